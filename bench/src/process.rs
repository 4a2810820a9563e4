//! The processes a run starts (the relay, perf, `pg_recvlogical`), each owned by a value that
//! stops it in `Drop`: a phase that fails, or a Ctrl-C that drops the run, leaves nothing
//! running.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use tokio::process::{Child, Command};

use crate::util::unix_ns;

/// How long a stopped relay may take to drain and exit before it is SIGKILLed.
const STOP_GRACE: Duration = Duration::from_secs(60);

/// Sends `signal` (TERM, INT, KILL) to `pid` with kill(1): the binary denies `unsafe`.
pub fn signal(pid: u32, signal: &str) {
    let _ = std::process::Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .stderr(Stdio::null())
        .status();
}

/// Waits up to `grace` for `child` to exit (blocking: used from `Drop`), then SIGKILLs it.
pub fn reap(child: &mut Child, grace: Duration) {
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if !matches!(child.try_wait(), Ok(None)) {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.start_kill();
    std::thread::sleep(Duration::from_millis(100));
    let _ = child.try_wait();
}

/// How to start a relay.
pub struct RelayCommand {
    pub bin: PathBuf,
    /// `OUTBOX_RELAY__…` and other environment assignments.
    pub env: Vec<(String, String)>,
    pub log: PathBuf,
    /// With `--perf`: profile it into this file (perf record, DWARF call graphs).
    pub profile: Option<PathBuf>,
}

/// A running relay (`outbox-relay run`), perhaps under `perf record`.
pub struct Relay {
    /// The relay, or perf around it.
    child: Child,
    pid: u32,
    pub started_ns: u128,
    pub log: PathBuf,
}

/// The relay's pid under perf: perf's child, once it forked it.
async fn perf_child(perf_pid: u32) -> anyhow::Result<u32> {
    let children = format!("/proc/{perf_pid}/task/{perf_pid}/children");
    for _ in 0..100 {
        let text = std::fs::read_to_string(&children).unwrap_or_default();
        if let Some(pid) = text.split_whitespace().next().and_then(|p| p.parse().ok()) {
            return Ok(pid);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    bail!("the relay did not start under perf")
}

impl Relay {
    pub async fn start(c: &RelayCommand) -> anyhow::Result<Relay> {
        let log =
            std::fs::File::create(&c.log).with_context(|| format!("create {}", c.log.display()))?;
        let mut command = match &c.profile {
            // Started under perf rather than attached to, so that librdkafka's threads,
            // created at start-up, are all followed.
            Some(data) => {
                let mut perf = Command::new("perf");
                perf.args(["record", "-q", "-e", "cpu-clock", "-F", "499"])
                    .args(["--call-graph", "dwarf,16384", "-o"])
                    .arg(data)
                    .arg("--")
                    .arg(&c.bin);
                perf
            }
            None => Command::new(&c.bin),
        };
        command
            .arg("run")
            .envs(c.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        let started_ns = unix_ns();
        let child = command
            .spawn()
            .with_context(|| format!("start {}", c.bin.display()))?;
        let own = child.id().context("the relay exited at once")?;
        let mut relay = Relay {
            child,
            pid: own,
            started_ns,
            log: c.log.clone(),
        };
        if c.profile.is_some() {
            relay.pid = perf_child(own).await?;
        }
        Ok(relay)
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Whether it still runs.
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// SIGTERM (the relay drains and confirms), then wait for it.
    pub async fn stop(mut self) {
        signal(self.pid, "TERM");
        let _ = tokio::time::timeout(STOP_GRACE, self.child.wait()).await;
        // Drop SIGKILLs it if it is still there.
    }

    /// SIGKILL, then wait for it.
    pub async fn kill(mut self) {
        signal(self.pid, "KILL");
        let _ = self.child.wait().await;
    }

    /// The relay's `/metrics` URL, from the address its log says it listens on (it listens on
    /// a port the kernel picks); waits up to 5 s for that line.
    pub async fn metrics_url(&self) -> Option<String> {
        for _ in 0..50 {
            if let Some(addr) = metrics_addr(&self.log) {
                return Some(format!("http://{addr}/metrics"));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        eprintln!(
            "[bench]   the relay did not say where it serves /metrics; log: {}",
            self.log.display()
        );
        None
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        if self.running() {
            signal(self.pid, "TERM");
            reap(&mut self.child, STOP_GRACE);
        }
    }
}

/// The `addr=host:port` of the relay's last "serving /metrics" log line.
fn metrics_addr(log: &Path) -> Option<String> {
    let text = std::fs::read_to_string(log).ok()?;
    let line = text
        .lines()
        .rev()
        .find(|l| l.contains("serving /metrics"))?;
    let rest = &line[line.find(" addr=")? + 6..];
    let addr: String = rest
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.' || *c == ':')
        .collect();
    addr.contains(':').then_some(addr)
}

/// A machine-wide `perf record` (no call graphs), stopped with SIGINT.
pub struct SystemPerf {
    child: Child,
}

impl SystemPerf {
    pub fn start(data: &Path, log: &Path) -> anyhow::Result<SystemPerf> {
        let child = Command::new("perf")
            .args(["record", "-q", "-a", "-e", "cpu-clock", "-F", "499", "-o"])
            .arg(data)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log)?)
            .spawn()
            .context("start perf record -a")?;
        Ok(SystemPerf { child })
    }
}

impl Drop for SystemPerf {
    fn drop(&mut self) {
        if let Some(pid) = self.child.id() {
            signal(pid, "INT");
            reap(&mut self.child, Duration::from_secs(30));
        }
    }
}

/// `pg_recvlogical` draining `slot` of `url` to /dev/null up to `end_lsn` (it exits at the
/// last commit); returns the seconds it took. Killed if the future is dropped.
pub async fn recvlogical(
    pg_bin: &Path,
    url: &str,
    slot: &str,
    end_lsn: &str,
) -> anyhow::Result<f64> {
    let started = Instant::now();
    let status = Command::new(pg_bin.join("pg_recvlogical"))
        .args(["--start", "--no-loop", "-S", slot, "-d", url])
        .args(["--plugin=pgoutput", "-o", "proto_version=1"])
        .args(["-o", "publication_names=outbox_relay_pub"])
        .arg(format!("--endpos={end_lsn}"))
        .args(["-f", "/dev/null"])
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .status()
        .await
        .context("run pg_recvlogical")?;
    if !status.success() {
        bail!("pg_recvlogical failed: {status}");
    }
    Ok(started.elapsed().as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_metrics_address_is_read_from_the_relay_log() {
        let dir = std::env::temp_dir().join(format!("outbox-bench-test-{}", unix_ns()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("relay.log");
        std::fs::write(
            &log,
            "2026-12-02T02:00:00Z  INFO outbox_relay::serve::http: serving /metrics, /healthz \
             and /readyz addr=127.0.0.1:40123\n",
        )
        .unwrap();
        assert_eq!(metrics_addr(&log).as_deref(), Some("127.0.0.1:40123"));
        std::fs::write(&log, "nothing yet\n").unwrap();
        assert_eq!(metrics_addr(&log), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
