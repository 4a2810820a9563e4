//! The latency phase: steady writers, a consumer, and the relay's own histogram.

use super::*;

/// About 250 bytes of JSON, like the drain's preload.
pub(super) fn payload(i: u64) -> String {
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
pub(super) fn numbered_id(i: u64) -> String {
    format!("00000000-0000-4000-8000-{:012x}", i & 0xffff_ffff_ffff)
}

/// Where the writers' event ids come from.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Ids {
    /// `gen_random_uuid()` on the server (the latency phase: ids do not matter).
    Random,
    /// [`numbered_id`] of the row's number (the re-send count needs to know every id).
    Numbered,
}

/// One writer connection sending `rate` single-row transactions per second (pipelined, so a
/// slow round trip does not lower the rate) for `duration`. Rows are numbered from `first_id`.
/// Returns the rows committed (all of them: an error ends the run).
pub(super) async fn writer(
    url: String,
    aggregate_type: String,
    rate: f64,
    first_id: u64,
    ids: Ids,
    start: Instant,
    duration: Duration,
) -> anyhow::Result<u64> {
    let client = pg_connect(&url).await?;
    // Each row is committed durably, as an application would: with asynchronous commit (the
    // test cluster's default) the walsender only sees a commit once the WAL writer flushes it,
    // up to wal_writer_delay (200 ms) later, and that delay would swamp the relay's.
    client.batch_execute("SET synchronous_commit = on").await?;
    let id_expr = match ids {
        Ids::Random => "gen_random_uuid()",
        Ids::Numbered => "$4::text::uuid",
    };
    let insert = client
        .prepare(&format!(
            "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
             VALUES ({id_expr}, $1, $2, 'OrderCreated', $3::text::jsonb)"
        ))
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
                let aggregate_id = i.to_string();
                let body = payload(i);
                match ids {
                    Ids::Random => {
                        client
                            .execute(insert, &[aggregate_type, &aggregate_id, &body])
                            .await
                    }
                    Ids::Numbered => {
                        let id = numbered_id(i);
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

/// Reads `topic` from the beginning until `expected` (set once the writers are done) records
/// arrived; returns each record's latency in ms (receive time − record timestamp).
/// A read_committed consumer of every partition of `topic` from the beginning.
///
/// Commit-to-visible: with `kafka.delivery = "exactly_once"` a record counts once its Kafka
/// transaction committed; records of a non-transactional producer are visible at once either
/// way. The broker answers a fetch as soon as one byte is there; the fetch settings only bound
/// the wait when there is nothing, so they cannot delay a record.
pub(super) fn assigned_consumer(
    brokers: &str,
    topic: &str,
    group_prefix: &str,
) -> anyhow::Result<BaseConsumer> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", format!("{group_prefix}-{}", unix_ns()))
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false")
        .set("fetch.wait.max.ms", "10")
        .set("fetch.min.bytes", "1")
        .set("isolation.level", "read_committed")
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
    Ok(consumer)
}

pub(super) fn consume_latencies(
    brokers: &str,
    topic: &str,
    expected: Arc<AtomicU64>,
    writers_done: Arc<AtomicBool>,
) -> anyhow::Result<(Vec<f64>, u64)> {
    let consumer = assigned_consumer(brokers, topic, "outbox-bench")?;
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

pub(super) fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// The writers' steady load.
pub(super) struct Load {
    pub(super) rate: u64,
    pub(super) seconds: u64,
    pub(super) writers: u64,
}

pub(super) async fn latency(
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
        Some(url) => scrape_text(url).await,
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
                Ids::Random,
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
    let relay_after = match metrics_url {
        Some(url) => scrape_text(url).await,
        None => None,
    };
    let (relay, relay_read, kafka_transactions) = match (&relay_before, &relay_after) {
        (Some(before), Some(after)) => (
            histogram_delta(before, after, COMMIT_TO_ACK),
            histogram_delta(before, after, COMMIT_TO_READ),
            kafka_transactions(Some(before), after),
        ),
        _ => (None, None, None),
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
        "relay_commit_to_read": relay_read,
        "relay_kafka_transactions": kafka_transactions,
    }))
}

/// The relay's commit-to-acknowledgement histogram (Prometheus text format).
pub(super) const COMMIT_TO_ACK: &str = "outbox_relay_commit_to_ack_seconds";
/// PostgreSQL's share of it: commit to the relay reading the transaction.
pub(super) const COMMIT_TO_READ: &str = "outbox_relay_commit_to_read_seconds";

/// A Prometheus histogram: cumulative counts per upper bound (seconds), sum and count.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct PromHistogram {
    pub(super) buckets: Vec<(f64, u64)>,
    pub(super) sum: f64,
    pub(super) count: u64,
}

