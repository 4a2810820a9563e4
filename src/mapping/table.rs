//! An outbox table bound to the latest Relation message: which column position holds each
//! configured field, found by name, so column order and added columns do not matter. A row's
//! values are PostgreSQL's text output, used byte-for-byte, except `bytea`, whose text form
//! is decoded back to the raw bytes. In binary mode (`postgres.binary`) a value may also arrive
//! in its type's binary format: [`super::binary`] turns it into those same bytes.

use std::sync::Arc;

use bytes::Bytes;

use super::binary::{self, Decoder};
use super::fields::{Columns, Kind, Role, Source, Value};
use super::rules::Rules;
use super::{MappingError, OutboxEvent};
use crate::source::pgoutput::{Relation, Tuple, TupleValue};

/// The position and type of one mapped column.
#[derive(Debug, Clone, Copy)]
struct Slot {
    index: usize,
    kind: Kind,
    /// How a binary value of this column is read; `Err` (why not) in text mode, or for a type
    /// the relay cannot convert, which binding refuses in binary mode.
    binary: Result<Decoder, &'static str>,
}

/// An outbox table as the current Relation message describes it: column positions.
#[derive(Debug, Clone)]
pub struct BoundTable {
    rules: Arc<Rules>,
    slots: [Option<Slot>; Role::ALL.len()],
    extra: Vec<Slot>,
}

impl BoundTable {
    /// Finds every configured column of `rules` in `relation`. With `binary` (pgoutput's
    /// binary mode) every one of them must have a type whose binary format the relay converts.
    pub(super) fn bind(
        rules: &Arc<Rules>,
        relation: &Relation,
        binary: bool,
    ) -> Result<Self, MappingError> {
        let table = || format!("{}.{}", relation.namespace, relation.name);
        let find = |column: &str, setting: &'static str| {
            let index = relation
                .columns
                .iter()
                .position(|c| c.name == column)
                .ok_or_else(|| MappingError::MissingColumn {
                    table: table(),
                    column: column.to_string(),
                    setting,
                })?;
            let type_oid = relation.columns[index].type_oid;
            let slot = Slot {
                index,
                kind: Kind::of_type(type_oid),
                binary: match binary {
                    true => binary::decoder(type_oid, setting == Role::Timestamp.setting()),
                    false => Err("the stream is in text mode"),
                },
            };
            match slot.binary {
                Err(reason) if binary => Err(MappingError::NotBinary {
                    table: table(),
                    column: column.to_string(),
                    setting,
                    type_name: binary::type_name(type_oid)
                        .map_or_else(|| format!("oid {type_oid}"), str::to_string),
                    reason,
                }),
                _ => Ok(slot),
            }
        };
        let mut slots = [None; Role::ALL.len()];
        for role in Role::ALL {
            if let Some(column) = rules.column(role) {
                slots[role.index()] = Some(find(column, role.setting())?);
            }
        }
        let extra = (0..rules.extra_columns())
            .map(|i| {
                find(
                    rules.extra_column(i).unwrap_or_default(),
                    rules.extra_setting(i),
                )
            })
            .collect::<Result<_, _>>()?;
        Ok(BoundTable {
            rules: rules.clone(),
            slots,
            extra,
        })
    }

    /// Builds the Kafka record for one inserted row.
    ///
    /// `commit_time_ms` (the transaction's commit time) becomes the record timestamp unless a
    /// `timestamp_column` is configured and non-null.
    pub fn to_event(
        &self,
        tuple: &Tuple,
        commit_time_ms: i64,
    ) -> Result<OutboxEvent, MappingError> {
        self.rules
            .build(&RowSource { bound: self, tuple }, commit_time_ms)
    }
}

impl BoundTable {
    /// The row's id column and its value as text (pgoutput's text output, or the binary value
    /// converted to it): what identifies the outbox row, to keep it and read it again. `None`
    /// when the value is null or cannot be read.
    pub fn row_id(&self, tuple: &Tuple) -> Option<(&str, String)> {
        let column = self.rules.column(Role::Id)?;
        let source = RowSource { bound: self, tuple };
        let value = source
            .value(self.slots[Role::Id.index()], column, "")
            .ok()??;
        Some((column, String::from_utf8_lossy(&value.bytes).into_owned()))
    }
}

struct RowSource<'a> {
    bound: &'a BoundTable,
    tuple: &'a Tuple,
}

