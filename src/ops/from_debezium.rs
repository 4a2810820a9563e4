//! `outbox-relay config --from-debezium FILE`: a Debezium PostgreSQL connector configured with
//! the outbox event router, translated into our TOML.
//!
//! In: the connector's configuration, as a `.properties` file, Kafka Connect's JSON
//! (`{"name": …, "config": {…}}`) or the bare JSON object `PUT /connectors/…/config` takes.
//! Out: the TOML text, in which every key written names the Debezium option it comes from, and
//! the options left behind, each with the reason. Pure: no file, no server.
//!
//! The translation keeps what Debezium's router puts on the wire where the relay can say the
//! same thing (topic, key, partition, headers, timestamp, tombstones) and writes down where it
//! cannot. Debezium's defaults count as set: a connector that relies on `aggregateid` being the
//! key gets `key_column = "aggregateid"` here, so the records keep their keys and partitions.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// The class of Debezium's outbox event router (`transforms.<name>.type`).
pub const EVENT_ROUTER: &str = "io.debezium.transforms.outbox.EventRouter";
/// The class of Debezium's PostgreSQL connector (`connector.class`).
pub const POSTGRES_CONNECTOR: &str = "io.debezium.connector.postgresql.PostgresConnector";

/// Why a file cannot be translated at all.
#[derive(Debug, thiserror::Error)]
pub enum DebeziumError {
    #[error("not JSON: {0}")]
    Json(#[source] serde_json::Error),
    #[error(
        "JSON `{key}` is {found}; Kafka Connect's configuration has strings, numbers and booleans"
    )]
    JsonValue { key: String, found: &'static str },
    #[error("line {line}: a properties line is `key=value`, got `{text}`")]
    Properties { line: usize, text: String },
    #[error("connector.class is `{0}`: only Debezium's PostgreSQL connector ({POSTGRES_CONNECTOR}) can be translated")]
    NotPostgres(String),
    #[error("no transformation of type {EVENT_ROUTER} in `transforms`: this is not an outbox router configuration")]
    NoOutboxRouter,
}

/// A Debezium option that has no place in the TOML, with the reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unmapped {
    pub key: String,
    pub reason: String,
}

impl fmt::Display for Unmapped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.key, self.reason)
    }
}

/// The translation: the TOML text and the options left behind (in the file's key order).
#[derive(Debug, Clone)]
pub struct Converted {
    pub toml: String,
    pub unmapped: Vec<Unmapped>,
}

/// Translates a connector configuration (properties or JSON, told apart by the first
/// character that is not blank).
pub fn convert(text: &str) -> Result<Converted, DebeziumError> {
    let options = if text.trim_start().starts_with('{') {
        parse_json(text)?
    } else {
        parse_properties(text)?
    };
    Translation::new(options).run()
}

/// Kafka Connect's JSON: `{"name": …, "config": {…}}`, or the `config` object alone.
fn parse_json(text: &str) -> Result<Vec<(String, String)>, DebeziumError> {
    let value: serde_json::Value = serde_json::from_str(text).map_err(DebeziumError::Json)?;
    let mut options = Vec::new();
    let object = match &value {
        serde_json::Value::Object(object) => object,
        _ => {
            return Err(DebeziumError::JsonValue {
                key: "(top level)".to_string(),
                found: json_kind(&value),
            })
        }
    };
    let config = match object.get("config") {
        Some(serde_json::Value::Object(config)) => {
            if let Some(name) = object.get("name") {
                options.push(("name".to_string(), json_scalar("name", name)?));
            }
            config
        }
        _ => object,
    };
    for (key, value) in config {
        options.push((key.clone(), json_scalar(key, value)?));
    }
    Ok(options)
}

fn json_scalar(key: &str, value: &serde_json::Value) -> Result<String, DebeziumError> {
    match value {
        serde_json::Value::String(s) => Ok(s.clone()),
        serde_json::Value::Number(n) => Ok(n.to_string()),
        serde_json::Value::Bool(b) => Ok(b.to_string()),
        other => Err(DebeziumError::JsonValue {
            key: key.to_string(),
            found: json_kind(other),
        }),
    }
}

fn json_kind(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Null => "null",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
        _ => "a scalar",
    }
}

/// Java's `.properties` format: `key=value`, `key: value` or `key value`; `#` and `!` start a
/// comment line; a line ending in an odd number of `\` continues on the next; `\` escapes the
/// next character (`\t`, `\n`, `\uXXXX` as Java reads them).
fn parse_properties(text: &str) -> Result<Vec<(String, String)>, DebeziumError> {
    let mut options = Vec::new();
    let mut logical = String::new();
    let mut first_line = 0;
    for (index, line) in text.lines().enumerate() {
        let line = if logical.is_empty() {
            first_line = index + 1;
            let trimmed = line.trim_start();
            if trimmed.is_empty() || trimmed.starts_with('#') || trimmed.starts_with('!') {
                continue;
            }
            trimmed
        } else {
            line.trim_start()
        };
        let trailing = line.len() - line.trim_end_matches('\\').len();
        if trailing % 2 == 1 {
            logical.push_str(&line[..line.len() - 1]);
            continue;
        }
        logical.push_str(line);
        let (key, value) = split_property(&logical).ok_or_else(|| DebeziumError::Properties {
            line: first_line,
            text: logical.clone(),
        })?;
        options.push((key, value));
        logical.clear();
    }
    if !logical.is_empty() {
        let (key, value) = split_property(&logical).ok_or_else(|| DebeziumError::Properties {
            line: first_line,
            text: logical.clone(),
        })?;
        options.push((key, value));
    }
    Ok(options)
}

