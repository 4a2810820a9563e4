//! The chain's HTTP sources: STS web identity, ECS container credentials and EC2 instance
//! metadata (IMDSv2).

use std::net::IpAddr;
use std::time::Duration;

use jiff::Timestamp;
use reqwest::{Client, Method, RequestBuilder};
use serde::Deserialize;

use super::profile::AssumeRole;
use super::{AwsCredentials, CredentialsError, Env, Fetched};

/// Whole-request limit for STS and the container endpoint.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Instance metadata is a link-local hop away or not there at all (off EC2): AWS's SDKs
/// give it one second.
const IMDS_TIMEOUT: Duration = Duration::from_secs(1);
const IMDS_DEFAULT: &str = "http://169.254.169.254";
/// How long an IMDSv2 session token is asked for, in seconds (only this fetch uses it).
const IMDS_TOKEN_TTL_S: &str = "21600";
const ECS_HOST: &str = "http://169.254.170.2";
const STS_API_VERSION: &str = "2011-06-15";

fn client(timeout: Duration) -> Result<Client, CredentialsError> {
    Client::builder()
        .timeout(timeout)
        .connect_timeout(timeout)
        .build()
        .map_err(|e| {
            CredentialsError::source(
                "the HTTP client",
                e.to_string(),
                "check the system's TLS set-up (OpenSSL)",
            )
        })
}

/// Sends `request`; the body of a 2xx answer, else an error quoting the status and body.
async fn send(
    request: RequestBuilder,
    from: &'static str,
    fix: &'static str,
) -> Result<String, CredentialsError> {
    let response = request
        .send()
        .await
        .map_err(|e| CredentialsError::source(from, format!("request failed: {e}"), fix))?;
    let status = response.status();
    let body = response
        .text()
        .await
        .map_err(|e| CredentialsError::source(from, format!("reading the answer: {e}"), fix))?;
    if !status.is_success() {
        let body: String = body.chars().take(500).collect();
        return Err(CredentialsError::source(
            from,
            format!("HTTP {status}: {body}"),
            fix,
        ));
    }
    Ok(body)
}

fn parse_time(
    text: &str,
    from: &'static str,
    fix: &'static str,
) -> Result<Timestamp, CredentialsError> {
    text.trim()
        .parse()
        .map_err(|e| CredentialsError::source(from, format!("bad Expiration `{text}`: {e}"), fix))
}

/// 2. Web identity: the token file's JWT exchanged for the role's credentials at STS.
pub(super) async fn web_identity(env: &Env) -> Result<Option<Fetched>, CredentialsError> {
    const FROM: &str = "web identity (AWS_WEB_IDENTITY_TOKEN_FILE)";
    const FIX: &str = "check that AWS_ROLE_ARN's trust policy admits this service account (EKS IRSA) and that the STS endpoint is reachable";
    let (Some(file), Some(role)) = (
        env.get("AWS_WEB_IDENTITY_TOKEN_FILE"),
        env.get("AWS_ROLE_ARN"),
    ) else {
        if env.get("AWS_WEB_IDENTITY_TOKEN_FILE").is_some() {
            return Err(CredentialsError::source(
                FROM,
                "AWS_ROLE_ARN is not set",
                "set it to the role to assume",
            ));
        }
        return Ok(None);
    };
    let token = std::fs::read_to_string(file).map_err(|e| {
        CredentialsError::source(
            FROM,
            format!("cannot read `{file}`: {e}"),
            "mount the projected service account token there",
        )
    })?;
    let session = env
        .get("AWS_ROLE_SESSION_NAME")
        .map(str::to_string)
        .unwrap_or_else(|| format!("outbox-relay-{}", Timestamp::now().as_second()));
    let form = [
        ("Action", "AssumeRoleWithWebIdentity"),
        ("Version", STS_API_VERSION),
        ("RoleArn", role),
        ("RoleSessionName", session.as_str()),
        ("WebIdentityToken", token.trim()),
    ];
    let body: Vec<String> = form
        .iter()
        .map(|(k, v)| format!("{k}={}", crate::aws::sigv4::uri_encode(v)))
        .collect();
    let request = client(REQUEST_TIMEOUT)?
        .post(sts_endpoint(env))
        .header("Content-Type", "application/x-www-form-urlencoded")
        .header("Accept", "text/xml")
        .body(body.join("&"));
    let answer = send(request, FROM, FIX).await?;
    sts_credentials(&answer, "web identity", FROM, FIX).map(Some)
}

