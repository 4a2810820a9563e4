//! Exactly-once: the timeline a progress value lies on. In: the replication connection
//! parameters of the session's server. Out: the server's history for `sink::open` (which
//! checks a stored value against it) and, on a standby, a watch the Kafka commit asks.
//!
//! Why a watch: a standby promoted in place goes on streaming to the relay across the switch,
//! so a value written after it lies on the new timeline. The watch keeps a replication
//! connection of its own, idle in command mode (no `wal_sender_timeout` there), and asks
//! `IDENTIFY_SYSTEM` at each commit: a standby answers with the timeline it replays, a
//! promoted one with its new timeline, whose `TIMELINE_HISTORY` then gives the switch point.

use std::sync::Arc;

use tokio::sync::Mutex;
use tracing::{info, warn};

use super::RelayError;
use crate::config::{Config, Delivery};
use crate::sink::progress::{BoxFuture, ServerHistory, Timelines, WatchTimelines};
use crate::source::walsender::{ConnectParams, ReplicationError, WalSender};

/// The server's timeline and its history, which a progress value written on another timeline
/// is checked against (at-least-once: not needed, left empty). A history that cannot be read
/// is reported as unknown (such a progress value then stops the relay).
pub(super) async fn server_history(
    sender: &mut WalSender,
    config: &Config,
) -> Result<ServerHistory, RelayError> {
    if config.kafka.delivery != Delivery::ExactlyOnce {
        return Ok(ServerHistory::default());
    }
    Ok(read_history(sender).await?)
}

async fn read_history(sender: &mut WalSender) -> Result<ServerHistory, ReplicationError> {
    let timeline = sender.timeline().await?;
    let history = match sender.timeline_history(timeline).await {
        Ok(history) => Some(history),
        Err(ReplicationError::Server(e)) => {
            warn!(timeline, error = %e, "cannot read the server's timeline history");
            None
        }
        Err(e) => return Err(e),
    };
    Ok(ServerHistory { timeline, history })
}

/// How progress values get their timeline in this session: fixed on a primary (or in
/// at-least-once, which writes none), watched on a standby.
pub(super) async fn timelines(
    config: &Config,
    in_recovery: bool,
    params: &ConnectParams,
    server: &ServerHistory,
) -> Result<Timelines, RelayError> {
    if config.kafka.delivery != Delivery::ExactlyOnce || !in_recovery {
        return Ok(Timelines::Fixed(server.clone()));
    }
    let sender = WalSender::connect(params).await?;
    Ok(Timelines::Watched(Arc::new(StandbyTimelines {
        state: Mutex::new((sender, server.clone())),
    })))
}

/// The watch on a standby: its own replication connection and the history last read.
struct StandbyTimelines {
    state: Mutex<(WalSender, ServerHistory)>,
}

impl WatchTimelines for StandbyTimelines {
    fn current(&self) -> BoxFuture<'_, Result<ServerHistory, String>> {
        Box::pin(async move {
            let mut state = self.state.lock().await;
            let (sender, known) = &mut *state;
            let now = sender
                .timeline()
                .await
                .map_err(|e| format!("IDENTIFY_SYSTEM on the watch connection: {e}"))?;
            if now != known.timeline {
                let history = sender
                    .timeline_history(now)
                    .await
                    .map_err(|e| format!("TIMELINE_HISTORY {now}: {e}"))?;
                info!(from = known.timeline, to = now, history = ?history,
                    "the server being decoded moved to a new timeline (promoted, or following its upstream): progress values past the switch point carry the new timeline");
                *known = ServerHistory {
                    timeline: now,
                    history: Some(history),
                };
            }
            Ok(known.clone())
        })
    }
}
