//! The WAL side of a session: each decoded message of the stream — BEGIN, RELATION, INSERT,
//! MESSAGE, COMMIT — becomes ledger entries and records for the sink (or a dead letter, or the
//! error that stops the session). The loop and the confirmation side are in `mod.rs`.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use tracing::{debug, info, warn};

use super::serialize::Mapped;
use super::{Held, OpenTxn, RelationEntry, Session, SourceRow};
use crate::clock::unix_us;
use crate::config::DeadLetterPolicy;
use crate::lsn::Lsn;
use crate::mapping::{self, MappingError, MessageRoute, OutboxEvent, Record};
use crate::relay::ledger::TxnSeq;
use crate::relay::seams::{Catalog, FrameSource, RecordKind, RecordSink};
use crate::relay::sweeper::kept::{Kept, KeptRow};
use crate::relay::{RelayError, Unmapped};
use crate::sink::dead_letter::{self, Reason};
use crate::sink::fault::{Stamp, Verdict};
use crate::sink::progress::{ChangeKind, Covered};
use crate::sink::publisher::PublishError;
use crate::sink::traces;
use crate::source::pgoutput::{self, LogicalMessage, Relation, Tuple};
use crate::source::walsender::pg_time_to_unix_us;

impl<'a, S: FrameSource, K: RecordSink, C: Catalog> Session<'a, S, K, C> {
    /// Handles one pgoutput message, which came at `lsn` (its XLogData's start).
    pub(super) async fn handle_message(
        &mut self,
        message: LogicalMessage,
        lsn: Lsn,
    ) -> Result<(), RelayError> {
        match message {
            LogicalMessage::Begin(begin) => {
                let commit_time_us = pg_time_to_unix_us(begin.commit_time_us);
                let read_after_us = (unix_us() - commit_time_us).max(0) as u64;
                self.metrics
                    .commit_to_read
                    .observe(Duration::from_micros(read_after_us));
                let commit_time_ms = commit_time_us / 1000;
                self.ledger.begin(commit_time_ms)?;
                let covered = self.contract.covered(begin.final_lsn);
                let (in_kafka, skip_through) = match covered {
                    Covered::First { changes, through } => (changes, through),
                    Covered::Nothing | Covered::All => (0, None),
                };
                self.txn = Some(OpenTxn {
                    final_lsn: begin.final_lsn,
                    commit_time_ms,
                    commit_time_us,
                    events: 0,
                    sent: 0,
                    changes: 0,
                    last_change: None,
                    unplaced: false,
                    skip: covered == Covered::All,
                    skip_left: in_kafka,
                    skip_through,
                });
            }
            LogicalMessage::Commit(commit) => self.handle_commit(commit)?,
            LogicalMessage::Relation(relation) => self.handle_relation(relation).await?,
            LogicalMessage::Insert(insert) => self.handle_insert(insert, lsn).await?,
            LogicalMessage::Truncate(_) => {
                warn!("the outbox table was truncated; nothing is published for a truncate")
            }
            LogicalMessage::Update(_)
            | LogicalMessage::Delete(_)
            | LogicalMessage::Origin(_)
            | LogicalMessage::Type(_) => {}
            LogicalMessage::Message(message) => self.handle_logical_message(message, lsn).await?,
        }
        Ok(())
    }

    pub(super) async fn handle_logical_message(
        &mut self,
        message: pgoutput::Message,
        lsn: Lsn,
    ) -> Result<(), RelayError> {
        // A transactional message is a change of its transaction, whatever the mapping makes
        // of it: the split progress counts it either way.
        if message.transactional {
            let txn = self.open_txn()?;
            if txn.skip || txn.change_in_kafka(lsn, ChangeKind::Message) {
                return Ok(());
            }
        }
        match self.mapping.route_message(&message) {
            MessageRoute::Event => {
                let commit_time_ms = self.open_txn()?.commit_time_ms;
                let event = self.mapping.message_event(&message, commit_time_ms);
                let (relation, tuple) = mapping::message_as_row(&message);
                self.publish_event(event, Arc::new(relation), tuple).await?;
            }
            MessageRoute::NonTransactional { rejected_total } => warn!(
                prefix = %message.prefix, lsn = %message.lsn, rejected_total,
                "skipped a non-transactional logical message with the outbox prefix: only pg_logical_emit_message(true, ...) is published"
            ),
            MessageRoute::Ignored => {}
        }
        Ok(())
    }

