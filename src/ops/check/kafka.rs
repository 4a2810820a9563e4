//! The Kafka items of `check`: brokers reachable, target topics present (or auto-created), and a
//! producer that keeps the delivery guarantee.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::KafkaError;
use rdkafka::metadata::Metadata;
use rdkafka::ClientContext;

use super::{ok, problem, warning, Item};
use crate::config::{Config, Delivery, KafkaConfig};
use crate::mapping::OutboxMapping;
use crate::ops::format;
use crate::ops::rows::{created_at_column, match_walsender_output, OutboxTable};
use crate::postgres::control::{quote_ident, Control};
use crate::sink::preflight::{self, Build};
use crate::sink::publisher::client_config;
use crate::sink::publisher::login::KafkaLogin;
use crate::sink::publisher::{admin_client, LoggedInAdmin};

/// How long each Kafka request of the check may take.
const KAFKA_TIMEOUT: Duration = Duration::from_secs(10);
/// Outbox rows per table mapped to find the topics the relay will write to.
const TOPIC_SAMPLE_ROWS: i64 = 200;
/// Distinct rows that cannot be mapped, listed at most.
const MAX_LISTED_ROW_ERRORS: usize = 3;

/// Which topics the relay will write to, as far as can be known before it runs.
pub(super) enum TopicPlan {
    /// These topics (from templates without placeholders and from a sample of the rows),
    /// and the same by the serialization section of the tables that write them (an index
    /// of `OutboxConfig::serialization_profiles`).
    Known(BTreeSet<String>, BTreeMap<usize, BTreeSet<String>>),
    /// Not knowable ahead; the reason.
    Unknown(&'static str),
}

impl TopicPlan {
    /// The topics of templates without placeholders, plus those the sampled rows map to.
    pub(super) async fn find(
        control: Option<&Control>,
        config: &Config,
        tables: &[OutboxTable],
        items: &mut Vec<Item>,
    ) -> TopicPlan {
        let configs = config.outbox.table_configs();
        let (_, profiles) = config.outbox.serialization_profiles();
        let templates: Vec<(usize, &String)> = configs
            .iter()
            .zip(profiles)
            .flat_map(|(c, p)| {
                std::iter::once(&c.topic)
                    .chain(c.topic_overrides.values())
                    .map(move |t| (p, t))
            })
            .collect();
        if templates
            .iter()
            .any(|(_, t)| t.contains("{id}") || t.contains("{aggregateid}"))
        {
            return TopicPlan::Unknown("the topic template names one topic per event or aggregate");
        }
        let mut found: BTreeSet<(usize, String)> = templates
            .iter()
            .filter(|(_, t)| !t.contains('{'))
            .map(|(p, t)| (*p, t.to_string()))
            .collect();
        if let Some(control) = control {
            found.extend(sample_topics(control, config, tables, items).await);
        }
        if found.is_empty() {
            return TopicPlan::Unknown(
                "the topic names depend on row values and the outbox has no rows yet",
            );
        }
        let mut by_profile: BTreeMap<usize, BTreeSet<String>> = BTreeMap::new();
        for (profile, topic) in &found {
            by_profile
                .entry(*profile)
                .or_default()
                .insert(topic.clone());
        }
        TopicPlan::Known(found.into_iter().map(|(_, t)| t).collect(), by_profile)
    }
}

/// Maps a sample of each table's rows with the live mapping: the topics they go to, with the
/// table's serialization section. Rows that cannot be mapped are reported (once per distinct
/// error).
async fn sample_topics(
    control: &Control,
    config: &Config,
    tables: &[OutboxTable],
    items: &mut Vec<Item>,
) -> BTreeSet<(usize, String)> {
    let mut topics = BTreeSet::new();
    let mut errors = BTreeSet::new();
    let Ok(mapping) = OutboxMapping::new(&config.outbox) else {
        return topics;
    };
    // Values printed as the walsender prints them (a failure shows in the queries below).
    let _ = match_walsender_output(control.client()).await;
    let created_at = created_at_column(&config.outbox);
    for table in tables {
        // A table the mapping cannot bind was reported with the columns already.
        let Some(Ok(bound)) = mapping.bind(&table.relation) else {
            continue;
        };
        // The newest rows, when there is a created_at to tell: the ones the relay meets next.
        let order = if table.has_column(created_at) {
            format!(" ORDER BY {} DESC", quote_ident(created_at))
        } else {
            String::new()
        };
        // Only the rows the publication sends (its row filter is the server's own SQL).
        let filter = table
            .row_filter
            .as_ref()
            .map_or(String::new(), |f| format!(" WHERE ({f})"));
        let sql = format!(
            "SELECT {} FROM {}{filter}{order} LIMIT {TOPIC_SAMPLE_ROWS}",
            table.select_list(),
            table.quoted
        );
        let Ok(rows) = control.client().query(&sql, &[]).await else {
            continue;
        };
        for row in &rows {
            match bound.to_event(&table.tuple(row), 0) {
                Ok(event) => {
                    topics.insert((event.profile, event.record.topic));
                }
                Err(e) => {
                    errors.insert(e.to_string());
                }
            }
        }
    }
    if !errors.is_empty() {
        let listed: Vec<String> = errors.iter().take(MAX_LISTED_ROW_ERRORS).cloned().collect();
        items.push(warning(
            "outbox rows",
            format!(
                "{} in the outbox cannot be mapped to a record, so the relay cannot publish them: {}",
                format::count(errors.len() as u64, "sampled row"),
                listed.join("; ")
            ),
            "fix or delete those rows, or change the outbox mapping",
        ));
    }
    topics
}

/// Swallows librdkafka's own logging: the check reports what matters as items.
struct Quiet;

impl ClientContext for Quiet {
    fn log(&self, _: RDKafkaLogLevel, _: &str, _: &str) {}
    fn error(&self, _: KafkaError, _: &str) {}
}

pub(super) async fn kafka(config: &KafkaConfig, topics: &TopicPlan, items: &mut Vec<Item>) {
    let build = Build::linked();
    items.push(ok("librdkafka", build.describe()));
    // What `run` refuses at start: a setting this librdkafka cannot work with, by its key.
    if let Err(refused) = preflight::check(config).await {
        items.push(problem(
            "kafka settings",
            format!("{}: {}", refused.key, refused.problem),
            refused.fix,
        ));
        return;
    }
    if let Some(login) = login_item(config) {
        items.push(login);
    }
    let login = KafkaLogin::from_config(config);
    let admin = match admin_client(&client_config(config), Quiet, &login) {
        Ok(admin) => admin,
        Err(e) => {
            let refused = preflight::explain(&e, config, &build);
            items.push(problem(
                "kafka brokers",
                format!(
                    "cannot create a Kafka client: {}: {}",
                    refused.key, refused.problem
                ),
                refused.fix,
            ));
            return;
        }
    };
    let admin = Arc::new(admin);
    let metadata = match fetch_metadata(&admin).await {
        Ok(metadata) => metadata,
        Err(e) => {
            items.push(problem(
                "kafka brokers",
                format!(
                    "cannot reach Kafka at {} within {} s: {e}",
                    config.brokers,
                    KAFKA_TIMEOUT.as_secs()
                ),
                unreachable_fix(config),
            ));
            items.push(producer(config));
            return;
        }
    };
    let ids: Vec<String> = metadata
        .brokers()
        .iter()
        .map(|b| b.id().to_string())
        .collect();
    items.push(ok(
        "kafka brokers",
        format!(
            "reached {} (broker ids {}), {} topics",
            config.brokers,
            ids.join(", "),
            metadata.topics().len()
        ),
    ));
    let broker = metadata
        .brokers()
        .first()
        .map_or(metadata.orig_broker_id(), |b| b.id());
    let auto_create = auto_create_topics(&admin, broker).await;
    items.push(topics_item(config, topics, &metadata, auto_create));
    items.push(producer(config));
    if config.delivery == Delivery::ExactlyOnce {
        items.push(exactly_once_item(&admin, config, &metadata, broker).await);
    }
}

/// `exactly_once`: the brokers can run transactions (enough brokers for the transaction
/// state log), and the progress topic is compacted (or missing: the relay creates it).
async fn exactly_once_item(
    admin: &AdminClient<Quiet>,
    config: &KafkaConfig,
    metadata: &Metadata,
    broker: i32,
) -> Item {
    const CHECK: &str = "kafka exactly-once";
    let options = AdminOptions::new().request_timeout(Some(KAFKA_TIMEOUT));
    let topic = &config.progress_topic;
    let resources = [
        ResourceSpecifier::Broker(broker),
        ResourceSpecifier::Topic(topic),
    ];
    let described =
        tokio::time::timeout(KAFKA_TIMEOUT, admin.describe_configs(&resources, &options))
            .await
            .ok()
            .and_then(Result::ok)
            .unwrap_or_default();
    let value = |i: usize, key: &str| -> Option<String> {
        let resource = described.get(i)?.as_ref().ok()?;
        resource.get(key)?.value.clone()
    };
    let brokers = metadata.brokers().len();
    let replication =
        value(0, "transaction.state.log.replication.factor").and_then(|v| v.parse::<usize>().ok());
    let min_isr = value(0, "transaction.state.log.min.isr").and_then(|v| v.parse::<usize>().ok());
    if let Some(needed) = replication.filter(|&r| r > brokers) {
        return problem(
            CHECK,
            format!("transaction.state.log.replication.factor = {needed} but the cluster has {brokers} broker(s): transactions cannot start"),
            "lower transaction.state.log.replication.factor (and transaction.state.log.min.isr) on the brokers, or add brokers",
        );
    }
    let state_log = format!(
        "transaction.state.log.replication.factor = {}, min.isr = {}",
        replication.map_or("unknown".into(), |r| r.to_string()),
        min_isr.map_or("unknown".into(), |r| r.to_string())
    );
    let exists = metadata
        .topics()
        .iter()
        .any(|t| t.name() == topic && t.error().is_none());
    if !exists {
        return ok(
            CHECK,
            format!("{state_log}; progress topic `{topic}` missing: the relay creates it (cleanup.policy=compact)"),
        );
    }
    match value(1, "cleanup.policy") {
        Some(policy) if policy.contains("compact") => ok(
            CHECK,
            format!("{state_log}; progress topic `{topic}` is compacted"),
        ),
        Some(policy) => problem(
            CHECK,
            format!("progress topic `{topic}` has cleanup.policy = {policy}: its progress records would expire, and events be published again"),
            format!("kafka-configs.sh --bootstrap-server {} --alter --entity-type topics --entity-name {topic} --add-config cleanup.policy=compact", config.brokers),
        ),
        None => warning(
            CHECK,
            format!("{state_log}; cannot read the cleanup.policy of progress topic `{topic}`"),
            "make sure it is cleanup.policy=compact",
        ),
    }
}

async fn fetch_metadata(admin: &Arc<LoggedInAdmin<Quiet>>) -> Result<Metadata, String> {
    let admin = admin.clone();
    // All topics, never named ones: asking for a named topic may auto-create it.
    tokio::task::spawn_blocking(move || admin.inner().fetch_metadata(None, KAFKA_TIMEOUT))
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())
}

