//! Templates decode back to the frames a Java producer sends, for single sends and batches.

use super::*;
use shardmq_protocol::body::parse_properties;
use shardmq_protocol::remoting::decode_frame;

fn fields() -> SendFields<'static> {
    SendFields {
        producer_group: "bench_group",
        topic: "BenchTopic",
        tag: "TagA",
        keys: false,
        stamp_sent_time: false,
        batch: 1,
        credentials: None,
    }
}

fn stamp(opaque: i32) -> RequestStamp {
    RequestStamp {
        opaque,
        born_timestamp_ms: 1_700_000_000_123,
        sent_micros: 1_700_000_000_123_456,
    }
}

/// The records of a batch body (§5.5): (flag, body, properties).
fn split_batch(mut body: &[u8]) -> Vec<(i32, Vec<u8>, String)> {
    let be32 = |bytes: &[u8]| i32::from_be_bytes(bytes[..4].try_into().unwrap());
    let mut records = Vec::new();
    while !body.is_empty() {
        let total = be32(body) as usize;
        assert_eq!(be32(&body[4..]), 0, "MAGICCODE");
        assert_eq!(be32(&body[8..]), 0, "BODYCRC");
        let flag = be32(&body[12..]);
        let body_len = be32(&body[16..]) as usize;
        let message = body[20..20 + body_len].to_vec();
        let at = 20 + body_len;
        let props_len = u16::from_be_bytes([body[at], body[at + 1]]) as usize;
        let props = String::from_utf8(body[at + 2..at + 2 + props_len].to_vec()).unwrap();
        assert_eq!(at + 2 + props_len, total, "TOTALSIZE");
        records.push((flag, message, props));
        body = &body[total..];
    }
    records
}

fn property<'a>(properties: &'a str, name: &str) -> Option<&'a str> {
    parse_properties(properties.as_bytes())
        .into_iter()
        .find(|(key, _)| *key == name)
        .map(|(_, value)| value)
}

#[test]
fn stamped_frame_decodes_with_every_header_field() {
    let body = vec![b'x'; 100];
    let template = SendTemplate::new(&fields(), 3, &body).unwrap();
    let mut keys = UniqKeyGenerator::new(0x0123_4567_89AB_CDEF, 7);
    let mut out = Vec::new();
    template.append(&mut out, stamp(1_234_567_890), &mut keys);
    assert_eq!(out.len(), template.frame_size_bytes());

    let (command, consumed) = decode_frame(&out).unwrap().unwrap();
    assert_eq!(consumed, out.len());
    assert_eq!(command.code, request_code::SEND_MESSAGE_V2);
    assert_eq!(command.opaque, 1_234_567_890);
    assert!(!command.is_response() && !command.is_oneway());
    assert_eq!(command.body, &body[..]);
    let ext = &command.ext_fields;
    let expected = [
        ("a", "bench_group"),
        ("b", "BenchTopic"),
        ("c", "TBW102"),
        ("d", "4"),
        ("e", "3"),
        ("f", "0"),
        ("g", "1700000000123"),
        ("h", "0"),
        ("j", "0"),
        ("k", "false"),
        ("m", "false"),
    ];
    for (key, value) in expected {
        assert_eq!(ext.get(key), Some(value), "ext {key}");
    }
    assert_eq!(
        ext.get("i"),
        Some(concat!(
            "TAGS\u{1}TagA\u{2}",
            "UNIQ_KEY\u{1}0123456789ABCDEF0007000000000000\u{2}",
            "WAIT\u{1}true\u{2}"
        ))
    );
}

#[test]
fn keys_and_sent_time_are_stamped_per_message() {
    let options = SendFields {
        keys: true,
        stamp_sent_time: true,
        ..fields()
    };
    let template = SendTemplate::new(&options, 0, b"hello").unwrap();
    let mut keys = UniqKeyGenerator::new(1, 2);
    let mut out = Vec::new();
    template.append(&mut out, stamp(OPAQUE_FIRST), &mut keys);
    template.append(&mut out, stamp(OPAQUE_FIRST + 1), &mut keys);
    let mut rest = &out[..];
    for index in 0..2u64 {
        let (command, consumed) = decode_frame(rest).unwrap().unwrap();
        let properties = command.ext_fields.get("i").unwrap();
        let uniq_key = format!("{:016X}{:04X}{:012X}", 1, 2, index);
        assert_eq!(property(properties, "UNIQ_KEY"), Some(uniq_key.as_str()));
        assert_eq!(property(properties, "KEYS"), Some(uniq_key.as_str()));
        assert_eq!(
            property(properties, SENT_MICROS_PROPERTY),
            Some("1700000000123456")
        );
        rest = &rest[consumed..];
    }
    assert!(rest.is_empty());
}

