//! Which rows a replay re-publishes: the configured outbox tables (or the one `--table` names)
//! and, per table, the SQL that selects the flags' rows in `created_at, id` order. Flag values
//! are checked against the server first (one clear usage error per bad value) and bound as
//! parameters, never spliced into SQL.

use std::error::Error;

use bytes::BytesMut;
use tokio_postgres::types::{Format, IsNull, ToSql, Type};
use tokio_postgres::Client;

use super::{ReplayError, Selection};
use crate::config::OutboxConfig;
use crate::ops::rows::{created_at_column, OutboxTable};
use crate::ops::OpsError;
use crate::postgres::control::{describe, query_err, quote_ident, sqlstate};
use crate::relay::sweeper::{HORIZON_CTE, XMIN64, XMIN64_FROM};

/// A value sent in text format, parsed by the server with the input function of whatever type
/// the parameter has (the id column may be uuid, bigint, text…). Command-line values travel
/// this way: bound, never spliced into SQL.
#[derive(Debug)]
pub(super) struct TextParam(String);

impl ToSql for TextParam {
    fn to_sql(&self, _: &Type, out: &mut BytesMut) -> Result<IsNull, Box<dyn Error + Sync + Send>> {
        out.extend_from_slice(self.0.as_bytes());
        Ok(IsNull::No)
    }

    fn accepts(_: &Type) -> bool {
        true
    }

    fn encode_format(&self, _: &Type) -> Format {
        Format::Text
    }

    fn to_sql_checked(
        &self,
        ty: &Type,
        out: &mut BytesMut,
    ) -> Result<IsNull, Box<dyn Error + Sync + Send>> {
        self.to_sql(ty, out)
    }
}

/// The SQL of a replay of one table: the table, its quoted columns and the WHERE clause.
pub(super) struct RowQuery {
    pub(super) table: String,
    pub(super) relation: String,
    select_list: String,
    created_at: String,
    id: String,
    /// The commit time in Unix microseconds, or NULL.
    commit_time: &'static str,
    /// The publication's row filter for this table (the server's own expression), if any.
    row_filter: Option<String>,
    /// The selection's conditions, one per flag given.
    conditions: Vec<String>,
    params: Vec<TextParam>,
}

impl RowQuery {
    /// `commit_times`: `track_commit_timestamp` is on, so each row's commit time is known.
    pub(super) fn new(table: &OutboxTable, selection: &Selection, commit_times: bool) -> RowQuery {
        let outbox = &table.config;
        let mut query = RowQuery {
            table: table.display.clone(),
            relation: table.quoted.clone(),
            select_list: table.select_list(),
            created_at: quote_ident(created_at_column(outbox)),
            id: quote_ident(&outbox.id_column),
            commit_time: if commit_times {
                "(extract(epoch FROM pg_xact_commit_timestamp(xmin)) * 1000000)::int8"
            } else {
                "NULL::int8"
            },
            // pgoutput sends only the rows the publication's row filter passes: the server's
            // own expression for this table, not operator input.
            row_filter: table.row_filter.as_ref().map(|f| format!("({f})")),
            conditions: Vec::new(),
            params: Vec::new(),
        };
        let created_at = query.created_at.clone();
        let id = query.id.clone();
        let s = selection;
        query.filter(&s.since, &format!("{created_at} >= $::text::timestamptz"));
        query.filter(&s.until, &format!("{created_at} < $::text::timestamptz"));
        query.filter(&s.from_id, &format!("{id} >= $"));
        query.filter(&s.to_id, &format!("{id} <= $"));
        let aggregate_type = quote_ident(&outbox.aggregate_type_column);
        query.filter(&s.aggregate_type, &format!("{aggregate_type} = $"));
        let event_type = quote_ident(&outbox.type_column);
        query.filter(&s.event_type, &format!("{event_type} = $"));
        query
    }

    /// Adds `condition` (its `$` numbered here) when the flag was given.
    fn filter(&mut self, value: &Option<String>, condition: &str) {
        if let Some(value) = value {
            self.params.push(TextParam(value.clone()));
            let n = self.params.len();
            self.conditions
                .push(condition.replacen('$', &format!("${n}"), 1));
        }
    }

