//! The report: the JSON lines the script collected, as one table and one JSON file.

use std::collections::BTreeMap;

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

pub(super) fn report(input: &PathBuf, output: &PathBuf, meta: &[String]) -> anyhow::Result<()> {
    let lines = read_lines(input)?;
    let run: serde_json::Map<String, Value> = parse_pairs(meta)?
        .into_iter()
        .map(|(k, v)| (k, v.as_str().map_or(v.clone(), |s| json!(s))))
        .collect();

    // Drain: pair each transaction size's pg_recvlogical and relay runs.
    let mut drain = Vec::new();
    let mut by_size: BTreeMap<u64, (Option<&Value>, Option<&Value>)> = BTreeMap::new();
    for v in of_kind(&lines, "recvlogical") {
        by_size.entry(num(v, "txn_rows") as u64).or_default().0 = Some(v);
    }
    for v in of_kind(&lines, "relay_drain") {
        by_size.entry(num(v, "txn_rows") as u64).or_default().1 = Some(v);
    }
    for (size, (recv, relay)) in &by_size {
        let events = relay.or(*recv).map_or(f64::NAN, |v| num(v, "events"));
        let recv_eps = recv.map_or(f64::NAN, |v| events / num(v, "seconds"));
        let relay_eps = relay.map_or(f64::NAN, |v| events / num(v, "seconds"));
        let target = if *size >= 100 {
            0.8
        } else if *size == 1 {
            0.6
        } else {
            f64::NAN
        };
        drain.push(json!({
            "txn_rows": size,
            "events": events,
            "pg_recvlogical_seconds": recv.map(|v| num(v, "seconds")),
            "pg_recvlogical_events_per_s": recv_eps,
            "relay_seconds": relay.map(|v| num(v, "seconds")),
            "relay_events_per_s": relay_eps,
            "ratio": relay_eps / recv_eps,
            "ratio_target": if target.is_nan() { Value::Null } else { json!(target) },
            "relay_peak_rss_mb": relay.map(|v| num(v, "vmhwm_kb") / 1024.0),
            "relay_cpu_seconds": relay.map(|v| num(v, "cpu_seconds")),
            "relay_cpu_seconds_per_million_events":
                relay.map(|v| num(v, "cpu_seconds") / events * 1e6),
            "relay_threads": relay.map(|v| num(v, "threads")),
            "relay_context_switches_per_1000_events":
                relay.map(|v| num(v, "context_switches") / events * 1000.0),
            "load_before": relay.map(|v| v["load_before"].clone()),
        }));
    }
    let latency: Vec<Value> = of_kind(&lines, "latency").into_iter().cloned().collect();
    let idle = of_kind(&lines, "idle").first().map(|v| (*v).clone());
    let loads: Vec<Value> = of_kind(&lines, "load").into_iter().cloned().collect();

    print_table(&run, &drain, &latency, idle.as_ref());

    let result = json!({
        "run": run,
        "machine": machine(),
        "drain": drain,
        "latency": latency,
        "idle": idle,
        "load": loads,
        "targets": {
            "drain_ratio_100_row_txns": 0.8,
            "drain_ratio_1_row_txns": 0.6,
            "p99_ms_at_5000_per_s": 20,
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

pub(super) fn fmt(v: f64, decimals: usize) -> String {
    if v.is_nan() {
        "-".into()
    } else {
        format!("{v:.decimals$}")
    }
}

pub(super) fn print_table(
    run: &serde_json::Map<String, Value>,
    drain: &[Value],
    latency: &[Value],
    idle: Option<&Value>,
) {
    let m = machine();
    println!(
        "outbox-relay benchmark  {}  ({} cores, {} MB, {}; load before: {})",
        run.get("date").and_then(Value::as_str).unwrap_or(""),
        m["nproc"],
        m["memory_mb"],
        m["cpu_model"].as_str().unwrap_or(""),
        run.get("load_start").and_then(Value::as_str).unwrap_or("?"),
    );
    println!();
    println!("Drain of a backlog (events/s; relay = until the slot confirmed the last commit)");
    println!(
        "{:>9} {:>9} {:>16} {:>12} {:>7} {:>7} {:>13} {:>15}",
        "txn rows",
        "events",
        "pg_recvlogical/s",
        "relay/s",
        "ratio",
        "target",
        "peak RSS MB",
        "CPU s/M events"
    );
    for d in drain {
        println!(
            "{:>9} {:>9} {:>16} {:>12} {:>7} {:>7} {:>13} {:>15}",
            fmt(num(d, "txn_rows"), 0),
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
    println!();
    println!("Latency, 1-row transactions at a steady rate (commit time -> consumer receive, ms)");
    println!(
        "{:>12} {:>12} {:>10} {:>10} {:>8} {:>8} {:>8}   relay's own histogram",
        "target ev/s", "achieved/s", "committed", "received", "p50", "p99", "max"
    );
    for l in latency {
        let r = &l["relay_commit_to_ack"];
        let relay = if r.is_object() {
            format!(
                "p50 <= {} ms, p99 <= {} ms, mean {} ms",
                fmt(num(r, "p50_at_most_ms"), 1),
                fmt(num(r, "p99_at_most_ms"), 1),
                fmt(num(r, "mean_ms"), 1)
            )
        } else {
            "(no /metrics histogram)".into()
        };
        println!(
            "{:>12} {:>12} {:>10} {:>10} {:>8} {:>8} {:>8}   {relay}",
            fmt(num(l, "rate_target"), 0),
            fmt(num(l, "rate_achieved"), 0),
            fmt(num(l, "committed"), 0),
            fmt(num(l, "received"), 0),
            fmt(num(l, "p50_ms"), 1),
            fmt(num(l, "p99_ms"), 1),
            fmt(num(l, "max_ms"), 1),
        );
    }
    if let Some(i) = idle {
        println!();
        println!(
            "Idle: {}% of one core over {} s with no traffic (relay RSS {} MB)",
            fmt(num(i, "cpu_percent"), 2),
            fmt(num(i, "seconds"), 0),
            fmt(num(i, "vmrss_kb") / 1024.0, 1),
        );
    }
}
