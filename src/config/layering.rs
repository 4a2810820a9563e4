//! Layering: built-in defaults (each section's `Default`), then the TOML file, then
//! `OUTBOX_RELAY__…` environment variables, merged and deserialized by `figment`.
//!
//! figment merges the sources and deserializes them into [`Config`] with serde, so unknown keys
//! (`deny_unknown_fields`), wrong types and unknown enum values are reported with the key's path;
//! [`from_figment`] turns its errors into ours, one line each.
//!
//! The environment is read by [`EnvOverrides`], a small figment provider of ours rather than
//! figment's `Env`: figment's parses every value with its own grammar (quotes stripped, `[…]`
//! and `{…}` read as arrays and tables, `1.0` as a float, a number refused by a string key),
//! silently skips names with empty segments (`OUTBOX_RELAY__`), and reads only the process
//! environment. Ours types each value by the key it names (a string key takes the value
//! verbatim, an integer key a non-negative integer, a boolean key `true`/`false` in any case),
//! refuses a name that is no key, and maps `KAFKA__PROPERTIES__SOCKET_TIMEOUT_MS` to the
//! property `socket.timeout.ms`.

use figment::error::{Actual, Kind};
use figment::providers::{Format, Toml};
use figment::value::{Dict, Map, Value};
use figment::{Figment, Metadata, Profile, Provider};

use super::{Config, ConfigError};

/// Prefix of the environment variables that override config keys.
pub const ENV_PREFIX: &str = "OUTBOX_RELAY__";

/// figment's name for the values [`EnvOverrides`] provides; errors about them name the variable.
const ENV_SOURCE: &str = "OUTBOX_RELAY__ environment variables";

type Table = toml::map::Map<String, toml::Value>;

/// Merges the sources (`toml_text` is the file's content, `origin` names it in errors) and
/// deserializes the result. Does not validate.
pub(super) fn layer(
    origin: &str,
    toml_text: Option<&str>,
    env: impl IntoIterator<Item = (String, String)>,
) -> Result<Config, ConfigError> {
    let mut figment = Figment::new();
    if let Some(text) = toml_text {
        // Syntax errors are ours to report: one line with the position (figment's span several).
        text.parse::<Table>().map_err(|err| ConfigError::Parse {
            origin: origin.to_string(),
            message: describe_toml_error(text, &err),
        })?;
        figment = figment.merge(Toml::string(text));
    }
    figment = figment.merge(EnvOverrides::new(env)?);
    figment
        .extract::<Config>()
        .map_err(|err| from_figment(origin, err))
}

/// The process environment as UTF-8 pairs; a non-UTF-8 variable with our prefix is an error,
/// other non-UTF-8 variables are ignored.
pub(super) fn env_vars() -> Result<Vec<(String, String)>, ConfigError> {
    let mut vars = Vec::new();
    for (name, value) in std::env::vars_os() {
        let name = name.to_string_lossy().into_owned();
        if !name.starts_with(ENV_PREFIX) {
            continue;
        }
        match value.into_string() {
            Ok(value) => vars.push((name, value)),
            Err(_) => return Err(ConfigError::env(&name, "the value is not valid UTF-8")),
        }
    }
    Ok(vars)
}

/// The `OUTBOX_RELAY__…` variables as a figment provider, each value typed by its key.
struct EnvOverrides(Dict);

impl EnvOverrides {
    fn new(env: impl IntoIterator<Item = (String, String)>) -> Result<Self, ConfigError> {
        let shape = match toml::Value::try_from(Config::default()) {
            Ok(toml::Value::Table(table)) => table,
            Ok(_) | Err(_) => {
                return Err(ConfigError::Parse {
                    origin: "built-in defaults".to_string(),
                    message: "cannot be represented as a TOML table".to_string(),
                })
            }
        };
        let mut vars: Vec<(String, String)> = env
            .into_iter()
            .filter(|(name, _)| name.starts_with(ENV_PREFIX))
            .collect();
        vars.sort();
        let mut dict = Dict::new();
        for (var, raw) in &vars {
            let (path, value) = env_value(&shape, var, raw)?;
            insert(&mut dict, &path, value);
        }
        Ok(EnvOverrides(dict))
    }
}

impl Provider for EnvOverrides {
    fn metadata(&self) -> Metadata {
        Metadata::named(ENV_SOURCE)
    }

    fn data(&self) -> Result<Map<Profile, Dict>, figment::Error> {
        Ok(Profile::Default.collect(self.0.clone()))
    }
}