/// The broker's `auto.create.topics.enable`, or `None` when it cannot be read (e.g. ACLs).
async fn auto_create_topics(admin: &AdminClient<Quiet>, broker: i32) -> Option<bool> {
    let options = AdminOptions::new().request_timeout(Some(KAFKA_TIMEOUT));
    let resources = [ResourceSpecifier::Broker(broker)];
    let described =
        tokio::time::timeout(KAFKA_TIMEOUT, admin.describe_configs(&resources, &options))
            .await
            .ok()?
            .ok()?;
    let resource = described.into_iter().next()?.ok()?;
    let value = resource.get("auto.create.topics.enable")?.value.clone()?;
    Some(value == "true")
}

fn topics_item(
    config: &KafkaConfig,
    plan: &TopicPlan,
    metadata: &Metadata,
    auto_create: Option<bool>,
) -> Item {
    let auto = match auto_create {
        Some(true) => "auto.create.topics.enable = true",
        Some(false) => "auto.create.topics.enable = false",
        None => "auto.create.topics.enable unknown (cannot read the broker's config)",
    };
    let wanted = match plan {
        TopicPlan::Known(topics, _) => topics,
        TopicPlan::Unknown(detail) => {
            return match auto_create {
                Some(true) => ok("kafka topics", format!("{detail}; {auto}: they are created on first use")),
                _ => warning("kafka topics", format!("{detail}; {auto}"), "create each topic before its first event, or enable auto.create.topics.enable on the brokers"),
            };
        }
    };
    let existing: BTreeSet<&str> = metadata
        .topics()
        .iter()
        .filter(|t| t.error().is_none())
        .map(|t| t.name())
        .collect();
    let missing: Vec<&String> = wanted
        .iter()
        .filter(|t| !existing.contains(t.as_str()))
        .collect();
    if missing.is_empty() {
        let names: Vec<&str> = wanted.iter().map(String::as_str).collect();
        return ok(
            "kafka topics",
            format!("target topics exist: {}", names.join(", ")),
        );
    }
    let names: Vec<&str> = missing.iter().map(|t| t.as_str()).collect();
    let detail = format!("missing topics: {}; {auto}", names.join(", "));
    let fix: Vec<String> = missing
        .iter()
        .map(|t| format!("kafka-topics.sh --bootstrap-server {} --create --topic {t} --partitions <n> --replication-factor <n>", config.brokers))
        .collect();
    match auto_create {
        Some(true) => ok(
            "kafka topics",
            format!("{detail}: they are created on first use with the broker's defaults"),
        ),
        Some(false) => problem("kafka topics", detail, fix.join("\n")),
        None => warning("kafka topics", detail, fix.join("\n")),
    }
}

