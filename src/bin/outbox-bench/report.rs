//! The report: the JSON lines the script collected, as one table and one JSON file.

use super::*;

pub(super) fn read_lines(path: &PathBuf) -> anyhow::Result<Vec<Value>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).with_context(|| format!("bad JSON line: {l}")))
        .collect()
}

pub(super) fn of_kind<'a>(lines: &'a [Value], kind: &str) -> Vec<&'a Value> {
    lines.iter().filter(|v| v["kind"] == kind).collect()
}

pub(super) fn num(v: &Value, key: &str) -> f64 {
    v[key].as_f64().unwrap_or(f64::NAN)
}

pub(super) fn machine() -> Value {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let cpuinfo = read("/proc/cpuinfo");
    let cpu_model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, m)| m.trim().to_string())
        .unwrap_or_default();
    let mem_kb: u64 = read("/proc/meminfo")
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    json!({
        "nproc": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "memory_mb": mem_kb / 1024,
        "cpu_model": cpu_model,
        "kernel": read("/proc/sys/kernel/osrelease").trim(),
        "librdkafka": rdkafka::util::get_rdkafka_version().1,
    })
}

/// The order in which delivery modes are shown: at-least-once first.
fn delivery_rank(d: &str) -> u8 {
    match d {
        "at_least_once" => 0,
        "exactly_once" => 1,
        _ => 2,
    }
}

fn str_of<'a>(v: &'a Value, key: &str) -> &'a str {
    v[key].as_str().unwrap_or("")
}

/// One row per relay drain of backlog shape `shape`, beside the `pg_recvlogical` drain of the
/// same backlog (same round) and the relay's exactly-once figures of that drain.
fn drains(lines: &[Value], shape: &str) -> Vec<Value> {
    let of_shape = |kind: &str| -> Vec<&Value> {
        of_kind(lines, kind)
            .into_iter()
            .filter(|v| str_of(v, "shape") == shape)
            .collect()
    };
    let recvs = of_shape("recvlogical");
    let metrics = of_shape("relay_metrics");
    let mut relays = of_shape("relay_drain");
    relays.sort_by_key(|v| {
        (
            num(v, "txn_rows") as u64,
            num(v, "payload_bytes") as u64,
            delivery_rank(str_of(v, "delivery")),
        )
    });
    relays
        .into_iter()
        .map(|relay| {
            let round = str_of(relay, "round");
            let delivery = str_of(relay, "delivery");
            let recv = recvs.iter().find(|v| str_of(v, "round") == round);
            let metric = metrics
                .iter()
                .find(|v| str_of(v, "round") == round && str_of(v, "delivery") == delivery);
            let events = num(relay, "events");
            let payload = num(relay, "payload_bytes");
            let mb = events * payload / 1e6;
            let recv_s = recv.map_or(f64::NAN, |v| num(v, "seconds"));
            let relay_s = num(relay, "seconds");
            let target = match (shape, num(relay, "txn_rows") as u64) {
                ("txn", 1) => json!(0.6),
                ("txn", r) if r >= 100 => json!(0.8),
                _ => Value::Null,
            };
            json!({
                "round": round,
                "delivery": delivery,
                "txn_rows": relay["txn_rows"],
                "events": events,
                "payload_bytes_avg": relay["payload_bytes"],
                "payload_mb": mb,
                "aggregate_types": relay["aggregate_types"],
                "pg_recvlogical_seconds": recv.map(|v| num(v, "seconds")),
                "pg_recvlogical_events_per_s": events / recv_s,
                "pg_recvlogical_payload_mb_per_s": mb / recv_s,
                "relay_seconds": relay_s,
                "relay_events_per_s": events / relay_s,
                // From the first poll at or past half-way (by WAL position) to the end.
                "relay_second_half_events_per_s": relay["half_way_seconds"].as_f64().map(|t| {
                    events * (1.0 - num(relay, "half_way_fraction")) / (relay_s - t)
                }),
                "relay_payload_mb_per_s": mb / relay_s,
                "ratio": recv_s / relay_s,
                "ratio_target": target,
                "relay_peak_rss_mb": num(relay, "vmhwm_kb") / 1024.0,
                "relay_cpu_seconds": num(relay, "cpu_seconds"),
                "relay_cpu_seconds_per_million_events": num(relay, "cpu_seconds") / events * 1e6,
                "relay_threads": relay["threads"],
                "relay_context_switches_per_1000_events":
                    num(relay, "context_switches") / events * 1000.0,
                "relay_kafka_transactions": metric.map(|m| m["kafka_transactions"].clone()),
                "load_before": relay["load_before"],
            })
        })
        .collect()
}

