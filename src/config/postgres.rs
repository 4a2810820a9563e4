//! `[postgres]`: the source database, its slot and publication, TLS, timeouts and keepalives.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::layering::unset;
use super::rules::split_tls_params;
use super::secret::{redact_connection_string, Secret};
use super::validate::{check_identifier, check_range, MAX_IDENTIFIER_BYTES};
use super::ConfigError;

/// Upper bound of `postgres.status_interval_ms`; well below the server's default
/// `wal_sender_timeout` (60 s) so an idle relay is never disconnected.
pub const MAX_STATUS_INTERVAL_MS: u64 = 30_000;
/// TCP keepalive on both PostgreSQL connections: first probe after this much silence. The URL's
/// `keepalives_idle` applies while the key is left at this value.
pub const DEFAULT_KEEPALIVES_IDLE_MS: u64 = 30_000;
/// Between unanswered keepalive probes (the URL's value applies while the key is left at this).
pub const DEFAULT_KEEPALIVES_INTERVAL_MS: u64 = 10_000;
/// Unanswered probes before the kernel drops the connection (likewise).
pub const DEFAULT_KEEPALIVES_RETRIES: u32 = 3;
/// `TCP_USER_TIMEOUT`: sent data unacknowledged this long drops the connection (Linux). Equal to
/// idle + interval × retries, so keepalives and unacknowledged writes give up alike.
pub const DEFAULT_TCP_USER_TIMEOUT_MS: u64 = 60_000;
/// The replication receive deadline when it is derived (`receive_timeout_ms` = 0) and the
/// server's `wal_sender_timeout` is 0 (disabled).
pub const FALLBACK_RECEIVE_TIMEOUT_MS: u64 = 30_000;

