//! The sweeper hold: what keeps the rows a new slot never streamed until the operator says
//! they were delivered.
//!
//! A slot streams only what commits after its creation. When a slot is created anew (after a
//! lost or dropped one, by `outbox-relay slot create` or by the relay with
//! `postgres.create_slot`), the rows committed before that — the gap a `replay` is meant to
//! re-send — are "confirmed" by the new slot at once (its position starts at "now"), so the
//! sweeper's rule alone would delete them. Whoever creates the slot therefore **arms a hold**
//! right after: one row per outbox table in [`HOLD_TABLE`] (in the schema of the first
//! configured outbox table), keyed by slot and table, holding `below_xid`, a transaction id
//! assigned after the slot existed. The sweeper deletes no row whose inserting transaction id
//! is below it (why that is exactly the rows the slot did not stream: see the sweeper's module
//! docs).
//!
//! The table is durable and shared: it survives restarts, every relay (standbys included) and
//! every operator command reads the same rows, and a promoted physical standby has it too. It
//! is released (its row deleted) by:
//! - `outbox-relay replay` that re-sent every row the hold keeps (checked by transaction id in
//!   the replay's snapshot, not by `created_at`; see `ops::replay::holds`), not a dry run, all
//!   acknowledged;
//! - the sweeper itself, when no row of the table is below `below_xid` any more (nothing left
//!   to protect: an empty outbox, insert-then-delete, a first start on an empty table), unless
//!   the hold still keeps every row;
//! - the operator: `outbox-relay slot release-hold --yes` (or `DELETE FROM
//!   outbox_relay_sweeper_hold WHERE slot = '…'`); the gap's rows are then swept as confirmed.
//!
//! A slot created by other means (`pg_create_logical_replication_slot` by hand) arms no hold.
//!
//! # An interrupted creation
//!
//! Arming takes two steps around the slot's creation (see the sweeper's module docs): a hold
//! that keeps every row ([`KEEPS_EVERY_ROW`]), the slot, then the real boundary. A process
//! that dies in between leaves the first kind, and the sweeper deletes nothing of that table
//! from then on (the sweeper never releases such a hold by itself: it does not know where the
//! slot's stream begins). [`HoldStore::complete_interrupted`] resolves it — at every session
//! of the relay and in `outbox-relay slot create` — with the same rule as a creation: the
//! boundary is a transaction id assigned *after* the slot was seen created, which it can
//! prove only when the slot exists and its creation has finished (`confirmed_flush_lsn` is
//! set once `pg_create_logical_replication_slot` has found its starting point). A transaction
//! with an id at or above it commits after the slot's start and is in its stream; every row
//! below it stays held, the gap's and those the slot streamed between its creation and the
//! completion alike (more than needed, never less). Otherwise the hold keeps every row, is
//! shown by `status` and logged with the fix, and the next session tries again.

use serde::Serialize;
use tokio_postgres::Client;
use tracing::{info, warn};

use super::{HORIZON_CTE, XMIN64, XMIN64_FROM};
use crate::config::Config;
use crate::lsn::Lsn;
use crate::postgres::control::{query_err, quote_ident, ControlError};

/// The hold table's name; it lives in the schema of the first configured outbox table.
pub const HOLD_TABLE: &str = "outbox_relay_sweeper_hold";

/// Why a hold was armed, as recorded in its row.
pub const ARMED_BY_SLOT_CREATE: &str = "outbox-relay slot create";
pub const ARMED_BY_RELAY: &str = "created by the relay (postgres.create_slot)";
/// Appended to a hold's reason when [`HoldStore::complete_interrupted`] completed it.
pub const COMPLETED_AFTER_INTERRUPTION: &str = "; completed after an interrupted creation";

/// The boundary of a hold armed before its slot's creation finished: every row is kept.
pub const KEEPS_EVERY_ROW: i64 = i64::MAX;

