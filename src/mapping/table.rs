//! An outbox table bound to the latest Relation message: which column position holds each
//! configured field, found by name, so column order and added columns do not matter. A row's
//! values are PostgreSQL's text output, used byte-for-byte, except `bytea`, whose text form
//! is decoded back to the raw bytes.

use std::sync::Arc;

use bytes::Bytes;

use super::rules::{Kind, Role, Rules, Source, Value};
use super::{MappingError, OutboxEvent};
use crate::source::pgoutput::{Relation, Tuple, TupleValue};

/// The position and type of one mapped column.
#[derive(Debug, Clone, Copy)]
struct Slot {
    index: usize,
    kind: Kind,
}

/// An outbox table as the current Relation message describes it: column positions.
#[derive(Debug, Clone)]
pub struct BoundTable {
    rules: Arc<Rules>,
    slots: [Option<Slot>; Role::ALL.len()],
    extra: Vec<Slot>,
}

impl BoundTable {
    /// Finds every configured column of `rules` in `relation`.
    pub(super) fn bind(rules: &Arc<Rules>, relation: &Relation) -> Result<Self, MappingError> {
        let find = |column: &str, setting: &'static str| {
            relation
                .columns
                .iter()
                .position(|c| c.name == column)
                .map(|index| Slot {
                    index,
                    kind: Kind::of_type(relation.columns[index].type_oid),
                })
                .ok_or_else(|| MappingError::MissingColumn {
                    table: format!("{}.{}", relation.namespace, relation.name),
                    column: column.to_string(),
                    setting,
                })
        };
        let mut slots = [None; Role::ALL.len()];
        for role in Role::ALL {
            if let Some(column) = rules.column(role) {
                slots[role.index()] = Some(find(column, role.setting())?);
            }
        }
        let extra = (0..rules.extra_columns())
            .map(|i| {
                let setting = if i < rules.extra_headers.len() {
                    "header_columns"
                } else {
                    "cloudevents_extensions"
                };
                find(rules.extra_column(i).unwrap_or_default(), setting)
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
        match self.tuple.get(slot.index) {
            Some(TupleValue::Text(bytes)) => {
                let bytes = if slot.kind == Kind::Bytea {
                    decode_bytea(bytes).map_err(|reason| MappingError::InvalidValue {
                        event_id: event_id.to_string(),
                        column: column.to_string(),
                        reason,
                    })?
                } else {
                    bytes.clone()
                };
                Ok(Some(Value {
                    bytes,
                    kind: slot.kind,
                }))
            }
            Some(TupleValue::Null) | Some(TupleValue::UnchangedToast) | None => Ok(None),
            Some(TupleValue::Binary(_)) => Err(MappingError::NotText {
                event_id: event_id.to_string(),
                column: column.to_string(),
            }),
        }
    }
}

impl Source for RowSource<'_> {
    fn get(
        &self,
        rules: &Rules,
        role: Role,
        event_id: &str,
    ) -> Result<Option<Value>, MappingError> {
        let column = rules.column(role).unwrap_or_default();
        self.value(self.bound.slots[role.index()], column, event_id)
    }

    fn extra(
        &self,
        rules: &Rules,
        i: usize,
        event_id: &str,
    ) -> Result<Option<Value>, MappingError> {
        let column = rules.extra_column(i).unwrap_or_default();
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