/// `[postgres]`. `Debug` shows the URL with its password replaced by `***`.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PostgresConfig {
    /// Connection string, URL (`postgres://user[:password]@host[:port]/dbname?…`) or libpq
    /// `key=value` form. Must name a host and a user. The relay opens a normal and a replication
    /// connection to this database.
    pub url: String,
    /// Path of a file holding the password (surrounding whitespace trimmed). Unset (`""` in the
    /// file): use the password in `url`, if any. When set it overrides the URL's password. Read
    /// at every connect.
    #[serde(with = "unset")]
    pub password_file: Option<PathBuf>,
    /// How the relay logs in: `password` (default: `password_file`, the URL's password or
    /// `PGPASSWORD`; none with `trust` or certificates), or `aws_rds_iam` (RDS / Aurora IAM
    /// database authentication: a token made for every connection from the AWS credentials in
    /// the environment; TLS required, no password configured).
    pub auth: PostgresAuth,
    /// `aws_rds_iam`: the AWS region of the database. Unset (`""`): read from the host name
    /// (`….<region>.rds.amazonaws.com`), else `AWS_REGION` / `AWS_DEFAULT_REGION`.
    #[serde(with = "unset")]
    pub aws_region: Option<String>,
    /// Logical replication slot (pgoutput) the relay consumes: lower-case letters, digits and
    /// `_`, 1 to 63 characters. Its confirmed LSN only advances past rows Kafka acknowledged.
    pub slot: String,
    /// Publication naming the outbox table (an identifier, up to 63 bytes, used quoted).
    pub publication: String,
    /// Create the slot (plugin pgoutput) at start-up if it does not exist.
    pub create_slot: bool,
    /// Create the publication `FOR TABLE <every outbox table> WITH (publish = 'insert')` at
    /// start-up if it does not exist, and add outbox tables it lacks.
    pub create_publication: bool,
    /// Period of standby status updates (LSN feedback and keepalive replies), in milliseconds;
    /// 1 to 30000.
    pub status_interval_ms: u64,
    /// Time limit for establishing a connection, in milliseconds; > 0.
    pub connect_timeout_ms: u64,
    /// First delay before reconnecting after a transient error, in milliseconds; > 0. Doubles on
    /// every further failure.
    pub reconnect_backoff_initial_ms: u64,
    /// Longest delay between reconnect attempts, in milliseconds; >= the initial backoff.
    pub reconnect_backoff_max_ms: u64,
    /// TLS towards PostgreSQL, on both connections: `disable`, `prefer` (TLS when the server
    /// offers it, unverified), `require` (TLS, unverified), `verify-ca` (TLS, certificate signed
    /// by `ssl_root_cert`), `verify-full` (as verify-ca, and the host name must match). An
    /// `sslmode=` / `sslrootcert=` in `url` is used when these keys are left at their defaults.
    pub ssl_mode: SslMode,
    /// CA certificate file (PEM) for `verify-ca` / `verify-full`. Unset (`""`): the system's roots.
    #[serde(with = "unset")]
    pub ssl_root_cert: Option<PathBuf>,
    /// While another relay streams the slot, how often this one (a standby) tries to take
    /// over, in milliseconds; 100 to 60000.
    pub standby_retry_ms: u64,
    /// A standby calls the slot's holder stale when PostgreSQL has had no reply from it for
    /// this long, in milliseconds (it is then logged as stale); > 0.
    pub stale_holder_after_ms: u64,
    /// End a stale holder's connection (`pg_terminate_backend`) so this relay can take over.
    /// Off by default: a stale-looking holder may still be a live relay behind a slow network.
    pub terminate_stale_holder: bool,
    /// How often the slot's lag, retained WAL and wal_status are sampled (for `/metrics`, and
    /// to stop when the slot is lost), in milliseconds; 100 to 600000.
    pub slot_sample_interval_ms: u64,
    /// TCP keepalive on both connections: silence before the first probe, in milliseconds, at
    /// least 1000 (the kernel counts whole seconds). A `keepalives_idle` (seconds) in `url` applies
    /// when this key is left at its default; `keepalives=0` in `url` turns keepalives off.
    pub keepalives_idle_ms: u64,
    /// Between unanswered keepalive probes, in milliseconds; >= 1000. `keepalives_interval`
    /// (seconds) in `url` applies when this key is left at its default.
    pub keepalives_interval_ms: u64,
    /// Unanswered probes before the connection is dropped; 1 to 127. `keepalives_retries` in
    /// `url` applies when this key is left at its default.
    pub keepalives_retries: u32,
    /// `TCP_USER_TIMEOUT` (Linux) on both connections: data sent and unacknowledged this long
    /// drops the connection, in milliseconds; 0 keeps the system default, else >= 1000.
    /// `tcp_user_timeout` (milliseconds, as libpq) in `url` applies when this key is left at its
    /// default.
    pub tcp_user_timeout_ms: u64,
    /// Receive deadline of the replication stream: no frame for this long ends the session
    /// (reconnect, resume from the slot), in milliseconds. 0 (default): three quarters of the
    /// server's `wal_sender_timeout` (the server sends a keepalive at least every half of it,
    /// and answers every status update), at least two status intervals; 30000 when the server's
    /// `wal_sender_timeout` is 0. Otherwise >= 2 × `status_interval_ms`, and at connect time
    /// more than half of the server's `wal_sender_timeout` (half + 1 s): while the server decodes
    /// a large transaction without outbox rows it sends a frame only that often, so the relay
    /// refuses a shorter deadline.
    pub receive_timeout_ms: u64,
    /// Create the slot as a failover slot (PostgreSQL 17+: synchronized to standbys with
    /// `sync_replication_slots`, so that it survives a promotion), or turn failover on for an
    /// existing slot: `auto` (on when the server is 17 or newer), `true` (refuse to run on an
    /// older server), `false` (leave the slot as it is).
    pub failover_slot: FailoverSlot,
    /// pgoutput's binary mode (PostgreSQL 14+): the walsender sends each column in its type's
    /// binary send format instead of its text output, and the relay converts the mapped columns
    /// back to the same records. A mapped column whose type has no conversion stops the relay
    /// when its table is bound (the error names it; `outbox-relay check` reports it too). Off by
    /// default.
    pub binary: bool,
}

/// `postgres.failover_slot`: `"auto"`, or `true`/`false` (as strings or booleans).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FailoverSlot {
    Auto,
    True,
    False,
}

impl FailoverSlot {
    pub const NAMES: &'static [&'static str] = &["auto", "true", "false"];

    /// Whether the slot should be a failover slot on a server of this version.
    pub fn wanted(self, server_version_num: i32) -> bool {
        match self {
            FailoverSlot::Auto => server_version_num >= 170000,
            FailoverSlot::True => true,
            FailoverSlot::False => false,
        }
    }
}

