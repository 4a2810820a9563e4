//! The CloudEvents formats (`outbox.format = "cloudevents_binary"` / `"cloudevents_structured"`):
//! CloudEvents 1.0 over the Kafka protocol binding.
//!
//! | attribute | from |
//! |---|---|
//! | `specversion` | `1.0` |
//! | `id` | the event id (non-empty) |
//! | `source` | `cloudevents_source`, `{schema}` and `{table}` replaced |
//! | `type` | the event type (non-empty) |
//! | `time` | the record timestamp, RFC 3339 in UTC with milliseconds |
//! | `subject` | `cloudevents_subject_column` (default: the aggregate id); null: none |
//! | `datacontenttype` | `application/json` for json/jsonb, else `cloudevents_content_type` |
//! | extensions | `cloudevents_extensions` columns; null: none |
//!
//! Binary mode: the value is the payload as in `plain`; each attribute is a header `ce_<name>`,
//! `datacontenttype` is the header `content-type`. Structured mode: the value is one JSON event
//! (`application/cloudevents+json`) holding the attributes and `data` (a JSON payload embedded
//! byte-for-byte; text as a JSON string) or `data_base64` (bytea); the `content-type` header
//! names the event format. A tombstone (null payload, `null_payload = "tombstone"`) keeps a
//! null value in both modes and carries the attributes as binary-mode headers: an event without
//! data. The record key stays the event id; `header_columns`, `headers_column` and the tracing
//! context still become headers.
//!
//! Attribute values are checked as the spec's String type (no control characters or Unicode
//! noncharacters; `id`, `type`, `subject` non-empty): an event that breaks a rule is a
//! [`MappingError::InvalidValue`], dead-lettered like any other mapping error.

use std::sync::Arc;

use bytes::Bytes;
use jiff::Timestamp;

use super::payload::{write_base64, write_string};
use super::rules::{Kind, Role, Rules, Source, Value};
use super::topic::EventFields;
use super::MappingError;
use crate::config::{
    cloudevents_extension_problem, cloudevents_string_problem, Format, OutboxConfig,
};

/// The `specversion` attribute.
pub(super) const SPEC_VERSION: &str = "1.0";
/// `datacontenttype` of json and jsonb payloads.
pub(super) const JSON_CONTENT_TYPE: &str = "application/json";
/// Default `datacontenttype` of text payloads.
pub(super) const TEXT_CONTENT_TYPE: &str = "text/plain; charset=utf-8";
/// Default `datacontenttype` of bytea payloads.
pub(super) const BYTES_CONTENT_TYPE: &str = "application/octet-stream";
/// The `content-type` header of a structured-mode record (the JSON event format).
pub(super) const STRUCTURED_CONTENT_TYPE: &str = "application/cloudevents+json; charset=UTF-8";
/// The Kafka binding's header for `datacontenttype` (and the event format in structured mode).
pub(super) const CONTENT_TYPE_HEADER: &str = "content-type";
/// Prefix of the binary-mode attribute headers.
pub(super) const HEADER_PREFIX: &str = "ce_";

/// A record's headers.
type Headers = Vec<(Arc<str>, Bytes)>;

/// One extension attribute: the column it is read from, its name and its binary-mode header.
#[derive(Debug)]
struct Extension {
    column: String,
    name: String,
    header: Arc<str>,
}

/// The compiled CloudEvents rules of one source (table or messages).
#[derive(Debug)]
pub(super) struct CloudEvents {
    structured: bool,
    /// The `source` attribute: constant per table.
    source: Bytes,
    /// `datacontenttype` of payloads that are not JSON; `None`: by type.
    content_type: Option<String>,
    /// True when `content_type` is a JSON media type.
    content_type_is_json: bool,
    extensions: Vec<Extension>,
    names: HeaderNames,
}

/// Binary-mode header names, allocated once.
#[derive(Debug)]
struct HeaderNames {
    specversion: Arc<str>,
    id: Arc<str>,
    source: Arc<str>,
    event_type: Arc<str>,
    time: Arc<str>,
    subject: Arc<str>,
    content_type: Arc<str>,
}

/// The attributes of one event, checked.
struct Attributes<'a> {
    id: &'a str,
    event_type: &'a str,
    time: String,
    subject: Option<Value>,
    /// (extension index, value)
    extensions: Vec<(usize, Bytes)>,
}

