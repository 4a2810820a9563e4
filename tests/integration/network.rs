//! Network faults against the real services: a replication connection whose path freezes
//! without a FIN/RST, Kafka unreachable at start, and a runtime thread that must keep
//! answering through both.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::common::probe::{free_port, http_get};
use crate::common::*;
use bytes::Bytes;
use outbox_relay::config::KafkaConfig;
use outbox_relay::mapping::Record;
use outbox_relay::sink::publisher::Publisher;

/// A TCP forwarder on 127.0.0.1 inside the test. `freeze` stops every connection accepted so
/// far from forwarding, in both directions, and closes nothing (a path that died without a
/// FIN/RST, as a NAT dropping the flow); connections accepted later forward normally.
struct Proxy {
    port: u16,
    /// Connections accepted in an earlier epoch than this are frozen.
    frozen_before: Arc<AtomicU64>,
    epoch: Arc<AtomicU64>,
}

impl Proxy {
    /// Listens on `listen` (a random port when 0) and forwards each connection to `target`.
    async fn start(listen: u16, target: SocketAddr) -> Proxy {
        let listener = TcpListener::bind(("127.0.0.1", listen)).await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let frozen_before = Arc::new(AtomicU64::new(0));
        let epoch = Arc::new(AtomicU64::new(0));
        let (frozen, current) = (frozen_before.clone(), epoch.clone());
        tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    continue;
                };
                let born = current.load(Ordering::SeqCst);
                let frozen = frozen.clone();
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(target).await else {
                        return;
                    };
                    let _ = client.set_nodelay(true);
                    let _ = server.set_nodelay(true);
                    let (cr, cw) = client.into_split();
                    let (sr, sw) = server.into_split();
                    tokio::join!(
                        pump(cr, sw, born, frozen.clone()),
                        pump(sr, cw, born, frozen)
                    );
                });
            }
        });
        Proxy {
            port,
            frozen_before,
            epoch,
        }
    }

    fn freeze_existing(&self) {
        let next = self.epoch.fetch_add(1, Ordering::SeqCst) + 1;
        self.frozen_before.store(next, Ordering::SeqCst);
    }
}

