//! `[outbox.serialization]` in the session: a mapped record's value encoded and framed
//! before it is sent. A payload the schema refuses goes to the dead-letter topic (reason
//! `schema`). While the registry gives no schema for an event, it waits in the session,
//! retried with back-off by the loop's registry arm, and the slot is never confirmed past it
//! (its ledger entry stays open). At-least-once, only its topic waits ([`Parked`]): the
//! topic's later events line up behind it (per-aggregate order), counted in flight so that
//! the in-flight caps bound them, and every other topic goes on — one missing subject does
//! not stall the stream. Exactly-once, nothing after it is read ([`RegistryWait`]): a Kafka
//! commit would put the waiting change below its progress value. Either way the loop's other
//! arms — shutdown, acknowledgements of what was sent before it, status updates — go on
//! being served, so the walsender still hears from the relay. During a registry request
//! itself (up to `request_timeout_ms` against a silent registry) `Session::ask` serves the
//! status updates and the delivery reports (one that ends the session ends it then), and
//! bounds the request by `shutdown_timeout` once shutdown has come.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::Session;
use crate::mapping::{OutboxEvent, Record};
use crate::relay::ledger::TxnSeq;
use crate::relay::seams::{Catalog, FrameSource, RecordSink};
use crate::relay::RelayError;
use crate::sink::schema::{SerializeError, Serializer};
use crate::source::pgoutput::{Relation, Tuple};

/// First pause after the registry failed; doubled up to [`MAX_BACKOFF`].
const INITIAL_BACKOFF: Duration = Duration::from_millis(200);
pub(super) const MAX_BACKOFF: Duration = Duration::from_secs(10);

/// A mapped event of the open transaction on its way to the sink: its ledger entry is
/// taken, its record not yet serialized.
pub(super) struct Mapped {
    pub event: OutboxEvent,
    pub seq: TxnSeq,
    /// The row it came from, for its dead letter.
    pub relation: Arc<Relation>,
    pub tuple: Tuple,
    pub commit_time_ms: i64,
    /// Where its trace span starts.
    pub commit_time_us: i64,
}

/// An event whose schema the registry did not give: the session reads nothing after it and
/// the delivery contract takes no turn (an exactly-once commit now would put the waiting
/// change below its progress value) until it is serialized.
pub(super) struct RegistryWait {
    mapped: Mapped,
    /// The pause that ends at `retry_at`; the next one is twice as long.
    backoff: Duration,
    retry_at: Instant,
}

/// At-least-once: the events of one topic whose first event the registry gave no schema for,
/// oldest first, and when that first one is tried again.
pub(super) struct Parked {
    events: VecDeque<Mapped>,
    backoff: Duration,
    retry_at: Instant,
    /// Given up (shutdown, or an error): the topic's later events of the session are not
    /// sent either, or one could reach Kafka before its aggregate's earlier given-up one.
    given_up: bool,
}

/// The parked topics, by name.
pub(super) type ParkedTopics = BTreeMap<String, Parked>;

impl<'a, S: FrameSource, K: RecordSink, C: Catalog> Session<'a, S, K, C> {
    /// Serializes the event's record when its table's serialization is on, then sends it (or
    /// dead-letters it when the payload or key does not fit its schema). When the registry
    /// fails, the event waits in the session, to be retried after `backoff` by the loop; `Err`
    /// when shutdown has come meanwhile (the record is sent again after the restart).
    pub(super) async fn serialize_and_send(
        &mut self,
        mut mapped: Mapped,
        backoff: Duration,
    ) -> Result<(), RelayError> {
        let Some(serializer) = self.settings.serializers.get(mapped.event.profile).cloned() else {
            return self.send_mapped(mapped, None).await;
        };
        match self.ask(&serializer, &mut mapped.event.record).await? {
            Ok(()) => self.send_mapped(mapped, None).await,
            Err(SerializeError::Payload(why)) => self.send_mapped(mapped, Some(why)).await,
            Err(SerializeError::Registry { subject, error }) => {
                serializer.health().block(&subject, &error);
                if self.shutdown.is_cancelled() {
                    return Err(RelayError::SchemaRegistry(format!(
                        "subject `{subject}`: {error}"
                    )));
                }
                let retry_at = Instant::now() + backoff;
                if self.settings.transactions.is_none() {
                    self.park(mapped, backoff, retry_at);
                    return Ok(());
                }
                self.registry = Some(RegistryWait {
                    mapped,
                    backoff,
                    retry_at,
                });
                Ok(())
            }
        }
    }

