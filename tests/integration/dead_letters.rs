//! Dead letters you can act on, against the real services: poison rows dead-lettered, the
//! configuration fixed and the topic's limit raised, then `dead-letters redrive` delivers each
//! once to its topic — also when SIGKILLed halfway and run again — and a second run sends
//! nothing; the same for the insert-then-delete pattern; a raised limit that each record fits
//! and librdkafka's default batches do not: every record arrives, none is dead-lettered
//! again. And the dead-letter breaker: past
//! `dead_letter.max_per_minute` the relay stops before confirming the transaction that tripped it.
//! And a topic limit that is no record's fault: a backlog older than the topic's timestamp
//! window waits, blocked, and nothing of it is dead-lettered.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::common::probe::{free_port, http_get, wait_exit};
use crate::common::*;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::ClientConfig;

/// Poison rows of each kind (enough for a redrive to have a "halfway").
const BAD_TOPIC_ROWS: usize = 150;
const TOO_BIG_ROWS: usize = 150;
/// The big topic's record limit, and a payload (random hex, so compression cannot shrink it
/// below the limit) well over it.
const SMALL_LIMIT: &str = "10000";
const BIG_HEX_CHUNKS: i32 = 1250;
/// Redriven twice at most: at-least-once's window, what landed in Kafka after the last commit
/// (every 200 ms, held back by the records lingering 500 ms; at 10 ms a record, about 70).
const MAX_DUPLICATES: usize = 100;

async fn create_topic_limited(topic: &str, max_message_bytes: &str) {
    create_topic_with(topic, 1, &[("max.message.bytes", max_message_bytes)]).await
}

fn admin() -> rdkafka::admin::AdminClient<rdkafka::client::DefaultClientContext> {
    ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .create()
        .expect("admin client")
}

/// Raises the topic's record limit to `max_message_bytes` with the admin API (the operator's
/// fix for `too_large`).
async fn raise_limit(topic: &str, max_message_bytes: &str) {
    use rdkafka::admin::{AdminOptions, AlterConfig, ResourceSpecifier};
    let config = AlterConfig::new(ResourceSpecifier::Topic(topic))
        .set("max.message.bytes", max_message_bytes);
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    for r in admin().alter_configs(&[config], &options).await.unwrap() {
        r.unwrap_or_else(|(_, e)| panic!("raise the limit of {topic}: {e}"));
    }
}

/// The high watermark of partition 0 of `topic`.
fn high_watermark(topic: &str) -> i64 {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", brokers())
        .set("group.id", "dead-letters-test-watermarks");
    let consumer: BaseConsumer = config.create().unwrap();
    consumer
        .fetch_watermarks(topic, 0, Duration::from_secs(10))
        .map(|(_, high)| high)
        .unwrap_or(0)
}

/// Inserts the poison rows: a routing column naming an invalid topic, and payloads over the
/// big topic's limit. `delete`: each row is deleted in its own transaction (insert-then-delete).
async fn insert_poison(db: &TestDb, delete: bool) -> (Vec<String>, Vec<String>) {
    let client = db.client().await;
    let ids = |n| {
        (0..n)
            .map(|_| uuid::Uuid::new_v4().to_string())
            .collect::<Vec<_>>()
    };
    let (bad, big) = (ids(BAD_TOPIC_ROWS), ids(TOO_BIG_ROWS));
    let then_delete = if delete {
        "DELETE FROM outbox WHERE id = ANY($1::text[]::uuid[]);"
    } else {
        ""
    };
    let bad_sql = String::from(
        "WITH i AS (INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, dest)
           SELECT i::uuid, 'order', 'agg-' || n, 'Bad', jsonb_build_object('n', n), 'bad topic!'
           FROM unnest($1::text[]) WITH ORDINALITY AS u(i, n) RETURNING id) SELECT count(*) FROM i",
    );
    let big_sql = format!(
        "WITH i AS (INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
           SELECT i::uuid, 'big', 'agg-' || n, 'Huge', jsonb_build_object('blob',
             (SELECT string_agg(md5(random()::text || g), '') FROM generate_series(1, {BIG_HEX_CHUNKS}) g))
           FROM unnest($1::text[]) WITH ORDINALITY AS u(i, n) RETURNING id) SELECT count(*) FROM i"
    );
    for (sql, batch) in [(&bad_sql, &bad), (&big_sql, &big)] {
        for chunk in batch.chunks(50) {
            let chunk = chunk.to_vec();
            client.execute("BEGIN", &[]).await.unwrap();
            client.query_one(sql.as_str(), &[&chunk]).await.unwrap();
            if delete {
                client.execute(then_delete, &[&chunk]).await.unwrap();
            }
            client.execute("COMMIT", &[]).await.unwrap();
        }
    }
    (bad, big)
}

