//! librdkafka's `rd_kafka_oauthbearer_set_token` and `_set_token_failure`, for the admin
//! client, whose rust-rdkafka wrapper never delivers the token-refresh request, and for the
//! new token the relay sets after a lost connection (see `login::ClientLogin`); and the
//! admin client's main queue, which rust-rdkafka never polls, for its errors.

use std::ffi::{c_char, CStr, CString};
use std::ptr::{self, NonNull};
use std::sync::OnceLock;
use std::time::Duration;

use rdkafka::bindings as rdsys;
use rdkafka::client::{Client, OAuthToken};
use rdkafka::types::{RDKafka, RDKafkaRespErr};
use rdkafka::ClientContext;

/// A client's librdkafka handle, kept by its context to set tokens from its callbacks.
#[derive(Clone, Copy)]
struct NativeClient(NonNull<RDKafka>);

// SAFETY: librdkafka's client handle is thread safe (its API may be called from any thread);
// this is only the address, whose use `ClientLogin` restricts to the client's own callbacks.
unsafe impl Send for NativeClient {}
// SAFETY: as for Send: nothing is read or written through a shared reference to it.
unsafe impl Sync for NativeClient {}

impl NativeClient {
    fn of<C: ClientContext>(client: &Client<C>) -> Option<NativeClient> {
        NonNull::new(client.native_ptr()).map(NativeClient)
    }
}

/// The client a context belongs to, filled once the client is made: its callbacks set
/// tokens on it.
#[derive(Default)]
pub(super) struct ClientSlot(OnceLock<NativeClient>);

impl ClientSlot {
    /// `client` is the one whose context holds this slot (a second call is ignored).
    pub(super) fn fill<C: ClientContext>(&self, client: &Client<C>) {
        if let Some(native) = NativeClient::of(client) {
            let _ = self.0.set(native);
        }
    }

    pub(super) fn is_filled(&self) -> bool {
        self.0.get().is_some()
    }

    /// Sets `token` on the client; `None` before [`ClientSlot::fill`]. Only for the
    /// client's own callbacks (`ClientContext::error`): librdkafka makes them only while
    /// the client is polled, so it is alive, and a slot is private to the context it fills.
    pub(super) fn set_token(&self, token: &OAuthToken) -> Option<Result<(), String>> {
        let native = *self.0.get()?;
        // SAFETY: the client is alive during its own callbacks (above), the only callers.
        Some(unsafe { set_native_token(native, token) })
    }
}

/// Gives `client` the token to log in with (until the next one).
pub(super) fn set_token<C: ClientContext>(
    client: &Client<C>,
    token: &OAuthToken,
) -> Result<(), String> {
    match NativeClient::of(client) {
        // SAFETY: the client is alive for the call (borrowed).
        Some(native) => unsafe { set_native_token(native, token) },
        None => Err("no client".into()),
    }
}

/// [`set_token`] through the handle a context keeps.
///
/// # Safety
///
/// The client `native` belongs to must be alive for the call (a callback of its own).
unsafe fn set_native_token(native: NativeClient, token: &OAuthToken) -> Result<(), String> {
    let value = CString::new(token.token.as_str()).map_err(|e| e.to_string())?;
    let principal = CString::new(token.principal_name.as_str()).map_err(|e| e.to_string())?;
    let mut errstr = [0 as c_char; 512];
    // SAFETY: the client is alive (the caller's promise); the strings are NUL-terminated
    // and outlive the call; no extensions (null, 0); errstr is a buffer of the length given.
    let code = unsafe {
        rdsys::rd_kafka_oauthbearer_set_token(
            native.0.as_ptr(),
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

/// What the admin login thread reads off the admin client's main queue.
pub(super) enum MainQueueEvent {
    Error(RDKafkaRespErr),
    /// A log line: level (syslog's), facility, text.
    Log(i32, String, String),
}

/// The errors and log lines waiting on `client`'s main queue, taken off it, waiting up to
/// `wait` for the first. For the admin client, whose main queue nobody else polls (its
/// results come on a queue of their own); the other events there (the token request
/// rust-rdkafka does not answer for it) are dropped.
pub(super) fn take_main_queue_events<C: ClientContext>(
    client: &Client<C>,
    wait: Duration,
) -> Vec<MainQueueEvent> {
    let mut events = Vec::new();
    // SAFETY: the client is alive for the call (borrowed); the queue reference is released
    // below, before it ends.
    let queue = unsafe { rdsys::rd_kafka_queue_get_main(client.native_ptr()) };
    if queue.is_null() {
        return events;
    }
    let mut timeout = wait.as_millis().min(i32::MAX as u128) as i32;
    loop {
        // SAFETY: the queue is a live reference (above); the event returned is ours.
        let event = unsafe { rdsys::rd_kafka_queue_poll(queue, timeout) };
        if event.is_null() {
            break;
        }
        // SAFETY: `event` is live (non-null, destroyed only below).
        if let Some(taken) = unsafe { read_event(event) } {
            events.push(taken);
        }
        // SAFETY: destroyed once, not used after.
        unsafe { rdsys::rd_kafka_event_destroy(event) };
        timeout = 0;
    }
    // SAFETY: releases the reference taken above, once.
    unsafe { rdsys::rd_kafka_queue_destroy(queue) };
    events
}

/// An error or log event's content, copied.
///
/// # Safety
///
/// `event` must be a live event.
unsafe fn read_event(event: *mut rdsys::rd_kafka_event_t) -> Option<MainQueueEvent> {
    // SAFETY: `event` is live (the caller's promise).
    match unsafe { rdsys::rd_kafka_event_type(event) } {
        // SAFETY: as above.
        rdsys::RD_KAFKA_EVENT_ERROR => Some(MainQueueEvent::Error(unsafe {
            rdsys::rd_kafka_event_error(event)
        })),
        rdsys::RD_KAFKA_EVENT_LOG => {
            let (mut fac, mut line, mut level) = (ptr::null(), ptr::null(), 0);
            // SAFETY: as above; the out-pointers are valid; the strings it points them at
            // live as long as the event, and are copied before it is destroyed.
            let found =
                unsafe { rdsys::rd_kafka_event_log(event, &mut fac, &mut line, &mut level) };
            if found != 0 || fac.is_null() || line.is_null() {
                return None;
            }
            // SAFETY: a NUL-terminated string of the live event (above).
            let fac = unsafe { CStr::from_ptr(fac) };
            // SAFETY: as for `fac`.
            let line = unsafe { CStr::from_ptr(line) };
            Some(MainQueueEvent::Log(
                level,
                fac.to_string_lossy().into_owned(),
                line.to_string_lossy().into_owned(),
            ))
        }
        _ => None,
    }
}
