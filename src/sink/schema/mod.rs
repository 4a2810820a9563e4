//! Schema Registry serialization (`[outbox.serialization]`): a record's JSON value encoded
//! per its subject's schema and framed in Confluent's wire format, between the mapping and
//! the producer.
//!
//! | part | file | I/O |
//! |---|---|---|
//! | the frame: magic byte, schema id, Protobuf message indexes | `wire.rs` | none |
//! | JSON → Avro binary | `avro.rs` | none |
//! | JSON validated by a JSON Schema | `json_schema.rs` | none |
//! | `.proto` text compiled, JSON → Protobuf binary | `protobuf.rs` | none |
//! | the format's schema parsed, a payload encoded | `codec.rs` | none |
//! | the registry's REST API | `registry.rs` | HTTP |
//! | a string key's subject and schema (`key_format`) | `key.rs` | none |
//! | subjects, the schema cache, what blocks | here, `health.rs` | through `registry.rs` |
//! | one serializer per section (`[outbox.tables.serialization]`) | `set.rs` | none |
//!
//! Two kinds of failure, never mixed up: a payload the schema refuses is the record's fault
//! ([`SerializeError::Payload`]: dead-lettered, reason `schema`); a registry that is down,
//! refuses the login or lacks a configured subject is the deployment's ([`SerializeError::Registry`]:
//! the record waits and is retried, [`RegistryHealth`] turns `/readyz` red, the slot is not
//! confirmed past it). Once a subject's schema is cached no record waits for the registry:
//! a pinned version is kept for good, `latest` is asked again after `latest_ttl_ms`, and
//! while that refresh fails the cached schema is still used, up to [`MAX_STALE`] past the
//! TTL (a warning, `outbox_relay_schema_registry_stale_seconds`).
//!
//! A missing schema is the record's fault only when the record's own data named it: the id
//! in its `schema_id_header`, or the subject taken from its record name under the `record`
//! and `topic_record` strategies (a 404 with the registry's error code, or a schema the
//! relay cannot use). A subject the configuration names (`<topic>-value`, `<topic>-key`)
//! blocks like an outage.

mod avro;
mod codec;
mod health;
mod json_schema;
pub mod key;
mod protobuf;
pub mod registry;
mod set;
#[cfg(test)]
mod stand_in;
pub mod wire;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
// The cache's times: the wall clock, but tokio's paused one in tests and the session's
// simulation, which so reach a `latest` schema's refresh and its staleness limit by seed.
use tokio::time::Instant;

use crate::config::{
    ConfigError, SchemaVersion, SerializationConfig, SerializationFormat, SubjectStrategy,
};
use crate::mapping::Record;
pub use avro::AvroSchema;
pub use codec::Codec;
pub use health::RegistryHealth;
pub use json_schema::JsonSchema;
pub use protobuf::ProtoSchema;
use registry::{RegistryClient, RegistryError, SchemaRegistry};
pub use set::Serializers;

/// Why a record could not be serialized.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SerializeError {
    /// The payload does not fit the schema, names no record, or names a schema (by id or
    /// record name) the registry does not have: dead-letter it.
    #[error("{0}")]
    Payload(String),
    /// No schema from the registry now: the record waits.
    #[error("subject `{subject}`: {error}")]
    Registry {
        subject: String,
        error: RegistryError,
    },
}

/// How long past `latest_ttl_ms` a cached `latest` schema is still used while the
/// registry fails to refresh it; older, its records wait for the registry.
pub const MAX_STALE: Duration = Duration::from_secs(3600);

/// A subject's schema as used now.
#[derive(Debug)]
struct Cached {
    id: u32,
    schema: Codec,
    /// When the registry gave it.
    fetched: Instant,
    /// When the registry was last asked for the subject (a failed refresh too).
    asked: Mutex<Instant>,
}

impl Cached {
    fn new(id: u32, schema: Codec) -> Cached {
        let now = Instant::now();
        Cached {
            id,
            schema,
            fetched: now,
            asked: Mutex::new(now),
        }
    }

    fn asked(&self) -> std::sync::MutexGuard<'_, Instant> {
        self.asked.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Which half of a record a subject's schema encodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    Value,
    /// `key_format`: a string, under `<topic>-key`.
    Key,
}

/// Serializes record values (and keys, with `key_format`) per one serialization section;
/// shared by every session (the cache outlives them).
#[derive(Debug)]
pub struct Serializer {
    config: SerializationConfig,
    /// Where the section is in the config (`outbox.serialization`,
    /// `outbox.tables[1].serialization`), for the settings messages name.
    section: String,
    /// The registry: [`RegistryClient`] in the relay.
    client: Arc<dyn SchemaRegistry>,
    cache: Mutex<HashMap<String, Arc<Cached>>>,
    health: Arc<RegistryHealth>,
    /// [`MAX_STALE`] (shorter in tests).
    max_stale: Duration,
}

impl Serializer {
    /// `None` when the section uses no registry. Reads the password or token file.
    pub fn new(config: &SerializationConfig) -> Result<Option<Arc<Serializer>>, ConfigError> {
        let health = Arc::new(RegistryHealth::new(&config.registry_url));
        Serializer::with_health(config, "outbox.serialization", health)
    }

