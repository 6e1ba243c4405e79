//! Every limit of the client library in one place, each with its unit and a line saying why:
//! nothing the client buffers grows without bound because a broker is slow. (The modules that
//! use them re-export them under their old paths.)

use shardmq_protocol::remoting::FRAME_SIZE_MAX_BYTES;

/// Largest message body a producer sends (Java `maxMessageSize`, the broker's limit too).
pub const MESSAGE_BODY_MAX_BYTES: usize = 4 * 1024 * 1024;

/// A decompressed body larger than this is refused (a hostile 4 MiB zlib bomb stays bounded).
pub const DECOMPRESSED_BODY_MAX_BYTES: usize = 64 * 1024 * 1024;

/// Pulled batches waiting for `poll`, all queues together.
pub const BUFFERED_BATCHES_MAX: usize = 1_024;

/// Frames queued for one connection's writer before senders wait (back-pressure on pipelining).
pub const WRITE_QUEUE_FRAMES_MAX: usize = 4096;

/// Server-initiated requests waiting for the owner before extra ones are dropped.
pub const SERVER_REQUESTS_QUEUED_MAX: usize = 1024;

/// Largest body a request may carry: the frame limit less room for the header.
pub const REQUEST_BODY_MAX_BYTES: usize = FRAME_SIZE_MAX_BYTES - 256 * 1024;

/// Messages one batch may carry (the broker's own limit is higher; this keeps bodies sane).
pub const BATCH_MESSAGES_MAX: usize = 10_000;

// The relations these limits rely on.
const _: () = assert!(REQUEST_BODY_MAX_BYTES < FRAME_SIZE_MAX_BYTES);
const _: () = assert!(MESSAGE_BODY_MAX_BYTES <= REQUEST_BODY_MAX_BYTES);
