//! The retention sweeper (`[outbox.sweeper]`, off by default): deletes outbox rows that are
//! older than the retention **and** whose inserting transaction the slot has already
//! confirmed, in small batches, so the table stops growing while `outbox-relay replay` keeps a
//! window of history.
//!
//! # Why "confirmed" needs care
//!
//! `created_at` (default `now()`) is the inserting transaction's *start* time: a transaction
//! may insert a row, stay open for an hour, and commit after rows that look much newer. And
//! the slot's `confirmed_flush_lsn` is a WAL position, not a time: it says which *commits* the
//! relay has delivered. So neither "older than the retention" nor "older than the last
//! delivered event" says that a given row was delivered.
//!
//! # The rule, and why it is safe
//!
//! Every sweep first takes a **mark**, in two statements, in this order:
//!
//! 1. `X = pg_snapshot_xmin(pg_current_snapshot())`: the oldest transaction still running at
//!    the moment `T` this snapshot `S` was taken;
//! 2. `L = pg_current_wal_insert_lsn()`, read after `S`.
//!
//! A row is deleted only with a mark whose `L <= confirmed_flush_lsn`, and only when its
//! `xmin` (as a 64-bit xid) is `< X` and its `created_at` is older than the retention.
//!
//! Proof that such a row was delivered. Let `x` be the row's `xmin` and `P` the top-level
//! transaction that inserted it (`x = P`, or `x` is a subtransaction of `P`; PostgreSQL
//! assigns a parent its xid before any child, so `P <= x`). Then `P <= x < X`, and every
//! transaction that was running when `S` was taken is `>= X`: so `P` had ended before `T`. The
//! row exists and the sweeper's `DELETE` sees it, so `P` committed (rows of aborted
//! transactions are never visible). A transaction's commit record is inserted into the WAL
//! *before* it stops being "running" (`RecordTransactionCommit` precedes
//! `ProcArrayEndTransaction`, also with `synchronous_commit = off`), so the end of `P`'s
//! commit record is `<= L`, which was read after `T`. The relay confirms a position only when
//! every transaction committed at or below it has been acknowledged by Kafka (see
//! `checkpoint.rs`); `confirmed_flush_lsn >= L` therefore includes `P`'s events.
//!
//! # Rows the slot never streamed: the hold
//!
//! The proof has a premise: `P` committed after the slot was created. A slot streams only
//! what commits after its creation, and a slot created anew (after a lost or dropped one)
//! starts at "now", so for a row of the gap before it `confirmed_flush_lsn >= L` proves
//! nothing. Whoever creates the slot (`outbox-relay slot create`, or the relay with
//! `postgres.create_slot`) therefore arms a **hold** ([`hold`]): first one that keeps every row
//! (`below_xid` = `i64::MAX`), then, once the slot exists, `B` = a transaction id assigned
//! after `pg_create_logical_replication_slot` returned. Under a hold a row is deleted only
//! when, in addition to the rule above, its widened `xmin` is `>= B`.
//!
//! Proof that such a row's `P` committed after the slot's start. The row's `x >= B` was
//! assigned after `B` (transaction ids are handed out in increasing order), so after the slot
//! existed; the row was inserted by `x`, and `P` commits no earlier than that insert, so `P`'s
//! commit is after the slot's creation and in its stream (creating a logical slot waits until
//! the transactions that were running when it began have ended, so one still running after it
//! returned is decoded whole): the proof above applies. Rows with
//! `xmin < B` (every row committed before the slot's start, and a few of transactions that ran
//! across it) stay until the hold is released: by a `replay` that covered the table's gap,
//! by the operator, or by the sweeper when no row below `B` is left. The sweeper reads the
//! holds *after* the slot's position, so a sweep that saw a new slot's position sees at least
//! the hold armed before its creation. Without a hold, every row is taken to have been
//! delivered (by an earlier slot, or a replay): a slot created by hand arms none.
//!
//! A hold still at `i64::MAX` (its slot's creation has not finished, or the process creating
//! it died between the steps) keeps every row of its table and is never released by the
//! sweeper, not even on an empty table: until the slot's start is known, any row committed
//! meanwhile may be one the slot never streams. The relay completes it at its next session
//! (see "An interrupted creation" in [`hold`]).
//!
//! `X` is deliberately the snapshot's *xmin*, not "visible in `S`"
//! (`pg_visible_in_snapshot`): a subtransaction's xid is not in a snapshot's list of running
//! transactions, so a row inserted in a savepoint of a transaction running at `T` would look
//! visible and could be deleted before its commit is confirmed. With `xmin` the only cost is
//! that rows of transactions that started after the oldest running one wait for a later mark.
//!
//! The row's 32-bit `xmin` is widened to 64 bits against the `DELETE` statement's own
//! snapshot (`pg_snapshot_xmax`): every row that statement can see has an xmin in the
//! 2^31-xid window below it (wraparound protection guarantees that for unfrozen rows, and the
//! raw xmin of a frozen row is kept), so the widening is exact for rows younger than 2^32
//! transactions. An older (frozen) row widens to a newer id: the `< X` rule then keeps it,
//! and a hold's `>= B` would not. A hold is meant to last the minutes to hours of a replay,
//! not billions of transactions; release it (or replay) rather than keep it.
//!
//! # Rows kept by id
//!
//! An event too large for its dead letter to keep (neither payload nor row image) leaves its
//! outbox row as its only copy: the relay records the row in [`kept`]'s table before it sends
//! the dead letter, and no sweep deletes a recorded row (nor drops a partition holding one)
//! until `dead-letters redrive` re-sent it and released it. The record exists before the slot
//! can be confirmed past the row, so before any sweep could delete it.
//!
//! # Partitioned outbox tables
//!
//! A row's `ctid` is unique only within one partition: the same `(0,1)` exists in every leaf,
//! so a `DELETE ... WHERE ctid = ANY (...)` on the partitioned table would also delete the
//! namesakes of the chosen rows in *other* partitions, unconfirmed ones included. The sweeper
//! therefore deletes leaf by leaf (`pg_partition_tree`, read again every sweep so attached and
//! detached partitions are followed); a plain table is its own only leaf.
//!
//! # Dropping partitions (`drop_partitions`, opt-in)
//!
//! Deleting rows one by one is what partitioning by time avoids. With `drop_partitions`, the
//! leaves of a partitioned outbox other than its DEFAULT partition are not swept row by row:
//! such a partition is detached and dropped as a whole once it holds rows and **every** row in
//! it satisfies the same rule as a row delete (older than the retention, `xmin` below a mark
//! the slot confirmed). A partition that is empty is left alone: nothing tells an old empty
//! partition from next month's. The DEFAULT partition is never dropped; its rows are deleted
//! one by one as for a plain table.
//!
//! The check runs twice: once without locks (cheap, fails fast on young partitions), then in
//! one transaction that first takes `SHARE` on the partition. That lock conflicts with every
//! insert into it, so no insert is in progress or can start, and the second check sees
//! everything the partition will ever hold. Only then `DETACH` (which needs `ACCESS
//! EXCLUSIVE` on the partitioned table for a moment) and `DROP`, in the same transaction. Two
//! waits are bounded by `lock_timeout = deadlock_timeout / 2`, and a partition someone is
//! waiting to insert into is skipped, so the sweeper gives up (trying again next sweep) before
//! PostgreSQL's deadlock detector could pick an application's transaction as the victim.
//!
//! Marks are taken every `interval_ms` and queued; each sweep uses the newest confirmed one
//! and drops the older ones. Deletion therefore trails confirmation by about one interval.
//! Nothing here ever waits for the relay: with the relay stopped, marks simply stay
//! unconfirmed (the queue is bounded) and nothing is deleted.

