//! `[outbox.serialization]`: record values encoded against a Schema Registry's schemas and
//! framed in Confluent's wire format (magic byte 0, the 4-byte schema id, the body). Off
//! (`format = "none"`) by default: the payload is then sent byte for byte, as before.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::layering::unset;
use super::{ConfigError, Format, Secret};

/// How long a schema fetched as `latest` is used before the registry is asked again, in ms.
pub const DEFAULT_LATEST_TTL_MS: u64 = 300_000;
/// A registry request's deadline, in ms.
pub const DEFAULT_REGISTRY_TIMEOUT_MS: u64 = 10_000;
/// The header whose value names the record for the `record` subject strategies.
pub const DEFAULT_RECORD_NAME_HEADER: &str = "type";

/// What the value is encoded as (`outbox.serialization.format`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SerializationFormat {
    /// The payload byte for byte (no registry).
    #[default]
    None,
    /// Avro binary of the JSON payload, per the subject's Avro schema.
    Avro,
    /// The JSON payload as it is, once validated against the subject's JSON Schema.
    JsonSchema,
    /// Protobuf binary of the JSON payload (protobuf's JSON mapping), per one message of
    /// the subject's `.proto` file.
    Protobuf,
}

impl SerializationFormat {
    pub const NAMES: &'static [&'static str] = &["none", "avro", "json_schema", "protobuf"];

    /// The registry's `schemaType`.
    pub fn schema_type(self) -> &'static str {
        match self {
            SerializationFormat::None | SerializationFormat::Avro => "AVRO",
            SerializationFormat::JsonSchema => "JSON",
            SerializationFormat::Protobuf => "PROTOBUF",
        }
    }

    /// The `content-type` of a CloudEvents binary-mode record.
    pub fn content_type(self) -> &'static str {
        match self {
            SerializationFormat::None => "application/json",
            SerializationFormat::Avro => "application/avro",
            SerializationFormat::JsonSchema => "application/json",
            SerializationFormat::Protobuf => "application/protobuf",
        }
    }
}

/// How the record key is written (`outbox.serialization.key_format`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KeyFormat {
    /// The key's bytes as they are (the event id, or `key_column`), unframed.
    #[default]
    String,
    /// The key as an Avro `"string"`, framed with the id of subject `<topic>-key`.
    Avro,
    /// The key as a JSON string (`"…"`), framed with the id of subject `<topic>-key`,
    /// whose schema is a JSON Schema of `"type": "string"`.
    JsonSchema,
    /// The key as message `outbox_relay.Key { string key = 1; }`, framed with the id of
    /// subject `<topic>-key` (the first message of that subject's file is used).
    Protobuf,
}

impl KeyFormat {
    pub const NAMES: &'static [&'static str] = &["string", "avro", "json_schema", "protobuf"];
}

/// Which subject a record's schema is under (Confluent's subject name strategies).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SubjectStrategy {
    /// `<topic>-value` (`TopicNameStrategy`).
    #[default]
    Topic,
    /// `<record name>` (`RecordNameStrategy`).
    Record,
    /// `<topic>-<record name>` (`TopicRecordNameStrategy`).
    TopicRecord,
}

