//! `outbox-bench`: the measuring half of `scripts/bench.sh`.
//!
//! The script orchestrates (services, databases, slots, preloads, `pg_recvlogical`, the relay
//! process); this binary does what shell cannot do precisely or cheaply:
//!
//! - `create-topics`: creates the benchmark topics up front, so that topic auto-creation and
//!   metadata refreshes are not part of any measurement;
//! - `wait-slot`: polls `pg_replication_slots` every 100 ms until a slot's `confirmed_flush_lsn`
//!   reaches a target, then samples the relay's peak RSS and CPU time from `/proc`;
//! - `latency`: writers insert 1-row transactions at a steady rate while a consumer reads the
//!   relay's topic; latency = consumer receive time − record timestamp (the relay stamps each
//!   record with its transaction's commit time);
//! - `resend`: writers at a steady rate with known event ids while the script SIGKILLs the
//!   relay; a consumer counts each id's copies (duplicates and missing ones);
//! - `metrics`: one scrape of the relay's `/metrics` (exactly-once's Kafka transactions);
//! - `otlp-sink`: a local OTLP/HTTP endpoint that drops what it gets (`--tracing`);
//! - `report`: turns the JSON lines collected by the script into one table and one JSON file.
//!
//! It is a benchmark tool, not part of the relay: it asserts nothing about time.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};
use futures_util::stream::{FuturesUnordered, StreamExt};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::message::Message;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use serde_json::{json, Value};
use tokio_postgres::NoTls;

mod latency;
mod otlp_sink;
mod report;
mod resend;

use latency::*;