pub mod hold;
pub mod kept;

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::config::Config;
use crate::lsn::Lsn;
use crate::postgres::control::{query_err, quote_ident, Control, ControlError};
use crate::serve::metrics::Metrics;
use hold::{held_rows_sql, Hold, HoldStore};
use kept::{not_kept_sql, KeptRows};

/// Most marks kept while none is confirmed (the relay is down or far behind). When full, no
/// new marks are taken until the oldest are confirmed and used.
const MAX_MARKS: usize = 64;
/// Most batches per table and sweep, so one sweep stays short.
const MAX_BATCHES_PER_SWEEP: usize = 100;

#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    #[error(transparent)]
    Control(#[from] ControlError),
}

/// A point the sweeper may delete up to once the slot confirms it (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mark {
    /// `pg_snapshot_xmin` of the snapshot taken first, as a 64-bit transaction id.
    pub xmin: i64,
    /// `pg_current_wal_insert_lsn()`, read after the snapshot.
    pub lsn: Lsn,
}

/// What one sweep did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SweepReport {
    /// The slot's `confirmed_flush_lsn`; `None` when the slot does not exist.
    pub confirmed: Option<Lsn>,
    /// The mark the rows were deleted under; `None` when no mark was confirmed yet.
    pub used: Option<Mark>,
    /// Rows deleted, over all tables.
    pub deleted: u64,
    /// Partitions detached and dropped (`drop_partitions`), `schema.table` quoted where needed.
    pub dropped: Vec<String>,
    /// Outbox tables (`schema.table`) whose rows below a hold were kept.
    pub held: Vec<String>,
    /// Outbox tables whose hold the sweeper released: no row under it was left.
    pub released: Vec<String>,
}

