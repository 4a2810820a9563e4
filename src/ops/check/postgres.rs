//! The PostgreSQL items of `check`: server settings, role, outbox table, slot; the publication's
//! are in [`super::publication`].

use std::collections::HashMap;
use std::time::Duration;

use super::{ok, problem, warning, Item};
use crate::config::{Config, OutboxConfig, PARTITION_BY_AGGREGATE_ID, PARTITION_BY_KEY};
use crate::mapping::OutboxMapping;
use crate::ops::format::{self, quote_literal};
use crate::ops::rows::{created_at_column, OutboxTable, TableColumn};
use crate::ops::OpsError;
use crate::postgres::control::{describe, query_err, quote_ident, Control, SlotInfo};
use crate::relay::sweeper::hold::{HoldStore, HOLD_TABLE};
use crate::source::walsender::check_receive_timeout;

/// What the server is and who we are on it, read once.
struct Server {
    settings: HashMap<String, String>,
    role: String,
    superuser: bool,
    replication: bool,
    /// Amazon RDS / Aurora (which has the role `rds_replication`): whether we are a member.
    /// There the right to stream comes from that membership; `ALTER ROLE … REPLICATION` is
    /// refused.
    rds_replication: Option<bool>,
    database: String,
    version: String,
    slots_used: i64,
    senders_used: i64,
}

impl Server {
    async fn read(control: &Control) -> Result<Server, OpsError> {
        let client = control.client();
        let settings = client
            .query(
                "SELECT name, setting FROM pg_settings WHERE name = ANY($1)",
                &[&vec![
                    "wal_level",
                    "max_replication_slots",
                    "max_wal_senders",
                    "max_slot_wal_keep_size",
                    "server_version",
                    "DateStyle",
                    "TimeZone",
                    "wal_sender_timeout",
                    // Managed services' switch for wal_level = logical.
                    "rds.logical_replication",
                    "cloudsql.logical_decoding",
                    "azure.replication_support",
                ]],
            )
            .await
            .map_err(query_err("reading pg_settings"))?
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        let row = client
            .query_one(
                "SELECT current_user::text, r.rolsuper, r.rolreplication, current_database()::text,
                        (SELECT count(*) FROM pg_replication_slots),
                        (SELECT count(*) FROM pg_stat_replication),
                        (SELECT pg_has_role(current_user, oid, 'MEMBER') FROM pg_roles
                          WHERE rolname = 'rds_replication')
                 FROM pg_roles r WHERE r.rolname = current_user",
                &[],
            )
            .await
            .map_err(query_err("reading the role and replication usage"))?;
        let mut server = Server {
            settings,
            role: row.get(0),
            superuser: row.get(1),
            replication: row.get(2),
            database: row.get(3),
            version: String::new(),
            slots_used: row.get(4),
            senders_used: row.get(5),
            rds_replication: row.get(6),
        };
        server.version = server.setting("server_version").to_string();
        Ok(server)
    }

    fn setting(&self, name: &str) -> &str {
        self.settings.get(name).map_or("", String::as_str)
    }

    fn number(&self, name: &str) -> i64 {
        self.setting(name).parse().unwrap_or(0)
    }
}

/// Every PostgreSQL item, in the order an operator fixes them. Returns the outbox tables that
/// exist, described for the topic sample.
pub(super) async fn postgres(
    control: &Control,
    config: &Config,
    items: &mut Vec<Item>,
) -> Vec<OutboxTable> {
    match super::failover::version(control.server()) {
        Ok(item) => items.push(item),
        Err(refused) => {
            items.push(refused);
            return Vec::new();
        }
    }
    let server = match Server::read(control).await {
        Ok(server) => server,
        Err(e) => {
            items.push(problem(
                "postgres",
                format!("cannot inspect the server: {e}"),
                "connect as a role that can read pg_settings and pg_roles",
            ));
            return Vec::new();
        }
    };
    items.push(ok(
        "postgres connection",
        format!(
            "connected to database \"{}\" as role \"{}\" (PostgreSQL {})",
            server.database, server.role, server.version
        ),
    ));
    items.push(wal_level(&server));
    items.push(date_style(&server, config));
    let slot = control.slot(&config.postgres.slot).await;
    let slot = match slot {
        Ok(slot) => slot,
        Err(e) => {
            items.push(problem(
                "slot",
                format!("cannot read pg_replication_slots: {e}"),
                "grant the role access to pg_replication_slots",
            ));
            None
        }
    };
    items.push(slot_capacity(&server, slot.is_some()));
    let streaming = slot.as_ref().is_some_and(|s| s.active);
    items.push(sender_capacity(&server, streaming));
    items.push(role(&server));
    items.push(receive_timeout(&server, config.postgres.receive_timeout_ms));
    let tables = outbox_tables(control, config, &server, items).await;
    items.extend(super::publication::publication(control, config).await);
    items.extend(slot_items(config, slot.as_ref(), &server));
    items.extend(sweeper_holds(control, config).await);
    items.extend(super::failover::failover(control, config, slot.as_ref()).await);
    tables
}

