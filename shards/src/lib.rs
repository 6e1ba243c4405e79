//! shards: what owns data on one core. The runtime facade over glommio (the rest of the code
//! names no glommio type, so a runtime swap stays a change to this crate), CPU placement and
//! the start-up checks, the control-plane mesh between shards, the per-shard store
//! (commitlog, consume queues) and the per-shard long-poll wheel (pure bookkeeping, driven by
//! the shard's ticking task).

pub mod buffers;
pub mod hash;
pub mod histogram;
pub mod limits;
pub mod long_poll;
pub mod mesh;
pub mod runtime;
pub mod store;
pub mod sync;
pub mod throttle;
pub mod types;
pub mod wheel;

pub use types::{CommitLogOffset, QueueId, QueueOffset, ShardId};
