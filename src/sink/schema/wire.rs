//! Confluent's wire format, byte for byte as its serializers write it. Pure.
//!
//! ```text
//! byte 0      magic byte, 0
//! bytes 1..5  the schema id, a 32-bit big-endian integer
//! Protobuf:   the message indexes (see `message_indexes`), then the body
//! others:     the body (Avro binary, JSON text)
//! ```

use bytes::{BufMut, Bytes, BytesMut};

/// The first byte of every framed value.
pub const MAGIC_BYTE: u8 = 0;
/// Magic byte and schema id.
pub const HEADER_LEN: usize = 5;

/// `body` framed with `schema_id`.
pub fn frame(schema_id: u32, body: &[u8]) -> Bytes {
    frame_with(schema_id, &[], body)
}

/// `body` framed with `schema_id` and a Protobuf message-index prefix (already encoded).
pub fn frame_with(schema_id: u32, prefix: &[u8], body: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(HEADER_LEN + prefix.len() + body.len());
    out.put_u8(MAGIC_BYTE);
    out.put_u32(schema_id);
    out.put_slice(prefix);
    out.put_slice(body);
    out.freeze()
}

/// The schema id of a framed value, `None` when it is not framed.
pub fn schema_id(value: &[u8]) -> Option<u32> {
    match value {
        [MAGIC_BYTE, a, b, c, d, ..] => Some(u32::from_be_bytes([*a, *b, *c, *d])),
        _ => None,
    }
}

/// Protobuf: which message of the `.proto` file the body is, as a path of indexes (the
/// first top-level message is `[0]`, its first nested message `[0, 0]`). Written as the
/// count and then each index, every one a zigzag varint; the common `[0]` as the single
/// byte 0 (a count of zero), as Confluent's serializer writes it.
pub fn message_indexes(path: &[i32]) -> Vec<u8> {
    let mut out = Vec::new();
    if path == [0] {
        out.push(0);
        return out;
    }
    zigzag_varint(path.len() as i64, &mut out);
    for index in path {
        zigzag_varint(i64::from(*index), &mut out);
    }
    out
}

/// `n` zigzag-encoded (0, -1, 1, -2 … → 0, 1, 2, 3 …) as a base-128 varint, low group first.
pub fn zigzag_varint(n: i64, out: &mut Vec<u8>) {
    let mut v = ((n << 1) ^ (n >> 63)) as u64;
    while v >= 0x80 {
        out.push((v as u8 & 0x7f) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_frame_is_magic_byte_big_endian_id_and_body() {
        let framed = frame(0x0102_0304, b"\x02\x06abc");
        assert_eq!(&framed[..], b"\x00\x01\x02\x03\x04\x02\x06abc");
        assert_eq!(schema_id(&framed), Some(0x0102_0304));
        assert_eq!(&frame(7, b"")[..], &[0, 0, 0, 0, 7]);
    }

    #[test]
    fn unframed_values_have_no_schema_id() {
        assert_eq!(schema_id(b"{\"a\":1}"), None);
        assert_eq!(schema_id(&[0, 1, 2]), None);
    }

    #[test]
    fn zigzag_varints_as_protobuf_sint() {
        let enc = |n| {
            let mut out = Vec::new();
            zigzag_varint(n, &mut out);
            out
        };
        assert_eq!(enc(0), [0]);
        assert_eq!(enc(-1), [1]);
        assert_eq!(enc(1), [2]);
        assert_eq!(enc(-2), [3]);
        assert_eq!(enc(63), [0x7e]);
        assert_eq!(enc(64), [0x80, 0x01]);
        assert_eq!(enc(150), [0xac, 0x02]);
    }

    #[test]
    fn message_indexes_as_confluent_writes_them() {
        // The first message: one zero byte.
        assert_eq!(message_indexes(&[0]), [0]);
        // The second top-level message: count 1, index 1 (zigzag: 2, 2).
        assert_eq!(message_indexes(&[1]), [2, 2]);
        // The third nested in the first: count 2, 0, 2.
        assert_eq!(message_indexes(&[0, 2]), [4, 0, 4]);
        let framed = frame_with(5, &message_indexes(&[0]), b"\x08\x01");
        assert_eq!(&framed[..], b"\x00\x00\x00\x00\x05\x00\x08\x01");
    }
}
