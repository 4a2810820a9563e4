//! `slot create`, `slot drop --yes` and `slot advance --to <LSN|now>`: moving the replication
//! slot by hand.
//!
//! A logical slot only moves forward. "Skip" is `advance`; "start over from now" is `drop` and
//! `create`; sending old events again is `replay` (rows still in the outbox table). An active
//! slot belongs to the relay streaming from it, so `drop` and `advance` refuse to touch it
//! unless `--force`, which ends the holding backend first.

use std::fmt;
use std::str::FromStr;
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio_postgres::types::PgLsn;

use super::{connect, format, OpsError, Report};
use crate::config::Config;
use crate::lsn::Lsn;
use crate::postgres::control::{check_slot_usable, query_err, sqlstate, Control, SlotInfo};
use crate::relay::sweeper::hold::{HoldStore, Interrupted, ARMED_BY_SLOT_CREATE};

/// How long `--force` waits for the slot to become inactive after ending its holder.
const RELEASE_TIMEOUT: Duration = Duration::from_secs(10);
const RELEASE_POLL: Duration = Duration::from_millis(100);
/// How long `advance` waits for the WAL up to its target to be flushed.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(10);
/// SQLSTATE object_in_use: the slot is active in some backend.
const OBJECT_IN_USE: &str = "55006";
/// SQLSTATE undefined_object: no such slot.
const UNDEFINED_OBJECT: &str = "42704";

#[derive(Debug, thiserror::Error)]
pub enum SlotError {
    #[error("slot `{slot}` does not exist: create it with `outbox-relay slot create`")]
    Missing { slot: String },
    #[error("slot `{slot}` is active in backend {pid}{holder}: stop the relay that holds it (see `outbox-relay status`), or pass --force to end that backend first")]
    Active {
        slot: String,
        pid: i32,
        holder: String,
    },
    #[error("slot `{slot}` is still held by backend {pid} {}s after pg_terminate_backend: see `outbox-relay status` and retry", RELEASE_TIMEOUT.as_secs())]
    StillActive { slot: String, pid: i32 },
    #[error("slot `{slot}` was taken again by backend {pid} right after its holder was ended (a running relay reconnects by itself): stop the relay first, then retry")]
    Retaken { slot: String, pid: i32 },
    #[error("slot `{slot}` has confirmed up to {confirmed}; {target} is behind that, and a logical slot cannot move backwards. To send those events again: `outbox-relay replay`; see docs/src/operations/runbooks.md#replay-after-an-incident")]
    Behind {
        slot: String,
        confirmed: Lsn,
        target: Lsn,
    },
    #[error("{target} is ahead of the server's WAL position {written}: there is nothing there to skip to yet; `--to now` skips everything written so far")]
    Ahead { target: Lsn, written: Lsn },
    #[error("publication `{publication}` does not exist and postgres.create_publication is off: create it first (`outbox-relay check` prints the statement) or turn that on; see docs/src/operations/runbooks.md#slot-create-refused")]
    PublicationMissing { publication: String },
    #[error("refusing to drop slot `{slot}` without --yes: the slot's position is lost, and events committed while no slot exists are never relayed")]
    NeedsYes { slot: String },
    #[error("refusing to release the sweeper hold of slot `{slot}` without --yes: {holds}; once released, the sweeper deletes those rows (the slot never streamed them) when they pass the retention. Re-send the gap first (`outbox-relay replay --since <start of the gap>`)")]
    ReleaseNeedsYes { slot: String, holds: String },
    #[error("`{table}` is not a configured outbox table (configured: {configured})")]
    NotAnOutboxTable { table: String, configured: String },
}

impl SlotError {
    pub fn is_usage(&self) -> bool {
        matches!(
            self,
            SlotError::NeedsYes { .. }
                | SlotError::ReleaseNeedsYes { .. }
                | SlotError::NotAnOutboxTable { .. }
        )
    }
}

