//! A downstream consumer that applies each outbox event exactly once: the inbox pattern.
//!
//! The relay delivers **at least once**: after a crash or a failed delivery it re-sends what
//! Kafka had not confirmed, so a record can arrive twice. A consumer crashes too, between doing
//! its work and committing its Kafka offsets, and then reads the same records again. Neither
//! duplicate may make the consumer act twice (charge a card, send a notification, call a
//! partner API twice). The inbox makes the effect idempotent in the consumer's own database:
//!
//! ```text
//! Kafka records ──▶ BEGIN
//!                     INSERT INTO inbox (event_id, …) VALUES ($id, …)
//!                       ON CONFLICT (event_id) DO NOTHING
//!                     1 row  → first delivery: apply the effect (here: INSERT INTO effects …)
//!                     0 rows → seen before: skip the effect
//!                   COMMIT                      ← the effect and the inbox row, atomically
//!               ──▶ commit the Kafka offsets    ← only after the database commit
//! ```
//!
//! Why it holds, crash by crash:
//! - Crash before the database COMMIT: neither the effect nor the inbox row exists; the offsets
//!   were not committed, so Kafka delivers the records again and they are applied then.
//! - Crash after the database COMMIT, before the offset commit: the records come again, the
//!   inbox insert affects 0 rows, the effect is skipped.
//! - A duplicate from the relay (same event id, new offset): same as above.
//!
//! The offset commit is therefore only an optimisation that bounds how much is re-read after a
//! restart; correctness rests on the inbox row living in the same transaction as the effect.
//! A failed offset commit (e.g. during a rebalance) is logged and otherwise harmless.
//!
//! The event id is read from the relay's `id` header (`ce_id` for CloudEvents binary records),
//! which every record carries. It is not the record key: the key is the event id only while
//! the relay's `outbox.key_column` is unset, and with `key_column = "aggregateid"` (what
//! `outbox-relay config --from-debezium` writes) every event of an aggregate shares one key, so
//! deduplicating on the key would drop all of them but the first. Only a record without the
//! header is deduplicated on its key. The event type and aggregate id are read from the relay's
//! headers too (`type`/`aggregateid`, or `ce_type`/`ce_subject` for CloudEvents binary records).
//!
//! Run it against the relay's topics (flags or environment variables):
//!
//! ```text
//! cargo run --example inbox_consumer -- \
//!     --brokers localhost:9092 --topics outbox.event.order,outbox.event.customer \
//!     --group-id billing --database-url postgres://app@localhost/billing
//! ```
//!
//! It creates its two tables when missing and stops cleanly on SIGTERM or Ctrl-C (the batch
//! in hand is finished and its offsets committed first).

use std::collections::HashMap;
use std::io::IsTerminal;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Parser;
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::message::{Headers, Message};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use tokio::signal::unix::{signal, SignalKind};
use tokio_postgres::{NoTls, Statement};
use tracing::{debug, info, warn};

/// Command-line flags; each can also be given as the environment variable named.
#[derive(Parser, Debug)]
#[command(about = "Applies each outbox event once to a PostgreSQL database (the inbox pattern)")]
struct Args {
    /// Kafka bootstrap servers, comma-separated.
    #[arg(long, env = "INBOX_BROKERS", default_value = "localhost:9092")]
    brokers: String,
    /// Topics to read, comma-separated (a name starting with `^` is a regular expression).
    #[arg(long, env = "INBOX_TOPICS", value_delimiter = ',', required = true)]
    topics: Vec<String>,
    /// Consumer group: instances sharing it split the partitions between them.
    #[arg(long, env = "INBOX_GROUP_ID", default_value = "inbox-consumer")]
    group_id: String,
    /// Static group membership (`group.instance.id`): a restarted instance with the same id
    /// takes its partitions back at once instead of waiting for the session timeout.
    #[arg(long, env = "INBOX_GROUP_INSTANCE_ID")]
    group_instance_id: Option<String>,
    /// The consumer's own database, where the inbox and the effects live.
    #[arg(long, env = "INBOX_DATABASE_URL")]
    database_url: String,
    /// At most this many records are applied in one database transaction.
    #[arg(long, env = "INBOX_BATCH_MAX", default_value_t = 500)]
    batch_max: usize,
    /// How long to wait for more records once a batch has its first one, in milliseconds.
    #[arg(long, env = "INBOX_BATCH_WAIT_MS", default_value_t = 20)]
    batch_wait_ms: u64,
}

