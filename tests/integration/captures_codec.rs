//! The codec against real client traffic: every frame of every capture in
//! `tests/golden/*.jsonl` (see its README) is rebuilt from `header_text` and
//! `body_hex`, decoded, checked field by field against the capture's own parse, then
//! re-encoded with `FrameEncoder` and decoded again.

use std::path::{Path, PathBuf};

use serde_json::Value;
use shardmq::remoting::{decode_frame, FrameEncoder, RemotingCommand};

fn captures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

fn capture_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(captures_dir())
        .expect("captures directory is a sibling of the repository")
        .map(|entry| entry.expect("readable directory entry").path())
        .filter(|path| {
            path.extension()
                .is_some_and(|extension| extension == "jsonl")
        })
        .collect();
    files.sort();
    files
}

fn hex_to_bytes(hex: &str) -> Vec<u8> {
    assert!(hex.len().is_multiple_of(2), "odd hex length");
    (0..hex.len())
        .step_by(2)
        .map(|index| u8::from_str_radix(&hex[index..index + 2], 16).expect("hex digit"))
        .collect()
}

/// A JSON-header frame exactly as the capture's sender wrote it.
fn rebuild_frame(header: &[u8], body: &[u8]) -> Vec<u8> {
    let length = u32::try_from(4 + header.len() + body.len()).expect("small frame");
    let header_word = u32::try_from(header.len()).expect("small header"); // type byte 0
    let mut frame = length.to_be_bytes().to_vec();
    frame.extend_from_slice(&header_word.to_be_bytes());
    frame.extend_from_slice(header);
    frame.extend_from_slice(body);
    frame
}

/// The text a capture's ext value must decode to (numbers and booleans keep their text).
fn expected_ext_text(value: &Value) -> Option<String> {
    match value {
        Value::Null => None,
        Value::String(text) => Some(text.clone()),
        other => Some(other.to_string()),
    }
}

fn int_field(record: &Value, key: &str) -> i64 {
    record[key]
        .as_i64()
        .unwrap_or_else(|| panic!("record has integer {key}"))
}

fn check_against_record(command: &RemotingCommand<'_>, record: &Value, context: &str) {
    assert_eq!(
        i64::from(command.code),
        int_field(record, "code"),
        "{context}: code"
    );
    assert_eq!(
        i64::from(command.opaque),
        int_field(record, "opaque"),
        "{context}: opaque"
    );
    assert_eq!(
        i64::from(command.flag),
        int_field(record, "flag"),
        "{context}: flag"
    );
    assert_eq!(
        i64::from(command.version),
        int_field(record, "version"),
        "{context}: version"
    );
    assert_eq!(
        command.language.name(),
        record["language"],
        "{context}: language"
    );
    assert_eq!(
        command.is_response(),
        record["type"] == "response",
        "{context}: type"
    );
    assert_eq!(
        command.is_oneway(),
        record["oneway"] == true,
        "{context}: oneway"
    );
    assert_eq!(
        command.remark.as_deref(),
        record["remark"].as_str(),
        "{context}: remark"
    );

    let empty = serde_json::Map::new();
    let expected = record["ext_fields"].as_object().unwrap_or(&empty);
    let mut expected_count = 0;
    for (key, value) in expected {
        let text = expected_ext_text(value);
        expected_count += usize::from(text.is_some());
        assert_eq!(
            command.ext_fields.get(key),
            text.as_deref(),
            "{context}: ext {key}"
        );
    }
    assert_eq!(
        command.ext_fields.len(),
        expected_count,
        "{context}: ext count"
    );
}

/// Re-encodes `command` with the broker's encoder and checks what survives the trip: code,
/// opaque, flag, remark, every ext entry, the body (language/version become ours).
fn check_re_encode(command: &RemotingCommand<'_>, context: &str) {
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
        .unwrap_or_else(|error| panic!("{context}: re-encoded frame fails: {error}"))
        .expect("whole frame");
    assert_eq!(consumed, out.len(), "{context}: consumed");
    assert_eq!(
        (again.code, again.opaque, again.flag),
        (command.code, command.opaque, command.flag)
    );
    assert_eq!(again.remark, command.remark, "{context}: remark");
    assert_eq!(again.ext_fields, command.ext_fields, "{context}: ext");
    assert_eq!(again.body, command.body, "{context}: body");
}

