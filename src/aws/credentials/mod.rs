//! The default AWS credential chain, in the order AWS's SDKs document it (the Java and PHP
//! developer guides, "default credential provider chain"): the first source that is set up
//! answers, and the chain stops there.
//!
//! 1. environment: `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`;
//! 2. web identity (EKS IRSA): `AWS_WEB_IDENTITY_TOKEN_FILE` and `AWS_ROLE_ARN`, exchanged
//!    at STS (`AssumeRoleWithWebIdentity`, an unsigned POST);
//! 3. the shared profile files (`~/.aws/credentials`, `~/.aws/config`; `AWS_PROFILE`,
//!    `AWS_SHARED_CREDENTIALS_FILE`, `AWS_CONFIG_FILE`): static keys, or the profile's
//!    `credential_process` (a command printing them as JSON), or a role assumed at STS
//!    (`role_arn` + `source_profile`, `AssumeRole` signed with SigV4);
//! 4. ECS / EKS Pod Identity container credentials (`AWS_CONTAINER_CREDENTIALS_RELATIVE_URI`
//!    or `_FULL_URI`, with `AWS_CONTAINER_AUTHORIZATION_TOKEN[_FILE]`);
//! 5. EC2 instance metadata, IMDSv2 (`AWS_EC2_METADATA_SERVICE_ENDPOINT`,
//!    `AWS_EC2_METADATA_DISABLED`).
//!
//! A source that is set up but fails (an unreadable token file, STS refusing the role) is an
//! error naming that source and its fix; it does not fall through to the next one, which
//! would log in as someone else. Temporary credentials are kept until
//! [`REFRESH_BEFORE_EXPIRY`] before their expiration, then fetched again.
//!
//! This is a small client of its own rather than `aws-config`: that crate brings the STS,
//! SSO and SSO-OIDC SDKs, the Smithy runtime and its own HTTP stack (about 150 crates more to
//! build); the five sources here need one HTTP client and a page of parsing each.

mod http;
mod process;
#[cfg(test)]
mod process_tests;
mod profile;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use jiff::Timestamp;

pub use super::sigv4::AwsCredentials;

/// Temporary credentials are fetched again this long before they expire (AWS's SDKs use 5
/// to 15 minutes; a token signed with them must stay valid for its own 15 minutes' use).
pub const REFRESH_BEFORE_EXPIRY: Duration = Duration::from_secs(5 * 60);

/// Credentials as a source gave them, with where from and until when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fetched {
    pub credentials: AwsCredentials,
    /// `None`: long-term keys.
    pub expires: Option<Timestamp>,
    /// The source, for logs and errors (`environment`, `web identity`, …).
    pub from: &'static str,
}

/// Why no credentials: the source that failed and the fix, or that none is set up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CredentialsError {
    #[error("AWS credentials from {from}: {message}; {fix}")]
    Source {
        from: &'static str,
        message: String,
        fix: &'static str,
    },
    #[error(
        "no AWS credentials found (tried: environment AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY; \
         web identity AWS_WEB_IDENTITY_TOKEN_FILE + AWS_ROLE_ARN; profile `{profile}` in \
         {files}; ECS AWS_CONTAINER_CREDENTIALS_*_URI; EC2 instance metadata: {imds}): give the \
         relay one of them, e.g. an IAM role for its pod (IRSA), task or instance"
    )]
    NotFound {
        profile: String,
        files: String,
        imds: String,
    },
}

impl CredentialsError {
    fn source(from: &'static str, message: impl Into<String>, fix: &'static str) -> Self {
        CredentialsError::Source {
            from,
            message: message.into(),
            fix,
        }
    }
}

/// The environment the chain reads: a snapshot of the process's (or a test's) variables.
#[derive(Debug, Clone, Default)]
pub struct Env {
    vars: HashMap<String, String>,
}

impl Env {
    pub fn process() -> Env {
        Env {
            vars: std::env::vars().collect(),
        }
    }

