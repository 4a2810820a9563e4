//! The chain's third source, the shared profile files: `~/.aws/credentials` (sections
//! `[name]`) and `~/.aws/config` (sections `[profile name]`, and `[default]`): static keys,
//! or else the profile's `credential_process` (see `process`). A key in the credentials file
//! wins over the same key in the config file, as in AWS's SDKs.

use std::collections::HashMap;
use std::path::PathBuf;

use super::{AwsCredentials, CredentialsError, Env, Fetched};

const FROM: &str = "the shared profile files";

/// The profile the chain reads, and where.
pub(super) struct Profile {
    pub(super) name: String,
    /// `AWS_PROFILE` named it (then it must exist).
    named: bool,
    credentials_file: Option<PathBuf>,
    config_file: Option<PathBuf>,
    /// Both paths, for messages.
    pub(super) files: String,
}

impl Profile {
    pub(super) fn locate(env: &Env) -> Profile {
        let home = env.home().map(|h| h.join(".aws"));
        let path = |var: &str, default: &str| {
            env.get(var)
                .map(PathBuf::from)
                .or_else(|| home.as_ref().map(|h| h.join(default)))
        };
        let credentials_file = path("AWS_SHARED_CREDENTIALS_FILE", "credentials");
        let config_file = path("AWS_CONFIG_FILE", "config");
        let shown = |p: &Option<PathBuf>| {
            p.as_ref()
                .map_or("(no HOME)".into(), |p| p.display().to_string())
        };
        Profile {
            name: env.get("AWS_PROFILE").unwrap_or("default").to_string(),
            named: env.get("AWS_PROFILE").is_some(),
            files: format!("{} and {}", shown(&credentials_file), shown(&config_file)),
            credentials_file,
            config_file,
        }
    }

    /// The profile's static keys; `None` if no file has the profile (unless `AWS_PROFILE`
    /// named it).
    pub(super) fn credentials(&self) -> Result<Option<Fetched>, CredentialsError> {
        let config_section = if self.name == "default" {
            "default".to_string()
        } else {
            format!("profile {}", self.name)
        };
        let mut keys = read_section(self.config_file.as_ref(), &config_section)?;
        let from_credentials = read_section(self.credentials_file.as_ref(), &self.name)?;
        let found = keys.is_some() || from_credentials.is_some();
        let keys: HashMap<String, String> = keys
            .take()
            .unwrap_or_default()
            .into_iter()
            .chain(from_credentials.unwrap_or_default())
            .collect();
        if !found {
            if self.named {
                return Err(CredentialsError::source(
                    FROM,
                    format!("AWS_PROFILE `{}` is in neither {}", self.name, self.files),
                    "fix AWS_PROFILE or add the profile",
                ));
            }
            return Ok(None);
        }
        let get = |k: &str| keys.get(k).map(String::as_str).filter(|v| !v.is_empty());
        match (get("aws_access_key_id"), get("aws_secret_access_key")) {
            (Some(id), Some(secret)) => Ok(Some(Fetched {
                credentials: AwsCredentials::new(id, secret, get("aws_session_token")),
                expires: None,
                from: FROM,
            })),
            _ if get("role_arn").is_some() || get("sso_session").is_some() || get("sso_start_url").is_some() => {
                Err(CredentialsError::source(
                    FROM,
                    format!("profile `{}` assumes a role or uses SSO, which the relay does not do", self.name),
                    "give the relay static keys, a credential_process, a web identity (IRSA), or an ECS/EC2 role instead",
                ))
            }
            _ if get("credential_process").is_some() => {
                let command = get("credential_process").unwrap_or_default();
                super::process::credentials(&self.name, command).map(Some)
            }
            _ => Err(CredentialsError::source(
                FROM,
                format!("profile `{}` has no aws_access_key_id and aws_secret_access_key", self.name),
                "add both keys to the profile",
            )),
        }
    }
}

/// The `key = value` pairs of `[section]` in `path`; `None` if the file or the section is
/// missing.
fn read_section(
    path: Option<&PathBuf>,
    section: &str,
) -> Result<Option<HashMap<String, String>>, CredentialsError> {
    let Some(path) = path else { return Ok(None) };
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(CredentialsError::source(
                FROM,
                format!("cannot read `{}`: {e}", path.display()),
                "make the file readable by the relay's user",
            ))
        }
    };
    Ok(parse_section(&text, section))
}

/// INI as AWS's files use it: `[section]` headers, `key = value`, `#` and `;` comments.
pub(super) fn parse_section(text: &str, section: &str) -> Option<HashMap<String, String>> {
    let mut current: Option<&str> = None;
    let mut found: Option<HashMap<String, String>> = None;
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(header) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            current = Some(header.trim());
            if current == Some(section) {
                found.get_or_insert_with(HashMap::new);
            }
            continue;
        }
        if current != Some(section) {
            continue;
        }
        if let (Some(map), Some((key, value))) = (found.as_mut(), line.split_once('=')) {
            map.insert(key.trim().to_ascii_lowercase(), value.trim().to_string());
        }
    }
    found
}
