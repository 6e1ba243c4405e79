//! Every limit of the wire and record formats in one place, each with its unit and a line
//! saying why; a length read from the wire is checked against one of these before anything is
//! allocated for it. (The modules that use them re-export them under their old paths.)

/// Largest accepted frame, including the 4-byte length prefix (Java's default
/// `com.rocketmq.remoting.frameMaxLength`).
pub const FRAME_SIZE_MAX_BYTES: usize = 16 * 1024 * 1024;

/// H is a 24-bit field.
pub const HEADER_SIZE_MAX_BYTES: usize = 0xFF_FFFF;

/// Most extFields entries accepted in one header. Real headers carry about 15; the limit
/// keeps a hostile 16 MiB header from turning into millions of entries.
pub const EXT_FIELDS_COUNT_MAX: usize = 1024;

/// Deepest object/array nesting accepted in a header (real headers are 2 deep: the header
/// object and `extFields`); bounds the recursion of the skipper.
pub const JSON_NESTING_DEPTH_MAX: usize = 16;

/// Java `MessageDecoder` limit on the properties string (it is framed by a u16 length).
pub const PROPERTIES_SIZE_MAX_BYTES: usize = 32767;

// The relations these limits rely on.
// The encoder writes the length as an i32 and Java reads it as one.
const _: () = assert!(FRAME_SIZE_MAX_BYTES <= i32::MAX as usize);
// The properties length is an i16 on the wire.
const _: () = assert!(PROPERTIES_SIZE_MAX_BYTES <= i16::MAX as usize);
const _: () = assert!(HEADER_SIZE_MAX_BYTES < 1 << 24);
