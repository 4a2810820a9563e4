//! The latency measurement: steady writers, a consumer, and the relay's own histograms.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use futures_util::stream::{FuturesUnordered, StreamExt};
use rdkafka::message::Message;

use crate::kafka::assigned_consumer;
use crate::pg::pg_connect;
use crate::prom::{
    histogram_delta, kafka_transactions, scrape_text, COMMIT_TO_ACK, COMMIT_TO_READ,
};
use crate::records::{Latency, LatencyKind, WarmUp};
use crate::util::{finite, percentile, unix_ns};

/// Inserts a latency writer may have outstanding on its connection (pipelined).
const MAX_PENDING_INSERTS: usize = 256;
/// How long the latency consumer keeps reading after the writers stop.
const LATENCY_SETTLE_TIMEOUT: Duration = Duration::from_secs(60);

/// About 250 bytes of JSON, like the drain's preload.
pub fn payload(i: u64) -> String {
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

/// The event id of row `i` when the writer chooses ids ([`Ids::Numbered`]): a UUID whose last
/// 48 bits are `i`, so that a consumer can tell which row a record came from.
pub fn numbered_id(i: u64) -> String {
    format!("00000000-0000-4000-8000-{:012x}", i & 0xffff_ffff_ffff)
}

/// Where the writers' event ids come from.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Ids {
    /// `gen_random_uuid()` on the server (the latency phase: ids do not matter).
    Random,
    /// [`numbered_id`] of the row's number (the re-send count needs to know every id).
    Numbered,
}

/// The writers' steady load.
#[derive(Clone, Copy)]
pub struct Load {
    pub rate: u64,
    pub seconds: u64,
    pub writers: u64,
}

/// Where the writers write and the consumer reads.
pub struct Target<'a> {
    pub url: &'a str,
    pub brokers: &'a str,
    pub topic: &'a str,
    /// The rows' aggregatetype (selects the topic through the relay's template).
    pub aggregate_type: &'a str,
    /// Topics the rows spread over: with more than one, row `i` has aggregate type
    /// `{aggregate_type}-t{i % spread}`, which the relay's topic template turns into topic
    /// `{topic}-t{i % spread}`.
    pub spread: u64,
}

/// `name` alone, or its `spread` variants `{name}-t{j}`: the topics and aggregate types of a
/// [`Target`] in the same order.
pub fn spread_names(name: &str, spread: u64) -> Vec<String> {
    match spread {
        0 | 1 => vec![name.to_string()],
        n => (0..n).map(|j| format!("{name}-t{j}")).collect(),
    }
}

impl Target<'_> {
    /// Every topic the rows go to.
    pub fn topics(&self) -> Vec<String> {
        spread_names(self.topic, self.spread)
    }
}

/// One writer connection's share of a [`Load`].
struct WriterPlan {
    url: String,
    /// Row `i` has the `i % len`th.
    aggregate_types: Arc<Vec<String>>,
    /// Rows per second of this writer.
    rate: f64,
    /// Rows are numbered from here.
    first_id: u64,
    ids: Ids,
    start: Instant,
    duration: Duration,
}

/// The insert statement of a writer.
fn insert_sql(ids: Ids) -> String {
    let id_expr = match ids {
        Ids::Random => "gen_random_uuid()",
        Ids::Numbered => "$4::text::uuid",
    };
    format!(
        "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
         VALUES ({id_expr}, $1, $2, 'OrderCreated', $3::text::jsonb)"
    )
}

