//! The Schema Registry's Confluent-compatible REST API: the few calls the serializer makes.
//! The I/O edge of serialization; what it returns is parsed by the pure encoders.

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde::Deserialize;
use tracing::{info, warn};

use crate::config::{SchemaVersion, Secret, SerializationConfig};

/// How often the password or token file is read again, so that a rotated secret is used
/// without a restart; it is also read again at once when the registry answers 401 or 403.
pub const CREDENTIALS_REREAD: Duration = Duration::from_secs(60);

/// Why the registry gave no schema. A deployment problem (records wait), except a missing
/// or unusable schema that a row's own data named ([`RegistryError::is_missing_schema`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    #[error("schema registry {url} unreachable: {reason}")]
    Unreachable { url: String, reason: String },
    #[error("schema registry refused the relay's credentials (HTTP {status}; the password or token file was read again): check outbox.serialization.registry_username / registry_password_file / registry_token_file and the registry's permissions")]
    Unauthorized { status: u16 },
    #[error("schema registry has no {what} (HTTP 404: {body}): register the schema, or set outbox.serialization.auto_register = true with schema_file{}", if code.is_none() { "; no registry error code in the answer: is registry_url the registry's Confluent-compatible base URL?" } else { "" })]
    NotFound {
        what: String,
        body: String,
        /// The registry's `error_code` (40401 no such subject, 40402 no such version, 40403
        /// no such schema id); `None` when the answer has none (not the registry's API: a
        /// wrong `registry_url` path, a proxy).
        code: Option<u32>,
    },
    #[error("schema registry answered HTTP {status}: {body}")]
    Failed { status: u16, body: String },
    #[error("the registry's schema for subject `{subject}` cannot be used: {reason}; register a valid one")]
    BadSchema { subject: String, reason: String },
    #[error("cannot read outbox.serialization.schema_file `{path}`: {reason}")]
    SchemaFile { path: String, reason: String },
}

impl RegistryError {
    /// The registry answered, and has no such subject, version or schema id (a 404 with the
    /// registry's own error code), or holds a schema the relay cannot use for it. When the
    /// subject or id came from a row's data this is that row's fault; from the configuration,
    /// the deployment's. A 404 without the registry's error code is neither: the URL may be
    /// wrong, so it blocks.
    pub fn is_missing_schema(&self) -> bool {
        match self {
            RegistryError::NotFound { code, .. } => {
                matches!(code, Some(40401..=40403))
            }
            RegistryError::BadSchema { .. } => true,
            _ => false,
        }
    }
}

/// A schema as the registry holds it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Registered {
    pub id: u32,
    pub schema: String,
    #[serde(rename = "schemaType", default)]
    pub schema_type: Option<String>,
}

/// `GET /schemas/ids/{id}`: a schema without its id.
#[derive(Debug, Deserialize)]
struct ById {
    schema: String,
    #[serde(rename = "schemaType", default)]
    schema_type: Option<String>,
}

#[derive(Debug, Deserialize)]
struct IdOnly {
    id: u32,
}

/// A boxed future the [`SchemaRegistry`] calls return (the trait stays object-safe). Its own
/// here: `sink/publisher/progress.rs` has the same alias, but serialization uses nothing of
/// the publisher.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The registry calls the [`super::Serializer`] makes: the seam between serialization and
/// the registry's HTTP API. [`RegistryClient`] is the real one; tests and the session's
/// simulation (`relay/session/sim/registry.rs`) stand in for it.
pub trait SchemaRegistry: std::fmt::Debug + Send + Sync {
    /// The subject's schema at `version` (`GET /subjects/{subject}/versions/{version}`).
    fn version<'a>(
        &'a self,
        subject: &'a str,
        version: SchemaVersion,
    ) -> BoxFuture<'a, Result<Registered, RegistryError>>;

    /// The schema registered as `id` (`GET /schemas/ids/{id}`).
    fn by_id(&self, id: u32) -> BoxFuture<'_, Result<Registered, RegistryError>>;

    /// Registers `schema` under `subject`, answering its id (`POST /subjects/{subject}/versions`).
    fn register<'a>(
        &'a self,
        subject: &'a str,
        schema: &'a str,
        schema_type: &'a str,
    ) -> BoxFuture<'a, Result<u32, RegistryError>>;

    /// Every subject (`GET /subjects`, for `check`).
    fn subjects(&self) -> BoxFuture<'_, Result<Vec<String>, RegistryError>>;
}

