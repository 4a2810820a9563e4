//! The report: a run's records as one [`BenchResult`] (the result file) and one table.

use std::path::Path;

use anyhow::Context;

use crate::records::{BigTxn, KafkaTransactions, Latency, PeerDrain, Record, RelayDrain};
use crate::records::{ProducerAlone, Recvlogical, RelayMetrics};
use crate::results::{
    BenchResult, BigTransaction, DeliveryRatio, DrainRow, Machine, OneOrMany, PeerRow, RunMeta,
    Targets,
};

/// Reads `results.jsonl`: one typed record a line.
pub fn read_records(path: &Path) -> anyhow::Result<Vec<Record>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| Record::from_line(l).with_context(|| format!("bad record: {l}")))
        .collect()
}

/// Reads a result file (`bench/results/*.json`).
pub fn read_result(path: &Path) -> anyhow::Result<BenchResult> {
    let text = std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{} is not a result file", path.display()))
}

/// Writes the result file: pretty JSON with its keys sorted, as every earlier file has them.
pub fn write_result(path: &Path, result: &BenchResult) -> anyhow::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    // Through a Value: serde_json's map keeps its keys sorted.
    let value = serde_json::to_value(result)?;
    std::fs::write(path, serde_json::to_string_pretty(&value)? + "\n")
        .with_context(|| format!("write {}", path.display()))
}

/// The order in which delivery modes are shown: at-least-once first.
fn delivery_rank(d: Option<&str>) -> u8 {
    match d {
        Some("at_least_once") => 0,
        Some("exactly_once") => 1,
        _ => 2,
    }
}

/// Owned copies.
fn cloned<T: Clone>(v: &[&T]) -> Vec<T> {
    v.iter().map(|x| (*x).clone()).collect()
}

/// Records of one variant.
macro_rules! of_kind {
    ($records:expr, $variant:ident) => {
        $records
            .iter()
            .filter_map(|r| match r {
                Record::$variant(x) => Some(x),
                _ => None,
            })
            .collect::<Vec<_>>()
    };
}

/// `a / b`, `None` where it is not a number (a phase that did not run).
fn ratio(a: f64, b: f64) -> Option<f64> {
    Some(a / b).filter(|v| v.is_finite())
}

/// The drain ratio the project aims at for a round.
fn ratio_target(shape: &str, txn_rows: u64) -> Option<f64> {
    match (shape, txn_rows) {
        ("txn", 1) => Some(0.6),
        ("txn", r) if r >= 100 => Some(0.8),
        _ => None,
    }
}

/// One row per relay drain of backlog shape `shape`, beside the `pg_recvlogical` drain of the
/// same round and the relay's exactly-once figures of that drain.
fn drains(records: &[Record], shape: &str) -> Vec<DrainRow> {
    let (recvs_after, recvs): (Vec<&Recvlogical>, Vec<&Recvlogical>) =
        of_kind!(records, Recvlogical)
            .into_iter()
            .partition(|v| v.after_contenders);
    let alones = of_kind!(records, ProducerAloneDrain);
    let metrics = of_kind!(records, RelayMetrics);
    let mut relays: Vec<&RelayDrain> = of_kind!(records, RelayDrain)
        .into_iter()
        .filter(|r| r.backlog.shape == shape)
        .collect();
    relays.sort_by_key(|r| {
        (
            r.backlog.txn_rows.unwrap_or(0),
            r.backlog.payload_bytes.unwrap_or(0.0) as u64,
            delivery_rank(Some(&r.delivery)),
        )
    });
    relays
        .into_iter()
        .map(|relay| {
            let round = &relay.backlog.round;
            let of_round =
                |v: &&&Recvlogical| v.backlog.shape == shape && &v.backlog.round == round;
            let recv = recvs.iter().find(of_round);
            let after = recvs_after.iter().find(of_round).map(|v| v.seconds);
            let metric = metrics.iter().find(|m| {
                m.shape.as_deref() == Some(shape)
                    && m.round.as_ref() == Some(round)
                    && m.delivery == relay.delivery
            });
            let alone = alones
                .iter()
                .find(|a| a.backlog.shape == shape && &a.backlog.round == round)
                .map(|a| &a.sent);
            drain_row(relay, recv.copied(), after, alone, metric.copied())
        })
        .collect()
}

