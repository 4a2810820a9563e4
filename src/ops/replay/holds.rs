//! Releasing the sweeper's holds (`relay::sweeper::hold`): a replay that re-sent every row a
//! hold keeps says the gap before the new slot was delivered.
//!
//! A hold keeps the rows of its table inserted by a transaction whose id is below its
//! `below_xid`. A replay releases it only when it proved that it re-sent every one of them:
//! - it sent something real (not a dry run) and Kafka acknowledged every selected record;
//! - in the replay's own snapshot, no row of the table the hold keeps is left out of the
//!   selection (`RowQuery::unselected_held_sql`: rows the publication's row filter passes,
//!   below the boundary, not selected by the flags). Times alone cannot say it: `created_at`
//!   is a transaction's *start*, so a row of a transaction that began before `--since` and
//!   committed after the slot was lost is in the gap, yet outside a `--since` window;
//! - the hold is complete: one that still keeps every row (its slot's creation did not
//!   finish) has no known boundary, so a row the replay's snapshot did not see may be one
//!   the slot never streams.
//!
//! The holds are read before the snapshot. A row the hold keeps that the snapshot does not
//! show belongs to a transaction still running then, after the hold (and so the slot) was
//! armed: it commits after the slot's start, and the slot streams it.

use std::collections::BTreeMap;

use serde::Serialize;
use tokio_postgres::{Client, Transaction};
use tracing::warn;

use super::rebuild::TableSource;
use crate::ops::OpsError;
use crate::postgres::control::query_err;
use crate::relay::sweeper::hold::{Hold, HoldStore};

/// What the replay did with a hold of one of its tables.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HoldOutcome {
    /// `schema.table`.
    pub table: String,
    pub released: bool,
    /// When kept: why this replay does not cover the table's gap.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kept_because: Option<String>,
    /// When the hold was armed (the new slot's creation).
    pub armed_at: String,
}

/// The holds on `tables` (`schema.table`), read before the replay starts. A hold table this
/// role cannot read does not stop the replay (it is what an incident needs): it is logged, and
/// nothing is released.
pub(super) async fn read(client: &Client, store: &HoldStore, tables: &[String]) -> Vec<Hold> {
    match store.list(client).await {
        Ok(holds) => holds
            .into_iter()
            .filter(|h| tables.contains(&h.table))
            .collect(),
        Err(e) => {
            warn!(error = %e, "cannot read the sweeper holds: this replay releases none");
            Vec::new()
        }
    }
}

/// In the replay's snapshot: per held table, the rows its hold keeps that the selection
/// leaves out.
pub(super) async fn unselected(
    tx: &Transaction<'_>,
    sources: &[TableSource],
    holds: &[Hold],
) -> Result<BTreeMap<String, i64>, OpsError> {
    let mut unselected = BTreeMap::new();
    for hold in holds {
        let Some(source) = sources.iter().find(|s| s.query.table == hold.table) else {
            continue;
        };
        let query = &source.query;
        let mut params = query.params();
        params.push(&hold.below_xid);
        let n: i64 = tx
            .query_one(&query.unselected_held_sql(), &params)
            .await
            .map_err(query_err(format!(
                "counting the held rows of {} this replay leaves out",
                hold.table
            )))?
            .get(0);
        unselected.insert(hold.table.clone(), n);
    }
    Ok(unselected)
}

/// After the replay: releases the holds it covered. `delivered`: not a dry run, and every
/// selected record acknowledged; `unselected`: from [`unselected`], in the replay's snapshot.
pub(super) async fn settle(
    client: &Client,
    store: &HoldStore,
    holds: Vec<Hold>,
    unselected: &BTreeMap<String, i64>,
    delivered: bool,
) -> Result<Vec<HoldOutcome>, OpsError> {
    let mut outcomes = Vec::with_capacity(holds.len());
    for hold in holds {
        let kept_because = kept_because(&hold, unselected.get(&hold.table).copied(), delivered);
        let released = kept_because.is_none() && store.release(client, &hold).await?;
        let kept_because = match (released, kept_because) {
            (false, None) => Some("the slot was created again meanwhile (a newer hold)".into()),
            (_, why) => why,
        };
        outcomes.push(HoldOutcome {
            table: hold.table,
            released,
            kept_because,
            armed_at: hold.armed_at,
        });
    }
    Ok(outcomes)
}

/// Why this replay does not prove that it re-sent every row `hold` keeps, if it does not.
fn kept_because(hold: &Hold, unselected: Option<i64>, delivered: bool) -> Option<String> {
    if !delivered {
        return Some(
            "this replay did not deliver every selected event (a dry run or a failure)".into(),
        );
    }
    if hold.keeps_every_row {
        return Some("the hold keeps every row: its slot's creation did not finish, so rows of transactions still running may be ones the slot never streams; start the relay (it completes the hold once the slot exists) or run `outbox-relay slot create`, then replay again".into());
    }
    match unselected {
        Some(0) => None,
        Some(n) => Some(format!(
            "{n} of the rows it keeps are outside this replay's selection (committed before the slot's creation, but with a created_at before --since — a transaction's start — or at/after --until, or left out by an id or type filter): replay them too, e.g. with an earlier --since, or release the hold"
        )),
        None => Some("its table was not part of this replay".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hold(below_xid: i64) -> Hold {
        Hold {
            slot: "s".into(),
            table: "public.outbox".into(),
            below_xid,
            slot_start: None,
            armed_at: "2026-01-01 00:00:00+00".into(),
            age_seconds: 1,
            reason: "outbox-relay slot create".into(),
            keeps_every_row: below_xid == i64::MAX,
        }
    }

    #[test]
    fn only_a_delivered_replay_that_left_no_held_row_out_releases() {
        assert_eq!(kept_because(&hold(900), Some(0), true), None);
        let left_out = kept_because(&hold(900), Some(1), true).unwrap();
        assert!(left_out.starts_with("1 of the rows it keeps"), "{left_out}");
        assert!(kept_because(&hold(900), Some(0), false).is_some());
        assert!(kept_because(&hold(900), None, true).is_some());
    }

    #[test]
    fn a_hold_that_keeps_every_row_is_never_released_by_a_replay() {
        let why = kept_because(&hold(i64::MAX), Some(0), true).unwrap();
        assert!(why.contains("outbox-relay slot create"), "{why}");
    }
}
