//! `check` for `[outbox.serialization]` and each `[outbox.tables.serialization]`: the
//! registry answers, and each known topic's subjects (the value's, and with `key_format` the
//! key's) have a schema that parses (or `auto_register` is on and the schema to register
//! parses), each checked by the section of the tables that write the topic.

use std::collections::BTreeSet;

use super::kafka::TopicPlan;
use super::{ok, problem, warning, Item};
use crate::config::{Config, SerializationFormat, SubjectStrategy};
use crate::mapping::Record;
use crate::sink::schema::registry::RegistryError;
use crate::sink::schema::{Serializer, Serializers};

const CHECK: &str = "schema registry";

pub(super) async fn registry(config: &Config, topics: &TopicPlan, items: &mut Vec<Item>) {
    let serializers = match Serializers::new(&config.outbox) {
        Ok(serializers) => serializers,
        Err(e) => {
            items.push(problem(
                CHECK,
                e.to_string(),
                "fix the serialization sections' secret files",
            ));
            return;
        }
    };
    let (profiles, _) = config.outbox.serialization_profiles();
    let none = BTreeSet::new();
    for profile in 0..profiles.len() {
        let Some(serializer) = serializers.get(profile) else {
            continue;
        };
        let topics = match topics {
            TopicPlan::Known(_, by_profile) => by_profile.get(&profile).unwrap_or(&none),
            TopicPlan::Unknown(_) => &none,
        };
        section(serializer, topics, items).await;
    }
}

/// One section's subjects, for the topics its tables write.
async fn section(serializer: &Serializer, topics: &BTreeSet<String>, items: &mut Vec<Item>) {
    let settings = serializer.config();
    let by_topic = settings.subject_strategy == SubjectStrategy::Topic;
    let mut values = Vec::new();
    let mut keys = Vec::new();
    for topic in topics {
        let record = Record {
            topic: topic.clone(),
            ..Record::default()
        };
        if by_topic && serializer.format() != SerializationFormat::None {
            values.extend(serializer.subject_for(&record).ok());
        }
        keys.extend(serializer.key_subject_for(&record));
    }
    if values.is_empty() && keys.is_empty() {
        match serializer.verify_reachable().await {
            Ok(()) => items.push(warning(
                CHECK,
                format!("{} answers; the subjects depend on the events, so their schemas are not checked", settings.registry_url),
                "make sure every subject the events name has a schema (or set auto_register)",
            )),
            Err(e) => items.push(problem(CHECK, e.to_string(), fix(&e))),
        }
        return;
    }
    for subject in values {
        item(&subject, serializer.verify(&subject).await, items);
    }
    for subject in keys {
        item(&subject, serializer.verify_key(&subject).await, items);
    }
}

fn item(subject: &str, verified: Result<u32, RegistryError>, items: &mut Vec<Item>) {
    match verified {
        Ok(id) => items.push(ok(
            CHECK,
            format!("subject `{subject}`: schema id {id} parses"),
        )),
        Err(e) => items.push(problem(CHECK, format!("subject `{subject}`: {e}"), fix(&e))),
    }
}

fn fix(error: &RegistryError) -> String {
    match error {
        RegistryError::Unreachable { .. } | RegistryError::Failed { .. } => {
            "start the registry or correct outbox.serialization.registry_url".into()
        }
        RegistryError::Unauthorized { .. } => {
            "correct outbox.serialization.registry_username / registry_password_file / registry_token_file".into()
        }
        RegistryError::NotFound { .. } => {
            "register the subject's schema, or set outbox.serialization.auto_register = true with schema_file".into()
        }
        RegistryError::BadSchema { .. } | RegistryError::SchemaFile { .. } => {
            "register a valid schema of outbox.serialization.format under the subject".into()
        }
    }
}