    /// [`Serializer::new`], reporting its blocks to `health` (shared by the sections).
    pub fn with_health(
        config: &SerializationConfig,
        section: &str,
        health: Arc<RegistryHealth>,
    ) -> Result<Option<Arc<Serializer>>, ConfigError> {
        if !config.enabled() {
            return Ok(None);
        }
        let client = RegistryClient::new(config, config.read_secret()?);
        Ok(Some(Serializer::with_registry(
            config,
            section,
            health,
            Arc::new(client),
            MAX_STALE,
        )))
    }

    /// A serializer of `config` (its registry settings unused) asking `registry`, reporting
    /// its blocks to `health`, using a stale `latest` schema up to `max_stale` past its TTL
    /// ([`MAX_STALE`] in the relay): for tests and the session's simulation, which stand in
    /// for the registry.
    pub fn with_registry(
        config: &SerializationConfig,
        section: &str,
        health: Arc<RegistryHealth>,
        registry: Arc<dyn SchemaRegistry>,
        max_stale: Duration,
    ) -> Arc<Serializer> {
        Arc::new(Serializer {
            config: config.clone(),
            section: section.to_string(),
            client: registry,
            cache: Mutex::default(),
            health,
            max_stale,
        })
    }

    /// What blocks now, for `/readyz` and the metrics.
    pub fn health(&self) -> Arc<RegistryHealth> {
        self.health.clone()
    }

    pub fn format(&self) -> SerializationFormat {
        self.config.format
    }

    /// The section this serializer encodes with.
    pub fn config(&self) -> &SerializationConfig {
        &self.config
    }

    /// The record's value subject under the configured strategy.
    pub fn subject_for(&self, record: &Record) -> Result<String, SerializeError> {
        let record_name = || {
            let header = &self.config.record_name_header;
            record
                .headers
                .iter()
                .find(|(name, _)| &**name == header)
                .and_then(|(_, v)| std::str::from_utf8(v).ok())
                .filter(|v| !v.is_empty())
                .ok_or_else(|| {
                    SerializeError::Payload(format!(
                        "the record has no header `{header}` naming its record ({}.record_name_header)",
                        self.section
                    ))
                })
        };
        Ok(match self.config.subject_strategy {
            SubjectStrategy::Topic => format!("{}-value", record.topic),
            SubjectStrategy::Record => record_name()?.to_string(),
            SubjectStrategy::TopicRecord => format!("{}-{}", record.topic, record_name()?),
        })
    }

    /// The record's key subject with `key_format`, `None` for string keys.
    pub fn key_subject_for(&self, record: &Record) -> Option<String> {
        key::format_of(self.config.key_format).map(|_| key::subject(&record.topic))
    }

    /// Encodes and frames the record's value (a tombstone stays null) and, with `key_format`,
    /// its key (a tombstone's too, so that compaction still matches it) in place, and sets a
    /// CloudEvents `content-type` header to the format's media type. Nothing changes unless
    /// both succeed, so a record that waits for the registry is retried as it was.
    pub async fn serialize(&self, record: &mut Record) -> Result<(), SerializeError> {
        let value = match &record.payload {
            Some(payload) if self.config.format != SerializationFormat::None => {
                Some(self.encode_value(record, payload).await?)
            }
            _ => None,
        };
        let key = self.encode_key(record).await?;
        if let Some(value) = value {
            record.payload = Some(value);
            for (name, value) in &mut record.headers {
                if &**name == "content-type" {
                    *value = Bytes::from_static(self.config.format.content_type().as_bytes());
                }
            }
        }
        if let Some(key) = key {
            // The partition is chosen from the unencoded key, as with string keys: the same
            // aggregate (or key) keeps its partition, and so its order.
            if record.partition.is_none() && record.partition_key.is_none() {
                record.partition_key = Some(record.key.clone()).filter(|k| !k.is_empty());
            }
            record.key = key;
        }
        Ok(())
    }

    async fn encode_value(&self, record: &Record, payload: &[u8]) -> Result<Bytes, SerializeError> {
        // What the schema is looked up by: the subject, or the id a header names; the label
        // of a registry block either way.
        let (subject, cached, named_by) = match self.pinned_id(record)? {
            Some(id) => {
                let label = format!("schema id {id}");
                let header = self.config.schema_id_header.as_deref().unwrap_or_default();
                let named_by = format!(
                    "the row's header `{header}` ({}.schema_id_header) names it",
                    self.section
                );
                (label, self.schema_by_id(id).await, Some(named_by))
            }
            None => {
                let subject = self.subject_for(record)?;
                let cached = self.schema(&subject, Part::Value).await;
                // Under the record strategies the subject is (partly) the row's record name.
                let named_by = (self.config.subject_strategy != SubjectStrategy::Topic).then(|| {
                    format!(
                        "the subject is taken from the row's header `{}` ({}.subject_strategy = {})",
                        self.config.record_name_header,
                        self.section,
                        match self.config.subject_strategy {
                            SubjectStrategy::Record => "record",
                            _ => "topic_record",
                        }
                    )
                });
                (subject, cached, named_by)
            }
        };
        let cached = match (cached, named_by) {
            (Ok(cached), _) => cached,
            // A schema the row itself names and the registry does not have (or holds in a
            // form the relay cannot use) will not appear by waiting: the row's fault, like a
            // payload the schema refuses. Every other row keeps flowing.
            (Err(error), Some(named_by)) if error.is_missing_schema() => {
                self.health.clear(&subject);
                return Err(SerializeError::Payload(format!(
                    "{subject}: {error}; {named_by}: correct the row, or register the schema, then `outbox-relay dead-letters redrive` this dead letter"
                )));
            }
            (Err(error), _) => {
                return Err(SerializeError::Registry {
                    subject: subject.clone(),
                    error,
                })
            }
        };
        self.health.clear(&subject);
        let body = cached.schema.encode(payload).map_err(|reason| {
            SerializeError::Payload(format!(
                "subject `{subject}` (schema id {}): {reason}",
                cached.id
            ))
        })?;
        Ok(wire::frame(cached.id, &body))
    }

