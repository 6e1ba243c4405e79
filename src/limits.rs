//! Every limit of the broker and namesrv roles in one place: each with its unit in its name
//! and a line saying why, the relations between them checked at compile time below. A client
//! that is slow or hostile meets one of these, and gets an answer, never unbounded growth.
//! (The modules that use them re-export them under their old paths. The store's limits are
//! `shards::limits`, the wire's `shardmq_protocol`'s.)

use shardmq_protocol::remoting::FRAME_SIZE_MAX_BYTES;

/// Messages one pull returns at most, whatever the client asks (RocketMQ's default).
pub const PULL_BATCH_MAX_MESSAGES: u32 = 32;

/// Bytes one pull returns at most (RocketMQ's maxTransferBytesOnMessageInMemory).
pub const PULL_BATCH_MAX_BYTES: u32 = 256 * 1024;

/// Longest a pull is held: clients time out their pulls at 30 s, so answer well before.
pub const PULL_SUSPEND_MAX_MS: u64 = 25_000;

/// Pulls parked at once on one shard; beyond it a pull gets SYSTEM_BUSY (a client retries).
pub const PARKED_PULLS_MAX: usize = 100_000;

/// Room a pull answer's frame takes beyond its body (length prefixes, JSON header).
pub const PULL_ANSWER_HEADER_MAX_BYTES: usize = 1024;

/// Messages one batch may carry (a client cannot make the broker loop without bound).
pub const SEND_BATCH_MESSAGES_MAX: usize = 10_000;

/// Halves one shard keeps waiting for their end; beyond it a half send gets SYSTEM_BUSY (a
/// producer that never ends its transactions cannot grow the broker without bound).
pub const HALF_MESSAGES_PENDING_MAX: usize = 100_000;

/// Checks one round sends at most, so that a round never holds the shard long.
pub const CHECKS_PER_ROUND_MAX: usize = 10_000;

/// Queues reset and not yet pulled again by their group, at most (beyond it a reset still
/// commits the offsets and pushes 220, but does not mark its queues for the pull path).
pub const PENDING_RESETS_MAX_QUEUES: usize = 65_536;

/// Distinct groups one shard tracks; beyond this heartbeats are refused (SYSTEM_BUSY).
pub const CONSUMER_GROUPS_CONNECTED_MAX: usize = 100_000;

/// Distinct producer groups one shard tracks; a heartbeat that would add one more is refused.
pub const PRODUCER_GROUPS_CONNECTED_MAX: usize = 100_000;

/// Clients (client ids) one group holds on a shard; a heartbeat that would add one more is
/// refused: one connection cannot grow a group's table without bound by inventing ids.
pub const CLIENTS_PER_GROUP_MAX: usize = 10_000;

/// Groups one shard keeps; beyond it auto-creation and UPDATE_AND_CREATE are refused.
pub const SUBSCRIPTION_GROUPS_MAX: usize = 100_000;

/// Topics one broker holds (the built-in ones included): creating one more, by
/// UPDATE_AND_CREATE_TOPIC or a send's auto-creation, is refused. Ten times issue 17's
/// 10,000; RocketMQ sets none, and with autoCreateTopicEnable on (its default) a client
/// sending to made-up names created topics without end.
pub const TOPICS_MAX: usize = 100_000;

/// Consumer offsets (a group's queue of a topic) one shard keeps: UPDATE_CONSUMER_OFFSET for
/// one more is refused. 1,000 groups on 125 topics of 8 queues; about 60 bytes each in
/// `consumerOffset.json`. Without it, 500,000 commits for made-up names took 6 s and left a
/// 29 MB file, rewritten every 5 s, growing without end.
pub const CONSUMER_OFFSETS_MAX: usize = 1_000_000;

/// Longest group name (RocketMQ's CHARACTER_MAX_LENGTH).
pub const GROUP_NAME_MAX_CHARS: usize = 255;

pub const TOPIC_NAME_MAX_CHARS: usize = 127;

/// %RETRY% and %DLQ% topics embed a group name, so they may be longer.
pub const SYSTEM_TOPIC_NAME_MAX_CHARS: usize = 255;

/// Most delay levels a table may have (one schedule queue each).
pub const DELAY_LEVELS_MAX: usize = 64;

/// Longest timer delay accepted (RocketMQ's timerMaxDelaySec, 3 days).
pub const TIMER_DELAY_MAX_MS: i64 = 3 * 24 * 3600 * 1000;

/// Timer messages held in memory at once; the scan of the timer queue pauses beyond it.
pub const TIMER_PENDING_MAX: usize = 1_000_000;

/// Messages one delivery round re-puts per level (and for timers) before yielding.
pub const DELIVER_BATCH_MAX: usize = 4096;

