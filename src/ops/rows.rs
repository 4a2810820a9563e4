//! Outbox rows as pgoutput would send them: the table's published columns (names, type OIDs,
//! typmods) as a [`Relation`], and each row's values as their types' text output. `replay` and
//! `check` turn them into records with the live [`crate::mapping::OutboxMapping`], so that
//! topic, key, partition, payload, timestamp and headers come out exactly as in the live
//! stream.
//!
//! The values are read with `format('%s', column)`, which calls the type's output function
//! like pgoutput does; a `::text` cast would not (`true::text` is `true`, pgoutput sends `t`;
//! `char(n)::text` drops the padding). Output functions depend on the session's settings; see
//! [`match_walsender_output`].

use bytes::Bytes;
use tokio_postgres::{Client, Row};

use crate::config::OutboxConfig;
use crate::ops::OpsError;
use crate::postgres::control::{query_err, quote_ident};
use crate::source::pgoutput::{Column, Relation, Tuple, TupleValue};

/// Makes this session print values as the relay's walsender does.
///
/// Neither connection sets `TimeZone`, `IntervalStyle`, `extra_float_digits` or `bytea_output`
/// in its start-up packet, so both get the same server, database and role defaults (unless
/// `postgres.url` carries an `options=-c …` of its own, which only this connection sees). The
/// relay reads timestamps in the ISO style, so `DateStyle` is set to ISO here: setting only the
/// style keeps the session's day/month order, which only matters for parsing input such as
/// `--since`. ISO output is `2026-03-01 12:30:45.123456+05:30`, in the session's `TimeZone`, the
/// same text the walsender sends when the server's DateStyle is ISO (the default, which
/// `outbox-relay check` verifies).
pub async fn match_walsender_output(client: &Client) -> Result<(), OpsError> {
    client
        .batch_execute("SET DateStyle = 'ISO'")
        .await
        .map_err(query_err("setting DateStyle = 'ISO'"))?;
    Ok(())
}

/// One column of an outbox table, as the catalog describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableColumn {
    pub name: String,
    pub type_oid: u32,
    pub type_modifier: i32,
    /// `format_type`: `timestamp with time zone`, `character varying(255)`…
    pub type_name: String,
    /// The type under a domain (the column's own type otherwise).
    pub base_type_oid: u32,
    pub not_null: bool,
    /// A generated column: pgoutput does not send it (before PostgreSQL 18; from 18 on only
    /// with the publication's `publish_generated_columns`).
    pub generated: bool,
    /// pgoutput sends this column: not generated, and in the publication's column list if it
    /// has one.
    pub published: bool,
}

/// One configured outbox table, described by the catalog.
#[derive(Debug, Clone)]
pub struct OutboxTable {
    /// The table's complete mapping (one entry of `OutboxConfig::table_configs`).
    pub config: OutboxConfig,
    /// `schema.table`, for messages.
    pub display: String,
    /// `"schema"."table"`, for SQL.
    pub quoted: String,
    /// Every column (not dropped) in `attnum` order, published or not.
    pub columns: Vec<TableColumn>,
    /// The publication's row filter for the table (a SQL expression, PostgreSQL 15+): pgoutput
    /// sends only the rows it is true for.
    pub row_filter: Option<String>,
    /// The published columns in `attnum` order, as pgoutput's Relation message lists them.
    pub relation: Relation,
}

impl OutboxTable {
    /// Reads the table's columns and which of them `publication` sends; `None` when the table
    /// does not exist.
    pub async fn describe(
        client: &Client,
        config: &OutboxConfig,
        publication: &str,
    ) -> Result<Option<OutboxTable>, OpsError> {
        let (schema, name) = config.schema_and_table();
        let what = format!("reading the columns of {schema}.{name}");
        let version: i32 = client
            .query_one("SELECT current_setting('server_version_num')::int4", &[])
            .await
            .map_err(query_err(what.clone()))?
            .get(0);
        let mut columns = table_columns(client, version, &schema, &name, &what).await?;
        if columns.is_empty() {
            return Ok(None);
        }
        let (listed, row_filter) = published_columns(client, version, publication, &schema, &name)
            .await?
            .unwrap_or_default();
        for column in &mut columns {
            column.published = sent_by_pgoutput(column, listed.as_deref(), version);
        }
        let relation = Relation {
            id: 0,
            namespace: schema.clone(),
            name: name.clone(),
            replica_identity: b'd',
            columns: columns
                .iter()
                .filter(|c| c.published)
                .map(|c| Column {
                    flags: 0,
                    name: c.name.clone(),
                    type_oid: c.type_oid,
                    type_modifier: c.type_modifier,
                })
                .collect(),
        };
        Ok(Some(OutboxTable {
            config: config.clone(),
            display: format!("{schema}.{name}"),
            quoted: format!("{}.{}", quote_ident(&schema), quote_ident(&name)),
            columns,
            row_filter,
            relation,
        }))
    }

