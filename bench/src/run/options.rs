//! `outbox-bench run`'s options: the same as `scripts/bench.sh`'s (its usage header is their
//! reference), and what they resolve to (the `--quick` defaults, the lists).

use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::Args;

/// The options, as given.
#[derive(Args, Debug, Clone)]
pub struct Options {
    /// Events per drain round (default 1000000; 200000 with --quick).
    #[arg(value_name = "N")]
    pub n: Option<u64>,
    /// Events per drain round (as N).
    #[arg(long)]
    pub events: Option<u64>,
    /// 5 s per latency rate, 10 s idle, and N=200000 unless N is given.
    #[arg(long)]
    pub quick: bool,
    /// Drain rounds, rows per transaction.
    #[arg(long, default_value = "1 10 100")]
    pub txn_sizes: String,
    /// Latency rates, events/s.
    #[arg(long, default_value = "1000 5000 20000")]
    pub rates: String,
    /// Seconds per latency rate (default 15; 5 with --quick).
    #[arg(long)]
    pub rate_seconds: Option<u64>,
    /// Seconds of writers at each latency rate before its measured window, whose records
    /// are reported apart (default 10; 3 with --quick; 0: none).
    #[arg(long)]
    pub warm_up_seconds: Option<u64>,
    /// Idle CPU window, s (default 30; 10 with --quick).
    #[arg(long)]
    pub idle_seconds: Option<u64>,
    /// Partitions of each benchmark topic.
    #[arg(long, default_value_t = 3)]
    pub partitions: i32,
    /// Latency writer connections.
    #[arg(long, default_value_t = 4)]
    pub writers: u64,
    /// Topics each latency rate's rows spread over (one aggregate type each).
    #[arg(long, default_value_t = 1)]
    pub latency_topics: u64,
    #[arg(long)]
    pub no_drain: bool,
    #[arg(long)]
    pub no_latency: bool,
    /// Each latency rate twice per mode, with [tracing] off and on.
    #[arg(long)]
    pub tracing: bool,
    /// Delivery modes measured side by side (space or comma separated).
    #[arg(long, default_value = "at_least_once exactly_once")]
    pub delivery: String,
    /// Opt-in phases: payload, topics, schema, big-txn, sigkill, all (space or comma separated).
    #[arg(long, default_value = "")]
    pub shapes: String,
    /// Payload bytes of the payload shape.
    #[arg(long, default_value = "2048 16384 262144")]
    pub payload_sizes: String,
    /// Payload megabytes per payload size (default 512; 64 with --quick).
    #[arg(long)]
    pub payload_mb: Option<u64>,
    /// Aggregate types (= topics) of the topics shape.
    #[arg(long, default_value_t = 1000)]
    pub topics_count: u64,
    /// Rows of the big-txn shape's transaction (default 1000000; 200000 with --quick).
    #[arg(long)]
    pub big_txn_rows: Option<u64>,
    /// Writers' events/s in the sigkill shape.
    #[arg(long, default_value_t = 5000)]
    pub kill_rate: u64,
    /// SIGKILLs per delivery mode.
    #[arg(long, default_value_t = 3)]
    pub kills: u64,
    /// Seconds between kills.
    #[arg(long, default_value_t = 5)]
    pub kill_interval: u64,
    /// A peer measured on the same drain backlogs: `debezium` (bench/debezium; scripts/bench.sh
    /// compiles it and sets OUTBOX_BENCH_DEBEZIUM_CLASSPATH).
    #[arg(long)]
    pub peer: Option<String>,
    /// Extra OUTBOX_RELAY__K=V for every relay run (repeatable).
    #[arg(long = "relay-env", value_name = "K=V")]
    pub relay_env: Vec<String>,
    /// Profile the relay and the machine in each drain round (perf record).
    #[arg(long)]
    pub perf: bool,
    /// Also run the relay's producer alone (its librdkafka settings, no relay in front) on
    /// each drain's records and at each latency rate: the Kafka side's limit.
    #[arg(long)]
    pub producer_alone: bool,
    /// The relay binary measured (scripts/bench.sh passes the one it built).
    #[arg(long, env = "OUTBOX_BENCH_RELAY_BIN")]
    pub relay_bin: PathBuf,
    /// Recorded with the results.
    #[arg(long, default_value = "")]
    pub label: String,
    /// Result JSON (default bench/results/<date>.json).
    #[arg(long)]
    pub output: Option<PathBuf>,
    /// Handled by scripts/bench.sh (the services); accepted here so the options stay one list.
    #[arg(long)]
    pub keep_services: bool,
    /// Check the options and exit (scripts/bench.sh, before it starts the services).
    #[arg(long, hide = true)]
    pub check_options: bool,
}

/// The delivery modes.
pub const MODES: [&str; 2] = ["at_least_once", "exactly_once"];
/// The opt-in shapes, in the order they run.
pub const SHAPES: [&str; 5] = ["payload", "topics", "schema", "big-txn", "sigkill"];
/// The peers `--peer` knows.
pub const PEERS: [&str; 1] = ["debezium"];

/// The options resolved: `--quick`'s defaults applied, lists split and checked.
#[derive(Debug, Clone)]
pub struct Settings {
    pub events: u64,
    pub txn_sizes: Vec<u64>,
    pub rates: Vec<u64>,
    pub rate_seconds: u64,
    pub warm_up_seconds: u64,
    pub idle_seconds: u64,
    pub partitions: i32,
    pub writers: u64,
    pub latency_topics: u64,
    pub drain: bool,
    pub latency: bool,
    /// `off`, or `off` and `on` (`--tracing`).
    pub tracing_runs: Vec<&'static str>,
    pub delivery: Vec<String>,
    pub shapes: Vec<String>,
    pub payload_sizes: Vec<u64>,
    pub payload_mb: u64,
    pub topics_count: u64,
    pub big_txn_rows: u64,
    pub kill_rate: u64,
    pub kills: u64,
    pub kill_interval: u64,
    /// `--peer`: drains each txn round's backlog after the relays.
    pub peer: Option<String>,
    /// `OUTBOX_RELAY__K=V` assignments.
    pub relay_env: Vec<String>,
    pub perf: bool,
    pub producer_alone: bool,
    pub relay_bin: PathBuf,
    pub label: String,
    pub output: Option<PathBuf>,
}

