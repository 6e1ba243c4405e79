//! shardmq: a thread-per-core message broker that speaks Apache RocketMQ's remoting protocol.
//!
//! `src/` is the part that speaks to the world: the remoting codec (`remoting`), the JSON bodies
//! that ride in frames (`protocol`), the namesrv and broker request handlers, the connection
//! server and the command line. Everything that owns data on one core lives in the `shards`
//! crate.

pub mod admin;
pub mod broker;
pub mod client;
pub mod error;
pub mod filter;
pub mod namesrv;
pub mod node;
pub mod persist;
pub mod protocol;
pub mod remoting;
pub mod server;
pub mod tuning;
