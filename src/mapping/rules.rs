//! One compiled set of rules per source (an outbox table, or the logical messages) and the
//! record it builds from any [`Source`] of named fields. The hub of the mapping: each record
//! part has its own file ([`super::topic`], [`super::timestamp`], [`super::headers`],
//! [`super::payload`], [`super::cloudevents`]), which knows nothing of `Rules`; the
//! vocabulary they share is [`super::fields`].

use super::cloudevents::CloudEvents;
use super::fields::{Columns, EventFields, FieldReader, Role, Source};
use super::headers::HeaderRules;
use super::topic::Topics;
use super::{payload, timestamp, MappingError, OutboxEvent, Record, UNKNOWN_ID};
use crate::config::{
    Format, NullPayload, OutboxConfig, PARTITION_BY_AGGREGATE_ID, PARTITION_BY_KEY,
};

/// How the partition is chosen.
#[derive(Debug, Clone, PartialEq, Eq)]
enum PartitionBy {
    AggregateId,
    Key,
    Column,
}

/// The compiled mapping of one source: an outbox table, or the logical messages.
#[derive(Debug)]
pub(super) struct Rules {
    pub schema: String,
    /// The table name, or the message prefix.
    pub table: String,
    columns: Columns,
    topics: Topics,
    /// `plain` or `envelope` (the CloudEvents formats are in `cloudevents`).
    format: Format,
    /// The CloudEvents attributes, in the two CloudEvents formats.
    cloudevents: Option<CloudEvents>,
    null_payload: NullPayload,
    partition_by: PartitionBy,
    headers: HeaderRules,
    /// The table's serialization section, for [`OutboxEvent::profile`].
    profile: usize,
}

impl Rules {
    pub(super) fn new(
        config: &OutboxConfig,
        schema: String,
        table: String,
    ) -> Result<Rules, MappingError> {
        let partition_by = match config.partition_by.as_str() {
            PARTITION_BY_AGGREGATE_ID => PartitionBy::AggregateId,
            PARTITION_BY_KEY => PartitionBy::Key,
            _ => PartitionBy::Column,
        };
        let format = config.effective_format();
        let cloudevents = if format.is_cloudevents() {
            Some(CloudEvents::new(config, format, &schema, &table)?)
        } else {
            None
        };
        let by_role = [
            Some(config.id_column.clone()),
            Some(config.aggregate_type_column.clone()),
            Some(config.aggregate_id_column.clone()),
            Some(config.type_column.clone()),
            Some(config.payload_column.clone()),
            config.key_column.clone(),
            config.timestamp_column.clone(),
            config.headers_column.clone(),
            config.tracing_column.clone(),
            config.topic_column.clone(),
            (partition_by == PartitionBy::Column).then(|| config.partition_by.clone()),
            format.is_cloudevents().then(|| {
                config
                    .cloudevents_subject_column
                    .clone()
                    .unwrap_or_else(|| config.aggregate_id_column.clone())
            }),
        ];
        let headers = HeaderRules::new(&config.header_columns, &config.tracing_header);
        // The extra columns: the `header_columns`, then the CloudEvents extensions.
        let mut extra: Vec<String> = headers.columns().map(str::to_string).collect();
        if let Some(ce) = &cloudevents {
            extra.extend(
                (0..ce.extensions())
                    .filter_map(|i| ce.extension_column(i))
                    .map(str::to_string),
            );
        }
        Ok(Rules {
            topics: Topics::parse(&config.topic, &config.topic_overrides)?,
            schema,
            table,
            columns: Columns::new(by_role, extra),
            format,
            cloudevents,
            null_payload: config.null_payload,
            partition_by,
            headers,
            profile: 0,
        })
    }

    /// Events of these rules are encoded by serialization section `profile`.
    pub(super) fn with_profile(mut self, profile: usize) -> Rules {
        self.profile = profile;
        self
    }

    pub(super) fn column(&self, role: Role) -> Option<&str> {
        self.columns.of(role)
    }

    /// The `i`-th extra column: the `header_columns`, then the CloudEvents extensions.
    pub(super) fn extra_column(&self, i: usize) -> Option<&str> {
        self.columns.extra(i)
    }

    /// How many extra columns [`Rules::extra_column`] names.
    pub(super) fn extra_columns(&self) -> usize {
        self.columns.extra_len()
    }

