//! The outbox-table items of `check`: each configured table exists and is readable, every
//! column its mapping reads exists, is published and has a type that works for its setting, and
//! the live mapping binds it. [`Table`] names a table for SQL and messages, here and in
//! [`super::publication`].

use super::{ok, problem, warning, Item};
use crate::config::{Config, OutboxConfig, PARTITION_BY_AGGREGATE_ID, PARTITION_BY_KEY};
use crate::mapping::OutboxMapping;
use crate::ops::rows::{created_at_column, OutboxTable, TableColumn};
use crate::postgres::control::{describe, quote_ident, Control};

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
pub(super) async fn outbox_tables(
    control: &Control,
    config: &Config,
    role: &str,
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
        let (table_items, table) = outbox_table(control, config, &table_config, role).await;
        items.extend(table_items);
        found.extend(table);
    }
    found
}

async fn outbox_table(
    control: &Control,
    config: &Config,
    table_config: &OutboxConfig,
    role: &str,
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
    let mut items = vec![table_access(&table, &kind, readable, role)];
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

/// `role` is the role the check connected as.
fn table_access(table: &Table, kind: &str, readable: bool, role: &str) -> Item {
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
                role, table.display
            ),
            format!("GRANT SELECT ON {} TO {};", table.quoted, quote_ident(role)),
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
    let columns = match configured_columns_fit(config, outbox, table) {
        Ok(columns) => columns,
        Err(problem) => return problem,
    };
    if let Some(problem) = binding_problem(config, outbox, table) {
        return problem;
    }
    let mut warnings = columns.warnings;
    let (more, mut fixes) = column_warnings(config, outbox, table);
    warnings.extend(more);
    if let Some(filter) = &outbox.row_filter {
        let publication = quote_ident(&config.postgres.publication);
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
            format!("{}: {}", table.display, columns.listed.join(", ")),
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

/// The configured columns, each present, published and of a type that can work for its
/// setting: `name type` of each, and the types that work only for some values.
struct FittingColumns {
    listed: Vec<String>,
    warnings: Vec<String>,
}

/// Checks each configured column; the problem item names every column that cannot work, so
/// that one run of `check` lists all the fixes.
fn configured_columns_fit(
    config: &Config,
    outbox: &OutboxTable,
    table: &Table,
) -> Result<FittingColumns, Item> {
    let publication = quote_ident(&config.postgres.publication);
    let mut problems = Vec::new();
    let mut fixes = Vec::new();
    let mut warnings = Vec::new();
    let mut listed = Vec::new();
    for (setting, name) in configured_columns(&outbox.config) {
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
        return Err(problem(
            "outbox columns",
            format!("{}: {}", table.display, problems.join("; ")),
            fixes.join("\n"),
        ));
    }
    Ok(FittingColumns { listed, warnings })
}

/// The relay's own mapping bound to the table, as it will be at start: whatever it refuses
/// that the column checks above let through.
fn binding_problem(config: &Config, outbox: &OutboxTable, table: &Table) -> Option<Item> {
    let bound = OutboxMapping::new(&config.outbox)
        .map(|m| m.with_binary(config.postgres.binary).bind(&outbox.relation));
    match bound {
        Ok(Some(Ok(_))) => None,
        Ok(Some(Err(e))) | Err(e) => Some(problem(
            "outbox columns",
            e.to_string(),
            "add the column, or set the outbox setting it names to one of the table's columns",
        )),
        // Unreachable: the table comes from the same configuration.
        Ok(None) => Some(problem(
            "outbox columns",
            format!(
                "{} is not an outbox table of the configuration",
                table.display
            ),
            "check outbox.table",
        )),
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::check::Status;

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
        let config = Config {
            outbox: outbox.clone(),
            ..Config::default()
        };
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
}
