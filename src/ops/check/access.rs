//! The `kafka access` item of `check`: may the relay's principal use every topic it can name
//! before it runs (the target topics it knows, `dead_letter.topic`, and in exactly-once
//! `kafka.progress_topic`)? A topic the principal may not DESCRIBE answers
//! `TOPIC_AUTHORIZATION_FAILED` to a metadata request by name, which would block the relay's
//! records of it; the item names each such topic with the `kafka-acls` command that fixes it.
//!
//! WRITE itself cannot be seen from a metadata request: a principal that may DESCRIBE a topic
//! but not WRITE it passes here, and the relay reports the block at the first record.

use std::collections::BTreeSet;
use std::time::Duration;

use rdkafka::admin::AdminClient;
use rdkafka::error::RDKafkaErrorCode;

use super::kafka::TopicPlan;
use super::{ok, problem, warning, Item};
use crate::config::{Config, Delivery};
use crate::sink::blocked::{BlockReason, Blocked};
use crate::sink::publisher::admin_client;
use crate::sink::publisher::client_config;
use crate::sink::publisher::login::{KafkaLogin, LoginContext};

const CHECK: &str = "kafka access";
const TIMEOUT: Duration = Duration::from_secs(10);

/// The topics the relay will write (as far as known) and whether it may.
pub(super) async fn access_item(config: &Config, plan: &TopicPlan) -> Item {
    let names = topics_to_check(config, plan);
    let mut client = client_config(&config.kafka);
    // Asking for a topic by name must not create it.
    client.set("allow.auto.create.topics", "false");
    let login = KafkaLogin::from_config(&config.kafka);
    let context = LoginContext::new(&login);
    let admin = match admin_client(&client, context, &login) {
        Ok(admin) => admin,
        Err(e) => {
            return warning(
                CHECK,
                format!("cannot create a Kafka client: {e}"),
                "see the kafka brokers item",
            )
        }
    };
    let names_for_query = names.clone();
    let refused = tokio::task::spawn_blocking(move || refused_topics(&admin, &names_for_query))
        .await
        .unwrap_or_else(|e| Err(e.to_string()));
    let refused = match refused {
        Ok(refused) => refused,
        Err(e) => {
            return warning(
                CHECK,
                format!("cannot read the topics' metadata: {e}"),
                "see the kafka brokers item",
            )
        }
    };
    let listed: Vec<&str> = names.iter().map(String::as_str).collect();
    if refused.is_empty() {
        return ok(
            CHECK,
            format!("the relay may describe {}", listed.join(", ")),
        );
    }
    let blocked = Blocked::new(&config.kafka);
    let fixes: Vec<String> = refused
        .iter()
        .map(|t| blocked.fix(BlockReason::TopicAuthorization, t))
        .collect();
    problem(
        CHECK,
        format!(
            "Kafka refuses the relay's principal on {}: their events would wait (blocked) until granted",
            refused.join(", ")
        ),
        fixes.join("\n"),
    )
}

/// The target topics known ahead, the dead-letter topic, and the progress topic in
/// exactly-once.
fn topics_to_check(config: &Config, plan: &TopicPlan) -> BTreeSet<String> {
    let mut names = match plan {
        TopicPlan::Known(topics, _) => topics.clone(),
        TopicPlan::Unknown(_) => BTreeSet::new(),
    };
    names.insert(config.dead_letter.topic.clone());
    if config.kafka.delivery == Delivery::ExactlyOnce {
        names.insert(config.kafka.progress_topic.clone());
    }
    names
}

/// The topics among `names` whose metadata Kafka refuses for lack of an ACL (missing ones are
/// the `kafka topics` item's).
fn refused_topics(
    admin: &AdminClient<LoginContext>,
    names: &BTreeSet<String>,
) -> Result<Vec<String>, String> {
    let mut refused = Vec::new();
    for name in names {
        let metadata = admin
            .inner()
            .fetch_metadata(Some(name), TIMEOUT)
            .map_err(|e| e.to_string())?;
        let denied = metadata.topics().iter().any(|t| {
            t.name() == name
                && t.error().map(RDKafkaErrorCode::from)
                    == Some(RDKafkaErrorCode::TopicAuthorizationFailed)
        });
        if denied {
            refused.push(name.clone());
        }
    }
    Ok(refused)
}
