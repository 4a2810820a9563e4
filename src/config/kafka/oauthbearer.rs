//! `[kafka.oauthbearer]`: SASL OAUTHBEARER with OIDC client credentials, fetched and refreshed
//! by librdkafka itself (`sasl.oauthbearer.method=oidc`): it posts the client id and secret to
//! the token endpoint, logs in with the token, and fetches a new one at 80% of its lifetime.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::super::layering::unset;
use super::super::secret::Secret;
use super::super::ConfigError;

/// The `kafka.sasl_mechanism` that uses this section.
pub const OAUTHBEARER: &str = "OAUTHBEARER";

/// `[kafka.oauthbearer]`, used with `sasl_mechanism = "OAUTHBEARER"` only.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OauthBearer {
    /// The identity provider's OAuth 2 token endpoint (`https://…/oauth2/token`), where the
    /// client-credentials grant is posted.
    #[serde(with = "unset")]
    pub token_endpoint_url: Option<String>,
    /// The relay's client id at the identity provider.
    #[serde(with = "unset")]
    pub client_id: Option<String>,
    /// File holding the client secret (trimmed); read when the Kafka client is made. The
    /// secret itself is never a config value.
    #[serde(with = "unset")]
    pub client_secret_file: Option<PathBuf>,
    /// Scope asked for (space-separated), if the provider wants one.
    #[serde(with = "unset")]
    pub scope: Option<String>,
    /// SASL extensions sent with the token (RFC 7628), e.g. Confluent Cloud's
    /// `logicalCluster` and `identityPoolId`. Keys are letters only; values have no comma.
    pub extensions: BTreeMap<String, String>,
}

impl OauthBearer {
    /// The client secret: the trimmed content of `client_secret_file` (read now).
    pub fn client_secret(&self) -> Result<Secret, ConfigError> {
        let Some(path) = &self.client_secret_file else {
            return Err(missing("client_secret_file"));
        };
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let secret = text.trim();
        if secret.is_empty() {
            return Err(ConfigError::invalid(
                "kafka.oauthbearer.client_secret_file",
                format!("`{}` is empty", path.display()),
            ));
        }
        Ok(Secret::new(secret))
    }

    /// The librdkafka settings for OIDC client credentials (with the `sasl.mechanism`);
    /// reads the secret file now. Validation read it at start; if it has gone since, the
    /// secret is left out and librdkafka refuses to make the client, naming the property.
    pub fn librdkafka_properties(&self) -> Vec<(&'static str, String)> {
        let mut properties = vec![
            ("sasl.mechanism", OAUTHBEARER.to_string()),
            ("sasl.oauthbearer.method", "oidc".to_string()),
            (
                "sasl.oauthbearer.token.endpoint.url",
                self.token_endpoint_url.clone().unwrap_or_default(),
            ),
            (
                "sasl.oauthbearer.client.id",
                self.client_id.clone().unwrap_or_default(),
            ),
        ];
        match self.client_secret() {
            Ok(secret) => {
                properties.push(("sasl.oauthbearer.client.secret", secret.expose().into()))
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot read kafka.oauthbearer.client_secret_file")
            }
        }
        if let Some(scope) = &self.scope {
            properties.push(("sasl.oauthbearer.scope", scope.clone()));
        }
        if !self.extensions.is_empty() {
            properties.push(("sasl.oauthbearer.extensions", self.extensions_property()));
        }
        properties
    }

    /// librdkafka's `sasl.oauthbearer.extensions`: `key=value` pairs, comma-separated.
    pub fn extensions_property(&self) -> String {
        let pairs: Vec<String> = self
            .extensions
            .iter()
            .map(|(key, value)| format!("{key}={value}"))
            .collect();
        pairs.join(",")
    }

    /// With `sasl_mechanism = "OAUTHBEARER"`: every field it needs is set and usable.
    pub(super) fn validate_used(&self) -> Result<(), ConfigError> {
        let Some(url) = &self.token_endpoint_url else {
            return Err(missing("token_endpoint_url"));
        };
        if !(url.starts_with("https://") || url.starts_with("http://")) {
            return Err(ConfigError::invalid(
                "kafka.oauthbearer.token_endpoint_url",
                format!("`{url}` is not an http(s):// URL"),
            ));
        }
        if self
            .client_id
            .as_deref()
            .is_none_or(|id| id.trim().is_empty())
        {
            return Err(missing("client_id"));
        }
        // Fail at start-up, not at the first token request.
        self.client_secret()?;
        for (key, value) in &self.extensions {
            let field = format!("kafka.oauthbearer.extensions.{key}");
            // RFC 7628: key = 1*(ALPHA), and "auth" is the token's own.
            if key.is_empty() || !key.bytes().all(|b| b.is_ascii_alphabetic()) || key == "auth" {
                return Err(ConfigError::invalid(
                    field,
                    "an extension key is letters only (RFC 7628), and not `auth`",
                ));
            }
            if value.contains(',') || value.contains('=') {
                return Err(ConfigError::invalid(
                    field,
                    "librdkafka separates extensions with `,` and `=`: the value cannot hold them",
                ));
            }
        }
        Ok(())
    }

    /// Without OAUTHBEARER: the first field set, which would be silently ignored.
    pub(super) fn first_set_field(&self) -> Option<&'static str> {
        [
            (
                "kafka.oauthbearer.token_endpoint_url",
                self.token_endpoint_url.is_some(),
            ),
            ("kafka.oauthbearer.client_id", self.client_id.is_some()),
            (
                "kafka.oauthbearer.client_secret_file",
                self.client_secret_file.is_some(),
            ),
            ("kafka.oauthbearer.scope", self.scope.is_some()),
            ("kafka.oauthbearer.extensions", !self.extensions.is_empty()),
        ]
        .into_iter()
        .find_map(|(field, set)| set.then_some(field))
    }
}