fn insert(dict: &mut Dict, path: &[String], value: Value) {
    match path {
        [] => {}
        [last] => {
            dict.insert(last.clone(), value);
        }
        [first, rest @ ..] => {
            let entry = dict
                .entry(first.clone())
                .or_insert_with(|| Value::from(Dict::new()));
            if !matches!(entry, Value::Dict(..)) {
                *entry = Value::from(Dict::new());
            }
            if let Value::Dict(_, inner) = entry {
                insert(inner, rest, value);
            }
        }
    }
}

/// The key path one variable names and its value, typed like the key's default in `shape`.
fn env_value(shape: &Table, var: &str, raw: &str) -> Result<(Vec<String>, Value), ConfigError> {
    let rest = &var[ENV_PREFIX.len()..];
    let segments: Vec<String> = rest.split("__").map(str::to_ascii_lowercase).collect();
    if segments.len() >= 3 && segments[0] == "kafka" && segments[1] == "properties" {
        return kafka_property(var, &segments[2..], raw);
    }
    let dotted = segments.join(".");
    let unknown = |table: &Table| {
        ConfigError::env(
            var,
            format!(
                "no config key `{dotted}`; expected OUTBOX_RELAY__<SECTION>__<KEY> (known here: {})",
                table.keys().map(String::as_str).collect::<Vec<_>>().join(", ")
            ),
        )
    };
    let Some((last, parents)) = segments.split_last() else {
        return Err(unknown(shape));
    };
    let mut table = shape;
    for segment in parents {
        match table.get(segment.as_str()) {
            Some(toml::Value::Table(inner)) => table = inner,
            _ => return Err(unknown(table)),
        }
    }
    let Some(default) = table.get(last.as_str()) else {
        return Err(unknown(table));
    };
    let value = typed_like(default, var, &dotted, raw)?;
    Ok((segments, value))
}

/// `OUTBOX_RELAY__KAFKA__PROPERTIES__<KEY>`: a librdkafka property passed through as a string,
/// its name spelt with `_` for `.` (`SOCKET_TIMEOUT_MS` is `socket.timeout.ms`), since `.` has
/// no place in a variable's name.
fn kafka_property(
    var: &str,
    segments: &[String],
    raw: &str,
) -> Result<(Vec<String>, Value), ConfigError> {
    let key = segments.join("_").replace('_', ".");
    if key.is_empty() || key.starts_with('.') || key.ends_with('.') || key.contains("..") {
        return Err(ConfigError::env(
            var,
            "not a property name: use OUTBOX_RELAY__KAFKA__PROPERTIES__<KEY> with `_` for `.`, \
             e.g. OUTBOX_RELAY__KAFKA__PROPERTIES__SOCKET_TIMEOUT_MS",
        ));
    }
    let path = vec!["kafka".to_string(), "properties".to_string(), key];
    Ok((path, Value::from(raw.to_string())))
}

/// `raw`, which is text like every variable's value, as the type of the key's `default`;
/// `dotted` names the key in the errors.
fn typed_like(
    default: &toml::Value,
    var: &str,
    dotted: &str,
    raw: &str,
) -> Result<Value, ConfigError> {
    Ok(match default {
        toml::Value::String(_) => Value::from(raw.to_string()),
        toml::Value::Integer(_) => {
            let n = raw.trim().parse::<u64>().map_err(|_| {
                ConfigError::env(var, format!("`{dotted}` expects a non-negative integer"))
            })?;
            Value::from(n)
        }
        toml::Value::Float(_) => {
            let x = raw.trim().parse::<f64>().map_err(|_| {
                ConfigError::env(var, format!("`{dotted}` expects a number (e.g. 0.5)"))
            })?;
            Value::from(x)
        }
        toml::Value::Boolean(_) => match raw.trim().to_ascii_lowercase().as_str() {
            "true" => Value::from(true),
            "false" => Value::from(false),
            _ => {
                return Err(ConfigError::env(
                    var,
                    format!("`{dotted}` expects a boolean (`true` or `false`)"),
                ))
            }
        },
        toml::Value::Table(_) => {
            return Err(ConfigError::env(
                var,
                format!("`{dotted}` is a section; set its keys, e.g. {var}__<KEY>"),
            ))
        }
        other => {
            return Err(ConfigError::env(
                var,
                format!(
                    "`{dotted}` is {} and cannot be set from the environment",
                    match other {
                        toml::Value::Array(_) => "an array",
                        _ => "not a scalar",
                    }
                ),
            ))
        }
    })
}