/// Where `slot advance --to` moves the slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdvanceTarget {
    /// The server's current WAL position: skip everything written so far.
    Now,
    Lsn(Lsn),
}

impl FromStr for AdvanceTarget {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.trim().eq_ignore_ascii_case("now") {
            return Ok(AdvanceTarget::Now);
        }
        s.parse().map(AdvanceTarget::Lsn).map_err(|_| {
            format!("`{s}` is not an LSN: give `now` or two hexadecimal numbers separated by a slash, like 0/16B3748 (see `outbox-relay status`)")
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SlotAction {
    Created,
    Exists,
    Dropped,
    Absent,
}

/// The outcome of `slot create` or `slot drop`.
#[derive(Debug, Serialize)]
pub struct SlotReport {
    pub ok: bool,
    pub slot: String,
    pub action: SlotAction,
    pub plugin: Option<String>,
    pub confirmed_flush_lsn: Option<Lsn>,
    /// The backend `--force` ended to free the slot.
    pub terminated_pid: Option<i32>,
    /// `slot create` created the publication (postgres.create_publication).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub publication_created: bool,
    /// Outbox tables `slot create` added to the publication (all of them when it created it).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub publication_tables_added: Vec<String>,
    /// Outbox tables whose rows committed before the new slot the sweeper now keeps, until a
    /// replay covers them (see `relay::sweeper::hold`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub sweeper_holds: Vec<String>,
    /// Why a hold left by an interrupted creation still keeps every row (the slot's creation
    /// has not finished yet).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sweeper_hold_pending: Option<String>,
}

impl Report for SlotReport {}

impl fmt::Display for SlotReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let slot = &self.slot;
        let confirmed = self.confirmed_flush_lsn.unwrap_or_default();
        if let Some(pid) = self.terminated_pid {
            writeln!(f, "ended backend {pid}, which held slot `{slot}`")?;
        }
        let tables = self.publication_tables_added.join(", ");
        if self.publication_created {
            writeln!(f, "created the publication (inserts only) for {tables}")?;
        } else if !tables.is_empty() {
            writeln!(f, "added {tables} to the publication")?;
        }
        if let Some(why) = &self.sweeper_hold_pending {
            writeln!(f, "the sweeper hold of an interrupted creation still keeps every row: {why}; run `outbox-relay slot create` again once it has finished")?;
        }
        match self.action {
            SlotAction::Created => {
                writeln!(
                    f,
                    "created slot `{slot}` (pgoutput) at {confirmed}: rows committed from now on are relayed"
                )?;
                if self.sweeper_holds.is_empty() {
                    return Ok(());
                }
                writeln!(
                    f,
                    "the retention sweeper keeps the rows of {} committed before now: re-send the gap with `outbox-relay replay --since <time of the last event consumers got>`, which releases the hold (`outbox-relay status` shows it)",
                    self.sweeper_holds.join(", ")
                )
            }
            SlotAction::Exists if !self.sweeper_holds.is_empty() => writeln!(
                f,
                "slot `{slot}` already exists; completed the sweeper hold of its interrupted creation on {}: the rows committed before now stay until `outbox-relay replay` covers them (`outbox-relay status` shows it)",
                self.sweeper_holds.join(", ")
            ),
            SlotAction::Exists => writeln!(
                f,
                "slot `{slot}` already exists ({}, confirmed up to {confirmed}): nothing to do",
                self.plugin.as_deref().unwrap_or("no plugin")
            ),
            SlotAction::Dropped => {
                writeln!(
                    f,
                    "dropped slot `{slot}` (it had confirmed up to {confirmed})"
                )?;
                writeln!(f, "events committed until a new slot exists are not relayed; `outbox-relay slot create` makes one, `outbox-relay replay` re-publishes rows still in the outbox table")
            }
            SlotAction::Absent => writeln!(f, "slot `{slot}` does not exist: nothing to drop"),
        }
    }
}

/// The outcome of `slot advance`.
#[derive(Debug, Serialize)]
pub struct AdvanceReport {
    pub ok: bool,
    pub slot: String,
    pub from: Lsn,
    pub to: Lsn,
    pub skipped_bytes: u64,
    pub terminated_pid: Option<i32>,
}

impl Report for AdvanceReport {}

impl fmt::Display for AdvanceReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(pid) = self.terminated_pid {
            writeln!(f, "ended backend {pid}, which held slot `{}`", self.slot)?;
        }
        if self.from == self.to {
            return writeln!(
                f,
                "slot `{}` is already at {}: nothing to skip",
                self.slot, self.to
            );
        }
        writeln!(
            f,
            "advanced slot `{}` from {} to {}: skipped {} of WAL",
            self.slot,
            self.from,
            self.to,
            format::bytes_exact(self.skipped_bytes)
        )?;
        writeln!(f, "events committed in that range will not be relayed; `outbox-relay replay` can re-publish them from the outbox table")
    }
}

