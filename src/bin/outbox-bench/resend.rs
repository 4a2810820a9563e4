//! Re-sent events per SIGKILL: steady writers with known ids, a consumer counting copies.
//!
//! The script kills and restarts the relay while this runs; a relay killed with `-9` cannot
//! confirm what Kafka already acknowledged, so after a restart PostgreSQL sends those
//! transactions again. At-least-once publishes them again (duplicates); exactly-once should
//! not, for this read_committed consumer. Missing ids would be a lost event: never expected.

use std::collections::HashMap;

use super::latency::assigned_consumer;
use super::*;

/// After every committed id arrived, keep reading this long for late copies.
const TRAILING_READ: Duration = Duration::from_secs(2);
/// Missing ids listed in the output (the count is always complete).
const MISSING_SAMPLE: usize = 10;

/// The row number in a record key written by [`numbered_id`]: the UUID's last 48 bits, from
/// its text form or its 16 raw bytes.
fn row_of_key(key: &[u8]) -> Option<u64> {
    match key.len() {
        16 => Some(key[10..].iter().fold(0u64, |n, b| n << 8 | u64::from(*b))),
        36 => u64::from_str_radix(std::str::from_utf8(&key[24..]).ok()?, 16).ok(),
        _ => None,
    }
}

/// What the consumer saw.
struct Counts {
    /// Copies per row number.
    copies: HashMap<u64, u32>,
    /// Records whose key was not a numbered id.
    foreign: u64,
}

/// Reads `topic` from the beginning (read_committed) until every one of `expected` rows (set
/// once the writers are done) arrived and [`TRAILING_READ`] passed, or `settle` after the
/// writers stopped.
fn count_copies(
    brokers: &str,
    topic: &str,
    expected: Arc<AtomicU64>,
    writers_done: Arc<AtomicBool>,
    settle: Duration,
) -> anyhow::Result<Counts> {
    let consumer = assigned_consumer(brokers, topic, "outbox-bench-resend")?;
    let mut counts = Counts {
        copies: HashMap::new(),
        foreign: 0,
    };
    let mut settle_deadline: Option<Instant> = None;
    let mut complete_at: Option<Instant> = None;
    loop {
        if writers_done.load(Ordering::Acquire) {
            let now = Instant::now();
            let deadline = *settle_deadline.get_or_insert(now + settle);
            if complete_at.is_none()
                && counts.copies.len() as u64 >= expected.load(Ordering::Acquire)
            {
                complete_at = Some(now);
            }
            if complete_at.is_some_and(|t| now > t + TRAILING_READ) || now > deadline {
                break;
            }
        }
        match consumer.poll(Duration::from_millis(50)) {
            Some(Ok(m)) => match m.key().and_then(row_of_key) {
                Some(row) => *counts.copies.entry(row).or_default() += 1,
                None => counts.foreign += 1,
            },
            Some(Err(e)) => eprintln!("outbox-bench: consumer error: {e}"),
            None => {}
        }
    }
    Ok(counts)
}

pub(super) async fn resend(
    url: &str,
    brokers: &str,
    topic: &str,
    aggregate_type: &str,
    load: Load,
    settle: Duration,
) -> anyhow::Result<Value> {
    let Load {
        rate,
        seconds,
        writers,
    } = load;
    let expected = Arc::new(AtomicU64::new(u64::MAX));
    let writers_done = Arc::new(AtomicBool::new(false));
    let consumer = {
        let (brokers, topic) = (brokers.to_string(), topic.to_string());
        let (expected, writers_done) = (expected.clone(), writers_done.clone());
        std::thread::spawn(move || count_copies(&brokers, &topic, expected, writers_done, settle))
    };
    let start = Instant::now();
    let duration = Duration::from_secs(seconds);
    let per_writer = rate as f64 / writers as f64;
    let first_id = |w: u64| w * 1_000_000_000;
    let tasks: Vec<_> = (0..writers)
        .map(|w| {
            tokio::spawn(writer(
                url.to_string(),
                aggregate_type.to_string(),
                per_writer,
                first_id(w),
                Ids::Numbered,
                start,
                duration,
            ))
        })
        .collect();
    // Writer w committed rows first_id(w) .. first_id(w) + n, all of them (an error ends the run).
    let mut committed_rows = Vec::new();
    for (w, task) in (0..writers).zip(tasks) {
        let n = task.await??;
        committed_rows.push((first_id(w), n));
    }
    let write_seconds = start.elapsed().as_secs_f64();
    let committed: u64 = committed_rows.iter().map(|(_, n)| n).sum();
    expected.store(committed, Ordering::Release);
    writers_done.store(true, Ordering::Release);
    let counts = tokio::task::spawn_blocking(move || consumer.join())
        .await?
        .map_err(|_| anyhow::anyhow!("consumer thread panicked"))??;

    let received: u64 = counts.copies.values().map(|&c| u64::from(c)).sum();
    let mut missing = 0u64;
    let mut missing_sample = Vec::new();
    for &(first, n) in &committed_rows {
        for row in first..first + n {
            if !counts.copies.contains_key(&row) {
                missing += 1;
                if missing_sample.len() < MISSING_SAMPLE {
                    missing_sample.push(numbered_id(row));
                }
            }
        }
    }
    let distinct = counts.copies.len() as u64;
    let duplicates = received - distinct;
    let max_copies = counts.copies.values().copied().max().unwrap_or(0);
    eprintln!(
        "[outbox-bench] resend at {rate}/s: {committed} committed ({:.0}/s), {received} received, \
         {duplicates} duplicates (max {max_copies} copies of one event), {missing} missing",
        committed as f64 / write_seconds,
    );
    if missing > 0 {
        eprintln!(
            "[outbox-bench] !!!!! {missing} COMMITTED EVENTS NEVER ARRIVED, e.g. {missing_sample:?} !!!!!"
        );
    }
    Ok(json!({
        "rate_target": rate,
        "rate_achieved": committed as f64 / write_seconds,
        "seconds": seconds,
        "writers": writers,
        "committed": committed,
        "received": received,
        "distinct": distinct,
        "duplicates": duplicates,
        "max_copies": max_copies,
        "missing": missing,
        "missing_sample": missing_sample,
        "foreign_records": counts.foreign,
        "method": "read_committed consumer from the beginning; copies per event id",
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbered_ids_round_trip_through_text_and_bytes() {
        let id = numbered_id(3_000_000_123);
        assert_eq!(row_of_key(id.as_bytes()), Some(3_000_000_123));
        let raw: Vec<u8> = (0..16)
            .map(|i| u8::from_str_radix(&id.replace('-', "")[2 * i..2 * i + 2], 16).unwrap())
            .collect();
        assert_eq!(row_of_key(&raw), Some(3_000_000_123));
        assert_eq!(row_of_key(b"not an id"), None);
    }
}