/// One hold: the rows of `table` inserted by transactions below `below_xid` stay.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Hold {
    pub slot: String,
    /// `schema.table` of the outbox table.
    pub table: String,
    /// Rows whose inserting transaction id (64-bit) is below this are kept.
    pub below_xid: i64,
    /// The new slot's `confirmed_flush_lsn` when the hold was armed: where its stream begins.
    pub slot_start: Option<Lsn>,
    /// When it was armed (server time, `timestamptz` text).
    pub armed_at: String,
    /// Seconds since it was armed (server clock).
    pub age_seconds: i64,
    pub reason: String,
    /// Armed before its slot's creation finished ([`KEEPS_EVERY_ROW`]): the sweeper deletes
    /// nothing of the table until it is completed (see the module docs).
    pub keeps_every_row: bool,
}

/// What [`HoldStore::complete_interrupted`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Interrupted {
    /// No hold of the slot keeps every row.
    Nothing,
    /// Completed with a boundary assigned after the slot was seen created.
    Completed(Vec<Hold>),
    /// Still keeps every row of `tables`, because of `why`.
    Pending { tables: Vec<String>, why: String },
}

/// Whether the slot's creation has surely finished, as step 2 of
/// [`HoldStore::complete_interrupted`] sees it: only then may a hold that keeps every row get
/// a boundary.
enum SlotCreation {
    /// Finished: the slot's confirmed position, where its stream starts.
    Finished { start: String },
    /// Not surely finished (absent, still being created, or held by another backend): why.
    Unsure { why: String },
}

/// The holds of one slot, in the table the configuration names.
#[derive(Debug, Clone)]
pub struct HoldStore {
    /// Quoted `schema.table` of the hold table; `None` without an outbox table (nothing to
    /// sweep, nothing to hold).
    relation: Option<String>,
    /// `(schema, table)` of every configured outbox table.
    tables: Vec<(String, String)>,
    slot: String,
    /// This relay sweeps: a hold that cannot be armed refuses the slot's creation.
    required: bool,
}

impl HoldStore {
    pub fn new(config: &Config) -> HoldStore {
        let tables = config.outbox.publication_tables();
        let relation = tables
            .first()
            .map(|(schema, _)| format!("{}.{}", quote_ident(schema), quote_ident(HOLD_TABLE)));
        HoldStore {
            relation,
            tables,
            slot: config.postgres.slot.clone(),
            required: config.outbox.sweeper.enabled,
        }
    }

    /// The hold table, quoted (for messages and SQL).
    pub fn relation(&self) -> Option<&str> {
        self.relation.as_deref()
    }

