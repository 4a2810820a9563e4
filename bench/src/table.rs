//! The printed table of a [`BenchResult`], the same for a run just made and a result file
//! read back.

use std::fmt::Write as _;

use crate::records::{HistogramSummary, KafkaTransactions, Latency};
use crate::results::{BenchResult, DrainRow, PeerRow};

/// Prints the table.
pub fn print(r: &BenchResult) {
    print!("{}", render(r));
}

/// The table as text.
pub fn render(r: &BenchResult) -> String {
    let mut out = String::new();
    header(&mut out, r);
    drain(&mut out, &r.drain);
    peer_drain(&mut out, r.peer_drain.as_deref().unwrap_or_default());
    delivery_ratios(&mut out, r);
    payload(&mut out, r.payload.as_deref().unwrap_or_default());
    topics(&mut out, r.many_topics.as_deref().unwrap_or_default());
    serialization(&mut out, r.serialization.as_deref().unwrap_or_default());
    big_transaction(&mut out, r);
    resend(&mut out, r);
    latency(&mut out, &r.latency);
    txn_probe(&mut out, r);
    idle_and_errors(&mut out, r);
    out
}

fn fmt(v: f64, decimals: usize) -> String {
    if v.is_nan() {
        "-".into()
    } else {
        format!("{v:.decimals$}")
    }
}

/// [`fmt`] of a figure that may be missing.
fn fmt_o(v: Option<f64>, decimals: usize) -> String {
    fmt(v.unwrap_or(f64::NAN), decimals)
}

/// Short name of a delivery mode for the tables.
fn mode(delivery: Option<&str>) -> &'static str {
    match delivery {
        Some("exactly_once") => "exactly",
        Some("at_least_once") | Some("") | None => "at-least",
        _ => "?",
    }
}

/// "n txns, r rec/txn, commit p99 <= x ms" for exactly-once runs; empty otherwise.
fn kafka_transactions_text(t: Option<&KafkaTransactions>) -> String {
    let Some(t) = t else {
        return String::new();
    };
    let commit = t.commit_seconds.as_ref();
    format!(
        "{} Kafka txns ({} aborted), {} rec/txn, commit p50 <= {} ms, p99 <= {} ms",
        fmt(t.committed, 0),
        fmt(t.aborted, 0),
        fmt_o(t.records_per_transaction, 0),
        fmt_o(commit.and_then(|c| c.p50_at_most_ms), 1),
        fmt_o(commit.and_then(|c| c.p99_at_most_ms), 1),
    )
}

/// One section of the table: a blank line, its title, the column names and one line per row,
/// each cell right-aligned to its column's width. A width of 0 is free text (the last column).
fn section(out: &mut String, title: &str, columns: &[(&str, usize)], rows: &[Vec<String>]) {
    let _ = writeln!(out);
    let _ = writeln!(out, "{title}");
    let names: Vec<String> = columns.iter().map(|(name, _)| name.to_string()).collect();
    for cells in std::iter::once(&names).chain(rows) {
        let line: Vec<String> = cells
            .iter()
            .zip(columns)
            .map(|(cell, (_, width))| format!("{cell:>width$}"))
            .collect();
        let _ = writeln!(out, "{}", line.join(" "));
    }
}

fn header(out: &mut String, r: &BenchResult) {
    let m = &r.machine;
    let _ = writeln!(
        out,
        "outbox-relay benchmark  {}  ({} cores, {} MB, {}; load before: {})",
        r.run.date, m.nproc, m.memory_mb, m.cpu_model, r.run.load_start,
    );
}

/// How busy each drain's walsender was, in % of a core over the drain: `pg_recvlogical`'s,
/// then the relay's. About 100: that drain was bound by the walsender.
fn walsender_busy(d: &DrainRow) -> String {
    let busy = |cpu: Option<f64>, seconds: Option<f64>| match (cpu, seconds) {
        (Some(cpu), Some(s)) if s > 0.0 => format!("{:.0}", cpu / s * 100.0),
        _ => "-".into(),
    };
    format!(
        "{} / {}",
        busy(
            d.pg_recvlogical_walsender_cpu_seconds,
            d.pg_recvlogical_seconds
        ),
        busy(d.relay_walsender_cpu_seconds, Some(d.relay_seconds))
    )
}

