//! Releasing the sweeper's holds (`relay::sweeper::hold`): a replay that re-sent every row of a
//! held table from `--since` on says the gap before the new slot was delivered.
//!
//! A hold of a replayed table is released when the replay sent something real (not a dry
//! run), Kafka acknowledged every record, the selection is a time window only (an id or type
//! filter leaves rows of the gap out), `--since` (if given) is before the hold was armed and
//! `--until` (if given) at or after it: every row committed before the slot existed has a
//! `created_at` before then. The holds are read before the replay's snapshot, so that snapshot
//! holds every row they keep.

use serde::Serialize;
use tokio_postgres::Client;
use tracing::warn;

use super::Selection;
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

/// Why a selection cannot stand for "the whole gap", whatever its times: a filter that drops
/// rows of it.
fn partial_filter(selection: &Selection) -> Option<&'static str> {
    if selection.from_id.is_some() || selection.to_id.is_some() {
        return Some("--from-id/--to-id select only some of its rows");
    }
    if selection.aggregate_type.is_some() || selection.event_type.is_some() {
        return Some("--aggregate-type/--type select only some of its rows");
    }
    None
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

/// After the replay: releases the holds it covered. `delivered`: not a dry run, and every
/// selected record acknowledged.
pub(super) async fn settle(
    client: &Client,
    store: &HoldStore,
    holds: Vec<Hold>,
    selection: &Selection,
    delivered: bool,
) -> Result<Vec<HoldOutcome>, OpsError> {
    let mut outcomes = Vec::with_capacity(holds.len());
    for hold in holds {
        let kept_because = match (delivered, partial_filter(selection)) {
            (false, _) => Some(
                "this replay did not deliver every selected event (a dry run or a failure)"
                    .to_string(),
            ),
            (true, Some(why)) => Some(why.to_string()),
            (true, None) => window_misses(client, selection, &hold).await?,
        };
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

/// Why the time window leaves out rows committed before the hold was armed, if it does.
async fn window_misses(
    client: &Client,
    selection: &Selection,
    hold: &Hold,
) -> Result<Option<String>, OpsError> {
    let row = client
        .query_one(
            "SELECT $1::text IS NULL OR $1::text::timestamptz < $3::text::timestamptz,
                    $2::text IS NULL OR $2::text::timestamptz >= $3::text::timestamptz",
            &[&selection.since, &selection.until, &hold.armed_at],
        )
        .await
        .map_err(query_err(
            "comparing the replay's window with the sweeper hold",
        ))?;
    let (since_before, until_after): (bool, bool) = (row.get(0), row.get(1));
    Ok(match (since_before, until_after) {
        (false, _) => Some(format!(
            "--since is not before the slot's creation ({})",
            hold.armed_at
        )),
        (_, false) => Some(format!(
            "--until ends before the slot's creation ({})",
            hold.armed_at
        )),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_time_window_can_cover_a_gap() {
        let since = Selection {
            since: Some("-infinity".into()),
            ..Selection::default()
        };
        assert_eq!(partial_filter(&since), None);
        for partial in [
            Selection {
                from_id: Some("a".into()),
                ..since.clone()
            },
            Selection {
                event_type: Some("OrderPaid".into()),
                ..since.clone()
            },
        ] {
            assert!(partial_filter(&partial).is_some(), "{partial:?}");
        }
    }
}