impl RowSource<'_> {
    fn value(
        &self,
        slot: Option<Slot>,
        column: &str,
        event_id: &str,
    ) -> Result<Option<Value>, MappingError> {
        let Some(slot) = slot else {
            return Ok(None);
        };
        let invalid = |reason| MappingError::InvalidValue {
            event_id: event_id.to_string(),
            column: column.to_string(),
            reason,
        };
        let bytes = match self.tuple.get(slot.index) {
            Some(TupleValue::Text(bytes)) if slot.kind == Kind::Bytea => {
                decode_bytea(bytes).map_err(invalid)?
            }
            Some(TupleValue::Text(bytes)) => bytes.clone(),
            Some(TupleValue::Binary(bytes)) => match slot.binary {
                Ok(decoder) => binary::to_text(decoder, bytes).map_err(invalid)?,
                // Bound in text mode, yet the server sends binary: not our START_REPLICATION.
                Err(_) => {
                    return Err(MappingError::NotText {
                        event_id: event_id.to_string(),
                        column: column.to_string(),
                    })
                }
            },
            Some(TupleValue::Null) | Some(TupleValue::UnchangedToast) | None => return Ok(None),
        };
        Ok(Some(Value {
            bytes,
            kind: slot.kind,
        }))
    }
}

impl Source for RowSource<'_> {
    fn get(
        &self,
        columns: &Columns,
        role: Role,
        event_id: &str,
    ) -> Result<Option<Value>, MappingError> {
        let column = columns.of(role).unwrap_or_default();
        self.value(self.bound.slots[role.index()], column, event_id)
    }

    fn extra(
        &self,
        columns: &Columns,
        i: usize,
        event_id: &str,
    ) -> Result<Option<Value>, MappingError> {
        let column = columns.extra(i).unwrap_or_default();
        self.value(self.bound.extra.get(i).copied(), column, event_id)
    }
}

