//! Re-sent events per SIGKILL: steady writers with known ids, a consumer counting copies.
//!
//! The driver kills and restarts the relay while this runs; a relay killed with `-9` cannot
//! confirm what Kafka already acknowledged, so after a restart PostgreSQL sends those
//! transactions again. At-least-once publishes them again (duplicates); exactly-once should
//! not, for this read_committed consumer. Missing ids would be a lost event: never expected.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::Context;
use rdkafka::consumer::BaseConsumer;
use rdkafka::message::Message;

use crate::kafka::assigned_consumer;
use crate::latency::{numbered_id, write, Expect, Ids, Load, Target};
use crate::records::{Resend, ResendKind};

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
#[derive(Default)]
struct Counts {
    /// Copies per row number.
    copies: HashMap<u64, u32>,
    /// Records whose key was not a numbered id.
    foreign: u64,
}

impl Counts {
    fn poll(&mut self, consumer: &BaseConsumer) {
        match consumer.poll(Duration::from_millis(50)) {
            Some(Ok(m)) => match m.key().and_then(row_of_key) {
                Some(row) => *self.copies.entry(row).or_default() += 1,
                None => self.foreign += 1,
            },
            Some(Err(e)) => eprintln!("outbox-bench: consumer error: {e}"),
            None => {}
        }
    }
}

/// Reads `topic` from the beginning (read_committed) until every expected row arrived and
/// [`TRAILING_READ`] passed, or `settle` after the writers stopped.
fn count_copies(
    brokers: &str,
    topic: &str,
    expect: Expect,
    settle: Duration,
) -> anyhow::Result<Counts> {
    let consumer = assigned_consumer(brokers, &[topic.to_string()], "outbox-bench-resend")?;
    let mut counts = Counts::default();
    let mut settle_deadline: Option<Instant> = None;
    let mut complete_at: Option<Instant> = None;
    loop {
        if let Some(expected) = expect.expected() {
            let now = Instant::now();
            let deadline = *settle_deadline.get_or_insert(now + settle);
            if complete_at.is_none() && counts.copies.len() as u64 >= expected {
                complete_at = Some(now);
            }
            if complete_at.is_some_and(|t| now > t + TRAILING_READ) || now > deadline {
                break;
            }
        }
        counts.poll(&consumer);
    }
    Ok(counts)
}

/// Committed rows that never arrived: how many, and the first few ids.
fn missing(committed_rows: &[(u64, u64)], counts: &Counts) -> (u64, Vec<String>) {
    let mut missing = 0u64;
    let mut sample = Vec::new();
    for &(first, n) in committed_rows {
        for row in (first..first + n).filter(|r| !counts.copies.contains_key(r)) {
            missing += 1;
            if sample.len() < MISSING_SAMPLE {
                sample.push(numbered_id(row));
            }
        }
    }
    (missing, sample)
}

/// Writers with numbered ids at `load`; then the copies of each id the consumer saw.
/// `kills` and `delivery` are the caller's (it SIGKILLs the relay meanwhile).
pub async fn resend(target: &Target<'_>, load: Load, settle: Duration) -> anyhow::Result<Resend> {
    let expect = Expect::new();
    let consumer = {
        let (brokers, topic, expect) = (
            target.brokers.to_string(),
            target.topic.to_string(),
            expect.clone(),
        );
        std::thread::spawn(move || count_copies(&brokers, &topic, expect, settle))
    };
    let (committed_rows, write_seconds) =
        write(target, load, Ids::Numbered, |w| w * 1_000_000_000).await?;
    let committed: u64 = committed_rows.iter().map(|(_, n)| n).sum();
    expect.writers_done(committed);
    let counts = tokio::task::spawn_blocking(move || consumer.join())
        .await?
        .map_err(|_| anyhow::anyhow!("consumer thread panicked"))?
        .context("the resend consumer")?;
    let received: u64 = counts.copies.values().map(|&c| u64::from(c)).sum();
    let (missing, missing_sample) = missing(&committed_rows, &counts);
    let distinct = counts.copies.len() as u64;
    let out = Resend {
        kind: ResendKind,
        delivery: String::new(),
        kills: 0,
        rate_target: load.rate,
        rate_achieved: committed as f64 / write_seconds,
        seconds: load.seconds,
        writers: load.writers,
        committed,
        received,
        distinct,
        duplicates: received - distinct,
        max_copies: counts.copies.values().copied().max().unwrap_or(0).into(),
        missing,
        missing_sample,
        foreign_records: counts.foreign,
        method: "read_committed consumer from the beginning; copies per event id".into(),
    };
    eprintln!(
        "[outbox-bench] resend at {}/s: {committed} committed ({:.0}/s), {received} received, \
         {} duplicates (max {} copies of one event), {missing} missing",
        load.rate, out.rate_achieved, out.duplicates, out.max_copies
    );
    if missing > 0 {
        eprintln!(
            "[outbox-bench] !!!!! {missing} COMMITTED EVENTS NEVER ARRIVED, e.g. {:?} !!!!!",
            out.missing_sample
        );
    }
    Ok(out)
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