fn drain(out: &mut String, rows: &[DrainRow]) {
    if rows.is_empty() {
        return;
    }
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|d| {
            vec![
                fmt(d.txn_rows, 0),
                mode(d.delivery.as_deref()).into(),
                fmt(d.events, 0),
                fmt_o(d.pg_recvlogical_events_per_s, 0),
                fmt(d.relay_events_per_s, 0),
                fmt_o(d.ratio, 2),
                d.ratio_target.map_or("-".into(), |t| format!(">={t}")),
                fmt(d.relay_peak_rss_mb, 1),
                fmt(d.relay_cpu_seconds_per_million_events, 2),
                walsender_busy(d),
            ]
        })
        .collect();
    section(
        out,
        "Drain of a backlog (events/s; relay = until the slot confirmed the last commit)",
        &[
            ("txn rows", 9),
            ("delivery", 9),
            ("events", 9),
            ("pg_recvlogical/s", 16),
            ("relay/s", 12),
            ("ratio", 7),
            ("target", 7),
            ("peak RSS MB", 13),
            ("CPU s/M events", 15),
            ("walsender % recv/relay", 23),
        ],
        &cells,
    );
    for d in rows {
        let text = kafka_transactions_text(d.relay_kafka_transactions.as_ref());
        if !text.is_empty() {
            let _ = writeln!(out, "  {}-row, exactly-once: {text}", fmt(d.txn_rows, 0));
        }
    }
    producer_alone(out, rows, |d| format!("{}-row", fmt(d.txn_rows, 0)));
    limit_after(out, rows, |d| format!("{}-row", fmt(d.txn_rows, 0)));
}

/// Under a drain table, once per round: `pg_recvlogical` before the contenders (the ratios'
/// reference) and again after them, so that a limit that moved during the round shows.
fn limit_after(out: &mut String, rows: &[DrainRow], label: impl Fn(&DrainRow) -> String) {
    let mut seen: Vec<&str> = Vec::new();
    for d in rows {
        let (Some(after), Some(round)) = (d.pg_recvlogical_after_events_per_s, d.round.as_deref())
        else {
            continue;
        };
        if seen.contains(&round) {
            continue;
        }
        seen.push(round);
        let _ = writeln!(
            out,
            "  {}: pg_recvlogical before / after the contenders {} / {} ev/s",
            label(d),
            fmt_o(d.pg_recvlogical_events_per_s, 0),
            fmt(after, 0),
        );
    }
}

/// `--producer-alone`: under a drain table, each row's Kafka-side limit (the relay's producer
/// with no relay in front, on the same events) beside `pg_recvlogical`, and the relay's share
/// of it; `label` names the row's round.
fn producer_alone(out: &mut String, rows: &[DrainRow], label: impl Fn(&DrainRow) -> String) {
    for d in rows {
        let Some(alone) = d.producer_alone_events_per_s else {
            continue;
        };
        let _ = writeln!(
            out,
            "  {}, {}: the producer alone {} ev/s ({}x pg_recvlogical, {} CPU s/M); relay / alone {}",
            label(d),
            mode(d.delivery.as_deref()),
            fmt(alone, 0),
            fmt_o(d.pg_recvlogical_events_per_s.map(|r| alone / r), 2),
            fmt_o(d.producer_alone_cpu_seconds_per_million_events, 2),
            fmt(d.relay_events_per_s / alone, 2),
        );
    }
}

/// `--peer`: the peer beside pg_recvlogical and the relay on the same backlogs.
fn peer_drain(out: &mut String, rows: &[PeerRow]) {
    if rows.is_empty() {
        return;
    }
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|p| {
            vec![
                fmt(p.txn_rows, 0),
                p.peer.clone(),
                fmt(p.events, 0),
                fmt_o(p.pg_recvlogical_events_per_s, 0),
                match p.peer_events_per_s {
                    Some(v) => fmt(v, 0),
                    None if p.events_missing > 0.0 => format!("LOST {}", fmt(p.events_missing, 0)),
                    None => "-".into(),
                },
                fmt_o(p.ratio, 2),
                fmt_o(p.relay_events_per_s, 0),
                fmt_o(p.relay_over_peer, 2),
                fmt(p.peer_startup_seconds, 1),
                format!(
                    "{} / {}",
                    fmt(p.peer_peak_rss_mb, 0),
                    fmt_o(p.relay_peak_rss_mb, 0)
                ),
                format!(
                    "{} / {}",
                    fmt(p.peer_cpu_seconds_per_million_events, 1),
                    fmt_o(p.relay_cpu_seconds_per_million_events, 1)
                ),
            ]
        })
        .collect();
    section(
        out,
        "Peer on the same backlogs (peer/s from streaming until its slot confirmed the last \
         commit; start-up apart; relay = at-least-once)",
        &[
            ("txn rows", 9),
            ("peer", 9),
            ("events", 9),
            ("pg_recvlogical/s", 16),
            ("peer/s", 12),
            ("ratio", 7),
            ("relay/s", 10),
            ("relay/peer", 10),
            ("start-up s", 10),
            ("RSS MB peer/relay", 17),
            ("CPU s/M peer/relay", 18),
        ],
        &cells,
    );
}

