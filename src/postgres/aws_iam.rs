//! RDS / Aurora IAM database authentication (`postgres.auth = "aws_rds_iam"`): the password is
//! an authentication token, a SigV4-presigned `connect` request for the host, port and user,
//! valid 15 minutes for opening connections. It is made afresh for every connection, from
//! the credentials in the environment, so a reconnect never presents an expired one.
//!
//! The signing is [`crate::aws::sigv4`]'s; the credentials come from the default AWS chain
//! ([`crate::aws::credentials`]), shared with the MSK login.

use std::sync::Arc;

use jiff::Timestamp;
use tokio_postgres::config::Host;

use crate::aws::credentials::{AwsCredentials, CredentialsProvider, FIRST_FETCH_WAIT};
use crate::aws::sigv4::{presigned_query, Presign};
use crate::config::{PostgresAuth, PostgresConfig};

/// How long a token may be used to open a connection (RDS accepts at most 15 minutes).
const TOKEN_LIFETIME_S: u32 = 900;
const SERVICE: &str = "rds-db";

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
#[derive(Debug, Clone)]
pub struct RdsIamAuth {
    credentials: Arc<CredentialsProvider>,
    configured_region: Option<String>,
    env_region: Option<String>,
}

impl RdsIamAuth {
    /// `None` unless `pg.auth` asks for IAM tokens.
    pub fn from_config(pg: &PostgresConfig) -> Result<Option<RdsIamAuth>, String> {
        if pg.auth != PostgresAuth::AwsRdsIam {
            return Ok(None);
        }
        let credentials = CredentialsProvider::shared();
        // Fail at start-up, naming the source and its fix, not at the first connection.
        credentials
            .credentials_within(FIRST_FETCH_WAIT)
            .map_err(|e| format!("postgres.auth = \"aws_rds_iam\": {e}"))?;
        Ok(Some(RdsIamAuth {
            env_region: credentials.env().region().map(str::to_string),
            credentials,
            configured_region: pg.aws_region.clone(),
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
    pub fn check_hosts<'h>(&self, hosts: impl IntoIterator<Item = &'h Host>) -> Result<(), String> {
        for host in hosts {
            let Host::Tcp(host) = host else {
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

    /// A fresh token for `user` at `host:port`, signed now; `None` for a host
    /// [`RdsIamAuth::check_hosts`] refuses, or without credentials (logged: the server
    /// then refuses the login, and the session is retried).
    pub fn token(&self, host: &Host, port: u16, user: &str) -> Option<String> {
        let Host::Tcp(host) = host else {
            return None;
        };
        let request = TokenRequest {
            host,
            port,
            user,
            region: self.region_for(host)?,
        };
        match self.credentials.credentials() {
            Ok(fetched) => Some(auth_token(&request, &fetched.credentials, Timestamp::now())),
            Err(error) => {
                tracing::warn!(%error, "postgres.auth = \"aws_rds_iam\": no token for this connection");
                None
            }
        }
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
    let host = format!("{}:{}", request.host, request.port);
    let presign = Presign {
        host: &host,
        service: SERVICE,
        region: request.region,
        params: vec![
            ("Action", "connect".to_string()),
            ("DBUser", request.user.to_string()),
        ],
        expires_s: TOKEN_LIFETIME_S,
    };
    format!("{host}/?{}", presigned_query(&presign, credentials, now))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY";

    fn at(text: &str) -> Timestamp {
        text.parse().unwrap()
    }

    // The expected tokens were produced once by botocore's own generate_db_auth_token
    // (botocore 1.44.8), its clock frozen (datetime.utcnow / now patched in botocore.auth):
    //
    //   client = botocore.session.Session().create_client("rds", region_name=region,
    //       aws_access_key_id=akid, aws_secret_access_key=SECRET, aws_session_token=token)
    //   client.generate_db_auth_token(host, port, user, region)
    //
    // (The signatures also equal those of an earlier hand-written hashlib/hmac computation;
    // botocore lists X-Amz-Security-Token after X-Amz-SignedHeaders.)
    #[test]
    fn token_matches_an_independent_sigv4_computation() {
        let credentials = AwsCredentials::new("AKIDEXAMPLE", SECRET, None);
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
        let credentials = AwsCredentials::new("ASIAEXAMPLE", SECRET, Some("FQoGZXIvYXdzE+/token="));
        let request = TokenRequest {
            host: "mydb.abc123.eu-west-1.rds.amazonaws.com",
            port: 5433,
            user: "relay user",
            region: "eu-west-1",
        };
        assert_eq!(
            auth_token(&request, &credentials, at("2024-12-31T23:59:59Z")),
            "mydb.abc123.eu-west-1.rds.amazonaws.com:5433/?Action=connect&DBUser=relay%20user&X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=ASIAEXAMPLE%2F20241231%2Feu-west-1%2Frds-db%2Faws4_request&X-Amz-Date=20241231T235959Z&X-Amz-Expires=900&X-Amz-SignedHeaders=host&X-Amz-Security-Token=FQoGZXIvYXdzE%2B%2Ftoken%3D&X-Amz-Signature=77d56cde3cc2305ffd8df5a82d0163bc407c2af83d034fd0083d1d3ae87e3b00"
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
