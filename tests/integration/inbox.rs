//! The inbox consumer (`examples/inbox_consumer.rs`) end to end: the relay and the consumer are
//! both SIGKILLed while events are written, and the consumer's effect table still holds every
//! event exactly once. The relay's duplicates (at-least-once) and the consumer's re-reads after
//! a kill are absorbed by the inbox.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;
use rand::seq::SliceRandom;
use rand::Rng;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

const PARTITIONS: i32 = 3;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inbox_consumer_applies_every_event_once_while_relay_and_consumer_are_killed() {
    run_inbox(Run {
        events: 10_000,
        relay_kills: 5,
        consumer_kills: 3,
        key_column: None,
    })
    .await;
}

/// `key_column = "aggregateid"` (what `config --from-debezium` writes for Debezium's usual
/// set-up): the events of one aggregate (here: of one writer's transaction, 1 to 20 rows) share
/// one record key. A consumer deduplicating on the key would apply the first of each aggregate
/// and drop the others as duplicates; deduplicating on the event id (the `id` header), every
/// event is applied once, and the duplicates of the kills are still skipped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inbox_consumer_applies_every_event_of_an_aggregate_keyed_by_aggregate_id() {
    run_inbox(Run {
        events: 2_000,
        relay_kills: 1,
        consumer_kills: 1,
        key_column: Some("aggregateid"),
    })
    .await;
}

/// One inbox run: how many events, how many kills of each, and the relay's `key_column`.
struct Run {
    events: usize,
    relay_kills: usize,
    consumer_kills: usize,
    key_column: Option<&'static str>,
}

