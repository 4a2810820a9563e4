//! Rows, relations and mappings shared by the mapping's unit tests.

use bytes::Bytes;

/// Type OIDs of the test columns: the ones the mapping reads, and `timestamptz`.
pub(super) mod oid {
    pub(in crate::mapping) use crate::mapping::fields::oid::*;
    pub(in crate::mapping) const TIMESTAMPTZ: u32 = 1184;
}
pub(super) use super::{MappingError, MessageRoute, OutboxEvent, OutboxMapping, Record};
pub(super) use crate::config::OutboxConfig;
pub(super) use crate::lsn::Lsn;
pub(super) use crate::source::pgoutput::{Column, Message, Relation, Tuple, TupleValue};

pub(super) fn column(name: &str, type_oid: u32) -> Column {
    Column {
        flags: 0,
        name: name.to_string(),
        type_oid,
        type_modifier: -1,
    }
}

pub(super) fn relation_of(columns: &[(&str, u32)]) -> Relation {
    Relation {
        id: 1,
        namespace: "public".into(),
        name: "outbox".into(),
        replica_identity: b'd',
        columns: columns.iter().map(|(n, t)| column(n, *t)).collect(),
    }
}

pub(super) fn relation(columns: &[&str]) -> Relation {
    relation_of(&columns.iter().map(|c| (*c, 25)).collect::<Vec<_>>())
}

pub(super) fn text(s: &str) -> TupleValue {
    TupleValue::Text(Bytes::copy_from_slice(s.as_bytes()))
}

pub(super) fn default_mapping() -> OutboxMapping {
    OutboxMapping::new(&OutboxConfig::default()).unwrap()
}

pub(super) fn mapping(edit: impl FnOnce(&mut OutboxConfig)) -> OutboxMapping {
    let mut config = OutboxConfig::default();
    edit(&mut config);
    OutboxMapping::new(&config).unwrap()
}

pub(super) const ID: &str = "7c9e6679-7425-40de-944b-e07fc1f90ae7";

pub(super) const COLUMNS: [&str; 6] = [
    "id",
    "aggregatetype",
    "aggregateid",
    "type",
    "payload",
    "created_at",
];

pub(super) fn row(aggregate_type: TupleValue, payload: TupleValue) -> Tuple {
    Tuple(vec![
        text(ID),
        aggregate_type,
        text("42"),
        text("OrderCreated"),
        payload,
        text("2026-01-01 00:00:00+00"),
    ])
}

/// Binds `columns` (name, type, value) under `mapping` and maps the row.
pub(super) fn map_row(
    mapping: &OutboxMapping,
    columns: &[(&str, u32, TupleValue)],
) -> Result<OutboxEvent, MappingError> {
    let rel = relation_of(&columns.iter().map(|(n, t, _)| (*n, *t)).collect::<Vec<_>>());
    let tuple = Tuple(columns.iter().map(|(_, _, v)| v.clone()).collect());
    mapping.bind(&rel).unwrap()?.to_event(&tuple, 1234)
}

pub(super) fn debezium_columns(payload: TupleValue) -> Vec<(&'static str, u32, TupleValue)> {
    vec![
        ("id", 2950, text(ID)),
        ("aggregatetype", 1043, text("order")),
        ("aggregateid", 1043, text("42")),
        ("type", 1043, text("OrderCreated")),
        ("payload", oid::JSONB, payload),
    ]
}

pub(super) fn headers(record: &Record) -> Vec<(&str, &[u8])> {
    record.headers.iter().map(|(k, v)| (&**k, &v[..])).collect()
}

pub(super) fn message(transactional: bool, prefix: &str, content: &str) -> Message {
    Message {
        transactional,
        lsn: Lsn(0x1_0000_0010),
        prefix: prefix.into(),
        content: Bytes::copy_from_slice(content.as_bytes()),
    }
}