    /// The serializer's answer for `record`, serving meanwhile what must not wait on a
    /// registry request. A registry that does not answer keeps one up to `request_timeout_ms`
    /// (10 s by default; the config sets no upper bound), and the request is awaited inside an
    /// arm of the loop, so none of the others runs: status updates go out here every status
    /// interval (so that `wal_sender_timeout` does not end the stream), delivery reports are
    /// handled (so that one that ends the session ends it now), and once shutdown has
    /// come the request gets `shutdown_timeout` (or what is left of the drain's) before the
    /// session ends with an error — the event is sent again after the restart. A cached
    /// schema answers at the first poll: nothing else is polled then.
    async fn ask(
        &mut self,
        serializer: &Serializer,
        record: &mut Record,
    ) -> Result<Result<(), SerializeError>, RelayError> {
        let mut serialize = std::pin::pin!(serializer.serialize(record));
        let (interval, grace) = (
            self.settings.status_interval,
            self.settings.shutdown_timeout,
        );
        let mut status_at = Instant::now() + interval;
        let mut deadline = self
            .drain_deadline()
            .or_else(|| self.shutdown.is_cancelled().then(|| Instant::now() + grace));
        let shutdown = self.shutdown.clone();
        loop {
            tokio::select! {
                biased;
                result = &mut serialize => return Ok(result),
                _ = shutdown.cancelled(), if deadline.is_none() => {
                    deadline = Some(Instant::now() + grace);
                }
                _ = super::sleep_until(deadline), if deadline.is_some() => {
                    return Err(RelayError::SchemaRegistry(format!(
                        "the registry had not answered {grace:?} (shutdown_timeout) after shutdown; the event is sent again after the restart"
                    )));
                }
                // A delivery report is handled as the loop would, so that one that ends the
                // session (a batch refused as too large, a delivery timeout) ends it now: the
                // producer goes before it writes the partition's later records past the gap.
                Some(delivery) = self.deliveries.recv() => self.handle_deliveries(delivery).await?,
                _ = tokio::time::sleep_until(status_at) => {
                    self.send_status(true).await?;
                    status_at = Instant::now() + interval;
                }
            }
        }
    }

    /// Serializes an event for the first time; one of a parked topic lines up behind it.
    pub(super) async fn serialize_first(&mut self, mapped: Mapped) -> Result<(), RelayError> {
        if let Some(parked) = self.parked.get_mut(&mapped.event.record.topic) {
            if parked.given_up {
                // Not sent, nor confirmed: read again after the restart.
                return Ok(());
            }
            self.in_flight.sent(mapped.event.record.size());
            parked.events.push_back(mapped);
            return Ok(());
        }
        self.serialize_and_send(mapped, INITIAL_BACKOFF).await
    }

    /// At-least-once: `mapped` (first of its topic's waiting events) waits until `retry_at`,
    /// counted in flight meanwhile.
    fn park(&mut self, mapped: Mapped, backoff: Duration, retry_at: Instant) {
        self.in_flight.sent(mapped.event.record.size());
        let topic = mapped.event.record.topic.clone();
        let parked = self.parked.entry(topic).or_insert_with(|| Parked {
            events: VecDeque::new(),
            backoff,
            retry_at,
            given_up: false,
        });
        parked.events.push_front(mapped);
        parked.backoff = backoff;
        parked.retry_at = retry_at;
    }

    /// Whether an event waits for the registry with nothing read after it (exactly-once).
    pub(super) fn waits_for_registry(&self) -> bool {
        self.registry.is_some()
    }

    /// When an event waiting for the registry is tried again (`None`: none waits).
    pub(super) fn registry_retry_at(&self) -> Option<Instant> {
        let parked = self
            .parked
            .values()
            .filter(|p| !p.given_up)
            .map(|p| p.retry_at)
            .min();
        match (self.registry.as_ref().map(|wait| wait.retry_at), parked) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The registry arm of the loop, at the retry time or on shutdown: the event is tried
    /// again (the loop's status timer goes on meanwhile, so `wal_sender_timeout` does not end
    /// the stream during a long outage). On shutdown this is its last try: failing, it ends
    /// the session.
    pub(super) async fn retry_registry(&mut self) -> Result<(), RelayError> {
        let Some(wait) = self.registry.take() else {
            return self.retry_parked().await;
        };
        let backoff = (wait.backoff * 2).min(MAX_BACKOFF);
        self.serialize_and_send(wait.mapped, backoff).await
    }

    /// The parked topic due first: its events go, oldest first, until one waits again.
    async fn retry_parked(&mut self) -> Result<(), RelayError> {
        let now = Instant::now();
        let due = self
            .parked
            .iter()
            .filter(|(_, p)| !p.given_up && p.retry_at <= now)
            .min_by_key(|(_, p)| p.retry_at)
            .map(|(topic, _)| topic.clone());
        let Some(topic) = due else {
            return Ok(());
        };
        let mut backoff = (self.parked[&topic].backoff * 2).min(MAX_BACKOFF);
        loop {
            let Some(parked) = self.parked.get_mut(&topic) else {
                return Ok(());
            };
            let Some(next) = parked.events.pop_front() else {
                self.parked.remove(&topic);
                return Ok(());
            };
            self.in_flight.settled(next.event.record.size());
            self.serialize_and_send(next, backoff).await?;
            if self.parked.get(&topic).is_some_and(|p| p.retry_at > now) {
                return Ok(()); // waits again
            }
            backoff = INITIAL_BACKOFF;
        }
    }

    /// An error or shutdown ends the waits: the waiting events are given up, and sent again
    /// after the restart (their transactions are not confirmed); so are their topics' events
    /// read after them in this session.
    pub(super) fn give_up_registry_wait(&mut self) {
        self.registry = None;
        for parked in self.parked.values_mut() {
            parked.given_up = true;
            for mapped in std::mem::take(&mut parked.events) {
                self.in_flight.settled(mapped.event.record.size());
            }
        }
    }
}
