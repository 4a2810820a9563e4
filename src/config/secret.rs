//! Secrets and their redaction: [`Secret`] never prints its value, and connection strings are
//! shown with their password replaced by [`REDACTED`].

use std::fmt;

use serde::{Serialize, Serializer};

/// What [`super::Config::to_redacted_toml`], `Debug` and `Display` print instead of a secret.
pub const REDACTED: &str = "***";

/// A secret string: `Debug`, `Display` and `Serialize` print `***`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }

    /// The secret itself; pass it on, never log it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl From<String> for Secret {
    fn from(value: String) -> Self {
        Secret(value)
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(REDACTED)
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(REDACTED)
    }
}

/// Serialized as `***`: the effective configuration can be printed without leaking it.
impl Serialize for Secret {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(REDACTED)
    }
}

/// Replaces the password in a libpq connection string (URL or `key=value` form) by `***`.
pub fn redact_connection_string(conn: &str) -> String {
    for prefix in ["postgres://", "postgresql://"] {
        if let Some(rest) = conn.strip_prefix(prefix) {
            return format!("{prefix}{}", redact_url_rest(rest));
        }
    }
    redact_key_value(conn).unwrap_or_else(|| REDACTED.to_string())
}

/// The part of a URL after the scheme. Mirrors tokio-postgres: the user info ends at the first
/// `@`, the password follows the first `:` in it; `password=` query parameters are masked too.
fn redact_url_rest(rest: &str) -> String {
    let mut masks: Vec<(usize, usize)> = Vec::new();
    if let Some(at) = rest.find('@') {
        if let Some(colon) = rest[..at].find(':') {
            masks.push((colon + 1, at));
        }
    }
    if let Some(q) = rest.find('?') {
        let mut start = q + 1;
        for param in rest[q + 1..].split('&') {
            if let Some((key, _)) = param.split_once('=') {
                if percent_decode(key).eq_ignore_ascii_case("password") {
                    masks.push((start + key.len() + 1, start + param.len()));
                }
            }
            start += param.len() + 1;
        }
    }
    masks.sort_unstable();
    let mut out = String::with_capacity(rest.len());
    let mut pos = 0;
    for (start, end) in masks {
        if end <= pos {
            continue;
        }
        let start = start.max(pos);
        out.push_str(&rest[pos..start]);
        out.push_str(REDACTED);
        pos = end;
    }
    out.push_str(&rest[pos..]);
    out
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s
                .get(i + 1..i + 3)
                .filter(|h| h.bytes().all(|b| b.is_ascii_hexdigit()))
                .and_then(|h| u8::from_str_radix(h, 16).ok());
            if let Some(b) = hex {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// libpq `key = value …` form with the value of `password` masked; `None` if it does not
/// tokenize (the caller then hides the whole string).
fn redact_key_value(conn: &str) -> Option<String> {
    let bytes = conn.as_bytes();
    let mut out = String::with_capacity(conn.len());
    let mut i = 0;
    let skip_ws = |mut i: usize| {
        while i < bytes.len() && bytes[i].is_ascii_whitespace() {
            i += 1;
        }
        i
    };
    loop {
        let ws_end = skip_ws(i);
        out.push_str(&conn[i..ws_end]);
        i = ws_end;
        if i >= bytes.len() {
            return Some(out);
        }
        let key_start = i;
        while i < bytes.len() && bytes[i] != b'=' && !bytes[i].is_ascii_whitespace() {
            i += 1;
        }
        let key = &conn[key_start..i];
        let eq = skip_ws(i);
        if eq >= bytes.len() || bytes[eq] != b'=' || key.is_empty() {
            return None;
        }
        let value_start = skip_ws(eq + 1);
        out.push_str(&conn[key_start..value_start]);
        let mut j = value_start;
        if j < bytes.len() && bytes[j] == b'\'' {
            j += 1;
            loop {
                match bytes.get(j) {
                    None => return None,
                    Some(b'\\') => j += 2,
                    Some(b'\'') => {
                        j += 1;
                        break;
                    }
                    Some(_) => j += 1,
                }
            }
        } else {
            while j < bytes.len() && !bytes[j].is_ascii_whitespace() {
                j += if bytes[j] == b'\\' { 2 } else { 1 };
            }
        }
        let j = j.min(bytes.len());
        if key == "password" {
            out.push_str(REDACTED);
        } else {
            out.push_str(conn.get(value_start..j)?);
        }
        i = j;
    }
}