/// How often `wait-slot` looks at `pg_replication_slots`.
const SLOT_POLL_INTERVAL: Duration = Duration::from_millis(100);
/// Inserts a latency writer may have outstanding on its connection (pipelined).
const MAX_PENDING_INSERTS: usize = 256;
/// How long the latency consumer keeps reading after the writers stop.
const LATENCY_SETTLE_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Parser)]
#[command(name = "outbox-bench", about = "Measuring helper for scripts/bench.sh")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
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
    /// Send one record with an idempotent producer and wait for its acknowledgement, so that
    /// a freshly started broker has loaded its transaction coordinator (which hands out
    /// producer ids) before anything is timed.
    WarmUp {
        #[arg(long)]
        brokers: String,
    },
    /// Wait until a slot's confirmed_flush_lsn reaches `lsn`; print one JSON line with the
    /// elapsed time since `started_ns` and the process's peak RSS and CPU time at that moment.
    WaitSlot {
        #[arg(long)]
        url: String,
        #[arg(long)]
        slot: String,
        #[arg(long)]
        lsn: String,
        /// The relay's process id (its /proc entry is sampled; its death is an error).
        #[arg(long)]
        pid: u32,
        /// When the relay was started, ns since the Unix epoch (`date +%s%N`).
        #[arg(long)]
        started_ns: u128,
        /// Clock ticks per second of /proc/<pid>/stat (`getconf CLK_TCK`).
        #[arg(long, default_value_t = 100)]
        clk_tck: u64,
        #[arg(long, default_value_t = 3600)]
        timeout_s: u64,
        /// Extra `key=value` fields copied into the output (numbers stay numbers).
        #[arg(long = "field")]
        fields: Vec<String>,
    },
    /// Insert 1-row outbox transactions at `rate` events/s for `seconds`, read the relay's
    /// topic, and print one JSON line with commit-to-receive latency percentiles.
    Latency {
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
        /// The relay's Prometheus endpoint (http://host:port/metrics), if it has one: its own
        /// commit-to-acknowledgement histogram is reported next to the consumer's figures.
        #[arg(long)]
        metrics_url: Option<String>,
    },
    /// Insert 1-row transactions with known event ids at `rate` events/s for `seconds` while
    /// the script kills and restarts the relay; read the topic (read_committed) until every
    /// committed id arrived, and print one JSON line: duplicates and missing ids.
    Resend {
        #[arg(long)]
        url: String,
        #[arg(long)]
        brokers: String,
        #[arg(long)]
        topic: String,
        #[arg(long)]
        aggregate_type: String,
        #[arg(long)]
        rate: u64,
        #[arg(long)]
        seconds: u64,
        #[arg(long, default_value_t = 4)]
        writers: u64,
        /// How long to wait, after the writers stopped, for the last ids to arrive.
        #[arg(long, default_value_t = 120)]
        settle_s: u64,
    },
    /// A bare transactional producer (no relay): `transactions` Kafka transactions of `records`
    /// records each, back to back; prints how long each commit took. The broker's and
    /// librdkafka's share of exactly-once's commit time, measured apart from the relay.
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
    /// Scrape the relay's `/metrics` once and print one JSON line with its Kafka transaction
    /// figures (exactly-once) and its commit-to-acknowledgement histogram.
    Metrics {
        #[arg(long)]
        metrics_url: String,
        /// Extra `key=value` fields copied into the output (numbers stay numbers).
        #[arg(long = "field")]
        fields: Vec<String>,
    },
    /// Print the results table from the script's JSON lines and write them as one JSON file.
    Report {
        /// JSON lines written by scripts/bench.sh and the subcommands above.
        #[arg(long)]
        input: PathBuf,
        /// Where to write the combined JSON.
        #[arg(long)]
        output: PathBuf,
        /// `key=value` pairs recorded under "run" (versions, command, settings).
        #[arg(long = "meta")]
        meta: Vec<String>,
    },
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async {
        match cli.command {
            Command::CreateTopics {
                brokers,
                partitions,
                configs,
                topics,
            } => create_topics(&brokers, partitions, &configs, &topics).await,
            Command::WarmUp { brokers } => warm_up(&brokers).await,
            Command::WaitSlot {
                url,
                slot,
                lsn,
                pid,
                started_ns,
                clk_tck,
                timeout_s,
                fields,
            } => {
                let mut out =
                    wait_slot(&url, &slot, &lsn, pid, started_ns, clk_tck, timeout_s).await?;
                for (k, v) in parse_pairs(&fields)? {
                    out[k] = v;
                }
                println!("{out}");
                Ok(())
            }
            Command::Latency {
                url,
                brokers,
                topic,
                aggregate_type,
                rate,
                seconds,
                writers,
                metrics_url,
            } => {
                let load = Load {
                    rate,
                    seconds,
                    writers,
                };
                let out = latency(
                    &url,
                    &brokers,
                    &topic,
                    &aggregate_type,
                    load,
                    metrics_url.as_deref(),
                )
                .await?;
                println!("{out}");
                Ok(())
            }
            Command::Resend {
                url,
                brokers,
                topic,
                aggregate_type,
                rate,
                seconds,
                writers,
                settle_s,
            } => {
                let load = Load {
                    rate,
                    seconds,
                    writers,
                };
                let settle = Duration::from_secs(settle_s);
                let out =
                    resend::resend(&url, &brokers, &topic, &aggregate_type, load, settle).await?;
                println!("{out}");
                Ok(())
            }
            Command::TxnProbe {
                brokers,
                topic,
                transactions,
                records,
                pause_ms,
            } => {
                let pause = Duration::from_millis(pause_ms);
                let out = txn_probe(&brokers, &topic, transactions, records, pause)?;
                println!("{out}");
                Ok(())
            }
            Command::Metrics {
                metrics_url,
                fields,
            } => {
                let mut out = relay_metrics(&metrics_url)
                    .await
                    .with_context(|| format!("no metrics at {metrics_url}"))?;
                for (k, v) in parse_pairs(&fields)? {
                    out[k] = v;
                }
                println!("{out}");
                Ok(())
            }
            Command::OtlpSink {
                port_file,
                counts_file,
            } => otlp_sink::run(&port_file, &counts_file),
            Command::Report {
                input,
                output,
                meta,
            } => report::report(&input, &output, &meta),
        }
    })
}

