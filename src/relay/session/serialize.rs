//! `[outbox.serialization]` in the session: a mapped record's value encoded and framed
//! before it is sent. A payload the schema refuses goes to the dead-letter topic (reason
//! `schema`). A record whose schema is cached is serialized at once. One whose schema the
//! registry must give waits with its topic ([`Parked`]): its request — after a failure, the
//! back-off's pause and then the request again — is a [`Request`] that the loop's registry
//! arm polls beside the others, one per waiting topic. No request holds the loop: frames,
//! acknowledgements, status updates and the other topics' records go on while a registry is
//! silent, and a silent registry holds only the topics whose schemas it must give.
//!
//! A waiting topic's later events line up behind its first (per-aggregate order), counted in
//! flight so that the in-flight caps bound them; the slot is never confirmed past them (their
//! ledger entries stay open). Exactly-once, nothing after a waiting event is read and the
//! delivery contract takes no turn: a Kafka commit would put the waiting change below its
//! progress value.
//!
//! Shutdown: exactly-once, the waiting event's request starts at once (its last try);
//! at-least-once, a topic in its back-off pause is given up (its events are read again after
//! the restart, and so are its events read later in the session). A request under way gets
//! the drain's `shutdown_timeout`: its failure, or the deadline, ends the session with the
//! registry's error (the event is sent again after the restart).

use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll, Waker};
use std::time::Duration;

use tokio::time::Sleep;

use super::Session;
use crate::mapping::OutboxEvent;
use crate::relay::ledger::TxnSeq;
use crate::relay::seams::{Catalog, FrameSource, RecordSink};
use crate::relay::RelayError;
use crate::sink::schema::registry::BoxFuture;
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

/// The serializer's answer for an event.
pub(super) struct Answer {
    mapped: Mapped,
    serializer: Arc<Serializer>,
    result: Result<(), SerializeError>,
}

/// The serializer asked for an event's record: after `pause` (the back-off after a failure;
/// none the first time), its answer. Lazy: nothing is asked before the pause ends.
pub(super) struct Request {
    /// Its event's size as counted in flight (serializing changes it).
    size: usize,
    pause: Option<Pin<Box<Sleep>>>,
    ask: BoxFuture<'static, Answer>,
}

impl Request {
    fn new(serializer: Arc<Serializer>, mut mapped: Mapped, pause: Option<Duration>) -> Request {
        Request {
            size: mapped.event.record.size(),
            pause: pause.map(|pause| Box::pin(tokio::time::sleep(pause))),
            ask: Box::pin(async move {
                let result = serializer.serialize(&mut mapped.event.record).await;
                Answer {
                    mapped,
                    serializer,
                    result,
                }
            }),
        }
    }

    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Answer> {
        if let Some(pause) = &mut self.pause {
            ready!(pause.as_mut().poll(cx));
            self.pause = None;
        }
        self.ask.as_mut().poll(cx)
    }

    /// The answer when it comes at the first poll (a cached schema); `None`: under way.
    fn now(&mut self) -> Option<Answer> {
        match self.poll(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(answer) => Some(answer),
            Poll::Pending => None,
        }
    }

    /// Still in its back-off pause: nothing asked yet.
    fn pausing(&self) -> bool {
        self.pause.as_ref().is_some_and(|pause| !pause.is_elapsed())
    }
}

/// A topic whose first event waits for the registry, and its events behind it.
pub(super) struct Parked {
    /// The first event's request; `None` once given up (and, briefly, once answered).
    request: Option<Request>,
    /// The events behind it, oldest first.
    events: VecDeque<Mapped>,
    /// The pause after the request's next failure; doubled at each failure up to
    /// [`MAX_BACKOFF`].
    backoff: Duration,
    /// Given up (shutdown, or an error): the topic's later events of the session are not
    /// sent either, or one could reach Kafka before its aggregate's earlier given-up one.
    given_up: bool,
}

/// The waiting topics, by name.
#[derive(Default)]
pub(super) struct ParkedTopics(BTreeMap<String, Parked>);

impl ParkedTopics {
    /// Whether a request is under way: the loop's registry arm is armed.
    pub(super) fn asking(&self) -> bool {
        self.0.values().any(|parked| parked.request.is_some())
    }

    /// The loop's registry arm: the next request answered, with its topic and its event's
    /// size as counted in flight.
    pub(super) fn answered(&mut self) -> impl Future<Output = (String, usize, Answer)> + '_ {
        std::future::poll_fn(|cx| {
            for (topic, parked) in &mut self.0 {
                let Some(request) = &mut parked.request else {
                    continue;
                };
                if let Poll::Ready(answer) = request.poll(cx) {
                    let size = request.size;
                    parked.request = None;
                    return Poll::Ready((topic.clone(), size, answer));
                }
            }
            Poll::Pending
        })
    }
}

