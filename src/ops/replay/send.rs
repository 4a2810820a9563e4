//! Handing replayed records to Kafka: within the in-flight window (the relay's
//! [`InFlight`], capped lower for a replay), counting acknowledgements and failures, and at the
//! end waiting for every record still in flight.

use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use super::progress::Progress;
use crate::config::Config;
use crate::mapping::OutboxEvent;
use crate::ops::OpsError;
use crate::sink::publisher::{Delivery, Publisher};
use crate::sink::schema::Serializers;
use crate::sink::window::InFlight;

/// Most records in flight during a replay (`kafka.max_in_flight_messages` if lower): a replay
/// has no WAL to keep up with, only a table to walk, so a smaller window costs nothing.
const MAX_IN_FLIGHT: usize = 10_000;
/// Extra wait for acknowledgements beyond `kafka.message_timeout_ms`, after which librdkafka
/// has reported every record one way or the other.
const ACK_GRACE: Duration = Duration::from_secs(10);
/// Failures listed in the report; the rest are counted.
const MAX_LISTED_FAILURES: usize = 5;
/// How often the progress bar moves while only acknowledgements are awaited.
const PROGRESS_INTERVAL: Duration = Duration::from_millis(250);

/// The producer side: sends with a bounded number in flight and counts acknowledgements.
pub(super) struct Sender {
    publisher: Publisher,
    deliveries: mpsc::UnboundedReceiver<Delivery>,
    /// `[outbox.serialization]` and each table's own: records encoded as the live relay
    /// encodes them, by their table's serializer.
    serializers: Serializers,
    window: InFlight,
    pub(super) sent: u64,
    pub(super) acknowledged: u64,
    pub(super) failed: u64,
    pub(super) failures: Vec<String>,
}

impl Sender {
    pub(super) fn new(config: &Config) -> Result<Sender, OpsError> {
        let kafka = &config.kafka;
        let (publisher, deliveries) = Publisher::new(kafka)?;
        let serializers = Serializers::new(&config.outbox)?;
        Ok(Sender {
            publisher,
            deliveries,
            serializers,
            window: InFlight::new(
                kafka.max_in_flight_messages.clamp(1, MAX_IN_FLIGHT),
                kafka.max_in_flight_bytes,
            ),
            sent: 0,
            acknowledged: 0,
            failed: 0,
            failures: Vec::new(),
        })
    }

    /// Waits for room, then hands the record to the producer. A failed delivery seen so far
    /// stops the replay: sending more would only pile up behind a broken topic or broker.
    pub(super) async fn send(
        &mut self,
        event: &OutboxEvent,
        progress: &mut Progress,
    ) -> Result<(), String> {
        while !self.window.has_room() {
            match self.deliveries.recv().await {
                Some(delivery) => self.handle(delivery),
                None => return Err("the Kafka producer went away".into()),
            }
        }
        while let Ok(delivery) = self.deliveries.try_recv() {
            self.handle(delivery);
        }
        progress.update(self.acknowledged);
        if self.failed > 0 {
            return Err("Kafka did not acknowledge a record (see the failures)".into());
        }
        let mut record = std::borrow::Cow::Borrowed(&event.record);
        if let Some(serializer) = self.serializers.get(event.profile) {
            // A replay is run by hand: a payload the schema refuses, or a registry that
            // gives no schema, stops it with the reason (nothing is dead-lettered).
            serializer
                .serialize(record.to_mut())
                .await
                .map_err(|e| format!("event {}: {e}", event.id))?;
        }
        self.publisher
            .send(&record, self.sent, &event.id)
            .await
            .map_err(|e| e.to_string())?;
        self.sent += 1;
        self.window.sent(record.size());
        Ok(())
    }

    fn handle(&mut self, delivery: Delivery) {
        self.window.settled(delivery.bytes);
        match delivery.result {
            Ok(()) => self.acknowledged += 1,
            Err(failure) => {
                self.failed += 1;
                if self.failures.len() < MAX_LISTED_FAILURES {
                    self.failures.push(failure.rejection().to_string());
                }
            }
        }
    }

    /// Waits for every record in flight to be acknowledged or failed. librdkafka reports each
    /// within `message.timeout.ms`; past that (plus a grace) the rest count as failed.
    pub(super) async fn finish(&mut self, message_timeout_ms: u64, progress: &mut Progress) {
        let deadline = Instant::now() + Duration::from_millis(message_timeout_ms) + ACK_GRACE;
        while !self.window.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            let wait = left.min(PROGRESS_INTERVAL);
            match tokio::time::timeout(wait, self.deliveries.recv()).await {
                Ok(Some(delivery)) => self.handle(delivery),
                Ok(None) => break,
                Err(_) if left.is_zero() => break,
                Err(_) => {}
            }
            progress.update(self.acknowledged);
        }
        if !self.window.is_empty() {
            let unanswered = self.window.clear();
            self.failed += unanswered as u64;
            self.failures.push(format!(
                "{unanswered} records got no answer from Kafka within kafka.message_timeout_ms"
            ));
        }
    }
}
