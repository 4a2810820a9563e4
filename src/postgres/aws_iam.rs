//! RDS / Aurora IAM database authentication (`postgres.auth = "aws_rds_iam"`): the password is
//! an authentication token, a SigV4-presigned `connect` request for the host, port and user,
//! valid 15 minutes for opening connections. It is made afresh for every connection, from
//! the credentials in the environment, so a reconnect never presents an expired one.
//!
//! The signing follows AWS Signature Version 4 (query-string form), with HMAC-SHA256 and
//! SHA-256 from OpenSSL, which the relay links already.

use std::fmt;

use jiff::Timestamp;
use openssl::hash::MessageDigest;
use openssl::pkey::PKey;
use openssl::sign::Signer;
use tokio_postgres::config::Host;

use crate::config::{PostgresAuth, PostgresConfig};
use crate::postgres::conninfo::Endpoint;

/// How long a token may be used to open a connection (RDS accepts at most 15 minutes).
const TOKEN_LIFETIME_S: u32 = 900;
const SERVICE: &str = "rds-db";

/// AWS credentials: an access key and, for temporary ones, the session token.
#[derive(Clone, PartialEq, Eq)]
pub struct AwsCredentials {
    pub access_key_id: String,
    pub secret_access_key: String,
    pub session_token: Option<String>,
}

impl fmt::Debug for AwsCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AwsCredentials")
            .field("access_key_id", &self.access_key_id)
            .finish_non_exhaustive()
    }
}

impl AwsCredentials {
    /// `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY` and `AWS_SESSION_TOKEN` (optional), as
    /// every AWS SDK reads them first.
    pub fn from_env() -> Result<AwsCredentials, String> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        match (var("AWS_ACCESS_KEY_ID"), var("AWS_SECRET_ACCESS_KEY")) {
            (Some(access_key_id), Some(secret_access_key)) => Ok(AwsCredentials {
                access_key_id,
                secret_access_key,
                session_token: var("AWS_SESSION_TOKEN"),
            }),
            _ => Err(
                "postgres.auth = \"aws_rds_iam\" needs AWS credentials in the environment: \
                 AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN for temporary \
                 ones)"
                    .into(),
            ),
        }
    }
}

/// What a token is made for: the server as the client names it, the user and the region.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenRequest<'a> {
    pub host: &'a str,
    pub port: u16,
    pub user: &'a str,
    pub region: &'a str,
}

/// `postgres.auth = "aws_rds_iam"`, resolved (at each session): the credentials and the
/// regions that may apply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RdsIamAuth {
    credentials: AwsCredentials,
    configured_region: Option<String>,
    env_region: Option<String>,
}

impl RdsIamAuth {
    /// `None` unless `pg.auth` asks for IAM tokens.
    pub fn from_config(pg: &PostgresConfig) -> Result<Option<RdsIamAuth>, String> {
        if pg.auth != PostgresAuth::AwsRdsIam {
            return Ok(None);
        }
        let env_region = ["AWS_REGION", "AWS_DEFAULT_REGION"]
            .iter()
            .find_map(|name| std::env::var(name).ok().filter(|v| !v.trim().is_empty()));
        Ok(Some(RdsIamAuth {
            credentials: AwsCredentials::from_env()?,
            configured_region: pg.aws_region.clone(),
            env_region,
        }))
    }

    /// The region tokens for `host` are signed for: `postgres.aws_region`, else the host
    /// name's, else `AWS_REGION` / `AWS_DEFAULT_REGION`.
    fn region_for<'a>(&'a self, host: &'a str) -> Option<&'a str> {
        self.configured_region
            .as_deref()
            .or_else(|| region_of_host(host))
            .or(self.env_region.as_deref())
    }

    /// Fails unless every host can have a token: a TCP host with a known region.
    pub fn check_hosts(&self, endpoints: &[Endpoint]) -> Result<(), String> {
        for endpoint in endpoints {
            let Host::Tcp(host) = &endpoint.host else {
                return Err(
                    "postgres.auth = \"aws_rds_iam\" needs a TCP host, not a socket directory"
                        .into(),
                );
            };
            if self.region_for(host).is_none() {
                return Err(format!(
                    "postgres.auth = \"aws_rds_iam\": no AWS region for host `{host}` (not an \
                     …<region>.rds.amazonaws.com name): set postgres.aws_region or AWS_REGION"
                ));
            }
        }
        Ok(())
    }

