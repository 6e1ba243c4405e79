//! The stored message record: RocketMQ's commitlog format, byte for byte (REMOTING.md §5.1).
//!
//! Pure code, no I/O: the store encodes with it, recovery and reads validate with it, and the
//! client library decodes PULL bodies with it (a pull body is the concatenation of records).
//! All integers are big-endian.
//!
//! | # | Field | Size (bytes) | Offset (IPv4 hosts, magic V1) |
//! |---|---|---|---|
//! | 1 | TOTALSIZE (whole record, this field included) | 4 | 0 |
//! | 2 | MAGICCODE (V1 0xDAA320A7, V2 0xDAA320AB, blank 0xCBD43194) | 4 | 4 |
//! | 3 | BODYCRC = crc32(body) & 0x7FFFFFFF | 4 | 8 |
//! | 4 | QUEUEID | 4 | 12 |
//! | 5 | FLAG | 4 | 16 |
//! | 6 | QUEUEOFFSET | 8 | 20 |
//! | 7 | PHYSICALOFFSET | 8 | 28 |
//! | 8 | SYSFLAG (0x10: born host is IPv6, 0x20: store host is IPv6) | 4 | 36 |
//! | 9 | BORNTIMESTAMP (ms) | 8 | 40 |
//! | 10 | BORNHOST: IPv4 4 + port i32 (IPv6: 16 + 4) | 8 / 20 | 48 |
//! | 11 | STORETIMESTAMP (ms) | 8 | 56 |
//! | 12 | STOREHOST (same form) | 8 / 20 | 64 |
//! | 13 | RECONSUMETIMES | 4 | 72 |
//! | 14 | PREPARED TRANSACTION OFFSET | 8 | 76 |
//! | 15 | BODY length i32 + body | 4 + b | 84 |
//! | 16 | TOPIC length (u8 for V1, i16 for V2) + UTF-8 topic | 1/2 + t | 88 + b |
//! | 17 | PROPERTIES length i16 + properties | 2 + p | 89 + b + t |
//!
//! Size with IPv4 hosts and magic V1: 91 + b + t + p. The blank filler that ends a commitlog
//! segment is TOTALSIZE (to the segment's end) + BLANK magic, then zeros.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

pub use crate::error::RecordError;
pub use crate::hash::java_string_hash;
pub use crate::msg_id::{
    offset_msg_id, parse_offset_msg_id, push_offset_msg_id, OFFSET_MSG_ID_V4_CHARS,
    OFFSET_MSG_ID_V6_CHARS,
};

/// Record magic for 1-byte topic lengths: what this store writes.
pub const MAGIC_CODE_V1: i32 = 0xDAA3_20A7_u32 as i32;
/// Record magic for 2-byte topic lengths (Java brokers, topics over 127 bytes): decoded only.
pub const MAGIC_CODE_V2: i32 = 0xDAA3_20AB_u32 as i32;
/// Magic of the filler that pads a commitlog segment to its end.
pub const BLANK_MAGIC_CODE: i32 = 0xCBD4_3194_u32 as i32;
/// Bytes of a record with IPv4 hosts, magic V1, empty body, topic and properties.
pub const RECORD_FIXED_BYTES: usize = 91;
/// SYSFLAG bit: BORNHOST is IPv6 (20 bytes instead of 8).
pub const BORNHOST_V6_FLAG: i32 = 0x10;
/// SYSFLAG bit: STOREHOST is IPv6 (20 bytes instead of 8).
pub const STOREHOST_V6_FLAG: i32 = 0x20;
/// Bytes the blank filler header takes (TOTALSIZE + MAGICCODE): a segment always keeps them.
pub const BLANK_HEADER_BYTES: usize = 8;
/// Where PHYSICALOFFSET lies in a record (the same for both magic codes and host families).
pub const PHYSICAL_OFFSET_AT: usize = 28;
/// Offset of STORETIMESTAMP in a record with an IPv4 born host (any store host).
pub const STORE_TIMESTAMP_OFFSET_V4_BORN: usize = 56;