/// One logical properties line into its unescaped key and value.
fn split_property(line: &str) -> Option<(String, String)> {
    let mut chars = line.char_indices().peekable();
    let mut end = line.len();
    while let Some((at, c)) = chars.next() {
        match c {
            '\\' => {
                chars.next();
            }
            '=' | ':' | ' ' | '\t' => {
                end = at;
                break;
            }
            _ => {}
        }
    }
    let key = unescape(&line[..end]);
    let mut rest = line[end..].trim_start_matches([' ', '\t']);
    if let Some(after) = rest.strip_prefix(['=', ':']) {
        rest = after.trim_start_matches([' ', '\t']);
    }
    if key.is_empty() {
        return None;
    }
    Some((key, unescape(rest)))
}

fn unescape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('t') => out.push('\t'),
            Some('n') => out.push('\n'),
            Some('r') => out.push('\r'),
            Some('f') => out.push('\u{c}'),
            Some('u') => {
                let hex: String = chars.by_ref().take(4).collect();
                match u32::from_str_radix(&hex, 16).ok().and_then(char::from_u32) {
                    Some(decoded) => out.push(decoded),
                    None => {
                        out.push_str("\\u");
                        out.push_str(&hex);
                    }
                }
            }
            Some(other) => out.push(other),
            None => {}
        }
    }
    out
}

/// Options Debezium reads that the relay has no use for, by exact key or by prefix (ending in
/// `.`), with the reason.
const NO_EQUIVALENT: &[(&str, &str)] = &[
    ("tasks.max", "one relay streams a slot (Debezium's PostgreSQL connector runs one task too); a second relay on the same config is a hot standby"),
    ("topic.prefix", "names Debezium's own topics (heartbeats, transaction metadata, the raw change topics); the relay writes only the event topics and `dead_letter.topic`"),
    ("database.server.name", "names Debezium's own topics (the pre-2.0 topic.prefix); the relay writes only the event topics and `dead_letter.topic`"),
    ("heartbeat.interval.ms", "not needed: while the outbox is idle the relay confirms the slot from the server's keepalives, with no heartbeat topic or table"),
    ("heartbeat.action.query", "not needed: while the outbox is idle the relay confirms the slot from the server's keepalives, with no heartbeat topic or table"),
    ("heartbeat.topics.prefix", "not needed: the relay writes no heartbeat topic"),
    ("poll.interval.ms", "the relay reads the replication stream as it arrives; batching towards Kafka is kafka.linger_ms"),
    ("max.batch.size", "batching towards Kafka is kafka.batch_num_messages and kafka.linger_ms"),
    ("max.queue.size", "work in flight is bounded by kafka.max_in_flight_messages and kafka.max_in_flight_bytes"),
    ("max.queue.size.in.bytes", "work in flight is bounded by kafka.max_in_flight_messages and kafka.max_in_flight_bytes"),
    ("offset.", "the relay keeps no offsets: the slot's confirmed position is the only one, moved once Kafka acknowledged (relay.confirm_delay_ms groups those confirmations)"),
    ("snapshot.", "the relay takes no snapshot; `outbox-relay replay` re-publishes rows still in the outbox table"),
    ("decimal.handling.mode", "the relay converts no column types: the payload is sent as its text (json, jsonb, text) or bytes (bytea)"),
    ("time.precision.mode", "the relay converts no column types; a timestamp column becomes the record timestamp in milliseconds"),
    ("binary.handling.mode", "the relay converts no column types: a bytea payload is sent as its raw bytes"),
    ("hstore.handling.mode", "the relay converts no column types"),
    ("interval.handling.mode", "the relay converts no column types"),
    ("include.unknown.datatypes", "the relay converts no column types"),
    ("provide.transaction.metadata", "the relay writes no transaction metadata topic"),
    ("message.key.columns", "the router sets the key itself (table.field.event.key)"),
    ("column.", "the relay reads only the columns its mapping names"),
    ("table.exclude.list", "the relay reads only the outbox tables it is given"),
    ("schema.exclude.list", "the relay reads only the outbox tables it is given"),
    ("table.blacklist", "the relay reads only the outbox tables it is given"),
    ("schema.blacklist", "the relay reads only the outbox tables it is given"),
    ("database.initial.statements", "the relay runs no statements of its own on connect"),
    ("slot.stream.params", "the relay sets pgoutput's options itself (proto_version 1, the publication)"),
    ("slot.max.retries", "the relay retries for as long as it runs, backing off from postgres.reconnect_backoff_initial_ms to postgres.reconnect_backoff_max_ms"),
    ("slot.retry.delay.ms", "the relay retries for as long as it runs, backing off from postgres.reconnect_backoff_initial_ms to postgres.reconnect_backoff_max_ms"),
    ("retriable.restart.connector.wait.ms", "the relay restarts its session with backoff: postgres.reconnect_backoff_initial_ms / _max_ms"),
    ("errors.", "Kafka Connect's error handling: rows that cannot become records follow dead_letter.policy"),
    ("producer.override.", "producer settings are kafka.* keys (and kafka.properties for librdkafka); translate them by hand"),
    ("consumer.override.", "the relay has no consumer"),
    ("signal.", "the relay reads no signal table or topic; its operator commands do that work"),
    ("incremental.snapshot.", "the relay takes no snapshot; `outbox-relay replay` re-publishes rows still in the outbox table"),
    ("notification.", "the relay sends no notifications; it serves /metrics and logs"),
    ("predicates", "not needed: the relay reads only the outbox tables' inserts"),
    ("converters", "the relay converts no column types"),
    ("schema.name.adjustment.mode", "the relay writes no Kafka Connect schemas"),
    ("field.name.adjustment.mode", "the relay writes no Kafka Connect schemas"),
    ("event.processing.failure.handling.mode", "rows that cannot become records follow dead_letter.policy"),
    ("skipped.operations", "the relay publishes inserts only (the publication has publish = 'insert')"),
];