#[test]
fn a_batch_is_one_send_batch_message_with_a_record_per_message() {
    let options = SendFields {
        batch: 3,
        keys: true,
        stamp_sent_time: true,
        ..fields()
    };
    let template = SendTemplate::new(&options, 5, b"payload").unwrap();
    assert_eq!(template.messages_per_request(), 3);
    let mut keys = UniqKeyGenerator::new(9, 0);
    let mut out = Vec::new();
    template.append(&mut out, stamp(OPAQUE_FIRST), &mut keys);
    let (command, consumed) = decode_frame(&out).unwrap().unwrap();
    assert_eq!(consumed, out.len());
    assert_eq!(command.code, request_code::SEND_BATCH_MESSAGE);
    assert_eq!(command.ext_fields.get("m"), Some("true"));
    assert_eq!(command.ext_fields.get("e"), Some("5"));
    assert_eq!(command.ext_fields.get("i"), Some("WAIT\u{1}true\u{2}"));
    let records = split_batch(command.body);
    assert_eq!(records.len(), 3);
    for (index, (flag, body, properties)) in records.iter().enumerate() {
        assert_eq!(*flag, 0);
        assert_eq!(body, b"payload");
        let uniq_key = format!("{:016X}{:04X}{:012X}", 9, 0, index);
        assert_eq!(property(properties, "UNIQ_KEY"), Some(uniq_key.as_str()));
        assert_eq!(property(properties, "KEYS"), Some(uniq_key.as_str()));
        assert_eq!(property(properties, "TAGS"), Some("TagA"));
        assert_eq!(
            property(properties, SENT_MICROS_PROPERTY),
            Some("1700000000123456")
        );
    }
}

#[test]
fn batches_over_the_size_limit_and_bad_tags_are_refused() {
    let big = vec![b'x'; 64 * 1024];
    let options = SendFields {
        batch: 64,
        ..fields()
    };
    assert!(SendTemplate::new(&options, 0, &big).is_err());
    let zero = SendFields {
        batch: 0,
        ..fields()
    };
    assert!(SendTemplate::new(&zero, 0, b"x").is_err());
    for tag in ["a\u{1}b", ""] {
        assert!(SendTemplate::new(&SendFields { tag, ..fields() }, 0, b"x").is_err());
    }
    // A quote in the tag is escaped by the encoder and cannot fake a slot marker.
    let tag = "\"g\":\"1";
    let template = SendTemplate::new(&SendFields { tag, ..fields() }, 0, b"x").unwrap();
    let mut out = Vec::new();
    let stamp = RequestStamp {
        opaque: OPAQUE_FIRST,
        born_timestamp_ms: 2_000_000_000_000,
        sent_micros: SENT_MICROS_MIN,
    };
    template.append(&mut out, stamp, &mut UniqKeyGenerator::new(0, 0));
    let (command, _) = decode_frame(&out).unwrap().unwrap();
    assert_eq!(command.ext_fields.get("g"), Some("2000000000000"));
}

#[test]
fn opaque_sequence_wraps_to_ten_digits() {
    let mut opaques = OpaqueSequence { next: i32::MAX };
    assert_eq!(opaques.next_opaque(), i32::MAX);
    assert_eq!(opaques.next_opaque(), OPAQUE_FIRST);
}

#[test]
fn fixed_width_writers() {
    let mut field = [0u8; 5];
    write_fixed_decimal(&mut field, 42);
    assert_eq!(&field, b"00042");
    write_fixed_hex(&mut field, 0xABCDEF);
    assert_eq!(&field, b"BCDEF");
}

#[test]
#[should_panic(expected = "wider than")]
fn fixed_decimal_overflow_is_a_bug() {
    write_fixed_decimal(&mut [0u8; 2], 100);
}

#[test]
fn signed_templates_carry_a_signature_of_what_is_patched_in() {
    let credentials = Credentials::new("bench-key", "bench-secret");
    for batch in [1, 3] {
        let fields = SendFields {
            credentials: Some(&credentials),
            keys: true,
            batch,
            ..fields()
        };
        let template = SendTemplate::new(&fields, 2, b"payload").unwrap();
        let mut keys = UniqKeyGenerator::new(7, 1);
        for opaque in [OPAQUE_FIRST, OPAQUE_FIRST + 1] {
            let mut out = Vec::new();
            template.append(&mut out, stamp(opaque), &mut keys);
            let (command, _) = decode_frame(&out).unwrap().unwrap();
            assert_eq!(command.ext_fields.get("AccessKey"), Some("bench-key"));
            let received = command.ext_fields.get("Signature").unwrap();
            assert!(signature::verify(
                "bench-secret",
                command.ext_fields.iter(),
                command.body,
                479,
                received
            ));
        }
    }
}
