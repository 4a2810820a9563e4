//! Rows as the live stream would have carried them: each table described as pgoutput's
//! Relation, bound by the live [`OutboxMapping`], and each row turned into the same record
//! (topic, key, partition, payload, headers, timestamp) plus [`super::REPLAY_HEADER`].

use std::sync::Arc;

use bytes::Bytes;
use tokio_postgres::{Client, Row};

use super::select::{display_name, RowQuery};
use super::{ReplayError, REPLAY_HEADER, REPLAY_HEADER_VALUE};
use crate::clock::unix_ms;
use crate::config::{Config, OutboxConfig};
use crate::mapping::{BoundTable, MappingError, OutboxEvent, OutboxMapping};
use crate::ops::rows::{created_at_column, OutboxTable};
use crate::ops::OpsError;

/// One table of the replay: described, bound by the live mapping, and its query.
pub(super) struct TableSource {
    pub(super) table: OutboxTable,
    pub(super) bound: BoundTable,
    pub(super) query: RowQuery,
}

impl TableSource {
    /// `created_at` of a selected row in Unix microseconds: the merge order (NULL last, as
    /// `ORDER BY` puts it).
    pub(super) fn created_us(&self, row: &Row) -> Option<i64> {
        row.get(self.table.relation.columns.len())
    }

    /// The record for one row, as the live stream builds it, plus the replay header. The
    /// commit time is the row's own when tracked, else `created_at` stands in for it (it only
    /// matters without an `outbox.timestamp_column`). Both are cut to milliseconds as live.
    pub(super) fn event(&self, row: &Row) -> Result<OutboxEvent, MappingError> {
        let commit_us: Option<i64> = row.get(self.table.relation.columns.len() + 1);
        let commit_time_ms = commit_us
            .or_else(|| self.created_us(row))
            .map_or_else(unix_ms, |us| us / 1000);
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

/// The table described by the catalog (the columns the publication sends) and bound by the
/// live mapping.
pub(super) async fn bind_table(
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