/// One table holding an outbox table's rows: a leaf partition, or the table itself.
#[derive(Debug, Clone)]
struct Leaf {
    /// Quoted `schema.table`.
    quoted: String,
    /// The partitioned table it is attached to (quoted), when it is a partition and not the
    /// DEFAULT one: a candidate for `drop_partitions`.
    droppable_from: Option<String>,
}

/// One outbox table: its name for messages and its quoted name for SQL.
#[derive(Debug, Clone)]
struct SweptTable {
    name: String,
    quoted: String,
    /// Its id column, by which rows are kept ([`kept`]).
    id_column: String,
}

pub struct Sweeper {
    control: Control,
    slot: String,
    tables: Vec<SweptTable>,
    created_at_column: String,
    drop_partitions: bool,
    retention_ms: i64,
    batch_size: i64,
    marks: VecDeque<Mark>,
    holds: HoldStore,
    /// Rows kept by id for their dead letters.
    kept: KeptRows,
    /// Holds (table, boundary) already logged, so that each is announced once.
    announced: HashSet<(String, i64)>,
}

impl Sweeper {
    /// Connects with the relay's PostgreSQL settings.
    pub async fn connect(config: &Config) -> Result<Sweeper, SweepError> {
        let control = Control::connect(&config.postgres).await?;
        Ok(Sweeper::new(control, config))
    }

    /// A sweeper of every configured outbox table, on `control`.
    pub fn new(control: Control, config: &Config) -> Sweeper {
        let sweeper = &config.outbox.sweeper;
        let tables = config
            .outbox
            .table_configs()
            .into_iter()
            .map(|table_config| {
                let (schema, table) = table_config.schema_and_table();
                SweptTable {
                    name: format!("{schema}.{table}"),
                    quoted: format!("{}.{}", quote_ident(&schema), quote_ident(&table)),
                    id_column: table_config.id_column,
                }
            })
            .collect();
        Sweeper {
            control,
            slot: config.postgres.slot.clone(),
            tables,
            created_at_column: sweeper.created_at_column.clone(),
            drop_partitions: sweeper.drop_partitions,
            retention_ms: i64::try_from(sweeper.retention_ms).unwrap_or(i64::MAX),
            batch_size: i64::try_from(sweeper.batch_size).unwrap_or(i64::MAX),
            marks: VecDeque::new(),
            holds: HoldStore::new(config),
            kept: KeptRows::new(config),
            announced: HashSet::new(),
        }
    }

