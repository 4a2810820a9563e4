//! The streaming half of a walsender connection, after `START_REPLICATION`: CopyData frames
//! in (cancel-safe, under the receive deadline), standby status updates out, and the orderly
//! close that makes the last status update count.

use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use postgres_protocol::message::{backend, frontend};
use tokio::io::AsyncWriteExt;
use tokio::time::Instant;

use super::{
    encode_status_update, parse_frame, server_error, ReplicationError, ReplicationFrame, WalSender,
};
use crate::lsn::Lsn;

/// How long `close` waits for the server to end the stream.
const CLOSE_WAIT: Duration = Duration::from_secs(5);
/// What `close` reads and drops before it lets the server's output back up, and how long it
/// then waits for the server to read the last status update.
const CLOSE_DISCARD: usize = 16 << 20;
const CLOSE_BACK_UP: Duration = Duration::from_secs(1);

/// A connection in CopyBoth mode: frames in, status updates out.
pub struct ReplicationStream {
    conn: WalSender,
}

impl ReplicationStream {
    /// `conn` after the server's CopyBothResponse.
    pub(super) fn new(conn: WalSender) -> Self {
        ReplicationStream { conn }
    }

    pub fn backend_pid(&self) -> i32 {
        self.conn.backend_pid
    }

    /// When bytes last arrived from the server (for `/readyz`).
    pub fn last_received(&self) -> std::time::Instant {
        self.conn.last_read.into_std()
    }

    /// No frame for this long fails [`ReplicationStream::next_frame`].
    pub fn receive_timeout(&self) -> Duration {
        self.conn.receive_timeout
    }

    /// The next replication frame. Cancel-safe.
    ///
    /// Fails with [`ReplicationError::ReceiveTimeout`] when nothing has arrived for the receive
    /// deadline. The clock runs from the last bytes received, not from this call, so the
    /// deadline holds although `select!` recreates this future on every turn; bytes that came
    /// while the caller was not reading (in-flight cap reached) are still taken first.
    pub async fn next_frame(&mut self) -> Result<ReplicationFrame, ReplicationError> {
        loop {
            if let Some(frame) = self.buffered_frame()? {
                return Ok(frame);
            }
            let limit = self.conn.receive_timeout;
            let deadline = self.conn.last_read + limit;
            // `timeout_at` polls the read first, so ready bytes win over an expired deadline.
            match tokio::time::timeout_at(deadline, self.conn.fill()).await {
                Ok(filled) => filled?,
                Err(_) => {
                    return Err(ReplicationError::ReceiveTimeout {
                        waited: self.conn.last_read.elapsed(),
                        limit,
                    })
                }
            }
        }
    }

    /// The next frame if a whole one is already buffered; reads nothing from the socket.
    pub fn buffered_frame(&mut self) -> Result<Option<ReplicationFrame>, ReplicationError> {
        self.take_copy_data()?.map(parse_frame).transpose()
    }

    /// Takes one buffered CopyData body, if a whole one is there; other messages are handled
    /// (errors returned, notices skipped).
    fn take_copy_data(&mut self) -> Result<Option<Bytes>, ReplicationError> {
        loop {
            let buf = &mut self.conn.buf;
            let Some(header) = backend::Header::parse(buf)? else {
                return Ok(None);
            };
            let total = header.len() as usize + 1;
            if buf.len() < total {
                return Ok(None);
            }
            if header.tag() == b'd' {
                let mut frame = buf.split_to(total).freeze();
                frame.advance(5);
                return Ok(Some(frame));
            }
            match backend::Message::parse(buf)? {
                Some(backend::Message::ErrorResponse(body)) => {
                    return Err(ReplicationError::Server(Box::new(server_error(&body)?)))
                }
                // The server ends the stream (shutdown): CopyDone, or straight CommandComplete.
                Some(backend::Message::CopyDone)
                | Some(backend::Message::CommandComplete(_))
                | Some(backend::Message::ReadyForQuery(_)) => return Err(ReplicationError::Closed),
                Some(backend::Message::NoticeResponse(_)) => {}
                Some(_) => {
                    return Err(ReplicationError::Protocol(format!(
                        "unexpected message {:?} while streaming",
                        header.tag() as char
                    )))
                }
                None => return Ok(None),
            }
        }
    }

    /// Sends a standby status update: `flush` is what the slot may confirm.
    pub async fn send_status(
        &mut self,
        write: Lsn,
        flush: Lsn,
        reply: bool,
    ) -> Result<(), ReplicationError> {
        let out = encode_status_update(write, flush, flush, reply);
        self.conn.send(&out).await
    }