impl<'de> Deserialize<'de> for FailoverSlot {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Flag(bool),
            Name(String),
        }
        match Raw::deserialize(d)? {
            Raw::Flag(true) => Ok(FailoverSlot::True),
            Raw::Flag(false) => Ok(FailoverSlot::False),
            Raw::Name(n) => match n.as_str() {
                "auto" => Ok(FailoverSlot::Auto),
                "true" => Ok(FailoverSlot::True),
                "false" => Ok(FailoverSlot::False),
                _ => Err(serde::de::Error::custom(format!(
                    "`{n}` must be one of auto|true|false"
                ))),
            },
        }
    }
}

/// TCP settings for both PostgreSQL connections, resolved from `[postgres]` and the URL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpKeepalive {
    /// Keepalive probes on (`keepalives=0` in the URL turns them off).
    pub enabled: bool,
    pub idle: Duration,
    pub interval: Duration,
    pub retries: u32,
    /// `TCP_USER_TIMEOUT`; `None` keeps the system default.
    pub user_timeout: Option<Duration>,
}

/// `postgres.auth`: where the password comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PostgresAuth {
    Password,
    AwsRdsIam,
}

/// TLS mode towards PostgreSQL, as libpq's `sslmode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SslMode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    pub const NAMES: &'static [&'static str] =
        &["disable", "prefer", "require", "verify-ca", "verify-full"];

    pub fn parse(text: &str) -> Option<SslMode> {
        match text {
            "disable" => Some(SslMode::Disable),
            "prefer" | "allow" => Some(SslMode::Prefer),
            "require" => Some(SslMode::Require),
            "verify-ca" => Some(SslMode::VerifyCa),
            "verify-full" => Some(SslMode::VerifyFull),
            _ => None,
        }
    }
}

impl Default for PostgresConfig {
    fn default() -> Self {
        PostgresConfig {
            url: "postgres://postgres@127.0.0.1:5432/postgres".to_string(),
            password_file: None,
            auth: PostgresAuth::Password,
            aws_region: None,
            slot: "outbox_relay".to_string(),
            publication: "outbox_relay_pub".to_string(),
            create_slot: true,
            create_publication: true,
            status_interval_ms: 1_000,
            connect_timeout_ms: 10_000,
            reconnect_backoff_initial_ms: 500,
            reconnect_backoff_max_ms: 30_000,
            // The URL's `sslmode` applies while the key is left at `prefer`.
            ssl_mode: SslMode::Prefer,
            ssl_root_cert: None,
            standby_retry_ms: 2_000,
            stale_holder_after_ms: 60_000,
            terminate_stale_holder: false,
            slot_sample_interval_ms: 5_000,
            keepalives_idle_ms: DEFAULT_KEEPALIVES_IDLE_MS,
            keepalives_interval_ms: DEFAULT_KEEPALIVES_INTERVAL_MS,
            keepalives_retries: DEFAULT_KEEPALIVES_RETRIES,
            tcp_user_timeout_ms: DEFAULT_TCP_USER_TIMEOUT_MS,
            // 0: derived from the server's `wal_sender_timeout`.
            receive_timeout_ms: 0,
            failover_slot: FailoverSlot::Auto,
            binary: false,
        }
    }
}

impl fmt::Debug for PostgresConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresConfig")
            .field("url", &self.redacted_url())
            .field("password_file", &self.password_file)
            .field("auth", &self.auth)
            .field("aws_region", &self.aws_region)
            .field("slot", &self.slot)
            .field("publication", &self.publication)
            .field("create_slot", &self.create_slot)
            .field("create_publication", &self.create_publication)
            .field("status_interval_ms", &self.status_interval_ms)
            .field("connect_timeout_ms", &self.connect_timeout_ms)
            .field(
                "reconnect_backoff_initial_ms",
                &self.reconnect_backoff_initial_ms,
            )
            .field("reconnect_backoff_max_ms", &self.reconnect_backoff_max_ms)
            .field("ssl_mode", &self.ssl_mode)
            .field("ssl_root_cert", &self.ssl_root_cert)
            .field("standby_retry_ms", &self.standby_retry_ms)
            .field("stale_holder_after_ms", &self.stale_holder_after_ms)
            .field("terminate_stale_holder", &self.terminate_stale_holder)
            .field("slot_sample_interval_ms", &self.slot_sample_interval_ms)
            .field("keepalives_idle_ms", &self.keepalives_idle_ms)
            .field("keepalives_interval_ms", &self.keepalives_interval_ms)
            .field("keepalives_retries", &self.keepalives_retries)
            .field("tcp_user_timeout_ms", &self.tcp_user_timeout_ms)
            .field("receive_timeout_ms", &self.receive_timeout_ms)
            .field("failover_slot", &self.failover_slot)
            .field("binary", &self.binary)
            .finish()
    }
}

