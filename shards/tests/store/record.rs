//! Property tests of the pure record codec (encode/decode, offset msgIds).

use std::net::{IpAddr, SocketAddr, SocketAddrV4};

use proptest::prelude::*;
use shards::store::record::{self, StoredMessage};

fn host() -> impl Strategy<Value = SocketAddr> {
    prop_oneof![
        (any::<[u8; 4]>(), any::<u16>())
            .prop_map(|(ip, port)| SocketAddr::new(IpAddr::from(ip), port)),
        (any::<[u8; 16]>(), any::<u16>())
            .prop_map(|(ip, port)| SocketAddr::new(IpAddr::from(ip), port)),
    ]
}

proptest! {
    #[test]
    fn encode_decode_round_trip(
        body in proptest::collection::vec(any::<u8>(), 0..2000),
        topic in "[A-Za-z0-9_%|-]{1,127}",
        properties in proptest::collection::vec(any::<u8>(), 0..300),
        queue_id in any::<u32>(),
        flag in any::<i32>(),
        queue_offset in any::<u64>(),
        physical_offset in any::<u64>(),
        sys_flag in any::<i32>(),
        born_timestamp_ms in any::<i64>(),
        store_timestamp_ms in any::<i64>(),
        born_host in host(),
        store_host in host(),
        reconsume_times in any::<i32>(),
        prepared_transaction_offset in any::<i64>(),
    ) {
        let host_flags = record::BORNHOST_V6_FLAG | record::STOREHOST_V6_FLAG;
        let mut sys_flag = sys_flag & !host_flags;
        if born_host.is_ipv6() { sys_flag |= record::BORNHOST_V6_FLAG; }
        if store_host.is_ipv6() { sys_flag |= record::STOREHOST_V6_FLAG; }
        let msg = StoredMessage {
            total_size: 0, body_crc: 0, queue_id, flag, queue_offset, physical_offset, sys_flag,
            born_timestamp_ms, born_host, store_timestamp_ms, store_host, reconsume_times,
            prepared_transaction_offset, body: &body, topic: &topic, properties: &properties,
        };
        let mut out = vec![0xEE; 3]; // encode appends after what is there
        let size = record::encode_into(&msg, &mut out);
        prop_assert_eq!(out.len(), 3 + size);
        let decoded = record::decode(&out[3..]).unwrap();
        prop_assert_eq!(decoded.total_size as usize, size);
        prop_assert_eq!(decoded.body_crc, record::body_crc(&body));
        prop_assert_eq!(StoredMessage { total_size: 0, body_crc: 0, ..decoded }, msg);
        if born_host.is_ipv4() && store_host.is_ipv4() {
            prop_assert_eq!(size, record::encoded_size(body.len(), topic.len(), properties.len()));
        }
        // Two records back to back decode as a pull body; any truncation is an error.
        let twice = [&out[3..], &out[3..]].concat();
        prop_assert_eq!(record::decode_all(&twice).unwrap().len(), 2);
        prop_assert!(record::decode_all(&twice[..twice.len() - 1]).is_err());
    }

    #[test]
    fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
        let _ = record::decode(&bytes);
        let _ = record::decode_all(&bytes);
    }

    #[test]
    fn offset_msg_id_round_trip(ip in any::<[u8; 4]>(), port in any::<u16>(), offset in any::<u64>()) {
        let host = SocketAddrV4::new(ip.into(), port);
        let id = record::offset_msg_id(host.into(), offset);
        prop_assert_eq!(id.len(), 32);
        prop_assert!(id.bytes().all(|b| b.is_ascii_digit() || b.is_ascii_uppercase()));
        prop_assert_eq!(record::parse_offset_msg_id(&id), Some((SocketAddr::V4(host), offset)));
    }
}