    /// The framed key with `key_format`; `None` for string keys.
    async fn encode_key(&self, record: &Record) -> Result<Option<Bytes>, SerializeError> {
        let Some(subject) = self.key_subject_for(record) else {
            return Ok(None);
        };
        let cached =
            self.schema(&subject, Part::Key)
                .await
                .map_err(|error| SerializeError::Registry {
                    subject: subject.clone(),
                    error,
                })?;
        self.health.clear(&subject);
        let body = key::as_json(self.format_of(Part::Key), &record.key)
            .and_then(|json| cached.schema.encode(&json))
            .map_err(|reason| {
                SerializeError::Payload(format!(
                    "key subject `{subject}` (schema id {}): {reason}",
                    cached.id
                ))
            })?;
        Ok(Some(wire::frame(cached.id, &body)))
    }

    /// The subject's schema: from the cache while fresh, else from the registry. A key
    /// subject is always at its latest version.
    async fn schema(&self, subject: &str, part: Part) -> Result<Arc<Cached>, RegistryError> {
        let ttl = Duration::from_millis(self.config.latest_ttl_ms);
        let (version, entry) = match part {
            Part::Value => (self.config.version(), subject.to_string()),
            Part::Key => (SchemaVersion::Latest, format!("#key {subject}")),
        };
        let cached = self.cached(&entry);
        if let Some(cached) = &cached {
            if version != SchemaVersion::Latest || cached.asked().elapsed() < ttl {
                return Ok(cached.clone());
            }
        }
        match self.fetch(subject, version, part).await {
            Ok(fetched) => {
                let fetched = Arc::new(fetched);
                self.cache
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert(entry, fetched.clone());
                self.health.fresh(subject);
                Ok(fetched)
            }
            // The refresh of a `latest` schema failed: the one the registry gave before is
            // still a schema of the subject, so records go on with it, for a while.
            Err(error) => {
                let Some(cached) = cached else {
                    return Err(error);
                };
                let age = cached.fetched.elapsed();
                let limit = ttl + self.max_stale;
                if age >= limit {
                    self.health.fresh(subject);
                    return Err(error);
                }
                *cached.asked() = Instant::now();
                self.health.serving_stale(subject, age, limit, &error);
                Ok(cached)
            }
        }
    }

    /// The schema id the record's `schema_id_header` names; `None` without the setting or
    /// the header (the subject's schema is used then). Not a number: the record's fault.
    fn pinned_id(&self, record: &Record) -> Result<Option<u32>, SerializeError> {
        let Some(header) = &self.config.schema_id_header else {
            return Ok(None);
        };
        let Some((_, value)) = record.headers.iter().find(|(name, _)| &**name == header) else {
            return Ok(None);
        };
        std::str::from_utf8(value)
            .ok()
            .and_then(|text| text.trim().parse::<u32>().ok())
            .map(Some)
            .ok_or_else(|| {
                SerializeError::Payload(format!(
                    "header `{header}` is not a schema id: {:?} ({}.schema_id_header)",
                    String::from_utf8_lossy(value),
                    self.section
                ))
            })
    }

    /// The schema registered as `id`: an id never changes its schema, so it is cached for good.
    async fn schema_by_id(&self, id: u32) -> Result<Arc<Cached>, RegistryError> {
        let key = format!("#id {id}");
        if let Some(cached) = self.cached(&key) {
            return Ok(cached);
        }
        let registered = self.client.by_id(id).await?;
        let schema = self.parse(&format!("schema id {id}"), &registered, Part::Value)?;
        tracing::info!(schema_id = id, "schema fetched from the registry by id");
        let cached = Arc::new(Cached::new(id, schema));
        self.cache
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(key, cached.clone());
        Ok(cached)
    }

    fn cached(&self, entry: &str) -> Option<Arc<Cached>> {
        self.cache
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(entry)
            .cloned()
    }

    /// `protobuf_message` for the value; a key is the first message of its subject's file.
    fn message_of(&self, part: Part) -> Option<&str> {
        match part {
            Part::Value => self.config.protobuf_message.as_deref(),
            Part::Key => None,
        }
    }

