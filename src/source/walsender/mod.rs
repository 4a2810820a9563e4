//! Our walsender client: a PostgreSQL connection in `replication=database` mode that streams a
//! logical slot.
//!
//! Mainline tokio-postgres cannot do this (no replication startup parameter, no CopyBoth), so
//! the wire protocol is spoken here with `postgres-protocol`: startup, authentication (trust,
//! cleartext, md5, SCRAM-SHA-256), `START_REPLICATION`, then CopyData frames both ways.
//!
//! Reading is cancel-safe (`ReplicationStream::next_frame` only consumes a frame once it is
//! whole), so the pipeline can poll it inside `tokio::select!` next to its timers.
//!
//! Dead connections: the socket has TCP keepalives and `TCP_USER_TIMEOUT`, and the stream has
//! a receive deadline. A healthy server sends a frame at least every `wal_sender_timeout / 2`
//! while idle, and answers every status update that asks for a reply, so silence longer than
//! the deadline means the path is gone (a NAT or load balancer dropped the flow without a
//! FIN/RST, a frozen VM): `next_frame` then fails with [`ReplicationError::ReceiveTimeout`].
//!
//! This file is the connection up to `START_REPLICATION`: connect, log in, commands. The
//! parts: `transport` (socket, keepalives, TLS), `frames` (the CopyData codec),
//! `receive_timeout` (the receive deadline's policy), `stream` ([`ReplicationStream`], after
//! `START_REPLICATION`).

use std::future::Future;
use std::io;
use std::task::Poll;
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use fallible_iterator::FallibleIterator;
use postgres_protocol::authentication::md5_hash;
use postgres_protocol::authentication::sasl::{
    ChannelBinding, ScramSha256, SCRAM_SHA_256, SCRAM_SHA_256_PLUS,
};
use postgres_protocol::message::{backend, frontend};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_postgres::config::Host;

use crate::config::{PostgresConfig, SslMode, TcpKeepalive, FALLBACK_RECEIVE_TIMEOUT_MS};
use crate::lsn::Lsn;
use crate::postgres::conninfo::{
    ConnInfo, Endpoint, HostsError, NoHost, ServerState, SERVER_STATE_SQL,
};
use crate::postgres::control::quote_ident;
use crate::postgres::tls::{server_end_point, TlsSettings};

mod frames;
mod receive_timeout;
mod stream;
mod transport;

pub use frames::{encode_status_update, parse_frame, pg_time_to_unix_us, ReplicationFrame};
pub use receive_timeout::{
    check_receive_timeout, minimum_receive_timeout, receive_timeout, ReceiveTimeoutTooLow,
    RECEIVE_TIMEOUT_MARGIN,
};
pub use stream::ReplicationStream;
use transport::open_transport;

/// Microseconds between the Unix epoch and PostgreSQL's epoch (2000-01-01 UTC).
const PG_EPOCH_OFFSET_US: i64 = 946_684_800_000_000;
/// How much the read buffer grows by when it runs out of room.
const READ_CHUNK: usize = 256 * 1024;
/// The most plaintext one TLS record carries.
const TLS_RECORD_MAX: usize = 16 * 1024;
/// SQLSTATE object_in_use: the slot is streamed by another backend.
const SQLSTATE_OBJECT_IN_USE: &str = "55006";
/// SQLSTATE undefined_object: the slot does not exist.
const SQLSTATE_UNDEFINED_OBJECT: &str = "42704";

/// An error reported by the server (`ErrorResponse`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerError {
    pub code: String,
    pub message: String,
    pub detail: Option<String>,
    pub hint: Option<String>,
}

