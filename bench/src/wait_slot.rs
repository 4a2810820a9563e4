//! Waiting for a slot: `confirmed_flush_lsn` polled every 100 ms until it reaches a target,
//! then the relay's `/proc` figures sampled at that moment.

use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::pg::{parse_lsn, pg_connect};
use crate::proc_stat::sample_proc;
use crate::records::SlotReached;
use crate::util::unix_ns;

/// How often the slot is looked at.
const SLOT_POLL_INTERVAL: Duration = Duration::from_millis(100);

/// What to wait for, and for which process.
pub struct SlotWait<'a> {
    pub url: &'a str,
    pub slot: &'a str,
    pub lsn: &'a str,
    /// The relay's process id: its /proc entry is sampled; its death is an error.
    pub pid: u32,
    /// From when the elapsed time counts, ns since the Unix epoch.
    pub started_ns: u128,
    pub clk_tck: u64,
    pub timeout: Duration,
}

/// Where the slot was first seen, and when (s since `started_ns`) and at which fraction of
/// the way it was first seen half-way or further: the rate of the second half leaves out
/// what a relay pays once at the start (connecting, a first sight of each topic).
#[derive(Default)]
struct Progress {
    first: Option<u64>,
    half: Option<(f64, f64)>,
}

impl Progress {
    fn saw(&mut self, at: u64, target: u64, reached: bool, started_ns: u128) {
        let start = *self.first.get_or_insert(at);
        let fraction = at.saturating_sub(start) as f64 / target.saturating_sub(start).max(1) as f64;
        // Not when it got there in one step with the end: no second half to time.
        if self.half.is_none() && fraction >= 0.5 && !reached {
            let seconds = unix_ns().saturating_sub(started_ns) as f64 / 1e9;
            self.half = Some((seconds, fraction.min(1.0)));
        }
    }
}

pub async fn wait_slot(w: &SlotWait<'_>) -> anyhow::Result<SlotReached> {
    let client = pg_connect(w.url).await?;
    let query = client
        .prepare(
            "SELECT confirmed_flush_lsn >= $2::text::pg_lsn, confirmed_flush_lsn::text
             FROM pg_replication_slots WHERE slot_name = $1",
        )
        .await?;
    let deadline = Instant::now() + w.timeout;
    let mut tick = tokio::time::interval(SLOT_POLL_INTERVAL);
    let target = parse_lsn(w.lsn).with_context(|| format!("`{}` is not an LSN", w.lsn))?;
    let mut progress = Progress::default();
    loop {
        tick.tick().await;
        let row = client
            .query_opt(&query, &[&w.slot, &w.lsn])
            .await?
            .with_context(|| format!("slot {} does not exist", w.slot))?;
        let reached = row.get::<_, Option<bool>>(0) == Some(true);
        let confirmed: Option<String> = row.get(1);
        if let Some(at) = confirmed.as_deref().and_then(parse_lsn) {
            progress.saw(at, target, reached, w.started_ns);
        }
        if reached {
            return reached_now(w, confirmed, &progress);
        }
        sample_proc(w.pid, w.clk_tck).context("the relay exited before confirming the target")?;
        if Instant::now() > deadline {
            bail!(
                "slot {} still at {confirmed:?} after {} s; target {}",
                w.slot,
                w.timeout.as_secs(),
                w.lsn
            );
        }
    }
}

/// The record of a slot that just reached its target: the process sampled right away,
/// before the caller stops it.
fn reached_now(
    w: &SlotWait<'_>,
    confirmed: Option<String>,
    progress: &Progress,
) -> anyhow::Result<SlotReached> {
    let seconds = unix_ns().saturating_sub(w.started_ns) as f64 / 1e9;
    let p = sample_proc(w.pid, w.clk_tck)?;
    eprintln!(
        "[outbox-bench] slot {} reached {} after {seconds:.2} s; peak RSS {:.1} MB, CPU {:.2} s, \
         {} context switches",
        w.slot,
        w.lsn,
        p.vmhwm_kb as f64 / 1024.0,
        p.cpu_seconds,
        p.context_switches
    );
    Ok(SlotReached {
        seconds,
        confirmed_flush_lsn: confirmed,
        target_lsn: w.lsn.to_string(),
        vmhwm_kb: p.vmhwm_kb,
        vmrss_kb: p.vmrss_kb,
        cpu_seconds: p.cpu_seconds,
        threads: p.threads,
        context_switches: p.context_switches,
        half_way_seconds: progress.half.map(|h| h.0),
        half_way_fraction: progress.half.map(|h| h.1),
    })
}
