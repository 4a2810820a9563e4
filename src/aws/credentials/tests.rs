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
            provider.settle();
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
    provider.settle();
    assert_eq!(*calls.lock().unwrap(), 2, "the refresh was tried");
    assert_eq!(
        provider.credentials().unwrap().credentials.access_key_id,
        "ASIAECS",
        "still valid after the failed refresh"
    );
}

fn assume_role_xml(expiration: &str) -> String {
    format!(
        "<AssumeRoleResponse xmlns=\"https://sts.amazonaws.com/doc/2011-06-15/\"><AssumeRoleResult>\
         <Credentials><AccessKeyId>ASIAROLE</AccessKeyId><SecretAccessKey>role/secret</SecretAccessKey>\
         <SessionToken>role-session</SessionToken><Expiration>{expiration}</Expiration></Credentials>\
         <AssumedRoleUser><Arn>arn:aws:sts::123456789012:assumed-role/relay/relay-test</Arn></AssumedRoleUser>\
         </AssumeRoleResult></AssumeRoleResponse>"
    )
}

/// A config file with a role profile `relay` whose source is `base`'s static keys.
fn role_profiles(name: &str, relay: &str) -> PathBuf {
    let dir = temp_dir(name);
    let config = dir.join("config");
    std::fs::write(
        &config,
        format!(
            "[profile base]\naws_access_key_id = AKIDBASE\naws_secret_access_key = base/secret\n\
             [profile relay]\n{relay}\n"
        ),
    )
    .unwrap();
    config
}

const ROLE: &str = "role_arn = arn:aws:iam::123456789012:role/relay\nsource_profile = base\n\
                    role_session_name = relay-test\nexternal_id = ext/1\nregion = eu-west-1";

/// SigV4 recomputed here from what the stand-in received, apart from the relay's signer:
/// the canonical query is the request's own parameters but the signature, sorted.
fn expected_signature(seen: &Seen, secret: &str) -> (String, String) {
    let hmac = |key: &[u8], data: &str| {
        let key = openssl::pkey::PKey::hmac(key).unwrap();
        let mut signer =
            openssl::sign::Signer::new(openssl::hash::MessageDigest::sha256(), &key).unwrap();
        signer.update(data.as_bytes()).unwrap();
        signer.sign_to_vec().unwrap()
    };
    let query = seen.path.strip_prefix("/?").expect("a query on /");
    let mut pairs: Vec<(&str, &str)> = query
        .split('&')
        .map(|p| p.split_once('=').unwrap())
        .collect();
    let signature = pairs
        .iter()
        .find(|(k, _)| *k == "X-Amz-Signature")
        .expect("signed")
        .1
        .to_string();
    pairs.retain(|(k, _)| *k != "X-Amz-Signature");
    pairs.sort();
    let canonical_query: Vec<String> = pairs.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let amz_date = pairs.iter().find(|(k, _)| *k == "X-Amz-Date").unwrap().1;
    let host = seen.header("host").unwrap();
    let canonical = format!(
        "GET\n/\n{}\nhost:{host}\n\nhost\n{}",
        canonical_query.join("&"),
        hex::encode(openssl::sha::sha256(b""))
    );
    let scope = format!("{}/eu-west-1/sts/aws4_request", &amz_date[..8]);
    let to_sign = format!(
        "AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{}",
        hex::encode(openssl::sha::sha256(canonical.as_bytes()))
    );
    let mut key = hmac(format!("AWS4{secret}").as_bytes(), &amz_date[..8]);
    for part in ["eu-west-1", "sts", "aws4_request"] {
        key = hmac(&key, part);
    }
    (signature, hex::encode(hmac(&key, &to_sign)))
}