/// exactly_once ÷ at_least_once for every round that has both.
fn delivery_ratios(drain: &[Value]) -> Vec<Value> {
    let find = |round: &str, d: &str| {
        drain
            .iter()
            .find(|v| str_of(v, "round") == round && str_of(v, "delivery") == d)
    };
    let mut rounds: Vec<&str> = drain.iter().map(|v| str_of(v, "round")).collect();
    rounds.dedup();
    rounds
        .into_iter()
        .filter_map(|round| {
            let alo = find(round, "at_least_once")?;
            let eo = find(round, "exactly_once")?;
            let rows = num(alo, "txn_rows") as u64;
            Some(json!({
                "round": round,
                "txn_rows": rows,
                "at_least_once_events_per_s": alo["relay_events_per_s"],
                "exactly_once_events_per_s": eo["relay_events_per_s"],
                "exactly_once_over_at_least_once":
                    num(eo, "relay_events_per_s") / num(alo, "relay_events_per_s"),
                "target": if rows >= 10 { json!(0.7) } else { Value::Null },
            }))
        })
        .collect()
}

pub(super) fn report(input: &PathBuf, output: &PathBuf, meta: &[String]) -> anyhow::Result<()> {
    let lines = read_lines(input)?;
    let run: serde_json::Map<String, Value> = parse_pairs(meta)?
        .into_iter()
        .map(|(k, v)| (k, v.as_str().map_or(v.clone(), |s| json!(s))))
        .collect();

    let drain = drains(&lines, "txn");
    let drain_delivery = delivery_ratios(&drain);
    let payload = drains(&lines, "payload");
    let topics = drains(&lines, "topics");
    let cloned =
        |kind: &str| -> Vec<Value> { of_kind(&lines, kind).into_iter().cloned().collect() };
    let mut latency = cloned("latency");
    latency.sort_by_key(|v| {
        (
            num(v, "rate_target") as u64,
            delivery_rank(str_of(v, "delivery")),
            str_of(v, "tracing") == "on",
        )
    });
    let metrics_of = |shape: &str, delivery: &str| {
        of_kind(&lines, "relay_metrics")
            .into_iter()
            .find(|m| str_of(m, "shape") == shape && str_of(m, "delivery") == delivery)
            .map(|m| m["kafka_transactions"].clone())
    };
    let big_txn = BigTxn {
        relay: cloned("big_txn")
            .into_iter()
            .map(|mut b| {
                b["relay_kafka_transactions"] =
                    json!(metrics_of("big_txn", str_of(&b, "delivery")));
                b
            })
            .collect(),
        recvlogical: of_kind(&lines, "recvlogical")
            .into_iter()
            .find(|v| str_of(v, "shape") == "big_txn")
            .cloned(),
    };
    let resend = cloned("resend");
    let idle = cloned("idle");
    let errors = cloned("error");
    let loads = cloned("load");
    let txn_probe = of_kind(&lines, "txn_probe").first().map(|v| (*v).clone());

    let tables = Tables {
        drain: &drain,
        drain_delivery: &drain_delivery,
        payload: &payload,
        topics: &topics,
        big_txn: &big_txn,
        resend: &resend,
        latency: &latency,
        idle: &idle,
        errors: &errors,
        txn_probe: txn_probe.as_ref(),
    };
    print_table(&run, &tables);

    let result = json!({
        "run": run,
        "machine": machine(),
        "drain": drain,
        "drain_exactly_once_over_at_least_once": drain_delivery,
        "payload": payload,
        "many_topics": topics,
        "big_transaction": {
            "relay": big_txn.relay,
            "pg_recvlogical": big_txn.recvlogical,
        },
        "resend_per_kill": resend,
        "latency": latency,
        "kafka_transaction_probe": txn_probe,
        "idle": idle,
        "errors": errors,
        "load": loads,
        "targets": {
            "drain_ratio_100_row_txns": 0.8,
            "drain_ratio_1_row_txns": 0.6,
            "exactly_once_drain_over_at_least_once_10_and_100_row_txns": 0.7,
            "p99_ms_at_5000_per_s": 20,
            "exactly_once_p99_ms_at_5000_per_s": 150,
            "peak_rss_mb": 64,
            "idle_cpu_percent_of_core": 1,
        },
    });
    if let Some(dir) = output.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(output, serde_json::to_string_pretty(&result)? + "\n")
        .with_context(|| format!("write {}", output.display()))?;
    println!("\nJSON: {}", output.display());
    Ok(())
}

