//! The pacer against a fake producer that records what it was handed.

use std::sync::{Arc, Mutex, Weak};

use bytes::Bytes;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};

use super::{Pacer, RequestSize, Sender, PACED_BIT, PARTITION_LIMIT};
use crate::mapping::Record;

/// What the fake producer saw: sends as (topic, partition, opaque without the bit), and
/// failures as opaques; it refuses every send while `refuse` is set (its queue is full),
/// and records over `max_bytes` as too large.
struct Fake {
    sent: Mutex<Vec<(String, i32, usize)>>,
    failed: Mutex<Vec<usize>>,
    refuse: Mutex<bool>,
    max_bytes: usize,
}

impl Default for Fake {
    fn default() -> Fake {
        Fake {
            sent: Mutex::default(),
            failed: Mutex::default(),
            refuse: Mutex::default(),
            max_bytes: usize::MAX,
        }
    }
}

impl Sender for Fake {
    fn send(&self, record: &Record, partition: i32, opaque: usize) -> Result<(), KafkaError> {
        assert_ne!(opaque & PACED_BIT, 0, "a paced record without its bit");
        if *self.refuse.lock().unwrap() {
            return Err(KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull));
        }
        if record.size() > self.max_bytes {
            return Err(KafkaError::MessageProduction(
                RDKafkaErrorCode::MessageSizeTooLarge,
            ));
        }
        let entry = (record.topic.clone(), partition, opaque & !PACED_BIT);
        self.sent.lock().unwrap().push(entry);
        Ok(())
    }

    fn fail(&self, _record: Record, opaque: usize, _error: KafkaError) {
        self.failed.lock().unwrap().push(opaque & !PACED_BIT);
    }
}

impl Fake {
    fn sent_opaques(&self) -> Vec<usize> {
        self.sent.lock().unwrap().iter().map(|s| s.2).collect()
    }
}

fn record(topic: &str, payload_bytes: usize) -> Record {
    Record {
        topic: topic.into(),
        key: Bytes::from_static(b"k"),
        payload: Some(Bytes::from(vec![b'x'; payload_bytes])),
        headers: Vec::new(),
        timestamp_ms: None,
        partition: None,
        partition_key: None,
    }
}

fn pacer(messages: usize, bytes: usize) -> (Pacer, Arc<Fake>) {
    let pacer = Pacer::new(RequestSize { messages, bytes });
    let fake = Arc::new(Fake::default());
    // Weakly, as it holds the producer: `fake` keeps it alive.
    let sender: Weak<dyn Sender> = Arc::downgrade(&fake) as Weak<dyn Sender>;
    pacer.attach(sender);
    (pacer, fake)
}

#[test]
fn a_partition_takes_its_limit_and_the_rest_waits_in_order() {
    let (pacer, fake) = pacer(100, 1 << 20);
    for opaque in 0..PARTITION_LIMIT + 3 {
        pacer
            .offer(fake.as_ref(), &record("t", 10), opaque, 0)
            .unwrap();
    }
    assert_eq!(
        fake.sent_opaques(),
        (0..PARTITION_LIMIT).collect::<Vec<_>>()
    );
    assert!(pacer.holds_any());
    // Another partition, and the same partition of another topic, are not held back.
    pacer
        .offer(fake.as_ref(), &record("t", 10), 100, 1)
        .unwrap();
    pacer
        .offer(fake.as_ref(), &record("u", 10), 101, 0)
        .unwrap();
    assert_eq!(fake.sent_opaques()[PARTITION_LIMIT..], [100, 101]);

    pacer.delivered("t", 0);
    let sent = fake.sent_opaques();
    assert_eq!(
        sent[PARTITION_LIMIT + 2..],
        [PARTITION_LIMIT, PARTITION_LIMIT + 1, PARTITION_LIMIT + 2],
        "the report that freed room releases the held records, oldest first"
    );
    assert!(!pacer.holds_any());
    let partitions: Vec<_> = fake.sent.lock().unwrap().iter().map(|s| s.1).collect();
    assert_eq!(partitions.iter().filter(|p| **p == 1).count(), 1);
}

#[test]
fn a_release_is_one_request_by_count_and_by_bytes() {
    let (pacer, fake) = pacer(3, 250);
    for opaque in 0..PARTITION_LIMIT + 10 {
        pacer
            .offer(fake.as_ref(), &record("t", 99), opaque, 0)
            .unwrap();
    }
    // Each record is 100 bytes (key and payload): two fit the 250 bytes, three the count.
    pacer.delivered("t", 0);
    assert_eq!(fake.sent_opaques().len(), PARTITION_LIMIT + 2);
    // Six in librdkafka now: room again only once two more are acknowledged.
    pacer.delivered("t", 0);
    assert_eq!(fake.sent_opaques().len(), PARTITION_LIMIT + 2);
    pacer.delivered("t", 0);
    assert_eq!(fake.sent_opaques().len(), PARTITION_LIMIT + 4);
    // A record larger than a request still goes, alone.
    let (pacer, fake) = pacer_with_held(1_000);
    pacer.delivered("t", 0);
    assert_eq!(
        fake.sent_opaques(),
        (0..=PARTITION_LIMIT).collect::<Vec<_>>()
    );
}