impl std::fmt::Display for ServerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (SQLSTATE {})", self.message, self.code)?;
        if let Some(detail) = &self.detail {
            write!(f, "; detail: {detail}")?;
        }
        if let Some(hint) = &self.hint {
            write!(f, "; hint: {hint}")?;
        }
        Ok(())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ReplicationError {
    #[error(
        "cannot reach PostgreSQL at {target}: {source}; is the server running and the URL right?"
    )]
    Connect {
        target: String,
        #[source]
        source: io::Error,
    },
    #[error("connection to PostgreSQL timed out after {0:?} ({1})")]
    ConnectTimeout(Duration, String),
    #[error("replication connection failed: {0}")]
    Io(#[from] io::Error),
    #[error("PostgreSQL closed the replication connection")]
    Closed,
    #[error("authentication failed: {0}")]
    Auth(String),
    #[error("slot `{slot}` is active in another backend: another relay holds it, or a stale connection; see `outbox-relay status`")]
    SlotActive {
        slot: String,
        server: Box<ServerError>,
    },
    #[error("slot `{slot}` does not exist: {server}; create it with `outbox-relay slot create` (events since it was lost may be missing: recover them with `outbox-relay replay`)")]
    SlotMissing {
        slot: String,
        server: Box<ServerError>,
    },
    #[error("PostgreSQL error: {0}")]
    Server(Box<ServerError>),
    #[error("replication protocol violation: {0}")]
    Protocol(String),
    #[error("invalid PostgreSQL URL: {0}")]
    Url(String),
    /// Several hosts, none usable.
    #[error(transparent)]
    Hosts(NoHost),
    #[error("TLS with PostgreSQL failed: {0}")]
    Tls(String),
    /// The handshake broke off (server restarting, network): worth another try.
    #[error("TLS handshake with PostgreSQL broke off: {0}")]
    TlsInterrupted(String),
    /// Nothing arrived before the receive deadline: the connection is presumed dead.
    #[error("no replication frame from PostgreSQL for {waited:?} (receive deadline {limit:?}): the server answers every status update, so the connection is presumed dead (a path dropped without FIN or RST)")]
    ReceiveTimeout { waited: Duration, limit: Duration },
    /// An explicit receive deadline the server cannot keep: never heals by reconnecting.
    #[error(transparent)]
    ReceiveTimeoutTooLow(#[from] ReceiveTimeoutTooLow),
}

impl ReplicationError {
    /// Transient errors heal by reconnecting (with backoff); the others need an operator.
    pub fn is_transient(&self) -> bool {
        match self {
            ReplicationError::Connect { .. }
            | ReplicationError::ConnectTimeout(..)
            | ReplicationError::Io(_)
            | ReplicationError::Closed
            | ReplicationError::TlsInterrupted(_)
            | ReplicationError::ReceiveTimeout { .. }
            | ReplicationError::SlotActive { .. } => true,
            // Shutdown, crash recovery, too many connections: the server will be back.
            ReplicationError::Server(e) => crate::postgres::control::sqlstate_is_transient(&e.code),
            ReplicationError::Hosts(all) => all.is_transient(),
            _ => false,
        }
    }
}

/// Where and as whom to connect (the resolved [`ConnInfo`]), and the stream's own settings.
#[derive(Clone)]
pub struct ConnectParams {
    pub info: ConnInfo,
    pub application_name: String,
    /// No frame for this long while streaming ends the stream (see [`receive_timeout`]).
    pub receive_timeout: Duration,
}

impl std::fmt::Debug for ConnectParams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectParams")
            .field("info", &self.info)
            .field("application_name", &self.application_name)
            .finish_non_exhaustive()
    }
}

impl ConnectParams {
    /// The replication connection to the servers `info` describes.
    pub fn new(info: ConnInfo) -> Self {
        ConnectParams {
            info,
            application_name: "outbox-relay".into(),
            receive_timeout: Duration::from_millis(FALLBACK_RECEIVE_TIMEOUT_MS),
        }
    }

    /// Hosts, credentials, database and TLS as `[postgres]` says.
    pub fn from_config(pg: &PostgresConfig) -> Result<Self, ReplicationError> {
        let info = ConnInfo::from_config(pg).map_err(|e| ReplicationError::Url(e.to_string()))?;
        let mut params = Self::new(info);
        if pg.receive_timeout_ms != 0 {
            params.receive_timeout = Duration::from_millis(pg.receive_timeout_ms);
        }
        Ok(params)
    }

    /// Every host, for messages.
    pub fn target(&self) -> String {
        self.info.targets()
    }
}

