//! `--peer debezium`: the incumbent on the same backlogs. Debezium's embedded engine with its
//! Outbox Event Router (`bench/debezium`, compiled by scripts/bench.sh) drains a third copy of
//! each txn round's slot, after the relays. Its time runs from the moment it streams (its
//! slot is active: the JVM and the connector have started, which is recorded apart) until
//! the slot's `confirmed_flush_lsn` reaches the end, as the relay's; its peak RSS and CPU are
//! sampled then. Every event must be in its topic, or the round counts as failed.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::ClientConfig;
use tokio::process::{Child, Command};
use tokio_postgres::Client;

use super::ctx::{Ctx, Round, DRAIN_TIMEOUT};
use crate::pg::{pg_connect, wait_slot_active};
use crate::proc_stat::cpu_seconds;
use crate::process::{reap, signal};
use crate::records::{Backlog, PeerDrain, PeerDrainKind, Record};
use crate::util::{loadavg, unix_ns};
use crate::wait_slot::{wait_slot, SlotWait};

/// How long the JVM and the connector may take to start streaming.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(180);
/// How long a stopped peer may take to commit and exit before it is SIGKILLed.
const STOP_GRACE: Duration = Duration::from_secs(60);
/// The peer's main class (bench/debezium).
const MAIN_CLASS: &str = "dev.outboxrelay.bench.DebeziumPeer";

/// A round's peer: its slot and topic.
pub struct PeerRound {
    slot: String,
    topic: String,
}

/// Where Debezium sends its heartbeats (`__debezium-heartbeat.<topic.prefix>`; the peer sets
/// the prefix to its topic).
fn heartbeat_topic(topic: &str) -> String {
    format!("__debezium-heartbeat.{topic}")
}

/// Before the preload: the peer's slot (a copy of `source`, so at the same position) and its
/// topics, when `--peer` is given and the round is a txn round.
pub async fn prepare(
    ctx: &Ctx,
    client: &Client,
    r: &Round,
    source: &str,
) -> anyhow::Result<Option<PeerRound>> {
    if ctx.settings.peer.is_none() || r.shape != "txn" {
        return Ok(None);
    }
    let slot = format!("bench_peer_{}", r.round);
    client
        .execute(
            "SELECT pg_copy_logical_replication_slot($1, $2)",
            &[&source, &slot],
        )
        .await
        .with_context(|| format!("copy slot {source} to {slot}"))?;
    let topic = format!("{}-{}-dbz", ctx.topic_prefix(), r.round);
    ctx.create_topics(r.partitions, std::slice::from_ref(&topic))
        .await?;
    // Made now, so that the first heartbeat does not wait for the broker to create it.
    ctx.create_topics(1, &[heartbeat_topic(&topic)]).await?;
    Ok(Some(PeerRound { slot, topic }))
}

/// The peer's classpath (its classes and jars), which scripts/bench.sh resolves.
fn classpath() -> anyhow::Result<String> {
    std::env::var("OUTBOX_BENCH_DEBEZIUM_CLASSPATH").context(
        "OUTBOX_BENCH_DEBEZIUM_CLASSPATH is not set: run --peer debezium with scripts/bench.sh \
         (it compiles bench/debezium with Maven)",
    )
}

/// A running peer JVM, SIGTERMed (it commits what Kafka acknowledged and exits) when dropped.
struct Jvm {
    child: Child,
    pid: u32,
    started_ns: u128,
    log: PathBuf,
}

impl Jvm {
    fn start(ctx: &Ctx, p: &PeerRound, db: &str, name: &str) -> anyhow::Result<Jvm> {
        let log = ctx.log_dir.join(format!("{name}.log"));
        let out =
            std::fs::File::create(&log).with_context(|| format!("create {}", log.display()))?;
        let offsets = ctx.log_dir.join(format!("{name}.offsets"));
        let args = [
            "host=127.0.0.1".to_string(),
            format!("port={}", ctx.services.cluster.port),
            "user=postgres".into(),
            format!("database={db}"),
            format!("slot={}", p.slot),
            "publication=outbox_relay_pub".into(),
            format!("brokers={}", ctx.services.brokers),
            format!("topic={}", p.topic),
            format!("offsets={}", offsets.display()),
        ];
        // Default JVM settings, as a user who sizes nothing; OUTBOX_BENCH_DEBEZIUM_JVM_OPTS
        // (e.g. "-Xmx512m") to measure another choice.
        let jvm_opts = std::env::var("OUTBOX_BENCH_DEBEZIUM_JVM_OPTS").unwrap_or_default();
        let started_ns = unix_ns();
        let child = Command::new("java")
            .args(jvm_opts.split_whitespace())
            .arg("-cp")
            .arg(classpath()?)
            .arg(MAIN_CLASS)
            .args(args)
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .context("start java (the Debezium peer)")?;
        let pid = child.id().context("the Debezium peer exited at once")?;
        Ok(Jvm {
            child,
            pid,
            started_ns,
            log,
        })
    }

    fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    async fn stop(mut self) {
        signal(self.pid, "TERM");
        let _ = tokio::time::timeout(STOP_GRACE, self.child.wait()).await;
    }
}

impl Drop for Jvm {
    fn drop(&mut self) {
        if self.running() {
            signal(self.pid, "TERM");
            reap(&mut self.child, STOP_GRACE);
        }
    }
}

/// Waits until the slot is active (the connector sent START_REPLICATION); returns that
/// moment (ns since the epoch).
async fn wait_streaming(jvm: &mut Jvm, url: &str, slot: &str) -> anyhow::Result<u128> {
    let client = pg_connect(url).await?;
    wait_slot_active(&client, slot, STARTUP_TIMEOUT, "the Debezium peer", || {
        jvm.running()
    })
    .await?;
    Ok(unix_ns())
}

/// Records in `topic`: the sum of its partitions' end offsets (a fresh topic starts at 0).
fn topic_records(brokers: &str, topic: &str) -> anyhow::Result<u64> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .context("create the Kafka consumer")?;
    let timeout = Duration::from_secs(10);
    let metadata = consumer
        .fetch_metadata(Some(topic), timeout)
        .context("topic metadata")?;
    let mut total = 0;
    for p in metadata.topics().iter().flat_map(|t| t.partitions()) {
        let (low, high) = consumer
            .fetch_watermarks(topic, p.id(), timeout)
            .with_context(|| format!("end offset of {topic}/{}", p.id()))?;
        total += high.saturating_sub(low) as u64;
    }
    Ok(total)
}

/// The peer draining its slot of `db` up to `end_lsn`.
pub async fn drain(
    ctx: &mut Ctx,
    p: &PeerRound,
    db: &str,
    end_lsn: &str,
    backlog: &Backlog,
) -> anyhow::Result<()> {
    let peer = ctx.settings.peer.clone().unwrap_or_default();
    let name = format!("{peer}-{}", backlog.round);
    eprintln!(
        "[bench]   {peer} draining {} into {} (load {})",
        p.slot,
        p.topic,
        loadavg()
    );
    let load_before = loadavg();
    let mut jvm = Jvm::start(ctx, p, db, &name)?;
    match measure(ctx, &mut jvm, p, db, end_lsn).await {
        Ok((startup_seconds, startup_cpu_seconds, reached)) => {
            let (brokers, topic) = (ctx.services.brokers.clone(), p.topic.clone());
            let kafka_events =
                tokio::task::spawn_blocking(move || topic_records(&brokers, &topic)).await??;
            eprintln!(
                "[bench]   {peer}: started in {startup_seconds:.1} s; {kafka_events} of {} events in {}",
                backlog.events, p.topic
            );
            ctx.record(Record::PeerDrain(PeerDrain {
                kind: PeerDrainKind,
                peer: peer.clone(),
                backlog: backlog.clone(),
                load_before,
                startup_seconds,
                startup_cpu_seconds,
                kafka_events,
                reached,
            }))?;
            if kafka_events < backlog.events {
                ctx.record_failure(
                    &format!("drain {name}"),
                    &peer,
                    format!(
                        "{} of {} events are not in {}; log: {}",
                        backlog.events - kafka_events,
                        backlog.events,
                        p.topic,
                        jvm.log.display()
                    ),
                )?;
            }
        }
        Err(e) => ctx.record_failure(
            &format!("drain {name}"),
            &peer,
            format!(
                "the peer did not drain {} ({e:#}); log: {}",
                p.slot,
                jvm.log.display()
            ),
        )?,
    }
    jvm.stop().await;
    Ok(())
}

/// Start-up seconds and CPU seconds, then the drain from the moment it streams.
async fn measure(
    ctx: &Ctx,
    jvm: &mut Jvm,
    p: &PeerRound,
    db: &str,
    end_lsn: &str,
) -> anyhow::Result<(f64, f64, crate::records::SlotReached)> {
    let url = ctx.url(db);
    let streaming_ns = wait_streaming(jvm, &url, &p.slot).await?;
    let startup_cpu = cpu_seconds(jvm.pid, ctx.clk_tck)?;
    let startup = streaming_ns.saturating_sub(jvm.started_ns) as f64 / 1e9;
    let reached = wait_slot(&SlotWait {
        url: &url,
        slot: &p.slot,
        lsn: end_lsn,
        pid: jvm.pid,
        started_ns: streaming_ns,
        clk_tck: ctx.clk_tck,
        timeout: DRAIN_TIMEOUT,
    })
    .await?;
    Ok((startup, startup_cpu, reached))
}
