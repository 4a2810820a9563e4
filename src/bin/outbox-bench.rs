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
//! - `report`: turns the JSON lines collected by the script into one table and one JSON file.
//!
//! It is a benchmark tool, not part of the relay: it asserts nothing about time.

use std::collections::BTreeMap;
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
    /// Create topics (replication factor 1); existing ones are left alone.
    CreateTopics {
        #[arg(long)]
        brokers: String,
        #[arg(long, default_value_t = 3)]
        partitions: i32,
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
                topics,
            } => create_topics(&brokers, partitions, &topics).await,
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
            Command::Report {
                input,
                output,
                meta,
            } => report(&input, &output, &meta),
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

async fn create_topics(brokers: &str, partitions: i32, topics: &[String]) -> anyhow::Result<()> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .context("create the Kafka admin client")?;
    let new: Vec<NewTopic<'_>> = topics
        .iter()
        .map(|t| NewTopic::new(t, partitions, TopicReplication::Fixed(1)))
        .collect();
    let results = admin
        .create_topics(&new, &AdminOptions::new())
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
    loop {
        tick.tick().await;
        let row = client
            .query_opt(&query, &[&slot, &lsn])
            .await?
            .with_context(|| format!("slot {slot} does not exist"))?;
        let reached: Option<bool> = row.get(0);
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

/// About 250 bytes of JSON, like the drain's preload.
fn payload(i: u64) -> String {
    format!(
        r#"{{"order_id": {i}, "customer_id": "c-{}", "status": "created", "currency": "EUR", "total_cents": {}, "lines": [{{"sku": "sku-{:016x}", "qty": {}}}, {{"sku": "sku-{:016x}", "qty": {}}}], "note": "pad-250-bytes-of-json."}}"#,
        i % 9973,
        (i * 7919) % 100_000,
        i.wrapping_mul(0x9e37_79b9_7f4a_7c15),
        i % 5 + 1,
        (i + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15),
        i % 3 + 1
    )
}

/// One writer connection sending `rate` single-row transactions per second (pipelined, so a
/// slow round trip does not lower the rate) for `duration`. Returns the rows committed.
async fn writer(
    url: String,
    aggregate_type: String,
    rate: f64,
    first_id: u64,
    start: Instant,
    duration: Duration,
) -> anyhow::Result<u64> {
    let client = pg_connect(&url).await?;
    // Each row is committed durably, as an application would: with asynchronous commit (the
    // test cluster's default) the walsender only sees a commit once the WAL writer flushes it,
    // up to wal_writer_delay (200 ms) later, and that delay would swamp the relay's.
    client.batch_execute("SET synchronous_commit = on").await?;
    let insert = client
        .prepare(
            "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
             VALUES (gen_random_uuid(), $1, $2, 'OrderCreated', $3::text::jsonb)",
        )
        .await?;
    let mut pending = FuturesUnordered::new();
    let mut sent = 0u64;
    let mut done = 0u64;
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        let elapsed = start.elapsed();
        if elapsed >= duration {
            break;
        }
        let due = (elapsed.as_secs_f64() * rate) as u64;
        while sent < due && pending.len() < MAX_PENDING_INSERTS {
            let i = first_id + sent;
            let (client, insert, aggregate_type) = (&client, &insert, &aggregate_type);
            pending.push(async move {
                let id = i.to_string();
                let body = payload(i);
                client.execute(insert, &[aggregate_type, &id, &body]).await
            });
            sent += 1;
        }
        tokio::select! {
            _ = tick.tick() => {}
            Some(result) = pending.next() => {
                result?;
                done += 1;
            }
        }
    }
    while let Some(result) = pending.next().await {
        result?;
        done += 1;
    }
    Ok(done)
}

