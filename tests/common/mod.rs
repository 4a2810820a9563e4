//! Shared harness for the integration tests: a fresh database, slot and topic prefix per test,
//! the relay binary as a child process, writers, and a Kafka reader.
//!
//! The services are started by `scripts/test.sh` (see `scripts/services.sh`), which exports
//! `OUTBOX_TEST_PG_URL`, `OUTBOX_TEST_KAFKA_BROKERS` and `OUTBOX_TEST_SERVICES`.
#![allow(dead_code)]

pub mod acl;
pub mod cluster;
pub mod probe;

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use outbox_relay::lsn::Lsn;
use outbox_relay::relay::sweeper::{Mark, Sweeper};
use rand::Rng;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use tokio_postgres::{Client, NoTls};

pub fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!("{name} is not set: run the integration tests through scripts/test.sh, which starts PostgreSQL and Kafka")
    })
}

pub fn brokers() -> String {
    env("OUTBOX_TEST_KAFKA_BROKERS")
}

/// Runs `scripts/services.sh <command>` (e.g. `kafka-stop`).
pub fn services(command: &str) {
    let status = Command::new("bash")
        .arg(env("OUTBOX_TEST_SERVICES"))
        .arg(command)
        .stdout(Stdio::null())
        .status()
        .expect("run services.sh");
    assert!(status.success(), "services.sh {command} failed");
}

/// `env` with each of `extra` set, replacing an earlier value of the same variable.
pub fn with(mut env: Vec<(String, String)>, extra: &[(&str, &str)]) -> Vec<(String, String)> {
    for (k, v) in extra {
        env.retain(|(key, _)| key != k);
        env.push((k.to_string(), v.to_string()));
    }
    env
}

pub fn random_name(prefix: &str) -> String {
    let n: u64 = rand::thread_rng().gen();
    format!("{prefix}{n:016x}")
}

/// Replaces the database in a postgres URL.
fn url_with_db(url: &str, db: &str) -> String {
    let (base, _) = url.rsplit_once('/').expect("URL has a database");
    format!("{base}/{db}")
}

pub async fn connect(url: &str) -> Client {
    let (client, conn) = tokio_postgres::connect(url, NoTls)
        .await
        .unwrap_or_else(|e| panic!("connect {url}: {e}"));
    tokio::spawn(async move {
        let _ = conn.await;
    });
    client
}

/// A fresh database with the outbox migration applied, plus a slot name and topic prefix
/// nobody else uses. Its database and slots are dropped when the last clone goes (see
/// [`DropDatabase`]), also when the test panics; [`TestDb::cleanup`] does it earlier.
#[derive(Clone)]
pub struct TestDb {
    pub name: String,
    pub url: String,
    pub slot: String,
    pub publication: String,
    pub topic_prefix: String,
    dropped: std::sync::Arc<DropDatabase>,
}

/// Drops a test's database, and every replication slot in it or named after it (ending the
/// slots' holders first), when dropped itself: at the end of the test, also while a panic
/// unwinds, so that no slot is left pinning WAL on the shared cluster.
///
/// `Drop` cannot await, and the test's runtime may be a current-thread one (where
/// `block_in_place` panics) or be the one unwinding, so the work runs on a thread of its own
/// with its own small runtime and connection. Best effort, bounded by [`DROP_DEADLINE`]; it
/// never panics (a panic in `Drop` while unwinding would abort the test binary).
pub struct DropDatabase {
    admin_url: String,
    name: String,
    done: std::sync::atomic::AtomicBool,
}

/// How long dropping a test's database may take before it is left (and reported).
const DROP_DEADLINE: Duration = Duration::from_secs(30);