    /// The format `part` is encoded in.
    fn format_of(&self, part: Part) -> SerializationFormat {
        match part {
            Part::Value => self.config.format,
            Part::Key => key::format_of(self.config.key_format).unwrap_or_default(),
        }
    }

    /// Asks the registry (registering the schema first when the subject is missing and
    /// `auto_register` is on: `schema_file` for a value, the string schema for a key) and
    /// parses what it holds.
    async fn fetch(
        &self,
        subject: &str,
        version: SchemaVersion,
        part: Part,
    ) -> Result<Cached, RegistryError> {
        let registered = match self.client.version(subject, version).await {
            Err(RegistryError::NotFound { .. }) if self.config.auto_register => {
                let text = self.schema_to_register(part)?;
                let id = self
                    .client
                    .register(subject, &text, self.format_of(part).schema_type())
                    .await?;
                registry::Registered {
                    id,
                    schema: text,
                    schema_type: None,
                }
            }
            other => other?,
        };
        let schema = self.parse(subject, &registered, part)?;
        tracing::info!(
            subject,
            schema_id = registered.id,
            "schema fetched from the registry"
        );
        Ok(Cached::new(registered.id, schema))
    }

    /// The registered schema parsed, when it is of `part`'s format (and, for a key, takes
    /// a string: otherwise every key would be refused, a deployment error).
    fn parse(
        &self,
        subject: &str,
        registered: &registry::Registered,
        part: Part,
    ) -> Result<Codec, RegistryError> {
        let bad = |reason| RegistryError::BadSchema {
            subject: subject.to_string(),
            reason,
        };
        let format = self.format_of(part);
        let setting = match part {
            Part::Value => "format",
            Part::Key => "key_format",
        };
        // The registry leaves `schemaType` out for Avro, the default.
        let kind = registered.schema_type.as_deref().unwrap_or("AVRO");
        if kind != format.schema_type() {
            return Err(bad(format!(
                "it is a {kind} schema, and {}.{setting} is {}",
                self.section,
                SerializationFormat::NAMES[format as usize]
            )));
        }
        let codec =
            Codec::parse_as(format, self.message_of(part), &registered.schema).map_err(bad)?;
        if part == Part::Key {
            if let Err(reason) = key::as_json(format, b"").and_then(|json| codec.encode(&json)) {
                return Err(bad(format!("it does not take a string key: {reason}")));
            }
        }
        Ok(codec)
    }

    fn schema_to_register(&self, part: Part) -> Result<String, RegistryError> {
        if part == Part::Key {
            return Ok(key::string_schema(self.format_of(part)).to_string());
        }
        let path = self.config.schema_file.clone().unwrap_or_default();
        std::fs::read_to_string(&path).map_err(|e| RegistryError::SchemaFile {
            path: path.display().to_string(),
            reason: e.to_string(),
        })
    }

    /// For `check`: the registry answers.
    pub async fn verify_reachable(&self) -> Result<(), RegistryError> {
        self.client.subjects().await.map(drop)
    }

    /// For `check`: the value subject's schema is there and parses. Bypasses the cache.
    /// Never registers: with `auto_register` a missing subject is checked against
    /// `schema_file` (id 0).
    pub async fn verify(&self, subject: &str) -> Result<u32, RegistryError> {
        self.verify_part(subject, Part::Value).await
    }

    /// For `check`: [`Serializer::verify`] of a key subject (a missing one is fine with
    /// `auto_register`: the string schema is known).
    pub async fn verify_key(&self, subject: &str) -> Result<u32, RegistryError> {
        self.verify_part(subject, Part::Key).await
    }