/// Reads `topic` from the beginning until `expected` (set once the writers are done) records
/// arrived; returns each record's latency in ms (receive time − record timestamp).
fn consume_latencies(
    brokers: &str,
    topic: &str,
    expected: Arc<AtomicU64>,
    writers_done: Arc<AtomicBool>,
) -> anyhow::Result<(Vec<f64>, u64)> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", format!("outbox-bench-{}", unix_ns()))
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false")
        // The broker answers a fetch as soon as one byte is there; these only bound the wait
        // when there is nothing, so they cannot delay a record.
        .set("fetch.wait.max.ms", "10")
        .set("fetch.min.bytes", "1")
        .create()
        .context("create the Kafka consumer")?;
    let metadata = consumer
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .context("topic metadata")?;
    let mut assignment = TopicPartitionList::new();
    for t in metadata.topics() {
        for p in t.partitions() {
            assignment.add_partition_offset(topic, p.id(), Offset::Beginning)?;
        }
    }
    if assignment.count() == 0 {
        bail!("topic {topic} has no partitions; create it first");
    }
    consumer.assign(&assignment)?;
    let mut latencies = Vec::new();
    let mut settle_deadline: Option<Instant> = None;
    loop {
        if writers_done.load(Ordering::Acquire) {
            let deadline = *settle_deadline.get_or_insert(Instant::now() + LATENCY_SETTLE_TIMEOUT);
            if latencies.len() as u64 >= expected.load(Ordering::Acquire)
                || Instant::now() > deadline
            {
                break;
            }
        }
        match consumer.poll(Duration::from_millis(50)) {
            Some(Ok(m)) => {
                let now_ms = unix_ns() as f64 / 1e6;
                if let Some(ts) = m.timestamp().to_millis() {
                    latencies.push(now_ms - ts as f64);
                }
            }
            Some(Err(e)) => eprintln!("outbox-bench: consumer error: {e}"),
            None => {}
        }
    }
    let received = latencies.len() as u64;
    Ok((latencies, received))
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// The writers' steady load.
struct Load {
    rate: u64,
    seconds: u64,
    writers: u64,
}

async fn latency(
    url: &str,
    brokers: &str,
    topic: &str,
    aggregate_type: &str,
    load: Load,
    metrics_url: Option<&str>,
) -> anyhow::Result<Value> {
    let Load {
        rate,
        seconds,
        writers,
    } = load;
    let expected = Arc::new(AtomicU64::new(u64::MAX));
    let writers_done = Arc::new(AtomicBool::new(false));
    let consumer = {
        let (brokers, topic) = (brokers.to_string(), topic.to_string());
        let (expected, writers_done) = (expected.clone(), writers_done.clone());
        std::thread::spawn(move || consume_latencies(&brokers, &topic, expected, writers_done))
    };
    // Let the consumer join before the first row, so that no record waits for it.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let relay_before = match metrics_url {
        Some(url) => scrape_histogram(url, COMMIT_TO_ACK).await,
        None => None,
    };
    let start = Instant::now();
    let duration = Duration::from_secs(seconds);
    let per_writer = rate as f64 / writers as f64;
    let tasks: Vec<_> = (0..writers)
        .map(|w| {
            tokio::spawn(writer(
                url.to_string(),
                aggregate_type.to_string(),
                per_writer,
                w * 1_000_000_000,
                start,
                duration,
            ))
        })
        .collect();
    let mut committed = 0;
    for task in tasks {
        committed += task.await??;
    }
    let write_seconds = start.elapsed().as_secs_f64();
    expected.store(committed, Ordering::Release);
    writers_done.store(true, Ordering::Release);
    let (mut latencies, received) = tokio::task::spawn_blocking(move || consumer.join())
        .await?
        .map_err(|_| anyhow::anyhow!("consumer thread panicked"))??;
    latencies.sort_by(f64::total_cmp);
    let relay = match (metrics_url, relay_before) {
        (Some(url), Some(before)) => scrape_histogram(url, COMMIT_TO_ACK)
            .await
            .map(|after| after.since(&before).summary()),
        _ => None,
    };
    eprintln!(
        "[outbox-bench] {rate}/s: {committed} committed ({:.0}/s), {received} received; \
         p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        committed as f64 / write_seconds,
        percentile(&latencies, 50.0),
        percentile(&latencies, 99.0),
        latencies.last().copied().unwrap_or(f64::NAN)
    );
    Ok(json!({
        "rate_target": rate,
        "rate_achieved": committed as f64 / write_seconds,
        "seconds": seconds,
        "writers": writers,
        "committed": committed,
        "received": received,
        "p50_ms": percentile(&latencies, 50.0),
        "p99_ms": percentile(&latencies, 99.0),
        "max_ms": latencies.last().copied().unwrap_or(f64::NAN),
        "method": "consumer receive time - record timestamp (commit time, ms)",
        "relay_commit_to_ack": relay,
    }))
}