/// One of figment's errors as ours: an unknown enum value is an invalid field, a problem with a
/// value from the environment names the variable, anything else the file.
fn from_figment(origin: &str, err: figment::Error) -> ConfigError {
    let path = key_path(&err.path);
    // figment's path of an unknown field ends with the field itself.
    let section = match (&err.kind, err.path.split_last()) {
        (Kind::UnknownField(key, _), Some((last, parents))) if last == key => key_path(parents),
        _ => path.clone(),
    };
    let message = match &err.kind {
        Kind::UnknownVariant(value, allowed) => {
            return ConfigError::invalid(
                path,
                format!("`{value}` must be one of {}", allowed.join("|")),
            )
        }
        Kind::UnknownField(key, known) if section.is_empty() => {
            format!(
                "unknown section [{key}]; known sections: {}",
                known.join(", ")
            )
        }
        Kind::UnknownField(key, known) => format!(
            "unknown key `{key}` in section [{section}]; known keys: {}",
            known.join(", ")
        ),
        Kind::InvalidType(actual, expected) => format!(
            "`{path}` must be {}, found {}",
            expected_name(expected),
            actual_name(actual)
        ),
        Kind::InvalidValue(actual, expected) => {
            let found = match actual {
                Actual::Signed(n) => n.to_string(),
                Actual::Unsigned(n) => n.to_string(),
                other => actual_name(other),
            };
            format!(
                "`{path}` must be {}, found {found}",
                expected_name(expected)
            )
        }
        Kind::MissingField(key) if path.is_empty() => format!("`{key}` is required"),
        Kind::MissingField(key) => format!("`{path}.{key}` is required"),
        other => format!("`{path}`: {other}"),
    };
    let from_env = err.metadata.as_ref().is_some_and(|m| m.name == ENV_SOURCE);
    if from_env {
        let var = format!("{ENV_PREFIX}{}", err.path.join("__").to_ascii_uppercase());
        ConfigError::env(&var, one_line(&message))
    } else {
        ConfigError::Parse {
            origin: origin.to_string(),
            message: one_line(&message),
        }
    }
}

/// `outbox.tables[0].table` from figment's `["outbox", "tables", "0", "table"]`.
fn key_path(segments: &[String]) -> String {
    let mut path = String::new();
    for segment in segments {
        if !segment.is_empty() && segment.bytes().all(|b| b.is_ascii_digit()) {
            path.push_str(&format!("[{segment}]"));
        } else {
            if !path.is_empty() {
                path.push('.');
            }
            path.push_str(segment);
        }
    }
    path
}

/// serde's name of an expected type, in the words of the config file.
fn expected_name(expected: &str) -> String {
    match expected {
        "u64" | "usize" => "a non-negative integer".to_string(),
        "u32" => format!("a non-negative integer up to {}", u32::MAX),
        "a sequence" => "an array".to_string(),
        "a map" => "a table".to_string(),
        _ if expected.starts_with("struct ") => "a section (table)".to_string(),
        _ => expected.to_string(),
    }
}

/// The kind of a value found, without the value itself.
fn actual_name(actual: &Actual) -> String {
    match actual {
        Actual::Bool(_) => "a boolean".to_string(),
        Actual::Unsigned(_) | Actual::Signed(_) => "an integer".to_string(),
        Actual::Float(_) => "a float".to_string(),
        Actual::Char(_) | Actual::Str(_) => "a string".to_string(),
        Actual::Seq => "an array".to_string(),
        Actual::Map => "a table".to_string(),
        other => other.to_string(),
    }
}

/// A TOML syntax error as one line with its position.
fn describe_toml_error(text: &str, err: &toml::de::Error) -> String {
    let message = one_line(err.message());
    match err.span() {
        Some(span) => {
            let before = &text[..span.start.min(text.len())];
            let line = before.matches('\n').count() + 1;
            let column = before.rsplit('\n').next().unwrap_or("").chars().count() + 1;
            format!("line {line}, column {column}: {message}")
        }
        None => message,
    }
}

fn one_line(message: &str) -> String {
    message
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("; ")
}

/// serde adapter for an optional value that the file writes `""` when unset: `""` reads as
/// `None`, and `None` is written as `""`, so `config/outbox-relay.toml` and the output of
/// `outbox-relay config` list every key.
pub(super) mod unset {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<T: Serialize, S: Serializer>(
        value: &Option<T>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        match value {
            Some(value) => value.serialize(serializer),
            None => serializer.serialize_str(""),
        }
    }

    pub fn deserialize<'de, T: From<String>, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<T>, D::Error> {
        let text = String::deserialize(deserializer)?;
        Ok((!text.is_empty()).then(|| T::from(text)))
    }
}
