//! `replay`: re-publishes events still present in the outbox tables, the "rewind" a logical
//! slot cannot do.
//!
//! Every configured outbox table is replayed unless `--table` names one. Rows are read from one
//! read-only snapshot, page by page through a portal per table, in `created_at, id` order
//! (tables merged by `created_at`), as pgoutput would send them: the published columns with
//! their type OIDs as the Relation, each value in its type's text output, printed in the ISO
//! DateStyle and the walsender's TimeZone ([`super::rows`]). The same [`OutboxMapping`] as the
//! live stream turns them into records, so topic, key, partition, payload and headers come out
//! identical; so does the timestamp when it comes from `outbox.timestamp_column`, or, without
//! one, when `track_commit_timestamp` is on (the row's commit time, as the live stream uses).
//! Otherwise `created_at` stands in for the unknown commit time. Each record also carries
//! [`REPLAY_HEADER`]. Sends are bounded in flight, and the command only reports success once
//! every record is acknowledged.

use std::collections::{BTreeMap, VecDeque};
use std::error::Error;
use std::fmt;
use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use serde::Serialize;
use tokio::sync::mpsc;
use tokio_postgres::types::{Format, IsNull, ToSql, Type};
use tokio_postgres::{Client, IsolationLevel, Portal, Row, Transaction};

use super::rows::{created_at_column, match_walsender_output, OutboxTable};
use super::{connect, format, OpsError, Report};
use crate::config::{Config, KafkaConfig, OutboxConfig};
use crate::mapping::{BoundTable, MappingError, OutboxEvent, OutboxMapping};
use crate::postgres::control::{describe, query_err, quote_ident, sqlstate};
use crate::sink::publisher::{Delivery, Publisher};

/// Header added to every replayed record, so consumers can tell a replay from the live stream.
pub const REPLAY_HEADER: &str = "outbox-relay-replay";
pub const REPLAY_HEADER_VALUE: &str = "true";
/// Rows fetched per round trip.
const PAGE_ROWS: i32 = 1_000;
/// Most records in flight during a replay (`kafka.max_in_flight_messages` if lower): a replay
/// has no WAL to keep up with, only a table to walk, so a smaller window costs nothing.
const MAX_IN_FLIGHT: usize = 10_000;
/// Extra wait for acknowledgements beyond `kafka.message_timeout_ms`, after which librdkafka
/// has reported every record one way or the other.
const ACK_GRACE: Duration = Duration::from_secs(10);
/// Failures listed in the report; the rest are counted.
const MAX_LISTED_FAILURES: usize = 5;
const PROGRESS_INTERVAL: Duration = Duration::from_millis(250);
/// [`ReplayReport::commit_time`] values.
const COMMIT_TIME_TRACKED: &str = "commit_timestamp";
const COMMIT_TIME_CREATED_AT: &str = "created_at";

#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("replay needs a selection: give --since, --until, --from-id, --to-id, --aggregate-type or --type (`--since -infinity` selects every row)")]
    NoSelection,
    #[error("{flag} `{value}` is not a time PostgreSQL understands ({reason}): use e.g. '2026-05-01 12:00:00+00' or 'yesterday'")]
    BadTime {
        flag: &'static str,
        value: String,
        reason: String,
    },
    #[error(
        "--until ({until}) is not after --since ({since}): the range selects nothing; swap them?"
    )]
    EmptyRange { since: String, until: String },
    #[error("{flag} `{value}` is not a valid value of column `{column}` of {table} ({reason}){}", if *.several { "; name one table with --table" } else { "" })]
    BadValue {
        flag: &'static str,
        value: String,
        table: String,
        column: String,
        reason: String,
        /// Several tables are replayed (the value may suit another one).
        several: bool,
    },
    #[error("outbox table {table} has no column `{column}`: replay selects and orders rows by it (outbox.sweeper.created_at_column)")]
    MissingColumn { table: String, column: String },
    #[error("outbox table {table} does not exist: see `outbox-relay check`")]
    MissingTable { table: String },
    #[error("no outbox table is configured (outbox.table or [[outbox.tables]]): replay re-reads rows of a table; events sent with pg_logical_emit_message cannot be replayed")]
    NoTable,
    #[error("--table `{table}` is not a configured outbox table (configured: {configured})")]
    UnknownTable { table: String, configured: String },
}