    /// Takes a mark and queues it (unless the queue is full); returns it.
    pub async fn take_mark(&mut self) -> Result<Mark, SweepError> {
        let client = self.control.client();
        // Two statements, in this order: the snapshot first, the WAL position after it.
        let xmin: i64 = client
            .query_one(
                "SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint",
                &[],
            )
            .await
            .map_err(query_err("taking a snapshot"))?
            .get(0);
        let lsn: String = client
            .query_one("SELECT pg_current_wal_insert_lsn()::text", &[])
            .await
            .map_err(query_err("reading the WAL insert position"))?
            .get(0);
        let lsn = lsn
            .parse()
            .map_err(|e| ControlError::Setup(format!("server returned a bad LSN: {e}")))?;
        let mark = Mark { xmin, lsn };
        if self.marks.len() < MAX_MARKS {
            self.marks.push_back(mark);
        }
        Ok(mark)
    }

    /// Deletes old rows under the newest mark the slot has confirmed, if any.
    pub async fn sweep(&mut self) -> Result<SweepReport, SweepError> {
        let confirmed = self
            .control
            .slot(&self.slot)
            .await?
            .and_then(|s| s.confirmed_flush_lsn);
        let mut report = SweepReport {
            confirmed,
            ..SweepReport::default()
        };
        let Some(confirmed) = confirmed else {
            return Ok(report);
        };
        // Marks are queued in LSN order: keep the newest confirmed one (it stays usable until
        // a newer one is confirmed) and everything after it.
        while self.marks.len() > 1 && self.marks[1].lsn <= confirmed {
            self.marks.pop_front();
        }
        let Some(mark) = self.marks.front().copied().filter(|m| m.lsn <= confirmed) else {
            return Ok(report);
        };
        report.used = Some(mark);
        // Read after the slot's position: a slot created since was held before it existed.
        let holds = self.holds.list(self.control.client()).await?;
        // Read after the slot's position too: a row kept for a dead letter was recorded
        // before the slot could be confirmed past it.
        let kept = match self.kept.exists(self.control.client()).await? {
            true => self.kept.relation().map(str::to_string),
            false => None,
        };
        for table in self.tables.clone() {
            let floor = self.hold_floor(&table, &holds, &mut report).await?;
            let kept = kept.as_deref().map(|k| (k, table.id_column.as_str()));
            for leaf in self.leaves(&table).await? {
                if let (true, Some(parent)) = (self.drop_partitions, &leaf.droppable_from) {
                    // Its rows stay until the whole partition can go.
                    if self
                        .drop_partition(parent, &leaf.quoted, mark, floor, kept)
                        .await?
                    {
                        report.dropped.push(leaf.quoted.clone());
                    }
                    continue;
                }
                let leaf = leaf.quoted;
                let sql = delete_sql(&leaf, &self.created_at_column, kept);
                let params: [&(dyn tokio_postgres::types::ToSql + Sync); 5] = [
                    &self.retention_ms,
                    &mark.xmin,
                    &self.batch_size,
                    &floor,
                    &self.slot,
                ];
                let params = &params[..if kept.is_some() { 5 } else { 4 }];
                for _ in 0..MAX_BATCHES_PER_SWEEP {
                    let deleted = self
                        .control
                        .client()
                        .execute(&sql, params)
                        .await
                        .map_err(query_err(format!("deleting old rows of {leaf}")))?;
                    report.deleted += deleted;
                    if (deleted as i64) < self.batch_size {
                        break;
                    }
                }
            }
        }
        Ok(report)
    }