async fn redrive_after_the_fix(delete: bool) {
    let db = TestDb::new().await;
    let (order, big_topic, dlq) = (
        db.topic("order"),
        db.topic("big"),
        format!("{}.dlq", db.topic_prefix),
    );
    create_topic(&order, 1).await;
    create_topic_limited(&big_topic, SMALL_LIMIT).await;
    let client = db.client().await;
    client
        .batch_execute("ALTER TABLE outbox ADD COLUMN dest text")
        .await
        .unwrap();
    db.create_slot().await;
    let (bad, big) = insert_poison(&db, delete).await;
    // Batches within the big topic's limit from the first record: else its first refused
    // batch restarts the session (nothing lost), and the rows dead-lettered before the restart
    // are dead-lettered twice, which the redrive would send twice.
    let fixed = with(
        db.relay_env(),
        &[
            ("OUTBOX_RELAY__DEAD_LETTER__TOPIC", &dlq),
            ("OUTBOX_RELAY__KAFKA__PROPERTIES__BATCH_SIZE", "9000"),
        ],
    );
    // The deploy that dead-letters: `dest` routes each event.
    let broken = with(
        fixed.clone(),
        &[("OUTBOX_RELAY__OUTBOX__TOPIC_COLUMN", "dest")],
    );
    let mut relay = RelayProcess::start(&broken, "dead_letters_poison");
    let all: Vec<String> = bad.iter().chain(&big).cloned().collect();
    let dead = read_ids(
        std::slice::from_ref(&dlq),
        1,
        &all,
        Duration::from_secs(90),
        Duration::ZERO,
    )
    .await;
    let reasons: HashMap<String, String> = dead
        .iter()
        .map(|r| {
            (
                r.key_str(),
                r.header("outbox-relay.dlq.reason")
                    .unwrap_or("")
                    .to_string(),
            )
        })
        .collect();
    assert_eq!(
        reasons.len(),
        all.len(),
        "dead letters missing\n{}",
        relay.log_text()
    );
    assert!(
        bad.iter().all(|id| reasons[id] == "invalid_topic"),
        "{reasons:?}"
    );
    assert!(
        big.iter().all(|id| reasons[id] == "too_large"),
        "{reasons:?}"
    );
    assert!(relay.terminate(Duration::from_secs(30)).success());

    // The fix: routing by the template again, and a limit the payloads fit.
    raise_limit(&big_topic, "2000000").await;
    let mut slow = redrive_command(&fixed, &[]);
    // Slow (10 ms a record), and records linger in the producer for 500 ms: at the kill some
    // were handed over and not yet acknowledged, which the group's position must not cover.
    slow.env("OUTBOX_RELAY_REDRIVE_PAUSE_MS", "10")
        .env("OUTBOX_RELAY__KAFKA__LINGER_MS", "500");
    let mut child = slow.spawn().unwrap();
    let began = Instant::now();
    let halfway = (all.len() / 3) as i64;
    while high_watermark(&order) + high_watermark(&big_topic) < halfway {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the slow redrive ended before its kill"
        );
        assert!(
            began.elapsed() < Duration::from_secs(60),
            "the redrive made no progress"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let killed_at = high_watermark(&order) + high_watermark(&big_topic);
    assert!(
        killed_at < all.len() as i64,
        "killed after the end ({killed_at})"
    );

    let second = redrive(&fixed, &[]);
    assert_eq!(second["failures"], serde_json::json!([]), "{second:#}");
    assert_eq!(second["left"], 0, "{second:#}");
    assert!(second["redriven"].as_u64().unwrap() > 0, "{second:#}");
    let third = redrive(&fixed, &[]);
    assert_eq!(
        third["redriven"], 0,
        "a finished redrive sent again: {third:#}"
    );

    let got = read_ids(
        &[order.clone(), big_topic.clone()],
        1,
        &all,
        Duration::from_secs(60),
        Duration::from_secs(1),
    )
    .await;
    let mut seen: HashMap<String, usize> = HashMap::new();
    for r in &got {
        assert!(
            r.header("outbox-relay.redrive-count") == Some("1"),
            "no redrive count on {}",
            r.key_str()
        );
        assert!(r
            .headers
            .iter()
            .all(|(k, _)| !k.starts_with("outbox-relay.dlq.")));
        *seen.entry(r.key_str()).or_default() += 1;
    }
    let missing: Vec<_> = all.iter().filter(|id| !seen.contains_key(*id)).collect();
    assert!(
        missing.is_empty(),
        "{} of {} not redriven: {missing:?}",
        missing.len(),
        all.len()
    );
    let duplicates: usize = seen.values().map(|n| n - 1).sum();
    eprintln!(
        "redrive killed at {killed_at} of {}: {duplicates} duplicates",
        all.len()
    );
    assert!(duplicates <= MAX_DUPLICATES, "{duplicates} duplicates");
    let on = |topic: &str, id: &String| got.iter().any(|r| &r.key_str() == id && r.topic == topic);
    assert!(
        bad.iter().all(|id| on(&order, id)),
        "mapped again to the template's topic"
    );
    assert!(
        big.iter().all(|id| on(&big_topic, id)),
        "re-sent to its original topic"
    );
    let payload = got
        .iter()
        .find(|r| r.topic == big_topic)
        .unwrap()
        .payload
        .as_ref()
        .unwrap()
        .len();
    assert!(
        payload > 40_000,
        "a too-large record comes back whole ({payload} bytes)"
    );
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redrive_delivers_poison_rows_once_after_the_fix_even_when_killed_halfway() {
    redrive_after_the_fix(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redrive_delivers_deleted_rows_of_the_insert_then_delete_pattern() {
    redrive_after_the_fix(true).await;
}

/// Records of ~3 KB (`MEDIUM_HEX_CHUNKS` × 32 characters of random hex): too large for a
/// 2,500-byte topic, and, 300 of them, far more than 100,000 bytes together.
const MEDIUM_HEX_CHUNKS: i32 = 94;

/// The runbook's fix for `too_large`, followed (issue 50, point 5): 300 events of ~3 KB to a
/// topic whose `max.message.bytes` is 2,500 are dead-lettered by the relay; the operator raises
/// the limit to 100,000 and runs `dead-letters redrive` with the defaults. Each record fits the
/// new limit; 300 of them in one of librdkafka's default batches (`batch.size` 1,000,000) do
/// not, and Kafka refuses such a batch whole. That is no record's fault: every one of the 300
/// reaches the topic, none is dead-lettered again, the command exits 0, and a second redrive
/// sends nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redrive_after_a_raised_limit_sends_every_record_in_batches_within_it() {
    let db = TestDb::new().await;
    let (topic, dlq) = (db.topic("medium"), format!("{}.dlq", db.topic_prefix));
    create_topic_limited(&topic, "2500").await;
    create_topic(&dlq, 1).await;
    db.create_slot().await;
    let ids: Vec<String> = (0..300).map(|_| uuid::Uuid::new_v4().to_string()).collect();
    // Each row its own random hex (the subquery names the row's id, so it runs per row):
    // batches of them do not compress below the limit.
    let sql = format!(
        "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
           SELECT i::uuid, 'medium', 'agg-' || n, 'Sized', jsonb_build_object('blob',
             (SELECT string_agg(md5(random()::text || g || i), '')
                FROM generate_series(1, {MEDIUM_HEX_CHUNKS}) g))
           FROM unnest($1::text[]) WITH ORDINALITY AS u(i, n)"
    );
    let client = db.client().await;
    for chunk in ids.chunks(50) {
        client
            .execute(sql.as_str(), &[&chunk.to_vec()])
            .await
            .unwrap();
    }
    let env = with(
        db.relay_env(),
        &[("OUTBOX_RELAY__DEAD_LETTER__TOPIC", dlq.as_str())],
    );
    let mut relay = RelayProcess::start(&env, "dead_letters_raised_limit");
    let dead = read_ids(
        std::slice::from_ref(&dlq),
        1,
        &ids,
        Duration::from_secs(90),
        Duration::from_secs(1),
    )
    .await;
    let mut dead_ids: Vec<String> = dead.iter().map(|r| r.key_str()).collect();
    dead_ids.sort();
    dead_ids.dedup();
    assert_eq!(
        dead_ids.len(),
        ids.len(),
        "not every event dead-lettered\n{}",
        relay.log_text()
    );
    assert!(
        dead.iter()
            .all(|r| r.header("outbox-relay.dlq.reason") == Some("too_large")),
        "dead-lettered for another reason\n{}",
        relay.log_text()
    );
    let mut payloads: Vec<_> = dead.iter().filter_map(|r| r.payload.clone()).collect();
    payloads.sort();
    payloads.dedup();
    assert_eq!(payloads.len(), ids.len(), "payloads alike: they compress");
    assert!(relay.terminate(Duration::from_secs(30)).success());

    raise_limit(&topic, "100000").await;
    let dead_before = high_watermark(&dlq);
    let out = redrive_command(&env, &[]).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let report: serde_json::Value =
        serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}{stderr}"));
    let dead_again = high_watermark(&dlq) - dead_before;
    let got = read_ids(
        std::slice::from_ref(&topic),
        1,
        &ids,
        Duration::from_secs(30),
        Duration::from_secs(1),
    )
    .await;
    let seen: std::collections::HashSet<String> = got.iter().map(|r| r.key_str()).collect();
    let missing = ids.iter().filter(|id| !seen.contains(*id)).count();
    eprintln!(
        "limit raised 2,500 -> 100,000, redrive: {} of {} on the topic ({missing} missing, {} records), \
         {dead_again} dead-lettered again (report: redriven {}, dead_lettered_again {}), {}",
        seen.len(),
        ids.len(),
        got.len(),
        report["redriven"],
        report["dead_lettered_again"],
        out.status
    );
    assert!(out.status.success(), "{}\n{report:#}\n{stderr}", out.status);
    assert_eq!(report["failures"], serde_json::json!([]), "{report:#}");
    assert_eq!(
        missing, 0,
        "events missing from the topic\n{report:#}\n{stderr}"
    );
    assert_eq!(dead_again, 0, "records dead-lettered again\n{report:#}");
    assert_eq!(report["dead_lettered_again"], 0, "{report:#}");

    let on_topic = high_watermark(&topic);
    let second = redrive(&env, &[]);
    assert_eq!(
        (&second["redriven"], &second["dead_lettered_again"]),
        (&serde_json::json!(0), &serde_json::json!(0)),
        "a finished redrive sent again: {second:#}"
    );
    assert_eq!(high_watermark(&topic), on_topic, "{second:#}");
    assert_eq!(high_watermark(&dlq), dead_before, "{second:#}");
    db.cleanup().await;
}

/// Six unroutable rows, one transaction each, against a breaker of 3 a minute: the relay
/// stops with exit 1, three dead letters sent, and the slot confirmed up to the third
/// transaction but not into the fourth.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_breaker_stops_the_relay_before_confirming_the_transaction_that_tripped_it() {
    let db = TestDb::new().await;
    let dlq = format!("{}.dlq", db.topic_prefix);
    let mut client = db.client().await;
    client
        .batch_execute("ALTER TABLE outbox ALTER COLUMN aggregatetype DROP NOT NULL")
        .await
        .unwrap();
    db.create_slot().await;
    let mut before_commit = Vec::new();
    let mut ids = Vec::new();
    for _ in 0..6 {
        let (id, lsn) = insert_poison_at(&mut client).await;
        before_commit.push(lsn);
        ids.push(id);
    }
    let env = with(
        db.relay_env(),
        &[
            ("OUTBOX_RELAY__DEAD_LETTER__TOPIC", &dlq),
            ("OUTBOX_RELAY__DEAD_LETTER__MAX_PER_MINUTE", "3"),
            ("OUTBOX_RELAY__DEAD_LETTER__ON_BREAKER", "stop"),
        ],
    );
    let mut relay = RelayProcess::start(&env, "dead_letters_breaker");
    let status = wait_exit(&mut relay, Duration::from_secs(60));
    let log = relay.log_text();
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(
        log.contains("dead-letter breaker tripped") && log.contains(&ids[3]),
        "{log}"
    );
    let confirmed = db.confirmed_flush_lsn().await;
    assert!(
        confirmed > before_commit[2],
        "the three dead-lettered transactions are confirmed ({confirmed:#x} <= {:#x})",
        before_commit[2]
    );
    assert!(
        confirmed <= before_commit[3],
        "slot confirmed {confirmed:#x}, into the transaction that tripped the breaker (commit after {:#x})",
        before_commit[3]
    );
    let dead = read_ids(
        std::slice::from_ref(&dlq),
        1,
        &ids[..3],
        Duration::from_secs(30),
        Duration::from_secs(1),
    )
    .await;
    let mut keys: Vec<String> = dead.iter().map(|r| r.key_str()).collect();
    keys.sort();
    let mut expected = ids[..3].to_vec();
    expected.sort();
    assert_eq!(keys, expected, "exactly the first three dead-lettered");
    db.cleanup().await;
}

/// A backlog of 5,000 events of ~400 bytes with one of 100 KB among them, to a topic whose
/// `max.message.bytes` is 64 KiB (a common per-topic limit). Kafka refuses whole batches over
/// the limit and librdkafka fails every record of a refused batch: only the one event is at
/// fault, so it alone is dead-lettered (`too_large`), and the 4,999 others arrive — in both
/// delivery modes. The slot ends past all of them.
async fn only_the_oversized_event_is_dead_lettered(exactly_once: bool) {
    let db = TestDb::new().await;
    let (topic, dlq) = (db.topic("small"), format!("{}.dlq", db.topic_prefix));
    create_topic_limited(&topic, "65536").await;
    create_topic(&dlq, 1).await;
    db.create_slot().await;
    let client = db.client().await;
    let ids: Vec<String> = (0..5_000)
        .map(|_| uuid::Uuid::new_v4().to_string())
        .collect();
    let big = ids[2_500].clone();
    // ~400 bytes of random hex (compression cannot shrink batches below the limit), and
    // 100 KB for the one, in transactions of 100 rows.
    let sql = "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
        SELECT i::uuid, 'small', 'agg-' || (n % 50), 'Happened', jsonb_build_object('blob',
          (SELECT string_agg(md5(random()::text || g), '') FROM generate_series(1,
            CASE WHEN i = $2 THEN 3200 ELSE 12 END) g))
        FROM unnest($1::text[]) WITH ORDINALITY AS u(i, n)";
    for chunk in ids.chunks(100) {
        client.execute(sql, &[&chunk.to_vec(), &big]).await.unwrap();
    }
    let mut env = with(
        db.relay_env(),
        &[("OUTBOX_RELAY__DEAD_LETTER__TOPIC", dlq.as_str())],
    );
    if exactly_once {
        env = with(
            exactly_once_env(&db),
            &[("OUTBOX_RELAY__DEAD_LETTER__TOPIC", dlq.as_str())],
        );
    }
    let mut relay = RelayProcess::start(&env, "dead_letters_batch_limit");
    let healthy: Vec<String> = ids.iter().filter(|id| **id != big).cloned().collect();
    let got = read_ids(
        std::slice::from_ref(&topic),
        1,
        &healthy,
        Duration::from_secs(120),
        Duration::from_secs(1),
    )
    .await;
    let dead = read_ids(
        std::slice::from_ref(&dlq),
        1,
        std::slice::from_ref(&big),
        Duration::from_secs(60),
        Duration::from_secs(2),
    )
    .await;
    let log = relay.log_text();
    let mut seen: HashMap<String, usize> = HashMap::new();
    for r in &got {
        *seen.entry(r.key_str()).or_default() += 1;
    }
    let missing = healthy.iter().filter(|id| !seen.contains_key(*id)).count();
    let resent: usize = seen.values().map(|n| n - 1).sum();
    let dead_healthy = dead.iter().filter(|r| r.key_str() != big).count();
    eprintln!(
        "64 KiB topic limit (exactly_once = {exactly_once}): {missing} of {} healthy missing, \
         {dead_healthy} healthy dead-lettered, {} dead letters of the big one, {resent} re-sent",
        healthy.len(),
        dead.len() - dead_healthy
    );
    assert_eq!(missing, 0, "healthy events missing\n{log}");
    assert_eq!(dead_healthy, 0, "healthy events dead-lettered\n{log}");
    assert!(
        !seen.contains_key(&big),
        "the oversized event was published"
    );
    let reasons: Vec<_> = dead
        .iter()
        .map(|r| r.header("outbox-relay.dlq.reason").unwrap_or(""))
        .collect();
    assert!(
        !reasons.is_empty() && reasons.iter().all(|r| *r == "too_large"),
        "the oversized event: {reasons:?}\n{log}"
    );
    let end = db.current_wal_lsn().await;
    wait_for(
        "the slot confirmed past the backlog",
        Duration::from_secs(30),
        || async { db.confirmed_flush_lsn().await >= end },
    )
    .await;
    assert!(relay.terminate(Duration::from_secs(30)).success());
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_topic_limit_dead_letters_only_the_event_over_it() {
    only_the_oversized_event_is_dead_lettered(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_topic_limit_dead_letters_only_the_event_over_it_in_exactly_once() {
    only_the_oversized_event_is_dead_lettered(true).await;
}

/// A topic whose timestamp window (`message.timestamp.before.max.ms`) is shorter than the
/// backlog's age refuses every record of it — several in a batch come back INVALID_RECORD
/// each, which alone would mean "dead-letter it". Nothing is wrong with the records: they wait
/// (blocked `record_timestamp`, `/readyz` red, the slot not confirmed past them), none is
/// dead-lettered, and once the window is widened every one arrives.
async fn a_backlog_older_than_its_topics_timestamp_window_waits(exactly_once: bool) {
    let db = TestDb::new().await;
    let (topic, dlq) = (db.topic("order"), format!("{}.dlq", db.topic_prefix));
    create_topic_with(&topic, 1, &[("message.timestamp.before.max.ms", "3000")]).await;
    create_topic(&dlq, 1).await;
    db.create_slot().await;
    let events: Vec<Event> = (0..200).map(|i| Event::new("order", "agg", 0, i)).collect();
    let mut client = db.client().await;
    for chunk in events.chunks(50) {
        insert_events(&mut client, chunk, true).await;
    }
    let end = db.current_wal_lsn().await;
    // Older than the window by the time the relay sends them.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let http = free_port();
    let listen = format!("127.0.0.1:{http}");
    let base = if exactly_once {
        exactly_once_env(&db)
    } else {
        db.relay_env()
    };
    let env = with(
        base,
        &[
            ("OUTBOX_RELAY__DEAD_LETTER__TOPIC", dlq.as_str()),
            ("OUTBOX_RELAY__HTTP__LISTEN", listen.as_str()),
        ],
    );
    let mut relay = RelayProcess::start(&env, &format!("timestamp_window_{}", db.name));
    let blocked = format!("reason=\"record_timestamp\",topic=\"{topic}\"");
    wait_for(
        "blocked record_timestamp on the topic, /readyz red",
        Duration::from_secs(60),
        || async {
            let metrics = http_get(http, "/metrics")
                .map(|(_, b)| b)
                .unwrap_or_default();
            let red = http_get(http, "/readyz").is_some_and(|(code, _)| code != 200);
            red && metrics.lines().any(|l| {
                l.starts_with("outbox_relay_kafka_blocked{")
                    && l.contains(&blocked)
                    && l.ends_with(" 1")
            })
        },
    )
    .await;
    // Refused for a while (several sessions' worth): nothing dead-lettered, nothing confirmed.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let log = relay.log_text();
    assert_eq!(
        high_watermark(&dlq),
        0,
        "healthy events dead-lettered\n{log}"
    );
    assert!(
        db.confirmed_flush_lsn().await < end,
        "the slot was confirmed past refused events\n{log}"
    );
    assert!(
        log.contains("message.timestamp.before.max.ms"),
        "no log line names the topic setting to change\n{log}"
    );
    assert!(relay.try_status().is_none(), "the relay stopped\n{log}");

    // The operator's fix: a window wider than the backlog's age.
    use rdkafka::admin::{AdminOptions, AlterConfig, ResourceSpecifier};
    let widen = AlterConfig::new(ResourceSpecifier::Topic(&topic))
        .set("message.timestamp.before.max.ms", "86400000");
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    for r in admin().alter_configs(&[widen], &options).await.unwrap() {
        r.unwrap_or_else(|(_, e)| panic!("widen the window of {topic}: {e}"));
    }
    let ids: Vec<String> = events.iter().map(|e| e.id.clone()).collect();
    let got = read_ids(
        std::slice::from_ref(&topic),
        1,
        &ids,
        Duration::from_secs(120),
        Duration::from_secs(1),
    )
    .await;
    let t = tally(&events, &got);
    eprintln!(
        "timestamp window (exactly_once = {exactly_once}): {} events, {} missing, {} duplicates, {} dead letters",
        events.len(),
        t.missing.len(),
        t.duplicates,
        high_watermark(&dlq)
    );
    assert_eq!(
        t.missing.len(),
        0,
        "events missing after the fix\n{}",
        relay.log_text()
    );
    assert_eq!(
        high_watermark(&dlq),
        0,
        "events dead-lettered\n{}",
        relay.log_text()
    );
    wait_for(
        "the slot confirmed past the backlog",
        Duration::from_secs(30),
        || async { db.confirmed_flush_lsn().await >= end },
    )
    .await;
    assert!(relay.terminate(Duration::from_secs(30)).success());
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_backlog_older_than_its_topics_timestamp_window_waits_and_none_is_dead_lettered() {
    a_backlog_older_than_its_topics_timestamp_window_waits(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_backlog_older_than_its_topics_timestamp_window_waits_in_exactly_once_too() {
    a_backlog_older_than_its_topics_timestamp_window_waits(true).await;
}
