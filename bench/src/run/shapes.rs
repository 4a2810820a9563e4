//! The opt-in shapes (`--shapes`): big payloads, many topics, Avro against none, one big
//! transaction, SIGKILLs.

use std::time::Duration;

use super::ctx::{mode_tag, Ctx, RelayRun, DRAIN_STATUS_INTERVAL_MS};
use super::ctx::{Round, DRAIN_TIMEOUT};
use super::drain::{drain_backlog, record_relay_metrics, txn_round};
use super::latency::wait_streaming;
use crate::latency::{Load, Target};
use crate::pg::{create_slot, current_lsn, drop_slot};
use crate::process::{recvlogical, Relay};
use crate::records::{Backlog, BigTxn, BigTxnKind, Record, Recvlogical, RecvlogicalKind, Resend};
use crate::resend::resend;
use crate::util::{loadavg, unix_ns};
use crate::wait_slot::{wait_slot, SlotWait};

/// Rows per transaction of the payload and topics shapes' backlogs.
const SHAPE_TXN_ROWS: u64 = 10;
/// How long the resend consumer waits, after the writers stopped, for the last ids.
const RESEND_SETTLE: Duration = Duration::from_secs(120);

/// Backlogs of big payloads: `--payload-mb` of payload text per size; MB/s against
/// `pg_recvlogical`.
pub async fn payload_shape(ctx: &mut Ctx) -> anyhow::Result<()> {
    for bytes in ctx.settings.payload_sizes.clone() {
        let events = (ctx.settings.payload_mb * 1_000_000 / bytes.max(1)).max(1);
        let round = Round {
            round: format!("p{bytes}"),
            shape: "payload",
            txn_rows: SHAPE_TXN_ROWS,
            events,
            preload: format!("CALL bench_preload_payload({events}, {SHAPE_TXN_ROWS}, {bytes})"),
            partitions: 1,
            types: Vec::new(),
            serialization: None,
        };
        drain_backlog(ctx, &round).await?;
    }
    Ok(())
}

/// N events over `--topics-count` aggregate types, one topic each (one partition each).
pub async fn topics_shape(ctx: &mut Ctx) -> anyhow::Result<()> {
    let (events, count) = (ctx.settings.events, ctx.settings.topics_count);
    let round = Round {
        round: format!("types{count}"),
        shape: "topics",
        txn_rows: SHAPE_TXN_ROWS,
        events,
        preload: format!("CALL bench_preload_types({events}, {SHAPE_TXN_ROWS}, {count})"),
        partitions: 1,
        types: (0..count).map(|i| format!("a{i}")).collect(),
        serialization: None,
    };
    drain_backlog(ctx, &round).await
}

/// The registry the schema shape encodes against (scripts/bench.sh starts one).
const REGISTRY_URL_VAR: &str = "OUTBOX_BENCH_REGISTRY_URL";

/// The same backlog of N events twice, drained with values sent as they are
/// (`outbox.serialization.format = "none"`) and Avro-encoded against the registry's schema
/// (`bench/order.avsc`, registered by the relay on first use): what the serializer costs
/// in drain ratio and CPU per event. Each format is its own round, beside its own
/// `pg_recvlogical` drain of an identical backlog.
pub async fn schema_shape(ctx: &mut Ctx) -> anyhow::Result<()> {
    let url = std::env::var(REGISTRY_URL_VAR).map_err(|_| {
        anyhow::anyhow!("the schema shape needs a schema registry in {REGISTRY_URL_VAR} (scripts/bench.sh starts one)")
    })?;
    let schema = ctx.repo.join("bench/order.avsc");
    let avro = [
        ("FORMAT", "avro".to_string()),
        ("REGISTRY_URL", url),
        ("AUTO_REGISTER", "true".into()),
        ("SCHEMA_FILE", schema.display().to_string()),
    ];
    let env = avro
        .into_iter()
        .map(|(k, v)| (format!("OUTBOX_RELAY__OUTBOX__SERIALIZATION__{k}"), v))
        .collect();
    for (format, env) in [("none", Vec::new()), ("avro", env)] {
        // The drain's own round of SHAPE_TXN_ROWS-row transactions, under its own name.
        let round = Round {
            round: format!("schema_{format}"),
            shape: "schema",
            serialization: Some((format.to_string(), env)),
            ..txn_round(ctx, SHAPE_TXN_ROWS)
        };
        drain_backlog(ctx, &round).await?;
    }
    Ok(())
}