    /// Ends streaming and waits for the server to end it too: CopyDone, then what the server
    /// still sends is read and dropped up to its CopyDone (it answers ours after reading
    /// everything before it), then Terminate. The wait is what makes the last status update
    /// count: a walsender still sending when the client vanishes dies on the broken pipe,
    /// unread messages and all (before the wait, half the SIGTERM stops in the tests ended that
    /// way; a CI run once re-sent 208 events after four stops). A walsender in the middle of one
    /// big transaction reads nothing while its output flows, so past [`CLOSE_DISCARD`] bytes
    /// the reading stops, its output backs up, and it reads ours. Bounded; errors are
    /// irrelevant here: the connection may be gone.
    pub async fn close(&mut self) {
        let mut out = BytesMut::new();
        frontend::copy_done(&mut out);
        if self.conn.send(&out).await.is_ok() {
            let deadline = Instant::now() + CLOSE_WAIT;
            match tokio::time::timeout_at(deadline, self.read_to_stream_end()).await {
                Ok(Ok(true)) => {}
                Ok(Ok(false)) => {
                    tokio::time::sleep_until(deadline.min(Instant::now() + CLOSE_BACK_UP)).await
                }
                ended => tracing::debug!(
                    ?ended,
                    "the server did not end the stream; the last status update may be lost"
                ),
            }
        }
        out.clear();
        frontend::terminate(&mut out);
        let _ = self.conn.send(&out).await;
        let _ = self.conn.io.shutdown().await;
    }