/// The relay's commit-to-acknowledgement histogram (Prometheus text format).
const COMMIT_TO_ACK: &str = "outbox_relay_commit_to_ack_seconds";

/// A Prometheus histogram: cumulative counts per upper bound (seconds), sum and count.
#[derive(Debug, Clone, PartialEq)]
struct PromHistogram {
    buckets: Vec<(f64, u64)>,
    sum: f64,
    count: u64,
}

impl PromHistogram {
    fn parse(text: &str, name: &str) -> Option<PromHistogram> {
        let mut h = PromHistogram {
            buckets: Vec::new(),
            sum: 0.0,
            count: 0,
        };
        let mut seen = false;
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let Some((series, value)) = line.rsplit_once(' ') else {
                continue;
            };
            if let Some(labels) = series.strip_prefix(&format!("{name}_bucket{{")) {
                let le = labels
                    .split(',')
                    .find_map(|l| l.strip_prefix("le=\""))
                    .map(|l| l.trim_end_matches('}').trim_end_matches('"'));
                let le = match le {
                    Some("+Inf") => f64::INFINITY,
                    Some(v) => v.parse().ok()?,
                    None => continue,
                };
                h.buckets.push((le, value.parse::<f64>().ok()? as u64));
                seen = true;
            } else if series == format!("{name}_sum") {
                h.sum = value.parse().ok()?;
            } else if series == format!("{name}_count") {
                h.count = value.parse::<f64>().ok()? as u64;
            }
        }
        h.buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        seen.then_some(h)
    }

    /// The observations made after `earlier` was taken.
    fn since(&self, earlier: &PromHistogram) -> PromHistogram {
        let before = |le: f64| {
            earlier
                .buckets
                .iter()
                .find(|(b, _)| *b == le)
                .map_or(0, |(_, c)| *c)
        };
        PromHistogram {
            buckets: self
                .buckets
                .iter()
                .map(|&(le, c)| (le, c.saturating_sub(before(le))))
                .collect(),
            sum: self.sum - earlier.sum,
            count: self.count.saturating_sub(earlier.count),
        }
    }

    /// Upper bound (seconds) of the bucket holding quantile `q`.
    fn quantile_bound(&self, q: f64) -> Option<f64> {
        let target = (q * self.count as f64).ceil().max(1.0) as u64;
        self.buckets
            .iter()
            .find(|(_, c)| *c >= target)
            .map(|(le, _)| *le)
    }

    fn summary(&self) -> Value {
        let ms = |s: Option<f64>| s.filter(|v| v.is_finite()).map(|v| v * 1000.0);
        json!({
            "count": self.count,
            "mean_ms": (self.count > 0).then(|| self.sum / self.count as f64 * 1000.0),
            "p50_at_most_ms": ms(self.quantile_bound(0.50)),
            "p99_at_most_ms": ms(self.quantile_bound(0.99)),
            "source": "relay /metrics histogram (bucket upper bounds)",
        })
    }
}

/// GETs `url` (plain http://host:port/path) and parses histogram `name`; `None` when the relay
/// has no such endpoint or series.
async fn scrape_histogram(url: &str, name: &str) -> Option<PromHistogram> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rest = url.strip_prefix("http://")?;
    let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
    let fetch = async {
        let mut stream = tokio::net::TcpStream::connect(host).await.ok()?;
        let request = format!("GET /{path} HTTP/1.0\r\nHost: {host}\r\n\r\n");
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut response = String::new();
        stream.read_to_string(&mut response).await.ok()?;
        let (head, body) = response.split_once("\r\n\r\n")?;
        head.starts_with("HTTP/1.1 200")
            .then_some(())
            .or_else(|| head.starts_with("HTTP/1.0 200").then_some(()))?;
        PromHistogram::parse(body, name)
    };
    tokio::time::timeout(Duration::from_secs(5), fetch)
        .await
        .ok()
        .flatten()
}