impl PostgresConfig {
    /// `url` with any password (in the user info, a `password=` parameter or `password=` of
    /// the `key=value` form) replaced by `***`.
    pub fn redacted_url(&self) -> String {
        redact_connection_string(&self.url)
    }

    /// The password file, if `password_file` is set.
    pub fn password_file_path(&self) -> Option<&Path> {
        self.password_file.as_deref()
    }

    /// The password to connect with: the trimmed content of `password_file` if set (read now),
    /// else the URL's password, if any.
    pub fn password(&self) -> Result<Option<Secret>, ConfigError> {
        if let Some(path) = self.password_file_path() {
            let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
                path: path.to_path_buf(),
                source,
            })?;
            let password = text.trim();
            if password.is_empty() {
                return Err(ConfigError::invalid(
                    "postgres.password_file",
                    format!("`{}` is empty", path.display()),
                ));
            }
            return Ok(Some(Secret::new(password)));
        }
        let parsed = self.parsed_url()?;
        Ok(parsed
            .get_password()
            .map(|p| Secret::new(String::from_utf8_lossy(p).into_owned())))
    }

    /// `aws_rds_iam`: the token is the password, so none may be configured, and RDS takes a
    /// token only over TLS. The AWS credentials are read at each connect, not here.
    fn validate_auth(&self, parsed: &tokio_postgres::Config) -> Result<(), ConfigError> {
        if self.auth != PostgresAuth::AwsRdsIam {
            if self.aws_region.is_some() {
                return Err(ConfigError::invalid(
                    "postgres.aws_region",
                    "is only used with postgres.auth = \"aws_rds_iam\"",
                ));
            }
            return Ok(());
        }
        if self.password_file.is_some() {
            return Err(ConfigError::invalid(
                "postgres.password_file",
                "is not used with postgres.auth = \"aws_rds_iam\" (the password is an IAM token made at each connect)",
            ));
        }
        if parsed.get_password().is_some() {
            return Err(ConfigError::invalid(
                "postgres.url",
                "carries a password, which postgres.auth = \"aws_rds_iam\" does not use: remove it",
            ));
        }
        if self.tls_mode_disabled() {
            return Err(ConfigError::invalid(
                "postgres.ssl_mode",
                "RDS accepts IAM tokens only over TLS: use require, verify-ca or verify-full (verify-full with the RDS CA bundle is best)",
            ));
        }
        Ok(())
    }

    /// TLS is off, by the key or by the URL's `sslmode` (which applies while the key is left
    /// at `prefer`).
    fn tls_mode_disabled(&self) -> bool {
        let (_, from_url, _) = split_tls_params(&self.url);
        match self.ssl_mode {
            SslMode::Prefer => {
                from_url.as_deref().and_then(SslMode::parse) == Some(SslMode::Disable)
            }
            mode => mode == SslMode::Disable,
        }
    }

    fn parsed_url(&self) -> Result<tokio_postgres::Config, ConfigError> {
        // tokio-postgres knows neither verify-ca nor verify-full: the TLS parameters are ours
        // (see `postgres::tls::TlsSettings::resolve`), the rest is checked by its parser.
        let (url, mode, _) = split_tls_params(&self.url);
        if let Some(mode) = mode.filter(|m| SslMode::parse(m).is_none()) {
            return Err(ConfigError::invalid(
                "postgres.url",
                format!(
                    "sslmode `{mode}` is not one of {}",
                    SslMode::NAMES.join(", ")
                ),
            ));
        }
        // tokio-postgres' parse errors name the option, never its value.
        url.parse::<tokio_postgres::Config>().map_err(|err| {
            ConfigError::invalid(
                "postgres.url",
                format!("not a PostgreSQL connection string: {err}"),
            )
        })
    }

    /// The first failure, checked in this order: where to connect and as whom, the slot and
    /// publication names, the timings, the network bounds, TLS.
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        let parsed = self.validate_url()?;
        self.validate_auth(&parsed)?;
        self.validate_names()?;
        self.validate_timing()?;
        self.validate_network()?;
        let needs_ca = matches!(self.ssl_mode, SslMode::VerifyCa | SslMode::VerifyFull);
        if self.ssl_root_cert.is_some() && !needs_ca {
            return Err(ConfigError::invalid(
                "postgres.ssl_root_cert",
                "is only used with ssl_mode = \"verify-ca\" or \"verify-full\"",
            ));
        }
        Ok(())
    }

    /// `postgres.url` parses and names a host and a user; returns it parsed, for the checks of
    /// the login that depend on it.
    fn validate_url(&self) -> Result<tokio_postgres::Config, ConfigError> {
        if self.url.trim().is_empty() {
            return Err(ConfigError::invalid("postgres.url", "must not be empty"));
        }
        let parsed = self.parsed_url()?;
        if parsed.get_hosts().is_empty() {
            return Err(ConfigError::invalid(
                "postgres.url",
                format!("`{}` names no host", self.redacted_url()),
            ));
        }
        if parsed.get_user().is_none_or(str::is_empty) {
            return Err(ConfigError::invalid(
                "postgres.url",
                format!("`{}` names no user", self.redacted_url()),
            ));
        }
        Ok(parsed)
    }

    /// The slot and publication names: PostgreSQL accepts only lower-case letters, digits and
    /// `_` in a slot name, so a wrong one is refused here rather than at the first connect.
    fn validate_names(&self) -> Result<(), ConfigError> {
        let slot_ok = (1..=MAX_IDENTIFIER_BYTES).contains(&self.slot.len())
            && self
                .slot
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
        if !slot_ok {
            return Err(ConfigError::invalid(
                "postgres.slot",
                format!(
                    "`{}` is not a replication slot name: use 1 to 63 lower-case letters, digits or `_`",
                    self.slot
                ),
            ));
        }
        check_identifier("postgres.publication", &self.publication)?;
        Ok(())
    }

    /// The status interval, connect timeout and reconnect backoff, and the standby, stale
    /// holder and slot sample intervals (all in ms).
    fn validate_timing(&self) -> Result<(), ConfigError> {
        check_range(
            "postgres.status_interval_ms",
            self.status_interval_ms,
            1,
            MAX_STATUS_INTERVAL_MS,
            "ms",
        )?;
        check_range(
            "postgres.connect_timeout_ms",
            self.connect_timeout_ms,
            1,
            u64::MAX,
            "ms",
        )?;
        check_range(
            "postgres.reconnect_backoff_initial_ms",
            self.reconnect_backoff_initial_ms,
            1,
            u64::MAX,
            "ms",
        )?;
        if self.reconnect_backoff_max_ms < self.reconnect_backoff_initial_ms {
            return Err(ConfigError::invalid(
                "postgres.reconnect_backoff_max_ms",
                format!(
                    "must be >= postgres.reconnect_backoff_initial_ms ({} ms), got {} ms",
                    self.reconnect_backoff_initial_ms, self.reconnect_backoff_max_ms
                ),
            ));
        }
        let ranges = [
            (
                "postgres.standby_retry_ms",
                self.standby_retry_ms,
                100,
                60_000,
            ),
            (
                "postgres.stale_holder_after_ms",
                self.stale_holder_after_ms,
                1,
                u64::MAX,
            ),
            (
                "postgres.slot_sample_interval_ms",
                self.slot_sample_interval_ms,
                100,
                600_000,
            ),
        ];
        for (field, value, min, max) in ranges {
            if !(min..=max).contains(&value) {
                return Err(ConfigError::invalid(
                    field,
                    format!("must be between {min} and {max} (ms), got {value}"),
                ));
            }
        }
        Ok(())
    }
}