/// 3b. A profile's `role_arn`: STS `AssumeRole` with the source profile's credentials, as
/// a SigV4-presigned GET (the query-string form of the same signature, which STS accepts
/// for every action; `crate::aws::sigv4` makes it).
pub(super) async fn assume_role(env: &Env, role: &AssumeRole) -> Result<Fetched, CredentialsError> {
    const FROM: &str = "a profile's role_arn (STS AssumeRole)";
    const FIX: &str = "check that the role's trust policy admits the source profile's identity, that it may sts:AssumeRole, and that the STS endpoint is reachable";
    let signed = assume_role_url(env, role, FROM)?;
    let request = client(REQUEST_TIMEOUT)?
        .get(signed)
        .header("Accept", "text/xml");
    let answer = send(request, FROM, FIX).await.map_err(|e| match e {
        CredentialsError::Source { message, .. } => CredentialsError::source(
            FROM,
            format!(
                "profile `{}`, role `{}`: {message}",
                role.profile, role.role_arn
            ),
            FIX,
        ),
        other => other,
    })?;
    sts_credentials(&answer, "a profile's role_arn", FROM, FIX)
}

/// The temporary credentials in STS's answer: AssumeRole and AssumeRoleWithWebIdentity both
/// answer with the same `<Credentials>` members. `source` names them in logs; `from` and
/// `fix` go into the error when a member is missing.
fn sts_credentials(
    answer: &str,
    source: &'static str,
    from: &'static str,
    fix: &'static str,
) -> Result<Fetched, CredentialsError> {
    let field = |name: &str| {
        xml_text(answer, name).ok_or_else(|| {
            CredentialsError::source(from, format!("STS's answer has no <{name}>"), fix)
        })
    };
    Ok(Fetched {
        credentials: AwsCredentials::new(
            &field("AccessKeyId")?,
            &field("SecretAccessKey")?,
            Some(&field("SessionToken")?),
        ),
        expires: Some(parse_time(&field("Expiration")?, from, fix)?),
        from: source,
    })
}

/// The AssumeRole request as a URL presigned with the source profile's credentials, for the
/// role's region, else the environment's, else STS's global region. `from` names the source
/// in errors.
fn assume_role_url(
    env: &Env,
    role: &AssumeRole,
    from: &'static str,
) -> Result<reqwest::Url, CredentialsError> {
    let region = role.region.as_deref().or(env.region());
    let endpoint = sts_endpoint_in(env, region);
    let url = reqwest::Url::parse(&endpoint).map_err(|e| {
        CredentialsError::source(
            from,
            format!("bad STS endpoint `{endpoint}`: {e}"),
            "fix AWS_ENDPOINT_URL_STS",
        )
    })?;
    let host = match (url.host_str(), url.port()) {
        (Some(host), Some(port)) => format!("{host}:{port}"),
        (Some(host), None) => host.to_string(),
        (None, _) => {
            return Err(CredentialsError::source(
                from,
                format!("STS endpoint `{endpoint}` has no host"),
                "fix AWS_ENDPOINT_URL_STS",
            ))
        }
    };
    let session = role
        .session_name
        .clone()
        .unwrap_or_else(|| format!("outbox-relay-{}", Timestamp::now().as_second()));
    let mut params = vec![
        ("Action", "AssumeRole".to_string()),
        ("Version", STS_API_VERSION.to_string()),
        ("RoleArn", role.role_arn.clone()),
        ("RoleSessionName", session),
    ];
    if let Some(id) = &role.external_id {
        params.push(("ExternalId", id.clone()));
    }
    if let Some(seconds) = role.duration_s {
        params.push(("DurationSeconds", seconds.to_string()));
    }
    let presign = crate::aws::sigv4::Presign {
        host: &host,
        service: "sts",
        region: region.unwrap_or(STS_GLOBAL_REGION),
        params,
        expires_s: ASSUME_ROLE_SIGNATURE_S,
    };
    let query =
        crate::aws::sigv4::presigned_query(&presign, &role.source.credentials, Timestamp::now());
    let mut signed = url;
    signed.set_path("/");
    signed.set_query(Some(&query));
    Ok(signed)
}