fn delivery_ratios(out: &mut String, r: &BenchResult) {
    let ratios = r
        .drain_exactly_once_over_at_least_once
        .as_deref()
        .unwrap_or_default();
    if ratios.is_empty() {
        return;
    }
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "Exactly-once / at-least-once, relay drain events/s (target >= 0.7 for 10, 100 rows)"
    );
    for r in ratios {
        let _ = writeln!(
            out,
            "{:>9}-row: {:>7}  ({} vs {} events/s)",
            r.txn_rows,
            fmt(r.exactly_once_over_at_least_once, 2),
            fmt(r.exactly_once_events_per_s, 0),
            fmt(r.at_least_once_events_per_s, 0),
        );
    }
}

fn payload(out: &mut String, rows: &[DrainRow]) {
    if rows.is_empty() {
        return;
    }
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|d| {
            vec![
                fmt_o(d.payload_bytes_avg, 0),
                mode(d.delivery.as_deref()).into(),
                fmt(d.events, 0),
                fmt_o(d.payload_mb, 0),
                fmt_o(d.pg_recvlogical_payload_mb_per_s, 1),
                fmt_o(d.relay_payload_mb_per_s, 1),
                fmt(d.relay_events_per_s, 0),
                fmt_o(d.ratio, 2),
                fmt(d.relay_peak_rss_mb, 1),
                fmt(d.relay_cpu_seconds_per_million_events, 1),
            ]
        })
        .collect();
    section(
        out,
        "Big payloads (10-row transactions; MB = 10^6 bytes of payload text)",
        &[
            ("payload B", 9),
            ("delivery", 9),
            ("events", 8),
            ("MB", 8),
            ("pg_recvl. MB/s", 14),
            ("relay MB/s", 10),
            ("relay ev/s", 10),
            ("ratio", 7),
            ("peak RSS MB", 13),
            ("CPU s/M events", 15),
        ],
        &cells,
    );
    producer_alone(out, rows, |d| {
        format!("{} B", fmt_o(d.payload_bytes_avg, 0))
    });
    limit_after(out, rows, |d| {
        format!("{} B", fmt_o(d.payload_bytes_avg, 0))
    });
}

fn topics(out: &mut String, rows: &[DrainRow]) {
    if rows.is_empty() {
        return;
    }
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|d| {
            vec![
                fmt_o(d.aggregate_types, 0),
                mode(d.delivery.as_deref()).into(),
                fmt(d.events, 0),
                fmt_o(d.pg_recvlogical_events_per_s, 0),
                fmt(d.relay_events_per_s, 0),
                fmt_o(d.relay_second_half_events_per_s, 0),
                fmt_o(d.ratio, 2),
                fmt(d.relay_peak_rss_mb, 1),
                fmt(d.relay_cpu_seconds_per_million_events, 2),
            ]
        })
        .collect();
    section(
        out,
        "Many topics (10-row transactions, one topic per aggregate type)",
        &[
            ("topics", 7),
            ("delivery", 9),
            ("events", 9),
            ("pg_recvlogical/s", 16),
            ("relay/s", 12),
            ("2nd half ev/s", 14),
            ("ratio", 7),
            ("peak RSS MB", 13),
            ("CPU s/M events", 15),
        ],
        &cells,
    );
    producer_alone(out, rows, |d| {
        format!("{} topics", fmt_o(d.aggregate_types, 0))
    });
    limit_after(out, rows, |d| {
        format!("{} topics", fmt_o(d.aggregate_types, 0))
    });
}

