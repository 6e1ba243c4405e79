//! The broker's integration tests, one binary (a link of the broker and its dependencies per
//! test file made these the slowest part of the test command's build). Run one part with
//! `cargo test --release --features fault-injection --test integration <module>::`.

mod common;

mod admin_cli;
mod broker_filters;
mod broker_longpoll;
mod broker_raw;
mod broker_reset;
mod broker_transactions;
mod captures_bodies;
mod captures_codec;
mod client_acl;
mod client_lite_pull;
mod client_producer;
mod client_push;
mod client_tls;
mod client_transaction;
mod tuning_cli;
