//! Reading the stored messages of a PULL response body (REMOTING.md §5.1): only what the
//! consumer counts (born and store timestamps, body size, one property), walked in place.
//! Pure; a malformed record ends the walk with an error instead of a panic.
//!
//! | Field (IPv4 hosts) | Offset | Size |
//! |---|---|---|
//! | TOTALSIZE | 0 | 4 |
//! | MAGICCODE | 4 | 4 |
//! | SYSFLAG | 36 | 4 |
//! | BORNTIMESTAMP | 40 | 8 |
//! | BORNHOST | 48 | 8 (20 with sysFlag 0x10) |
//! | STORETIMESTAMP | after BORNHOST | 8 |
//! | STOREHOST | then | 8 (20 with sysFlag 0x20) |
//! | RECONSUMETIMES, PREPARED TX OFFSET | then | 4 + 8 |
//! | BODY length + body | then | 4 + b |
//! | TOPIC length + topic | then | 1 + t (2 + t for magic V2) |
//! | PROPERTIES length + properties | then | 2 + p |

/// Magic of a V2 record (two-byte topic length).
const MAGIC_V2: i32 = 0xDAA3_20ABu32 as i32;
const BORN_HOST_V6_FLAG: i32 = 0x10;
const STORE_HOST_V6_FLAG: i32 = 0x20;
const HOST_V4_BYTES: usize = 8;
const HOST_V6_BYTES: usize = 20;
const SYS_FLAG_AT: usize = 36;
const BORN_TIMESTAMP_AT: usize = 40;
const BORN_HOST_AT: usize = 48;

/// The parts of one stored message the consumer looks at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordView<'a> {
    pub born_timestamp_ms: i64,
    pub store_timestamp_ms: i64,
    pub body_size_bytes: usize,
    pub properties: &'a [u8],
}

impl<'a> RecordView<'a> {
    /// The value of property `name`, if present.
    pub fn property(&self, name: &str) -> Option<&'a [u8]> {
        self.properties
            .split(|&byte| byte == 2)
            .filter_map(|pair| {
                let at = pair.iter().position(|&byte| byte == 1)?;
                Some((&pair[..at], &pair[at + 1..]))
            })
            .find(|(key, _)| *key == name.as_bytes())
            .map(|(_, value)| value)
    }
}

/// Why a body could not be walked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed stored message at byte {at}: {why}")]
pub struct RecordError {
    pub at: usize,
    pub why: &'static str,
}

/// Every record of a PULL body, in order.
pub fn records(body: &[u8]) -> impl Iterator<Item = Result<RecordView<'_>, RecordError>> {
    let mut at = 0;
    std::iter::from_fn(move || {
        if at >= body.len() {
            return None;
        }
        let result = parse_one(&body[at..]).map_err(|why| RecordError { at, why });
        match &result {
            Ok((_, size)) => at += size,
            Err(_) => at = body.len(),
        }
        Some(result.map(|(view, _)| view))
    })
}

