//! `credential_process` profiles, with small shell scripts as the process.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use jiff::{SignedDuration, Timestamp};

use super::process::split;
use super::*;

fn dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("aws-process-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// An executable `name` in `dir` running `body` (sh), each run appending a line to `runs`.
fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
    let path = dir.join(name);
    let runs = dir.join("runs");
    std::fs::write(
        &path,
        format!("#!/bin/sh\necho run >> '{}'\n{body}\n", runs.display()),
    )
    .unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

fn runs(dir: &Path) -> usize {
    std::fs::read_to_string(dir.join("runs"))
        .map(|s| s.lines().count())
        .unwrap_or(0)
}

/// A provider whose only source is profile `relay` of a config file running `command`.
fn provider_running(dir: &Path, command: &str) -> CredentialsProvider {
    let config = dir.join("config");
    std::fs::write(
        &config,
        format!("[profile relay]\ncredential_process = {command}\n"),
    )
    .unwrap();
    let config = config.to_str().unwrap().to_string();
    CredentialsProvider::new(Env::from_pairs([
        ("AWS_EC2_METADATA_DISABLED", "true"),
        ("HOME", "/nonexistent"),
        ("AWS_CONFIG_FILE", config.as_str()),
        ("AWS_PROFILE", "relay"),
    ]))
}

fn printing(expiration: Option<Timestamp>) -> String {
    let expiration = expiration.map_or(String::new(), |at| format!(r#", "Expiration": "{at}""#));
    format!(
        r#"echo '{{"Version": 1, "AccessKeyId": "ASIAPROC", "SecretAccessKey": "proc/secret", "SessionToken": "proc-token"{expiration}}}'"#
    )
}

#[test]
fn a_credential_process_gives_its_credentials_kept_until_near_expiry() {
    let dir = dir("lasting");
    let expires = Timestamp::now() + SignedDuration::from_hours(1);
    // A path with a space, quoted as the SDKs take it; an argument after it.
    std::fs::create_dir_all(dir.join("with space")).unwrap();
    let path = script(&dir.join("with space"), "creds", &printing(Some(expires)));
    let provider = provider_running(&dir, &format!("\"{}\" --profile relay", path.display()));
    let found = provider.credentials().unwrap();
    assert_eq!(
        found.credentials,
        AwsCredentials::new("ASIAPROC", "proc/secret", Some("proc-token"))
    );
    assert_eq!(found.from, "a profile's credential_process");
    assert_eq!(
        found.expires.map(|t| t.as_second()),
        Some(expires.as_second())
    );
    for _ in 0..3 {
        provider.credentials().unwrap();
    }
    let ran = std::fs::read_to_string(dir.join("with space/runs")).unwrap_or_default();
    assert_eq!(ran.lines().count(), 1, "run once, then cached");
}

#[test]
fn credentials_near_their_expiry_are_fetched_again_and_none_never_expire() {
    let dir = dir("expiring");
    let soon = Timestamp::now() + SignedDuration::try_from(REFRESH_BEFORE_EXPIRY / 2).unwrap();
    let path = script(&dir, "creds", &printing(Some(soon)));
    let provider = provider_running(&dir, path.to_str().unwrap());
    for _ in 0..3 {
        provider.credentials().unwrap();
        provider.settle();
    }
    assert_eq!(runs(&dir), 3, "inside the refresh margin: run at each call");

    let dir = self::dir("long-term");
    let path = script(&dir, "creds", &printing(None));
    let provider = provider_running(&dir, path.to_str().unwrap());
    for _ in 0..3 {
        assert_eq!(provider.credentials().unwrap().expires, None);
    }
    assert_eq!(runs(&dir), 1);
}

#[test]
fn a_failing_process_is_reported_with_the_profile_and_its_stderr() {
    let dir = dir("failing");
    let path = script(
        &dir,
        "creds",
        "echo 'the vault session expired: run vault login' >&2\nexit 3",
    );
    let err = provider_running(&dir, path.to_str().unwrap())
        .credentials()
        .unwrap_err()
        .to_string();
    assert!(err.contains("profile `relay`"), "{err}");
    assert!(err.contains(path.to_str().unwrap()), "{err}");
    assert!(
        err.contains("the vault session expired: run vault login"),
        "{err}"
    );
    assert!(err.contains("exit status: 3"), "{err}");

    let missing = provider_running(&dir, "/nonexistent/creds")
        .credentials()
        .unwrap_err()
        .to_string();
    assert!(missing.contains("cannot be started"), "{missing}");
}

#[test]
fn output_that_is_not_version_1_credentials_is_refused() {
    for (name, body, expect) in [
        (
            "v2",
            r#"echo '{"Version": 2, "AccessKeyId": "A", "SecretAccessKey": "S"}'"#,
            "Version 2, not 1",
        ),
        ("text", "echo hello", "printed no credentials JSON"),
        (
            "no-secret",
            r#"echo '{"Version": 1, "AccessKeyId": "A"}'"#,
            "printed no credentials JSON",
        ),
        (
            "bad-time",
            r#"echo '{"Version": 1, "AccessKeyId": "A", "SecretAccessKey": "S", "Expiration": "tomorrow"}'"#,
            "no ISO 8601 time",
        ),
    ] {
        let dir = dir(name);
        let path = script(&dir, "creds", body);
        let err = provider_running(&dir, path.to_str().unwrap())
            .credentials()
            .unwrap_err()
            .to_string();
        assert!(err.contains(expect), "{name}: {err}");
    }
}

#[test]
fn the_command_line_splits_at_spaces_outside_double_quotes() {
    assert_eq!(
        split(r#"  "/opt/my tools/creds" --role  "a b" x "#),
        ["/opt/my tools/creds", "--role", "a b", "x"]
    );
    assert_eq!(split(r#"cmd """#), ["cmd", ""]);
    assert!(split("   ").is_empty());
}

/// A refresh whose `credential_process` takes 20 s (a vault, an SSO helper) blocks no caller
/// while the current credentials are valid: they are returned at once and the refresh runs in
/// the background. Callers include the runtime thread (PostgreSQL logins) and the thread that
/// serves Kafka's delivery reports (MSK tokens): a blocked call froze status updates and acks.
#[test]
fn a_slow_refresh_blocks_no_caller_while_the_current_credentials_are_valid() {
    let dir = dir("slow");
    let soon = Timestamp::now() + SignedDuration::try_from(REFRESH_BEFORE_EXPIRY / 2).unwrap();
    // The first run answers at once; every later one sleeps 20 s first.
    let body = format!(
        "if [ \"$(wc -l < '{}')\" -gt 1 ]; then sleep 20; fi\n{}",
        dir.join("runs").display(),
        printing(Some(soon))
    );
    let path = script(&dir, "creds", &body);
    let provider = provider_running(&dir, path.to_str().unwrap());
    provider.credentials().unwrap();
    let began = std::time::Instant::now();
    for _ in 0..100 {
        let found = provider.credentials().unwrap();
        assert_eq!(found.credentials.access_key_id, "ASIAPROC");
    }
    let took = began.elapsed();
    assert!(
        took < std::time::Duration::from_secs(5),
        "100 calls took {took:?} while a 20 s refresh ran"
    );
    // The refresh started (its process runs, sleeping), and only one.
    let waiting = std::time::Instant::now();
    while runs(&dir) < 2 && waiting.elapsed() < std::time::Duration::from_secs(10) {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    provider.credentials().unwrap();
    assert_eq!(runs(&dir), 2, "one refresh at a time");
    // Without valid credentials a caller waits, bounded.
    let expired = Timestamp::now() - SignedDuration::from_mins(1);
    let dir = self::dir("slow-expired");
    let body = format!("sleep 20\n{}", printing(Some(expired)));
    let path = script(&dir, "creds", &body);
    let provider = provider_running(&dir, path.to_str().unwrap());
    let began = std::time::Instant::now();
    let err = provider
        .credentials_within(std::time::Duration::from_millis(300))
        .unwrap_err()
        .to_string();
    assert!(
        began.elapsed() < std::time::Duration::from_secs(5),
        "unbounded wait"
    );
    assert!(err.contains("no credentials after"), "{err}");
}
