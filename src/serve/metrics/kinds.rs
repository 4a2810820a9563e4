//! The metric types the families are made of: thin wrappers over `prometheus-client`'s (so
//! the code counts with plain atomics) and the few that read shared state when scraped.

use std::ops::Deref;
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use prometheus_client::encoding::{EncodeMetric, MetricEncoder};
use prometheus_client::metrics::counter::Counter as PromCounter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{Atomic as GaugeAtomic, ConstGauge, Gauge as PromGauge};
use prometheus_client::metrics::histogram::Histogram as PromHistogram;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Metric, Registry};

use crate::sink::blocked::Blocked;
use crate::sink::kafka_latency::{BrokerLatency, KafkaLatency, Quantiles};
use crate::sink::schema::RegistryHealth;

/// Upper bounds (seconds) of the latency histograms' buckets.
const LATENCY_BUCKETS: [f64; 14] = [
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// The registry while [`Metrics::default`] fills it: each method registers one family and
/// hands back the handle.
pub(super) struct Declare(pub(super) Registry);

impl Declare {
    /// Registers `metric` as `name` (as exposed: a counter's with its `_total`) with `help`
    /// (as exposed, ending in a period).
    pub(super) fn family<M: Metric + Clone>(&mut self, name: &str, help: &str, metric: M) -> M {
        // prometheus-client appends a counter's `_total` and the help's period itself.
        let name = match metric.metric_type() {
            MetricType::Counter => name.strip_suffix("_total").unwrap_or(name),
            _ => name,
        };
        let help = help.strip_suffix('.').unwrap_or(help);
        self.0.register(name, help, metric.clone());
        metric
    }

    pub(super) fn counter(&mut self, name: &str, help: &str) -> Counter {
        self.family(name, help, Counter::default())
    }

    pub(super) fn gauge<N, A>(&mut self, name: &str, help: &str) -> Gauge<N, A>
    where
        Gauge<N, A>: Metric + Clone + Default,
    {
        self.family(name, help, Gauge::default())
    }

    pub(super) fn histogram(&mut self, name: &str, help: &str) -> Histogram {
        self.family(name, help, Histogram::default())
    }
}

/// A registered counter. It derefs to its atomic, so the code counts with `fetch_add` (or
/// `store`s a running total kept elsewhere) and reads with `load`.
#[derive(Debug, Clone, Default)]
pub struct Counter(PromCounter<u64, AtomicU64>);

impl Deref for Counter {
    type Target = AtomicU64;

    fn deref(&self) -> &AtomicU64 {
        self.0.inner()
    }
}

impl EncodeMetric for Counter {
    fn encode(&self, encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        self.0.encode(encoder)
    }

    fn metric_type(&self) -> MetricType {
        self.0.metric_type()
    }
}

/// A registered gauge (`i64` unless said). It derefs to its atomic, as [`Counter`] does.
#[derive(Debug)]
pub struct Gauge<N = i64, A = AtomicI64>(PromGauge<N, A>);

impl<N, A: Default> Default for Gauge<N, A> {
    fn default() -> Self {
        Gauge(PromGauge::default())
    }
}

impl<N, A> Clone for Gauge<N, A> {
    fn clone(&self) -> Self {
        Gauge(self.0.clone())
    }
}

impl Gauge {
    /// A gauge starting at -1 ("unknown").
    pub(super) fn unknown() -> Gauge {
        let gauge: Gauge = Gauge::default();
        gauge.set(-1);
        gauge
    }

    pub(super) fn set(&self, value: i64) {
        self.0.set(value);
    }
}

impl Gauge<f64, AtomicU64> {
    pub(super) fn set(&self, value: f64) {
        self.0.set(value);
    }
}

impl<N, A: GaugeAtomic<N>> Deref for Gauge<N, A> {
    type Target = A;

    fn deref(&self) -> &A {
        self.0.inner()
    }
}

impl<N, A> EncodeMetric for Gauge<N, A>
where
    PromGauge<N, A>: EncodeMetric,
{
    fn encode(&self, encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        self.0.encode(encoder)
    }

    fn metric_type(&self) -> MetricType {
        self.0.metric_type()
    }
}

/// A registered latency histogram, in seconds, with [`LATENCY_BUCKETS`].
#[derive(Debug, Clone)]
pub struct Histogram(PromHistogram);

impl Default for Histogram {
    fn default() -> Self {
        Histogram(PromHistogram::new(LATENCY_BUCKETS))
    }
}

impl Histogram {
    pub fn observe(&self, value: Duration) {
        self.0.observe(value.as_secs_f64());
    }
}

impl EncodeMetric for Histogram {
    fn encode(&self, encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        self.0.encode(encoder)
    }

    fn metric_type(&self) -> MetricType {
        self.0.metric_type()
    }
}

/// A family with a series per label set, shown (help and type) also before its first series,
/// so that the rules and the dashboard find it on a fresh relay.
#[derive(Debug)]
pub(super) struct Labelled<S, M>(pub(super) Family<S, M>);

impl<S: Clone + Eq + std::hash::Hash, M: Default> Default for Labelled<S, M> {
    fn default() -> Self {
        Labelled(Family::default())
    }
}

impl<S, M> Clone for Labelled<S, M> {
    fn clone(&self) -> Self {
        Labelled(self.0.clone())
    }
}

impl<S, M> EncodeMetric for Labelled<S, M>
where
    Family<S, M>: EncodeMetric,
{
    fn encode(&self, encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        self.0.encode(encoder)
    }

    fn metric_type(&self) -> MetricType {
        self.0.metric_type()
    }
}

/// A gauge with a series per value of one label: 1 for the selected value, 0 for the others.
#[derive(Debug, Clone)]
pub(super) struct OneHot {
    label: &'static str,
    values: Vec<&'static str>,
    /// The index in `values` of the selected one; `usize::MAX`: none.
    selected: Arc<AtomicUsize>,
}

impl OneHot {
    pub(super) fn new(label: &'static str, values: Vec<&'static str>) -> OneHot {
        OneHot {
            label,
            values,
            selected: Arc::new(AtomicUsize::new(usize::MAX)),
        }
    }

    pub(super) fn selecting(self, index: usize) -> OneHot {
        self.select(Some(index));
        self
    }

    pub(super) fn select(&self, index: Option<usize>) {
        self.selected.store(index.unwrap_or(usize::MAX), Relaxed);
    }

    pub(super) fn selected(&self) -> Option<usize> {
        Some(self.selected.load(Relaxed)).filter(|i| *i != usize::MAX)
    }
}

impl EncodeMetric for OneHot {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let selected = self.selected();
        for (i, value) in self.values.iter().enumerate() {
            let labels = [(self.label, *value)];
            let one = i64::from(selected == Some(i));
            ConstGauge::new(one).encode(encoder.encode_family(&labels)?)?;
        }
        Ok(())
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Gauge
    }
}

