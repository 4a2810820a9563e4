//! AWS Signature Version 4, query-string form (a presigned `GET`): what both the RDS / Aurora
//! IAM token and the MSK IAM token are. HMAC-SHA256 and SHA-256 come from OpenSSL, which the
//! relay links already.
//!
//! The signed URL lists its parameters as botocore writes them (the caller's first, then the
//! `X-Amz-*` ones in the order botocore adds them, the signature last), so that a token can be
//! compared byte for byte with one AWS's Python SDK makes; the signature itself is over the
//! sorted (canonical) query, as SigV4 defines.

use std::fmt;

use jiff::Timestamp;
use openssl::hash::MessageDigest;
use openssl::pkey::PKey;
use openssl::sign::Signer;

use crate::config::Secret;

/// AWS credentials: an access key and, for temporary ones, the session token (what a
/// signature is made with; `credentials` finds them).
#[derive(Clone, PartialEq, Eq)]
pub struct AwsCredentials {
    pub access_key_id: String,
    pub secret_access_key: Secret,
    pub session_token: Option<Secret>,
}

impl fmt::Debug for AwsCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AwsCredentials")
            .field("access_key_id", &self.access_key_id)
            .finish_non_exhaustive()
    }
}

impl AwsCredentials {
    pub fn new(access_key_id: &str, secret: &str, session_token: Option<&str>) -> AwsCredentials {
        AwsCredentials {
            access_key_id: access_key_id.to_string(),
            secret_access_key: Secret::new(secret),
            session_token: session_token.map(Secret::new),
        }
    }
}

const ALGORITHM: &str = "AWS4-HMAC-SHA256";

/// What is presigned: a `GET` of `/` at `host` (as the client names it, with a port if it
/// names one), for `service` in `region`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Presign<'a> {
    pub host: &'a str,
    pub service: &'a str,
    pub region: &'a str,
    /// The request's own query parameters (`Action`, …), unencoded.
    pub params: Vec<(&'a str, String)>,
    /// `X-Amz-Expires`, in seconds.
    pub expires_s: u32,
}

/// The presigned query string (encoded, without `?`), signed at `now`.
pub fn presigned_query(
    request: &Presign<'_>,
    credentials: &AwsCredentials,
    now: Timestamp,
) -> String {
    let amz_date = now.strftime("%Y%m%dT%H%M%SZ").to_string();
    let date = &amz_date[..8];
    let scope = format!("{date}/{}/{}/aws4_request", request.region, request.service);
    let mut params: Vec<(&str, String)> = request.params.clone();
    params.extend([
        ("X-Amz-Algorithm", ALGORITHM.to_string()),
        (
            "X-Amz-Credential",
            format!("{}/{scope}", credentials.access_key_id),
        ),
        ("X-Amz-Date", amz_date.clone()),
        ("X-Amz-Expires", request.expires_s.to_string()),
        ("X-Amz-SignedHeaders", "host".to_string()),
    ]);
    if let Some(token) = &credentials.session_token {
        params.push(("X-Amz-Security-Token", token.expose().to_string()));
    }
    let encoded: Vec<(String, String)> = params
        .iter()
        .map(|(key, value)| (uri_encode(key), uri_encode(value)))
        .collect();
    let mut canonical = encoded.clone();
    canonical.sort();
    let canonical_request = format!(
        "GET\n/\n{}\nhost:{}\n\nhost\n{}",
        join_query(&canonical),
        request.host,
        hex::encode(openssl::sha::sha256(b""))
    );
    let string_to_sign = format!(
        "{ALGORITHM}\n{amz_date}\n{scope}\n{}",
        hex::encode(openssl::sha::sha256(canonical_request.as_bytes()))
    );
    let key = signing_key(
        credentials.secret_access_key.expose(),
        date,
        request.region,
        request.service,
    );
    let signature = hex::encode(hmac(&key, string_to_sign.as_bytes()));
    format!("{}&X-Amz-Signature={signature}", join_query(&encoded))
}

fn join_query(pairs: &[(String, String)]) -> String {
    let pairs: Vec<String> = pairs.iter().map(|(k, v)| format!("{k}={v}")).collect();
    pairs.join("&")
}

/// SigV4's derived key: the secret, then the date, region, service and `aws4_request`.
pub(crate) fn signing_key(secret: &str, date: &str, region: &str, service: &str) -> Vec<u8> {
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
pub fn uri_encode(text: &str) -> String {
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

    /// AWS's published example of the derived signing key ("Signature Version 4: examples of
    /// how to derive a signing key": 20120215, us-east-1, iam).
    #[test]
    fn signing_key_matches_aws_published_example() {
        let key = signing_key(
            "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
            "20120215",
            "us-east-1",
            "iam",
        );
        assert_eq!(
            hex::encode(key),
            "f4780e2d9f65fa895f9c67b32ce1baf0b0d8a43505a000a1a9e090d414db404d"
        );
    }

    /// The SigV4 test suite's `get-vanilla` case, the parts a presigned
    /// request shares: the derived key and the HMAC of a string to sign (AWS's published
    /// signature for that case, with the suite's credentials, 20150830, us-east-1, service).
    #[test]
    fn signature_matches_the_sigv4_test_suite() {
        let key = signing_key(
            "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
            "20150830",
            "us-east-1",
            "service",
        );
        let string_to_sign = "AWS4-HMAC-SHA256\n20150830T123600Z\n20150830/us-east-1/service/aws4_request\nbb579772317eb040ac9ed261061d46c1f17a8133879d6129b6e1c25292927e63";
        assert_eq!(
            hex::encode(hmac(&key, string_to_sign.as_bytes())),
            "5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31"
        );
    }
}
