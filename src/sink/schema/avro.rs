//! Avro: a JSON payload to Avro binary per the subject's schema. Pure.
//!
//! The payload is plain JSON (what the application writes to the jsonb column), not Avro's
//! JSON encoding: a union member is given as its value (`"x"`, `null`), not as
//! `{"string": "x"}`; the first branch of the union the value fits is used. Numbers are
//! resolved to the field's type (an integer into `long`, `int`, `float`, `double`); object
//! members the record does not name are ignored, missing ones take the field's default.

use apache_avro::types::Value;
use apache_avro::Schema;

/// A parsed Avro schema.
#[derive(Debug)]
pub struct AvroSchema(Schema);

impl AvroSchema {
    /// Parses the registry's schema text; the error says what is wrong with it.
    pub fn parse(text: &str) -> Result<AvroSchema, String> {
        Schema::parse_str(text)
            .map(AvroSchema)
            .map_err(|e| format!("not a valid Avro schema: {e}"))
    }

    /// The Avro binary body of `payload` (JSON text); the error says why it does not fit.
    pub fn encode(&self, payload: &[u8]) -> Result<Vec<u8>, String> {
        let json: serde_json::Value =
            serde_json::from_slice(payload).map_err(|e| format!("the payload is not JSON: {e}"))?;
        let value = Value::from(json)
            .resolve(&self.0)
            .map_err(|e| format!("the payload does not match the Avro schema: {e}"))?;
        apache_avro::to_avro_datum(&self.0, value)
            .map_err(|e| format!("cannot encode the payload as Avro: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ORDER: &str = r#"{"type":"record","name":"OrderPlaced","namespace":"dev.outbox",
        "fields":[{"name":"id","type":"long"},{"name":"status","type":"string"},
        {"name":"note","type":["null","string"],"default":null},
        {"name":"total","type":"double","default":0}]}"#;

    #[test]
    fn json_becomes_avro_binary_byte_exact() {
        let schema = AvroSchema::parse(ORDER).unwrap();
        let body = schema
            .encode(br#"{"id": 3, "status": "new", "note": "hi", "total": 1.5}"#)
            .unwrap();
        // long 3 = zigzag 6; string "new" = len 3 (6) + bytes; union branch 1 (2) + "hi";
        // double 1.5 little-endian.
        let mut want = vec![6, 6, b'n', b'e', b'w', 2, 4, b'h', b'i'];
        want.extend_from_slice(&1.5f64.to_le_bytes());
        assert_eq!(body, want);
    }

    #[test]
    fn missing_members_take_defaults_and_null_picks_the_null_branch() {
        let schema = AvroSchema::parse(ORDER).unwrap();
        let body = schema
            .encode(br#"{"id": 1, "status": "", "extra": true}"#)
            .unwrap();
        let mut want = vec![2, 0, 0];
        want.extend_from_slice(&0f64.to_le_bytes());
        assert_eq!(body, want);
    }

    #[test]
    fn a_payload_that_breaks_the_schema_is_refused_with_a_reason() {
        let schema = AvroSchema::parse(ORDER).unwrap();
        for bad in [
            &br#"{"status": "new"}"#[..],
            br#"{"id": "three", "status": "new"}"#,
            br#"{"id": 1.5, "status": "new"}"#,
            br#"[1, 2]"#,
            b"not json",
        ] {
            let err = schema.encode(bad).unwrap_err();
            assert!(
                err.contains("Avro schema") || err.contains("not JSON"),
                "{err}"
            );
        }
    }

    #[test]
    fn an_invalid_schema_is_refused() {
        let err = AvroSchema::parse(r#"{"type":"record","name":"Broken""#).unwrap_err();
        assert!(err.starts_with("not a valid Avro schema"), "{err}");
    }
}
