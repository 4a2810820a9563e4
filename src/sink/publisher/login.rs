//! Kafka logins whose tokens the relay makes itself: `kafka.sasl_mechanism = "AWS_MSK_IAM"`.
//!
//! librdkafka logs in with SASL OAUTHBEARER and asks for a token when a client starts and
//! again at 80% of the last token's lifetime (every 12 minutes for MSK's 15-minute tokens;
//! after a failure, every 10 s). rust-rdkafka hands that request to the client context's
//! `generate_oauth_token`, which every context of the relay forwards to its [`ClientLogin`].
//!
//! A reconnect would log in with the token current then: librdkafka asks for none when a
//! connection is lost. The relay makes a new one instead: when a client logs a failed or
//! lost broker connection (librdkafka's facility `FAIL`, at info or above: it reports a lost
//! connection as a log line, not as an error) or reports every broker down or a refused
//! login ([`ClientLogin::on_log`], [`ClientLogin::on_error`]), its context signs a new token
//! and sets it on the client at once, at most one per [`RECONNECT_TOKEN_EVERY`] (a flapping
//! broker reports such failures many times a second). The event reaches the context within
//! milliseconds (its poller wakes on it) and librdkafka waits `reconnect.backoff.ms` (at least
//! 75 ms) before it reconnects, so the reconnect logs in with the new token. What librdkafka
//! does not log at info (an idle connection closed by the broker's reaper; the same failure
//! again within 30 s) reconnects with the current token, which is always inside its
//! lifetime.
//!
//! rust-rdkafka's admin client never polls for its token request or its errors
//! (fede1024/rust-rdkafka#757), so `login_admin` does both for it on a thread of its own.

use std::error::Error;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use jiff::Timestamp;
use rdkafka::client::{Client, OAuthToken};
use rdkafka::config::ClientConfig;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, KafkaResult, RDKafkaErrorCode};
use rdkafka::producer::{BaseProducer, Producer, ProducerContext};
use rdkafka::types::RDKafkaRespErr;
use rdkafka::ClientContext;

use super::login_ffi::ClientSlot;
use crate::aws::credentials::CredentialsProvider;
use crate::aws::msk;
use crate::config::KafkaConfig;

/// What makes the tokens: the MSK signer in the relay, another in tests.
pub trait TokenSource: Send + Sync {
    /// A token to log in with now; the error says what to fix.
    fn token(&self) -> Result<OAuthToken, String>;
}

/// The token maker of a client, if the relay makes them (`AWS_MSK_IAM`); shared by every
/// Kafka client of a config.
#[derive(Clone, Default)]
pub struct KafkaLogin(Option<Arc<dyn TokenSource>>);

impl fmt::Debug for KafkaLogin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_some() {
            "KafkaLogin(tokens)"
        } else {
            "KafkaLogin(none)"
        })
    }
}

impl KafkaLogin {
    /// The relay's own tokens with `AWS_MSK_IAM`; none otherwise (librdkafka logs in by
    /// itself: PLAIN, SCRAM, OIDC).
    pub fn from_config(config: &KafkaConfig) -> KafkaLogin {
        if !config.uses_aws_msk_iam() {
            return KafkaLogin::default();
        }
        let credentials = CredentialsProvider::shared();
        let env_region = credentials.env().region().map(str::to_string);
        let region = config
            .aws_msk_iam
            .resolve_region(&config.brokers, env_region.as_deref())
            .map_err(|e| e.to_string());
        KafkaLogin(Some(Arc::new(MskIamTokens {
            region,
            credentials,
        })))
    }

    /// Tokens from `source` (tests; embedding).
    pub fn custom(source: Arc<dyn TokenSource>) -> KafkaLogin {
        KafkaLogin(Some(source))
    }

    /// The relay makes this client's tokens.
    pub fn makes_tokens(&self) -> bool {
        self.0.is_some()
    }

    /// For `generate_oauth_token`: a token, or why none (librdkafka reports it as an
    /// authentication error, which blocks the relay with the fix, and asks again in 10 s).
    pub fn generate(&self) -> Result<OAuthToken, Box<dyn Error>> {
        match &self.0 {
            Some(source) => source.token().map_err(Into::into),
            None => Err("no token source: sasl.mechanism OAUTHBEARER without kafka.sasl_mechanism = \"AWS_MSK_IAM\"".into()),
        }
    }
}

/// `AWS_MSK_IAM`: tokens signed for the cluster's region with the default AWS credentials.
struct MskIamTokens {
    /// An unresolvable region is reported at each token request (validation reports it at
    /// start already).
    region: Result<String, String>,
    credentials: Arc<CredentialsProvider>,
}