/// `key=value` → (key, JSON number if it parses as one, else JSON string).
fn parse_pairs(pairs: &[String]) -> anyhow::Result<Vec<(String, Value)>> {
    pairs
        .iter()
        .map(|p| {
            let (k, v) = p
                .split_once('=')
                .with_context(|| format!("`{p}` is not key=value"))?;
            let value = match v.parse::<f64>() {
                Ok(n) if !v.is_empty() && n.is_finite() => json!(n),
                _ => json!(v),
            };
            Ok((k.to_string(), value))
        })
        .collect()
}

fn unix_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

// ------------------------------------------------------------------------------ topics

async fn create_topics(
    brokers: &str,
    partitions: i32,
    configs: &[String],
    topics: &[String],
) -> anyhow::Result<()> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .context("create the Kafka admin client")?;
    let configs: Vec<(&str, &str)> = configs
        .iter()
        .map(|c| {
            c.split_once('=')
                .with_context(|| format!("`{c}` is not key=value"))
        })
        .collect::<anyhow::Result<_>>()?;
    let new: Vec<NewTopic<'_>> = topics
        .iter()
        .map(|t| {
            configs.iter().fold(
                NewTopic::new(t, partitions, TopicReplication::Fixed(1)),
                |topic, (k, v)| topic.set(k, v),
            )
        })
        .collect();
    // Many topics at once (the many-topics shape) take the broker a while.
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(120)));
    let results = admin
        .create_topics(&new, &options)
        .await
        .context("create topics")?;
    for result in results {
        match result {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((topic, code)) => bail!("cannot create topic {topic}: {code:?}"),
        }
    }
    Ok(())
}

async fn warm_up(brokers: &str) -> anyhow::Result<()> {
    use rdkafka::producer::{FutureProducer, FutureRecord};
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("enable.idempotence", "true")
        .set("message.timeout.ms", "120000")
        .create()
        .context("create the warm-up producer")?;
    let record = FutureRecord::to("outbox-bench-warm-up")
        .key("warm-up")
        .payload("warm-up");
    producer
        .send(record, Duration::from_secs(120))
        .await
        .map_err(|(e, _)| anyhow::anyhow!("warm-up record not acknowledged: {e}"))?;
    Ok(())
}

/// `X/Y` (hex) → the 64-bit position.
fn parse_lsn(text: &str) -> Option<u64> {
    let (hi, lo) = text.split_once('/')?;
    Some(u64::from_str_radix(hi, 16).ok()? << 32 | u64::from_str_radix(lo, 16).ok()?)
}

// --------------------------------------------------------------------------- txn-probe

/// See [`Command::TxnProbe`]. Delivery reports are served on this thread before each commit,
/// so that rust-rdkafka's flush inside `commit_transaction` finds nothing outstanding.
fn txn_probe(
    brokers: &str,
    topic: &str,
    transactions: u32,
    records: u32,
    pause: Duration,
) -> anyhow::Result<Value> {
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    let timeout = Duration::from_secs(30);
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set(
            "transactional.id",
            format!("outbox-bench-probe-{}", unix_ns()),
        )
        .set("linger.ms", "5")
        .create()
        .context("create the transactional producer")?;
    producer.init_transactions(timeout)?;
    let (mut commit_ms, mut total_ms) = (Vec::new(), Vec::new());
    for t in 0..transactions {
        let begun = Instant::now();
        producer.begin_transaction()?;
        for r in 0..records {
            let key = format!("{t}-{r}");
            producer
                .send(BaseRecord::to(topic).key(&key).payload("probe"))
                .map_err(|(e, _)| e)?;
        }
        while producer.in_flight_count() > 0 {
            if begun.elapsed() > timeout {
                bail!("transaction {t}: records not acknowledged after {timeout:?}");
            }
            producer.poll(Duration::from_millis(1));
        }
        let committing = Instant::now();
        producer.commit_transaction(timeout)?;
        commit_ms.push(committing.elapsed().as_secs_f64() * 1000.0);
        total_ms.push(begun.elapsed().as_secs_f64() * 1000.0);
        std::thread::sleep(pause);
    }
    let summary = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        json!({
            "p50_ms": percentile(v, 50.0),
            "p99_ms": percentile(v, 99.0),
            "max_ms": v.last().copied().unwrap_or(f64::NAN),
        })
    };
    let (commit, total) = (summary(&mut commit_ms), summary(&mut total_ms));
    eprintln!(
        "[outbox-bench] txn-probe: {transactions} transactions of {records} records; \
         commit_transaction {commit}; begin to committed {total}"
    );
    Ok(json!({
        "kind": "txn_probe",
        "transactions": transactions,
        "records": records,
        "pause_ms": pause.as_millis() as u64,
        "commit": commit,
        "begin_to_committed": total,
    }))
}

