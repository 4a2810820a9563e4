//! The fakes the session's tests (`tests.rs`) and its simulation (`sim/`) both need, written
//! once: the settings they start from, pgoutput frames as a walsender sends them, a frame
//! source over a channel, and a catalog from a table. What each side does with a status update differs (the tests log it,
//! the simulation moves its slot), so the frame source hands that to an [`Upstream`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::mpsc;

use super::Settings;
use crate::config::{BreakerPolicy, DeadLetterPolicy};
use crate::lsn::Lsn;
use crate::postgres::control::ControlError;
use crate::relay::seams::{Catalog, FrameSource};
use crate::relay::sweeper::kept::{Kept, KeptRow, KeptRows};
use crate::source::pgoutput::encode::encode;
use crate::source::pgoutput::{
    Begin, Column, Commit, Insert, LogicalMessage, Relation, Tuple, TupleValue,
};
use crate::source::walsender::{ReplicationError, ReplicationFrame};

/// The outbox table's relation id.
pub(super) const OUTBOX: u32 = 16_400;

/// At-least-once settings with no cap that bites, rows that cannot be published
/// dead-lettered to `dead_letter_topic`, and a status timer too slow to matter: confirmations
/// come from acknowledgements.
pub(super) fn settings(dead_letter_topic: &str) -> Settings {
    Settings {
        max_in_flight_messages: 10_000,
        max_in_flight_bytes: 1 << 30,
        dead_letter_policy: DeadLetterPolicy::DeadLetter,
        dead_letter_topic: dead_letter_topic.into(),
        dead_letter_max_per_minute: 0,
        on_breaker: BreakerPolicy::Stop,
        shutdown_timeout: Duration::from_secs(5),
        status_interval: Duration::from_secs(60),
        confirm_delay: Duration::ZERO,
        publication: "outbox_relay_pub".into(),
        transactions: None,
        adaptive: false,
        serializers: Default::default(),
        kept: KeptRows::default(),
    }
}

// ---------------------------------------------------------------------------------------
// pgoutput frames.

/// `message` in an XLogData frame, with the header LSNs a logical walsender leaves at 0.
pub(super) fn frame(message: LogicalMessage) -> ReplicationFrame {
    ReplicationFrame::XLogData {
        wal_start: Lsn::ZERO,
        wal_end: Lsn::ZERO,
        data: encode(&message),
    }
}

/// A column value in text format.
pub(super) fn text(s: &str) -> TupleValue {
    TupleValue::Text(Bytes::copy_from_slice(s.as_bytes()))
}

/// The relation message of an outbox table `schema.name`: the outbox's five columns, then
/// `added` text columns (`added_0`, …) as after an `ALTER TABLE … ADD COLUMN`.
pub(super) fn relation(id: u32, schema: &str, name: &str, added: usize) -> ReplicationFrame {
    let column = |name: String, type_oid| Column {
        flags: 0,
        name,
        type_oid,
        type_modifier: -1,
    };
    let mut columns = vec![
        column("id".into(), 2950),
        column("aggregatetype".into(), 1043),
        column("aggregateid".into(), 1043),
        column("type".into(), 1043),
        column("payload".into(), 3802),
    ];
    columns.extend((0..added).map(|i| column(format!("added_{i}"), 25)));
    frame(LogicalMessage::Relation(Relation {
        id,
        namespace: schema.into(),
        name: name.into(),
        replica_identity: b'd',
        columns,
    }))
}

/// The begin of a transaction that commits at `final_lsn`.
pub(super) fn begin(final_lsn: Lsn, xid: u32) -> ReplicationFrame {
    frame(LogicalMessage::Begin(Begin {
        final_lsn,
        commit_time_us: 0,
        xid,
    }))
}

/// An insert into relation `relid`.
pub(super) fn insert(relid: u32, values: Vec<TupleValue>) -> ReplicationFrame {
    frame(LogicalMessage::Insert(Insert {
        relation_id: relid,
        tuple: Tuple(values),
    }))
}

/// The commit of the transaction begun at `commit_lsn`, ending at `end_lsn`.
pub(super) fn commit(commit_lsn: Lsn, end_lsn: Lsn) -> ReplicationFrame {
    frame(LogicalMessage::Commit(Commit {
        flags: 0,
        commit_lsn,
        end_lsn,
        commit_time_us: 0,
    }))
}

// ---------------------------------------------------------------------------------------
// The replication connection.

/// The frames' channel, the walsender's end.
pub(super) type Frames = mpsc::UnboundedSender<Result<ReplicationFrame, ReplicationError>>;

/// What stands behind the fake connection: it sees each frame taken and each status update.
pub(super) trait Upstream {
    /// The session took a frame.
    fn taken(&mut self) {}
    /// A standby status update confirming `flush`, asking for a reply or not.
    fn status(&mut self, flush: Lsn, reply: bool) -> Result<(), ReplicationError>;
    /// The session closed the stream.
    fn closed(&mut self) {}
}

/// The session's end of a replication connection: frames from a channel (the other end may
/// add more while the session runs); none left: waits, as a quiet walsender does.
pub(super) struct ChannelSource<U> {
    pub frames: mpsc::UnboundedReceiver<Result<ReplicationFrame, ReplicationError>>,
    pub upstream: U,
}

impl<U: Upstream> FrameSource for ChannelSource<U> {
    async fn next_frame(&mut self) -> Result<ReplicationFrame, ReplicationError> {
        match self.frames.recv().await {
            Some(frame) => {
                self.upstream.taken();
                frame
            }
            None => std::future::pending().await,
        }
    }

    fn buffered_frame(&mut self) -> Result<Option<ReplicationFrame>, ReplicationError> {
        match self.frames.try_recv() {
            Ok(frame) => {
                self.upstream.taken();
                frame.map(Some)
            }
            Err(_) => Ok(None),
        }
    }

    async fn send_status(
        &mut self,
        _write: Lsn,
        flush: Lsn,
        reply: bool,
    ) -> Result<(), ReplicationError> {
        self.upstream.status(flush, reply)
    }

    async fn close(&mut self) {
        self.upstream.closed();
    }
}

// ---------------------------------------------------------------------------------------
// The control connection.

/// The catalog: each relation id it knows resolves to its partition root; any other to
/// nothing (a dropped relation).
pub(super) struct FakeCatalog(
    HashMap<u32, (String, String)>,
    /// The rows kept from the sweeper; a row whose id is in `gone` does not exist.
    pub(super) Arc<Mutex<Vec<KeptRow>>>,
    pub(super) Vec<String>,
);

impl FakeCatalog {
    /// `(relid, schema, root table)` per known relation.
    pub(super) fn new(roots: &[(u32, &str, &str)]) -> FakeCatalog {
        FakeCatalog(
            roots
                .iter()
                .map(|&(relid, schema, table)| (relid, (schema.to_string(), table.to_string())))
                .collect(),
            Arc::default(),
            Vec::new(),
        )
    }
}

impl Catalog for FakeCatalog {
    async fn partition_root(
        &mut self,
        relid: u32,
    ) -> Result<Option<(String, String)>, ControlError> {
        Ok(self.0.get(&relid).cloned())
    }

    async fn keep_row(&mut self, _: &KeptRows, row: &KeptRow) -> Result<Kept, ControlError> {
        if self.2.contains(&row.id) {
            return Ok(Kept::Gone);
        }
        self.1.lock().unwrap().push(row.clone());
        Ok(Kept::Kept)
    }
}