    /// Every published column's text output, in order: the start of a SELECT list.
    pub fn select_list(&self) -> String {
        let values: Vec<String> = self
            .relation
            .columns
            .iter()
            .map(|c| text_output(&c.name))
            .collect();
        values.join(", ")
    }

    /// The row's first columns (those of [`OutboxTable::select_list`]) as pgoutput's tuple.
    pub fn tuple(&self, row: &Row) -> Tuple {
        let values = (0..self.relation.columns.len())
            .map(|i| match row.get::<_, Option<String>>(i) {
                Some(text) => TupleValue::Text(Bytes::from(text)),
                None => TupleValue::Null,
            })
            .collect();
        Tuple(values)
    }

    /// The column named `name`, published or not.
    pub fn column(&self, name: &str) -> Option<&TableColumn> {
        self.columns.iter().find(|c| c.name == name)
    }

    pub fn has_column(&self, name: &str) -> bool {
        self.column(name).is_some()
    }
}

/// The table's columns in `attnum` order, none marked published yet; empty when the table
/// does not exist.
async fn table_columns(
    client: &Client,
    version: i32,
    schema: &str,
    name: &str,
    what: &str,
) -> Result<Vec<TableColumn>, OpsError> {
    // attgenerated is PostgreSQL 12+.
    let generated = if version >= 120_000 {
        "a.attgenerated <> ''"
    } else {
        "false"
    };
    let sql = format!(
        "SELECT a.attname::text, a.atttypid, a.atttypmod, format_type(a.atttypid, a.atttypmod),
                COALESCE(NULLIF(t.typbasetype, 0), a.atttypid), a.attnotnull, {generated}
         FROM pg_attribute a
         JOIN pg_class c ON c.oid = a.attrelid
         JOIN pg_namespace n ON n.oid = c.relnamespace
         JOIN pg_type t ON t.oid = a.atttypid
         WHERE n.nspname = $1 AND c.relname = $2 AND a.attnum > 0 AND NOT a.attisdropped
         ORDER BY a.attnum"
    );
    let rows = client
        .query(&sql, &[&schema, &name])
        .await
        .map_err(query_err(what.to_string()))?;
    Ok(rows
        .iter()
        .map(|r| TableColumn {
            name: r.get(0),
            type_oid: r.get(1),
            type_modifier: r.get(2),
            type_name: r.get(3),
            base_type_oid: r.get(4),
            not_null: r.get(5),
            generated: r.get(6),
            published: false,
        })
        .collect())
}

/// The publication's column list (`None`: every column) and row filter for the table
/// (PostgreSQL 15+ has both); `None` when the table is not in the publication.
async fn published_columns(
    client: &Client,
    version: i32,
    publication: &str,
    schema: &str,
    name: &str,
) -> Result<Option<(Option<Vec<String>>, Option<String>)>, OpsError> {
    let published_sql = if version >= 150_000 {
        "SELECT attnames::text[], rowfilter FROM pg_publication_tables
         WHERE pubname = $1 AND schemaname = $2 AND tablename = $3"
    } else {
        "SELECT NULL::text[], NULL::text FROM pg_publication_tables
         WHERE pubname = $1 AND schemaname = $2 AND tablename = $3"
    };
    Ok(client
        .query_opt(published_sql, &[&publication, &schema, &name])
        .await
        .map_err(query_err(format!(
            "reading which columns of {schema}.{name} publication `{publication}` sends"
        )))?
        .map(|r| (r.get(0), r.get(1))))
}

/// Whether pgoutput sends the column, given the publication's column list (`None`: every
/// column). Before PostgreSQL 18 pgoutput never sends generated columns, although the list
/// names them; from 18 on, the list says whether it does (publish_generated_columns).
fn sent_by_pgoutput(column: &TableColumn, listed: Option<&[String]>, version: i32) -> bool {
    let gencols_listed = version >= 180_000;
    match listed {
        Some(names) if gencols_listed => names.contains(&column.name),
        Some(names) => names.contains(&column.name) && !column.generated,
        None => !column.generated,
    }
}

/// The column's value as its type's text output, NULL kept NULL (`format` turns NULL into '').
pub fn text_output(column: &str) -> String {
    let c = quote_ident(column);
    format!("CASE WHEN {c} IS NULL THEN NULL ELSE format('%s', {c}) END")
}

/// The column that `replay --since/--until` select by, `replay` orders by and `status` ages
/// the outbox by: `outbox.sweeper.created_at_column` (`created_at` by default), the same in
/// every outbox table.
pub fn created_at_column(outbox: &OutboxConfig) -> &str {
    &outbox.sweeper.created_at_column
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_read_as_their_text_output() {
        assert_eq!(
            text_output("pay\"load"),
            r#"CASE WHEN "pay""load" IS NULL THEN NULL ELSE format('%s', "pay""load") END"#
        );
    }

    #[test]
    fn the_created_at_column_is_the_sweepers() {
        let mut outbox = OutboxConfig::default();
        assert_eq!(created_at_column(&outbox), "created_at");
        outbox.sweeper.created_at_column = "inserted_at".into();
        assert_eq!(created_at_column(&outbox), "inserted_at");
    }
}