impl CloudEvents {
    pub(super) fn new(
        config: &OutboxConfig,
        format: Format,
        schema: &str,
        table: &str,
    ) -> Result<Self, MappingError> {
        let invalid = |reason: String| MappingError::InvalidCloudEventsConfig(reason);
        let source = config
            .cloudevents_source
            .replace("{schema}", schema)
            .replace("{table}", table);
        if source.is_empty() {
            return Err(invalid("outbox.cloudevents_source is empty".into()));
        }
        if let Some(problem) = cloudevents_string_problem(&source) {
            return Err(invalid(format!("source `{source}` {problem}")));
        }
        let mut extensions = Vec::with_capacity(config.cloudevents_extensions.len());
        for (column, name) in &config.cloudevents_extensions {
            if let Some(problem) = cloudevents_extension_problem(name) {
                return Err(invalid(format!(
                    "outbox.cloudevents_extensions.{column}: {problem}"
                )));
            }
            extensions.push(Extension {
                column: column.clone(),
                name: name.clone(),
                header: Arc::from(format!("{HEADER_PREFIX}{name}")),
            });
        }
        let header = |name: &str| Arc::from(format!("{HEADER_PREFIX}{name}"));
        Ok(CloudEvents {
            structured: format == Format::CloudeventsStructured,
            source: Bytes::from(source),
            content_type_is_json: config
                .cloudevents_content_type
                .as_deref()
                .is_some_and(is_json_media_type),
            content_type: config.cloudevents_content_type.clone(),
            extensions,
            names: HeaderNames {
                specversion: header("specversion"),
                id: header("id"),
                source: header("source"),
                event_type: header("type"),
                time: header("time"),
                subject: header("subject"),
                content_type: Arc::from(CONTENT_TYPE_HEADER),
            },
        })
    }

    /// The column of the `i`-th extension.
    pub(super) fn extension_column(&self, i: usize) -> Option<&str> {
        self.extensions.get(i).map(|e| e.column.as_str())
    }

    /// How many extensions are configured.
    pub(super) fn extensions(&self) -> usize {
        self.extensions.len()
    }

    /// The record value and headers of one event. Errors come in a fixed order: attributes,
    /// other headers, payload.
    pub(super) fn build(
        &self,
        rules: &Rules,
        source: &dyn Source,
        fields: &EventFields<'_>,
        timestamp_ms: i64,
    ) -> Result<(Option<Bytes>, Headers), MappingError> {
        let attributes = self.attributes(rules, source, fields, timestamp_ms)?;
        let other_headers = rules.headers(source, fields.id, None)?;
        let payload = rules.payload_value(source, fields.id)?;
        let (value, mut headers) = match payload {
            Some(data) if self.structured => {
                let value = self.structured_event(rules, &attributes, &data, fields.id)?;
                let headers = vec![(
                    self.names.content_type.clone(),
                    Bytes::from_static(STRUCTURED_CONTENT_TYPE.as_bytes()),
                )];
                (Some(value), headers)
            }
            Some(data) => {
                let mut headers = self.binary_headers(&attributes);
                headers.push((
                    self.names.content_type.clone(),
                    Bytes::copy_from_slice(self.content_type(data.kind).as_bytes()),
                ));
                (Some(data.bytes), headers)
            }
            // A tombstone: an event without data, in binary mode whatever the format.
            None => (None, self.binary_headers(&attributes)),
        };
        headers.extend(other_headers);
        Ok((value, headers))
    }

