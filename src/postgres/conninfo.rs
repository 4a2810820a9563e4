//! How to reach PostgreSQL: one value resolved once from `[postgres]` (URL or `key=value`
//! string, TLS keys, password file or `PGPASSWORD`, connect timeout, keepalives) and handed to
//! everything that connects: the replication connection, the control connection, the sweeper
//! and every operator command.
//!
//! Several hosts follow libpq: `host=a,b port=1,2` or `postgres://u@a:1,b:2/db`, tried in
//! order, each within `connect_timeout`; `target_session_attrs` (`any`, `read-write`,
//! `read-only`, `primary`, `standby`, `prefer-standby`) says which server is acceptable. Each
//! connection asks the server it reached ([`SERVER_STATE_SQL`], which a logical walsender
//! answers too) and moves on when it is not. A failure names every host tried and why.

use std::time::Duration;

use tokio_postgres::config::Host;

use crate::config::{PostgresConfig, TcpKeepalive};
use crate::postgres::aws_iam::RdsIamAuth;
use crate::postgres::tls::TlsSettings;

/// Oldest PostgreSQL the relay supports (`server_version_num`).
pub const MIN_SERVER_VERSION: i32 = 140000;

/// What a connection asks the server it reached: role, writability and version. Plain SQL that
/// a `replication=database` walsender accepts before `START_REPLICATION`.
pub const SERVER_STATE_SQL: &str = "SELECT pg_is_in_recovery()::text, current_setting('transaction_read_only'), current_setting('server_version_num')";

/// libpq's `target_session_attrs`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionAttrs {
    Any,
    ReadWrite,
    ReadOnly,
    Primary,
    Standby,
    PreferStandby,
}

impl SessionAttrs {
    pub const NAMES: &'static [&'static str] = &[
        "any",
        "read-write",
        "read-only",
        "primary",
        "standby",
        "prefer-standby",
    ];

    pub fn parse(text: &str) -> Option<SessionAttrs> {
        Some(match text {
            "any" => SessionAttrs::Any,
            "read-write" => SessionAttrs::ReadWrite,
            "read-only" => SessionAttrs::ReadOnly,
            "primary" => SessionAttrs::Primary,
            "standby" => SessionAttrs::Standby,
            "prefer-standby" => SessionAttrs::PreferStandby,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            SessionAttrs::Any => "any",
            SessionAttrs::ReadWrite => "read-write",
            SessionAttrs::ReadOnly => "read-only",
            SessionAttrs::Primary => "primary",
            SessionAttrs::Standby => "standby",
            SessionAttrs::PreferStandby => "prefer-standby",
        }
    }

    /// The passes over the host list: `prefer-standby` first looks for a standby, then takes
    /// any server, as libpq does.
    fn passes(self) -> &'static [SessionAttrs] {
        match self {
            SessionAttrs::PreferStandby => &[SessionAttrs::Standby, SessionAttrs::Any],
            SessionAttrs::Any => &[SessionAttrs::Any],
            SessionAttrs::ReadWrite => &[SessionAttrs::ReadWrite],
            SessionAttrs::ReadOnly => &[SessionAttrs::ReadOnly],
            SessionAttrs::Primary => &[SessionAttrs::Primary],
            SessionAttrs::Standby => &[SessionAttrs::Standby],
        }
    }

    /// `None` when `server` is acceptable, else why not.
    fn rejects(self, server: &ServerState) -> Option<&'static str> {
        match self {
            SessionAttrs::Any | SessionAttrs::PreferStandby => None,
            SessionAttrs::ReadWrite if server.read_only => Some("is read-only"),
            SessionAttrs::ReadOnly if !server.read_only => Some("is not read-only"),
            SessionAttrs::Primary if server.in_recovery => Some("is a standby (in recovery)"),
            SessionAttrs::Standby if !server.in_recovery => Some("is not a standby"),
            _ => None,
        }
    }
}

/// What the server a connection reached said about itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerState {
    pub in_recovery: bool,
    pub read_only: bool,
    pub version_num: i32,
}

impl ServerState {
    /// From the three text columns of [`SERVER_STATE_SQL`].
    pub fn from_row(in_recovery: &str, read_only: &str, version: &str) -> Option<ServerState> {
        Some(ServerState {
            in_recovery: in_recovery == "true",
            read_only: read_only == "on",
            version_num: version.trim().parse().ok()?,
        })
    }