async fn run_inbox(run: Run) {
    let Run {
        events,
        relay_kills,
        consumer_kills,
        key_column,
    } = run;
    let started = Instant::now();
    let db = TestDb::new().await;
    let sink = ScratchDb::new().await;
    let topics = vec![db.topic("order"), db.topic("customer")];
    for topic in &topics {
        create_topic(topic, PARTITIONS).await;
    }
    db.create_slot().await;

    let mut relay_env = db.relay_env();
    if let Some(column) = key_column {
        relay_env.push(("OUTBOX_RELAY__OUTBOX__KEY_COLUMN".into(), column.into()));
    }
    let relay_log = format!("{}-inbox-relay", db.name);
    let mut relay = RelayProcess::start(&relay_env, &relay_log);
    wait_for_slot(&db, &mut relay).await;

    let consumer_bin = consumer_binary();
    let group = random_name("inbox-group");
    let consumer_args = vec![
        "--brokers".to_string(),
        brokers(),
        "--topics".into(),
        topics.join(","),
        "--group-id".into(),
        group.clone(),
        // Static membership: a restarted consumer takes its partitions back at once instead of
        // waiting for the dead member's session to time out.
        "--group-instance-id".into(),
        "inbox-test-consumer".into(),
        "--database-url".into(),
        sink.url.clone(),
    ];
    let consumer_log = format!("{}-inbox-consumer", db.name);
    let mut consumer = ConsumerProcess::start(&consumer_bin, &consumer_args, &consumer_log);

    // 4 writers, transactions of 1..=20 rows, a pause between them: about 10 s of writing, so
    // that the kills below land while events flow.
    let writer_db = db.clone();
    let writers = tokio::spawn(async move {
        write_concurrently(&writer_db, 4, events, 20, Duration::from_millis(40)).await
    });

    // The kills, in random order at random moments; each victim is restarted at once.
    let mut kills: Vec<&str> =
        [vec!["relay"; relay_kills], vec!["consumer"; consumer_kills]].concat();
    kills.shuffle(&mut rand::thread_rng());
    for (n, victim) in kills.iter().enumerate() {
        let pause = rand::thread_rng().gen_range(400..1400);
        tokio::time::sleep(Duration::from_millis(pause)).await;
        println!(
            "{:>5.1} s: kill -9 the {victim} ({}/{})",
            started.elapsed().as_secs_f64(),
            n + 1,
            kills.len()
        );
        if *victim == "relay" {
            relay.kill9();
            relay = RelayProcess::start(&relay_env, &relay_log);
            wait_for_slot(&db, &mut relay).await;
        } else {
            consumer.kill9();
            consumer = ConsumerProcess::start(&consumer_bin, &consumer_args, &consumer_log);
        }
    }
    let written: Vec<Event> = writers.await.unwrap().into_iter().flatten().collect();
    assert_eq!(written.len(), events);
    if key_column.is_some() {
        let mut per_aggregate: HashMap<&str, usize> = HashMap::new();
        for e in &written {
            *per_aggregate.entry(e.aggregate_id.as_str()).or_default() += 1;
        }
        let sharing: usize = per_aggregate.values().filter(|&&n| n > 1).sum();
        println!("{sharing} of {events} events share their key with another event");
        assert!(
            sharing > 0,
            "no two events share a key: the run proves nothing"
        );
    }
    println!(
        "{:>5.1} s: {events} events written, all kills done",
        started.elapsed().as_secs_f64()
    );

    // Settled means: the relay confirmed every write (so it will send nothing more), and the
    // consumer committed offsets up to the end of every partition (so it has applied or
    // skipped every record, duplicates included). Only then is the effect table final.
    let written_lsn = db.current_wal_lsn().await;
    wait_for(
        "the relay to confirm every written event",
        Duration::from_secs(60),
        || async { db.confirmed_flush_lsn().await >= written_lsn },
    )
    .await;
    let ends = high_watermarks(&topics).await;
    let records_on_topics: i64 = ends.values().sum();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let committed = committed_offsets(&group, &ends).await;
        if ends.iter().all(|(tp, end)| committed.get(tp) >= Some(end)) {
            break;
        }
        if let Some(status) = consumer.try_status() {
            panic!(
                "the consumer exited with {status}:\n{}",
                consumer.log_text()
            );
        }
        assert!(
            Instant::now() < deadline,
            "the consumer did not reach the end of the topics within 60 s: committed {committed:?}, ends {ends:?}\n{}",
            consumer.log_text()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // The effect table: exactly one row per written event, with the event's own data.
    let client = connect(&sink.url).await;
    let rows = client
        .query(
            "SELECT event_id, aggregate_id, event_type, payload FROM effects",
            &[],
        )
        .await
        .unwrap();
    let mut applied: HashMap<String, Vec<Effect>> = HashMap::new();
    for row in &rows {
        applied
            .entry(row.get(0))
            .or_default()
            .push((row.get(1), row.get(2), row.get(3)));
    }
    let inbox_rows: i64 = client
        .query_one("SELECT count(*) FROM inbox", &[])
        .await
        .unwrap()
        .get(0);
    let twice: Vec<&String> = applied
        .iter()
        .filter(|(_, v)| v.len() > 1)
        .map(|(id, _)| id)
        .collect();
    let missing: Vec<&str> = written
        .iter()
        .filter(|e| !applied.contains_key(&e.id))
        .map(|e| e.id.as_str())
        .collect();
    let written_ids: std::collections::HashSet<&str> =
        written.iter().map(|e| e.id.as_str()).collect();
    let unexpected = applied
        .keys()
        .filter(|id| !written_ids.contains(id.as_str()))
        .count();
    let (deliveries, skipped) = consumer_batches(&consumer.log_text());
    println!(
        "{events} events; {records_on_topics} records on the topics ({} duplicates from the relay); \
         the consumers logged {deliveries} records read, {skipped} skipped by the inbox; \
         effects: {} rows, {} distinct events, {} applied twice, {} missing, {unexpected} unexpected; \
         inbox: {inbox_rows} rows; {:.1} s",
        records_on_topics - events as i64,
        rows.len(),
        applied.len(),
        twice.len(),
        missing.len(),
        started.elapsed().as_secs_f64()
    );
    assert!(
        twice.is_empty(),
        "{} events applied more than once, e.g. {:?}",
        twice.len(),
        &twice[..twice.len().min(3)]
    );
    assert!(
        missing.is_empty(),
        "{} of {events} events never applied, e.g. {:?}\n{}",
        missing.len(),
        &missing[..missing.len().min(3)],
        consumer.log_text()
    );
    assert_eq!(unexpected, 0, "effects of events nobody wrote");
    assert_eq!(rows.len(), events);
    assert_eq!(inbox_rows, events as i64);
    for event in &written {
        let (aggregate_id, event_type, payload) = &applied[&event.id][0];
        assert_eq!(aggregate_id.as_deref(), Some(event.aggregate_id.as_str()));
        assert_eq!(event_type.as_deref(), Some(event.event_type.as_str()));
        assert_eq!(payload.as_deref(), Some(event.payload.as_bytes()));
    }

    // Both stop cleanly on SIGTERM.
    let status = consumer.terminate(Duration::from_secs(20));
    assert!(status.success(), "consumer exited with {status}");
    let status = relay.terminate(Duration::from_secs(20));
    assert!(status.success(), "relay exited with {status}");
    db.cleanup().await;
    sink.cleanup().await;
}

/// The example binary, built here when missing or older than its source (`cargo test
/// --all-targets` builds examples as test harnesses, not as the program). `--workspace`: the
/// features cargo unifies are then those of scripts/test.sh's `cargo test --workspace`, so only
/// the example itself is compiled, not 15 dependencies again beside running tests.
fn consumer_binary() -> PathBuf {
    let relay = PathBuf::from(env!("CARGO_BIN_EXE_outbox-relay"));
    let profile_dir = relay.parent().expect("the relay binary has a directory");
    let binary = profile_dir.join("examples").join("inbox_consumer");
    let modified = |p: &PathBuf| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let source = repo_path("examples/inbox_consumer.rs");
    if modified(&binary).is_none() || modified(&binary) < modified(&source) {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut build = Command::new(cargo);
        build
            .args(["build", "--workspace", "--example", "inbox_consumer"])
            .current_dir(repo_path(""));
        if profile_dir.ends_with("release") {
            build.arg("--release");
        }
        let status = build.status().expect("run cargo build --example");
        assert!(
            status.success(),
            "cargo build --example inbox_consumer failed"
        );
    }
    assert!(binary.exists(), "{} was not built", binary.display());
    binary
}

/// The example consumer as a child process, its log in `test_logs_dir()`.
struct ConsumerProcess {
    child: Child,
    log: PathBuf,
}

impl ConsumerProcess {
    fn start(binary: &Path, args: &[String], name: &str) -> ConsumerProcess {
        let (log, file) = test_log(name);
        let child = Command::new(binary)
            .args(args)
            .env("INBOX_LOG", "info,inbox_consumer=debug,rdkafka=warn")
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .expect("start the inbox consumer");
        ConsumerProcess { child, log }
    }

    fn kill9(&mut self) {
        let _ = self.child.kill(); // SIGKILL
        let _ = self.child.wait();
    }

    fn terminate(&mut self, timeout: Duration) -> std::process::ExitStatus {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .stdout(Stdio::null())
            .status();
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            if Instant::now() > deadline {
                self.kill9();
                panic!(
                    "consumer did not exit within {timeout:?} of SIGTERM; log: {}",
                    self.log.display()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn try_status(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().unwrap()
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for ConsumerProcess {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            self.kill9();
        }
    }
}

/// A fresh, empty database for the consumer (its inbox and effects), dropped at the end
/// (also when the test panics).
struct ScratchDb {
    url: String,
    dropped: DropDatabase,
}

impl ScratchDb {
    async fn new() -> ScratchDb {
        let admin_url = env("OUTBOX_TEST_PG_URL");
        let name = random_name("inbox");
        connect(&admin_url)
            .await
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .expect("create the consumer's database");
        let (base, _) = admin_url.rsplit_once('/').expect("URL has a database");
        ScratchDb {
            url: format!("{base}/{name}"),
            dropped: DropDatabase::new(&admin_url, &name),
        }
    }

    async fn cleanup(self) {
        self.dropped.now().await;
    }
}

type Partitions = HashMap<(String, i32), i64>;

/// One row of the consumer's `effects` table: aggregate id, event type, payload.
type Effect = (Option<String>, Option<String>, Option<Vec<u8>>);

fn offsets_reader(group: &str) -> BaseConsumer {
    ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer")
}

/// The end (high watermark) of every partition of `topics`.
async fn high_watermarks(topics: &[String]) -> Partitions {
    let topics = topics.to_vec();
    tokio::task::spawn_blocking(move || {
        let reader = offsets_reader(&random_name("watermarks"));
        let mut ends = Partitions::new();
        for topic in &topics {
            for p in 0..PARTITIONS {
                let (_, high) = reader
                    .fetch_watermarks(topic, p, Duration::from_secs(10))
                    .unwrap_or_else(|e| panic!("watermarks of {topic}/{p}: {e}"));
                ends.insert((topic.clone(), p), high);
            }
        }
        ends
    })
    .await
    .unwrap()
}

/// The offsets `group` committed for the partitions in `ends` (missing when none).
async fn committed_offsets(group: &str, ends: &Partitions) -> Partitions {
    let group = group.to_string();
    let mut list = TopicPartitionList::new();
    for (topic, p) in ends.keys() {
        list.add_partition(topic, *p);
    }
    tokio::task::spawn_blocking(move || {
        let reader = offsets_reader(&group);
        let mut committed = Partitions::new();
        match reader.committed_offsets(list, Duration::from_secs(10)) {
            Ok(list) => {
                for e in list.elements() {
                    if let Offset::Offset(o) = e.offset() {
                        committed.insert((e.topic().to_string(), e.partition()), o);
                    }
                }
            }
            Err(e) => eprintln!("committed offsets of {group}: {e}"),
        }
        committed
    })
    .await
    .unwrap()
}

/// Sums `records=` and `skipped=` over the consumer's "batch done" log lines (lines of a batch
/// whose process was killed before logging are not counted).
fn consumer_batches(log: &str) -> (usize, usize) {
    let field = |line: &str, name: &str| -> usize {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(name))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    log.lines()
        .filter(|l| l.contains("batch done"))
        .fold((0, 0), |(records, skipped), l| {
            (
                records + field(l, "records="),
                skipped + field(l, "skipped="),
            )
        })
}