    /// Binds a relation to its outbox configuration: by name, else (a partition, when the
    /// publication does not publish via the root) as its partition root. A relation that binds
    /// neither way is kept unbound: an insert from it stops the session (`handle_insert`).
    pub(super) async fn handle_relation(&mut self, relation: Relation) -> Result<(), RelayError> {
        let mut entry = RelationEntry {
            bound: self.mapping.bind(&relation).transpose()?,
            relation: Arc::new(relation),
            bound_as: None,
            root: None,
        };
        if entry.bound.is_none() {
            self.bind_as_root(&mut entry).await?;
        }
        self.relations.insert(entry.relation.id, entry);
        Ok(())
    }

    pub(super) async fn bind_as_root(
        &mut self,
        entry: &mut RelationEntry,
    ) -> Result<(), RelayError> {
        let relation = entry.relation.clone();
        let root = self.catalog.partition_root(relation.id).await?;
        // A partition detached since it was bound in this session resolves to itself now,
        // but its changes still in the stream were written while it was a partition.
        let previous = self
            .relations
            .get(&relation.id)
            .and_then(|e| e.bound_as.clone());
        let candidate = root
            .clone()
            .filter(|(s, t)| (s, t) != (&relation.namespace, &relation.name))
            .or(previous);
        if let Some((schema, table)) = candidate {
            if let Some(bound) = self.mapping.bind_as(&relation, &schema, &table) {
                info!(schema = %relation.namespace, table = %relation.name, oid = relation.id,
                    outbox = %format!("{schema}.{table}"),
                    "a partition of an outbox arrived under its own name (the publication does not publish via the root); mapped as its root");
                entry.bound = Some(bound?);
                entry.bound_as = Some((schema, table));
                return Ok(());
            }
        }
        warn!(schema = %relation.namespace, table = %relation.name, oid = relation.id,
            root = ?root.as_ref().map(|(s, t)| format!("{s}.{t}")),
            "the publication sends a relation that is not a configured outbox table; an insert from it stops the relay");
        entry.root = root;
        Ok(())
    }

    pub(super) fn handle_commit(&mut self, commit: pgoutput::Commit) -> Result<(), RelayError> {
        let txn = self
            .txn
            .take()
            .ok_or_else(|| RelayError::Protocol("COMMIT without BEGIN".into()))?;
        if txn.final_lsn != commit.commit_lsn {
            return Err(RelayError::Protocol(format!(
                "COMMIT at {} does not match BEGIN's final LSN {}",
                commit.commit_lsn, txn.final_lsn
            )));
        }
        self.ledger.commit(commit.end_lsn)?;
        if txn.skip {
            self.metrics.transactions_skipped.fetch_add(1, Relaxed);
        }
        self.contract.postgres_committed(commit.end_lsn);
        debug!(end_lsn = %commit.end_lsn, events = txn.events, skipped = txn.skip, "transaction handed to kafka");
        Ok(())
    }

    /// An insert is published, or dead-lettered, or stops the session: never skipped, since
    /// the slot would then be confirmed past it.
    pub(super) async fn handle_insert(
        &mut self,
        insert: pgoutput::Insert,
        lsn: Lsn,
    ) -> Result<(), RelayError> {
        let txn = self.open_txn()?;
        if txn.skip || txn.change_in_kafka(lsn, ChangeKind::Row) {
            return Ok(());
        }
        let commit_time_ms = txn.commit_time_ms;
        let Some(entry) = self.relations.get(&insert.relation_id) else {
            return Err(RelayError::Protocol(format!(
                "INSERT for relation {} before its RELATION message",
                insert.relation_id
            )));
        };
        let relation = entry.relation.clone();
        let Some(bound) = &entry.bound else {
            let name = format!("{}.{}", relation.namespace, relation.name);
            let root = entry.root.as_ref().map(|(s, t)| format!("{s}.{t}"));
            return Err(RelayError::Unmapped(Box::new(Unmapped {
                oid: relation.id,
                dropped: root.is_none(),
                root: root.filter(|r| *r != name),
                relation: name,
                publication: self.settings.publication.clone(),
            })));
        };
        let event = bound.to_event(&insert.tuple, commit_time_ms);
        self.publish_event(event, relation, insert.tuple).await
    }

