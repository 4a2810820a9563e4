//! The relay's `/metrics`: one plain HTTP GET and the few series the benchmark reads
//! (Prometheus text format). A leaf but for the record types it fills.

use std::time::Duration;

use crate::records::{HistogramSummary, KafkaTransactions, RelayMetrics, RelayMetricsKind};

/// The relay's commit-to-acknowledgement histogram.
pub const COMMIT_TO_ACK: &str = "outbox_relay_commit_to_ack_seconds";
/// PostgreSQL's share of it: commit to the relay reading the transaction.
pub const COMMIT_TO_READ: &str = "outbox_relay_commit_to_read_seconds";
/// Exactly-once's Kafka transaction histogram: how long a commit took.
const KAFKA_COMMIT: &str = "outbox_relay_kafka_commit_seconds";
const KAFKA_TXN_COMMITTED: &str = "outbox_relay_kafka_transactions_committed_total";
const KAFKA_TXN_ABORTED: &str = "outbox_relay_kafka_transactions_aborted_total";
const KAFKA_TXN_RECORDS: &str = "outbox_relay_kafka_transaction_records_total";
const EVENTS_PUBLISHED: &str = "outbox_relay_events_published_total";
const EVENTS_DEAD_LETTERED: &str = "outbox_relay_events_dead_lettered_total";

/// A Prometheus histogram: cumulative counts per upper bound (seconds), sum and count.
#[derive(Debug, Clone, PartialEq)]
pub struct PromHistogram {
    pub buckets: Vec<(f64, u64)>,
    pub sum: f64,
    pub count: u64,
}

impl PromHistogram {
    pub fn parse(text: &str, name: &str) -> Option<PromHistogram> {
        let mut h = PromHistogram {
            buckets: Vec::new(),
            sum: 0.0,
            count: 0,
        };
        let mut seen = false;
        let bucket_prefix = format!("{name}_bucket{{");
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let Some((series, value)) = line.rsplit_once(' ') else {
                continue;
            };
            if let Some(labels) = series.strip_prefix(&bucket_prefix) {
                let Some(le) = bucket_bound(labels)? else {
                    continue;
                };
                h.buckets.push((le, value.parse::<f64>().ok()? as u64));
                seen = true;
            } else if series == format!("{name}_sum") {
                h.sum = value.parse().ok()?;
            } else if series == format!("{name}_count") {
                h.count = value.parse::<f64>().ok()? as u64;
            }
        }
        h.buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        seen.then_some(h)
    }

    /// The observations made after `earlier` was taken.
    pub fn since(&self, earlier: &PromHistogram) -> PromHistogram {
        let before = |le: f64| {
            earlier
                .buckets
                .iter()
                .find(|(b, _)| *b == le)
                .map_or(0, |(_, c)| *c)
        };
        PromHistogram {
            buckets: self
                .buckets
                .iter()
                .map(|&(le, c)| (le, c.saturating_sub(before(le))))
                .collect(),
            sum: self.sum - earlier.sum,
            count: self.count.saturating_sub(earlier.count),
        }
    }

    /// Upper bound (seconds) of the bucket holding quantile `q`.
    pub fn quantile_bound(&self, q: f64) -> Option<f64> {
        let target = (q * self.count as f64).ceil().max(1.0) as u64;
        self.buckets
            .iter()
            .find(|(_, c)| *c >= target)
            .map(|(le, _)| *le)
    }

    pub fn summary(&self) -> HistogramSummary {
        let ms = |s: Option<f64>| s.filter(|v| v.is_finite()).map(|v| v * 1000.0);
        HistogramSummary {
            count: self.count,
            mean_ms: (self.count > 0).then(|| self.sum / self.count as f64 * 1000.0),
            p50_at_most_ms: ms(self.quantile_bound(0.50)),
            p99_at_most_ms: ms(self.quantile_bound(0.99)),
            source: "relay /metrics histogram (bucket upper bounds)".into(),
        }
    }
}

/// The `le` label of a bucket's labels (`le="0.5"}`): `Some(None)` when it has none, `None`
/// when it does not parse.
fn bucket_bound(labels: &str) -> Option<Option<f64>> {
    let le = labels
        .split(',')
        .find_map(|l| l.strip_prefix("le=\""))
        .map(|l| l.trim_end_matches('}').trim_end_matches('"'));
    match le {
        Some("+Inf") => Some(Some(f64::INFINITY)),
        Some(v) => v.parse().ok().map(Some),
        None => Some(None),
    }
}

/// The summary of histogram `name` between two scrapes; `None` when the relay has no such
/// series.
pub fn histogram_delta(before: &str, after: &str, name: &str) -> Option<HistogramSummary> {
    let before = PromHistogram::parse(before, name)?;
    let after = PromHistogram::parse(after, name)?;
    Some(after.since(&before).summary())
}

