//! Codec microbenchmark: what one SEND_MESSAGE_V2 costs the broker in header decoding and
//! answer encoding, per frame, on one core. `cargo bench --bench codec` prints ns/frame; run
//! two builds in one session and compare ratios (these machines are noisy).
//!
//! The request is shaped like the Java client's (one-letter V2 keys, fastjson's `\u0001` /
//! `\u0002` escapes in the properties, a 1 KiB body).

use std::hint::black_box;
use std::time::Instant;

use shardmq_protocol::remoting::{decode_frame, request_code, FrameEncoder};

const FRAMES_DEFAULT: usize = 400_000;
const ROUNDS: usize = 5;

/// Frames a round (`CODEC_FRAMES`, for a quick count of instructions under callgrind).
fn frames() -> usize {
    std::env::var("CODEC_FRAMES")
        .ok()
        .and_then(|frames| frames.parse().ok())
        .unwrap_or(FRAMES_DEFAULT)
}

fn send_request() -> Vec<u8> {
    let properties = "UNIQ_KEY\u{1}7F0000010A2C18B4AAC27D1A3F2B0000\u{2}WAIT\u{1}true\u{2}\
                      TAGS\u{1}TagA\u{2}KEYS\u{1}order-1234 user-77\u{2}";
    let body = vec![b'x'; 1024];
    let mut out = Vec::new();
    let mut frame = FrameEncoder::request(&mut out, request_code::SEND_MESSAGE_V2, 4242, false);
    frame
        .ext("a", "please_rename_unique_group_name")
        .ext("b", "BenchTopic")
        .ext("c", "TBW102")
        .ext("d", "4")
        .ext("e", "2")
        .ext("f", "0")
        .ext("g", "1764420000000")
        .ext("h", "0")
        .ext("i", properties)
        .ext("j", "0")
        .ext("k", "false")
        .ext("m", "false");
    frame.finish(&body);
    out
}

fn per_frame_ns(mut op: impl FnMut()) -> f64 {
    let frames = frames();
    let mut best = f64::MAX;
    for _ in 0..ROUNDS {
        let started = Instant::now();
        for _ in 0..frames {
            op();
        }
        best = best.min(started.elapsed().as_nanos() as f64 / frames as f64);
    }
    best
}

fn main() {
    let request = send_request();
    let decode = per_frame_ns(|| {
        let (command, length) = decode_frame(black_box(&request)).unwrap().unwrap();
        black_box((&command, length));
    });
    let mut out = Vec::with_capacity(1 << 20);
    let encode = per_frame_ns(|| {
        if out.len() > (1 << 20) - 512 {
            out.clear();
        }
        let mut frame = FrameEncoder::response(&mut out, 0, black_box(4242));
        frame
            .ext("msgId", "7F00000100002A9F0000000012345678")
            .ext_i64("queueId", 2)
            .ext_i64("queueOffset", 123_456)
            .ext("transactionId", "7F0000010A2C18B4AAC27D1A3F2B0000")
            .ext("MSG_REGION", "DefaultRegion")
            .ext("TRACE_ON", "true");
        frame.finish(&[]);
    });
    println!(
        "codec: SEND_MESSAGE_V2 request of {} bytes: decode {decode:.0} ns/frame; \
         send answer encode {encode:.0} ns/frame (best of {ROUNDS} rounds of {})",
        request.len(),
        frames()
    );
}