/// Avro against none: each row beside its own `pg_recvlogical` drain, and its CPU per event
/// over that of `none` in the same delivery mode.
fn serialization(out: &mut String, rows: &[DrainRow]) {
    if rows.is_empty() {
        return;
    }
    let plain_cpu = |delivery: &Option<String>| {
        rows.iter()
            .find(|d| d.delivery == *delivery && d.serialization.as_deref() == Some("none"))
            .map(|d| d.relay_cpu_seconds_per_million_events)
    };
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|d| {
            let cpu = d.relay_cpu_seconds_per_million_events;
            vec![
                d.serialization.clone().unwrap_or_else(|| "-".into()),
                mode(d.delivery.as_deref()).into(),
                fmt(d.events, 0),
                fmt_o(d.pg_recvlogical_events_per_s, 0),
                fmt(d.relay_events_per_s, 0),
                fmt_o(d.ratio, 2),
                fmt(d.relay_peak_rss_mb, 1),
                fmt(cpu, 2),
                fmt_o(plain_cpu(&d.delivery).map(|none| cpu / none), 2),
                fmt_o(d.relay_events_dead_lettered, 0),
            ]
        })
        .collect();
    section(
        out,
        "Schema Registry serialization (10-row transactions; Avro against none, same backlog)",
        &[
            ("format", 6),
            ("delivery", 9),
            ("events", 9),
            ("pg_recvlogical/s", 16),
            ("relay/s", 12),
            ("ratio", 7),
            ("peak RSS MB", 13),
            ("CPU s/M events", 15),
            ("CPU vs none", 12),
            ("dead letters", 13),
        ],
        &cells,
    );
    limit_after(out, rows, |d| d.serialization.clone().unwrap_or_default());
}

fn big_transaction(out: &mut String, r: &BenchResult) {
    let Some(big) = r.big_transaction.as_ref().filter(|b| !b.relay.is_empty()) else {
        return;
    };
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "One big transaction (relay streaming when it commits; commit -> slot confirmed)"
    );
    if let Some(r) = &big.pg_recvlogical {
        let _ = writeln!(
            out,
            "  pg_recvlogical draining the same transaction afterwards: {} s",
            fmt(r.seconds, 2)
        );
    }
    for b in &big.relay {
        let _ = writeln!(
            out,
            "  {:>9}: {} rows, commit -> last ack {} s ({} events/s), peak RSS {} MB, CPU {} s {}",
            mode(Some(&b.delivery)),
            fmt(b.events, 0),
            fmt(b.reached.seconds, 2),
            fmt(b.events / b.reached.seconds, 0),
            fmt(b.reached.vmhwm_kb as f64 / 1024.0, 1),
            fmt(b.reached.cpu_seconds, 2),
            kafka_transactions_text(b.relay_kafka_transactions.as_ref()),
        );
    }
}

fn resend(out: &mut String, r: &BenchResult) {
    let rows = r.resend_per_kill.as_deref().unwrap_or_default();
    if rows.is_empty() {
        return;
    }
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                mode(Some(&r.delivery)).into(),
                fmt(r.rate_achieved, 0),
                r.kills.to_string(),
                r.committed.to_string(),
                r.received.to_string(),
                r.duplicates.to_string(),
                fmt(r.duplicates as f64 / r.kills as f64, 0),
                r.missing.to_string(),
            ]
        })
        .collect();
    section(
        out,
        "Re-sent events per SIGKILL (writers at a steady rate, read_committed consumer)",
        &[
            ("delivery", 9),
            ("rate/s", 8),
            ("kills", 6),
            ("committed", 10),
            ("received", 10),
            ("duplicates", 11),
            ("per kill", 9),
            ("missing", 8),
        ],
        &cells,
    );
    for r in rows.iter().filter(|r| r.missing > 0) {
        let _ = writeln!(
            out,
            "  !!!!! {} COMMITTED EVENTS MISSING ({}), e.g. {:?} !!!!!",
            r.missing,
            mode(Some(&r.delivery)),
            r.missing_sample
        );
    }
}

/// A histogram summary of the relay's as text: "p50 <= a ms, p99 <= b ms, mean c ms".
fn histogram_text(h: Option<&HistogramSummary>) -> Option<String> {
    h.map(|h| {
        format!(
            "p50 <= {} ms, p99 <= {} ms, mean {} ms",
            fmt_o(h.p50_at_most_ms, 1),
            fmt_o(h.p99_at_most_ms, 1),
            fmt_o(h.mean_ms, 1)
        )
    })
}

/// The relay's side of a latency row: its CPU and its own histograms.
fn relay_text(l: &Latency) -> String {
    let relay = match histogram_text(l.relay_commit_to_ack.as_ref()) {
        Some(ack) => match histogram_text(l.relay_commit_to_read.as_ref()) {
            Some(read) => format!("to ack {ack}; to read {read}"),
            None => ack,
        },
        None => "(no /metrics histogram)".into(),
    };
    match l.relay_cpu_seconds {
        Some(cpu) => format!("relay cpu {cpu:.2} s; {relay}"),
        None => relay,
    }
}