trait Transport: AsyncRead + AsyncWrite + Unpin + Send {
    /// One read hands over at most one TLS record, even when more have arrived: OpenSSL's
    /// read-ahead holds the rest, and reading again at once takes them without a system call.
    fn reads_one_record(&self) -> bool {
        false
    }
}
impl Transport for TcpStream {}
#[cfg(unix)]
impl Transport for tokio::net::UnixStream {}
impl Transport for tokio_openssl::SslStream<TcpStream> {
    fn reads_one_record(&self) -> bool {
        true
    }
}
#[cfg(test)]
impl Transport for tokio::io::DuplexStream {}

/// An authenticated replication connection, ready for a replication command.
pub struct WalSender {
    io: Box<dyn Transport>,
    /// `tls-server-end-point` data when the connection is TLS, for SCRAM channel binding.
    channel_binding: Option<Vec<u8>>,
    buf: BytesMut,
    /// The server's backend process id, for logs and `pg_terminate_backend`.
    pub backend_pid: i32,
    /// When bytes last arrived from the server.
    last_read: Instant,
    receive_timeout: Duration,
    endpoint: Endpoint,
    server: ServerState,
}

impl WalSender {
    /// Connects to the first host whose server satisfies `target_session_attrs` (asked on
    /// the replication connection itself, before any replication command).
    pub async fn connect(params: &ConnectParams) -> Result<WalSender, ReplicationError> {
        let opened = params
            .info
            .connect_first(
                |endpoint| Self::connect_one(params, endpoint),
                ReplicationError::is_transient,
            )
            .await;
        match opened {
            Ok((conn, _, _)) => Ok(conn),
            Err(HostsError::One(e)) => Err(e),
            Err(HostsError::All(all)) => Err(ReplicationError::Hosts(all)),
        }
    }

    async fn connect_one(
        params: &ConnectParams,
        endpoint: Endpoint,
    ) -> Result<(WalSender, ServerState), ReplicationError> {
        let timeout = params.info.connect_timeout;
        let target = endpoint.target();
        let (io, channel_binding) =
            tokio::time::timeout(timeout, open_transport(params, &endpoint))
                .await
                .map_err(|_| ReplicationError::ConnectTimeout(timeout, target.clone()))??;
        let mut conn = WalSender {
            io,
            channel_binding,
            buf: BytesMut::with_capacity(READ_CHUNK),
            backend_pid: 0,
            last_read: Instant::now(),
            receive_timeout: params.receive_timeout,
            endpoint: endpoint.clone(),
            server: ServerState {
                in_recovery: false,
                read_only: false,
                version_num: 0,
            },
        };
        let ready = async {
            conn.startup(params).await?;
            conn.simple_query(SERVER_STATE_SQL).await
        };
        let rows = tokio::time::timeout(timeout, ready)
            .await
            .map_err(|_| ReplicationError::ConnectTimeout(timeout, target.clone()))??;
        let state = rows
            .first()
            .and_then(|r| match r.as_slice() {
                [Some(a), Some(b), Some(c)] => ServerState::from_row(a, b, c),
                _ => None,
            })
            .ok_or_else(|| {
                ReplicationError::Protocol(format!("{target} did not describe itself"))
            })?;
        conn.server = state;
        Ok((conn, state))
    }

    /// The host this connection reached.
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// The server's role and version as seen at connect time.
    pub fn server(&self) -> ServerState {
        self.server
    }

    /// Runs one simple-protocol command (plain SQL, or a replication command such as
    /// `ALTER_REPLICATION_SLOT`) before streaming; returns its rows as text.
    /// `IDENTIFY_SYSTEM`: the server's current timeline.
    pub async fn timeline(&mut self) -> Result<u32, ReplicationError> {
        let rows = self.simple_query("IDENTIFY_SYSTEM").await?;
        rows.first()
            .and_then(|row| row.get(1).cloned().flatten())
            .and_then(|tli| tli.parse().ok())
            .ok_or_else(|| ReplicationError::Protocol("IDENTIFY_SYSTEM gave no timeline".into()))
    }