/// One decoded record; borrowed slices point into the buffer it was decoded from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredMessage<'a> {
    pub total_size: u32,
    pub body_crc: u32,
    pub queue_id: u32,
    pub flag: i32,
    pub queue_offset: u64,
    pub physical_offset: u64,
    pub sys_flag: i32,
    pub born_timestamp_ms: i64,
    pub born_host: SocketAddr,
    pub store_timestamp_ms: i64,
    pub store_host: SocketAddr,
    pub reconsume_times: i32,
    pub prepared_transaction_offset: i64,
    pub body: &'a [u8],
    pub topic: &'a str,
    pub properties: &'a [u8],
}

/// Size of a record with IPv4 hosts and magic V1: 91 + body + topic + properties.
pub const fn encoded_size(body_len: usize, topic_len: usize, properties_len: usize) -> usize {
    RECORD_FIXED_BYTES + body_len + topic_len + properties_len
}

fn host_bytes(addr: &SocketAddr) -> usize {
    match addr {
        SocketAddr::V4(_) => 8,
        SocketAddr::V6(_) => 20,
    }
}

/// Size of `msg` encoded with magic V1 and its hosts' families.
pub fn encoded_size_of(msg: &StoredMessage<'_>) -> usize {
    encoded_size(msg.body.len(), msg.topic.len(), msg.properties.len())
        + host_bytes(&msg.born_host)
        + host_bytes(&msg.store_host)
        - 16
}

/// BODYCRC as RocketMQ stores it.
pub fn body_crc(body: &[u8]) -> u32 {
    crc32fast::hash(body) & 0x7FFF_FFFF
}

/// A writer over a slice sized exactly for one record (overrunning it is a bug: panics).
struct SliceWriter<'o> {
    out: &'o mut [u8],
    pos: usize,
}

impl SliceWriter<'_> {
    fn put(&mut self, bytes: &[u8]) {
        self.out[self.pos..self.pos + bytes.len()].copy_from_slice(bytes);
        self.pos += bytes.len();
    }

    fn put_host(&mut self, addr: &SocketAddr) {
        match addr {
            SocketAddr::V4(a) => self.put(&a.ip().octets()),
            SocketAddr::V6(a) => self.put(&a.ip().octets()),
        }
        self.put(&i32::from(addr.port()).to_be_bytes());
    }
}

/// Appends `msg` to `out` with magic V1; see [`encode_to`]. Returns the size.
pub fn encode_into(msg: &StoredMessage<'_>, out: &mut Vec<u8>) -> usize {
    let size = encoded_size_of(msg);
    let start = out.len();
    out.resize(start + size, 0);
    encode_to(msg, &mut out[start..]);
    size
}

/// Writes `msg` with magic V1 into `out`, which must be exactly [`encoded_size_of`] bytes
/// (the append path hands out room in the commitlog tail itself). TOTALSIZE and BODYCRC are
/// computed here (the given ones are ignored); the two host-family SYSFLAG bits are set from
/// the hosts. Panics if the topic exceeds 255 bytes or properties 32767 (callers check
/// limits first) or if `out` has another size.
pub fn encode_to(msg: &StoredMessage<'_>, out: &mut [u8]) {
    write_record(msg, &[msg.properties], out);
}

/// The seal of a record written over a reused commitlog segment: a last property `__CRC32#`,
/// in the format of RocketMQ's `enabledAppendPropCRC` (`MessageDecoder.createCrc32`): the
/// CRC32 (IEEE, masked to 31 bits as `UtilAll.crc32` does) of every byte of the record before
/// the property, in ten decimal digits, the least significant first. BODYCRC covers only the
/// body; over space a segment held before, a torn write leaves old bytes (not zeros) in the
/// rest, and the seal is what tells them apart.
pub const SEAL_KEY: &[u8] = b"__CRC32#";
const SEAL_DIGITS: usize = 10;
/// A seal's bytes: the key, 0x01, ten digits, 0x02.
pub const SEAL_BYTES: usize = SEAL_KEY.len() + 1 + SEAL_DIGITS + 1;
/// What sealing may add to a message's properties: a separator and the seal.
pub const SEAL_BYTES_MAX: usize = SEAL_BYTES + 1;