fn wal_level(server: &Server) -> Item {
    let level = server.setting("wal_level");
    if level == "logical" {
        return ok("wal_level", "wal_level = logical");
    }
    problem(
        "wal_level",
        format!("wal_level = {level}: logical decoding is off, so no logical slot can be created or streamed"),
        wal_level_fix(server),
    )
}

/// How wal_level becomes logical here: each managed service has its own switch.
fn wal_level_fix(server: &Server) -> &'static str {
    let has = |name: &str| server.settings.contains_key(name);
    if has("rds.logical_replication") {
        "Amazon RDS / Aurora: set rds.logical_replication = 1 in the DB (cluster) parameter group, then reboot the instance"
    } else if has("cloudsql.logical_decoding") {
        "Cloud SQL: set the database flag cloudsql.logical_decoding = on (the instance restarts)"
    } else if has("azure.replication_support") {
        "Azure Database for PostgreSQL: set the server parameter azure.replication_support = logical (and wal_level = logical where offered), then restart the server"
    } else {
        "ALTER SYSTEM SET wal_level = 'logical'; then restart PostgreSQL (on a managed service: its parameter for it, e.g. rds.logical_replication = 1 on RDS)"
    }
}

/// pgoutput prints timestamps in the walsender's DateStyle, which neither the relay nor this
/// connection sets: both get the server's (or the database's, or the role's) default. The
/// relay reads `timestamp_column` values in the ISO style only.
fn date_style(server: &Server, config: &Config) -> Item {
    let style = server.setting("DateStyle");
    let zone = server.setting("TimeZone");
    let detail = format!("DateStyle = {style}, TimeZone = {zone}");
    if style.trim_start().to_ascii_uppercase().starts_with("ISO") {
        return ok(
            "DateStyle",
            format!("{detail}: timestamps arrive in ISO form"),
        );
    }
    let order = style.split_once(',').map_or("MDY", |(_, o)| o.trim());
    let fix = format!(
        "ALTER DATABASE {} SET DateStyle = 'ISO, {order}'; then restart the relay",
        quote_ident(&server.database)
    );
    let detail = format!("{detail}: pgoutput sends date and time values in this style, not ISO");
    let timestamps = config
        .outbox
        .table_configs()
        .iter()
        .any(|t| t.timestamp_column.is_some());
    if timestamps {
        problem(
            "DateStyle",
            format!("{detail}, and the relay reads timestamp_column values only in the ISO style"),
            fix,
        )
    } else {
        warning("DateStyle", detail, fix)
    }
}

fn slot_capacity(server: &Server, slot_exists: bool) -> Item {
    let max = server.number("max_replication_slots");
    let free = max - server.slots_used;
    let detail = format!(
        "{} of max_replication_slots = {max} in use, {free} free",
        server.slots_used
    );
    if slot_exists || free > 0 {
        return ok("replication slots", detail);
    }
    problem(
        "replication slots",
        format!("{detail}: the relay's slot cannot be created"),
        format!(
            "ALTER SYSTEM SET max_replication_slots = {}; then restart PostgreSQL (or drop an unused slot: SELECT pg_drop_replication_slot('<name>');)",
            max + 1
        ),
    )
}

fn sender_capacity(server: &Server, streaming: bool) -> Item {
    let max = server.number("max_wal_senders");
    let free = max - server.senders_used;
    let detail = format!(
        "{} of max_wal_senders = {max} in use, {free} free",
        server.senders_used
    );
    // A relay already streaming holds its sender; otherwise the relay needs one free.
    if streaming || free > 0 {
        return ok("wal senders", detail);
    }
    problem(
        "wal senders",
        format!("{detail}: the relay cannot open its replication connection"),
        format!(
            "ALTER SYSTEM SET max_wal_senders = {}; then restart PostgreSQL",
            max + 1
        ),
    )
}

/// One warning per sweeper hold on the slot: rows the sweeper keeps until a replay covers
/// them (see `relay::sweeper::hold`).
async fn sweeper_holds(control: &Control, config: &Config) -> Vec<Item> {
    let store = HoldStore::new(config);
    let holds = match store.list(control.client()).await {
        Ok(holds) => holds,
        Err(e) => {
            return vec![warning(
                "sweeper hold",
                format!("cannot read the sweeper holds: {e}"),
                "grant the role SELECT on outbox_relay_sweeper_hold",
            )]
        }
    };
    holds
        .iter()
        .map(|h| {
            warning(
                "sweeper hold",
                format!(
                    "the sweeper keeps the rows of {} committed before slot `{}` was created ({}, {})",
                    h.table, h.slot, h.armed_at, h.reason
                ),
                format!(
                    "`outbox-relay replay --since <start of the gap>` (no id or type filter) releases it; or, if the gap needs no replay, DELETE FROM {} WHERE slot = {}",
                    store.relation().unwrap_or(HOLD_TABLE),
                    quote_literal(&h.slot)
                ),
            )
        })
        .collect()
}