/// Words of a space or comma separated list.
pub fn words(list: &str) -> Vec<String> {
    list.split([' ', ',', '\t', '\n'])
        .filter(|w| !w.is_empty())
        .map(str::to_string)
        .collect()
}

fn numbers(option: &str, list: &str) -> anyhow::Result<Vec<u64>> {
    words(list)
        .iter()
        .map(|w| {
            w.parse()
                .with_context(|| format!("{option}: `{w}` is not a number"))
        })
        .collect()
}

fn check_modes(delivery: &[String]) -> anyhow::Result<()> {
    if delivery.is_empty() {
        bail!("--delivery needs at least one mode");
    }
    if let Some(m) = delivery.iter().find(|m| !MODES.contains(&m.as_str())) {
        bail!("unknown delivery mode '{m}' (at_least_once, exactly_once)");
    }
    Ok(())
}

fn resolve_shapes(list: &str) -> anyhow::Result<Vec<String>> {
    let mut shapes = words(list);
    if shapes.iter().any(|s| s == "all") {
        shapes = SHAPES.iter().map(|s| s.to_string()).collect();
    }
    if let Some(s) = shapes.iter().find(|s| !SHAPES.contains(&s.as_str())) {
        bail!("unknown shape '{s}' (payload, topics, schema, big-txn, sigkill, all)");
    }
    Ok(shapes)
}

fn check_peer(peer: Option<String>) -> anyhow::Result<Option<String>> {
    match peer {
        Some(p) if !PEERS.contains(&p.as_str()) => bail!("unknown peer '{p}' (debezium)"),
        peer => Ok(peer),
    }
}

impl Options {
    pub fn resolve(self) -> anyhow::Result<Settings> {
        let quick = |full: u64, short: u64| if self.quick { short } else { full };
        let events = self.events.or(self.n).unwrap_or(quick(1_000_000, 200_000));
        if events == 0 {
            bail!("N must be a positive integer");
        }
        let delivery = words(&self.delivery);
        check_modes(&delivery)?;
        if self.perf && !on_path("perf") {
            bail!("--perf needs perf (Debian: apt-get install linux-perf)");
        }
        Ok(Settings {
            events,
            txn_sizes: numbers("--txn-sizes", &self.txn_sizes)?,
            rates: numbers("--rates", &self.rates)?,
            // --quick sets these even when given, as scripts/bench.sh always did.
            rate_seconds: if self.quick {
                5
            } else {
                self.rate_seconds.unwrap_or(15)
            },
            warm_up_seconds: self
                .warm_up_seconds
                .unwrap_or(if self.quick { 3 } else { 10 }),
            idle_seconds: if self.quick {
                10
            } else {
                self.idle_seconds.unwrap_or(30)
            },
            partitions: self.partitions,
            writers: self.writers,
            latency_topics: self.latency_topics.max(1),
            drain: !self.no_drain,
            latency: !self.no_latency,
            tracing_runs: if self.tracing {
                vec!["off", "on"]
            } else {
                vec!["off"]
            },
            delivery,
            shapes: resolve_shapes(&self.shapes)?,
            payload_sizes: numbers("--payload-sizes", &self.payload_sizes)?,
            payload_mb: self.payload_mb.unwrap_or(quick(512, 64)),
            topics_count: self.topics_count,
            big_txn_rows: self.big_txn_rows.unwrap_or(quick(1_000_000, 200_000)),
            kill_rate: self.kill_rate,
            kills: self.kills,
            kill_interval: self.kill_interval,
            peer: check_peer(self.peer)?,
            relay_env: self
                .relay_env
                .iter()
                .map(|kv| format!("OUTBOX_RELAY__{kv}"))
                .collect(),
            perf: self.perf,
            producer_alone: self.producer_alone,
            relay_bin: std::fs::canonicalize(&self.relay_bin)
                .with_context(|| format!("no relay binary at {}", self.relay_bin.display()))?,
            label: self.label,
            output: self.output,
        })
    }
}

/// Whether `program` is on PATH.
fn on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(program).is_file()))
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        options: Options,
    }

    /// The settings of `outbox-bench run ARGS` (with a relay binary that exists).
    fn resolve(args: &[&str]) -> anyhow::Result<Settings> {
        let exe = std::env::current_exe().unwrap();
        let relay_bin = ["--relay-bin", exe.to_str().unwrap()];
        let argv = ["run"].iter().chain(&relay_bin).chain(args);
        Cli::try_parse_from(argv)?.options.resolve()
    }

    #[test]
    fn peer_debezium_is_taken_and_an_unknown_peer_is_refused() {
        assert_eq!(resolve(&[]).unwrap().peer, None);
        let settings = resolve(&["--peer", "debezium", "--no-latency"]).unwrap();
        assert_eq!(settings.peer.as_deref(), Some("debezium"));
        assert!(
            !settings.latency,
            "--peer took the next option as its value"
        );
        let err = resolve(&["--peer", "flink"]).unwrap_err();
        assert!(err.to_string().contains("unknown peer 'flink'"), "{err}");
        assert!(resolve(&["--peer"]).is_err(), "--peer needs a value");
    }
}
