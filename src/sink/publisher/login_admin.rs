//! Admin clients that log in with the relay's tokens. rust-rdkafka's admin client never
//! polls its main queue (fede1024/rust-rdkafka#757): neither librdkafka's token request nor
//! its errors reach the context. A thread of its own, per admin client, sets its tokens on
//! librdkafka's schedule (80% of a token's lifetime; 10 s after a failure) and reads that
//! queue: its errors and log lines (forwarded to the log, as the other clients' are), for a
//! new token after a lost connection as the other clients' contexts make (see `login`).

use std::sync::mpsc::{self, TryRecvError};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use jiff::Timestamp;
use rdkafka::admin::AdminClient;
use rdkafka::client::OAuthToken;
use rdkafka::config::{ClientConfig, FromClientConfigAndContext, RDKafkaLogLevel};
use rdkafka::error::KafkaResult;
use rdkafka::ClientContext;

use super::login::{
    error_means_reconnect, forward_log, KafkaLogin, ReconnectGate, CONNECTION_FAILED_FACILITY,
};
use super::login_ffi::{self, MainQueueEvent};

/// After a failed token, the next try (librdkafka's own interval).
const RETRY_AFTER_FAILURE: Duration = Duration::from_secs(10);
/// A new token once this share of the last one's lifetime has passed (librdkafka's).
const REFRESH_AT_SHARE: f64 = 0.8;
/// How long the thread waits for an error at a time: how soon it sees a stop.
const POLL_INTERVAL: Duration = Duration::from_millis(200);

/// An admin client that logs in with the relay's tokens (see the module's docs).
pub struct LoggedInAdmin<C: ClientContext + 'static> {
    // Declared first: dropped (the thread stopped and joined) before the client.
    _refresher: Option<Refresher>,
    client: Arc<AdminClient<C>>,
}

impl<C: ClientContext + 'static> std::ops::Deref for LoggedInAdmin<C> {
    type Target = AdminClient<C>;

    fn deref(&self) -> &AdminClient<C> {
        &self.client
    }
}

/// An admin client made from `config` with `context`, whose tokens `login` makes.
pub fn admin_client<C: ClientContext + 'static>(
    config: &ClientConfig,
    context: C,
    login: &KafkaLogin,
) -> KafkaResult<LoggedInAdmin<C>> {
    let client = Arc::new(AdminClient::from_config_and_context(config, context)?);
    let refresher = login
        .makes_tokens()
        .then(|| Refresher::start(Arc::downgrade(&client), login.clone()));
    Ok(LoggedInAdmin {
        _refresher: refresher,
        client,
    })
}

struct Refresher {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Refresher {
    fn start<C: ClientContext + 'static>(
        client: Weak<AdminClient<C>>,
        login: KafkaLogin,
    ) -> Refresher {
        let (stop, stopped) = mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("kafka-admin-login".into())
            .spawn(move || run(&client, &login, &stopped));
        match thread {
            Ok(thread) => Refresher {
                stop: Some(stop),
                thread: Some(thread),
            },
            Err(e) => {
                tracing::error!(error = %e, "cannot start the admin client's login thread: it cannot log in");
                Refresher {
                    stop: None,
                    thread: None,
                }
            }
        }
    }
}

/// The thread: a token when one is due or after a lost connection, until stopped.
fn run<C: ClientContext>(
    client: &Weak<AdminClient<C>>,
    login: &KafkaLogin,
    stopped: &mpsc::Receiver<()>,
) {
    let reconnects = ReconnectGate::default();
    let mut due = Instant::now();
    while let Err(TryRecvError::Empty) = stopped.try_recv() {
        let Some(admin) = client.upgrade() else {
            return;
        };
        let now = Instant::now();
        if now >= due {
            due = now + set_token(&admin, login);
        }
        let wait = due.saturating_duration_since(now).min(POLL_INTERVAL);
        let mut reconnect = false;
        for event in login_ffi::take_main_queue_events(admin.inner(), wait) {
            reconnect |= match event {
                MainQueueEvent::Error(code) => error_means_reconnect(code),
                MainQueueEvent::Log(level, fac, line) => {
                    forward_log(log_level(level), &fac, &line);
                    fac == CONNECTION_FAILED_FACILITY
                }
            };
        }
        let now = Instant::now();
        if reconnect && reconnects.admit(now) {
            tracing::debug!("a new Kafka login token for the admin client's reconnect");
            due = now + set_token(&admin, login);
        }
    }
}

/// Makes a token and sets it on `admin`; when the next is due.
fn set_token<C: ClientContext>(admin: &AdminClient<C>, login: &KafkaLogin) -> Duration {
    match login.generate() {
        Ok(token) => {
            if let Err(e) = login_ffi::set_token(admin.inner(), &token) {
                tracing::warn!(error = %e, "librdkafka refused the admin client's token");
            }
            refresh_after(&token)
        }
        Err(e) => {
            login_ffi::set_token_failure(admin.inner(), &e.to_string());
            RETRY_AFTER_FAILURE
        }
    }
}

impl Drop for Refresher {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// How long until a new token is due: 80% of what is left of this one's lifetime.
fn refresh_after(token: &OAuthToken) -> Duration {
    let left_ms = token.lifetime_ms - Timestamp::now().as_millisecond();
    Duration::from_millis((left_ms.max(0) as f64 * REFRESH_AT_SHARE) as u64)
        .max(Duration::from_secs(1))
}

/// A syslog level as rust-rdkafka names it.
fn log_level(level: i32) -> RDKafkaLogLevel {
    use RDKafkaLogLevel as L;
    match level {
        ..=0 => L::Emerg,
        1 => L::Alert,
        2 => L::Critical,
        3 => L::Error,
        4 => L::Warning,
        5 => L::Notice,
        6 => L::Info,
        _ => L::Debug,
    }
}