    /// The lowest transaction id whose rows of `table` may be deleted: a hold's boundary, or
    /// `i64::MIN` without one. A hold with no row left under it is released here (and then
    /// none applies), unless it keeps every row; one that changed meanwhile keeps the whole
    /// table this sweep.
    async fn hold_floor(
        &mut self,
        table: &SweptTable,
        holds: &[Hold],
        report: &mut SweepReport,
    ) -> Result<i64, SweepError> {
        let Some(hold) = holds.iter().find(|h| h.table == table.name) else {
            return Ok(i64::MIN);
        };
        if hold.keeps_every_row {
            // Its slot's creation has not finished (or was interrupted): where the slot's
            // stream begins is not known, so neither is which rows it will never stream. Not
            // released even when the table is empty: rows committed before the slot's start
            // may still come. Completed by the relay's next session or `slot create`.
            if self.announced.insert((hold.table.clone(), hold.below_xid)) {
                warn!(table = %hold.table, slot = %hold.slot, armed_at = %hold.armed_at,
                    reason = %hold.reason,
                    "sweeper keeps every row: a hold was armed before the slot's creation, which has not finished or was interrupted. The relay completes it at its next session once the slot exists, or run `outbox-relay slot create`; see `outbox-relay status`");
            }
            report.held.push(table.name.clone());
            return Ok(hold.below_xid);
        }
        let client = self.control.client();
        let held: bool = client
            .query_one(&held_rows_sql(&table.quoted, true), &[&hold.below_xid])
            .await
            .map_err(query_err(format!(
                "looking for held rows of {}",
                table.name
            )))?
            .get(0);
        if held {
            if self.announced.insert((hold.table.clone(), hold.below_xid)) {
                warn!(table = %hold.table, slot = %hold.slot, armed_at = %hold.armed_at,
                    reason = %hold.reason, below_xid = hold.below_xid,
                    "sweeper holds the rows committed before the slot was created: the slot never streamed them, so they are not deleted until `outbox-relay replay` covers them (or the hold is released); see `outbox-relay status`");
            }
            report.held.push(table.name.clone());
            return Ok(hold.below_xid);
        }
        if !self.holds.release(client, hold).await? {
            // Armed again since it was read: its new boundary is not known to this sweep.
            return Ok(i64::MAX);
        }
        info!(table = %hold.table, slot = %hold.slot,
            "sweeper hold released: no row committed before the slot was created is left");
        report.released.push(table.name.clone());
        Ok(i64::MIN)
    }

    /// The tables that hold `table`'s rows, quoted: its leaf partitions when it is
    /// partitioned, else itself (see the module docs for why deletes go leaf by leaf).
    async fn leaves(&self, table: &SweptTable) -> Result<Vec<Leaf>, SweepError> {
        let leaves: Vec<Leaf> = self
            .control
            .client()
            .query(
                "SELECT format('%I.%I', n.nspname, c.relname),
                        CASE WHEN t.relid <> pt.partdefid
                             THEN format('%I.%I', pn.nspname, p.relname) END
                 FROM pg_partition_tree($1::text::regclass) t
                 JOIN pg_class c ON c.oid = t.relid
                 JOIN pg_namespace n ON n.oid = c.relnamespace
                 JOIN pg_class p ON p.oid = t.parentrelid
                 JOIN pg_namespace pn ON pn.oid = p.relnamespace
                 JOIN pg_partitioned_table pt ON pt.partrelid = t.parentrelid
                 WHERE t.isleaf
                 ORDER BY t.level, c.relname",
                &[&table.quoted],
            )
            .await
            .map_err(query_err(format!(
                "listing the partitions of {}",
                table.name
            )))?
            .iter()
            .map(|r| Leaf {
                quoted: r.get(0),
                droppable_from: r.get(1),
            })
            .collect();
        if leaves.is_empty() {
            // A plain table (pg_partition_tree returns nothing for it), or a partitioned
            // table without partitions (which holds no rows).
            return Ok(vec![Leaf {
                quoted: table.quoted.clone(),
                droppable_from: None,
            }]);
        }
        Ok(leaves)
    }

