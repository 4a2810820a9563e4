//! What comes back from the producer: a [`Delivery`] per record, reported through a channel by
//! [`DeliveryReporter`] (librdkafka's callbacks, on the poller thread), and the publisher's
//! errors. The delivery opaque carries the transaction's sequence number and the record's
//! place in it ([`Opaque`]), with [`DEAD_LETTER_BIT`] for dead letters.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{DeliveryResult, Header, Headers, Message, OwnedHeaders, OwnedMessage};
use rdkafka::producer::ProducerContext;
use rdkafka::ClientContext;
use tokio::sync::mpsc;
use tracing::{debug, warn};

use crate::mapping::{event_id_of, Record};
use crate::sink::blocked::{BlockReason, Blocked};
use crate::sink::fault::{KafkaFault, Stamp, Verdict};
use crate::sink::kafka_latency::KafkaLatency;
use crate::sink::limits::RecordContent;
use crate::sink::traces::{self, Outcome};
use crate::sink::TxnSeq;

use super::login::{self, ClientLogin, KafkaLogin, LogsIn};

/// Marks a dead-letter record in the delivery opaque (transaction numbers never get there).
const DEAD_LETTER_BIT: usize = 1 << (usize::BITS - 1);
/// The low bits of the opaque: the record's place among those sent for its transaction.
const PLACE_BITS: u32 = 20;
const PLACE_MAX: usize = (1 << PLACE_BITS) - 1;
/// The largest transaction sequence number an opaque carries (2^43 - 2: years of a session at
/// 100,000 transactions a second; [`PROGRESS_OPAQUE`] stays apart).
const SEQ_MAX: TxnSeq = (1 << (usize::BITS - 1 - PLACE_BITS)) - 2;
const _: () = assert!(
    usize::BITS == 64,
    "the delivery opaque needs a 64-bit usize"
);

/// What a record's delivery opaque says: its transaction's sequence number, its place among
/// the records sent for that transaction, and whether it is a dead letter. The place is for
/// the order of records a topic refused: librdkafka reports a refused topic's queued records
/// before the refused batch, so records of one transaction come back out of their send order
/// (`partition_counts_refused`); ordered by `seq` and then place, they go out again in the
/// order they were sent. Places past 2^20 - 1 in one transaction share the last one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Opaque {
    pub seq: TxnSeq,
    pub place: usize,
    pub dead_letter: bool,
}

impl Opaque {
    /// `None` past [`SEQ_MAX`]: a new session numbers its transactions from 0 again.
    pub(super) fn encode(self) -> Option<usize> {
        if self.seq > SEQ_MAX {
            return None;
        }
        let bits = (self.seq as usize) << PLACE_BITS | self.place.min(PLACE_MAX);
        Some(if self.dead_letter {
            bits | DEAD_LETTER_BIT
        } else {
            bits
        })
    }

    pub(super) fn decode(opaque: usize) -> Opaque {
        Opaque {
            seq: ((opaque & !DEAD_LETTER_BIT) >> PLACE_BITS) as TxnSeq,
            place: opaque & PLACE_MAX,
            dead_letter: opaque & DEAD_LETTER_BIT != 0,
        }
    }

    /// The send order of records with this opaque: by transaction, then place.
    pub(super) fn send_order(opaque: usize) -> usize {
        opaque & !DEAD_LETTER_BIT
    }
}
/// The opaque of a progress record (`exactly_once`): its delivery is not reported, since it
/// is no event; a failure shows in the transaction's commit instead.
pub(super) const PROGRESS_OPAQUE: usize = usize::MAX;

/// What Kafka said about one record.
#[derive(Debug)]
pub struct Delivery {
    pub seq: TxnSeq,
    /// The record was a dead letter (sent with `send_dead_letter`).
    pub dead_letter: bool,
    /// Key + payload bytes of the record, to release from the in-flight count.
    pub bytes: usize,
    pub result: Result<(), DeliveryFailure>,
}

/// A record Kafka did not take, with the record itself so it can be dead-lettered, and what
/// the refusal means, classified once where it entered (the delivery callback).
#[derive(Debug)]
pub struct DeliveryFailure {
    pub error: KafkaError,
    pub fault: KafkaFault,
    pub message: OwnedMessage,
}

/// A record Kafka refused, named by topic and event id (never by payload), with what the
/// refusal means.
#[derive(Debug)]
pub struct Rejection {
    pub topic: String,
    pub event_id: String,
    pub error: KafkaError,
    pub fault: KafkaFault,
}