/// Whether `properties` end with a property shaped as a seal.
fn ends_with_seal(properties: &[u8]) -> bool {
    let Some(at) = properties.len().checked_sub(SEAL_BYTES) else {
        return false;
    };
    let starts_pair = at == 0 || properties[at - 1] == PROPERTY_SEPARATOR;
    starts_pair && seal_shaped(&properties[at..])
}

/// Whether `seal` (SEAL_BYTES long) is the key, 0x01, ten digits and 0x02.
fn seal_shaped(seal: &[u8]) -> bool {
    seal.starts_with(SEAL_KEY)
        && seal[SEAL_KEY.len()] == NAME_VALUE_SEPARATOR
        && seal[SEAL_KEY.len() + 1..SEAL_BYTES - 1]
            .iter()
            .all(u8::is_ascii_digit)
        && seal[SEAL_BYTES - 1] == PROPERTY_SEPARATOR
}

const NAME_VALUE_SEPARATOR: u8 = 0x01;
const PROPERTY_SEPARATOR: u8 = 0x02;

/// The properties a sealed record keeps in front of its seal: the given ones less a seal they
/// end with (a message read from a sealed record and stored again gets a new one), and
/// whether a separator must follow them (they do not end with one).
fn before_seal(properties: &[u8]) -> (&[u8], bool) {
    let kept = if ends_with_seal(properties) {
        &properties[..properties.len() - SEAL_BYTES]
    } else {
        properties
    };
    let separator = kept.last().is_some_and(|&b| b != PROPERTY_SEPARATOR);
    (kept, separator)
}

/// Length of the properties a sealed record of `properties` stores, its seal included.
pub fn sealed_properties_len(properties: &[u8]) -> usize {
    let (kept, separator) = before_seal(properties);
    kept.len() + usize::from(separator) + SEAL_BYTES
}

/// [`encode_to`] with a seal: `out` must be [`encoded_size_of`] bytes for properties of
/// [`sealed_properties_len`].
pub fn encode_sealed_to(msg: &StoredMessage<'_>, out: &mut [u8]) {
    let (kept, separator) = before_seal(msg.properties);
    let separator: &[u8] = if separator {
        &[PROPERTY_SEPARATOR]
    } else {
        &[]
    };
    let mut seal = [b'0'; SEAL_BYTES];
    seal[..SEAL_KEY.len()].copy_from_slice(SEAL_KEY);
    seal[SEAL_KEY.len()] = NAME_VALUE_SEPARATOR;
    seal[SEAL_BYTES - 1] = PROPERTY_SEPARATOR;
    write_record(msg, &[kept, separator, &seal], out);
    let sealed_at = out.len() - SEAL_BYTES;
    let mut value = seal_crc(&out[..sealed_at]);
    let digits_at = out.len() - SEAL_DIGITS - 1;
    for digit in &mut out[digits_at..digits_at + SEAL_DIGITS] {
        *digit = b'0' + (value % 10) as u8;
        value /= 10;
    }
}

/// The value a seal holds for the record bytes in front of it.
fn seal_crc(before: &[u8]) -> u32 {
    crc32fast::hash(before) & 0x7FFF_FFFF
}

/// Whether `record` (one whole record) ends with a seal that matches its bytes.
pub fn seal_holds(record: &[u8]) -> bool {
    let Some(at) = record.len().checked_sub(SEAL_BYTES) else {
        return false;
    };
    if !seal_shaped(&record[at..]) {
        return false;
    }
    let digits_at = record.len() - SEAL_DIGITS - 1;
    let value = record[digits_at..digits_at + SEAL_DIGITS]
        .iter()
        .rev()
        .fold(0u64, |value, digit| value * 10 + u64::from(digit - b'0'));
    value == u64::from(seal_crc(&record[..at]))
}