    /// `TIMELINE_HISTORY tli`: each earlier timeline of the server and the LSN where it was
    /// left, oldest first (none for timeline 1).
    pub async fn timeline_history(
        &mut self,
        tli: u32,
    ) -> Result<Vec<(u32, Lsn)>, ReplicationError> {
        if tli <= 1 {
            return Ok(Vec::new());
        }
        let rows = self
            .simple_query(&format!("TIMELINE_HISTORY {tli}"))
            .await?;
        let content = rows
            .first()
            .and_then(|row| row.get(1).cloned().flatten())
            .unwrap_or_default();
        Ok(parse_timeline_history(&content))
    }

    pub async fn simple_query(
        &mut self,
        sql: &str,
    ) -> Result<Vec<Vec<Option<String>>>, ReplicationError> {
        let mut out = BytesMut::new();
        frontend::query(sql, &mut out)?;
        self.send(&out).await?;
        let mut rows = Vec::new();
        let mut failed = None;
        loop {
            match self.read_message().await? {
                backend::Message::DataRow(body) => {
                    let buf = body.buffer();
                    let mut row = Vec::new();
                    let mut ranges = body.ranges();
                    while let Some(range) = ranges.next()? {
                        row.push(range.map(|r| String::from_utf8_lossy(&buf[r]).into_owned()));
                    }
                    rows.push(row);
                }
                backend::Message::ErrorResponse(body) => failed = Some(server_error(&body)?),
                backend::Message::ReadyForQuery(_) => {
                    return match failed {
                        Some(e) => Err(ReplicationError::Server(Box::new(e))),
                        None => Ok(rows),
                    }
                }
                _ => {}
            }
        }
    }

    async fn startup(&mut self, params: &ConnectParams) -> Result<(), ReplicationError> {
        let mut out = BytesMut::new();
        let info = &params.info;
        let mut startup = vec![
            ("user", info.user.as_str()),
            ("database", info.dbname.as_str()),
            ("replication", "database"),
            ("application_name", params.application_name.as_str()),
            ("client_encoding", "UTF8"),
        ];
        if let Some(options) = &info.options {
            startup.push(("options", options.as_str()));
        }
        frontend::startup_message(startup, &mut out)?;
        self.send(&out).await?;
        self.authenticate(params).await?;
        self.wait_ready().await
    }

    async fn authenticate(&mut self, params: &ConnectParams) -> Result<(), ReplicationError> {
        loop {
            match self.read_message().await? {
                backend::Message::AuthenticationOk => return Ok(()),
                backend::Message::AuthenticationCleartextPassword => {
                    let password = require_password(params)?;
                    self.send_password(password).await?;
                }
                backend::Message::AuthenticationMd5Password(body) => {
                    let password = require_password(params)?;
                    let hash = md5_hash(params.info.user.as_bytes(), password, body.salt());
                    self.send_password(hash.as_bytes()).await?;
                }
                backend::Message::AuthenticationSasl(body) => {
                    let mut mechanisms = body.mechanisms();
                    let (mut scram, mut plus) = (false, false);
                    while let Some(m) = mechanisms.next()? {
                        scram |= m == SCRAM_SHA_256;
                        plus |= m == SCRAM_SHA_256_PLUS;
                    }
                    if !scram && !plus {
                        return Err(ReplicationError::Auth(
                            "the server offers no SASL mechanism we support (SCRAM-SHA-256)".into(),
                        ));
                    }
                    self.scram(require_password(params)?, plus).await?;
                }
                backend::Message::ErrorResponse(body) => return Err(login_error(&body)?),
                _ => {
                    return Err(ReplicationError::Auth(
                        "unsupported authentication method requested by the server (use trust, password, md5 or scram-sha-256)".into(),
                    ))
                }
            }
        }
    }

    async fn send_password(&mut self, password: &[u8]) -> Result<(), ReplicationError> {
        let mut out = BytesMut::new();
        frontend::password_message(password, &mut out)?;
        self.send(&out).await
    }

