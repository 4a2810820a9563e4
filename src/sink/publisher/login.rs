//! Kafka logins whose tokens the relay makes itself: `kafka.sasl_mechanism = "AWS_MSK_IAM"`.
//!
//! librdkafka logs in with SASL OAUTHBEARER and asks for a token when a client starts and
//! again at 80% of the last token's lifetime (every 12 minutes for MSK's 15-minute tokens;
//! after a failure, every 10 s). rust-rdkafka hands that request to the client context's
//! `generate_oauth_token`, which every context of the relay forwards to [`KafkaLogin`]. A
//! reconnect (a broker restart, a dropped connection) logs in with the token current then,
//! which is always inside its lifetime, and a re-authentication (KIP-368, MSK ends sessions
//! with their token) likewise.
//!
//! rust-rdkafka's admin client never polls for that request (fede1024/rust-rdkafka#757), so
//! [`admin_client`] sets its token itself, on a thread of its own, on the same schedule.

use std::error::Error;
use std::fmt;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use jiff::Timestamp;
use rdkafka::admin::AdminClient;
use rdkafka::client::OAuthToken;
use rdkafka::config::{ClientConfig, FromClientConfigAndContext};
use rdkafka::consumer::{BaseConsumer, ConsumerContext};
use rdkafka::error::KafkaResult;
use rdkafka::producer::{BaseProducer, ProducerContext};
use rdkafka::ClientContext;

use super::login_ffi;
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
#[derive(Debug, Clone, Default)]
pub struct LoginContext {
    pub login: KafkaLogin,
}

impl ClientContext for LoginContext {
    const ENABLE_REFRESH_OAUTH_TOKEN: bool = true;

    fn generate_oauth_token(&self, _config: Option<&str>) -> Result<OAuthToken, Box<dyn Error>> {
        self.login.generate()
    }
}

impl ConsumerContext for LoginContext {}

/// After a failed token, the next try (librdkafka's own interval).
const RETRY_AFTER_FAILURE: Duration = Duration::from_secs(10);
/// A new token once this share of the last one's lifetime has passed (librdkafka's).
const REFRESH_AT_SHARE: f64 = 0.8;

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
            .spawn(move || loop {
                let Some(admin) = client.upgrade() else { return };
                let wait = match login.generate() {
                    Ok(token) => {
                        let wait = refresh_after(&token);
                        if let Err(e) = login_ffi::set_token(admin.inner(), &token) {
                            tracing::warn!(error = %e, "librdkafka refused the admin client's token");
                        }
                        wait
                    }
                    Err(e) => {
                        login_ffi::set_token_failure(admin.inner(), &e.to_string());
                        RETRY_AFTER_FAILURE
                    }
                };
                drop(admin);
                match stopped.recv_timeout(wait) {
                    Err(RecvTimeoutError::Timeout) => continue,
                    _ => return,
                }
            });
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

/// A consumer made from `config` with `context`, whose first token is made now when `login`
/// makes them: a consumer that only reads offsets is never polled, and rust-rdkafka answers
/// librdkafka's token request only in a poll.
pub fn consumer<C: ConsumerContext>(
    config: &ClientConfig,
    context: C,
    login: &KafkaLogin,
) -> KafkaResult<BaseConsumer<C>> {
    let consumer: BaseConsumer<C> = config.create_with_context(context)?;
    if login.makes_tokens() {
        let _ = consumer.poll(Duration::ZERO);
    }
    Ok(consumer)
}

/// [`consumer`]'s counterpart for a producer that is not polled (the pre-flight probe).
pub fn producer<C: ProducerContext>(
    config: &ClientConfig,
    context: C,
    login: &KafkaLogin,
) -> KafkaResult<BaseProducer<C>> {
    let producer: BaseProducer<C> = config.create_with_context(context)?;
    if login.makes_tokens() {
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