/// One transaction of `--big-txn-rows` rows, committed while the relay streams: from the
/// commit until the relay's slot confirmed its end, and the relay's peak RSS. Each delivery
/// mode gets its own slot (made just before its transaction) and relay. `pg_recvlogical`
/// then drains the first transaction from a slot made before it, as a reference.
pub async fn big_txn_shape(ctx: &mut Ctx) -> anyhow::Result<()> {
    let (db, recv_slot) = ("bench_bigtxn", "bench_recv_bigtxn");
    let rows = ctx.settings.big_txn_rows;
    eprintln!("[bench] big transaction ({rows} rows): fresh database {db}");
    let client = ctx.fresh_database(db).await?;
    create_slot(&client, recv_slot).await?;
    let mut first_end = None;
    for mode in ctx.settings.delivery.clone() {
        let end = big_txn_mode(ctx, &client, db, &mode).await?;
        first_end = first_end.or(end);
    }
    if let Some(end) = first_end {
        eprintln!("[bench]   pg_recvlogical draining the first transaction from {recv_slot}");
        let seconds = recvlogical(&ctx.services.pg_bin, &ctx.url(db), recv_slot, &end).await?;
        ctx.record(Record::Recvlogical(Recvlogical {
            kind: RecvlogicalKind,
            backlog: Backlog {
                shape: "big_txn".into(),
                round: "bigtxn".into(),
                events: rows,
                ..Backlog::default()
            },
            seconds,
            walsender_cpu_seconds: None,
            after_contenders: false,
        }))?;
    }
    drop(client);
    ctx.drop_database(db).await
}

/// The big transaction in one delivery mode; returns its end position (none when the relay
/// did not start).
async fn big_txn_mode(
    ctx: &mut Ctx,
    client: &tokio_postgres::Client,
    db: &str,
    mode: &str,
) -> anyhow::Result<Option<String>> {
    let tag = mode_tag(mode);
    let (slot, topic) = (
        format!("bench_relay_bigtxn_{tag}"),
        format!("{}-bigtxn-{tag}", ctx.topic_prefix()),
    );
    ctx.create_topics(ctx.settings.partitions, std::slice::from_ref(&topic))
        .await?;
    create_slot(client, &slot).await?;
    let mut env = ctx.mode_env(mode);
    env.push((
        "OUTBOX_RELAY__POSTGRES__STATUS_INTERVAL_MS".into(),
        DRAIN_STATUS_INTERVAL_MS.to_string(),
    ));
    let name = format!("relay-bigtxn-{tag}");
    let mut relay = ctx
        .start_relay(RelayRun::new(db, &slot, &topic, &name, env))
        .await?;
    if let Err(e) = wait_streaming(ctx, db, &slot, &mut relay).await {
        let message = format!(
            "the relay did not start ({e:#}); log: {}",
            relay.log.display()
        );
        ctx.record_failure("big-txn", mode, message)?;
        relay.stop().await;
        return Ok(None);
    }
    let rows = ctx.settings.big_txn_rows;
    eprintln!(
        "[bench]   {mode}: one {rows}-row transaction (load {})",
        loadavg()
    );
    ctx.record_load(format!("bigtxn-{tag}"))?;
    client
        .simple_query(&format!("CALL bench_preload({rows}, {rows})"))
        .await?;
    let end_lsn = current_lsn(client).await?;
    let commit_ns = unix_ns();
    let url = ctx.url(db);
    let waited = wait_slot(&SlotWait {
        url: &url,
        slot: &slot,
        lsn: &end_lsn,
        pid: relay.pid(),
        started_ns: commit_ns,
        clk_tck: ctx.clk_tck,
        timeout: DRAIN_TIMEOUT,
    })
    .await;
    match waited {
        Ok(reached) => {
            let big = BigTxn {
                kind: BigTxnKind,
                delivery: mode.to_string(),
                events: rows as f64,
                reached,
                relay_kafka_transactions: None,
            };
            ctx.record(Record::BigTxn(big))?;
            record_relay_metrics(ctx, &relay, mode, None).await?;
        }
        Err(e) => {
            let message = format!(
                "the relay did not confirm the transaction ({e:#}); log: {}",
                relay.log.display()
            );
            ctx.record_failure("big-txn", mode, message)?;
        }
    }
    relay.stop().await;
    drop_slot(client, &slot).await?;
    Ok(Some(end_lsn))
}