/// `[outbox.serialization]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SerializationConfig {
    /// `none` (default), `avro`, `json_schema` or `protobuf`.
    pub format: SerializationFormat,
    /// The registry's Confluent-compatible base URL (Confluent: `http://host:8081`;
    /// Apicurio: `http://host:8080/apis/ccompat/v7`). Required unless `format = "none"`.
    pub registry_url: String,
    /// Basic auth user; its password is in `registry_password_file`. Unset: no basic auth.
    #[serde(with = "unset")]
    pub registry_username: Option<String>,
    /// File holding the basic-auth password (trimmed).
    #[serde(with = "unset")]
    pub registry_password_file: Option<PathBuf>,
    /// File holding a bearer token (trimmed), sent as `Authorization: Bearer`.
    #[serde(with = "unset")]
    pub registry_token_file: Option<PathBuf>,
    /// `topic` (`<topic>-value`), `record` or `topic_record`.
    pub subject_strategy: SubjectStrategy,
    /// `record`/`topic_record`: the header whose value is the record name (default `type`,
    /// the event type; `ce_type` in `cloudevents_binary`; map any column to a header with
    /// `header_columns` to name records by it).
    pub record_name_header: String,
    /// `latest` (default) or a version number of the subject, as a string.
    pub schema_version: String,
    /// `latest`: milliseconds a fetched schema is used before the registry is asked again
    /// (a new version is picked up then); > 0.
    pub latest_ttl_ms: u64,
    /// Register `schema_file` under the subject when it is missing (default false: a missing
    /// subject blocks until an operator registers it).
    pub auto_register: bool,
    /// The schema to register when `auto_register` is on. Required with it.
    #[serde(with = "unset")]
    pub schema_file: Option<PathBuf>,
    /// Deadline of one registry request, in milliseconds; > 0.
    pub request_timeout_ms: u64,
    /// `protobuf`: the message of the `.proto` file values are encoded as, by full name
    /// (`pkg.Msg`, `pkg.Outer.Inner`) or relative to the file's package. Unset: the file's
    /// first message.
    #[serde(with = "unset")]
    pub protobuf_message: Option<String>,
    /// A header whose value is the schema id to encode the record with (map a column to it
    /// with `header_columns`), instead of the subject's `schema_version`. A record without the
    /// header uses the subject's; a value that is not a number is dead-lettered. Unset: off.
    #[serde(with = "unset")]
    pub schema_id_header: Option<String>,
    /// The record key: `string` (default: its bytes as today), `avro`, `json_schema` or
    /// `protobuf` (the key as a string of that format, framed with the id of subject
    /// `<topic>-key` under every `subject_strategy`, as Confluent's default key strategy
    /// names it). The partition is still chosen from the unencoded key. Needs
    /// `registry_url`; with `auto_register` the string schema is registered under a missing
    /// key subject (no file needed).
    pub key_format: KeyFormat,
}

impl Default for SerializationConfig {
    fn default() -> Self {
        SerializationConfig {
            format: SerializationFormat::None,
            registry_url: String::new(),
            registry_username: None,
            registry_password_file: None,
            registry_token_file: None,
            subject_strategy: SubjectStrategy::Topic,
            record_name_header: DEFAULT_RECORD_NAME_HEADER.to_string(),
            schema_version: "latest".to_string(),
            latest_ttl_ms: DEFAULT_LATEST_TTL_MS,
            auto_register: false,
            schema_file: None,
            request_timeout_ms: DEFAULT_REGISTRY_TIMEOUT_MS,
            protobuf_message: None,
            schema_id_header: None,
            key_format: KeyFormat::String,
        }
    }
}

/// The subject version to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SchemaVersion {
    Latest,
    Pinned(u32),
}

impl SerializationConfig {
    /// True when a registry is used: for the value, the key, or both.
    pub fn enabled(&self) -> bool {
        self.format != SerializationFormat::None || self.key_format != KeyFormat::String
    }

    /// A `[[outbox.tables]]` entry's own section completed from the top-level `top`: the
    /// registry connection (`registry_url`, and the login when the section sets none of
    /// `registry_username`, `registry_password_file`, `registry_token_file`) is inherited
    /// when unset; every other key is the section's own or its default.
    pub fn inherit(&self, top: &SerializationConfig) -> SerializationConfig {
        let mut own = self.clone();
        if own.registry_url.is_empty() {
            own.registry_url = top.registry_url.clone();
        }
        let no_login = own.registry_username.is_none()
            && own.registry_password_file.is_none()
            && own.registry_token_file.is_none();
        if no_login {
            own.registry_username = top.registry_username.clone();
            own.registry_password_file = top.registry_password_file.clone();
            own.registry_token_file = top.registry_token_file.clone();
        }
        own
    }

    /// `schema_version` parsed (validated by [`SerializationConfig::validate`]).
    pub fn version(&self) -> SchemaVersion {
        match self.schema_version.parse::<u32>() {
            Ok(n) => SchemaVersion::Pinned(n),
            Err(_) => SchemaVersion::Latest,
        }
    }

