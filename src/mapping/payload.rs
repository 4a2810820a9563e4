//! The record's value: the payload as it is (text and JSON byte-for-byte, bytea decoded), or
//! in envelope mode one JSON object with the metadata and the payload; a null payload is a
//! tombstone or an error, as `outbox.null_payload` says.

use base64::Engine;
use bytes::Bytes;

use super::fields::{EventFields, FieldReader, Kind, Role, Value};
use super::MappingError;
use crate::config::{Format, NullPayload};

/// The record value in the `plain` and `envelope` formats; `None` is a tombstone.
pub(super) fn payload(
    reader: FieldReader<'_>,
    format: Format,
    null_payload: NullPayload,
    fields: &EventFields<'_>,
    timestamp_ms: i64,
) -> Result<Option<Bytes>, MappingError> {
    Ok(match payload_value(reader, null_payload, fields.id)? {
        Some(v) if format == Format::Envelope => Some(envelope(fields, timestamp_ms, &v)),
        Some(v) => Some(v.bytes),
        None => None,
    })
}

/// The payload field; `None` for a null payload when tombstones are configured, else
/// a null payload is an error.
pub(super) fn payload_value(
    reader: FieldReader<'_>,
    null_payload: NullPayload,
    event_id: &str,
) -> Result<Option<Value>, MappingError> {
    match reader.get(Role::Payload, event_id)? {
        Some(v) => Ok(Some(v)),
        None if null_payload == NullPayload::Tombstone => Ok(None),
        None => Err(MappingError::NullPayload {
            event_id: event_id.to_string(),
            column: reader.column(Role::Payload),
        }),
    }
}

/// The envelope: metadata and payload in one JSON object. A JSON payload is embedded as it
/// is, a bytea one as a base64 string, any other as a JSON string.
fn envelope(fields: &EventFields<'_>, timestamp_ms: i64, payload: &Value) -> Bytes {
    fn member(out: &mut Vec<u8>, name: &str, value: &str) {
        out.push(if out.is_empty() { b'{' } else { b',' });
        write_string(out, name);
        out.push(b':');
        write_string(out, value);
    }
    let mut out = Vec::with_capacity(128 + payload.bytes.len() * 4 / 3);
    member(&mut out, "id", fields.id);
    member(&mut out, "aggregatetype", fields.aggregate_type);
    member(&mut out, "aggregateid", fields.aggregate_id);
    member(&mut out, "type", fields.event_type);
    out.extend_from_slice(format!(",\"timestamp\":{timestamp_ms},\"payload\":").as_bytes());
    match payload.kind {
        Kind::Json => out.extend_from_slice(&payload.bytes),
        Kind::Bytea => write_base64(&mut out, &payload.bytes),
        Kind::Text | Kind::Integer => {
            write_string(&mut out, &String::from_utf8_lossy(&payload.bytes))
        }
    }
    out.push(b'}');
    Bytes::from(out)
}

/// Appends `bytes` as a padded base64 string (standard alphabet, RFC 4648 §4), in quotes.
pub(super) fn write_base64(out: &mut Vec<u8>, bytes: &[u8]) {
    out.push(b'"');
    let start = out.len();
    out.resize(start + bytes.len().div_ceil(3) * 4, 0);
    let written = base64::engine::general_purpose::STANDARD
        .encode_slice(bytes, &mut out[start..])
        .unwrap_or_default();
    out.truncate(start + written);
    out.push(b'"');
}