    /// Detaches `leaf` from `parent` and drops it when it holds rows and every row would be
    /// deleted under `mark` (older than the retention, inserted by a transaction the slot
    /// confirmed). Returns whether it did. See "Dropping partitions" in the module docs.
    async fn drop_partition(
        &mut self,
        parent: &str,
        leaf: &str,
        mark: Mark,
        floor: i64,
        kept: Option<(&str, &str)>,
    ) -> Result<bool, SweepError> {
        let what = format!("dropping partition {leaf}");
        // Cheap and lock-free first: most partitions are young and fail at once.
        let check = drop_check_sql(leaf, &self.created_at_column, kept);
        let all: [&(dyn tokio_postgres::types::ToSql + Sync); 4] =
            [&self.retention_ms, &mark.xmin, &floor, &self.slot];
        let params = &all[..if kept.is_some() { 4 } else { 3 }];
        let row = self
            .control
            .client()
            .query_one(&check, params)
            .await
            .map_err(query_err(what.clone()))?;
        if !(row.get::<_, bool>(0) && row.get::<_, bool>(1)) {
            return Ok(false);
        }
        let deadlock_ms: i32 = self
            .control
            .client()
            .query_one(
                "SELECT setting::int4 FROM pg_settings WHERE name = 'deadlock_timeout'",
                &[],
            )
            .await
            .map_err(query_err(what.clone()))?
            .get(0);
        let lock_timeout_ms = (deadlock_ms / 2).max(1);
        let tx = self
            .control
            .client_mut()
            .transaction()
            .await
            .map_err(query_err(what.clone()))?;
        let locked =
            detach_if_still_droppable(&tx, parent, leaf, &check, params, lock_timeout_ms).await;
        match locked {
            Ok(true) => {
                tx.commit().await.map_err(query_err(what))?;
                info!(partition = %leaf, table = %parent,
                    "dropped a partition whose rows are all older than the retention and confirmed");
                Ok(true)
            }
            Ok(false) => Ok(false),
            // lock_not_available: someone uses the partition or the table; next sweep.
            Err(e) if e.code().map(|c| c.code()) == Some("55P03") => {
                debug!(partition = %leaf, "partition busy; trying to drop it next sweep");
                Ok(false)
            }
            Err(e) => Err(query_err(what)(e).into()),
        }
    }

    /// One round: a new mark, then a sweep under the newest confirmed mark.
    pub async fn tick(&mut self) -> Result<SweepReport, SweepError> {
        self.take_mark().await?;
        self.sweep().await
    }
}

/// The `horizon` CTE: the next transaction id as of the statement's own snapshot, against
/// which a row's 32-bit `xmin` is widened (see the module docs).
pub(crate) const HORIZON_CTE: &str =
    "WITH horizon AS (SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS next_xid)";
/// Joined after `FROM <relation> o`: the row's `xmin` in the current epoch.
pub(crate) const XMIN64_FROM: &str = "CROSS JOIN horizon h
             CROSS JOIN LATERAL (
                 SELECT ((h.next_xid >> 32) << 32) | o.xmin::text::bigint AS same_epoch
             ) x";
/// The row's `xmin` widened to 64 bits (needs [`HORIZON_CTE`] and [`XMIN64_FROM`]).
pub(crate) const XMIN64: &str =
    "CASE WHEN x.same_epoch > h.next_xid THEN x.same_epoch - 4294967296 ELSE x.same_epoch END";