/// Router options the relay cannot express, with the reason.
const ROUTER_NO_EQUIVALENT: &[(&str, &str)] = &[
    ("table.field.event.schema.version", "a Kafka Connect schema version: the relay writes no Connect schemas"),
    ("tracing.operation.name", "the relay's span is its own PRODUCER span per event ([tracing])"),
    ("tracing.with.context.field.only", "the relay traces an event when [tracing] is enabled and samples it, whether or not it carries a context"),
    ("predicate", "not needed: the relay reads only the outbox tables' inserts"),
    ("negate", "not needed: the relay reads only the outbox tables' inserts"),
];

/// The TOML being written: sections in order, each a list of lines.
#[derive(Default)]
struct Toml {
    sections: Vec<(String, Vec<String>)>,
}

impl Toml {
    fn section(&mut self, name: &str) -> &mut Vec<String> {
        if let Some(at) = self.sections.iter().position(|(n, _)| n == name) {
            return &mut self.sections[at].1;
        }
        self.sections.push((name.to_string(), Vec::new()));
        &mut self.sections.last_mut().expect("just pushed").1
    }

    /// `key = value` preceded by a comment naming where it comes from.
    fn set(&mut self, section: &str, key: &str, value: impl Into<toml::Value>, from: &str) {
        let lines = self.section(section);
        lines.push(format!("# {from}"));
        lines.push(format!("{key} = {}", inline(&value.into())));
    }

    /// A comment only: an option mapped to what the relay does anyway.
    fn note(&mut self, section: &str, text: &str) {
        self.section(section).push(format!("# {text}"));
    }

    fn render(&self, header: &str) -> String {
        let mut out = String::from(header);
        for (name, lines) in &self.sections {
            if lines.is_empty() {
                continue;
            }
            out.push('\n');
            if let Some((array, _)) = name.split_once('#') {
                // `[[outbox.tables]]#2`: one entry of an array of tables.
                out.push_str(array);
            } else {
                out.push_str(&format!("[{name}]"));
            }
            out.push('\n');
            for line in lines {
                out.push_str(line);
                out.push('\n');
            }
        }
        out
    }
}

/// A value written inline: strings quoted, tables as `{ "k" = "v" }`.
fn inline(value: &toml::Value) -> String {
    match value {
        toml::Value::Table(table) => {
            let members: Vec<String> = table
                .iter()
                .map(|(k, v)| format!("{} = {}", toml::Value::String(k.clone()), inline(v)))
                .collect();
            format!("{{ {} }}", members.join(", "))
        }
        other => other.to_string(),
    }
}

/// One run of the translation: the options, which of them were used, what is written.
struct Translation {
    options: Vec<(String, String)>,
    by_key: BTreeMap<String, String>,
    used: BTreeSet<String>,
    unmapped: Vec<Unmapped>,
    out: Toml,
}

impl Translation {
    fn new(options: Vec<(String, String)>) -> Self {
        let by_key = options.iter().cloned().collect();
        Translation {
            options,
            by_key,
            used: BTreeSet::new(),
            unmapped: Vec::new(),
            out: Toml::default(),
        }
    }

    /// The option's value (trimmed), marking it used.
    fn take(&mut self, key: &str) -> Option<String> {
        let value = self.by_key.get(key)?.trim().to_string();
        self.used.insert(key.to_string());
        Some(value)
    }

    fn leave(&mut self, key: &str, reason: impl Into<String>) {
        self.used.insert(key.to_string());
        self.unmapped.push(Unmapped {
            key: key.to_string(),
            reason: reason.into(),
        });
    }

    fn run(mut self) -> Result<Converted, DebeziumError> {
        if let Some(class) = self.take("connector.class") {
            if class != POSTGRES_CONNECTOR {
                return Err(DebeziumError::NotPostgres(class));
            }
        }
        let router = self.router()?;
        // Sections in the order of the example config file.
        for section in ["postgres", "outbox", "kafka"] {
            self.out.section(section);
        }
        if self.used.contains("connector.class") {
            self.out.note(
                "postgres",
                "connector.class: Debezium's PostgreSQL connector, the source here",
            );
        }
        self.out.note(
            "outbox",
            &format!(
                "transforms, transforms.{router}.type: the outbox event router, translated below"
            ),
        );
        self.connection();
        self.slot_and_publication();
        self.tables();
        self.routing(&router);
        self.converters();
        self.kafka();
        self.leftovers(&router);
        let header = "# outbox-relay configuration translated from a Debezium PostgreSQL connector with the\n\
             # outbox event router by `outbox-relay config --from-debezium`. Each key names the Debezium\n\
             # option it comes from (\"Debezium's default\": the option was absent, its default is kept).\n\
             # Keys not written keep outbox-relay's defaults; `outbox-relay config` prints them all.\n\
             # Options with no equivalent were listed on stderr. Check it: `outbox-relay check`.\n";
        Ok(Converted {
            toml: self.out.render(header),
            unmapped: self.unmapped,
        })
    }