impl Rejection {
    pub fn new(topic: String, event_id: String, error: KafkaError) -> Rejection {
        let fault = KafkaFault::of(&error);
        Rejection {
            topic,
            event_id,
            error,
            fault,
        }
    }

    /// Whether sending again from the slot may heal it: not when the refusal may be the
    /// record's own (a record refused so that gets here was not dead-lettered: a dead letter
    /// itself, or the policy `stop`). Its timestamp is not known here.
    pub fn is_transient(&self) -> bool {
        match self.fault.verdict(Stamp::CommitOrUnknown) {
            Verdict::Retry | Verdict::Hold(_) => true,
            Verdict::JudgeSize | Verdict::OwnFault(_) => false,
        }
    }
}

impl std::fmt::Display for Rejection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "event {} for topic `{}`: {}",
            self.event_id, self.topic, self.error
        )
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error("cannot create the Kafka producer: {0}")]
    Create(#[source] KafkaError),
    #[error("Kafka refused the record: {0}")]
    Rejected(Box<Rejection>),
    #[error("the Kafka producer hit a fatal error: {0}; it will be recreated")]
    Fatal(String),
    /// A Kafka transaction (`exactly_once`) could not be initialised, begun or committed.
    /// Nothing of it is visible to read_committed consumers; the session restarts from the
    /// slot and the progress record.
    #[error("kafka transaction: cannot {what}: {error}")]
    Transaction {
        what: &'static str,
        #[source]
        error: KafkaError,
    },
    /// Kafka refused a record as too large, and either its batch was (the record is not at
    /// fault), or, in `exactly_once`, the record itself was (the next session refuses it
    /// before it is sent, and dead-letters it). The next producer batches within the limit
    /// learned (`sink::limits`); the records are sent again from the slot.
    #[error("kafka refused {what} for topic `{topic}` as too large (its max.message.bytes is at most {limit} bytes): the producer is made again with batches within that limit, and the records are sent again from the slot")]
    SizeRefused {
        topic: String,
        what: &'static str,
        limit: usize,
    },
    /// Exactly-once: the broker refused a record as invalid (INVALID_RECORD), which dooms the
    /// transaction. The publisher remembers the record (`sink::limits`): the next session
    /// refuses it at `send` and dead-letters it inside its transaction; the rest is sent again
    /// from the slot.
    #[error("kafka refused a record for topic `{topic}` as invalid: the transaction is aborted, and the next one dead-letters that record and sends the others again from the slot")]
    InvalidRecordRefused { topic: String },
    /// The progress record (`exactly_once`) could not be read, or its topic made.
    #[error("kafka.progress_topic `{topic}`: {problem}")]
    Progress { topic: String, problem: String },
    /// The progress record says something this database's history contradicts: the relay
    /// cannot tell what Kafka has, so it stops.
    #[error("kafka.progress_topic `{topic}`: {problem}. Fix: a tombstone with key {key} to `{topic}`, or a new postgres.slot and `outbox-relay replay`; see docs/src/operations/runbooks.md#exactly-once-progress")]
    ProgressDiverged {
        topic: String,
        key: String,
        problem: String,
    },
}

impl PublishError {
    /// Transient errors heal by restarting from the slot; the others are about the record, or
    /// a setting. Deployment errors ([`BlockReason`]: a missing ACL) are transient: the
    /// session is retried with back-off until the operator fixed them.
    pub fn is_transient(&self) -> bool {
        match self {
            PublishError::Create(_)
            | PublishError::Fatal(_)
            | PublishError::Progress { .. }
            | PublishError::SizeRefused { .. }
            | PublishError::InvalidRecordRefused { .. } => true,
            PublishError::Rejected(r) => r.is_transient(),
            PublishError::ProgressDiverged { .. } => false,
            // Fenced is transient too: the relay that fenced us holds the slot, so the next
            // session waits as a standby.
            PublishError::Transaction { error, .. } => !matches!(
                error.rdkafka_error_code(),
                Some(
                    RDKafkaErrorCode::InvalidTransactionTimeout
                        | RDKafkaErrorCode::UnsupportedVersion
                        | RDKafkaErrorCode::UnsupportedForMessageFormat
                )
            ),
        }
    }
}

/// Whether a record that failed with `fault` goes back to the publisher's gate to wait for
/// its topic (at-least-once) rather than to the session: a refusal to WRITE a topic whose
/// metadata we may read. One decision, named, so that the session simulation
/// (`relay::session::sim`) routes its delivery reports through it as the reporter does.
pub fn waits_at_gate(fault: KafkaFault) -> bool {
    fault == KafkaFault::Deployment(BlockReason::TopicAuthorization)
}

