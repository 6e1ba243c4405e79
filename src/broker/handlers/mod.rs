//! The broker's request handlers, one family per file. Each answers every request it is given
//! (or hands it to a task that answers later); errors reach the wire through
//! `RequestError::code_and_remark` (src/error.rs). `Broker::dispatch` (mod.rs) is the table
//! from request code to handler.

pub mod broker_config;
pub mod clients;
pub mod consumer_running_info;
pub mod end_transaction;
pub mod filters;
pub mod group_admin;
pub mod offsets;
pub mod pull;
pub mod query;
pub mod reset_offset;
pub mod send;
pub mod send_back;
pub mod stats;
pub mod store_admin;
pub mod topic_admin;
