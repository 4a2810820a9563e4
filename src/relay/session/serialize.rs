//! `[outbox.serialization]` in the session: a mapped record's value encoded and framed
//! before it is sent. A payload the schema refuses goes to the dead-letter topic (reason
//! `schema`); while the registry gives no schema the record waits here, retried with
//! back-off: nothing after it is read, so the slot is never confirmed past it, while the
//! acknowledgements of what was sent before it still count and the walsender still hears
//! from the relay.

use std::time::Duration;

use tokio::time::Instant;

use super::Session;
use crate::mapping::OutboxEvent;
use crate::relay::seams::{Catalog, FrameSource, RecordSink};
use crate::relay::RelayError;
use crate::sink::schema::SerializeError;

/// First pause after the registry failed; doubled up to [`MAX_BACKOFF`].
const INITIAL_BACKOFF: Duration = Duration::from_millis(200);
const MAX_BACKOFF: Duration = Duration::from_secs(10);

impl<'a, S: FrameSource, K: RecordSink, C: Catalog> Session<'a, S, K, C> {
    /// Serializes the event's record in place when its table's serialization is on.
    /// `Ok(Err(why))`: the payload (or key) does not fit its schema (dead-letter it). Waits
    /// while the registry fails; `Err` only when shutdown comes meanwhile (the record is sent
    /// again after the restart).
    pub(super) async fn serialize(
        &mut self,
        event: &mut OutboxEvent,
    ) -> Result<Result<(), String>, RelayError> {
        let Some(serializer) = self.settings.serializers.get(event.profile).cloned() else {
            return Ok(Ok(()));
        };
        let record = &mut event.record;
        let mut backoff = INITIAL_BACKOFF;
        loop {
            match serializer.serialize(record).await {
                Ok(()) => return Ok(Ok(())),
                Err(SerializeError::Payload(why)) => return Ok(Err(why)),
                Err(SerializeError::Registry { subject, error }) => {
                    serializer.health().block(&subject, &error);
                    if self.shutdown.is_cancelled() {
                        return Err(RelayError::SchemaRegistry(format!(
                            "subject `{subject}`: {error}"
                        )));
                    }
                    self.wait_for_registry(backoff).await?;
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
            }
        }
    }

    /// Sleeps `pause`, meanwhile handling acknowledgements and sending status updates (so
    /// that `wal_sender_timeout` does not end the stream during a long outage). Returns at
    /// once on shutdown: the caller then gives up.
    async fn wait_for_registry(&mut self, pause: Duration) -> Result<(), RelayError> {
        let until = Instant::now() + pause;
        let shutdown = self.shutdown.clone();
        loop {
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => return Ok(()),
                _ = tokio::time::sleep_until(until) => break,
                Some(delivery) = self.deliveries.recv() => {
                    Box::pin(self.handle_deliveries(delivery)).await?;
                }
            }
        }
        self.schedule_confirm();
        self.send_status(false).await
    }
}