/// How the relay logs in with OAUTHBEARER: where its tokens come from (none for the others,
/// whose user name the brokers line already implies).
fn login_item(config: &KafkaConfig) -> Option<Item> {
    if !config.uses_oauthbearer() {
        return None;
    }
    let oauth = &config.oauthbearer;
    Some(ok(
        "kafka login",
        format!(
            "OAUTHBEARER with OIDC client credentials: client id `{}` at {}{}; librdkafka fetches the token and a new one at 80% of its lifetime",
            oauth.client_id.as_deref().unwrap_or_default(),
            oauth.token_endpoint_url.as_deref().unwrap_or_default(),
            oauth.scope.as_ref().map(|s| format!(", scope `{s}`")).unwrap_or_default(),
        ),
    ))
}

fn unreachable_fix(config: &KafkaConfig) -> String {
    if config.uses_oauthbearer() {
        return format!(
            "start the brokers or correct kafka.brokers; for the login check {}",
            config.login_fields()
        );
    }
    "start the brokers or correct kafka.brokers; for TLS or SASL set kafka.security_protocol, kafka.sasl_mechanism, kafka.sasl_username, kafka.sasl_password (or sasl_password_file) and kafka.ssl_ca_file".to_string()
}

/// The producer keeps the delivery guarantee: idempotence on, acks=all, nothing unsafe.
fn producer(config: &KafkaConfig) -> Item {
    let unsafe_settings = config.unsafe_properties();
    if !unsafe_settings.is_empty() {
        let listed: Vec<String> = unsafe_settings
            .iter()
            .map(|(k, v, why)| format!("{k} = {v} ({why})"))
            .collect();
        let keys: Vec<String> = unsafe_settings
            .iter()
            .map(|(k, _, _)| format!("kafka.properties.\"{k}\""))
            .collect();
        return problem(
            "kafka producer",
            format!(
                "settings weaken at-least-once delivery or per-key order: {}",
                listed.join("; ")
            ),
            format!(
                "remove {} and set kafka.allow_unsafe_kafka_settings = false",
                keys.join(", ")
            ),
        );
    }
    let effective = client_config(config);
    let idempotent = effective.get("enable.idempotence") == Some("true");
    let acks_all = matches!(effective.get("acks"), Some("all" | "-1"));
    if !idempotent || !acks_all {
        return problem(
            "kafka producer",
            "the producer is not idempotent with acks=all",
            "remove enable.idempotence and acks from kafka.properties",
        );
    }
    ok("kafka producer", format!("enable.idempotence = true, acks = all, message.timeout.ms = {}: at-least-once, per-key order kept", config.message_timeout_ms))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::check::Status;

    #[test]
    fn an_oauth_login_is_shown_with_its_endpoint_and_client() {
        let mut config = KafkaConfig {
            security_protocol: crate::config::KafkaSecurityProtocol::SaslSsl,
            sasl_mechanism: Some("OAUTHBEARER".into()),
            ..KafkaConfig::default()
        };
        config.oauthbearer.token_endpoint_url = Some("https://idp.example/token".into());
        config.oauthbearer.client_id = Some("relay".into());
        config.oauthbearer.scope = Some("kafka".into());
        let item = login_item(&config).expect("a kafka login line");
        assert_eq!(item.status, Status::Ok);
        for part in [
            "OAUTHBEARER",
            "`relay`",
            "https://idp.example/token",
            "`kafka`",
        ] {
            assert!(item.detail.contains(part), "{}", item.detail);
        }
        assert!(unreachable_fix(&config).contains("kafka.oauthbearer"));
        config.sasl_mechanism = Some("PLAIN".into());
        assert!(login_item(&config).is_none());
        assert!(unreachable_fix(&config).contains("kafka.sasl_username"));
    }

    #[test]
    fn unsafe_producer_settings_are_a_problem() {
        let mut kafka = KafkaConfig::default();
        assert_eq!(producer(&kafka).status, Status::Ok);
        kafka.properties.insert("acks".into(), "1".into());
        kafka.allow_unsafe_kafka_settings = true;
        let item = producer(&kafka);
        assert_eq!(item.status, Status::Problem);
        assert!(item.fix.unwrap().contains("kafka.properties.\"acks\""));
    }
    #[tokio::test]
    async fn topics_come_from_plain_templates_unless_per_event() {
        let mut config = Config::default();
        config.outbox.topic = "events".into();
        config
            .outbox
            .topic_overrides
            .insert("order".into(), "orders.{type}".into());
        let plan = TopicPlan::find(None, &config, &[], &mut Vec::new()).await;
        assert!(
            matches!(plan, TopicPlan::Known(t, _) if t == BTreeSet::from(["events".to_string()]))
        );
        config.outbox.topic = "e.{aggregatetype}".into();
        config.outbox.topic_overrides.clear();
        let plan = TopicPlan::find(None, &config, &[], &mut Vec::new()).await;
        assert!(matches!(plan, TopicPlan::Unknown(r) if r.contains("no rows")));
        config.outbox.topic = "e.{aggregateid}".into();
        let plan = TopicPlan::find(None, &config, &[], &mut Vec::new()).await;
        assert!(matches!(plan, TopicPlan::Unknown(r) if r.contains("per event")));
    }
}
