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

use std::io;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

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
use crate::postgres::tls::{server_end_point, TlsSettings};

mod frames;
mod transport;

pub use frames::{encode_status_update, parse_frame, pg_time_to_unix_us, ReplicationFrame};
use transport::open_transport;

/// Microseconds between the Unix epoch and PostgreSQL's epoch (2000-01-01 UTC).
const PG_EPOCH_OFFSET_US: i64 = 946_684_800_000_000;
/// How much the read buffer grows by when it runs out of room.
const READ_CHUNK: usize = 256 * 1024;
/// How long `close` waits for the server to end the stream.
const CLOSE_WAIT: Duration = Duration::from_secs(5);
/// What `close` reads and drops before it lets the server's output back up, and how long it
/// then waits for the server to read the last status update.
const CLOSE_DISCARD: usize = 16 << 20;
const CLOSE_BACK_UP: Duration = Duration::from_secs(1);
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
    #[error("no replication frame from PostgreSQL for {waited:?} (receive deadline {limit:?}, from wal_sender_timeout or postgres.receive_timeout_ms): the server answers every status update, so the connection is presumed dead (a network path dropped without FIN or RST)")]
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

trait Transport: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Transport for T {}

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
                return Ok(ReplicationStream { conn: self });
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

/// The replication receive deadline: `configured_ms` when set; else three quarters of the
/// server's `wal_sender_timeout` (which sends a keepalive at least every half of it while
/// idle), or [`FALLBACK_RECEIVE_TIMEOUT_MS`] when that is 0 (disabled). Never under two
/// status intervals: the relay's own status updates ask for a reply, so a live server answers
/// within one.
pub fn receive_timeout(
    configured_ms: u64,
    wal_sender_timeout: Duration,
    status_interval: Duration,
) -> Duration {
    if configured_ms != 0 {
        return Duration::from_millis(configured_ms);
    }
    let derived = if wal_sender_timeout.is_zero() {
        Duration::from_millis(FALLBACK_RECEIVE_TIMEOUT_MS)
    } else {
        wal_sender_timeout * 3 / 4
    };
    derived.max(status_interval * 2)
}

/// How much longer than half of `wal_sender_timeout` an explicit receive deadline must be: the
/// server's keepalive timer is checked between decoded changes, and the frame still has to
/// travel.
pub const RECEIVE_TIMEOUT_MARGIN: Duration = Duration::from_secs(1);

/// An explicit `postgres.receive_timeout_ms` shorter than the server's longest silence.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("postgres.receive_timeout_ms = {configured_ms} is below the minimum of {minimum_ms} ms for this server (wal_sender_timeout = {wal_sender_timeout_ms} ms): while PostgreSQL decodes a large transaction without outbox rows it sends a frame only every half of wal_sender_timeout, so the session would time out and decode the same transaction again and again. Set postgres.receive_timeout_ms = 0 (derived from wal_sender_timeout) or at least {minimum_ms}")]
pub struct ReceiveTimeoutTooLow {
    pub configured_ms: u64,
    pub wal_sender_timeout_ms: u64,
    pub minimum_ms: u64,
}

/// The least explicit receive deadline that `wal_sender_timeout` allows: half of it plus
/// [`RECEIVE_TIMEOUT_MARGIN`]. `None` when the server's timeout is 0 (disabled: the server
/// then promises no keepalives at all, and no deadline is safe from a long decode).
///
/// Why half: while the walsender decodes a transaction that touches no published table it
/// sends nothing of it, and reads the relay's status updates (and answers them) only when half
/// of `wal_sender_timeout` has passed since the last one it read. Frames then come that far
/// apart, however often the relay asks.
pub fn minimum_receive_timeout(wal_sender_timeout: Duration) -> Option<Duration> {
    if wal_sender_timeout.is_zero() {
        return None;
    }
    Some(wal_sender_timeout / 2 + RECEIVE_TIMEOUT_MARGIN)
}

