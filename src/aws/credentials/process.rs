//! A profile's `credential_process`: a command the SDKs run for credentials, which prints
//! them as JSON on its standard output (AWS's "Sourcing credentials with an external
//! process"): `Version` 1, `AccessKeyId`, `SecretAccessKey`, and for temporary credentials
//! `SessionToken` and `Expiration` (ISO 8601). Without `Expiration` they never expire.
//!
//! The command line is split as the SDKs split it, without a shell: at whitespace, with
//! double quotes around a part that holds spaces. It runs with the relay's environment, for
//! at most [`PROCESS_TIMEOUT`]; the provider's cache keeps what it printed until
//! `REFRESH_BEFORE_EXPIRY` before `Expiration`.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use jiff::Timestamp;
use serde::Deserialize;

use super::{AwsCredentials, CredentialsError, Fetched};

const FROM: &str = "a profile's credential_process";

/// A command that has not answered by then is killed (a token request waits on it).
pub(super) const PROCESS_TIMEOUT: Duration = Duration::from_secs(30);

/// What the command prints (the fields the relay uses; others are ignored).
#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Output {
    version: u32,
    access_key_id: String,
    secret_access_key: String,
    session_token: Option<String>,
    expiration: Option<String>,
}

/// Runs `command_line` (profile `profile`'s) and reads its credentials.
pub(super) fn credentials(profile: &str, command_line: &str) -> Result<Fetched, CredentialsError> {
    let fail = |message: String, fix: &'static str| {
        CredentialsError::source(
            FROM,
            format!("profile `{profile}`: `{command_line}` {message}"),
            fix,
        )
    };
    let words = split(command_line);
    let Some((program, args)) = words.split_first() else {
        return Err(fail(
            "is empty".into(),
            "set credential_process to a command",
        ));
    };
    let run = run(program, args).map_err(|e| fail(e, "fix the command or its permissions"))?;
    if !run.success {
        return Err(fail(
            format!("failed ({}): {}", run.status, run.stderr.trim()),
            "run the command as the relay's user and fix what it reports",
        ));
    }
    let output: Output = serde_json::from_slice(&run.stdout).map_err(|e| {
        fail(
            format!("printed no credentials JSON ({e})"),
            "make it print {\"Version\": 1, \"AccessKeyId\": …, \"SecretAccessKey\": …}",
        )
    })?;
    if output.version != 1 {
        return Err(fail(
            format!("printed Version {}, not 1", output.version),
            "make it print Version 1, the only one AWS defines",
        ));
    }
    let expires = match output.expiration.as_deref() {
        None => None,
        Some(at) => Some(at.parse::<Timestamp>().map_err(|e| {
            fail(
                format!("printed an Expiration that is no ISO 8601 time: `{at}` ({e})"),
                "make it print Expiration as e.g. 2026-12-02T10:00:00Z",
            )
        })?),
    };
    Ok(Fetched {
        credentials: AwsCredentials::new(
            &output.access_key_id,
            &output.secret_access_key,
            output.session_token.as_deref(),
        ),
        expires,
        from: FROM,
    })
}

/// The command line's words: split at whitespace outside double quotes, quotes removed.
pub(super) fn split(command_line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word: Option<String> = None;
    let mut quoted = false;
    for c in command_line.chars() {
        match c {
            '"' => {
                quoted = !quoted;
                word.get_or_insert_with(String::new);
            }
            c if c.is_whitespace() && !quoted => words.extend(word.take()),
            c => word.get_or_insert_with(String::new).push(c),
        }
    }
    words.extend(word);
    words
}

struct Ran {
    success: bool,
    status: String,
    stdout: Vec<u8>,
    stderr: String,
}

/// Runs the program, its output read as it comes (a full pipe must not stall it), killed
/// after [`PROCESS_TIMEOUT`].
fn run(program: &str, args: &[String]) -> Result<Ran, String> {
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot be started: {e}"))?;
    let read = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let _ = pipe.read_to_end(&mut bytes);
            bytes
        })
    };
    let stdout = child.stdout.take().map(|p| read(Box::new(p)));
    let stderr = child.stderr.take().map(|p| read(Box::new(p)));
    let deadline = Instant::now() + PROCESS_TIMEOUT;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("did not finish in {PROCESS_TIMEOUT:?} (killed)"));
            }
            Err(e) => return Err(format!("cannot be waited for: {e}")),
        }
    };
    let collect = |t: Option<std::thread::JoinHandle<Vec<u8>>>| {
        t.and_then(|t| t.join().ok()).unwrap_or_default()
    };
    Ok(Ran {
        success: status.success(),
        status: status.to_string(),
        stdout: collect(stdout),
        stderr: String::from_utf8_lossy(&collect(stderr)).into_owned(),
    })
}
