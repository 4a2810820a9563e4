//! `outbox-bench run`: the benchmark's phases, in order, with typed records.
//!
//! scripts/bench.sh builds the binaries, starts PostgreSQL and Kafka (scripts/services.sh)
//! and runs this with the services' environment; this makes the databases, slots, preloads
//! and topics, runs `pg_recvlogical` and the relays (owned values that stop them when
//! dropped), measures, and writes the result file. Parts:
//!
//! - `options`: the command line (bench.sh's) and what it resolves to;
//! - `ctx`: what every phase shares (settings, services, names, the records);
//! - `drain`, `latency`, `shapes`: the phases; `meta`: the result file's `run` section;
//! - `peer`: `--peer debezium`, the incumbent draining the same backlogs.

mod ctx;
mod drain;
mod latency;
mod meta;
pub mod options;
mod peer;
mod shapes;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};

use crate::kafka::{create_topics, txn_probe, warm_up, ProbeLoad};
use crate::records::Record;
use crate::report::{result_of, write_result};
use crate::util::loadavg;
use ctx::{Ctx, Services};
use options::Options;

/// Runs the benchmark; an error or Ctrl-C drops the run, and with it every process it
/// started.
pub async fn run(options: Options) -> anyhow::Result<()> {
    tokio::select! {
        result = run_all(options) => result,
        _ = tokio::signal::ctrl_c() => bail!("interrupted: the relays and pg_recvlogical are stopped"),
    }
}

async fn run_all(options: Options) -> anyhow::Result<()> {
    let check_only = options.check_options;
    let settings = options.resolve()?;
    if check_only {
        return Ok(());
    }
    let services = Services::from_env()?;
    let repo =
        std::env::var_os("OUTBOX_BENCH_REPO").map_or(std::env::current_dir()?, PathBuf::from);
    let now = jiff::Timestamp::now();
    let run_id = now.strftime("%Y%m%d%H%M%S").to_string();
    let output = settings.output.clone().unwrap_or_else(|| {
        repo.join(format!(
            "bench/results/{}.json",
            now.strftime("%Y-%m-%d-%H%M")
        ))
    });
    let load_start = loadavg();
    let mut ctx = Ctx::new(settings, services, repo, run_id)?;
    eprintln!(
        "[bench] run {}: N={}; logs and raw results in {}",
        ctx.run_id,
        ctx.settings.events,
        ctx.log_dir.display()
    );
    // A freshly started broker takes a moment to hand out producer ids; the first relay
    // would otherwise wait for that inside its timed drain.
    warm_up(&ctx.services.brokers).await?;
    if ctx.settings.delivery.iter().any(|m| m == "exactly_once") {
        exactly_once_setup(&mut ctx).await?;
    }
    let payload_bytes = payload_size(&ctx).await?;
    phases(&mut ctx).await?;
    let run = meta::run_meta(&ctx, payload_bytes, load_start);
    // Beside results.jsonl, so that `outbox-bench report --input` can make the file again.
    let run_json = ctx.log_dir.join("run.json");
    std::fs::write(&run_json, serde_json::to_string_pretty(&run)?)
        .with_context(|| format!("write {}", run_json.display()))?;
    let result = result_of(ctx.records(), run);
    crate::table::print(&result);
    write_result(&output, &result)?;
    println!("\nJSON: {}", output.display());
    if ctx.failures > 0 {
        bail!(
            "{} phase(s) failed: see FAILED above and the logs in {}",
            ctx.failures,
            ctx.log_dir.display()
        );
    }
    Ok(())
}

/// exactly_once's progress topic, made before anything is timed (one partition,
/// compacted, as the relay would make it), and what a Kafka transaction costs without the
/// relay: the floor under exactly-once's commit time and commit-to-visible latency.
async fn exactly_once_setup(ctx: &mut Ctx) -> anyhow::Result<()> {
    let brokers = ctx.services.brokers.clone();
    let compact = ["cleanup.policy=compact".to_string()];
    create_topics(
        &brokers,
        1,
        &compact,
        std::slice::from_ref(&ctx.progress_topic),
    )
    .await?;
    let probe_topic = format!("{}-probe", ctx.topic_prefix());
    ctx.create_topics(ctx.settings.partitions, std::slice::from_ref(&probe_topic))
        .await?;
    let load = ProbeLoad {
        transactions: 50,
        records: 100,
        pause: Duration::ZERO,
    };
    let probe =
        tokio::task::spawn_blocking(move || txn_probe(&brokers, &probe_topic, &load)).await?;
    match probe {
        Ok(p) => ctx.record(Record::TxnProbe(p)),
        Err(e) => ctx.record_failure(
            "txn-probe",
            "exactly_once",
            format!("a bare transactional producer failed: {e:#}"),
        ),
    }
}

/// The phases the settings ask for.
async fn phases(ctx: &mut Ctx) -> anyhow::Result<()> {
    if ctx.settings.drain {
        for rows in ctx.settings.txn_sizes.clone() {
            let round = drain::txn_round(ctx, rows);
            drain::drain_backlog(ctx, &round).await?;
        }
    }
    if ctx.settings.latency {
        for mode in ctx.settings.delivery.clone() {
            for tracing in ctx.settings.tracing_runs.clone() {
                latency::latency_phase(ctx, &mode, tracing).await?;
            }
        }
    }
    for shape in ctx.settings.shapes.clone() {
        match shape.as_str() {
            "payload" => shapes::payload_shape(ctx).await?,
            "topics" => shapes::topics_shape(ctx).await?,
            "schema" => shapes::schema_shape(ctx).await?,
            "big-txn" => shapes::big_txn_shape(ctx).await?,
            _ => shapes::sigkill_shape(ctx).await?,
        }
    }
    Ok(())
}

/// Average payload size of the preload, from a small sample.
async fn payload_size(ctx: &Ctx) -> anyhow::Result<f64> {
    let db = "bench_sample";
    let migration = ctx.repo.join("migrations/001_outbox.sql");
    let client = ctx
        .services
        .cluster
        .fresh_database(db, &[&migration])
        .await?;
    ctx::run_file(&client, &ctx.repo.join("bench/preload.sql")).await?;
    client.simple_query("CALL bench_preload(1000, 100)").await?;
    let avg = crate::pg::scalar(
        &client,
        "SELECT round(avg(octet_length(payload::text))) FROM outbox",
    )
    .await?
    .and_then(|v| v.parse().ok())
    .context("no payload size")?;
    drop(client);
    ctx.drop_database(db).await?;
    Ok(avg)
}