impl TokenSource for MskIamTokens {
    fn token(&self) -> Result<OAuthToken, String> {
        let region = self.region.as_ref().map_err(Clone::clone)?;
        let fetched = self
            .credentials
            .credentials()
            .map_err(|e| format!("kafka.sasl_mechanism = \"AWS_MSK_IAM\": {e}"))?;
        let token = msk::auth_token(
            region,
            &fetched.credentials,
            Timestamp::now(),
            msk::USER_AGENT,
        );
        tracing::debug!(region, from = fetched.from, "signed an MSK IAM token");
        Ok(OAuthToken {
            token: token.token,
            // Only librdkafka's own bookkeeping: OAUTHBEARER sends no principal to the broker,
            // which takes the IAM identity from the signature.
            principal_name: fetched.credentials.access_key_id,
            lifetime_ms: token.expires_ms,
        })
    }
}

/// A context that only logs in: for admin clients and the relay's plain consumers.
#[derive(Debug, Default)]
pub struct LoginContext {
    login: ClientLogin,
}

impl LoginContext {
    pub fn new(login: &KafkaLogin) -> LoginContext {
        LoginContext {
            login: ClientLogin::new(login.clone()),
        }
    }
}

impl LogsIn for LoginContext {
    fn client_login(&self) -> &ClientLogin {
        &self.login
    }
}

impl ClientContext for LoginContext {
    const ENABLE_REFRESH_OAUTH_TOKEN: bool = true;

    fn generate_oauth_token(&self, _config: Option<&str>) -> Result<OAuthToken, Box<dyn Error>> {
        self.login.generate()
    }

    fn error(&self, error: KafkaError, reason: &str) {
        self.login.on_error(&error);
        tracing::warn!(error = %error, reason, "kafka client error");
    }

    fn log(&self, level: RDKafkaLogLevel, fac: &str, line: &str) {
        self.login.on_log(fac);
        forward_log(level, fac, line);
    }
}

impl ConsumerContext for LoginContext {}

/// A consumer made from `config` with `context`, whose first token is made now when `login`
/// makes them: a consumer that only reads offsets is never polled, and rust-rdkafka answers
/// librdkafka's token request only in a poll.
pub fn consumer<C: ConsumerContext + LogsIn>(
    config: &ClientConfig,
    context: C,
) -> KafkaResult<BaseConsumer<C>> {
    let consumer: BaseConsumer<C> = config.create_with_context(context)?;
    attach(consumer.client());
    if consumer.context().client_login().makes_tokens() {
        let _ = consumer.poll(Duration::ZERO);
    }
    Ok(consumer)
}

/// [`consumer`]'s counterpart for a producer that is not polled (the pre-flight probe).
pub fn producer<C: ProducerContext + LogsIn>(
    config: &ClientConfig,
    context: C,
) -> KafkaResult<BaseProducer<C>> {
    let producer: BaseProducer<C> = config.create_with_context(context)?;
    attach(producer.client());
    if producer.context().client_login().makes_tokens() {
        producer.poll(Duration::ZERO);
    }
    Ok(producer)
}

/// The relay's producers report deliveries through their own context; this one is for a
/// producer that only needs to log in (tests, tools).
impl ProducerContext for LoginContext {
    type DeliveryOpaque = ();

    fn delivery(&self, _: &rdkafka::message::DeliveryResult<'_>, _: ()) {}
}

/// A new token at most this often per client after lost connections (see the module's docs).
pub const RECONNECT_TOKEN_EVERY: Duration = Duration::from_secs(1);

/// Which client errors call for a new token, and not more often than
/// [`RECONNECT_TOKEN_EVERY`]: shared by the contexts and the admin login thread.
#[derive(Debug, Default)]
pub(super) struct ReconnectGate {
    last: Mutex<Option<Instant>>,
}

impl ReconnectGate {
    /// A reconnect signal at `now` may make a new token (and is counted as having made one).
    pub(super) fn admit(&self, now: Instant) -> bool {
        let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        if last.is_some_and(|at| now.saturating_duration_since(at) < RECONNECT_TOKEN_EVERY) {
            return false;
        }
        *last = Some(now);
        true
    }
}

/// A connection lost (or not made), every broker down, a refused login: the next login is
/// a reconnect.
fn means_reconnect(code: RDKafkaErrorCode) -> bool {
    matches!(
        code,
        RDKafkaErrorCode::BrokerTransportFailure
            | RDKafkaErrorCode::AllBrokersDown
            | RDKafkaErrorCode::Authentication
            | RDKafkaErrorCode::SaslAuthenticationFailed
    )
}

/// The facility of librdkafka's log lines about a failed or lost broker connection.
pub(super) const CONNECTION_FAILED_FACILITY: &str = "FAIL";

/// For the admin login thread, which reads raw error codes off the client's queue.
pub(super) fn error_means_reconnect(code: RDKafkaRespErr) -> bool {
    means_reconnect(code.into())
}

/// What rust-rdkafka's default `ClientContext::log` does, for the contexts that read the
/// lines first.
pub fn forward_log(level: RDKafkaLogLevel, fac: &str, line: &str) {
    use RDKafkaLogLevel as L;
    match level {
        L::Emerg | L::Alert | L::Critical | L::Error => {
            tracing::error!(target: "librdkafka", "librdkafka: {fac} {line}")
        }
        L::Warning => tracing::warn!(target: "librdkafka", "librdkafka: {fac} {line}"),
        L::Notice | L::Info => tracing::info!(target: "librdkafka", "librdkafka: {fac} {line}"),
        L::Debug => tracing::debug!(target: "librdkafka", "librdkafka: {fac} {line}"),
    }
}

/// One client's login: the token maker and, once [`attach`]ed, the client to set a new token
/// on after a lost connection.
#[derive(Default)]
pub struct ClientLogin {
    login: KafkaLogin,
    client: ClientSlot,
    reconnects: ReconnectGate,
}

impl fmt::Debug for ClientLogin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientLogin")
            .field("login", &self.login)
            .field("attached", &self.client.is_filled())
            .finish()
    }
}

