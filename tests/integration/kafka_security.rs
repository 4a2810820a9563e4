//! Kafka as production clusters run it (issue 19): a SASL/PLAIN broker with the KRaft
//! StandardAuthorizer, nothing allowed without an ACL, no topic auto-creation
//! (`scripts/services.sh kafka-acl-start`, started on demand by [`AclBroker::start`]).
//!
//! A missing ACL or topic is an operator's problem, not a bad record: the relay blocks (keeps
//! the records, confirms nothing past the first blocked one, turns `/readyz` red, raises
//! `outbox_relay_kafka_blocked{reason,topic}` and logs the `kafka-acls` command that fixes it),
//! and resumes by itself once the operator acts. Records of other topics keep flowing
//! meanwhile (at-least-once).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::acl::{transactional_id, AclBroker};
use crate::common::probe::{free_port, http_get};
use crate::common::*;
use tokio_postgres::Client;

/// How soon `/readyz` must turn red once a record is blocked (issue 19, done-when 1).
const READY_RED_WITHIN: Duration = Duration::from_secs(10);
/// How soon a topic's records must be in Kafka while another topic is missing (done-when 3).
const OTHERS_FLOW_WITHIN: Duration = Duration::from_secs(5);
const DELIVERY_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a blocked phase is watched before the operator acts: longer than the relay's own
/// wait for a topic's metadata (10 s at main 41fecb1, after which it dead-lettered). The
/// default `kafka.message_timeout_ms` (300 s) stays: a shorter one changes how a relay fails
/// (a session restart on MessageTimedOut) and hid that dead-lettering.
const BLOCKED_HOLD: Duration = Duration::from_secs(15);
/// The consumer group of the relay's exactly-once progress reader (`src/sink/progress.rs`).
const PROGRESS_GROUP: &str = "outbox-relay-progress";

/// A relay logged in to the ACL broker as user relay, with its HTTP port.
struct Relay {
    process: RelayProcess,
    http: u16,
}

impl Relay {
    fn start(broker: &AclBroker, db: &TestDb, extra: &[(&str, &str)], name: &str) -> Relay {
        let http = free_port();
        let listen = format!("127.0.0.1:{http}");
        let mut env = broker.relay_env(db);
        let extra = extra
            .iter()
            .copied()
            .chain([("OUTBOX_RELAY__HTTP__LISTEN", listen.as_str())]);
        for (key, value) in extra {
            env.retain(|(k, _)| k != key);
            env.push((key.to_string(), value.to_string()));
        }
        Relay {
            // One log per run (RelayProcess appends to an existing one).
            process: RelayProcess::start(&env, &format!("{name}_{}", db.name)),
            http,
        }
    }

    fn readyz(&self) -> Option<u16> {
        http_get(self.http, "/readyz").map(|(code, _)| code)
    }

    fn metrics(&self) -> String {
        http_get(self.http, "/metrics")
            .map(|(_, body)| body)
            .unwrap_or_default()
    }

    /// Fails (with the log) when the relay exited.
    fn assert_running(&mut self) {
        if let Some(status) = self.process.try_status() {
            panic!("relay exited with {status}:\n{}", self.process.log_text());
        }
    }

