//! Rows kept by id: the outbox rows of events whose dead letter could keep neither payload
//! nor row image (`sink::dead_letter::lost_content`: an event larger than the dead-letter
//! topic and the producer take). Such a dead letter names its row
//! (`outbox-relay.dlq.outbox-row`), and the row is its event's only copy once the slot is
//! confirmed past it: the relay records it in [`KEPT_TABLE`] (beside the hold table, in the
//! schema of the first outbox table) before the dead letter is sent, and the sweeper deletes
//! no row recorded there (nor drops a partition holding one). `dead-letters redrive` re-sends
//! the event from the row and then deletes the record; so can the operator (`DELETE FROM
//! outbox_relay_kept_rows WHERE …`), and the row is then swept as any confirmed row.
//!
//! The record is made before the slot can be confirmed past the row (the dead letter is sent
//! after it, and the slot waits for the dead letter's acknowledgement), so no sweep can have
//! deleted the row first: a sweep deletes only rows the slot confirmed. A row already gone
//! (the application deletes it in its inserting transaction) cannot be kept: the relay stops
//! before confirming past it, as without this table.
//!
//! A row is matched by its id column's text (`id::text`, which is pgoutput's text output for
//! the usual id types: uuid, integers, text).

use tokio_postgres::Client;
use tracing::warn;

use crate::config::Config;
use crate::postgres::control::{query_err, quote_ident, ControlError};

/// The table of kept rows; it lives in the schema of the first configured outbox table.
pub const KEPT_TABLE: &str = "outbox_relay_kept_rows";

/// An outbox row to keep: its table (`schema.table`), id column and id (text).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeptRow {
    pub table: String,
    pub id_column: String,
    pub id: String,
    /// The event it stands for, and why its dead letter could not keep it (for the record).
    pub event_id: String,
    pub reason: String,
}

/// What [`KeptRows::keep`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kept {
    /// The row exists and is recorded: the sweeper leaves it.
    Kept,
    /// The row exists; it could not be recorded, which is tolerated because this relay does
    /// not sweep (logged).
    Unrecorded,
    /// No such row (deleted already): nothing can keep the event.
    Gone,
}

/// The kept rows of one slot, in the table the configuration names.
#[derive(Debug, Clone, Default)]
pub struct KeptRows {
    /// Quoted `schema.table` of the kept-rows table; `None` without an outbox table.
    relation: Option<String>,
    slot: String,
    /// This relay sweeps: a row that cannot be recorded is an error.
    required: bool,
}

impl KeptRows {
    pub fn new(config: &Config) -> KeptRows {
        let relation = config
            .outbox
            .publication_tables()
            .first()
            .map(|(schema, _)| format!("{}.{}", quote_ident(schema), quote_ident(KEPT_TABLE)));
        KeptRows {
            relation,
            slot: config.postgres.slot.clone(),
            required: config.outbox.sweeper.enabled,
        }
    }

    /// The kept-rows table, quoted.
    pub fn relation(&self) -> Option<&str> {
        self.relation.as_deref()
    }

    /// Whether the table exists.
    pub async fn exists(&self, client: &Client) -> Result<bool, ControlError> {
        let Some(relation) = &self.relation else {
            return Ok(false);
        };
        let row = client
            .query_one("SELECT to_regclass($1) IS NOT NULL", &[relation])
            .await
            .map_err(query_err("looking for the kept-rows table"))?;
        Ok(row.get(0))
    }