impl ReplayError {
    pub fn is_usage(&self) -> bool {
        !matches!(
            self,
            ReplayError::MissingColumn { .. } | ReplayError::MissingTable { .. }
        )
    }
}

/// Which rows to replay. Every given filter must match; times are PostgreSQL `timestamptz`
/// input, `since` inclusive and `until` exclusive; ids are inclusive and compared as the id
/// column's type.
#[derive(Debug, Clone, Default)]
pub struct Selection {
    pub since: Option<String>,
    pub until: Option<String>,
    pub from_id: Option<String>,
    pub to_id: Option<String>,
    pub aggregate_type: Option<String>,
    pub event_type: Option<String>,
}

impl Selection {
    fn is_empty(&self) -> bool {
        self.since.is_none()
            && self.until.is_none()
            && self.from_id.is_none()
            && self.to_id.is_none()
            && self.aggregate_type.is_none()
            && self.event_type.is_none()
    }
}

#[derive(Debug, Clone, Default)]
pub struct ReplayOptions {
    pub selection: Selection,
    /// The outbox table to replay (`schema.table`, or a bare name in `public`); `None`: every
    /// configured outbox table, merged in `created_at` order.
    pub table: Option<String>,
    /// Count and map the rows, send nothing.
    pub dry_run: bool,
    /// Draw a progress line on stderr (when it is a terminal).
    pub progress: bool,
}

#[derive(Debug, Serialize)]
pub struct ReplayReport {
    pub ok: bool,
    pub dry_run: bool,
    /// Rows the selection matched.
    pub matched: u64,
    /// Records handed to Kafka.
    pub sent: u64,
    pub acknowledged: u64,
    pub failed: u64,
    /// Rows matched per outbox table (`schema.table`).
    pub tables: BTreeMap<String, u64>,
    /// Events per topic (sent, or that would be sent in a dry run).
    pub topics: BTreeMap<String, u64>,
    /// The header every replayed record carries, `name: value`.
    pub header: String,
    /// What stands in for the commit time (the record timestamp unless
    /// `outbox.timestamp_column` gives one): `commit_timestamp` (the row's own, with
    /// `track_commit_timestamp = on`: as live) or `created_at`.
    pub commit_time: String,
    pub seconds: f64,
    /// The first failed deliveries: event id, topic, error.
    pub failures: Vec<String>,
    /// Why the replay stopped before the end of the selection, if it did.
    pub stopped: Option<String>,
}

impl Report for ReplayReport {
    fn succeeded(&self) -> bool {
        self.ok
    }
}

/// A value sent in text format, parsed by the server with the input function of whatever type
/// the parameter has (the id column may be uuid, bigint, text…). Command-line values travel
/// this way: bound, never spliced into SQL.
#[derive(Debug)]
struct TextParam(String);

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
struct RowQuery {
    table: String,
    relation: String,
    select_list: String,
    created_at: String,
    id: String,
    /// The commit time in Unix microseconds, or NULL.
    commit_time: &'static str,
    conditions: Vec<String>,
    params: Vec<TextParam>,
}

impl RowQuery {
    /// `commit_times`: `track_commit_timestamp` is on, so each row's commit time is known.
    fn new(table: &OutboxTable, selection: &Selection, commit_times: bool) -> RowQuery {
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
            conditions: Vec::new(),
            params: Vec::new(),
        };
        // pgoutput sends only the rows the publication's row filter passes: the server's own
        // expression for this table, not operator input.
        if let Some(filter) = &table.row_filter {
            query.conditions.push(format!("({filter})"));
        }
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
        if self.conditions.is_empty() {
            String::new()
        } else {
            format!(" WHERE {}", self.conditions.join(" AND "))
        }
    }

    fn count_sql(&self) -> String {
        format!(
            "SELECT count(*) FROM {}{}",
            self.relation,
            self.where_clause()
        )
    }

    /// Every published column's text output, then `created_at` and the commit time in Unix
    /// microseconds (the live stream's unit).
    fn select_sql(&self) -> String {
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

    fn params(&self) -> Vec<&(dyn ToSql + Sync)> {
        self.params
            .iter()
            .map(|p| p as &(dyn ToSql + Sync))
            .collect()
    }
}

