//! Watching the slot from the control side: sampling its lag and health for `/metrics`, noticing
//! when it is lost or dropped, and waiting as a standby while another relay streams it.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::config::Config;
use crate::lsn::Lsn;
use crate::postgres::control::{Control, ControlError, SlotHolder};
use crate::serve::metrics::Metrics;

/// Why the slot can no longer be trusted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("slot `{slot}` {}: events after {confirmed} may be missing. Recover with {}, then `outbox-relay replay --since <time of the last event consumers saw>`", .cause.what(), .cause.recovery())]
pub struct SlotGone {
    pub slot: String,
    pub cause: GoneCause,
    /// The last position the relay knew confirmed.
    pub confirmed: Lsn,
}

/// How the slot went: a lost slot still exists (and must be dropped before it can be created
/// again), a dropped one does not, and one missing on the server the relay now reaches may be
/// either (a failover to a standby without a synchronized copy).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GoneCause {
    /// `wal_status = lost`: PostgreSQL removed WAL the slot still needed.
    Lost,
    /// The slot disappeared while the relay ran.
    Dropped,
    /// The slot was streamed before (the mark in the publication's comment says so) but is not
    /// on this server, named here.
    Missing { server: String },
}

impl GoneCause {
    fn what(&self) -> String {
        match self {
            GoneCause::Lost => "is lost (wal_status = lost): PostgreSQL removed WAL it still needed (max_slot_wal_keep_size)".into(),
            GoneCause::Dropped => "was dropped while the relay ran".into(),
            GoneCause::Missing { server } => format!("was streamed before but is not on {server}: either it was dropped, or a failover promoted a standby that had no synchronized copy of it (no failover slot, or not synced yet: see postgres.failover_slot and `outbox-relay check`)"),
        }
    }

    fn recovery(&self) -> &'static str {
        match self {
            GoneCause::Lost => "`outbox-relay slot drop --yes` (the lost slot still exists), `outbox-relay slot create`",
            GoneCause::Dropped | GoneCause::Missing { .. } => "`outbox-relay slot create`",
        }
    }
}

/// Longest wait for one sample or standby look-up (connect included). A control connection
/// whose path died without a FIN/RST would otherwise hang the watcher until TCP gives up.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(30);

/// Opens a control connection for the configured database.
pub async fn connect(config: &Config) -> Result<Control, ControlError> {
    Control::connect(&config.postgres).await
}

