//! What every phase of a run shares: the settings, the services, the run's names and
//! directories, and the records collected so far.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use tokio_postgres::Client;

use super::options::Settings;
use crate::pg::Cluster;
use crate::process::{Relay, RelayCommand};
use crate::records::{ErrorKind, Failure, LoadKind, LoadSample, Record};
use crate::util::loadavg;

/// The drain relays report their position every 100 ms instead of every 1 s (the default),
/// so that the moment the slot reaches the end is seen with the same 100 ms resolution as
/// the polling; one 39-byte message per 100 ms costs nothing measurable. The latency and
/// idle relay runs with the defaults.
pub const DRAIN_STATUS_INTERVAL_MS: u64 = 100;

/// The services `scripts/services.sh` started (its env file, sourced by scripts/bench.sh).
pub struct Services {
    pub cluster: Cluster,
    /// psql, pg_recvlogical.
    pub pg_bin: PathBuf,
    /// postgres (for its version).
    pub pg_server_bin: PathBuf,
    pub brokers: String,
    pub run_dir: PathBuf,
}

fn env(name: &str) -> anyhow::Result<String> {
    std::env::var(name).with_context(|| {
        format!(
            "{name} is not set: run the benchmark with scripts/bench.sh (it starts the services)"
        )
    })
}

impl Services {
    pub fn from_env() -> anyhow::Result<Services> {
        let pg_bin = PathBuf::from(env("OUTBOX_TEST_PG_BIN")?);
        Ok(Services {
            cluster: Cluster {
                port: env("OUTBOX_TEST_PG_PORT")?
                    .parse()
                    .context("OUTBOX_TEST_PG_PORT")?,
            },
            pg_server_bin: std::env::var_os("OUTBOX_TEST_PG_SERVER_BIN")
                .map_or(pg_bin.clone(), PathBuf::from),
            pg_bin,
            brokers: env("OUTBOX_TEST_KAFKA_BROKERS")?,
            run_dir: PathBuf::from(env("OUTBOX_RUN_DIR")?),
        })
    }
}

/// How a relay run differs from the others.
pub struct RelayRun {
    pub db: String,
    pub slot: String,
    /// The topic, or a template ending in `{aggregatetype}`.
    pub topic: String,
    /// Names its log (`<name>.log` in the log directory).
    pub name: String,
    /// Extra `OUTBOX_RELAY__…` assignments (the delivery mode's, the phase's).
    pub env: Vec<(String, String)>,
    /// With `--perf`: profile it as `perf-<name>.data` in the run directory.
    pub profile_as: Option<String>,
}

impl RelayRun {
    pub fn new(
        db: &str,
        slot: &str,
        topic: &str,
        name: &str,
        env: Vec<(String, String)>,
    ) -> RelayRun {
        RelayRun {
            db: db.into(),
            slot: slot.into(),
            topic: topic.into(),
            name: name.into(),
            env,
            profile_as: None,
        }
    }
}

/// A run in progress.
pub struct Ctx {
    pub settings: Settings,
    pub services: Services,
    /// The repository (migrations, preload SQL).
    pub repo: PathBuf,
    /// UTC timestamp naming the run's topics and log directory.
    pub run_id: String,
    pub log_dir: PathBuf,
    /// exactly_once's progress topic.
    pub progress_topic: String,
    /// Whether the relay has an HTTP listener (the `[http]` config section).
    pub serves_metrics: bool,
    pub clk_tck: u64,
    /// The local OTLP endpoint of `--tracing`, once started.
    pub otlp_port: Option<u16>,
    records: Vec<Record>,
    results_file: std::fs::File,
    pub failures: u32,
}

impl Ctx {
    pub fn new(
        settings: Settings,
        services: Services,
        repo: PathBuf,
        run_id: String,
    ) -> anyhow::Result<Ctx> {
        let log_dir = services.run_dir.join(format!("bench-{run_id}"));
        std::fs::create_dir_all(&log_dir)?;
        let results = log_dir.join("results.jsonl");
        let results_file = std::fs::File::create(&results)
            .with_context(|| format!("create {}", results.display()))?;
        let serves_metrics = relay_serves_metrics(&settings.relay_bin);
        if !serves_metrics {
            eprintln!(
                "[bench] this relay has no HTTP listener: latency is measured by the consumer only"
            );
        }
        Ok(Ctx {
            progress_topic: format!("bench-{run_id}-progress"),
            settings,
            services,
            repo,
            run_id,
            log_dir,
            serves_metrics,
            clk_tck: crate::proc_stat::clk_tck(),
            otlp_port: None,
            records: Vec::new(),
            results_file,
            failures: 0,
        })
    }

    pub fn records(&self) -> &[Record] {
        &self.records
    }

    /// Keeps a record, and appends it to the run directory's `results.jsonl`.
    pub fn record(&mut self, record: Record) -> anyhow::Result<()> {
        let line = serde_json::to_string(&record)?;
        writeln!(self.results_file, "{line}")?;
        self.records.push(record);
        Ok(())
    }

    /// The load average before timed phase `phase`.
    pub fn record_load(&mut self, phase: String) -> anyhow::Result<()> {
        self.record(Record::Load(LoadSample {
            kind: LoadKind,
            phase,
            loadavg: loadavg(),
        }))
    }