/// The region the global STS endpoint signs for.
const STS_GLOBAL_REGION: &str = "us-east-1";
/// How long the signed AssumeRole request itself is good for, in seconds.
const ASSUME_ROLE_SIGNATURE_S: u32 = 60;

/// STS: `AWS_ENDPOINT_URL_STS`, else `AWS_ENDPOINT_URL`, else the region's endpoint (the
/// global one without a region).
pub(super) fn sts_endpoint(env: &Env) -> String {
    sts_endpoint_in(env, env.region())
}

/// [`sts_endpoint`] for `region` (a profile's, which wins over the environment's).
fn sts_endpoint_in(env: &Env, region: Option<&str>) -> String {
    if let Some(url) = env
        .get("AWS_ENDPOINT_URL_STS")
        .or_else(|| env.get("AWS_ENDPOINT_URL"))
    {
        return url.to_string();
    }
    match region {
        Some(region) if region.starts_with("cn-") => {
            format!("https://sts.{region}.amazonaws.com.cn")
        }
        Some(region) => format!("https://sts.{region}.amazonaws.com"),
        None => "https://sts.amazonaws.com".to_string(),
    }
}

/// The text of the first `<name>…</name>` element, XML entities decoded (STS answers are
/// flat, with no attributes on these elements).
fn xml_text(xml: &str, name: &str) -> Option<String> {
    let open = format!("<{name}>");
    let start = xml.find(&open)? + open.len();
    let end = start + xml[start..].find(&format!("</{name}>"))?;
    let text = &xml[start..end];
    Some(
        text.replace("&lt;", "<")
            .replace("&gt;", ">")
            .replace("&quot;", "\"")
            .replace("&apos;", "'")
            .replace("&amp;", "&"),
    )
}

/// What the container and instance-metadata endpoints answer.
#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct JsonCredentials {
    access_key_id: String,
    secret_access_key: String,
    token: Option<String>,
    expiration: Option<String>,
    code: Option<String>,
}

fn from_json(
    body: &str,
    from: &'static str,
    fix: &'static str,
) -> Result<Fetched, CredentialsError> {
    let parsed: JsonCredentials = serde_json::from_str(body)
        .map_err(|e| CredentialsError::source(from, format!("unexpected answer: {e}"), fix))?;
    if let Some(code) = parsed.code.filter(|c| c != "Success") {
        return Err(CredentialsError::source(
            from,
            format!("Code `{code}`"),
            fix,
        ));
    }
    let expires = match &parsed.expiration {
        Some(text) => Some(parse_time(text, from, fix)?),
        None => None,
    };
    Ok(Fetched {
        credentials: AwsCredentials::new(
            &parsed.access_key_id,
            &parsed.secret_access_key,
            parsed.token.as_deref(),
        ),
        expires,
        from,
    })
}

/// 4. ECS task role / EKS Pod Identity: a GET of the container credentials endpoint.
pub(super) async fn container(env: &Env) -> Result<Option<Fetched>, CredentialsError> {
    const FROM: &str = "ECS container credentials";
    const FIX: &str = "check the task role (ECS) or the pod identity association (EKS) and AWS_CONTAINER_* variables";
    let url = match (
        env.get("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI"),
        env.get("AWS_CONTAINER_CREDENTIALS_FULL_URI"),
    ) {
        (Some(relative), _) => format!("{ECS_HOST}{relative}"),
        (None, Some(full)) => {
            check_full_uri(full).map_err(|message| {
                CredentialsError::source(
                    FROM,
                    message,
                    "use https, or a loopback or ECS/EKS link-local address",
                )
            })?;
            full.to_string()
        }
        (None, None) => return Ok(None),
    };
    let mut request = client(REQUEST_TIMEOUT)?.get(&url);
    if let Some(token) = container_authorization(env)? {
        request = request.header("Authorization", token);
    }
    let body = send(request, FROM, FIX).await?;
    from_json(&body, FROM, FIX).map(Some)
}

