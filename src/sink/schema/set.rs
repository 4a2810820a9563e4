//! One [`Serializer`] per serialization section in force (`[outbox.serialization]` and each
//! `[outbox.tables.serialization]`), picked by [`crate::mapping::OutboxEvent::profile`]: the
//! live relay, `replay` and `dead-letters redrive` encode a record with its table's.

use std::sync::Arc;

use super::{RegistryHealth, Serializer};
use crate::config::{ConfigError, OutboxConfig};

/// The serializers by profile index (`None`: that section is `format = "none"` with string
/// keys), sharing one [`RegistryHealth`] for `/readyz` and the metrics.
#[derive(Debug, Clone, Default)]
pub struct Serializers {
    by_profile: Arc<[Option<Arc<Serializer>>]>,
    health: Option<Arc<RegistryHealth>>,
}

impl Serializers {
    /// Reads each section's password or token file.
    pub fn new(outbox: &OutboxConfig) -> Result<Serializers, ConfigError> {
        let (profiles, _) = outbox.serialization_profiles();
        let mut urls: Vec<&str> = profiles
            .iter()
            .filter(|p| p.enabled())
            .map(|p| p.registry_url.as_str())
            .collect();
        urls.sort_unstable();
        urls.dedup();
        if urls.is_empty() {
            return Ok(Serializers::default());
        }
        let health = Arc::new(RegistryHealth::new(&urls.join(", ")));
        let by_profile = profiles
            .iter()
            .enumerate()
            .map(|(i, p)| Serializer::with_health(p, &section(outbox, i), health.clone()))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Serializers {
            by_profile: by_profile.into(),
            health: Some(health),
        })
    }

    /// One serializer for every profile (tests).
    pub fn single(serializer: Arc<Serializer>) -> Serializers {
        Serializers {
            health: Some(serializer.health()),
            by_profile: vec![Some(serializer)].into(),
        }
    }

    /// The serializer of `profile`; `None` when that section encodes nothing.
    pub fn get(&self, profile: usize) -> Option<&Arc<Serializer>> {
        self.by_profile.get(profile).and_then(Option::as_ref)
    }

    /// What blocks now; `None` when no section uses a registry.
    pub fn health(&self) -> Option<Arc<RegistryHealth>> {
        self.health.clone()
    }

    /// True when more than one section is in force (a record's profile then matters).
    pub fn several(&self) -> bool {
        self.by_profile.len() > 1
    }
}

/// Where section `profile` is in the config: the top-level one, or the first
/// `[[outbox.tables]]` entry that has it.
fn section(outbox: &OutboxConfig, profile: usize) -> String {
    let (_, of_table) = outbox.serialization_profiles();
    // `table_configs` lists `table` first when it is set, then the entries.
    let skip = usize::from(!outbox.table.is_empty());
    of_table
        .iter()
        .enumerate()
        .skip(skip)
        .find(|(_, p)| **p == profile && profile != 0)
        .map_or("outbox.serialization".to_string(), |(i, _)| {
            format!("outbox.tables[{}].serialization", i - skip)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_section_is_named_by_its_place_in_the_config() {
        let mut outbox = OutboxConfig::default();
        let json = crate::config::SerializationConfig {
            format: crate::config::SerializationFormat::JsonSchema,
            registry_url: "http://r".into(),
            ..Default::default()
        };
        for own in [None, Some(json)] {
            outbox.tables.push(crate::config::OutboxTableConfig {
                table: format!("t{}", outbox.tables.len()),
                serialization: own,
                ..Default::default()
            });
        }
        assert_eq!(section(&outbox, 0), "outbox.serialization");
        assert_eq!(section(&outbox, 1), "outbox.tables[1].serialization");
        let serializers = Serializers::new(&outbox).unwrap();
        assert!(serializers.get(0).is_none(), "the top-level section is off");
        assert_eq!(
            serializers.get(1).unwrap().section,
            "outbox.tables[1].serialization"
        );
    }
}
