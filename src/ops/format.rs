//! How the operator commands print: sizes and durations for humans, SQL literals for the fixes
//! `check` suggests, and the JSON form for scripts. Pure: no I/O except [`print_json`].

use serde::Serialize;

/// Bytes in binary units with one decimal: `512 B`, `18.2 KiB`, `3.0 GiB`.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut value = n as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// Human-readable and exact: `18.2 KiB (18624 bytes)`; small sizes only once (`512 B`).
pub fn bytes_exact(n: u64) -> String {
    if n < 1024 {
        bytes(n)
    } else {
        format!("{} ({n} bytes)", bytes(n))
    }
}

/// A duration in its two largest units: `42 s`, `3 min 5 s`, `2 h 10 min`, `4 d 3 h`.
pub fn duration(seconds: f64) -> String {
    let s = seconds.max(0.0).round() as u64;
    match s {
        0..=59 => format!("{s} s"),
        60..=3599 => format!("{} min {} s", s / 60, s % 60),
        3600..=86_399 => format!("{} h {} min", s / 3600, s % 3600 / 60),
        _ => format!("{} d {} h", s / 86_400, s % 86_400 / 3600),
    }
}

/// An SQL string literal, for printing a fix the operator can paste (never for running SQL:
/// the commands bind values as parameters).
pub fn quote_literal(value: &str) -> String {
    format!("'{}'", value.replace('\'', "''"))
}

/// `1 event`, `3 events`.
pub fn count(n: u64, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

/// Prints `value` as one JSON document on stdout.
pub fn print_json<T: Serialize>(value: &T) {
    match serde_json::to_string_pretty(value) {
        Ok(text) => println!("{text}"),
        // Our reports are plain structs and maps with string keys: this cannot happen.
        Err(e) => println!("{{\"ok\": false, \"error\": {:?}}}", e.to_string()),
    }
}

/// The JSON printed on stdout when a command fails under `--json`, so scripts always get JSON.
pub fn error_json(message: &str, exit_code: u8) -> serde_json::Value {
    serde_json::json!({ "ok": false, "error": message, "exit_code": exit_code })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_readable() {
        assert_eq!(bytes(0), "0 B");
        assert_eq!(bytes(1023), "1023 B");
        assert_eq!(bytes(1024), "1.0 KiB");
        assert_eq!(bytes(18_624), "18.2 KiB");
        assert_eq!(bytes(3 * 1024 * 1024 * 1024), "3.0 GiB");
        assert_eq!(bytes(u64::MAX), "16.0 EiB");
        assert_eq!(bytes_exact(18_624), "18.2 KiB (18624 bytes)");
        assert_eq!(bytes_exact(12), "12 B");
    }

    #[test]
    fn durations_use_two_units() {
        assert_eq!(duration(0.4), "0 s");
        assert_eq!(duration(42.0), "42 s");
        assert_eq!(duration(185.0), "3 min 5 s");
        assert_eq!(duration(7_800.0), "2 h 10 min");
        assert_eq!(duration(356_400.0), "4 d 3 h");
        assert_eq!(duration(-5.0), "0 s");
    }

    #[test]
    fn literals_double_their_quotes() {
        assert_eq!(quote_literal("slot"), "'slot'");
        assert_eq!(quote_literal("it's"), "'it''s'");
    }

    #[test]
    fn counts_agree_with_their_noun() {
        assert_eq!(count(1, "problem"), "1 problem");
        assert_eq!(count(0, "warning"), "0 warnings");
    }
}
