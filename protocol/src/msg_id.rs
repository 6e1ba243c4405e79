//! Message ids (REMOTING.md §5.7): the offset msgId, hex of the store host and the commitlog
//! offset, which the broker answers a send with and VIEW_MESSAGE_BY_ID, CONSUMER_SEND_MSG_BACK
//! and END_TRANSACTION resolve back to a record. The one builder and parser in the tree.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// Offset msgId (REMOTING.md §5.7): hex of store IP, port (i32) and commitlog offset (i64),
/// upper case; 32 characters for an IPv4 store host, 56 for IPv6.
pub fn offset_msg_id(store_host: SocketAddr, physical_offset: u64) -> String {
    let mut id = String::with_capacity(OFFSET_MSG_ID_V6_CHARS);
    push_offset_msg_id(&mut id, store_host, physical_offset);
    id
}

/// Characters of an IPv4 offset msgId: host, port and offset in upper-case hex.
pub const OFFSET_MSG_ID_V4_CHARS: usize = 32;
/// Characters of an IPv6 offset msgId.
pub const OFFSET_MSG_ID_V6_CHARS: usize = 56;

/// Appends the offset msgId of [`offset_msg_id`] to `out` (the send path's reply, without
/// going through `fmt`).
pub fn push_offset_msg_id(out: &mut String, store_host: SocketAddr, physical_offset: u64) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let (ip_bits, ip_digits): (u128, u32) = match store_host.ip() {
        IpAddr::V4(ip) => (u128::from(u32::from(ip)), 8),
        IpAddr::V6(ip) => (u128::from(ip), 32),
    };
    let mut id = [0u8; OFFSET_MSG_ID_V6_CHARS];
    let fields = [
        (ip_bits, ip_digits),
        (u128::from(store_host.port()), 8),
        (u128::from(physical_offset), 16),
    ];
    let mut at = 0;
    for (value, digits) in fields {
        for shift in (0..digits).rev() {
            id[at] = HEX[((value >> (shift * 4)) & 0xF) as usize];
            at += 1;
        }
    }
    out.push_str(std::str::from_utf8(&id[..at]).expect("hex digits are ASCII"));
}

/// Parses an offset msgId (32 hex chars for IPv4, 56 for IPv6) back into (host, offset).
pub fn parse_offset_msg_id(id: &str) -> Option<(SocketAddr, u64)> {
    let hex = |s: &str| -> Option<u128> {
        if s.bytes().all(|b| b.is_ascii_hexdigit()) {
            u128::from_str_radix(s, 16).ok()
        } else {
            None
        }
    };
    let ip_hex_len = match id.len() {
        32 => 8,
        56 => 32,
        _ => return None,
    };
    let ip_bits = hex(id.get(..ip_hex_len)?)?;
    let port = u16::try_from(hex(id.get(ip_hex_len..ip_hex_len + 8)?)?).ok()?;
    let offset = u64::try_from(hex(id.get(ip_hex_len + 8..)?)?).ok()?;
    let ip = if ip_hex_len == 8 {
        IpAddr::V4(Ipv4Addr::from(u32::try_from(ip_bits).ok()?))
    } else {
        IpAddr::V6(Ipv6Addr::from(ip_bits))
    };
    Some((SocketAddr::new(ip, port), offset))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v4_and_v6_ids_round_trip() {
        let v4: SocketAddr = "10.1.2.3:10911".parse().unwrap();
        let id = offset_msg_id(v4, 0x1234);
        assert_eq!(id, "0A01020300002A9F0000000000001234");
        assert_eq!(parse_offset_msg_id(&id), Some((v4, 0x1234)));
        let v6: SocketAddr = "[fe80::1]:10911".parse().unwrap();
        let id = offset_msg_id(v6, u64::MAX);
        assert_eq!(id.len(), OFFSET_MSG_ID_V6_CHARS);
        assert_eq!(parse_offset_msg_id(&id), Some((v6, u64::MAX)));
    }
}