/// `slot create`: creates the logical slot (pgoutput) unless it exists. Idempotent.
///
/// The publication comes first, as `outbox-relay run` does it: a slot decodes each change with
/// the publication as of that change's WAL position, so every change written between a slot's
/// creation and its publication's fails with `publication "…" does not exist`. With
/// `postgres.create_publication` the publication is created (or completed with the outbox
/// tables it lacks); without it, a missing publication refuses the creation of the slot.
pub async fn create(config: &Config) -> Result<SlotReport, OpsError> {
    let control = connect(config).await?;
    let pg = &config.postgres;
    let slot = &pg.slot;
    let mut publication = (false, Vec::new());
    if pg.create_publication {
        let existed = publication_exists(&control, &pg.publication).await?;
        let added = control
            .ensure_publication_tables(&pg.publication, &config.outbox.publication_tables())
            .await?;
        publication = (!existed, added);
    } else if control.slot(slot).await?.is_none()
        && !publication_exists(&control, &pg.publication).await?
    {
        return Err(SlotError::PublicationMissing {
            publication: pg.publication.clone(),
        }
        .into());
    }
    let failover = pg.failover_slot.wanted(control.server().version_num);
    // A new slot starts at "now": the sweeper must keep the rows committed before it.
    let holds = HoldStore::new(config);
    let missing = control.slot(slot).await?.is_none();
    if missing {
        holds
            .before_creation(control.client(), ARMED_BY_SLOT_CREATE)
            .await?;
    }
    let created = control.create_slot(slot, failover).await?;
    let info = existing(&control, slot).await?;
    check_slot_usable(&info)?;
    let mut held = Vec::new();
    let mut hold_pending = None;
    if missing {
        let start = info.confirmed_flush_lsn;
        held = holds
            .after_creation(control.client(), start, ARMED_BY_SLOT_CREATE)
            .await?;
    } else {
        // A hold armed for a creation that did not finish (still keeping every row) is
        // completed once the slot's creation has provably finished (`relay::sweeper::hold`).
        match holds.complete_interrupted(control.client(), None).await? {
            Interrupted::Completed(completed) => held = completed,
            Interrupted::Pending { why, .. } => hold_pending = Some(why),
            Interrupted::Nothing => {}
        }
    }
    let action = if created {
        SlotAction::Created
    } else {
        SlotAction::Exists
    };
    let mut report = slot_report(&info, action, None);
    report.publication_created = publication.0;
    report.publication_tables_added = publication
        .1
        .iter()
        .map(|(schema, table)| format!("{schema}.{table}"))
        .collect();
    report.sweeper_holds = held.into_iter().map(|h| h.table).collect();
    report.sweeper_hold_pending = hold_pending;
    Ok(report)
}

