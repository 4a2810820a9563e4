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

/// The subject a record key's schema is under.
pub fn subject(topic: &str) -> String {
    format!("{topic}-key")
}

/// The codec format a key format encodes with; `None` for the unframed `string`.
pub fn format_of(key: KeyFormat) -> Option<SerializationFormat> {
    match key {
        KeyFormat::Avro => Some(SerializationFormat::Avro),
        KeyFormat::JsonSchema => Some(SerializationFormat::JsonSchema),
        // Protobuf is refused by validation; unframed if it ever got here.
        KeyFormat::String | KeyFormat::Protobuf => None,
    }
}

/// The string schema registered under a missing key subject (with `auto_register`).
pub fn string_schema(format: SerializationFormat) -> &'static str {
    match format {
        SerializationFormat::JsonSchema => JSON_STRING,
        _ => AVRO_STRING,
    }
}

/// The key as the JSON string the codecs take (`"…"`). A key that is not UTF-8 text (a
/// `bytea` key column) is no string: the record's fault.
pub fn as_json(key: &[u8]) -> Result<Vec<u8>, String> {
    let text = std::str::from_utf8(key)
        .map_err(|e| format!("the key is not UTF-8 text, so it is no string: {e}"))?;
    serde_json::to_vec(text).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sink::schema::{wire, AvroSchema, JsonSchema};

    #[test]
    fn an_avro_key_is_the_framed_string_confluent_writes() {
        let schema = AvroSchema::parse(AVRO_STRING).unwrap();
        let body = schema.encode(&as_json(b"order-17").unwrap()).unwrap();
        let framed = wire::frame(7, &body);
        // What confluent_kafka's AvroSerializer(schema "string") writes for "order-17" with
        // schema id 7: magic byte, id, zigzag length 8 (16), the UTF-8 bytes.
        assert_eq!(&framed[..], b"\x00\x00\x00\x00\x07\x10order-17");
        // A 64-byte key: zigzag 128 as a two-byte varint.
        let long = "k".repeat(64);
        let body = schema.encode(&as_json(long.as_bytes()).unwrap()).unwrap();
        assert_eq!(&body[..2], &[0x80, 0x01]);
        assert_eq!(&body[2..], long.as_bytes());
    }

    #[test]
    fn a_json_schema_key_is_the_framed_json_string() {
        let schema = JsonSchema::parse(JSON_STRING).unwrap();
        let body = schema.encode(&as_json(b"a\"b").unwrap()).unwrap();
        // confluent_kafka's JSONSerializer({"type":"string"}) writes the same for `a"b`.
        assert_eq!(
            &wire::frame(7, &body)[..],
            b"\x00\x00\x00\x00\x07\"a\\\"b\""
        );
    }

    #[test]
    fn a_key_that_is_no_text_is_refused() {
        let err = as_json(&[0xff, 0x00]).unwrap_err();
        assert!(err.contains("not UTF-8"), "{err}");
    }

    #[test]
    fn the_key_subject_is_the_topics() {
        assert_eq!(subject("orders"), "orders-key");
    }
}
