//! Exactly-once at its edges (issue 20, done-when 1–3), against the real PostgreSQL and Kafka:
//! a PostgreSQL transaction that takes many times `transaction.timeout.ms` to publish, a
//! progress topic shared with a neighbour frozen between its progress record and its commit,
//! and a record whose topic does not exist yet. Each must end with every event exactly once
//! for a read_committed consumer.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::cluster::OwnCluster;
use crate::common::probe::{free_port, http_get, metric};
use crate::common::*;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

/// Sets `key` in a relay environment, replacing an earlier value.
fn set(env: &mut Vec<(String, String)>, key: &str, value: &str) {
    env.retain(|(k, _)| k != key);
    env.push((key.to_string(), value.to_string()));
}

// ---------------------------------------------------------------------------------------
// Done-when 1: one PostgreSQL transaction far longer than a Kafka transaction may stay open.

/// Rows of the one big transaction: enough for several times `split_after` (a third of
/// [`BIG_TXN_TIMEOUT_MS`]) of publishing. The test relay (opt-level 1) publishes some 140,000
/// rows a second beside another test here; on a slower machine the test takes longer and needs
/// more split commits (the test asks for one per timeout the publishing took). The main before the
/// split, 639c6b9, had the broker abort every attempt: 9 in 150 s, nothing delivered.
/// `OUTBOX_TEST_BIG_TXN_ROWS` sets another size (the read deadline grows with it).
fn big_rows() -> u64 {
    std::env::var("OUTBOX_TEST_BIG_TXN_ROWS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000)
}
/// `kafka.properties."transaction.timeout.ms"` of that test: a Kafka transaction open longer
/// is aborted by the broker (it checks every 10 s, its default
/// `transaction.abort.timed.out.transaction.cleanup.interval.ms`). The relay splits after a
/// third of it (667 ms), leaving over a second for the commit.
const BIG_TXN_TIMEOUT_MS: &str = "2000";

/// Row number of a big-transaction event id (a UUID whose last 12 hex digits are the row
/// number), `None` for anything else.
fn big_index(key: &[u8]) -> Option<u64> {
    let key = std::str::from_utf8(key).ok()?;
    let tail = key.strip_prefix("00000000-0000-4000-8000-")?;
    u64::from_str_radix(tail, 16).ok()
}

/// Inserts rows 1..=`rows` in one transaction, straight from `generate_series` (shaped like
/// [`Event`]: aggregate type `order`, a payload with `seq` and `writer`); returns how long
/// the INSERT and the COMMIT took.
async fn insert_big_transaction(db: &TestDb, rows: u64) -> Duration {
    let began = Instant::now();
    db.client()
        .await
        .execute(
            "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
             SELECT ('00000000-0000-4000-8000-' || lpad(to_hex(i), 12, '0'))::uuid,
                    'order', 'big-' || (i % 1000), 'Created',
                    jsonb_build_object('seq', i, 'writer', 0, 'note', 'one big transaction')
             FROM generate_series(1::bigint, $1::bigint) AS i",
            &[&(rows as i64)],
        )
        .await
        .expect("insert the big transaction");
    began.elapsed()
}

/// What a read_committed consumer saw of the big transaction.
struct BigTally {
    /// Records per row number (index 0 unused).
    counts: Vec<u8>,
    distinct: u64,
    unexpected: u64,
    /// When the last missing row arrived (from the start of the read), if all did.
    complete_after: Option<Duration>,
}

impl BigTally {
    fn missing(&self) -> u64 {
        self.counts.len() as u64 - 1 - self.distinct
    }

    fn duplicates(&self) -> u64 {
        self.counts
            .iter()
            .map(|&n| u64::from(n.saturating_sub(1)))
            .sum()
    }
}

/// Reads `topic` (one partition) read_committed from the start until each of rows 1..=`rows`
/// arrived or `timeout` passed, then `settle` longer to see duplicates. Counts by row number
/// instead of keeping records: the big transaction is too many to hold.
async fn read_big(topic: &str, rows: u64, timeout: Duration, settle: Duration) -> BigTally {
    let topic = topic.to_string();
    tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", brokers())
            .set("group.id", random_name("big-reader"))
            .set("isolation.level", "read_committed")
            .set("enable.auto.commit", "false")
            .set("topic.metadata.refresh.interval.ms", "500")
            .create()
            .expect("consumer");
        let mut assignment = TopicPartitionList::new();
        assignment
            .add_partition_offset(&topic, 0, Offset::Beginning)
            .unwrap();
        consumer.assign(&assignment).expect("assign");
        let began = Instant::now();
        let mut tally = BigTally {
            counts: vec![0; rows as usize + 1],
            distinct: 0,
            unexpected: 0,
            complete_after: None,
        };
        let mut deadline = began + timeout;
        while Instant::now() < deadline {
            match consumer.poll(Duration::from_millis(200)) {
                Some(Ok(m)) => match big_index(m.key().unwrap_or_default()) {
                    Some(i) if (1..=rows).contains(&i) => {
                        let n = &mut tally.counts[i as usize];
                        if *n == 0 {
                            tally.distinct += 1;
                            if tally.distinct == rows {
                                tally.complete_after = Some(began.elapsed());
                                deadline = Instant::now() + settle;
                            }
                        }
                        *n = n.saturating_add(1);
                    }
                    _ => tally.unexpected += 1,
                },
                Some(Err(e)) if e.to_string().contains("Unknown topic") => {}
                Some(Err(e)) => eprintln!("read_big: consumer error {e}"),
                None => {}
            }
        }
        tally
    })
    .await
    .unwrap()
}