    /// The basic-auth password or the bearer token, read from their files.
    pub fn read_secret(&self) -> Result<Option<Secret>, ConfigError> {
        let Some(path) = self
            .registry_password_file
            .as_ref()
            .or(self.registry_token_file.as_ref())
        else {
            return Ok(None);
        };
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
            path: path.clone(),
            source,
        })?;
        Ok(Some(Secret::new(text.trim().to_string())))
    }

    /// `path`: where the section is (`outbox.serialization`, `outbox.tables[1].serialization`);
    /// `formats`: the `outbox.format` of every table (and of messages) it encodes.
    pub(super) fn validate(
        &self,
        path: &str,
        formats: &[(String, Format)],
    ) -> Result<(), ConfigError> {
        let field = |key: &str| format!("{path}.{key}");
        if !self.enabled() {
            return Ok(());
        }
        if self.protobuf_message.is_some() && self.format != SerializationFormat::Protobuf {
            return Err(ConfigError::invalid(
                field("protobuf_message"),
                "names a protobuf message: only with format = \"protobuf\"",
            ));
        }
        if !(self.registry_url.starts_with("http://") || self.registry_url.starts_with("https://"))
        {
            return Err(ConfigError::invalid(
                field("registry_url"),
                "must be the registry's http:// or https:// base URL",
            ));
        }
        if self.registry_username.is_some() != self.registry_password_file.is_some() {
            return Err(ConfigError::invalid(
                field("registry_password_file"),
                "registry_username and registry_password_file go together",
            ));
        }
        if self.registry_token_file.is_some() && self.registry_username.is_some() {
            return Err(ConfigError::invalid(
                field("registry_token_file"),
                "set basic auth (registry_username) or a bearer token, not both",
            ));
        }
        if self.schema_version != "latest" && self.schema_version.parse::<u32>().is_err() {
            return Err(ConfigError::invalid(
                field("schema_version"),
                "must be `latest` or a version number",
            ));
        }
        if self.auto_register
            && self.schema_file.is_none()
            && self.format != SerializationFormat::None
        {
            return Err(ConfigError::invalid(
                field("schema_file"),
                "auto_register = true needs the schema to register",
            ));
        }
        if self.subject_strategy != SubjectStrategy::Topic && self.record_name_header.is_empty() {
            return Err(ConfigError::invalid(
                field("record_name_header"),
                "must name the header holding the record name",
            ));
        }
        for (key, value) in [
            ("latest_ttl_ms", self.latest_ttl_ms),
            ("request_timeout_ms", self.request_timeout_ms),
        ] {
            if value == 0 {
                return Err(ConfigError::invalid(field(key), "must be > 0"));
            }
        }
        for (table, format) in formats {
            if self.format == SerializationFormat::None {
                break;
            }
            if matches!(format, Format::Envelope | Format::CloudeventsStructured) {
                return Err(ConfigError::invalid(
                    format!("{table}.format"),
                    format!(
                        "`{}` wraps the payload in a JSON document, which {path} cannot encode; use `plain` or `cloudevents_binary` (the CloudEvents attributes then go in ce_* headers), or set {path}.format = \"none\"",
                        Format::NAMES[*format as usize]
                    ),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::config::{Config, ConfigError};

    fn load(toml: &str, env: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let env = env.iter().map(|(k, v)| (k.to_string(), v.to_string()));
        Config::from_sources(Some(toml), env)
    }

    fn field_of(result: Result<Config, ConfigError>) -> String {
        match result {
            Err(ConfigError::Invalid { field, .. }) => field,
            other => panic!("expected an invalid field, got {other:?}"),
        }
    }

    const AVRO: &str =
        "[outbox.serialization]\nformat = \"avro\"\nregistry_url = \"http://r:8081\"\n";

    #[test]
    fn avro_with_a_registry_is_accepted_and_off_by_default() {
        let config = load(AVRO, &[]).unwrap();
        assert!(config.outbox.serialization.enabled());
        assert!(!load("", &[]).unwrap().outbox.serialization.enabled());
        let from_env = load(
            "",
            &[
                ("OUTBOX_RELAY__OUTBOX__SERIALIZATION__FORMAT", "avro"),
                (
                    "OUTBOX_RELAY__OUTBOX__SERIALIZATION__REGISTRY_URL",
                    "http://r",
                ),
                ("OUTBOX_RELAY__OUTBOX__SERIALIZATION__SCHEMA_VERSION", "3"),
            ],
        )
        .unwrap();
        assert_eq!(
            from_env.outbox.serialization.version(),
            super::SchemaVersion::Pinned(3)
        );
    }

    #[test]
    fn bad_settings_name_their_key() {
        let cases = [
            (
                "[outbox.serialization]\nformat = \"protobuf\"\n",
                "outbox.serialization.registry_url",
            ),
            (
                &format!("{AVRO}protobuf_message = \"E\"\n"),
                "outbox.serialization.protobuf_message",
            ),
            (
                "[outbox.serialization]\nformat = \"xml\"\nregistry_url = \"http://r\"\n",
                "outbox.serialization.format",
            ),
            (
                "[outbox.serialization]\nformat = \"avro\"\n",
                "outbox.serialization.registry_url",
            ),
            (
                &format!("{AVRO}schema_version = \"newest\"\n"),
                "outbox.serialization.schema_version",
            ),
            (
                &format!("{AVRO}auto_register = true\n"),
                "outbox.serialization.schema_file",
            ),
            (
                &format!("{AVRO}registry_username = \"u\"\n"),
                "outbox.serialization.registry_password_file",
            ),
            (
                &format!("{AVRO}registry_username = \"u\"\nregistry_password_file = \"/p\"\nregistry_token_file = \"/t\"\n"),
                "outbox.serialization.registry_token_file",
            ),
            (
                &format!("{AVRO}latest_ttl_ms = 0\n"),
                "outbox.serialization.latest_ttl_ms",
            ),
        ];
        for (toml, field) in cases {
            assert_eq!(field_of(load(toml, &[])), field, "{toml}");
        }
    }

    #[test]
    fn structured_cloudevents_and_envelopes_are_refused_with_a_serialization_format() {
        let structured = format!("[outbox]\nformat = \"cloudevents_structured\"\n{AVRO}");
        assert_eq!(field_of(load(&structured, &[])), "outbox.format");
        let table =
            format!("[outbox]\n[[outbox.tables]]\ntable = \"b\"\nformat = \"envelope\"\n{AVRO}");
        assert_eq!(field_of(load(&table, &[])), "outbox.tables[0].format");
        let binary = format!("[outbox]\nformat = \"cloudevents_binary\"\n{AVRO}");
        assert!(load(&binary, &[]).is_ok());
    }

    const TWO_TABLES: &str = r#"
[outbox]
table = ""
[outbox.serialization]
format = "avro"
registry_url = "http://r:8081"
registry_username = "u"
registry_password_file = "/p"
schema_version = "3"
[[outbox.tables]]
table = "orders_outbox"
[[outbox.tables]]
table = "audit_outbox"
[outbox.tables.serialization]
format = "json_schema"
key_format = "json_schema"
"#;

    #[test]
    fn a_tables_section_replaces_the_top_level_one_but_inherits_the_registry() {
        let config = load(TWO_TABLES, &[]).unwrap();
        let tables = config.outbox.table_configs();
        let orders = &tables[0].serialization;
        assert_eq!(orders, &config.outbox.serialization);
        let audit = &tables[1].serialization;
        assert_eq!(audit.format, super::SerializationFormat::JsonSchema);
        assert_eq!(audit.key_format, super::KeyFormat::JsonSchema);
        // The connection is inherited...
        assert_eq!(audit.registry_url, "http://r:8081");
        assert_eq!(audit.registry_username.as_deref(), Some("u"));
        // ...the contract is not: the pinned version was the Avro subject's.
        assert_eq!(audit.version(), super::SchemaVersion::Latest);
        let (profiles, of_table) = config.outbox.serialization_profiles();
        assert_eq!(profiles.len(), 2);
        assert_eq!(of_table, [0, 1]);
        // `outbox-relay config` shows the table's own section, and it reads back the same.
        let shown = config.to_redacted_toml();
        assert!(shown.contains("[outbox.tables.serialization]"), "{shown}");
        let again = load(&shown, &[]).unwrap();
        assert_eq!(again.outbox.table_configs()[1].serialization, *audit);

        // A login of its own replaces the inherited one as a whole; so does a URL.
        let own = TWO_TABLES.replace(
            "key_format = \"json_schema\"",
            "registry_url = \"http://other\"\nregistry_token_file = \"/t\"",
        );
        let audit = &load(&own, &[]).unwrap().outbox.table_configs()[1].serialization;
        assert_eq!(audit.registry_url, "http://other");
        assert_eq!(audit.registry_username, None);
        assert_eq!(audit.registry_token_file.as_deref(), Some("/t".as_ref()));
        // `format = "none"` in a table: its values go out as they are, the others encoded.
        let plain = TWO_TABLES.replace(
            "format = \"json_schema\"\nkey_format = \"json_schema\"",
            "format = \"none\"",
        );
        let config = load(&plain, &[]).unwrap();
        assert!(!config.outbox.table_configs()[1].serialization.enabled());
        assert!(config.outbox.table_configs()[0].serialization.enabled());
    }

    #[test]
    fn a_tables_section_is_validated_under_its_own_key() {
        let no_url = "[outbox]\n[[outbox.tables]]\ntable = \"a\"\n[[outbox.tables]]\ntable = \"b\"\n[outbox.tables.serialization]\nformat = \"avro\"\n";
        assert_eq!(
            field_of(load(no_url, &[])),
            "outbox.tables[1].serialization.registry_url"
        );
        let envelope = "[outbox]\n[[outbox.tables]]\ntable = \"a\"\nformat = \"envelope\"\n[outbox.tables.serialization]\nformat = \"avro\"\nregistry_url = \"http://r\"\n";
        let err = load(envelope, &[]).unwrap_err();
        assert_eq!(field_of(Err(err)), "outbox.tables[0].format");
        // The same envelope table is fine when its own section encodes nothing.
        let plain_table = format!("[outbox]\n[[outbox.tables]]\ntable = \"a\"\nformat = \"envelope\"\n[outbox.tables.serialization]\nformat = \"none\"\n{AVRO}");
        assert!(load(&plain_table, &[]).is_ok());
        let bad_format = TWO_TABLES.replace("\"json_schema\"\nkey", "\"xml\"\nkey");
        let err = load(&bad_format, &[]).unwrap_err().to_string();
        assert!(
            err.contains("outbox.tables") && err.contains("xml"),
            "{err}"
        );
    }

    #[test]
    fn key_formats_parse_and_need_a_registry() {
        for (name, format) in [
            ("avro", super::KeyFormat::Avro),
            ("json_schema", super::KeyFormat::JsonSchema),
            ("protobuf", super::KeyFormat::Protobuf),
        ] {
            let config = load(&format!("{AVRO}key_format = \"{name}\"\n"), &[]).unwrap();
            assert_eq!(config.outbox.serialization.key_format, format);
        }
        // String keys by default; keys alone need a registry too.
        assert_eq!(
            load(AVRO, &[]).unwrap().outbox.serialization.key_format,
            super::KeyFormat::String
        );
        let keys_only = "[outbox.serialization]\nkey_format = \"avro\"\n";
        assert_eq!(
            field_of(load(keys_only, &[])),
            "outbox.serialization.registry_url"
        );
        // Without a schema file: the key's string schema needs none.
        let keys_only = format!("{keys_only}registry_url = \"http://r\"\nauto_register = true\n");
        assert!(load(&keys_only, &[])
            .unwrap()
            .outbox
            .serialization
            .enabled());
        let table = "[outbox]\n[[outbox.tables]]\ntable = \"a\"\n[outbox.tables.serialization]\nkey_format = \"json_schema\"\n";
        assert_eq!(
            field_of(load(table, &[])),
            "outbox.tables[0].serialization.registry_url"
        );
    }

    #[test]
    fn the_secret_is_read_from_its_file_and_never_printed() {
        let path = std::env::temp_dir().join(format!("registry-secret-{}", std::process::id()));
        std::fs::write(&path, "s3cret\n").unwrap();
        let config = load(
            &format!(
                "{AVRO}registry_username = \"u\"\nregistry_password_file = \"{}\"\n",
                path.display()
            ),
            &[],
        )
        .unwrap();
        let secret = config.outbox.serialization.read_secret().unwrap().unwrap();
        assert_eq!(secret.expose(), "s3cret");
        assert_eq!(format!("{secret:?}"), "***");
        assert!(!config.to_redacted_toml().contains("s3cret"));
        std::fs::remove_file(path).unwrap();
    }
}