    /// Creates the hold table unless it exists, and checks that this role may use it. Run
    /// before creating a slot, so that a role that cannot arm a hold finds out before the slot
    /// exists.
    pub async fn ensure_table(&self, client: &Client) -> Result<(), ControlError> {
        let Some(relation) = &self.relation else {
            return Ok(());
        };
        if !self.table_exists(client).await? {
            // IF NOT EXISTS: another relay may create it at the same moment.
            let sql = format!(
                "CREATE TABLE IF NOT EXISTS {relation} (
                     slot           text        NOT NULL,
                     outbox_table   text        NOT NULL,
                     below_xid      bigint      NOT NULL,
                     slot_start_lsn pg_lsn,
                     armed_at       timestamptz NOT NULL DEFAULT now(),
                     reason         text        NOT NULL,
                     PRIMARY KEY (slot, outbox_table))"
            );
            client.batch_execute(&sql).await.map_err(|e| {
                ControlError::Setup(format!(
                    "cannot create the sweeper hold table {relation}: {}; create it as its schema's owner (migrations/002_sweeper_hold.sql) and grant this role SELECT, INSERT, UPDATE, DELETE on it",
                    crate::postgres::control::describe(&e)
                ))
            })?;
        }
        let allowed: bool = client
            .query_one(
                // One privilege per call: with a list, has_table_privilege says whether
                // *any* of them is held.
                "SELECT has_table_privilege($1::text::regclass, 'SELECT')
                        AND has_table_privilege($1::text::regclass, 'INSERT')
                        AND has_table_privilege($1::text::regclass, 'UPDATE')
                        AND has_table_privilege($1::text::regclass, 'DELETE')",
                &[relation],
            )
            .await
            .map_err(query_err(
                "checking the privileges on the sweeper hold table",
            ))?
            .get(0);
        if !allowed {
            return Err(ControlError::Setup(format!(
                "this role may not use the sweeper hold table {relation}: GRANT SELECT, INSERT, UPDATE, DELETE ON {relation} TO <the relay's role>"
            )));
        }
        Ok(())
    }

    async fn table_exists(&self, client: &Client) -> Result<bool, ControlError> {
        let Some(relation) = &self.relation else {
            return Ok(false);
        };
        let row = client
            .query_one("SELECT to_regclass($1) IS NOT NULL", &[relation])
            .await
            .map_err(query_err("looking for the sweeper hold table"))?;
        Ok(row.get(0))
    }

    /// Before a slot is created: holds **every** row (`below_xid` = `i64::MAX`), so that no
    /// sweep can run between the slot's creation and [`HoldStore::after_creation`] unheld.
    /// Required when this relay sweeps (`outbox.sweeper.enabled`): then an error refuses the
    /// slot's creation; otherwise it is logged and the slot created without a hold.
    pub async fn before_creation(&self, client: &Client, reason: &str) -> Result<(), ControlError> {
        let armed = self.arm(client, Boundary::Everything, reason).await;
        self.tolerate(armed.map(|_| ()))
    }

    /// After the slot exists: the boundary becomes a transaction id assigned now, above every
    /// transaction id assigned before the slot existed (see the module docs).
    pub async fn after_creation(
        &self,
        client: &Client,
        slot_start: Option<Lsn>,
        reason: &str,
    ) -> Result<Vec<Hold>, ControlError> {
        let armed = self.arm(client, Boundary::Now(slot_start), reason).await;
        match armed {
            Ok(holds) => Ok(holds),
            Err(e) => self.tolerate(Err(e)).map(|_| Vec::new()),
        }
    }

    fn tolerate(&self, result: Result<(), ControlError>) -> Result<(), ControlError> {
        match result {
            Err(e) if !self.required => {
                warn!(error = %e, slot = %self.slot,
                    "no sweeper hold armed for the new slot (this relay's sweeper is off): a relay that sweeps this outbox could delete rows the new slot never streamed");
                Ok(())
            }
            other => other,
        }
    }

    /// Arms (or re-arms) a hold on every outbox table. Re-arming replaces an older hold of
    /// the same slot and table: the new boundary is higher, so it keeps what the old one kept.
    async fn arm(
        &self,
        client: &Client,
        boundary: Boundary,
        reason: &str,
    ) -> Result<Vec<Hold>, ControlError> {
        let Some(relation) = &self.relation else {
            return Ok(Vec::new());
        };
        self.ensure_table(client).await?;
        let (below, slot_start) = match boundary {
            Boundary::Everything => (format!("{KEEPS_EVERY_ROW}::bigint"), None),
            Boundary::Now(start) => ("pg_current_xact_id()::text::bigint".to_string(), start),
        };
        let tables: Vec<String> = self
            .tables
            .iter()
            .map(|(schema, table)| format!("{schema}.{table}"))
            .collect();
        let start = slot_start.map(|l| l.to_string());
        let sql = format!(
            "INSERT INTO {relation} AS h (slot, outbox_table, below_xid, slot_start_lsn, reason)
             SELECT $1, t, {below}, $2::text::pg_lsn, $3
             FROM unnest($4::text[]) t
             ON CONFLICT (slot, outbox_table) DO UPDATE
                 SET below_xid = excluded.below_xid, slot_start_lsn = excluded.slot_start_lsn,
                     armed_at = excluded.armed_at, reason = excluded.reason
             RETURNING {RETURNED}"
        );
        let rows = client
            .query(&sql, &[&self.slot, &start, &reason, &tables])
            .await
            .map_err(query_err(format!("arming the sweeper hold in {relation}")))?;
        let holds: Vec<Hold> = rows.iter().map(hold_from_row).collect();
        for hold in holds
            .iter()
            .filter(|_| matches!(boundary, Boundary::Now(_)))
        {
            info!(slot = %hold.slot, table = %hold.table, below_xid = hold.below_xid,
                reason = %hold.reason,
                "sweeper hold armed: rows committed before the slot existed stay until a replay covers them");
        }
        Ok(holds)
    }

    /// Completes the slot's holds that still keep every row, when that is provably safe (see
    /// "An interrupted creation" in the module docs). Three steps, in this order:
    ///
    /// 1. the holds that keep every row, and the version (`xmin`) of each;
    /// 2. the slot: it must exist with its `confirmed_flush_lsn` set, held by no backend or
    ///    by the caller's own stream (creation finished: from PostgreSQL 17 on a slot being
    ///    created shows its position early, but its creator holds it until it is done);
    /// 3. one `UPDATE` of exactly those versions to `pg_current_xact_id()`, an id assigned in
    ///    that statement, after step 2.
    ///
    /// A hold armed again between 1 and 3 (a new creation of the slot, which may not have
    /// finished) has another version and is left as it is, also when the `UPDATE` has to wait
    /// for it (PostgreSQL checks the condition again on the new version).
    /// `streaming`: the backend pid of the caller's own replication connection, when it holds
    /// the slot (then its creation has surely finished).
    pub async fn complete_interrupted(
        &self,
        client: &Client,
        streaming: Option<i32>,
    ) -> Result<Interrupted, ControlError> {
        let Some(relation) = &self.relation else {
            return Ok(Interrupted::Nothing);
        };
        if !self.table_exists(client).await? {
            return Ok(Interrupted::Nothing);
        }
        let (tables, xmins) = self.keeping_every_row(client, relation).await?;
        if tables.is_empty() {
            return Ok(Interrupted::Nothing);
        }
        let start = match self.slot_creation(client, streaming).await? {
            SlotCreation::Finished { start } => start,
            SlotCreation::Unsure { why } => return Ok(Interrupted::Pending { tables, why }),
        };
        let holds = self
            .complete_versions(client, relation, &start, &tables, &xmins)
            .await?;
        if holds.is_empty() {
            return Ok(Interrupted::Pending {
                tables,
                why: "the hold was armed again meanwhile (a new creation of the slot)".into(),
            });
        }
        Ok(Interrupted::Completed(holds))
    }

    /// Step 1 of [`HoldStore::complete_interrupted`]: the slot's holds that keep every row, by
    /// table, with the version (`xmin`) of each, so that step 3 changes only these versions.
    async fn keeping_every_row(
        &self,
        client: &Client,
        relation: &str,
    ) -> Result<(Vec<String>, Vec<String>), ControlError> {
        let sql = format!(
            "SELECT outbox_table, xmin::text FROM {relation}
             WHERE slot = $1 AND below_xid = $2 ORDER BY outbox_table"
        );
        let versions = client
            .query(&sql, &[&self.slot, &KEEPS_EVERY_ROW])
            .await
            .map_err(query_err(format!(
                "looking for interrupted sweeper holds in {relation}"
            )))?;
        let tables = versions.iter().map(|r| r.get(0)).collect();
        let xmins = versions.iter().map(|r| r.get(1)).collect();
        Ok((tables, xmins))
    }

    /// Step 2 of [`HoldStore::complete_interrupted`]: whether the slot's creation has surely
    /// finished — it exists, has a confirmed position, and no backend but the caller's own
    /// stream (`streaming`) holds it.
    async fn slot_creation(
        &self,
        client: &Client,
        streaming: Option<i32>,
    ) -> Result<SlotCreation, ControlError> {
        let slot = client
            .query_opt(
                "SELECT confirmed_flush_lsn::text, active_pid
                 FROM pg_replication_slots WHERE slot_name = $1",
                &[&self.slot],
            )
            .await
            .map_err(query_err("reading the slot"))?;
        let why = match slot.map(|r| (r.get::<_, Option<String>>(0), r.get::<_, Option<i32>>(1))) {
            None => format!(
                "slot `{}` does not exist (its creation stopped before it)",
                self.slot
            ),
            // In use: its creation may still be running (from PostgreSQL 17 on, a slot being
            // created shows a confirmed position before it has waited for the transactions
            // running at its start). Only a slot no backend holds has surely finished.
            Some((_, Some(pid))) if Some(pid) != streaming => format!(
                "slot `{}` is still being created, or is in use, by backend {pid}",
                self.slot
            ),
            Some((None, _)) => format!(
                "slot `{}` is still being created (no confirmed position yet)",
                self.slot
            ),
            Some((Some(start), _)) => return Ok(SlotCreation::Finished { start }),
        };
        Ok(SlotCreation::Unsure { why })
    }

    /// Step 3 of [`HoldStore::complete_interrupted`]: one `UPDATE` of exactly the versions read
    /// in step 1 to an xid assigned in this statement, after step 2. Returns the holds it
    /// completed: none when they were armed again in between.
    async fn complete_versions(
        &self,
        client: &Client,
        relation: &str,
        start: &str,
        tables: &[String],
        xmins: &[String],
    ) -> Result<Vec<Hold>, ControlError> {
        let sql = format!(
            "UPDATE {relation} AS h
             SET below_xid = pg_current_xact_id()::text::bigint,
                 slot_start_lsn = $2::text::pg_lsn,
                 reason = h.reason || $3
             WHERE h.slot = $1 AND h.below_xid = $4
               AND (h.outbox_table, h.xmin::text) IN (SELECT * FROM unnest($5::text[], $6::text[]))
             RETURNING {RETURNED}"
        );
        let rows = client
            .query(
                &sql,
                &[
                    &self.slot,
                    &start,
                    &COMPLETED_AFTER_INTERRUPTION,
                    &KEEPS_EVERY_ROW,
                    &tables,
                    &xmins,
                ],
            )
            .await
            .map_err(query_err(format!(
                "completing the interrupted sweeper hold in {relation}"
            )))?;
        Ok(rows.iter().map(hold_from_row).collect())
    }

    /// [`HoldStore::complete_interrupted`], logged: what was completed, or what still keeps
    /// every row and how to fix it. An error is logged too: keeping every row is safe, and the
    /// next session tries again.
    pub async fn resolve_interrupted(&self, client: &Client, streaming: Option<i32>) {
        let hold_table = self.relation().unwrap_or(HOLD_TABLE);
        match self.complete_interrupted(client, streaming).await {
            Ok(Interrupted::Completed(holds)) => {
                for hold in &holds {
                    info!(slot = %hold.slot, table = %hold.table, below_xid = hold.below_xid,
                        "sweeper hold completed after an interrupted slot creation: the rows committed before now stay until `outbox-relay replay` covers them (or the hold is released); see `outbox-relay status`");
                }
            }
            Ok(Interrupted::Pending { tables, why }) => {
                warn!(slot = %self.slot, tables = %tables.join(", "), %why,
                    "a sweeper hold armed before a slot creation that did not finish keeps every row: the sweeper deletes nothing of these tables until it is completed. The relay completes it at its next session once the slot exists, or run `outbox-relay slot create`; see `outbox-relay status`");
            }
            Ok(Interrupted::Nothing) => {}
            Err(e) => {
                warn!(slot = %self.slot, %hold_table, error = %e,
                    "cannot complete an interrupted sweeper hold, which keeps every row of its tables meanwhile: the role needs SELECT and UPDATE on the hold table; the relay tries again at its next session");
            }
        }
    }

    /// The slot's holds; none when the hold table does not exist.
    pub async fn list(&self, client: &Client) -> Result<Vec<Hold>, ControlError> {
        let Some(relation) = &self.relation else {
            return Ok(Vec::new());
        };
        if !self.table_exists(client).await? {
            return Ok(Vec::new());
        }
        let sql =
            format!("SELECT {RETURNED} FROM {relation} h WHERE slot = $1 ORDER BY outbox_table");
        let rows = client
            .query(&sql, &[&self.slot])
            .await
            .map_err(query_err(format!(
                "reading the sweeper holds in {relation}"
            )))?;
        Ok(rows.iter().map(hold_from_row).collect())
    }

    /// The rows of its table that `hold` keeps now (a scan of the table).
    pub async fn held_rows(&self, client: &Client, hold: &Hold) -> Result<i64, ControlError> {
        let (schema, table) = hold
            .table
            .split_once('.')
            .unwrap_or(("public", &hold.table));
        let relation = format!("{}.{}", quote_ident(schema), quote_ident(table));
        let row = client
            .query_one(&held_rows_sql(&relation, false), &[&hold.below_xid])
            .await
            .map_err(query_err(format!("counting the rows held in {relation}")))?;
        Ok(row.get(0))
    }

    /// Deletes `hold` if it is still the one armed (a hold armed again since, with a higher
    /// boundary, stays). Returns whether it was deleted.
    pub async fn release(&self, client: &Client, hold: &Hold) -> Result<bool, ControlError> {
        let Some(relation) = &self.relation else {
            return Ok(false);
        };
        let sql = format!(
            "DELETE FROM {relation} WHERE slot = $1 AND outbox_table = $2 AND below_xid = $3"
        );
        let deleted = client
            .execute(&sql, &[&hold.slot, &hold.table, &hold.below_xid])
            .await
            .map_err(query_err(format!(
                "releasing the sweeper hold in {relation}"
            )))?;
        Ok(deleted > 0)
    }
}

