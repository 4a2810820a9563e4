//! Each source against a stand-in on 127.0.0.1 (STS, ECS, instance metadata) or files in a
//! temporary directory; the chain's order; the cache's expiry-driven refresh.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use jiff::{SignedDuration, Timestamp};

use super::*;

/// One request as the stand-in saw it.
#[derive(Debug, Clone)]
struct Seen {
    method: String,
    path: String,
    headers: Vec<(String, String)>,
    body: String,
}

impl Seen {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// An HTTP/1.1 server answering each request with `answer(request)`: (status, body).
struct StandIn {
    url: String,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl StandIn {
    fn start(answer: impl Fn(&Seen) -> (u16, String) + Send + 'static) -> StandIn {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let log = seen.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let mut reader = BufReader::new(&stream);
                let mut line = String::new();
                if reader.read_line(&mut line).is_err() {
                    continue;
                }
                let mut parts = line.split_whitespace();
                let (method, path) = (
                    parts.next().unwrap_or("").to_string(),
                    parts.next().unwrap_or("").to_string(),
                );
                let mut headers = Vec::new();
                loop {
                    let mut header = String::new();
                    if reader.read_line(&mut header).unwrap_or(0) == 0 || header.trim().is_empty() {
                        break;
                    }
                    if let Some((k, v)) = header.trim().split_once(':') {
                        headers.push((k.trim().to_string(), v.trim().to_string()));
                    }
                }
                let length: usize = headers
                    .iter()
                    .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
                    .and_then(|(_, v)| v.parse().ok())
                    .unwrap_or(0);
                let mut body = vec![0; length];
                let _ = reader.read_exact(&mut body);
                let request = Seen {
                    method,
                    path,
                    headers,
                    body: String::from_utf8_lossy(&body).into_owned(),
                };
                let (status, body) = answer(&request);
                log.lock().unwrap().push(request);
                let response = format!(
                    "HTTP/1.1 {status} X\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = (&stream).write_all(response.as_bytes());
            }
        });
        StandIn { url, seen }
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("aws-creds-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn in_an_hour() -> String {
    (Timestamp::now() + SignedDuration::from_hours(1)).to_string()
}

fn resolve_now(env: &Env) -> Result<Fetched, CredentialsError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(resolve(env))
}

/// No instance metadata (tests must not wait for 169.254.169.254), no HOME profile.
const ISOLATED: [(&str, &str); 2] = [
    ("AWS_EC2_METADATA_DISABLED", "true"),
    ("HOME", "/nonexistent"),
];

fn env(pairs: &[(&str, &str)]) -> Env {
    Env::from_pairs(ISOLATED.iter().copied().chain(pairs.iter().copied()))
}

fn sts_xml(expiration: &str) -> String {
    format!(
        "<AssumeRoleWithWebIdentityResponse xmlns=\"https://sts.amazonaws.com/doc/2011-06-15/\">\
         <AssumeRoleWithWebIdentityResult><Credentials><AccessKeyId>ASIAWEBID</AccessKeyId>\
         <SecretAccessKey>web/secret</SecretAccessKey><SessionToken>web+session&amp;token=</SessionToken>\
         <Expiration>{expiration}</Expiration></Credentials></AssumeRoleWithWebIdentityResult>\
         </AssumeRoleWithWebIdentityResponse>"
    )
}

fn json_credentials(id: &str, expiration: &str) -> String {
    format!(
        r#"{{"Code":"Success","AccessKeyId":"{id}","SecretAccessKey":"s3cret","Token":"tok-{id}","Expiration":"{expiration}"}}"#
    )
}

#[test]
fn environment_keys_come_first_and_half_a_pair_is_an_error() {
    let found = resolve_now(&env(&[
        ("AWS_ACCESS_KEY_ID", "AKIDENV"),
        ("AWS_SECRET_ACCESS_KEY", "envsecret"),
        ("AWS_SESSION_TOKEN", "envtoken"),
    ]))
    .unwrap();
    assert_eq!(found.from, "environment");
    assert_eq!(
        found.credentials,
        AwsCredentials::new("AKIDENV", "envsecret", Some("envtoken"))
    );
    assert_eq!(found.expires, None);
    let err = resolve_now(&env(&[("AWS_ACCESS_KEY_ID", "AKIDENV")])).unwrap_err();
    assert!(err.to_string().contains("environment"), "{err}");
}

#[test]
fn web_identity_posts_the_token_to_sts_unsigned() {
    let expiration = in_an_hour();
    let answer = sts_xml(&expiration);
    let sts = StandIn::start(move |_| (200, answer.clone()));
    let dir = temp_dir("web-identity");
    let token_file = dir.join("token");
    std::fs::write(&token_file, "eyJhbGciOiJSUzI1NiJ9.jwt.sig\n").unwrap();
    let env = env(&[
        ("AWS_WEB_IDENTITY_TOKEN_FILE", token_file.to_str().unwrap()),
        ("AWS_ROLE_ARN", "arn:aws:iam::123456789012:role/relay"),
        ("AWS_ROLE_SESSION_NAME", "relay-pod"),
        ("AWS_ENDPOINT_URL_STS", &sts.url),
    ]);
    let found = resolve_now(&env).unwrap();
    assert_eq!(found.from, "web identity");
    assert_eq!(
        found.credentials,
        AwsCredentials::new("ASIAWEBID", "web/secret", Some("web+session&token="))
    );
    assert_eq!(found.expires, Some(expiration.parse().unwrap()));
    let request = &sts.seen()[0];
    assert_eq!(request.method, "POST");
    assert_eq!(
        request.header("Authorization"),
        None,
        "AssumeRoleWithWebIdentity is unsigned"
    );
    for field in [
        "Action=AssumeRoleWithWebIdentity",
        "Version=2011-06-15",
        "RoleArn=arn%3Aaws%3Aiam%3A%3A123456789012%3Arole%2Frelay",
        "RoleSessionName=relay-pod",
        "WebIdentityToken=eyJhbGciOiJSUzI1NiJ9.jwt.sig",
    ] {
        assert!(
            request.body.split('&').any(|f| f == field),
            "{field} in {}",
            request.body
        );
    }
}

#[test]
fn sts_refusing_the_role_names_web_identity_and_does_not_fall_through() {
    let sts = StandIn::start(|_| {
        (403, "<ErrorResponse><Error><Code>AccessDenied</Code><Message>Not authorized to perform sts:AssumeRoleWithWebIdentity</Message></Error></ErrorResponse>".into())
    });
    let dir = temp_dir("web-identity-refused");
    std::fs::write(dir.join("token"), "jwt").unwrap();
    std::fs::write(
        dir.join("credentials"),
        "[default]\naws_access_key_id = AKIDFILE\naws_secret_access_key = s\n",
    )
    .unwrap();
    let err = resolve_now(&env(&[
        (
            "AWS_WEB_IDENTITY_TOKEN_FILE",
            dir.join("token").to_str().unwrap(),
        ),
        ("AWS_ROLE_ARN", "arn:aws:iam::1:role/r"),
        ("AWS_ENDPOINT_URL", &sts.url),
        (
            "AWS_SHARED_CREDENTIALS_FILE",
            dir.join("credentials").to_str().unwrap(),
        ),
    ]))
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("web identity")
            && err.contains("AccessDenied")
            && err.contains("trust policy"),
        "{err}"
    );
    let missing = resolve_now(&env(&[
        ("AWS_WEB_IDENTITY_TOKEN_FILE", "/nonexistent/token"),
        ("AWS_ROLE_ARN", "arn:aws:iam::1:role/r"),
    ]))
    .unwrap_err()
    .to_string();
    assert!(missing.contains("/nonexistent/token"), "{missing}");
}