/// A record a topic refused for a deployment reason when it was sent (WRITE missing while
/// DESCRIBE is allowed, or revoked): not the record's fault, so it goes back to the
/// publisher's gate to wait, instead of failing (at-least-once).
#[derive(Debug)]
pub(super) struct Refused {
    pub(super) record: Record,
    pub(super) opaque: usize,
}

impl Refused {
    /// The record as it was sent, to the same partition; with its timestamp only where the
    /// report gives one (librdkafka gives none for a failed record: it is stamped anew when
    /// sent again). Only a producer that is not gap-less hands refusals to the gate so
    /// (`Publisher::with_client_config`).
    fn of(message: &rdkafka::message::BorrowedMessage<'_>, opaque: usize) -> Refused {
        use rdkafka::message::Headers;
        let headers = message
            .headers()
            .map(|h| {
                h.iter()
                    .map(|h| {
                        let value = bytes::Bytes::copy_from_slice(h.value.unwrap_or_default());
                        (Arc::<str>::from(h.key), value)
                    })
                    .collect()
            })
            .unwrap_or_default();
        Refused {
            record: Record {
                topic: message.topic().to_string(),
                key: bytes::Bytes::copy_from_slice(message.key().unwrap_or_default()),
                payload: message.payload().map(bytes::Bytes::copy_from_slice),
                headers,
                timestamp_ms: message.timestamp().to_millis(),
                partition: Some(message.partition()).filter(|p| *p >= 0),
                partition_key: None,
            },
            opaque,
        }
    }
}

/// Receives librdkafka callbacks on its polling thread and forwards deliveries.
pub struct DeliveryReporter {
    deliveries: mpsc::UnboundedSender<Delivery>,
    /// At-least-once: where records a topic refused for a deployment reason go back to wait.
    refusals: Option<mpsc::UnboundedSender<Refused>>,
    errors_logged: Mutex<ErrorLog>,
    latency: Arc<KafkaLatency>,
    blocked: Arc<Blocked>,
    login: ClientLogin,
}

impl DeliveryReporter {
    /// Forwards deliveries to `deliveries`, keeping what Kafka refuses in `blocked`; logs
    /// in with `login`'s tokens if it makes them.
    pub(super) fn new(
        deliveries: mpsc::UnboundedSender<Delivery>,
        refusals: Option<mpsc::UnboundedSender<Refused>>,
        blocked: Arc<Blocked>,
        login: KafkaLogin,
    ) -> Self {
        DeliveryReporter {
            deliveries,
            refusals,
            errors_logged: Mutex::new(ErrorLog::default()),
            latency: Arc::default(),
            blocked,
            login: ClientLogin::new(login),
        }
    }

    /// Kafka's share of the latency, per broker (librdkafka's statistics).
    pub(super) fn latency(&self) -> Arc<KafkaLatency> {
        self.latency.clone()
    }
}

/// librdkafka reports a broker that is down every few tens of milliseconds: one line per
/// [`ERROR_LOG_INTERVAL`] says it, with how many were not logged.
#[derive(Default)]
struct ErrorLog {
    last: Option<Instant>,
    suppressed: u64,
}

const ERROR_LOG_INTERVAL: Duration = Duration::from_secs(10);

impl ClientContext for DeliveryReporter {
    const ENABLE_REFRESH_OAUTH_TOKEN: bool = true;

    fn generate_oauth_token(
        &self,
        _config: Option<&str>,
    ) -> Result<rdkafka::client::OAuthToken, Box<dyn std::error::Error>> {
        self.login.generate()
    }

    // Only the latency is read, straight from the JSON: rust-rdkafka's full `Statistics`
    // (every partition of every topic) is not needed.
    fn stats_raw(&self, json: &[u8]) {
        if let Err(e) = self.latency.update(json) {
            debug!(error = %e, "cannot read librdkafka's statistics");
        }
    }

    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, line: &str) {
        self.login.on_log(fac);
        login::forward_log(level, fac, line);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        self.login.on_error(&error);
        // Broker connection problems are reported here; librdkafka retries by itself.
        // Cluster-wide refusals come here, with no topic: a refused login, no
        // IDEMPOTENT_WRITE for the idempotent producer.
        if let Some(block @ (BlockReason::Authentication | BlockReason::ClusterAuthorization)) =
            KafkaFault::of(&error).block()
        {
            self.blocked.block(block, "", &format!("{error}: {reason}"));
        }
        let mut log = self
            .errors_logged
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if log.last.is_some_and(|at| at.elapsed() < ERROR_LOG_INTERVAL) {
            log.suppressed += 1;
            return;
        }
        let suppressed = std::mem::take(&mut log.suppressed);
        log.last = Some(Instant::now());
        warn!(error = %error, reason, suppressed,
            "kafka client error; the producer keeps retrying");
    }
}

