//! TLS towards PostgreSQL, for both connections: modes as libpq's `sslmode`, a CA file for
//! verification, and SCRAM channel binding (`tls-server-end-point`) on the replication
//! connection. OpenSSL, as librdkafka already links it.

use std::path::PathBuf;

use openssl::hash::MessageDigest;
use openssl::nid::Nid;
use openssl::ssl::{SslConnector, SslMethod, SslRef, SslVerifyMode};

use crate::config::{split_tls_params, PostgresConfig, SslMode};

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot set up TLS for PostgreSQL: {0}")]
    Setup(#[from] openssl::error::ErrorStack),
    #[error("cannot read the CA file `{path}` (postgres.ssl_root_cert): {source}")]
    RootCert {
        path: String,
        #[source]
        source: openssl::error::ErrorStack,
    },
}

/// The TLS settings in force, from the config keys or, when those are at their defaults,
/// from `sslmode` / `sslrootcert` in the URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsSettings {
    pub mode: SslMode,
    pub root_cert: Option<PathBuf>,
}

impl TlsSettings {
    /// The settings and the URL without its TLS parameters (tokio-postgres' own parser knows
    /// neither `verify-ca` nor `verify-full`).
    pub fn resolve(pg: &PostgresConfig) -> (TlsSettings, String) {
        let (url, url_mode, url_root) = split_tls_params(&pg.url);
        let mode = match (pg.ssl_mode, url_mode.as_deref().and_then(SslMode::parse)) {
            (SslMode::Prefer, Some(from_url)) => from_url,
            (configured, _) => configured,
        };
        let root = pg.ssl_root_cert.clone().or(url_root.map(PathBuf::from));
        (
            TlsSettings {
                mode,
                root_cert: root,
            },
            url,
        )
    }

    /// Whether certificates are checked at all.
    pub fn verifies(&self) -> bool {
        matches!(self.mode, SslMode::VerifyCa | SslMode::VerifyFull)
    }

    /// An OpenSSL connector doing the verification the mode asks for. Host names are checked
    /// by the caller's `ConnectConfiguration` unless the mode is `verify-ca`.
    pub fn connector(&self) -> Result<SslConnector, TlsError> {
        let mut builder = SslConnector::builder(SslMethod::tls_client())?;
        if self.verifies() {
            if let Some(path) = &self.root_cert {
                builder
                    .set_ca_file(path)
                    .map_err(|source| TlsError::RootCert {
                        path: path.display().to_string(),
                        source,
                    })?;
            }
            builder.set_verify(SslVerifyMode::PEER);
        } else {
            // prefer / require: encrypted, not authenticated (as libpq does).
            builder.set_verify(SslVerifyMode::NONE);
        }
        // Without it OpenSSL reads each TLS record with two reads of exactly its header and
        // body; the walsender sends every message in a record of its own, so streaming cost
        // two system calls per message. With it, one read takes whatever has arrived.
        builder.set_read_ahead(true);
        Ok(builder.build())
    }

    /// The connector for the control connection (tokio-postgres).
    pub fn make_tls(&self) -> Result<postgres_openssl::MakeTlsConnector, TlsError> {
        let mut make = postgres_openssl::MakeTlsConnector::new(self.connector()?);
        let check_host = self.mode == SslMode::VerifyFull;
        make.set_callback(move |config, _host| {
            config.set_verify_hostname(check_host);
            Ok(())
        });
        Ok(make)
    }

    /// The tokio-postgres `sslmode` matching ours (it knows only disable/prefer/require).
    pub fn tokio_postgres_mode(&self) -> tokio_postgres::config::SslMode {
        match self.mode {
            SslMode::Disable => tokio_postgres::config::SslMode::Disable,
            SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
            _ => tokio_postgres::config::SslMode::Require,
        }
    }
}

/// The `tls-server-end-point` channel binding data: the server certificate's hash, with the
/// certificate's own signature hash (SHA-256 for MD5 and SHA-1), as RFC 5929 says.
pub fn server_end_point(ssl: &SslRef) -> Option<Vec<u8>> {
    let cert = ssl.peer_certificate()?;
    let algorithm = cert.signature_algorithm().object().nid();
    let digest = match algorithm.signature_algorithms().map(|a| a.digest) {
        Some(Nid::MD5) | Some(Nid::SHA1) | None => MessageDigest::sha256(),
        Some(nid) => MessageDigest::from_nid(nid).unwrap_or_else(MessageDigest::sha256),
    };
    cert.digest(digest).ok().map(|d| d.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pg(url: &str, mode: SslMode, root: &str) -> PostgresConfig {
        PostgresConfig {
            url: url.into(),
            ssl_mode: mode,
            ssl_root_cert: (!root.is_empty()).then(|| root.into()),
            ..PostgresConfig::default()
        }
    }

    #[test]
    fn url_parameters_apply_when_the_keys_are_defaults() {
        let (tls, url) = TlsSettings::resolve(&pg(
            "postgres://u@db:5432/app?sslmode=verify-full&sslrootcert=/ca.pem&application_name=x",
            SslMode::Prefer,
            "",
        ));
        assert_eq!(tls.mode, SslMode::VerifyFull);
        assert_eq!(tls.root_cert, Some(PathBuf::from("/ca.pem")));
        assert_eq!(url, "postgres://u@db:5432/app?application_name=x");
    }

    #[test]
    fn config_keys_win_over_the_url() {
        let (tls, url) = TlsSettings::resolve(&pg(
            "postgres://u@db/app?sslmode=require",
            SslMode::VerifyCa,
            "/mine.pem",
        ));
        assert_eq!(tls.mode, SslMode::VerifyCa);
        assert_eq!(tls.root_cert, Some(PathBuf::from("/mine.pem")));
        assert_eq!(url, "postgres://u@db/app");
    }

    #[test]
    fn key_value_strings_are_handled_too() {
        let (tls, url) = TlsSettings::resolve(&pg(
            "host=db user=u sslmode=verify-ca dbname=app",
            SslMode::Prefer,
            "",
        ));
        assert_eq!(tls.mode, SslMode::VerifyCa);
        assert_eq!(url, "host=db user=u dbname=app");
        assert_eq!(
            tls.tokio_postgres_mode(),
            tokio_postgres::config::SslMode::Require
        );
    }
}