    /// The alias of the outbox router among `transforms`; marks `transforms` and the router's
    /// `type` used. Other transformations are left, with their options.
    fn router(&mut self) -> Result<String, DebeziumError> {
        let aliases: Vec<String> = self
            .take("transforms")
            .unwrap_or_default()
            .split(',')
            .map(|a| a.trim().to_string())
            .filter(|a| !a.is_empty())
            .collect();
        let router = aliases
            .iter()
            .find(|alias| {
                self.by_key
                    .get(&format!("transforms.{alias}.type"))
                    .is_some_and(|t| t.trim() == EVENT_ROUTER)
            })
            .cloned()
            .ok_or(DebeziumError::NoOutboxRouter)?;
        self.take(&format!("transforms.{router}.type"));
        for alias in aliases.iter().filter(|a| **a != router) {
            let prefix = format!("transforms.{alias}.");
            let keys: Vec<String> = self
                .options
                .iter()
                .map(|(k, _)| k.clone())
                .filter(|k| k.starts_with(&prefix))
                .collect();
            for key in keys {
                self.leave(
                    &key,
                    format!("transformation `{alias}` is not the outbox router: only the router is translated; the relay runs no other transformation"),
                );
            }
        }
        Ok(router)
    }

    /// `database.*` → `postgres.url`, TLS and keepalives.
    fn connection(&mut self) {
        self.connection_url();
        self.password();
        self.tls();
        self.keepalives_and_status();
    }

    /// `database.hostname`, `port`, `user` and `dbname` → `postgres.url`, with libpq's defaults
    /// for the parts left out; written only if at least one of them is given.
    fn connection_url(&mut self) {
        let host = self.take("database.hostname");
        let port = self.take("database.port");
        let user = self.take("database.user");
        let dbname = self.take("database.dbname");
        if host.is_none() && user.is_none() && dbname.is_none() {
            return;
        }
        let mut from = vec![];
        for (key, present) in [
            ("database.hostname", host.is_some()),
            ("database.port", port.is_some()),
            ("database.user", user.is_some()),
            ("database.dbname", dbname.is_some()),
        ] {
            if present {
                from.push(key);
            }
        }
        let url = format!(
            "postgres://{}@{}:{}/{}",
            percent_encode(user.as_deref().unwrap_or("postgres")),
            host.as_deref().unwrap_or("localhost"),
            port.as_deref().unwrap_or("5432"),
            percent_encode(dbname.as_deref().unwrap_or("postgres")),
        );
        self.out.set(
            "postgres",
            "url",
            url,
            &format!(
                "{} (without the password: see password_file)",
                from.join(", ")
            ),
        );
    }

    /// `database.password` is never copied: a secret does not belong in a config file, so the
    /// output says where to put it instead.
    fn password(&mut self) {
        if !self.by_key.contains_key("database.password") {
            return;
        }
        self.take("database.password");
        self.out.note(
            "postgres",
            "database.password: not copied (a secret in a config file). Write it to a file and set",
        );
        self.out.note(
            "postgres",
            "password_file = \"/run/secrets/postgres-password\"",
        );
        self.leave(
            "database.password",
            "not copied into the output: write the password to a file and set postgres.password_file (or PGPASSWORD)",
        );
    }

    /// `database.sslmode` and `sslrootcert` → `postgres.ssl_mode` and `ssl_root_cert`; client
    /// certificates have no equivalent (the relay logs in with a password or AWS IAM).
    fn tls(&mut self) {
        if let Some(mode) = self.take("database.sslmode") {
            let mode = mode.to_ascii_lowercase();
            if ["disable", "prefer", "require", "verify-ca", "verify-full"].contains(&mode.as_str())
            {
                self.out
                    .set("postgres", "ssl_mode", mode, "database.sslmode");
            } else {
                self.leave(
                    "database.sslmode",
                    format!("`{mode}` is none of disable, prefer, require, verify-ca, verify-full"),
                );
            }
        }
        if let Some(root) = self.take("database.sslrootcert") {
            self.out
                .set("postgres", "ssl_root_cert", root, "database.sslrootcert");
        }
        for key in [
            "database.sslcert",
            "database.sslkey",
            "database.sslpassword",
            "database.sslfactory",
        ] {
            if self.by_key.contains_key(key) {
                self.leave(key, "client certificate login is not translated: the relay logs in with a password or AWS IAM (postgres.auth)");
            }
        }
    }

    /// `database.tcpKeepAlive` (the relay's keepalives are always on) and
    /// `status.update.interval.ms` → `postgres.status_interval_ms`.
    fn keepalives_and_status(&mut self) {
        if let Some(keepalive) = self.take("database.tcpKeepAlive") {
            if keepalive.eq_ignore_ascii_case("true") {
                self.out.note(
                    "postgres",
                    "database.tcpKeepAlive = true: keepalives are on by default (postgres.keepalives_*)",
                );
            } else {
                self.leave(
                    "database.tcpKeepAlive",
                    "the relay always sets TCP keepalives (postgres.keepalives_idle_ms and the like); a dead peer would otherwise go unnoticed for minutes",
                );
            }
        }
        if let Some(ms) = self.take("status.update.interval.ms") {
            match ms.parse::<u64>() {
                Ok(ms) => self.out.set(
                    "postgres",
                    "status_interval_ms",
                    ms as i64,
                    "status.update.interval.ms",
                ),
                Err(_) => self.leave(
                    "status.update.interval.ms",
                    format!("`{ms}` is not a number of milliseconds"),
                ),
            }
        }
    }

