//! QUERY_MESSAGE on one store: index lookup, then each candidate record read back and checked.
//!
//! Runs on the store's shard. The index (`index.rs`) answers with commitlog offsets filed
//! under the hash of `topic#key`; a candidate counts only if a valid record still starts
//! there, its topic is the query's and the key is its UNIQ_KEY or one of its KEYS words
//! (only the UNIQ_KEY for a unique-key query). That resolves hash collisions, entries whose
//! records were deleted, and stale entries alike. The answer body is the matching records
//! concatenated, as stored: a QUERY_MESSAGE body, decoded by clients like a pull body.

use super::index::IndexLastUpdate;
use super::{pull, record, Inner, StoreError};

pub use crate::limits::QUERY_BODY_MAX_BYTES;
pub use crate::limits::QUERY_MESSAGES_MAX;
/// Index candidates read per message asked for: collisions are rare with 64-bit hashes, but
/// entries of deleted or rewritten records also take a read.
const QUERY_CANDIDATES_PER_MESSAGE: usize = 4;

const _: () = assert!(QUERY_BODY_MAX_BYTES >= super::RECORD_SIZE_MAX_BYTES);

/// One QUERY_MESSAGE, as the broker hands it over.
#[derive(Debug, Clone, Copy)]
pub struct MessageQuery<'a> {
    pub topic: &'a str,
    pub key: &'a str,
    /// Clamped to `1..=QUERY_MESSAGES_MAX`.
    pub max_messages: u32,
    /// Store-time range, both ends included.
    pub begin_timestamp_ms: i64,
    pub end_timestamp_ms: i64,
    /// The key is a UNIQ_KEY (`_UNIQUE_KEY_QUERY`): KEYS words do not match it.
    pub unique_key: bool,
}

/// What a query found.
#[derive(Debug, Default)]
pub struct QueryMessageResult {
    /// The matching records, concatenated as stored, newest first.
    pub body: Vec<u8>,
    pub message_count: u32,
    pub index_last_update: IndexLastUpdate,
}

pub(crate) async fn query_messages(
    inner: &Inner,
    query: &MessageQuery<'_>,
) -> Result<QueryMessageResult, StoreError> {
    let max = query.max_messages.clamp(1, QUERY_MESSAGES_MAX) as usize;
    let (candidates, index_last_update) = {
        let index = inner.index.borrow();
        let range = (query.begin_timestamp_ms, query.end_timestamp_ms);
        let limit = max * QUERY_CANDIDATES_PER_MESSAGE;
        (
            index.lookup(query.topic, query.key, range, limit),
            index.last_update(),
        )
    };
    let mut result = QueryMessageResult {
        index_last_update,
        ..QueryMessageResult::default()
    };
    for offset in candidates {
        if result.message_count as usize == max {
            break;
        }
        let bytes = match pull::read_record(inner, offset).await {
            Ok(Some(bytes)) => bytes,
            // Nothing valid there any more (deleted, or a stale entry): not a match.
            Ok(None) | Err(StoreError::Corrupt { .. }) => continue,
            Err(error) => return Err(error),
        };
        if !record::decode(&bytes).is_ok_and(|m| matches(&m, query)) {
            continue;
        }
        if result.message_count > 0 && result.body.len() + bytes.len() > QUERY_BODY_MAX_BYTES {
            break;
        }
        result.body.extend_from_slice(&bytes);
        result.message_count += 1;
    }
    Ok(result)
}

/// Whether a record answers the query: same topic, and the key is its UNIQ_KEY or (for a
/// key query) one of its KEYS words.
fn matches(message: &record::StoredMessage<'_>, query: &MessageQuery<'_>) -> bool {
    if message.topic != query.topic {
        return false;
    }
    let property = |name| record::property(message.properties, name);
    if property("UNIQ_KEY") == Some(query.key.as_bytes()) {
        return true;
    }
    !query.unique_key
        && property("KEYS").is_some_and(|keys| {
            keys.split(|&b| b == b' ')
                .any(|word| word == query.key.as_bytes())
        })
}
