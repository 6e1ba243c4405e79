//! RocketMQ's ACL signature of a remoting request (CAPABILITIES.md §4.2–§4.3), the same on
//! both sides: the client signs what it sends, the broker recomputes over what it received.
//!
//! The signed content is the values of every extFields entry except `Signature`, in
//! bytewise-sorted key order, concatenated with no keys and no separators, then the raw body;
//! `Signature = Base64(HmacSHA1(SecretKey, content))`. A repeated key counts once, with its
//! last value (Java reads extFields into a map). JSON numbers and booleans are signed as their
//! text, which is how the header decoder already keeps them (`"queueId":0` → `"0"`).

use base64::Engine;
use hmac::{Hmac, Mac};
use sha1::Sha1;

/// The extFields entries the signature adds (RocketMQ's `SessionCredentials`).
pub const ACCESS_KEY: &str = "AccessKey";
pub const SIGNATURE: &str = "Signature";
pub const SECURITY_TOKEN: &str = "SecurityToken";
/// Sent (and signed) by the C++ client and ali-ons; only part of the content here.
pub const ONS_CHANNEL: &str = "OnsChannel";
/// Left out of the content for senders at or below V4_9_3 (MQVersion ordinal 399), as the
/// Java broker does (`PlainAccessResource.parse`): those clients did not sign it.
pub const UNIQUE_KEY_QUERY: &str = "_UNIQUE_KEY_QUERY";
const UNIQUE_KEY_QUERY_UNSIGNED_UP_TO_VERSION: i32 = 399;

type HmacSha1 = Hmac<Sha1>;

/// An account's AccessKey and SecretKey (and an STS token, when there is one), as a client
/// signs with them (RocketMQ's `SessionCredentials`). `Debug` never shows the secret.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub access_key: String,
    pub secret_key: String,
    pub security_token: Option<String>,
}

impl Credentials {
    pub fn new(access_key: impl Into<String>, secret_key: impl Into<String>) -> Credentials {
        Credentials {
            access_key: access_key.into(),
            secret_key: secret_key.into(),
            security_token: None,
        }
    }

    /// Adds `AccessKey` (and `SecurityToken`) to a request's `fields`, then its `Signature`
    /// over all of them and `body` (RocketMQ's `AclClientRPCHook.doBeforeRequest`).
    pub fn sign_request(&self, fields: &mut Vec<(String, String)>, body: &[u8]) {
        fields.retain(|(key, _)| key != SIGNATURE);
        fields.push((ACCESS_KEY.to_string(), self.access_key.clone()));
        if let Some(token) = &self.security_token {
            fields.push((SECURITY_TOKEN.to_string(), token.clone()));
        }
        let signature = sign(
            &self.secret_key,
            fields
                .iter()
                .map(|(key, value)| (key.as_str(), value.as_str())),
            body,
        );
        fields.push((SIGNATURE.to_string(), signature));
    }
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("access_key", &self.access_key)
            .field("secret_key", &"<hidden>")
            .field(
                "security_token",
                &self.security_token.as_ref().map(|_| "<hidden>"),
            )
            .finish()
    }
}

/// The signature of `fields` (any order; `Signature` itself is skipped) and `body` under
/// `secret_key`, as a client puts it into the `Signature` field.
pub fn sign<'a>(
    secret_key: &str,
    fields: impl IntoIterator<Item = (&'a str, &'a str)>,
    body: &[u8],
) -> String {
    let mac = content_mac(secret_key, signed_fields(fields, |_| true), body);
    base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes())
}

/// Whether `signature` (the received `Signature` value) is the signature of `fields` and
/// `body` under `secret_key`, for a sender of MQVersion `version`. Compared in constant time.
pub fn verify<'a>(
    secret_key: &str,
    fields: impl IntoIterator<Item = (&'a str, &'a str)>,
    body: &[u8],
    version: i32,
    signature: &str,
) -> bool {
    let Ok(expected) = base64::engine::general_purpose::STANDARD.decode(signature) else {
        return false;
    };
    let skip_unique_key = version <= UNIQUE_KEY_QUERY_UNSIGNED_UP_TO_VERSION;
    let fields = signed_fields(fields, |key| !(skip_unique_key && key == UNIQUE_KEY_QUERY));
    content_mac(secret_key, fields, body)
        .verify_slice(&expected)
        .is_ok()
}