impl PromHistogram {
    pub(super) fn parse(text: &str, name: &str) -> Option<PromHistogram> {
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
    pub(super) fn since(&self, earlier: &PromHistogram) -> PromHistogram {
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
    pub(super) fn quantile_bound(&self, q: f64) -> Option<f64> {
        let target = (q * self.count as f64).ceil().max(1.0) as u64;
        self.buckets
            .iter()
            .find(|(_, c)| *c >= target)
            .map(|(le, _)| *le)
    }

    pub(super) fn summary(&self) -> Value {
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

/// The summary of histogram `name` between two scrapes; `None` when the relay has no such
/// series.
pub(super) fn histogram_delta(before: &str, after: &str, name: &str) -> Option<Value> {
    let before = PromHistogram::parse(before, name)?;
    let after = PromHistogram::parse(after, name)?;
    Some(after.since(&before).summary())
}

/// Exactly-once's Kafka transaction histogram: how long a commit took.
pub(super) const KAFKA_COMMIT: &str = "outbox_relay_kafka_commit_seconds";
pub(super) const KAFKA_TXN_COMMITTED: &str = "outbox_relay_kafka_transactions_committed_total";
pub(super) const KAFKA_TXN_ABORTED: &str = "outbox_relay_kafka_transactions_aborted_total";
pub(super) const KAFKA_TXN_RECORDS: &str = "outbox_relay_kafka_transaction_records_total";

/// The value of an unlabelled counter or gauge `name` in a Prometheus text scrape.
pub(super) fn counter(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// Exactly-once's Kafka transactions between two scrapes (from the relay's start when
/// `before` is `None`): committed, aborted, records per transaction and commit latency.
/// `None` when the relay has no such counters or committed none (at-least-once).
pub(super) fn kafka_transactions(before: Option<&str>, after: &str) -> Option<Value> {
    let delta = |name: &str| {
        let a = counter(after, name)?;
        Some(a - before.and_then(|b| counter(b, name)).unwrap_or(0.0))
    };
    let committed = delta(KAFKA_TXN_COMMITTED)?;
    let aborted = delta(KAFKA_TXN_ABORTED).unwrap_or(0.0);
    if committed == 0.0 && aborted == 0.0 {
        return None;
    }
    let records = delta(KAFKA_TXN_RECORDS);
    let commit = PromHistogram::parse(after, KAFKA_COMMIT).map(|a| match before {
        Some(b) => match PromHistogram::parse(b, KAFKA_COMMIT) {
            Some(b) => a.since(&b),
            None => a,
        },
        None => a,
    });
    Some(json!({
        "committed": committed,
        "aborted": aborted,
        "records": records,
        "records_per_transaction": records.map(|r| r / committed),
        "commit_seconds": commit.map(|h| h.summary()),
    }))
}

/// One scrape of the relay as a JSON object: its exactly-once figures since it started and
/// its commit-to-acknowledgement histogram. `None` when it serves no metrics.
pub(super) async fn relay_metrics(url: &str) -> Option<Value> {
    let text = scrape_text(url).await?;
    Some(json!({
        "kind": "relay_metrics",
        "kafka_transactions": kafka_transactions(None, &text),
        "commit_to_ack": PromHistogram::parse(&text, COMMIT_TO_ACK).map(|h| h.summary()),
        "events_published": counter(&text, "outbox_relay_events_published_total"),
    }))
}

/// GETs `url` (plain http://host:port/path): the body of a 200 answer, `None` otherwise.
pub(super) async fn scrape_text(url: &str) -> Option<String> {
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
        Some(body.to_string())
    };
    tokio::time::timeout(Duration::from_secs(5), fetch)
        .await
        .ok()
        .flatten()
}

// ------------------------------------------------------------------------------ report