/// A pacer whose partition 0 of `t` is full with one held record of `payload_bytes`.
fn pacer_with_held(payload_bytes: usize) -> (Pacer, Arc<Fake>) {
    let (pacer, fake) = pacer(3, 250);
    for opaque in 0..PARTITION_LIMIT {
        pacer
            .offer(fake.as_ref(), &record("t", 1), opaque, 0)
            .unwrap();
    }
    let big = record("t", payload_bytes);
    pacer
        .offer(fake.as_ref(), &big, PARTITION_LIMIT, 0)
        .unwrap();
    (pacer, fake)
}

#[test]
fn a_record_behind_held_ones_waits_even_when_there_is_room() {
    let (pacer, fake) = pacer(1, 1 << 20);
    for opaque in 0..PARTITION_LIMIT + 3 {
        pacer
            .offer(fake.as_ref(), &record("t", 1), opaque, 0)
            .unwrap();
    }
    // Room for one more after a report, but two still wait: a new one goes behind them.
    pacer.delivered("t", 0);
    pacer.offer(fake.as_ref(), &record("t", 1), 99, 0).unwrap();
    assert_eq!(fake.sent_opaques().last(), Some(&PARTITION_LIMIT));
    for _ in 0..3 {
        pacer.delivered("t", 0);
    }
    assert_eq!(
        fake.sent_opaques()[PARTITION_LIMIT..],
        [
            PARTITION_LIMIT,
            PARTITION_LIMIT + 1,
            PARTITION_LIMIT + 2,
            99
        ]
    );
}

#[test]
fn a_refused_release_fails_it_and_everything_behind_it_and_the_gate_goes_on() {
    let (pacer, fake) = pacer(100, 1 << 20);
    for opaque in 0..PARTITION_LIMIT + 3 {
        pacer
            .offer(fake.as_ref(), &record("t", 1), opaque, 0)
            .unwrap();
    }
    *fake.refuse.lock().unwrap() = true;
    pacer.delivered("t", 0);
    assert_eq!(
        *fake.failed.lock().unwrap(),
        [PARTITION_LIMIT, PARTITION_LIMIT + 1, PARTITION_LIMIT + 2]
    );
    assert!(!pacer.holds_any());
    *fake.refuse.lock().unwrap() = false;
    pacer.offer(fake.as_ref(), &record("t", 1), 50, 0).unwrap();
    assert_eq!(
        fake.sent_opaques().last(),
        Some(&50),
        "the gate has room again"
    );
}

#[test]
fn a_refused_offer_changes_nothing() {
    let (pacer, fake) = pacer(100, 1 << 20);
    *fake.refuse.lock().unwrap() = true;
    assert!(pacer.offer(fake.as_ref(), &record("t", 1), 0, 0).is_err());
    *fake.refuse.lock().unwrap() = false;
    for opaque in 1..=PARTITION_LIMIT {
        pacer
            .offer(fake.as_ref(), &record("t", 1), opaque, 0)
            .unwrap();
    }
    assert_eq!(
        fake.sent_opaques(),
        (1..=PARTITION_LIMIT).collect::<Vec<_>>()
    );
    assert!(!pacer.holds_any(), "the refused record took no room");
}

#[test]
fn a_report_after_the_producer_went_does_nothing() {
    let pacer = Pacer::new(RequestSize {
        messages: 10,
        bytes: 1 << 20,
    });
    let fake = Arc::new(Fake::default());
    let gone: Weak<dyn Sender> = {
        let sender: Arc<dyn Sender> = Arc::new(Fake::default());
        Arc::downgrade(&sender)
    };
    pacer.attach(gone);
    for opaque in 0..PARTITION_LIMIT + 1 {
        pacer
            .offer(fake.as_ref(), &record("t", 1), opaque, 0)
            .unwrap();
    }
    pacer.delivered("t", 0);
    assert_eq!(fake.sent_opaques().len(), PARTITION_LIMIT);
}

#[test]
fn a_record_refused_for_itself_fails_alone_and_the_ones_behind_it_go() {
    let pacer = Pacer::new(RequestSize {
        messages: 100,
        bytes: 1 << 20,
    });
    let fake = Arc::new(Fake {
        max_bytes: 1_000,
        ..Fake::default()
    });
    pacer.attach(Arc::downgrade(&fake) as Weak<dyn Sender>);
    for opaque in 0..PARTITION_LIMIT {
        pacer
            .offer(fake.as_ref(), &record("t", 1), opaque, 0)
            .unwrap();
    }
    let too_large = record("t", 5_000);
    pacer
        .offer(fake.as_ref(), &too_large, PARTITION_LIMIT, 0)
        .unwrap();
    for opaque in PARTITION_LIMIT + 1..PARTITION_LIMIT + 3 {
        pacer
            .offer(fake.as_ref(), &record("t", 1), opaque, 0)
            .unwrap();
    }
    pacer.delivered("t", 0);
    assert_eq!(*fake.failed.lock().unwrap(), [PARTITION_LIMIT]);
    assert_eq!(
        fake.sent_opaques()[PARTITION_LIMIT..],
        [PARTITION_LIMIT + 1, PARTITION_LIMIT + 2],
        "the records behind the refused one were held back"
    );
    assert!(!pacer.holds_any());
}
