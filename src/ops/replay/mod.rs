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
//!
//! The steps, one file each: `select` turns the flags into checked, parameterised SQL per
//! table; `rebuild` describes each table as pgoutput would and maps its rows with the live
//! mapping; `walk` pages through the tables in one snapshot, merged by `created_at`; `send`
//! hands records to Kafka within the in-flight window (the relay's
//! [`crate::sink::window::InFlight`]) and waits for the acknowledgements; `progress` draws the
//! bar; `report` says what happened. This file is the command that runs them in order.

mod holds;
pub(crate) mod progress;
mod rebuild;
mod report;
mod select;
mod send;
mod walk;

use std::collections::BTreeMap;
use std::time::Instant;

use tokio_postgres::IsolationLevel;

use super::rows::match_walsender_output;
use super::{connect, OpsError};
use crate::config::Config;
use crate::mapping::OutboxMapping;
use crate::postgres::control::query_err;
use crate::relay::sweeper::hold::HoldStore;
use rebuild::{bind_table, TableSource};
pub use report::ReplayReport;
use select::{
    choose_tables, commit_times_tracked, display_name, validate_times, validate_values, RowQuery,
};
use send::Sender;
use walk::Walk;

/// Header added to every replayed record, so consumers can tell a replay from the live stream.
pub const REPLAY_HEADER: &str = "outbox-relay-replay";
pub const REPLAY_HEADER_VALUE: &str = "true";
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
    // Before the snapshot: it then holds every row these holds keep.
    let store = HoldStore::new(config);
    let names: Vec<String> = table_configs.iter().map(display_name).collect();
    let held = holds::read(client, &store, &names).await;
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
    // In the same snapshot as the rows sent: what of each hold the selection leaves out.
    let unselected = holds::unselected(&tx, &sources, &held).await?;
    let mut walk = Walk::new(tables, options, started);
    let mut sender = if options.dry_run {
        None
    } else {
        Some(Sender::new(config)?)
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
    let mut report = walk.report(sender, stopped, commit_time);
    let delivered = report.ok && !report.dry_run;
    report.sweeper_holds =
        holds::settle(control.client(), &store, held, &unselected, delivered).await?;
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