impl PostgresConfig {
    /// Keepalive, user timeout and receive deadline bounds.
    fn validate_network(&self) -> Result<(), ConfigError> {
        check_range(
            "postgres.keepalives_idle_ms",
            self.keepalives_idle_ms,
            1_000,
            u64::MAX,
            "ms",
        )?;
        check_range(
            "postgres.keepalives_interval_ms",
            self.keepalives_interval_ms,
            1_000,
            u64::MAX,
            "ms",
        )?;
        check_range(
            "postgres.keepalives_retries",
            u64::from(self.keepalives_retries),
            1,
            127,
            "probes",
        )?;
        if self.tcp_user_timeout_ms != 0 && self.tcp_user_timeout_ms < 1_000 {
            return Err(ConfigError::invalid(
                "postgres.tcp_user_timeout_ms",
                format!(
                    "must be 0 (system default) or >= 1000 (ms), got {}",
                    self.tcp_user_timeout_ms
                ),
            ));
        }
        let min_receive = self.status_interval_ms.saturating_mul(2);
        if self.receive_timeout_ms != 0 && self.receive_timeout_ms < min_receive {
            return Err(ConfigError::invalid(
                "postgres.receive_timeout_ms",
                format!(
                    "must be 0 (derived from wal_sender_timeout) or >= 2 × postgres.status_interval_ms ({min_receive} ms): the server's frames answer our status updates; got {}",
                    self.receive_timeout_ms
                ),
            ));
        }
        Ok(())
    }

