//! `outbox-bench`: the benchmark of outbox-relay (`scripts/bench.sh` starts the services and
//! runs `outbox-bench run`), and its parts as subcommands for debugging one of them.
//!
//! - `run`: every phase (see `run/mod.rs`), writing typed records and the result file;
//! - `report`: the table of a result file (`--result`), or of a run's records (`--input`);
//! - `create-topics`, `warm-up`, `txn-probe`: Kafka set-up and the bare transactional probe;
//! - `producer-alone`: the relay's producer with no relay in front (the Kafka side's limit);
//! - `wait-slot`: polls a slot until it confirms a target, then samples a process in /proc;
//! - `latency`, `resend`: steady writers and a consumer (latency, copies per id);
//! - `metrics`: one scrape of the relay's `/metrics`;
//! - `otlp-sink`: a local OTLP/HTTP endpoint that drops what it gets (`--tracing`).
//!
//! It is a benchmark tool, not part of the relay: it asserts nothing about time.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};

mod kafka;
mod latency;
mod otlp_sink;
mod pg;
mod proc_stat;
mod process;
mod producer_alone;
mod prom;
mod records;
mod report;
mod resend;
mod results;
mod run;
mod table;
mod util;
mod wait_slot;
mod walsender_cpu;

use latency::{Load, Target};

#[derive(Parser)]
#[command(
    name = "outbox-bench",
    about = "The outbox-relay benchmark (scripts/bench.sh)"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// The writers' steady load, on the command line.
#[derive(clap::Args)]
struct LoadArgs {
    #[arg(long)]
    url: String,
    #[arg(long)]
    brokers: String,
    /// The topic the relay publishes these rows to.
    #[arg(long)]
    topic: String,
    /// The rows' aggregatetype (selects the topic through the relay's template).
    #[arg(long)]
    aggregate_type: String,
    #[arg(long)]
    rate: u64,
    #[arg(long, default_value_t = 15)]
    seconds: u64,
    /// Writer connections; each pipelines its inserts.
    #[arg(long, default_value_t = 4)]
    writers: u64,
}

impl LoadArgs {
    fn split(&self) -> (Target<'_>, Load) {
        let target = Target {
            url: &self.url,
            brokers: &self.brokers,
            topic: &self.topic,
            aggregate_type: &self.aggregate_type,
            spread: 1,
        };
        let load = Load {
            rate: self.rate,
            seconds: self.seconds,
            writers: self.writers,
        };
        (target, load)
    }
}

#[derive(Subcommand)]
enum Command {
    /// The benchmark: every phase, with the options of scripts/bench.sh (run it through
    /// scripts/bench.sh, which starts the services and passes their environment).
    Run(Box<run::options::Options>),
    /// A local OTLP/HTTP endpoint that answers every export 200 and drops the spans, until
    /// killed: its port goes to `port_file`, the requests and bytes taken to `counts_file`.
    OtlpSink {
        #[arg(long)]
        port_file: PathBuf,
        #[arg(long)]
        counts_file: PathBuf,
    },
    /// Create topics (replication factor 1); existing ones are left alone.
    CreateTopics {
        #[arg(long)]
        brokers: String,
        #[arg(long, default_value_t = 3)]
        partitions: i32,
        /// Topic configuration `key=value` (repeatable), e.g. cleanup.policy=compact.
        #[arg(long = "config")]
        configs: Vec<String>,
        topics: Vec<String>,
    },
    /// Send one record with an idempotent producer and wait for its acknowledgement.
    WarmUp {
        #[arg(long)]
        brokers: String,
    },
    /// Wait until a slot's confirmed_flush_lsn reaches `lsn`; print the record (elapsed time
    /// since `started_ns`, the process's peak RSS and CPU time at that moment).
    WaitSlot {
        #[arg(long)]
        url: String,
        #[arg(long)]
        slot: String,
        #[arg(long)]
        lsn: String,
        /// The process sampled (its death is an error).
        #[arg(long)]
        pid: u32,
        /// From when the time counts, ns since the Unix epoch (`date +%s%N`).
        #[arg(long)]
        started_ns: u128,
        #[arg(long, default_value_t = 3600)]
        timeout_s: u64,
    },
    /// Insert 1-row outbox transactions at `rate` events/s, read the relay's topic, and print
    /// the latency record.
    Latency {
        #[command(flatten)]
        load: LoadArgs,
        /// The relay's Prometheus endpoint (http://host:port/metrics), if it has one.
        #[arg(long)]
        metrics_url: Option<String>,
        /// Seconds of writers before the measured window, reported apart.
        #[arg(long, default_value_t = 0)]
        warm_up_seconds: u64,
    },
    /// Insert 1-row transactions with known event ids while someone kills and restarts the
    /// relay; print the copies of each id (duplicates and missing ones).
    Resend {
        #[command(flatten)]
        load: LoadArgs,
        /// How long to wait, after the writers stopped, for the last ids to arrive.
        #[arg(long, default_value_t = 120)]
        settle_s: u64,
    },
    /// A bare transactional producer (no relay): how long each commit took.
    TxnProbe {
        #[arg(long)]
        brokers: String,
        #[arg(long)]
        topic: String,
        #[arg(long, default_value_t = 50)]
        transactions: u32,
        #[arg(long, default_value_t = 100)]
        records: u32,
        /// Pause between a commit and the next transaction's first record, in ms.
        #[arg(long, default_value_t = 0)]
        pause_ms: u64,
    },
    /// The relay's producer alone (its librdkafka settings and in-flight window, no relay in
    /// front): a backlog of `--events` records, or `--rate` records/s for `--seconds` after
    /// `--warm-up-seconds`, to the topics in `--topics-file` (one per line, in turn), payloads
    /// from `--payloads-file` (one per line, in turn). Prints its time and CPU.
    ProducerAlone {
        #[arg(long)]
        brokers: String,
        #[arg(long)]
        topics_file: PathBuf,
        #[arg(long)]
        payloads_file: PathBuf,
        #[arg(long)]
        events: Option<u64>,
        #[arg(long)]
        rate: Option<u64>,
        #[arg(long)]
        seconds: Option<u64>,
        #[arg(long, default_value_t = 0)]
        warm_up_seconds: u64,
    },
    /// Scrape the relay's `/metrics` once and print its Kafka transaction figures.
    Metrics {
        #[arg(long)]
        metrics_url: String,
    },
    /// Print the table of a result file (`--result`), or make one from a run's records
    /// (`--input` results.jsonl, with run.json beside it; written to `--output`).
    Report {
        #[arg(long, conflicts_with_all = ["input", "output"])]
        result: Option<PathBuf>,
        #[arg(long, requires = "output")]
        input: Option<PathBuf>,
        #[arg(long)]
        output: Option<PathBuf>,
    },
}