    pub fn from_pairs<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> Env {
        Env {
            vars: pairs
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    /// The variable, unless unset or blank.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.vars
            .get(name)
            .map(String::as_str)
            .filter(|v| !v.trim().is_empty())
    }

    fn home(&self) -> Option<PathBuf> {
        self.get("HOME").map(PathBuf::from)
    }

    pub fn region(&self) -> Option<&str> {
        self.get("AWS_REGION")
            .or_else(|| self.get("AWS_DEFAULT_REGION"))
    }
}

/// 1. `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY` / `AWS_SESSION_TOKEN`.
fn from_environment(env: &Env) -> Result<Option<Fetched>, CredentialsError> {
    let from = "environment";
    match (
        env.get("AWS_ACCESS_KEY_ID"),
        env.get("AWS_SECRET_ACCESS_KEY"),
    ) {
        (None, None) => Ok(None),
        (Some(id), Some(secret)) => Ok(Some(Fetched {
            credentials: AwsCredentials::new(id, secret, env.get("AWS_SESSION_TOKEN")),
            expires: None,
            from,
        })),
        _ => Err(CredentialsError::source(
            from,
            "only one of AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY is set",
            "set both, or neither to use the next source",
        )),
    }
}

/// The chain, run once: the first source set up answers (async: three sources are HTTP).
pub async fn resolve(env: &Env) -> Result<Fetched, CredentialsError> {
    if let Some(found) = from_environment(env)? {
        return Ok(found);
    }
    if let Some(found) = http::web_identity(env).await? {
        return Ok(found);
    }
    let profile = profile::Profile::locate(env);
    match profile.credentials()? {
        Some(profile::FromProfile::Ready(found)) => return Ok(found),
        Some(profile::FromProfile::AssumeRole(role)) => return http::assume_role(env, &role).await,
        None => {}
    }
    if let Some(found) = http::container(env).await? {
        return Ok(found);
    }
    let imds = match http::instance_metadata(env).await? {
        http::Imds::Found(found) => return Ok(found),
        http::Imds::Unavailable(why) => why,
    };
    Err(CredentialsError::NotFound {
        profile: profile.name,
        files: profile.files,
        imds,
    })
}

/// How long [`CredentialsProvider::credentials`] waits for a fetch when it holds no valid
/// credentials at all. With valid ones it never waits: a refresh runs in the background.
pub const WAIT_WITHOUT_CREDENTIALS: Duration = Duration::from_secs(5);
/// What a first fetch may take: a `credential_process` may run 30 s, an STS request 10 s.
pub const FIRST_FETCH_WAIT: Duration = Duration::from_secs(40);

/// The chain with its cache: credentials are kept until [`REFRESH_BEFORE_EXPIRY`] before
/// they expire, then fetched again **in the background** while the current ones are used.
/// Callers include tokio's runtime thread (a PostgreSQL login) and librdkafka's threads (an
/// MSK token, served by the thread that also serves delivery reports): a fetch — up to 30 s
/// for a `credential_process`, 10 s per STS request — runs on a thread of its own, one at a
/// time, and a caller waits for it only when it holds no valid credentials, and then for a
/// bounded time.
#[derive(Debug)]
pub struct CredentialsProvider {
    /// `None`: the process's environment, read at each fetch.
    env: Option<Env>,
    state: Arc<(Mutex<State>, Condvar)>,
}

#[derive(Debug, Default)]
struct State {
    cached: Option<Fetched>,
    /// A fetch runs.
    fetching: bool,
    /// Fetches finished so far, and the error of the last one if it failed.
    finished: u64,
    last_error: Option<CredentialsError>,
}

impl CredentialsProvider {
    /// A provider reading `env` (tests; the relay uses [`CredentialsProvider::shared`]).
    pub fn new(env: Env) -> CredentialsProvider {
        CredentialsProvider {
            env: Some(env),
            state: Arc::default(),
        }
    }

    /// The process's provider, shared by the RDS and MSK logins (one cache, one fetch).
    pub fn shared() -> Arc<CredentialsProvider> {
        static SHARED: OnceLock<Arc<CredentialsProvider>> = OnceLock::new();
        SHARED
            .get_or_init(|| {
                Arc::new(CredentialsProvider {
                    env: None,
                    state: Arc::default(),
                })
            })
            .clone()
    }

    /// The environment a fetch reads now.
    pub fn env(&self) -> Env {
        self.env.clone().unwrap_or_else(Env::process)
    }