/// An explicit `postgres.receive_timeout_ms` the server's `wal_sender_timeout` allows (the
/// relay refuses to connect otherwise; see [`check_receive_timeout`]).
fn receive_timeout(server: &Server, configured_ms: u64) -> Item {
    let check = "receive_timeout";
    let wal_sender_timeout =
        Duration::from_millis(server.number("wal_sender_timeout").max(0) as u64);
    match check_receive_timeout(configured_ms, wal_sender_timeout) {
        Err(too_low) => problem(
            check,
            too_low.to_string(),
            format!(
                "set postgres.receive_timeout_ms = 0 (derived) or at least {}",
                too_low.minimum_ms
            ),
        ),
        Ok(()) if configured_ms == 0 => ok(
            check,
            format!(
                "postgres.receive_timeout_ms = 0: derived from wal_sender_timeout = {} ms",
                wal_sender_timeout.as_millis()
            ),
        ),
        Ok(()) => ok(
            check,
            format!(
                "postgres.receive_timeout_ms = {configured_ms} outlasts half of wal_sender_timeout = {} ms",
                wal_sender_timeout.as_millis()
            ),
        ),
    }
}

fn role(server: &Server) -> Item {
    let role = &server.role;
    if server.superuser {
        return ok("role", format!("role \"{role}\" is a superuser"));
    }
    if server.replication {
        return ok("role", format!("role \"{role}\" has REPLICATION"));
    }
    match server.rds_replication {
        Some(true) => ok(
            "role",
            format!("role \"{role}\" is a member of rds_replication (Amazon RDS / Aurora)"),
        ),
        Some(false) => problem(
            "role",
            format!("role \"{role}\" is not a member of rds_replication: on Amazon RDS / Aurora it cannot stream from a replication slot without it"),
            format!("GRANT rds_replication TO {};", quote_ident(role)),
        ),
        None => problem(
            "role",
            format!("role \"{role}\" has neither REPLICATION nor superuser: it cannot stream from a replication slot"),
            format!("ALTER ROLE {} WITH REPLICATION;", quote_ident(role)),
        ),
    }
}

/// An outbox table as configured, quoted once (whether or not it exists).
/// A table by name: for SQL and for messages.
pub(super) struct Table {
    pub(super) schema: String,
    pub(super) name: String,
    pub(super) display: String,
    pub(super) quoted: String,
}

impl Table {
    pub(super) fn new((schema, name): (String, String)) -> Table {
        Table {
            display: format!("{schema}.{name}"),
            quoted: format!("{}.{}", quote_ident(&schema), quote_ident(&name)),
            schema,
            name,
        }
    }

    pub(super) fn from_config(config: &OutboxConfig) -> Table {
        Table::new(config.schema_and_table())
    }
}

/// The items of every configured outbox table; returns the tables that exist, for the topic
/// sample.
async fn outbox_tables(
    control: &Control,
    config: &Config,
    server: &Server,
    items: &mut Vec<Item>,
) -> Vec<OutboxTable> {
    let configs = config.outbox.table_configs();
    if configs.is_empty() {
        items.push(ok(
            "outbox table",
            format!(
                "no outbox table: events come from pg_logical_emit_message with prefix `{}`",
                config.outbox.message_prefix.as_deref().unwrap_or_default()
            ),
        ));
    }
    let mut found = Vec::new();
    for table_config in configs {
        let (table_items, table) = outbox_table(control, config, &table_config, server).await;
        items.extend(table_items);
        found.extend(table);
    }
    found
}

async fn outbox_table(
    control: &Control,
    config: &Config,
    table_config: &OutboxConfig,
    server: &Server,
) -> (Vec<Item>, Option<OutboxTable>) {
    let table = Table::from_config(table_config);
    let row = control
        .client()
        .query_opt(
            "SELECT c.relkind::text, has_table_privilege(c.oid, 'SELECT')
             FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = $1 AND c.relname = $2",
            &[&table.schema, &table.name],
        )
        .await;
    let (kind, readable): (String, bool) = match row {
        Ok(Some(row)) => (row.get(0), row.get(1)),
        Ok(None) => {
            let item = problem(
                "outbox table",
                format!("table {} does not exist", table.display),
                "create it (migrations/001_outbox.sql), or set outbox.table (or the [[outbox.tables]] entry's table) to the table's `schema.table`",
            );
            return (vec![item], None);
        }
        Err(e) => {
            let item = problem(
                "outbox table",
                format!("cannot look up {}: {}", table.display, describe(&e)),
                "check the role's access to the catalog",
            );
            return (vec![item], None);
        }
    };
    let mut items = vec![table_access(&table, &kind, readable, server)];
    let publication = &config.postgres.publication;
    match OutboxTable::describe(control.client(), table_config, publication).await {
        Ok(Some(outbox)) => {
            items.push(outbox_columns(config, &outbox, &table));
            (items, Some(outbox))
        }
        Err(e) => {
            items.push(problem(
                "outbox columns",
                format!("cannot read the columns of {}: {e}", table.display),
                "check the role's access to the catalog",
            ));
            (items, None)
        }
        Ok(None) => (items, None),
    }
}