impl DropDatabase {
    pub fn new(admin_url: &str, name: &str) -> DropDatabase {
        DropDatabase {
            admin_url: admin_url.to_string(),
            name: name.to_string(),
            done: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Drops the slots and the database now (and not again in `Drop`).
    pub async fn now(&self) {
        if !self.done.swap(true, std::sync::atomic::Ordering::SeqCst) {
            let dropped = tokio::time::timeout(DROP_DEADLINE, self.drop_all()).await;
            self.report(dropped);
        }
    }

    async fn drop_all(&self) -> Result<(), tokio_postgres::Error> {
        let (admin, conn) = tokio_postgres::connect(&self.admin_url, NoTls).await?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        // The slots in the database (logical ones), and any named after it on the cluster.
        let mine = "(database = $1 OR slot_name LIKE $1 || '%')";
        let began = Instant::now();
        loop {
            admin
                .execute(
                    &format!("SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE {mine} AND active_pid IS NOT NULL"),
                    &[&self.name],
                )
                .await?;
            // A slot still active (its holder not yet gone) fails to drop: try again.
            let _ = admin
                .execute(
                    &format!("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE {mine} AND NOT active"),
                    &[&self.name],
                )
                .await;
            let left = admin
                .query_one(
                    &format!("SELECT count(*) FROM pg_replication_slots WHERE {mine}"),
                    &[&self.name],
                )
                .await?
                .get::<_, i64>(0);
            if left == 0 || began.elapsed() > DROP_DEADLINE / 2 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        admin
            .batch_execute(&format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                self.name
            ))
            .await
    }

    fn report(
        &self,
        dropped: Result<Result<(), tokio_postgres::Error>, tokio::time::error::Elapsed>,
    ) {
        let why = match dropped {
            Ok(Ok(())) => return,
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("not done within {DROP_DEADLINE:?}"),
        };
        eprintln!(
            "test harness: could not drop database {} and its slots: {why}",
            self.name
        );
    }
}

impl Drop for DropDatabase {
    fn drop(&mut self) {
        if self.done.load(std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        let this = DropDatabase::new(&self.admin_url, &self.name);
        let worker = std::thread::Builder::new()
            .name(format!("drop-{}", self.name))
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build();
                match runtime {
                    Ok(runtime) => runtime.block_on(this.now()),
                    Err(e) => eprintln!("test harness: no runtime to drop {}: {e}", this.name),
                }
            });
        match worker {
            Ok(worker) => {
                let _ = worker.join();
            }
            Err(e) => eprintln!("test harness: no thread to drop {}: {e}", self.name),
        }
    }
}

impl TestDb {
    pub async fn new() -> TestDb {
        let admin_url = env("OUTBOX_TEST_PG_URL");
        let name = random_name("t");
        let admin = connect(&admin_url).await;
        admin
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .expect("create database");
        let url = url_with_db(&admin_url, &name);
        let db = connect(&url).await;
        let migration = std::fs::read_to_string(repo_path("migrations/001_outbox.sql")).unwrap();
        db.batch_execute(&migration).await.expect("apply migration");
        TestDb {
            slot: format!("{name}_slot"),
            publication: "outbox_relay_pub".into(),
            topic_prefix: name.clone(),
            dropped: std::sync::Arc::new(DropDatabase::new(&admin_url, &name)),
            name,
            url,
        }
    }

    pub async fn client(&self) -> Client {
        connect(&self.url).await
    }

    pub fn topic(&self, aggregate_type: &str) -> String {
        format!("{}.{aggregate_type}", self.topic_prefix)
    }

    /// The environment that points a relay at this database, slot and topic prefix.
    pub fn relay_env(&self) -> Vec<(String, String)> {
        vec![
            ("OUTBOX_RELAY__POSTGRES__URL".into(), self.url.clone()),
            ("OUTBOX_RELAY__POSTGRES__SLOT".into(), self.slot.clone()),
            (
                "OUTBOX_RELAY__POSTGRES__PUBLICATION".into(),
                self.publication.clone(),
            ),
            (
                "OUTBOX_RELAY__POSTGRES__STATUS_INTERVAL_MS".into(),
                "500".into(),
            ),
            (
                "OUTBOX_RELAY__POSTGRES__RECONNECT_BACKOFF_INITIAL_MS".into(),
                "200".into(),
            ),
            (
                "OUTBOX_RELAY__POSTGRES__RECONNECT_BACKOFF_MAX_MS".into(),
                "2000".into(),
            ),
            ("OUTBOX_RELAY__OUTBOX__TABLE".into(), "public.outbox".into()),
            (
                "OUTBOX_RELAY__OUTBOX__TOPIC".into(),
                format!("{}.{{aggregatetype}}", self.topic_prefix),
            ),
            ("OUTBOX_RELAY__KAFKA__BROKERS".into(), brokers()),
            // Tests run relays side by side: no fixed metrics port unless a test asks for one.
            ("OUTBOX_RELAY__HTTP__LISTEN".into(), String::new()),
            (
                "OUTBOX_RELAY__POSTGRES__SLOT_SAMPLE_INTERVAL_MS".into(),
                "500".into(),
            ),
        ]
    }

    /// Creates the slot now, so that rows inserted before the relay starts are streamed.
    pub async fn create_slot(&self) {
        self.client()
            .await
            .execute(
                "SELECT pg_create_logical_replication_slot($1, 'pgoutput')",
                &[&self.slot],
            )
            .await
            .expect("create slot");
    }