// --------------------------------------------------------------------------- wait-slot

/// Peak RSS, current RSS (kB) and CPU seconds (user + system) of a process.
struct ProcSample {
    vmhwm_kb: u64,
    vmrss_kb: u64,
    cpu_seconds: f64,
    threads: u64,
    /// Context switches of all threads so far (voluntary + involuntary).
    context_switches: u64,
}

/// Sum of a `/proc/<pid>/task/*/status` counter over the process's threads.
fn thread_counter(pid: u32, names: &[&str]) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("status")).ok())
        .flat_map(|status| {
            status
                .lines()
                .filter(|l| names.iter().any(|n| l.starts_with(n)))
                .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
                .collect::<Vec<_>>()
        })
        .sum()
}

fn sample_proc(pid: u32, clk_tck: u64) -> anyhow::Result<ProcSample> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("process {pid} is gone"))?;
    let field = |name: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("process {pid} is gone"))?;
    // Fields after the command name, which is in parentheses and may contain spaces.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .context("unexpected /proc/<pid>/stat format")?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state); utime is field 14, stime field 15.
    let ticks = |i: usize| {
        f.get(i - 3)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    Ok(ProcSample {
        vmhwm_kb: field("VmHWM:"),
        vmrss_kb: field("VmRSS:"),
        cpu_seconds: (ticks(14) + ticks(15)) as f64 / clk_tck as f64,
        threads: field("Threads:"),
        context_switches: thread_counter(
            pid,
            &["voluntary_ctxt_switches:", "nonvoluntary_ctxt_switches:"],
        ),
    })
}

async fn pg_connect(url: &str) -> anyhow::Result<tokio_postgres::Client> {
    let (client, conn) = tokio_postgres::connect(url, NoTls)
        .await
        .with_context(|| format!("connect to {url}"))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(client)
}