    /// Credentials, from the cache when they are valid for at least [`REFRESH_BEFORE_EXPIRY`]
    /// more. Nearer their expiry, the cached ones are returned at once while a refresh runs in
    /// the background (a failed one is logged and tried again at the next call). Without valid
    /// ones, waits up to [`WAIT_WITHOUT_CREDENTIALS`] for the fetch.
    pub fn credentials(&self) -> Result<Fetched, CredentialsError> {
        self.credentials_within(WAIT_WITHOUT_CREDENTIALS)
    }

    /// [`CredentialsProvider::credentials`], waiting up to `wait` when none are valid (at
    /// start-up: [`FIRST_FETCH_WAIT`]). A fetch still running then goes on in the background.
    pub fn credentials_within(&self, wait: Duration) -> Result<Fetched, CredentialsError> {
        let now = Timestamp::now();
        let (lock, done) = &*self.state;
        let mut state = lock.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(cached) = state
            .cached
            .as_ref()
            .filter(|c| fresh(c, now, REFRESH_BEFORE_EXPIRY))
        {
            return Ok(cached.clone());
        }
        let ticket = state.finished;
        if !state.fetching {
            state.fetching = true;
            if let Err(e) = self.fetch_in_background() {
                state.fetching = false;
                return Err(e);
            }
        }
        if let Some(valid) = state
            .cached
            .as_ref()
            .filter(|c| fresh(c, now, Duration::ZERO))
        {
            return Ok(valid.clone());
        }
        let give_up = std::time::Instant::now() + wait;
        while state.finished == ticket {
            let left = give_up.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return Err(CredentialsError::source(
                    "the chain",
                    format!("no credentials after {} s", wait.as_secs()),
                    "the fetch goes on in the background and the next login uses what it gets; a credential_process or STS that slow needs looking at",
                ));
            }
            state = done
                .wait_timeout(state, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        let now = Timestamp::now();
        match state
            .cached
            .as_ref()
            .filter(|c| fresh(c, now, Duration::ZERO))
        {
            Some(valid) => Ok(valid.clone()),
            None => Err(state.last_error.clone().unwrap_or_else(|| {
                CredentialsError::source("the chain", "no credentials", "see the log")
            })),
        }
    }

    /// Waits until no fetch runs (tests: a background refresh has finished).
    #[cfg(test)]
    fn settle(&self) {
        let (lock, done) = &*self.state;
        let mut state = lock.lock().unwrap_or_else(PoisonError::into_inner);
        while state.fetching {
            state = done.wait(state).unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Runs the chain on a thread with its own runtime (callers include librdkafka's threads
    /// and tokio's, where blocking on a runtime of the caller's is not allowed); its outcome
    /// goes to the cache, and waiting callers are woken.
    fn fetch_in_background(&self) -> Result<(), CredentialsError> {
        let env = self.env();
        let state = self.state.clone();
        std::thread::Builder::new()
            .name("aws-credentials".into())
            .spawn(move || {
                let fetched = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| {
                        CredentialsError::source(
                            "the chain",
                            e.to_string(),
                            "check the process's limits (threads, file descriptors)",
                        )
                    })
                    .and_then(|runtime| runtime.block_on(resolve(&env)));
                let (lock, done) = &*state;
                let mut state = lock.lock().unwrap_or_else(PoisonError::into_inner);
                match fetched {
                    Ok(fetched) => {
                        tracing::debug!(from = fetched.from, expires = ?fetched.expires, "fetched AWS credentials");
                        state.cached = Some(fetched);
                        state.last_error = None;
                    }
                    Err(error) => {
                        if state.cached.is_some() {
                            tracing::warn!(%error, "cannot refresh the AWS credentials; using the current ones until they expire");
                        }
                        state.last_error = Some(error);
                    }
                }
                state.fetching = false;
                state.finished += 1;
                done.notify_all();
            })
            .map(drop)
            .map_err(|e| {
                CredentialsError::source(
                    "the chain",
                    format!("cannot start a thread: {e}"),
                    "check the process's thread limit",
                )
            })
    }
}

/// Valid for at least `margin` more at `now` (long-term keys always are).
fn fresh(fetched: &Fetched, now: Timestamp, margin: Duration) -> bool {
    let margin = jiff::SignedDuration::try_from(margin).unwrap_or(jiff::SignedDuration::ZERO);
    fetched
        .expires
        .is_none_or(|expires| now.checked_add(margin).is_ok_and(|t| t < expires))
}