/// Appends `s` as a JSON string.
pub(super) fn write_string(out: &mut Vec<u8>, s: &str) {
    // Writing a &str to a Vec cannot fail.
    let _ = serde_json::to_writer(out, s);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mapping::test_support::*;

    #[test]
    fn null_payload_is_an_error_unless_tombstones_are_configured() {
        let bound = default_mapping()
            .bind(&relation(&COLUMNS))
            .unwrap()
            .unwrap();
        let err = bound
            .to_event(&row(text("order"), TupleValue::Null), 0)
            .unwrap_err();
        assert!(matches!(err, MappingError::NullPayload { .. }), "{err}");
        assert!(err.to_string().contains("null_payload"), "{err}");
        assert_eq!(err.event_id(), Some(ID));

        let m = mapping(|c| c.null_payload = NullPayload::Tombstone);
        let bound = m.bind(&relation(&COLUMNS)).unwrap().unwrap();
        let event = bound
            .to_event(&row(text("order"), TupleValue::Null), 0)
            .unwrap();
        assert_eq!(event.record.payload, None);
        assert_eq!(&event.record.key[..], ID.as_bytes());
    }

    #[test]
    fn payload_types_are_sent_byte_for_byte() {
        let m = default_mapping();
        for (type_oid, sent, expected) in [
            (oid::JSONB, &br#"{"a": 1}"#[..], &br#"{"a": 1}"#[..]),
            (oid::JSON, b"{ \"a\" :1 }", b"{ \"a\" :1 }"),
            (25, "ünï\ttext".as_bytes(), "ünï\ttext".as_bytes()),
            (oid::BYTEA, b"\\x00ff0a5c78", b"\x00\xff\x0a\x5c\x78"),
        ] {
            let mut cols = debezium_columns(TupleValue::Text(Bytes::copy_from_slice(sent)));
            cols[4].1 = type_oid;
            let event = map_row(&m, &cols).unwrap();
            assert_eq!(
                event.record.payload.as_deref(),
                Some(expected),
                "type {type_oid}"
            );
        }
        let mut cols = debezium_columns(text("\\x0"));
        cols[4].1 = oid::BYTEA;
        assert!(matches!(
            map_row(&m, &cols),
            Err(MappingError::InvalidValue { .. })
        ));
        let mut cols = debezium_columns(TupleValue::Binary(Bytes::from_static(b"x")));
        cols[4].1 = oid::BYTEA;
        assert!(matches!(
            map_row(&m, &cols),
            Err(MappingError::NotText { .. })
        ));
    }

    #[test]
    fn envelope_wraps_metadata_and_payload() {
        let m = mapping(|c| c.format = Format::Envelope);
        let event = map_row(&m, &debezium_columns(text(r#"{"total": 3}"#))).unwrap();
        let expected = format!(
            r#"{{"id":"{ID}","aggregatetype":"order","aggregateid":"42","type":"OrderCreated","timestamp":1234,"payload":{{"total": 3}}}}"#
        );
        assert_eq!(event.record.payload.as_deref(), Some(expected.as_bytes()));

        let mut cols = debezium_columns(text("say \"hi\""));
        cols[4].1 = 25;
        let event = map_row(&m, &cols).unwrap();
        let value: serde_json::Value =
            serde_json::from_slice(event.record.payload.as_deref().unwrap()).unwrap();
        assert_eq!(value["payload"], "say \"hi\"");

        cols[4] = ("payload", oid::BYTEA, text("\\x00ff10"));
        let event = map_row(&m, &cols).unwrap();
        let value: serde_json::Value =
            serde_json::from_slice(event.record.payload.as_deref().unwrap()).unwrap();
        assert_eq!(value["payload"], "AP8Q");
    }

    #[test]
    fn bytea_payload_in_an_envelope_is_base64_padded_like_rfc_4648() {
        let m = mapping(|c| c.envelope = true);
        for (input, expected) in [
            (&b""[..], ""),
            (b"f", "Zg=="),
            (b"fo", "Zm8="),
            (b"foo", "Zm9v"),
            (b"foob", "Zm9vYg=="),
            (b"fooba", "Zm9vYmE="),
            (b"foobar", "Zm9vYmFy"),
        ] {
            let hex: String = input.iter().map(|b| format!("{b:02x}")).collect();
            let mut cols = debezium_columns(text(&format!("\\x{hex}")));
            cols[4].1 = oid::BYTEA;
            let payload = map_row(&m, &cols).unwrap().record.payload.unwrap();
            let tail = format!(",\"payload\":\"{expected}\"}}");
            assert!(payload.ends_with(tail.as_bytes()), "{input:?}: {payload:?}");
        }
    }
}