    /// Waits until `/readyz` answers 200 (`green`) or, when not `green`, anything else.
    async fn wait_readyz(&mut self, green: bool, timeout: Duration, what: &str) -> Duration {
        let began = Instant::now();
        loop {
            self.assert_running();
            let code = self.readyz();
            if (code == Some(200)) == green && code.is_some() {
                return began.elapsed();
            }
            assert!(
                began.elapsed() < timeout,
                "{what}: /readyz answered {code:?} for {timeout:?}\n{}",
                self.process.log_text()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until `/metrics` has `outbox_relay_kafka_blocked{…} 1` with `reason` and (when
    /// given) `topic`; returns the line.
    async fn wait_blocked(
        &mut self,
        reason: &str,
        topic: Option<&str>,
        timeout: Duration,
    ) -> String {
        let began = Instant::now();
        loop {
            self.assert_running();
            let body = self.metrics();
            if let Some(line) = blocked_line(&body, reason, topic) {
                return line;
            }
            assert!(
                began.elapsed() < timeout,
                "no outbox_relay_kafka_blocked{{reason=\"{reason}\",topic={topic:?}}} 1 within \
                 {timeout:?}; the blocked series:\n{}\nlog:\n{}",
                body.lines()
                    .filter(|l| l.starts_with("outbox_relay_kafka_blocked"))
                    .collect::<Vec<_>>()
                    .join("\n"),
                self.process.log_text()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The relay's log says what is blocked and how to grant it: names `what` and gives the
    /// `kafka-acls` command.
    fn assert_log_names(&self, what: &str) {
        let log = self.process.log_text();
        let names = log
            .lines()
            .any(|l| l.contains(what) && l.contains("kafka-acls"));
        assert!(
            names,
            "no log line names {what} together with the kafka-acls command that grants it:\n{log}"
        );
    }

    /// The three signals of a blocked phase: `/readyz` red within [`READY_RED_WITHIN`] of the
    /// writes (`watch`), `outbox_relay_kafka_blocked{reason, topic} 1` and, when `names` is
    /// given, a log line naming it with the `kafka-acls` command that grants it.
    async fn assert_blocked(
        &mut self,
        watch: &ReadyWatch,
        what: &str,
        (reason, topic): (&str, Option<&str>),
        names: Option<&str>,
    ) {
        watch.assert_red_within(READY_RED_WITHIN, self, what).await;
        let line = self
            .wait_blocked(reason, topic, Duration::from_secs(10))
            .await;
        println!("blocked: {line}");
        if let Some(names) = names {
            self.assert_log_names(names);
        }
    }

    /// No `outbox_relay_kafka_blocked` series is 1 any more.
    fn assert_not_blocked(&self) {
        let body = self.metrics();
        let still: Vec<&str> = body
            .lines()
            .filter(|l| l.starts_with("outbox_relay_kafka_blocked{"))
            .filter(|l| {
                l.rsplit_once(' ')
                    .and_then(|(_, v)| v.trim().parse::<f64>().ok())
                    == Some(1.0)
            })
            .collect();
        assert!(still.is_empty(), "still blocked once ready: {still:?}");
    }

    fn assert_log_contains(&self, text: &str) {
        let log = self.process.log_text();
        assert!(log.contains(text), "the relay's log lacks {text:?}:\n{log}");
    }

    async fn stop(mut self) {
        let status = self.process.terminate(Duration::from_secs(30));
        assert!(
            status.success(),
            "relay exited with {status} on SIGTERM:\n{}",
            self.process.log_text()
        );
    }
}

/// Polls `/readyz` every 100 ms from its start, and remembers when it first answered anything
/// but 200: so that a test can check the other promises first and this one still to the
/// second.
struct ReadyWatch {
    first_red: Arc<Mutex<Option<Duration>>>,
    stop: Arc<AtomicBool>,
}

impl ReadyWatch {
    fn start(http: u16) -> ReadyWatch {
        let first_red = Arc::new(Mutex::new(None));
        let stop = Arc::new(AtomicBool::new(false));
        let (seen, stopped) = (first_red.clone(), stop.clone());
        std::thread::spawn(move || {
            let began = Instant::now();
            while !stopped.load(Ordering::Relaxed) {
                let code = http_get(http, "/readyz").map(|(code, _)| code);
                if code.is_some_and(|c| c != 200) {
                    seen.lock().unwrap().get_or_insert(began.elapsed());
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        ReadyWatch { first_red, stop }
    }

    /// Fails unless `/readyz` turned red within `within` of the watch's start (waiting for
    /// that moment if it has not come yet).
    async fn assert_red_within(&self, within: Duration, relay: &mut Relay, what: &str) {
        let began = Instant::now();
        loop {
            relay.assert_running();
            if let Some(after) = *self.first_red.lock().unwrap() {
                println!("{what}: /readyz red {after:?} after the writes");
                assert!(
                    after <= within,
                    "{what}: /readyz turned red only {after:?} after the writes (limit {within:?})"
                );
                return;
            }
            assert!(
                began.elapsed() < within,
                "{what}: /readyz still 200 (or silent) {within:?} and more after the writes\n{}",
                relay.process.log_text()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for ReadyWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// The `outbox_relay_kafka_blocked` series with value 1 whose labels hold `reason` and `topic`
/// (in any order, other labels allowed).
fn blocked_line(body: &str, reason: &str, topic: Option<&str>) -> Option<String> {
    body.lines()
        .filter(|l| l.starts_with("outbox_relay_kafka_blocked{"))
        .find(|l| {
            let Some((labels, value)) = l.rsplit_once(' ') else {
                return false;
            };
            value.trim().parse::<f64>().ok() == Some(1.0)
                && labels.contains(&format!("reason=\"{reason}\""))
                && topic.is_none_or(|t| labels.contains(&format!("topic=\"{t}\"")))
        })
        .map(str::to_string)
}

fn ids(events: &[Event]) -> Vec<String> {
    events.iter().map(|e| e.id.clone()).collect()
}

fn events(aggregate_type: &str, aggregate_id: &str, n: usize) -> Vec<Event> {
    (0..n)
        .map(|i| Event::new(aggregate_type, aggregate_id, 0, i))
        .collect()
}

/// Writes `a` and `b` in alternating transactions of `per_txn`, an `a` one first. Returns the
/// LSN before the commit of the first transaction (see [`insert_events_at`]).
async fn write_interleaved(client: &mut Client, a: &[Event], b: &[Event], per_txn: usize) -> u64 {
    let mut first = None;
    for (ca, cb) in a.chunks(per_txn).zip(b.chunks(per_txn)) {
        let lsn = insert_events_at(client, ca, true).await;
        first.get_or_insert(lsn);
        insert_events(client, cb, true).await;
    }
    first.expect("events to write")
}

/// What every test here starts from: the ACL broker, and a database of its own with the
/// relay's slot made.
struct Scene {
    broker: AclBroker,
    db: TestDb,
}

impl Scene {
    async fn start() -> Scene {
        Scene::start_after("").await
    }

    /// With `sql` run on the database before the slot is made.
    async fn start_after(sql: &str) -> Scene {
        let broker = AclBroker::start().await;
        let db = TestDb::new().await;
        if !sql.is_empty() {
            db.client().await.batch_execute(sql).await.unwrap();
        }
        db.create_slot().await;
        Scene { broker, db }
    }

    /// This test's topic `name`, made with one partition.
    async fn topic(&self, name: &str) -> String {
        let topic = self.db.topic(name);
        self.broker.create_topic(&topic, 1).await;
        topic
    }

    /// A relay with `extra` settings (see [`Relay::start`]), streaming from the slot.
    async fn relay(&self, extra: &[(&str, &str)], name: &str) -> Relay {
        let mut relay = Relay::start(&self.broker, &self.db, extra, name);
        wait_for_slot(&self.db, &mut relay.process).await;
        relay
    }

    /// Reads `events` from `topics` on the ACL broker and fails when any is missing; with
    /// `exactly_once` also on duplicates (the reader is read_committed).
    async fn delivered(
        &self,
        label: &str,
        (topics, events): (&[&String], &[Event]),
        exactly_once: bool,
        relay: &Relay,
    ) -> Vec<Received> {
        let topics: Vec<String> = topics.iter().map(|t| t.to_string()).collect();
        let received = self
            .broker
            .read_ids(
                &topics,
                1,
                &ids(events),
                DELIVERY_TIMEOUT,
                Duration::from_secs(2),
            )
            .await;
        let t = assert_none_missing(label, events, &received, &relay.process.log_text());
        if exactly_once {
            assert_eq!(
                t.duplicates, 0,
                "{label}: duplicates for a read_committed reader"
            );
        }
        received
    }

    /// Watches a blocked phase until `until`: the relay keeps running, the slot stays below
    /// `lsn` (a position inside the first blocked transaction, before its commit), and the
    /// topics in `empty` get no record. Fails at the first breach.
    async fn held(
        &self,
        relay: &mut Relay,
        until: Instant,
        (lsn, what): (u64, &str),
        empty: &[(&str, &str)],
    ) {
        let (broker, db) = (&self.broker, &self.db);
        loop {
            relay.assert_running();
            for (topic, breach) in empty {
                let n = broker.record_count(topic).await;
                assert_eq!(
                    n,
                    0,
                    "{breach}: {n} records in {topic}\n{}",
                    relay.process.log_text()
                );
            }
            let confirmed = db.confirmed_flush_lsn().await;
            if confirmed >= lsn {
                let mut meanwhile = String::new();
                for (topic, _) in empty {
                    let n = broker.record_count(topic).await;
                    meanwhile.push_str(&format!("; {n} records in {topic}"));
                }
                panic!(
                    "the slot was confirmed to {confirmed:X}, past {what} (its commit is after \
                     {lsn:X}){meanwhile}\n{}",
                    relay.process.log_text()
                );
            }
            if Instant::now() >= until {
                return;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// Waits until the slot is confirmed to the end of the WAL as it is now.
    async fn confirmed(&self, relay: &Relay) {
        let end = self.db.current_wal_lsn().await;
        let began = Instant::now();
        while self.db.confirmed_flush_lsn().await < end {
            assert!(
                began.elapsed() < Duration::from_secs(30),
                "the slot did not reach {end:X} within 30 s of delivery:\n{}",
                relay.process.log_text()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// After the operator's fix: `/readyz` green again, nothing blocked any more, the slot
    /// confirmed to the end of the WAL.
    async fn recovered(&self, relay: &mut Relay) {
        relay
            .wait_readyz(true, Duration::from_secs(30), "after the grant")
            .await;
        relay.assert_not_blocked();
        self.confirmed(relay).await;
    }

    /// Stops the relay (it must exit cleanly) and drops the database.
    async fn finish(self, relay: Relay) {
        relay.stop().await;
        self.db.cleanup().await;
    }

    /// The settings of a delivery mode, for [`Relay::start`]: none for at-least-once; for
    /// exactly-once the mode and its progress topic, made and granted with what a
    /// transactional relay needs besides its events' topics: READ and WRITE on the progress
    /// topic, READ on the progress reader's group and, when `with_transactional_id`, WRITE and
    /// DESCRIBE on its transactional id.
    async fn delivery(
        &self,
        exactly_once: bool,
        with_transactional_id: bool,
    ) -> Vec<(&'static str, String)> {
        if !exactly_once {
            return vec![];
        }
        let (broker, db) = (&self.broker, &self.db);
        let progress = db.topic("progress");
        broker
            .create_topic_with(&progress, 1, &[("cleanup.policy", "compact")])
            .await;
        broker.grant_read_write(&progress).await;
        broker.grant_group_read(PROGRESS_GROUP).await;
        if with_transactional_id {
            broker
                .grant_transactional_id(&transactional_id(db).await)
                .await;
        }
        vec![
            ("OUTBOX_RELAY__KAFKA__DELIVERY", "exactly_once".to_string()),
            ("OUTBOX_RELAY__KAFKA__PROGRESS_TOPIC", progress),
        ]
    }
}

/// Borrows owned settings as [`Relay::start`] takes them.
fn settings<'a>(owned: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
    owned.iter().map(|(k, v)| (*k, v.as_str())).collect()
}

fn mode_label(exactly_once: bool) -> &'static str {
    if exactly_once {
        "exactly_once"
    } else {
        "at_least_once"
    }
}

/// The baseline: with the ACLs docs/src/guides/kafka.md#locked-down-kafka-and-topic-creation names, and no more, both delivery modes deliver
/// everything, also after a restart. At-least-once: WRITE on the events' topics. Exactly-once:
/// also READ+WRITE on the progress topic, READ on the group `outbox-relay-progress` and
/// WRITE+DESCRIBE on the transactional id.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn documented_acls_are_enough_for_both_delivery_modes() {
    for exactly_once in [false, true] {
        let s = Scene::start().await;
        let (order, customer) = (s.topic("order").await, s.topic("customer").await);
        s.broker.grant_write(&[&order, &customer]).await;
        let delivery = s.delivery(exactly_once, true).await;
        let label = mode_label(exactly_once);
        let extra = settings(&delivery);
        let mut relay = s.relay(&extra, &format!("acl_baseline_{label}")).await;
        let (a, b) = (events("order", "o", 100), events("customer", "c", 100));
        let mut client = s.db.client().await;
        write_interleaved(&mut client, &a, &b, 10).await;
        let mut all: Vec<Event> = a.iter().chain(&b).cloned().collect();
        let label_1 = format!("documented ACLs, {label}");
        s.delivered(&label_1, (&[&order, &customer], &all), exactly_once, &relay)
            .await;
        s.confirmed(&relay).await;
        relay
            .wait_readyz(true, Duration::from_secs(10), label)
            .await;
        relay.stop().await;
        // A second start reads the progress record (exactly-once): READ on it is enough.
        let more = events("order", "o2", 20);
        insert_events(&mut client, &more, true).await;
        all.extend(more);
        let relay = s.relay(&extra, &format!("acl_baseline_{label}_2")).await;
        let label_2 = format!("documented ACLs, {label}, after a restart");
        s.delivered(&label_2, (&[&order, &customer], &all), exactly_once, &relay)
            .await;
        if exactly_once {
            relay.assert_log_contains("transactions below the progress record are skipped");
        }
        s.finish(relay).await;
    }
}

/// Done-when 1: a topic the relay may not write. Its events are neither dead-lettered nor
/// confirmed; other topics flow; once WRITE is granted every event arrives in its own topic.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn missing_write_acl_blocks_instead_of_dead_lettering() {
    let s = Scene::start().await;
    let (a_topic, b_topic, dlq) = (
        s.topic("order").await,
        s.topic("customer").await,
        s.topic("dlq").await,
    );
    // The operator's slip: WRITE on B and the dead-letter topic, not on A.
    s.broker.grant_write(&[&b_topic, &dlq]).await;
    let dead_letter = [("OUTBOX_RELAY__DEAD_LETTER__TOPIC", dlq.as_str())];
    let mut relay = s.relay(&dead_letter, "acl_missing_write").await;
    relay
        .wait_readyz(true, Duration::from_secs(30), "before any blocked record")
        .await;

    let (a, b) = (events("order", "a", 200), events("customer", "b", 200));
    let mut client = s.db.client().await;
    let watch = ReadyWatch::start(relay.http);
    let written = Instant::now();
    let first_a = write_interleaved(&mut client, &a, &b, 20).await;

    s.delivered("B while A is blocked", (&[&b_topic], &b), false, &relay)
        .await;
    let dead_lettered = "A's events were dead-lettered: a missing ACL is a deployment error";
    s.held(
        &mut relay,
        written + BLOCKED_HOLD,
        (first_a, "A's first event"),
        &[
            (&dlq, dead_lettered),
            (&a_topic, "A got records without WRITE"),
        ],
    )
    .await;
    let blocked = ("topic_authorization", Some(a_topic.as_str()));
    relay
        .assert_blocked(&watch, "A blocked", blocked, Some(&a_topic))
        .await;

    // The operator grants it; the relay resumes by itself.
    s.broker.grant_write(&[&a_topic]).await;
    let received = s
        .delivered("A after the grant", (&[&a_topic], &a), false, &relay)
        .await;
    assert!(received.iter().all(|r| r.topic == a_topic));
    s.recovered(&mut relay).await;
    assert_eq!(
        s.broker.record_count(&dlq).await,
        0,
        "dead letters after the grant"
    );
    s.finish(relay).await;
}

/// Issue 39: a topic the relay may describe but not write. The metadata checks pass and the
/// refusal shows only when records are sent (TOPIC_AUTHORIZATION_FAILED in the delivery
/// report). It holds that topic alone: no session restart per refusal, so the healthy topic's
/// events are not sent again (at main 51bd1e8: 3,090 sends for 2,960 events), none is
/// dead-lettered, the slot stays before the first refused event; after the grant every
/// refused event arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn write_refused_at_produce_time_holds_only_that_topic() {
    let s = Scene::start().await;
    let (a_topic, b_topic, dlq) = (
        s.topic("order").await,
        s.topic("customer").await,
        s.topic("dlq").await,
    );
    s.broker.grant_write(&[&b_topic, &dlq]).await;
    // DESCRIBE on A, not WRITE: the refusal shows only when records are sent.
    let principal = s.broker.relay_principal();
    s.broker
        .acl_command(&[
            "--add",
            "--allow-principal",
            &principal,
            "--operation",
            "Describe",
            "--topic",
            &a_topic,
        ])
        .await;
    let dead_letter = [("OUTBOX_RELAY__DEAD_LETTER__TOPIC", dlq.as_str())];
    let mut relay = s.relay(&dead_letter, "acl_produce_refused").await;
    let (a, b) = (events("order", "a", 300), events("customer", "b", 3_000));
    let mut client = s.db.client().await;
    let watch = ReadyWatch::start(relay.http);
    let written = Instant::now();
    let mut first_a = None;
    for (ca, cb) in a.chunks(1).zip(b.chunks(10)) {
        insert_events(&mut client, cb, true).await;
        let lsn = insert_events_at(&mut client, ca, true).await;
        first_a.get_or_insert(lsn);
    }
    let received = s
        .delivered("B while A refuses writes", (&[&b_topic], &b), false, &relay)
        .await;
    let sent_again = tally(&b, &received).duplicates;
    println!(
        "B: {} events, {sent_again} sent again while A refused writes",
        b.len()
    );
    assert!(
        sent_again <= 100,
        "{sent_again} of B's events sent again while A refused writes\n{}",
        relay.process.log_text()
    );
    let dead_lettered = "A's events were dead-lettered: a refused write is a deployment error";
    s.held(
        &mut relay,
        written + Duration::from_secs(5),
        (first_a.unwrap(), "A's first event"),
        &[
            (&dlq, dead_lettered),
            (&a_topic, "A got records without WRITE"),
        ],
    )
    .await;
    let blocked = ("topic_authorization", Some(a_topic.as_str()));
    relay
        .assert_blocked(&watch, "A refused at produce time", blocked, None)
        .await;
    let restarts = relay
        .process
        .log_text()
        .matches("relay session ended")
        .count();
    assert_eq!(
        restarts,
        0,
        "the session restarted on a refused write\n{}",
        relay.process.log_text()
    );

    s.broker.grant_write(&[&a_topic]).await;
    let received = s
        .delivered("A after the grant", (&[&a_topic], &a), false, &relay)
        .await;
    assert_eq!(tally(&a, &received).duplicates, 0, "A's events sent twice");
    let order: Vec<String> = received.iter().map(Received::key_str).collect();
    assert_eq!(order, ids(&a), "A's events out of their commit order");
    relay
        .wait_readyz(true, Duration::from_secs(30), "after the grant")
        .await;
    s.confirmed(&relay).await;
    assert_eq!(s.broker.record_count(&dlq).await, 0, "dead letters");
    s.finish(relay).await;
}

/// WRITE on A revoked while the relay writes it (issue 50, points 6 and 9): the gap-less
/// producer meets the refusal, which is fatal to it; the session restarts and its gate holds
/// A (the probe producer finds the refusal) while B goes on. After the grant every event of A
/// arrives once at least, in its commit order, stamped with its commit time — not with the time
/// it was released (a refused record's delivery report carries no timestamp, and held records
/// made from reports went out stamped anew).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn write_revoked_mid_stream_holds_that_topic_and_keeps_order_and_timestamps() {
    let s = Scene::start().await;
    let (a_topic, b_topic, dlq) = (
        s.topic("order").await,
        s.topic("customer").await,
        s.topic("dlq").await,
    );
    s.broker.grant_write(&[&a_topic, &b_topic, &dlq]).await;
    let dead_letter = [("OUTBOX_RELAY__DEAD_LETTER__TOPIC", dlq.as_str())];
    let relay = s.relay(&dead_letter, "acl_revoked_mid_stream").await;
    let (a, b) = (events("order", "a", 400), events("customer", "b", 400));
    let mut client = s.db.client().await;
    write_interleaved(&mut client, &a[..100], &b[..100], 10).await;
    s.delivered(
        "A before the revoke",
        (&[&a_topic], &a[..100]),
        false,
        &relay,
    )
    .await;
    s.broker.revoke_write(&[&a_topic]).await;
    write_interleaved(&mut client, &a[100..], &b[100..], 10).await;
    s.delivered(
        "B while A's WRITE is revoked",
        (&[&b_topic], &b),
        false,
        &relay,
    )
    .await;
    let granted_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    s.broker.grant_write(&[&a_topic]).await;
    let received = s
        .delivered("A after the grant", (&[&a_topic], &a), false, &relay)
        .await;
    let mut seen = std::collections::HashSet::new();
    let first_seen: Vec<String> = received
        .iter()
        .map(Received::key_str)
        .filter(|k| seen.insert(k.clone()))
        .collect();
    assert_eq!(first_seen, ids(&a), "A's events out of their commit order");
    let restamped: Vec<&Received> = received
        .iter()
        .filter(|r| r.timestamp_ms.is_none_or(|t| t >= granted_ms))
        .collect();
    println!(
        "A: {} records for {} events, {} stamped at or after the grant",
        received.len(),
        a.len(),
        restamped.len()
    );
    assert!(
        restamped.is_empty(),
        "{} of A's records stamped at or after the grant (their commit was before it)",
        restamped.len()
    );
    s.confirmed(&relay).await;
    assert_eq!(s.broker.record_count(&dlq).await, 0, "dead letters");
    s.finish(relay).await;
}

/// Done-when 1, the dead-letter topic: a poison row whose dead letter may not be written
/// blocks (nothing confirmed past it) until the ACL is granted; then it is in the dead-letter
/// topic and its neighbours in theirs.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dead_letter_topic_without_acl_blocks() {
    let s = Scene::start_after("ALTER TABLE outbox ALTER COLUMN aggregatetype DROP NOT NULL").await;
    let (order, dlq) = (s.topic("order").await, s.topic("dlq").await);
    s.broker.grant_write(&[&order]).await;
    let dead_letter = [("OUTBOX_RELAY__DEAD_LETTER__TOPIC", dlq.as_str())];
    let mut relay = s.relay(&dead_letter, "acl_dead_letter").await;
    relay
        .wait_readyz(true, Duration::from_secs(30), "before the poison row")
        .await;

    let mut client = s.db.client().await;
    let before = events("order", "p", 50);
    let watch = ReadyWatch::start(relay.http);
    let written = Instant::now();
    insert_events(&mut client, &before, true).await;
    let (poison, poison_lsn) = insert_poison_at(&mut client).await;
    let after: Vec<Event> = (0..50)
        .map(|i| Event::new("order", "p", 0, 100 + i))
        .collect();
    insert_events(&mut client, &after, true).await;

    s.held(
        &mut relay,
        written + BLOCKED_HOLD,
        (poison_lsn, "the poison row"),
        &[(&dlq, "a dead letter without WRITE")],
    )
    .await;
    s.delivered("before the poison row", (&[&order], &before), false, &relay)
        .await;
    let blocked = ("topic_authorization", Some(dlq.as_str()));
    relay
        .assert_blocked(&watch, "dead-letter topic blocked", blocked, Some(&dlq))
        .await;

    s.broker.grant_write(&[&dlq]).await;
    let dead = s
        .broker
        .read_ids(
            std::slice::from_ref(&dlq),
            1,
            std::slice::from_ref(&poison),
            DELIVERY_TIMEOUT,
            Duration::from_secs(1),
        )
        .await;
    assert!(
        dead.iter().any(|r| r.key_str() == poison),
        "the dead letter is not in {dlq} after the grant: {dead:?}\n{}",
        relay.process.log_text()
    );
    let neighbours: Vec<Event> = before.iter().chain(&after).cloned().collect();
    let label = "the poison row's neighbours";
    s.delivered(label, (&[&order], &neighbours), false, &relay)
        .await;
    s.recovered(&mut relay).await;
    s.finish(relay).await;
}

/// Done-when 1, exactly-once: without an ACL on its transactional id the relay publishes
/// nothing and confirms nothing, says why, and after the grant delivers every event exactly
/// once to a read_committed reader.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn transactional_id_without_acl_blocks_exactly_once() {
    let s = Scene::start().await;
    let (order, customer) = (s.topic("order").await, s.topic("customer").await);
    s.broker.grant_write(&[&order, &customer]).await;
    let delivery = s.delivery(true, false).await;
    let progress = delivery[1].1.clone();
    let tid = transactional_id(&s.db).await;

    let mut client = s.db.client().await;
    let (a, b) = (events("order", "o", 100), events("customer", "c", 100));
    let first = write_interleaved(&mut client, &a, &b, 10).await;
    let started = Instant::now();
    let mut relay = Relay::start(
        &s.broker,
        &s.db,
        &settings(&delivery),
        "acl_transactional_id",
    );
    let watch = ReadyWatch::start(relay.http);
    let published = "published without the transactional id's ACL";
    s.held(
        &mut relay,
        started + BLOCKED_HOLD,
        (first, "the first transaction"),
        &[
            (&order, published),
            (&customer, published),
            (&progress, published),
        ],
    )
    .await;
    let blocked = ("transactional_id_authorization", None);
    relay
        .assert_blocked(&watch, "no transactional id ACL", blocked, Some(&tid))
        .await;

    s.broker.grant_transactional_id(&tid).await;
    let all: Vec<Event> = a.iter().chain(&b).cloned().collect();
    s.delivered(
        "after the grant",
        (&[&order, &customer], &all),
        true,
        &relay,
    )
    .await;
    s.recovered(&mut relay).await;
    s.finish(relay).await;
}

/// Done-when 2: topic creation on, a group for `outbox\.event\.billing.*` with 6 partitions and
/// a retention: the first event of a new aggregate type makes its topic with those settings,
/// and the events arrive in order per aggregate.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn topic_creation_group_sets_partitions_and_retention() {
    const AGGREGATES: usize = 8;
    const PER_AGGREGATE: usize = 25;
    let s = Scene::start().await;
    let aggregate_type = random_name("billing");
    let topic = format!("outbox.event.{aggregate_type}");
    // CREATE (and WRITE) on the billing topics only: the cluster-wide CREATE is not needed.
    s.broker.grant_create_prefixed("outbox.event.billing").await;
    assert_eq!(
        s.broker.partition_count(&topic).await,
        None,
        "{topic} exists already"
    );
    let config = write_config(
        &format!("acl_topic_creation_{}", s.db.name),
        r#"
[kafka.topic_creation]
enabled = true
partitions = 1

[[kafka.topic_creation.groups]]
match = 'outbox\.event\.billing.*'
partitions = 6
configs = { "retention.ms" = "3600000" }
"#,
    );
    let config = config.display().to_string();
    let extra = [
        ("OUTBOX_RELAY_CONFIG", config.as_str()),
        (
            "OUTBOX_RELAY__OUTBOX__TOPIC",
            "outbox.event.{aggregatetype}",
        ),
    ];
    let relay = s.relay(&extra, "acl_topic_creation").await;

    // Aggregates interleaved within and across transactions; the payload's seq is the
    // aggregate's own sequence.
    let mut client = s.db.client().await;
    let mut written: Vec<Event> = Vec::new();
    for round in 0..PER_AGGREGATE / 5 {
        let batch: Vec<Event> = (0..5)
            .flat_map(|k| (0..AGGREGATES).map(move |agg| (round * 5 + k, agg)))
            .map(|(seq, agg)| Event::new(&aggregate_type, &format!("acct-{agg}"), agg, seq))
            .collect();
        insert_events(&mut client, &batch, true).await;
        written.extend(batch);
    }
    let received = s
        .broker
        .read_ids(
            std::slice::from_ref(&topic),
            6,
            &ids(&written),
            DELIVERY_TIMEOUT,
            Duration::from_secs(2),
        )
        .await;
    let t = tally(&written, &received);
    assert!(
        t.missing.is_empty(),
        "{} of {} events missing from {topic}\n{}",
        t.missing.len(),
        written.len(),
        relay.process.log_text()
    );
    assert_eq!(
        s.broker.partition_count(&topic).await,
        Some(6),
        "{topic} was not created with the group's partition count"
    );
    let configs = s.broker.topic_configs(&topic).await;
    assert_eq!(
        configs.get("retention.ms").cloned().flatten().as_deref(),
        Some("3600000"),
        "{topic}'s retention.ms is not the group's"
    );

    assert_eq!(t.duplicates, 0, "duplicates without any restart");
    // Per aggregate: one partition, and its sequence 0, 1, 2, … in offset order.
    let mut by_partition: BTreeMap<i32, Vec<&Received>> = BTreeMap::new();
    for r in &received {
        by_partition.entry(r.partition).or_default().push(r);
    }
    let mut partition_of: HashMap<String, i32> = HashMap::new();
    let mut next: HashMap<String, u64> = HashMap::new();
    for records in by_partition.values_mut() {
        records.sort_by_key(|r| r.offset);
        for r in records.iter() {
            let aggregate = r
                .header("aggregateid")
                .expect("aggregateid header")
                .to_string();
            let p = *partition_of.entry(aggregate.clone()).or_insert(r.partition);
            assert_eq!(
                p, r.partition,
                "{aggregate} is in partitions {p} and {}",
                r.partition
            );
            let payload: serde_json::Value =
                serde_json::from_slice(r.payload.as_deref().unwrap()).unwrap();
            let seq = payload["seq"].as_u64().unwrap();
            let want = next.entry(aggregate.clone()).or_insert(0);
            assert_eq!(seq, *want, "{aggregate} out of order in partition {p}");
            *want += 1;
        }
    }
    assert_eq!(partition_of.len(), AGGREGATES);
    s.finish(relay).await;
}

/// Done-when 3: creation off, topic A missing. At-least-once: B's events committed afterwards
/// are in Kafka within 5 s; once A is created all of A's events arrive; nothing missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn missing_topic_does_not_stop_other_topics_at_least_once() {
    missing_topic_does_not_stop_other_topics(false).await;
}

/// Done-when 3 in exactly-once mode: B may wait for A (one Kafka transaction holds both), but
/// once A is created nothing is missing and nothing duplicated for a read_committed reader.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn missing_topic_does_not_stop_other_topics_exactly_once() {
    missing_topic_does_not_stop_other_topics(true).await;
}

async fn missing_topic_does_not_stop_other_topics(exactly_once: bool) {
    let label = mode_label(exactly_once);
    let s = Scene::start().await;
    let a_topic = s.db.topic("order");
    let b_topic = s.topic("customer").await;
    // WRITE on both: A is missing, not forbidden.
    s.broker.grant_write(&[&a_topic, &b_topic]).await;
    let delivery = s.delivery(exactly_once, true).await;
    let mut relay = s
        .relay(&settings(&delivery), &format!("acl_missing_topic_{label}"))
        .await;

    let mut client = s.db.client().await;
    let a = events("order", "a", 100);
    for chunk in a.chunks(10) {
        insert_events(&mut client, chunk, true).await;
    }
    let b = events("customer", "b", 100);
    for chunk in b.chunks(10) {
        insert_events(&mut client, chunk, true).await;
    }
    let committed = Instant::now();
    if !exactly_once {
        let received = s
            .broker
            .read_ids(
                std::slice::from_ref(&b_topic),
                1,
                &ids(&b),
                OTHERS_FLOW_WITHIN,
                Duration::ZERO,
            )
            .await;
        let t = tally(&b, &received);
        assert!(
            t.missing.is_empty(),
            "{} of B's {} events not in Kafka {:?} after their commit, while A is missing\n{}",
            t.missing.len(),
            b.len(),
            committed.elapsed(),
            relay.process.log_text()
        );
        println!(
            "{label}: B's events in Kafka {:?} after their commit",
            committed.elapsed()
        );
    }
    relay.assert_running();
    assert_eq!(
        s.broker.partition_count(&a_topic).await,
        None,
        "{a_topic} was created"
    );

    s.broker.create_topic(&a_topic, 1).await;
    let all: Vec<Event> = a.iter().chain(&b).cloned().collect();
    let label = format!("{label}, after A was created");
    s.delivered(&label, (&[&a_topic, &b_topic], &all), exactly_once, &relay)
        .await;
    s.confirmed(&relay).await;
    s.finish(relay).await;
}

/// A refused topic creation (creation on, no CREATE ACL) blocks with reason `topic_creation`
/// and names the topic; once CREATE is granted the relay makes the topic and delivers.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn refused_topic_creation_blocks_until_create_is_granted() {
    let s = Scene::start().await;
    let topic = s.db.topic("order");
    // WRITE, not CREATE: the creation is what is refused.
    s.broker.grant_write(&[&topic]).await;
    let creation = [("OUTBOX_RELAY__KAFKA__TOPIC_CREATION__ENABLED", "true")];
    let mut relay = s.relay(&creation, "acl_creation_refused").await;
    relay
        .wait_readyz(true, Duration::from_secs(30), "before any blocked record")
        .await;
    let mut client = s.db.client().await;
    let watch = ReadyWatch::start(relay.http);
    let written = Instant::now();
    let a = events("order", "a", 50);
    let first = insert_events_at(&mut client, &a[..10], true).await;
    for chunk in a[10..].chunks(10) {
        insert_events(&mut client, chunk, true).await;
    }
    let held = (first, "the first event");
    s.held(&mut relay, written + BLOCKED_HOLD, held, &[]).await;
    assert_eq!(
        s.broker.partition_count(&topic).await,
        None,
        "{topic} exists without CREATE"
    );
    let blocked = ("topic_creation", Some(topic.as_str()));
    relay
        .assert_blocked(&watch, "creation refused", blocked, Some(&topic))
        .await;

    s.broker.grant_create_prefixed(&topic).await;
    s.delivered("after CREATE was granted", (&[&topic], &a), false, &relay)
        .await;
    s.recovered(&mut relay).await;
    s.finish(relay).await;
}

/// A refused login (a wrong password) blocks with reason `authentication`: the relay keeps
/// running and retrying, confirms nothing, and `/readyz` is red.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn refused_login_blocks_with_reason_authentication() {
    let s = Scene::start().await;
    let topic = s.topic("order").await;
    s.broker.grant_write(&[&topic]).await;
    let wrong = test_logs_dir().join(random_name("acl-wrong-password-"));
    std::fs::write(&wrong, "not-the-password\n").unwrap();
    let wrong = wrong.display().to_string();
    let mut relay = Relay::start(
        &s.broker,
        &s.db,
        &[
            ("OUTBOX_RELAY__KAFKA__SASL_PASSWORD_FILE", &wrong),
            // SIGTERM at the end finds the records still in flight: drain them for 5 s, not
            // the default 30 s, which is the test harness's own SIGTERM limit.
            ("OUTBOX_RELAY__RELAY__SHUTDOWN_TIMEOUT_MS", "5000"),
        ],
        "acl_login_refused",
    );
    let watch = ReadyWatch::start(relay.http);
    let started = Instant::now();
    let mut client = s.db.client().await;
    let a = events("order", "a", 20);
    let first = insert_events_at(&mut client, &a, true).await;
    s.held(
        &mut relay,
        started + BLOCKED_HOLD,
        (first, "the first event"),
        &[(&topic, "published with a refused login")],
    )
    .await;
    let blocked = ("authentication", None);
    relay
        .assert_blocked(&watch, "login refused", blocked, None)
        .await;
    let log = relay.process.log_text();
    assert!(
        !log.contains(&s.broker.relay_password) && !log.contains("not-the-password"),
        "a SASL password reached the log"
    );
    s.finish(relay).await;
}