/// A value another part of the relay owns and replaces (each session's producer's latency;
/// the Kafka blocks), shared with the metric that shows it.
#[derive(Debug)]
pub(super) struct Shared<T>(Arc<Mutex<Option<Arc<T>>>>);

impl<T> Default for Shared<T> {
    fn default() -> Self {
        Shared(Arc::new(Mutex::new(None)))
    }
}

impl<T> Clone for Shared<T> {
    fn clone(&self) -> Self {
        Shared(self.0.clone())
    }
}

impl<T> Shared<T> {
    pub(super) fn get(&self) -> Option<Arc<T>> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub(super) fn set(&self, value: Arc<T>) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Some(value);
    }

    pub(super) fn get_or_insert_with(&self, make: impl FnOnce() -> T) -> Arc<T> {
        let mut value = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        value.get_or_insert_with(|| Arc::new(make())).clone()
    }
}

/// `outbox_relay_kafka_blocked`: 1 per reason and topic that Kafka refuses now.
impl EncodeMetric for Shared<Blocked> {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        for block in self.get().map_or_else(Vec::new, |b| b.current()) {
            let labels = [("reason", block.reason.name()), ("topic", &block.subject)];
            ConstGauge::new(1i64).encode(encoder.encode_family(&labels)?)?;
        }
        Ok(())
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Gauge
    }
}

/// `outbox_relay_schema_registry_blocked`: 1 per subject without a schema now.
impl EncodeMetric for Shared<RegistryHealth> {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        for (subject, _) in self.get().map_or_else(Vec::new, |h| h.current()) {
            let labels = [("subject", subject.as_str())];
            ConstGauge::new(1i64).encode(encoder.encode_family(&labels)?)?;
        }
        Ok(())
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Gauge
    }
}

/// `outbox_relay_schema_registry_stale_seconds`: per subject served from a stale `latest`
/// schema, the schema's age.
#[derive(Debug, Clone)]
pub(super) struct StaleSchemas(pub(super) Shared<RegistryHealth>);

impl EncodeMetric for StaleSchemas {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        for (subject, age) in self.0.get().map_or_else(Vec::new, |h| h.stale()) {
            let labels = [("subject", subject.as_str())];
            ConstGauge::new(age.as_secs_f64()).encode(encoder.encode_family(&labels)?)?;
        }
        Ok(())
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Gauge
    }
}

/// Seconds per broker and quantile (`broker`, `quantile` labels) of one of the producer's
/// latencies, over librdkafka's last statistics window.
#[derive(Debug, Clone)]
pub(super) struct BrokerQuantiles(
    pub(super) Shared<KafkaLatency>,
    pub(super) fn(&BrokerLatency) -> Quantiles,
);

impl EncodeMetric for BrokerQuantiles {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let brokers = self.0.get().map(|l| l.brokers()).unwrap_or_default();
        for (broker, latency) in brokers {
            let q = (self.1)(&latency);
            for (quantile, v) in [("0.5", q.p50), ("0.99", q.p99), ("1", q.max)] {
                let labels = [("broker", broker.as_str()), ("quantile", quantile)];
                ConstGauge::new(v).encode(encoder.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Gauge
    }
}

/// `outbox_relay_info`: always 1, the slot, publication and version as its labels.
#[derive(Debug, Clone, Default)]
pub(super) struct Info(pub(super) Arc<Mutex<(String, String)>>);

impl EncodeMetric for Info {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let (slot, publication) = self
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let labels = [
            ("slot", slot.as_str()),
            ("publication", publication.as_str()),
            ("version", env!("CARGO_PKG_VERSION")),
        ];
        ConstGauge::new(1i64).encode(encoder.encode_family(&labels)?)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Gauge
    }
}
