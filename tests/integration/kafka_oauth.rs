//! SASL OAUTHBEARER with OIDC client credentials (issue 22, done-when 1): the relay logs in to
//! the main broker's OAUTHBEARER listener (`OUTBOX_TEST_KAFKA_OAUTH_BROKERS`: Kafka's
//! unsecured-JWT validator, sessions ending with their token) with tokens from a token
//! endpoint this test runs, which issues unsecured JWTs (`alg: none`) of a few seconds.
//!
//! librdkafka fetches the tokens itself (`sasl.oauthbearer.method=oidc`) and a new one before
//! each expires; a token endpoint that refuses is a login failure (the authentication block:
//! `/readyz` red, `outbox_relay_kafka_blocked{reason="authentication"}`, a log line naming
//! `kafka.oauthbearer`), and the events wait for it to be fixed: none is lost or dead-lettered.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::common::probe::{free_port, http_get};
use crate::common::*;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine;

/// Lifetime of each token: librdkafka fetches the next at 80% of it, and the broker ends a
/// session whose token expired. Not shorter: a connection made with a token near its end
/// re-authenticates (KIP-368) at 90% of what is left, and the broker refuses a
/// re-authentication less than a second after the last one.
const TOKEN_LIFETIME: Duration = Duration::from_secs(10);
const CLIENT_ID: &str = "outbox-relay-test";
const CLIENT_SECRET: &str = "oauth-client-secret-4711";
const SCOPE: &str = "kafka.write";
const DELIVERY_TIMEOUT: Duration = Duration::from_secs(60);

/// The token endpoint: answers every POST with a fresh unsecured JWT, or 401 while refusing.
struct TokenEndpoint {
    port: u16,
    refusing: Arc<AtomicBool>,
    issued: Arc<AtomicUsize>,
    refused: Arc<AtomicUsize>,
    /// The last request's `Authorization` header and body.
    last_request: Arc<Mutex<Option<(String, String)>>>,
}

impl TokenEndpoint {
    fn start(refusing: bool) -> TokenEndpoint {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = TokenEndpoint {
            port: listener.local_addr().unwrap().port(),
            refusing: Arc::new(AtomicBool::new(refusing)),
            issued: Arc::default(),
            refused: Arc::default(),
            last_request: Arc::default(),
        };
        let (refusing, issued, refused, last) = (
            endpoint.refusing.clone(),
            endpoint.issued.clone(),
            endpoint.refused.clone(),
            endpoint.last_request.clone(),
        );
        // Serves one request at a time: librdkafka asks for one token at a time.
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let Some(request) = read_request(&stream) else {
                    continue;
                };
                *last.lock().unwrap() = Some(request);
                let response = if refusing.load(Ordering::SeqCst) {
                    refused.fetch_add(1, Ordering::SeqCst);
                    http_response("401 Unauthorized", r#"{"error":"invalid_client"}"#)
                } else {
                    issued.fetch_add(1, Ordering::SeqCst);
                    let body = format!(
                        r#"{{"access_token":"{}","token_type":"bearer","expires_in":{}}}"#,
                        unsecured_jwt(TOKEN_LIFETIME),
                        TOKEN_LIFETIME.as_secs()
                    );
                    http_response("200 OK", &body)
                };
                let _ = (&stream).write_all(response.as_bytes());
            }
        });
        endpoint
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/oauth2/token", self.port)
    }

    fn refuse(&self, refusing: bool) {
        self.refusing.store(refusing, Ordering::SeqCst);
    }

    fn issued(&self) -> usize {
        self.issued.load(Ordering::SeqCst)
    }

    fn refused(&self) -> usize {
        self.refused.load(Ordering::SeqCst)
    }
}

/// An unsecured JWT (RFC 7519 section 6: `alg: none`, empty signature) for the relay's
/// principal, expiring in `lifetime`.
fn unsecured_jwt(lifetime: Duration) -> String {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    let header = URL_SAFE_NO_PAD.encode(r#"{"alg":"none"}"#);
    let claims = format!(
        r#"{{"sub":"relay","iat":{},"exp":{},"scope":"{SCOPE}"}}"#,
        now.as_secs(),
        (now + lifetime).as_secs()
    );
    format!("{header}.{}.", URL_SAFE_NO_PAD.encode(claims))
}

/// The `Authorization` header and the body of one HTTP request.
fn read_request(stream: &TcpStream) -> Option<(String, String)> {
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    let mut reader = BufReader::new(stream);
    let (mut authorization, mut length) = (String::new(), 0);
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).ok()?;
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        let (name, value) = line.split_once(':').unwrap_or((line, ""));
        match name.to_ascii_lowercase().as_str() {
            "authorization" => authorization = value.trim().to_string(),
            "content-length" => length = value.trim().parse().unwrap_or(0),
            _ => {}
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).ok()?;
    Some((authorization, String::from_utf8_lossy(&body).into_owned()))
}

