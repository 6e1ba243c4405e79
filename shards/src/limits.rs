//! Every limit of the per-core layer in one place: each with its unit in its name and a line
//! saying why, the relations between them checked at compile time below. Nothing the store,
//! the mesh or the runtime keeps grows past one of these because a client is slow or hostile.
//! (The modules that use them re-export them under their old paths.)

pub use shardmq_protocol::body::PROPERTIES_SIZE_MAX_BYTES;
use shardmq_protocol::record;
use shardmq_protocol::remoting::FRAME_SIZE_MAX_BYTES;

/// Largest message body accepted (RocketMQ's maxMessageSize default).
pub const MESSAGE_SIZE_MAX_BYTES: usize = 4 * 1024 * 1024;

/// Longest topic name (magic V1 stores the topic length in one signed byte).
pub const TOPIC_NAME_MAX_BYTES: usize = 127;

/// Largest record this store writes.
pub const RECORD_SIZE_MAX_BYTES: usize = record::encoded_size(
    MESSAGE_SIZE_MAX_BYTES,
    TOPIC_NAME_MAX_BYTES,
    PROPERTIES_SIZE_MAX_BYTES,
);

/// Commitlog bytes appended but not yet durable, at most: beyond this `append` answers
/// `Busy` (a full queue is an answer) instead of growing memory while the disk lags.
pub const TAIL_UNDURABLE_MAX_BYTES: u64 = 32 << 20;

/// Written bytes kept in memory behind those of the last write (which stay too), so that
/// consumers and the HA stream reading the hot tail are served without a disk read.
pub const TAIL_READ_KEEP_BYTES: u64 = 4 << 20;

/// Smallest segment (tests use such tiny ones); a record that does not fit its segment with
/// the blank filler's header is refused as too large.
pub const SEGMENT_SIZE_MIN_BYTES: u64 = 64 << 10;

/// Largest async-flush batch: half the undurable tail, so appends never stall on the tail
/// limit while a flush of a full batch is under way.
pub const FLUSH_DIRTY_MAX_BYTES_LIMIT: u64 = TAIL_UNDURABLE_MAX_BYTES / 2;

/// Smallest allocation window: room for the undurable tail twice over, so that appends are
/// held back by the disk's speed (`Busy`), not by allocation.
pub const ALLOCATION_WINDOW_MIN_BYTES: u64 = 2 * TAIL_UNDURABLE_MAX_BYTES;

/// Size of one tail chunk: big enough that a 1 KiB append rarely crosses a chunk, small enough
/// that sliding frees memory promptly.
pub const TAIL_CHUNK_BYTES: u64 = 1 << 20;

/// Most messages one pull returns, whatever the client asks (a hostile maxMsgNums must not
/// turn into an unbounded scan or body).
pub const STORE_READ_MESSAGES_MAX: u32 = 1024;

/// Most body bytes one pull returns (the first message is returned whatever its size).
pub const STORE_READ_MAX_BYTES: u32 = 16 << 20;

/// Commitlog bytes one pull reads at most to evaluate a properties filter (at least one
/// record is always read): a filter that matches nothing must not turn into reading the
/// whole scan window of large records.
pub const PROPERTY_FILTER_READ_MAX_BYTES: u64 = 8 << 20;

/// Keys of one message that are indexed, at most (its UNIQ_KEY included): a message with
/// thousands of keys must not fill a file by itself.
pub const INDEX_KEYS_PER_MESSAGE_MAX: usize = 64;

/// Most messages one query returns (RocketMQ's maxMsgsNumBatch).
pub const QUERY_MESSAGES_MAX: u32 = 64;

/// Most record bytes one answer carries (the first record always goes): the answer must fit
/// a remoting frame (16 MiB) with room for its header.
pub const QUERY_BODY_MAX_BYTES: usize = 12 << 20;

/// Largest single write of a flush (it gathers the tail chunks it covers): on these virtio
/// disks one 8 MiB RWF_DSYNC write at a time runs at fio's sequential bandwidth.
pub const FLUSH_WRITE_MAX_BYTES: u64 = 8 << 20;

/// Async mode: default dirty bytes that trigger a flush before the interval ends (one large
/// write is as cheap as a small one; more would delay durability and grow the write).
/// `StoreConfig::flush_dirty_max_bytes` sets it per store.
pub const FLUSH_DIRTY_BYTES_MAX: u64 = 4 << 20;

/// Most entries a wheel holds at once (node indexes are u32 and `NIL` is reserved); owners
/// bound themselves far below this (the long-poll limit).
pub const WHEEL_ENTRIES_MAX: usize = (u32::MAX - 1) as usize;

/// The kernel's largest io_uring ring (IORING_MAX_ENTRIES).
pub const RING_DEPTH_MAX_ENTRIES: usize = 32_768;

/// Capacity of each shard-to-shard control channel; a full channel is a logged drop.
pub const MESH_CHANNEL_CAPACITY_MESSAGES: usize = 1024;

/// Messages handled per turn, so a burst cannot monopolise the shard.
pub const MESH_MESSAGES_PER_POLL_MAX: usize = 256;

// The relations these limits rely on.
const _: () = assert!(TAIL_UNDURABLE_MAX_BYTES >= 2 * RECORD_SIZE_MAX_BYTES as u64);
const _: () = assert!(ALLOCATION_WINDOW_MIN_BYTES >= TAIL_UNDURABLE_MAX_BYTES);
const _: () = assert!(FLUSH_DIRTY_BYTES_MAX <= FLUSH_DIRTY_MAX_BYTES_LIMIT);
const _: () = assert!(FLUSH_WRITE_MAX_BYTES <= TAIL_UNDURABLE_MAX_BYTES);
const _: () = assert!(TAIL_READ_KEEP_BYTES.is_multiple_of(TAIL_CHUNK_BYTES));
// A largest message travels in one frame, with room for its header.
const _: () = assert!(MESSAGE_SIZE_MAX_BYTES + (256 << 10) <= FRAME_SIZE_MAX_BYTES);
// A query's records travel in one answer frame.
const _: () = assert!(QUERY_BODY_MAX_BYTES + (256 << 10) <= FRAME_SIZE_MAX_BYTES);
const _: () = assert!(RECORD_SIZE_MAX_BYTES as u64 <= PROPERTY_FILTER_READ_MAX_BYTES);
