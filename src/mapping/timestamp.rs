//! The record's timestamp: `timestamp_column` if configured and non-null (integer milliseconds,
//! or PostgreSQL's ISO text of `timestamp`/`timestamptz`), else the commit time.

use jiff::civil::DateTime;
use jiff::fmt::temporal::{Pieces, PiecesOffset};
use jiff::tz::Offset;

use super::fields::{FieldReader, Kind, Role, Value};
use super::MappingError;

/// 1970-01-01 00:00:00, the zero of Kafka timestamps.
const UNIX_EPOCH: DateTime = DateTime::constant(1970, 1, 1, 0, 0, 0, 0);

/// The record timestamp from the `timestamp_column` value.
pub(super) fn timestamp_ms(
    reader: FieldReader<'_>,
    value: &Value,
    event_id: &str,
) -> Result<i64, MappingError> {
    let text = reader.utf8(&value.bytes, Role::Timestamp, event_id)?;
    let ms = match value.kind {
        Kind::Integer => text
            .trim()
            .parse::<i64>()
            .map_err(|_| format!("`{text}` is not an integer of milliseconds")),
        Kind::Bytea => Err("a bytea value is not a timestamp".to_string()),
        Kind::Json => Err("a JSON value is not a timestamp".to_string()),
        Kind::Text => parse_timestamp_ms(text),
    }
    .map_err(|reason| reader.invalid(Role::Timestamp, event_id, reason))?;
    if ms < 0 {
        return Err(reader.invalid(
            Role::Timestamp,
            event_id,
            format!("{ms} ms is before 1970, which Kafka timestamps cannot express"),
        ));
    }
    Ok(ms)
}

/// Milliseconds since the Unix epoch of PostgreSQL's ISO text output of `timestamptz`
/// (`2026-01-01 12:00:00.123456+02`, `+05:30`) or `timestamp` (taken as UTC); also accepts
/// `T` between date and time and a `Z` suffix. Fractions below a millisecond are truncated
/// (towards the past).
pub(super) fn parse_timestamp_ms(text: &str) -> Result<i64, String> {
    let bad = || format!("`{text}` is not an ISO timestamp (PostgreSQL DateStyle ISO)");
    let s = text.trim();
    if s.ends_with(" BC") {
        return Err(format!("`{text}` is before the common era"));
    }
    if s.eq_ignore_ascii_case("infinity") || s.eq_ignore_ascii_case("-infinity") {
        return Err(format!("`{text}` has no Kafka timestamp"));
    }
    let pieces = Pieces::parse(s).map_err(|_| bad())?;
    let time = pieces.time().ok_or_else(bad)?;
    if pieces.time_zone_annotation().is_some() {
        return Err(bad());
    }
    let offset = match pieces.offset() {
        None | Some(PiecesOffset::Zulu) => Offset::UTC,
        Some(PiecesOffset::Numeric(numeric)) => numeric.offset(),
        Some(_) => return Err(bad()),
    };
    // Civil arithmetic rather than `Offset::to_timestamp`: jiff's `Timestamp` range ends a day
    // before its civil range does, and PostgreSQL prints `9999-12-31 23:59:59+00` happily.
    let local = pieces.date().to_datetime(time).duration_since(UNIX_EPOCH);
    let nanos = local.as_nanos() - i128::from(offset.seconds()) * 1_000_000_000;
    i64::try_from(nanos.div_euclid(1_000_000)).map_err(|_| bad())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mapping::test_support::*;

    #[test]
    fn timestamp_column_sets_the_record_timestamp() {
        let m = mapping(|c| c.timestamp_column = Some("occurred_at".into()));
        let mut cols = debezium_columns(text("{}"));
        cols.push((
            "occurred_at",
            oid::TIMESTAMPTZ,
            text("2026-03-01 12:30:45.678901+02"),
        ));
        let event = map_row(&m, &cols).unwrap();
        // 2026-03-01T10:30:45.678Z
        assert_eq!(event.record.timestamp_ms, Some(1_772_361_045_678));
        cols[5].2 = TupleValue::Null;
        assert_eq!(map_row(&m, &cols).unwrap().record.timestamp_ms, Some(1234));
        cols[5] = ("occurred_at", oid::INT8, text("1700000000123"));
        assert_eq!(
            map_row(&m, &cols).unwrap().record.timestamp_ms,
            Some(1_700_000_000_123)
        );
        cols[5] = ("occurred_at", oid::TIMESTAMPTZ, text("infinity"));
        assert!(matches!(
            map_row(&m, &cols),
            Err(MappingError::InvalidValue { .. })
        ));
    }

    #[test]
    fn timestamps_parse_like_postgres_prints_them() {
        let cases = [
            ("1970-01-01 00:00:00+00", 0),
            ("1970-01-01 00:00:00", 0),
            ("1970-01-01T00:00:01Z", 1000),
            ("2000-02-29 23:59:59.999+00", 951_868_799_999),
            ("2026-03-01 12:30:45.5+05:30", 1_772_348_445_500),
            ("2026-03-01 12:30:45-03:30:15", 1_772_380_860_000),
            ("1969-12-31 23:59:59+00", -1000),
            ("2024-12-31 23:59:59.1234567+00", 1_735_689_599_123),
            // Sub-millisecond fractions are truncated towards the past.
            ("1969-12-31 23:59:59.9995+00", -1),
            // The last instant PostgreSQL prints with a four-digit year.
            ("9999-12-31 23:59:59.999+00", 253_402_300_799_999),
            // ISO 8601 forms PostgreSQL does not print, read as ISO 8601 means them.
            ("2026-03-01 12:30:45+0530", 1_772_348_445_000),
            ("1970-01-01t00:00:01z", 1000),
            ("2026-01-01 00:00", 1_767_225_600_000),
        ];
        for (text, expected) in cases {
            assert_eq!(parse_timestamp_ms(text), Ok(expected), "{text}");
        }
        for bad in [
            "",
            "yesterday",
            "2026-13-01 00:00:00",
            "2026-01-01",
            "2026-01-01 25:00:00",
            "2026-01-01 24:00:00",
            "2026-02-31 00:00:00",
            "2026-1-1 00:00:00",
            // Beyond the four-digit years jiff's civil calendar holds.
            "10000-01-01 00:00:00+00",
            "2026-01-01 00:00:00+00[Europe/Paris]",
            "0001-01-01 00:00:00 BC",
            "-infinity",
            "2026-01-01 00:00:00+x",
        ] {
            assert!(parse_timestamp_ms(bad).is_err(), "{bad}");
        }
    }
}