    /// SCRAM-SHA-256, bound to the TLS channel (`-PLUS`) when both sides can.
    async fn scram(&mut self, password: &[u8], server_plus: bool) -> Result<(), ReplicationError> {
        let (mechanism, binding) = match (&self.channel_binding, server_plus) {
            (Some(data), true) => (
                SCRAM_SHA_256_PLUS,
                ChannelBinding::tls_server_end_point(data.clone()),
            ),
            (Some(_), false) => (SCRAM_SHA_256, ChannelBinding::unrequested()),
            (None, _) => (SCRAM_SHA_256, ChannelBinding::unsupported()),
        };
        let mut scram = ScramSha256::new(password, binding);
        let mut out = BytesMut::new();
        frontend::sasl_initial_response(mechanism, scram.message(), &mut out)?;
        self.send(&out).await?;
        match self.read_message().await? {
            backend::Message::AuthenticationSaslContinue(body) => scram.update(body.data())?,
            backend::Message::ErrorResponse(body) => return Err(login_error(&body)?),
            _ => return Err(ReplicationError::Protocol("unexpected SASL message".into())),
        }
        out.clear();
        frontend::sasl_response(scram.message(), &mut out)?;
        self.send(&out).await?;
        match self.read_message().await? {
            backend::Message::AuthenticationSaslFinal(body) => Ok(scram.finish(body.data())?),
            backend::Message::ErrorResponse(body) => Err(login_error(&body)?),
            _ => Err(ReplicationError::Protocol("unexpected SASL message".into())),
        }
    }

    /// Reads parameter statuses and the backend key until ReadyForQuery.
    async fn wait_ready(&mut self) -> Result<(), ReplicationError> {
        loop {
            match self.read_message().await? {
                backend::Message::ReadyForQuery(_) => return Ok(()),
                backend::Message::BackendKeyData(body) => self.backend_pid = body.process_id(),
                backend::Message::ErrorResponse(body) => {
                    return Err(ReplicationError::Server(Box::new(server_error(&body)?)))
                }
                _ => {}
            }
        }
    }

    /// Sends `START_REPLICATION` for a pgoutput slot and switches to streaming.
    ///
    /// `start` of `Lsn::ZERO` resumes from the slot's `confirmed_flush_lsn`. `messages` asks
    /// for logical decoding messages, `binary` for columns in their types' binary formats
    /// (PostgreSQL 14+, like the relay itself).
    pub async fn start_replication(
        mut self,
        slot: &str,
        publication: &str,
        start: Lsn,
        messages: bool,
        binary: bool,
    ) -> Result<ReplicationStream, ReplicationError> {
        let command = start_replication_command(slot, publication, start, messages, binary);
        tracing::debug!(%command, "starting replication");
        let mut out = BytesMut::new();
        frontend::query(&command, &mut out)?;
        self.send(&out).await?;
        loop {
            let header = self.read_header().await?;
            if header.tag() == b'W' {
                // CopyBothResponse: postgres-protocol's parser does not know it.
                self.buf.advance(header.len() as usize + 1);
                self.last_read = Instant::now();
                return Ok(ReplicationStream::new(self));
            }
            match self.read_message().await? {
                backend::Message::ErrorResponse(body) => {
                    return Err(classify_start_error(slot, server_error(&body)?))
                }
                backend::Message::NoticeResponse(_) => {}
                _ => {
                    return Err(ReplicationError::Protocol(
                        "unexpected answer to START_REPLICATION".into(),
                    ))
                }
            }
        }
    }

    async fn send(&mut self, bytes: &[u8]) -> Result<(), ReplicationError> {
        self.io.write_all(bytes).await?;
        self.io.flush().await?;
        Ok(())
    }

    /// Waits until a whole message is buffered and returns its header.
    async fn read_header(&mut self) -> Result<backend::Header, ReplicationError> {
        loop {
            if let Some(header) = backend::Header::parse(&self.buf)? {
                if self.buf.len() > header.len() as usize {
                    return Ok(header);
                }
            }
            self.fill().await?;
        }
    }

    async fn read_message(&mut self) -> Result<backend::Message, ReplicationError> {
        self.read_header().await?;
        backend::Message::parse(&mut self.buf)?
            .ok_or_else(|| ReplicationError::Protocol("incomplete message".into()))
    }