    async fn verify_part(&self, subject: &str, part: Part) -> Result<u32, RegistryError> {
        let version = match part {
            Part::Value => self.config.version(),
            Part::Key => SchemaVersion::Latest,
        };
        match self.client.version(subject, version).await {
            Err(RegistryError::NotFound { .. }) if self.config.auto_register => {
                let text = self.schema_to_register(part)?;
                let message = self.message_of(part);
                Codec::parse_as(self.format_of(part), message, &text).map_err(|reason| {
                    RegistryError::BadSchema {
                        subject: subject.to_string(),
                        reason: format!("schema_file: {reason}"),
                    }
                })?;
                Ok(0)
            }
            Err(e) => Err(e),
            Ok(registered) => self
                .parse(subject, &registered, part)
                .map(|_| registered.id),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SCHEMA: &str = r#"{"type":"record","name":"E","fields":[{"name":"n","type":"long"}]}"#;

    /// A serializer whose registry does not answer (port 1), with `subject` cached as id 9.
    fn serializer(strategy: SubjectStrategy, cached: &str) -> Arc<Serializer> {
        let avro = Codec::Avro(AvroSchema::parse(SCHEMA).unwrap());
        serializer_of(SerializationFormat::Avro, avro, strategy, cached)
    }

    fn serializer_of(
        format: SerializationFormat,
        codec: Codec,
        strategy: SubjectStrategy,
        cached: &str,
    ) -> Arc<Serializer> {
        let config = SerializationConfig {
            format,
            registry_url: "http://127.0.0.1:1".into(),
            subject_strategy: strategy,
            schema_version: "2".into(),
            request_timeout_ms: 2_000,
            ..SerializationConfig::default()
        };
        let s = Serializer::new(&config).unwrap().unwrap();
        s.cache
            .lock()
            .unwrap()
            .insert(cached.to_string(), Arc::new(Cached::new(9, codec)));
        s
    }

    fn record(topic: &str, payload: Option<&str>, headers: &[(&str, &str)]) -> Record {
        Record {
            topic: topic.into(),
            payload: payload.map(|p| Bytes::from(p.to_string())),
            headers: headers
                .iter()
                .map(|(k, v)| (Arc::from(*k), Bytes::from(v.to_string())))
                .collect(),
            ..Record::default()
        }
    }

    #[test]
    fn subjects_follow_confluents_strategies() {
        let r = record("orders", Some("{}"), &[("type", "OrderPlaced")]);
        let subject = |s| serializer(s, "x").subject_for(&r).unwrap();
        assert_eq!(subject(SubjectStrategy::Topic), "orders-value");
        assert_eq!(subject(SubjectStrategy::Record), "OrderPlaced");
        assert_eq!(subject(SubjectStrategy::TopicRecord), "orders-OrderPlaced");
        let nameless = record("orders", Some("{}"), &[]);
        let err = serializer(SubjectStrategy::Record, "x")
            .subject_for(&nameless)
            .unwrap_err();
        assert!(
            matches!(&err, SerializeError::Payload(m) if m.contains("no header `type`")),
            "{err}"
        );
    }

    #[tokio::test]
    async fn a_cached_schema_frames_the_value_and_sets_the_content_type() {
        let s = serializer(SubjectStrategy::Topic, "orders-value");
        let mut r = record(
            "orders",
            Some(r#"{"n": 3}"#),
            &[("content-type", "application/json"), ("ce_type", "T")],
        );
        s.serialize(&mut r).await.unwrap();
        assert_eq!(r.payload.as_deref(), Some(&[0, 0, 0, 0, 9, 6][..]));
        assert_eq!(&r.headers[0].1[..], b"application/avro");
        assert_eq!(&r.headers[1].1[..], b"T");

        let mut tombstone = record("orders", None, &[]);
        s.serialize(&mut tombstone).await.unwrap();
        assert_eq!(tombstone.payload, None);
    }

    #[tokio::test]
    async fn json_schema_and_protobuf_values_are_framed_with_their_content_types() {
        let json = JsonSchema::parse(r#"{"type":"object","required":["n"]}"#).unwrap();
        let s = serializer_of(
            SerializationFormat::JsonSchema,
            Codec::Json(json),
            SubjectStrategy::Topic,
            "orders-value",
        );
        let mut r = record("orders", Some(r#"{"n": 3}"#), &[("content-type", "x")]);
        s.serialize(&mut r).await.unwrap();
        assert_eq!(r.payload.as_deref(), Some(&b"\0\0\0\0\x09{\"n\": 3}"[..]));
        assert_eq!(&r.headers[0].1[..], b"application/json");

        let proto = ProtoSchema::parse("syntax = \"proto3\"; message E { int64 n = 1; }", None);
        let s = serializer_of(
            SerializationFormat::Protobuf,
            Codec::Protobuf(proto.unwrap()),
            SubjectStrategy::Topic,
            "orders-value",
        );
        let mut r = record("orders", Some(r#"{"n": 3}"#), &[("content-type", "x")]);
        s.serialize(&mut r).await.unwrap();
        // Magic byte, id 9, message index [0] as one 0, then field 1 = 3.
        assert_eq!(r.payload.as_deref(), Some(&[0, 0, 0, 0, 9, 0, 0x08, 3][..]));
        assert_eq!(&r.headers[0].1[..], b"application/protobuf");
        let mut bad = record("orders", Some(r#"{"m": 3}"#), &[]);
        assert!(matches!(
            s.serialize(&mut bad).await,
            Err(SerializeError::Payload(why)) if why.contains("schema id 9")
        ));
    }

    #[tokio::test]
    async fn a_schema_id_header_picks_the_schema_by_id() {
        let s = serializer(SubjectStrategy::Topic, "#id 9");
        let mut config = s.config.clone();
        config.schema_id_header = Some("sid".into());
        let s = Serializer {
            config,
            section: s.section.clone(),
            client: s.client.clone(),
            cache: Mutex::new(s.cache.lock().unwrap().clone()),
            health: s.health(),
            max_stale: MAX_STALE,
        };
        // `orders-value` is not cached (its registry does not answer): the id is used.
        let mut r = record("orders", Some(r#"{"n": 3}"#), &[("sid", "9")]);
        s.serialize(&mut r).await.unwrap();
        assert_eq!(r.payload.as_deref(), Some(&[0, 0, 0, 0, 9, 6][..]));
        let mut bad = record("orders", Some(r#"{"n": 3}"#), &[("sid", "v9")]);
        assert!(matches!(
            s.serialize(&mut bad).await,
            Err(SerializeError::Payload(why)) if why.contains("header `sid` is not a schema id")
        ));
        // Without the header the subject's schema is asked for.
        let mut plain = record("orders", Some(r#"{"n": 3}"#), &[]);
        assert!(matches!(
            s.serialize(&mut plain).await,
            Err(SerializeError::Registry { subject, .. }) if subject == "orders-value"
        ));
    }

    /// An Avro serializer with Avro keys: `orders-value` cached as id 9, the key subject
    /// `orders-key` as id 5.
    fn with_avro_keys() -> Arc<Serializer> {
        let s = serializer(SubjectStrategy::Topic, "orders-value");
        let mut config = s.config.clone();
        config.key_format = crate::config::KeyFormat::Avro;
        let string = Codec::Avro(AvroSchema::parse(key::AVRO_STRING).unwrap());
        let mut cache = s.cache.lock().unwrap().clone();
        let key = Cached::new(5, string);
        cache.insert("#key orders-key".into(), Arc::new(key));
        Arc::new(Serializer {
            config,
            section: s.section.clone(),
            client: s.client.clone(),
            cache: Mutex::new(cache),
            health: s.health(),
            max_stale: MAX_STALE,
        })
    }

    #[tokio::test]
    async fn an_avro_key_is_framed_and_the_partition_still_follows_the_plain_key() {
        let s = with_avro_keys();
        let mut r = record("orders", Some(r#"{"n": 3}"#), &[]);
        r.key = Bytes::from_static(b"e-1");
        r.partition_key = Some(Bytes::from_static(b"agg-7"));
        s.serialize(&mut r).await.unwrap();
        assert_eq!(&r.key[..], b"\0\0\0\0\x05\x06e-1");
        assert_eq!(r.payload.as_deref(), Some(&[0, 0, 0, 0, 9, 6][..]));
        assert_eq!(r.partition_key.as_deref(), Some(&b"agg-7"[..]), "kept");
        // partition_by = "key": the partition is hashed from the key as it was.
        let mut by_key = record("orders", Some(r#"{"n": 3}"#), &[]);
        by_key.key = Bytes::from_static(b"e-2");
        s.serialize(&mut by_key).await.unwrap();
        assert_eq!(by_key.partition_key.as_deref(), Some(&b"e-2"[..]));
        // A tombstone's key is encoded too, so compaction matches it with its records.
        let mut tombstone = record("orders", None, &[]);
        tombstone.key = Bytes::from_static(b"e-1");
        s.serialize(&mut tombstone).await.unwrap();
        assert_eq!(&tombstone.key[..], b"\0\0\0\0\x05\x06e-1");
        assert_eq!(tombstone.payload, None);
    }

    #[tokio::test]
    async fn a_key_that_is_no_string_is_the_records_fault_and_a_missing_key_schema_blocks() {
        let s = with_avro_keys();
        let mut bytes_key = record("orders", Some(r#"{"n": 3}"#), &[]);
        bytes_key.key = Bytes::from_static(&[0xff]);
        match s.serialize(&mut bytes_key).await {
            Err(SerializeError::Payload(why)) => {
                assert!(why.contains("key subject `orders-key`"), "{why}")
            }
            other => panic!("{other:?}"),
        }
        // `users-key` is not cached and the registry does not answer: it blocks, and the
        // record is left as it was (its value is not half encoded).
        let s = with_avro_keys();
        let value = s.cached("orders-value").unwrap();
        s.cache.lock().unwrap().insert("users-value".into(), value);
        let mut users = record("users", Some(r#"{"n": 1}"#), &[]);
        users.key = Bytes::from_static(b"u-1");
        let before = users.clone();
        match s.serialize(&mut users).await {
            Err(SerializeError::Registry { subject, .. }) => assert_eq!(subject, "users-key"),
            other => panic!("{other:?}"),
        }
        assert_eq!(users, before);
    }

    /// A registry stand-in: ids 9 (the test schema) and subject `Known`; 404s with the
    /// registry's codes for id 77 and subjects `Typo` and `orders-value`; `Wrong` holds a
    /// Protobuf schema; `Down` answers 503, `Locked` 401, `Proxy` a 404 without a code.
    fn registry() -> stand_in::StandIn {
        stand_in::StandIn::start(|seen| {
            let found = serde_json::json!({ "id": 9, "schema": SCHEMA }).to_string();
            let missing = |code: u32| {
                (
                    404,
                    format!(r#"{{"error_code":{code},"message":"not found"}}"#),
                )
            };
            match seen.path.as_str() {
                "/schemas/ids/9" | "/subjects/Known/versions/latest" => (200, found),
                "/schemas/ids/77" => missing(40403),
                "/subjects/Typo/versions/latest" | "/subjects/orders-value/versions/latest" => {
                    missing(40401)
                }
                "/subjects/orders-Typo/versions/latest" => missing(40401),
                "/subjects/Wrong/versions/latest" => (
                    200,
                    serde_json::json!({ "id": 5, "schemaType": "PROTOBUF",
                        "schema": "syntax = \"proto3\"; message E { int64 n = 1; }" })
                    .to_string(),
                ),
                "/subjects/Locked/versions/latest" => (401, "{}".into()),
                "/subjects/Proxy/versions/latest" => (404, "<html>no</html>".into()),
                _ => (503, "{}".into()),
            }
        })
    }

    fn against(url: &str, configure: impl FnOnce(&mut SerializationConfig)) -> Arc<Serializer> {
        let mut config = SerializationConfig {
            format: SerializationFormat::Avro,
            registry_url: url.into(),
            request_timeout_ms: 2_000,
            ..SerializationConfig::default()
        };
        configure(&mut config);
        Serializer::new(&config).unwrap().unwrap()
    }

    #[tokio::test]
    async fn a_schema_id_the_registry_does_not_have_is_the_records_fault() {
        let registry = registry();
        let s = against(&registry.url, |c| c.schema_id_header = Some("sid".into()));
        let mut known = record("orders", Some(r#"{"n": 3}"#), &[("sid", "9")]);
        s.serialize(&mut known).await.unwrap();
        assert_eq!(known.payload.as_deref(), Some(&[0, 0, 0, 0, 9, 6][..]));
        let mut again = record("orders", Some(r#"{"n": 4}"#), &[("sid", "9")]);
        s.serialize(&mut again).await.unwrap();
        let asked = registry
            .seen()
            .iter()
            .filter(|r| r.path == "/schemas/ids/9")
            .count();
        assert_eq!(asked, 1, "an id's schema is cached for good");

        let mut unknown = record("orders", Some(r#"{"n": 3}"#), &[("sid", "77")]);
        match s.serialize(&mut unknown).await {
            Err(SerializeError::Payload(why)) => {
                assert!(why.contains("schema id 77"), "{why}");
                assert!(
                    why.contains("outbox.serialization.schema_id_header"),
                    "{why}"
                );
                assert!(why.contains("dead-letters redrive"), "{why}");
            }
            other => panic!("{other:?}"),
        }
        assert!(s.health().current().is_empty(), "nothing blocks");
        // Without the header the configured subject is used: its 404 is the deployment's.
        let mut plain = record("orders", Some(r#"{"n": 3}"#), &[]);
        match s.serialize(&mut plain).await {
            Err(SerializeError::Registry { subject, error }) => {
                assert_eq!(subject, "orders-value");
                assert!(matches!(error, RegistryError::NotFound { .. }), "{error}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn a_record_name_the_registry_does_not_have_is_the_records_fault_and_an_outage_is_not() {
        let registry = registry();
        for strategy in [SubjectStrategy::Record, SubjectStrategy::TopicRecord] {
            let s = against(&registry.url, |c| c.subject_strategy = strategy);
            let mut typo = record("orders", Some(r#"{"n": 3}"#), &[("type", "Typo")]);
            match s.serialize(&mut typo).await {
                Err(SerializeError::Payload(why)) => {
                    assert!(why.contains("Typo"), "{why}");
                    assert!(why.contains("header `type`"), "{why}");
                    assert!(why.contains("subject_strategy"), "{why}");
                }
                other => panic!("{strategy:?}: {other:?}"),
            }
        }
        let s = against(&registry.url, |c| {
            c.subject_strategy = SubjectStrategy::Record
        });
        let mut known = record("orders", Some(r#"{"n": 3}"#), &[("type", "Known")]);
        s.serialize(&mut known).await.unwrap();
        // A schema of another format under the row's subject: the row's fault too.
        let mut wrong = record("orders", Some(r#"{"n": 3}"#), &[("type", "Wrong")]);
        assert!(
            matches!(s.serialize(&mut wrong).await, Err(SerializeError::Payload(why)) if why.contains("PROTOBUF")),
        );
        // An outage, a refused login, or a 404 that is not the registry's: they block.
        for subject in ["Down", "Locked", "Proxy"] {
            let mut r = record("orders", Some(r#"{"n": 3}"#), &[("type", subject)]);
            match s.serialize(&mut r).await {
                Err(SerializeError::Registry { subject: s, .. }) => assert_eq!(s, subject),
                other => panic!("{subject}: {other:?}"),
            }
        }
        // The topic strategy's subject is configuration: its 404 blocks, as before.
        let s = against(&registry.url, |_| {});
        let mut r = record("orders", Some(r#"{"n": 3}"#), &[("type", "Typo")]);
        assert!(matches!(
            s.serialize(&mut r).await,
            Err(SerializeError::Registry { .. })
        ));
    }

    /// `s` with its cache as it is, its client and its staleness limit replaced.
    fn rebuilt(s: &Serializer, client: Arc<dyn SchemaRegistry>, max_stale: Duration) -> Serializer {
        Serializer {
            config: s.config.clone(),
            section: s.section.clone(),
            client,
            cache: Mutex::new(s.cache.lock().unwrap().clone()),
            health: s.health(),
            max_stale,
        }
    }

    #[tokio::test]
    async fn a_latest_schema_whose_refresh_fails_is_used_until_the_staleness_limit() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let down = Arc::new(AtomicBool::new(false));
        let switch = down.clone();
        let registry = stand_in::StandIn::start(move |_| {
            if switch.load(Ordering::SeqCst) {
                (503, "{}".into())
            } else {
                (
                    200,
                    serde_json::json!({ "id": 9, "schema": SCHEMA }).to_string(),
                )
            }
        });
        let s = against(&registry.url, |c| c.latest_ttl_ms = 1);
        let mut r = record("orders", Some(r#"{"n": 3}"#), &[]);
        s.serialize(&mut r).await.unwrap();

        down.store(true, Ordering::SeqCst);
        // Past the 1 ms TTL: the refresh is due, and fails.
        std::thread::sleep(Duration::from_millis(2));
        let mut r = record("orders", Some(r#"{"n": 3}"#), &[]);
        s.serialize(&mut r).await.unwrap();
        assert_eq!(r.payload.as_deref(), Some(&[0, 0, 0, 0, 9, 6][..]));
        let stale = s.health().stale();
        assert_eq!(stale.len(), 1, "{stale:?}");
        assert_eq!(stale[0].0, "orders-value");
        assert!(s.health().current().is_empty(), "nothing blocks");
        assert_eq!(registry.seen().len(), 2, "the refresh was tried");

        // Past the limit the stale schema is no longer used: the record waits.
        let strict = rebuilt(&s, s.client.clone(), Duration::ZERO);
        std::thread::sleep(Duration::from_millis(2));
        let mut r = record("orders", Some(r#"{"n": 3}"#), &[]);
        match strict.serialize(&mut r).await {
            Err(SerializeError::Registry { subject, error }) => {
                assert_eq!(subject, "orders-value");
                assert!(
                    matches!(error, RegistryError::Failed { status: 503, .. }),
                    "{error}"
                );
            }
            other => panic!("{other:?}"),
        }
        assert!(strict.health().stale().is_empty());

        down.store(false, Ordering::SeqCst);
        let mut r = record("orders", Some(r#"{"n": 3}"#), &[]);
        s.serialize(&mut r).await.unwrap();
        assert!(s.health().stale().is_empty(), "refreshed");
    }

    #[tokio::test]
    async fn a_rotated_token_is_read_again_after_a_refusal_and_every_few_minutes() {
        let file = std::env::temp_dir().join(format!(
            "outbox-relay-registry-token-{}",
            std::process::id()
        ));
        std::fs::write(&file, "old\n").unwrap();
        // The registry takes any token but `old`.
        let registry = stand_in::StandIn::start(|seen| {
            if seen.authorization.as_deref() == Some("Bearer old") {
                (401, "{}".into())
            } else {
                (
                    200,
                    serde_json::json!({ "id": 9, "schema": SCHEMA }).to_string(),
                )
            }
        });
        let path = file.clone();
        let s = against(&registry.url, move |c| c.registry_token_file = Some(path));
        // The client itself (its login shared by its clones), to make one that reads the
        // file again at every request below.
        let client = RegistryClient::new(&s.config, s.config.read_secret().unwrap());
        let s = Serializer::with_registry(
            &s.config,
            &s.section,
            s.health(),
            Arc::new(client.clone()),
            MAX_STALE,
        );
        // Refused, and the file holds the same token: no second try, the record waits.
        let mut r = record("orders", Some(r#"{"n": 3}"#), &[]);
        match s.serialize(&mut r).await {
            Err(SerializeError::Registry { error, .. }) => {
                assert_eq!(error, RegistryError::Unauthorized { status: 401 })
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(registry.seen().len(), 1);

        // Rotated: the refusal makes the relay read the file again and retry at once.
        std::fs::write(&file, "new\n").unwrap();
        s.serialize(&mut r).await.unwrap();
        let auth: Vec<Option<String>> = registry
            .seen()
            .into_iter()
            .map(|r| r.authorization)
            .collect();
        assert_eq!(
            auth[1..],
            [
                Some("Bearer old".to_string()),
                Some("Bearer new".to_string())
            ]
        );

        // Rotated again: read when due, before any refusal.
        std::fs::write(&file, "newer").unwrap();
        let due = rebuilt(
            &s,
            Arc::new(client.rereading_every(Duration::ZERO)),
            MAX_STALE,
        );
        let mut users = record("users", Some(r#"{"n": 1}"#), &[]);
        due.serialize(&mut users).await.unwrap();
        let last = registry.seen().pop().unwrap();
        assert_eq!(last.authorization.as_deref(), Some("Bearer newer"));
        assert_eq!(registry.seen().len(), 4, "no refusal first");
        let _ = std::fs::remove_file(&file);
    }

    #[tokio::test]
    async fn a_bad_payload_is_the_records_fault_and_a_silent_registry_is_not() {
        let s = serializer(SubjectStrategy::Topic, "orders-value");
        let mut bad = record("orders", Some(r#"{"n": "x"}"#), &[]);
        match s.serialize(&mut bad).await {
            Err(SerializeError::Payload(why)) => {
                assert!(
                    why.contains("subject `orders-value` (schema id 9)"),
                    "{why}"
                )
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(bad.payload.as_deref(), Some(&br#"{"n": "x"}"#[..]));

        let mut uncached = record("users", Some(r#"{"n": 1}"#), &[]);
        match s.serialize(&mut uncached).await {
            Err(SerializeError::Registry { subject, error }) => {
                assert_eq!(subject, "users-value");
                assert!(
                    matches!(error, RegistryError::Unreachable { .. }),
                    "{error}"
                );
            }
            other => panic!("{other:?}"),
        }
    }
}