/// The value of an unlabelled counter or gauge `name` in a Prometheus text scrape.
pub fn counter(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// Exactly-once's Kafka transactions between two scrapes (from the relay's start when
/// `before` is `None`). `None` when the relay has no such counters or committed none.
pub fn kafka_transactions(before: Option<&str>, after: &str) -> Option<KafkaTransactions> {
    let delta = |name: &str| {
        let a = counter(after, name)?;
        Some(a - before.and_then(|b| counter(b, name)).unwrap_or(0.0))
    };
    let committed = delta(KAFKA_TXN_COMMITTED)?;
    let aborted = delta(KAFKA_TXN_ABORTED).unwrap_or(0.0);
    if committed == 0.0 && aborted == 0.0 {
        return None;
    }
    let records = delta(KAFKA_TXN_RECORDS);
    let commit = PromHistogram::parse(after, KAFKA_COMMIT).map(|a| {
        match before.and_then(|b| PromHistogram::parse(b, KAFKA_COMMIT)) {
            Some(b) => a.since(&b),
            None => a,
        }
    });
    Some(KafkaTransactions {
        committed,
        aborted,
        records,
        records_per_transaction: records.map(|r| r / committed),
        commit_seconds: commit.map(|h| h.summary()),
    })
}

/// One scrape of the relay: its exactly-once figures since it started and its
/// commit-to-acknowledgement histogram. `None` when it serves no metrics.
pub async fn relay_metrics(url: &str, delivery: &str) -> Option<RelayMetrics> {
    let text = scrape_text(url).await?;
    Some(RelayMetrics {
        kind: RelayMetricsKind,
        delivery: delivery.to_string(),
        shape: None,
        round: None,
        kafka_transactions: kafka_transactions(None, &text),
        commit_to_ack: PromHistogram::parse(&text, COMMIT_TO_ACK).map(|h| h.summary()),
        events_published: counter(&text, EVENTS_PUBLISHED),
        events_dead_lettered: counter(&text, EVENTS_DEAD_LETTERED),
    })
}

/// GETs `url` (plain http://host:port/path): the body of a 200 answer, `None` otherwise.
pub async fn scrape_text(url: &str) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rest = url.strip_prefix("http://")?;
    let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
    let fetch = async {
        let mut stream = tokio::net::TcpStream::connect(host).await.ok()?;
        let request = format!("GET /{path} HTTP/1.0\r\nHost: {host}\r\n\r\n");
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut response = String::new();
        stream.read_to_string(&mut response).await.ok()?;
        let (head, body) = response.split_once("\r\n\r\n")?;
        (head.starts_with("HTTP/1.1 200") || head.starts_with("HTTP/1.0 200"))
            .then(|| body.to_string())
    };
    tokio::time::timeout(Duration::from_secs(5), fetch)
        .await
        .ok()
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SCRAPE: &str = "# HELP outbox_relay_commit_to_ack_seconds x
# TYPE outbox_relay_commit_to_ack_seconds histogram
outbox_relay_commit_to_ack_seconds_bucket{le=\"0.005\"} 40
outbox_relay_commit_to_ack_seconds_bucket{le=\"0.01\"} 98
outbox_relay_commit_to_ack_seconds_bucket{le=\"0.02\"} 100
outbox_relay_commit_to_ack_seconds_bucket{le=\"+Inf\"} 100
outbox_relay_commit_to_ack_seconds_sum 0.6
outbox_relay_commit_to_ack_seconds_count 100
outbox_relay_events_published_total 100
outbox_relay_events_dead_lettered_total 2
";

    #[test]
    fn histogram_quantiles_are_bucket_bounds_of_the_difference() {
        let after = PromHistogram::parse(SCRAPE, COMMIT_TO_ACK).unwrap();
        assert_eq!(after.count, 100);
        assert_eq!(after.quantile_bound(0.5), Some(0.01));
        assert_eq!(after.quantile_bound(0.99), Some(0.02));
        let before = PromHistogram {
            buckets: vec![(0.005, 40), (0.01, 40), (0.02, 40), (f64::INFINITY, 40)],
            sum: 0.1,
            count: 40,
        };
        let delta = after.since(&before);
        assert_eq!(delta.count, 60);
        assert_eq!(delta.quantile_bound(0.5), Some(0.01));
        assert!(PromHistogram::parse("other 1\n", COMMIT_TO_ACK).is_none());
        assert_eq!(counter(SCRAPE, EVENTS_PUBLISHED), Some(100.0));
        assert_eq!(counter(SCRAPE, EVENTS_DEAD_LETTERED), Some(2.0));
    }
}