/// The entries that are signed, sorted by key, one per key (the last one wins).
fn signed_fields<'a>(
    fields: impl IntoIterator<Item = (&'a str, &'a str)>,
    keep: impl Fn(&str) -> bool,
) -> Vec<(&'a str, &'a str)> {
    let mut entries: Vec<(&str, &str)> = fields
        .into_iter()
        .filter(|(key, _)| *key != SIGNATURE && keep(key))
        .collect();
    // Stable: among equal keys wire order stays, so the last of a run is the last sent.
    entries.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    let mut unique: Vec<(&str, &str)> = Vec::with_capacity(entries.len());
    for entry in entries {
        match unique.last_mut() {
            Some(last) if last.0 == entry.0 => *last = entry,
            _ => unique.push(entry),
        }
    }
    unique
}

fn content_mac(secret_key: &str, fields: Vec<(&str, &str)>, body: &[u8]) -> HmacSha1 {
    // HMAC takes a key of any length (an empty one too: the C++ client signs with it).
    let mut mac = HmacSha1::new_from_slice(secret_key.as_bytes()).expect("any key length");
    for (_, value) in fields {
        mac.update(value.as_bytes());
    }
    mac.update(body);
    mac
}

#[cfg(test)]
mod tests {
    use super::*;

    // Computed independently with Python's hmac/hashlib/base64 over the same content.
    #[test]
    fn signs_sorted_values_then_body() {
        let fields = [
            ("topic", "TopicA"),
            ("AccessKey", "RocketMQ"),
            ("queueId", "0"),
        ];
        let signature = sign("12345678", fields, b"hello");
        assert_eq!(signature, "UxXtGjl5hC76qjMD6q7LodOGZi4=");
        assert!(verify("12345678", fields, b"hello", 479, &signature));
        assert!(!verify("12345679", fields, b"hello", 479, &signature));
        assert!(!verify("12345678", fields, b"hellp", 479, &signature));
        assert!(!verify("12345678", fields, b"hello", 479, "not base64!"));
    }

    #[test]
    fn the_signature_field_itself_and_repeats_are_handled_as_java_does() {
        let signed = sign("k", [("a", "1"), ("b", "2")], b"");
        let received = [("b", "x"), ("Signature", &*signed), ("a", "1"), ("b", "2")];
        assert!(verify("k", received, b"", 479, &signed));
    }

    #[test]
    fn old_senders_leave_the_unique_key_query_flag_unsigned() {
        let signed = sign("k", [("topic", "T"), ("key", "K")], b"");
        let received = [("topic", "T"), ("key", "K"), (UNIQUE_KEY_QUERY, "true")];
        assert!(verify("k", received, b"", 63, &signed));
        assert!(!verify("k", received, b"", 401, &signed));
    }

    #[test]
    fn credentials_add_the_access_key_then_sign_everything() {
        let credentials = Credentials::new("RocketMQ", "12345678");
        let mut fields = vec![
            ("topic".to_string(), "TopicA".to_string()),
            ("queueId".to_string(), "0".to_string()),
        ];
        credentials.sign_request(&mut fields, b"hello");
        assert_eq!(fields[2], ("AccessKey".to_string(), "RocketMQ".to_string()));
        assert_eq!(fields[3].1, "UxXtGjl5hC76qjMD6q7LodOGZi4=");
        assert!(!format!("{credentials:?}").contains("12345678"));
    }

    // The C++ client's GET_ROUTEINFO_BY_TOPIC from captures/rocketmq-python-cpp.jsonl (it
    // signs with an empty secret when it has no credentials).
    #[test]
    fn matches_a_captured_cpp_request() {
        let fields = [
            ("AccessKey", ""),
            ("OnsChannel", "ALIYUN"),
            ("topic", "LabCapturePy"),
        ];
        assert!(verify("", fields, b"", 63, "xI3fq8nkeHaTDvDZfcCQy8TcTfw="));
    }
}