fn missing(field: &str) -> ConfigError {
    ConfigError::invalid(
        format!("kafka.oauthbearer.{field}"),
        "must be set with sasl_mechanism = \"OAUTHBEARER\"",
    )
}

#[cfg(test)]
mod tests {
    use crate::config::{Config, ConfigError};

    fn secret_file(name: &str, text: &str) -> std::path::PathBuf {
        let file = format!("oauth-unit-{name}-{}", std::process::id());
        let path = std::env::temp_dir().join(file);
        std::fs::write(&path, text).unwrap();
        path
    }

    fn load(oauth: &str) -> Result<Config, ConfigError> {
        let text = format!(
            "[kafka]\nsecurity_protocol = \"sasl_ssl\"\nsasl_mechanism = \"OAUTHBEARER\"\n\
             [kafka.oauthbearer]\n{oauth}\n"
        );
        Config::from_sources(Some(&text), Vec::new())
    }

    fn field_of(result: Result<Config, ConfigError>) -> String {
        match result {
            Err(ConfigError::Invalid { field, .. }) => field,
            other => panic!("expected an invalid field, got {other:?}"),
        }
    }

    #[test]
    fn oidc_client_credentials_become_librdkafka_settings() {
        let secret = secret_file("settings", "s3cret-client\n");
        let config = load(&format!(
            "token_endpoint_url = \"https://idp.example/oauth2/token\"\nclient_id = \"relay\"\n\
             client_secret_file = \"{}\"\nscope = \"kafka\"\n\
             extensions = {{ logicalCluster = \"lkc-1\", identityPoolId = \"pool-2\" }}",
            secret.display()
        ))
        .unwrap();
        let props = config.kafka.oauthbearer.librdkafka_properties();
        let get = |key: &str| {
            props
                .iter()
                .find(|(k, _)| *k == key)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(get("sasl.mechanism"), Some("OAUTHBEARER"));
        assert_eq!(get("sasl.oauthbearer.method"), Some("oidc"));
        assert_eq!(get("sasl.oauthbearer.client.secret"), Some("s3cret-client"));
        assert_eq!(get("sasl.oauthbearer.scope"), Some("kafka"));
        assert_eq!(
            get("sasl.oauthbearer.extensions"),
            Some("identityPoolId=pool-2,logicalCluster=lkc-1")
        );
        assert!(!format!("{config:?}").contains("s3cret-client"));
        assert!(!config.to_redacted_toml().contains("s3cret-client"));
        let _ = std::fs::remove_file(secret);
    }

    #[test]
    fn validation_names_the_missing_or_wrong_field() {
        let secret = secret_file("validation", "s");
        let file = format!("client_secret_file = \"{}\"", secret.display());
        let url = "token_endpoint_url = \"https://idp.example/token\"";
        let id = "client_id = \"relay\"";
        let cases = [
            (
                format!("{id}\n{file}"),
                "kafka.oauthbearer.token_endpoint_url",
            ),
            (format!("{url}\n{file}"), "kafka.oauthbearer.client_id"),
            (
                format!("{url}\n{id}"),
                "kafka.oauthbearer.client_secret_file",
            ),
            (
                format!("{url}\n{id}\nclient_secret_file = \"/nonexistent/secret\""),
                "/nonexistent/secret",
            ),
            (
                format!("token_endpoint_url = \"idp/token\"\n{id}\n{file}"),
                "kafka.oauthbearer.token_endpoint_url",
            ),
            (
                format!("{url}\n{id}\n{file}\nextensions = {{ \"bad-key\" = \"x\" }}"),
                "kafka.oauthbearer.extensions.bad-key",
            ),
            (
                format!("{url}\n{id}\n{file}\nextensions = {{ ok = \"a,b\" }}"),
                "kafka.oauthbearer.extensions.ok",
            ),
        ];
        for (oauth, want) in cases {
            let result = load(&oauth);
            let shown = match &result {
                Err(ConfigError::Io { path, .. }) => path.display().to_string(),
                _ => field_of(result),
            };
            assert_eq!(shown, want, "{oauth}");
        }
        // The secret itself is never a config value.
        let inline = load(&format!("{url}\n{id}\nclient_secret = \"s\""));
        assert!(inline.unwrap_err().to_string().contains("client_secret"));
        // Nor are a user name or a password with OAUTHBEARER, nor the section without it.
        let text = format!(
            "[kafka]\nsecurity_protocol = \"sasl_ssl\"\nsasl_mechanism = \"OAUTHBEARER\"\n\
             sasl_username = \"u\"\n[kafka.oauthbearer]\n{url}\n{id}\n{file}\n"
        );
        let result = Config::from_sources(Some(&text), Vec::new());
        assert_eq!(field_of(result), "kafka.sasl_username");
        let text = format!("[kafka.oauthbearer]\n{url}\n");
        let result = Config::from_sources(Some(&text), Vec::new());
        assert_eq!(field_of(result), "kafka.oauthbearer.token_endpoint_url");
        let text = "[kafka.properties]\n\"sasl.oauthbearer.client.secret\" = \"s\"\n";
        let result = Config::from_sources(Some(text), Vec::new());
        assert_eq!(
            field_of(result),
            "kafka.properties.sasl.oauthbearer.client.secret"
        );
        let _ = std::fs::remove_file(secret);
    }
}
