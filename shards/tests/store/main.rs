//! The store's integration tests, one binary (a link of the store and its dependencies per
//! test file made these the slowest part of the test command's build). Run one part with
//! `cargo test --release -p shards --features fault-injection --test store <module>::`.

mod support;

mod basic;
#[cfg(feature = "fault-injection")]
mod durability;
mod filter;
mod index;
mod record;
mod recovery;
mod retention;
mod throughput;
