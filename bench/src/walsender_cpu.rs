//! The CPU time of the walsender serving a slot, sampled from `/proc` while a drain runs.
//!
//! Why: a drain's ratio says which client finished first, not who held it back. A walsender
//! that used about one core per second of the drain was the bound, and no client could have
//! gone faster against it; one that idled was waiting for its client.

use std::collections::HashMap;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::pg::pg_connect;
use crate::proc_stat::cpu_seconds;

/// How often the slot's walsender is sampled. Its last sample before it exits (the end of a
/// `pg_recvlogical` drain) is at most this old: up to 50 ms of one core missing.
const SAMPLE_INTERVAL: Duration = Duration::from_millis(50);

/// A running sampler; `finish` stops it.
pub struct WalsenderCpu {
    stop: oneshot::Sender<()>,
    task: JoinHandle<Option<f64>>,
}

/// Samples the CPU of each walsender that serves `slot` (its `active_pid`) until finished.
pub fn watch(url: &str, slot: &str, clk_tck: u64) -> WalsenderCpu {
    let (stop, mut stopped) = oneshot::channel();
    let (url, slot) = (url.to_string(), slot.to_string());
    let task = tokio::spawn(async move {
        let client = match pg_connect(&url).await {
            Ok(c) => c,
            Err(e) => {
                eprintln!("[bench]   (no walsender CPU: {e:#})");
                return None;
            }
        };
        let query = "SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1";
        // Each walsender's latest total: a client that reconnects gets a new one.
        let mut per_pid: HashMap<u32, f64> = HashMap::new();
        let mut tick = tokio::time::interval(SAMPLE_INTERVAL);
        loop {
            tokio::select! {
                _ = &mut stopped => break,
                _ = tick.tick() => {}
            }
            let Ok(Some(row)) = client.query_opt(query, &[&slot]).await else {
                continue;
            };
            if let Some(pid) = row.get::<_, Option<i32>>(0) {
                if let Ok(cpu) = cpu_seconds(pid as u32, clk_tck) {
                    per_pid.insert(pid as u32, cpu);
                }
            }
        }
        (!per_pid.is_empty()).then(|| per_pid.values().sum())
    });
    WalsenderCpu { stop, task }
}

impl WalsenderCpu {
    /// Stops sampling: the CPU seconds of the slot's walsenders (none seen: `None`), and a
    /// line saying what share of a core that was over `seconds` of drain.
    pub async fn finish(self, who: &str, seconds: f64) -> Option<f64> {
        let _ = self.stop.send(());
        let cpu = self.task.await.ok().flatten();
        if let Some(cpu) = cpu {
            eprintln!(
                "[bench]   {who}'s walsender: CPU {cpu:.2} s over {seconds:.2} s ({:.0} % of a core)",
                cpu / seconds * 100.0
            );
        }
        cpu
    }
}
