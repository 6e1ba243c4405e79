//! shards: what owns data on one core. The runtime facade over glommio (the rest of the code
//! names no glommio type, so a runtime swap stays a change to this crate), CPU placement and
//! the start-up checks, the control-plane mesh between shards, and the per-shard store
//! (commitlog, consume queues).

pub mod mesh;
pub mod runtime;
pub mod store;
pub mod sync;
pub mod timing_wheel;

/// Index of a shard on this node: shard i is pinned to one core and is broker endpoint i.
pub type ShardId = usize;