/// One batch: at most `$3` rows older than `$1` ms whose widened xmin is below `$2` (the mark)
/// and at or above `$4` (a hold's boundary; `i64::MIN` without one), and, with `kept` (the
/// kept-rows table and this table's id column), none kept by slot `$5`.
/// `relation` must not be a partitioned table (`ctid` is unique per partition only).
fn delete_sql(relation: &str, created_at_column: &str, kept: Option<(&str, &str)>) -> String {
    let created_at = quote_ident(created_at_column);
    let not_kept = kept.map_or(String::new(), |(k, id)| {
        format!("AND {}", not_kept_sql(k, id, "$5::text"))
    });
    format!(
        "{HORIZON_CTE}
         DELETE FROM {relation}
         WHERE ctid = ANY (ARRAY(
             SELECT o.ctid
             FROM {relation} o
             {XMIN64_FROM}
             WHERE o.{created_at} < now() - $1::bigint * interval '1 millisecond'
               AND {XMIN64} < $2::bigint
               AND {XMIN64} >= $4::bigint
               {not_kept}
             LIMIT $3::bigint))"
    )
}

/// In `tx`: locks `leaf` against inserts (waiting at most `lock_timeout_ms`), checks again
/// with `check` that every row it holds would be deleted, and detaches and drops it unless
/// someone waits to insert into it. Returns whether it did; the caller commits.
async fn detach_if_still_droppable(
    tx: &tokio_postgres::Transaction<'_>,
    parent: &str,
    leaf: &str,
    check: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    lock_timeout_ms: i32,
) -> Result<bool, tokio_postgres::Error> {
    tx.batch_execute(&format!(
        "SET LOCAL lock_timeout = {lock_timeout_ms};
         LOCK TABLE ONLY {leaf} IN SHARE MODE"
    ))
    .await?;
    // No insert into the partition is in progress or can start now: what the check
    // sees is all it will ever hold.
    let row = tx.query_one(check, params).await?;
    if !(row.get::<_, bool>(0) && row.get::<_, bool>(1)) {
        return Ok(false);
    }
    // Someone waiting to insert into the partition holds the table's lock that the
    // DETACH needs: leave it to them (the partition is not done), rather than deadlock.
    let waiting: bool = tx
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_locks
                            WHERE locktype = 'relation' AND NOT granted
                              AND relation = $1::text::regclass)",
            &[&leaf],
        )
        .await?
        .get(0);
    if waiting {
        return Ok(false);
    }
    tx.batch_execute(&format!(
        "ALTER TABLE {parent} DETACH PARTITION {leaf}; DROP TABLE {leaf}"
    ))
    .await?;
    Ok(true)
}

/// Whether `relation` has rows, and whether every row would be deleted by [`delete_sql`]
/// with the same parameters (`$1` retention ms, `$2` mark xmin, `$3` hold boundary, `$4` the
/// slot, with `kept`).
fn drop_check_sql(relation: &str, created_at_column: &str, kept: Option<(&str, &str)>) -> String {
    let created_at = quote_ident(created_at_column);
    let not_kept = kept.map_or(String::new(), |(k, id)| {
        format!("AND {}", not_kept_sql(k, id, "$4::text"))
    });
    format!(
        "{HORIZON_CTE}
         SELECT EXISTS (SELECT 1 FROM {relation}),
                NOT EXISTS (
                    SELECT 1
                    FROM {relation} o
                    {XMIN64_FROM}
                    WHERE NOT COALESCE(
                        o.{created_at} < now() - $1::bigint * interval '1 millisecond'
                        AND {XMIN64} < $2::bigint
                        AND {XMIN64} >= $3::bigint
                        {not_kept},
                        false))"
    )
}

