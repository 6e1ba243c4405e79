//! Frame-level tests of the codec: exact encoder bytes, the client quirks of REMOTING.md §1.3,
//! limits, truncation, malformed input, and property tests for every encode/decode pair.

use std::borrow::Cow;

use proptest::prelude::*;

use super::*;

/// A frame around `header` with the given type byte.
fn frame(type_byte: u8, header: &[u8], body: &[u8]) -> Vec<u8> {
    let length = (4 + header.len() + body.len()) as u32;
    let mut bytes = length.to_be_bytes().to_vec();
    bytes.push(type_byte);
    bytes.extend_from_slice(&(header.len() as u32).to_be_bytes()[1..]);
    bytes.extend_from_slice(header);
    bytes.extend_from_slice(body);
    bytes
}

fn decode_json(header: &str) -> Result<RemotingCommand<'_>, DecodeError> {
    // Leak-free: the command borrows the frame, so decode from a per-call frame and own it.
    json_header::decode(header.as_bytes(), b"")
}

fn ext_pairs<'c>(command: &'c RemotingCommand<'_>) -> Vec<(&'c str, &'c str)> {
    command.ext_fields.iter().collect()
}

#[test]
fn response_encodes_to_exact_bytes() {
    let mut out = Vec::new();
    let mut encoder = FrameEncoder::response(&mut out, response_code::SUCCESS, 17);
    encoder
        .ext("queueId", "1")
        .ext_i64("queueOffset", 3)
        .ext_bool("TRACE_ON", true);
    encoder.finish(b"xy");
    let header = concat!(
        r#"{"code":0,"flag":1,"language":"JAVA","opaque":17,"serializeTypeCurrentRPC":"JSON","#,
        r#""version":479,"extFields":{"queueId":"1","queueOffset":"3","TRACE_ON":"true"}}"#
    );
    assert_eq!(out, frame(0, header.as_bytes(), b"xy"));
}

#[test]
fn request_encodes_remark_escapes_and_flags() {
    let mut out = b"previous frame".to_vec();
    let mut encoder = FrameEncoder::request(
        &mut out,
        request_code::NOTIFY_CONSUMER_IDS_CHANGED,
        -5,
        true,
    );
    encoder
        .remark("a\"b\\c\u{1}\n\u{7f}é")
        .ext_i64("n", i64::MIN)
        .ext_bool("b", false);
    encoder.finish(b"");
    let header = concat!(
        r#"{"code":40,"flag":2,"language":"JAVA","opaque":-5,"serializeTypeCurrentRPC":"JSON","#,
        r#""version":479,"remark":"a\"b\\c\u0001\u000a"#,
        "\u{7f}é",
        r#"","extFields":{"n":"-9223372036854775808","b":"false"}}"#
    );
    let mut expected = b"previous frame".to_vec();
    expected.extend_from_slice(&frame(0, header.as_bytes(), b""));
    assert_eq!(out, expected);

    let mut plain = Vec::new();
    FrameEncoder::request(&mut plain, 105, 0, false).finish(b"");
    let (command, _) = decode_frame(&plain).unwrap().unwrap();
    assert_eq!(
        (command.flag, command.is_oneway(), command.is_response()),
        (0, false, false)
    );
    assert!(command.ext_fields.is_empty() && command.remark.is_none());
}

