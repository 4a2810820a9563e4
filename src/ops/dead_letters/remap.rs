//! A dead letter's row image back into a row, mapped again with the current configuration by
//! the relay's own [`OutboxMapping`] (no second mapper).
//!
//! The image (see [`crate::sink::dead_letter`]) holds each column's text output and its type
//! OID; a Relation and a Tuple are rebuilt from it, bound by name like the live stream does.
//! A dead letter written before the types were recorded maps every column as text. A row of
//! `pg_logical_emit_message` (table `pg_logical_emit_message.<prefix>`) becomes the message
//! again. What the image does not hold (a column left out for its size, a binary value)
//! cannot be mapped: the dead letter is left, and says why.

use bytes::Bytes;
use serde::Deserialize;

use crate::lsn::Lsn;
use crate::mapping::{OutboxEvent, OutboxMapping};
use crate::source::pgoutput::{Column, Message, Relation, Tuple, TupleValue};

/// The schema name [`crate::mapping::message_as_row`] gives a logical message.
const MESSAGE_NAMESPACE: &str = "pg_logical_emit_message";
/// PostgreSQL's `text` type, for columns of an image without types.
const TEXT_OID: u32 = 25;

/// The row image of a dead letter.
#[derive(Debug, Deserialize)]
pub(super) struct RowImage {
    table: String,
    columns: serde_json::Map<String, serde_json::Value>,
    #[serde(default)]
    types: serde_json::Map<String, serde_json::Value>,
    #[serde(default)]
    commit_time_ms: Option<i64>,
}

/// Why a dead letter could not be mapped again.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Remap {
    /// The image lacks what a mapping needs (its text says what).
    Unusable(String),
    /// The current configuration still cannot map it.
    Failed(String),
}

impl RowImage {
    pub(super) fn parse(bytes: &[u8]) -> Result<RowImage, Remap> {
        serde_json::from_slice(bytes)
            .map_err(|e| Remap::Unusable(format!("its row image is not readable: {e}")))
    }

    /// Maps the row with `mapping`; `fallback_time_ms` stands in for a missing commit time.
    pub(super) fn map(
        &self,
        mapping: &OutboxMapping,
        fallback_time_ms: i64,
    ) -> Result<OutboxEvent, Remap> {
        let commit_time_ms = self.commit_time_ms.unwrap_or(fallback_time_ms);
        let (relation, tuple) = self.rebuild()?;
        let failed = |e: crate::mapping::MappingError| Remap::Failed(e.to_string());
        if relation.namespace == MESSAGE_NAMESPACE {
            let content = match tuple.0.first() {
                Some(TupleValue::Text(b)) => b.clone(),
                _ => return Err(Remap::Unusable("the message has no content".into())),
            };
            let message = Message {
                transactional: true,
                lsn: Lsn(0),
                prefix: relation.name.clone(),
                content,
            };
            return mapping
                .message_event(&message, commit_time_ms)
                .map_err(failed);
        }
        let Some(bound) = mapping.bind(&relation) else {
            return Err(Remap::Failed(format!(
                "table {} is not a configured outbox table",
                self.table
            )));
        };
        bound
            .map_err(failed)?
            .to_event(&tuple, commit_time_ms)
            .map_err(failed)
    }

    fn rebuild(&self) -> Result<(Relation, Tuple), Remap> {
        let (namespace, name) = self
            .table
            .split_once('.')
            .ok_or_else(|| Remap::Unusable(format!("table `{}` has no schema", self.table)))?;
        let mut columns = Vec::new();
        let mut values = Vec::new();
        for (column, value) in &self.columns {
            let type_oid = self
                .types
                .get(column)
                .and_then(serde_json::Value::as_u64)
                .map_or(TEXT_OID, |t| t as u32);
            columns.push(Column {
                flags: 0,
                name: column.clone(),
                type_oid,
                type_modifier: -1,
            });
            values.push(match value {
                serde_json::Value::Null => TupleValue::Null,
                serde_json::Value::String(s) => TupleValue::Text(Bytes::from(s.clone())),
                other => TupleValue::Text(Bytes::from(other.to_string())),
            });
        }
        let relation = Relation {
            id: 0,
            namespace: namespace.to_string(),
            name: name.to_string(),
            replica_identity: b'd',
            columns,
        };
        Ok((relation, Tuple(values)))
    }
}

/// A row image that left columns out cannot be mapped faithfully. `omitted`: the dead
/// letter's `outbox-relay.dlq.omitted` notes; `in_value`: the image is the value (a row dead
/// letter, whose every note is about the image) rather than the `row` header (whose notes
/// start with `row`).
pub(super) fn check_complete(in_value: bool, omitted: &[String]) -> Result<(), Remap> {
    match omitted.iter().find(|o| in_value || o.starts_with("row")) {
        Some(what) => Err(Remap::Unusable(format!(
            "its row image left out {what}; redrive it by hand"
        ))),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::OutboxConfig;

    fn mapping(topic_column: bool) -> OutboxMapping {
        let mut config = OutboxConfig::default();
        if topic_column {
            config.topic_column = Some("topic".into());
        }
        OutboxMapping::new(&config).unwrap()
    }

    fn image(topic: &str) -> Vec<u8> {
        serde_json::json!({
            "table": "public.outbox",
            "columns": {
                "id": "e-1", "aggregatetype": "order", "aggregateid": "a-1",
                "type": "Created", "payload": "{\"a\":1}", "topic": topic,
            },
            "types": {"id": 25, "payload": 114},
            "commit_time_ms": 1_700_000_000_000i64,
        })
        .to_string()
        .into_bytes()
    }

    #[test]
    fn a_row_image_maps_like_the_live_row() {
        let row = RowImage::parse(&image("orders.fixed")).unwrap();
        let event = row.map(&mapping(true), 0).unwrap();
        assert_eq!(event.id, "e-1");
        assert_eq!(event.record.topic, "orders.fixed");
        assert_eq!(event.record.payload.as_deref(), Some(&b"{\"a\":1}"[..]));
        assert_eq!(event.record.timestamp_ms, Some(1_700_000_000_000));
    }

    #[test]
    fn a_row_the_current_config_still_cannot_map_fails() {
        let row = RowImage::parse(&image("bad topic!")).unwrap();
        assert!(matches!(row.map(&mapping(true), 0), Err(Remap::Failed(_))));
    }

    #[test]
    fn an_image_with_columns_left_out_is_unusable() {
        let payload = vec!["payload (2000000 bytes)".to_string()];
        assert!(
            check_complete(false, &payload).is_ok(),
            "the record's payload"
        );
        assert!(check_complete(false, &[]).is_ok());
        assert!(matches!(
            check_complete(true, &payload),
            Err(Remap::Unusable(_))
        ));
        let row = vec!["row: payload (300000 bytes)".to_string()];
        assert!(matches!(
            check_complete(false, &row),
            Err(Remap::Unusable(_))
        ));
        assert!(RowImage::parse(b"not json").is_err());
    }
}