/// One writer connection sending single-row transactions at its rate (pipelined, so a slow
/// round trip does not lower the rate). Returns the rows committed (all of them: an error
/// ends the run).
async fn writer(plan: WriterPlan) -> anyhow::Result<u64> {
    let client = pg_connect(&plan.url).await?;
    // Each row is committed durably, as an application would: with asynchronous commit (the
    // test cluster's default) the walsender only sees a commit once the WAL writer flushes it,
    // up to wal_writer_delay (200 ms) later, and that delay would swamp the relay's.
    client.batch_execute("SET synchronous_commit = on").await?;
    let insert = client.prepare(&insert_sql(plan.ids)).await?;
    let mut pending = FuturesUnordered::new();
    let (mut sent, mut done) = (0u64, 0u64);
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    while plan.start.elapsed() < plan.duration {
        let due = (plan.start.elapsed().as_secs_f64() * plan.rate) as u64;
        while sent < due && pending.len() < MAX_PENDING_INSERTS {
            let i = plan.first_id + sent;
            let types = &plan.aggregate_types;
            let (client, insert) = (&client, &insert);
            let aggregate_type = &types[(i % types.len() as u64) as usize];
            pending.push(async move {
                let (aggregate_id, body, id) = (i.to_string(), payload(i), numbered_id(i));
                match plan.ids {
                    Ids::Random => {
                        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 3] =
                            [aggregate_type, &aggregate_id, &body];
                        client.execute(insert, &params).await
                    }
                    Ids::Numbered => {
                        client
                            .execute(insert, &[aggregate_type, &aggregate_id, &body, &id])
                            .await
                    }
                }
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

/// Writers of `load` on `target`, rows numbered from `first_id(w)` for writer `w`, all
/// started at `start`. Returns the rows each writer committed and the seconds they wrote.
pub async fn write(
    target: &Target<'_>,
    load: Load,
    ids: Ids,
    first_id: fn(u64) -> u64,
) -> anyhow::Result<(Vec<(u64, u64)>, f64)> {
    let start = Instant::now();
    let aggregate_types = Arc::new(spread_names(target.aggregate_type, target.spread));
    let tasks: Vec<_> = (0..load.writers)
        .map(|w| {
            tokio::spawn(writer(WriterPlan {
                url: target.url.to_string(),
                aggregate_types: aggregate_types.clone(),
                rate: load.rate as f64 / load.writers as f64,
                first_id: first_id(w),
                ids,
                start,
                duration: Duration::from_secs(load.seconds),
            }))
        })
        .collect();
    let mut committed = Vec::new();
    for (w, task) in (0..load.writers).zip(tasks) {
        committed.push((first_id(w), task.await??));
    }
    Ok((committed, start.elapsed().as_secs_f64()))
}

/// Tells a consumer thread when the writers are done and how many rows to expect, and which
/// records belong to the warm-up.
#[derive(Clone)]
pub struct Expect {
    expected: Arc<AtomicU64>,
    done: Arc<AtomicBool>,
    /// Records with an earlier timestamp (unix ms) are the warm-up's; 0 until a warm-up.
    measure_from_ms: Arc<AtomicU64>,
    /// Warm-up records received so far.
    warm_received: Arc<AtomicU64>,
}

impl Expect {
    pub fn new() -> Expect {
        Expect {
            expected: Arc::new(AtomicU64::new(u64::MAX)),
            done: Arc::new(AtomicBool::new(false)),
            measure_from_ms: Arc::new(AtomicU64::new(0)),
            warm_received: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Whether a record committed at `timestamp_ms` belongs to the warm-up (counting it).
    fn is_warm_up(&self, timestamp_ms: i64) -> bool {
        let warm = (timestamp_ms.max(0) as u64) < self.measure_from_ms.load(Ordering::Acquire);
        if warm {
            self.warm_received.fetch_add(1, Ordering::AcqRel);
        }
        warm
    }

    pub fn writers_done(&self, committed: u64) {
        self.expected.store(committed, Ordering::Release);
        self.done.store(true, Ordering::Release);
    }

    /// `Some(expected)` once the writers are done.
    pub fn expected(&self) -> Option<u64> {
        self.done
            .load(Ordering::Acquire)
            .then(|| self.expected.load(Ordering::Acquire))
    }
}

/// Each record's latency in ms (receive time − record timestamp), the measured window's and
/// the warm-up's apart.
#[derive(Default)]
struct Consumed {
    latencies: Vec<f64>,
    warm_up: Vec<f64>,
}

/// Reads `topics` from the beginning until the expected records arrived (or the settle
/// timeout).
fn consume_latencies(brokers: &str, topics: &[String], expect: Expect) -> anyhow::Result<Consumed> {
    let consumer = assigned_consumer(brokers, topics, "outbox-bench")?;
    let mut consumed = Consumed::default();
    let mut settle_deadline: Option<Instant> = None;
    loop {
        if let Some(expected) = expect.expected() {
            let deadline = *settle_deadline.get_or_insert(Instant::now() + LATENCY_SETTLE_TIMEOUT);
            if consumed.latencies.len() as u64 >= expected || Instant::now() > deadline {
                break;
            }
        }
        match consumer.poll(Duration::from_millis(50)) {
            Some(Ok(m)) => {
                let now_ms = unix_ns() as f64 / 1e6;
                if let Some(ts) = m.timestamp().to_millis() {
                    match expect.is_warm_up(ts) {
                        true => consumed.warm_up.push(now_ms - ts as f64),
                        false => consumed.latencies.push(now_ms - ts as f64),
                    }
                }
            }
            Some(Err(e)) => eprintln!("outbox-bench: consumer error: {e}"),
            None => {}
        }
    }
    Ok(consumed)
}

/// Optional scrape of the relay's metrics.
async fn scrape(metrics_url: Option<&str>) -> Option<String> {
    scrape_text(metrics_url?).await
}

/// How long the warm-up's last records may take to arrive before the measured window starts.
const WARM_UP_SETTLE_TIMEOUT: Duration = Duration::from_secs(60);

/// A consumer reading a [`Target`]'s topics from the beginning, for one latency measurement.
pub struct LatencyConsumer {
    expect: Expect,
    thread: std::thread::JoinHandle<anyhow::Result<Consumed>>,
}

impl LatencyConsumer {
    /// Starts the consumer and gives it time to join before the first row, so that no
    /// record waits for it.
    pub async fn start(target: &Target<'_>) -> LatencyConsumer {
        let expect = Expect::new();
        let (brokers, topics, e) = (target.brokers.to_string(), target.topics(), expect.clone());
        let thread = std::thread::spawn(move || consume_latencies(&brokers, &topics, e));
        tokio::time::sleep(Duration::from_secs(2)).await;
        LatencyConsumer { expect, thread }
    }

    /// [`LatencyConsumer::start`], then [`LatencyConsumer::warm_up`] at `load`'s rate for
    /// `warm_up_seconds` (none when 0).
    pub async fn start_warm(
        target: &Target<'_>,
        load: Load,
        warm_up_seconds: u64,
    ) -> anyhow::Result<LatencyConsumer> {
        let consumer = LatencyConsumer::start(target).await;
        if warm_up_seconds > 0 {
            let warm = Load {
                seconds: warm_up_seconds,
                ..load
            };
            consumer.warm_up(target, warm).await?;
        }
        Ok(consumer)
    }

    /// Writers at `load` before the measured window, then a wait until every row they
    /// committed arrived: the relay, librdkafka and the broker have then seen every topic
    /// and partition (a partition's first records on a new topic can wait for seconds: see
    /// bench/README.md), and the window measures a steady state. Its records are reported
    /// apart ([`WarmUp`]).
    pub async fn warm_up(&self, target: &Target<'_>, load: Load) -> anyhow::Result<()> {
        self.expect
            .measure_from_ms
            .store(u64::MAX, Ordering::Release);
        let (rows, _) = write(target, load, Ids::Random, |w| w * 1_000_000_000).await?;
        let committed: u64 = rows.iter().map(|(_, n)| n).sum();
        let give_up = Instant::now() + WARM_UP_SETTLE_TIMEOUT;
        while self.expect.warm_received.load(Ordering::Acquire) < committed {
            if Instant::now() > give_up || self.thread.is_finished() {
                anyhow::bail!(
                    "the warm-up's {committed} rows did not all arrive within {} s",
                    WARM_UP_SETTLE_TIMEOUT.as_secs()
                );
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // Commit timestamps are whole ms: the window's rows commit after this one.
        let from = (unix_ns() / 1_000_000) as u64 + 1;
        tokio::time::sleep(Duration::from_millis(2)).await;
        self.expect.measure_from_ms.store(from, Ordering::Release);
        Ok(())
    }
}

/// Writers at `load.rate` for `load.seconds` while `consumer` reads the relay's topics; the
/// relay's own histograms between two scrapes of `metrics_url`, when it has one.
pub async fn latency(
    target: &Target<'_>,
    load: Load,
    consumer: LatencyConsumer,
    metrics_url: Option<&str>,
) -> anyhow::Result<Latency> {
    let LatencyConsumer { expect, thread } = consumer;
    let relay_before = scrape(metrics_url).await;
    let (rows, write_seconds) = write(target, load, Ids::Random, |w| w * 1_000_000_000).await?;
    let committed: u64 = rows.iter().map(|(_, n)| n).sum();
    expect.writers_done(committed);
    let Consumed {
        mut latencies,
        mut warm_up,
    } = tokio::task::spawn_blocking(move || thread.join())
        .await?
        .map_err(|_| anyhow::anyhow!("consumer thread panicked"))?
        .context("the latency consumer")?;
    latencies.sort_by(f64::total_cmp);
    warm_up.sort_by(f64::total_cmp);
    let relay_after = scrape(metrics_url).await;
    let (ack, read, txns) = match (&relay_before, &relay_after) {
        (Some(before), Some(after)) => (
            histogram_delta(before, after, COMMIT_TO_ACK),
            histogram_delta(before, after, COMMIT_TO_READ),
            kafka_transactions(Some(before), after),
        ),
        _ => (None, None, None),
    };
    let out = Latency {
        kind: LatencyKind,
        delivery: None,
        tracing: None,
        relay_cpu_seconds: None,
        walsender_cpu_seconds: None,
        producer_alone_cpu_seconds: None,
        topics: (target.spread > 1).then_some(target.spread),
        rate_target: load.rate,
        rate_achieved: committed as f64 / write_seconds,
        seconds: load.seconds,
        writers: load.writers,
        committed,
        received: latencies.len() as u64,
        p50_ms: finite(percentile(&latencies, 50.0)),
        p99_ms: finite(percentile(&latencies, 99.0)),
        max_ms: latencies.last().copied(),
        method: "consumer receive time - record timestamp (commit time, ms)".into(),
        relay_commit_to_ack: ack,
        relay_commit_to_read: read,
        relay_kafka_transactions: txns,
        warm_up: (!warm_up.is_empty()).then(|| {
            Box::new(WarmUp {
                received: warm_up.len() as u64,
                p50_ms: finite(percentile(&warm_up, 50.0)),
                p99_ms: finite(percentile(&warm_up, 99.0)),
                max_ms: warm_up.last().copied(),
            })
        }),
    };
    eprintln!(
        "[outbox-bench] {}/s: {committed} committed ({:.0}/s), {} received; p50 {:?} ms, p99 \
         {:?} ms, max {:?} ms",
        load.rate, out.rate_achieved, out.received, out.p50_ms, out.p99_ms, out.max_ms
    );
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_before_the_window_are_the_warm_ups_and_counted() {
        let expect = Expect::new();
        // No warm-up: every record is measured.
        assert!(!expect.is_warm_up(1_000));
        expect.measure_from_ms.store(u64::MAX, Ordering::Release);
        assert!(expect.is_warm_up(1_000));
        assert!(expect.is_warm_up(2_000));
        expect.measure_from_ms.store(2_000, Ordering::Release);
        assert!(expect.is_warm_up(1_999));
        assert!(!expect.is_warm_up(2_000));
        assert_eq!(expect.warm_received.load(Ordering::Acquire), 3);
    }
}