fn latency(out: &mut String, rows: &[Latency]) {
    if rows.is_empty() {
        return;
    }
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|l| {
            // `--tracing`: the same rate with a span per event.
            let traces = if l.tracing.as_deref() == Some("on") {
                "+traces"
            } else {
                ""
            };
            // `--latency-topics`: the rate's rows spread over that many topics.
            let spread = l.topics.map_or(String::new(), |t| format!(" /{t}t"));
            vec![
                format!("{}{spread}", l.rate_target),
                format!("{}{traces}", mode(l.delivery.as_deref())),
                fmt(l.rate_achieved, 0),
                l.committed.to_string(),
                l.received.to_string(),
                fmt_o(l.p50_ms, 1),
                fmt_o(l.p99_ms, 1),
                fmt_o(l.max_ms, 1),
                cpu_percent(l.relay_cpu_seconds, l.seconds),
                cpu_percent(l.walsender_cpu_seconds, l.seconds),
                format!("  {}", relay_text(l)),
            ]
        })
        .collect();
    section(
        out,
        "Latency, 1-row transactions at a steady rate (commit time -> consumer receive, ms)",
        &[
            ("target ev/s", 12),
            ("delivery", 15),
            ("achieved/s", 12),
            ("committed", 10),
            ("received", 10),
            ("p50", 8),
            ("p99", 8),
            ("max", 8),
            ("relay CPU%", 11),
            ("walsender%", 11),
            ("  relay's own histograms (to read: PostgreSQL's share)", 0),
        ],
        &cells,
    );
    for l in rows {
        let text = kafka_transactions_text(l.relay_kafka_transactions.as_ref());
        if !text.is_empty() {
            let _ = writeln!(out, "  {}/s, exactly-once: {text}", l.rate_target);
        }
    }
    for (l, cpu) in rows
        .iter()
        .filter_map(|l| Some((l, l.producer_alone_cpu_seconds?)))
    {
        let _ = writeln!(
            out,
            "  {}/s, {}: the relay's producer alone at this rate over the same topics: CPU {} % of a core",
            l.rate_target,
            mode(l.delivery.as_deref()),
            cpu_percent(Some(cpu), l.seconds),
        );
    }
    for (l, w) in rows.iter().filter_map(|l| Some((l, l.warm_up.as_ref()?))) {
        let _ = writeln!(
            out,
            "  {}/s, {}: warm-up before the window, {} records: p50 {} / p99 {} / max {} ms",
            l.rate_target,
            mode(l.delivery.as_deref()),
            w.received,
            fmt_o(w.p50_ms, 1),
            fmt_o(w.p99_ms, 1),
            fmt_o(w.max_ms, 1),
        );
    }
}

/// CPU seconds over a window of `seconds`, as a percentage of one core.
fn cpu_percent(cpu_seconds: Option<f64>, seconds: u64) -> String {
    fmt_o(cpu_seconds.map(|c| 100.0 * c / seconds.max(1) as f64), 1)
}

fn txn_probe(out: &mut String, r: &BenchResult) {
    let Some(p) = &r.kafka_transaction_probe else {
        return;
    };
    let (c, b) = (&p.commit, &p.begin_to_committed);
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "Broker alone: a transactional producer, {} transactions of {} records: \
         commit p50 {} / p99 {} ms; begin to committed p50 {} / p99 {} ms",
        p.transactions,
        p.records,
        fmt(c.p50_ms, 1),
        fmt(c.p99_ms, 1),
        fmt(b.p50_ms, 1),
        fmt(b.p99_ms, 1),
    );
}

fn idle_and_errors(out: &mut String, r: &BenchResult) {
    for i in r.idle.as_ref().map(|i| i.as_slice()).unwrap_or_default() {
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "Idle ({}): {}% of one core over {} s with no traffic (relay RSS {} MB)",
            mode(i.delivery.as_deref()),
            fmt(i.cpu_percent, 2),
            i.seconds,
            fmt(i.vmrss_kb as f64 / 1024.0, 1),
        );
    }
    for e in r.errors.as_deref().unwrap_or_default() {
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "FAILED: {} ({}): {}",
            e.phase,
            mode(Some(&e.delivery)),
            e.message
        );
    }
}
