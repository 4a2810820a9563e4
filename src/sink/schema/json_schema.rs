//! JSON Schema: a JSON payload validated against the subject's schema, sent as it is. Pure.
//!
//! The body is the payload's own bytes (what the application wrote, in jsonb's text form):
//! validation never rewrites it. The draft is the schema's `$schema` (2020-12 when it names
//! none). No `$ref` outside the schema is followed: the relay fetches nothing but the
//! registry's schema, so a schema that refers elsewhere is refused when it is parsed.

use jsonschema::Validator;

/// A compiled JSON Schema.
pub struct JsonSchema(Validator);

impl std::fmt::Debug for JsonSchema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("JsonSchema")
    }
}

impl JsonSchema {
    /// Compiles the registry's schema text; the error says what is wrong with it.
    pub fn parse(text: &str) -> Result<JsonSchema, String> {
        let schema: serde_json::Value = serde_json::from_str(text)
            .map_err(|e| format!("not a valid JSON Schema (not JSON: {e})"))?;
        jsonschema::validator_for(&schema)
            .map(JsonSchema)
            .map_err(|e| format!("not a valid JSON Schema: {e}"))
    }

    /// `payload` when it fits the schema; else the validator's message and where it points.
    pub fn encode(&self, payload: &[u8]) -> Result<Vec<u8>, String> {
        let json: serde_json::Value =
            serde_json::from_slice(payload).map_err(|e| format!("the payload is not JSON: {e}"))?;
        if let Err(e) = self.0.validate(&json) {
            let at = e.instance_path().to_string();
            let at = if at.is_empty() { "/".to_string() } else { at };
            return Err(format!(
                "the payload does not match the JSON Schema at {at}: {e}"
            ));
        }
        Ok(payload.to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ORDER: &str = r#"{"$schema":"http://json-schema.org/draft-07/schema#",
        "type":"object","properties":{"id":{"type":"integer"},"status":{"type":"string"},
        "note":{"type":["null","string"]}},"required":["id","status"],
        "additionalProperties":false}"#;

    #[test]
    fn a_fitting_payload_is_sent_byte_for_byte() {
        let schema = JsonSchema::parse(ORDER).unwrap();
        let payload = r#"{"id": 3, "note": null, "status": "ünï"}"#.as_bytes();
        assert_eq!(schema.encode(payload).unwrap(), payload);
    }

    #[test]
    fn a_payload_that_breaks_the_schema_is_refused_with_the_validators_message() {
        let schema = JsonSchema::parse(ORDER).unwrap();
        let err = schema
            .encode(br#"{"id": "three", "status": "new"}"#)
            .unwrap_err();
        assert!(err.contains("at /id"), "{err}");
        assert!(err.contains(r#""three" is not of type "integer""#), "{err}");
        let err = schema.encode(br#"{"id": 1}"#).unwrap_err();
        assert!(err.contains(r#""status" is a required property"#), "{err}");
        let err = schema
            .encode(br#"{"id": 1, "status": "", "extra": 1}"#)
            .unwrap_err();
        assert!(err.contains("extra"), "{err}");
        let err = schema.encode(b"not json").unwrap_err();
        assert!(err.contains("not JSON"), "{err}");
    }

    #[test]
    fn an_invalid_schema_is_refused() {
        let err = JsonSchema::parse(r#"{"type": "nonsense"}"#).unwrap_err();
        assert!(err.starts_with("not a valid JSON Schema"), "{err}");
        let err = JsonSchema::parse("{").unwrap_err();
        assert!(err.contains("not JSON"), "{err}");
        let err = JsonSchema::parse(r#"{"$ref": "http://elsewhere/s.json"}"#).unwrap_err();
        assert!(err.starts_with("not a valid JSON Schema"), "{err}");
    }
}
