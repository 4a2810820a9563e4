//! `key_format`: the record key written as a string of the registry's formats and framed
//! like a value, under subject `<topic>-key`. Pure.
//!
//! The key subject is `<topic>-key` whatever `subject_strategy` names the value's: Confluent's
//! clients configure the key's strategy apart from the value's (`key.subject.name.strategy`),
//! and its default is the topic one. Its schema is a plain string, known without a file, so
//! `auto_register` registers it when the subject is missing.

use crate::config::{KeyFormat, SerializationFormat};

/// The Avro schema of a string key.
pub const AVRO_STRING: &str = r#""string""#;
/// The JSON Schema of a string key. `$schema` names the draft: Apicurio's registry refuses
/// a JSON Schema without it ("Given schema is not from type: JSON").
pub const JSON_STRING: &str =
    r#"{"$schema":"http://json-schema.org/draft-07/schema#","type":"string"}"#;
/// The Protobuf schema of a string key: one message, the key its field 1. Consumers
/// generate `outbox_relay.Key` from it (or read it as a dynamic message).
pub const PROTO_STRING: &str =
    "syntax = \"proto3\";\npackage outbox_relay;\n\nmessage Key {\n  string key = 1;\n}\n";

/// The subject a record key's schema is under.
pub fn subject(topic: &str) -> String {
    format!("{topic}-key")
}

/// The codec format a key format encodes with; `None` for the unframed `string`.
pub fn format_of(key: KeyFormat) -> Option<SerializationFormat> {
    match key {
        KeyFormat::Avro => Some(SerializationFormat::Avro),
        KeyFormat::JsonSchema => Some(SerializationFormat::JsonSchema),
        KeyFormat::Protobuf => Some(SerializationFormat::Protobuf),
        KeyFormat::String => None,
    }
}

/// The string schema registered under a missing key subject (with `auto_register`).
pub fn string_schema(format: SerializationFormat) -> &'static str {
    match format {
        SerializationFormat::JsonSchema => JSON_STRING,
        SerializationFormat::Protobuf => PROTO_STRING,
        SerializationFormat::Avro | SerializationFormat::None => AVRO_STRING,
    }
}

/// The key as the JSON the codec of `format` takes: a string (`"…"`), for Protobuf the
/// message `{"key": "…"}`. A key that is not UTF-8 text (a `bytea` key column) is no
/// string: the record's fault.
pub fn as_json(format: SerializationFormat, key: &[u8]) -> Result<Vec<u8>, String> {
    let text = std::str::from_utf8(key)
        .map_err(|e| format!("the key is not UTF-8 text, so it is no string: {e}"))?;
    let json = match format {
        SerializationFormat::Protobuf => serde_json::json!({ "key": text }),
        _ => serde_json::Value::from(text),
    };
    serde_json::to_vec(&json).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sink::schema::{wire, AvroSchema, JsonSchema, ProtoSchema};
    use SerializationFormat::{Avro, JsonSchema as Json, Protobuf};

    #[test]
    fn an_avro_key_is_the_framed_string_confluent_writes() {
        let schema = AvroSchema::parse(AVRO_STRING).unwrap();
        let body = schema.encode(&as_json(Avro, b"order-17").unwrap()).unwrap();
        let framed = wire::frame(7, &body);
        // What confluent_kafka's AvroSerializer(schema "string") writes for "order-17" with
        // schema id 7: magic byte, id, zigzag length 8 (16), the UTF-8 bytes.
        assert_eq!(&framed[..], b"\x00\x00\x00\x00\x07\x10order-17");
        // A 64-byte key: zigzag 128 as a two-byte varint.
        let long = "k".repeat(64);
        let body = schema
            .encode(&as_json(Avro, long.as_bytes()).unwrap())
            .unwrap();
        assert_eq!(&body[..2], &[0x80, 0x01]);
        assert_eq!(&body[2..], long.as_bytes());
    }

    #[test]
    fn a_json_schema_key_is_the_framed_json_string() {
        let schema = JsonSchema::parse(JSON_STRING).unwrap();
        let body = schema.encode(&as_json(Json, b"a\"b").unwrap()).unwrap();
        // confluent_kafka's JSONSerializer({"type":"string"}) writes the same for `a"b`.
        assert_eq!(
            &wire::frame(7, &body)[..],
            b"\x00\x00\x00\x00\x07\"a\\\"b\""
        );
    }

    #[test]
    fn a_protobuf_key_is_the_framed_one_field_message() {
        let schema = ProtoSchema::parse(PROTO_STRING, None).unwrap();
        let body = schema
            .encode(&as_json(Protobuf, b"order-17").unwrap())
            .unwrap();
        // What confluent_kafka's ProtobufSerializer writes for Key(key="order-17") with
        // schema id 7: magic byte, id, message index [0] as one 0, field 1 (0x0a), length 8.
        assert_eq!(
            &wire::frame(7, &body)[..],
            b"\x00\x00\x00\x00\x07\x00\x0a\x08order-17"
        );
    }

    #[test]
    fn a_key_that_is_no_text_is_refused() {
        let err = as_json(Avro, &[0xff, 0x00]).unwrap_err();
        assert!(err.contains("not UTF-8"), "{err}");
    }

    #[test]
    fn the_key_subject_is_the_topics() {
        assert_eq!(subject("orders"), "orders-key");
    }
}
