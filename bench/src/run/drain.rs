//! Drain rounds: one backlog drained by `pg_recvlogical` and by the relay once per delivery
//! mode (then the peer, if any), each from its own slot at the same start position.
//!
//! Fair to every contender: an untimed `pg_recvlogical` read of the whole backlog comes first,
//! so that the first one timed does not pay for bringing the WAL into the page cache; the
//! limit (`pg_recvlogical`, timed) is measured before the contenders and again after them, each
//! from its own slot copy; the contenders run in a fixed order: the relay in `--delivery`
//! order, then the peer.

use std::time::Instant;

use super::ctx::{mode_tag, Ctx, RelayRun, Round, DRAIN_STATUS_INTERVAL_MS, DRAIN_TIMEOUT};
use super::peer;
use crate::pg::{create_slot, current_lsn, drop_slot, scalar};
use crate::process::{recvlogical, SystemPerf};
use crate::producer_alone;
use crate::prom::relay_metrics;
use crate::records::{Backlog, Record, RecvlogicalKind, RelayDrain, RelayDrainKind};
use crate::records::{ProducerAlone, ProducerAloneDrain, ProducerAloneDrainKind, Recvlogical};
use crate::util::loadavg;
use crate::wait_slot::{wait_slot, SlotWait};
use crate::walsender_cpu;

/// One drain round of the default phase: N events in transactions of `rows` rows.
pub fn txn_round(ctx: &Ctx, rows: u64) -> Round {
    let events = ctx.settings.events;
    Round {
        round: format!("tx{rows}"),
        shape: "txn",
        txn_rows: rows,
        events,
        preload: format!("CALL bench_preload({events}, {rows})"),
        partitions: ctx.settings.partitions,
        types: Vec::new(),
        serialization: None,
    }
}

/// The topics of a round for delivery mode `mode`, and the relay's topic (template).
fn topics_of(ctx: &Ctx, r: &Round, mode: &str) -> (Vec<String>, String) {
    named_topics(ctx, r, mode_tag(mode))
}

/// The topics of a round named `tag` (a delivery mode's, or the producer alone's).
fn named_topics(ctx: &Ctx, r: &Round, tag: &str) -> (Vec<String>, String) {
    let prefix = format!("{}-{}-{tag}", ctx.topic_prefix(), r.round);
    if r.types.is_empty() {
        return (vec![prefix.clone()], prefix);
    }
    let topics = r.types.iter().map(|t| format!("{prefix}-{t}")).collect();
    (topics, format!("{prefix}-{{aggregatetype}}"))
}

/// Preloads the backlog; returns the end position (read in the same session right after the
/// last COMMIT: the end of that commit record, where both consumers must get to) and the
/// backlog's description.
async fn preload(r: &Round, client: &tokio_postgres::Client) -> anyhow::Result<(String, Backlog)> {
    eprintln!("[bench]   preloading {} events: {}", r.events, r.preload);
    let started = Instant::now();
    client.simple_query(&r.preload).await?;
    let end_lsn = current_lsn(client).await?;
    let avg = "SELECT round(avg(octet_length(payload::text))) FROM (SELECT payload FROM outbox LIMIT 1000) s";
    let toast = "SELECT round(pg_relation_size(reltoastrelid) / 1e6, 1) FROM pg_class WHERE relname = 'outbox'";
    let payload_text = scalar(client, avg).await?.unwrap_or_default();
    let toast_text = scalar(client, toast).await?.unwrap_or_default();
    eprintln!(
        "[bench]   preload took {} ms; end LSN {end_lsn}; payloads ~{payload_text} bytes; TOAST {toast_text} MB",
        started.elapsed().as_millis()
    );
    let (payload_bytes, toast_mb) = (payload_text.parse().ok(), toast_text.parse().ok());
    let backlog = Backlog {
        shape: r.shape.to_string(),
        round: r.round.clone(),
        txn_rows: Some(r.txn_rows),
        events: r.events,
        payload_bytes,
        toast_mb,
        aggregate_types: (!r.types.is_empty()).then_some(r.types.len() as u64),
        serialization: r.serialization.as_ref().map(|(format, _)| format.clone()),
    };
    Ok((end_lsn, backlog))
}

