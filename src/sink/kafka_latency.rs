//! Kafka's share of the latency, from librdkafka's statistics: per broker, how long requests
//! take to come back and how long records wait inside librdkafka before their produce request
//! is made. On `/metrics`, so that a slow broker can be told from a slow relay.

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};

use serde::Deserialize;

/// How often librdkafka reports its statistics (`statistics.interval.ms`), unless
/// `kafka.properties` sets it (0 turns them off).
pub const STATISTICS_INTERVAL_MS: u64 = 5_000;

/// The median, 99th percentile and maximum of one statistics window, in seconds.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Quantiles {
    pub p50: f64,
    pub p99: f64,
    pub max: f64,
}

/// One broker's last statistics window.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct BrokerLatency {
    /// Request round-trip time (librdkafka `rtt`).
    pub rtt: Quantiles,
    /// How long records waited in librdkafka before their produce request was made: the
    /// linger, or the in-flight request limit (librdkafka `int_latency`).
    pub queue: Quantiles,
}

/// The last window of every broker, by librdkafka's broker name (`host:port/id`).
#[derive(Debug, Default)]
pub struct KafkaLatency(Mutex<BTreeMap<String, BrokerLatency>>);

impl KafkaLatency {
    /// Takes one statistics document (JSON); one it cannot read changes nothing.
    pub fn update(&self, json: &[u8]) -> Result<(), serde_json::Error> {
        let stats: RawStats = serde_json::from_slice(json)?;
        let brokers = stats
            .brokers
            .into_values()
            // Bootstrap and coordinator entries are not brokers of their own.
            .filter(|b| b.nodeid >= 0)
            .map(|b| {
                let latency = BrokerLatency {
                    rtt: b.rtt.quantiles(),
                    queue: b.int_latency.quantiles(),
                };
                (b.name, latency)
            })
            .collect();
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = brokers;
        Ok(())
    }

    pub fn brokers(&self) -> BTreeMap<String, BrokerLatency> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// The part of librdkafka's statistics read here (STATISTICS.md).
#[derive(Deserialize)]
struct RawStats {
    #[serde(default)]
    brokers: BTreeMap<String, RawBroker>,
}

#[derive(Deserialize)]
struct RawBroker {
    name: String,
    nodeid: i32,
    #[serde(default)]
    rtt: RawWindow,
    #[serde(default)]
    int_latency: RawWindow,
}

/// A librdkafka window, in microseconds (all 0 when nothing happened in it).
#[derive(Deserialize, Default)]
#[serde(default)]
struct RawWindow {
    p50: i64,
    p99: i64,
    max: i64,
}

impl RawWindow {
    fn quantiles(&self) -> Quantiles {
        let seconds = |us: i64| us.max(0) as f64 / 1e6;
        Quantiles {
            p50: seconds(self.p50),
            p99: seconds(self.p99),
            max: seconds(self.max),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Trimmed from a real document of librdkafka 2.12 (a producer, one broker).
    const STATS: &str = r#"{
        "name": "outbox-relay#producer-1", "type": "producer", "ts": 1, "msg_cnt": 0,
        "brokers": {
            "127.0.0.1:20038/bootstrap": {"name": "127.0.0.1:20038/bootstrap", "nodeid": -1,
                "rtt": {"min": 0, "max": 0, "avg": 0, "p50": 0, "p99": 0, "cnt": 0}},
            "127.0.0.1:20038/1": {"name": "127.0.0.1:20038/1", "nodeid": 1, "state": "UP",
                "int_latency": {"min": 2, "max": 9594, "avg": 400, "p50": 250, "p99": 3599,
                    "p99_99": 9594, "cnt": 5033},
                "rtt": {"min": 120, "max": 19347, "avg": 800, "p50": 703, "p99": 4607,
                    "p99_99": 19347, "cnt": 1202},
                "toppars": {"outbox.event.order-0": {"topic": "outbox.event.order",
                    "partition": 0}}}
        },
        "topics": {}
    }"#;

    #[test]
    fn reads_each_brokers_round_trip_and_queue_time_in_seconds() {
        let latency = KafkaLatency::default();
        latency.update(STATS.as_bytes()).unwrap();
        let brokers = latency.brokers();
        assert_eq!(brokers.len(), 1, "the bootstrap entry is no broker");
        let broker = brokers["127.0.0.1:20038/1"];
        assert_eq!(
            broker.rtt,
            Quantiles {
                p50: 0.000703,
                p99: 0.004607,
                max: 0.019347
            }
        );
        assert_eq!(broker.queue.p99, 0.003599);
    }

    #[test]
    fn an_unreadable_document_keeps_the_last_window() {
        let latency = KafkaLatency::default();
        latency.update(STATS.as_bytes()).unwrap();
        assert!(latency.update(b"{not json").is_err());
        assert_eq!(latency.brokers().len(), 1);
    }
}
