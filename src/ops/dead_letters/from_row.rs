//! A dead letter that kept neither payload nor row image names its outbox row (kept from the
//! sweeper by the relay, `relay::sweeper::kept`): the redrive reads that row by id, as
//! `replay` reads rows (`ops::rows`: the published columns in their text output, as pgoutput
//! sends them), and maps it with the current configuration. Once its record is acknowledged
//! the row is released (`Run::commit`), and the sweeper may delete it as any confirmed row.

use std::collections::HashMap;

use crate::config::Config;
use crate::mapping::{BoundTable, OutboxEvent, OutboxMapping};
use crate::ops::rows::{match_walsender_output, OutboxTable};
use crate::ops::{connect, OpsError};
use crate::postgres::control::{query_err, Control};
use crate::relay::sweeper::kept::{id_is, KeptRows};

/// What reading a named row found.
pub(super) enum Found {
    Event(Box<OutboxEvent>),
    /// Not redriven; why (the row is gone, its table is not configured, it does not map).
    Leave(String),
}

/// The connection the rows are read (and released) on, made at the first named row.
pub(super) struct Rows {
    control: Control,
    /// Each outbox table met, described and bound (`schema.table`).
    tables: HashMap<String, (OutboxTable, BoundTable)>,
    pub(super) kept: KeptRows,
}

impl Rows {
    pub(super) async fn connect(config: &Config) -> Result<Rows, OpsError> {
        let control = connect(config).await?;
        match_walsender_output(control.client()).await?;
        Ok(Rows {
            control,
            tables: HashMap::new(),
            kept: KeptRows::new(config),
        })
    }

    /// The row `id` of `table` as the live stream would map it; `time_ms` (the dead letter's
    /// timestamp: its event's) stands in for the commit time.
    pub(super) async fn read(
        &mut self,
        config: &Config,
        mapping: &OutboxMapping,
        table: &str,
        id: &str,
        time_ms: i64,
    ) -> Result<Found, OpsError> {
        if !self.tables.contains_key(table) {
            let configs = config.outbox.table_configs();
            let named = configs.iter().find(|c| {
                let (schema, name) = c.schema_and_table();
                format!("{schema}.{name}") == table
            });
            let Some(table_config) = named else {
                return Ok(Found::Leave(format!(
                    "its outbox row is in {table}, which is not a configured outbox table"
                )));
            };
            let client = self.control.client();
            let described =
                OutboxTable::describe(client, table_config, &config.postgres.publication).await?;
            let Some(described) = described else {
                return Ok(Found::Leave(format!("outbox table {table} does not exist")));
            };
            let bound = match mapping.bind(&described.relation) {
                Some(Ok(bound)) => bound,
                Some(Err(e)) => return Ok(Found::Leave(e.to_string())),
                None => {
                    return Ok(Found::Leave(format!(
                        "{table} is not a configured outbox table"
                    )))
                }
            };
            self.tables.insert(table.to_string(), (described, bound));
        }
        let Some((described, bound)) = self.tables.get(table) else {
            return Ok(Found::Leave(format!("{table} is not described")));
        };
        let sql = format!(
            "SELECT {} FROM {} WHERE {} LIMIT 1",
            described.select_list(),
            described.quoted,
            id_is(&described.config.id_column, id)
        );
        let row = self
            .control
            .client()
            .query_opt(&sql, &[])
            .await
            .map_err(query_err(format!("reading row {id} of {table}")))?;
        let Some(row) = row else {
            return Ok(Found::Leave(format!(
                "its outbox row {id} of {table} is gone (deleted since)"
            )));
        };
        Ok(match bound.to_event(&described.tuple(&row), time_ms) {
            Ok(event) => Found::Event(Box::new(event)),
            Err(e) => Found::Leave(format!("its outbox row does not map: {e}")),
        })
    }

    /// No longer keeps row `id` of `table` from the sweeper.
    pub(super) async fn release(&self, table: &str, id: &str) -> Result<bool, OpsError> {
        Ok(self.kept.release(self.control.client(), table, id).await?)
    }
}
