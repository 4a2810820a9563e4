//! `[kafka.topic_creation]`: topics the relay creates itself before their first record, as
//! Debezium's `topic.creation.*` does, for clusters that do not auto-create topics (routing by
//! `{aggregatetype}` makes a new topic whenever the domain grows).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::ConfigError;

/// `-1`: the broker's default (`num.partitions`, `default.replication.factor`).
pub const BROKER_DEFAULT: i32 = -1;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TopicCreation {
    /// Create a missing topic before its first record (`CreateTopics`; a topic that exists
    /// by then is fine). Off: a missing topic's records wait until someone creates it.
    pub enabled: bool,
    /// Partitions of a created topic; `-1` = the broker's `num.partitions`.
    pub partitions: i32,
    /// Replication factor of a created topic; `-1` = the broker's `default.replication.factor`.
    pub replication_factor: i32,
    /// Topic configs of a created topic (`retention.ms`, `cleanup.policy`, …), string to string.
    pub configs: BTreeMap<String, String>,
    /// Per-topic settings: the first group whose `match` matches the whole topic name wins;
    /// what it leaves unset comes from the settings above.
    pub groups: Vec<TopicCreationGroup>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TopicCreationGroup {
    /// A regular expression that must match the whole topic name, e.g.
    /// `outbox\.event\.billing.*`.
    #[serde(rename = "match")]
    pub pattern: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partitions: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replication_factor: Option<i32>,
    /// Added to (and overriding) the top-level `configs`.
    #[serde(default)]
    pub configs: BTreeMap<String, String>,
}

impl Default for TopicCreation {
    fn default() -> Self {
        TopicCreation {
            enabled: false,
            partitions: BROKER_DEFAULT,
            replication_factor: BROKER_DEFAULT,
            configs: BTreeMap::new(),
            groups: Vec::new(),
        }
    }
}

/// How one topic is to be created.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicSpec {
    pub partitions: i32,
    pub replication_factor: i32,
    pub configs: BTreeMap<String, String>,
}

impl TopicCreation {
    /// The settings for `topic`: its first matching group over the top-level ones.
    pub fn spec_for(&self, topic: &str) -> TopicSpec {
        let mut spec = TopicSpec {
            partitions: self.partitions,
            replication_factor: self.replication_factor,
            configs: self.configs.clone(),
        };
        if let Some(group) = self.groups.iter().find(|g| whole_match(&g.pattern, topic)) {
            spec.partitions = group.partitions.unwrap_or(spec.partitions);
            spec.replication_factor = group.replication_factor.unwrap_or(spec.replication_factor);
            spec.configs.extend(group.configs.clone());
        }
        spec
    }

    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        let count = |field: String, n: i32| {
            if n == BROKER_DEFAULT || n >= 1 {
                Ok(())
            } else {
                Err(ConfigError::invalid(
                    field,
                    format!("{n}: must be -1 (the broker's default) or at least 1"),
                ))
            }
        };
        let prefix = "kafka.topic_creation";
        count(format!("{prefix}.partitions"), self.partitions)?;
        count(
            format!("{prefix}.replication_factor"),
            self.replication_factor,
        )?;
        for (i, group) in self.groups.iter().enumerate() {
            let at = format!("{prefix}.groups[{i}]");
            if let Err(e) = regex::Regex::new(&group.pattern) {
                return Err(ConfigError::invalid(
                    format!("{at}.match"),
                    format!("`{}` is not a regular expression: {e}", group.pattern),
                ));
            }
            if let Some(n) = group.partitions {
                count(format!("{at}.partitions"), n)?;
            }
            if let Some(n) = group.replication_factor {
                count(format!("{at}.replication_factor"), n)?;
            }
        }
        Ok(())
    }
}

/// `pattern` matches all of `name` (validation has compiled it once already).
fn whole_match(pattern: &str, name: &str) -> bool {
    regex::Regex::new(&format!("^(?:{pattern})$")).is_ok_and(|re| re.is_match(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn creation() -> TopicCreation {
        TopicCreation {
            enabled: true,
            partitions: 3,
            replication_factor: BROKER_DEFAULT,
            configs: BTreeMap::from([
                ("retention.ms".into(), "1000".into()),
                ("cleanup.policy".into(), "delete".into()),
            ]),
            groups: vec![TopicCreationGroup {
                pattern: r"outbox\.event\.billing.*".into(),
                partitions: Some(6),
                replication_factor: None,
                configs: BTreeMap::from([("retention.ms".into(), "3600000".into())]),
            }],
        }
    }

    #[test]
    fn the_first_matching_group_wins_over_the_defaults() {
        let spec = creation().spec_for("outbox.event.billing_v2");
        assert_eq!(spec.partitions, 6);
        assert_eq!(spec.replication_factor, BROKER_DEFAULT);
        assert_eq!(spec.configs["retention.ms"], "3600000");
        assert_eq!(spec.configs["cleanup.policy"], "delete");
    }

    #[test]
    fn a_group_matches_the_whole_name_only() {
        let spec = creation().spec_for("x.outbox.event.billing");
        assert_eq!(spec.partitions, 3);
        assert_eq!(spec.configs["retention.ms"], "1000");
    }

    #[test]
    fn bad_counts_and_patterns_name_their_field() {
        let mut c = creation();
        c.groups[0].pattern = "(".into();
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("kafka.topic_creation.groups[0].match"), "{e}");
        let mut c = creation();
        c.partitions = 0;
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("kafka.topic_creation.partitions"), "{e}");
        let mut c = creation();
        c.groups[0].replication_factor = Some(-2);
        let e = c.validate().unwrap_err().to_string();
        assert!(
            e.contains("kafka.topic_creation.groups[0].replication_factor"),
            "{e}"
        );
    }
}