#[test]
fn profile_files_give_static_keys_credentials_file_first() {
    let dir = temp_dir("profile");
    let credentials = dir.join("credentials");
    let config = dir.join("config");
    std::fs::write(
        &credentials,
        "# comment\n[default]\naws_access_key_id = AKIDDEFAULT\naws_secret_access_key = d\n\n[relay]\naws_secret_access_key = from-credentials\n",
    )
    .unwrap();
    std::fs::write(
        &config,
        "[default]\nregion = eu-west-1\n[profile relay]\naws_access_key_id = AKIDRELAY\naws_secret_access_key = from-config\naws_session_token = cfgtoken\n[profile sso]\nsso_session = corp\n",
    )
    .unwrap();
    let files = [
        ("AWS_SHARED_CREDENTIALS_FILE", credentials.to_str().unwrap()),
        ("AWS_CONFIG_FILE", config.to_str().unwrap()),
    ];
    let found = resolve_now(&env(&files)).unwrap();
    assert_eq!(
        found.credentials,
        AwsCredentials::new("AKIDDEFAULT", "d", None)
    );
    let named: Vec<_> = files
        .iter()
        .copied()
        .chain([("AWS_PROFILE", "relay")])
        .collect();
    let found = resolve_now(&env(&named)).unwrap();
    assert_eq!(found.from, "the shared profile files");
    assert_eq!(
        found.credentials,
        AwsCredentials::new("AKIDRELAY", "from-credentials", Some("cfgtoken"))
    );
    let sso: Vec<_> = files
        .iter()
        .copied()
        .chain([("AWS_PROFILE", "sso")])
        .collect();
    let err = resolve_now(&env(&sso)).unwrap_err().to_string();
    assert!(
        err.contains("profile `sso`") && err.contains("SSO"),
        "{err}"
    );
    let absent: Vec<_> = files
        .iter()
        .copied()
        .chain([("AWS_PROFILE", "absent")])
        .collect();
    let err = resolve_now(&env(&absent)).unwrap_err().to_string();
    assert!(err.contains("AWS_PROFILE `absent`"), "{err}");
    // HOME's ~/.aws is the default place.
    let home = temp_dir("home");
    std::fs::create_dir_all(home.join(".aws")).unwrap();
    std::fs::copy(&credentials, home.join(".aws/credentials")).unwrap();
    let found = resolve_now(&Env::from_pairs([
        ("AWS_EC2_METADATA_DISABLED", "true"),
        ("HOME", home.to_str().unwrap()),
    ]))
    .unwrap();
    assert_eq!(found.credentials.access_key_id, "AKIDDEFAULT");
}

