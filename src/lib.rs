//! shardmq: a thread-per-core message broker that speaks Apache RocketMQ's remoting protocol.
//!
//! `src/` is the part that speaks to the world: the namesrv and broker request handlers, the
//! connection server, the admin CLI, tuning and the command line. The wire and record formats
//! are the `shardmq-protocol` crate (re-exported here as `remoting`, `body` and `record`);
//! everything that owns data on one core lives in the `shards` crate.

pub mod acl;
pub mod admin;
pub mod broker;
pub mod conf;
pub mod console;
pub mod error;
pub mod filter;
pub mod ha;
pub mod limits;
pub mod logging;
pub mod metrics;
pub mod namesrv;
pub mod node;
pub mod persist;
pub mod server;
pub mod tls;
pub mod tuning;
pub mod verify;

pub use shardmq_protocol::{body, record, remoting};
