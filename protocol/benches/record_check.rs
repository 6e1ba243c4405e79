//! What checking a stored record costs a pull (issue 13: pulls check every record they serve):
//! per 1 KiB record on one core, reading TOTALSIZE and magic only (what pulls checked before)
//! against a whole decode with BODYCRC (what they check now). `cargo bench --bench
//! record_check` prints ns per record and the ratio; compare within one run.

use std::hint::black_box;
use std::net::SocketAddr;
use std::time::Instant;

use shardmq_protocol::record::{self, StoredMessage};

const RECORDS: usize = 4096;
const ROUNDS: usize = 5;
const PASSES: usize = 50;

fn records(body_bytes: usize) -> Vec<u8> {
    let host: SocketAddr = "127.0.0.1:10911".parse().unwrap();
    let body = vec![b'x'; body_bytes];
    let properties = b"UNIQ_KEY\x017F0000010A2C18B4AAC27D1A3F2B0000\x02TAGS\x01TagA\x02";
    let mut out = Vec::new();
    for i in 0..RECORDS {
        let message = StoredMessage {
            total_size: 0,
            body_crc: record::body_crc(&body),
            queue_id: 0,
            flag: 0,
            queue_offset: i as u64,
            physical_offset: out.len() as u64,
            sys_flag: 0,
            born_timestamp_ms: 1_764_420_000_000,
            born_host: host,
            store_timestamp_ms: 1_764_420_000_001,
            store_host: host,
            reconsume_times: 0,
            prepared_transaction_offset: 0,
            body: &body,
            topic: "BenchTopic",
            properties,
        };
        record::encode_into(&message, &mut out);
    }
    out
}

fn time_per_record(buf: &[u8], check: impl Fn(&[u8]) -> usize) -> f64 {
    let started = Instant::now();
    for _ in 0..PASSES {
        let mut at = 0;
        while at < buf.len() {
            at += black_box(check(&buf[at..]));
        }
    }
    started.elapsed().as_nanos() as f64 / (PASSES * RECORDS) as f64
}

fn main() {
    for body_bytes in [1024usize, 16 * 1024] {
        let buf = records(body_bytes);
        let peek = |b: &[u8]| record::peek_header(b).unwrap().0 as usize;
        let decode = |b: &[u8]| record::decode(b).unwrap().total_size as usize;
        let (mut best_peek, mut best_decode) = (f64::MAX, f64::MAX);
        for _ in 0..ROUNDS {
            best_peek = best_peek.min(time_per_record(&buf, peek));
            best_decode = best_decode.min(time_per_record(&buf, decode));
        }
        println!(
            "body {body_bytes} B: size+magic only {best_peek:.1} ns/record, whole decode with \
             BODYCRC {best_decode:.1} ns/record ({:.2} GB/s checked); the check adds \
             {:.1} ns/record",
            (body_bytes as f64) / best_decode,
            best_decode - best_peek
        );
    }
}
