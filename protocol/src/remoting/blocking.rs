//! Reading one whole frame from a blocking [`std::io::Read`] (a `std::net::TcpStream`): for the
//! admin command's client and the integration tests, which talk to a server one request at a
//! time without a runtime. The broker and the async client split frames off their own read
//! buffers with [`decode_frame`] instead.
//!
//! Invariants: exactly one frame is consumed from the reader, never a byte more, so a caller
//! can read the next frame (or hand the stream on) afterwards; the length prefix is checked
//! against [`FRAME_SIZE_MAX_BYTES`](super::FRAME_SIZE_MAX_BYTES) before the buffer grows, so a hostile prefix is an error
//! at once, never a 4 GiB allocation or wait.

use std::io::{ErrorKind, Read};

use super::command::RemotingCommand;
use super::frame::{decode_frame, peek_frame_size_bytes, DecodeError, LENGTH_PREFIX_BYTES};

/// Why [`read_frame`] returned no frame.
#[derive(Debug, thiserror::Error)]
pub enum ReadFrameError {
    /// The reader failed (a read timeout included), or ended inside a frame.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// The bytes are not a frame; the connection should be closed.
    #[error(transparent)]
    Decode(#[from] DecodeError),
}

/// Reads exactly one frame into `buffer` (its old contents are dropped) and decodes it.
/// `Ok(None)`: the reader ended cleanly before the first byte of a frame (the peer closed).
pub fn read_frame<'b, R: Read + ?Sized>(
    reader: &mut R,
    buffer: &'b mut Vec<u8>,
) -> Result<Option<RemotingCommand<'b>>, ReadFrameError> {
    buffer.clear();
    buffer.resize(LENGTH_PREFIX_BYTES, 0);
    let first = loop {
        match reader.read(&mut buffer[..1]) {
            Ok(read) => break read,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    };
    if first == 0 {
        return Ok(None);
    }
    reader.read_exact(&mut buffer[1..])?;
    let Some(frame_size_bytes) = peek_frame_size_bytes(buffer)? else {
        // Unreachable: the whole prefix is in the buffer.
        return Err(std::io::Error::from(ErrorKind::UnexpectedEof).into());
    };
    buffer.resize(frame_size_bytes, 0);
    reader.read_exact(&mut buffer[LENGTH_PREFIX_BYTES..])?;
    match decode_frame(buffer)? {
        Some((command, _)) => Ok(Some(command)),
        // Unreachable: the buffer holds the whole frame the prefix announced.
        None => Err(std::io::Error::from(ErrorKind::UnexpectedEof).into()),
    }
}