    fn attributes<'a>(
        &self,
        rules: &Rules,
        source: &dyn Source,
        fields: &EventFields<'a>,
        timestamp_ms: i64,
    ) -> Result<Attributes<'a>, MappingError> {
        let id = fields.id;
        check_string(rules, Role::Id, id, id, true)?;
        check_string(rules, Role::Type, id, fields.event_type, true)?;
        let subject = match source.get(rules, Role::Subject, id)? {
            Some(v) => {
                let text = rules.utf8(&v.bytes, Role::Subject, id)?;
                check_string(rules, Role::Subject, id, text, true)?;
                Some(v)
            }
            None => None,
        };
        let mut extensions = Vec::with_capacity(self.extensions.len());
        for (i, extension) in self.extensions.iter().enumerate() {
            let Some(v) = source.extra(rules, rules.extra_headers.len() + i, id)? else {
                continue;
            };
            let invalid = |reason: String| MappingError::InvalidValue {
                event_id: id.to_string(),
                column: extension.column.clone(),
                reason: format!("CloudEvents extension `{}`: {reason}", extension.name),
            };
            if v.kind == Kind::Bytea {
                return Err(invalid("a bytea value is not a CloudEvents string".into()));
            }
            let text = std::str::from_utf8(&v.bytes)
                .map_err(|_| invalid("the value is not valid UTF-8".into()))?;
            if let Some(problem) = cloudevents_string_problem(text) {
                return Err(invalid(format!("the value {problem}")));
            }
            extensions.push((i, v.bytes));
        }
        Ok(Attributes {
            id,
            event_type: fields.event_type,
            time: rfc3339(timestamp_ms)
                .map_err(|reason| rules.invalid(Role::Timestamp, id, reason))?,
            subject,
            extensions,
        })
    }

    /// `datacontenttype` of a payload of this kind.
    fn content_type(&self, kind: Kind) -> &str {
        match (kind, &self.content_type) {
            (Kind::Json, _) => JSON_CONTENT_TYPE,
            (_, Some(configured)) => configured,
            (Kind::Bytea, None) => BYTES_CONTENT_TYPE,
            (Kind::Text | Kind::Integer, None) => TEXT_CONTENT_TYPE,
        }
    }

    /// The attributes as `ce_*` headers (without `content-type`).
    fn binary_headers(&self, a: &Attributes<'_>) -> Headers {
        let n = &self.names;
        let mut headers = vec![
            (
                n.specversion.clone(),
                Bytes::from_static(SPEC_VERSION.as_bytes()),
            ),
            (n.id.clone(), Bytes::copy_from_slice(a.id.as_bytes())),
            (n.source.clone(), self.source.clone()),
            (
                n.event_type.clone(),
                Bytes::copy_from_slice(a.event_type.as_bytes()),
            ),
            (n.time.clone(), Bytes::copy_from_slice(a.time.as_bytes())),
        ];
        if let Some(subject) = &a.subject {
            headers.push((n.subject.clone(), subject.bytes.clone()));
        }
        for (i, value) in &a.extensions {
            headers.push((self.extensions[*i].header.clone(), value.clone()));
        }
        headers
    }

    /// The JSON event format: one object with the attributes and `data` or `data_base64`.
    fn structured_event(
        &self,
        rules: &Rules,
        a: &Attributes<'_>,
        data: &Value,
        event_id: &str,
    ) -> Result<Bytes, MappingError> {
        fn member(out: &mut Vec<u8>, name: &str, value: &str) {
            out.push(if out.is_empty() { b'{' } else { b',' });
            write_string(out, name);
            out.push(b':');
            write_string(out, value);
        }
        // Attribute values were checked as UTF-8 strings; the source is a String too.
        let text = |bytes: &Bytes| String::from_utf8_lossy(bytes).into_owned();
        let mut out = Vec::with_capacity(256 + data.bytes.len() * 4 / 3);
        member(&mut out, "specversion", SPEC_VERSION);
        member(&mut out, "id", a.id);
        member(&mut out, "source", &text(&self.source));
        member(&mut out, "type", a.event_type);
        member(&mut out, "time", &a.time);
        if let Some(subject) = &a.subject {
            member(&mut out, "subject", &text(&subject.bytes));
        }
        member(&mut out, "datacontenttype", self.content_type(data.kind));
        for (i, value) in &a.extensions {
            member(&mut out, &self.extensions[*i].name, &text(value));
        }
        match data.kind {
            Kind::Json => {
                out.extend_from_slice(b",\"data\":");
                out.extend_from_slice(&data.bytes);
            }
            Kind::Bytea => {
                out.extend_from_slice(b",\"data_base64\":");
                write_base64(&mut out, &data.bytes);
            }
            Kind::Text | Kind::Integer if self.content_type_is_json => {
                if serde_json::from_slice::<serde::de::IgnoredAny>(&data.bytes).is_err() {
                    return Err(rules.invalid(
                        Role::Payload,
                        event_id,
                        format!(
                            "the payload is not JSON, but cloudevents_content_type `{}` says it is",
                            self.content_type(data.kind)
                        ),
                    ));
                }
                out.extend_from_slice(b",\"data\":");
                out.extend_from_slice(&data.bytes);
            }
            Kind::Text | Kind::Integer => {
                let payload = rules.utf8(&data.bytes, Role::Payload, event_id)?;
                out.extend_from_slice(b",\"data\":");
                write_string(&mut out, payload);
            }
        }
        out.push(b'}');
        Ok(Bytes::from(out))
    }
}

/// A required (`non_empty`) or optional attribute value as the spec's String type.
fn check_string(
    rules: &Rules,
    role: Role,
    event_id: &str,
    value: &str,
    non_empty: bool,
) -> Result<(), MappingError> {
    let attribute = match role {
        Role::Id => "id",
        Role::Type => "type",
        _ => "subject",
    };
    if non_empty && value.is_empty() {
        return Err(rules.invalid(
            role,
            event_id,
            format!("CloudEvents attribute `{attribute}` must not be empty"),
        ));
    }
    if let Some(problem) = cloudevents_string_problem(value) {
        return Err(rules.invalid(
            role,
            event_id,
            format!("CloudEvents attribute `{attribute}` {problem}"),
        ));
    }
    Ok(())
}

/// `application/json`, or any `…/…+json` media type, parameters ignored.
fn is_json_media_type(content_type: &str) -> bool {
    let essence = content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    essence == JSON_CONTENT_TYPE || (essence.contains('/') && essence.ends_with("+json"))
}

/// Milliseconds since the Unix epoch as RFC 3339 in UTC with milliseconds:
/// `2026-03-01T10:30:45.678Z`. The mapping refuses negative timestamps (Kafka has none), so
/// the year has four digits; the last day of year 9999 is beyond jiff's range and refused.
pub(super) fn rfc3339(timestamp_ms: i64) -> Result<String, String> {
    let t = Timestamp::from_millisecond(timestamp_ms)
        .map_err(|_| format!("{timestamp_ms} ms cannot be written as an RFC 3339 time"))?;
    Ok(format!(
        "{}.{:03}Z",
        t.strftime("%Y-%m-%dT%H:%M:%S"),
        timestamp_ms.rem_euclid(1000)
    ))
}