/// Starts the relay and checks that it is still running a second later; tries again up to
/// 5 times (after a SIGKILL, the old walsender may hold the slot for a moment).
async fn start_relay_checked(
    ctx: &Ctx,
    run: impl Fn() -> RelayRun,
) -> anyhow::Result<Option<Relay>> {
    for attempt in 1..=5 {
        let mut relay = ctx.start_relay(run()).await?;
        tokio::time::sleep(Duration::from_secs(1)).await;
        if relay.running() {
            return Ok(Some(relay));
        }
        eprintln!(
            "[bench]   the relay exited at start (attempt {attempt}); log: {}",
            relay.log.display()
        );
    }
    Ok(None)
}

/// Writers at `--kill-rate` with known event ids for (kills + 1) × interval s; every
/// interval the relay is SIGKILLed and started again. A read_committed consumer counts the
/// copies of every id.
pub async fn sigkill_shape(ctx: &mut Ctx) -> anyhow::Result<()> {
    for mode in ctx.settings.delivery.clone() {
        sigkill_mode(ctx, &mode).await?;
    }
    Ok(())
}

/// The relay of a sigkill run after `k` kills.
fn kill_run(db: &str, topic: &str, tag: &str, env: &[(String, String)], k: u64) -> RelayRun {
    RelayRun::new(
        db,
        db,
        topic,
        &format!("relay-kill-{tag}-{k}"),
        env.to_vec(),
    )
}

/// Every `--kill-interval` s, SIGKILLs the relay and starts it again; returns the kills
/// made and the relay running at the end (none when one did not restart).
async fn kill_and_restart(
    ctx: &mut Ctx,
    relay: Relay,
    mode: &str,
    run_k: impl Fn(u64) -> RelayRun,
) -> anyhow::Result<(u64, Option<Relay>)> {
    let (kills, interval) = (ctx.settings.kills, ctx.settings.kill_interval);
    let mut relay = Some(relay);
    let mut made = 0;
    for k in 1..=kills {
        tokio::time::sleep(Duration::from_secs(interval)).await;
        let Some(r) = relay.take() else { break };
        eprintln!("[bench]   kill -9 relay {} ({k} of {kills})", r.pid());
        r.kill().await;
        made += 1;
        relay = start_relay_checked(ctx, || run_k(k)).await?;
        if relay.is_none() {
            let message = format!("the relay did not restart after kill {k}");
            ctx.record_failure("sigkill", mode, message)?;
        }
    }
    Ok((made, relay))
}

async fn sigkill_mode(ctx: &mut Ctx, mode: &str) -> anyhow::Result<()> {
    let s = ctx.settings.clone();
    let seconds = (s.kills + 1) * s.kill_interval;
    let tag = mode_tag(mode);
    let db = format!("bench_kill_{tag}");
    let topic = format!("{}-kill-{tag}", ctx.topic_prefix());
    eprintln!(
        "[bench] sigkill ({mode}): {} events/s for {seconds} s, {} kills",
        s.kill_rate, s.kills
    );
    let client = ctx.fresh_database(&db).await?;
    create_slot(&client, &db).await?;
    drop(client);
    ctx.create_topics(s.partitions, std::slice::from_ref(&topic))
        .await?;
    let env = ctx.mode_env(mode);
    let run_k = |k: u64| kill_run(&db, &topic, tag, &env, k);
    let mut relay = ctx.start_relay(run_k(0)).await?;
    if let Err(e) = wait_streaming(ctx, &db, &db, &mut relay).await {
        let message = format!(
            "the relay did not start ({e:#}); log: {}",
            relay.log.display()
        );
        ctx.record_failure("sigkill", mode, message)?;
        relay.stop().await;
        return ctx.drop_database(&db).await;
    }
    ctx.record_load(format!("sigkill-{tag}"))?;
    let (url, brokers) = (ctx.url(&db), ctx.services.brokers.clone());
    let target = Target {
        url: &url,
        brokers: &brokers,
        topic: &topic,
        aggregate_type: "kill",
        spread: 1,
    };
    let load = Load {
        rate: s.kill_rate,
        seconds,
        writers: s.writers,
    };
    let (out, killed) = tokio::join!(
        resend(&target, load, RESEND_SETTLE),
        kill_and_restart(ctx, relay, mode, run_k)
    );
    let (kills, relay) = killed?;
    match out {
        Ok(r) => ctx.record(Record::Resend(Resend {
            delivery: mode.to_string(),
            kills,
            ..r
        }))?,
        Err(e) => ctx.record_failure(
            "sigkill",
            mode,
            format!("outbox-bench resend failed: {e:#}"),
        )?,
    }
    if let Some(relay) = relay {
        relay.stop().await;
    }
    ctx.drop_database(&db).await
}