/// Runs the sweeper every `outbox.sweeper.interval_ms` until `shutdown`. Errors are logged and
/// the next round reconnects; they never stop the relay.
pub async fn run(config: Config, metrics: Arc<Metrics>, shutdown: CancellationToken) {
    let interval = Duration::from_millis(config.outbox.sweeper.interval_ms);
    info!(
        retention_ms = config.outbox.sweeper.retention_ms,
        interval_ms = config.outbox.sweeper.interval_ms,
        batch_size = config.outbox.sweeper.batch_size,
        drop_partitions = config.outbox.sweeper.drop_partitions,
        "retention sweeper started"
    );
    let mut sweeper: Option<Sweeper> = None;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
        if sweeper.is_none() {
            match Sweeper::connect(&config).await {
                Ok(s) => sweeper = Some(s),
                Err(e) => {
                    warn!(error = %e, "sweeper cannot connect; retrying next round");
                    continue;
                }
            }
        }
        let Some(s) = sweeper.as_mut() else { continue };
        let round = tokio::select! {
            _ = shutdown.cancelled() => return,
            round = s.tick() => round,
        };
        if round.is_ok() {
            show_holds(s, &metrics).await;
        }
        match round {
            Ok(report) if report.deleted > 0 || !report.dropped.is_empty() => {
                debug!(deleted = report.deleted, dropped_partitions = report.dropped.len(),
                    below = ?report.used.map(|m| m.lsn.to_string()),
                    "sweeper deleted confirmed rows older than the retention")
            }
            Ok(report) => {
                debug!(confirmed = ?report.confirmed.map(|l| l.to_string()),
                    marks = s.marks.len(), "sweeper: nothing to delete")
            }
            Err(e) => {
                warn!(error = %e, "sweep failed; reconnecting next round");
                sweeper = None;
            }
        }
    }
}

/// Shows the slot's holds in `outbox_relay_sweeper_hold_age_seconds` (unchanged when they
/// cannot be read: the next round tries again).
async fn show_holds(sweeper: &Sweeper, metrics: &Metrics) {
    match sweeper.holds.list(sweeper.control.client()).await {
        Ok(holds) => {
            let ages: Vec<(String, i64)> = holds
                .into_iter()
                .map(|h| (h.table, h.age_seconds))
                .collect();
            metrics.set_sweeper_holds(&ages);
        }
        Err(e) => debug!(error = %e, "cannot read the sweeper holds for the metrics"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_partition_is_dropped_only_when_no_row_fails_the_delete_rule() {
        let sql = drop_check_sql("\"s\".\"t_2026_01\"", "created_at", None);
        assert!(
            sql.contains("SELECT EXISTS (SELECT 1 FROM \"s\".\"t_2026_01\")"),
            "{sql}"
        );
        // A NULL created_at is not "older than the retention".
        assert!(sql.contains("WHERE NOT COALESCE("), "{sql}");
        assert!(sql.contains("END >= $3::bigint"), "{sql}");
        assert!(sql.ends_with(",\n                        false))"), "{sql}");
        let kept = drop_check_sql("t", "created_at", Some(("k", "id")));
        assert!(
            kept.contains("k.slot = $4::text AND k.row_id = o.\"id\"::text"),
            "{kept}"
        );
    }

    #[test]
    fn delete_quotes_names_and_binds_values() {
        let sql = delete_sql("\"s\".\"t\"", "Created \"At\"", None);
        assert!(sql.contains("DELETE FROM \"s\".\"t\""), "{sql}");
        assert!(sql.contains("o.\"Created \"\"At\"\"\" < now()"), "{sql}");
        for param in ["$1::bigint", "$2::bigint", "$3::bigint", "$4::bigint"] {
            assert!(sql.contains(param), "{sql}");
        }
    }

    #[test]
    fn a_hold_bounds_deletes_and_partition_drops_from_below() {
        assert!(delete_sql("t", "created_at", None).contains("END >= $4::bigint"));
        assert!(drop_check_sql("t", "created_at", None).contains("END >= $3::bigint"));
        let kept = delete_sql("t", "created_at", Some(("k", "id")));
        assert!(
            kept.contains("k.slot = $5::text AND k.row_id = o.\"id\"::text"),
            "{kept}"
        );
    }
}