impl ClientLogin {
    pub fn new(login: KafkaLogin) -> ClientLogin {
        ClientLogin {
            login,
            ..ClientLogin::default()
        }
    }

    /// The relay makes this client's tokens.
    pub fn makes_tokens(&self) -> bool {
        self.login.makes_tokens()
    }

    /// For `generate_oauth_token` (see [`KafkaLogin::generate`]).
    pub fn generate(&self) -> Result<OAuthToken, Box<dyn Error>> {
        self.login.generate()
    }

    /// For the context's `ClientContext::error`, and nothing else: after every broker down
    /// or a refused login, a new token for the reconnect (see the module's docs).
    pub(super) fn on_error(&self, error: &KafkaError) {
        if error.rdkafka_error_code().is_some_and(means_reconnect) {
            self.reconnect(&error.to_string());
        }
    }

    /// For the context's `ClientContext::log`, and nothing else: after a failed or lost
    /// broker connection, a new token for the reconnect.
    pub(super) fn on_log(&self, fac: &str) {
        if fac == CONNECTION_FAILED_FACILITY {
            self.reconnect("broker connection failed or lost");
        }
    }

    fn reconnect(&self, why: &str) {
        if !self.makes_tokens()
            || !self.client.is_filled()
            || !self.reconnects.admit(Instant::now())
        {
            return;
        }
        match self.login.generate() {
            Ok(token) => match self.client.set_token(&token) {
                Some(Ok(())) => tracing::debug!(why, "a new Kafka login token for the reconnect"),
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "librdkafka refused the reconnect's token")
                }
                None => {}
            },
            // The current token stays: it may still be good; librdkafka's own schedule
            // reports a lasting failure.
            Err(e) => {
                tracing::warn!(error = %e, "cannot make a new Kafka login token for the reconnect")
            }
        }
    }
}

/// A context that logs in with a [`ClientLogin`].
pub trait LogsIn {
    fn client_login(&self) -> &ClientLogin;
}

/// Lets `client`'s context set new tokens on it after lost connections; call it right after
/// the client is made (a later call is ignored).
pub fn attach<C: ClientContext + LogsIn>(client: &Client<C>) {
    client.context().client_login().client.fill(client);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_token_for_a_reconnect_at_most_once_a_second() {
        let gate = ReconnectGate::default();
        let t0 = Instant::now();
        assert!(gate.admit(t0));
        assert!(!gate.admit(t0 + Duration::from_millis(10)));
        assert!(!gate.admit(t0 + RECONNECT_TOKEN_EVERY - Duration::from_millis(1)));
        assert!(gate.admit(t0 + RECONNECT_TOKEN_EVERY));
        assert!(!gate.admit(t0 + RECONNECT_TOKEN_EVERY + Duration::from_millis(500)));
    }

    #[test]
    fn lost_connections_and_refused_logins_mean_a_reconnect() {
        for code in [
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__TRANSPORT,
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN,
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__AUTHENTICATION,
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_SASL_AUTHENTICATION_FAILED,
        ] {
            assert!(error_means_reconnect(code), "{code:?}");
        }
        for code in [
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__PARTITION_EOF,
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED,
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__MSG_TIMED_OUT,
        ] {
            assert!(!error_means_reconnect(code), "{code:?}");
        }
    }

    /// Counts tokens; `on_log`/`on_error` without a client (not attached) make none, and
    /// no token source makes none either.
    struct Count(std::sync::atomic::AtomicUsize);

    impl TokenSource for Count {
        fn token(&self) -> Result<OAuthToken, String> {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Err("counted".into())
        }
    }

    #[test]
    fn an_unattached_login_makes_no_reconnect_token() {
        let count = Arc::new(Count(Default::default()));
        let login = ClientLogin::new(KafkaLogin::custom(count.clone()));
        login.on_log(CONNECTION_FAILED_FACILITY);
        login.on_error(&KafkaError::Global(RDKafkaErrorCode::AllBrokersDown));
        assert_eq!(count.0.load(std::sync::atomic::Ordering::SeqCst), 0);
    }
}
