//! `[kafka.aws_msk_iam]`: SASL login to Amazon MSK with IAM (`sasl_mechanism = "AWS_MSK_IAM"`).
//! The relay signs the token itself (SigV4, from the default AWS credential chain) and hands
//! it to librdkafka as an OAUTHBEARER token; the cluster's region is all there is to set.

use serde::{Deserialize, Serialize};

use super::super::layering::unset;
use super::super::ConfigError;

/// The `kafka.sasl_mechanism` that uses this section.
pub const AWS_MSK_IAM: &str = "AWS_MSK_IAM";
const REGION_FIELD: &str = "kafka.aws_msk_iam.region";

/// `[kafka.aws_msk_iam]`, used with `sasl_mechanism = "AWS_MSK_IAM"` only.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AwsMskIam {
    /// The MSK cluster's AWS region (`eu-west-1`), which the token is signed for. Unset
    /// (`""`): from the broker names (`…kafka.<region>.amazonaws.com`, or
    /// `kafka-serverless`), else `AWS_REGION` / `AWS_DEFAULT_REGION`.
    #[serde(with = "unset")]
    pub region: Option<String>,
}

impl AwsMskIam {
    /// The region tokens are signed for: `region`, else the brokers', else `env_region`.
    pub fn resolve_region(
        &self,
        brokers: &str,
        env_region: Option<&str>,
    ) -> Result<String, ConfigError> {
        self.region
            .clone()
            .or_else(|| region_of_brokers(brokers))
            .or_else(|| env_region.map(str::to_string))
            .ok_or_else(|| {
                ConfigError::invalid(
                    REGION_FIELD,
                    format!(
                        "no AWS region: the brokers `{brokers}` are not …kafka.<region>.amazonaws.com \
                         names and AWS_REGION is not set; set {REGION_FIELD} to the cluster's region"
                    ),
                )
            })
    }

    /// With `sasl_mechanism = "AWS_MSK_IAM"`: a region can be found and looks like one.
    pub(super) fn validate_used(&self, brokers: &str) -> Result<(), ConfigError> {
        let env_region = ["AWS_REGION", "AWS_DEFAULT_REGION"]
            .iter()
            .find_map(|name| std::env::var(name).ok().filter(|v| !v.trim().is_empty()));
        let region = self.resolve_region(brokers, env_region.as_deref())?;
        let looks_right = !region.is_empty()
            && region
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
        if !looks_right {
            return Err(ConfigError::invalid(
                REGION_FIELD,
                format!("`{region}` is not an AWS region name (like `eu-west-1`)"),
            ));
        }
        Ok(())
    }

    /// Without `AWS_MSK_IAM`: the first field set, which would be silently ignored.
    pub(super) fn first_set_field(&self) -> Option<&'static str> {
        self.region.is_some().then_some(REGION_FIELD)
    }
}

/// The region of MSK broker names (`b-1.c1.abc.c2.kafka.us-east-1.amazonaws.com:9098`,
/// serverless `boot-x.c1.kafka-serverless.eu-west-1.amazonaws.com:9098`): the label after
/// `kafka` or `kafka-serverless`, if every broker listed has the same one.
fn region_of_brokers(brokers: &str) -> Option<String> {
    let mut regions = brokers.split(',').map(|broker| {
        let broker = broker.trim();
        let host = broker.rsplit_once(':').map_or(broker, |(host, _)| host);
        let labels: Vec<&str> = host.trim_end_matches('.').split('.').collect();
        labels
            .windows(3)
            .find(|w| (w[0] == "kafka" || w[0] == "kafka-serverless") && w[2] == "amazonaws")
            .map(|w| w[1].to_string())
    });
    let first = regions.next()??;
    regions
        .all(|r| r.as_deref() == Some(first.as_str()))
        .then_some(first)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, ConfigError};

    #[test]
    fn region_comes_from_msk_broker_names() {
        for (brokers, region) in [
            ("b-1.c1.abc123.c2.kafka.us-east-1.amazonaws.com:9098", Some("us-east-1")),
            (
                "b-1.c1.x.c2.kafka.eu-west-1.amazonaws.com:9098,b-2.c1.x.c2.kafka.eu-west-1.amazonaws.com:9098",
                Some("eu-west-1"),
            ),
            ("boot-abc.c1.kafka-serverless.ap-south-1.amazonaws.com:9098", Some("ap-south-1")),
            ("b-1.x.kafka.us-east-1.amazonaws.com:9098,b-2.x.kafka.us-west-2.amazonaws.com:9098", None),
            ("broker.internal:9092", None),
            ("b-1.x.kafka.us-east-1.amazonaws.com:9098,broker.internal:9092", None),
        ] {
            assert_eq!(region_of_brokers(brokers).as_deref(), region, "{brokers}");
        }
    }

    #[test]
    fn region_is_configured_then_the_brokers_then_the_environment() {
        let msk = "b-1.x.kafka.eu-central-1.amazonaws.com:9098";
        let set = AwsMskIam {
            region: Some("us-west-2".into()),
        };
        assert_eq!(
            set.resolve_region(msk, Some("ap-east-1")).unwrap(),
            "us-west-2"
        );
        let unset = AwsMskIam::default();
        assert_eq!(
            unset.resolve_region(msk, Some("ap-east-1")).unwrap(),
            "eu-central-1"
        );
        assert_eq!(
            unset
                .resolve_region("kafka.internal:9092", Some("ap-east-1"))
                .unwrap(),
            "ap-east-1"
        );
        match unset.resolve_region("kafka.internal:9092", None) {
            Err(ConfigError::Invalid { field, .. }) => assert_eq!(field, REGION_FIELD),
            other => panic!("{other:?}"),
        }
    }

    fn load(kafka: &str) -> Result<Config, ConfigError> {
        Config::from_sources(Some(&format!("[kafka]\n{kafka}\n")), Vec::new())
    }

    fn field_of(result: Result<Config, ConfigError>) -> String {
        match result {
            Err(ConfigError::Invalid { field, .. }) => field,
            other => panic!("expected an invalid field, got {other:?}"),
        }
    }

    #[test]
    fn validation_names_the_field() {
        let msk = "brokers = \"b-1.x.kafka.eu-west-1.amazonaws.com:9098\"\nsecurity_protocol = \"sasl_ssl\"\nsasl_mechanism = \"AWS_MSK_IAM\"";
        let config = load(msk).unwrap();
        assert!(config.kafka.uses_aws_msk_iam());
        let with_region = format!("{msk}\n[kafka.aws_msk_iam]\nregion = \"us-east-1\"");
        assert!(load(&with_region).is_ok());
        let bad = format!("{msk}\n[kafka.aws_msk_iam]\nregion = \"US East\"");
        assert_eq!(field_of(load(&bad)), REGION_FIELD);
        let user = format!("{msk}\nsasl_username = \"u\"");
        assert_eq!(field_of(load(&user)), "kafka.sasl_username");
        let unused = "[kafka.aws_msk_iam]\nregion = \"us-east-1\"";
        assert_eq!(field_of(load(unused)), REGION_FIELD);
        // IAM needs TLS: MSK's IAM listener is SASL_SSL only.
        let plain = "brokers = \"b-1.x.kafka.eu-west-1.amazonaws.com:9098\"\nsecurity_protocol = \"sasl_plaintext\"\nsasl_mechanism = \"AWS_MSK_IAM\"";
        assert_eq!(field_of(load(plain)), "kafka.security_protocol");
        let unknown = format!("{msk}\n[kafka.aws_msk_iam]\nrole_arn = \"x\"");
        assert!(load(&unknown).unwrap_err().to_string().contains("role_arn"));
    }
}