/// `AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE` (EKS Pod Identity, re-read every fetch), else
/// `AWS_CONTAINER_AUTHORIZATION_TOKEN`.
fn container_authorization(env: &Env) -> Result<Option<String>, CredentialsError> {
    if let Some(file) = env.get("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE") {
        let token = std::fs::read_to_string(file).map_err(|e| {
            CredentialsError::source(
                "ECS container credentials",
                format!("cannot read AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE `{file}`: {e}"),
                "mount the pod identity token there",
            )
        })?;
        return Ok(Some(token.trim().to_string()));
    }
    Ok(env
        .get("AWS_CONTAINER_AUTHORIZATION_TOKEN")
        .map(str::to_string))
}

/// As AWS's SDKs allow: https anywhere; http only to loopback or the ECS / EKS addresses.
fn check_full_uri(uri: &str) -> Result<(), String> {
    if uri.starts_with("https://") {
        return Ok(());
    }
    let Some(rest) = uri.strip_prefix("http://") else {
        return Err(format!(
            "AWS_CONTAINER_CREDENTIALS_FULL_URI `{uri}` is not an http(s) URL"
        ));
    };
    let authority = rest.split('/').next().unwrap_or_default();
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or_default(),
        None => authority
            .rsplit_once(':')
            .map_or(authority, |(host, _)| host),
    };
    let allowed = host == "localhost"
        || host.parse::<IpAddr>().is_ok_and(|ip| {
            ip.is_loopback()
                || ip == IpAddr::from([169, 254, 170, 2])
                || ip == IpAddr::from([169, 254, 170, 23])
                || ip == "fd00:ec2::23".parse::<IpAddr>().expect("an IPv6 address")
        });
    if allowed {
        Ok(())
    } else {
        Err(format!("AWS_CONTAINER_CREDENTIALS_FULL_URI `{uri}`: plain http only to loopback or 169.254.170.2/.23"))
    }
}

/// What instance metadata gave: credentials, or why there are none here (not an error: off
/// EC2 there is no metadata service, and the chain ends with "not found").
pub(super) enum Imds {
    Found(Fetched),
    Unavailable(String),
}

/// 5. EC2 instance metadata, IMDSv2: a session token (PUT), the role's name, its credentials.
pub(super) async fn instance_metadata(env: &Env) -> Result<Imds, CredentialsError> {
    const FROM: &str = "EC2 instance metadata";
    const FIX: &str = "attach an instance profile with a role to the instance, and allow IMDSv2 (hop limit 2 in containers)";
    if env
        .get("AWS_EC2_METADATA_DISABLED")
        .is_some_and(|v| v.eq_ignore_ascii_case("true"))
    {
        return Ok(Imds::Unavailable(
            "disabled by AWS_EC2_METADATA_DISABLED".into(),
        ));
    }
    let base = env
        .get("AWS_EC2_METADATA_SERVICE_ENDPOINT")
        .unwrap_or(IMDS_DEFAULT)
        .trim_end_matches('/')
        .to_string();
    let http = client(IMDS_TIMEOUT)?;
    let token_request = http
        .request(Method::PUT, format!("{base}/latest/api/token"))
        .header("X-aws-ec2-metadata-token-ttl-seconds", IMDS_TOKEN_TTL_S);
    let token = match token_request.send().await {
        Err(e) => return Ok(Imds::Unavailable(format!("{base} did not answer ({e})"))),
        Ok(response) if !response.status().is_success() => {
            return Err(CredentialsError::source(
                FROM,
                format!("the token PUT got HTTP {}", response.status()),
                FIX,
            ))
        }
        Ok(response) => response
            .text()
            .await
            .map_err(|e| CredentialsError::source(FROM, e.to_string(), FIX))?,
    };
    let path = format!("{base}/latest/meta-data/iam/security-credentials/");
    let get = |url: String| {
        http.get(url)
            .header("X-aws-ec2-metadata-token", token.trim())
    };
    let roles = send(get(path.clone()), FROM, FIX).await?;
    let Some(role) = roles.lines().map(str::trim).find(|l| !l.is_empty()) else {
        return Err(CredentialsError::source(
            FROM,
            "the instance has no role",
            FIX,
        ));
    };
    let body = send(get(format!("{path}{role}")), FROM, FIX).await?;
    from_json(&body, FROM, FIX).map(Imds::Found)
}