fn drain_row(
    relay: &RelayDrain,
    recvlogical: Option<&Recvlogical>,
    recvlogical_after_seconds: Option<f64>,
    alone: Option<&ProducerAlone>,
    metric: Option<&RelayMetrics>,
) -> DrainRow {
    let (b, r) = (&relay.backlog, &relay.reached);
    let recv_s = recvlogical.map(|v| v.seconds);
    let events = b.events as f64;
    let mb = events * b.payload_bytes.unwrap_or(f64::NAN) / 1e6;
    let recv = recv_s.unwrap_or(f64::NAN);
    let relay_s = r.seconds;
    let txn_rows = b.txn_rows.unwrap_or(0);
    DrainRow {
        round: Some(b.round.clone()),
        delivery: Some(relay.delivery.clone()),
        txn_rows: txn_rows as f64,
        events,
        payload_bytes_avg: b.payload_bytes,
        payload_mb: ratio(mb, 1.0),
        aggregate_types: b.aggregate_types.map(|t| t as f64),
        serialization: b.serialization.clone(),
        pg_recvlogical_seconds: recv_s,
        pg_recvlogical_events_per_s: ratio(events, recv),
        pg_recvlogical_payload_mb_per_s: ratio(mb, recv),
        pg_recvlogical_walsender_cpu_seconds: recvlogical.and_then(|v| v.walsender_cpu_seconds),
        pg_recvlogical_after_events_per_s: recvlogical_after_seconds.and_then(|s| ratio(events, s)),
        producer_alone_events_per_s: alone.map(|a| a.events as f64 / a.seconds),
        producer_alone_cpu_seconds_per_million_events: alone
            .map(|a| a.cpu_seconds / a.events as f64 * 1e6),
        relay_seconds: relay_s,
        relay_events_per_s: events / relay_s,
        // From the first poll at or past half-way (by WAL position) to the end.
        relay_second_half_events_per_s: r
            .half_way_seconds
            .map(|t| events * (1.0 - r.half_way_fraction.unwrap_or(f64::NAN)) / (relay_s - t)),
        relay_payload_mb_per_s: ratio(mb, relay_s),
        ratio: ratio(recv, relay_s),
        ratio_target: ratio_target(&b.shape, txn_rows),
        relay_peak_rss_mb: r.vmhwm_kb as f64 / 1024.0,
        relay_cpu_seconds: r.cpu_seconds,
        relay_cpu_seconds_per_million_events: r.cpu_seconds / events * 1e6,
        relay_walsender_cpu_seconds: relay.walsender_cpu_seconds,
        relay_threads: r.threads as f64,
        relay_context_switches_per_1000_events: r.context_switches as f64 / events * 1000.0,
        relay_kafka_transactions: metric.and_then(|m| m.kafka_transactions.clone()),
        relay_events_dead_lettered: metric.and_then(|m| m.events_dead_lettered),
        load_before: relay.load_before.clone(),
    }
}

/// One row per peer drain, beside the same round's `pg_recvlogical` drain and relay drain
/// (at-least-once when it ran, else the first mode).
fn peer_rows(records: &[Record], drain: &[DrainRow]) -> Vec<PeerRow> {
    let recvs: Vec<&Recvlogical> = of_kind!(records, Recvlogical)
        .into_iter()
        .filter(|v| !v.after_contenders)
        .collect();
    of_kind!(records, PeerDrain)
        .into_iter()
        .map(|peer| {
            let round = &peer.backlog.round;
            let recv = recvs
                .iter()
                .find(|v| v.backlog.shape == peer.backlog.shape && &v.backlog.round == round);
            let relay = drain
                .iter()
                .filter(|d| d.round.as_ref() == Some(round))
                .min_by_key(|d| delivery_rank(d.delivery.as_deref()));
            peer_row(peer, recv.map(|r| r.seconds), relay)
        })
        .collect()
}