#[test]
fn a_role_profile_assumes_its_role_at_sts_signed_with_the_source_profiles_keys() {
    let sts = StandIn::start(|_| (200, assume_role_xml(&in_an_hour())));
    let config = role_profiles("role", ROLE);
    let provider = CredentialsProvider::new(env(&[
        ("AWS_CONFIG_FILE", config.to_str().unwrap()),
        ("AWS_PROFILE", "relay"),
        ("AWS_ENDPOINT_URL_STS", sts.url.as_str()),
    ]));
    for _ in 0..3 {
        let found = provider.credentials().unwrap();
        assert_eq!(
            found.credentials,
            AwsCredentials::new("ASIAROLE", "role/secret", Some("role-session"))
        );
        assert_eq!(found.from, "a profile's role_arn");
        assert!(found.expires.is_some());
    }
    let seen = sts.seen();
    assert_eq!(seen.len(), 1, "asked once, then cached until near expiry");
    let request = &seen[0];
    assert_eq!(request.method, "GET");
    for part in [
        "Action=AssumeRole",
        "Version=2011-06-15",
        "RoleArn=arn%3Aaws%3Aiam%3A%3A123456789012%3Arole%2Frelay",
        "RoleSessionName=relay-test",
        "ExternalId=ext%2F1",
        "X-Amz-Algorithm=AWS4-HMAC-SHA256",
        "X-Amz-SignedHeaders=host",
    ] {
        assert!(request.path.contains(part), "{part} in {}", request.path);
    }
    assert!(
        request.path.contains("X-Amz-Credential=AKIDBASE%2F"),
        "signed with the source profile's key: {}",
        request.path
    );
    assert_eq!(
        request.header("host"),
        sts.url.strip_prefix("http://"),
        "the Host signed is the one sent"
    );
    let (sent, expected) = expected_signature(request, "base/secret");
    assert_eq!(sent, expected, "SigV4 recomputed from the request");
    let (_, other_secret) = expected_signature(request, "another secret");
    assert_ne!(sent, other_secret, "the check can fail");
}

#[test]
fn sts_refusing_the_role_names_the_profile_and_the_role() {
    let sts = StandIn::start(|_| {
        (
            403,
            "<ErrorResponse><Error><Code>AccessDenied</Code><Message>not authorized to perform \
             sts:AssumeRole</Message></Error></ErrorResponse>"
                .into(),
        )
    });
    let config = role_profiles("role-refused", ROLE);
    let err = resolve_now(&env(&[
        ("AWS_CONFIG_FILE", config.to_str().unwrap()),
        ("AWS_PROFILE", "relay"),
        ("AWS_ENDPOINT_URL_STS", sts.url.as_str()),
    ]))
    .unwrap_err()
    .to_string();
    for part in [
        "profile `relay`",
        "arn:aws:iam::123456789012:role/relay",
        "403",
        "not authorized to perform sts:AssumeRole",
        "trust policy",
    ] {
        assert!(err.contains(part), "{part}: {err}");
    }
}

#[test]
fn role_profiles_the_relay_cannot_follow_are_refused_with_the_reason() {
    for (name, relay, expect) in [
        (
            "no-source",
            "role_arn = arn:aws:iam::1:role/r",
            "without source_profile",
        ),
        (
            "absent-source",
            "role_arn = arn:aws:iam::1:role/r\nsource_profile = absent",
            "source_profile `absent` is in neither",
        ),
        (
            "mfa",
            "role_arn = arn:aws:iam::1:role/r\nsource_profile = base\nmfa_serial = arn:aws:iam::1:mfa/u",
            "mfa_serial",
        ),
        (
            "duration",
            "role_arn = arn:aws:iam::1:role/r\nsource_profile = base\nduration_seconds = an hour",
            "duration_seconds `an hour`",
        ),
    ] {
        let config = role_profiles(name, relay);
        let err = resolve_now(&env(&[
            ("AWS_CONFIG_FILE", config.to_str().unwrap()),
            ("AWS_PROFILE", "relay"),
        ]))
        .unwrap_err()
        .to_string();
        assert!(err.contains(expect), "{name}: {err}");
    }
}