    /// Reads more bytes from the socket. Cancel-safe: bytes land in `buf` or nowhere.
    async fn fill(&mut self) -> Result<(), ReplicationError> {
        if self.buf.capacity() - self.buf.len() < READ_CHUNK / 4 {
            self.buf.reserve(READ_CHUNK);
        }
        if self.io.read_buf(&mut self.buf).await? == 0 {
            return Err(ReplicationError::Closed);
        }
        self.last_read = Instant::now();
        if self.io.reads_one_record() {
            self.take_ready_records().await?;
        }
        Ok(())
    }

    /// Over TLS, takes the records that have already arrived too, without waiting. The
    /// walsender writes each message in a record of its own, so one read is one message: a
    /// backlog of 1-row transactions cost a wake-up of the session per message, three per
    /// event. Stops at the first read that would wait, at the end of the stream (the next
    /// `fill` reports it) or when the buffer's room is short of a whole record.
    async fn take_ready_records(&mut self) -> Result<(), ReplicationError> {
        while self.buf.capacity() - self.buf.len() >= TLS_RECORD_MAX {
            let mut read = std::pin::pin!(self.io.read_buf(&mut self.buf));
            match std::future::poll_fn(|cx| Poll::Ready(read.as_mut().poll(cx))).await {
                Poll::Ready(Ok(0)) | Poll::Pending => break,
                Poll::Ready(Ok(_)) => {}
                Poll::Ready(Err(e)) => return Err(e.into()),
            }
        }
        Ok(())
    }
}

/// An error while logging in: refused credentials (SQLSTATE class 28) need an operator; a
/// server that is starting up or shutting down (57P03, 57P01) is only a reason to retry.
fn login_error(body: &backend::ErrorResponseBody) -> Result<ReplicationError, ReplicationError> {
    let error = server_error(body)?;
    Ok(if error.code.starts_with("28") {
        ReplicationError::Auth(error.to_string())
    } else {
        ReplicationError::Server(Box::new(error))
    })
}

fn require_password(params: &ConnectParams) -> Result<&[u8], ReplicationError> {
    params.info.password().map(str::as_bytes).ok_or_else(|| {
        ReplicationError::Auth(format!(
            "the server asks a password for user `{}` and none is configured (put it in the URL, postgres.password_file, or PGPASSWORD)",
            params.info.user
        ))
    })
}

/// The connection and, for TLS, its channel binding data.
type Opened = (Box<dyn Transport>, Option<Vec<u8>>);

/// Quotes a string literal (`'` doubled).
fn quote_literal(value: &str) -> String {
    format!("'{}'", value.replace('\'', "''"))
}

fn start_replication_command(
    slot: &str,
    publication: &str,
    start: Lsn,
    messages: bool,
    binary: bool,
) -> String {
    // publication_names is itself a list of identifiers inside a string literal.
    let publications = quote_literal(&quote_ident(publication));
    // `binary` only when asked for: text mode sends the same command as before the option.
    format!(
        "START_REPLICATION SLOT {} LOGICAL {} (\"proto_version\" '1', \"publication_names\" {}, \"messages\" '{}'{})",
        quote_ident(slot),
        start,
        publications,
        if messages { "true" } else { "false" },
        if binary { ", \"binary\" 'true'" } else { "" }
    )
}

fn classify_start_error(slot: &str, server: ServerError) -> ReplicationError {
    let slot = slot.to_string();
    let server = Box::new(server);
    match server.code.as_str() {
        SQLSTATE_OBJECT_IN_USE => ReplicationError::SlotActive { slot, server },
        SQLSTATE_UNDEFINED_OBJECT if server.message.contains("replication slot") => {
            ReplicationError::SlotMissing { slot, server }
        }
        _ => ReplicationError::Server(server),
    }
}

fn server_error(body: &backend::ErrorResponseBody) -> Result<ServerError, ReplicationError> {
    let mut error = ServerError {
        code: String::new(),
        message: String::new(),
        detail: None,
        hint: None,
    };
    let mut fields = body.fields();
    while let Some(field) = fields.next()? {
        let value = String::from_utf8_lossy(field.value_bytes()).into_owned();
        match field.type_() {
            b'C' => error.code = value,
            b'M' => error.message = value,
            b'D' => error.detail = Some(value),
            b'H' => error.hint = Some(value),
            _ => {}
        }
    }
    Ok(error)
}