    pub async fn confirmed_flush_lsn(&self) -> u64 {
        self.confirmed_flush_lsn_on(&self.client().await).await
    }

    /// `confirmed_flush_lsn` on a connection the caller keeps: for a loop that polls often,
    /// a connection per poll would load the server it is measuring.
    pub async fn confirmed_flush_lsn_on(&self, client: &tokio_postgres::Client) -> u64 {
        let row = client
            .query_one(
                "SELECT (confirmed_flush_lsn - '0/0')::bigint FROM pg_replication_slots WHERE slot_name = $1",
                &[&self.slot],
            )
            .await
            .expect("read slot");
        row.get::<_, i64>(0) as u64
    }

    /// A WAL position at or after the commit of every transaction committed so far.
    ///
    /// The test cluster commits asynchronously, so `pg_current_wal_lsn()` (the write position)
    /// can stand before commits that already returned; waiting for a slot to confirm it then
    /// ends while their records are still on the way. A synchronous commit first writes and
    /// flushes everything before it.
    pub async fn current_wal_lsn(&self) -> u64 {
        let client = self.client().await;
        client
            .batch_execute("SET synchronous_commit = on; SELECT txid_current()")
            .await
            .unwrap();
        let row = client
            .query_one("SELECT (pg_current_wal_lsn() - '0/0')::bigint", &[])
            .await
            .unwrap();
        row.get::<_, i64>(0) as u64
    }

    /// Drops the slots (ending their holders) and the database now, for every clone; what
    /// the last clone's `Drop` would do otherwise. Best effort.
    pub async fn cleanup(self) {
        self.dropped.now().await;
    }
}

pub fn repo_path(relative: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(relative)
}

/// Where the tests' child processes write their logs and the tests their config and secret
/// files, created: `$OUTBOX_RUN_DIR/test-logs` beside the services' logs, else
/// `target/test-logs`. Per run dir, because test runs against different services may run side
/// by side (`scripts/test-versions.sh`) with the same file names and must not share a file.
pub fn test_logs_dir() -> PathBuf {
    let dir = match std::env::var_os("OUTBOX_RUN_DIR") {
        Some(run) => PathBuf::from(run).join("test-logs"),
        None => repo_path("target/test-logs"),
    };
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// One outbox event as the tests write it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub id: String,
    pub aggregate_type: String,
    pub aggregate_id: String,
    pub event_type: String,
    pub payload: String,
}

impl Event {
    /// A new event; the payload carries the writer and its sequence for order checks.
    pub fn new(aggregate_type: &str, aggregate_id: &str, writer: usize, seq: usize) -> Event {
        Event {
            id: uuid::Uuid::new_v4().to_string(),
            aggregate_type: aggregate_type.into(),
            aggregate_id: aggregate_id.into(),
            event_type: "Created".into(),
            // jsonb's own text form, so the payload read back from the table is identical.
            payload: format!(
                r#"{{"seq": {seq}, "note": "ünïcode \"quoted\"", "writer": {writer}}}"#
            ),
        }
    }
}

/// Inserts events in one transaction; commits, or rolls back when `commit` is false.
pub async fn insert_events(client: &mut Client, events: &[Event], commit: bool) {
    insert_events_at(client, events, commit).await;
}

/// Like `insert_events`, and returns the WAL insert position just before the COMMIT: a lower
/// bound of the transaction's commit LSN, which is what redelivery after a restart hinges on
/// (PostgreSQL re-sends every transaction whose commit is at or after the confirmed position).
pub async fn insert_events_at(client: &mut Client, events: &[Event], commit: bool) -> u64 {
    let tx = client.transaction().await.expect("begin");
    let ids: Vec<&str> = events.iter().map(|e| e.id.as_str()).collect();
    let types: Vec<&str> = events.iter().map(|e| e.aggregate_type.as_str()).collect();
    let agg_ids: Vec<&str> = events.iter().map(|e| e.aggregate_id.as_str()).collect();
    let event_types: Vec<&str> = events.iter().map(|e| e.event_type.as_str()).collect();
    let payloads: Vec<&str> = events.iter().map(|e| e.payload.as_str()).collect();
    tx.execute(
        "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
         SELECT i::uuid, a, g, t, p::jsonb
         FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[])
              WITH ORDINALITY AS u(i, a, g, t, p, n) ORDER BY n",
        &[&ids, &types, &agg_ids, &event_types, &payloads],
    )
    .await
    .expect("insert outbox rows");
    let before_commit = wal_insert_lsn(&tx).await;
    if commit {
        tx.commit().await.expect("commit");
    } else {
        tx.rollback().await.expect("rollback");
    }
    before_commit
}