/// The shimmed header the peer received must decode to the same frame identity.
fn check_forwarded_header(command: &RemotingCommand<'_>, record: &Value, context: &str) {
    let Some(forwarded) = record["shim"]["forwarded_header_text"].as_str() else {
        return;
    };
    let frame = rebuild_frame(forwarded.as_bytes(), b"");
    let (shimmed, _) = decode_frame(&frame)
        .unwrap_or_else(|error| panic!("{context}: forwarded header fails: {error}"))
        .expect("whole frame");
    assert_eq!(
        (shimmed.code, shimmed.opaque),
        (command.code, command.opaque),
        "{context}"
    );
    assert_eq!(
        shimmed.ext_fields.len(),
        command.ext_fields.len(),
        "{context}: shim ext"
    );
}

fn check_record(record: &Value, context: &str) -> bool {
    let header = record["header_text"]
        .as_str()
        .expect("JSON frames carry header_text");
    let body = hex_to_bytes(record["body_hex"].as_str().unwrap_or(""));
    let truncated = record["body_truncated"] == true;
    let frame = rebuild_frame(header.as_bytes(), &body);
    let (command, consumed) = decode_frame(&frame)
        .unwrap_or_else(|error| panic!("{context}: {error}"))
        .expect("whole frame");
    assert_eq!(consumed, frame.len(), "{context}: consumed");
    if !truncated {
        assert_eq!(
            consumed as i64 - 4,
            int_field(record, "frame_len"),
            "{context}: frame_len"
        );
        assert_eq!(command.body, &body[..], "{context}: body");
    }
    check_against_record(&command, record, context);
    check_re_encode(&command, context);
    check_forwarded_header(&command, record, context);
    !truncated
}

#[test]
fn every_captured_frame_decodes_and_re_encodes() {
    let files = capture_files();
    assert!(
        files.len() >= 6,
        "expected the six capture files, found {}",
        files.len()
    );
    let mut frames_checked = 0;
    for file in &files {
        let text = std::fs::read_to_string(file).expect("readable capture");
        let mut frames_in_file = 0;
        for (line_index, line) in text.lines().enumerate() {
            let record: Value = serde_json::from_str(line).expect("one JSON object per line");
            if record["event"] != "frame" {
                continue;
            }
            assert_eq!(record["serialize_type"], 0, "captures are JSON-only");
            let context = format!("{}:{}", file.display(), line_index + 1);
            check_record(&record, &context);
            frames_in_file += 1;
        }
        assert!(frames_in_file > 0, "{}: no frames", file.display());
        frames_checked += frames_in_file;
    }
    assert!(
        frames_checked >= 250,
        "only {frames_checked} frames checked"
    );
}

#[test]
fn captured_cpp_and_ali_ons_quirks_are_present() {
    // Guards the vectors themselves: if a capture is regenerated without the quirks, the
    // test above would silently stop covering them.
    let mut seen_number = false;
    let mut seen_boolean = false;
    let mut seen_trailing_newline = false;
    for file in capture_files() {
        for line in std::fs::read_to_string(&file)
            .expect("readable capture")
            .lines()
        {
            let record: Value = serde_json::from_str(line).expect("JSON line");
            if let Some(fields) = record["ext_fields"].as_object() {
                seen_number |= fields.values().any(Value::is_number);
                seen_boolean |= fields.values().any(Value::is_boolean);
            }
            seen_trailing_newline |= record["header_text"]
                .as_str()
                .is_some_and(|text| text.ends_with('\n'));
        }
    }
    assert!(seen_number && seen_boolean && seen_trailing_newline);
}

#[test]
fn every_signed_cpp_request_verifies_as_captured() {
    // The C++ client signs every request, with an empty secret when it has no credentials
    // (CAPABILITIES.md §4.3): recomputing over what the decoder yields (numbers as their
    // text, body bytes as sent) must give the captured `Signature` of each of them.
    use shardmq::remoting::signature;
    let mut verified = 0;
    for file in capture_files() {
        for (line_index, line) in std::fs::read_to_string(&file)
            .expect("readable capture")
            .lines()
            .enumerate()
        {
            let record: Value = serde_json::from_str(line).expect("JSON line");
            if record["event"] != "frame" || record["dir"] != "c2s" {
                continue;
            }
            if record["body_truncated"] == true || record["ext_fields"]["Signature"].is_null() {
                continue;
            }
            let header = record["header_text"].as_str().expect("header_text");
            let body = hex_to_bytes(record["body_hex"].as_str().unwrap_or(""));
            let frame = rebuild_frame(header.as_bytes(), &body);
            let (command, _) = decode_frame(&frame).expect("decodes").expect("whole");
            let received = command
                .ext_fields
                .get(signature::SIGNATURE)
                .expect("signed");
            assert!(
                signature::verify(
                    "",
                    command.ext_fields.iter(),
                    command.body,
                    command.version,
                    received
                ),
                "{}:{}: signature does not verify",
                file.display(),
                line_index + 1
            );
            verified += 1;
        }
    }
    assert!(verified >= 30, "only {verified} signed requests verified");
}
