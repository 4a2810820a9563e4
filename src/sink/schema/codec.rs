//! The schema of a subject, parsed per `outbox.serialization.format`, and what it turns a
//! payload into. Pure.

use super::{AvroSchema, JsonSchema, ProtoSchema};
use crate::config::{SerializationConfig, SerializationFormat};

/// A parsed schema of one of the formats.
#[derive(Debug)]
pub enum Codec {
    Avro(AvroSchema),
    Json(JsonSchema),
    Protobuf(ProtoSchema),
}

impl Codec {
    /// Parses the registry's schema text as `config.format` says (for Protobuf, picking
    /// `config.protobuf_message`); the error says what is wrong with it.
    pub fn parse(config: &SerializationConfig, text: &str) -> Result<Codec, String> {
        Codec::parse_as(config.format, config.protobuf_message.as_deref(), text)
    }

    /// [`Codec::parse`] as `format` (for Protobuf, as `message`, or the file's first).
    pub fn parse_as(
        format: SerializationFormat,
        message: Option<&str>,
        text: &str,
    ) -> Result<Codec, String> {
        Ok(match format {
            SerializationFormat::Avro => Codec::Avro(AvroSchema::parse(text)?),
            SerializationFormat::JsonSchema => Codec::Json(JsonSchema::parse(text)?),
            SerializationFormat::Protobuf => Codec::Protobuf(ProtoSchema::parse(text, message)?),
            SerializationFormat::None => return Err("format `none` has no schema".into()),
        })
    }

    /// What follows the schema id in the frame: the Avro binary, the validated JSON, or the
    /// Protobuf message indexes and binary. The error says why the payload does not fit.
    pub fn encode(&self, payload: &[u8]) -> Result<Vec<u8>, String> {
        match self {
            Codec::Avro(schema) => schema.encode(payload),
            Codec::Json(schema) => schema.encode(payload),
            Codec::Protobuf(schema) => schema.encode(payload),
        }
    }
}