    async fn ensure_table(&self, client: &Client, relation: &str) -> Result<(), ControlError> {
        if self.exists(client).await? {
            return Ok(());
        }
        let sql = format!(
            "CREATE TABLE IF NOT EXISTS {relation} (
                 slot         text        NOT NULL,
                 outbox_table text        NOT NULL,
                 row_id       text        NOT NULL,
                 event_id     text        NOT NULL,
                 reason       text        NOT NULL,
                 kept_at      timestamptz NOT NULL DEFAULT now(),
                 PRIMARY KEY (slot, outbox_table, row_id))"
        );
        client.batch_execute(&sql).await.map_err(|e| {
            ControlError::Setup(format!(
                "cannot create the kept-rows table {relation}: {}; create it as its schema's owner (migrations/003_kept_rows.sql) and grant this role SELECT, INSERT, DELETE on it",
                crate::postgres::control::describe(&e)
            ))
        })
    }

    /// Keeps `row` from the sweeper, if it exists. Required when this relay sweeps: then a row
    /// that cannot be recorded is an error (the session restarts and tries again); otherwise
    /// it is logged and the row stays in the outbox as long as nobody deletes it.
    pub async fn keep(&self, client: &Client, row: &KeptRow) -> Result<Kept, ControlError> {
        let (schema, table) = row.table.split_once('.').unwrap_or(("public", &row.table));
        let outbox = format!("{}.{}", quote_ident(schema), quote_ident(table));
        let sql = format!(
            "SELECT EXISTS (SELECT 1 FROM {outbox} WHERE {})",
            id_is(&row.id_column, &row.id)
        );
        let exists: bool = client
            .query_one(&sql, &[])
            .await
            .map_err(query_err(format!("looking for row {} of {outbox}", row.id)))?
            .get(0);
        if !exists {
            return Ok(Kept::Gone);
        }
        match self.record(client, row).await {
            Ok(()) => Ok(Kept::Kept),
            Err(e) if !self.required => {
                warn!(table = %row.table, id = %row.id, error = %e,
                    "cannot record the outbox row its dead letter names (this relay's sweeper is off): a relay that sweeps this outbox could delete it before `dead-letters redrive` re-sends it");
                Ok(Kept::Unrecorded)
            }
            Err(e) => Err(e),
        }
    }

    async fn record(&self, client: &Client, row: &KeptRow) -> Result<(), ControlError> {
        let Some(relation) = &self.relation else {
            return Err(ControlError::Setup(
                "no outbox table is configured: no row can be kept".into(),
            ));
        };
        self.ensure_table(client, relation).await?;
        let sql = format!(
            "INSERT INTO {relation} (slot, outbox_table, row_id, event_id, reason)
             VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (slot, outbox_table, row_id) DO NOTHING"
        );
        client
            .execute(
                &sql,
                &[&self.slot, &row.table, &row.id, &row.event_id, &row.reason],
            )
            .await
            .map_err(query_err(format!(
                "keeping row {} of {}",
                row.id, row.table
            )))?;
        Ok(())
    }

    /// Stops keeping row `id` of `table` (`schema.table`); returns whether it was kept.
    pub async fn release(
        &self,
        client: &Client,
        table: &str,
        id: &str,
    ) -> Result<bool, ControlError> {
        let Some(relation) = &self.relation else {
            return Ok(false);
        };
        if !self.exists(client).await? {
            return Ok(false);
        }
        let sql =
            format!("DELETE FROM {relation} WHERE slot = $1 AND outbox_table = $2 AND row_id = $3");
        let deleted = client
            .execute(&sql, &[&self.slot, &table, &id])
            .await
            .map_err(query_err(format!("releasing row {id} of {table}")))?;
        Ok(deleted > 0)
    }
}

/// The condition the sweeper adds for the rows of one outbox table (`o`): none kept by the
/// slot (`$slot`, a parameter) under its id column.
pub fn not_kept_sql(relation: &str, id_column: &str, slot_param: &str) -> String {
    format!(
        "NOT EXISTS (SELECT 1 FROM {relation} k
                     WHERE k.slot = {slot_param} AND k.row_id = o.{}::text)",
        quote_ident(id_column)
    )
}

/// The condition that selects the row whose `id_column` is `id` (text): a literal of unknown
/// type takes the column's type, so the table's index finds it.
pub fn id_is(id_column: &str, id: &str) -> String {
    format!("{} = {}", quote_ident(id_column), escaped_literal(id))
}

/// `value` as an escape-string literal (`E'…'`), whatever `standard_conforming_strings` says.
fn escaped_literal(value: &str) -> String {
    format!("E'{}'", value.replace('\\', "\\\\").replace('\'', "\\'"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_is_quoted_whatever_it_holds() {
        assert_eq!(escaped_literal("a'b\\c"), "E'a\\'b\\\\c'");
        assert_eq!(escaped_literal("42"), "E'42'");
    }

    #[test]
    fn the_kept_rows_table_lives_beside_the_first_outbox_table() {
        let mut config = Config::default();
        config.outbox.table = "app.events".into();
        assert_eq!(
            KeptRows::new(&config).relation(),
            Some("\"app\".\"outbox_relay_kept_rows\"")
        );
        let sql = not_kept_sql("\"app\".\"outbox_relay_kept_rows\"", "Id", "$5");
        assert!(
            sql.contains("k.slot = $5 AND k.row_id = o.\"Id\"::text"),
            "{sql}"
        );
    }
}