/// Samples the slot every `slot_sample_interval_ms` into `metrics` until `shutdown`. Sends a
/// `SlotGone` (once) when the slot is lost, or disappears after having been seen.
pub async fn sample_forever(
    config: Config,
    metrics: Arc<Metrics>,
    gone: mpsc::Sender<SlotGone>,
    shutdown: CancellationToken,
) {
    let slot = config.postgres.slot.clone();
    let interval = Duration::from_millis(config.postgres.slot_sample_interval_ms);
    let mut control: Option<Control> = None;
    let mut seen = false;
    loop {
        if control.is_none() {
            control = tokio::time::timeout(LOOKUP_TIMEOUT, connect(&config))
                .await
                .ok()
                .and_then(Result::ok);
        }
        if let Some(c) = &control {
            let Ok(sampled) = tokio::time::timeout(LOOKUP_TIMEOUT, c.sample_slot(&slot)).await
            else {
                warn!(
                    timeout_s = LOOKUP_TIMEOUT.as_secs(),
                    "sampling the slot timed out; reconnecting"
                );
                control = None;
                continue;
            };
            match sampled {
                Ok(Some(sample)) => {
                    seen = true;
                    metrics
                        .slot_lag_bytes
                        .store(sample.lag_bytes.unwrap_or(-1), Relaxed);
                    metrics
                        .slot_retained_wal_bytes
                        .store(sample.retained_bytes.unwrap_or(-1), Relaxed);
                    let status = sample.wal_status.unwrap_or_default();
                    metrics.set_wal_status(&status);
                    if status == "lost" {
                        let lost = slot_gone(&slot, GoneCause::Lost, &metrics);
                        let _ = gone.send(lost).await;
                        return;
                    }
                }
                Ok(None) => {
                    metrics.set_wal_status("missing");
                    if seen {
                        let dropped = slot_gone(&slot, GoneCause::Dropped, &metrics);
                        let _ = gone.send(dropped).await;
                        return;
                    }
                }
                Err(e) => {
                    warn!(error = %e, "cannot sample the slot; retrying");
                    control = None;
                }
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
    }
}

pub fn slot_gone(slot: &str, cause: GoneCause, metrics: &Metrics) -> SlotGone {
    SlotGone {
        slot: slot.to_string(),
        cause,
        confirmed: Lsn(metrics.confirmed_lsn.load(Relaxed)),
    }
}

/// One standby round: says who holds the slot (once per holder), flags a stale holder, ends it
/// when configured to, then waits `standby_retry_ms`.
pub struct Standby {
    last_holder: Option<i32>,
}

impl Standby {
    pub fn new() -> Self {
        Standby { last_holder: None }
    }

    pub async fn wait(&mut self, config: &Config, shutdown: &CancellationToken) {
        let pg = &config.postgres;
        if tokio::time::timeout(LOOKUP_TIMEOUT, self.look_up(config))
            .await
            .is_err()
        {
            warn!(
                timeout_s = LOOKUP_TIMEOUT.as_secs(),
                "standby: looking up the slot's holder timed out"
            );
        }
        tokio::select! {
            _ = shutdown.cancelled() => {}
            _ = tokio::time::sleep(Duration::from_millis(pg.standby_retry_ms)) => {}
        }
    }

    async fn look_up(&mut self, config: &Config) {
        let pg = &config.postgres;
        match connect(config).await {
            Ok(control) => match control.slot_holder(&pg.slot).await {
                Ok(Some(holder)) => self.consider(&control, config, &holder).await,
                Ok(None) => {}
                Err(e) => warn!(error = %e, "standby: cannot look up the slot's holder"),
            },
            Err(e) => warn!(error = %e, "standby: cannot connect to look up the slot's holder"),
        }
    }

    async fn consider(&mut self, control: &Control, config: &Config, holder: &SlotHolder) {
        let pg = &config.postgres;
        if self.last_holder != Some(holder.pid) {
            self.last_holder = Some(holder.pid);
            info!(slot = %pg.slot, holder_pid = holder.pid, application = ?holder.application_name,
                client = ?holder.client_addr, retry_ms = pg.standby_retry_ms,
                "standby: another connection streams the slot; taking over when it goes away");
        }
        let stale_after = Duration::from_millis(pg.stale_holder_after_ms).as_secs_f64();
        let Some(age) = holder.reply_age_secs.filter(|age| *age > stale_after) else {
            return;
        };
        if !pg.terminate_stale_holder {
            warn!(slot = %pg.slot, holder_pid = holder.pid, silent_secs = age,
                "standby: the slot's holder has not answered PostgreSQL for a while and looks stale; set postgres.terminate_stale_holder = true to end it, or end it with `SELECT pg_terminate_backend({pid})` (the slot and its position stay)", pid = holder.pid);
            return;
        }
        match control.terminate_backend(holder.pid).await {
            Ok(true) => warn!(slot = %pg.slot, holder_pid = holder.pid, silent_secs = age,
                "standby: ended the stale holder of the slot (postgres.terminate_stale_holder)"),
            Ok(false) => {}
            Err(e) => warn!(error = %e, "standby: cannot end the stale holder"),
        }
    }
}

impl Default for Standby {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lost_slot_is_dropped_before_it_is_created_again() {
        let metrics = Metrics::default();
        let lost = slot_gone("s", GoneCause::Lost, &metrics).to_string();
        assert!(lost.contains("is lost (wal_status = lost)"), "{lost}");
        assert!(
            lost.contains("`outbox-relay slot drop --yes` (the lost slot still exists), `outbox-relay slot create`, then `outbox-relay replay"),
            "{lost}"
        );
        let dropped = slot_gone("s", GoneCause::Dropped, &metrics).to_string();
        assert!(
            dropped.contains("was dropped while the relay ran"),
            "{dropped}"
        );
        assert!(
            dropped.contains("Recover with `outbox-relay slot create`, then"),
            "{dropped}"
        );
        assert!(!dropped.contains("slot drop"), "{dropped}");
    }
}
