//! Field checks shared by the sections' `validate()`: each error names the field (`section.key`)
//! and the constraint.

use super::ConfigError;

/// Longest PostgreSQL identifier, in bytes (NAMEDATALEN - 1).
pub const MAX_IDENTIFIER_BYTES: usize = 63;

pub(super) fn check_range(
    field: &str,
    value: u64,
    min: u64,
    max: u64,
    unit: &str,
) -> Result<(), ConfigError> {
    if (min..=max).contains(&value) {
        return Ok(());
    }
    let problem = match (min, max) {
        (1, u64::MAX) => format!("must be > 0 ({unit}), got {value}"),
        (_, u64::MAX) => format!("must be >= {min} ({unit}), got {value}"),
        _ => format!("must be between {min} and {max} ({unit}), got {value}"),
    };
    Err(ConfigError::invalid(field, problem))
}

/// A PostgreSQL identifier that the relay quotes: non-empty, at most 63 bytes, no NUL.
pub(super) fn check_identifier(field: &str, value: &str) -> Result<(), ConfigError> {
    if value.is_empty() {
        return Err(ConfigError::invalid(field, "must not be empty"));
    }
    if value.len() > MAX_IDENTIFIER_BYTES {
        return Err(ConfigError::invalid(
            field,
            format!(
                "`{value}` is {} bytes; PostgreSQL identifiers have at most {MAX_IDENTIFIER_BYTES}",
                value.len()
            ),
        ));
    }
    if value.contains('\0') {
        return Err(ConfigError::invalid(
            field,
            "must not contain a NUL character",
        ));
    }
    Ok(())
}

/// A Kafka header name: non-empty UTF-8 (any characters are allowed by Kafka).
pub(super) fn check_header_name(field: &str, name: &str) -> Result<(), ConfigError> {
    if name.is_empty() {
        return Err(ConfigError::invalid(
            field,
            "a header name must not be empty",
        ));
    }
    Ok(())
}