/// Drains one backlog: `pg_recvlogical`, then the relay in every delivery mode.
pub async fn drain_backlog(ctx: &mut Ctx, r: &Round) -> anyhow::Result<()> {
    let db = format!("bench_{}", r.round);
    let recv_slot = format!("bench_recv_{}", r.round);
    let warm_slot = format!("bench_warm_{}", r.round);
    let after_slot = format!("bench_recv_after_{}", r.round);
    eprintln!(
        "[bench] drain {} ({}, {}-row transactions): fresh database {db}",
        r.round, r.shape, r.txn_rows
    );
    let client = ctx.fresh_database(&db).await?;
    // All slots before the preload, at the same position: a copy shares the original's
    // restart and confirmed positions exactly.
    create_slot(&client, &recv_slot).await?;
    let relay_slots = ctx.settings.delivery.iter();
    let relay_slots = relay_slots.map(|mode| format!("bench_relay_{}_{}", r.round, mode_tag(mode)));
    let copies: Vec<String> = [warm_slot.clone(), after_slot.clone()]
        .into_iter()
        .chain(relay_slots)
        .collect();
    for copy in copies {
        client
            .execute(
                "SELECT pg_copy_logical_replication_slot($1, $2)",
                &[&recv_slot, &copy],
            )
            .await?;
    }
    let peer = peer::prepare(ctx, &client, r, &recv_slot).await?;
    let (end_lsn, backlog) = preload(r, &client).await?;
    let mut topics = Vec::new();
    for mode in &ctx.settings.delivery {
        topics.extend(topics_of(ctx, r, mode).0);
    }
    let alone_topics = named_topics(ctx, r, "alone").0;
    if ctx.settings.producer_alone {
        topics.extend(alone_topics.iter().cloned());
    }
    eprintln!("[bench]   creating {} topics", topics.len());
    ctx.create_topics(r.partitions, &topics).await?;
    crate::kafka::touch_topics(&ctx.services.brokers, r.partitions, &topics).await?;

    eprintln!("[bench]   warm-up: pg_recvlogical reading the backlog from {warm_slot}, untimed");
    recvlogical(&ctx.services.pg_bin, &ctx.url(&db), &warm_slot, &end_lsn).await?;
    drop_slot(&client, &warm_slot).await?;
    let limit = Limit {
        db: &db,
        slot: &recv_slot,
        end_lsn: &end_lsn,
        backlog: &backlog,
        after_contenders: false,
    };
    limit_drain(ctx, &client, limit).await?;
    let payloads = match ctx.settings.producer_alone {
        true => sample_payloads(&client).await?,
        false => Vec::new(),
    };
    // pg_recvlogical's slot is done: it would only hold WAL.
    drop_slot(&client, &recv_slot).await?;
    drop(client);

    for mode in ctx.settings.delivery.clone() {
        let (_, template) = topics_of(ctx, r, &mode);
        let serialization = r.serialization.as_ref().map(|(_, env)| env.clone());
        let drain = Drain {
            db: &db,
            end_lsn: &end_lsn,
            mode: &mode,
            template: &template,
            backlog: &backlog,
            extra_env: serialization.unwrap_or_default(),
        };
        relay_drain(ctx, drain).await?;
    }
    if let Some(p) = peer {
        peer::drain(ctx, &p, &db, &end_lsn, &backlog).await?;
    }
    let client = ctx.services.cluster.connect(&db).await?;
    let limit = Limit {
        db: &db,
        slot: &after_slot,
        end_lsn: &end_lsn,
        backlog: &backlog,
        after_contenders: true,
    };
    limit_drain(ctx, &client, limit).await?;
    drop_slot(&client, &after_slot).await?;
    drop(client);
    // Last, so that its records' flushing on the broker is behind every relay's drain.
    if ctx.settings.producer_alone {
        match producer_alone(ctx, r, &alone_topics, &payloads).await {
            Ok(sent) => ctx.record(Record::ProducerAloneDrain(ProducerAloneDrain {
                kind: ProducerAloneDrainKind,
                backlog: backlog.clone(),
                sent,
            }))?,
            Err(e) => {
                let phase = format!("producer alone {}", r.round);
                ctx.record_failure(&phase, "at_least_once", format!("{e:#}"))?;
            }
        }
    }
    // Frees the WAL the slots hold, so every round starts alike.
    ctx.drop_database(&db).await
}

