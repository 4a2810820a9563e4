//! The CloudEvents formats (`outbox.format = "cloudevents_binary"` / `"cloudevents_structured"`):
//! CloudEvents 1.0 over the Kafka protocol binding.
//!
//! | attribute | from |
//! |---|---|
//! | `specversion` | `1.0` |
//! | `id` | the event id (non-empty) |
//! | `source` | `cloudevents_source`, `{schema}` and `{table}` replaced (messages: `pg_logical_emit_message` and the prefix) |
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
//! data. The record key stays the event id (or `key_column`'s value); `header_columns`,
//! `headers_column` and the tracing context still become headers.
//!
//! Attribute values are checked as the spec's String type (no control characters or Unicode
//! noncharacters; `id`, `type`, `subject` non-empty): an event that breaks a rule is a
//! [`MappingError::InvalidValue`], dead-lettered like any other mapping error.

use std::sync::Arc;

use bytes::Bytes;

use super::fields::{EventFields, FieldReader, Kind, Role, Value};
use super::headers::HeaderRules;
use super::payload::{payload_value, write_base64, write_string};
use super::MappingError;
use crate::config::{
    cloudevents_extension_problem, cloudevents_string_problem, Format, NullPayload, OutboxConfig,
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
/// `{schema}` of `pg_logical_emit_message` events in `cloudevents_source`.
pub(super) const MESSAGE_SCHEMA: &str = "pg_logical_emit_message";
/// Prefix of the binary-mode attribute headers.
pub(super) const HEADER_PREFIX: &str = "ce_";
/// The binary-mode header of the `id` attribute: the event id.
pub(super) const ID_HEADER: &str = "ce_id";

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
        // Logical messages have no schema: they are named like their dead letters' rows.
        let schema = if schema.is_empty() {
            MESSAGE_SCHEMA
        } else {
            schema
        };
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
                id: Arc::from(ID_HEADER),
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
        reader: FieldReader<'_>,
        header_rules: &HeaderRules,
        null_payload: NullPayload,
        fields: &EventFields<'_>,
        timestamp_ms: i64,
    ) -> Result<(Option<Bytes>, Headers), MappingError> {
        // The extensions' values are the extra columns after the `header_columns`.
        let first_extension = header_rules.count();
        let attributes = self.attributes(reader, first_extension, fields, timestamp_ms)?;
        let other_headers = header_rules.headers(reader, fields.id, None)?;
        let payload = payload_value(reader, null_payload, fields.id)?;
        let (value, mut headers) = match payload {
            Some(data) if self.structured => {
                let value = self.structured_event(reader, &attributes, &data, fields.id)?;
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
        reader: FieldReader<'_>,
        first_extension: usize,
        fields: &EventFields<'a>,
        timestamp_ms: i64,
    ) -> Result<Attributes<'a>, MappingError> {
        let id = fields.id;
        check_string(reader, Role::Id, id, id, true)?;
        check_string(reader, Role::Type, id, fields.event_type, true)?;
        let subject = match reader.get(Role::Subject, id)? {
            Some(v) => {
                let text = reader.utf8(&v.bytes, Role::Subject, id)?;
                check_string(reader, Role::Subject, id, text, true)?;
                Some(v)
            }
            None => None,
        };
        let mut extensions = Vec::with_capacity(self.extensions.len());
        for (i, extension) in self.extensions.iter().enumerate() {
            let Some(v) = reader.extra(first_extension + i, id)? else {
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
                .map_err(|reason| reader.invalid(Role::Timestamp, id, reason))?,
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
        reader: FieldReader<'_>,
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
                    return Err(reader.invalid(
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
                let payload = reader.utf8(&data.bytes, Role::Payload, event_id)?;
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
    reader: FieldReader<'_>,
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
        return Err(reader.invalid(
            role,
            event_id,
            format!("CloudEvents attribute `{attribute}` must not be empty"),
        ));
    }
    if let Some(problem) = cloudevents_string_problem(value) {
        return Err(reader.invalid(
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
/// `2026-03-01T10:30:45.678Z`. Negative and post-9999 times are refused (the mapping already
/// refuses negative timestamps, which Kafka cannot hold).
///
/// Computed as a civil (UTC) date-time: jiff's `Timestamp` stops a day short of 9999-12-31
/// (so that any offset can apply), while PostgreSQL's timestamps reach its end.
pub(super) fn rfc3339(timestamp_ms: i64) -> Result<String, String> {
    const UNIX_EPOCH: jiff::civil::DateTime = jiff::civil::date(1970, 1, 1).at(0, 0, 0, 0);
    let out_of_range = || format!("{timestamp_ms} ms cannot be written as an RFC 3339 time");
    if timestamp_ms < 0 {
        return Err(out_of_range());
    }
    let utc = UNIX_EPOCH
        .checked_add(jiff::SignedDuration::from_millis(timestamp_ms))
        .map_err(|_| out_of_range())?;
    // The precision fixes three fractional digits.
    Ok(format!("{utc:.3}Z"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::NullPayload;
    use crate::mapping::test_support::*;

    fn binary(edit: impl FnOnce(&mut OutboxConfig)) -> OutboxMapping {
        mapping(|c| {
            c.format = Format::CloudeventsBinary;
            edit(c);
        })
    }

    fn structured(edit: impl FnOnce(&mut OutboxConfig)) -> OutboxMapping {
        mapping(|c| {
            c.format = Format::CloudeventsStructured;
            edit(c);
        })
    }

    fn event_json(record: &Record) -> serde_json::Value {
        serde_json::from_slice(record.payload.as_deref().unwrap()).unwrap()
    }

    fn with_payload(type_oid: u32, payload: &str) -> Vec<(&'static str, u32, TupleValue)> {
        let mut cols = debezium_columns(text(payload));
        cols[4].1 = type_oid;
        cols
    }

    #[test]
    fn binary_mode_sends_every_attribute_as_a_ce_header() {
        let event = map_row(&binary(|_| {}), &debezium_columns(text(r#"{"total": 3}"#))).unwrap();
        let r = &event.record;
        assert_eq!(&r.key[..], ID.as_bytes(), "the key stays the event id");
        assert_eq!(r.topic, "outbox.event.order");
        assert_eq!(r.payload.as_deref(), Some(&br#"{"total": 3}"#[..]));
        assert_eq!(r.timestamp_ms, Some(1234));
        assert_eq!(
            headers(r),
            vec![
                ("ce_specversion", &b"1.0"[..]),
                ("ce_id", ID.as_bytes()),
                ("ce_source", b"/outbox-relay/public.outbox"),
                ("ce_type", b"OrderCreated"),
                ("ce_time", b"1970-01-01T00:00:01.234Z"),
                ("ce_subject", b"42"),
                ("content-type", b"application/json"),
            ]
        );
    }

    #[test]
    fn structured_mode_is_one_json_event_with_the_payload_embedded_byte_for_byte() {
        let payload = r#"{"total": 3, "items": [1.50, "x"]}"#;
        let event = map_row(&structured(|_| {}), &debezium_columns(text(payload))).unwrap();
        let r = &event.record;
        assert_eq!(&r.key[..], ID.as_bytes());
        assert_eq!(
            headers(r),
            vec![(
                "content-type",
                &b"application/cloudevents+json; charset=UTF-8"[..]
            )]
        );
        let value = r.payload.as_deref().unwrap();
        let expected = format!(
            r#"{{"specversion":"1.0","id":"{ID}","source":"/outbox-relay/public.outbox","type":"OrderCreated","time":"1970-01-01T00:00:01.234Z","subject":"42","datacontenttype":"application/json","data":{payload}}}"#
        );
        assert_eq!(std::str::from_utf8(value).unwrap(), expected);
        let json = event_json(r);
        assert_eq!(json["specversion"], "1.0");
        assert_eq!(json["id"], ID);
        assert_eq!(json["data"]["items"][0], 1.5);
        assert!(json.get("data_base64").is_none());
    }

    #[test]
    fn bytea_payloads_are_data_base64_and_octet_streams() {
        let cols = with_payload(oid::BYTEA, "\\x00ff10");
        let event = map_row(&structured(|_| {}), &cols).unwrap();
        let json = event_json(&event.record);
        assert_eq!(json["data_base64"], "AP8Q");
        assert!(json.get("data").is_none());
        assert_eq!(json["datacontenttype"], "application/octet-stream");

        let event = map_row(&binary(|_| {}), &cols).unwrap();
        assert_eq!(event.record.payload.as_deref(), Some(&b"\x00\xff\x10"[..]));
        assert_eq!(
            headers(&event.record).last(),
            Some(&("content-type", &b"application/octet-stream"[..]))
        );

        let m = structured(|c| c.cloudevents_content_type = Some("image/png".into()));
        let json = event_json(&map_row(&m, &cols).unwrap().record);
        assert_eq!(json["datacontenttype"], "image/png");
        assert_eq!(json["data_base64"], "AP8Q");
    }

    #[test]
    fn text_payloads_are_strings_unless_their_content_type_is_json() {
        let cols = with_payload(25, "say \"hi\"");
        let json = event_json(&map_row(&structured(|_| {}), &cols).unwrap().record);
        assert_eq!(json["data"], "say \"hi\"");
        assert_eq!(json["datacontenttype"], "text/plain; charset=utf-8");
        let event = map_row(&binary(|_| {}), &cols).unwrap();
        assert_eq!(event.record.payload.as_deref(), Some(&b"say \"hi\""[..]));
        assert_eq!(
            headers(&event.record).last(),
            Some(&("content-type", &b"text/plain; charset=utf-8"[..]))
        );

        let m = structured(|c| {
            c.cloudevents_content_type = Some("application/vnd.acme+json; v=2".into())
        });
        let event = map_row(&m, &with_payload(25, r#"{"a": [1]}"#)).unwrap();
        assert!(event
            .record
            .payload
            .as_deref()
            .unwrap()
            .ends_with(br#","data":{"a": [1]}}"#));
        let err = map_row(&m, &cols).unwrap_err();
        assert!(
            matches!(err, MappingError::InvalidValue { ref column, .. } if column == "payload"),
            "{err}"
        );
        assert!(err.to_string().contains("not JSON"), "{err}");
    }

    #[test]
    fn subject_comes_from_the_configured_column_and_may_be_absent() {
        let m = binary(|c| c.cloudevents_subject_column = Some("customer".into()));
        let mut cols = debezium_columns(text("{}"));
        cols.push(("customer", 25, text("c-7")));
        let event = map_row(&m, &cols).unwrap();
        assert_eq!(headers(&event.record)[5], ("ce_subject", &b"c-7"[..]));

        cols[5].2 = TupleValue::Null;
        let event = map_row(&m, &cols).unwrap();
        assert!(headers(&event.record)
            .iter()
            .all(|(name, _)| *name != "ce_subject"));
        let m = structured(|c| c.cloudevents_subject_column = Some("customer".into()));
        assert!(event_json(&map_row(&m, &cols).unwrap().record)
            .get("subject")
            .is_none());

        cols[5].2 = text("");
        let err = map_row(&m, &cols).unwrap_err();
        assert!(
            err.to_string().contains("`subject` must not be empty"),
            "{err}"
        );
        assert_eq!(err.event_id(), Some(ID));
    }

    #[test]
    fn extensions_are_ce_headers_or_event_members() {
        let edit = |c: &mut OutboxConfig| {
            c.cloudevents_extensions
                .insert("tenant".into(), "tenant".into());
            c.cloudevents_extensions
                .insert("region".into(), "region2".into());
            c.header_columns.insert("tenant".into(), "x-tenant".into());
        };
        let mut cols = debezium_columns(text("{}"));
        cols.push(("tenant", 25, text("acme")));
        cols.push(("region", 25, TupleValue::Null));
        let event = map_row(&binary(edit), &cols).unwrap();
        assert_eq!(
            headers(&event.record)[5..],
            [
                ("ce_subject", &b"42"[..]),
                ("ce_tenant", b"acme"),
                ("content-type", b"application/json"),
                ("x-tenant", b"acme"),
            ]
        );
        let event = map_row(&structured(edit), &cols).unwrap();
        let json = event_json(&event.record);
        assert_eq!(json["tenant"], "acme");
        assert!(json.get("region2").is_none());
        assert_eq!(headers(&event.record)[1], ("x-tenant", &b"acme"[..]));

        cols[6].2 = text("eu\nwest");
        let err = map_row(&binary(edit), &cols).unwrap_err();
        assert!(
            matches!(err, MappingError::InvalidValue { ref column, .. } if column == "region"),
            "{err}"
        );
        assert!(err.to_string().contains("U+000A"), "{err}");
        cols[6] = ("region", oid::BYTEA, text("\\x00"));
        assert!(map_row(&binary(edit), &cols)
            .unwrap_err()
            .to_string()
            .contains("bytea"));
    }

    #[test]
    fn rows_that_cannot_be_events_are_mapping_errors_naming_the_event() {
        for (column, value, expect) in [
            (3, "", "`type` must not be empty"),
            (3, "Order\u{7f}Created", "U+007F"),
            (3, "Order\u{fffe}", "U+FFFE"),
            (0, "", "`id` must not be empty"),
        ] {
            let mut cols = debezium_columns(text("{}"));
            cols[column].2 = text(value);
            for m in [binary(|_| {}), structured(|_| {})] {
                let err = map_row(&m, &cols).unwrap_err();
                assert!(matches!(err, MappingError::InvalidValue { .. }), "{err}");
                assert!(err.to_string().contains(expect), "{value:?}: {err}");
            }
        }
        // The same rows are fine as plain records.
        let mut cols = debezium_columns(text("{}"));
        cols[3].2 = text("");
        assert!(map_row(&default_mapping(), &cols).is_ok());
    }

    #[test]
    fn invalid_extension_names_and_sources_refuse_the_mapping() {
        for name in ["Tenant", "ten-ant", "", "abcdefghijklmnopqrstu", "subject"] {
            let mut config = OutboxConfig {
                format: Format::CloudeventsBinary,
                ..Default::default()
            };
            config
                .cloudevents_extensions
                .insert("tenant".into(), name.into());
            let err = OutboxMapping::new(&config).unwrap_err();
            assert!(
                matches!(err, MappingError::InvalidCloudEventsConfig(_)),
                "{name}: {err}"
            );
            // Plain records ignore the CloudEvents keys.
            config.format = Format::Plain;
            assert!(OutboxMapping::new(&config).is_ok());
        }
        let config = OutboxConfig {
            format: Format::CloudeventsStructured,
            cloudevents_source: "/a\u{1}b".into(),
            ..Default::default()
        };
        assert!(OutboxMapping::new(&config).is_err());
    }

    #[test]
    fn a_tombstone_is_a_null_value_with_binary_attributes_in_either_mode() {
        for m in [
            binary(|c| c.null_payload = NullPayload::Tombstone),
            structured(|c| c.null_payload = NullPayload::Tombstone),
        ] {
            let event = map_row(&m, &debezium_columns(TupleValue::Null)).unwrap();
            assert_eq!(event.record.payload, None);
            let names: Vec<&str> = headers(&event.record).iter().map(|h| h.0).collect();
            assert_eq!(
                names,
                [
                    "ce_specversion",
                    "ce_id",
                    "ce_source",
                    "ce_type",
                    "ce_time",
                    "ce_subject"
                ]
            );
        }
        assert!(matches!(
            map_row(&binary(|_| {}), &debezium_columns(TupleValue::Null)),
            Err(MappingError::NullPayload { .. })
        ));
    }

    #[test]
    fn time_is_the_record_timestamp_in_rfc_3339() {
        let m = structured(|c| c.timestamp_column = Some("occurred_at".into()));
        let mut cols = debezium_columns(text("{}"));
        cols.push((
            "occurred_at",
            oid::TIMESTAMPTZ,
            text("2026-03-01 12:30:45.678901+02"),
        ));
        let json = event_json(&map_row(&m, &cols).unwrap().record);
        assert_eq!(json["time"], "2026-03-01T10:30:45.678Z");
        for (ms, expected) in [
            (0, "1970-01-01T00:00:00.000Z"),
            (1_772_361_045_678, "2026-03-01T10:30:45.678Z"),
            (951_868_799_999, "2000-02-29T23:59:59.999Z"),
            (1_709_251_199_001, "2024-02-29T23:59:59.001Z"),
            (4_107_542_400_000, "2100-03-01T00:00:00.000Z"),
            (253_402_300_799_999, "9999-12-31T23:59:59.999Z"),
        ] {
            assert_eq!(rfc3339(ms).as_deref(), Ok(expected));
            // Read back with the mapping's own ISO parser.
            let parsed = super::super::timestamp::parse_timestamp_ms(expected);
            assert_eq!(parsed, Ok(ms), "{expected} reads back");
        }
        // Agrees with jiff over its range.
        for i in 0..2_000i64 {
            let ms = i * 126_701_107_200_001 % 253_402_214_399_999;
            let t = jiff::Timestamp::from_millisecond(ms).unwrap();
            let expected = format!("{}Z", t.strftime("%Y-%m-%dT%H:%M:%S%.3f"));
            assert_eq!(rfc3339(ms).as_deref(), Ok(expected.as_str()));
        }
        assert!(rfc3339(253_402_300_800_000).is_err());
        assert!(rfc3339(-1).is_err());
        cols[5] = ("occurred_at", oid::INT8, text("253402300800000"));
        assert!(matches!(
            map_row(&m, &cols),
            Err(MappingError::InvalidValue { .. })
        ));
    }

    #[test]
    fn messages_and_other_tables_name_their_own_source() {
        let m = structured(|c| {
            c.message_prefix = Some("outbox".into());
            c.cloudevents_source = "//db1.example.com/orders/{schema}/{table}".into();
        });
        let content =
            r#"{"id":"m-1","aggregatetype":"o","aggregateid":"9","type":"T","payload":{"a":1}}"#;
        let event = m
            .message_event(&message(true, "outbox", content), 5)
            .unwrap();
        let json = event_json(&event.record);
        assert_eq!(
            json["source"],
            "//db1.example.com/orders/pg_logical_emit_message/outbox"
        );
        assert_eq!(json["data"]["a"], 1);
        let event = map_row(&m, &debezium_columns(text("{}"))).unwrap();
        assert_eq!(
            event_json(&event.record)["source"],
            "//db1.example.com/orders/public/outbox"
        );
    }

    #[test]
    fn json_media_types_are_recognised() {
        for (content_type, json) in [
            ("application/json", true),
            ("Application/JSON; charset=utf-8", true),
            ("application/vnd.acme+json", true),
            ("text/plain", false),
            ("+json", false),
            ("application/jsonl", false),
        ] {
            assert_eq!(is_json_media_type(content_type), json, "{content_type}");
        }
    }
}