    /// Reads and drops messages up to the server's CopyDone (or straight ReadyForQuery): true.
    /// False once [`CLOSE_DISCARD`] bytes of data were dropped first.
    async fn read_to_stream_end(&mut self) -> Result<bool, ReplicationError> {
        let mut dropped = 0;
        loop {
            match backend::Message::parse(&mut self.conn.buf)? {
                Some(backend::Message::CopyDone | backend::Message::ReadyForQuery(_)) => {
                    return Ok(true)
                }
                Some(backend::Message::ErrorResponse(body)) => {
                    return Err(ReplicationError::Server(Box::new(server_error(&body)?)))
                }
                Some(backend::Message::CopyData(data)) => {
                    dropped += data.data().len();
                    if dropped > CLOSE_DISCARD {
                        return Ok(false);
                    }
                }
                Some(_) => {}
                None => self.conn.fill().await?,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::pin::Pin;
    use std::task::{ready, Context, Poll};

    use bytes::BufMut;
    use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
    use tokio::time::Instant;
    use tokio_postgres::config::Host;

    use super::super::Transport;
    use super::*;
    use crate::postgres::conninfo::{Endpoint, ServerState};

    /// A streaming connection over an in-memory pipe; the other end plays the server.
    fn stream_over(limit: Duration) -> (ReplicationStream, tokio::io::DuplexStream) {
        let (ours, server) = tokio::io::duplex(64 * 1024);
        (stream_on(Box::new(ours), limit), server)
    }

    fn stream_on(io: Box<dyn Transport>, limit: Duration) -> ReplicationStream {
        let conn = WalSender {
            io,
            channel_binding: None,
            buf: BytesMut::new(),
            backend_pid: 1,
            last_read: Instant::now(),
            receive_timeout: limit,
            endpoint: Endpoint {
                host: Host::Tcp("test".into()),
                port: 1,
            },
            server: ServerState {
                in_recovery: false,
                read_only: false,
                version_num: 170000,
            },
        };
        ReplicationStream::new(conn)
    }

    /// Reads as TLS does: at most one record (here `record` bytes) per read, whatever has
    /// arrived behind it.
    struct RecordReads {
        inner: tokio::io::DuplexStream,
        record: usize,
    }

    impl Transport for RecordReads {
        fn reads_one_record(&self) -> bool {
            true
        }
    }

    impl AsyncRead for RecordReads {
        fn poll_read(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<std::io::Result<()>> {
            let mut record = vec![0; self.record.min(buf.remaining())];
            let mut part = ReadBuf::new(&mut record);
            ready!(Pin::new(&mut self.inner).poll_read(cx, &mut part))?;
            buf.put_slice(part.filled());
            Poll::Ready(Ok(()))
        }
    }

    impl AsyncWrite for RecordReads {
        fn poll_write(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<std::io::Result<usize>> {
            Pin::new(&mut self.inner).poll_write(cx, buf)
        }

        fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Pin::new(&mut self.inner).poll_flush(cx)
        }

        fn poll_shutdown(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<std::io::Result<()>> {
            Pin::new(&mut self.inner).poll_shutdown(cx)
        }
    }

    fn keepalive(wal_end: u64) -> ReplicationFrame {
        ReplicationFrame::Keepalive {
            wal_end: Lsn(wal_end),
            reply_requested: false,
        }
    }

    #[tokio::test]
    async fn over_tls_one_read_takes_every_record_that_has_arrived() {
        let (ours, mut server) = tokio::io::duplex(64 * 1024);
        let record = keepalive_message(0).len();
        let io = Box::new(RecordReads {
            inner: ours,
            record,
        });
        let mut stream = stream_on(io, Duration::from_secs(5));
        for wal_end in 1..=3 {
            server.write_all(&keepalive_message(wal_end)).await.unwrap();
        }
        assert_eq!(stream.next_frame().await.unwrap(), keepalive(1));
        // The same wake-up read the other two records.
        assert_eq!(stream.buffered_frame().unwrap(), Some(keepalive(2)));
        assert_eq!(stream.buffered_frame().unwrap(), Some(keepalive(3)));
        assert_eq!(stream.buffered_frame().unwrap(), None);
        // Nothing more has arrived: the next frame waits for it.
        server.write_all(&keepalive_message(4)).await.unwrap();
        assert_eq!(stream.next_frame().await.unwrap(), keepalive(4));
    }

    /// A keepalive frame inside CopyData, as the server sends it.
    fn keepalive_message(wal_end: u64) -> Vec<u8> {
        let mut body = BytesMut::new();
        body.put_u8(b'k');
        body.put_u64(wal_end);
        body.put_i64(0);
        body.put_u8(0);
        let mut out = vec![b'd'];
        out.extend_from_slice(&(4 + body.len() as i32).to_be_bytes());
        out.extend_from_slice(&body);
        out
    }

    #[tokio::test]
    async fn silent_stream_fails_at_the_receive_deadline() {
        let limit = Duration::from_millis(200);
        let (mut stream, _server) = stream_over(limit);
        let started = std::time::Instant::now();
        let err = stream.next_frame().await.unwrap_err();
        let took = started.elapsed();
        assert!(
            matches!(err, ReplicationError::ReceiveTimeout { limit: l, .. } if l == limit),
            "{err:?}"
        );
        assert!(took >= limit && took < Duration::from_secs(2), "{took:?}");
        assert!(err.is_transient());
        assert!(err.to_string().contains("receive deadline"), "{err}");
    }

    #[tokio::test]
    async fn deadline_runs_from_the_last_bytes_not_from_each_poll() {
        let limit = Duration::from_millis(300);
        let (mut stream, mut server) = stream_over(limit);
        let writer = tokio::spawn(async move {
            for i in 0..8 {
                tokio::time::sleep(Duration::from_millis(100)).await;
                server.write_all(&keepalive_message(i)).await.unwrap();
            }
            server // kept open, silent
        });
        // As in the pipeline's select!: the read future is dropped and recreated often.
        let mut frames = 0;
        let started = std::time::Instant::now();
        let err = loop {
            tokio::select! {
                frame = stream.next_frame() => match frame {
                    Ok(_) => frames += 1,
                    Err(e) => break e,
                },
                _ = tokio::time::sleep(Duration::from_millis(30)) => {}
            }
        };
        assert_eq!(frames, 8, "every frame before the silence arrives");
        assert!(
            matches!(err, ReplicationError::ReceiveTimeout { .. }),
            "{err:?}"
        );
        // 8 frames over ~800 ms, then the deadline: the 30 ms polls never reset it.
        let took = started.elapsed();
        assert!(took >= Duration::from_millis(1_000), "{took:?}");
        assert!(took < Duration::from_millis(3_000), "{took:?}");
        drop(writer.await.unwrap());
    }

    #[tokio::test]
    async fn bytes_that_waited_win_over_an_expired_deadline() {
        let (mut stream, mut server) = stream_over(Duration::from_millis(100));
        server.write_all(&keepalive_message(7)).await.unwrap();
        // The caller did not read for longer than the deadline (in-flight cap reached).
        tokio::time::sleep(Duration::from_millis(250)).await;
        assert_eq!(stream.next_frame().await.unwrap(), keepalive(7));
        assert!(matches!(
            stream.next_frame().await,
            Err(ReplicationError::ReceiveTimeout { .. })
        ));
    }
}
