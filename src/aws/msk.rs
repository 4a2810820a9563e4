//! The MSK IAM token (`kafka.sasl_mechanism = "AWS_MSK_IAM"`), as AWS's
//! aws-msk-iam-sasl-signer libraries make it: a SigV4-presigned
//! `GET https://kafka.<region>.amazonaws.com/?Action=kafka-cluster%3AConnect` (service
//! `kafka-cluster`, 900 s), with a `User-Agent` parameter added after signing, the whole URL
//! base64url-encoded without padding. It is sent as a SASL OAUTHBEARER token; the brokers
//! check the signature and the principal's `kafka-cluster:*` IAM permissions.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use jiff::Timestamp;

use super::credentials::AwsCredentials;
use super::sigv4::{presigned_query, uri_encode, Presign};

/// How long a token may be used to log in, in seconds (what AWS's signers sign).
pub const TOKEN_LIFETIME_S: u32 = 900;
const SERVICE: &str = "kafka-cluster";
const ACTION: &str = "kafka-cluster:Connect";
/// The `User-Agent` parameter: which client signed (the signer libraries name themselves).
pub const USER_AGENT: &str = concat!("outbox-relay/", env!("CARGO_PKG_VERSION"));

/// A token and the moment it stops being accepted, in milliseconds since the epoch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MskToken {
    pub token: String,
    pub expires_ms: i64,
}

/// The token for the cluster in `region`, signed at `now`, naming `user_agent`.
pub fn auth_token(
    region: &str,
    credentials: &AwsCredentials,
    now: Timestamp,
    user_agent: &str,
) -> MskToken {
    let host = format!("kafka.{region}.amazonaws.com");
    let request = Presign {
        host: &host,
        service: SERVICE,
        region,
        params: vec![("Action", ACTION.to_string())],
        expires_s: TOKEN_LIFETIME_S,
    };
    let query = presigned_query(&request, credentials, now);
    let url = format!(
        "https://{host}/?{query}&User-Agent={}",
        uri_encode(user_agent)
    );
    MskToken {
        token: URL_SAFE_NO_PAD.encode(url),
        // As the signers compute it: from the signing time, in whole seconds.
        expires_ms: (now.as_second() + i64::from(TOKEN_LIFETIME_S)) * 1000,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY";
    /// The user agent AWS's Python signer 1.0.2 writes: with it, our token and the
    /// signer's must be the same bytes.
    const PYTHON_SIGNER: &str = "aws-msk-iam-sasl-signer-python/1.0.2";

    // The expected values were produced once by AWS's own Python signer
    // (aws-msk-iam-sasl-signer-python 1.0.2 on botocore 1.44.8), with botocore's clock frozen:
    //
    //   from unittest import mock; import botocore.auth, datetime as dt
    //   from botocore.credentials import Credentials
    //   import aws_msk_iam_sasl_signer.MSKAuthTokenProvider as p
    //   class Frozen(dt.datetime):
    //       @classmethod
    //       def utcnow(cls): return dt.datetime(2024, 1, 2, 3, 4, 5)
    //   with mock.patch.object(botocore.auth.datetime, "datetime", Frozen):
    //       token, expiry_ms = p.__dict__["__construct_auth_token"](
    //           "us-east-1", Credentials("AKIDEXAMPLE", SECRET, None))
    //
    // (and eu-west-1, ASIAEXAMPLE with session token "FQoGZXIvYXdzE+/token=" at
    // 2024-12-31T23:59:59Z). They are AWS's code's answer, not ours.
    #[test]
    fn token_matches_aws_python_signer() {
        let credentials = AwsCredentials::new("AKIDEXAMPLE", SECRET, None);
        let now: Timestamp = "2024-01-02T03:04:05Z".parse().unwrap();
        let token = auth_token("us-east-1", &credentials, now, PYTHON_SIGNER);
        assert_eq!(
            token.token,
            "aHR0cHM6Ly9rYWZrYS51cy1lYXN0LTEuYW1hem9uYXdzLmNvbS8_QWN0aW9uPWthZmthLWNsdXN0ZXIlM0FDb25uZWN0JlgtQW16LUFsZ29yaXRobT1BV1M0LUhNQUMtU0hBMjU2JlgtQW16LUNyZWRlbnRpYWw9QUtJREVYQU1QTEUlMkYyMDI0MDEwMiUyRnVzLWVhc3QtMSUyRmthZmthLWNsdXN0ZXIlMkZhd3M0X3JlcXVlc3QmWC1BbXotRGF0ZT0yMDI0MDEwMlQwMzA0MDVaJlgtQW16LUV4cGlyZXM9OTAwJlgtQW16LVNpZ25lZEhlYWRlcnM9aG9zdCZYLUFtei1TaWduYXR1cmU9ZDk3NmE2MzMzNGIyZjYwZTY4MmJhNjUwMzJjZDllOTg1Y2M1MjVmOWJlODA5ZGJhNDk1OTg0Zjg2NjkxMDEyNCZVc2VyLUFnZW50PWF3cy1tc2staWFtLXNhc2wtc2lnbmVyLXB5dGhvbiUyRjEuMC4y"
        );
        assert_eq!(token.expires_ms, 1704165545000);
    }

    #[test]
    fn session_token_is_signed_as_aws_python_signer_signs_it() {
        let credentials = AwsCredentials::new("ASIAEXAMPLE", SECRET, Some("FQoGZXIvYXdzE+/token="));
        let now: Timestamp = "2024-12-31T23:59:59Z".parse().unwrap();
        let token = auth_token("eu-west-1", &credentials, now, PYTHON_SIGNER);
        let url = String::from_utf8(URL_SAFE_NO_PAD.decode(&token.token).unwrap()).unwrap();
        assert_eq!(
            url,
            "https://kafka.eu-west-1.amazonaws.com/?Action=kafka-cluster%3AConnect&X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=ASIAEXAMPLE%2F20241231%2Feu-west-1%2Fkafka-cluster%2Faws4_request&X-Amz-Date=20241231T235959Z&X-Amz-Expires=900&X-Amz-SignedHeaders=host&X-Amz-Security-Token=FQoGZXIvYXdzE%2B%2Ftoken%3D&X-Amz-Signature=f2e51533fe26aebcb51582ead003d4d70e62ba1376b909ea778d6815638ab5af&User-Agent=aws-msk-iam-sasl-signer-python%2F1.0.2"
        );
        assert_eq!(token.expires_ms, 1735690499000);
        assert!(!token.token.ends_with('='), "base64url without padding");
    }
}
