//! The latency phase (one relay, writers at each rate) and the idle window after it.

use std::time::Duration;

use super::ctx::{mode_tag, Ctx, RelayRun};
use crate::latency::{latency, spread_names, LatencyConsumer, Load, Target};
use crate::pg::{create_slot, current_lsn, slot_active_pid, wait_slot_active};
use crate::proc_stat::{cpu_seconds, sample_proc};
use crate::process::Relay;
use crate::producer_alone;
use crate::records::{Idle, IdleKind, ProducerAlone, Record};
use crate::util::loadavg;
use crate::wait_slot::{wait_slot, SlotWait};

/// Waits until the relay just started on `slot` streams: a walsender serves the slot and the
/// relay confirmed the current position (an idle relay confirms the server's keepalive
/// position), within 60 s. A slot made just now is at the current position already, so its
/// position alone would not say that the relay connected.
pub async fn wait_streaming(
    ctx: &Ctx,
    db: &str,
    slot: &str,
    relay: &mut Relay,
) -> anyhow::Result<()> {
    let client = ctx.services.cluster.connect(db).await?;
    wait_slot_active(&client, slot, STREAMING_TIMEOUT, "the relay", || {
        relay.running()
    })
    .await?;
    let lsn = current_lsn(&client).await?;
    let url = ctx.url(db);
    wait_slot(&SlotWait {
        url: &url,
        slot,
        lsn: &lsn,
        pid: relay.pid(),
        started_ns: relay.started_ns,
        clk_tck: ctx.clk_tck,
        timeout: STREAMING_TIMEOUT,
    })
    .await
    .map(|_| ())
}

/// How long a relay may take to stream its slot.
const STREAMING_TIMEOUT: Duration = Duration::from_secs(60);

/// The relay's environment for `--tracing` run `tracing` (a span per event, exported to the
/// local sink that drops them), and the name suffix of such a run.
fn tracing_env(
    ctx: &mut Ctx,
    tracing: &str,
) -> anyhow::Result<(Vec<(String, String)>, &'static str)> {
    if tracing != "on" {
        return Ok((Vec::new(), ""));
    }
    let port = match ctx.otlp_port {
        Some(port) => port,
        None => {
            let counts = ctx.log_dir.join("otlp-sink-counts.json");
            let port = crate::otlp_sink::start(&counts)?;
            eprintln!("[bench]   OTLP sink on 127.0.0.1:{port}");
            *ctx.otlp_port.insert(port)
        }
    };
    let env = vec![
        ("OUTBOX_RELAY__TRACING__ENABLED".into(), "true".into()),
        (
            "OUTBOX_RELAY__TRACING__ENDPOINT".into(),
            format!("http://127.0.0.1:{port}/v1/traces"),
        ),
    ];
    Ok((env, "_tr"))
}

/// Latency at each rate, then idle CPU, with one relay in delivery mode `mode`, tracing
/// `tracing` (`off` or `on`).
pub async fn latency_phase(ctx: &mut Ctx, mode: &str, tracing: &str) -> anyhow::Result<()> {
    let (tracing_env, suffix) = tracing_env(ctx, tracing)?;
    let tag = format!("{}{suffix}", mode_tag(mode));
    let (db, slot) = (
        format!("bench_latency_{tag}"),
        format!("bench_latency_{tag}"),
    );
    eprintln!("[bench] latency ({mode}): fresh database {db}");
    let client = ctx.fresh_database(&db).await?;
    create_slot(&client, &slot).await?;
    drop(client);
    let topics: Vec<String> = (ctx.settings.rates.iter())
        .flat_map(|&rate| spread_names(&rate_names(ctx, &tag, rate).0, ctx.settings.latency_topics))
        .collect();
    ctx.create_topics(ctx.settings.partitions, &topics).await?;
    // One relay for all rates; the topic follows the rows' aggregatetype.
    let mut env = ctx.mode_env(mode);
    env.extend(tracing_env);
    let template = format!("{}-lat-{tag}-{{aggregatetype}}", ctx.topic_prefix());
    let name = format!("relay-latency-{tag}");
    let mut relay = ctx
        .start_relay(RelayRun::new(&db, &slot, &template, &name, env))
        .await?;
    if let Err(e) = wait_streaming(ctx, &db, &slot, &mut relay).await {
        let message = format!(
            "the latency relay did not start ({e:#}); log: {}",
            relay.log.display()
        );
        ctx.record_failure("latency", mode, message)?;
        relay.stop().await;
        return ctx.drop_database(&db).await;
    }
    let metrics_url = match ctx.serves_metrics {
        true => relay.metrics_url().await,
        false => None,
    };
    if let Some(url) = &metrics_url {
        eprintln!("[bench]   relay metrics on {url}");
    }
    for rate in ctx.settings.rates.clone() {
        one_rate(
            ctx,
            &relay,
            (mode, tracing, &tag),
            rate,
            &db,
            metrics_url.as_deref(),
        )
        .await?;
    }
    save_metrics(ctx, metrics_url.as_deref(), &tag).await;
    idle_phase(ctx, &relay, mode).await?;
    relay.stop().await;
    ctx.drop_database(&db).await
}

