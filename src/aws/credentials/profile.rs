//! The chain's third source, the shared profile files: `~/.aws/credentials` (sections
//! `[name]`) and `~/.aws/config` (sections `[profile name]`, and `[default]`): a role to
//! assume (`role_arn` with `source_profile`, one hop; `http::assume_role` asks STS), else
//! static keys, else the profile's `credential_process` (see `process`). A key in the credentials file
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

    /// The profile's credentials, or the role it assumes; `None` if no file has the
    /// profile (unless `AWS_PROFILE` named it).
    pub(super) fn credentials(&self) -> Result<Option<FromProfile>, CredentialsError> {
        let Some(keys) = self.keys_of(&self.name)? else {
            if self.named {
                return Err(CredentialsError::source(
                    FROM,
                    format!("AWS_PROFILE `{}` is in neither {}", self.name, self.files),
                    "fix AWS_PROFILE or add the profile",
                ));
            }
            return Ok(None);
        };
        let get = |k: &str| get(&keys, k);
        if let Some(role_arn) = get("role_arn") {
            return self.assume_role(role_arn, &keys).map(Some);
        }
        self.keys_or_process(&self.name, &keys)
            .map(|f| Some(FromProfile::Ready(f)))
    }

    /// Both files' keys of profile `name`, the credentials file's winning; `None` if
    /// neither has it.
    fn keys_of(&self, name: &str) -> Result<Option<HashMap<String, String>>, CredentialsError> {
        let config_section = if name == "default" {
            "default".to_string()
        } else {
            format!("profile {name}")
        };
        let from_config = read_section(self.config_file.as_ref(), &config_section)?;
        let from_credentials = read_section(self.credentials_file.as_ref(), name)?;
        if from_config.is_none() && from_credentials.is_none() {
            return Ok(None);
        }
        Ok(Some(
            from_config
                .unwrap_or_default()
                .into_iter()
                .chain(from_credentials.unwrap_or_default())
                .collect(),
        ))
    }

    /// Profile `name`'s static keys, else its `credential_process`.
    fn keys_or_process(
        &self,
        name: &str,
        keys: &HashMap<String, String>,
    ) -> Result<Fetched, CredentialsError> {
        let get = |k: &str| get(keys, k);
        match (get("aws_access_key_id"), get("aws_secret_access_key")) {
            (Some(id), Some(secret)) => Ok(Fetched {
                credentials: AwsCredentials::new(id, secret, get("aws_session_token")),
                expires: None,
                from: FROM,
            }),
            _ if get("sso_session").is_some() || get("sso_start_url").is_some() => {
                Err(CredentialsError::source(
                    FROM,
                    format!("profile `{name}` uses SSO, which the relay does not do"),
                    "give the relay static keys, a credential_process, a web identity (IRSA), or an ECS/EC2 role instead",
                ))
            }
            _ if get("credential_process").is_some() => {
                let command = get("credential_process").unwrap_or_default();
                super::process::credentials(name, command)
            }
            _ => Err(CredentialsError::source(
                FROM,
                format!("profile `{name}` has no aws_access_key_id and aws_secret_access_key"),
                "add both keys to the profile",
            )),
        }
    }

    /// `role_arn` with `source_profile`: the source's credentials and the role to assume
    /// with them (one hop: the source profile must have keys or a credential_process).
    fn assume_role(
        &self,
        role_arn: &str,
        keys: &HashMap<String, String>,
    ) -> Result<FromProfile, CredentialsError> {
        let name = &self.name;
        let get = |k: &str| get(keys, k);
        let refuse =
            |message: String, fix: &'static str| Err(CredentialsError::source(FROM, message, fix));
        if get("credential_source").is_some() || get("mfa_serial").is_some() {
            return refuse(
                format!("profile `{name}` assumes its role with credential_source or mfa_serial, which the relay does not do"),
                "use source_profile with a profile holding keys or a credential_process",
            );
        }
        let Some(source) = get("source_profile") else {
            return refuse(
                format!("profile `{name}` has role_arn without source_profile"),
                "add source_profile = <a profile with keys or a credential_process>",
            );
        };
        let source_keys = if source == name {
            Some(keys.clone())
        } else {
            self.keys_of(source)?
        };
        let Some(source_keys) = source_keys else {
            return refuse(
                format!(
                    "profile `{name}`'s source_profile `{source}` is in neither {}",
                    self.files
                ),
                "fix source_profile or add the profile",
            );
        };
        if source != name && source_keys.contains_key("role_arn") {
            return refuse(
                format!("profile `{name}`'s source_profile `{source}` assumes a role itself, which the relay does not chain"),
                "point source_profile at a profile with keys or a credential_process",
            );
        }
        let duration_s = match get("duration_seconds") {
            None => None,
            Some(d) => match d.parse::<u32>() {
                Ok(d) => Some(d),
                Err(_) => {
                    return refuse(
                        format!("profile `{name}`: duration_seconds `{d}` is no number of seconds"),
                        "set it to 900 to 43200, or remove it (1 hour)",
                    )
                }
            },
        };
        Ok(FromProfile::AssumeRole(AssumeRole {
            profile: name.clone(),
            role_arn: role_arn.to_string(),
            session_name: get("role_session_name").map(str::to_string),
            external_id: get("external_id").map(str::to_string),
            duration_s,
            region: get("region").map(str::to_string),
            source: self.keys_or_process(source, &source_keys)?,
        }))
    }
}

/// What a profile gives: credentials, or a role to assume at STS with the source's.
#[derive(Debug)]
pub(super) enum FromProfile {
    Ready(Fetched),
    AssumeRole(AssumeRole),
}

/// `role_arn` + `source_profile`, ready for STS `AssumeRole`.
#[derive(Debug, Clone)]
pub(super) struct AssumeRole {
    pub(super) profile: String,
    pub(super) role_arn: String,
    pub(super) session_name: Option<String>,
    pub(super) external_id: Option<String>,
    pub(super) duration_s: Option<u32>,
    /// The profile's `region`: where STS is asked (else the environment's).
    pub(super) region: Option<String>,
    /// The source profile's credentials, which sign the request.
    pub(super) source: Fetched,
}

fn get<'a>(keys: &'a HashMap<String, String>, key: &str) -> Option<&'a str> {
    keys.get(key).map(String::as_str).filter(|v| !v.is_empty())
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
