//! `check` for `[outbox.serialization]`: the registry answers, and each known topic's subject
//! has a schema that parses (or `auto_register` is on and `schema_file` parses).

use super::kafka::TopicPlan;
use super::{ok, problem, warning, Item};
use crate::config::{Config, SubjectStrategy};
use crate::mapping::Record;
use crate::sink::schema::registry::RegistryError;
use crate::sink::schema::Serializer;

const CHECK: &str = "schema registry";

pub(super) async fn registry(config: &Config, topics: &TopicPlan, items: &mut Vec<Item>) {
    let settings = &config.outbox.serialization;
    let serializer = match Serializer::new(settings) {
        Ok(Some(serializer)) => serializer,
        Ok(None) => return,
        Err(e) => {
            items.push(problem(
                CHECK,
                e.to_string(),
                "fix outbox.serialization's secret files",
            ));
            return;
        }
    };
    let subjects: Vec<String> = match (settings.subject_strategy, topics) {
        (SubjectStrategy::Topic, TopicPlan::Known(topics)) => topics
            .iter()
            .filter_map(|topic| {
                let record = Record {
                    topic: topic.clone(),
                    ..Record::default()
                };
                serializer.subject_for(&record).ok()
            })
            .collect(),
        _ => Vec::new(),
    };
    if subjects.is_empty() {
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
    for subject in subjects {
        match serializer.verify(&subject).await {
            Ok(id) => items.push(ok(
                CHECK,
                format!("subject `{subject}`: schema id {id} parses"),
            )),
            Err(e) => items.push(problem(CHECK, format!("subject `{subject}`: {e}"), fix(&e))),
        }
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