/// Refuses an explicit `configured_ms` (0 is derived, always fine) below
/// [`minimum_receive_timeout`].
pub fn check_receive_timeout(
    configured_ms: u64,
    wal_sender_timeout: Duration,
) -> Result<(), ReceiveTimeoutTooLow> {
    let Some(minimum) = minimum_receive_timeout(wal_sender_timeout) else {
        return Ok(());
    };
    let minimum_ms = minimum.as_millis() as u64;
    if configured_ms == 0 || configured_ms >= minimum_ms {
        return Ok(());
    }
    Err(ReceiveTimeoutTooLow {
        configured_ms,
        wal_sender_timeout_ms: wal_sender_timeout.as_millis() as u64,
        minimum_ms,
    })
}

/// Quotes an identifier for a replication command (`"` doubled).
fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

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

/// A connection in CopyBoth mode: frames in, status updates out.
pub struct ReplicationStream {
    conn: WalSender,
}

impl ReplicationStream {
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
            if let Some(body) = self.take_copy_data()? {
                return parse_frame(body);
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
    fn receive_deadline_derives_from_wal_sender_timeout() {
        let s = Duration::from_secs;
        let ms = Duration::from_millis;
        // Default server: 60 s; the server keepalives every 30 s, we ask every second.
        assert_eq!(receive_timeout(0, s(60), s(1)), s(45));
        assert_eq!(receive_timeout(0, s(4), s(1)), s(3));
        // Never under two status intervals.
        assert_eq!(receive_timeout(0, ms(1_000), ms(333)), ms(750));
        assert_eq!(receive_timeout(0, ms(400), ms(300)), ms(600));
        // wal_sender_timeout = 0 disables the server's timeout: our fallback.
        assert_eq!(
            receive_timeout(0, Duration::ZERO, s(1)),
            ms(FALLBACK_RECEIVE_TIMEOUT_MS)
        );
        // Configured: as is.
        assert_eq!(receive_timeout(5_000, s(60), s(1)), s(5));
    }

    #[test]
    fn an_explicit_receive_deadline_must_outlast_half_the_wal_sender_timeout() {
        let s = Duration::from_secs;
        // 60 s on the server: frames may be 30 s apart while it decodes a large transaction.
        let err = check_receive_timeout(20_000, s(60)).unwrap_err();
        assert_eq!(
            err,
            ReceiveTimeoutTooLow {
                configured_ms: 20_000,
                wal_sender_timeout_ms: 60_000,
                minimum_ms: 31_000,
            }
        );
        let message = err.to_string();
        for part in [
            "postgres.receive_timeout_ms = 20000",
            "31000 ms",
            "wal_sender_timeout = 60000 ms",
        ] {
            assert!(message.contains(part), "{message}");
        }
        // Exactly half is still too short: the keepalive would race the deadline.
        assert!(check_receive_timeout(30_000, s(60)).is_err());
        assert!(check_receive_timeout(31_000, s(60)).is_ok());
        assert!(check_receive_timeout(45_000, s(60)).is_ok());
        // 0 is derived (three quarters), and a disabled server timeout promises nothing.
        assert!(check_receive_timeout(0, s(60)).is_ok());
        assert!(check_receive_timeout(1_000, Duration::ZERO).is_ok());
        assert!(!ReplicationError::from(err).is_transient());
    }

    /// A streaming connection over an in-memory pipe; the other end plays the server.
    fn stream_over(limit: Duration) -> (ReplicationStream, tokio::io::DuplexStream) {
        let (ours, server) = tokio::io::duplex(64 * 1024);
        let conn = WalSender {
            io: Box::new(ours),
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
        (ReplicationStream { conn }, server)
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
        let frame = stream.next_frame().await.unwrap();
        assert_eq!(
            frame,
            ReplicationFrame::Keepalive {
                wal_end: Lsn(7),
                reply_requested: false
            }
        );
        assert!(matches!(
            stream.next_frame().await,
            Err(ReplicationError::ReceiveTimeout { .. })
        ));
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