impl<'a, S: FrameSource, K: RecordSink, C: Catalog> Session<'a, S, K, C> {
    /// Serializes an event for the first time; one of a waiting topic lines up behind it.
    pub(super) async fn serialize_first(&mut self, mapped: Mapped) -> Result<(), RelayError> {
        if let Some(parked) = self.parked.0.get_mut(&mapped.event.record.topic) {
            if !parked.given_up {
                self.in_flight.sent(mapped.event.record.size());
                parked.events.push_back(mapped);
            }
            // Given up: not sent, nor confirmed: read again after the restart.
            return Ok(());
        }
        self.serialize_and_send(mapped).await
    }

    /// Serializes the event's record when its table's serialization is on, then sends it (or
    /// its dead letter). A schema the registry must give leaves the event's topic waiting,
    /// with the request under way.
    async fn serialize_and_send(&mut self, mapped: Mapped) -> Result<(), RelayError> {
        let Some(serializer) = self.settings.serializers.get(mapped.event.profile).cloned() else {
            return self.send_mapped(mapped, None).await;
        };
        let topic = mapped.event.record.topic.clone();
        let mut request = Request::new(serializer, mapped, None);
        match request.now() {
            Some(answer) => self.serialized(answer).await,
            None => {
                self.wait(topic, request);
                Ok(())
            }
        }
    }

    /// The serializer's answer: the event is sent, or dead-lettered (its payload or key does
    /// not fit its schema); when the registry gave no schema, its topic waits and the event
    /// is asked for again after the back-off. `Err` when shutdown has come meanwhile.
    async fn serialized(&mut self, answer: Answer) -> Result<(), RelayError> {
        let Answer {
            mapped,
            serializer,
            result,
        } = answer;
        match result {
            Ok(()) => self.send_mapped(mapped, None).await,
            Err(SerializeError::Payload(why)) => self.send_mapped(mapped, Some(why)).await,
            Err(SerializeError::Registry { subject, error }) => {
                serializer.health().block(&subject, &error);
                if self.shutdown.is_cancelled() {
                    return Err(RelayError::SchemaRegistry(format!(
                        "subject `{subject}`: {error}"
                    )));
                }
                let topic = mapped.event.record.topic.clone();
                let parked = self
                    .parked
                    .0
                    .entry(topic.clone())
                    .or_insert_with(Parked::new);
                let pause = parked.backoff;
                parked.backoff = (pause * 2).min(MAX_BACKOFF);
                self.wait(topic, Request::new(serializer, mapped, Some(pause)));
                Ok(())
            }
        }
    }

    /// `request` is for the first waiting event of `topic`, counted in flight meanwhile.
    fn wait(&mut self, topic: String, request: Request) {
        self.in_flight.sent(request.size);
        let parked = self.parked.0.entry(topic).or_insert_with(Parked::new);
        parked.request = Some(request);
    }

    /// The loop's registry arm: a topic's request answered. Its event goes, or waits again;
    /// then the topic's later events go, oldest first, until one waits again.
    pub(super) async fn registry_answered(
        &mut self,
        (topic, size, answer): (String, usize, Answer),
    ) -> Result<(), RelayError> {
        self.in_flight.settled(size);
        self.serialized(answer).await?;
        loop {
            let Some(parked) = self.parked.0.get_mut(&topic) else {
                return Ok(());
            };
            if parked.request.is_some() || parked.given_up {
                return Ok(()); // waits again
            }
            // Its first event went: the next failure pauses briefly again.
            parked.backoff = INITIAL_BACKOFF;
            let Some(next) = parked.events.pop_front() else {
                self.parked.0.remove(&topic);
                return Ok(());
            };
            self.in_flight.settled(next.event.record.size());
            self.serialize_and_send(next).await?;
        }
    }

    /// Whether an event waits for the registry with nothing read after it (exactly-once).
    pub(super) fn waits_for_registry(&self) -> bool {
        self.settings.transactions.is_some() && self.parked.0.values().any(|p| !p.given_up)
    }

    /// Whether a registry request is under way.
    pub(super) fn asks_registry(&self) -> bool {
        self.parked.asking()
    }

    /// Exactly-once, on shutdown: the waiting event's request starts now, its last try.
    pub(super) fn ask_registry_now(&mut self) {
        for parked in self.parked.0.values_mut() {
            if let Some(request) = &mut parked.request {
                request.pause = None;
            }
        }
    }

    /// An error ends every wait; shutdown (`requests_too` false) those in a back-off pause,
    /// while a request under way gets the drain's time. The waiting events are given up, and
    /// sent again after the restart (their transactions are not confirmed); so are their
    /// topics' events read after them in this session.
    pub(super) fn give_up_registry_wait(&mut self, requests_too: bool) {
        for parked in self.parked.0.values_mut() {
            let under_way = parked.request.as_ref().is_some_and(|r| !r.pausing());
            if parked.given_up || (under_way && !requests_too) {
                continue;
            }
            parked.given_up = true;
            if let Some(request) = parked.request.take() {
                self.in_flight.settled(request.size);
            }
            for mapped in std::mem::take(&mut parked.events) {
                self.in_flight.settled(mapped.event.record.size());
            }
        }
    }
}

impl Parked {
    fn new() -> Parked {
        Parked {
            request: None,
            events: VecDeque::new(),
            backoff: INITIAL_BACKOFF,
            given_up: false,
        }
    }
}