/// Writes `msg` with its properties given as the concatenation of `properties`.
fn write_record(msg: &StoredMessage<'_>, properties: &[&[u8]], out: &mut [u8]) {
    let properties_len: usize = properties.iter().map(|p| p.len()).sum();
    assert!(
        msg.topic.len() <= usize::from(u8::MAX),
        "topic length checked by the caller"
    );
    assert!(
        properties_len <= i16::MAX as usize,
        "properties length checked by the caller"
    );
    let size = encoded_size_of(msg) - msg.properties.len() + properties_len;
    assert_eq!(out.len(), size, "room for exactly one record");
    let mut sys_flag = msg.sys_flag & !(BORNHOST_V6_FLAG | STOREHOST_V6_FLAG);
    if msg.born_host.is_ipv6() {
        sys_flag |= BORNHOST_V6_FLAG;
    }
    if msg.store_host.is_ipv6() {
        sys_flag |= STOREHOST_V6_FLAG;
    }
    let mut w = SliceWriter { out, pos: 0 };
    w.put(&(size as i32).to_be_bytes());
    w.put(&MAGIC_CODE_V1.to_be_bytes());
    w.put(&body_crc(msg.body).to_be_bytes());
    w.put(&msg.queue_id.to_be_bytes());
    w.put(&msg.flag.to_be_bytes());
    w.put(&msg.queue_offset.to_be_bytes());
    w.put(&msg.physical_offset.to_be_bytes());
    w.put(&sys_flag.to_be_bytes());
    w.put(&msg.born_timestamp_ms.to_be_bytes());
    w.put_host(&msg.born_host);
    w.put(&msg.store_timestamp_ms.to_be_bytes());
    w.put_host(&msg.store_host);
    w.put(&msg.reconsume_times.to_be_bytes());
    w.put(&msg.prepared_transaction_offset.to_be_bytes());
    w.put(&(msg.body.len() as i32).to_be_bytes());
    w.put(msg.body);
    w.put(&[msg.topic.len() as u8]);
    w.put(msg.topic.as_bytes());
    w.put(&(properties_len as i16).to_be_bytes());
    for part in properties {
        w.put(part);
    }
    assert_eq!(w.pos, size, "record size equals its computed size");
}

/// A bounds-checked big-endian reader over one record.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, field: &'static str) -> Result<&'a [u8], RecordError> {
        let end = self
            .pos
            .checked_add(n)
            .ok_or(RecordError::FieldOverrun(field))?;
        let bytes = self
            .buf
            .get(self.pos..end)
            .ok_or(RecordError::FieldOverrun(field))?;
        self.pos = end;
        Ok(bytes)
    }
    fn array<const N: usize>(&mut self, field: &'static str) -> Result<[u8; N], RecordError> {
        let bytes = self.take(N, field)?;
        let mut out = [0u8; N];
        out.copy_from_slice(bytes);
        Ok(out)
    }
    fn i16(&mut self, field: &'static str) -> Result<i16, RecordError> {
        Ok(i16::from_be_bytes(self.array(field)?))
    }
    fn i32(&mut self, field: &'static str) -> Result<i32, RecordError> {
        Ok(i32::from_be_bytes(self.array(field)?))
    }
    fn i64(&mut self, field: &'static str) -> Result<i64, RecordError> {
        Ok(i64::from_be_bytes(self.array(field)?))
    }
    fn host(&mut self, ipv6: bool, field: &'static str) -> Result<SocketAddr, RecordError> {
        let ip = if ipv6 {
            IpAddr::V6(Ipv6Addr::from(self.array::<16>(field)?))
        } else {
            IpAddr::V4(Ipv4Addr::from(self.array::<4>(field)?))
        };
        // Ports are stored as i32; anything outside u16 is kept modulo 2^16 like Java's cast.
        let port = self.i32(field)? as u16;
        Ok(SocketAddr::new(ip, port))
    }
    fn length(&mut self, field: &'static str) -> Result<usize, RecordError> {
        usize::try_from(self.i32(field)?).map_err(|_| RecordError::FieldOverrun(field))
    }
    /// TOPICLEN: one byte in magic V1 records, two in V2.
    fn topic_length(&mut self, magic: i32) -> Result<usize, RecordError> {
        if magic == MAGIC_CODE_V1 {
            Ok(usize::from(self.array::<1>("TOPIC")?[0]))
        } else {
            usize::try_from(self.i16("TOPIC")?).map_err(|_| RecordError::FieldOverrun("TOPIC"))
        }
    }
    /// PROPERTIESLEN, two bytes.
    fn properties_length(&mut self) -> Result<usize, RecordError> {
        usize::try_from(self.i16("PROPERTIES")?)
            .map_err(|_| RecordError::FieldOverrun("PROPERTIES"))
    }
}