/// The one-transaction shape: the relay's commit-to-acknowledgement per delivery mode, and
/// `pg_recvlogical`'s drain of the same transaction.
pub(super) struct BigTxn {
    relay: Vec<Value>,
    recvlogical: Option<Value>,
}

/// Everything the printed report shows.
pub(super) struct Tables<'a> {
    drain: &'a [Value],
    drain_delivery: &'a [Value],
    payload: &'a [Value],
    topics: &'a [Value],
    big_txn: &'a BigTxn,
    resend: &'a [Value],
    latency: &'a [Value],
    idle: &'a [Value],
    errors: &'a [Value],
    /// A bare transactional producer's commit times (no relay), with exactly-once.
    txn_probe: Option<&'a Value>,
}

pub(super) fn fmt(v: f64, decimals: usize) -> String {
    if v.is_nan() {
        "-".into()
    } else {
        format!("{v:.decimals$}")
    }
}

/// Short name of a delivery mode for the tables.
fn mode(v: &Value) -> &'static str {
    match str_of(v, "delivery") {
        "exactly_once" => "exactly",
        "at_least_once" | "" => "at-least",
        _ => "?",
    }
}

/// "n txns, r rec/txn, commit p99 <= x ms" for exactly-once runs; empty otherwise.
fn kafka_transactions_text(t: &Value) -> String {
    if !t.is_object() {
        return String::new();
    }
    let commit = &t["commit_seconds"];
    format!(
        "{} Kafka txns ({} aborted), {} rec/txn, commit p50 <= {} ms, p99 <= {} ms",
        fmt(num(t, "committed"), 0),
        fmt(num(t, "aborted"), 0),
        fmt(num(t, "records_per_transaction"), 0),
        fmt(num(commit, "p50_at_most_ms"), 1),
        fmt(num(commit, "p99_at_most_ms"), 1),
    )
}

