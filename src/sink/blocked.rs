//! Deployment errors are not poison records. A missing ACL, a missing topic, a refused topic
//! creation or a refused login is the operator's to fix, and every record it stops would go
//! through once fixed: such records are kept and retried, never dead-lettered, and the slot is
//! never confirmed past them. Meanwhile [`Blocked`] holds what stops them, which `/readyz`
//! (red while anything is blocked) and `outbox_relay_kafka_blocked{reason,topic}` show, and
//! the log says the fix (the `kafka-acls` command that grants the missing permission).
//!
//! | Kafka says | class | what the relay does |
//! |---|---|---|
//! | `TOPIC_AUTHORIZATION_FAILED` | blocked `topic_authorization` | records wait (first metadata) or the session restarts (a refused produce); retried |
//! | `CLUSTER_AUTHORIZATION_FAILED` | blocked `cluster_authorization` | as above |
//! | `TRANSACTIONAL_ID_AUTHORIZATION_FAILED` | blocked `transactional_id_authorization` | the session restarts with back-off |
//! | SASL authentication failed | blocked `authentication` | librdkafka reconnects; records wait |
//! | `UNKNOWN_TOPIC_OR_PARTITION` | blocked `unknown_topic` | records of that topic wait, other topics go on |
//! | topic creation refused | blocked `topic_creation` | records of that topic wait |
//! | `INVALID_TIMESTAMP`, or `INVALID_RECORD` for a record outside its topic's timestamp window | blocked `record_timestamp` | the session restarts with back-off; nothing is dead-lettered |
//!
//! Which code means which block is `sink::fault`'s one list (`CODES`); a row's own timestamp
//! (`timestamp_column`) outside the window is the row's fault there, not a block.
//!
//! A block is lifted by the first success that shows it fixed: a record delivered to the
//! topic, its metadata read (a topic that appeared), a transactional producer initialised.
//! Login failures are reported by librdkafka at every reconnect attempt; one not repeated for
//! [`AUTHENTICATION_EXPIRY`] is over.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use tracing::warn;

use crate::config::KafkaConfig;
use crate::sink::limits::TopicLimits;

/// Why records cannot go to Kafka now, though nothing is wrong with them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum BlockReason {
    TopicAuthorization,
    ClusterAuthorization,
    TransactionalIdAuthorization,
    Authentication,
    UnknownTopic,
    TopicCreation,
    /// The topic's timestamp window (`message.timestamp.before.max.ms`/`after.max.ms`,
    /// CreateTime) refuses the records' timestamps: a backlog older than the window, or
    /// clocks apart. The topic's setting, not the records.
    RecordTimestamp,
}

impl BlockReason {
    /// Every reason, for the metrics reference's `reason` values. `name` matches every
    /// variant, so a new one is named there; list it here too.
    pub const ALL: [BlockReason; 7] = [
        BlockReason::TopicAuthorization,
        BlockReason::ClusterAuthorization,
        BlockReason::TransactionalIdAuthorization,
        BlockReason::Authentication,
        BlockReason::UnknownTopic,
        BlockReason::TopicCreation,
        BlockReason::RecordTimestamp,
    ];

    /// The `reason` label.
    pub fn name(self) -> &'static str {
        match self {
            BlockReason::TopicAuthorization => "topic_authorization",
            BlockReason::ClusterAuthorization => "cluster_authorization",
            BlockReason::TransactionalIdAuthorization => "transactional_id_authorization",
            BlockReason::Authentication => "authentication",
            BlockReason::UnknownTopic => "unknown_topic",
            BlockReason::TopicCreation => "topic_creation",
            BlockReason::RecordTimestamp => "record_timestamp",
        }
    }

    /// Lifted by a record delivered to the topic (or, for the cluster-wide ones, to any).
    fn lifted_by_delivery(self, blocked_topic: &str, delivered_to: &str) -> bool {
        match self {
            BlockReason::Authentication | BlockReason::ClusterAuthorization => true,
            BlockReason::TransactionalIdAuthorization => false,
            BlockReason::TopicAuthorization
            | BlockReason::UnknownTopic
            | BlockReason::TopicCreation
            | BlockReason::RecordTimestamp => blocked_topic == delivered_to,
        }
    }
}

/// A login failure not reported again for this long is over. librdkafka fails a login at every
/// reconnect attempt (at most `reconnect.backoff.max.ms`, 10 s by default, apart) but reports
/// an identical failure of a broker to the application only once per 30 s, and a failed
/// OAUTHBEARER token fetch only when its message changes: more than one such period, so that
/// a refusal that lasts does not blink green between reports.
pub const AUTHENTICATION_EXPIRY: Duration = Duration::from_secs(75);
/// A block still in force is logged again this often.
const LOG_INTERVAL: Duration = Duration::from_secs(60);