async fn publication_exists(control: &Control, publication: &str) -> Result<bool, OpsError> {
    let row = control
        .client()
        .query_opt(
            "SELECT 1 FROM pg_publication WHERE pubname = $1",
            &[&publication],
        )
        .await
        .map_err(query_err("checking the publication"))?;
    Ok(row.is_some())
}

/// `slot drop --yes [--force]`. Idempotent: a missing slot is not an error.
pub async fn drop(config: &Config, yes: bool, force: bool) -> Result<SlotReport, OpsError> {
    let slot = &config.postgres.slot;
    if !yes {
        return Err(SlotError::NeedsYes { slot: slot.clone() }.into());
    }
    let control = connect(config).await?;
    let Some(info) = control.slot(slot).await? else {
        return Ok(absent(slot));
    };
    let terminated = release(&control, &info, force).await?;
    let result = control
        .client()
        .execute("SELECT pg_drop_replication_slot($1)", &[slot])
        .await;
    match result {
        Ok(_) => Ok(slot_report(&info, SlotAction::Dropped, terminated)),
        Err(e) if sqlstate(&e) == Some(UNDEFINED_OBJECT) => Ok(absent(slot)),
        Err(e) if sqlstate(&e) == Some(OBJECT_IN_USE) => Err(retaken(&control, slot).await),
        Err(e) => Err(query_err(format!("dropping slot `{slot}`"))(e).into()),
    }
}

/// `slot advance --to <LSN|now> [--force]`: moves the slot forward, skipping WAL.
pub async fn advance(
    config: &Config,
    target: AdvanceTarget,
    force: bool,
) -> Result<AdvanceReport, OpsError> {
    let control = connect(config).await?;
    let slot = &config.postgres.slot;
    let info = existing(&control, slot).await?;
    check_slot_usable(&info)?;
    let written = wal_lsn(&control, "pg_current_wal_insert_lsn()").await?;
    let target = match target {
        AdvanceTarget::Now => written,
        AdvanceTarget::Lsn(lsn) => lsn,
    };
    check_target(&info, target, written)?;
    let terminated = release(&control, &info, force).await?;
    // Re-read: the holder we ended may have confirmed more before it went.
    let info = existing(&control, slot).await?;
    let from = info.confirmed_flush_lsn.unwrap_or_default();
    check_target(&info, target, written)?;
    wait_flushed(&control, target).await?;
    let to = if target > from {
        advance_to(&control, slot, target).await?
    } else {
        from
    };
    Ok(AdvanceReport {
        ok: true,
        slot: slot.clone(),
        from,
        to,
        skipped_bytes: from.bytes_until(to),
        terminated_pid: terminated,
    })
}

/// A target behind the confirmed position or past the server's WAL is refused.
fn check_target(info: &SlotInfo, target: Lsn, written: Lsn) -> Result<(), SlotError> {
    let confirmed = info.confirmed_flush_lsn.unwrap_or_default();
    if target < confirmed {
        return Err(SlotError::Behind {
            slot: info.name.clone(),
            confirmed,
            target,
        });
    }
    if target > written {
        return Err(SlotError::Ahead { target, written });
    }
    Ok(())
}

async fn advance_to(control: &Control, slot: &str, target: Lsn) -> Result<Lsn, OpsError> {
    let result = control
        .client()
        .query_one(
            "SELECT end_lsn::text FROM pg_replication_slot_advance($1, $2::pg_lsn)",
            &[&slot, &PgLsn::from(target.0)],
        )
        .await;
    let row = match result {
        Ok(row) => row,
        Err(e) if sqlstate(&e) == Some(OBJECT_IN_USE) => return Err(retaken(control, slot).await),
        Err(e) => return Err(query_err(format!("advancing slot `{slot}`"))(e).into()),
    };
    let text: Option<String> = row.get(0);
    Ok(text.and_then(|t| t.parse().ok()).unwrap_or(target))
}

