//! Protobuf: a JSON payload to protobuf binary per one message of the subject's `.proto`
//! file. Pure.
//!
//! The registry holds `.proto` text; it is compiled here (imports of Google's well-known
//! types resolve, registry schema references do not yet). The message is the file's first
//! one, or the one `protobuf_message` names. The payload is read with protobuf's JSON
//! mapping: members by field name or its lowerCamelCase JSON name, 64-bit integers as
//! numbers or strings, enums by name or number; a member the message lacks is refused.

use prost::Message;
use prost_reflect::{DynamicMessage, MessageDescriptor};
use protox::file::{ChainFileResolver, File, FileResolver, GoogleFileResolver};

use super::wire;

/// The name the registry's schema is compiled under (it has none of its own).
const FILE_NAME: &str = "registry.proto";

/// The message values are encoded as, and its index path framed before each body.
#[derive(Debug)]
pub struct ProtoSchema {
    message: MessageDescriptor,
    indexes: Vec<u8>,
}

/// Serves the registry's text as [`FILE_NAME`].
struct RegistryFile(String);

impl FileResolver for RegistryFile {
    fn open_file(&self, name: &str) -> Result<File, protox::Error> {
        if name == FILE_NAME {
            File::from_source(name, &self.0)
        } else {
            Err(protox::Error::file_not_found(name))
        }
    }
}

impl ProtoSchema {
    /// Compiles the registry's `.proto` text and picks the message: `message` (a full name,
    /// or one relative to the file's package), else the file's first message.
    pub fn parse(text: &str, message: Option<&str>) -> Result<ProtoSchema, String> {
        let mut resolver = ChainFileResolver::new();
        resolver.add(RegistryFile(text.to_string()));
        resolver.add(GoogleFileResolver::new());
        let mut compiler = protox::Compiler::with_file_resolver(resolver);
        compiler
            .open_file(FILE_NAME)
            .map_err(|e| format!("not a valid .proto file: {e}"))?;
        let pool = compiler.descriptor_pool();
        let file = pool
            .get_file_by_name(FILE_NAME)
            .ok_or("not a valid .proto file: it did not compile")?;
        let message = match message {
            None => file
                .messages()
                .next()
                .ok_or("the .proto file has no message")?,
            Some(name) => {
                let in_package = format!("{}.{name}", file.package_name());
                pool.get_message_by_name(name)
                    .or_else(|| pool.get_message_by_name(&in_package))
                    .ok_or_else(|| {
                        format!("the .proto file has no message `{name}` (outbox.serialization.protobuf_message)")
                    })?
            }
        };
        let indexes = wire::message_indexes(&index_path(&message));
        Ok(ProtoSchema { message, indexes })
    }

    /// The message's full name.
    pub fn message_name(&self) -> &str {
        self.message.full_name()
    }

    /// The message indexes and the protobuf binary of `payload` (JSON text), ready to follow
    /// the schema id; the error says why the payload does not fit.
    pub fn encode(&self, payload: &[u8]) -> Result<Vec<u8>, String> {
        let mut json = serde_json::Deserializer::from_slice(payload);
        let message = DynamicMessage::deserialize(self.message.clone(), &mut json)
            .and_then(|m| json.end().map(|()| m))
            .map_err(|e| {
                format!(
                    "the payload does not match protobuf message `{}`: {e}",
                    self.message.full_name()
                )
            })?;
        let mut out = Vec::with_capacity(self.indexes.len() + message.encoded_len());
        out.extend_from_slice(&self.indexes);
        message
            .encode(&mut out)
            .map_err(|e| format!("cannot encode the payload as protobuf: {e}"))?;
        Ok(out)
    }
}

/// Where the message sits in its file, as Confluent's message indexes: its descriptor path
/// is `[4, top-level index, 3, nested index, 3, …]` (field 4 of the file is `message_type`,
/// field 3 of a message `nested_type`).
fn index_path(message: &MessageDescriptor) -> Vec<i32> {
    message.path().iter().skip(1).step_by(2).copied().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const ORDERS: &str = r#"
        syntax = "proto3";
        package dev.outbox;
        import "google/protobuf/timestamp.proto";
        message OrderPlaced {
          int64 id = 1;
          string status = 2;
          repeated string tags = 3;
          google.protobuf.Timestamp at = 4;
          message Line { int32 qty = 1; }
        }
        message OrderCancelled { int64 id = 1; }
    "#;

    #[test]
    fn json_becomes_protobuf_binary_after_the_first_messages_index() {
        let schema = ProtoSchema::parse(ORDERS, None).unwrap();
        assert_eq!(schema.message_name(), "dev.outbox.OrderPlaced");
        let body = schema
            .encode(br#"{"id": 3, "status": "new", "tags": ["a"], "at": "1970-01-01T00:00:01Z"}"#)
            .unwrap();
        // index [0] as one zero byte; field 1 varint 3; field 2 "new"; field 3 "a";
        // field 4 a Timestamp of 1 s (its field 1 varint 1).
        let want = [
            0, 0x08, 3, 0x12, 3, b'n', b'e', b'w', 0x1a, 1, b'a', 0x22, 2, 0x08, 1,
        ];
        assert_eq!(body, want);
        // 64-bit integers may come as strings, and camelCase names are taken too.
        assert_eq!(schema.encode(br#"{"id": "3"}"#).unwrap(), [0, 0x08, 3]);
    }

    #[test]
    fn a_named_message_is_framed_with_its_index_path() {
        let second = ProtoSchema::parse(ORDERS, Some("OrderCancelled")).unwrap();
        assert_eq!(second.encode(br#"{"id": 1}"#).unwrap(), [2, 2, 0x08, 1]);
        let nested = ProtoSchema::parse(ORDERS, Some("dev.outbox.OrderPlaced.Line")).unwrap();
        assert_eq!(nested.encode(br#"{"qty": 2}"#).unwrap(), [4, 0, 0, 0x08, 2]);
        let err = ProtoSchema::parse(ORDERS, Some("Nope")).unwrap_err();
        assert!(err.contains("no message `Nope`"), "{err}");
    }

    #[test]
    fn a_payload_that_breaks_the_message_is_refused_with_a_reason() {
        let schema = ProtoSchema::parse(ORDERS, None).unwrap();
        for (bad, says) in [
            (&br#"{"id": 1, "colour": "red"}"#[..], "colour"),
            (br#"{"id": "three"}"#, "id"),
            (br#"{"status": 5}"#, "string"),
            (br#"[1]"#, "OrderPlaced"),
            (b"{} {}", "trailing"),
        ] {
            let err = schema.encode(bad).unwrap_err();
            assert!(
                err.contains("protobuf message `dev.outbox.OrderPlaced`") && err.contains(says),
                "{}: {err}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn an_invalid_proto_is_refused() {
        let err = ProtoSchema::parse("message {", None).unwrap_err();
        assert!(err.starts_with("not a valid .proto file"), "{err}");
        let err =
            ProtoSchema::parse(r#"syntax = "proto3"; import "other.proto";"#, None).unwrap_err();
        assert!(err.starts_with("not a valid .proto file"), "{err}");
        let err = ProtoSchema::parse(r#"syntax = "proto3"; enum E { A = 0; }"#, None).unwrap_err();
        assert!(err.contains("no message"), "{err}");
    }
}