    /// A fresh token for `user` at `endpoint`, signed now; `None` for a host
    /// [`RdsIamAuth::check_hosts`] refuses.
    pub fn token(&self, endpoint: &Endpoint, user: &str) -> Option<String> {
        let Host::Tcp(host) = &endpoint.host else {
            return None;
        };
        let request = TokenRequest {
            host,
            port: endpoint.port,
            user,
            region: self.region_for(host)?,
        };
        Some(auth_token(&request, &self.credentials, Timestamp::now()))
    }
}

/// The region of an RDS / Aurora / RDS Proxy endpoint name: the label before
/// `rds.amazonaws.com` (`db.abc.eu-west-1.rds.amazonaws.com` → `eu-west-1`).
pub fn region_of_host(host: &str) -> Option<&str> {
    let labels: Vec<&str> = host.trim_end_matches('.').split('.').collect();
    let rds = labels
        .windows(3)
        .position(|w| w[1] == "rds" && w[2] == "amazonaws")?;
    Some(labels[rds]).filter(|region| !region.is_empty())
}

/// The authentication token for `request`, signed at `now` (the password to send).
pub fn auth_token(
    request: &TokenRequest<'_>,
    credentials: &AwsCredentials,
    now: Timestamp,
) -> String {
    let amz_date = now.strftime("%Y%m%dT%H%M%SZ").to_string();
    let date = &amz_date[..8];
    let scope = format!("{date}/{}/{SERVICE}/aws4_request", request.region);
    let mut query = vec![
        ("Action", "connect".to_string()),
        ("DBUser", request.user.to_string()),
        ("X-Amz-Algorithm", "AWS4-HMAC-SHA256".to_string()),
        (
            "X-Amz-Credential",
            format!("{}/{scope}", credentials.access_key_id),
        ),
        ("X-Amz-Date", amz_date.clone()),
        ("X-Amz-Expires", TOKEN_LIFETIME_S.to_string()),
        ("X-Amz-SignedHeaders", "host".to_string()),
    ];
    if let Some(token) = &credentials.session_token {
        query.push(("X-Amz-Security-Token", token.clone()));
    }
    query.sort();
    let query: Vec<String> = query
        .iter()
        .map(|(key, value)| format!("{}={}", uri_encode(key), uri_encode(value)))
        .collect();
    let query = query.join("&");
    let host = format!("{}:{}", request.host, request.port);
    let canonical_request = format!(
        "GET\n/\n{query}\nhost:{host}\n\nhost\n{}",
        hex::encode(openssl::sha::sha256(b""))
    );
    let string_to_sign = format!(
        "AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{}",
        hex::encode(openssl::sha::sha256(canonical_request.as_bytes()))
    );
    let key = signing_key(
        &credentials.secret_access_key,
        date,
        request.region,
        SERVICE,
    );
    let signature = hex::encode(hmac(&key, string_to_sign.as_bytes()));
    format!("{host}/?{query}&X-Amz-Signature={signature}")
}

/// SigV4's derived key: the secret, then the date, region, service and `aws4_request`.
fn signing_key(secret: &str, date: &str, region: &str, service: &str) -> Vec<u8> {
    let mut key = hmac(format!("AWS4{secret}").as_bytes(), date.as_bytes());
    for part in [region, service, "aws4_request"] {
        key = hmac(&key, part.as_bytes());
    }
    key
}

fn hmac(key: &[u8], data: &[u8]) -> Vec<u8> {
    // HMAC-SHA256 takes any key and message: OpenSSL fails here only without memory.
    let key = PKey::hmac(key).expect("an HMAC key");
    let mut signer = Signer::new(MessageDigest::sha256(), &key).expect("an HMAC-SHA256 signer");
    signer.update(data).expect("HMAC update");
    signer.sign_to_vec().expect("HMAC result")
}