/// A WAL position function of the server (`pg_current_wal_insert_lsn()` or
/// `pg_current_wal_flush_lsn()`; never user input).
async fn wal_lsn(control: &Control, function: &str) -> Result<Lsn, OpsError> {
    let row = control
        .client()
        .query_one(&format!("SELECT {function}::text"), &[])
        .await
        .map_err(query_err("reading the server's WAL position"))?;
    let text: String = row.get(0);
    Ok(text.parse().unwrap_or_default())
}

/// Waits until the server flushed WAL up to `target`: a slot cannot be advanced past the flushed
/// position, and with `synchronous_commit = off` a committed transaction may not be flushed yet
/// (the WAL writer does it within a few `wal_writer_delay`). Gives up quietly after a while: the
/// advance then stops at the flushed position, which the report shows.
async fn wait_flushed(control: &Control, target: Lsn) -> Result<(), OpsError> {
    let deadline = Instant::now() + FLUSH_TIMEOUT;
    while wal_lsn(control, "pg_current_wal_flush_lsn()").await? < target
        && Instant::now() < deadline
    {
        tokio::time::sleep(RELEASE_POLL).await;
    }
    Ok(())
}

async fn existing(control: &Control, slot: &str) -> Result<SlotInfo, OpsError> {
    control.slot(slot).await?.ok_or_else(|| {
        SlotError::Missing {
            slot: slot.to_string(),
        }
        .into()
    })
}

/// Frees an active slot: refuses without `force`; with it, ends the holding backend and waits
/// until the slot is inactive. Returns the ended backend's pid.
async fn release(control: &Control, info: &SlotInfo, force: bool) -> Result<Option<i32>, OpsError> {
    let Some(pid) = info.active_pid.filter(|_| info.active) else {
        return Ok(None);
    };
    if !force {
        return Err(SlotError::Active {
            slot: info.name.clone(),
            pid,
            holder: holder(control, pid).await,
        }
        .into());
    }
    control
        .client()
        .query_one("SELECT pg_terminate_backend($1)", &[&pid])
        .await
        .map_err(query_err(format!(
            "ending backend {pid}, which holds slot `{}`",
            info.name
        )))?;
    wait_inactive(control, &info.name, pid).await?;
    Ok(Some(pid))
}

async fn wait_inactive(control: &Control, slot: &str, pid: i32) -> Result<(), OpsError> {
    let deadline = Instant::now() + RELEASE_TIMEOUT;
    loop {
        let Some(info) = control.slot(slot).await? else {
            return Ok(());
        };
        match info.active_pid.filter(|_| info.active) {
            None => return Ok(()),
            Some(other) if other != pid => {
                return Err(SlotError::Retaken {
                    slot: slot.to_string(),
                    pid: other,
                }
                .into())
            }
            Some(_) if Instant::now() >= deadline => {
                return Err(SlotError::StillActive {
                    slot: slot.to_string(),
                    pid,
                }
                .into())
            }
            Some(_) => tokio::time::sleep(RELEASE_POLL).await,
        }
    }
}

/// The error for a slot that became active again between releasing and using it.
async fn retaken(control: &Control, slot: &str) -> OpsError {
    let pid = match control.slot(slot).await {
        Ok(Some(info)) => info.active_pid.unwrap_or(0),
        _ => 0,
    };
    SlotError::Retaken {
        slot: slot.to_string(),
        pid,
    }
    .into()
}

/// ` (application "outbox-relay", client 10.0.0.7)` for a backend, or empty when unknown.
async fn holder(control: &Control, pid: i32) -> String {
    let row = control
        .client()
        .query_opt(
            "SELECT application_name, client_addr::text FROM pg_stat_activity WHERE pid = $1",
            &[&pid],
        )
        .await;
    match row {
        Ok(Some(row)) => {
            let app: Option<String> = row.get(0);
            let addr: Option<String> = row.get(1);
            let mut parts = Vec::new();
            if let Some(app) = app.filter(|a| !a.is_empty()) {
                parts.push(format!("application \"{app}\""));
            }
            if let Some(addr) = addr {
                parts.push(format!("client {addr}"));
            }
            if parts.is_empty() {
                String::new()
            } else {
                format!(" ({})", parts.join(", "))
            }
        }
        _ => String::new(),
    }
}