/// The inbox (one row per event ever applied) and a stand-in for the business effect.
///
/// `effects` deliberately has no unique constraint on `event_id`: the inbox is the only thing
/// standing between a duplicate delivery and a second application, and a second application
/// would show as a second row.
const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS inbox (
    event_id        text        PRIMARY KEY,
    topic           text        NOT NULL,
    kafka_partition integer     NOT NULL,
    kafka_offset    bigint      NOT NULL,
    received_at     timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS effects (
    id           bigserial   PRIMARY KEY,
    event_id     text        NOT NULL,
    aggregate_id text,
    event_type   text,
    payload      bytea,
    applied_at   timestamptz NOT NULL DEFAULT now()
);
";

/// One Kafka record, copied out of the consumer's buffer.
struct Event {
    id: String,
    event_type: Option<String>,
    aggregate_id: Option<String>,
    payload: Option<Vec<u8>>,
    topic: String,
    partition: i32,
    offset: i64,
}

impl Event {
    fn from_message(m: &impl Message) -> Event {
        let header = |names: &[&str]| -> Option<String> {
            let headers = m.headers()?;
            headers.iter().find_map(|h| {
                if names.contains(&h.key) {
                    h.value.map(|v| String::from_utf8_lossy(v).into_owned())
                } else {
                    None
                }
            })
        };
        // The first of them: a `header_columns` entry named `id` comes after the relay's own.
        // Without the header (not a record of the relay's), the key stands in.
        let id = header(&["id", "ce_id"])
            .unwrap_or_else(|| String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned());
        Event {
            id,
            event_type: header(&["type", "ce_type"]),
            aggregate_id: header(&["aggregateid", "ce_subject"]),
            payload: m.payload().map(<[u8]>::to_vec),
            topic: m.topic().to_string(),
            partition: m.partition(),
            offset: m.offset(),
        }
    }
}

/// The two statements of the pattern, prepared once.
struct Statements {
    /// Records the event; affects 0 rows when it was applied before.
    claim: Statement,
    /// The effect itself: whatever the service does with the event.
    apply: Statement,
}

/// What one batch did.
#[derive(Default)]
struct BatchOutcome {
    applied: usize,
    skipped: usize,
}

#[tokio::main]
async fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("INBOX_LOG")
                .unwrap_or_else(|_| "info,rdkafka=warn".into()),
        )
        .with_ansi(std::io::stdout().is_terminal())
        .init();
    let args = Args::parse();

    let (mut db, connection) = tokio_postgres::connect(&args.database_url, NoTls)
        .await
        .context("connect to the consumer's database")?;
    let connection = tokio::spawn(connection);
    db.batch_execute(SCHEMA)
        .await
        .context("create the inbox and effects tables")?;
    let statements = Statements {
        claim: db
            .prepare(
                "INSERT INTO inbox (event_id, topic, kafka_partition, kafka_offset)
                 VALUES ($1, $2, $3, $4)
                 ON CONFLICT (event_id) DO NOTHING",
            )
            .await?,
        apply: db
            .prepare(
                "INSERT INTO effects (event_id, aggregate_id, event_type, payload)
                 VALUES ($1, $2, $3, $4)",
            )
            .await?,
    };

    let consumer = create_consumer(&args)?;
    let topics: Vec<&str> = args.topics.iter().map(String::as_str).collect();
    consumer.subscribe(&topics).context("subscribe")?;
    info!(topics = ?args.topics, group = %args.group_id, "consuming");

    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sigint = signal(SignalKind::interrupt())?;
    let batch_wait = Duration::from_millis(args.batch_wait_ms);
    loop {
        // 1. Wait for a first record, or stop.
        let first = tokio::select! {
            biased;
            _ = sigterm.recv() => break,
            _ = sigint.recv() => break,
            received = consumer.recv() => received,
        };
        let mut batch = match first {
            Ok(m) => vec![Event::from_message(&m)],
            // Mostly transient (a broker restarting, a topic not created yet): librdkafka
            // recovers by itself.
            Err(e) => {
                warn!(error = %e, "kafka consumer error");
                continue;
            }
        };
        // 2. Take what else is already there, up to the batch size.
        while batch.len() < args.batch_max {
            match tokio::time::timeout(batch_wait, consumer.recv()).await {
                Ok(Ok(m)) => batch.push(Event::from_message(&m)),
                Ok(Err(e)) => warn!(error = %e, "kafka consumer error"),
                Err(_) => break,
            }
        }
        // 3. Apply the batch and its inbox rows in one transaction; a database error ends the
        //    process (uncommitted offsets: the batch is read again after a restart).
        let outcome = apply_batch(&mut db, &statements, &batch).await?;
        // 4. Only now tell Kafka the batch is done.
        commit_offsets(&consumer, &batch);
        debug!(
            records = batch.len(),
            applied = outcome.applied,
            skipped = outcome.skipped,
            "batch done"
        );
    }

    info!("stopping");
    drop(consumer); // leaves the group
    drop(db);
    let _ = connection.await;
    Ok(())
}

