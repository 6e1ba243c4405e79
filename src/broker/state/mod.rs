//! The shard's broker state tables and their persistence: topics, subscription groups,
//! consumer offsets, clients, queue locks, delay-delivery progress, transaction halves and
//! pending offset resets. Plain data owned by the shard (`RefCell`s in `Broker`); the files
//! behind them are written off the shard thread (`persist::run_writer`).

pub mod clients;
pub mod groups;
pub mod locks;
pub mod offsets;
pub mod resets;
pub mod schedule;
pub mod store_stats;
pub mod topics;
pub mod transactions;
pub mod versioned;
