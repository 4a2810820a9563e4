//! The `run` section of the result file: the command, the settings and the versions.

use std::path::Path;
use std::process::Command;

use super::ctx::{Ctx, DRAIN_STATUS_INTERVAL_MS};
use crate::results::RunMeta;
use crate::util::loadavg;

/// The first line a command prints, trimmed; `unknown` when it fails.
fn first_line(program: impl AsRef<std::ffi::OsStr>, args: &[&str]) -> String {
    Command::new(program)
        .args(args)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.lines().next().map(|l| l.trim().to_string()))
        .unwrap_or_else(|| "unknown".into())
}

/// The broker's version, from scripts/kafka/pom.xml (`<kafka.version>`).
fn kafka_version(repo: &Path) -> String {
    let pom = std::fs::read_to_string(repo.join("scripts/kafka/pom.xml")).unwrap_or_default();
    pom.split_once("<kafka.version>")
        .and_then(|(_, rest)| rest.split_once("</kafka.version>"))
        .map_or(String::new(), |(v, _)| v.to_string())
}

/// The first 16 hex digits of the relay binary's SHA-256.
fn relay_sha256(relay_bin: &Path) -> String {
    let line = first_line("sha256sum", &[&relay_bin.to_string_lossy()]);
    line.chars().take(16).collect()
}

/// The command line recorded: scripts/bench.sh's own, when it ran this.
fn command_line() -> String {
    std::env::var("OUTBOX_BENCH_COMMAND").unwrap_or_else(|_| {
        let args: Vec<String> = std::env::args().collect();
        args.join(" ")
    })
}

/// The run's metadata, at its end.
pub fn run_meta(ctx: &Ctx, payload_bytes_avg: f64, load_start: String) -> RunMeta {
    let s = &ctx.settings;
    let repo = &ctx.repo;
    RunMeta {
        date: jiff::Timestamp::now()
            .strftime("%Y-%m-%dT%H:%M:%SZ")
            .to_string(),
        command: command_line(),
        label: s.label.clone(),
        events: s.events as f64,
        partitions: f64::from(s.partitions),
        payload_bytes_avg,
        drain_relay_status_interval_ms: DRAIN_STATUS_INTERVAL_MS as f64,
        delivery: Some(s.delivery.join(" ")),
        shapes: Some(s.shapes.join(" ")),
        relay_extra_env: s.relay_env.join(" "),
        kafka_jvm_opts: std::env::var("OUTBOX_KAFKA_JVM_OPTS").unwrap_or_default(),
        load_start,
        load_end: loadavg(),
        git_commit: first_line("git", &["-C", &repo.to_string_lossy(), "rev-parse", "HEAD"]),
        relay_sha256: relay_sha256(&s.relay_bin),
        postgres: first_line(ctx.services.pg_server_bin.join("postgres"), &["--version"]),
        kafka: kafka_version(repo),
        rustc: first_line("rustc", &["--version"]),
    }
}