fn peer_row(peer: &PeerDrain, recv_s: Option<f64>, relay: Option<&DrainRow>) -> PeerRow {
    let (b, r) = (&peer.backlog, &peer.reached);
    let events = b.events as f64;
    let missing = b.events.saturating_sub(peer.kafka_events) as f64;
    let peer_events_per_s = (missing == 0.0).then(|| ratio(events, r.seconds)).flatten();
    let recv_events_per_s = recv_s.and_then(|s| ratio(events, s));
    let cpu = r.cpu_seconds - peer.startup_cpu_seconds;
    PeerRow {
        peer: peer.peer.clone(),
        round: b.round.clone(),
        txn_rows: b.txn_rows.unwrap_or(0) as f64,
        events,
        kafka_events: peer.kafka_events as f64,
        events_missing: missing,
        pg_recvlogical_events_per_s: recv_events_per_s,
        peer_seconds: r.seconds,
        peer_events_per_s,
        ratio: peer_events_per_s
            .zip(recv_events_per_s)
            .and_then(|(p, v)| ratio(p, v)),
        relay_delivery: relay.and_then(|d| d.delivery.clone()),
        relay_events_per_s: relay.map(|d| d.relay_events_per_s),
        relay_over_peer: relay
            .zip(peer_events_per_s)
            .and_then(|(d, p)| ratio(d.relay_events_per_s, p)),
        peer_startup_seconds: peer.startup_seconds,
        peer_startup_cpu_seconds: peer.startup_cpu_seconds,
        peer_peak_rss_mb: r.vmhwm_kb as f64 / 1024.0,
        peer_cpu_seconds: cpu,
        peer_cpu_seconds_per_million_events: cpu / events * 1e6,
        relay_peak_rss_mb: relay.map(|d| d.relay_peak_rss_mb),
        relay_cpu_seconds_per_million_events: relay.map(|d| d.relay_cpu_seconds_per_million_events),
        load_before: peer.load_before.clone(),
    }
}

/// exactly_once ÷ at_least_once for every round that has both.
fn delivery_ratios(drain: &[DrainRow]) -> Vec<DeliveryRatio> {
    let find = |round: &str, d: &str| {
        drain
            .iter()
            .find(|v| v.round.as_deref() == Some(round) && v.delivery.as_deref() == Some(d))
    };
    let mut rounds: Vec<&str> = drain.iter().filter_map(|v| v.round.as_deref()).collect();
    rounds.dedup();
    rounds
        .into_iter()
        .filter_map(|round| {
            let alo = find(round, "at_least_once")?;
            let eo = find(round, "exactly_once")?;
            let rows = alo.txn_rows as u64;
            Some(DeliveryRatio {
                round: round.to_string(),
                txn_rows: rows,
                at_least_once_events_per_s: alo.relay_events_per_s,
                exactly_once_events_per_s: eo.relay_events_per_s,
                exactly_once_over_at_least_once: eo.relay_events_per_s / alo.relay_events_per_s,
                target: (rows >= 10).then_some(0.7),
            })
        })
        .collect()
}

fn sorted_latency(records: &[Record]) -> Vec<Latency> {
    let mut latency: Vec<Latency> = of_kind!(records, Latency).into_iter().cloned().collect();
    latency.sort_by_key(|v| {
        (
            v.rate_target,
            delivery_rank(v.delivery.as_deref()),
            v.tracing.as_deref() == Some("on"),
        )
    });
    latency
}

fn big_transaction(records: &[Record]) -> BigTransaction {
    let metrics_of = |delivery: &str| -> Option<KafkaTransactions> {
        of_kind!(records, RelayMetrics)
            .into_iter()
            .find(|m| m.shape.as_deref() == Some("big_txn") && m.delivery == delivery)
            .and_then(|m| m.kafka_transactions.clone())
    };
    let relay: Vec<BigTxn> = of_kind!(records, BigTxn)
        .into_iter()
        .map(|b| BigTxn {
            relay_kafka_transactions: metrics_of(&b.delivery),
            ..b.clone()
        })
        .collect();
    BigTransaction {
        relay,
        pg_recvlogical: of_kind!(records, Recvlogical)
            .into_iter()
            .find(|v| v.backlog.shape == "big_txn")
            .cloned(),
    }
}

/// The result file of a run's records.
pub fn result_of(records: &[Record], run: RunMeta) -> BenchResult {
    let drain = drains(records, "txn");
    BenchResult {
        run,
        machine: Machine::here(),
        drain_exactly_once_over_at_least_once: Some(delivery_ratios(&drain)),
        peer_drain: Some(peer_rows(records, &drain)).filter(|rows| !rows.is_empty()),
        drain,
        payload: Some(drains(records, "payload")),
        many_topics: Some(drains(records, "topics")),
        serialization: Some(drains(records, "schema")).filter(|rows| !rows.is_empty()),
        big_transaction: Some(big_transaction(records)),
        resend_per_kill: Some(cloned(&of_kind!(records, Resend))),
        latency: sorted_latency(records),
        kafka_transaction_probe: of_kind!(records, TxnProbe).first().map(|p| (*p).clone()),
        idle: Some(OneOrMany::Many(cloned(&of_kind!(records, Idle)))),
        errors: Some(cloned(&of_kind!(records, Error))),
        load: cloned(&of_kind!(records, Load)),
        targets: Targets::default(),
    }
}