    /// The TCP settings both connections use: the `[postgres]` keys, or the URL's libpq
    /// parameters (`keepalives`, `keepalives_idle`, `keepalives_interval`, `keepalives_retries`
    /// in seconds/count, `tcp_user_timeout` in milliseconds) where a key is left at its default.
    pub fn tcp_keepalive(&self) -> TcpKeepalive {
        let (url, _, _) = split_tls_params(&self.url);
        let parsed = url.parse::<tokio_postgres::Config>().ok();
        // tokio-postgres' own defaults: a getter that differs from them was set by the URL.
        let pristine = tokio_postgres::Config::new();
        let from_url = |get: &dyn Fn(&tokio_postgres::Config) -> Option<Duration>| {
            parsed
                .as_ref()
                .and_then(|p| get(p).filter(|d| Some(*d) != get(&pristine)))
        };
        let keyed = |configured_ms: u64, default_ms: u64, url: Option<Duration>| match url {
            Some(d) if configured_ms == default_ms => d,
            _ => Duration::from_millis(configured_ms),
        };
        let idle = keyed(
            self.keepalives_idle_ms,
            DEFAULT_KEEPALIVES_IDLE_MS,
            from_url(&|c| Some(c.get_keepalives_idle())),
        );
        let interval = keyed(
            self.keepalives_interval_ms,
            DEFAULT_KEEPALIVES_INTERVAL_MS,
            from_url(&|c| c.get_keepalives_interval()),
        );
        let retries = match parsed.as_ref().and_then(|p| p.get_keepalives_retries()) {
            Some(n) if self.keepalives_retries == DEFAULT_KEEPALIVES_RETRIES && n > 0 => n,
            _ => self.keepalives_retries,
        };
        // libpq counts tcp_user_timeout in milliseconds; tokio-postgres' parser reads seconds.
        let url_user_timeout = from_url(&|c| c.get_tcp_user_timeout().copied())
            .map(|d| Duration::from_millis(d.as_secs()));
        let user_timeout = keyed(
            self.tcp_user_timeout_ms,
            DEFAULT_TCP_USER_TIMEOUT_MS,
            url_user_timeout,
        );
        TcpKeepalive {
            enabled: parsed.as_ref().is_none_or(|p| p.get_keepalives()),
            idle,
            interval,
            retries,
            user_timeout: (!user_timeout.is_zero()).then_some(user_timeout),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::config::{Config, ConfigError};

    fn field_of(postgres: &str) -> Option<String> {
        let text = format!("[postgres]\n{postgres}\n");
        match Config::from_sources(Some(&text), Vec::new()) {
            Ok(_) => None,
            Err(ConfigError::Invalid { field, .. }) => Some(field),
            Err(other) => panic!("{other}"),
        }
    }

    #[test]
    fn rds_iam_takes_no_password_and_needs_tls() {
        let iam = "auth = \"aws_rds_iam\"";
        let url = "url = \"postgres://relay@db.abc.eu-west-1.rds.amazonaws.com/app\"";
        assert_eq!(field_of(&format!("{iam}\n{url}")), None);
        let with_password = "url = \"postgres://relay:pw@db.abc.eu-west-1.rds.amazonaws.com/app\"";
        assert_eq!(
            field_of(&format!("{iam}\n{with_password}")).as_deref(),
            Some("postgres.url")
        );
        assert_eq!(
            field_of(&format!("{iam}\n{url}\npassword_file = \"/run/pw\"")).as_deref(),
            Some("postgres.password_file")
        );
        assert_eq!(
            field_of(&format!("{iam}\n{url}\nssl_mode = \"disable\"")).as_deref(),
            Some("postgres.ssl_mode")
        );
        let no_tls =
            "url = \"postgres://relay@db.abc.eu-west-1.rds.amazonaws.com/app?sslmode=disable\"";
        assert_eq!(
            field_of(&format!("{iam}\n{no_tls}")).as_deref(),
            Some("postgres.ssl_mode")
        );
        assert_eq!(
            field_of("aws_region = \"eu-west-1\"").as_deref(),
            Some("postgres.aws_region")
        );
    }
}