/// Copies bytes one way until the connection ends; once frozen, holds both sockets open
/// forever without reading or writing another byte.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    born: u64,
    frozen_before: Arc<AtomicU64>,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        if born < frozen_before.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => {
                let _ = to.shutdown().await;
                return;
            }
            Ok(n) => n,
        };
        if born < frozen_before.load(Ordering::SeqCst) {
            // Bytes that arrive after the freeze are swallowed: the path is gone.
            std::future::pending::<()>().await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// `GET path` off the test's runtime threads, with how long the answer took.
async fn timed_get(port: u16, path: &'static str) -> (Option<u16>, Duration) {
    tokio::task::spawn_blocking(move || {
        let began = Instant::now();
        let answer = http_get(port, path).map(|(code, _)| code);
        (answer, began.elapsed())
    })
    .await
    .unwrap()
}

/// Writes a batch of 10 events every 50 ms until `stop`; returns them all.
fn start_writer(db: &TestDb, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<Vec<Event>> {
    let db = db.clone();
    tokio::spawn(async move {
        let mut client = db.client().await;
        let mut all = Vec::new();
        let mut n = 0;
        while !stop.load(Ordering::SeqCst) {
            let batch: Vec<Event> = (0..10)
                .map(|i| Event::new("order", &format!("agg{}", i % 3), 0, n + i))
                .collect();
            n += 10;
            insert_events(&mut client, &batch, true).await;
            all.extend(batch);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        all
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn frozen_replication_path_is_noticed_and_nothing_is_lost() {
    let db = TestDb::new().await;
    // A short wal_sender_timeout for this database: the relay derives its receive deadline
    // from it (3/4: 3 s), and the server ends the frozen walsender after it, freeing the slot.
    db.client()
        .await
        .batch_execute(&format!(
            "ALTER DATABASE {} SET wal_sender_timeout = '4s'",
            db.name
        ))
        .await
        .unwrap();
    db.create_slot().await;
    let (host, port) = {
        let rest = db.url.split_once('@').unwrap().1;
        let host_port = rest.split_once('/').unwrap().0;
        let (h, p) = host_port.rsplit_once(':').unwrap();
        (h.to_string(), p.parse::<u16>().unwrap())
    };
    let target = tokio::net::lookup_host((host.as_str(), port))
        .await
        .unwrap()
        .next()
        .unwrap();
    let proxy = Proxy::start(0, target).await;
    let proxied_url = db.url.replacen(
        &format!("@{host}:{port}/"),
        &format!("@127.0.0.1:{}/", proxy.port),
        1,
    );
    assert_ne!(proxied_url, db.url);
    let http = free_port();
    let env = with(
        db.relay_env(),
        &[
            ("OUTBOX_RELAY__POSTGRES__URL", &proxied_url),
            ("OUTBOX_RELAY__HTTP__LISTEN", &format!("127.0.0.1:{http}")),
            ("OUTBOX_RELAY__POSTGRES__STANDBY_RETRY_MS", "500"),
        ],
    );
    let mut relay = RelayProcess::start(&env, "network_frozen_path");
    wait_for_slot(&db, &mut relay).await;
    wait_for("/readyz to be ready", Duration::from_secs(30), || async {
        timed_get(http, "/readyz").await.0 == Some(200)
    })
    .await;

    let stop = Arc::new(AtomicBool::new(false));
    let writer = start_writer(&db, stop.clone());
    tokio::time::sleep(Duration::from_secs(2)).await;
    proxy.freeze_existing();
    let frozen_at = Instant::now();

    // Red once the relay notices (receive deadline 3 s), green again after it reconnected
    // (the server ends the frozen walsender after wal_sender_timeout, 4 s).
    let mut red_after = None;
    let green_after = loop {
        let (code, _) = timed_get(http, "/readyz").await;
        match (code, red_after) {
            (Some(503), None) => red_after = Some(frozen_at.elapsed()),
            (Some(200), Some(_)) => break frozen_at.elapsed(),
            _ => {}
        }
        if let Some(status) = relay.try_status() {
            panic!("relay exited with {status}:\n{}", relay.log_text());
        }
        assert!(
            frozen_at.elapsed() < Duration::from_secs(60),
            "relay did not recover within 60 s of the freeze (red after {red_after:?}):\n{}",
            relay.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let red_after = red_after.unwrap();
    println!("frozen path: /readyz red after {red_after:?}, ready again after {green_after:?}");
    assert!(
        red_after < Duration::from_millis(3_000 + 2_500),
        "the relay noticed the dead path only after {red_after:?} (receive deadline 3 s)"
    );
    let log = relay.log_text();
    assert!(
        log.contains("receive deadline"),
        "the session should end on the receive deadline:\n{log}"
    );

    // Keep writing a little on the new connection, then check every event.
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::SeqCst);
    let all = writer.await.unwrap();
    expect_all(
        "frozen replication path",
        &[db.topic("order")],
        &all,
        Duration::from_secs(60),
        Duration::from_secs(2),
        &relay,
    )
    .await;
    assert!(relay.terminate(Duration::from_secs(30)).success());
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kafka_unreachable_at_start_keeps_http_answering() {
    let db = TestDb::new().await;
    db.create_slot().await;
    // Nothing listens on this port for the first 15 s; then it forwards to the broker.
    let kafka_port = free_port();
    let http = free_port();
    let env = with(
        db.relay_env(),
        &[
            (
                "OUTBOX_RELAY__KAFKA__BROKERS",
                &format!("127.0.0.1:{kafka_port}"),
            ),
            ("OUTBOX_RELAY__HTTP__LISTEN", &format!("127.0.0.1:{http}")),
        ],
    );
    let mut relay = RelayProcess::start(&env, "network_kafka_unreachable");
    wait_for_slot(&db, &mut relay).await;

    let stop = Arc::new(AtomicBool::new(false));
    let writer = start_writer(&db, stop.clone());
    let outage = Instant::now();
    let (mut probes, mut slowest) = (0, (Duration::ZERO, ""));
    while outage.elapsed() < Duration::from_secs(15) {
        for path in ["/healthz", "/metrics"] {
            let (code, took) = timed_get(http, path).await;
            assert_eq!(
                code,
                Some(200),
                "{path} did not answer during the Kafka outage:\n{}",
                relay.log_text()
            );
            assert!(
                took < Duration::from_secs(1),
                "{path} took {took:?} during the Kafka outage (at {:?}):\n{}",
                outage.elapsed(),
                relay.log_text()
            );
            probes += 1;
            if took > slowest.0 {
                slowest = (took, path);
            }
        }
        if let Some(status) = relay.try_status() {
            panic!("relay exited with {status}:\n{}", relay.log_text());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!(
        "kafka unreachable 15 s: {probes} HTTP probes, slowest {} in {:?}",
        slowest.1, slowest.0
    );
    assert!(
        relay.log_text().contains("partition count"),
        "the relay should have tried to read the topic's metadata while Kafka was away"
    );

    let broker: SocketAddr = brokers()
        .split(',')
        .next()
        .unwrap()
        .parse()
        .expect("test broker address is host:port");
    let _kafka = Proxy::start(kafka_port, broker).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::SeqCst);
    let all = writer.await.unwrap();
    expect_all(
        "kafka unreachable at start",
        &[db.topic("order")],
        &all,
        Duration::from_secs(90),
        Duration::from_secs(2),
        &relay,
    )
    .await;
    assert!(relay.terminate(Duration::from_secs(30)).success());
    db.cleanup().await;
}

/// Runs a task on the (single) test runtime thread that ticks every 20 ms; returns the
/// longest gap between ticks seen until `stop`.
fn watch_the_runtime_thread(stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<Duration> {
    tokio::spawn(async move {
        let mut longest = Duration::ZERO;
        let mut last = Instant::now();
        while !stop.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(20)).await;
            longest = longest.max(last.elapsed());
            last = Instant::now();
        }
        longest
    })
}

/// The relay's runtime has one thread, as this test's has: records of a topic whose metadata
/// unreachable brokers never give, and dropping the producer, must all leave it free.
#[tokio::test(flavor = "current_thread")]
async fn publisher_never_blocks_a_current_thread_runtime() {
    let config = KafkaConfig {
        // Nothing listens there: every metadata request waits for its timeout.
        brokers: format!("127.0.0.1:{}", free_port()),
        ..KafkaConfig::default()
    };
    let (publisher, _deliveries) = Publisher::new(&config).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = watch_the_runtime_thread(stop.clone());
    let record = |partition: Option<i32>, partition_key: Option<&'static str>| Record {
        topic: "network.orders".into(),
        key: Bytes::from_static(b"event"),
        payload: Some(Bytes::from_static(b"{}")),
        partition,
        partition_key: partition_key.map(|k: &'static str| Bytes::from_static(k.as_bytes())),
        ..Record::default()
    };

    // Every topic's first records wait for its metadata in the publisher (never in
    // librdkafka's queue, which could fill): both sends return at once, and the thread stays
    // free while the metadata reads go on. (A full librdkafka queue is waited out on the
    // timer: src/sink/topic_handles_tests.rs.)
    let began = Instant::now();
    for (seq, id) in [(1, "a"), (2, "b")] {
        publisher
            .send(&record(Some(0), None), seq, id)
            .await
            .unwrap();
    }
    assert!(
        began.elapsed() < Duration::from_millis(100),
        "the sends waited {:?}",
        began.elapsed()
    );

    // A partition key needs the topic's partition count, which unreachable brokers never give:
    // the send either gives up after its tries or queues the record behind a background read.
    // Either way the thread stays free, also while the reads go on.
    let began = Instant::now();
    let keyed = publisher.send(&record(None, Some("agg")), 3, "c").await;
    println!(
        "partition count: send returned {:?} after {:?}",
        keyed.as_ref().map_err(ToString::to_string),
        began.elapsed()
    );
    tokio::time::sleep(Duration::from_secs(3)).await;

    let began = Instant::now();
    drop(publisher);
    let dropped_in = began.elapsed();
    stop.store(true, Ordering::SeqCst);
    let longest = watcher.await.unwrap();
    println!("drop took {dropped_in:?}; longest stall of the runtime thread {longest:?}");
    assert!(
        dropped_in < Duration::from_millis(100),
        "drop took {dropped_in:?}"
    );
    assert!(
        longest < Duration::from_millis(250),
        "the runtime thread stalled for {longest:?}"
    );
}