impl SchemaRegistry for RegistryClient {
    fn version<'a>(
        &'a self,
        subject: &'a str,
        version: SchemaVersion,
    ) -> BoxFuture<'a, Result<Registered, RegistryError>> {
        Box::pin(RegistryClient::version(self, subject, version))
    }

    fn by_id(&self, id: u32) -> BoxFuture<'_, Result<Registered, RegistryError>> {
        Box::pin(RegistryClient::by_id(self, id))
    }

    fn register<'a>(
        &'a self,
        subject: &'a str,
        schema: &'a str,
        schema_type: &'a str,
    ) -> BoxFuture<'a, Result<u32, RegistryError>> {
        Box::pin(RegistryClient::register(self, subject, schema, schema_type))
    }

    fn subjects(&self) -> BoxFuture<'_, Result<Vec<String>, RegistryError>> {
        Box::pin(RegistryClient::subjects(self))
    }
}

/// The registry's base URL and how the relay logs in.
#[derive(Debug, Clone)]
pub struct RegistryClient {
    http: reqwest::Client,
    base: String,
    username: Option<String>,
    /// `registry_password_file` or `registry_token_file`, read again every
    /// `reread_every` and after a refusal.
    secret_file: Option<PathBuf>,
    reread_every: Duration,
    login: Arc<Mutex<Login>>,
}

/// The secret in use and when its file was last read.
#[derive(Debug)]
struct Login {
    secret: Option<Secret>,
    read_at: Instant,
}

const CONTENT_TYPE: &str = "application/vnd.schemaregistry.v1+json";

impl RegistryClient {
    pub fn new(config: &SerializationConfig, secret: Option<Secret>) -> RegistryClient {
        let timeout = Duration::from_millis(config.request_timeout_ms);
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout)
            .build()
            .unwrap_or_default();
        RegistryClient {
            http,
            base: config.registry_url.trim_end_matches('/').to_string(),
            username: config.registry_username.clone(),
            secret_file: config
                .registry_password_file
                .clone()
                .or_else(|| config.registry_token_file.clone()),
            reread_every: CREDENTIALS_REREAD,
            login: Arc::new(Mutex::new(Login {
                secret,
                read_at: Instant::now(),
            })),
        }
    }

    /// [`RegistryClient::new`] reading its secret file again every `every` (tests).
    #[cfg(test)]
    pub(crate) fn rereading_every(mut self, every: Duration) -> RegistryClient {
        self.reread_every = every;
        self
    }

    fn login(&self) -> std::sync::MutexGuard<'_, Login> {
        self.login.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The secret to send: the file's content, read again when the last read is
    /// `reread_every` old.
    fn secret(&self) -> Option<Secret> {
        let due = self.login().read_at.elapsed() >= self.reread_every;
        if due {
            self.reread();
        }
        self.login().secret.clone()
    }

    /// Reads the secret file again; true when its content changed. A file that cannot be
    /// read (being rotated, say) leaves the secret in use as it was.
    fn reread(&self) -> bool {
        let Some(path) = &self.secret_file else {
            return false;
        };
        let read = std::fs::read_to_string(path);
        let mut login = self.login();
        login.read_at = Instant::now();
        match read {
            Ok(text) => {
                let text = text.trim();
                if login.secret.as_ref().is_some_and(|s| s.expose() == text) {
                    return false;
                }
                login.secret = Some(Secret::new(text.to_string()));
                info!(file = %path.display(), "schema registry credentials read again: changed");
                true
            }
            Err(e) => {
                warn!(file = %path.display(), error = %e,
                    "cannot read the schema registry's password or token file again: the one read before is still used");
                false
            }
        }
    }

    pub fn url(&self) -> &str {
        &self.base
    }

    /// The subject's schema at `version`.
    pub async fn version(
        &self,
        subject: &str,
        version: SchemaVersion,
    ) -> Result<Registered, RegistryError> {
        let v = match version {
            SchemaVersion::Latest => "latest".to_string(),
            SchemaVersion::Pinned(n) => n.to_string(),
        };
        let path = format!("/subjects/{}/versions/{v}", encode(subject));
        let what = format!("version {v} of subject `{subject}`");
        let body = self.send(self.http.get(self.at(&path)), &what).await?;
        serde_json::from_str(&body).map_err(|e| self.garbled(e))
    }

    /// The schema registered as `id` (whatever its subjects).
    pub async fn by_id(&self, id: u32) -> Result<Registered, RegistryError> {
        let path = format!("/schemas/ids/{id}");
        let body = self
            .send(self.http.get(self.at(&path)), &format!("schema id {id}"))
            .await?;
        let found: ById = serde_json::from_str(&body).map_err(|e| self.garbled(e))?;
        Ok(Registered {
            id,
            schema: found.schema,
            schema_type: found.schema_type,
        })
    }

    /// Registers `schema` under `subject` (the registry answers with the id it already has
    /// when the schema is there).
    pub async fn register(
        &self,
        subject: &str,
        schema: &str,
        schema_type: &str,
    ) -> Result<u32, RegistryError> {
        let path = format!("/subjects/{}/versions", encode(subject));
        let body = serde_json::json!({ "schema": schema, "schemaType": schema_type });
        let request = self
            .http
            .post(self.at(&path))
            .header(reqwest::header::CONTENT_TYPE, CONTENT_TYPE)
            .body(body.to_string());
        let answer = self.send(request, &format!("subject `{subject}`")).await?;
        serde_json::from_str::<IdOnly>(&answer)
            .map(|r| r.id)
            .map_err(|e| self.garbled(e))
    }

    /// Every subject (for `check`).
    pub async fn subjects(&self) -> Result<Vec<String>, RegistryError> {
        let body = self
            .send(self.http.get(self.at("/subjects")), "subject list")
            .await?;
        serde_json::from_str(&body).map_err(|e| self.garbled(e))
    }

    fn at(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    fn garbled(&self, e: serde_json::Error) -> RegistryError {
        RegistryError::Failed {
            status: 200,
            body: format!("unexpected answer: {e}"),
        }
    }

    /// Sends `request` with the current secret; after a 401 or 403, reads the secret file
    /// again and, when it changed (a rotated token), sends once more with the new one.
    async fn send(
        &self,
        request: reqwest::RequestBuilder,
        what: &str,
    ) -> Result<String, RegistryError> {
        let again = request.try_clone();
        let (mut status, mut body) = self.exchange(request).await?;
        if matches!(status, 401 | 403) && self.reread() {
            if let Some(again) = again {
                (status, body) = self.exchange(again).await?;
            }
        }
        match status {
            200..=299 => Ok(body),
            401 | 403 => Err(RegistryError::Unauthorized { status }),
            404 => Err(RegistryError::NotFound {
                what: what.to_string(),
                code: error_code(&body),
                body: shorten(&body),
            }),
            _ => Err(RegistryError::Failed {
                status,
                body: shorten(&body),
            }),
        }
    }
}