fn table_access(table: &Table, kind: &str, readable: bool, server: &Server) -> Item {
    if !matches!(kind, "r" | "p") {
        return problem(
            "outbox table",
            format!(
                "{} is not a table (relkind {kind}): only tables can be published",
                table.display
            ),
            "point outbox.table at the table the application inserts into",
        );
    }
    if !readable {
        return problem(
            "outbox table",
            format!(
                "role \"{}\" cannot read {} (needed by `status` and `replay`)",
                server.role, table.display
            ),
            format!(
                "GRANT SELECT ON {} TO {};",
                table.quoted,
                quote_ident(&server.role)
            ),
        );
    }
    ok(
        "outbox table",
        format!("{} exists and is readable", table.display),
    )
}

/// Type OIDs the column checks tell apart: the ones whose text the live mapping interprets
/// (`outbox.rs` reads a value by its column's own type OID), and text.
mod oid {
    pub const BYTEA: u32 = 17;
    pub const INT8: u32 = 20;
    pub const INT2: u32 = 21;
    pub const INT4: u32 = 23;
    pub const TEXT: u32 = 25;
    pub const JSON: u32 = 114;
    pub const BPCHAR: u32 = 1042;
    pub const VARCHAR: u32 = 1043;
    pub const TIMESTAMP: u32 = 1114;
    pub const TIMESTAMPTZ: u32 = 1184;
    pub const JSONB: u32 = 3802;
}

/// Every column a table's mapping reads: `(setting, column)`, optional ones when set.
fn configured_columns(o: &OutboxConfig) -> Vec<(String, &str)> {
    let mut columns: Vec<(String, &str)> = [
        ("id_column", Some(&o.id_column)),
        ("aggregate_type_column", Some(&o.aggregate_type_column)),
        ("aggregate_id_column", Some(&o.aggregate_id_column)),
        ("type_column", Some(&o.type_column)),
        ("payload_column", Some(&o.payload_column)),
        ("key_column", o.key_column.as_ref()),
        ("timestamp_column", o.timestamp_column.as_ref()),
        ("headers_column", o.headers_column.as_ref()),
        ("tracing_column", o.tracing_column.as_ref()),
        ("topic_column", o.topic_column.as_ref()),
    ]
    .into_iter()
    .filter_map(|(setting, column)| Some((setting.to_string(), column?.as_str())))
    .filter(|(_, column)| !column.is_empty())
    .collect();
    if ![PARTITION_BY_AGGREGATE_ID, PARTITION_BY_KEY].contains(&o.partition_by.as_str()) {
        columns.push(("partition_by".into(), o.partition_by.as_str()));
    }
    for column in o.header_columns.keys() {
        columns.push((format!("header_columns.{column}"), column.as_str()));
    }
    columns
}