/// Where a hold's boundary is put.
#[derive(Debug, Clone, Copy)]
enum Boundary {
    /// Above every transaction: all rows stay (while the slot is being created).
    Everything,
    /// A transaction id assigned now; the new slot's start position, for the record.
    Now(Option<Lsn>),
}

/// The columns every query returns, in [`hold_from_row`]'s order.
const RETURNED: &str = "h.slot, h.outbox_table, h.below_xid, h.slot_start_lsn::text,
     h.armed_at::text, h.reason, extract(epoch FROM now() - h.armed_at)::bigint";

fn hold_from_row(row: &tokio_postgres::Row) -> Hold {
    let start: Option<String> = row.get(3);
    let below_xid: i64 = row.get(2);
    Hold {
        slot: row.get(0),
        table: row.get(1),
        below_xid,
        slot_start: start.and_then(|s| s.parse().ok()),
        armed_at: row.get(4),
        reason: row.get(5),
        age_seconds: row.get(6),
        keeps_every_row: below_xid == KEEPS_EVERY_ROW,
    }
}

/// `SELECT count(*)` (or `EXISTS`, when `exists`) of the rows of `relation` a hold keeps:
/// inserted by a transaction below `$1`. `relation` may be partitioned (nothing is deleted).
pub fn held_rows_sql(relation: &str, exists: bool) -> String {
    let inner = format!("SELECT 1 FROM {relation} o {XMIN64_FROM} WHERE {XMIN64} < $1::bigint");
    if exists {
        format!("{HORIZON_CTE} SELECT EXISTS ({inner})")
    } else {
        format!("{HORIZON_CTE} SELECT count(*) FROM ({inner}) held")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hold_table_lives_beside_the_first_outbox_table() {
        let mut config = Config::default();
        config.outbox.table = "app.events".into();
        let store = HoldStore::new(&config);
        assert_eq!(
            store.relation(),
            Some("\"app\".\"outbox_relay_sweeper_hold\"")
        );
    }

    #[test]
    fn held_rows_are_those_below_the_boundary() {
        let sql = held_rows_sql("\"public\".\"outbox\"", true);
        assert!(
            sql.contains("SELECT EXISTS (SELECT 1 FROM \"public\".\"outbox\" o"),
            "{sql}"
        );
        assert!(sql.contains("END < $1::bigint"), "{sql}");
        assert!(held_rows_sql("t", false).contains("SELECT count(*)"));
    }
}