/// What stops records now, by reason and subject (a topic, a transactional id, or empty for
/// the whole cluster). Shared by the publisher, its librdkafka callbacks and the metrics.
#[derive(Debug)]
pub struct Blocked {
    entries: Mutex<BTreeMap<(BlockReason, String), Entry>>,
    /// Some entry exists: the delivery path looks at the map only then.
    any: AtomicBool,
    /// For the fixes: how the relay logs in, and where.
    principal: String,
    brokers: String,
    /// The settings a refused login is fixed in.
    login_fields: &'static str,
    /// Each topic's record limit: not a block, but learned the same way (from the brokers'
    /// answers) and kept as long, so that the next session's producer batches within it.
    limits: TopicLimits,
}

#[derive(Debug)]
struct Entry {
    since: Instant,
    last_seen: Instant,
    last_logged: Instant,
}

/// One current block, for `/metrics` and `/readyz`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Block {
    pub reason: BlockReason,
    pub subject: String,
    pub since: Duration,
}

impl Blocked {
    pub fn new(config: &KafkaConfig) -> Blocked {
        let principal = match &config.sasl_username {
            _ if config.uses_oauthbearer() => "User:<the token's subject>".to_string(),
            Some(user) if config.security_protocol.uses_sasl() => format!("User:{user}"),
            _ => "User:<the relay's principal>".to_string(),
        };
        Blocked {
            entries: Mutex::default(),
            any: AtomicBool::new(false),
            principal,
            brokers: config.brokers.clone(),
            login_fields: config.login_fields(),
            limits: TopicLimits::default(),
        }
    }

    /// What each topic accepts, as far as known.
    pub fn limits(&self) -> &TopicLimits {
        &self.limits
    }

    fn entries(&self) -> std::sync::MutexGuard<'_, BTreeMap<(BlockReason, String), Entry>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records (or refreshes) a block; logs it with its fix when new, and again every
    /// [`LOG_INTERVAL`] while it lasts.
    pub fn block(&self, reason: BlockReason, subject: &str, error: &dyn std::fmt::Display) {
        let now = Instant::now();
        let mut entries = self.entries();
        let entry = entries
            .entry((reason, subject.to_string()))
            .or_insert_with(|| Entry {
                since: now,
                last_seen: now,
                last_logged: now - LOG_INTERVAL,
            });
        entry.last_seen = now;
        self.any.store(true, Ordering::Release);
        if entry.last_logged.elapsed() >= LOG_INTERVAL {
            entry.last_logged = now;
            let blocked_s = now.duration_since(entry.since).as_secs();
            warn!(reason = reason.name(), topic = subject, error = %error, blocked_s,
                fix = %self.fix(reason, subject),
                "kafka refuses the relay's records: a deployment error, not a bad record; they wait (the slot is not confirmed past them) and go out once it is fixed");
        }
    }

    /// Lifts one block (a success showed it fixed).
    pub fn clear(&self, reason: BlockReason, subject: &str) {
        if !self.any.load(Ordering::Acquire) {
            return;
        }
        let mut entries = self.entries();
        if entries.remove(&(reason, subject.to_string())).is_some() {
            tracing::info!(
                reason = reason.name(),
                topic = subject,
                "kafka block lifted"
            );
        }
        self.any.store(!entries.is_empty(), Ordering::Release);
    }

    /// A record reached `topic`: lifts what that proves fixed. One atomic load when nothing
    /// is blocked (it runs for every delivery).
    pub fn delivered(&self, topic: &str) {
        if !self.any.load(Ordering::Acquire) {
            return;
        }
        let mut entries = self.entries();
        entries.retain(|(reason, subject), _| !reason.lifted_by_delivery(subject, topic));
        self.any.store(!entries.is_empty(), Ordering::Release);
    }

    /// A refusal of `topic`'s records (no WRITE, or the topic missing) is in force.
    pub fn holds_topic(&self, topic: &str) -> bool {
        if !self.any.load(Ordering::Acquire) {
            return false;
        }
        let entries = self.entries();
        [BlockReason::TopicAuthorization, BlockReason::UnknownTopic]
            .into_iter()
            .any(|reason| entries.contains_key(&(reason, topic.to_string())))
    }

    /// The blocks in force now, oldest reason first.
    pub fn current(&self) -> Vec<Block> {
        if !self.any.load(Ordering::Acquire) {
            return Vec::new();
        }
        let now = Instant::now();
        let mut entries = self.entries();
        entries.retain(|(reason, _), e| {
            *reason != BlockReason::Authentication
                || now.duration_since(e.last_seen) < AUTHENTICATION_EXPIRY
        });
        self.any.store(!entries.is_empty(), Ordering::Release);
        entries
            .iter()
            .map(|((reason, subject), e)| Block {
                reason: *reason,
                subject: subject.clone(),
                since: now.duration_since(e.since),
            })
            .collect()
    }