/// What a column's type means for the setting that maps it.
enum Fit {
    Usable,
    /// Works for the right values only: why.
    Depends(String),
    /// Can never work: why, and a type that would.
    Unusable(String, &'static str),
}

fn type_fit(setting: &str, column: &TableColumn) -> Fit {
    let c = &column.name;
    let t = &column.type_name;
    let text_like = |oid: u32| matches!(oid, oid::TEXT | oid::VARCHAR | oid::BPCHAR);
    match setting {
        // Read by the column's own type: a domain over bigint is text to the relay.
        "timestamp_column" => match (column.type_oid, column.base_type_oid) {
            (oid::TIMESTAMPTZ | oid::TIMESTAMP | oid::INT2 | oid::INT4 | oid::INT8, _) => {
                Fit::Usable
            }
            // A domain over a timestamp prints as one.
            (_, oid::TIMESTAMPTZ | oid::TIMESTAMP) => Fit::Usable,
            (_, base) if text_like(base) => Fit::Depends(format!(
                "`{c}` is {t}: its values must be ISO timestamps, or the event is a mapping error"
            )),
            _ => Fit::Unusable(format!("`{c}` (timestamp_column) is {t}: the record timestamp is read from timestamptz, timestamp (as UTC), an integer of milliseconds or ISO text, so every non-null value would be a mapping error"), "timestamptz"),
        },
        "headers_column" => match column.base_type_oid {
            oid::JSON | oid::JSONB => Fit::Usable,
            oid::BYTEA | oid::TEXT | oid::VARCHAR | oid::BPCHAR => Fit::Depends(format!(
                "`{c}` is {t}: its values must be JSON objects, or the event is a mapping error"
            )),
            _ => Fit::Unusable(format!("`{c}` (headers_column) is {t}, which never holds a JSON object of headers: every non-null value would be a mapping error"), "jsonb"),
        },
        _ => Fit::Usable,
    }
}

/// Every configured column exists, pgoutput sends it, and its type can work for its setting;
/// then the live mapping binds the table, and the routing columns cannot trip it up.
fn outbox_columns(config: &Config, outbox: &OutboxTable, table: &Table) -> Item {
    let o = &outbox.config;
    let publication = quote_ident(&config.postgres.publication);
    let mut problems = Vec::new();
    let mut fixes = Vec::new();
    let mut warnings = Vec::new();
    let mut listed = Vec::new();
    for (setting, name) in configured_columns(o) {
        let Some(column) = outbox.column(name) else {
            problems.push(format!("no column `{name}` ({setting})"));
            fixes.push(format!(
                "add column `{name}` to {}, or set {setting} to one of its columns",
                table.display
            ));
            continue;
        };
        if !column.published {
            if column.generated {
                problems.push(format!(
                    "`{name}` ({setting}) is a generated column, which pgoutput does not send"
                ));
                fixes.push(format!(
                    "map {setting} to a plain column of {}",
                    table.display
                ));
            } else {
                problems.push(format!("`{name}` ({setting}) is left out of publication `{}`'s column list, so pgoutput does not send it", config.postgres.publication));
                fixes.push(format!(
                    "BEGIN; ALTER PUBLICATION {publication} DROP TABLE {t}; ALTER PUBLICATION {publication} ADD TABLE {t}; COMMIT; (publishes every column)",
                    t = table.quoted
                ));
            }
            continue;
        }
        match type_fit(&setting, column) {
            Fit::Usable => {}
            Fit::Depends(why) => warnings.push(why),
            Fit::Unusable(why, wanted) => {
                problems.push(why);
                fixes.push(format!(
                    "map {setting} to a {wanted} column, or convert `{name}`: ALTER TABLE {} ALTER COLUMN {} TYPE {wanted} USING …;",
                    table.quoted,
                    quote_ident(name)
                ));
            }
        }
        listed.push(format!("{name} {}", column.type_name));
    }
    if !problems.is_empty() {
        fixes.dedup();
        return problem(
            "outbox columns",
            format!("{}: {}", table.display, problems.join("; ")),
            fixes.join("\n"),
        );
    }
    let bound = OutboxMapping::new(&config.outbox)
        .map(|m| m.with_binary(config.postgres.binary).bind(&outbox.relation));
    match bound {
        Ok(Some(Ok(_))) => {}
        Ok(Some(Err(e))) | Err(e) => {
            return problem(
                "outbox columns",
                e.to_string(),
                "add the column, or set the outbox setting it names to one of the table's columns",
            )
        }
        // Unreachable: the table comes from the same configuration.
        Ok(None) => {
            return problem(
                "outbox columns",
                format!(
                    "{} is not an outbox table of the configuration",
                    table.display
                ),
                "check outbox.table",
            )
        }
    }
    let (more, mut fixes) = column_warnings(config, outbox, table);
    warnings.extend(more);
    if let Some(filter) = &outbox.row_filter {
        warnings.push(format!(
            "publication `{}` sends only the rows where {filter}: the others are never relayed",
            config.postgres.publication
        ));
        fixes.push(format!(
            "if that is not intended: BEGIN; ALTER PUBLICATION {publication} DROP TABLE {t}; ALTER PUBLICATION {publication} ADD TABLE {t}; COMMIT;",
            t = table.quoted
        ));
    }
    if warnings.is_empty() {
        return ok(
            "outbox columns",
            format!("{}: {}", table.display, listed.join(", ")),
        );
    }
    let fix = if fixes.is_empty() {
        "make sure the application writes such values, or change the column type".to_string()
    } else {
        fixes.join("\n")
    };
    warning(
        "outbox columns",
        format!("{}: {}", table.display, warnings.join("; ")),
        fix,
    )
}

/// Nullable or space-padded routing columns, and a `created_at` that `replay` cannot use.
fn column_warnings(
    config: &Config,
    outbox: &OutboxTable,
    table: &Table,
) -> (Vec<String>, Vec<String>) {
    let o = &outbox.config;
    let mut warnings = Vec::new();
    let mut fixes = Vec::new();
    let routing = [
        &o.id_column,
        &o.aggregate_type_column,
        &o.aggregate_id_column,
        &o.type_column,
    ];
    for column in routing {
        let Some(info) = outbox.column(column) else {
            continue;
        };
        if !info.not_null {
            warnings.push(format!(
                "`{column}` allows NULL, and a NULL there makes the event unpublishable (dead_letter.policy)"
            ));
            fixes.push(format!(
                "ALTER TABLE {} ALTER COLUMN {} SET NOT NULL;",
                table.quoted,
                quote_ident(column)
            ));
        }
        if info.type_oid == oid::BPCHAR {
            warnings.push(format!(
                "`{column}` is {}: its values arrive space-padded",
                info.type_name
            ));
            fixes.push(format!(
                "ALTER TABLE {} ALTER COLUMN {} TYPE text;",
                table.quoted,
                quote_ident(column)
            ));
        }
    }
    let created_at = created_at_column(&config.outbox);
    match outbox.column(created_at) {
        Some(c) if c.type_name.starts_with("timestamp") => {}
        Some(c) => warnings.push(format!(
            "`{created_at}` is {}, not a timestamp: `replay --since/--until` cannot use it",
            c.type_name
        )),
        None => {
            warnings.push(format!(
                "no `{created_at}` column (outbox.sweeper.created_at_column): `replay` selects and orders rows by it"
            ));
            fixes.push(format!(
                "ALTER TABLE {} ADD COLUMN {} timestamptz NOT NULL DEFAULT now();",
                table.quoted,
                quote_ident(created_at)
            ));
        }
    }
    (warnings, fixes)
}

/// The slot exists (or will be created), uses pgoutput in this database, and keeps its WAL.
fn slot_items(config: &Config, slot: Option<&SlotInfo>, server: &Server) -> Vec<Item> {
    let name = &config.postgres.slot;
    let create_sql = format!(
        "SELECT pg_create_logical_replication_slot({}, 'pgoutput');",
        quote_literal(name)
    );
    let Some(slot) = slot else {
        let detail = format!("slot `{name}` does not exist yet");
        return vec![if config.postgres.create_slot {
            warning("slot", format!("{detail}; `outbox-relay run` creates it at start-up (postgres.create_slot = true), and rows committed before that are not relayed"), "create it now: `outbox-relay slot create`")
        } else {
            problem(
                "slot",
                format!("{detail} and postgres.create_slot is off"),
                format!("`outbox-relay slot create` (or {create_sql})"),
            )
        }];
    };
    let drop_sql = format!("SELECT pg_drop_replication_slot({});", quote_literal(name));
    if slot.slot_type != "logical" || slot.plugin.as_deref() != Some("pgoutput") {
        return vec![problem(
            "slot",
            format!("slot `{name}` is a {} slot with plugin {}; the relay needs a logical slot using pgoutput", slot.slot_type, slot.plugin.as_deref().unwrap_or("none")),
            format!("{drop_sql} then {create_sql} (or set postgres.slot to another name)"),
        )];
    }
    if slot.database.as_deref() != Some(server.database.as_str()) {
        return vec![problem(
            "slot",
            format!(
                "slot `{name}` belongs to database \"{}\", not \"{}\"",
                slot.database.as_deref().unwrap_or("?"),
                server.database
            ),
            "point postgres.url at that database, or set postgres.slot to a new name",
        )];
    }
    let holder = match slot.active_pid.filter(|_| slot.active) {
        Some(pid) => format!("active in backend {pid}"),
        None => "inactive".to_string(),
    };
    let confirmed = slot.confirmed_flush_lsn.unwrap_or_default();
    vec![
        ok(
            "slot",
            format!("slot `{name}` uses pgoutput, {holder}, confirmed up to {confirmed}"),
        ),
        slot_wal(name, slot, server),
    ]
}

fn slot_wal(name: &str, slot: &SlotInfo, server: &Server) -> Item {
    let status = slot.wal_status.as_deref().unwrap_or("unknown");
    let safe = match slot.safe_wal_size {
        Some(n) => format!("safe_wal_size {}", format::bytes(n.max(0) as u64)),
        None => {
            "no max_slot_wal_keep_size limit: a stopped relay lets WAL grow until the disk fills"
                .to_string()
        }
    };
    let detail = format!("slot `{name}`: wal_status {status}, {safe}");
    match status {
        "reserved" => ok("slot WAL", detail),
        "extended" => warning("slot WAL", format!("{detail}: the slot holds more WAL than max_wal_size, the relay is behind"), "start the relay or let it catch up; `outbox-relay status` shows the lag"),
        "unreserved" => problem("slot WAL", format!("{detail}: WAL the slot needs is about to be removed (max_slot_wal_keep_size = {})", server.setting("max_slot_wal_keep_size")), "start the relay now so it catches up, or raise max_slot_wal_keep_size: ALTER SYSTEM SET max_slot_wal_keep_size = '<larger>'; SELECT pg_reload_conf();"),
        "lost" => problem("slot WAL", format!("{detail}: the slot was invalidated and events were lost"), "`outbox-relay slot drop --yes`, `outbox-relay slot create`, then `outbox-relay replay --since <time of the last event consumers got>`"),
        _ => warning("slot WAL", detail, "see `outbox-relay status`"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::check::Status;

    fn server(superuser: bool, replication: bool) -> Server {
        Server {
            settings: HashMap::from([
                ("wal_level".to_string(), "replica".to_string()),
                ("max_replication_slots".to_string(), "10".to_string()),
                ("max_wal_senders".to_string(), "10".to_string()),
            ]),
            role: "app\"user".into(),
            superuser,
            replication,
            rds_replication: None,
            database: "db".into(),
            version: "15".into(),
            slots_used: 10,
            senders_used: 3,
        }
    }
    #[test]
    fn a_receive_timeout_under_half_the_wal_sender_timeout_is_a_problem() {
        let mut s = server(true, true);
        s.settings
            .insert("wal_sender_timeout".into(), "60000".into());
        let item = receive_timeout(&s, 20_000);
        assert_eq!(item.status, Status::Problem);
        assert!(
            item.detail.contains("postgres.receive_timeout_ms"),
            "{}",
            item.detail
        );
        assert!(item.fix.unwrap().contains("31000"));
        assert_eq!(receive_timeout(&s, 31_000).status, Status::Ok);
        assert_eq!(receive_timeout(&s, 0).status, Status::Ok);
    }

    #[test]
    fn wal_level_replica_names_the_setting() {
        let item = wal_level(&server(true, true));
        assert_eq!(item.status, Status::Problem);
        assert!(item
            .fix
            .unwrap()
            .contains("ALTER SYSTEM SET wal_level = 'logical'"));
    }
    #[test]
    fn role_fix_quotes_the_role() {
        let item = role(&server(false, false));
        assert_eq!(item.status, Status::Problem);
        assert_eq!(
            item.fix.as_deref(),
            Some("ALTER ROLE \"app\"\"user\" WITH REPLICATION;")
        );
        assert_eq!(role(&server(false, true)).status, Status::Ok);
        assert_eq!(role(&server(true, false)).status, Status::Ok);
    }
    #[test]
    fn on_rds_the_right_comes_from_rds_replication_and_the_fix_is_a_grant() {
        let mut s = server(false, false);
        s.rds_replication = Some(true);
        assert_eq!(role(&s).status, Status::Ok);
        s.rds_replication = Some(false);
        let item = role(&s);
        assert_eq!(item.status, Status::Problem);
        assert_eq!(
            item.fix.as_deref(),
            Some("GRANT rds_replication TO \"app\"\"user\";")
        );
        s.settings
            .insert("rds.logical_replication".into(), "0".into());
        assert!(wal_level(&s)
            .fix
            .unwrap()
            .contains("rds.logical_replication = 1"));
        s.settings.remove("rds.logical_replication");
        s.settings
            .insert("cloudsql.logical_decoding".into(), "off".into());
        assert!(wal_level(&s)
            .fix
            .unwrap()
            .contains("cloudsql.logical_decoding = on"));
    }
    #[test]
    fn full_slots_are_a_problem_only_without_our_slot() {
        assert_eq!(
            slot_capacity(&server(true, true), false).status,
            Status::Problem
        );
        assert_eq!(slot_capacity(&server(true, true), true).status, Status::Ok);
        assert_eq!(
            sender_capacity(&server(true, true), false).status,
            Status::Ok
        );
    }
    /// A column: name, own type OID, base type OID, type name, published, generated.
    fn col(
        name: &str,
        type_oid: u32,
        base_type_oid: u32,
        type_name: &str,
        published: bool,
        generated: bool,
    ) -> TableColumn {
        TableColumn {
            name: name.into(),
            type_oid,
            type_modifier: -1,
            type_name: type_name.into(),
            base_type_oid,
            not_null: true,
            generated,
            published,
        }
    }

    fn described(config: &OutboxConfig, columns: Vec<TableColumn>) -> OutboxTable {
        let (schema, name) = config.schema_and_table();
        OutboxTable {
            config: config.clone(),
            display: format!("{schema}.{name}"),
            quoted: format!("{}.{}", quote_ident(&schema), quote_ident(&name)),
            row_filter: None,
            relation: crate::source::pgoutput::Relation {
                id: 0,
                namespace: schema,
                name,
                replica_identity: b'd',
                columns: columns
                    .iter()
                    .filter(|c| c.published)
                    .map(|c| crate::source::pgoutput::Column {
                        flags: 0,
                        name: c.name.clone(),
                        type_oid: c.type_oid,
                        type_modifier: c.type_modifier,
                    })
                    .collect(),
            },
            columns,
        }
    }

    fn base_columns() -> Vec<TableColumn> {
        vec![
            col("id", 2950, 2950, "uuid", true, false),
            col("aggregatetype", 25, 25, "text", true, false),
            col("aggregateid", 25, 25, "text", true, false),
            col("type", 25, 25, "text", true, false),
            col("payload", oid::BYTEA, oid::BYTEA, "bytea", true, false),
            col(
                "created_at",
                1184,
                1184,
                "timestamp with time zone",
                true,
                false,
            ),
        ]
    }

    fn config_with(outbox: OutboxConfig) -> Config {
        Config {
            outbox,
            ..Config::default()
        }
    }

    #[test]
    fn optional_columns_must_exist_be_published_and_fit() {
        let outbox = OutboxConfig {
            timestamp_column: Some("at".into()),
            headers_column: Some("hdrs".into()),
            key_column: Some("k".into()),
            tracing_column: Some("span".into()),
            partition_by: "shard".into(),
            header_columns: [("total".to_string(), "x-total".to_string())].into(),
            ..OutboxConfig::default()
        };
        let config = config_with(outbox.clone());
        let table = Table::from_config(&outbox);

        let mut columns = base_columns();
        columns.extend([
            col("at", oid::JSONB, oid::JSONB, "jsonb", true, false),
            col("hdrs", 23, 23, "integer", true, false),
            col("k", 25, 25, "text", false, false),
            col("total", 1700, 1700, "numeric", false, true),
            col("shard", 25, 25, "text", true, false),
        ]);
        let item = outbox_columns(&config, &described(&outbox, columns), &table);
        assert_eq!(item.status, Status::Problem, "{item:?}");
        for expected in [
            "`at` (timestamp_column) is jsonb",
            "`hdrs` (headers_column) is integer",
            "`k` (key_column) is left out of publication `outbox_relay_pub`'s column list",
            "`total` (header_columns.total) is a generated column",
            "no column `span` (tracing_column)",
        ] {
            assert!(item.detail.contains(expected), "{expected}: {item:?}");
        }
        let fix = item.fix.unwrap();
        assert!(
            fix.contains(r#"ALTER PUBLICATION "outbox_relay_pub" ADD TABLE "public"."outbox""#),
            "{fix}"
        );

        // Usable types; text that must hold the right values is a warning.
        let mut columns = base_columns();
        columns.extend([
            col("at", 20, 20, "bigint", true, false),
            col("hdrs", 25, 25, "text", true, false),
            col("k", 25, 25, "text", true, false),
            col("span", 25, 25, "text", true, false),
            col("total", 1700, 1700, "numeric", true, false),
            col("shard", 25, 25, "text", true, false),
        ]);
        let item = outbox_columns(&config, &described(&outbox, columns.clone()), &table);
        assert_eq!(item.status, Status::Warning, "{item:?}");
        assert!(
            item.detail
                .contains("`hdrs` is text: its values must be JSON objects"),
            "{item:?}"
        );
        columns[7] = col("hdrs", oid::JSONB, oid::JSONB, "jsonb", true, false);
        let item = outbox_columns(&config, &described(&outbox, columns.clone()), &table);
        assert_eq!(item.status, Status::Ok, "{item:?}");
        assert!(
            item.detail
                .contains("payload bytea, k text, at bigint, hdrs jsonb, span text"),
            "{item:?}"
        );
        // A domain over bigint is text to the relay: not a timestamp.
        columns[6] = col("at", 90_000, 20, "epoch_ms", true, false);
        let item = outbox_columns(&config, &described(&outbox, columns), &table);
        assert_eq!(item.status, Status::Problem, "{item:?}");
    }

    #[test]
    fn date_style_must_be_iso_for_timestamp_columns() {
        let mut s = server(true, true);
        s.settings.insert("DateStyle".into(), "ISO, MDY".into());
        s.settings.insert("TimeZone".into(), "Europe/Berlin".into());
        let mut outbox = OutboxConfig::default();
        assert_eq!(
            date_style(&s, &config_with(outbox.clone())).status,
            Status::Ok
        );
        s.settings.insert("DateStyle".into(), "SQL, DMY".into());
        assert_eq!(
            date_style(&s, &config_with(outbox.clone())).status,
            Status::Warning
        );
        outbox.tables.push(crate::config::OutboxTableConfig {
            table: "app.events".into(),
            timestamp_column: Some("at".into()),
            ..Default::default()
        });
        let item = date_style(&s, &config_with(outbox));
        assert_eq!(item.status, Status::Problem);
        assert_eq!(
            item.fix.as_deref(),
            Some(r#"ALTER DATABASE "db" SET DateStyle = 'ISO, DMY'; then restart the relay"#)
        );
    }
}