    /// A phase that failed: said loudly, recorded, and the run goes on.
    pub fn record_failure(
        &mut self,
        phase: &str,
        mode: &str,
        message: String,
    ) -> anyhow::Result<()> {
        eprintln!("[bench] FAILED: {phase} ({mode}): {message}");
        self.failures += 1;
        self.record(Record::Error(Failure {
            kind: ErrorKind,
            phase: phase.to_string(),
            delivery: mode.to_string(),
            message,
        }))
    }

    pub fn url(&self, db: &str) -> String {
        self.services.cluster.url(db)
    }

    /// A fresh database with the outbox migration and the preload procedures.
    pub async fn fresh_database(&self, db: &str) -> anyhow::Result<Client> {
        let migration = self.repo.join("migrations/001_outbox.sql");
        let client = self
            .services
            .cluster
            .fresh_database(db, &[&migration])
            .await?;
        // Autovacuum would wake up after the preload and compete for the 2 cores with
        // exactly the processes being measured.
        client
            .batch_execute("ALTER TABLE outbox SET (autovacuum_enabled = false)")
            .await?;
        for file in ["bench/preload.sql", "bench/preload-shapes.sql"] {
            run_file(&client, &self.repo.join(file)).await?;
        }
        Ok(client)
    }

    pub async fn drop_database(&self, db: &str) -> anyhow::Result<()> {
        self.services.cluster.drop_database(db).await
    }

    pub async fn create_topics(&self, partitions: i32, topics: &[String]) -> anyhow::Result<()> {
        crate::kafka::create_topics(&self.services.brokers, partitions, &[], topics).await
    }

    /// Topic names of this run start with this.
    pub fn topic_prefix(&self) -> String {
        format!("bench-{}", self.run_id)
    }

    /// Starts a relay (its log in the log directory).
    pub async fn start_relay(&self, run: RelayRun) -> anyhow::Result<Relay> {
        let mut env: Vec<(String, String)> = [
            ("OUTBOX_RELAY__POSTGRES__URL", self.url(&run.db)),
            ("OUTBOX_RELAY__POSTGRES__SLOT", run.slot.clone()),
            (
                "OUTBOX_RELAY__POSTGRES__PUBLICATION",
                "outbox_relay_pub".into(),
            ),
            ("OUTBOX_RELAY__POSTGRES__CREATE_SLOT", "false".into()),
            ("OUTBOX_RELAY__OUTBOX__TOPIC", run.topic.clone()),
            (
                "OUTBOX_RELAY__KAFKA__BROKERS",
                self.services.brokers.clone(),
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        // A port the kernel picks: a benchmark relay must not collide with another relay
        // on the default 9187, nor with another benchmark's on the same machine.
        if self.serves_metrics {
            env.push(("OUTBOX_RELAY__HTTP__LISTEN".into(), "127.0.0.1:0".into()));
        }
        env.extend(run.env);
        env.extend(self.settings.relay_env.iter().filter_map(|kv| {
            let (k, v) = kv.split_once('=')?;
            Some((k.to_string(), v.to_string()))
        }));
        Relay::start(&RelayCommand {
            bin: self.settings.relay_bin.clone(),
            env,
            log: self.log_dir.join(format!("{}.log", run.name)),
            profile: run
                .profile_as
                .map(|p| self.services.run_dir.join(format!("perf-{p}.data"))),
        })
        .await
    }

    /// The relay's environment for delivery mode `mode`. Nothing for at_least_once (the
    /// default), so that `--delivery at_least_once` also measures relays that predate the
    /// setting. exactly_once publishes its progress records to a topic made up front.
    pub fn mode_env(&self, mode: &str) -> Vec<(String, String)> {
        if mode != "exactly_once" {
            return Vec::new();
        }
        vec![
            (
                "OUTBOX_RELAY__KAFKA__DELIVERY".into(),
                "exactly_once".into(),
            ),
            (
                "OUTBOX_RELAY__KAFKA__PROGRESS_TOPIC".into(),
                self.progress_topic.clone(),
            ),
        ]
    }
}

/// Runs a SQL file on `client`, one simple-protocol batch.
pub async fn run_file(client: &Client, path: &Path) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
    client
        .batch_execute(&text)
        .await
        .with_context(|| format!("run {}", path.display()))
}

/// Whether `outbox-relay config` shows an `[http]` section.
fn relay_serves_metrics(relay_bin: &Path) -> bool {
    std::process::Command::new(relay_bin)
        .arg("config")
        .stderr(std::process::Stdio::null())
        .output()
        .is_ok_and(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .any(|l| l.starts_with("[http]"))
        })
}

/// Short name of a delivery mode, for slot, database and topic names.
pub fn mode_tag(mode: &str) -> &'static str {
    match mode {
        "exactly_once" => "eo",
        _ => "alo",
    }
}

/// How long a drain may take before it counts as failed (and the run goes on).
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(900);

/// A backlog to drain.
pub struct Round {
    /// Names the database, the slots and the topics (an identifier).
    pub round: String,
    /// `txn`, `payload`, `topics` or `schema` (groups the report's tables).
    pub shape: &'static str,
    pub txn_rows: u64,
    pub events: u64,
    /// The preload (SQL).
    pub preload: String,
    pub partitions: i32,
    /// Aggregate types: one topic each per delivery mode and the relay's topic template ends
    /// in `{aggregatetype}`; none: the rows' type is 'order' and the relay publishes to one
    /// fixed topic (no template to render).
    pub types: Vec<String>,
    /// The relay's `outbox.serialization` (`OUTBOX_RELAY__…` variables) and its format, for
    /// the schema shape; empty and none elsewhere.
    pub serialization: Option<(String, Vec<(String, String)>)>,
}