    pub(super) fn open_txn(&mut self) -> Result<&mut OpenTxn, RelayError> {
        self.txn
            .as_mut()
            .ok_or_else(|| RelayError::Protocol("change outside a transaction".into()))
    }

    /// Hands one mapped event of the open transaction to the sink, once serialized (which may
    /// leave it waiting for the registry: `serialize.rs`); an event that cannot be published
    /// goes to the dead-letter topic (or stops the relay, by policy). `relation` and `tuple`
    /// are the row it came from, for the dead letter.
    pub(super) async fn publish_event(
        &mut self,
        event: Result<OutboxEvent, MappingError>,
        relation: Arc<Relation>,
        tuple: Tuple,
    ) -> Result<(), RelayError> {
        let txn = self.open_txn()?;
        let commit_time_ms = txn.commit_time_ms;
        txn.events += 1;
        let commit_time_us = txn.commit_time_us;
        let seq = self.ledger.record_sent()?;
        let event = match event {
            Ok(event) => event,
            Err(e) => {
                let row = SourceRow {
                    relation,
                    tuple,
                    commit_time_ms,
                };
                return self.dead_letter_unmapped(seq, &e, &row).await;
            }
        };
        self.serialize_first(Mapped {
            event,
            seq,
            relation,
            tuple,
            commit_time_ms,
            commit_time_us,
        })
        .await
    }

    /// Sends a mapped event whose record is serialized (when its table's serialization is
    /// on), or its dead letter when its schema refused it (`refused`: why) or its topic's
    /// timestamp window refuses the row's own time.
    pub(super) async fn send_mapped(
        &mut self,
        mapped: Mapped,
        refused: Option<String>,
    ) -> Result<(), RelayError> {
        let Mapped {
            mut event,
            seq,
            relation,
            tuple,
            commit_time_ms,
            commit_time_us,
        } = mapped;
        // Its own fault, found before it is sent: a payload its schema refused, or a time of
        // the row's own (`timestamp_column`) its topic's window refuses — the row's fault, not
        // the topic's (`sink::fault`; a commit time outside the window blocks the topic
        // instead, at send). Dead-lettered with the row, so that the stream goes on.
        let own_fault = match refused {
            Some(why) => Some((Reason::Schema, why)),
            None if event.own_timestamp
                && self
                    .sink
                    .refuses_timestamp(&event.record.topic, event.record.timestamp_ms) =>
            {
                Some((Reason::Timestamp, format!(
                    "its timestamp ({} ms, the row's own) lies outside the window of topic `{}` (message.timestamp.before.max.ms / after.max.ms)",
                    event.record.timestamp_ms.unwrap_or_default(),
                    event.record.topic
                )))
            }
            None => None,
        };
        if let Some((reason, why)) = own_fault {
            let dlq = &self.settings.dead_letter_topic;
            let mut record = dead_letter::from_record(dlq, &event.record, reason, &why);
            if reason == Reason::Timestamp {
                // Stamped with its commit time: the dead-letter topic may refuse its own.
                dead_letter::restamp(&mut record, commit_time_ms);
            }
            // With the row, a redrive maps it again, so it is encoded by its table's section.
            let row = SourceRow {
                relation,
                tuple,
                commit_time_ms,
            };
            dead_letter::with_row(&mut record, row.as_row());
            return self
                .dead_letter(seq, record, &event.id, &why, false, Some(&row))
                .await;
        }
        if let Some(traces) = traces::active() {
            traces.start(&mut event.record, &event.id, commit_time_us);
        }
        self.send_or_hold(Held {
            record: event.record,
            seq,
            event_id: event.id,
            kind: RecordKind::Event,
            row: Some(Box::new(SourceRow {
                relation,
                tuple,
                commit_time_ms,
            })),
        })
        .await
    }