pub(super) fn print_table(run: &serde_json::Map<String, Value>, t: &Tables<'_>) {
    let m = machine();
    println!(
        "outbox-relay benchmark  {}  ({} cores, {} MB, {}; load before: {})",
        run.get("date").and_then(Value::as_str).unwrap_or(""),
        m["nproc"],
        m["memory_mb"],
        m["cpu_model"].as_str().unwrap_or(""),
        run.get("load_start").and_then(Value::as_str).unwrap_or("?"),
    );
    if !t.drain.is_empty() {
        println!();
        println!("Drain of a backlog (events/s; relay = until the slot confirmed the last commit)");
        println!(
            "{:>9} {:>9} {:>9} {:>16} {:>12} {:>7} {:>7} {:>13} {:>15}",
            "txn rows",
            "delivery",
            "events",
            "pg_recvlogical/s",
            "relay/s",
            "ratio",
            "target",
            "peak RSS MB",
            "CPU s/M events"
        );
        for d in t.drain {
            println!(
                "{:>9} {:>9} {:>9} {:>16} {:>12} {:>7} {:>7} {:>13} {:>15}",
                fmt(num(d, "txn_rows"), 0),
                mode(d),
                fmt(num(d, "events"), 0),
                fmt(num(d, "pg_recvlogical_events_per_s"), 0),
                fmt(num(d, "relay_events_per_s"), 0),
                fmt(num(d, "ratio"), 2),
                d["ratio_target"]
                    .as_f64()
                    .map_or("-".into(), |t| format!(">={t}")),
                fmt(num(d, "relay_peak_rss_mb"), 1),
                fmt(num(d, "relay_cpu_seconds_per_million_events"), 2),
            );
        }
        for d in t.drain {
            let text = kafka_transactions_text(&d["relay_kafka_transactions"]);
            if !text.is_empty() {
                println!("  {}-row, exactly-once: {text}", fmt(num(d, "txn_rows"), 0));
            }
        }
    }
    if !t.drain_delivery.is_empty() {
        println!();
        println!(
            "Exactly-once / at-least-once, relay drain events/s (target >= 0.7 for 10, 100 rows)"
        );
        for r in t.drain_delivery {
            println!(
                "{:>9}-row: {:>7}  ({} vs {} events/s)",
                fmt(num(r, "txn_rows"), 0),
                fmt(num(r, "exactly_once_over_at_least_once"), 2),
                fmt(num(r, "exactly_once_events_per_s"), 0),
                fmt(num(r, "at_least_once_events_per_s"), 0),
            );
        }
    }
    if !t.payload.is_empty() {
        println!();
        println!("Big payloads (10-row transactions; MB = 10^6 bytes of payload text)");
        println!(
            "{:>9} {:>9} {:>8} {:>8} {:>14} {:>10} {:>10} {:>7} {:>13} {:>15}",
            "payload B",
            "delivery",
            "events",
            "MB",
            "pg_recvl. MB/s",
            "relay MB/s",
            "relay ev/s",
            "ratio",
            "peak RSS MB",
            "CPU s/M events"
        );
        for d in t.payload {
            println!(
                "{:>9} {:>9} {:>8} {:>8} {:>14} {:>10} {:>10} {:>7} {:>13} {:>15}",
                fmt(num(d, "payload_bytes_avg"), 0),
                mode(d),
                fmt(num(d, "events"), 0),
                fmt(num(d, "payload_mb"), 0),
                fmt(num(d, "pg_recvlogical_payload_mb_per_s"), 1),
                fmt(num(d, "relay_payload_mb_per_s"), 1),
                fmt(num(d, "relay_events_per_s"), 0),
                fmt(num(d, "ratio"), 2),
                fmt(num(d, "relay_peak_rss_mb"), 1),
                fmt(num(d, "relay_cpu_seconds_per_million_events"), 1),
            );
        }
    }
    if !t.topics.is_empty() {
        println!();
        println!("Many topics (10-row transactions, one topic per aggregate type)");
        println!(
            "{:>7} {:>9} {:>9} {:>16} {:>12} {:>14} {:>7} {:>13} {:>15}",
            "topics",
            "delivery",
            "events",
            "pg_recvlogical/s",
            "relay/s",
            "2nd half ev/s",
            "ratio",
            "peak RSS MB",
            "CPU s/M events"
        );
        for d in t.topics {
            println!(
                "{:>7} {:>9} {:>9} {:>16} {:>12} {:>14} {:>7} {:>13} {:>15}",
                fmt(num(d, "aggregate_types"), 0),
                mode(d),
                fmt(num(d, "events"), 0),
                fmt(num(d, "pg_recvlogical_events_per_s"), 0),
                fmt(num(d, "relay_events_per_s"), 0),
                fmt(num(d, "relay_second_half_events_per_s"), 0),
                fmt(num(d, "ratio"), 2),
                fmt(num(d, "relay_peak_rss_mb"), 1),
                fmt(num(d, "relay_cpu_seconds_per_million_events"), 2),
            );
        }
    }
    if !t.big_txn.relay.is_empty() {
        println!();
        println!("One big transaction (relay streaming when it commits; commit -> slot confirmed)");
        if let Some(r) = &t.big_txn.recvlogical {
            println!(
                "  pg_recvlogical draining the same transaction afterwards: {} s",
                fmt(num(r, "seconds"), 2)
            );
        }
        for b in &t.big_txn.relay {
            println!(
                "  {:>9}: {} rows, commit -> last ack {} s ({} events/s), peak RSS {} MB, CPU {} s {}",
                mode(b),
                fmt(num(b, "events"), 0),
                fmt(num(b, "seconds"), 2),
                fmt(num(b, "events") / num(b, "seconds"), 0),
                fmt(num(b, "vmhwm_kb") / 1024.0, 1),
                fmt(num(b, "cpu_seconds"), 2),
                kafka_transactions_text(&b["relay_kafka_transactions"]),
            );
        }
    }
    if !t.resend.is_empty() {
        println!();
        println!("Re-sent events per SIGKILL (writers at a steady rate, read_committed consumer)");
        println!(
            "{:>9} {:>8} {:>6} {:>10} {:>10} {:>11} {:>9} {:>8}",
            "delivery",
            "rate/s",
            "kills",
            "committed",
            "received",
            "duplicates",
            "per kill",
            "missing"
        );
        for r in t.resend {
            println!(
                "{:>9} {:>8} {:>6} {:>10} {:>10} {:>11} {:>9} {:>8}",
                mode(r),
                fmt(num(r, "rate_achieved"), 0),
                fmt(num(r, "kills"), 0),
                fmt(num(r, "committed"), 0),
                fmt(num(r, "received"), 0),
                fmt(num(r, "duplicates"), 0),
                fmt(num(r, "duplicates") / num(r, "kills"), 0),
                fmt(num(r, "missing"), 0),
            );
            if num(r, "missing") > 0.0 {
                println!(
                    "  !!!!! {} COMMITTED EVENTS MISSING ({}), e.g. {} !!!!!",
                    fmt(num(r, "missing"), 0),
                    mode(r),
                    r["missing_sample"]
                );
            }
        }
    }
    if !t.latency.is_empty() {
        println!();
        println!(
            "Latency, 1-row transactions at a steady rate (commit time -> consumer receive, ms)"
        );
        println!(
            "{:>12} {:>15} {:>12} {:>10} {:>10} {:>8} {:>8} {:>8}   relay's own histograms (to read: PostgreSQL's share)",
            "target ev/s", "delivery", "achieved/s", "committed", "received", "p50", "p99", "max"
        );
        for l in t.latency {
            let relay = match histogram_text(&l["relay_commit_to_ack"]) {
                Some(ack) => match histogram_text(&l["relay_commit_to_read"]) {
                    Some(read) => format!("to ack {ack}; to read {read}"),
                    None => ack,
                },
                None => "(no /metrics histogram)".into(),
            };
            let relay = match l.get("relay_cpu_seconds").and_then(Value::as_f64) {
                Some(cpu) => format!("relay cpu {cpu:.2} s; {relay}"),
                None => relay,
            };
            println!(
                "{:>12} {:>15} {:>12} {:>10} {:>10} {:>8} {:>8} {:>8}   {relay}",
                fmt(num(l, "rate_target"), 0),
                // `--tracing`: the same rate with a span per event.
                format!(
                    "{}{}",
                    mode(l),
                    if str_of(l, "tracing") == "on" {
                        "+traces"
                    } else {
                        ""
                    }
                ),
                fmt(num(l, "rate_achieved"), 0),
                fmt(num(l, "committed"), 0),
                fmt(num(l, "received"), 0),
                fmt(num(l, "p50_ms"), 1),
                fmt(num(l, "p99_ms"), 1),
                fmt(num(l, "max_ms"), 1),
            );
        }
        for l in t.latency {
            let text = kafka_transactions_text(&l["relay_kafka_transactions"]);
            if !text.is_empty() {
                println!(
                    "  {}/s, exactly-once: {text}",
                    fmt(num(l, "rate_target"), 0)
                );
            }
        }
    }
    if let Some(p) = t.txn_probe {
        let (c, b) = (&p["commit"], &p["begin_to_committed"]);
        println!();
        println!(
            "Broker alone: a transactional producer, {} transactions of {} records: \
             commit p50 {} / p99 {} ms; begin to committed p50 {} / p99 {} ms",
            fmt(num(p, "transactions"), 0),
            fmt(num(p, "records"), 0),
            fmt(num(c, "p50_ms"), 1),
            fmt(num(c, "p99_ms"), 1),
            fmt(num(b, "p50_ms"), 1),
            fmt(num(b, "p99_ms"), 1),
        );
    }
    for i in t.idle {
        println!();
        println!(
            "Idle ({}): {}% of one core over {} s with no traffic (relay RSS {} MB)",
            mode(i),
            fmt(num(i, "cpu_percent"), 2),
            fmt(num(i, "seconds"), 0),
            fmt(num(i, "vmrss_kb") / 1024.0, 1),
        );
    }
    for e in t.errors {
        println!();
        println!(
            "FAILED: {} ({}): {}",
            str_of(e, "phase"),
            mode(e),
            str_of(e, "message")
        );
    }
}

/// A histogram summary of the relay's as text: "p50 <= a ms, p99 <= b ms, mean c ms".
fn histogram_text(r: &Value) -> Option<String> {
    r.is_object().then(|| {
        format!(
            "p50 <= {} ms, p99 <= {} ms, mean {} ms",
            fmt(num(r, "p50_at_most_ms"), 1),
            fmt(num(r, "p99_at_most_ms"), 1),
            fmt(num(r, "mean_ms"), 1)
        )
    })
}
