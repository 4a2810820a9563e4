//! What the registry refuses now, by subject: records of those subjects wait. `/readyz` is
//! red and `outbox_relay_schema_registry_blocked{subject}` is 1 while anything is here.

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
        }
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
}