    /// Hands a record to the sink, or (exactly-once, while a Kafka commit runs: librdkafka
    /// takes no record then) holds it for the next Kafka transaction. With adaptive batching,
    /// a record that is the only one in flight skips the producer's linger.
    pub(super) async fn send_or_hold(&mut self, record: Held) -> Result<(), RelayError> {
        let size = record.record.size();
        let Some(record) = self.contract.hold(record) else {
            self.count_in_flight(size);
            return Ok(());
        };
        let alone = self.settings.adaptive && self.in_flight.is_empty();
        self.send_now(record, false).await?;
        if alone {
            self.sink.skip_linger();
        }
        Ok(())
    }

    /// Sends a record (`counted`: a held one, already counted in flight). An event Kafka
    /// refuses for good is dead-lettered in its place.
    pub(super) async fn send_now(&mut self, held: Held, counted: bool) -> Result<(), RelayError> {
        self.contract.begin(&mut self.sink)?;
        let Held {
            record,
            seq,
            event_id,
            kind,
            row,
        } = held;
        let sent = self.sink.send(&record, seq, &event_id, kind).await;
        if counted && sent.is_err() {
            self.in_flight.settled(record.size());
        }
        match sent {
            Ok(()) => {
                if !counted {
                    self.count_in_flight(record.size());
                }
                self.contract.sent();
                Ok(())
            }
            // Refused before it was sent (the memory of a record refused for its own fault,
            // librdkafka's own checks): decided by its fault.
            Err(PublishError::Rejected(r)) if kind == RecordKind::Event => {
                let reason = match r.fault.verdict(Stamp::CommitOrUnknown) {
                    // At `send`, a size refusal is this record's alone: remembered as refused
                    // alone, or over librdkafka's `message.max.bytes` by itself.
                    Verdict::JudgeSize => Reason::TooLarge,
                    Verdict::OwnFault(reason) => reason,
                    Verdict::Retry | Verdict::Hold(_) => {
                        return Err(PublishError::Rejected(r).into())
                    }
                };
                self.metrics.count_delivery_error(&r.error);
                let dlq = &self.settings.dead_letter_topic;
                let mut record = dead_letter::from_record(dlq, &record, reason, &r.to_string());
                if let Some(row) = &row {
                    dead_letter::with_row(&mut record, row.as_row());
                }
                let why = r.to_string();
                let row = row.as_deref();
                Box::pin(self.dead_letter(seq, record, &event_id, &why, counted, row)).await
            }
            Err(e) => Err(e.into()),
        }
    }

    pub(super) async fn dead_letter_unmapped(
        &mut self,
        seq: TxnSeq,
        error: &MappingError,
        row: &SourceRow,
    ) -> Result<(), RelayError> {
        let reason = match error {
            MappingError::InvalidTopic { .. } => Reason::InvalidTopic,
            MappingError::MissingColumn { .. }
            | MappingError::NullColumn { .. }
            | MappingError::NotText { .. }
            | MappingError::NotBinary { .. }
            | MappingError::InvalidUtf8 { .. }
            | MappingError::UnknownPlaceholder(..)
            | MappingError::NullPayload { .. }
            | MappingError::InvalidValue { .. }
            | MappingError::InvalidCloudEventsConfig(_)
            | MappingError::InvalidMessage { .. } => Reason::Mapping,
        };
        let event_id = error.event_id();
        let dlq = &self.settings.dead_letter_topic;
        let why = error.to_string();
        let record = dead_letter::from_row_image(dlq, row.as_row(), reason, &why, event_id);
        self.dead_letter(seq, record, event_id.unwrap_or("?"), &why, false, Some(row))
            .await
    }