/// Topics one GET_CONSUME_STATS reports, at most (a group's offsets name its topics).
pub const CONSUME_STATS_TOPICS_MAX: usize = 1024;

/// Largest answer we accept from a namesrv.
pub const NAMESRV_RESPONSE_MAX_BYTES: usize = 16 << 20;

/// Default bytes read from the socket per read call.
pub const READ_CHUNK_BYTES: usize = 64 * 1024;

/// Default output waiting to be written past which the connection stops reading requests.
pub const OUTPUT_PAUSE_BYTES: usize = 32 * 1024 * 1024;

/// Default requests of one connection still being served (waiting for a group commit, parked
/// pulls) past which the connection stops reading more: a client cannot make us hold without
/// bound.
pub const IN_FLIGHT_REQUESTS_MAX: usize = 8192;

/// Default client connections one shard serves at once.
pub const CONNECTIONS_PER_SHARD_MAX: usize = 16_384;

/// Default client connections one shard serves from one remote address: one host cannot take
/// every place of a shard (a Java or C++ client opens one connection per broker).
pub const CONNECTIONS_PER_ADDRESS_MAX: usize = 2_048;

/// Default time a frame may take to arrive whole from its first byte; past it the connection
/// is closed (a client that sends part of a frame and stalls holds its buffer until then).
pub const PARTIAL_FRAME_TIMEOUT_MS: u64 = 30_000;

/// Default bytes one shard lets the frames still arriving on its connections take, past
/// each connection's read buffer: a frame larger than that buffer takes room for all of
/// itself before its connection reads on, and waits while others hold the rest. Without it
/// one client could make a shard hold up to 16 MiB on each of its connections for as long
/// as the partial frame timeout (200 connections of one address held 3 GB).
pub const ARRIVING_FRAMES_MAX_BYTES: usize = 256 << 20;

/// Default output one shard holds for all its connections together (waiting, being written,
/// promised) past which a pull's answer waits for room, unless its connection has nothing
/// waiting (so every connection gets one answer at a time). Without it, clients that pull and
/// never read held `output_pause_kib` on each connection: 100 such connections held 2.9 GB.
pub const SHARD_OUTPUT_MAX_BYTES: usize = 1 << 30;

/// Connections a shard's HA port serves at once (a master has a slave or two); one more is
/// accepted and closed at once. Counted in the node's descriptor budget: before, anyone
/// reaching the port could take every descriptor of the process (19,950 idle connections
/// did, and client accepts failed with EMFILE).
pub const HA_CONNECTIONS_MAX: usize = 64;

/// Connections the metrics port (Prometheus, the web console) serves at once; the same.
pub const METRICS_CONNECTIONS_MAX: usize = 256;

/// Longest expression accepted. Subscriptions travel in request headers and heartbeats;
/// RocketMQ sets no bound, this one is far above any selector a person writes.
pub const SQL_EXPRESSION_MAX_BYTES: usize = 16 * 1024;

/// Deepest expression tree (and deepest parenthesis / prefix-operator nesting) accepted:
/// evaluation recurses once per level, so the bound keeps it far from the stack's end.
pub const SQL_EXPRESSION_DEPTH_MAX: usize = 64;

/// (group, topic) pairs whose compiled expression one shard keeps. Beyond it the cache is
/// emptied and refilled (expressions are cheap to parse; this only bounds memory).
pub const SQL_FILTER_CACHE_ENTRIES_MAX: usize = 4096;

// The relations these limits rely on.
// A pull answer (records + its header) fits one frame.
const _: () =
    assert!(PULL_BATCH_MAX_BYTES as usize + PULL_ANSWER_HEADER_MAX_BYTES <= FRAME_SIZE_MAX_BYTES);
// The broker asks the store for no more than the store reads at most.
const _: () = assert!(PULL_BATCH_MAX_MESSAGES <= shards::limits::STORE_READ_MESSAGES_MAX);
const _: () = assert!(PULL_BATCH_MAX_BYTES <= shards::limits::STORE_READ_MAX_BYTES);
// A connection's output cap holds at least one largest frame (one answer always proceeds).
const _: () = assert!(OUTPUT_PAUSE_BYTES >= FRAME_SIZE_MAX_BYTES);
// A batch of the largest count still fits a frame's body when its messages are empty.
const _: () = assert!(
    SEND_BATCH_MESSAGES_MAX * shardmq_protocol::batch::BATCH_ENTRY_FIXED_BYTES
        <= FRAME_SIZE_MAX_BYTES
);
// Topic names the broker accepts are names the store can write.
const _: () = assert!(TOPIC_NAME_MAX_CHARS <= shards::limits::TOPIC_NAME_MAX_BYTES);