    fn where_clause(&self) -> String {
        let all: Vec<&str> = self
            .row_filter
            .iter()
            .chain(&self.conditions)
            .map(String::as_str)
            .collect();
        if all.is_empty() {
            String::new()
        } else {
            format!(" WHERE {}", all.join(" AND "))
        }
    }

    /// Counts the rows a sweeper hold keeps (widened `xmin` below the parameter after
    /// [`RowQuery::params`], see `relay::sweeper::hold`) that this selection leaves out: rows
    /// the publication's row filter passes and the flags do not select. A NULL in a condition
    /// (a NULL `created_at`) counts as left out, as the replay's own `WHERE` leaves it.
    pub(super) fn unselected_held_sql(&self) -> String {
        let published = self.row_filter.as_deref().unwrap_or("true");
        let selected = if self.conditions.is_empty() {
            "true".to_string()
        } else {
            self.conditions.join(" AND ")
        };
        let boundary = self.params.len() + 1;
        format!(
            "{HORIZON_CTE} SELECT count(*)
             FROM (SELECT xmin FROM {} WHERE COALESCE({published}, false)
                                           AND NOT COALESCE(({selected}), false)) o
             {XMIN64_FROM}
             WHERE {XMIN64} < ${boundary}::bigint",
            self.relation
        )
    }

    pub(super) fn count_sql(&self) -> String {
        format!(
            "SELECT count(*) FROM {}{}",
            self.relation,
            self.where_clause()
        )
    }

    /// Every published column's text output, then `created_at` and the commit time in Unix
    /// microseconds (the live stream's unit).
    pub(super) fn select_sql(&self) -> String {
        format!(
            "SELECT {}, (extract(epoch FROM {ca}) * 1000000)::int8, {} FROM {}{} ORDER BY {ca}, {}",
            self.select_list,
            self.commit_time,
            self.relation,
            self.where_clause(),
            self.id,
            ca = self.created_at,
        )
    }

    pub(super) fn params(&self) -> Vec<&(dyn ToSql + Sync)> {
        self.params
            .iter()
            .map(|p| p as &(dyn ToSql + Sync))
            .collect()
    }
}

/// `schema.table` of a table's config.
pub(super) fn display_name(config: &OutboxConfig) -> String {
    let (schema, table) = config.schema_and_table();
    format!("{schema}.{table}")
}

/// The outbox tables to replay: the one `--table` names, or every configured one.
pub(super) fn choose_tables(
    outbox: &OutboxConfig,
    wanted: Option<&str>,
) -> Result<Vec<OutboxConfig>, ReplayError> {
    let tables = outbox.table_configs();
    if tables.is_empty() {
        return Err(ReplayError::NoTable);
    }
    let Some(wanted) = wanted else {
        return Ok(tables);
    };
    let key = OutboxConfig {
        table: wanted.to_string(),
        ..OutboxConfig::default()
    }
    .schema_and_table();
    let names: Vec<String> = tables.iter().map(display_name).collect();
    tables
        .into_iter()
        .find(|t| t.schema_and_table() == key)
        .map(|t| vec![t])
        .ok_or_else(|| ReplayError::UnknownTable {
            table: wanted.to_string(),
            configured: names.join(", "),
        })
}

/// `track_commit_timestamp` is on: rows' commit times can be read back.
pub(super) async fn commit_times_tracked(client: &Client) -> Result<bool, OpsError> {
    let row = client
        .query_one(
            "SELECT current_setting('track_commit_timestamp') = 'on'",
            &[],
        )
        .await
        .map_err(query_err("reading track_commit_timestamp"))?;
    Ok(row.get(0))
}

/// Checks the time flags against the server before anything is read or sent: one clear error
/// per bad value, and a time range that selects something.
pub(super) async fn validate_times(client: &Client, selection: &Selection) -> Result<(), OpsError> {
    let since = parse_time(client, "--since", &selection.since).await?;
    let until = parse_time(client, "--until", &selection.until).await?;
    if let (Some(since), Some(until)) = (since, until) {
        let row = client
            .query_one(
                "SELECT $1::text::timestamptz < $2::text::timestamptz",
                &[&since, &until],
            )
            .await
            .map_err(query_err("comparing --since and --until"))?;
        if !row.get::<_, bool>(0) {
            return Err(ReplayError::EmptyRange { since, until }.into());
        }
    }
    Ok(())
}