fn parse_one(record: &[u8]) -> Result<(RecordView<'_>, usize), &'static str> {
    let i32_at = |at: usize| -> Result<i32, &'static str> {
        let bytes = record.get(at..at + 4).ok_or("truncated")?;
        Ok(i32::from_be_bytes(bytes.try_into().expect("4 bytes")))
    };
    let i64_at = |at: usize| -> Result<i64, &'static str> {
        let bytes = record.get(at..at + 8).ok_or("truncated")?;
        Ok(i64::from_be_bytes(bytes.try_into().expect("8 bytes")))
    };
    let total = i32_at(0)?;
    if total < 0 || total as usize > record.len() {
        return Err("TOTALSIZE beyond the body");
    }
    let record = &record[..total as usize];
    let sys_flag = i32_at(SYS_FLAG_AT)?;
    let born_timestamp_ms = i64_at(BORN_TIMESTAMP_AT)?;
    let host_bytes = |flag| match sys_flag & flag {
        0 => HOST_V4_BYTES,
        _ => HOST_V6_BYTES,
    };
    let store_timestamp_at = BORN_HOST_AT + host_bytes(BORN_HOST_V6_FLAG);
    let store_timestamp_ms = i64_at(store_timestamp_at)?;
    let body_length_at = store_timestamp_at + 8 + host_bytes(STORE_HOST_V6_FLAG) + 4 + 8;
    let body_size_bytes = usize::try_from(i32_at(body_length_at)?).map_err(|_| "body length")?;
    let topic_length_at = body_length_at + 4 + body_size_bytes;
    let (topic_size_bytes, topic_length_bytes) = if i32_at(4)? == MAGIC_V2 {
        let bytes = record
            .get(topic_length_at..topic_length_at + 2)
            .ok_or("truncated")?;
        (u16::from_be_bytes([bytes[0], bytes[1]]) as usize, 2)
    } else {
        (*record.get(topic_length_at).ok_or("truncated")? as usize, 1)
    };
    let properties_length_at = topic_length_at + topic_length_bytes + topic_size_bytes;
    let bytes = record
        .get(properties_length_at..properties_length_at + 2)
        .ok_or("truncated")?;
    let properties_size_bytes = u16::from_be_bytes([bytes[0], bytes[1]]) as usize;
    let properties_at = properties_length_at + 2;
    let properties = record
        .get(properties_at..properties_at + properties_size_bytes)
        .ok_or("properties beyond TOTALSIZE")?;
    let view = RecordView {
        born_timestamp_ms,
        store_timestamp_ms,
        body_size_bytes,
        properties,
    };
    Ok((view, record.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A V1 record with IPv4 hosts, laid out by hand per §5.1.
    fn record(body: &[u8], topic: &str, properties: &str, born: i64, stored: i64) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&0i32.to_be_bytes()); // TOTALSIZE, patched below
        out.extend_from_slice(&(0xDAA3_20A7u32 as i32).to_be_bytes());
        out.extend_from_slice(&0i32.to_be_bytes()); // BODYCRC
        out.extend_from_slice(&1i32.to_be_bytes()); // QUEUEID
        out.extend_from_slice(&0i32.to_be_bytes()); // FLAG
        out.extend_from_slice(&7i64.to_be_bytes()); // QUEUEOFFSET
        out.extend_from_slice(&99i64.to_be_bytes()); // PHYSICALOFFSET
        out.extend_from_slice(&0i32.to_be_bytes()); // SYSFLAG
        out.extend_from_slice(&born.to_be_bytes());
        out.extend_from_slice(&[127, 0, 0, 1, 0, 0, 0x27, 0x0F]);
        out.extend_from_slice(&stored.to_be_bytes());
        out.extend_from_slice(&[10, 0, 0, 1, 0, 0, 0x2A, 0x9F]);
        out.extend_from_slice(&0i32.to_be_bytes()); // RECONSUMETIMES
        out.extend_from_slice(&0i64.to_be_bytes()); // PREPARED TX OFFSET
        out.extend_from_slice(&(body.len() as i32).to_be_bytes());
        out.extend_from_slice(body);
        out.push(topic.len() as u8);
        out.extend_from_slice(topic.as_bytes());
        out.extend_from_slice(&(properties.len() as u16).to_be_bytes());
        out.extend_from_slice(properties.as_bytes());
        let total = out.len() as i32;
        out[..4].copy_from_slice(&total.to_be_bytes());
        out
    }

    #[test]
    fn walks_concatenated_records_and_reads_a_property() {
        let mut body = record(
            b"hello",
            "T",
            "TAGS\u{1}a\u{2}BENCH_SENT_US\u{1}17\u{2}",
            5,
            6,
        );
        body.extend(record(&[0; 300], "Topic", "UNIQ_KEY\u{1}x\u{2}", 8, 9));
        let views: Vec<_> = records(&body).collect::<Result<_, _>>().unwrap();
        assert_eq!(views.len(), 2);
        assert_eq!(views[0].born_timestamp_ms, 5);
        assert_eq!(views[0].store_timestamp_ms, 6);
        assert_eq!(views[0].body_size_bytes, 5);
        assert_eq!(views[0].property("BENCH_SENT_US"), Some(&b"17"[..]));
        assert_eq!(views[0].property("TAGS"), Some(&b"a"[..]));
        assert_eq!(views[1].body_size_bytes, 300);
        assert_eq!(views[1].property("BENCH_SENT_US"), None);
    }

    #[test]
    fn a_truncated_body_is_an_error_not_a_panic() {
        let body = record(b"hello", "T", "A\u{1}b\u{2}", 1, 2);
        for cut in 0..body.len() {
            let result: Result<Vec<_>, _> = records(&body[..cut]).collect();
            assert!(cut == 0 || result.is_err(), "cut at {cut}");
        }
        let mut lying = body.clone();
        lying[..4].copy_from_slice(&10i32.to_be_bytes());
        assert!(records(&lying).next().unwrap().is_err());
    }
}