/// One table of the replay: described, bound by the live mapping, and its query.
struct TableSource {
    table: OutboxTable,
    bound: BoundTable,
    query: RowQuery,
}

impl TableSource {
    /// `created_at` of a selected row in Unix microseconds: the merge order (NULL last, as
    /// `ORDER BY` puts it).
    fn created_us(&self, row: &Row) -> Option<i64> {
        row.get(self.table.relation.columns.len())
    }

    /// The record for one row, as the live stream builds it, plus the replay header. The
    /// commit time is the row's own when tracked, else `created_at` stands in for it (it only
    /// matters without an `outbox.timestamp_column`). Both are cut to milliseconds as live.
    fn event(&self, row: &Row) -> Result<OutboxEvent, MappingError> {
        let commit_us: Option<i64> = row.get(self.table.relation.columns.len() + 1);
        let commit_time_ms = commit_us
            .or_else(|| self.created_us(row))
            .map_or_else(now_ms, |us| us / 1000);
        let mut event = self
            .bound
            .to_event(&self.table.tuple(row), commit_time_ms)?;
        event.record.headers.push((
            Arc::from(REPLAY_HEADER),
            Bytes::from_static(REPLAY_HEADER_VALUE.as_bytes()),
        ));
        Ok(event)
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// `schema.table` of a table's config.
fn display_name(config: &OutboxConfig) -> String {
    let (schema, table) = config.schema_and_table();
    format!("{schema}.{table}")
}

/// The outbox tables to replay: the one `--table` names, or every configured one.
fn choose_tables(
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

/// The table described by the catalog (the columns the publication sends) and bound by the
/// live mapping.
async fn bind_table(
    client: &Client,
    config: &Config,
    mapping: &OutboxMapping,
    table_config: &OutboxConfig,
) -> Result<(OutboxTable, BoundTable), OpsError> {
    let table = OutboxTable::describe(client, table_config, &config.postgres.publication)
        .await?
        .ok_or_else(|| ReplayError::MissingTable {
            table: display_name(table_config),
        })?;
    let created_at = created_at_column(&config.outbox);
    if !table.has_column(created_at) {
        return Err(ReplayError::MissingColumn {
            table: table.display.clone(),
            column: created_at.to_string(),
        }
        .into());
    }
    match mapping.bind(&table.relation) {
        Some(bound) => Ok((table, bound?)),
        // Unreachable: the table comes from the same configuration.
        None => Err(ReplayError::UnknownTable {
            table: table.display,
            configured: String::new(),
        }
        .into()),
    }
}

/// `track_commit_timestamp` is on: rows' commit times can be read back.
async fn commit_times_tracked(client: &Client) -> Result<bool, OpsError> {
    let row = client
        .query_one(
            "SELECT current_setting('track_commit_timestamp') = 'on'",
            &[],
        )
        .await
        .map_err(query_err("reading track_commit_timestamp"))?;
    Ok(row.get(0))
}

/// Runs the replay; see the module docs.
pub async fn run(config: &Config, options: &ReplayOptions) -> Result<ReplayReport, OpsError> {
    let selection = &options.selection;
    if selection.is_empty() {
        return Err(ReplayError::NoSelection.into());
    }
    let table_configs = choose_tables(&config.outbox, options.table.as_deref())?;
    let mapping = OutboxMapping::new(&config.outbox)?;
    let mut control = connect(config).await?;
    let client = control.client();
    match_walsender_output(client).await?;
    let commit_times = commit_times_tracked(client).await?;
    validate_times(client, selection).await?;
    let several = table_configs.len() > 1;
    let mut sources = Vec::with_capacity(table_configs.len());
    for table_config in &table_configs {
        let (table, bound) = bind_table(client, config, &mapping, table_config).await?;
        let query = RowQuery::new(&table, selection, commit_times);
        validate_values(client, &query, table_config, selection, several).await?;
        sources.push(TableSource {
            table,
            bound,
            query,
        });
    }
    let started = Instant::now();
    let tx = control
        .client_mut()
        .build_transaction()
        .isolation_level(IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await
        .map_err(query_err("starting a read-only transaction"))?;
    let mut tables = BTreeMap::new();
    for source in &sources {
        let query = &source.query;
        let matched: i64 = tx
            .query_one(&query.count_sql(), &query.params())
            .await
            .map_err(query_err(format!(
                "counting the selected rows of {}",
                query.table
            )))?
            .get(0);
        tables.insert(query.table.clone(), matched.max(0) as u64);
    }
    let mut walk = Walk::new(tables, options, started);
    let mut sender = if options.dry_run {
        None
    } else {
        Some(Sender::new(&config.kafka)?)
    };
    let stopped = walk.rows(&tx, &sources, sender.as_mut()).await.err();
    let _ = tx.rollback().await;
    if let Some(sender) = sender.as_mut() {
        sender
            .finish(config.kafka.message_timeout_ms, &mut walk.progress)
            .await;
    }
    walk.progress.clear();
    let commit_time = if commit_times {
        COMMIT_TIME_TRACKED
    } else {
        COMMIT_TIME_CREATED_AT
    };
    Ok(walk.report(sender, stopped, commit_time))
}

/// Checks the time flags against the server before anything is read or sent: one clear error
/// per bad value, and a time range that selects something.
async fn validate_times(client: &Client, selection: &Selection) -> Result<(), OpsError> {
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
async fn validate_values(
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

/// One table's selected rows, read a page at a time.
struct Cursor<'a> {
    source: &'a TableSource,
    portal: Portal,
    page: VecDeque<Row>,
    done: bool,
}

/// Going through the selected rows: counts, topics and progress.
struct Walk {
    matched: u64,
    tables: BTreeMap<String, u64>,
    dry_run: bool,
    mapped: u64,
    topics: BTreeMap<String, u64>,
    started: Instant,
    progress: Progress,
}

impl Walk {
    fn new(tables: BTreeMap<String, u64>, options: &ReplayOptions, started: Instant) -> Walk {
        let matched = tables.values().sum();
        Walk {
            matched,
            tables,
            dry_run: options.dry_run,
            mapped: 0,
            topics: BTreeMap::new(),
            started,
            progress: Progress::new(options.progress, matched),
        }
    }

    /// Pages through every table's rows, merged by `created_at` (ties: the configured table
    /// order), sending each (unless a dry run). Stops at the first failure: its description is
    /// the error.
    async fn rows(
        &mut self,
        tx: &Transaction<'_>,
        sources: &[TableSource],
        mut sender: Option<&mut Sender>,
    ) -> Result<(), String> {
        let mut cursors = Vec::with_capacity(sources.len());
        for source in sources {
            let statement = tx
                .prepare(&source.query.select_sql())
                .await
                .map_err(|e| format!("preparing the row query: {}", describe(&e)))?;
            let portal = tx
                .bind(&statement, &source.query.params())
                .await
                .map_err(|e| format!("selecting the rows: {}", describe(&e)))?;
            cursors.push(Cursor {
                source,
                portal,
                page: VecDeque::new(),
                done: false,
            });
        }
        loop {
            for cursor in cursors.iter_mut().filter(|c| c.page.is_empty() && !c.done) {
                let rows = tx
                    .query_portal(&cursor.portal, PAGE_ROWS)
                    .await
                    .map_err(|e| format!("reading the rows: {}", describe(&e)))?;
                cursor.done = rows.is_empty();
                cursor.page.extend(rows);
            }
            let next = cursors
                .iter()
                .enumerate()
                .filter_map(|(i, c)| {
                    let row = c.page.front()?;
                    Some((c.source.created_us(row).unwrap_or(i64::MAX), i))
                })
                .min();
            let Some((_, i)) = next else {
                return Ok(());
            };
            let cursor = &mut cursors[i];
            let Some(row) = cursor.page.pop_front() else {
                continue;
            };
            let event = cursor.source.event(&row).map_err(|e| e.to_string())?;
            *self.topics.entry(event.record.topic.clone()).or_default() += 1;
            self.mapped += 1;
            match sender.as_deref_mut() {
                Some(sender) => sender.send(&event, &mut self.progress).await?,
                None => self.progress.update(self.mapped),
            }
        }
    }

    fn report(
        self,
        sender: Option<Sender>,
        stopped: Option<String>,
        commit_time: &str,
    ) -> ReplayReport {
        let (sent, acknowledged, failed, failures) = match sender {
            Some(s) => (s.sent, s.acknowledged, s.failed, s.failures),
            None => (0, 0, 0, Vec::new()),
        };
        let complete = match self.dry_run {
            true => self.mapped == self.matched,
            false => failed == 0 && acknowledged == self.matched,
        };
        ReplayReport {
            ok: stopped.is_none() && complete,
            dry_run: self.dry_run,
            matched: self.matched,
            sent,
            acknowledged,
            failed,
            tables: self.tables,
            topics: self.topics,
            header: format!("{REPLAY_HEADER}: {REPLAY_HEADER_VALUE}"),
            commit_time: commit_time.to_string(),
            seconds: self.started.elapsed().as_secs_f64(),
            failures,
            stopped,
        }
    }
}

/// The producer side: sends with a bounded number in flight and counts acknowledgements.
struct Sender {
    publisher: Publisher,
    deliveries: mpsc::UnboundedReceiver<Delivery>,
    max_messages: usize,
    max_bytes: usize,
    in_flight: usize,
    in_flight_bytes: usize,
    sent: u64,
    acknowledged: u64,
    failed: u64,
    failures: Vec<String>,
}

impl Sender {
    fn new(kafka: &KafkaConfig) -> Result<Sender, OpsError> {
        let (publisher, deliveries) = Publisher::new(kafka)?;
        Ok(Sender {
            publisher,
            deliveries,
            max_messages: kafka.max_in_flight_messages.clamp(1, MAX_IN_FLIGHT),
            max_bytes: kafka.max_in_flight_bytes,
            in_flight: 0,
            in_flight_bytes: 0,
            sent: 0,
            acknowledged: 0,
            failed: 0,
            failures: Vec::new(),
        })
    }

    /// Waits for room, then hands the record to the producer. A failed delivery seen so far
    /// stops the replay: sending more would only pile up behind a broken topic or broker.
    async fn send(&mut self, event: &OutboxEvent, progress: &mut Progress) -> Result<(), String> {
        while self.in_flight >= self.max_messages || self.in_flight_bytes >= self.max_bytes {
            match self.deliveries.recv().await {
                Some(delivery) => self.handle(delivery),
                None => return Err("the Kafka producer went away".into()),
            }
        }
        while let Ok(delivery) = self.deliveries.try_recv() {
            self.handle(delivery);
        }
        progress.update(self.acknowledged);
        if self.failed > 0 {
            return Err("Kafka did not acknowledge a record (see the failures)".into());
        }
        self.publisher
            .send(&event.record, self.sent, &event.id)
            .await
            .map_err(|e| e.to_string())?;
        self.sent += 1;
        self.in_flight += 1;
        self.in_flight_bytes += event.record.size();
        Ok(())
    }

    fn handle(&mut self, delivery: Delivery) {
        self.in_flight = self.in_flight.saturating_sub(1);
        self.in_flight_bytes = self.in_flight_bytes.saturating_sub(delivery.bytes);
        match delivery.result {
            Ok(()) => self.acknowledged += 1,
            Err(failure) => {
                self.failed += 1;
                if self.failures.len() < MAX_LISTED_FAILURES {
                    self.failures.push(failure.rejection().to_string());
                }
            }
        }
    }

    /// Waits for every record in flight to be acknowledged or failed. librdkafka reports each
    /// within `message.timeout.ms`; past that (plus a grace) the rest count as failed.
    async fn finish(&mut self, message_timeout_ms: u64, progress: &mut Progress) {
        let deadline = Instant::now() + Duration::from_millis(message_timeout_ms) + ACK_GRACE;
        while self.in_flight > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            let wait = left.min(PROGRESS_INTERVAL);
            match tokio::time::timeout(wait, self.deliveries.recv()).await {
                Ok(Some(delivery)) => self.handle(delivery),
                Ok(None) => break,
                Err(_) if left.is_zero() => break,
                Err(_) => {}
            }
            progress.update(self.acknowledged);
        }
        if self.in_flight > 0 {
            self.failed += self.in_flight as u64;
            self.failures.push(format!(
                "{} records got no answer from Kafka within kafka.message_timeout_ms",
                self.in_flight
            ));
            self.in_flight = 0;
        }
    }
}

/// A one-line progress bar on stderr: done/total, rate, ETA. Off unless asked for.
struct Progress {
    enabled: bool,
    total: u64,
    started: Instant,
    last_drawn: Option<Instant>,
}

impl Progress {
    fn new(enabled: bool, total: u64) -> Progress {
        Progress {
            enabled: enabled && total > 0,
            total,
            started: Instant::now(),
            last_drawn: None,
        }
    }

    fn update(&mut self, done: u64) {
        if !self.enabled
            || self
                .last_drawn
                .is_some_and(|t| t.elapsed() < PROGRESS_INTERVAL)
        {
            return;
        }
        self.last_drawn = Some(Instant::now());
        let line = progress_line(done, self.total, self.started.elapsed().as_secs_f64());
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "\r\x1b[2K{line}");
        let _ = err.flush();
    }

    fn clear(&mut self) {
        if self.enabled && self.last_drawn.is_some() {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[2K");
            let _ = err.flush();
        }
    }
}

/// `[########----------------]  1200/5000  24%  830 records/s  ETA 5 s`
fn progress_line(done: u64, total: u64, elapsed_s: f64) -> String {
    const WIDTH: u64 = 24;
    let total = total.max(1);
    let done = done.min(total);
    let filled = (done * WIDTH / total) as usize;
    let bar = format!(
        "{}{}",
        "#".repeat(filled),
        "-".repeat(WIDTH as usize - filled)
    );
    let rate = if elapsed_s > 0.0 {
        done as f64 / elapsed_s
    } else {
        0.0
    };
    let eta = if rate > 0.0 {
        format::duration((total - done) as f64 / rate)
    } else {
        "?".to_string()
    };
    format!(
        "[{bar}] {done}/{total} {:>3}%  {rate:.0} records/s  ETA {eta}",
        done * 100 / total
    )
}

impl fmt::Display for ReplayReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.matched == 0 && self.stopped.is_none() {
            return writeln!(f, "no events match the selection: nothing to replay");
        }
        self.write_headline(f)?;
        if self.tables.len() > 1 {
            let tables: Vec<String> = self
                .tables
                .iter()
                .map(|(table, n)| format!("{table} ({n})"))
                .collect();
            writeln!(f, "  from {}", tables.join(", "))?;
        }
        let width = self.topics.keys().map(String::len).max().unwrap_or(0);
        for (topic, n) in &self.topics {
            writeln!(f, "  {topic:<width$}  {n}")?;
        }
        if self.commit_time == COMMIT_TIME_CREATED_AT {
            writeln!(f, "  record timestamps: outbox.timestamp_column where set, else created_at (the original commit time is not known: track_commit_timestamp is off)")?;
        }
        for failure in &self.failures {
            writeln!(f, "  failed: {failure}")?;
        }
        if self.stopped.is_some() {
            writeln!(f, "fix the cause, then run the same replay again: it re-sends all {} (consumers deduplicate by event id)", self.matched)?;
        } else if !self.ok {
            writeln!(f, "the acknowledged events are in Kafka; running the same replay again re-sends all {} (consumers deduplicate by event id)", self.matched)?;
        }
        Ok(())
    }
}

impl ReplayReport {
    fn write_headline(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let topics = format::count(self.topics.len() as u64, "topic");
        if let Some(reason) = &self.stopped {
            let done = if self.dry_run {
                self.topics.values().sum()
            } else {
                self.acknowledged
            };
            return writeln!(
                f,
                "replay STOPPED after {done} of {} events: {reason}",
                self.matched
            );
        }
        if self.dry_run {
            return writeln!(
                f,
                "dry run: {} match and would be re-published to {topics}; nothing was sent",
                format::count(self.matched, "event")
            );
        }
        if !self.ok {
            return writeln!(
                f,
                "replay FAILED: {} of {} events were not acknowledged by Kafka ({} acknowledged)",
                self.failed, self.matched, self.acknowledged
            );
        }
        let rate = self.acknowledged as f64 / self.seconds.max(0.001);
        writeln!(
            f,
            "replayed {} to {topics} in {:.1} s ({rate:.0} events/s), each with header {}",
            format::count(self.acknowledged, "event"),
            self.seconds,
            self.header
        )
    }
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
        outbox.message_prefix = "outbox".into();
        assert!(matches!(
            choose_tables(&outbox, None),
            Err(ReplayError::NoTable)
        ));
    }

    #[test]
    fn a_bad_value_names_the_table_and_suggests_table_when_several() {
        let err = |several| ReplayError::BadValue {
            flag: "--from-id",
            value: "42".into(),
            table: "app.events".into(),
            column: "id".into(),
            reason: "invalid input syntax for type uuid".into(),
            several,
        };
        let one = err(false).to_string();
        assert!(
            one.contains("not a valid value of column `id` of app.events"),
            "{one}"
        );
        assert!(!one.contains("--table"), "{one}");
        assert!(err(true)
            .to_string()
            .ends_with("name one table with --table"));
    }

    #[test]
    fn only_a_missing_column_is_not_a_usage_error() {
        assert!(ReplayError::NoSelection.is_usage());
        assert!(ReplayError::EmptyRange {
            since: "b".into(),
            until: "a".into()
        }
        .is_usage());
        assert!(!ReplayError::MissingColumn {
            table: "t".into(),
            column: "created_at".into()
        }
        .is_usage());
    }

    #[test]
    fn progress_line_shows_rate_and_eta() {
        let line = progress_line(1200, 5000, 2.0);
        assert!(line.contains("1200/5000  24%"), "{line}");
        assert!(line.contains("600 records/s"), "{line}");
        assert!(line.contains("ETA 6 s"), "{line}");
        assert!(progress_line(0, 0, 0.0).contains("ETA ?"));
    }

    #[test]
    fn summary_names_the_header_and_failures() {
        let mut report = ReplayReport {
            ok: true,
            dry_run: false,
            matched: 3,
            sent: 3,
            acknowledged: 3,
            failed: 0,
            tables: BTreeMap::from([("app.a".to_string(), 1), ("public.outbox".to_string(), 2)]),
            topics: BTreeMap::from([("a".to_string(), 2), ("bb".to_string(), 1)]),
            header: format!("{REPLAY_HEADER}: {REPLAY_HEADER_VALUE}"),
            commit_time: COMMIT_TIME_TRACKED.into(),
            seconds: 1.0,
            failures: Vec::new(),
            stopped: None,
        };
        let text = report.to_string();
        assert!(text.starts_with("replayed 3 events to 2 topics"), "{text}");
        assert!(text.contains("outbox-relay-replay: true"), "{text}");
        assert!(text.contains("from app.a (1), public.outbox (2)"), "{text}");
        assert!(!text.contains("record timestamps"), "{text}");
        report.commit_time = COMMIT_TIME_CREATED_AT.into();
        assert!(
            report.to_string().contains("track_commit_timestamp is off"),
            "{report}"
        );
        report.ok = false;
        report.acknowledged = 2;
        report.failed = 1;
        report.failures = vec!["event x for topic `a`: timed out".into()];
        let text = report.to_string();
        assert!(text.starts_with("replay FAILED: 1 of 3 events"), "{text}");
        assert!(text.contains("failed: event x"), "{text}");
    }
}
