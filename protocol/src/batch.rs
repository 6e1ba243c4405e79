//! The batch body (REMOTING.md §5.5): what SEND_BATCH_MESSAGE (320, or any send whose `batch`
//! flag is set) carries, one entry per message. All integers big-endian.
//!
//! | Field | Size |
//! |---|---|
//! | TOTALSIZE (the entry, this field included) | 4 |
//! | MAGICCODE (clients send 0) | 4 |
//! | BODYCRC (clients send 0) | 4 |
//! | FLAG | 4 |
//! | body length + body | 4 + b |
//! | properties length (u16) + properties | 2 + p |
//!
//! The one encoder (the client) and the one decoder (the broker's send path). Every length is
//! checked against what is left before it is used; a malformed body is a `BatchError`.

/// Bytes of an entry with an empty body and no properties.
pub const BATCH_ENTRY_FIXED_BYTES: usize = 22;

/// One message of a batch, borrowed from the body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchEntry<'a> {
    pub flag: i32,
    pub body: &'a [u8],
    /// The message's own encoded properties string.
    pub properties: &'a str,
}

/// Why a batch body could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BatchError {
    #[error("truncated record")]
    Truncated,
    #[error("record length out of range")]
    RecordLength,
    #[error("body length out of range")]
    BodyLength,
    #[error("properties length out of range")]
    PropertiesLength,
    #[error("properties are not UTF-8")]
    PropertiesNotUtf8,
    #[error("too many messages (at most {0})")]
    TooMany(usize),
    #[error("no message in the batch")]
    Empty,
}

/// Appends one entry for a message with `flag`, `body` and encoded `properties`.
pub fn encode_entry(out: &mut Vec<u8>, flag: i32, body: &[u8], properties: &[u8]) {
    let total = BATCH_ENTRY_FIXED_BYTES + body.len() + properties.len();
    out.extend_from_slice(&(total as i32).to_be_bytes());
    out.extend_from_slice(&0i32.to_be_bytes()); // MAGICCODE
    out.extend_from_slice(&0i32.to_be_bytes()); // BODYCRC
    out.extend_from_slice(&flag.to_be_bytes());
    out.extend_from_slice(&(body.len() as i32).to_be_bytes());
    out.extend_from_slice(body);
    out.extend_from_slice(&(properties.len() as u16).to_be_bytes());
    out.extend_from_slice(properties);
}

/// Splits a batch body into its entries: at most `entries_max`, at least one.
pub fn decode(mut body: &[u8], entries_max: usize) -> Result<Vec<BatchEntry<'_>>, BatchError> {
    let be32 = |bytes: &[u8], at: usize| {
        i32::from_be_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
    };
    let mut entries = Vec::new();
    while !body.is_empty() {
        if entries.len() == entries_max {
            return Err(BatchError::TooMany(entries_max));
        }
        if body.len() < 20 {
            return Err(BatchError::Truncated);
        }
        let (total, flag, body_len) = (be32(body, 0), be32(body, 12), be32(body, 16));
        if total < BATCH_ENTRY_FIXED_BYTES as i32 || total as usize > body.len() || body_len < 0 {
            return Err(BatchError::RecordLength);
        }
        let entry = &body[..total as usize];
        let body_end = 20 + body_len as usize;
        if body_end + 2 > entry.len() {
            return Err(BatchError::BodyLength);
        }
        let properties_len = u16::from_be_bytes([entry[body_end], entry[body_end + 1]]) as usize;
        let properties_start = body_end + 2;
        if properties_start + properties_len > entry.len() {
            return Err(BatchError::PropertiesLength);
        }
        let properties =
            std::str::from_utf8(&entry[properties_start..properties_start + properties_len])
                .map_err(|_| BatchError::PropertiesNotUtf8)?;
        entries.push(BatchEntry {
            flag,
            body: &entry[20..body_end],
            properties,
        });
        body = &body[total as usize..];
    }
    if entries.is_empty() {
        return Err(BatchError::Empty);
    }
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn entries_follow_the_layout() {
        let mut body = Vec::new();
        encode_entry(&mut body, 7, b"ab", b"TAGS\x01t1\x02");
        encode_entry(&mut body, 0, b"c", b"");
        assert_eq!(
            i32::from_be_bytes(body[0..4].try_into().unwrap()),
            22 + 2 + 8
        );
        assert_eq!(i32::from_be_bytes(body[12..16].try_into().unwrap()), 7);
        assert_eq!(&body[20..22], b"ab");
        let entries = decode(&body, 10).unwrap();
        assert_eq!(entries.len(), 2);
        assert_eq!(
            entries[0],
            BatchEntry {
                flag: 7,
                body: b"ab",
                properties: "TAGS\x01t1\x02"
            }
        );
        assert_eq!(decode(&body, 1), Err(BatchError::TooMany(1)));
        assert_eq!(decode(&[], 1), Err(BatchError::Empty));
        assert_eq!(
            decode(&body[..body.len() - 1], 10),
            Err(BatchError::RecordLength)
        );
    }

    proptest! {
        #[test]
        fn decode_inverts_encode(messages in prop::collection::vec(
            (any::<i32>(), prop::collection::vec(any::<u8>(), 0..64), "[a-zA-Z0-9]{0,32}"), 1..8)
        ) {
            let mut body = Vec::new();
            for (flag, payload, properties) in &messages {
                encode_entry(&mut body, *flag, payload, properties.as_bytes());
            }
            let entries = decode(&body, 100).unwrap();
            prop_assert_eq!(entries.len(), messages.len());
            for (entry, (flag, payload, properties)) in entries.iter().zip(&messages) {
                prop_assert_eq!(entry.flag, *flag);
                prop_assert_eq!(entry.body, &payload[..]);
                prop_assert_eq!(entry.properties, properties.as_str());
            }
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
            let _ = decode(&bytes, 100);
        }
    }
}
