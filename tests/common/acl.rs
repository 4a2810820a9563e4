//! The locked-down broker of `scripts/services.sh kafka-acl-start`: SASL_PLAINTEXT with PLAIN
//! only, the StandardAuthorizer refusing what no ACL allows, no topic auto-creation; users
//! `admin` (a super user) and `relay` (nothing until granted).
//!
//! The test process was started (by `scripts/test.sh`) before the broker, so its variables are
//! not in our environment: they are read from the env file whose path `kafka-acl-start` prints.
//! Grants go through the Java `AclCommand` (`services.sh kafka-acl-tool`): rust-rdkafka has no
//! ACL API. Topics are made, described and read as the admin with rdkafka.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::ClientConfig;

use super::{env, random_name, test_logs_dir, Received, TestDb};

/// `AclCommand`'s class, run by `services.sh kafka-acl-tool`.
const ACL_COMMAND: &str = "org.apache.kafka.tools.AclCommand";
const ADMIN_TIMEOUT: Duration = Duration::from_secs(30);

/// The running ACL broker and its users.
#[derive(Debug, Clone)]
pub struct AclBroker {
    /// host:port of its SASL_PLAINTEXT listener.
    pub brokers: String,
    pub admin_user: String,
    pub admin_password: String,
    pub relay_user: String,
    pub relay_password: String,
    /// The admin's client properties (`--command-config` of the Kafka tools).
    pub admin_config: PathBuf,
    /// A file holding `relay_password`, for `kafka.sasl_password_file`.
    pub relay_password_file: PathBuf,
}

impl AclBroker {
    /// Starts the broker unless it runs (once per test binary; `kafka-acl-start` itself is
    /// idempotent and locked, so test binaries running side by side are safe too).
    pub async fn start() -> AclBroker {
        static BROKER: OnceLock<AclBroker> = OnceLock::new();
        tokio::task::spawn_blocking(|| BROKER.get_or_init(start_blocking).clone())
            .await
            .unwrap()
    }

    /// The principal the relay logs in as, `User:relay`.
    pub fn relay_principal(&self) -> String {
        format!("User:{}", self.relay_user)
    }

    /// The environment of a relay on `db` that logs in to this broker as user relay.
    pub fn relay_env(&self, db: &TestDb) -> Vec<(String, String)> {
        let mut env = db.relay_env();
        let password_file = self.relay_password_file.display().to_string();
        for (key, value) in [
            ("OUTBOX_RELAY__KAFKA__BROKERS", self.brokers.as_str()),
            ("OUTBOX_RELAY__KAFKA__SECURITY_PROTOCOL", "sasl_plaintext"),
            ("OUTBOX_RELAY__KAFKA__SASL_MECHANISM", "PLAIN"),
            (
                "OUTBOX_RELAY__KAFKA__SASL_USERNAME",
                self.relay_user.as_str(),
            ),
            (
                "OUTBOX_RELAY__KAFKA__SASL_PASSWORD_FILE",
                password_file.as_str(),
            ),
        ] {
            env.retain(|(k, _)| k != key);
            env.push((key.to_string(), value.to_string()));
        }
        env
    }