#[test]
fn container_credentials_send_the_authorization_token() {
    let expiration = in_an_hour();
    let answer = json_credentials("ASIAECS", &expiration);
    let ecs = StandIn::start(move |_| (200, answer.clone()));
    let dir = temp_dir("ecs");
    std::fs::write(dir.join("token"), "pod-identity-token\n").unwrap();
    let full = format!("{}/v2/credentials/abc", ecs.url);
    let found = resolve_now(&env(&[
        ("AWS_CONTAINER_CREDENTIALS_FULL_URI", &full),
        (
            "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE",
            dir.join("token").to_str().unwrap(),
        ),
    ]))
    .unwrap();
    assert_eq!(found.from, "ECS container credentials");
    assert_eq!(
        found.credentials,
        AwsCredentials::new("ASIAECS", "s3cret", Some("tok-ASIAECS"))
    );
    assert_eq!(found.expires, Some(expiration.parse().unwrap()));
    let request = &ecs.seen()[0];
    assert_eq!(
        (request.method.as_str(), request.path.as_str()),
        ("GET", "/v2/credentials/abc")
    );
    assert_eq!(request.header("Authorization"), Some("pod-identity-token"));
    let err = resolve_now(&env(&[(
        "AWS_CONTAINER_CREDENTIALS_FULL_URI",
        "http://example.com/creds",
    )]))
    .unwrap_err()
    .to_string();
    assert!(err.contains("ECS") && err.contains("loopback"), "{err}");
}

/// IMDSv2 as EC2 serves it: PUT for a session token, then the role and its credentials,
/// each GET carrying the token.
fn imds_stand_in() -> StandIn {
    let expiration = in_an_hour();
    StandIn::start(move |request| {
        let token_ok = request.header("X-aws-ec2-metadata-token") == Some("imds-session");
        match (request.method.as_str(), request.path.as_str()) {
            ("PUT", "/latest/api/token")
                if request
                    .header("X-aws-ec2-metadata-token-ttl-seconds")
                    .is_some() =>
            {
                (200, "imds-session".into())
            }
            ("GET", "/latest/meta-data/iam/security-credentials/") if token_ok => {
                (200, "relay-role\n".into())
            }
            ("GET", "/latest/meta-data/iam/security-credentials/relay-role") if token_ok => {
                (200, json_credentials("ASIAIMDS", &expiration))
            }
            _ => (401, String::new()),
        }
    })
}

#[test]
fn instance_metadata_uses_imdsv2_session_tokens() {
    let imds = imds_stand_in();
    let found = resolve_now(&Env::from_pairs([
        ("HOME", "/nonexistent"),
        ("AWS_EC2_METADATA_SERVICE_ENDPOINT", imds.url.as_str()),
    ]))
    .unwrap();
    assert_eq!(found.from, "EC2 instance metadata");
    assert_eq!(
        found.credentials,
        AwsCredentials::new("ASIAIMDS", "s3cret", Some("tok-ASIAIMDS"))
    );
    let calls: Vec<(String, String)> = imds
        .seen()
        .into_iter()
        .map(|s| (s.method, s.path))
        .collect();
    assert_eq!(calls.len(), 3, "{calls:?}");
    // Disabled, or nothing listening: not found, with every source named.
    let closed = TcpListener::bind("127.0.0.1:0").unwrap();
    let closed_url = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    for env in [
        env(&[("AWS_EC2_METADATA_SERVICE_ENDPOINT", imds.url.as_str())]),
        Env::from_pairs([
            ("HOME", "/nonexistent"),
            ("AWS_EC2_METADATA_SERVICE_ENDPOINT", closed_url.as_str()),
        ]),
    ] {
        let err = resolve_now(&env).unwrap_err();
        assert!(matches!(err, CredentialsError::NotFound { .. }), "{err}");
        let text = err.to_string();
        for source in [
            "AWS_ACCESS_KEY_ID",
            "AWS_WEB_IDENTITY_TOKEN_FILE",
            "profile `default`",
            "AWS_CONTAINER_CREDENTIALS",
            "EC2 instance metadata",
        ] {
            assert!(text.contains(source), "{source} in {text}");
        }
    }
}