/// One latency rate: writers on the relay's database, the relay's CPU around them.
async fn one_rate(
    ctx: &mut Ctx,
    relay: &Relay,
    (mode, tracing, tag): (&str, &str, &str),
    rate: u64,
    db: &str,
    metrics_url: Option<&str>,
) -> anyhow::Result<()> {
    let s = &ctx.settings;
    eprintln!(
        "[bench] latency ({mode}, tracing {tracing}): {rate} events/s for {} s after {} s of \
         warm-up (load {})",
        s.rate_seconds,
        s.warm_up_seconds,
        loadavg()
    );
    ctx.record_load(format!("latency-{tag}-{rate}"))?;
    let (url, (topic, aggregate_type)) = (ctx.url(db), rate_names(ctx, tag, rate));
    let target = Target {
        url: &url,
        brokers: &ctx.services.brokers,
        topic: &topic,
        aggregate_type: &aggregate_type,
        spread: ctx.settings.latency_topics,
    };
    let load = Load {
        rate,
        seconds: ctx.settings.rate_seconds,
        writers: ctx.settings.writers,
    };
    let consumer = LatencyConsumer::start_warm(&target, load, ctx.settings.warm_up_seconds).await?;
    let client = ctx.services.cluster.connect(db).await?;
    let walsender = slot_active_pid(&client, &format!("bench_latency_{tag}")).await?;
    drop(client);
    let cpu = |pid: Option<u32>| pid.and_then(|pid| cpu_seconds(pid, ctx.clk_tck).ok());
    let (c0, w0) = (cpu_seconds(relay.pid(), ctx.clk_tck)?, cpu(walsender));
    let mut out = latency(&target, load, consumer, metrics_url).await?;
    let (c1, w1) = (cpu_seconds(relay.pid(), ctx.clk_tck)?, cpu(walsender));
    out.delivery = Some(mode.to_string());
    out.tracing = Some(tracing.to_string());
    out.relay_cpu_seconds = Some(round3(c1 - c0));
    out.walsender_cpu_seconds = w0.zip(w1).map(|(w0, w1)| round3(w1 - w0));
    if ctx.settings.producer_alone {
        match producer_alone_at(ctx, &target.topics(), rate, tag).await {
            Ok(sent) => out.producer_alone_cpu_seconds = Some(round3(sent.cpu_seconds)),
            Err(e) => {
                let phase = format!("producer alone at {rate}/s");
                ctx.record_failure(&phase, mode, format!("{e:#}"))?;
            }
        }
    }
    ctx.record(Record::Latency(out))
}

/// The relay's producer alone at `rate` over the rate's topics (warm now: the relay wrote to
/// them) for as long as the measured window, after a short warm-up.
async fn producer_alone_at(
    ctx: &Ctx,
    topics: &[String],
    rate: u64,
    tag: &str,
) -> anyhow::Result<ProducerAlone> {
    let seconds = ctx.settings.rate_seconds;
    eprintln!(
        "[bench]   the relay's producer alone at {rate}/s over {} topics for {seconds} s",
        topics.len()
    );
    let payloads: Vec<String> = (0..1000).map(crate::latency::payload).collect();
    let name = format!("producer-alone-{tag}-{rate}");
    let sent = producer_alone::run_process(&producer_alone::Job {
        brokers: &ctx.services.brokers,
        name: &name,
        dir: &ctx.log_dir,
        topics,
        payloads: &payloads,
        relay_env: &ctx.settings.relay_env,
        pace: producer_alone::Pace::Steady {
            rate,
            seconds,
            warm_up_seconds: ALONE_WARM_UP_SECONDS,
        },
    })
    .await?;
    eprintln!(
        "[bench]   producer alone: CPU {:.2} s over {:.1} s",
        sent.cpu_seconds, sent.seconds
    );
    Ok(sent)
}

/// The producer alone's warm-up: its connection and the topics' metadata.
const ALONE_WARM_UP_SECONDS: u64 = 3;

/// Rate `rate`'s topic `…-lat-{tag}-r{rate}` and aggregate type `r{rate}`; with
/// `--latency-topics` its rows spread over that many topics ([`Target::topics`]).
fn rate_names(ctx: &Ctx, tag: &str, rate: u64) -> (String, String) {
    (
        format!("{}-lat-{tag}-r{rate}", ctx.topic_prefix()),
        format!("r{rate}"),
    )
}

/// Rounded to 3 decimals, as the figures of `/proc` differences are printed.
fn round3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

/// If the relay serves Prometheus metrics, keep a scrape next to the results.
async fn save_metrics(ctx: &Ctx, metrics_url: Option<&str>, tag: &str) {
    let Some(url) = metrics_url else { return };
    if let Some(text) = crate::prom::scrape_text(url).await {
        let path = ctx.log_dir.join(format!("metrics-{tag}.txt"));
        if std::fs::write(&path, text).is_ok() {
            eprintln!("[bench]   relay metrics saved: {}", path.display());
        }
    }
}

/// CPU of the latency relay (delivery mode `mode`) over the idle window with nothing to do.
async fn idle_phase(ctx: &mut Ctx, relay: &Relay, mode: &str) -> anyhow::Result<()> {
    let seconds = ctx.settings.idle_seconds;
    eprintln!("[bench] idle ({mode}): relay CPU over {seconds} s with no traffic");
    // Let the last deliveries and status updates pass.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let c0 = cpu_seconds(relay.pid(), ctx.clk_tck)?;
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    let c1 = cpu_seconds(relay.pid(), ctx.clk_tck)?;
    let rss = sample_proc(relay.pid(), ctx.clk_tck)?.vmrss_kb;
    ctx.record(Record::Idle(Idle {
        kind: IdleKind,
        delivery: Some(mode.to_string()),
        seconds,
        cpu_seconds: round3(c1 - c0),
        cpu_percent: round3(100.0 * (c1 - c0) / seconds as f64),
        vmrss_kb: rss,
    }))
}