/// SigV4's URI encoding: every byte but `A-Z a-z 0-9 - _ . ~` as `%XX` (upper-case hex).
fn uri_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-_.~".contains(&byte) {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY";

    fn at(text: &str) -> Timestamp {
        text.parse().unwrap()
    }

    /// AWS's published example of the derived signing key ("Signature Version 4: examples of
    /// how to derive a signing key": 20120215, us-east-1, iam).
    #[test]
    fn signing_key_matches_aws_published_example() {
        let key = signing_key(SECRET, "20120215", "us-east-1", "iam");
        assert_eq!(
            hex::encode(key),
            "f4780e2d9f65fa895f9c67b32ce1baf0b0d8a43505a000a1a9e090d414db404d"
        );
    }

    // The expected tokens were computed independently with Python's hmac and hashlib:
    //
    //   def h(k, m): return hmac.new(k, m.encode(), hashlib.sha256).digest()
    //   q = {"Action": "connect", "DBUser": user, "X-Amz-Algorithm": "AWS4-HMAC-SHA256",
    //        "X-Amz-Credential": f"{akid}/{date}/{region}/rds-db/aws4_request",
    //        "X-Amz-Date": amzdate, "X-Amz-Expires": "900", "X-Amz-SignedHeaders": "host"}
    //   (plus "X-Amz-Security-Token" when given)
    //   enc = lambda s: urllib.parse.quote(s, safe="-_.~")
    //   cq = "&".join(f"{enc(k)}={enc(v)}" for k, v in sorted(q.items()))
    //   creq = "\n".join(["GET", "/", cq, f"host:{host}:{port}", "", "host",
    //                     hashlib.sha256(b"").hexdigest()])
    //   sts = "\n".join(["AWS4-HMAC-SHA256", amzdate, f"{date}/{region}/rds-db/aws4_request",
    //                    hashlib.sha256(creq.encode()).hexdigest()])
    //   key = h(h(h(h(("AWS4" + secret).encode(), date), region), "rds-db"), "aws4_request")
    //   token = f"{host}:{port}/?{cq}&X-Amz-Signature=" + hmac.new(key, sts.encode(),
    //                                                             hashlib.sha256).hexdigest()
    #[test]
    fn token_matches_an_independent_sigv4_computation() {
        let credentials = AwsCredentials {
            access_key_id: "AKIDEXAMPLE".into(),
            secret_access_key: SECRET.into(),
            session_token: None,
        };
        let request = TokenRequest {
            host: "mydb.abc123.us-east-1.rds.amazonaws.com",
            port: 5432,
            user: "relay",
            region: "us-east-1",
        };
        assert_eq!(
            auth_token(&request, &credentials, at("2024-01-02T03:04:05Z")),
            "mydb.abc123.us-east-1.rds.amazonaws.com:5432/?Action=connect&DBUser=relay&X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIDEXAMPLE%2F20240102%2Fus-east-1%2Frds-db%2Faws4_request&X-Amz-Date=20240102T030405Z&X-Amz-Expires=900&X-Amz-SignedHeaders=host&X-Amz-Signature=57ff9ccf30ed59c79bc12db59dd7befaa7d62d0bb7c3413e25b84ae109bac237"
        );
    }

    #[test]
    fn temporary_credentials_sign_their_session_token_and_odd_users_are_encoded() {
        let credentials = AwsCredentials {
            access_key_id: "ASIAEXAMPLE".into(),
            secret_access_key: SECRET.into(),
            session_token: Some("FQoGZXIvYXdzE+/token=".into()),
        };
        let request = TokenRequest {
            host: "mydb.abc123.eu-west-1.rds.amazonaws.com",
            port: 5433,
            user: "relay user",
            region: "eu-west-1",
        };
        assert_eq!(
            auth_token(&request, &credentials, at("2024-12-31T23:59:59Z")),
            "mydb.abc123.eu-west-1.rds.amazonaws.com:5433/?Action=connect&DBUser=relay%20user&X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=ASIAEXAMPLE%2F20241231%2Feu-west-1%2Frds-db%2Faws4_request&X-Amz-Date=20241231T235959Z&X-Amz-Expires=900&X-Amz-Security-Token=FQoGZXIvYXdzE%2B%2Ftoken%3D&X-Amz-SignedHeaders=host&X-Amz-Signature=77d56cde3cc2305ffd8df5a82d0163bc407c2af83d034fd0083d1d3ae87e3b00"
        );
    }

    #[test]
    fn region_comes_from_rds_aurora_and_proxy_host_names() {
        for (host, region) in [
            ("mydb.abc123.us-east-1.rds.amazonaws.com", Some("us-east-1")),
            (
                "c1.cluster-abc.eu-central-1.rds.amazonaws.com",
                Some("eu-central-1"),
            ),
            (
                "c1.cluster-ro-abc.ap-south-1.rds.amazonaws.com.",
                Some("ap-south-1"),
            ),
            (
                "p1.proxy-abc.us-west-2.rds.amazonaws.com",
                Some("us-west-2"),
            ),
            ("db.abc.cn-north-1.rds.amazonaws.com.cn", Some("cn-north-1")),
            ("db.internal.example.com", None),
            ("10.0.0.5", None),
        ] {
            assert_eq!(region_of_host(host), region, "{host}");
        }
    }
}
