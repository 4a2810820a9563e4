//! JSON Schema: a JSON payload validated against the subject's schema, sent as it is. Pure.
//!
//! The body is the payload's own bytes (what the application wrote, in jsonb's text form):
//! validation never rewrites it. The draft is the schema's `$schema` (2020-12 when it names
//! none). No `$ref` outside the schema is followed: the relay fetches nothing but the
//! registry's schema, so a schema that refers elsewhere is refused when it is parsed.

use boon::{Compiler, Draft, SchemaIndex, Schemas, UrlLoader, ValidationError};

/// Where the registry's schema sits among the compiler's resources: a name, nothing is read
/// from it.
const SCHEMA_URL: &str = "file:///outbox-relay/registry-schema.json";
/// How many of the validator's findings a dead letter names.
const FINDINGS_NAMED: usize = 3;

/// A compiled JSON Schema.
pub struct JsonSchema {
    schemas: Schemas,
    root: SchemaIndex,
}

impl std::fmt::Debug for JsonSchema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("JsonSchema")
    }
}

/// Refuses every `$ref` outside the schema (the drafts' own metaschemas are built in).
struct NothingOutside;

impl UrlLoader for NothingOutside {
    fn load(&self, url: &str) -> Result<serde_json::Value, Box<dyn std::error::Error>> {
        Err(format!("the relay follows no $ref outside the registry's schema ({url})").into())
    }
}

impl JsonSchema {
    /// Compiles the registry's schema text; the error says what is wrong with it.
    pub fn parse(text: &str) -> Result<JsonSchema, String> {
        let schema: serde_json::Value = serde_json::from_str(text)
            .map_err(|e| format!("not a valid JSON Schema (not JSON: {e})"))?;
        // boon's report is a tree over several lines; a log line or a `check` row wants one.
        let invalid =
            |e: boon::CompileError| format!("not a valid JSON Schema: {e:#}").replace('\n', " ");
        let mut compiler = Compiler::new();
        compiler.set_default_draft(Draft::V2020_12);
        compiler.use_loader(Box::new(NothingOutside));
        compiler.add_resource(SCHEMA_URL, schema).map_err(invalid)?;
        let mut schemas = Schemas::new();
        let root = compiler
            .compile(SCHEMA_URL, &mut schemas)
            .map_err(invalid)?;
        Ok(JsonSchema { schemas, root })
    }

    /// `payload` when it fits the schema; else the validator's findings and where they point.
    pub fn encode(&self, payload: &[u8]) -> Result<Vec<u8>, String> {
        let json: serde_json::Value =
            serde_json::from_slice(payload).map_err(|e| format!("the payload is not JSON: {e}"))?;
        if let Err(e) = self.schemas.validate(&json, self.root) {
            let mut findings = Vec::new();
            leaf_findings(&e, &mut findings);
            return Err(format!(
                "the payload does not match the JSON Schema: {}",
                findings.join("; ")
            ));
        }
        Ok(payload.to_vec())
    }
}

/// The innermost errors (the ones that say what is wrong), as `at /path: what`.
fn leaf_findings(e: &ValidationError, out: &mut Vec<String>) {
    if out.len() >= FINDINGS_NAMED {
        return;
    }
    if e.causes.is_empty() {
        let at = e.instance_location.to_string();
        let at = if at.is_empty() { "/" } else { at.as_str() };
        out.push(format!("at {at}: {}", e.kind));
    }
    for cause in &e.causes {
        leaf_findings(cause, out);
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
        assert!(
            err.contains("at /id: want integer, but got string"),
            "{err}"
        );
        let err = schema.encode(br#"{"id": 1}"#).unwrap_err();
        assert!(err.contains("at /: missing properties 'status'"), "{err}");
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