#[test]
fn the_chain_takes_the_first_source_set_up_in_aws_order() {
    let sts_answer = sts_xml(&in_an_hour());
    let sts = StandIn::start(move |_| (200, sts_answer.clone()));
    let ecs_answer = json_credentials("ASIAECS", &in_an_hour());
    let ecs = StandIn::start(move |_| (200, ecs_answer.clone()));
    let imds = imds_stand_in();
    let dir = temp_dir("order");
    std::fs::write(dir.join("token"), "jwt").unwrap();
    std::fs::write(
        dir.join("credentials"),
        "[default]\naws_access_key_id = AKIDFILE\naws_secret_access_key = f\n",
    )
    .unwrap();
    let ecs_uri = format!("{}/creds", ecs.url);
    let token_file = dir.join("token");
    let credentials_file = dir.join("credentials");
    let sources: Vec<(&str, Vec<(&str, &str)>)> = vec![
        (
            "environment",
            vec![
                ("AWS_ACCESS_KEY_ID", "AKIDENV"),
                ("AWS_SECRET_ACCESS_KEY", "e"),
            ],
        ),
        (
            "web identity",
            vec![
                ("AWS_WEB_IDENTITY_TOKEN_FILE", token_file.to_str().unwrap()),
                ("AWS_ROLE_ARN", "arn:aws:iam::1:role/r"),
                ("AWS_ENDPOINT_URL_STS", sts.url.as_str()),
            ],
        ),
        (
            "the shared profile files",
            vec![(
                "AWS_SHARED_CREDENTIALS_FILE",
                credentials_file.to_str().unwrap(),
            )],
        ),
        (
            "ECS container credentials",
            vec![("AWS_CONTAINER_CREDENTIALS_FULL_URI", ecs_uri.as_str())],
        ),
        (
            "EC2 instance metadata",
            vec![("AWS_EC2_METADATA_SERVICE_ENDPOINT", imds.url.as_str())],
        ),
    ];
    // With sources 0..n all set up, source `first` answers once those before it are gone.
    for first in 0..sources.len() {
        let mut pairs = vec![("HOME", "/nonexistent")];
        for (_, vars) in &sources[first..] {
            pairs.extend(vars.iter().copied());
        }
        let found = resolve_now(&Env::from_pairs(pairs)).unwrap();
        assert_eq!(found.from, sources[first].0);
    }
}

#[test]
fn cached_credentials_are_fetched_again_near_their_expiry() {
    // Expiring inside REFRESH_BEFORE_EXPIRY: every call fetches; an hour away: one fetch.
    for (lifetime, fetches) in [
        (SignedDuration::from_mins(2), 3),
        (SignedDuration::from_hours(1), 1),
    ] {
        let ecs = StandIn::start(move |_| {
            (
                200,
                json_credentials("ASIAECS", &(Timestamp::now() + lifetime).to_string()),
            )
        });
        let uri = format!("{}/creds", ecs.url);
        let provider =
            CredentialsProvider::new(env(&[("AWS_CONTAINER_CREDENTIALS_FULL_URI", uri.as_str())]));
        for _ in 0..3 {
            assert_eq!(
                provider.credentials().unwrap().credentials.access_key_id,
                "ASIAECS"
            );
        }
        assert_eq!(ecs.seen().len(), fetches, "lifetime {lifetime}");
    }
}

#[test]
fn a_failed_refresh_keeps_credentials_that_are_still_valid() {
    let calls = Arc::new(Mutex::new(0));
    let counter = calls.clone();
    let ecs = StandIn::start(move |_| {
        let mut n = counter.lock().unwrap();
        *n += 1;
        match *n {
            1 => (
                200,
                json_credentials(
                    "ASIAECS",
                    &(Timestamp::now() + SignedDuration::from_mins(2)).to_string(),
                ),
            ),
            _ => (500, "unavailable".into()),
        }
    });
    let uri = format!("{}/creds", ecs.url);
    let provider =
        CredentialsProvider::new(env(&[("AWS_CONTAINER_CREDENTIALS_FULL_URI", uri.as_str())]));
    assert!(provider.credentials().is_ok());
    assert_eq!(
        provider.credentials().unwrap().credentials.access_key_id,
        "ASIAECS"
    );
    assert_eq!(*calls.lock().unwrap(), 2, "the refresh was tried");
}