/// The WAL insert position now (`pg_current_wal_insert_lsn()`), on `client` or inside a
/// transaction.
pub async fn wal_insert_lsn(client: &impl tokio_postgres::GenericClient) -> u64 {
    let lsn: i64 = client
        .query_one("SELECT (pg_current_wal_insert_lsn() - '0/0')::bigint", &[])
        .await
        .expect("pg_current_wal_insert_lsn()")
        .get(0);
    lsn as u64
}

/// The relay binary running as a child process, its log in [`test_logs_dir`].
pub struct RelayProcess {
    child: Child,
    pub log: PathBuf,
}

impl RelayProcess {
    pub fn start(env: &[(String, String)], name: &str) -> RelayProcess {
        let (mut command, log) = relay_command(env, name);
        let child = command.spawn().expect("start relay");
        RelayProcess { child, log }
    }

    /// Like `start`, with SIGTERM and SIGINT blocked from before exec, as a parent may leave
    /// them: a signal sent before the relay runs its first instruction waits for the relay to
    /// unblock it instead of ending the process by the default action.
    pub fn start_signals_blocked(env: &[(String, String)], name: &str) -> RelayProcess {
        let (mut command, log) = relay_command(env, name);
        block_termination_signals_at_exec(&mut command);
        let child = command.spawn().expect("start relay");
        RelayProcess { child, log }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn kill9(&mut self) {
        let _ = self.child.kill(); // SIGKILL
        let _ = self.child.wait();
    }

    /// SIGTERM, then waits for the exit status.
    pub fn terminate(&mut self, timeout: Duration) -> std::process::ExitStatus {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            if Instant::now() > deadline {
                self.kill9();
                panic!(
                    "relay did not exit within {timeout:?} of SIGTERM; log: {}",
                    self.log.display()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The exit status if the process has ended.
    pub fn try_status(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().unwrap()
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for RelayProcess {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            self.kill9();
        }
    }
}

/// `<test_logs_dir>/<name>.log`, opened for appending: where a child process of a test writes.
pub fn test_log(name: &str) -> (PathBuf, std::fs::File) {
    let log = test_logs_dir().join(format!("{name}.log"));
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)
        .unwrap();
    (log, file)
}

/// `outbox-relay run` with `env`, its output appended to `<test_logs_dir>/<name>.log`.
fn relay_command(env: &[(String, String)], name: &str) -> (Command, PathBuf) {
    let (log, file) = test_log(name);
    let mut command = Command::new(env!("CARGO_BIN_EXE_outbox-relay"));
    command
        .arg("run")
        .envs(env.iter().cloned())
        // librdkafka writes debug lines only where a test sets `kafka.properties.debug`.
        .env(
            "OUTBOX_RELAY_LOG",
            "info,outbox_relay=debug,rdkafka=warn,librdkafka=debug",
        )
        .stdout(file.try_clone().unwrap())
        .stderr(file);
    (command, log)
}

/// Has `command`'s child block SIGTERM and SIGINT from before exec.
#[allow(unsafe_code, reason = "FFI: the signal mask of a child before exec")]
fn block_termination_signals_at_exec(command: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs between fork and exec and makes only async-signal-safe calls
    // (sigemptyset, sigaddset, pthread_sigmask), allocating nothing.
    unsafe { command.pre_exec(block_termination_signals) };
}

/// Blocks SIGTERM and SIGINT in the calling thread (a child between fork and exec).
#[allow(unsafe_code, reason = "FFI: the signal mask of a child before exec")]
fn block_termination_signals() -> std::io::Result<()> {
    let mut set = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
    // SAFETY: sigemptyset initialises the set it is given.
    unsafe { libc::sigemptyset(set.as_mut_ptr()) };
    // SAFETY: initialised just above.
    let mut set = unsafe { set.assume_init() };
    for signal in [libc::SIGTERM, libc::SIGINT] {
        // SAFETY: `set` is an initialised sigset_t and `signal` a valid signal number.
        unsafe { libc::sigaddset(&mut set, signal) };
    }
    // SAFETY: `set` is initialised; no old mask is asked for.
    match unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) } {
        0 => Ok(()),
        e => Err(std::io::Error::from_raw_os_error(e)),
    }
}

/// One record read back from Kafka.
#[derive(Debug, Clone)]
pub struct Received {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub key: Vec<u8>,
    pub payload: Option<Vec<u8>>,
    pub headers: HashMap<String, Vec<u8>>,
    pub timestamp_ms: Option<i64>,
}

impl Received {
    pub fn key_str(&self) -> String {
        String::from_utf8_lossy(&self.key).into_owned()
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .get(name)
            .map(|v| std::str::from_utf8(v).expect("utf-8 header"))
    }
}

/// Reads the given topics from the beginning, feeding each record to `done` until it returns
/// true or the deadline passes; then keeps reading for `settle` so duplicates are seen too.
pub async fn read_until(
    topics: &[String],
    partitions: i32,
    timeout: Duration,
    settle: Duration,
    done: impl FnMut(&Received) -> bool + Send + 'static,
) -> Vec<Received> {
    read_until_as(reader_config(), topics, partitions, timeout, settle, done).await
}

/// [`read_until`] with a consumer of `config` (another broker, or a login).
pub async fn read_until_as(
    config: ClientConfig,
    topics: &[String],
    partitions: i32,
    timeout: Duration,
    settle: Duration,
    done: impl FnMut(&Received) -> bool + Send + 'static,
) -> Vec<Received> {
    let topics = topics.to_vec();
    tokio::task::spawn_blocking(move || {
        read_until_blocking(config, &topics, partitions, timeout, settle, done)
    })
    .await
    .unwrap()
}

/// The test reader's settings on the main broker; [`reader_settings`] on `ClientConfig::new()`.
fn reader_config() -> ClientConfig {
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", brokers());
    reader_settings(&mut config);
    config
}

/// What every test reader sets: its own group, read_committed, nothing committed.
pub fn reader_settings(config: &mut ClientConfig) {
    config
        .set("group.id", random_name("reader"))
        // librdkafka's default, said out loud: records of aborted Kafka transactions are never
        // seen, as an exactly-once consumer reads (and at-least-once records are unaffected).
        .set("isolation.level", "read_committed")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false")
        .set("topic.metadata.refresh.interval.ms", "500");
}

/// Reads until every id in `ids` has arrived (or the deadline), then for `settle` more.
pub async fn read_ids(
    topics: &[String],
    partitions: i32,
    ids: &[String],
    timeout: Duration,
    settle: Duration,
) -> Vec<Received> {
    let mut waiting: HashSet<Vec<u8>> = ids.iter().map(|i| i.as_bytes().to_vec()).collect();
    read_until(topics, partitions, timeout, settle, move |record| {
        waiting.remove(&record.key);
        waiting.is_empty()
    })
    .await
}

fn read_until_blocking(
    config: ClientConfig,
    topics: &[String],
    partitions: i32,
    timeout: Duration,
    settle: Duration,
    mut done: impl FnMut(&Received) -> bool,
) -> Vec<Received> {
    let consumer: BaseConsumer = config.create().expect("consumer");
    let mut assignment = TopicPartitionList::new();
    for topic in topics {
        for p in 0..partitions {
            assignment
                .add_partition_offset(topic, p, Offset::Beginning)
                .unwrap();
        }
    }
    consumer.assign(&assignment).expect("assign");
    let mut deadline = Instant::now() + timeout;
    let mut records = Vec::new();
    let mut settling = false;
    while Instant::now() < deadline {
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => {
                let record = received(&m);
                if !settling && done(&record) {
                    settling = true;
                    deadline = Instant::now() + settle;
                }
                records.push(record);
            }
            // Unknown topic while the relay has not created it yet: keep polling.
            Some(Err(e)) if e.to_string().contains("Unknown topic") => {}
            Some(Err(e)) => eprintln!("read_until: consumer error {e}"),
            None => {}
        }
    }
    if !settling {
        eprintln!("read_until: deadline after {} records", records.len());
    }
    records
}