/// Reads TOTALSIZE and MAGICCODE of the record starting `buf`, without validating the rest.
pub fn peek_header(buf: &[u8]) -> Option<(i32, i32)> {
    let size = i32::from_be_bytes(buf.get(0..4)?.try_into().ok()?);
    let magic = i32::from_be_bytes(buf.get(4..8)?.try_into().ok()?);
    Some((size, magic))
}

/// TOTALSIZE (as a size) and MAGICCODE of the record starting `buf`: a known magic code and a
/// size that is not negative, or the error saying why not.
fn checked_header(buf: &[u8]) -> Result<(usize, i32), RecordError> {
    let (size, magic) = peek_header(buf).ok_or(RecordError::Truncated {
        need_bytes: 8,
        have_bytes: buf.len(),
    })?;
    if magic != MAGIC_CODE_V1 && magic != MAGIC_CODE_V2 {
        return Err(RecordError::BadMagic(magic));
    }
    let size = usize::try_from(size).map_err(|_| RecordError::BadSize(size))?;
    Ok((size, magic))
}

/// The record of `size` bytes at the start of `buf`, or `Truncated`.
fn whole_record(buf: &[u8], size: usize) -> Result<&[u8], RecordError> {
    buf.get(..size).ok_or(RecordError::Truncated {
        need_bytes: size,
        have_bytes: buf.len(),
    })
}

/// Decodes the record at the start of `buf`, checking TOTALSIZE, magic, field bounds and
/// BODYCRC. Accepts magic V1 and V2 and IPv6 hosts.
pub fn decode(buf: &[u8]) -> Result<StoredMessage<'_>, RecordError> {
    decode_checking(buf, true)
}

/// [`decode`] without the BODYCRC check, for bytes whose body was checked before and has not
/// changed since, or never left memory.
pub fn decode_body_unchecked(buf: &[u8]) -> Result<StoredMessage<'_>, RecordError> {
    decode_checking(buf, false)
}

