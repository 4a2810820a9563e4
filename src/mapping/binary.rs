//! pgoutput's binary format (`postgres.binary = true`): a column arrives as `b` with its type's
//! *send* format instead of its text output. Each value the mapping reads is turned back into
//! the bytes the text format would have given, so a row maps to the same record in both modes.
//! Columns the mapping does not read are never converted.
//!
//! | type | send format | becomes |
//! |---|---|---|
//! | `text`, `varchar`, `bpchar`, `name`, `json` | the text itself | as it is |
//! | `bytea` | the raw bytes | as it is (the text form is decoded to these bytes too) |
//! | `jsonb` | version byte 1, then the text | the text (the same `JsonbToCString` as `jsonb_out`) |
//! | `uuid` | 16 bytes | lower-case hyphenated text |
//! | `int2`, `int4`, `int8`, `oid` | big-endian integer | decimal text |
//! | `bool` | one byte, 0 or 1 | `f` or `t` |
//! | `timestamp` | Int64 µs since 2000-01-01 | ISO text (`DateStyle` ISO, as the relay assumes) |
//! | `timestamptz` | Int64 µs since 2000-01-01 UTC | only as `timestamp_column`, where the instant is all that counts: its text form depends on the walsender's `TimeZone`, which the relay does not reproduce |
//!
//! pgoutput sends a column as text even in binary mode when its type has no send function;
//! such values are read as in text mode. Any other type in a mapped column is refused when the
//! table is bound ([`decoder`]), so the relay stops with the fix instead of skipping a row.

use std::fmt::Write;

use bytes::Bytes;

use super::fields::oid;

/// How one mapped column's binary value becomes its text-format bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Decoder {
    /// The send format is the text format (or, for `bytea`, the bytes the mapping wants).
    AsIs,
    Jsonb,
    Uuid,
    Int2,
    Int4,
    Int8,
    Oid,
    Bool,
    /// `timestamp`: ISO text without an offset.
    Timestamp,
    /// `timestamptz` read as the record timestamp: ISO text in UTC (`+00`).
    TimestampUtc,
}

/// The decoder of a mapped column of type `type_oid`; `as_timestamp` when the column is the
/// `timestamp_column`. `Err` says why the type cannot be mapped in binary mode.
pub(super) fn decoder(type_oid: u32, as_timestamp: bool) -> Result<Decoder, &'static str> {
    Ok(match type_oid {
        oid::TEXT | oid::VARCHAR | oid::BPCHAR | oid::NAME | oid::JSON | oid::BYTEA => {
            Decoder::AsIs
        }
        oid::JSONB => Decoder::Jsonb,
        oid::UUID => Decoder::Uuid,
        oid::INT2 => Decoder::Int2,
        oid::INT4 => Decoder::Int4,
        oid::INT8 => Decoder::Int8,
        oid::OID => Decoder::Oid,
        oid::BOOL => Decoder::Bool,
        oid::TIMESTAMP => Decoder::Timestamp,
        oid::TIMESTAMPTZ if as_timestamp => Decoder::TimestampUtc,
        oid::TIMESTAMPTZ => {
            return Err("its text form depends on the walsender's TimeZone, which the binary form does not carry (only timestamp_column may be a timestamptz in binary mode)")
        }
        _ => return Err("the relay has no conversion from its binary format"),
    })
}

/// A readable name of a built-in type, for error messages.
pub(super) fn type_name(type_oid: u32) -> Option<&'static str> {
    Some(match type_oid {
        oid::BOOL => "bool",
        oid::BYTEA => "bytea",
        oid::NAME => "name",
        oid::INT8 => "int8",
        oid::INT2 => "int2",
        oid::INT4 => "int4",
        oid::TEXT => "text",
        oid::OID => "oid",
        oid::JSON => "json",
        700 => "float4",
        701 => "float8",
        oid::BPCHAR => "bpchar",
        oid::VARCHAR => "varchar",
        1082 => "date",
        1083 => "time",
        oid::TIMESTAMP => "timestamp",
        oid::TIMESTAMPTZ => "timestamptz",
        1186 => "interval",
        1700 => "numeric",
        oid::UUID => "uuid",
        oid::JSONB => "jsonb",
        _ => return None,
    })
}

/// The text-format bytes of one binary value.
pub(super) fn to_text(decoder: Decoder, value: &Bytes) -> Result<Bytes, String> {
    let text = match decoder {
        Decoder::AsIs => return Ok(value.clone()),
        Decoder::Jsonb => {
            return match value.first() {
                Some(1) => Ok(value.slice(1..)),
                Some(v) => Err(format!("jsonb binary format version {v} is not 1")),
                None => Err("jsonb binary value is empty".into()),
            }
        }
        Decoder::Uuid => uuid(value)?,
        Decoder::Int2 => i16::from_be_bytes(fixed(value, "int2")?).to_string(),
        Decoder::Int4 => i32::from_be_bytes(fixed(value, "int4")?).to_string(),
        Decoder::Int8 => i64::from_be_bytes(fixed(value, "int8")?).to_string(),
        Decoder::Oid => u32::from_be_bytes(fixed(value, "oid")?).to_string(),
        Decoder::Bool => match fixed::<1>(value, "bool")? {
            [0] => "f".into(),
            _ => "t".into(),
        },
        Decoder::Timestamp => timestamp(i64::from_be_bytes(fixed(value, "timestamp")?), ""),
        Decoder::TimestampUtc => timestamp(i64::from_be_bytes(fixed(value, "timestamptz")?), "+00"),
    };
    Ok(Bytes::from(text))
}

fn fixed<const N: usize>(value: &[u8], type_name: &str) -> Result<[u8; N], String> {
    value.try_into().map_err(|_| {
        format!(
            "binary {type_name} value has {} bytes, not {N}",
            value.len()
        )
    })
}