/// `report`: from a run's records (`--input`, written to `--output`) or from a result file
/// (`--result`: only printed).
pub fn report(
    input: Option<&Path>,
    output: Option<&Path>,
    result: Option<&Path>,
) -> anyhow::Result<()> {
    if let Some(path) = result {
        crate::table::print(&read_result(path)?);
        return Ok(());
    }
    let (Some(input), Some(output)) = (input, output) else {
        anyhow::bail!("report needs --result FILE, or --input FILE and --output FILE");
    };
    let records = read_records(input)?;
    let meta_path = input.with_file_name("run.json");
    let run: RunMeta = serde_json::from_str(
        &std::fs::read_to_string(&meta_path)
            .with_context(|| format!("read {}", meta_path.display()))?,
    )?;
    let result = result_of(&records, run);
    crate::table::print(&result);
    write_result(output, &result)?;
    println!("\nJSON: {}", output.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::{Backlog, PeerDrainKind, Recvlogical, RecvlogicalKind, SlotReached};

    fn backlog(round: &str, events: u64) -> Backlog {
        Backlog {
            shape: "txn".into(),
            round: round.into(),
            txn_rows: Some(100),
            events,
            ..Backlog::default()
        }
    }

    fn peer(round: &str, events: u64, kafka_events: u64) -> PeerDrain {
        PeerDrain {
            kind: PeerDrainKind,
            peer: "debezium".into(),
            backlog: backlog(round, events),
            load_before: "0.5 0.4 0.3".into(),
            startup_seconds: 4.0,
            startup_cpu_seconds: 6.0,
            kafka_events,
            reached: SlotReached {
                seconds: 10.0,
                confirmed_flush_lsn: Some("0/2".into()),
                target_lsn: "0/2".into(),
                vmhwm_kb: 512 * 1024,
                vmrss_kb: 400 * 1024,
                cpu_seconds: 26.0,
                threads: 40,
                context_switches: 0,
                half_way_seconds: None,
                half_way_fraction: None,
            },
        }
    }

    fn relay_row(round: &str, delivery: &str, events_per_s: f64) -> DrainRow {
        DrainRow {
            round: Some(round.into()),
            delivery: Some(delivery.into()),
            relay_events_per_s: events_per_s,
            relay_peak_rss_mb: 30.0,
            relay_cpu_seconds_per_million_events: 4.0,
            ..DrainRow::default()
        }
    }

    #[test]
    fn a_peer_that_delivered_every_event_gets_its_rate_and_ratios() {
        let relay = relay_row("tx100", "at_least_once", 300_000.0);
        let row = peer_row(
            &peer("tx100", 1_000_000, 1_000_000),
            Some(4.0),
            Some(&relay),
        );
        assert_eq!(row.peer_events_per_s, Some(100_000.0));
        assert_eq!(row.pg_recvlogical_events_per_s, Some(250_000.0));
        assert_eq!(row.ratio, Some(0.4));
        assert_eq!(row.relay_over_peer, Some(3.0));
        assert_eq!(row.events_missing, 0.0);
        // 26 s in all, 6 of them before streaming.
        assert_eq!(row.peer_cpu_seconds, 20.0);
        assert_eq!(row.peer_cpu_seconds_per_million_events, 20.0);
        assert_eq!(row.peer_peak_rss_mb, 512.0);
        assert_eq!(row.relay_delivery.as_deref(), Some("at_least_once"));
    }

    #[test]
    fn a_peer_that_lost_events_has_no_rate() {
        let relay = relay_row("tx100", "at_least_once", 300_000.0);
        let row = peer_row(&peer("tx100", 1_000_000, 999_995), Some(4.0), Some(&relay));
        assert_eq!(row.events_missing, 5.0);
        assert_eq!(row.peer_events_per_s, None);
        assert_eq!(row.ratio, None);
        assert_eq!(row.relay_over_peer, None);
        // More records than events (at-least-once duplicates) lose nothing.
        let row = peer_row(&peer("tx100", 1_000, 1_002), Some(4.0), Some(&relay));
        assert_eq!(row.events_missing, 0.0);
        assert_eq!(row.peer_events_per_s, Some(100.0));
    }

    #[test]
    fn a_drain_row_takes_the_producer_alone_of_its_own_round() {
        let relay = |round: &str| {
            let reached = peer(round, 1_000, 1_000).reached;
            Record::RelayDrain(RelayDrain {
                kind: crate::records::RelayDrainKind,
                delivery: "at_least_once".into(),
                backlog: backlog(round, 1_000),
                load_before: String::new(),
                reached,
                walsender_cpu_seconds: None,
            })
        };
        let alone = |round: &str, seconds: f64| {
            Record::ProducerAloneDrain(crate::records::ProducerAloneDrain {
                kind: crate::records::ProducerAloneDrainKind,
                backlog: backlog(round, 1_000),
                sent: ProducerAlone {
                    events: 1_000,
                    seconds,
                    cpu_seconds: 0.5,
                },
            })
        };
        let records = vec![
            relay("tx1"),
            relay("tx100"),
            alone("tx100", 0.5),
            alone("tx1", 2.0),
        ];
        let rows = drains(&records, "txn");
        let by_round = |round: &str| rows.iter().find(|r| r.round.as_deref() == Some(round));
        let tx1 = by_round("tx1").unwrap();
        assert_eq!(tx1.producer_alone_events_per_s, Some(500.0));
        assert_eq!(
            tx1.producer_alone_cpu_seconds_per_million_events,
            Some(500.0)
        );
        assert_eq!(
            by_round("tx100").unwrap().producer_alone_events_per_s,
            Some(2_000.0)
        );
        let without: Vec<Record> = records.into_iter().take(2).collect();
        assert_eq!(drains(&without, "txn")[0].producer_alone_events_per_s, None);
    }

    #[test]
    fn the_limit_after_the_contenders_is_shown_beside_the_one_the_ratios_are_against() {
        let relay = |round: &str| {
            Record::RelayDrain(RelayDrain {
                kind: crate::records::RelayDrainKind,
                delivery: "at_least_once".into(),
                backlog: backlog(round, 1_000),
                load_before: String::new(),
                reached: peer(round, 1_000, 1_000).reached,
                walsender_cpu_seconds: None,
            })
        };
        let limit = |round: &str, seconds: f64, after_contenders: bool| {
            Record::Recvlogical(Recvlogical {
                kind: RecvlogicalKind,
                backlog: backlog(round, 1_000),
                seconds,
                walsender_cpu_seconds: None,
                after_contenders,
            })
        };
        // The after drain first: the order of the records does not matter.
        let records = vec![
            limit("tx1", 2.0, true),
            limit("tx1", 1.0, false),
            limit("tx100", 0.5, false),
            relay("tx1"),
            relay("tx100"),
            Record::PeerDrain(peer("tx1", 1_000, 1_000)),
        ];
        let rows = drains(&records, "txn");
        let by_round = |round: &str| rows.iter().find(|r| r.round.as_deref() == Some(round));
        let tx1 = by_round("tx1").unwrap();
        assert_eq!(tx1.pg_recvlogical_events_per_s, Some(1_000.0));
        assert_eq!(tx1.pg_recvlogical_after_events_per_s, Some(500.0));
        // The relay took 10 s: the ratio is against the limit before the contenders.
        assert_eq!(tx1.ratio, Some(0.1));
        assert_eq!(
            by_round("tx100").unwrap().pg_recvlogical_after_events_per_s,
            None
        );
        let peers = peer_rows(&records, &rows);
        assert_eq!(peers[0].pg_recvlogical_events_per_s, Some(1_000.0));
        let table = crate::table::render(&result_of(&records, RunMeta::default()));
        let lines: Vec<&str> = table
            .lines()
            .filter(|l| l.contains("before / after"))
            .collect();
        assert_eq!(
            lines,
            ["  100-row: pg_recvlogical before / after the contenders 1000 / 500 ev/s"],
            "{table}"
        );
    }

    #[test]
    fn a_peer_row_is_beside_its_own_round_and_the_at_least_once_relay() {
        let records = vec![
            Record::Recvlogical(Recvlogical {
                kind: RecvlogicalKind,
                backlog: backlog("tx1", 1_000),
                seconds: 1.0,
                walsender_cpu_seconds: None,
                after_contenders: false,
            }),
            Record::Recvlogical(Recvlogical {
                kind: RecvlogicalKind,
                backlog: backlog("tx100", 1_000),
                seconds: 2.0,
                walsender_cpu_seconds: None,
                after_contenders: false,
            }),
            Record::PeerDrain(peer("tx100", 1_000, 1_000)),
        ];
        let drain = vec![
            relay_row("tx1", "at_least_once", 7.0),
            relay_row("tx100", "exactly_once", 200.0),
            relay_row("tx100", "at_least_once", 300.0),
        ];
        let rows = peer_rows(&records, &drain);
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].pg_recvlogical_events_per_s, Some(500.0));
        assert_eq!(rows[0].relay_events_per_s, Some(300.0));
        assert_eq!(rows[0].relay_delivery.as_deref(), Some("at_least_once"));
    }
}