fn create_consumer(args: &Args) -> Result<StreamConsumer> {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", &args.brokers)
        .set("group.id", &args.group_id)
        // Offsets are committed by hand, after the database commit.
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        // Skip records of aborted Kafka transactions (librdkafka's default, stated here).
        .set("isolation.level", "read_committed")
        // A new group starts at the oldest record: nothing published before it is missed.
        .set("auto.offset.reset", "earliest")
        .set("enable.partition.eof", "false");
    if let Some(id) = &args.group_instance_id {
        config.set("group.instance.id", id);
    }
    config.create().context("create the Kafka consumer")
}

/// Applies the batch in ONE database transaction: per event, claim its inbox row, and apply
/// the effect only when the claim inserted a row.
async fn apply_batch(
    db: &mut tokio_postgres::Client,
    statements: &Statements,
    batch: &[Event],
) -> Result<BatchOutcome> {
    let tx = db.transaction().await.context("begin")?;
    let mut outcome = BatchOutcome::default();
    for event in batch {
        let claimed = tx
            .execute(
                &statements.claim,
                &[&event.id, &event.topic, &event.partition, &event.offset],
            )
            .await
            .context("insert into inbox")?;
        if claimed == 0 {
            // Applied before: by an earlier delivery, or earlier in this very batch.
            outcome.skipped += 1;
            continue;
        }
        // The business effect goes here. It must use `tx` (not another connection), so that
        // it commits or rolls back together with the inbox row.
        tx.execute(
            &statements.apply,
            &[
                &event.id,
                &event.aggregate_id,
                &event.event_type,
                &event.payload,
            ],
        )
        .await
        .context("apply the effect")?;
        outcome.applied += 1;
    }
    tx.commit().await.context("commit")?;
    Ok(outcome)
}

/// Commits, per partition, the offset after the last record of the batch.
fn commit_offsets(consumer: &StreamConsumer, batch: &[Event]) {
    let mut next: HashMap<(&str, i32), i64> = HashMap::new();
    for event in batch {
        let slot = next.entry((&event.topic, event.partition)).or_default();
        *slot = (*slot).max(event.offset + 1);
    }
    let mut offsets = TopicPartitionList::new();
    for ((topic, partition), offset) in next {
        if let Err(e) = offsets.add_partition_offset(topic, partition, Offset::Offset(offset)) {
            warn!(topic, partition, error = %e, "cannot list offset to commit");
        }
    }
    // Synchronous: when this returns, a restart resumes after the batch. A failure (say, the
    // partition moved to another instance in a rebalance) only means the batch is read again,
    // and the inbox skips it.
    // (block_in_place: the wait must not stall the other tasks of this runtime thread.)
    let committed = tokio::task::block_in_place(|| consumer.commit(&offsets, CommitMode::Sync));
    if let Err(e) = committed {
        warn!(error = %e, "offset commit failed; the batch will be read again and skipped");
    }
}