// ------------------------------------------------------------------------------ report

fn read_lines(path: &PathBuf) -> anyhow::Result<Vec<Value>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).with_context(|| format!("bad JSON line: {l}")))
        .collect()
}

fn of_kind<'a>(lines: &'a [Value], kind: &str) -> Vec<&'a Value> {
    lines.iter().filter(|v| v["kind"] == kind).collect()
}

fn num(v: &Value, key: &str) -> f64 {
    v[key].as_f64().unwrap_or(f64::NAN)
}

fn machine() -> Value {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let cpuinfo = read("/proc/cpuinfo");
    let cpu_model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, m)| m.trim().to_string())
        .unwrap_or_default();
    let mem_kb: u64 = read("/proc/meminfo")
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    json!({
        "nproc": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "memory_mb": mem_kb / 1024,
        "cpu_model": cpu_model,
        "kernel": read("/proc/sys/kernel/osrelease").trim(),
        "librdkafka": rdkafka::util::get_rdkafka_version().1,
    })
}

fn report(input: &PathBuf, output: &PathBuf, meta: &[String]) -> anyhow::Result<()> {
    let lines = read_lines(input)?;
    let run: serde_json::Map<String, Value> = parse_pairs(meta)?
        .into_iter()
        .map(|(k, v)| (k, v.as_str().map_or(v.clone(), |s| json!(s))))
        .collect();

    // Drain: pair each transaction size's pg_recvlogical and relay runs.
    let mut drain = Vec::new();
    let mut by_size: BTreeMap<u64, (Option<&Value>, Option<&Value>)> = BTreeMap::new();
    for v in of_kind(&lines, "recvlogical") {
        by_size.entry(num(v, "txn_rows") as u64).or_default().0 = Some(v);
    }
    for v in of_kind(&lines, "relay_drain") {
        by_size.entry(num(v, "txn_rows") as u64).or_default().1 = Some(v);
    }
    for (size, (recv, relay)) in &by_size {
        let events = relay.or(*recv).map_or(f64::NAN, |v| num(v, "events"));
        let recv_eps = recv.map_or(f64::NAN, |v| events / num(v, "seconds"));
        let relay_eps = relay.map_or(f64::NAN, |v| events / num(v, "seconds"));
        let target = if *size >= 100 {
            0.8
        } else if *size == 1 {
            0.6
        } else {
            f64::NAN
        };
        drain.push(json!({
            "txn_rows": size,
            "events": events,
            "pg_recvlogical_seconds": recv.map(|v| num(v, "seconds")),
            "pg_recvlogical_events_per_s": recv_eps,
            "relay_seconds": relay.map(|v| num(v, "seconds")),
            "relay_events_per_s": relay_eps,
            "ratio": relay_eps / recv_eps,
            "ratio_target": if target.is_nan() { Value::Null } else { json!(target) },
            "relay_peak_rss_mb": relay.map(|v| num(v, "vmhwm_kb") / 1024.0),
            "relay_cpu_seconds": relay.map(|v| num(v, "cpu_seconds")),
            "relay_cpu_seconds_per_million_events":
                relay.map(|v| num(v, "cpu_seconds") / events * 1e6),
            "relay_threads": relay.map(|v| num(v, "threads")),
            "relay_context_switches_per_1000_events":
                relay.map(|v| num(v, "context_switches") / events * 1000.0),
            "load_before": relay.map(|v| v["load_before"].clone()),
        }));
    }
    let latency: Vec<Value> = of_kind(&lines, "latency").into_iter().cloned().collect();
    let idle = of_kind(&lines, "idle").first().map(|v| (*v).clone());
    let loads: Vec<Value> = of_kind(&lines, "load").into_iter().cloned().collect();

    print_table(&run, &drain, &latency, idle.as_ref());

    let result = json!({
        "run": run,
        "machine": machine(),
        "drain": drain,
        "latency": latency,
        "idle": idle,
        "load": loads,
        "targets": {
            "drain_ratio_100_row_txns": 0.8,
            "drain_ratio_1_row_txns": 0.6,
            "p99_ms_at_5000_per_s": 20,
            "peak_rss_mb": 64,
            "idle_cpu_percent_of_core": 1,
        },
    });
    if let Some(dir) = output.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(output, serde_json::to_string_pretty(&result)? + "\n")
        .with_context(|| format!("write {}", output.display()))?;
    println!("\nJSON: {}", output.display());
    Ok(())
}