impl LogsIn for DeliveryReporter {
    fn client_login(&self) -> &ClientLogin {
        &self.login
    }
}

impl ProducerContext for DeliveryReporter {
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, seq: usize) {
        if seq == PROGRESS_OPAQUE {
            return;
        }
        let Opaque {
            seq: txn,
            dead_letter,
            ..
        } = Opaque::decode(seq);
        if let Some(traces) = traces::active() {
            let (m, outcome) = match result {
                Ok(m) if dead_letter => (m, Outcome::DeadLettered),
                Ok(m) => (m, Outcome::Acknowledged),
                Err((error, m)) => (m, Outcome::Failed(error)),
            };
            traces.delivered(m, outcome);
        }
        let (bytes, result) = match result {
            Ok(m) => {
                self.blocked.delivered(m.topic());
                (m.payload_len() + m.key_len(), Ok(()))
            }
            Err((error, m)) => {
                // Classified once, here; every decision after is a match on it.
                let fault = KafkaFault::of(error);
                if let Some(reason) = fault.block() {
                    self.blocked.block(reason, m.topic(), error);
                }
                // Named invalid by the broker: refused before it is sent again, or the
                // neighbours its batch fails with it would go back to the broker with it,
                // every time (see `sink::limits`).
                if fault == KafkaFault::InvalidRecord {
                    self.blocked
                        .limits()
                        .remember_invalid(m.topic(), RecordContent::of(m.key(), m.payload()));
                }
                // Held by the gate until the topic takes records again: the session never
                // sees the failure, so nothing of other topics is sent again. (A topic gone
                // mid-stream still ends the session: the next one's first read creates it.)
                if let (Some(refusals), true) = (&self.refusals, waits_at_gate(fault)) {
                    if refusals.send(Refused::of(m, seq)).is_ok() {
                        return;
                    }
                }
                (
                    m.payload_len() + m.key_len(),
                    Err(DeliveryFailure {
                        error: error.clone(),
                        fault,
                        message: m.detach(),
                    }),
                )
            }
        };
        // The receiver is gone only when the pipeline has been torn down: nothing to tell.
        let _ = self.deliveries.send(Delivery {
            seq: txn,
            dead_letter,
            bytes,
            result,
        });
    }
}

impl DeliveryFailure {
    /// A failure the delivery callback did not see (a record failed before it was produced),
    /// classified here.
    pub fn new(error: KafkaError, message: OwnedMessage) -> DeliveryFailure {
        let fault = KafkaFault::of(&error);
        DeliveryFailure {
            error,
            fault,
            message,
        }
    }

    /// Key + payload bytes of the refused record (as `Record::size` counts them).
    pub fn record_bytes(&self) -> usize {
        self.message.key().map_or(0, <[u8]>::len) + self.message.payload().map_or(0, <[u8]>::len)
    }

    /// The failure as a rejection: topic and event id (where the record carries it; the key
    /// only when it carries none), without the payload.
    pub fn rejection(&self) -> Rejection {
        let headers = self
            .message
            .headers()
            .into_iter()
            .flat_map(|h| h.iter().map(|h| (h.key, h.value.unwrap_or_default())));
        let event_id = event_id_of(headers, self.message.payload()).unwrap_or_else(|| {
            String::from_utf8_lossy(self.message.key().unwrap_or_default()).into_owned()
        });
        Rejection {
            topic: self.message.topic().to_string(),
            event_id,
            error: self.error.clone(),
            fault: self.fault,
        }
    }

    /// What the refused record holds, by which a refusal of its own is remembered.
    pub fn content(&self) -> RecordContent<'_> {
        RecordContent::of(self.message.key(), self.message.payload())
    }
}

pub(super) fn owned_headers(record: &Record) -> OwnedHeaders {
    record.headers.iter().fold(
        OwnedHeaders::new_with_capacity(record.headers.len()),
        |h, (k, v)| {
            h.insert(Header {
                key: k,
                value: Some(&v[..]),
            })
        },
    )
}