impl RegistryClient {
    /// One request with the secret in use: the status and the body.
    async fn exchange(
        &self,
        request: reqwest::RequestBuilder,
    ) -> Result<(u16, String), RegistryError> {
        let secret = self.secret();
        let request = match (&self.username, &secret) {
            (Some(user), secret) => request.basic_auth(user, secret.as_ref().map(Secret::expose)),
            (None, Some(token)) => request.bearer_auth(token.expose()),
            (None, None) => request,
        };
        let response = request
            .header(reqwest::header::ACCEPT, CONTENT_TYPE)
            .send()
            .await
            .map_err(|e| RegistryError::Unreachable {
                url: self.base.clone(),
                reason: error_chain(&e),
            })?;
        let status = response.status().as_u16();
        Ok((status, response.text().await.unwrap_or_default()))
    }
}

/// A subject in a URL path: `/` and the other reserved characters percent-encoded.
fn encode(subject: &str) -> String {
    let mut out = String::with_capacity(subject.len());
    for b in subject.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The `error_code` of a registry's error answer (`{"error_code":40401,"message":...}`).
fn error_code(body: &str) -> Option<u32> {
    #[derive(Deserialize)]
    struct Answer {
        error_code: u32,
    }
    serde_json::from_str::<Answer>(body)
        .ok()
        .map(|a| a.error_code)
}

fn shorten(body: &str) -> String {
    body.chars().take(300).collect()
}

/// The error and its causes on one line (reqwest's own message says only "error sending
/// request").
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_are_percent_encoded_in_paths() {
        assert_eq!(encode("orders-value"), "orders-value");
        assert_eq!(encode("dev.outbox.Order"), "dev.outbox.Order");
        assert_eq!(encode("a/b c"), "a%2Fb%20c");
    }

    #[test]
    fn only_a_404_with_the_registrys_own_code_is_a_missing_schema() {
        let not_found = |body: &str| RegistryError::NotFound {
            what: "subject `x`".into(),
            code: error_code(body),
            body: body.into(),
        };
        assert!(
            not_found(r#"{"error_code":40401,"message":"Subject 'x' not found."}"#)
                .is_missing_schema()
        );
        assert!(
            not_found(r#"{"error_code":40403,"message":"Schema 7 not found"}"#).is_missing_schema()
        );
        let html = not_found("<html>Not Found</html>");
        assert!(!html.is_missing_schema(), "a wrong URL blocks");
        assert!(html.to_string().contains("is registry_url"), "{html}");
        assert!(!RegistryError::Unauthorized { status: 401 }.is_missing_schema());
        assert!(!RegistryError::Failed {
            status: 503,
            body: String::new()
        }
        .is_missing_schema());
    }
}