fn received(m: &rdkafka::message::BorrowedMessage<'_>) -> Received {
    Received {
        topic: m.topic().to_string(),
        partition: m.partition(),
        offset: m.offset(),
        key: m.key().unwrap_or_default().to_vec(),
        payload: m.payload().map(<[u8]>::to_vec),
        headers: m
            .headers()
            .map(|h| {
                h.iter()
                    .map(|h| (h.key.to_string(), h.value.unwrap_or_default().to_vec()))
                    .collect()
            })
            .unwrap_or_default(),
        timestamp_ms: m.timestamp().to_millis(),
    }
}

/// Counts of what arrived against what was expected.
pub struct Tally {
    pub missing: Vec<String>,
    pub duplicates: usize,
    pub unexpected: usize,
}

pub fn tally(expected: &[Event], received: &[Received]) -> Tally {
    let mut seen: HashMap<String, usize> = HashMap::new();
    for r in received {
        *seen.entry(r.key_str()).or_default() += 1;
    }
    let expected_ids: std::collections::HashSet<&str> =
        expected.iter().map(|e| e.id.as_str()).collect();
    Tally {
        missing: expected
            .iter()
            .filter(|e| !seen.contains_key(&e.id))
            .map(|e| e.id.clone())
            .collect(),
        duplicates: seen.values().map(|&n| n.saturating_sub(1)).sum(),
        unexpected: seen
            .keys()
            .filter(|k| !expected_ids.contains(k.as_str()))
            .count(),
    }
}