    /// `slot.name`, `publication.name` and how they are made.
    fn slot_and_publication(&mut self) {
        self.plugin();
        // Debezium's publication can be the relay's only if it names the outbox tables alone:
        // an insert into any other published table stops the relay. `filtered` made it so,
        // `disabled` means someone made it (`outbox-relay check` says whether it fits); the
        // default `all_tables` publishes every table.
        let mode = self.take("publication.autocreate.mode");
        let mode_text = match &mode {
            Some(mode) => format!("publication.autocreate.mode = {mode}"),
            None => {
                "publication.autocreate.mode absent (Debezium's default all_tables)".to_string()
            }
        };
        if matches!(mode.as_deref(), Some("filtered" | "disabled")) {
            self.reuse_debezium_slot(mode.as_deref() == Some("filtered"), &mode_text);
        } else {
            self.own_slot_and_publication(mode.as_deref(), &mode_text);
        }
        self.slot_lifecycle();
    }

    /// `plugin.name`: the relay decodes pgoutput only, so only a pgoutput slot can be reused.
    fn plugin(&mut self) {
        match self.take("plugin.name").as_deref() {
            Some("pgoutput") => self.out.note(
                "postgres",
                "plugin.name = pgoutput: the relay always decodes pgoutput",
            ),
            Some(other) => {
                let other = other.to_string();
                self.leave(
                    "plugin.name",
                    format!("`{other}`: the relay decodes pgoutput only; its slot must be a new pgoutput slot (give postgres.slot another name)"),
                );
            }
            None => self.out.note(
                "postgres",
                "plugin.name absent: the slot must be a pgoutput slot to be reused (a decoderbufs slot needs a new postgres.slot)",
            ),
        }
    }

    /// Debezium's publication names the outbox tables: the relay takes over its slot and
    /// publication and continues from the position Debezium confirmed. `create` is whether
    /// Debezium created the publication (`filtered`), so the relay may too.
    fn reuse_debezium_slot(&mut self, create: bool, mode_text: &str) {
        match self.take("slot.name") {
            Some(slot) => self.out.set("postgres", "slot", slot, "slot.name: the relay continues from the position Debezium confirmed (stop Debezium first)"),
            None => self.out.set("postgres", "slot", "debezium", "slot.name (Debezium's default): the relay continues from the position Debezium confirmed (stop Debezium first)"),
        }
        match self.take("publication.name") {
            Some(name) => self
                .out
                .set("postgres", "publication", name, "publication.name"),
            None => self.out.set(
                "postgres",
                "publication",
                "dbz_publication",
                "publication.name (Debezium's default)",
            ),
        }
        self.out.set(
            "postgres",
            "create_publication",
            create,
            &format!("{mode_text}: the publication names the outbox tables; `outbox-relay check` prints the ALTER PUBLICATION that makes it publish inserts only"),
        );
    }

    /// Debezium's publication publishes every table (or an unknown `mode`): the relay gets a
    /// slot and a publication of its own, and Debezium's names are left with the reason.
    fn own_slot_and_publication(&mut self, mode: Option<&str>, mode_text: &str) {
        let why = format!("{mode_text}: Debezium's publication publishes every table, and an insert into a table that is not an outbox stops the relay: it gets a slot and a publication of its own (postgres.slot, postgres.publication, created at start); create the slot before stopping Debezium so that nothing falls in between (see the guide: moving from Debezium)");
        for key in ["slot.name", "publication.name"] {
            if self.by_key.contains_key(key) {
                self.leave(key, why.clone());
            }
        }
        if let Some(other) = mode.filter(|m| !["all_tables", "no_tables"].contains(m)) {
            self.leave(
                "publication.autocreate.mode",
                format!("`{other}` is none of all_tables, disabled, filtered, no_tables"),
            );
        }
        self.out.note("postgres", &why);
        self.out.set(
            "postgres",
            "slot",
            "outbox_relay",
            "a slot of the relay's own: `outbox-relay slot create` while Debezium still runs",
        );
        self.out.set("postgres", "publication", "outbox_relay_pub", "a publication of the relay's own: FOR TABLE <the outbox tables> WITH (publish = 'insert')");
        self.out.set(
            "postgres",
            "create_publication",
            true,
            "created by `outbox-relay slot create` or at start",
        );
    }

    /// `slot.drop.on.stop`, `slot.failover` and `snapshot.mode`: the slot's life around the
    /// relay, which never drops it and never snapshots.
    fn slot_lifecycle(&mut self) {
        if let Some(drop) = self.take("slot.drop.on.stop") {
            if drop.eq_ignore_ascii_case("true") {
                self.leave("slot.drop.on.stop", "the relay never drops its slot: events committed while no slot exists are never relayed (`outbox-relay slot drop` does it on purpose)");
            } else {
                self.out.note(
                    "postgres",
                    "slot.drop.on.stop = false: the relay never drops its slot",
                );
            }
        }
        if let Some(failover) = self.take("slot.failover") {
            let value = if failover.eq_ignore_ascii_case("true") {
                "true"
            } else {
                "false"
            };
            self.out
                .set("postgres", "failover_slot", value, "slot.failover");
        }
        if let Some(mode) = self.take("snapshot.mode") {
            match mode.as_str() {
                "never" | "no_data" => self.out.note(
                    "postgres",
                    &format!("snapshot.mode = {mode}: the relay never snapshots; it streams what is committed after its slot was created"),
                ),
                other => {
                    let other = other.to_string();
                    self.leave(
                        "snapshot.mode",
                        format!("`{other}`: the relay takes no snapshot; rows committed before the slot existed are re-published with `outbox-relay replay`"),
                    );
                }
            }
        }
    }