    /// Runs `AclCommand` as the admin with `args` (e.g. `--add --allow-principal User:relay
    /// --operation Write --topic t`); panics with its output when it fails.
    pub async fn acl_command(&self, args: &[&str]) {
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        let out = tokio::task::spawn_blocking(move || {
            Command::new("bash")
                .arg(env("OUTBOX_TEST_SERVICES"))
                .arg("kafka-acl-tool")
                .arg(ACL_COMMAND)
                .args(&args)
                .output()
                .expect("run services.sh kafka-acl-tool")
        })
        .await
        .unwrap();
        assert!(
            out.status.success(),
            "AclCommand failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Lets the relay write `topics` (WRITE implies DESCRIBE), in one command.
    pub async fn grant_write(&self, topics: &[&str]) {
        self.topic_acl("--add", &["Write"], topics, false).await;
    }

    /// Takes WRITE on `topics` away again.
    pub async fn revoke_write(&self, topics: &[&str]) {
        self.topic_acl("--remove", &["Write"], topics, false).await;
    }

    /// Lets the relay read and write `topic`: what the exactly-once progress topic needs (the
    /// relay reads its last value at start, and writes one per Kafka transaction).
    pub async fn grant_read_write(&self, topic: &str) {
        self.topic_acl("--add", &["Read", "Write"], &[topic], false)
            .await;
    }

    /// Lets the relay use the consumer group `group` (READ implies DESCRIBE): librdkafka looks
    /// up the group's coordinator for a consumer with a `group.id`, even one that only assigns
    /// partitions and commits nothing, as the relay's progress reader does.
    pub async fn grant_group_read(&self, group: &str) {
        let principal = self.relay_principal();
        self.acl_command(&[
            "--add",
            "--allow-principal",
            &principal,
            "--operation",
            "Read",
            "--group",
            group,
        ])
        .await;
    }

    /// Lets the relay create topics whose names start with `prefix` (and write them).
    pub async fn grant_create_prefixed(&self, prefix: &str) {
        self.topic_acl("--add", &["Create", "Write"], &[prefix], true)
            .await;
    }

    /// Lets the relay use the transactional id `id` (WRITE and DESCRIBE): what a transactional
    /// producer needs for InitProducerId, AddPartitionsToTxn and EndTxn.
    pub async fn grant_transactional_id(&self, id: &str) {
        let principal = self.relay_principal();
        self.acl_command(&[
            "--add",
            "--allow-principal",
            &principal,
            "--operation",
            "Write",
            "--operation",
            "Describe",
            "--transactional-id",
            id,
        ])
        .await;
    }

    async fn topic_acl(&self, action: &str, operations: &[&str], topics: &[&str], prefixed: bool) {
        let principal = self.relay_principal();
        let mut args = vec![action, "--allow-principal", &principal];
        if action == "--remove" {
            args.push("--force");
        }
        for op in operations {
            args.extend(["--operation", op]);
        }
        for topic in topics {
            args.extend(["--topic", topic]);
        }
        if prefixed {
            args.extend(["--resource-pattern-type", "prefixed"]);
        }
        self.acl_command(&args).await;
    }

    fn client_config(&self) -> ClientConfig {
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", &self.brokers)
            .set("security.protocol", "SASL_PLAINTEXT")
            .set("sasl.mechanism", "PLAIN")
            .set("sasl.username", &self.admin_user)
            .set("sasl.password", &self.admin_password);
        config
    }

    fn admin(&self) -> AdminClient<DefaultClientContext> {
        self.client_config().create().expect("admin client")
    }

    /// Creates `topic` as the admin (replication factor 1, `configs` set) and waits until its
    /// metadata shows all `partitions`.
    pub async fn create_topic_with(&self, topic: &str, partitions: i32, configs: &[(&str, &str)]) {
        let admin = self.admin();
        let mut new = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
        for (key, value) in configs {
            new = new.set(key, value);
        }
        let options = AdminOptions::new().operation_timeout(Some(ADMIN_TIMEOUT));
        let results = admin
            .create_topics([&new], &options)
            .await
            .unwrap_or_else(|e| panic!("create topic {topic}: {e}"));
        for result in results {
            result.unwrap_or_else(|(t, e)| panic!("create topic {t}: {e}"));
        }
        let deadline = Instant::now() + ADMIN_TIMEOUT;
        loop {
            let seen = self.partition_count(topic).await;
            if seen == Some(partitions) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "topic {topic} has {seen:?} partitions, not {partitions}, {ADMIN_TIMEOUT:?} after creation"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// [`AclBroker::create_topic_with`] with the broker's default configs.
    pub async fn create_topic(&self, topic: &str, partitions: i32) {
        self.create_topic_with(topic, partitions, &[]).await;
    }

    /// The topic's partition count as the admin sees it; `None` while it does not exist.
    pub async fn partition_count(&self, topic: &str) -> Option<i32> {
        let admin = self.admin();
        let topic = topic.to_string();
        tokio::task::spawn_blocking(move || {
            // All topics: asking for one by name is a request to create it where auto-create
            // is on (not here, but the habit is cheap).
            let metadata = admin.inner().fetch_metadata(None, ADMIN_TIMEOUT).ok()?;
            metadata
                .topics()
                .iter()
                .find(|t| t.name() == topic && t.error().is_none() && !t.partitions().is_empty())
                .map(|t| t.partitions().len() as i32)
        })
        .await
        .unwrap()
    }

    /// The topic's configuration (every entry the broker reports, defaults included).
    pub async fn topic_configs(&self, topic: &str) -> HashMap<String, Option<String>> {
        let admin = self.admin();
        let options = AdminOptions::new().request_timeout(Some(ADMIN_TIMEOUT));
        let results = admin
            .describe_configs([&ResourceSpecifier::Topic(topic)], &options)
            .await
            .unwrap_or_else(|e| panic!("describe configs of {topic}: {e}"));
        let resource = results
            .into_iter()
            .next()
            .expect("one result")
            .unwrap_or_else(|e| panic!("describe configs of {topic}: {e:?}"));
        resource
            .entries
            .into_iter()
            .map(|e| (e.name, e.value))
            .collect()
    }

    /// How many records `topic` holds (high minus low watermark over its partitions; records
    /// of aborted transactions and their markers count too). 0 when the topic does not exist.
    pub async fn record_count(&self, topic: &str) -> i64 {
        let Some(partitions) = self.partition_count(topic).await else {
            return 0;
        };
        let consumer: BaseConsumer = self.reader_config().create().expect("consumer");
        let topic = topic.to_string();
        tokio::task::spawn_blocking(move || {
            (0..partitions)
                .map(|p| {
                    let (low, high) = consumer
                        .fetch_watermarks(&topic, p, ADMIN_TIMEOUT)
                        .unwrap_or_else(|e| panic!("watermarks of {topic}/{p}: {e}"));
                    high - low
                })
                .sum()
        })
        .await
        .unwrap()
    }

    fn reader_config(&self) -> ClientConfig {
        let mut config = self.client_config();
        super::reader_settings(&mut config);
        config
    }

    /// Reads `topics` (`partitions` each) from the beginning as the admin with read_committed,
    /// until every id in `ids` arrived or `timeout` passed, then `settle` longer (to see
    /// duplicates); with no ids, for `settle`. Topics that do not exist yet are waited for.
    pub async fn read_ids(
        &self,
        topics: &[String],
        partitions: i32,
        ids: &[String],
        timeout: Duration,
        settle: Duration,
    ) -> Vec<Received> {
        let timeout = if ids.is_empty() { settle } else { timeout };
        let mut waiting: HashSet<Vec<u8>> = ids.iter().map(|i| i.as_bytes().to_vec()).collect();
        super::read_until_as(
            self.reader_config(),
            topics,
            partitions,
            timeout,
            settle,
            move |record| {
                waiting.remove(&record.key);
                waiting.is_empty()
            },
        )
        .await
    }
}

/// The exactly-once producer's `transactional.id` for `db`'s slot: the relay builds it from
/// the cluster's system identifier, the database and the slot.
pub async fn transactional_id(db: &TestDb) -> String {
    let system_identifier: String = db
        .client()
        .await
        .query_one(
            "SELECT system_identifier::text FROM pg_control_system()",
            &[],
        )
        .await
        .expect("read the system identifier")
        .get(0);
    format!("outbox-relay/{system_identifier}/{}/{}", db.name, db.slot)
}

fn start_blocking() -> AclBroker {
    let out = Command::new("bash")
        .arg(env("OUTBOX_TEST_SERVICES"))
        .arg("kafka-acl-start")
        .output()
        .expect("run services.sh kafka-acl-start");
    assert!(
        out.status.success(),
        "kafka-acl-start failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let env_file = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let text = std::fs::read_to_string(&env_file)
        .unwrap_or_else(|e| panic!("read the env file {env_file}: {e}"));
    let var = |name: &str| {
        env_file_value(&text, name).unwrap_or_else(|| panic!("{name} not in {env_file}"))
    };
    let relay_password = var("OUTBOX_TEST_KAFKA_ACL_RELAY_PASSWORD");
    let relay_password_file = test_logs_dir().join(random_name("acl-relay-password-"));
    std::fs::write(&relay_password_file, format!("{relay_password}\n")).unwrap();
    AclBroker {
        brokers: var("OUTBOX_TEST_KAFKA_ACL_BROKERS"),
        admin_user: var("OUTBOX_TEST_KAFKA_ACL_ADMIN_USER"),
        admin_password: var("OUTBOX_TEST_KAFKA_ACL_ADMIN_PASSWORD"),
        relay_user: var("OUTBOX_TEST_KAFKA_ACL_RELAY_USER"),
        relay_password,
        admin_config: var("OUTBOX_TEST_KAFKA_ACL_ADMIN_CONFIG").into(),
        relay_password_file,
    }
}

/// The value of `export NAME=VALUE` in an env file written by services.sh (which quotes with
/// `printf %q`: the values used here need none, or single quotes at most).
fn env_file_value(text: &str, name: &str) -> Option<String> {
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("export {name}=")))
        .map(|v| v.trim_matches('\'').to_string())
}
