//! librdkafka's `rd_kafka_oauthbearer_set_token` and `_set_token_failure`, for the admin
//! client, whose rust-rdkafka wrapper never delivers the token-refresh request.

use std::ffi::{c_char, CString};
use std::ptr;

use rdkafka::bindings as rdsys;
use rdkafka::client::{Client, OAuthToken};
use rdkafka::types::RDKafkaRespErr;
use rdkafka::ClientContext;

/// Gives `client` the token to log in with (until the next one).
pub(super) fn set_token<C: ClientContext>(
    client: &Client<C>,
    token: &OAuthToken,
) -> Result<(), String> {
    let value = CString::new(token.token.as_str()).map_err(|e| e.to_string())?;
    let principal = CString::new(token.principal_name.as_str()).map_err(|e| e.to_string())?;
    let mut errstr = [0 as c_char; 512];
    // SAFETY: the client is alive for the call (borrowed); the strings are NUL-terminated
    // and outlive it; no extensions (null, 0); errstr is a buffer of the length given.
    let code = unsafe {
        rdsys::rd_kafka_oauthbearer_set_token(
            client.native_ptr(),
            value.as_ptr(),
            token.lifetime_ms,
            principal.as_ptr(),
            ptr::null_mut(),
            0,
            errstr.as_mut_ptr(),
            errstr.len(),
        )
    };
    if code == RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR {
        return Ok(());
    }
    let bytes: Vec<u8> = errstr
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    Err(format!("{code:?}: {}", String::from_utf8_lossy(&bytes)))
}

/// Tells `client` no token could be made (it logs in no more until one is set).
pub(super) fn set_token_failure<C: ClientContext>(client: &Client<C>, reason: &str) {
    let reason = CString::new(reason.replace('\0', " ")).unwrap_or_default();
    // SAFETY: the client is alive for the call (borrowed); librdkafka copies the string.
    unsafe { rdsys::rd_kafka_oauthbearer_set_token_failure(client.native_ptr(), reason.as_ptr()) };
}