/// Checks the value flags against one table's column types.
pub(super) async fn validate_values(
    client: &Client,
    query: &RowQuery,
    outbox: &OutboxConfig,
    selection: &Selection,
    several: bool,
) -> Result<(), OpsError> {
    let values = [
        ("--from-id", &selection.from_id, &outbox.id_column),
        ("--to-id", &selection.to_id, &outbox.id_column),
        (
            "--aggregate-type",
            &selection.aggregate_type,
            &outbox.aggregate_type_column,
        ),
        ("--type", &selection.event_type, &outbox.type_column),
    ];
    for (flag, value, column) in values {
        if let Some(value) = value {
            check_value(client, query, flag, value, column, several).await?;
        }
    }
    Ok(())
}

/// The time as the server reads it (normalised text), or a usage error.
async fn parse_time(
    client: &Client,
    flag: &'static str,
    value: &Option<String>,
) -> Result<Option<String>, OpsError> {
    let Some(value) = value else {
        return Ok(None);
    };
    match client
        .query_one("SELECT $1::text::timestamptz::text", &[value])
        .await
    {
        Ok(row) => Ok(Some(row.get(0))),
        Err(e) if is_data_error(&e) => Err(ReplayError::BadTime {
            flag,
            value: value.clone(),
            reason: describe(&e),
        }
        .into()),
        Err(e) => Err(query_err(format!("reading {flag}"))(e).into()),
    }
}

/// Lets the server parse `value` as the column's type: a bad uuid is a usage error up front.
async fn check_value(
    client: &Client,
    query: &RowQuery,
    flag: &'static str,
    value: &str,
    column: &str,
    several: bool,
) -> Result<(), OpsError> {
    let sql = format!(
        "SELECT 1 FROM {} WHERE {} = $1 LIMIT 0",
        query.relation,
        quote_ident(column)
    );
    let param = TextParam(value.to_string());
    match client.query(&sql, &[&param]).await {
        Ok(_) => Ok(()),
        Err(e) if is_data_error(&e) => Err(ReplayError::BadValue {
            flag,
            value: value.to_string(),
            table: query.table.clone(),
            column: column.to_string(),
            reason: describe(&e),
            several,
        }
        .into()),
        Err(e) => Err(query_err(format!("checking {flag}"))(e).into()),
    }
}

