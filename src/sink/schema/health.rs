//! What the registry refuses now, by subject: records of those subjects wait. `/readyz` is
//! red and `outbox_relay_schema_registry_blocked{subject}` is 1 while anything is here.
//! Beside the blocks, the subjects served from a `latest` schema whose refresh fails
//! (`outbox_relay_schema_registry_stale_seconds{subject}`, a warning; records flow).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use tracing::warn;

/// A block still in force is logged again this often.
const LOG_INTERVAL: Duration = Duration::from_secs(30);

#[derive(Debug)]
pub struct RegistryHealth {
    url: String,
    entries: Mutex<BTreeMap<String, Entry>>,
    any: AtomicBool,
    /// Subjects served from a stale `latest` schema: the age of the schema.
    stale: Mutex<BTreeMap<String, Stale>>,
    any_stale: AtomicBool,
}

#[derive(Debug)]
struct Stale {
    age: Duration,
    last_logged: Option<Instant>,
}

#[derive(Debug)]
struct Entry {
    since: Instant,
    error: String,
    last_logged: Instant,
}

impl RegistryHealth {
    pub fn new(url: &str) -> RegistryHealth {
        RegistryHealth {
            url: url.to_string(),
            entries: Mutex::default(),
            any: AtomicBool::new(false),
            stale: Mutex::default(),
            any_stale: AtomicBool::new(false),
        }
    }

    fn stale_entries(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Stale>> {
        self.stale.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `subject`'s `latest` schema, `age` old, is used although its refresh failed with
    /// `error`, until it is `limit` old; logged when it starts and every [`LOG_INTERVAL`]
    /// while it lasts.
    pub fn serving_stale(
        &self,
        subject: &str,
        age: Duration,
        limit: Duration,
        error: &dyn std::fmt::Display,
    ) {
        let mut stale = self.stale_entries();
        let entry = stale.entry(subject.to_string()).or_insert(Stale {
            age,
            last_logged: None,
        });
        entry.age = age;
        self.any_stale.store(true, Ordering::Release);
        if entry
            .last_logged
            .is_none_or(|at| at.elapsed() >= LOG_INTERVAL)
        {
            entry.last_logged = Some(Instant::now());
            warn!(subject, registry = %self.url, error = %error, age_s = age.as_secs(),
                limit_s = limit.as_secs(),
                "cannot refresh the subject's latest schema: the cached one is used meanwhile, until it is older than the limit (then its records wait)");
        }
    }

    /// `subject`'s `latest` schema was refreshed (or is no longer used).
    pub fn fresh(&self, subject: &str) {
        if !self.any_stale.load(Ordering::Acquire) {
            return;
        }
        let mut stale = self.stale_entries();
        if stale.remove(subject).is_some() {
            tracing::info!(subject, "the subject's latest schema is refreshed again");
        }
        self.any_stale.store(!stale.is_empty(), Ordering::Release);
    }

    /// The subjects served from a stale schema, and the schema's age when last used.
    pub fn stale(&self) -> Vec<(String, Duration)> {
        if !self.any_stale.load(Ordering::Acquire) {
            return Vec::new();
        }
        self.stale_entries()
            .iter()
            .map(|(s, e)| (s.clone(), e.age))
            .collect()
    }

    fn entries(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Entry>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records (or refreshes) a block of `subject`; logged when new and every
    /// [`LOG_INTERVAL`] while it lasts.
    pub fn block(&self, subject: &str, error: &dyn std::fmt::Display) {
        let now = Instant::now();
        let mut entries = self.entries();
        let entry = entries.entry(subject.to_string()).or_insert_with(|| Entry {
            since: now,
            error: String::new(),
            last_logged: now - LOG_INTERVAL,
        });
        entry.error = error.to_string();
        self.any.store(true, Ordering::Release);
        if entry.last_logged.elapsed() >= LOG_INTERVAL {
            entry.last_logged = now;
            warn!(subject, registry = %self.url, error = %entry.error,
                blocked_s = now.duration_since(entry.since).as_secs(),
                "no schema from the registry: records wait (the slot is not confirmed past them) and go out once it answers");
        }
    }

    /// A schema arrived for `subject`. One atomic load when nothing is blocked.
    pub fn clear(&self, subject: &str) {
        if !self.any.load(Ordering::Acquire) {
            return;
        }
        let mut entries = self.entries();
        if entries.remove(subject).is_some() {
            tracing::info!(subject, "schema registry block lifted");
        }
        self.any.store(!entries.is_empty(), Ordering::Release);
    }

    /// The blocked subjects and since when.
    pub fn current(&self) -> Vec<(String, Duration)> {
        if !self.any.load(Ordering::Acquire) {
            return Vec::new();
        }
        self.entries()
            .iter()
            .map(|(s, e)| (s.clone(), e.since.elapsed()))
            .collect()
    }

    /// One line for `/readyz`: the oldest block.
    pub fn readiness(&self) -> Result<(), String> {
        if !self.any.load(Ordering::Acquire) {
            return Ok(());
        }
        let entries = self.entries();
        let Some((subject, entry)) = entries.iter().min_by_key(|(_, e)| e.since) else {
            return Ok(());
        };
        Err(format!(
            "schema registry blocked ({} subjects): subject `{subject}` for {:.0}s: {}",
            entries.len(),
            entry.since.elapsed().as_secs_f64(),
            entry.error
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_is_red_until_its_subject_gets_a_schema() {
        let h = RegistryHealth::new("http://r");
        assert!(h.readiness().is_ok());
        h.block("orders-value", &"connection refused");
        h.block("users-value", &"HTTP 503");
        let why = h.readiness().unwrap_err();
        assert!(why.contains("orders-value"), "{why}");
        assert!(why.contains("connection refused"), "{why}");
        assert_eq!(h.current().len(), 2);
        h.clear("orders-value");
        h.clear("users-value");
        assert!(h.readiness().is_ok());
        assert!(h.current().is_empty());
    }

    #[test]
    fn a_stale_schema_is_listed_until_refreshed_and_keeps_readyz_green() {
        let h = RegistryHealth::new("http://r");
        let hour = Duration::from_secs(3600);
        h.serving_stale("orders-value", Duration::from_secs(7), hour, &"HTTP 503");
        h.serving_stale("orders-value", Duration::from_secs(9), hour, &"HTTP 503");
        assert_eq!(
            h.stale(),
            vec![("orders-value".to_string(), Duration::from_secs(9))]
        );
        assert!(h.readiness().is_ok(), "records flow");
        h.fresh("orders-value");
        assert!(h.stale().is_empty());
    }
}