/// A timed `pg_recvlogical` drain of a round's backlog: the walsender's limit.
struct Limit<'a> {
    db: &'a str,
    slot: &'a str,
    end_lsn: &'a str,
    backlog: &'a Backlog,
    /// After every contender of the round (false: before them).
    after_contenders: bool,
}

/// Times `pg_recvlogical` draining `limit.slot` to the end of the backlog, with its
/// walsender's CPU, checks that the slot got there, and records it.
async fn limit_drain(
    ctx: &mut Ctx,
    client: &tokio_postgres::Client,
    limit: Limit<'_>,
) -> anyhow::Result<()> {
    let (db, slot, end_lsn) = (limit.db, limit.slot, limit.end_lsn);
    let when = if limit.after_contenders {
        "after"
    } else {
        "before"
    };
    eprintln!(
        "[bench]   pg_recvlogical draining {slot}, {when} the contenders (load {})",
        loadavg()
    );
    let round = &limit.backlog.round;
    let phase = match limit.after_contenders {
        false => format!("recvlogical-{round}"),
        true => format!("recvlogical-after-{round}"),
    };
    ctx.record_load(phase)?;
    let walsender = walsender_cpu::watch(&ctx.url(db), slot, ctx.clk_tck);
    let seconds = recvlogical(&ctx.services.pg_bin, &ctx.url(db), slot, end_lsn).await;
    let walsender_cpu_seconds = walsender
        .finish("pg_recvlogical", *seconds.as_ref().unwrap_or(&f64::NAN))
        .await;
    let seconds = seconds?;
    eprintln!("[bench]   pg_recvlogical: {seconds:.3} s");
    let check = format!(
        "SELECT confirmed_flush_lsn >= '{end_lsn}' FROM pg_replication_slots WHERE slot_name = '{slot}'"
    );
    if scalar(client, &check).await?.as_deref() != Some("t") {
        anyhow::bail!("pg_recvlogical exited before its slot reached {end_lsn}");
    }
    ctx.record(Record::Recvlogical(Recvlogical {
        kind: RecvlogicalKind,
        backlog: limit.backlog.clone(),
        seconds,
        walsender_cpu_seconds,
        after_contenders: limit.after_contenders,
    }))
}

/// Payloads of the backlog for the producer alone: up to 1,000 rows, 16 MB.
async fn sample_payloads(client: &tokio_postgres::Client) -> anyhow::Result<Vec<String>> {
    let sample = "SELECT payload::text FROM outbox \
                  LIMIT greatest(1, least(1000, 16000000 / (SELECT max(octet_length(payload::text)) FROM (SELECT payload FROM outbox LIMIT 100) s)))";
    Ok((client.query(sample, &[]).await?)
        .iter()
        .filter_map(|row| row.get(0))
        .collect())
}

/// The relay's producer alone sends the backlog's events, with `payloads` sampled from it,
/// to topics of its own.
async fn producer_alone(
    ctx: &Ctx,
    r: &Round,
    topics: &[String],
    payloads: &[String],
) -> anyhow::Result<ProducerAlone> {
    eprintln!(
        "[bench]   the relay's producer alone sending {} events to {} topics (load {})",
        r.events,
        topics.len(),
        loadavg()
    );
    let name = format!("producer-alone-{}", r.round);
    let sent = producer_alone::run_process(&producer_alone::Job {
        brokers: &ctx.services.brokers,
        name: &name,
        dir: &ctx.log_dir,
        topics,
        payloads,
        relay_env: &ctx.settings.relay_env,
        pace: producer_alone::Pace::Backlog { events: r.events },
    })
    .await?;
    eprintln!(
        "[bench]   producer alone: {:.3} s, CPU {:.2} s",
        sent.seconds, sent.cpu_seconds
    );
    Ok(sent)
}