/// Samples a process's resident set size (`VmRSS`) every 100 ms until dropped.
struct RssWatch {
    max_kib: Arc<AtomicU64>,
    last_kib: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
}

impl RssWatch {
    fn start(pid: u32) -> RssWatch {
        let (max_kib, last_kib) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let stop = Arc::new(AtomicBool::new(false));
        let (max, last, stopped) = (max_kib.clone(), last_kib.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stopped.load(Ordering::Relaxed) {
                if let Some(kib) = vm_rss_kib(pid) {
                    max.fetch_max(kib, Ordering::Relaxed);
                    last.store(kib, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        RssWatch {
            max_kib,
            last_kib,
            stop,
        }
    }

    fn max_mib(&self) -> u64 {
        self.max_kib.load(Ordering::Relaxed) / 1024
    }

    fn last_mib(&self) -> u64 {
        self.last_kib.load(Ordering::Relaxed) / 1024
    }

    /// Forgets the maximum so far (a new phase begins).
    fn reset_max(&self) {
        self.max_kib
            .store(self.last_kib.load(Ordering::Relaxed), Ordering::Relaxed);
    }
}

impl Drop for RssWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// `VmRSS` of a process in KiB, from `/proc/<pid>/status`.
fn vm_rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// How much the relay's RSS may grow while it publishes the big transaction. Holding the
/// transaction's records until its PostgreSQL commit would take far more (each record is
/// about 250 bytes of key, payload and headers: 500,000 are about 120 MiB before any
/// overhead); librdkafka's queue and the in-flight window are bounded by the caps whatever
/// the transaction's size.
const BIG_RSS_GROWTH_MAX_MIB: u64 = 64;

/// Done-when 1: one PostgreSQL transaction of [`big_rows`] rows with `transaction.timeout.ms`
/// = [`BIG_TXN_TIMEOUT_MS`]: the relay splits it across Kafka transactions that each stay well under the
/// timeout, so the broker aborts none, a read_committed consumer sees every row exactly once,
/// and the relay's memory stays flat.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_transaction_many_kafka_timeouts_long_arrives_once_without_aborts() {
    let db = TestDb::new().await;
    db.create_slot().await;
    let http = free_port();
    let mut env = exactly_once_env(&db);
    set(
        &mut env,
        "OUTBOX_RELAY__HTTP__LISTEN",
        &format!("127.0.0.1:{http}"),
    );
    set(
        &mut env,
        "OUTBOX_RELAY__KAFKA__PROPERTIES__TRANSACTION_TIMEOUT_MS",
        BIG_TXN_TIMEOUT_MS,
    );
    let mut relay = RelayProcess::start(&env, &format!("eos-big-{}", db.name));
    wait_for_slot(&db, &mut relay).await;
    let rss = RssWatch::start(relay.pid());
    // The producer and the HTTP listener are up before the baseline is taken.
    wait_for("the relay's /metrics", Duration::from_secs(30), || async {
        http_get(http, "/metrics").is_some()
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let baseline_mib = rss.last_mib();
    rss.reset_max();

    let big = big_rows();
    let inserted = insert_big_transaction(&db, big).await;
    println!("big transaction: {big} rows inserted and committed in {inserted:?}");
    let reading = Instant::now();
    let tally = read_big(
        &db.topic("order"),
        big,
        Duration::from_secs(150 * big.div_ceil(500_000)),
        Duration::from_secs(3),
    )
    .await;
    let max_mib = rss.max_mib();
    let body = http_get(http, "/metrics")
        .map(|(_, b)| b)
        .unwrap_or_default();
    let aborted = metric(&body, "outbox_relay_kafka_transactions_aborted_total");
    let committed = metric(&body, "outbox_relay_kafka_transactions_committed_total");
    let log = relay.log_text();
    let splits = log.matches("changes of the transaction there)").count();
    println!(
        "big transaction: all {} of {big} rows read_committed {:?} after the commit \
         (read for {:?}), {} duplicates, {} unexpected; {committed:?} Kafka transactions \
         committed, {aborted:?} aborted, {splits} split commits; relay RSS {baseline_mib} MiB \
         before, max {max_mib} MiB while publishing",
        tally.distinct,
        tally.complete_after,
        reading.elapsed(),
        tally.duplicates(),
        tally.unexpected
    );
    let said = format!(
        "{} of {big} rows read_committed, {aborted:?} Kafka transactions aborted, \
         {splits} split commits; log: {}",
        tally.distinct,
        relay.log.display()
    );
    assert_eq!(
        aborted,
        Some(0.0),
        "Kafka transactions were aborted or failed (transaction.timeout.ms = \
         {BIG_TXN_TIMEOUT_MS}): {said}"
    );
    assert_eq!(tally.missing(), 0, "rows missing: {said}");
    assert_eq!(
        tally.duplicates(),
        0,
        "duplicates for a read_committed consumer: {said}"
    );
    assert_eq!(tally.unexpected, 0, "records of no row: {said}");
    // No Kafka transaction may stay open for transaction.timeout.ms, so publishing that took
    // N + 1 timeouts went out in at least N + 1 Kafka transactions, N of them split commits
    // inside the PostgreSQL transaction, however fast the machine is (a fast one needs fewer,
    // a slow one more; the relay splits after a third of the timeout, so it makes about 3N).
    let took = tally.complete_after.unwrap_or_default();
    let timeout_ms: u128 = BIG_TXN_TIMEOUT_MS.parse().unwrap();
    let needed = (took.as_millis() / timeout_ms).saturating_sub(1);
    assert!(
        splits as u128 >= needed,
        "publishing took {took:?}, {needed} times transaction.timeout.ms, but the transaction \
         went out in only {splits} split commits: {said}"
    );
    assert!(
        max_mib <= baseline_mib + BIG_RSS_GROWTH_MAX_MIB,
        "the relay's RSS grew from {baseline_mib} MiB to {max_mib} MiB while publishing one \
         transaction of {big} rows (at most {BIG_RSS_GROWTH_MAX_MIB} MiB of growth allowed)"
    );

    // The slot reaches the transaction's end once its last part committed.
    let end = db.current_wal_lsn().await;
    wait_for(
        "the slot to confirm the big transaction",
        Duration::from_secs(60),
        || async { db.confirmed_flush_lsn().await >= end },
    )
    .await;
    assert!(relay.terminate(Duration::from_secs(30)).success(), "{log}");
    db.cleanup().await;
}

// ---------------------------------------------------------------------------------------
// Done-when 2: a progress topic shared with a neighbour frozen mid-commit.

/// A Kafka transaction another producer opened on a partition and left open: what a relay
/// frozen (or killed) between producing its progress record and committing leaves behind.
/// The partition's last stable offset stays at its record until it is aborted (or the broker
/// aborts it after its `transaction.timeout.ms`).
struct HangingTxn {
    producer: BaseProducer,
}

impl HangingTxn {
    /// Opens a transaction with one record on partition 0 of `topic`, flushed to the broker.
    async fn open(topic: &str) -> HangingTxn {
        let topic = topic.to_string();
        tokio::task::spawn_blocking(move || {
            let producer: BaseProducer = ClientConfig::new()
                .set("bootstrap.servers", brokers())
                .set("transactional.id", random_name("eos-frozen-neighbour-"))
                // The test ends it; the broker must not do so first.
                .set("transaction.timeout.ms", "120000")
                .create()
                .expect("transactional producer");
            producer
                .init_transactions(Duration::from_secs(30))
                .expect("init_transactions");
            producer.begin_transaction().expect("begin_transaction");
            // Shaped like a progress record of a third slot.
            let key = r#"{"system_identifier":"0","database":"neighbour","slot":"frozen"}"#;
            producer
                .send(
                    BaseRecord::to(&topic)
                        .partition(0)
                        .key(key)
                        .payload(r#"{"end_lsn":"0/1"}"#),
                )
                .map_err(|(e, _)| e)
                .expect("produce the hanging record");
            producer
                .flush(Duration::from_secs(30))
                .expect("flush the hanging record");
            HangingTxn { producer }
        })
        .await
        .unwrap()
    }

    async fn abort(self) {
        tokio::task::spawn_blocking(move || {
            self.producer
                .abort_transaction(Duration::from_secs(30))
                .expect("abort the hanging transaction");
        })
        .await
        .unwrap();
    }
}

/// Partition 0 of `topic`: (last stable offset, high watermark). The first is what a
/// read_committed consumer sees as the end, the second a read_uncommitted one.
async fn stable_and_high(topic: &str) -> (i64, i64) {
    let topic = topic.to_string();
    tokio::task::spawn_blocking(move || {
        let watermarks = |isolation: &str| {
            let consumer: BaseConsumer = ClientConfig::new()
                .set("bootstrap.servers", brokers())
                .set("isolation.level", isolation)
                .create()
                .expect("consumer");
            consumer
                .fetch_watermarks(&topic, 0, Duration::from_secs(10))
                .expect("watermarks")
                .1
        };
        (watermarks("read_committed"), watermarks("read_uncommitted"))
    })
    .await
    .unwrap()
}

/// `n` events of `aggregate_type` in transactions of 10; returns them and the WAL position
/// just after the first transaction's commit: a slot confirmed below it re-reads that
/// transaction. (Not the position before the commit: the relay may rightly confirm a
/// keepalive's position between the two, before it received the transaction, and
/// PostgreSQL still sends a transaction whose commit is at or after the confirmed position.)
async fn write_batch(
    db: &TestDb,
    aggregate_type: &str,
    batch: usize,
    n: usize,
) -> (Vec<Event>, u64) {
    let mut client = db.client().await;
    let events: Vec<Event> = (0..n)
        .map(|i| Event::new(aggregate_type, &format!("b{batch}"), batch, i))
        .collect();
    let mut first = None;
    for chunk in events.chunks(10) {
        insert_events_at(&mut client, chunk, true).await;
        if first.is_none() {
            first = Some(wal_insert_lsn(&client).await);
        }
    }
    (events, first.expect("events to write"))
}

/// Fails unless every event of `events` is in its topic for a read_committed consumer
/// within `timeout` (duplicates are the final check's business).
async fn expect_committed(label: &str, db: &TestDb, events: &[Event], relay: &RelayProcess) {
    let topics = vec![db.topic("order"), db.topic("customer")];
    let ids: Vec<String> = events.iter().map(|e| e.id.clone()).collect();
    let received = read_ids_committed(&topics, &ids, Duration::from_secs(60), Duration::ZERO).await;
    let t = tally(events, &received);
    assert!(
        t.missing.is_empty(),
        "{label}: {} of {} events not committed to Kafka within 60 s\n{}",
        t.missing.len(),
        events.len(),
        relay.log_text()
    );
}

/// How long the neighbour's transaction stays open after the relays restarted: longer than
/// the 3 s after which the main before 0b02faa took a stable offset below the high watermark
/// as the end, shorter than the 30 s the progress reader now waits for the stable offset.
const NEIGHBOUR_HOLD: Duration = Duration::from_secs(15);

/// Done-when 2, without a fault hook: relays of two slots (A and B, two databases) share one
/// one-partition progress topic. Their slots lag behind Kafka (a status update every 20 s,
/// no early confirmation), so a restart is sent again what Kafka already has. A neighbour's
/// transaction left open on the progress partition holds its stable offset; A and B commit
/// more (their newer progress records land beyond it), are SIGKILLed and restart while it
/// is still open; while they are down PostgreSQL crashes (`pg_ctl -m immediate`, on a cluster
/// of the test's own), so the slots fall back to their last saved positions and the restarts
/// are sent again even more of what Kafka has. A progress reader that took the stable offset
/// as the end would read their older values and publish the second batch again: duplicates
/// for read_committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_neighbour_frozen_mid_commit_on_the_shared_progress_topic_causes_no_duplicates() {
    let cluster = OwnCluster::new("eos-shared");
    let (a_db, b_db) = (
        TestDb::new_on(&cluster.url()).await,
        TestDb::new_on(&cluster.url()).await,
    );
    for db in [&a_db, &b_db] {
        // The relay sends status updates at most every third of wal_sender_timeout (10 s on
        // the test cluster): 90 s lets it keep the configured 20 s.
        db.client()
            .await
            .batch_execute(&format!(
                "ALTER DATABASE {} SET wal_sender_timeout = '90s'",
                db.name
            ))
            .await
            .unwrap();
        db.create_slot().await;
    }
    let progress = format!("{}.shared-progress", a_db.topic_prefix);
    let env_of = |db: &TestDb| {
        let mut env = exactly_once_env(db);
        set(&mut env, "OUTBOX_RELAY__KAFKA__PROGRESS_TOPIC", &progress);
        // The slot confirms at the session's first status update, then 20 s later: the
        // test kills the relays before that, so a restart re-reads both batches.
        set(
            &mut env,
            "OUTBOX_RELAY__POSTGRES__STATUS_INTERVAL_MS",
            "20000",
        );
        set(&mut env, "OUTBOX_RELAY__RELAY__CONFIRM_DELAY_MS", "600000");
        env
    };
    let (a_env, b_env) = (env_of(&a_db), env_of(&b_db));
    let (a_log, b_log) = (
        format!("eos-shared-a-{}", a_db.name),
        format!("eos-shared-b-{}", b_db.name),
    );
    // A first: it makes the progress topic (one partition, compacted), which B then finds.
    let mut a = RelayProcess::start(&a_env, &a_log);
    wait_for_slot(&a_db, &mut a).await;
    let mut b = RelayProcess::start(&b_env, &b_log);
    wait_for_slot(&b_db, &mut b).await;

    // Batch 1: in Kafka, progress records committed below what comes next.
    let (a1, _) = write_batch(&a_db, "order", 1, 100).await;
    let (b1, _) = write_batch(&b_db, "customer", 1, 100).await;
    expect_committed("A, batch 1", &a_db, &a1, &a).await;
    expect_committed("B, batch 1", &b_db, &b1, &b).await;

    // The neighbour freezes between its progress record and its commit.
    let hanging = HangingTxn::open(&progress).await;
    let (stable, high) = stable_and_high(&progress).await;
    assert!(
        stable < high,
        "the hanging transaction does not hold the progress partition's stable offset \
         ({stable}, high watermark {high})"
    );
    let frozen_at = stable;

    // Batch 2: committed to Kafka, its progress records beyond the stable offset.
    let (a2, a2_lsn) = write_batch(&a_db, "order", 2, 100).await;
    let (b2, b2_lsn) = write_batch(&b_db, "customer", 2, 100).await;
    expect_committed("A, batch 2", &a_db, &a2, &a).await;
    expect_committed("B, batch 2", &b_db, &b2, &b).await;
    let (stable, high) = stable_and_high(&progress).await;
    assert!(
        stable == frozen_at && high > frozen_at + 1,
        "the relays' newer progress records should lie beyond the frozen stable offset \
         {frozen_at}: now stable {stable}, high {high}"
    );
    // Without a lagging slot a restart re-reads nothing, and the test proves nothing.
    for (label, db, lsn) in [("A", &a_db, a2_lsn), ("B", &b_db, b2_lsn)] {
        let confirmed = db.confirmed_flush_lsn().await;
        assert!(
            confirmed < lsn,
            "{label}'s slot confirmed batch 2 ({confirmed:X} ≥ {lsn:X}) before the kill: a \
             restart would re-read nothing"
        );
    }

    a.kill9();
    b.kill9();
    let confirmed = (
        a_db.confirmed_flush_lsn().await,
        b_db.confirmed_flush_lsn().await,
    );
    cluster.crash();
    let recovered = (
        a_db.confirmed_flush_lsn().await,
        b_db.confirmed_flush_lsn().await,
    );
    println!(
        "A and B SIGKILLed with batch 2 in Kafka and not confirmed, then PostgreSQL crashed: \
         slots confirmed {:X}/{:X} before the crash, {:X}/{:X} after; restarting",
        confirmed.0, confirmed.1, recovered.0, recovered.1
    );
    let mut a = RelayProcess::start(&a_env, &a_log);
    let mut b = RelayProcess::start(&b_env, &b_log);
    // The deliberate hold: the neighbour stays frozen while both restart.
    tokio::time::sleep(NEIGHBOUR_HOLD).await;
    for (label, relay) in [("A", &mut a), ("B", &mut b)] {
        if let Some(status) = relay.try_status() {
            panic!("{label} exited with {status}:\n{}", relay.log_text());
        }
    }
    hanging.abort().await;
    println!("the neighbour's transaction aborted after {NEIGHBOUR_HOLD:?}");

    let (a3, _) = write_batch(&a_db, "order", 3, 100).await;
    let (b3, _) = write_batch(&b_db, "customer", 3, 100).await;
    let a_all: Vec<Event> = [a1, a2, a3].concat();
    let b_all: Vec<Event> = [b1, b2, b3].concat();
    expect_exactly_once("A", &a_db, &a_all, &[], &a.log_text()).await;
    expect_exactly_once("B", &b_db, &b_all, &[], &b.log_text()).await;
    for (label, relay) in [("A", &mut a), ("B", &mut b)] {
        let skipped = relay.log_text().matches("skipped=true").count();
        println!("{label}: {skipped} transactions skipped as already in Kafka");
        assert!(
            relay.terminate(Duration::from_secs(30)).success(),
            "{label}"
        );
    }
    a_db.cleanup().await;
    b_db.cleanup().await;
}

// ---------------------------------------------------------------------------------------
// Done-when 3: a record whose topic does not exist yet.

/// Whether `topic` exists, from a metadata request for all topics (a request for it by name
/// could create it).
async fn topic_exists(topic: &str) -> bool {
    let topic = topic.to_string();
    tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", brokers())
            .create()
            .expect("consumer");
        let metadata = consumer
            .fetch_metadata(None, Duration::from_secs(10))
            .expect("metadata");
        metadata
            .topics()
            .iter()
            .any(|t| t.name() == topic && t.error().is_none() && !t.partitions().is_empty())
    })
    .await
    .unwrap()
}

/// `kafka.message_timeout_ms` of that test: how long a commit waits for records that wait for
/// their topic. Above the 10 s after which the main before 06d211d failed such a record (and
/// could then commit past it): with less, the commit gave up first and that path never ran.
const MISSING_MESSAGE_TIMEOUT_MS: &str = "15000";
/// How long the topic stays missing: past the 10 s above, and past one commit given up.
const MISSING_HOLD: Duration = Duration::from_secs(25);

/// Done-when 3: in exactly-once mode, events for a topic that does not exist (the relay's
/// producer may not auto-create it: `allow.auto.create.topics = false`, and
/// `kafka.topic_creation` is off) followed by events for one that does. The records of the
/// missing topic wait for its partition count; the Kafka transaction that holds them cannot
/// commit without them, so nothing after them is committed or confirmed: the slot stays
/// below their first commit and a read_committed consumer sees none of the later events.
/// Once the topic exists, everything arrives exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_record_waiting_for_a_missing_topic_is_never_committed_past() {
    let db = TestDb::new().await;
    db.create_slot().await;
    let (missing, existing) = (db.topic("order"), db.topic("customer"));
    create_topic(&existing, 1).await;
    let mut env = exactly_once_env(&db);
    set(
        &mut env,
        "OUTBOX_RELAY__KAFKA__PROPERTIES__ALLOW_AUTO_CREATE_TOPICS",
        "false",
    );
    set(
        &mut env,
        "OUTBOX_RELAY__KAFKA__MESSAGE_TIMEOUT_MS",
        MISSING_MESSAGE_TIMEOUT_MS,
    );
    let mut relay = RelayProcess::start(&env, &format!("eos-missing-{}", db.name));
    wait_for_slot(&db, &mut relay).await;

    let (first, first_lsn) = write_batch(&db, "order", 1, 50).await;
    let (after, _) = write_batch(&db, "customer", 2, 50).await;
    let written = Instant::now();

    // While the topic is missing, a read_committed consumer of the existing topic reads
    // (and must see nothing), and the slot is watched.
    let watch_existing = tokio::spawn({
        let topics = vec![existing.clone()];
        async move { read_until(&topics, 1, MISSING_HOLD, Duration::ZERO, |_| false).await }
    });
    while written.elapsed() < MISSING_HOLD {
        if let Some(status) = relay.try_status() {
            panic!("the relay exited with {status}:\n{}", relay.log_text());
        }
        let confirmed = db.confirmed_flush_lsn().await;
        assert!(
            confirmed < first_lsn,
            "the slot was confirmed to {confirmed:X}, past the first transaction for the \
             missing topic {missing} (its commit ends before {first_lsn:X}), {:?} after the \
             writes\n{}",
            written.elapsed(),
            relay.log_text()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let seen = watch_existing.await.unwrap();
    assert!(
        seen.is_empty(),
        "{} records of events written after those for the missing topic were committed to \
         {existing} while it was missing, e.g. {:?}\n{}",
        seen.len(),
        seen.first().map(Received::key_str),
        relay.log_text()
    );
    assert!(!topic_exists(&missing).await, "{missing} was created");

    create_topic(&missing, 1).await;
    let all: Vec<Event> = [first, after].concat();
    expect_exactly_once(
        "after the topic was made",
        &db,
        &all,
        &[],
        &relay.log_text(),
    )
    .await;
    let end = db.current_wal_lsn().await;
    wait_for(
        "the slot to confirm everything once the topic exists",
        Duration::from_secs(60),
        || async { db.confirmed_flush_lsn().await >= end },
    )
    .await;
    assert!(
        relay.terminate(Duration::from_secs(30)).success(),
        "{}",
        relay.log_text()
    );
    db.cleanup().await;
}