/// A timeline history file's entries (`parent_tli<TAB>switchpoint<TAB>reason` per line;
/// comments and lines that do not parse are skipped).
fn parse_timeline_history(content: &str) -> Vec<(u32, Lsn)> {
    content
        .lines()
        .filter(|line| !line.trim_start().starts_with('#'))
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let tli = fields.next()?.parse().ok()?;
            let switchpoint = fields.next()?.parse().ok()?;
            Some((tli, switchpoint))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeline_history_lists_each_parent_and_where_it_was_left() {
        let file = "1\t0/3000060\tno recovery target specified\n\n# a comment\n2\t0/5000A28\tat restore point \"x\"\n";
        assert_eq!(
            parse_timeline_history(file),
            vec![(1, Lsn(0x3000060)), (2, Lsn(0x5000A28))]
        );
    }

    #[test]
    fn keepalive_frame_parses() {
        let mut b = BytesMut::new();
        b.put_u8(b'k');
        b.put_u64(0x1_0000_0010);
        b.put_i64(0);
        b.put_u8(1);
        let frame = parse_frame(b.freeze()).unwrap();
        assert_eq!(
            frame,
            ReplicationFrame::Keepalive {
                wal_end: Lsn(0x1_0000_0010),
                reply_requested: true
            }
        );
    }

    #[test]
    fn xlogdata_frame_keeps_payload() {
        let mut b = BytesMut::new();
        b.put_u8(b'w');
        b.put_u64(5);
        b.put_u64(9);
        b.put_i64(0);
        b.extend_from_slice(b"Bxyz");
        match parse_frame(b.freeze()).unwrap() {
            ReplicationFrame::XLogData {
                wal_start,
                wal_end,
                data,
            } => {
                assert_eq!((wal_start, wal_end), (Lsn(5), Lsn(9)));
                assert_eq!(&data[..], b"Bxyz");
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn short_or_unknown_frames_are_errors() {
        for body in [&b""[..], b"k\0\0", b"w\0\0\0", b"z"] {
            assert!(parse_frame(Bytes::copy_from_slice(body)).is_err());
        }
    }

    #[test]
    fn status_update_layout() {
        let out = encode_status_update(Lsn(3), Lsn(2), Lsn(2), true);
        assert_eq!(out.len(), 1 + 4 + 34);
        assert_eq!(out[0], b'd');
        assert_eq!(&out[1..5], &38i32.to_be_bytes());
        assert_eq!(out[5], b'r');
        assert_eq!(&out[6..14], &3u64.to_be_bytes());
        assert_eq!(&out[14..22], &2u64.to_be_bytes());
        assert_eq!(out[38], 1);
    }

    #[test]
    fn start_command_quotes_names() {
        let cmd = start_replication_command("s", "my\"pub", Lsn(0), true, false);
        assert_eq!(
            cmd,
            "START_REPLICATION SLOT \"s\" LOGICAL 0/0 (\"proto_version\" '1', \"publication_names\" '\"my\"\"pub\"', \"messages\" 'true')"
        );
    }

    #[test]
    fn start_command_asks_for_binary_only_when_configured() {
        let cmd = start_replication_command("s", "p", Lsn(0), false, true);
        assert!(
            cmd.ends_with("\"messages\" 'false', \"binary\" 'true')"),
            "{cmd}"
        );
        assert!(!start_replication_command("s", "p", Lsn(0), false, false).contains("binary"));
    }

    #[test]
    fn config_gives_connect_params() {
        let p = ConnectParams::from_config(&PostgresConfig {
            url: "postgres://u:secret@127.0.0.1:6543,h2:7/db".into(),
            ..PostgresConfig::default()
        })
        .unwrap();
        assert_eq!(p.target(), "127.0.0.1:6543, h2:7");
        assert_eq!((p.info.user.as_str(), p.info.dbname.as_str()), ("u", "db"));
        assert_eq!(p.info.password(), Some("secret"));
        assert!(!format!("{p:?}").contains("secret"));
    }
}