#[test]
fn the_head_of_an_encoded_frame_reads_back() {
    let mut out = Vec::new();
    let mut encoder = FrameEncoder::response(&mut out, response_code::SYSTEM_BUSY, -7);
    encoder.remark("busy");
    encoder.finish(b"body");
    let head = encoded_head(&out).unwrap();
    assert_eq!(
        (head.code, head.opaque, head.is_response()),
        (response_code::SYSTEM_BUSY, -7, true)
    );
    assert_eq!(head.frame_size_bytes, out.len());
    let mut request = Vec::new();
    FrameEncoder::request(&mut request, 40, i32::MAX, true).finish(b"");
    let head = encoded_head(&request).unwrap();
    assert_eq!(
        (head.code, head.opaque, head.is_response()),
        (40, i32::MAX, false)
    );
    // A header only (the body follows later) is enough; other layouts are not read.
    assert_eq!(encoded_head(&out[..70]).map(|h| h.opaque), Some(-7));
    assert_eq!(encoded_head(&out[..12]), None);
    assert_eq!(
        encoded_head(&frame(0, br#"{"flag":1,"code":0}"#, b"")),
        None
    );
}

#[test]
fn dropped_encoder_leaves_no_partial_frame() {
    let mut out = b"kept".to_vec();
    {
        let mut encoder = FrameEncoder::response(&mut out, 1, 2);
        encoder.remark("half").ext("k", "v");
    }
    assert_eq!(out, b"kept");
    let mut out = Vec::new();
    let encoder = FrameEncoder::response(&mut out, 0, 9);
    encoder.finish_header(3);
    out.extend_from_slice(b"abc");
    let (command, consumed) = decode_frame(&out).unwrap().unwrap();
    assert_eq!((command.body, consumed), (&b"abc"[..], out.len()));
}

#[test]
fn cpp_header_with_numbers_string_booleans_and_trailing_newline() {
    let header = concat!(
        r#"{"code":10,"extFields":{"AccessKey":"","batch":"0","bornTimestamp":"1795948679723","#,
        r#""defaultTopicQueueNums":4,"queueId":-1,"unitMode":"1","#,
        r#""properties":"TAGS\u0001TagA\u0002"},"#,
        r#""flag":0,"language":"CPP","opaque":0,"remark":"","version":63}"#,
        "\n"
    );
    let command = decode_json(header).unwrap();
    assert_eq!((command.code, command.opaque, command.version), (10, 0, 63));
    assert_eq!(command.language, LanguageCode::Cpp);
    assert_eq!(command.remark.as_deref(), Some(""));
    let fields = &command.ext_fields;
    assert_eq!(fields.get("AccessKey"), Some(""));
    assert_eq!(fields.get_non_empty("AccessKey"), None);
    assert_eq!(fields.required_i32("defaultTopicQueueNums").unwrap(), 4);
    assert_eq!(fields.get("queueId"), Some("-1"));
    assert_eq!(
        fields.required_i64("bornTimestamp").unwrap(),
        1_795_948_679_723
    );
    assert_eq!(fields.bool_lenient("batch"), Some(false));
    assert_eq!(fields.bool_lenient("unitMode"), Some(true));
    assert_eq!(fields.get("properties"), Some("TAGS\u{1}TagA\u{2}"));
}

#[test]
fn ali_ons_header_with_json_booleans_and_no_remark() {
    let header = concat!(
        r#"{"code":310,"language":"JAVA","opaque":1,"flag":0,"version":121,"#,
        r#""extFields":{"a":"g","d":4,"k":false,"sub":1795948689289,"x":1.5e3,"t":true}}"#
    );
    let command = decode_json(header).unwrap();
    assert!(command.remark.is_none());
    assert_eq!(command.language, LanguageCode::Java);
    assert_eq!(
        ext_pairs(&command),
        vec![
            ("a", "g"),
            ("d", "4"),
            ("k", "false"),
            ("sub", "1795948689289"),
            ("x", "1.5e3"),
            ("t", "true")
        ]
    );
    assert_eq!(command.ext_fields.bool_lenient("k"), Some(false));
}

#[test]
fn rust_header_with_nulls_and_unknown_keys() {
    let header = concat!(
        r#" { "code" : 0 , "language":"RUST","version":474,"opaque":3,"flag":1,"remark":null,"#,
        r#""extFields":null,"serializeTypeCurrentRPC":"JSON","#,
        r#""future":{"a":[1,{"b":null}],"c":"\"}"},"more":[]}"#
    );
    let command = decode_json(header).unwrap();
    assert!(command.is_response());
    assert_eq!(command.language, LanguageCode::Rust);
    assert!(command.remark.is_none() && command.ext_fields.is_empty());
    assert_eq!(command.code_name(), Some("SUCCESS"));

    let minimal = decode_json(r#"{"language":"KOTLIN","code":"105","ext":1}"#).unwrap();
    assert_eq!((minimal.code, minimal.language), (105, LanguageCode::Other));
}

#[test]
fn ext_nulls_are_dropped_and_nested_values_keep_their_text() {
    let header = r#"{"code":1,"extFields":{"gone":null,"obj":{"a": [1, "x"]},"arr":[],"k":"v"}}"#;
    let command = decode_json(header).unwrap();
    assert_eq!(
        ext_pairs(&command),
        vec![("obj", r#"{"a": [1, "x"]}"#), ("arr", "[]"), ("k", "v")]
    );
}

#[test]
fn escapes_allocate_only_when_present() {
    let header = concat!(
        r#"{"remark":"plain","extFields":{"p":"a\u0001b\n\"\\\/\t","emoji":"\ud83d\ude00","#,
        r#""lone":"x\ud800y","low":"\udc00","k\u0041":"é"}}"#
    );
    let command = decode_json(header).unwrap();
    assert!(matches!(command.remark, Some(Cow::Borrowed("plain"))));
    let fields = &command.ext_fields;
    assert_eq!(fields.get("p"), Some("a\u{1}b\n\"\\/\t"));
    assert_eq!(fields.get("emoji"), Some("😀"));
    assert_eq!(fields.get("lone"), Some("x\u{fffd}y"));
    assert_eq!(fields.get("low"), Some("\u{fffd}"));
    assert_eq!(fields.get("kA"), Some("é"));
}

#[test]
fn short_paths_read_as_the_general_ones() {
    // Integers: the plain form, and the forms left to the general path (ten digits, strings,
    // a sign, leading zeros, null); an escaped header key is found like a plain one.
    let header = concat!(
        r#"{"code":-2147483648,"opaque":2147483647,"flag":"12","version":000000000007,"#,
        r#""language":null,"extFields":{}}"#
    );
    let command = decode_json(header).unwrap();
    assert_eq!(
        (command.code, command.opaque, command.flag, command.version),
        (i32::MIN, i32::MAX, 12, 7)
    );
    for bad in [r#"{"code":1e3}"#, r#"{"code":-1.0}"#, r#"{"code":--1}"#] {
        assert!(decode_json(bad).is_err(), "accepted {bad}");
    }
    // Every ASCII byte written as \u00XX (either case), and the first one past ASCII.
    let mut written = String::new();
    let mut expected = String::new();
    for byte in 0u8..=0x80 {
        written.push_str(&format!("\\u00{byte:02x}\\u00{byte:02X}"));
        let decoded = char::from(byte);
        expected.push(decoded);
        expected.push(decoded);
    }
    let header = format!(r#"{{"extFields":{{"p":"{written}","k":"v"}}}}"#);
    let command = decode_json(&header).unwrap();
    assert_eq!(command.ext_fields.get("p"), Some(expected.as_str()));
    // A dropped entry whose key was unescaped leaves the next entries' text as it was.
    let header = r#"{"extFields":{"a\u0001":null,"b\u0002":"x\u0003","c":"y"}}"#;
    let command = decode_json(header).unwrap();
    assert_eq!(ext_pairs(&command), vec![("b\u{2}", "x\u{3}"), ("c", "y")]);
}

#[test]
fn huge_length_prefix_is_an_error_at_once() {
    for prefix in [u32::MAX, 0x8000_0000, FRAME_SIZE_MAX_BYTES as u32 - 3] {
        let error = decode_frame(&prefix.to_be_bytes()).unwrap_err();
        assert!(
            matches!(error, DecodeError::FrameTooLarge { .. }),
            "{prefix}"
        );
    }
    let largest = (FRAME_SIZE_MAX_BYTES - 4) as u32;
    assert!(decode_frame(&largest.to_be_bytes()).unwrap().is_none());
    assert_eq!(
        decode_frame(&[0, 0, 0, 3, 0, 0, 0]).unwrap_err(),
        DecodeError::FrameTooShort
    );
}

#[test]
fn every_truncation_of_a_frame_needs_more_bytes() {
    let mut out = Vec::new();
    let mut encoder = FrameEncoder::response(&mut out, 0, 7);
    encoder.ext("k", "v");
    encoder.finish(b"body");
    for cut in 0..out.len() {
        assert!(decode_frame(&out[..cut]).unwrap().is_none(), "cut at {cut}");
    }
    let first_len = out.len();
    FrameEncoder::request(&mut out, 11, 8, false).finish(b"");
    let (first, consumed) = decode_frame(&out).unwrap().unwrap();
    assert_eq!((first.opaque, consumed), (7, first_len));
    let (second, rest) = decode_frame(&out[consumed..]).unwrap().unwrap();
    assert_eq!(
        (second.opaque, second.code, consumed + rest),
        (8, 11, out.len())
    );
}

#[test]
fn bad_header_length_and_type_are_errors() {
    let mut bytes = frame(0, b"{}", b"");
    bytes[7] = 3; // H = 3 > L - 4 = 2
    assert!(matches!(
        decode_frame(&bytes),
        Err(DecodeError::HeaderLengthOutOfRange {
            header_length_bytes: 3,
            available_bytes: 2
        })
    ));
    assert_eq!(
        decode_frame(&frame(2, b"{}", b"")).unwrap_err(),
        DecodeError::UnknownSerializeType(2)
    );
    assert!(matches!(
        decode_frame(&frame(0, b"", b"")),
        Err(DecodeError::MalformedJsonHeader { .. })
    ));
    assert!(matches!(
        decode_frame(&frame(0, b"{\"remark\":\"\xff\"}", b"")),
        Err(DecodeError::JsonHeaderNotUtf8 { at: 11 })
    ));
}

#[test]
fn malformed_json_is_an_error() {
    let deep_ok = format!("{{\"x\":{}1{}}}", "[".repeat(14), "]".repeat(14));
    assert!(decode_json(&deep_ok).is_ok());
    let deep = format!("{{\"x\":{}{}}}", "[".repeat(100_000), "]".repeat(100_000));
    let cases = [
        "",
        "{",
        "[]",
        "null",
        r#"{"code":}"#,
        r#"{"code":1,}"#,
        r#"{"code":1} x"#,
        r#"{"code":1}}"#,
        r#"{"code":"x"}"#,
        r#"{"code":2147483648}"#,
        r#"{"code":1.5}"#,
        r#"{"code":-}"#,
        r#"{"code":tru}"#,
        r#"{"remark":1}"#,
        r#"{"language":2}"#,
        r#"{"extFields":[]}"#,
        r#"{"extFields":{"a"}}"#,
        r#"{"extFields":{"a":}}"#,
        r#"{"remark":"\x"}"#,
        r#"{"remark":"\u12"}"#,
        r#"{"remark":"\u12G4"}"#,
        r#"{"remark":"abc"#,
        r#"{"remark":"abc\"#,
        r#"{"a":[1,]}"#,
        r#"{"a":[1 2]}"#,
        r#"{"a":"\é"}"#,
        r#"{'code':1}"#,
        &deep,
    ];
    for case in cases {
        assert!(decode_json(case).is_err(), "accepted {case:.80}");
    }
    let too_many: String = (0..=EXT_FIELDS_COUNT_MAX)
        .map(|i| format!("\"k{i}\":\"v\","))
        .collect();
    let header = format!("{{\"extFields\":{{{}\"end\":null}}}}", too_many);
    assert!(matches!(
        decode_json(&header),
        Err(DecodeError::TooManyExtFields { .. })
    ));
}

#[test]
fn binary_header_frame_decodes() {
    let template = RemotingCommand {
        code: 34,
        language: LanguageCode::Go,
        version: 317,
        opaque: 99,
        flag: 0,
        remark: None,
        ext_fields: ExtFields::new(),
        body: b"",
        serialize_type: SerializeType::RocketMq,
    };
    let header = binary_header::encode_for_test(&template, &[("clientID", "c1")]);
    let bytes = frame(1, &header, b"{}");
    let (command, consumed) = decode_frame(&bytes).unwrap().unwrap();
    assert_eq!(consumed, bytes.len());
    assert_eq!(
        (command.code, command.language, command.opaque),
        (34, LanguageCode::Go, 99)
    );
    assert_eq!(command.serialize_type, SerializeType::RocketMq);
    assert_eq!(command.ext_fields.get("clientID"), Some("c1"));
    assert_eq!(command.body, b"{}");
}

#[test]
fn read_frame_takes_exactly_one_frame_from_a_reader() {
    let mut wire = Vec::new();
    let mut first = FrameEncoder::response(&mut wire, response_code::SUCCESS, 5);
    first.ext("queueId", "1");
    first.finish(b"one");
    FrameEncoder::request(&mut wire, request_code::HEART_BEAT, 6, true).finish(b"two");
    let mut reader = std::io::Cursor::new(wire);
    let mut buffer = Vec::new();
    let command = read_frame(&mut reader, &mut buffer).unwrap().unwrap();
    assert_eq!((command.code, command.opaque), (response_code::SUCCESS, 5));
    assert_eq!(command.ext_fields.get("queueId"), Some("1"));
    assert_eq!(command.body, b"one");
    let command = read_frame(&mut reader, &mut buffer).unwrap().unwrap();
    assert_eq!((command.opaque, command.is_oneway()), (6, true));
    assert_eq!(command.body, b"two");
    assert!(
        read_frame(&mut reader, &mut buffer).unwrap().is_none(),
        "clean end"
    );
}

#[test]
fn read_frame_rejects_hostile_and_truncated_frames() {
    let mut buffer = Vec::new();
    let hostile = [0x7F, 0xFF, 0xFF, 0xFF, 0, 0, 0, 2, b'{', b'}'];
    assert!(matches!(
        read_frame(&mut &hostile[..], &mut buffer),
        Err(ReadFrameError::Decode(DecodeError::FrameTooLarge { .. }))
    ));
    assert!(
        buffer.len() <= LENGTH_PREFIX_BYTES,
        "nothing allocated for it"
    );
    let mut whole = Vec::new();
    FrameEncoder::response(&mut whole, 0, 1).finish(b"body");
    for cut in [2, 9, whole.len() - 1] {
        match read_frame(&mut &whole[..cut], &mut buffer) {
            Err(ReadFrameError::Io(e)) => assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof),
            other => panic!("cut at {cut}: {other:?}"),
        }
    }
    let garbage = [0, 0, 0, 9, 0, 0, 0, 5, b'{', b'x', b'x', b'x', b'x'];
    assert!(matches!(
        read_frame(&mut &garbage[..], &mut buffer),
        Err(ReadFrameError::Decode(_))
    ));
}

// ---------------------------------------------------------------------------------------
// Property tests

fn text() -> impl Strategy<Value = String> {
    // Control chars, quotes, backslashes, non-ASCII and astral chars all show up.
    prop_oneof![
        "[\\x00-\\x1f\"\\\\a-z/]{0,12}",
        any::<String>(),
        "[é€😀\\u{1}\\u{2}A-Z]{0,8}",
    ]
}

fn ext_entries() -> impl Strategy<Value = Vec<(String, String)>> {
    prop::collection::vec((text(), text()), 0..12)
}

proptest! {
    #[test]
    fn encode_then_decode_round_trips(
        code in any::<i32>(),
        opaque in any::<i32>(),
        response in any::<bool>(),
        oneway in any::<bool>(),
        remark in prop::option::of(text()),
        ext in ext_entries(),
        number in any::<i64>(),
        body in prop::collection::vec(any::<u8>(), 0..64),
    ) {
        let mut out = Vec::new();
        let mut encoder = if response {
            FrameEncoder::response(&mut out, code, opaque)
        } else {
            FrameEncoder::request(&mut out, code, opaque, oneway)
        };
        if let Some(remark) = &remark {
            encoder.remark(remark);
        }
        for (key, value) in &ext {
            encoder.ext(key, value);
        }
        encoder.ext_i64("number", number);
        encoder.finish(&body);

        let (command, consumed) = decode_frame(&out).unwrap().unwrap();
        prop_assert_eq!(consumed, out.len());
        prop_assert_eq!((command.code, command.opaque), (code, opaque));
        prop_assert_eq!(command.is_response(), response);
        prop_assert_eq!(command.is_oneway(), !response && oneway);
        prop_assert_eq!(command.language, LanguageCode::Java);
        prop_assert_eq!(command.version, BROKER_VERSION);
        prop_assert_eq!(command.remark.as_deref(), remark.as_deref());
        let mut expected: Vec<(&str, &str)> =
            ext.iter().map(|(key, value)| (key.as_str(), value.as_str())).collect();
        let number_text = number.to_string();
        expected.push(("number", &number_text));
        prop_assert_eq!(ext_pairs(&command), expected);
        prop_assert_eq!(command.ext_fields.required_i64("number").unwrap(), number);
        prop_assert_eq!(command.body, &body[..]);
        // A standard JSON parser agrees with the header we wrote.
        let header_size = u32::from_be_bytes(out[4..8].try_into().unwrap()) as usize;
        let parsed: serde_json::Value = serde_json::from_slice(&out[8..8 + header_size]).unwrap();
        prop_assert_eq!(parsed["opaque"].as_i64(), Some(i64::from(opaque)));
    }

    #[test]
    fn binary_header_round_trips(
        code in any::<i16>(),
        language in 0u8..14,
        version in any::<i16>(),
        opaque in any::<i32>(),
        flag in any::<i32>(),
        remark in prop::option::of(text()),
        ext in ext_entries(),
        body in prop::collection::vec(any::<u8>(), 0..64),
    ) {
        let template = RemotingCommand {
            code: i32::from(code),
            language: LanguageCode::from_code(language),
            version: i32::from(version),
            opaque,
            flag,
            remark: remark.as_deref().map(Cow::Borrowed),
            ext_fields: ExtFields::new(),
            body: b"",
            serialize_type: SerializeType::RocketMq,
        };
        let pairs: Vec<(&str, &str)> =
            ext.iter().map(|(key, value)| (key.as_str(), value.as_str())).collect();
        let bytes = frame(1, &binary_header::encode_for_test(&template, &pairs), &body);
        let (command, consumed) = decode_frame(&bytes).unwrap().unwrap();
        prop_assert_eq!(consumed, bytes.len());
        prop_assert_eq!(
            (command.code, command.language, command.version, command.opaque, command.flag),
            (template.code, template.language, template.version, opaque, flag)
        );
        let expected_remark = remark.as_deref().filter(|remark| !remark.is_empty());
        prop_assert_eq!(command.remark.as_deref(), expected_remark);
        let expected: Vec<(&str, &str)> =
            pairs.iter().copied().filter(|(_, value)| !value.is_empty()).collect();
        prop_assert_eq!(ext_pairs(&command), expected);
        prop_assert_eq!(command.body, &body[..]);
    }

    #[test]
    fn json_values_in_ext_fields_decode_as_their_text(
        numbers in prop::collection::vec(any::<i64>(), 0..6),
        flags in prop::collection::vec(any::<bool>(), 0..6),
        float in any::<f64>().prop_filter("finite", |value| value.is_finite()),
    ) {
        let mut object = serde_json::Map::new();
        for (index, number) in numbers.iter().enumerate() {
            object.insert(format!("n{index}"), serde_json::json!(number));
        }
        for (index, flag) in flags.iter().enumerate() {
            object.insert(format!("b{index}"), serde_json::json!(flag));
        }
        object.insert("f".into(), serde_json::json!(float));
        let header = serde_json::json!({"code": 1, "extFields": object}).to_string();
        let command = decode_json(&header).unwrap();
        for (key, value) in &object {
            let text = value.to_string();
            prop_assert_eq!(command.ext_fields.get(key), Some(text.as_str()));
        }
    }

    #[test]
    fn headers_written_by_serde_json_decode_alike(
        remark in text(),
        ext in ext_entries(),
        pretty in any::<bool>(),
    ) {
        let object: serde_json::Map<String, serde_json::Value> =
            ext.into_iter().map(|(key, value)| (key, value.into())).collect();
        let header = serde_json::json!({
            "code": 310, "flag": 0, "language": "GO", "opaque": 5, "remark": remark,
            "extFields": object, "version": 317,
        });
        let text = if pretty {
            serde_json::to_string_pretty(&header).unwrap()
        } else {
            serde_json::to_string(&header).unwrap()
        };
        let command = decode_json(&text).unwrap();
        prop_assert_eq!((command.code, command.opaque, command.version), (310, 5, 317));
        prop_assert_eq!(command.language, LanguageCode::Go);
        prop_assert_eq!(command.remark.as_deref(), Some(remark.as_str()));
        prop_assert_eq!(command.ext_fields.len(), object.len());
        for (key, value) in &object {
            prop_assert_eq!(command.ext_fields.get(key), value.as_str());
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        let _ = decode_frame(&bytes);
    }

    #[test]
    fn arbitrary_headers_never_panic(
        type_byte in 0u8..3,
        header in prop_oneof![
            prop::collection::vec(any::<u8>(), 0..128),
            "[{}\\[\\]\":,0-9a-z\\\\ -]{0,64}".prop_map(String::into_bytes),
        ],
    ) {
        let _ = decode_frame(&frame(type_byte, &header, b""));
    }

    #[test]
    fn mutated_frames_never_panic(
        position in any::<prop::sample::Index>(),
        replacement in any::<u8>(),
        ext in ext_entries(),
    ) {
        let mut out = Vec::new();
        let mut encoder = FrameEncoder::response(&mut out, 0, 1);
        for (key, value) in &ext {
            encoder.ext(key, value);
        }
        encoder.finish(b"body");
        let index = position.index(out.len());
        out[index] = replacement;
        let _ = decode_frame(&out);
    }
}