/// Polls `check` until it returns true or the deadline passes (then panics with `what`).
pub async fn wait_for<F, Fut>(what: &str, timeout: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    while !check().await {
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

// ---- helpers for tests/integration/ops.rs (operator commands) ----

impl TestDb {
    /// Like [`TestDb::new`], on another cluster: `admin_url` is that cluster's superuser URL
    /// (e.g. the wal_level=replica one from `services.sh pg-replica-start`).
    pub async fn new_on(admin_url: &str) -> TestDb {
        let name = random_name("t");
        let admin = connect(admin_url).await;
        admin
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .expect("create database");
        let url = url_with_db(admin_url, &name);
        let migration = std::fs::read_to_string(repo_path("migrations/001_outbox.sql")).unwrap();
        connect(&url)
            .await
            .batch_execute(&migration)
            .await
            .expect("apply migration");
        TestDb {
            slot: format!("{name}_slot"),
            publication: "outbox_relay_pub".into(),
            topic_prefix: name.clone(),
            dropped: std::sync::Arc::new(DropDatabase::new(admin_url, &name)),
            name,
            url,
        }
    }
}

// ---- helpers for tests/integration/routing.rs (outbox routing) ----

/// Creates `topic` with `partitions` partitions (replication factor 1), then waits until the
/// broker's metadata shows all of them, so a relay started afterwards sees the final count.
pub async fn create_topic(topic: &str, partitions: i32) {
    create_topic_with(topic, partitions, &[]).await
}

/// [`create_topic`] with topic `configs` set (`max.message.bytes`, …).
pub async fn create_topic_with(topic: &str, partitions: i32, configs: &[(&str, &str)]) {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use rdkafka::client::DefaultClientContext;

    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .create()
        .expect("admin client");
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    let results = admin
        .create_topics(
            &[configs.iter().fold(
                NewTopic::new(topic, partitions, TopicReplication::Fixed(1)),
                |t, (k, v)| t.set(k, v),
            )],
            &options,
        )
        .await
        .unwrap_or_else(|e| panic!("create topic {topic}: {e}"));
    for result in results {
        result.unwrap_or_else(|(t, e)| panic!("create topic {t}: {e}"));
    }
    let topic = topic.to_string();
    tokio::task::spawn_blocking(move || {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let seen = admin
                .inner()
                .fetch_metadata(Some(&topic), Duration::from_secs(5))
                .ok()
                .and_then(|m| {
                    m.topics()
                        .iter()
                        .find(|t| t.name() == topic && t.error().is_none())
                        .map(|t| t.partitions().len() as i32)
                });
            if seen == Some(partitions) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "topic {topic} has {seen:?} partitions, not {partitions}, 30 s after creation"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    })
    .await
    .unwrap();
}

/// Writes `text` to `<test_logs_dir>/<name>.toml` and returns its path, for
/// `OUTBOX_RELAY_CONFIG`.
pub fn write_config(name: &str, text: &str) -> PathBuf {
    let path = test_logs_dir().join(format!("{name}.toml"));
    std::fs::write(&path, text).unwrap();
    path
}

/// Reads `topics` (one partition each) until every event arrived or `timeout` passed, keeps
/// reading `settle` longer to see duplicates, prints the tally under `label`, and fails when
/// any event is missing (with the relay's log).
pub async fn expect_all(
    label: &str,
    topics: &[String],
    events: &[Event],
    timeout: Duration,
    settle: Duration,
    relay: &RelayProcess,
) -> (Vec<Received>, Tally) {
    let ids: Vec<String> = events.iter().map(|e| e.id.clone()).collect();
    let received = read_ids(topics, 1, &ids, timeout, settle).await;
    let t = tally(events, &received);
    println!(
        "{label}: {} events, {} missing, {} duplicates",
        events.len(),
        t.missing.len(),
        t.duplicates
    );
    assert!(
        t.missing.is_empty(),
        "{label}: {} of {} events missing, e.g. {:?}\n{}",
        t.missing.len(),
        events.len(),
        &t.missing[..t.missing.len().min(3)],
        relay.log_text()
    );
    (received, t)
}

/// Waits until the relay streams the slot, failing early if the relay exits.
///
/// "Streams" means a walsender holds the slot: `active` alone is also true while
/// `pg_create_logical_replication_slot` is still waiting for running transactions, and rows
/// committed before it returns are (correctly) not part of the slot's stream.
pub async fn wait_for_slot(db: &TestDb, relay: &mut RelayProcess) {
    let client = db.client().await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let streaming = client
            .query_opt(
                "SELECT 1 FROM pg_replication_slots s
                 JOIN pg_stat_replication r ON r.pid = s.active_pid
                 WHERE s.slot_name = $1",
                &[&db.slot],
            )
            .await
            .unwrap()
            .is_some();
        if streaming {
            return;
        }
        if let Some(status) = relay.try_status() {
            panic!(
                "relay exited with {status} before streaming:\n{}",
                relay.log_text()
            );
        }
        assert!(
            Instant::now() < deadline,
            "relay never started streaming:\n{}",
            relay.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Writes `total` events from `writers` concurrent writers in transactions of 1 to `max_txn`
/// rows, alternating aggregate types per transaction. Returns events in each writer's commit
/// order, writer by writer.
pub async fn write_concurrently(
    db: &TestDb,
    writers: usize,
    total: usize,
    max_txn: usize,
    pause: Duration,
) -> Vec<Vec<Event>> {
    let per_writer = total / writers;
    let mut tasks = Vec::new();
    for w in 0..writers {
        let mut client = db.client().await;
        tasks.push(tokio::spawn(async move {
            let mut written = Vec::with_capacity(per_writer);
            let mut txn_no = 0;
            while written.len() < per_writer {
                let n = rand::thread_rng()
                    .gen_range(1..=max_txn)
                    .min(per_writer - written.len());
                let aggregate_type = if txn_no % 2 == 0 { "order" } else { "customer" };
                let batch: Vec<Event> = (0..n)
                    .map(|i| {
                        Event::new(
                            aggregate_type,
                            &format!("w{w}-{txn_no}"),
                            w,
                            written.len() + i,
                        )
                    })
                    .collect();
                insert_events(&mut client, &batch, true).await;
                written.extend(batch);
                txn_no += 1;
                if !pause.is_zero() {
                    tokio::time::sleep(pause).await;
                }
            }
            written
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.push(t.await.unwrap());
    }
    all
}

// ---------------------------------------------------------------------------------------
// Exactly-once: what a read_committed consumer sees.

/// [`read_ids`] on one-partition topics, named for what the exactly-once tests rely on: the
/// reader uses `isolation.level=read_committed`, so aborted records are not seen.
pub async fn read_ids_committed(
    topics: &[String],
    ids: &[String],
    timeout: Duration,
    settle: Duration,
) -> Vec<Received> {
    read_ids(topics, 1, ids, timeout, settle).await
}

// ---- helpers for the sweeper tests (tests/integration/routing.rs, tests/integration/partitions.rs) ----

/// Moves the slot's confirmed position to exactly `to` (once the WAL is flushed that far).
pub async fn advance_slot(db: &TestDb, to: Lsn) {
    let client = db.client().await;
    wait_for(
        "the WAL to be flushed up to the mark",
        Duration::from_secs(10),
        || async {
            // A commit that has an xid flushes the WAL up to itself: on a quiet server the
            // flush position may otherwise stay just short of an insert position.
            client.batch_execute("SELECT txid_current()").await.unwrap();
            let flushed: i64 = client
                .query_one("SELECT (pg_current_wal_flush_lsn() - '0/0')::bigint", &[])
                .await
                .unwrap()
                .get(0);
            flushed as u64 >= to.0
        },
    )
    .await;
    client
        .execute(
            "SELECT pg_replication_slot_advance($1, $2::text::pg_lsn)",
            &[&db.slot, &to.to_string()],
        )
        .await
        .unwrap();
}

/// Takes marks until one is newer than the transactions that inserted `ids` (other tests'
/// transactions on the cluster can hold a mark's xmin back).
pub async fn mark_after(sweeper: &mut Sweeper, client: &Client, ids: &[String]) -> Mark {
    let newest: i64 = client
        .query_one(
            "SELECT max(xmin::text::bigint) FROM outbox WHERE id::text = ANY($1)",
            &[&ids],
        )
        .await
        .unwrap()
        .get(0);
    for _ in 0..40 {
        let mark = sweeper.take_mark().await.unwrap();
        if mark.xmin > newest {
            return mark;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    panic!("a transaction older than xid {newest} kept running for 10 s");
}

// ---- helpers for the exactly-once tests (tests/integration/exactly_once.rs, tests/integration/exclusive/) ----

/// The relay's environment in exactly-once mode, with a progress topic of the test's own.
pub fn exactly_once_env(db: &TestDb) -> Vec<(String, String)> {
    let mut env = db.relay_env();
    env.push((
        "OUTBOX_RELAY__KAFKA__DELIVERY".into(),
        "exactly_once".into(),
    ));
    env.push((
        "OUTBOX_RELAY__KAFKA__PROGRESS_TOPIC".into(),
        db.topic("progress"),
    ));
    env
}

/// Tallies what arrived of `expected`, prints it under `label`, and fails when any is missing
/// (with `log`, the relay's).
pub fn assert_none_missing(
    label: &str,
    expected: &[Event],
    received: &[Received],
    log: &str,
) -> Tally {
    let t = tally(expected, received);
    println!(
        "{label}: {} events, {} received, {} missing, {} duplicates",
        expected.len(),
        received.len(),
        t.missing.len(),
        t.duplicates
    );
    assert!(
        t.missing.is_empty(),
        "{label}: {} of {} events missing, e.g. {:?}\n{log}",
        t.missing.len(),
        expected.len(),
        &t.missing[..t.missing.len().min(3)]
    );
    t
}

/// Reads with read_committed and fails on any missing, duplicate or out-of-order event.
pub async fn expect_exactly_once(
    label: &str,
    db: &TestDb,
    committed: &[Event],
    rolled_back: &[Event],
    relay_log: &str,
) {
    let topics = vec![db.topic("order"), db.topic("customer")];
    let received = read_ids_committed(
        &topics,
        &committed.iter().map(|e| e.id.clone()).collect::<Vec<_>>(),
        Duration::from_secs(180),
        Duration::from_secs(5),
    )
    .await;
    let t = assert_none_missing(label, committed, &received, relay_log);
    assert_eq!(
        t.duplicates, 0,
        "{label}: duplicates for a read_committed consumer"
    );
    let rolled: std::collections::HashSet<&str> =
        rolled_back.iter().map(|e| e.id.as_str()).collect();
    assert!(
        !received
            .iter()
            .any(|r| rolled.contains(r.key_str().as_str())),
        "{label}: a rolled-back event reached Kafka"
    );
    assert_eq!(t.unexpected, 0, "{label}: unexpected records");
    // Commit order per partition (one per topic): each writer's events in its order.
    let mut last: HashMap<(String, u64), u64> = HashMap::new();
    for r in &received {
        let payload: serde_json::Value =
            serde_json::from_slice(r.payload.as_deref().unwrap()).unwrap();
        let writer = payload["writer"].as_u64().unwrap();
        let seq = payload["seq"].as_u64().unwrap();
        if let Some(before) = last.insert((r.topic.clone(), writer), seq) {
            assert!(
                before < seq,
                "{label}: writer {writer} out of order in {}: {seq} after {before}",
                r.topic
            );
        }
    }
}

/// Inserts a row with a NULL aggregate type (no topic can be formed: a dead letter) in its own
/// transaction; returns its id and the LSN before its commit.
pub async fn insert_poison_at(client: &mut Client) -> (String, u64) {
    let id = uuid::Uuid::new_v4().to_string();
    let tx = client.transaction().await.unwrap();
    tx.execute(
        "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
         VALUES ($1::text::uuid, NULL, 'p', 'Bad', '{}')",
        &[&id],
    )
    .await
    .unwrap();
    let lsn: i64 = tx
        .query_one("SELECT (pg_current_wal_insert_lsn() - '0/0')::bigint", &[])
        .await
        .unwrap()
        .get(0);
    tx.commit().await.unwrap();
    (id, lsn as u64)
}

/// `outbox-relay dead-letters redrive --json ARGS` with `env`, its output piped.
pub fn redrive_command(env: &[(String, String)], args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_outbox-relay"));
    command
        .args(["dead-letters", "redrive", "--json"])
        .args(args)
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

/// `dead-letters redrive --json ARGS`, which must succeed; its JSON report.
pub fn redrive(env: &[(String, String)], args: &[&str]) -> serde_json::Value {
    let out = redrive_command(env, args).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "dead-letters redrive {args:?}: {}\n{stdout}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}