    /// `table.include.list` (and the old `table.whitelist`) → `outbox.table` and
    /// `[[outbox.tables]]`; `schema.include.list` when it agrees.
    fn tables(&mut self) {
        let key = if self.by_key.contains_key("table.include.list") {
            "table.include.list"
        } else {
            "table.whitelist"
        };
        let mut tables = Vec::new();
        if let Some(list) = self.take(key) {
            for entry in list.split(',').map(str::trim).filter(|e| !e.is_empty()) {
                let name = entry.replace("\\.", ".");
                if name.contains(|c: char| "*+?[](){}|^$\\".contains(c)) {
                    self.unmapped.push(Unmapped {
                        key: key.to_string(),
                        reason: format!("`{entry}` is a regular expression: name each outbox table (`schema.table`) in outbox.table or [[outbox.tables]]"),
                    });
                } else {
                    tables.push(name);
                }
            }
        }
        match tables.split_first() {
            Some((first, rest)) => {
                self.out.set("outbox", "table", first.clone(), key);
                for (n, table) in rest.iter().enumerate() {
                    self.out.set(&format!("[[outbox.tables]]#{n}"), "table", table.clone(), &format!("{key}: one more outbox table, with [outbox]'s mapping"));
                }
            }
            None => self.out.note(
                "outbox",
                "no table.include.list: the relay reads only its outbox table (default public.outbox): set outbox.table",
            ),
        }
        for key in ["schema.include.list", "schema.whitelist"] {
            let Some(list) = self.take(key) else { continue };
            let schemas: Vec<&str> = list.split(',').map(str::trim).collect();
            let covered = !tables.is_empty()
                && tables.iter().all(|t| {
                    let schema = t.split_once('.').map_or("public", |(s, _)| s);
                    schemas.contains(&schema)
                });
            if covered {
                self.out.note(
                    "outbox",
                    &format!("{key} = {list}: covers the outbox tables"),
                );
            } else {
                self.leave(key, "the relay reads the outbox tables it is given, not schemas: name them in outbox.table or [[outbox.tables]]");
            }
        }
    }

    /// The router's options (`transforms.<router>.*`) → `[outbox]`, in the order the TOML
    /// reads: the columns, the topic, the header and partition placements, what the relay does
    /// anyway, and what it cannot say.
    fn routing(&mut self, router: &str) {
        self.router_columns(router);
        self.router_topic(router);
        self.router_placements(router);
        self.router_payload_and_tracing(router);
        for (name, reason) in ROUTER_NO_EQUIVALENT {
            let key = router_option(router, name);
            if self.by_key.contains_key(&key) {
                self.leave(&key, *reason);
            }
        }
    }

    /// The columns a record is made of: id, key, type, payload, aggregate id, timestamp and the
    /// column routed by.
    fn router_columns(&mut self, router: &str) {
        self.router_column(router, "table.field.event.id", "id_column", Some("id"));
        // The router's key (default: the aggregate id) is the record key, and Kafka's producer
        // partitions by it: both are kept.
        self.router_column(
            router,
            "table.field.event.key",
            "key_column",
            Some("aggregateid"),
        );
        self.router_column(router, "table.field.event.type", "type_column", None);
        let payload_key = if self
            .by_key
            .contains_key(&router_option(router, "table.field.event.payload"))
        {
            "table.field.event.payload"
        } else {
            "table.field.payload"
        };
        self.router_column(router, payload_key, "payload_column", None);
        for old in ["table.field.event.payload.id", "table.field.payload.id"] {
            self.router_column(router, old, "aggregate_id_column", None);
        }
        self.router_column(
            router,
            "table.field.event.timestamp",
            "timestamp_column",
            None,
        );
        let by = router_option(router, "route.by.field");
        match self.take(&by) {
            Some(field) => self.out.set(
                "outbox",
                "aggregate_type_column",
                field,
                &format!("{by}: the column routed by, `{{aggregatetype}}` in the topic (and header `aggregatetype`)"),
            ),
            None => self.out.note(
                "outbox",
                &format!("{by} absent: Debezium's default aggregatetype is outbox.aggregate_type_column's"),
            ),
        }
    }

    /// One router column option → `[outbox] toml_key`; an absent option with a Debezium default
    /// writes the default, so that records keep what Debezium put in them.
    fn router_column(&mut self, router: &str, name: &str, toml_key: &str, default: Option<&str>) {
        let key = router_option(router, name);
        match (self.take(&key), default) {
            (Some(value), _) => self.out.set("outbox", toml_key, value, &key),
            (None, Some(default)) => self.out.set(
                "outbox",
                toml_key,
                default,
                &format!("{key} (Debezium's default)"),
            ),
            (None, None) => {}
        }
    }