#[inline(always)]
fn decode_checking(buf: &[u8], check_body_crc: bool) -> Result<StoredMessage<'_>, RecordError> {
    let (total, magic) = checked_header(buf)?;
    if total < RECORD_FIXED_BYTES {
        // Lossless: the size was read as a non-negative i32.
        return Err(RecordError::BadSize(total as i32));
    }
    let record = whole_record(buf, total)?;
    let mut r = Reader {
        buf: record,
        pos: 8,
    };
    let body_crc = r.i32("BODYCRC")? as u32;
    let queue_id = r.i32("QUEUEID")? as u32;
    let flag = r.i32("FLAG")?;
    let queue_offset = r.i64("QUEUEOFFSET")? as u64;
    let physical_offset = r.i64("PHYSICALOFFSET")? as u64;
    let sys_flag = r.i32("SYSFLAG")?;
    let born_timestamp_ms = r.i64("BORNTIMESTAMP")?;
    let born_host = r.host(sys_flag & BORNHOST_V6_FLAG != 0, "BORNHOST")?;
    let store_timestamp_ms = r.i64("STORETIMESTAMP")?;
    let store_host = r.host(sys_flag & STOREHOST_V6_FLAG != 0, "STOREHOST")?;
    let reconsume_times = r.i32("RECONSUMETIMES")?;
    let prepared_transaction_offset = r.i64("PREPAREDTRANSACTIONOFFSET")?;
    let body_len = r.length("BODY")?;
    let body = r.take(body_len, "BODY")?;
    let topic_len = r.topic_length(magic)?;
    let topic =
        std::str::from_utf8(r.take(topic_len, "TOPIC")?).map_err(|_| RecordError::TopicNotUtf8)?;
    let properties_len = r.properties_length()?;
    let properties = r.take(properties_len, "PROPERTIES")?;
    if r.pos != total {
        return Err(RecordError::SizeMismatch {
            fields_end_bytes: r.pos,
            total_size_bytes: total,
        });
    }
    if check_body_crc {
        let computed = self::body_crc(body);
        if computed != body_crc {
            return Err(RecordError::CrcMismatch {
                stored: body_crc,
                computed,
            });
        }
    }
    Ok(StoredMessage {
        total_size: total as u32,
        body_crc,
        queue_id,
        flag,
        queue_offset,
        physical_offset,
        sys_flag,
        born_timestamp_ms,
        born_host,
        store_timestamp_ms,
        store_host,
        reconsume_times,
        prepared_transaction_offset,
        body,
        topic,
        properties,
    })
}

/// The PROPERTIES field of the record at the start of `buf`, found by walking the length
/// fields only: no BODYCRC check and no other field decoded, for filters that look at the
/// properties of many records.
pub fn properties_of(buf: &[u8]) -> Result<&[u8], RecordError> {
    let (size, magic) = checked_header(buf)?;
    let record = whole_record(buf, size)?;
    let mut r = Reader {
        buf: record,
        pos: 36,
    };
    let sys_flag = r.i32("SYSFLAG")?;
    let host_bytes = |flag: i32| if sys_flag & flag != 0 { 20 } else { 8 };
    // BORNTIMESTAMP, BORNHOST, STORETIMESTAMP, STOREHOST, RECONSUMETIMES, PREPARED OFFSET.
    let skipped = 8 + host_bytes(BORNHOST_V6_FLAG) + 8 + host_bytes(STOREHOST_V6_FLAG) + 4 + 8;
    r.take(skipped, "STOREHOST")?;
    let body_len = r.length("BODY")?;
    r.take(body_len, "BODY")?;
    let topic_len = r.topic_length(magic)?;
    r.take(topic_len, "TOPIC")?;
    let properties_len = r.properties_length()?;
    r.take(properties_len, "PROPERTIES")
}

/// Decodes a concatenation of records (a PULL body). Every byte must belong to a record.
pub fn decode_all(buf: &[u8]) -> Result<Vec<StoredMessage<'_>>, RecordError> {
    iter(buf).collect()
}

/// The records of a concatenation (a PULL body), decoded one by one without collecting them;
/// the first malformed record is the last item.
pub fn iter(buf: &[u8]) -> Records<'_> {
    Records { rest: buf }
}

/// Iterator of [`iter`].
pub struct Records<'a> {
    rest: &'a [u8],
}

impl<'a> Iterator for Records<'a> {
    type Item = Result<StoredMessage<'a>, RecordError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.is_empty() {
            return None;
        }
        match decode(self.rest) {
            Ok(message) => {
                self.rest = &self.rest[message.total_size as usize..];
                Some(Ok(message))
            }
            Err(error) => {
                self.rest = &[];
                Some(Err(error))
            }
        }
    }
}

/// Value of property `name` in an encoded properties string (`name\x01value\x02...`).
pub fn property<'a>(properties: &'a [u8], name: &str) -> Option<&'a [u8]> {
    properties.split(|&b| b == 2).find_map(|pair| {
        let split = pair.iter().position(|&b| b == 1)?;
        (&pair[..split] == name.as_bytes()).then(|| &pair[split + 1..])
    })
}