/// One relay drain: its slot of `db` up to `end_lsn` in delivery mode `mode`.
struct Drain<'a> {
    db: &'a str,
    end_lsn: &'a str,
    mode: &'a str,
    template: &'a str,
    backlog: &'a Backlog,
    /// More of the relay's environment (the schema shape's serialization).
    extra_env: Vec<(String, String)>,
}

/// The relay draining its slot.
async fn relay_drain(ctx: &mut Ctx, d: Drain<'_>) -> anyhow::Result<()> {
    let Drain {
        db,
        end_lsn,
        mode,
        template,
        backlog,
        extra_env,
    } = d;
    let tag = mode_tag(mode);
    let slot = format!("bench_relay_{}_{tag}", backlog.round);
    let name = format!("{}-{tag}", backlog.round);
    eprintln!(
        "[bench]   relay ({mode}) draining {slot} into {template} (load {})",
        loadavg()
    );
    let load_before = loadavg();
    // Where the whole machine's time goes (walsender, broker, relay), without call graphs.
    let system_perf = match ctx.settings.perf {
        true => Some(SystemPerf::start(
            &ctx.services
                .run_dir
                .join(format!("perf-system-{name}.data")),
            &ctx.log_dir.join(format!("perf-system-{name}.log")),
        )?),
        false => None,
    };
    let mut env = ctx.mode_env(mode);
    env.push((
        "OUTBOX_RELAY__POSTGRES__STATUS_INTERVAL_MS".into(),
        DRAIN_STATUS_INTERVAL_MS.to_string(),
    ));
    env.extend(extra_env);
    let mut run = RelayRun::new(db, &slot, template, &format!("relay-{name}"), env);
    run.profile_as = ctx.settings.perf.then(|| name.clone());
    let relay = ctx.start_relay(run).await?;
    let url = ctx.url(db);
    let walsender = walsender_cpu::watch(&url, &slot, ctx.clk_tck);
    let waited = wait_slot(&SlotWait {
        url: &url,
        slot: &slot,
        lsn: end_lsn,
        pid: relay.pid(),
        started_ns: relay.started_ns,
        clk_tck: ctx.clk_tck,
        timeout: DRAIN_TIMEOUT,
    })
    .await;
    let drained_s = waited.as_ref().map_or(f64::NAN, |r| r.seconds);
    let walsender_cpu_seconds = walsender.finish("the relay", drained_s).await;
    match waited {
        Ok(reached) => {
            ctx.record(Record::RelayDrain(RelayDrain {
                kind: RelayDrainKind,
                delivery: mode.to_string(),
                backlog: backlog.clone(),
                load_before,
                reached,
                walsender_cpu_seconds,
            }))?;
            record_relay_metrics(ctx, &relay, mode, Some(backlog)).await?;
        }
        Err(e) => ctx.record_failure(
            &format!("drain {name}"),
            mode,
            format!(
                "the relay did not drain {slot} ({e:#}); log: {}",
                relay.log.display()
            ),
        )?,
    }
    relay.stop().await;
    drop(system_perf);
    if ctx.settings.perf {
        let dir = ctx.services.run_dir.display();
        eprintln!("[bench]   profiles: perf report -i {dir}/perf-{name}.data (relay), perf report -i {dir}/perf-system-{name}.data --sort comm (machine)");
    }
    Ok(())
}

/// The running relay's `/metrics` figures (exactly-once's Kafka transactions since it
/// started), when it serves them; `backlog` says which round (none: the big transaction).
pub async fn record_relay_metrics(
    ctx: &mut Ctx,
    relay: &crate::process::Relay,
    mode: &str,
    backlog: Option<&Backlog>,
) -> anyhow::Result<()> {
    if !ctx.serves_metrics {
        return Ok(());
    }
    let Some(url) = relay.metrics_url().await else {
        return Ok(());
    };
    match relay_metrics(&url, mode).await {
        Some(mut m) => {
            m.shape = Some(backlog.map_or("big_txn".into(), |b| b.shape.clone()));
            m.round = backlog.map(|b| b.round.clone());
            ctx.record(Record::RelayMetrics(m))
        }
        None => {
            eprintln!("[bench]   (no metrics scrape)");
            Ok(())
        }
    }
}