    /// `None` when supported, else the one-line reason to refuse.
    pub fn unsupported(&self) -> Option<String> {
        (self.version_num < MIN_SERVER_VERSION).then(|| {
            format!(
                "PostgreSQL {} (server_version_num {}) is not supported: outbox-relay needs PostgreSQL 14 or newer",
                version_name(self.version_num),
                self.version_num
            )
        })
    }
}

/// `170002` → `17.2`, `90624` → `9.6.24`.
pub fn version_name(num: i32) -> String {
    if num >= 100000 {
        format!("{}.{}", num / 10000, num % 10000)
    } else {
        format!("{}.{}.{}", num / 10000, num / 100 % 100, num % 100)
    }
}

/// One host of the list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub host: Host,
    pub port: u16,
}

impl Endpoint {
    /// `host:port`, or the socket path.
    pub fn target(&self) -> String {
        match &self.host {
            Host::Tcp(h) => format!("{h}:{}", self.port),
            Host::Unix(dir) => format!("{}/.s.PGSQL.{}", dir.display(), self.port),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConnInfoError {
    #[error("invalid postgres.url: {0}")]
    Url(String),
    #[error("{0}")]
    Password(String),
}

/// Everything needed to connect, resolved once.
#[derive(Clone)]
pub struct ConnInfo {
    /// Tried in order.
    pub endpoints: Vec<Endpoint>,
    pub user: String,
    password: Option<String>,
    /// `aws_rds_iam`: the password is a token made per connection instead.
    iam: Option<RdsIamAuth>,
    pub dbname: String,
    /// The URL's `options` (`-c name=value …`), passed to the server on both connections.
    pub options: Option<String>,
    pub tls: TlsSettings,
    /// Per host.
    pub connect_timeout: Duration,
    pub keepalive: TcpKeepalive,
    pub session_attrs: SessionAttrs,
}

impl std::fmt::Debug for ConnInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnInfo")
            .field("targets", &self.targets())
            .field("user", &self.user)
            .field("dbname", &self.dbname)
            .field("tls", &self.tls)
            .field("session_attrs", &self.session_attrs)
            .finish_non_exhaustive()
    }
}

/// The URL's hosts, each with its port: one port for all, or one per host (libpq's rule).
/// Without a host, `localhost`; without a port, 5432.
fn endpoints(config: &tokio_postgres::Config) -> Result<Vec<Endpoint>, ConnInfoError> {
    let hosts = config.get_hosts();
    let ports = config.get_ports();
    if hosts.is_empty() {
        return Ok(vec![Endpoint {
            host: Host::Tcp("localhost".into()),
            port: ports.first().copied().unwrap_or(5432),
        }]);
    }
    if ports.len() > 1 && ports.len() != hosts.len() {
        return Err(ConnInfoError::Url(format!(
            "{} hosts but {} ports: give one port, or one per host",
            hosts.len(),
            ports.len()
        )));
    }
    Ok(hosts
        .iter()
        .enumerate()
        .map(|(i, host)| Endpoint {
            host: host.clone(),
            port: ports
                .get(i)
                .or_else(|| ports.first())
                .copied()
                .unwrap_or(5432),
        })
        .collect())
}

impl ConnInfo {
    /// Resolves `[postgres]`: the URL's hosts, ports, user, database and `target_session_attrs`;
    /// the password from `password_file`, else the URL, else `PGPASSWORD`; TLS from the keys
    /// or the URL; the connect timeout and keepalives.
    pub fn from_config(pg: &PostgresConfig) -> Result<ConnInfo, ConnInfoError> {
        let (_, attrs) = take_param(&pg.url, "target_session_attrs");
        // Without the TLS parameters and target_session_attrs: ours, not tokio-postgres'.
        let (tls, url) = TlsSettings::resolve(pg);
        let session_attrs = match attrs {
            None => SessionAttrs::Any,
            Some(a) => SessionAttrs::parse(&a).ok_or_else(|| {
                ConnInfoError::Url(format!(
                    "target_session_attrs `{a}` is not one of {}",
                    SessionAttrs::NAMES.join(", ")
                ))
            })?,
        };
        let config: tokio_postgres::Config = url
            .parse()
            .map_err(|e| ConnInfoError::Url(format!("{e}")))?;
        let endpoints = endpoints(&config)?;
        let user = config
            .get_user()
            .ok_or_else(|| ConnInfoError::Url("the URL names no user".into()))?
            .to_string();
        let configured = pg
            .password()
            .map_err(|e| ConnInfoError::Password(e.to_string()))?
            .map(|s| s.expose().to_string());
        let password = configured
            .or_else(|| {
                config
                    .get_password()
                    .map(|p| String::from_utf8_lossy(p).into_owned())
            })
            .or_else(|| std::env::var("PGPASSWORD").ok());
        let iam = RdsIamAuth::from_config(pg).map_err(ConnInfoError::Password)?;
        if let Some(iam) = &iam {
            iam.check_hosts(endpoints.iter().map(|e| &e.host))
                .map_err(ConnInfoError::Password)?;
        }
        let mut info = ConnInfo {
            endpoints,
            dbname: config.get_dbname().unwrap_or(&user).to_string(),
            user,
            password,
            iam,
            options: config.get_options().map(str::to_string),
            tls,
            connect_timeout: Duration::from_millis(pg.connect_timeout_ms),
            keepalive: pg.tcp_keepalive(),
            session_attrs,
        };
        if let Some(first) = info.endpoints.first().cloned() {
            info.password = info.password_for(&first);
        }
        Ok(info)
    }