fn fmt(v: f64, decimals: usize) -> String {
    if v.is_nan() {
        "-".into()
    } else {
        format!("{v:.decimals$}")
    }
}

fn print_table(
    run: &serde_json::Map<String, Value>,
    drain: &[Value],
    latency: &[Value],
    idle: Option<&Value>,
) {
    let m = machine();
    println!(
        "outbox-relay benchmark  {}  ({} cores, {} MB, {}; load before: {})",
        run.get("date").and_then(Value::as_str).unwrap_or(""),
        m["nproc"],
        m["memory_mb"],
        m["cpu_model"].as_str().unwrap_or(""),
        run.get("load_start").and_then(Value::as_str).unwrap_or("?"),
    );
    println!();
    println!("Drain of a backlog (events/s; relay = until the slot confirmed the last commit)");
    println!(
        "{:>9} {:>9} {:>16} {:>12} {:>7} {:>7} {:>13} {:>15}",
        "txn rows",
        "events",
        "pg_recvlogical/s",
        "relay/s",
        "ratio",
        "target",
        "peak RSS MB",
        "CPU s/M events"
    );
    for d in drain {
        println!(
            "{:>9} {:>9} {:>16} {:>12} {:>7} {:>7} {:>13} {:>15}",
            fmt(num(d, "txn_rows"), 0),
            fmt(num(d, "events"), 0),
            fmt(num(d, "pg_recvlogical_events_per_s"), 0),
            fmt(num(d, "relay_events_per_s"), 0),
            fmt(num(d, "ratio"), 2),
            d["ratio_target"]
                .as_f64()
                .map_or("-".into(), |t| format!(">={t}")),
            fmt(num(d, "relay_peak_rss_mb"), 1),
            fmt(num(d, "relay_cpu_seconds_per_million_events"), 2),
        );
    }
    println!();
    println!("Latency, 1-row transactions at a steady rate (commit time -> consumer receive, ms)");
    println!(
        "{:>12} {:>12} {:>10} {:>10} {:>8} {:>8} {:>8}   relay's own histogram",
        "target ev/s", "achieved/s", "committed", "received", "p50", "p99", "max"
    );
    for l in latency {
        let r = &l["relay_commit_to_ack"];
        let relay = if r.is_object() {
            format!(
                "p50 <= {} ms, p99 <= {} ms, mean {} ms",
                fmt(num(r, "p50_at_most_ms"), 1),
                fmt(num(r, "p99_at_most_ms"), 1),
                fmt(num(r, "mean_ms"), 1)
            )
        } else {
            "(no /metrics histogram)".into()
        };
        println!(
            "{:>12} {:>12} {:>10} {:>10} {:>8} {:>8} {:>8}   {relay}",
            fmt(num(l, "rate_target"), 0),
            fmt(num(l, "rate_achieved"), 0),
            fmt(num(l, "committed"), 0),
            fmt(num(l, "received"), 0),
            fmt(num(l, "p50_ms"), 1),
            fmt(num(l, "p99_ms"), 1),
            fmt(num(l, "max_ms"), 1),
        );
    }
    if let Some(i) = idle {
        println!();
        println!(
            "Idle: {}% of one core over {} s with no traffic (relay RSS {} MB)",
            fmt(num(i, "cpu_percent"), 2),
            fmt(num(i, "seconds"), 0),
            fmt(num(i, "vmrss_kb") / 1024.0, 1),
        );
    }
}

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
    fn percentiles_are_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), 50.0);
        assert_eq!(percentile(&v, 99.0), 99.0);
        assert_eq!(percentile(&v, 100.0), 100.0);
    }
}