fn http_response(status: &str, body: &str) -> String {
    format!(
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

/// A relay logging in with OAUTHBEARER at `endpoint`, with its HTTP port.
struct Relay {
    process: RelayProcess,
    http: u16,
}

impl Relay {
    fn start(db: &TestDb, endpoint: &TokenEndpoint, secret_file: &Path, name: &str) -> Relay {
        let http = free_port();
        // The extensions are a table: the file carries them (with the rest from the environment).
        let config = write_config(
            &format!("{name}_{}", db.name),
            "[kafka.oauthbearer.extensions]\ntraceId = \"outbox-relay-test\"\n",
        );
        let env = with(
            db.relay_env(),
            &[
                ("OUTBOX_RELAY_CONFIG", config.to_str().unwrap()),
                (
                    "OUTBOX_RELAY__KAFKA__BROKERS",
                    &env("OUTBOX_TEST_KAFKA_OAUTH_BROKERS"),
                ),
                ("OUTBOX_RELAY__KAFKA__SECURITY_PROTOCOL", "sasl_plaintext"),
                ("OUTBOX_RELAY__KAFKA__SASL_MECHANISM", "OAUTHBEARER"),
                (
                    "OUTBOX_RELAY__KAFKA__OAUTHBEARER__TOKEN_ENDPOINT_URL",
                    &endpoint.url(),
                ),
                ("OUTBOX_RELAY__KAFKA__OAUTHBEARER__CLIENT_ID", CLIENT_ID),
                (
                    "OUTBOX_RELAY__KAFKA__OAUTHBEARER__CLIENT_SECRET_FILE",
                    secret_file.to_str().unwrap(),
                ),
                ("OUTBOX_RELAY__KAFKA__OAUTHBEARER__SCOPE", SCOPE),
                ("OUTBOX_RELAY__HTTP__LISTEN", &format!("127.0.0.1:{http}")),
            ],
        );
        Relay {
            process: RelayProcess::start(&env, &format!("{name}_{}", db.name)),
            http,
        }
    }

    fn assert_running(&mut self) {
        if let Some(status) = self.process.try_status() {
            panic!("relay exited with {status}:\n{}", self.process.log_text());
        }
    }

    fn metrics(&self) -> String {
        http_get(self.http, "/metrics")
            .map(|(_, body)| body)
            .unwrap_or_default()
    }

    fn metric(&self, name: &str) -> Option<f64> {
        self.metrics()
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.rsplit_once(' '))
            .and_then(|(_, v)| v.trim().parse().ok())
    }

    /// Waits until the relay reports the refused login: the authentication block, `/readyz`
    /// red, and a log line pointing at `kafka.oauthbearer`.
    async fn wait_login_refused(&mut self, timeout: Duration) {
        let began = Instant::now();
        loop {
            self.assert_running();
            let blocked = self.metrics().lines().any(|l| {
                l.starts_with("outbox_relay_kafka_blocked{")
                    && l.contains("reason=\"authentication\"")
                    && l.ends_with(" 1")
            });
            let ready = http_get(self.http, "/readyz").map(|(code, _)| code);
            let log = self.process.log_text();
            let named = log
                .lines()
                .any(|l| l.contains("authentication") && l.contains("kafka.oauthbearer"));
            if blocked && ready.is_some_and(|c| c != 200) && named {
                return;
            }
            assert!(
                began.elapsed() < timeout,
                "no refused login reported within {timeout:?} (blocked: {blocked}, /readyz: \
                 {ready:?}, log names kafka.oauthbearer: {named}):\n{log}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    fn stop(mut self) {
        let status = self.process.terminate(Duration::from_secs(30));
        assert!(
            status.success(),
            "relay exited with {status} on SIGTERM:\n{}",
            self.process.log_text()
        );
    }
}

fn secret_file() -> PathBuf {
    let path = std::env::temp_dir().join(random_name("oauth-secret"));
    std::fs::write(&path, format!("{CLIENT_SECRET}\n")).unwrap();
    path
}

fn batch(seq: usize, n: usize) -> Vec<Event> {
    (0..n)
        .map(|i| Event::new("order", "oauth", 0, seq * n + i))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tokens_of_a_few_seconds_are_refreshed_and_every_event_arrives() {
    let endpoint = TokenEndpoint::start(false);
    let secret = secret_file();
    let db = TestDb::new().await;
    db.create_slot().await;
    let mut relay = Relay::start(&db, &endpoint, &secret, "oauth_refresh");
    let mut client = db.client().await;
    // Written over two and a half token lifetimes: three refreshed tokens, each taking over a
    // session the broker would otherwise end.
    let mut events = Vec::new();
    let began = Instant::now();
    for seq in 0.. {
        relay.assert_running();
        let next = batch(seq, 20);
        insert_events(&mut client, &next, true).await;
        events.extend(next);
        if began.elapsed() > TOKEN_LIFETIME * 5 / 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    expect_all(
        "oauthbearer across token expiries",
        &[db.topic("order")],
        &events,
        DELIVERY_TIMEOUT,
        Duration::ZERO,
        &relay.process,
    )
    .await;
    let issued = endpoint.issued();
    assert!(
        issued >= 3,
        "only {issued} tokens issued in {:?}: librdkafka did not refresh before expiry",
        began.elapsed()
    );
    let (authorization, body) = endpoint.last_request.lock().unwrap().clone().unwrap();
    let basic = STANDARD.encode(format!("{CLIENT_ID}:{CLIENT_SECRET}"));
    assert_eq!(
        authorization,
        format!("Basic {basic}"),
        "client credentials"
    );
    assert!(
        body.contains("grant_type=client_credentials") && body.contains("scope=kafka.write"),
        "token request body: {body}"
    );
    let log = relay.process.log_text();
    assert!(
        !log.contains(CLIENT_SECRET),
        "the client secret reached the log"
    );
    assert!(
        !log.contains("Kafka refused the login"),
        "a login failed on the way:\n{log}"
    );
    relay.stop();
    let _ = std::fs::remove_file(secret);
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_refused_token_is_a_login_failure_and_no_event_is_lost() {
    let endpoint = TokenEndpoint::start(true);
    let secret = secret_file();
    let db = TestDb::new().await;
    db.create_slot().await;
    let mut relay = Relay::start(&db, &endpoint, &secret, "oauth_refused");
    let mut client = db.client().await;
    let mut events = batch(0, 30);
    insert_events(&mut client, &events, true).await;
    relay.wait_login_refused(Duration::from_secs(30)).await;
    assert!(endpoint.refused() > 0, "the token endpoint was never asked");
    // The identity provider is fixed: the waiting events go out (librdkafka asks again
    // within 10 s of a failure).
    endpoint.refuse(false);
    expect_all(
        "oauthbearer after a refused token",
        &[db.topic("order")],
        &events,
        DELIVERY_TIMEOUT,
        Duration::ZERO,
        &relay.process,
    )
    .await;
    // Refused again while a token is still valid: once it expires the broker ends the session
    // and the next login fails. The events wait, and arrive once tokens are issued again.
    endpoint.refuse(true);
    tokio::time::sleep(TOKEN_LIFETIME).await;
    let later = batch(1, 30);
    insert_events(&mut client, &later, true).await;
    relay.wait_login_refused(Duration::from_secs(40)).await;
    let early = read_ids(
        &[db.topic("order")],
        1,
        &later.iter().map(|e| e.id.clone()).collect::<Vec<_>>(),
        Duration::from_secs(3),
        Duration::ZERO,
    )
    .await;
    let through = tally(&later, &early);
    assert_eq!(
        through.missing.len(),
        later.len(),
        "events went out with an expired token: the broker does not end sessions at expiry, so \
         the refresh test would prove nothing"
    );
    endpoint.refuse(false);
    events.extend(later);
    expect_all(
        "oauthbearer after a second refusal",
        &[db.topic("order")],
        &events,
        DELIVERY_TIMEOUT,
        Duration::ZERO,
        &relay.process,
    )
    .await;
    assert_eq!(
        relay.metric("outbox_relay_events_dead_lettered_total"),
        Some(0.0),
        "an event was dead-lettered for a refused login"
    );
    relay.stop();
    let _ = std::fs::remove_file(secret);
    db.cleanup().await;
}