async fn wait_slot(
    url: &str,
    slot: &str,
    lsn: &str,
    pid: u32,
    started_ns: u128,
    clk_tck: u64,
    timeout_s: u64,
) -> anyhow::Result<Value> {
    let client = pg_connect(url).await?;
    let query = client
        .prepare(
            "SELECT confirmed_flush_lsn >= $2::text::pg_lsn, confirmed_flush_lsn::text
             FROM pg_replication_slots WHERE slot_name = $1",
        )
        .await?;
    let deadline = Instant::now() + Duration::from_secs(timeout_s);
    let mut tick = tokio::time::interval(SLOT_POLL_INTERVAL);
    let target = parse_lsn(lsn).with_context(|| format!("`{lsn}` is not an LSN"))?;
    // Where the slot was at the first poll, and when (s since `started_ns`) and at which
    // fraction of the way it was first seen half-way or further: the rate of the second half
    // leaves out what a relay pays once at the start (connecting, a first sight of each topic).
    let mut first: Option<u64> = None;
    let mut half: Option<(f64, f64)> = None;
    loop {
        tick.tick().await;
        let row = client
            .query_opt(&query, &[&slot, &lsn])
            .await?
            .with_context(|| format!("slot {slot} does not exist"))?;
        let reached: Option<bool> = row.get(0);
        if let Some(at) = row
            .get::<_, Option<String>>(1)
            .as_deref()
            .and_then(parse_lsn)
        {
            let start = *first.get_or_insert(at);
            let fraction =
                at.saturating_sub(start) as f64 / target.saturating_sub(start).max(1) as f64;
            // Not when it got there in one step with the end: no second half to time.
            if half.is_none() && fraction >= 0.5 && reached != Some(true) {
                half = Some((
                    unix_ns().saturating_sub(started_ns) as f64 / 1e9,
                    fraction.min(1.0),
                ));
            }
        }
        if reached == Some(true) {
            let done_ns = unix_ns();
            // Sampled right away, before the script stops the process.
            let p = sample_proc(pid, clk_tck)?;
            let confirmed: Option<String> = row.get(1);
            let seconds = (done_ns.saturating_sub(started_ns)) as f64 / 1e9;
            eprintln!(
                "[outbox-bench] slot {slot} reached {lsn} after {seconds:.2} s; \
                 peak RSS {:.1} MB, CPU {:.2} s, {} context switches",
                p.vmhwm_kb as f64 / 1024.0,
                p.cpu_seconds,
                p.context_switches
            );
            return Ok(json!({
                "seconds": seconds,
                "confirmed_flush_lsn": confirmed,
                "target_lsn": lsn,
                "vmhwm_kb": p.vmhwm_kb,
                "vmrss_kb": p.vmrss_kb,
                "cpu_seconds": p.cpu_seconds,
                "threads": p.threads,
                "context_switches": p.context_switches,
                "half_way_seconds": half.map(|h| h.0),
                "half_way_fraction": half.map(|h| h.1),
            }));
        }
        sample_proc(pid, clk_tck).context("the relay exited before confirming the target")?;
        if Instant::now() > deadline {
            let confirmed: Option<String> = row.get(1);
            bail!("slot {slot} still at {confirmed:?} after {timeout_s} s; target {lsn}");
        }
    }
}

// ----------------------------------------------------------------------------- latency

#[cfg(test)]
mod tests {
    use super::*;

    const SCRAPE: &str = "# HELP outbox_relay_commit_to_ack_seconds x
# TYPE outbox_relay_commit_to_ack_seconds histogram
outbox_relay_commit_to_ack_seconds_bucket{le=\"0.005\"} 40
outbox_relay_commit_to_ack_seconds_bucket{le=\"0.01\"} 98
outbox_relay_commit_to_ack_seconds_bucket{le=\"0.02\"} 100
outbox_relay_commit_to_ack_seconds_bucket{le=\"+Inf\"} 100
outbox_relay_commit_to_ack_seconds_sum 0.6
outbox_relay_commit_to_ack_seconds_count 100
outbox_relay_events_published_total 100
";

    #[test]
    fn histogram_quantiles_are_bucket_bounds_of_the_difference() {
        let after = PromHistogram::parse(SCRAPE, COMMIT_TO_ACK).unwrap();
        assert_eq!(after.count, 100);
        assert_eq!(after.quantile_bound(0.5), Some(0.01));
        assert_eq!(after.quantile_bound(0.99), Some(0.02));
        let before = PromHistogram {
            buckets: vec![(0.005, 40), (0.01, 40), (0.02, 40), (f64::INFINITY, 40)],
            sum: 0.1,
            count: 40,
        };
        let delta = after.since(&before);
        assert_eq!(delta.count, 60);
        assert_eq!(delta.quantile_bound(0.5), Some(0.01));
        assert!(PromHistogram::parse("other 1\n", COMMIT_TO_ACK).is_none());
    }

    #[test]
    fn lsns_parse_as_postgres_prints_them() {
        assert_eq!(parse_lsn("0/9F04550"), Some(0x9F0_4550));
        assert_eq!(parse_lsn("1/0"), Some(1 << 32));
        assert_eq!(parse_lsn("nope"), None);
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), 50.0);
        assert_eq!(percentile(&v, 99.0), 99.0);
        assert_eq!(percentile(&v, 100.0), 100.0);
    }
}