fn slot_report(info: &SlotInfo, action: SlotAction, terminated: Option<i32>) -> SlotReport {
    SlotReport {
        ok: true,
        slot: info.name.clone(),
        action,
        plugin: info.plugin.clone(),
        confirmed_flush_lsn: info.confirmed_flush_lsn,
        terminated_pid: terminated,
        publication_created: false,
        publication_tables_added: Vec::new(),
        sweeper_holds: Vec::new(),
        sweeper_hold_pending: None,
    }
}

fn absent(slot: &str) -> SlotReport {
    SlotReport {
        ok: true,
        slot: slot.to_string(),
        action: SlotAction::Absent,
        plugin: None,
        confirmed_flush_lsn: None,
        terminated_pid: None,
        publication_created: false,
        publication_tables_added: Vec::new(),
        sweeper_holds: Vec::new(),
        sweeper_hold_pending: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(confirmed: u64) -> SlotInfo {
        SlotInfo {
            name: "s".into(),
            plugin: Some("pgoutput".into()),
            slot_type: "logical".into(),
            database: Some("db".into()),
            active: false,
            active_pid: None,
            restart_lsn: Some(Lsn(confirmed)),
            confirmed_flush_lsn: Some(Lsn(confirmed)),
            wal_status: Some("reserved".into()),
            safe_wal_size: None,
            failover: None,
            synced: None,
            temporary: false,
        }
    }

    #[test]
    fn targets_parse_as_now_or_an_lsn() {
        assert_eq!("now".parse(), Ok(AdvanceTarget::Now));
        assert_eq!("NOW".parse(), Ok(AdvanceTarget::Now));
        assert_eq!("1/AB".parse(), Ok(AdvanceTarget::Lsn(Lsn(0x1_0000_00AB))));
        let err = "banana".parse::<AdvanceTarget>().unwrap_err();
        assert!(err.contains("`banana` is not an LSN"), "{err}");
        assert!(!err.contains('\n'));
    }

    #[test]
    fn a_target_behind_the_slot_points_to_replay() {
        let err = check_target(&info(0x500), Lsn(0x400), Lsn(0x900)).unwrap_err();
        assert!(matches!(err, SlotError::Behind { .. }));
        let message = err.to_string();
        assert!(message.contains("outbox-relay replay"), "{message}");
        assert!(
            message.contains("0/500") && message.contains("0/400"),
            "{message}"
        );
    }

    #[test]
    fn a_target_past_the_server_is_refused_and_between_is_fine() {
        let err = check_target(&info(0x500), Lsn(0xA00), Lsn(0x900)).unwrap_err();
        assert!(matches!(err, SlotError::Ahead { .. }), "{err}");
        assert!(check_target(&info(0x500), Lsn(0x500), Lsn(0x900)).is_ok());
        assert!(check_target(&info(0x500), Lsn(0x900), Lsn(0x900)).is_ok());
    }

    #[test]
    fn only_a_missing_yes_is_a_usage_error() {
        assert!(SlotError::NeedsYes { slot: "s".into() }.is_usage());
        assert!(!SlotError::Missing { slot: "s".into() }.is_usage());
    }

    #[test]
    fn advance_report_says_how_much_was_skipped() {
        let report = AdvanceReport {
            ok: true,
            slot: "s".into(),
            from: Lsn(0x1000),
            to: Lsn(0x1000 + 18_624),
            skipped_bytes: 18_624,
            terminated_pid: None,
        };
        let text = report.to_string();
        assert!(text.contains("from 0/1000 to 0/58C0"), "{text}");
        assert!(text.contains("18.2 KiB (18624 bytes)"), "{text}");
    }
}