    /// The setting that names the `i`-th extra column, for error messages.
    pub(super) fn extra_setting(&self, i: usize) -> &'static str {
        if i < self.headers.count() {
            "header_columns"
        } else {
            "cloudevents_extensions"
        }
    }

    /// The record for one event, its fields read from `source`. Errors are checked in a fixed
    /// order (routing fields, topic, key, partition, timestamp, headers, payload), so the same
    /// bad event always reports the same first problem.
    pub(super) fn build(
        &self,
        source: &dyn Source,
        commit_time_ms: i64,
    ) -> Result<OutboxEvent, MappingError> {
        let reader = FieldReader {
            source,
            columns: &self.columns,
        };
        let id_value = reader.required(Role::Id, UNKNOWN_ID)?;
        let id = reader
            .utf8(&id_value.bytes, Role::Id, UNKNOWN_ID)?
            .to_string();
        let aggregate_type = reader.required(Role::AggregateType, &id)?;
        let aggregate_id = reader.required(Role::AggregateId, &id)?;
        let event_type = reader.required(Role::Type, &id)?;
        let fields = EventFields {
            id: &id,
            aggregate_type: reader.utf8(&aggregate_type.bytes, Role::AggregateType, &id)?,
            aggregate_id: reader.utf8(&aggregate_id.bytes, Role::AggregateId, &id)?,
            event_type: reader.utf8(&event_type.bytes, Role::Type, &id)?,
            table: &self.table,
            schema: &self.schema,
        };

        let topic = self.topics.topic(reader, &fields)?;
        let key = match self.column(Role::Key) {
            Some(_) => reader.required(Role::Key, &id)?.bytes,
            None => id_value.bytes.clone(),
        };
        let partition_key = match self.partition_by {
            PartitionBy::AggregateId => Some(aggregate_id.bytes.clone()),
            PartitionBy::Key => None,
            PartitionBy::Column => reader.get(Role::Partition, &id)?.map(|v| v.bytes),
        };
        let (timestamp_ms, own_timestamp) = match reader.get(Role::Timestamp, &id)? {
            Some(v) => (timestamp::timestamp_ms(reader, &v, &id)?, true),
            None => (commit_time_ms, false),
        };
        let (payload, headers) = match &self.cloudevents {
            Some(ce) => ce.build(
                reader,
                &self.headers,
                self.null_payload,
                &fields,
                timestamp_ms,
            )?,
            None => {
                let headers = self.headers.headers(
                    reader,
                    &id,
                    Some([&id_value, &event_type, &aggregate_type, &aggregate_id]),
                )?;
                let payload = payload::payload(
                    reader,
                    self.format,
                    self.null_payload,
                    &fields,
                    timestamp_ms,
                )?;
                (payload, headers)
            }
        };

        Ok(OutboxEvent {
            record: Record {
                topic,
                key,
                payload,
                headers,
                timestamp_ms: Some(timestamp_ms),
                partition: None,
                partition_key,
            },
            id,
            profile: self.profile,
            own_timestamp,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mapping::test_support::*;

    #[test]
    fn null_routing_column_is_an_error_naming_the_event() {
        let bound = default_mapping()
            .bind(&relation(&COLUMNS))
            .unwrap()
            .unwrap();
        let err = bound
            .to_event(&row(TupleValue::Null, text("{}")), 0)
            .unwrap_err();
        assert!(
            matches!(err, MappingError::NullColumn { ref column, .. } if column == "aggregatetype")
        );
        assert!(err.to_string().contains("7c9e6679"));
        assert_eq!(err.event_id(), Some(ID));
    }

    #[test]
    fn custom_column_names_key_and_partition() {
        let m = mapping(|c| {
            c.id_column = "event_id".into();
            c.aggregate_type_column = "kind".into();
            c.aggregate_id_column = "entity".into();
            c.type_column = "name".into();
            c.payload_column = "body".into();
            c.key_column = Some("k".into());
            c.partition_by = "shard".into();
        });
        let cols = vec![
            ("body", 25, text("plain text")),
            ("shard", 25, text("s-1")),
            ("k", 25, text("the-key")),
            ("name", 25, text("Renamed")),
            ("entity", 25, text("e-9")),
            ("kind", 25, text("thing")),
            ("event_id", 25, text("ev-1")),
        ];
        let event = map_row(&m, &cols).unwrap();
        assert_eq!(event.id, "ev-1");
        assert_eq!(event.record.topic, "outbox.event.thing");
        assert_eq!(&event.record.key[..], b"the-key");
        assert_eq!(event.record.partition_key.as_deref(), Some(&b"s-1"[..]));
        assert_eq!(event.record.payload.as_deref(), Some(&b"plain text"[..]));
        assert_eq!(headers(&event.record)[0], ("id", &b"ev-1"[..]));

        // A null partition column falls back to the key's partition.
        let mut cols = cols;
        cols[1].2 = TupleValue::Null;
        assert_eq!(map_row(&m, &cols).unwrap().record.partition_key, None);
        // A configured key column must not be null.
        cols[2].2 = TupleValue::Null;
        assert!(matches!(
            map_row(&m, &cols),
            Err(MappingError::NullColumn { ref column, .. }) if column == "k"
        ));

        let by_key = mapping(|c| c.partition_by = "key".into());
        let event = map_row(&by_key, &debezium_columns(text("{}"))).unwrap();
        assert_eq!(event.record.partition_key, None);
    }
}