/// Prints a record as one JSON line.
fn print_json(value: &impl serde::Serialize) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string(value)?);
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(dispatch(cli.command))
}

async fn dispatch(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Run(options) => run::run(*options).await,
        Command::OtlpSink {
            port_file,
            counts_file,
        } => otlp_sink::run(&port_file, &counts_file),
        Command::CreateTopics {
            brokers,
            partitions,
            configs,
            topics,
        } => kafka::create_topics(&brokers, partitions, &configs, &topics).await,
        Command::WarmUp { brokers } => kafka::warm_up(&brokers).await,
        Command::WaitSlot {
            url,
            slot,
            lsn,
            pid,
            started_ns,
            timeout_s,
        } => {
            let wait = wait_slot::SlotWait {
                url: &url,
                slot: &slot,
                lsn: &lsn,
                pid,
                started_ns,
                clk_tck: proc_stat::clk_tck(),
                timeout: Duration::from_secs(timeout_s),
            };
            print_json(&wait_slot::wait_slot(&wait).await?)
        }
        Command::Latency {
            load,
            metrics_url,
            warm_up_seconds,
        } => {
            let (target, load) = load.split();
            let consumer =
                latency::LatencyConsumer::start_warm(&target, load, warm_up_seconds).await?;
            let measured = latency::latency(&target, load, consumer, metrics_url.as_deref());
            print_json(&measured.await?)
        }
        Command::Resend { load, settle_s } => {
            let (target, load) = load.split();
            let settle = Duration::from_secs(settle_s);
            print_json(&resend::resend(&target, load, settle).await?)
        }
        Command::TxnProbe {
            brokers,
            topic,
            transactions,
            records,
            pause_ms,
        } => {
            let load = kafka::ProbeLoad {
                transactions,
                records,
                pause: Duration::from_millis(pause_ms),
            };
            print_json(&kafka::txn_probe(&brokers, &topic, &load)?)
        }
        Command::ProducerAlone {
            brokers,
            topics_file,
            payloads_file,
            events,
            rate,
            seconds,
            warm_up_seconds,
        } => {
            let pace = producer_alone::pace_of(events, rate, seconds, warm_up_seconds)?;
            let topics = producer_alone::read_lines(&topics_file)?;
            let payloads: Vec<Vec<u8>> = (producer_alone::read_lines(&payloads_file)?)
                .into_iter()
                .map(String::into_bytes)
                .collect();
            let sent = tokio::task::spawn_blocking(move || {
                producer_alone::produce(&brokers, &topics, &payloads, pace)
            });
            print_json(&sent.await??)
        }
        Command::Metrics { metrics_url } => {
            let metrics = prom::relay_metrics(&metrics_url, "")
                .await
                .with_context(|| format!("no metrics at {metrics_url}"))?;
            print_json(&metrics)
        }
        Command::Report {
            result,
            input,
            output,
        } => report::report(input.as_deref(), output.as_deref(), result.as_deref()),
    }
}