    /// What the operator does about a block: the exact command where there is one.
    pub fn fix(&self, reason: BlockReason, subject: &str) -> String {
        let acls = format!(
            "kafka-acls --bootstrap-server {} --add --allow-principal {}",
            self.brokers, self.principal
        );
        match reason {
            BlockReason::TopicAuthorization => format!(
                "grant the relay WRITE on topic `{subject}`: {acls} --operation Write --operation Describe --topic {subject}"
            ),
            BlockReason::ClusterAuthorization => format!(
                "grant the relay IDEMPOTENT_WRITE on the cluster: {acls} --operation IdempotentWrite --cluster"
            ),
            BlockReason::TransactionalIdAuthorization => format!(
                "grant the relay its transactional id `{subject}` (kafka.delivery = \"exactly_once\"): {acls} --operation Write --operation Describe --transactional-id {subject}"
            ),
            BlockReason::Authentication => format!(
                "Kafka refused the login of {}: check {}",
                self.principal, self.login_fields
            ),
            BlockReason::UnknownTopic => format!(
                "topic `{subject}` does not exist and the brokers do not create topics: create it (kafka-topics --bootstrap-server {} --create --topic {subject}), or set kafka.topic_creation.enabled = true",
                self.brokers
            ),
            BlockReason::TopicCreation => format!(
                "the relay may not create topic `{subject}`: grant CREATE ({acls} --operation Create --topic {subject}), fix kafka.topic_creation, or create the topic yourself"
            ),
            BlockReason::RecordTimestamp => format!(
                "topic `{subject}` refuses the records' timestamps (their commit time, or outbox.timestamp_column): widen its window (kafka-configs --bootstrap-server {} --alter --entity-type topics --entity-name {subject} --add-config message.timestamp.before.max.ms=<ms>,message.timestamp.after.max.ms=<ms>) or set message.timestamp.type=LogAppendTime on it",
                self.brokers
            ),
        }
    }

    /// One line for `/readyz`: the oldest block and how many there are.
    pub fn readiness(&self) -> Result<(), String> {
        let blocks = self.current();
        let Some(first) = blocks.iter().max_by_key(|b| b.since) else {
            return Ok(());
        };
        let others = match blocks.len() - 1 {
            0 => String::new(),
            1 => " (and 1 more block)".to_string(),
            n => format!(" (and {n} more blocks)"),
        };
        Err(format!(
            "kafka blocked ({} of {}) for {:.0}s{others}; fix: {}",
            first.reason.name(),
            if first.subject.is_empty() {
                "the cluster"
            } else {
                &first.subject
            },
            first.since.as_secs_f64(),
            self.fix(first.reason, &first.subject)
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blocked() -> Blocked {
        Blocked::new(&KafkaConfig {
            brokers: "k1:9092".into(),
            ..KafkaConfig::default()
        })
    }

    #[test]
    fn a_delivery_lifts_its_topics_block_and_cluster_wide_ones_only() {
        let b = blocked();
        b.block(BlockReason::TopicAuthorization, "a", &"denied");
        b.block(BlockReason::TopicAuthorization, "b", &"denied");
        b.block(BlockReason::Authentication, "", &"login");
        b.block(BlockReason::TransactionalIdAuthorization, "tid", &"denied");
        b.delivered("a");
        let left: Vec<_> = b
            .current()
            .into_iter()
            .map(|x| (x.reason.name(), x.subject))
            .collect();
        assert_eq!(
            left,
            vec![
                ("topic_authorization", "b".to_string()),
                ("transactional_id_authorization", "tid".to_string())
            ]
        );
        b.clear(BlockReason::TransactionalIdAuthorization, "tid");
        b.delivered("b");
        assert!(b.current().is_empty());
        assert!(b.readiness().is_ok());
    }

    #[test]
    fn readiness_names_the_topic_and_the_acl_command() {
        let b = blocked();
        b.block(BlockReason::TopicAuthorization, "orders", &"denied");
        let why = b.readiness().unwrap_err();
        assert!(
            why.contains("topic_authorization of orders) for 0s;"),
            "{why}"
        );
        b.block(BlockReason::UnknownTopic, "payments", &"missing");
        let why = b.readiness().unwrap_err();
        assert!(why.contains("(and 1 more block); fix:"), "{why}");
        assert!(
            why.contains("kafka-acls --bootstrap-server k1:9092 --add"),
            "{why}"
        );
        assert!(why.contains("--operation Write"), "{why}");
        assert!(why.contains("--topic orders"), "{why}");
    }
}
