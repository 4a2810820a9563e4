//! The record's headers: `id`, `type`, `aggregatetype`, `aggregateid`, then the
//! `header_columns`, the members of the `headers_column` JSON object, and the tracing context.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;

use super::fields::{FieldReader, Role, Value};
use super::MappingError;

/// The header holding the event id, the first header of every record in the `plain` and
/// `envelope` formats.
pub(super) const ID_HEADER: &str = "id";

/// Header names, allocated once and shared by every record.
#[derive(Debug, Clone)]
pub(super) struct HeaderNames {
    id: Arc<str>,
    event_type: Arc<str>,
    aggregate_type: Arc<str>,
    aggregate_id: Arc<str>,
}

impl HeaderNames {
    pub(super) fn new() -> Self {
        HeaderNames {
            id: Arc::from(ID_HEADER),
            event_type: Arc::from("type"),
            aggregate_type: Arc::from("aggregatetype"),
            aggregate_id: Arc::from("aggregateid"),
        }
    }
}

/// The header rules of one source: the `header_columns` (their values are the first extra
/// columns, in this order), the tracing header's name, and the fixed header names.
#[derive(Debug)]
pub(super) struct HeaderRules {
    /// `header_columns`: column → header name.
    extra: Vec<(String, Arc<str>)>,
    tracing_header: Arc<str>,
    names: HeaderNames,
}

impl HeaderRules {
    pub(super) fn new(header_columns: &BTreeMap<String, String>, tracing_header: &str) -> Self {
        HeaderRules {
            extra: header_columns
                .iter()
                .map(|(column, header)| (column.clone(), Arc::from(header.as_str())))
                .collect(),
            tracing_header: Arc::from(tracing_header),
            names: HeaderNames::new(),
        }
    }

    /// The `header_columns`' columns, in the order of their extra-column index.
    pub(super) fn columns(&self) -> impl Iterator<Item = &str> {
        self.extra.iter().map(|(column, _)| column.as_str())
    }

    /// How many `header_columns` there are: the extra columns after them are CloudEvents
    /// extensions.
    pub(super) fn count(&self) -> usize {
        self.extra.len()
    }

    /// All headers of one event; `fixed` holds the id, type, aggregate type and aggregate id
    /// (`None` in the CloudEvents formats, whose attributes take their place).
    pub(super) fn headers(
        &self,
        reader: FieldReader<'_>,
        event_id: &str,
        fixed: Option<[&Value; 4]>,
    ) -> Result<Vec<(Arc<str>, Bytes)>, MappingError> {
        let mut headers = Vec::with_capacity(4 + self.extra.len());
        if let Some([id, event_type, aggregate_type, aggregate_id]) = fixed {
            headers.extend([
                (self.names.id.clone(), id.bytes.clone()),
                (self.names.event_type.clone(), event_type.bytes.clone()),
                (
                    self.names.aggregate_type.clone(),
                    aggregate_type.bytes.clone(),
                ),
                (self.names.aggregate_id.clone(), aggregate_id.bytes.clone()),
            ]);
        }
        for (i, (_, header)) in self.extra.iter().enumerate() {
            if let Some(v) = reader.extra(i, event_id)? {
                headers.push((header.clone(), v.bytes));
            }
        }
        if let Some(v) = reader.get(Role::Headers, event_id)? {
            self.json_headers(reader, &v, event_id, &mut headers)?;
        }
        if let Some(v) = reader.get(Role::Tracing, event_id)? {
            self.tracing_headers(reader, &v, event_id, &mut headers)?;
        }
        Ok(headers)
    }

    /// One header per member of a JSON object.
    fn json_headers(
        &self,
        reader: FieldReader<'_>,
        value: &Value,
        event_id: &str,
        headers: &mut Vec<(Arc<str>, Bytes)>,
    ) -> Result<(), MappingError> {
        let object: serde_json::Map<String, serde_json::Value> =
            serde_json::from_slice(&value.bytes).map_err(|e| {
                reader.invalid(
                    Role::Headers,
                    event_id,
                    format!("not a JSON object of headers ({e})"),
                )
            })?;
        for (name, v) in object {
            let bytes = match v {
                serde_json::Value::Null => continue,
                serde_json::Value::String(s) => Bytes::from(s),
                other => Bytes::from(other.to_string()),
            };
            headers.push((Arc::from(name.as_str()), bytes));
        }
        Ok(())
    }

    /// A W3C span context as one header, or a `key=value` list as one header per key.
    fn tracing_headers(
        &self,
        reader: FieldReader<'_>,
        value: &Value,
        event_id: &str,
        headers: &mut Vec<(Arc<str>, Bytes)>,
    ) -> Result<(), MappingError> {
        let text = reader.utf8(&value.bytes, Role::Tracing, event_id)?;
        if !text.contains('=') {
            let trimmed = text.trim();
            if !trimmed.is_empty() {
                headers.push((
                    self.tracing_header.clone(),
                    Bytes::copy_from_slice(trimmed.as_bytes()),
                ));
            }
            return Ok(());
        }
        for line in text.lines().map(str::trim) {
            if line.is_empty() || line.starts_with('#') || line.starts_with('!') {
                continue;
            }
            let (name, v) = line.split_once('=').ok_or_else(|| {
                reader.invalid(
                    Role::Tracing,
                    event_id,
                    format!("line `{line}` of the span context is not key=value"),
                )
            })?;
            headers.push((
                Arc::from(name.trim()),
                Bytes::copy_from_slice(v.trim().as_bytes()),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::mapping::test_support::*;

    #[test]
    fn headers_column_and_extra_columns_become_headers() {
        let m = mapping(|c| {
            c.headers_column = Some("headers".into());
            c.header_columns.insert("tenant".into(), "x-tenant".into());
            c.header_columns.insert("region".into(), "x-region".into());
        });
        let mut cols = debezium_columns(text("{}"));
        cols.push(("tenant", 25, text("acme")));
        cols.push(("region", 25, TupleValue::Null));
        cols.push((
            "headers",
            oid::JSONB,
            text(r#"{"n": 1, "s": "v", "nothing": null, "o": {"a": [1]}}"#),
        ));
        let event = map_row(&m, &cols).unwrap();
        assert_eq!(
            headers(&event.record)[4..],
            [
                ("x-tenant", &b"acme"[..]),
                ("n", b"1"),
                ("o", br#"{"a":[1]}"#),
                ("s", b"v"),
            ]
        );
        cols[7].2 = text("[1, 2]");
        let err = map_row(&m, &cols).unwrap_err();
        assert!(err.to_string().contains("headers"), "{err}");
    }

    #[test]
    fn tracing_context_becomes_headers() {
        let m = mapping(|c| c.tracing_column = Some("tracingspancontext".into()));
        let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let mut cols = debezium_columns(text("{}"));
        cols.push(("tracingspancontext", 25, text(traceparent)));
        let event = map_row(&m, &cols).unwrap();
        assert_eq!(
            headers(&event.record)[4..],
            [("traceparent", traceparent.as_bytes())]
        );
        let properties = format!("#Mon Jan 01\ntraceparent={traceparent}\ntracestate=k=v\n");
        cols[5].2 = text(&properties);
        let event = map_row(&m, &cols).unwrap();
        assert_eq!(
            headers(&event.record)[4..],
            [
                ("traceparent", traceparent.as_bytes()),
                ("tracestate", &b"k=v"[..])
            ]
        );
    }
}