fn uuid(value: &[u8]) -> Result<String, String> {
    let b: [u8; 16] = fixed(value, "uuid")?;
    let mut out = String::with_capacity(36);
    for (i, byte) in b.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            out.push('-');
        }
        let _ = write!(out, "{byte:02x}");
    }
    Ok(out)
}

/// µs between 2000-01-01 (PostgreSQL's epoch) and 1970-01-01, in days.
const PG_EPOCH_DAYS_FROM_UNIX: i64 = 10_957;
const MICROS_PER_DAY: i64 = 86_400_000_000;

/// PostgreSQL's ISO output of a `timestamp` (`suffix` ""), or of a `timestamptz` in UTC
/// (`suffix` "+00"): `2026-03-01 12:30:45.678901`, the fraction without trailing zeros,
/// years below 1 as `… BC`, and `infinity` / `-infinity` for the two sentinels.
fn timestamp(micros: i64, suffix: &str) -> String {
    match micros {
        i64::MAX => return "infinity".into(),
        i64::MIN => return "-infinity".into(),
        _ => {}
    }
    let days = micros.div_euclid(MICROS_PER_DAY) + PG_EPOCH_DAYS_FROM_UNIX;
    let in_day = micros.rem_euclid(MICROS_PER_DAY);
    let (year, month, day) = civil_from_days(days);
    let secs = in_day / 1_000_000;
    let frac = in_day % 1_000_000;
    let (shown_year, era) = if year <= 0 {
        (1 - year, " BC")
    } else {
        (year, "")
    };
    let mut out = format!(
        "{shown_year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    );
    if frac != 0 {
        let digits = format!("{frac:06}");
        out.push('.');
        out.push_str(digits.trim_end_matches('0'));
    }
    out.push_str(suffix);
    out.push_str(era);
    out
}

/// The proleptic Gregorian date of a day count from 1970-01-01 (year 0 = 1 BC): the
/// era-of-400-years method, exact for any `i64` day count PostgreSQL can hold.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(decoder: Decoder, value: &[u8]) -> String {
        String::from_utf8(
            to_text(decoder, &Bytes::copy_from_slice(value))
                .unwrap()
                .to_vec(),
        )
        .unwrap()
    }

    #[test]
    fn integers_are_big_endian() {
        assert_eq!(text(Decoder::Int2, &(-2i16).to_be_bytes()), "-2");
        assert_eq!(text(Decoder::Int4, &42i32.to_be_bytes()), "42");
        assert_eq!(
            text(Decoder::Int8, &i64::MIN.to_be_bytes()),
            "-9223372036854775808"
        );
        assert_eq!(text(Decoder::Oid, &u32::MAX.to_be_bytes()), "4294967295");
        assert_eq!(text(Decoder::Bool, &[1]), "t");
        assert_eq!(text(Decoder::Bool, &[0]), "f");
        let err = to_text(Decoder::Int4, &Bytes::from_static(&[0, 1])).unwrap_err();
        assert!(err.contains("2 bytes, not 4"), "{err}");
    }

    #[test]
    fn uuid_is_lower_case_and_hyphenated() {
        let bytes = hex::decode("7c9e6679742540de944be07fc1f90ae7").unwrap();
        assert_eq!(
            text(Decoder::Uuid, &bytes),
            "7c9e6679-7425-40de-944b-e07fc1f90ae7"
        );
        assert!(to_text(Decoder::Uuid, &Bytes::from_static(&[1; 15])).is_err());
    }

    #[test]
    fn jsonb_drops_its_version_byte() {
        assert_eq!(text(Decoder::Jsonb, b"\x01{\"a\": 1}"), "{\"a\": 1}");
        assert!(to_text(Decoder::Jsonb, &Bytes::from_static(b"\x02{}")).is_err());
        assert!(to_text(Decoder::Jsonb, &Bytes::new()).is_err());
    }

    #[test]
    fn timestamps_print_like_postgres() {
        let at = |us: i64| text(Decoder::Timestamp, &us.to_be_bytes());
        assert_eq!(at(0), "2000-01-01 00:00:00");
        assert_eq!(at(-1), "1999-12-31 23:59:59.999999");
        assert_eq!(at(1_500_000), "2000-01-01 00:00:01.5");
        // 2026-03-01 12:30:45.678901
        assert_eq!(at(825_683_445_678_901), "2026-03-01 12:30:45.678901");
        // The day before 0001-01-01: 1 BC.
        let year_1 = (-62_135_596_800 - 946_684_800) * 1_000_000;
        assert_eq!(at(year_1), "0001-01-01 00:00:00");
        assert_eq!(at(year_1 - 86_400_000_000), "0001-12-31 00:00:00 BC");
        assert_eq!(at(i64::MAX), "infinity");
        assert_eq!(at(i64::MIN), "-infinity");
        // 2000-02-29, a leap day of a year divisible by 400.
        assert_eq!(at(59 * 86_400_000_000), "2000-02-29 00:00:00");
        let utc = text(Decoder::TimestampUtc, &825_683_445_678_901i64.to_be_bytes());
        assert_eq!(utc, "2026-03-01 12:30:45.678901+00");
    }

    #[test]
    fn unsupported_types_are_refused_with_a_reason() {
        assert!(decoder(1700, false).is_err());
        assert!(decoder(oid::TIMESTAMPTZ, false).is_err());
        assert_eq!(decoder(oid::TIMESTAMPTZ, true), Ok(Decoder::TimestampUtc));
        assert_eq!(decoder(oid::UUID, false), Ok(Decoder::Uuid));
        assert_eq!(type_name(1700), Some("numeric"));
    }
}