    /// Sends a dead letter in place of the event (policy `dead_letter`), or stops. `counted`:
    /// the event was held, so it already counts for its PostgreSQL transaction (which may be
    /// over by now) and its dead letter stands in for it there; only its bytes are new. `row`:
    /// the row it came from, when the session still has it. The dead letter keeps what its
    /// topic and the producer take (`dead_letter::fit`); one that keeps neither payload nor
    /// row image names the outbox row, which is kept from the sweeper ([`Self::keep_row`]).
    pub(super) async fn dead_letter(
        &mut self,
        seq: TxnSeq,
        mut record: Record,
        event_id: &str,
        why: &str,
        counted: bool,
        row: Option<&SourceRow>,
    ) -> Result<(), RelayError> {
        if self.settings.dead_letter_policy == DeadLetterPolicy::Stop {
            return Err(RelayError::Poison(format!("event {event_id}: {why}")));
        }
        let limit = self.sink.record_limit(&record.topic);
        dead_letter::fit(&mut record, limit);
        if let Some(omitted) = dead_letter::lost_content(&record) {
            self.keep_row(&mut record, row, event_id, why, &omitted)
                .await?;
        }
        if let Some(breaker) = &mut self.breaker {
            if !breaker.admit(tokio::time::Instant::now()) {
                self.metrics.dead_letter_breaker_trips.fetch_add(1, Relaxed);
                return Err(RelayError::Breaker(format!(
                    "event {event_id} would be the dead letter number {} within a minute (dead_letter.max_per_minute = {}): {why}",
                    breaker.max() + 1,
                    breaker.max()
                )));
            }
        }
        warn!(event_id, topic = %record.topic, reason = why, "event sent to the dead-letter topic");
        let dead_letter = Held {
            record,
            seq,
            event_id: event_id.to_string(),
            kind: RecordKind::DeadLetter,
            row: None,
        };
        if counted {
            self.in_flight.sent(dead_letter.record.size());
            return self.send_now(dead_letter, true).await;
        }
        self.send_or_hold(dead_letter).await
    }

    /// A dead letter that keeps neither payload nor row image (`omitted`): its outbox row is
    /// the event's only copy once the slot passes it. The row is kept from the sweeper by id
    /// (`relay::sweeper::kept`) and the dead letter names it, so the stream goes on and
    /// `dead-letters redrive` re-sends the event from the row. Without such a row — a logical
    /// message, a row without an id, a refusal reported after the row was let go, a row the
    /// application deleted already — the session stops before confirming past it.
    async fn keep_row(
        &mut self,
        record: &mut Record,
        row: Option<&SourceRow>,
        event_id: &str,
        why: &str,
        omitted: &str,
    ) -> Result<(), RelayError> {
        let original = record
            .headers
            .iter()
            .find(|(k, _)| &**k == dead_letter::HEADER_ORIGINAL_TOPIC)
            .map_or(String::new(), |(_, v)| {
                String::from_utf8_lossy(v).into_owned()
            });
        let stop = |cause: &str| {
            RelayError::TooLargeToKeep(format!(
                "event {event_id} for topic `{original}`: {why}; its dead letter cannot keep it ({omitted}), and {cause}"
            ))
        };
        let Some(row) = row else {
            return Err(stop("its row was no longer at hand when Kafka refused it"));
        };
        let entry = self.relations.get(&row.relation.id);
        let Some(entry) = entry.filter(|e| Arc::ptr_eq(&e.relation, &row.relation)) else {
            return Err(stop(
                "it comes from no outbox table the session knows (a logical message)",
            ));
        };
        let Some((id_column, id)) = entry.bound.as_ref().and_then(|b| b.row_id(&row.tuple)) else {
            return Err(stop("its row has no id to keep it by"));
        };
        let table = match &entry.bound_as {
            Some((schema, table)) => format!("{schema}.{table}"),
            None => format!("{}.{}", row.relation.namespace, row.relation.name),
        };
        let kept = KeptRow {
            table,
            id_column: id_column.to_string(),
            id,
            event_id: event_id.to_string(),
            reason: format!("{why}; its dead letter left out {omitted}"),
        };
        match self.catalog.keep_row(&self.settings.kept, &kept).await? {
            Kept::Kept | Kept::Unrecorded => {}
            Kept::Gone => {
                return Err(stop(
                    "its outbox row is gone already (deleted in its transaction?)",
                ))
            }
        }
        info!(event_id, table = %kept.table, id = %kept.id, omitted,
            "an event too large for its dead letter: the dead letter names its outbox row, kept until `dead-letters redrive` re-sends it");
        dead_letter::name_row(record, &kept.table, &kept.id);
        Ok(())
    }

    /// A record sent or held (`size` bytes): it counts against the in-flight caps and for
    /// the open PostgreSQL transaction.
    pub(super) fn count_in_flight(&mut self, size: usize) {
        self.in_flight.sent(size);
        if let Some(txn) = &mut self.txn {
            txn.sent += 1;
        }
    }
}