    /// `route.topic.regex` and `route.topic.replacement` → `outbox.topic`: only the default
    /// regex (the whole routing value) has an equivalent, the relay's `{aggregatetype}`.
    fn router_topic(&mut self, router: &str) {
        let regex_key = router_option(router, "route.topic.regex");
        let regex = self.take(&regex_key);
        let replacement_key = router_option(router, "route.topic.replacement");
        let replacement = self.take(&replacement_key);
        let default_regex = regex.as_deref().is_none_or(|r| r == "(?<routedByValue>.*)");
        if !default_regex {
            self.leave(
                &regex_key,
                "a regular expression over the routing value: the relay's topic template inserts whole values; use outbox.topic_overrides (per aggregate type) or outbox.topic_column",
            );
            if replacement.is_some() {
                self.leave(
                    &replacement_key,
                    "goes with route.topic.regex, which is not translated",
                );
            }
            return;
        }
        let (template, from) = match &replacement {
            Some(r) => (r.clone(), replacement_key.clone()),
            None => (
                "outbox.event.${routedByValue}".to_string(),
                format!("{replacement_key} (Debezium's default)"),
            ),
        };
        let topic = template.replace("${routedByValue}", "{aggregatetype}");
        if topic.contains('$') {
            self.leave(
                &replacement_key,
                format!("`{template}` refers to a regex group other than routedByValue"),
            );
        } else {
            self.out.set(
                "outbox",
                "topic",
                topic,
                &format!("{from}: ${{routedByValue}} is {{aggregatetype}}"),
            );
        }
    }

    /// `table.fields.additional.placement` → `outbox.header_columns` and `outbox.partition_by`.
    /// Without a partition placement the records are partitioned by key, as Kafka Connect's
    /// producer does.
    fn router_placements(&mut self, router: &str) {
        let placement_key = router_option(router, "table.fields.additional.placement");
        let mut partition = None;
        if let Some(list) = self.take(&placement_key) {
            let fixed = self.fixed_headers(router);
            let mut headers = toml::value::Table::new();
            for item in list.split(',').map(str::trim).filter(|i| !i.is_empty()) {
                let parts: Vec<&str> = item.split(':').map(str::trim).collect();
                match parts.as_slice() {
                    [column, "header"] | [column, "header", _] => {
                        let alias = parts.get(2).copied().unwrap_or(column);
                        if fixed.iter().any(|(c, h)| c == column && h == &alias) {
                            self.out.note(
                                "outbox",
                                &format!("{placement_key}: `{item}` is a header the relay always sends"),
                            );
                        } else {
                            headers.insert(column.to_string(), toml::Value::String(alias.to_string()));
                        }
                    }
                    [column, "partition"] | [column, "partition", _] => {
                        partition = Some(column.to_string());
                    }
                    [_, "envelope"] | [_, "envelope", _] => self.unmapped.push(Unmapped {
                        key: placement_key.clone(),
                        reason: format!("`{item}`: the relay's envelope (outbox.format = \"envelope\") has fixed members (id, aggregatetype, aggregateid, type, timestamp, payload); send the column as a header, or put it in the payload"),
                    }),
                    _ => self.unmapped.push(Unmapped {
                        key: placement_key.clone(),
                        reason: format!("`{item}` is not column:placement[:alias] with placement header, envelope or partition"),
                    }),
                }
            }
            if !headers.is_empty() {
                self.out.set(
                    "outbox",
                    "header_columns",
                    toml::Value::Table(headers),
                    &format!("{placement_key} (header placements: column = header name)"),
                );
            }
        }
        match partition {
            Some(column) => self.out.set(
                "outbox",
                "partition_by",
                column,
                &format!("{placement_key} (partition placement)"),
            ),
            None => self.out.set(
                "outbox",
                "partition_by",
                "key",
                "Kafka Connect's producer partitions by the router's key (murmur2), and so does this",
            ),
        }
    }

    /// The headers the relay always sends, by the column they come from: a header placement
    /// that repeats one of them needs no `header_columns` entry.
    fn fixed_headers(&self, router: &str) -> Vec<(String, &'static str)> {
        [
            (vec!["table.field.event.id"], "id", "id"),
            (vec!["table.field.event.type"], "type", "type"),
            (vec!["route.by.field"], "aggregatetype", "aggregatetype"),
            (
                vec!["table.field.event.payload.id", "table.field.payload.id"],
                "aggregateid",
                "aggregateid",
            ),
        ]
        .into_iter()
        .map(|(names, default, header)| {
            let column = names
                .iter()
                .find_map(|name| self.by_key.get(&router_option(router, name)))
                .map_or(default.to_string(), |c| c.trim().to_string());
            (column, header)
        })
        .collect()
    }