/// bytea's text output back to its bytes: the `hex` format (`\x0aff…`, the default) or the
/// `escape` format (`\\` and `\ooo` octal escapes). The escape format is decoded by hand: it
/// is PostgreSQL's own (neither C nor any common encoding), and no crate reads it.
fn decode_bytea(text: &[u8]) -> Result<Bytes, String> {
    if let Some(digits) = text.strip_prefix(b"\\x") {
        return hex::decode(digits).map(Bytes::from).map_err(|e| match e {
            hex::FromHexError::InvalidHexCharacter { index, .. } => format!(
                "`{}` is not a hex digit in bytea text",
                digits[index].escape_ascii()
            ),
            hex::FromHexError::OddLength | hex::FromHexError::InvalidStringLength => {
                "bytea hex text has an odd number of digits".into()
            }
        });
    }
    let mut out = Vec::with_capacity(text.len());
    let mut i = 0;
    while i < text.len() {
        if text[i] != b'\\' {
            out.push(text[i]);
            i += 1;
            continue;
        }
        if text.get(i + 1) == Some(&b'\\') {
            out.push(b'\\');
            i += 2;
            continue;
        }
        match text.get(i + 1..i + 4) {
            Some(&[a, b, c]) if [a, b, c].iter().all(|d| (b'0'..=b'7').contains(d)) => {
                let n = u32::from(a - b'0') << 6 | u32::from(b - b'0') << 3 | u32::from(c - b'0');
                out.push(u8::try_from(n).map_err(|_| "bytea escape out of range".to_string())?);
                i += 4;
            }
            _ => return Err("bytea escape text has a bad `\\` sequence".into()),
        }
    }
    Ok(Bytes::from(out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Format;
    use crate::mapping::test_support::*;

    #[test]
    fn columns_are_found_by_name_in_any_order() {
        let mut cols = COLUMNS;
        cols.reverse();
        let bound = default_mapping().bind(&relation(&cols)).unwrap().unwrap();
        let mut values = row(text("order"), text("{}")).0;
        values.reverse();
        let event = bound.to_event(&Tuple(values), 0).unwrap();
        assert_eq!(event.record.topic, "outbox.event.order");
    }

    #[test]
    fn missing_column_names_the_setting() {
        let err = default_mapping()
            .bind(&relation(&["id", "aggregatetype", "type", "payload"]))
            .unwrap()
            .unwrap_err();
        assert!(err.to_string().contains("aggregate_id_column"), "{err}");

        let m = mapping(|c| c.timestamp_column = Some("occurred_at".into()));
        let err = m.bind(&relation(&COLUMNS)).unwrap().unwrap_err();
        assert!(err.to_string().contains("timestamp_column"), "{err}");
        let m = mapping(|c| {
            c.header_columns.insert("tenant".into(), "x-tenant".into());
        });
        let err = m.bind(&relation(&COLUMNS)).unwrap().unwrap_err();
        assert!(err.to_string().contains("header_columns"), "{err}");
    }

    /// One row with a column of every type binary mode converts: (name, type oid, text form
    /// as pgoutput sends it, binary form as `<type>_send` gives it). The binary forms were
    /// captured from PostgreSQL 15 (`encode(uuid_send(…), 'hex')` and so on), TimeZone UTC.
    const ALL_TYPES: [(&str, u32, &str, &str); 16] = [
        ("id", oid::UUID, ID, "7c9e6679742540de944be07fc1f90ae7"),
        ("aggregatetype", oid::TEXT, "order", "6f72646572"),
        ("aggregateid", oid::VARCHAR, "42", "3432"),
        (
            "type",
            oid::NAME,
            "OrderCreated",
            "4f7264657243726561746564",
        ),
        (
            "payload",
            oid::JSONB,
            r#"{"a": "xé", "b": [1, 2.50]}"#,
            "017b2261223a202278c3a9222c202262223a205b312c20322e35305d7d",
        ),
        (
            "created_at",
            oid::TIMESTAMPTZ,
            "2026-03-01 12:30:45.678901+02",
            "0002eef2bb52bb35",
        ),
        ("doc", oid::JSON, r#"{ "k" :1 }"#, "7b20226b22203a31207d"),
        ("blob", oid::BYTEA, r"\x00ff0a", "00ff0a"),
        ("small", oid::INT2, "-7", "fff9"),
        ("num", oid::INT4, "2147483647", "7fffffff"),
        ("big", oid::INT8, "-42", "ffffffffffffffd6"),
        ("flag", oid::BOOL, "t", "01"),
        ("code", oid::BPCHAR, "ab  ", "61622020"),
        ("relid", oid::OID, "4294967295", "ffffffff"),
        (
            "at",
            oid::TIMESTAMP,
            "2026-03-01 12:30:45.678901",
            "0002eef4687a0335",
        ),
        (
            "bc",
            oid::TIMESTAMP,
            "0001-12-31 00:00:00 BC",
            "ff1fe2eba7c50000",
        ),
    ];

    /// Maps the row of [`ALL_TYPES`] in text and in binary form under `edit`'s configuration.
    fn text_and_binary(
        edit: impl FnOnce(&mut OutboxConfig),
    ) -> (
        Result<OutboxEvent, MappingError>,
        Result<OutboxEvent, MappingError>,
    ) {
        let mut config = OutboxConfig::default();
        edit(&mut config);
        let m = OutboxMapping::new(&config).unwrap();
        let rel = relation_of(&ALL_TYPES.map(|(n, t, _, _)| (n, t)));
        let text_row = Tuple(ALL_TYPES.iter().map(|c| text(c.2)).collect());
        let binary_row = Tuple(
            ALL_TYPES
                .iter()
                .map(|c| TupleValue::Binary(Bytes::from(hex::decode(c.3).unwrap())))
                .collect(),
        );
        let in_text = m.bind(&rel).unwrap().unwrap().to_event(&text_row, 1234);
        let binary = m.with_binary(true);
        let in_binary = binary
            .bind(&rel)
            .unwrap()
            .unwrap()
            .to_event(&binary_row, 1234);
        (in_text, in_binary)
    }

    #[test]
    fn binary_and_text_rows_give_the_same_record() {
        let headers = |c: &mut OutboxConfig, columns: &[&str]| {
            for column in columns {
                c.header_columns
                    .insert(column.to_string(), format!("x-{column}"));
            }
        };
        type Edit = Box<dyn Fn(&mut OutboxConfig)>;
        let configs: Vec<(&str, Edit)> = vec![
            ("default", Box::new(|_| {})),
            (
                "every text-like column as a header, int8 key, timestamptz timestamp",
                Box::new(move |c| {
                    headers(
                        c,
                        &[
                            "doc", "blob", "small", "num", "big", "flag", "code", "relid", "at",
                            "bc",
                        ],
                    );
                    c.key_column = Some("big".into());
                    c.timestamp_column = Some("created_at".into());
                    c.partition_by = "code".into();
                }),
            ),
            (
                "envelope, int4 partition column, timestamp column",
                Box::new(|c| {
                    c.format = Format::Envelope;
                    c.partition_by = "num".into();
                    c.timestamp_column = Some("at".into());
                }),
            ),
            (
                "integer milliseconds as the timestamp, uuid key",
                Box::new(|c| {
                    c.timestamp_column = Some("num".into());
                    c.key_column = Some("id".into());
                }),
            ),
            (
                "bytea payload in envelope",
                Box::new(|c| {
                    c.format = Format::Envelope;
                    c.payload_column = "blob".into();
                }),
            ),
            (
                "json payload",
                Box::new(|c| c.payload_column = "doc".into()),
            ),
            (
                "cloudevents structured, bytea data, extensions",
                Box::new(|c| {
                    c.format = Format::CloudeventsStructured;
                    c.payload_column = "blob".into();
                    c.timestamp_column = Some("created_at".into());
                    c.header_columns.insert("small".into(), "smallext".into());
                }),
            ),
            (
                "cloudevents binary, jsonb data",
                Box::new(|c| {
                    c.format = Format::CloudeventsBinary;
                    c.cloudevents_subject_column = Some("num".into());
                }),
            ),
        ];
        for (name, edit) in configs {
            let (in_text, in_binary) = text_and_binary(edit);
            let in_text = in_text.unwrap_or_else(|e| panic!("{name}: text: {e}"));
            let in_binary = in_binary.unwrap_or_else(|e| panic!("{name}: binary: {e}"));
            assert_eq!(in_text, in_binary, "{name}");
        }
        // The comparison sees the values: a converted uuid is the key of the default mapping.
        let (_, in_binary) = text_and_binary(|_| {});
        assert_eq!(&in_binary.unwrap().record.key[..], ID.as_bytes());
    }

    #[test]
    fn a_text_value_in_a_binary_stream_is_read_as_text() {
        // pgoutput sends types without a send function as text even in binary mode.
        let m = default_mapping().with_binary(true);
        let rel = relation_of(&ALL_TYPES.map(|(n, t, _, _)| (n, t)));
        let row = Tuple(ALL_TYPES.iter().map(|c| text(c.2)).collect());
        let event = m.bind(&rel).unwrap().unwrap().to_event(&row, 0).unwrap();
        assert_eq!(event.id, ID);
    }

    #[test]
    fn binary_mode_refuses_a_mapped_column_it_cannot_convert() {
        let numeric = |role: &str| {
            let mut cols = debezium_columns(text("{}"));
            cols.push(("amount", 1700, text("1.50")));
            cols.push((
                "created_at",
                oid::TIMESTAMPTZ,
                text("2026-01-01 00:00:00+00"),
            ));
            let m = mapping(|c| {
                c.header_columns.insert(role.into(), "x".into());
            });
            let rel = relation_of(&cols.iter().map(|(n, t, _)| (*n, *t)).collect::<Vec<_>>());
            (
                m.bind(&rel).unwrap().map(|_| ()),
                m.with_binary(true).bind(&rel).unwrap().map(|_| ()),
            )
        };
        let (in_text, in_binary) = numeric("amount");
        in_text.unwrap();
        let message = in_binary.unwrap_err().to_string();
        for part in [
            "`amount`",
            "numeric",
            "header_columns",
            "postgres.binary = false",
        ] {
            assert!(message.contains(part), "{part}: {message}");
        }
        // A timestamptz prints in the walsender's TimeZone, which binary values do not carry.
        let (in_text, in_binary) = numeric("created_at");
        in_text.unwrap();
        let message = in_binary.unwrap_err().to_string();
        assert!(
            message.contains("timestamptz") && message.contains("TimeZone"),
            "{message}"
        );
        // Columns that are not mapped are never converted, whatever their type.
        let (_, in_binary) = numeric("type");
        in_binary.unwrap();
    }

    #[test]
    fn a_corrupt_binary_value_names_the_event_and_column() {
        let m = default_mapping().with_binary(true);
        let rel = relation_of(&ALL_TYPES.map(|(n, t, _, _)| (n, t)));
        let mut row: Vec<TupleValue> = ALL_TYPES.iter().map(|c| text(c.2)).collect();
        row[4] = TupleValue::Binary(Bytes::from_static(b"\x02{}"));
        let err = m
            .bind(&rel)
            .unwrap()
            .unwrap()
            .to_event(&Tuple(row), 0)
            .unwrap_err();
        assert!(
            matches!(err, MappingError::InvalidValue { ref column, .. } if column == "payload")
        );
        assert!(err.to_string().contains(ID), "{err}");
    }

    #[test]
    fn bytea_escape_format_is_decoded() {
        assert_eq!(
            &decode_bytea(b"ab\\\\c\\000\\377").unwrap()[..],
            b"ab\\c\x00\xff"
        );
        assert!(decode_bytea(b"a\\9").is_err());
        assert_eq!(&decode_bytea(b"\\x").unwrap()[..], b"");
        assert_eq!(
            &decode_bytea(b"\\xDEADbeef").unwrap()[..],
            b"\xde\xad\xbe\xef"
        );
    }
}
