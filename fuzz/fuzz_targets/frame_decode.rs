//! Fuzz target for the remoting frame decoder (`cargo fuzz run frame_decode`).
//!
//! The input is read three ways: as a stream of frames (length prefix included), and as the
//! header of a JSON frame and of a binary frame (most random length prefixes are rejected at
//! once, so this reaches the header decoders). Decoding must never panic; every frame that
//! decodes must survive a trip through `FrameEncoder` unchanged.

#![no_main]

use libfuzzer_sys::fuzz_target;
use shardmq_protocol::remoting::{decode_frame, FrameEncoder, RemotingCommand};

/// Inputs past this are only decoded, not re-encoded (escaping can grow a header sixfold).
const RE_ENCODE_INPUT_MAX_BYTES: usize = 1024 * 1024;

fuzz_target!(|data: &[u8]| {
    let mut rest = data;
    while let Ok(Some((command, consumed))) = decode_frame(rest) {
        assert!(
            consumed >= 8 && consumed <= rest.len(),
            "consumed {consumed}"
        );
        check_re_encode(&command, data.len());
        rest = &rest[consumed..];
    }
    for type_byte in [0u8, 1] {
        let frame = frame_around(type_byte, data);
        if let Ok(Some((command, consumed))) = decode_frame(&frame) {
            assert_eq!(consumed, frame.len());
            check_re_encode(&command, data.len());
        }
    }
});

fn frame_around(type_byte: u8, header: &[u8]) -> Vec<u8> {
    let header = &header[..header.len().min(0xFF_FFFF)];
    let length = (4 + header.len()) as u32;
    let mut frame = length.to_be_bytes().to_vec();
    frame.push(type_byte);
    frame.extend_from_slice(&(header.len() as u32).to_be_bytes()[1..]);
    frame.extend_from_slice(header);
    frame
}

fn check_re_encode(command: &RemotingCommand<'_>, input_size_bytes: usize) {
    if input_size_bytes > RE_ENCODE_INPUT_MAX_BYTES {
        return;
    }
    let mut out = Vec::new();
    let mut encoder = if command.is_response() {
        FrameEncoder::response(&mut out, command.code, command.opaque)
    } else {
        FrameEncoder::request(&mut out, command.code, command.opaque, command.is_oneway())
    };
    if let Some(remark) = &command.remark {
        encoder.remark(remark);
    }
    for (key, value) in command.ext_fields.iter() {
        encoder.ext(key, value);
    }
    encoder.finish(command.body);
    let (again, consumed) = decode_frame(&out)
        .expect("an encoded frame decodes")
        .expect("an encoded frame is whole");
    assert_eq!(consumed, out.len());
    assert_eq!((again.code, again.opaque), (command.code, command.opaque));
    assert_eq!(again.is_response(), command.is_response());
    assert_eq!(
        again.is_oneway(),
        command.is_oneway() && !command.is_response()
    );
    assert_eq!(again.remark, command.remark);
    assert_eq!(again.ext_fields, command.ext_fields);
    assert_eq!(again.body, command.body);
}