    /// The password for a connection to `endpoint`: with `aws_rds_iam` a token made now (each
    /// connection gets its own, never an expired one), else the configured password.
    fn password_for(&self, endpoint: &Endpoint) -> Option<String> {
        match &self.iam {
            Some(iam) => iam.token(&endpoint.host, endpoint.port, &self.user),
            None => self.password.clone(),
        }
    }

    pub fn password(&self) -> Option<&str> {
        self.password.as_deref()
    }

    /// The same settings with one host: for a second connection that must reach the server
    /// the first one chose.
    pub fn pinned(&self, endpoint: &Endpoint) -> ConnInfo {
        ConnInfo {
            endpoints: vec![endpoint.clone()],
            password: self.password_for(endpoint),
            ..self.clone()
        }
    }

    /// Every host, for messages: `a:1, b:2`.
    pub fn targets(&self) -> String {
        self.endpoints
            .iter()
            .map(Endpoint::target)
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// A tokio-postgres configuration for one host.
    pub fn tokio_config(
        &self,
        endpoint: &Endpoint,
        application_name: &str,
    ) -> tokio_postgres::Config {
        let mut config = tokio_postgres::Config::new();
        match &endpoint.host {
            Host::Tcp(h) => config.host(h),
            #[cfg(unix)]
            Host::Unix(p) => config.host_path(p),
            #[cfg(not(unix))]
            Host::Unix(_) => &mut config,
        };
        config.port(endpoint.port);
        config.user(&self.user);
        config.dbname(&self.dbname);
        if let Some(p) = self.password_for(endpoint) {
            config.password(p);
        }
        if let Some(o) = &self.options {
            config.options(o);
        }
        config.connect_timeout(self.connect_timeout);
        let keepalive = &self.keepalive;
        config
            .keepalives(keepalive.enabled)
            .keepalives_idle(keepalive.idle)
            .keepalives_interval(keepalive.interval)
            .keepalives_retries(keepalive.retries);
        // Zero is the system default.
        config.tcp_user_timeout(keepalive.user_timeout.unwrap_or(Duration::ZERO));
        config.application_name(application_name);
        config.ssl_mode(self.tls.tokio_postgres_mode());
        config
    }

    /// Tries the hosts in order (in two passes for `prefer-standby`) with `open`, which
    /// connects to one host and reports the server's state; returns the first connection
    /// whose server `target_session_attrs` accepts, with its host.
    ///
    /// With one host and no role to check, a failure is `open`'s own error; otherwise every
    /// attempt is listed.
    pub async fn connect_first<T, E, F, Fut>(
        &self,
        mut open: F,
        is_transient: impl Fn(&E) -> bool,
    ) -> Result<(T, Endpoint, ServerState), HostsError<E>>
    where
        E: std::fmt::Display,
        F: FnMut(Endpoint) -> Fut,
        Fut: std::future::Future<Output = Result<(T, ServerState), E>>,
    {
        let mut attempts = Vec::new();
        let mut only_error = None;
        for pass in self.session_attrs.passes() {
            for endpoint in &self.endpoints {
                match open(endpoint.clone()).await {
                    Ok((conn, state)) => match pass.rejects(&state) {
                        None => return Ok((conn, endpoint.clone(), state)),
                        Some(why) => attempts.push(Attempt {
                            target: endpoint.target(),
                            reason: why.to_string(),
                            // A promotion or demotion may change that.
                            transient: true,
                        }),
                    },
                    Err(e) => {
                        attempts.push(Attempt {
                            target: endpoint.target(),
                            reason: e.to_string(),
                            transient: is_transient(&e),
                        });
                        only_error = Some(e);
                    }
                }
            }
        }
        match (attempts.len(), only_error) {
            (1, Some(e)) => Err(HostsError::One(e)),
            _ => Err(HostsError::All(NoHost {
                attrs: self.session_attrs,
                attempts,
            })),
        }
    }
}

/// Why [`ConnInfo::connect_first`] found no server.
#[derive(Debug)]
pub enum HostsError<E> {
    /// The only host failed: its own error.
    One(E),
    All(NoHost),
}

/// Every host tried, and why each was not used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("no PostgreSQL server usable (target_session_attrs={}): {}", .attrs.name(), describe_attempts(.attempts))]
pub struct NoHost {
    pub attrs: SessionAttrs,
    pub attempts: Vec<Attempt>,
}

impl NoHost {
    /// Worth retrying when any host might come back or change role.
    pub fn is_transient(&self) -> bool {
        self.attempts.iter().any(|a| a.transient)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempt {
    pub target: String,
    pub reason: String,
    pub transient: bool,
}

fn describe_attempts(attempts: &[Attempt]) -> String {
    attempts
        .iter()
        .map(|a| format!("{}: {}", a.target, a.reason))
        .collect::<Vec<_>>()
        .join("; ")
}

/// Removes `key` from a URL's query or a `key=value` string; returns the rest and the value.
pub fn take_param(url: &str, key: &str) -> (String, Option<String>) {
    let mut found = None;
    let rest = crate::config::remove_params(url, |k, v| {
        let hit = k == key;
        if hit {
            found = Some(v.to_string());
        }
        hit
    });
    (rest, found)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(url: &str) -> ConnInfo {
        ConnInfo::from_config(&PostgresConfig {
            url: url.into(),
            ..PostgresConfig::default()
        })
        .unwrap()
    }

    /// One test for every case that sets the AWS variables (the environment is the process's).
    #[test]
    fn rds_iam_makes_a_fresh_token_for_every_connection() {
        use crate::config::PostgresAuth;
        let iam = |url: &str, region: Option<&str>| {
            ConnInfo::from_config(&PostgresConfig {
                url: url.into(),
                auth: PostgresAuth::AwsRdsIam,
                aws_region: region.map(str::to_string),
                ..PostgresConfig::default()
            })
        };
        let url = "postgres://relay@db.abc.eu-west-1.rds.amazonaws.com:5433/app";
        for name in ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION"] {
            std::env::remove_var(name);
        }
        // The chain's last source: not here, and not worth its timeout.
        std::env::set_var("AWS_EC2_METADATA_DISABLED", "true");
        let err = iam(url, None).unwrap_err().to_string();
        assert!(err.contains("AWS_ACCESS_KEY_ID"), "{err}");
        std::env::set_var("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE");
        std::env::set_var(
            "AWS_SECRET_ACCESS_KEY",
            "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
        );
        let err = iam("postgres://relay@db.internal:5432/app", None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("postgres.aws_region"), "{err}");
        assert!(iam("postgres://relay@db.internal:5432/app", Some("us-east-2")).is_ok());

        let info = iam(url, None).unwrap();
        let first = info.password().unwrap().to_string();
        assert!(
            first.starts_with(
                "db.abc.eu-west-1.rds.amazonaws.com:5433/?Action=connect&DBUser=relay&"
            ),
            "{first}"
        );
        assert!(
            first.contains("%2Feu-west-1%2Frds-db%2Faws4_request"),
            "{first}"
        );
        // X-Amz-Date has whole seconds: a connection a second later signs anew.
        std::thread::sleep(Duration::from_millis(1100));
        let endpoint = info.endpoints[0].clone();
        let replication = info.pinned(&endpoint);
        let replication = replication.password().unwrap();
        assert_ne!(
            replication, first,
            "the replication connection reused a token"
        );
        std::thread::sleep(Duration::from_millis(1100));
        let control = info.tokio_config(&endpoint, "outbox-relay");
        let control = String::from_utf8(control.get_password().unwrap().to_vec()).unwrap();
        assert_ne!(control, first, "the control connection reused a token");
        assert_ne!(
            control, replication,
            "the control connection reused a token"
        );
        assert!(control.contains("X-Amz-Signature="), "{control}");
        for name in [
            "AWS_ACCESS_KEY_ID",
            "AWS_SECRET_ACCESS_KEY",
            "AWS_EC2_METADATA_DISABLED",
        ] {
            std::env::remove_var(name);
        }
    }

    #[test]
    fn several_hosts_with_their_ports_in_order() {
        let i = info("postgres://u:pw@a:1,b:2/db?target_session_attrs=read-write&sslmode=disable");
        assert_eq!(i.targets(), "a:1, b:2");
        assert_eq!(i.session_attrs, SessionAttrs::ReadWrite);
        assert_eq!((i.user.as_str(), i.dbname.as_str()), ("u", "db"));
        assert_eq!(i.password(), Some("pw"));
        assert!(!format!("{i:?}").contains("pw"));
        let kv = info("host=a,b port=7 user=u target_session_attrs=prefer-standby");
        assert_eq!(kv.targets(), "a:7, b:7");
        assert_eq!(kv.session_attrs, SessionAttrs::PreferStandby);
        assert_eq!(kv.dbname, "u");
    }

    #[test]
    fn unknown_session_attrs_are_refused() {
        let e = ConnInfo::from_config(&PostgresConfig {
            url: "postgres://u@a/db?target_session_attrs=leader".into(),
            ..PostgresConfig::default()
        })
        .unwrap_err();
        assert!(e.to_string().contains("prefer-standby"), "{e}");
    }

    const PRIMARY: ServerState = ServerState {
        in_recovery: false,
        read_only: false,
        version_num: 170000,
    };
    const STANDBY: ServerState = ServerState {
        in_recovery: true,
        read_only: true,
        version_num: 170000,
    };

    async fn pick(
        url: &str,
        servers: &[Result<ServerState, &'static str>],
    ) -> Result<String, String> {
        let i = info(url);
        let servers = servers.to_vec();
        i.connect_first(
            |ep| {
                let idx = i.endpoints.iter().position(|e| *e == ep).unwrap();
                let s = servers[idx];
                async move { s.map(|s| ((), s)) }
            },
            |_| true,
        )
        .await
        .map(|(_, ep, _)| ep.target())
        .map_err(|e| match e {
            HostsError::One(e) => e.to_string(),
            HostsError::All(all) => all.to_string(),
        })
    }

    #[tokio::test]
    async fn hosts_are_tried_in_order_until_one_fits() {
        let url = "postgres://u@a:1,b:2/db?target_session_attrs=read-write";
        assert_eq!(pick(url, &[Ok(STANDBY), Ok(PRIMARY)]).await.unwrap(), "b:2");
        assert_eq!(
            pick(url, &[Err("refused"), Ok(PRIMARY)]).await.unwrap(),
            "b:2"
        );
        let none = pick(url, &[Err("refused"), Ok(STANDBY)]).await.unwrap_err();
        assert_eq!(
            none,
            "no PostgreSQL server usable (target_session_attrs=read-write): a:1: refused; b:2: is read-only"
        );
        let any = "postgres://u@a:1,b:2/db";
        assert_eq!(pick(any, &[Ok(STANDBY), Ok(PRIMARY)]).await.unwrap(), "a:1");
        let prefer = "postgres://u@a:1,b:2/db?target_session_attrs=prefer-standby";
        assert_eq!(
            pick(prefer, &[Ok(PRIMARY), Ok(STANDBY)]).await.unwrap(),
            "b:2"
        );
        assert_eq!(
            pick(prefer, &[Ok(PRIMARY), Err("down")]).await.unwrap(),
            "a:1"
        );
        let standby = "postgres://u@a:1,b:2/db?target_session_attrs=standby";
        assert_eq!(
            pick(standby, &[Ok(PRIMARY), Ok(STANDBY)]).await.unwrap(),
            "b:2"
        );
        // One host: its own error, unchanged.
        assert_eq!(
            pick("postgres://u@a:1/db", &[Err("refused")])
                .await
                .unwrap_err(),
            "refused"
        );
    }

    #[test]
    fn versions_below_14_are_refused() {
        let old = ServerState {
            version_num: 130016,
            ..PRIMARY
        };
        assert_eq!(
            old.unsupported().unwrap(),
            "PostgreSQL 13.16 (server_version_num 130016) is not supported: outbox-relay needs PostgreSQL 14 or newer"
        );
        assert!(PRIMARY.unsupported().is_none());
        assert_eq!(version_name(90624), "9.6.24");
    }
}