/// The tags code RocketMQ gives a record: hash of its TAGS property, 0 when it has none.
/// Recovery uses it to rebuild consume-queue units (see `StoreConfig::tags_code_of`).
pub fn tags_code_from_properties(msg: &StoredMessage<'_>) -> i64 {
    match property(msg.properties, "TAGS").and_then(|t| std::str::from_utf8(t).ok()) {
        Some(tags) if !tags.is_empty() => i64::from(java_string_hash(tags)),
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddrV4;

    fn sample<'a>(body: &'a [u8], topic: &'a str, props: &'a [u8]) -> StoredMessage<'a> {
        StoredMessage {
            total_size: 0,
            body_crc: 0,
            queue_id: 3,
            flag: 7,
            queue_offset: 42,
            physical_offset: 4096,
            sys_flag: 0,
            born_timestamp_ms: 1_700_000_000_000,
            born_host: "10.0.0.1:5555".parse().unwrap(),
            store_timestamp_ms: 1_700_000_000_001,
            store_host: "10.0.0.2:10911".parse().unwrap(),
            reconsume_times: 1,
            prepared_transaction_offset: -1,
            body,
            topic,
            properties: props,
        }
    }

    fn sealed(msg: &StoredMessage<'_>) -> Vec<u8> {
        let len = sealed_properties_len(msg.properties);
        let size = encoded_size_of(msg) - msg.properties.len() + len;
        let mut out = vec![0u8; size];
        encode_sealed_to(msg, &mut out);
        out
    }

    #[test]
    fn a_seal_is_the_last_property_and_covers_every_byte_before_it() {
        for props in [&b""[..], b"KEYS\x01k1\x02", b"TAGS\x01a\x02UNIQ_KEY\x01u"] {
            let msg = sample(b"hello", "TopicA", props);
            let bytes = sealed(&msg);
            assert!(seal_holds(&bytes), "{props:?}");
            let decoded = decode(&bytes).unwrap();
            let parsed: std::collections::HashMap<&str, &str> =
                crate::body::parse_properties(decoded.properties)
                    .into_iter()
                    .collect();
            // RocketMQ's: CRC32 & 0x7FFFFFFF of the bytes before the property, ten digits
            // from the least significant.
            let crc = crc32fast::hash(&bytes[..bytes.len() - SEAL_BYTES]) & 0x7FFF_FFFF;
            let digits: String = format!("{crc:010}").chars().rev().collect();
            assert_eq!(parsed.get("__CRC32#").copied(), Some(&*digits));
            // Every other property is kept as it was.
            let given = crate::body::parse_properties(props);
            assert_eq!(parsed.len(), given.len() + 1);
            for (key, value) in given {
                assert_eq!(parsed.get(key), Some(&value));
            }
            // Any changed byte breaks it: the body (BODYCRC's), a header field, a property.
            for at in [20, 100, bytes.len() - 15, bytes.len() - 5] {
                let mut torn = bytes.clone();
                torn[at] ^= 0x40;
                assert!(!seal_holds(&torn), "byte {at} of {props:?}");
            }
            // Stored again, a sealed message's properties get one seal, a new one.
            let mut again = sample(b"hello", "TopicA", decoded.properties);
            again.physical_offset = 8192;
            let resealed = sealed(&again);
            assert_eq!(resealed.len(), bytes.len());
            assert!(seal_holds(&resealed));
            assert_ne!(resealed[bytes.len() - 11..], bytes[bytes.len() - 11..]);
        }
        // An unsealed record, and one whose last property is not a seal, do not hold one.
        let mut plain = Vec::new();
        encode_into(&sample(b"x", "T", b"A\x01b\x02"), &mut plain);
        assert!(!seal_holds(&plain));
    }

    #[test]
    fn magic_values_match_java() {
        assert_eq!(MAGIC_CODE_V1, -626843481);
        assert_eq!(MAGIC_CODE_V2, -626843477);
        assert_eq!(BLANK_MAGIC_CODE, -875286124);
    }

    #[test]
    fn round_trip_and_size() {
        let msg = sample(b"hello", "TopicA", b"TAGS\x01a\x02");
        let mut out = Vec::new();
        let size = encode_into(&msg, &mut out);
        assert_eq!(size, encoded_size(5, 6, 7));
        let back = decode(&out).unwrap();
        assert_eq!(back.total_size as usize, size);
        assert_eq!(back.body_crc, body_crc(b"hello"));
        assert_eq!(
            StoredMessage {
                total_size: 0,
                body_crc: 0,
                ..back
            },
            msg
        );
        let mut corrupt = out.clone();
        let body_at = 84 + 4;
        corrupt[body_at] ^= 1;
        assert!(matches!(
            decode(&corrupt),
            Err(RecordError::CrcMismatch { .. })
        ));
        assert!(matches!(
            decode(&out[..size - 1]),
            Err(RecordError::Truncated { .. })
        ));
    }

    #[test]
    fn properties_are_found_without_decoding() {
        let mut msg = sample(b"body bytes", "TopicA", b"a\x011\x02TAGS\x01x\x02");
        for born_v6 in [false, true] {
            if born_v6 {
                msg.born_host = "[::1]:9".parse().unwrap();
            }
            let mut out = Vec::new();
            encode_into(&msg, &mut out);
            out.extend_from_slice(b"next record");
            assert_eq!(properties_of(&out), Ok(&b"a\x011\x02TAGS\x01x\x02"[..]));
            // A wrong BODYCRC does not matter here; a length past TOTALSIZE does.
            out[8] ^= 1;
            assert!(properties_of(&out).is_ok());
            let total = msg_size(&out);
            assert!(matches!(
                properties_of(&out[..total - 1]),
                Err(RecordError::Truncated { .. })
            ));
            let mut bad = out.clone();
            let props_len_at = total - 2 - msg.properties.len();
            bad[props_len_at] = 0x40;
            assert!(matches!(
                properties_of(&bad),
                Err(RecordError::FieldOverrun("PROPERTIES"))
            ));
        }
        assert!(matches!(
            properties_of(&[0, 0, 0, 9, 1, 2, 3, 4]),
            Err(RecordError::BadMagic(_))
        ));
    }

    fn msg_size(buf: &[u8]) -> usize {
        peek_header(buf).unwrap().0 as usize
    }

    #[test]
    fn ipv6_hosts_round_trip() {
        let mut msg = sample(b"x", "T", b"");
        msg.born_host = "[::1]:9".parse().unwrap();
        let mut out = Vec::new();
        encode_into(&msg, &mut out);
        let back = decode(&out).unwrap();
        assert_eq!(back.born_host, msg.born_host);
        assert_eq!(back.sys_flag, BORNHOST_V6_FLAG);
        assert_eq!(back.store_host, msg.store_host);
    }

    #[test]
    fn msg_id_round_trip() {
        let host: SocketAddrV4 = "192.168.1.7:10911".parse().unwrap();
        let id = offset_msg_id(host.into(), 0x0012_3456_789A);
        assert_eq!(id, "C0A8010700002A9F000000123456789A");
        assert_eq!(
            parse_offset_msg_id(&id),
            Some((SocketAddr::V4(host), 0x0012_3456_789A))
        );
        assert_eq!(parse_offset_msg_id("XYZ"), None);
        assert_eq!(parse_offset_msg_id(&id.replace('C', "G")), None);
    }

    #[test]
    fn java_hash_and_tags() {
        assert_eq!(java_string_hash("TagA"), 2598919);
        assert_eq!(java_string_hash(""), 0);
        let msg = sample(b"", "T", b"KEYS\x01k\x02TAGS\x01TagA\x02");
        assert_eq!(tags_code_from_properties(&msg), 2598919);
    }
}