    /// The router's options on missing columns, null and JSON payloads, updates and tracing:
    /// most are what the relay does anyway (a note), two change what it writes.
    fn router_payload_and_tracing(&mut self, router: &str) {
        let strict_key = router_option(router, "table.fields.additional.error.on.missing");
        if let Some(strict) = self.take(&strict_key) {
            if strict.eq_ignore_ascii_case("false") {
                self.leave(&strict_key, "the relay checks every mapped column when it binds a table: a missing one is an error it names");
            } else {
                self.out.note(
                    "outbox",
                    &format!("{strict_key} = true: a missing mapped column is always an error"),
                );
            }
        }
        let tombstone_key = router_option(router, "route.tombstone.on.empty.payload");
        match self.take(&tombstone_key) {
            Some(v) if v.eq_ignore_ascii_case("true") => {
                self.out
                    .set("outbox", "null_payload", "tombstone", &tombstone_key)
            }
            Some(_) => self.out.note(
                "outbox",
                &format!("{tombstone_key} = false: a null payload is a mapping error (dead_letter.policy); null_payload = \"tombstone\" sends a null value instead"),
            ),
            None => {}
        }
        let expand_key = router_option(router, "table.expand.json.payload");
        if let Some(expand) = self.take(&expand_key) {
            self.out.note(
                "outbox",
                &format!("{expand_key} = {expand}: a json/jsonb payload is always sent as its JSON text, never as an escaped string"),
            );
        }
        let null_key = router_option(router, "table.json.payload.null.behavior");
        if let Some(behavior) = self.take(&null_key) {
            self.out.note(
                "outbox",
                &format!(
                    "{null_key} = {behavior}: JSON nulls inside the payload are sent as they are"
                ),
            );
        }
        for name in ["table.op.invalid.behavior", "debezium.op.invalid.behavior"] {
            let key = router_option(router, name);
            if let Some(behavior) = self.take(&key) {
                self.out.note(
                    "outbox",
                    &format!("{key} = {behavior}: updates never reach the relay (the publication publishes inserts only)"),
                );
            }
        }
        let tracing_key = router_option(router, "tracing.span.context.field");
        if let Some(field) = self.take(&tracing_key) {
            self.out.set(
                "outbox",
                "tracing_column",
                field,
                &format!("{tracing_key}: its key=value lines become headers, as Debezium propagates them"),
            );
        }
    }

    /// `key.converter` and `value.converter`: what the relay writes is the column's text or
    /// bytes, which is what the string, byte-array and binary-data converters write too.
    fn converters(&mut self) {
        for side in ["key", "value"] {
            let key = format!("{side}.converter");
            let Some(class) = self.take(&key) else {
                continue;
            };
            let plain = [
                "org.apache.kafka.connect.storage.StringConverter",
                "org.apache.kafka.connect.converters.ByteArrayConverter",
                "io.debezium.converters.BinaryDataConverter",
                "io.debezium.converters.ByteBufferConverter",
            ];
            let prefix = format!("{key}.");
            let settings: Vec<String> = self
                .options
                .iter()
                .map(|(k, _)| k.clone())
                .filter(|k| k.starts_with(&prefix))
                .collect();
            if plain.contains(&class.as_str()) {
                self.out.note(
                    "outbox",
                    &format!("{key} = {class}: the relay writes the {side} as its text or bytes, as this converter does"),
                );
                for setting in settings {
                    self.take(&setting);
                    self.out
                        .note("outbox", &format!("{setting}: goes with {key}"));
                }
            } else {
                self.leave(
                    &key,
                    format!("`{class}`: the relay writes the {side} as its text or bytes, not wrapped by a Kafka Connect converter (JSON quoting, a schema envelope, Connect's Avro of the row); for a Schema Registry see [outbox.serialization]"),
                );
                for setting in settings {
                    self.leave(
                        &setting,
                        format!("goes with {key}, which is not translated"),
                    );
                }
            }
        }
        if let Some(extended) = self.take("extended.headers.enabled") {
            if extended.eq_ignore_ascii_case("false") {
                self.out.note("outbox", "extended.headers.enabled = false: the relay sends no __debezium.context.* headers");
            } else {
                self.leave("extended.headers.enabled", "the relay sends no __debezium.context.* headers; its headers are id, type, aggregatetype, aggregateid and header_columns");
            }
        }
        if let Some(tombstones) = self.take("tombstones.on.delete") {
            self.out.note(
                "outbox",
                &format!("tombstones.on.delete = {tombstones}: deletes are never published (publish = 'insert')"),
            );
        }
    }

    /// `name` and `bootstrap.servers` (the embedded engine's; Kafka Connect's workers hold it
    /// outside the connector) → `[kafka]`.
    fn kafka(&mut self) {
        match self.take("bootstrap.servers") {
            Some(brokers) => self.out.set("kafka", "brokers", brokers, "bootstrap.servers"),
            None => self.out.note(
                "kafka",
                "brokers: Kafka Connect's worker holds bootstrap.servers, not the connector: set kafka.brokers",
            ),
        }
        if let Some(name) = self.take("name") {
            if !name.is_empty() && name.bytes().all(|b| b.is_ascii_graphic()) {
                self.out
                    .set("kafka", "client_id", name, "name (the connector's name)");
            } else {
                self.leave("name", "not usable as a Kafka client id");
            }
        }
    }

    /// Every option not used yet: a known one with its reason, any other as unknown.
    fn leftovers(&mut self, router: &str) {
        let router_prefix = format!("transforms.{router}.");
        let keys: Vec<String> = self
            .options
            .iter()
            .map(|(k, _)| k.clone())
            .filter(|k| !self.used.contains(k))
            .collect();
        for key in keys {
            if self.used.contains(&key) {
                continue; // the same key twice in a properties file
            }
            let reason = if key.starts_with(&router_prefix) {
                "not an option of the outbox event router that outbox-relay knows".to_string()
            } else if let Some((_, reason)) = NO_EQUIVALENT.iter().find(|(known, _)| {
                key == *known || (known.ends_with('.') && key.starts_with(known))
            }) {
                reason.to_string()
            } else {
                "no equivalent in outbox-relay".to_string()
            };
            self.leave(&key, reason);
        }
    }
}

/// The key of the router's option `name`: `transforms.<router>.<name>`.
fn router_option(router: &str, name: &str) -> String {
    format!("transforms.{router}.{name}")
}

/// A URL's user or database name with everything outside RFC 3986's unreserved set escaped.
fn percent_encode(text: &str) -> String {
    let mut out = String::new();
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests;
