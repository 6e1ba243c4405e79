//! shards: what owns data on one core. The runtime facade over glommio (the rest of the code
//! names no glommio type), CPU placement, the control-plane mesh between shards, and the
//! per-shard store (commitlog, consume queues).

pub mod store;