/// SQLSTATE class 22: the value does not fit the type.
fn is_data_error(e: &tokio_postgres::Error) -> bool {
    sqlstate(e).is_some_and(|s| s.starts_with("22"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn selection() -> Selection {
        Selection {
            since: Some("2026-01-01".into()),
            from_id: Some("x'; DROP TABLE outbox; --".into()),
            event_type: Some("Created".into()),
            ..Selection::default()
        }
    }

    fn outbox_table() -> OutboxTable {
        let column = |name: &str, type_oid: u32| crate::source::pgoutput::Column {
            flags: 0,
            name: name.to_string(),
            type_oid,
            type_modifier: -1,
        };
        let relation = crate::source::pgoutput::Relation {
            id: 0,
            namespace: "public".into(),
            name: "outbox".into(),
            replica_identity: b'd',
            columns: vec![
                column("id", 2950),
                column("aggregatetype", 25),
                column("aggregateid", 25),
                column("type", 25),
                column("payload", 3802),
                column("created_at", 1184),
            ],
        };
        OutboxTable {
            config: OutboxConfig::default(),
            display: "public.outbox".into(),
            quoted: r#""public"."outbox""#.into(),
            columns: Vec::new(),
            row_filter: None,
            relation,
        }
    }

    #[test]
    fn filters_are_numbered_parameters_never_spliced() {
        let query = RowQuery::new(&outbox_table(), &selection(), false);
        let sql = query.select_sql();
        assert!(
            !sql.contains("DROP TABLE") && !sql.contains("2026"),
            "{sql}"
        );
        assert!(
            sql.contains(
                r#"WHERE "created_at" >= $1::text::timestamptz AND "id" >= $2 AND "type" = $3"#
            ),
            "{sql}"
        );
        assert!(sql.ends_with(r#"ORDER BY "created_at", "id""#), "{sql}");
        assert!(sql.contains(r#"format('%s', "payload")"#), "{sql}");
        assert!(sql.contains(r#"FROM "public"."outbox""#), "{sql}");
        assert!(
            sql.contains(r#"(extract(epoch FROM "created_at") * 1000000)::int8, NULL::int8 FROM"#),
            "{sql}"
        );
        assert_eq!(query.params().len(), 3);
        assert_eq!(
            query.count_sql(),
            format!(
                r#"SELECT count(*) FROM "public"."outbox"{}"#,
                query.where_clause()
            )
        );
    }

    #[test]
    fn commit_times_row_filter_and_created_at_column_follow_the_setup() {
        let mut table = outbox_table();
        table.config.sweeper.created_at_column = "inserted_at".into();
        table.row_filter = Some("(aggregatetype <> 'internal'::text)".into());
        let query = RowQuery::new(&table, &selection(), true);
        let sql = query.select_sql();
        assert!(
            sql.contains(
                "(extract(epoch FROM pg_xact_commit_timestamp(xmin)) * 1000000)::int8 FROM"
            ),
            "{sql}"
        );
        assert!(
            sql.contains(r#"WHERE ((aggregatetype <> 'internal'::text)) AND "inserted_at" >= $1"#),
            "{sql}"
        );
        assert!(sql.ends_with(r#"ORDER BY "inserted_at", "id""#), "{sql}");
        assert_eq!(query.params().len(), 3);
    }

    #[test]
    fn held_rows_left_out_are_those_the_row_filter_passes_and_the_flags_do_not() {
        let mut table = outbox_table();
        table.row_filter = Some("(aggregatetype <> 'internal'::text)".into());
        let query = RowQuery::new(&table, &selection(), false);
        let sql = query.unselected_held_sql();
        assert!(
            sql.contains("WHERE COALESCE(((aggregatetype <> 'internal'::text)), false)"),
            "{sql}"
        );
        // A NULL created_at is not selected by the replay: it counts as left out.
        assert!(
            sql.contains(
                r#"AND NOT COALESCE(("created_at" >= $1::text::timestamptz AND "id" >= $2 AND "type" = $3), false)"#
            ),
            "{sql}"
        );
        // The hold's boundary comes after the selection's parameters.
        assert!(sql.contains("END < $4::bigint"), "{sql}");
        assert!(sql.starts_with("WITH horizon AS"), "{sql}");
    }

    #[test]
    fn every_configured_table_unless_one_is_named() {
        let mut outbox = OutboxConfig::default();
        outbox.tables.push(crate::config::OutboxTableConfig {
            table: "app.events".into(),
            ..Default::default()
        });
        let names = |tables: Vec<OutboxConfig>| -> Vec<String> {
            tables.iter().map(display_name).collect()
        };
        assert_eq!(
            names(choose_tables(&outbox, None).unwrap()),
            ["public.outbox", "app.events"]
        );
        assert_eq!(
            names(choose_tables(&outbox, Some("outbox")).unwrap()),
            ["public.outbox"]
        );
        assert_eq!(
            names(choose_tables(&outbox, Some("app.events")).unwrap()),
            ["app.events"]
        );
        let err = choose_tables(&outbox, Some("other")).unwrap_err();
        assert!(
            err.to_string()
                .contains("configured: public.outbox, app.events"),
            "{err}"
        );
        assert!(err.is_usage());
        outbox.table = String::new();
        assert_eq!(names(choose_tables(&outbox, None).unwrap()), ["app.events"]);
        outbox.tables.clear();
        outbox.message_prefix = Some("outbox".into());
        assert!(matches!(
            choose_tables(&outbox, None),
            Err(ReplayError::NoTable)
        ));
    }
}
