//! Operator commands: `check` (pre-flight), `status`, `slot create|drop|advance` and `replay`.
//!
//! They share the relay's configuration and its control connection. Each command returns a
//! report that prints for a human ([`std::fmt::Display`]) or as JSON (`serde`), and says
//! whether it succeeded; `main` picks the form and the exit code (1 for a failure, 2 for a
//! usage error, see [`OpsError::exit_code`]).
//!
//! Names from the configuration are quoted as identifiers and values from the command line are
//! bound as parameters: nothing the operator types is spliced into SQL text.

pub mod check;
pub mod format;
pub mod replay;
mod rows;
pub mod slot;
pub mod status;

use serde::Serialize;

use crate::config::Config;
use crate::mapping::MappingError;
use crate::postgres::control::{Control, ControlError};
use crate::sink::publisher::PublishError;

/// Exit code of a failed command (server state, Kafka, a refused operation).
pub const EXIT_FAILURE: u8 = 1;
/// Exit code of a usage error (bad flag value or combination): clap's own code too.
pub const EXIT_USAGE: u8 = 2;

#[derive(Debug, thiserror::Error)]
pub enum OpsError {
    #[error("cannot connect to PostgreSQL ({target}): {}; check that the server is running and that postgres.url and the password are right", pg_message(source))]
    Connect {
        target: String,
        #[source]
        source: tokio_postgres::Error,
    },
    #[error("{what}: {}", pg_message(source))]
    Query {
        what: String,
        #[source]
        source: tokio_postgres::Error,
    },
    #[error(transparent)]
    Control(ControlError),
    #[error(transparent)]
    Mapping(#[from] MappingError),
    #[error(transparent)]
    Publish(#[from] PublishError),
    #[error(transparent)]
    Slot(#[from] slot::SlotError),
    #[error(transparent)]
    Replay(#[from] replay::ReplayError),
}

impl From<ControlError> for OpsError {
    /// Query errors are re-wrapped so that they print on one line, like ours.
    fn from(error: ControlError) -> Self {
        match error {
            ControlError::Query { what, source } => OpsError::Query { what, source },
            other => OpsError::Control(other),
        }
    }
}

impl OpsError {
    /// 2 for usage errors, 1 for everything else.
    pub fn exit_code(&self) -> u8 {
        let usage = match self {
            OpsError::Slot(e) => e.is_usage(),
            OpsError::Replay(e) => e.is_usage(),
            _ => false,
        };
        if usage {
            EXIT_USAGE
        } else {
            EXIT_FAILURE
        }
    }
}

/// What a command hands back to `main`: printable both ways, and a verdict.
pub trait Report: Serialize + std::fmt::Display {
    /// False when the command ran but found a failure (exit code 1).
    fn succeeded(&self) -> bool {
        true
    }
}

/// Prints the report in the requested form; returns whether the command succeeded.
pub fn emit<R: Report>(report: &R, json: bool) -> bool {
    if json {
        format::print_json(report);
    } else {
        print!("{report}");
    }
    report.succeeded()
}

/// Maps a query error to [`OpsError::Query`], naming what was being done.
pub(crate) fn query_err(what: impl Into<String>) -> impl FnOnce(tokio_postgres::Error) -> OpsError {
    let what = what.into();
    move |source| OpsError::Query { what, source }
}

/// A PostgreSQL error on one line: the server's message and hint, or the client error.
pub fn pg_message(error: &tokio_postgres::Error) -> String {
    match error.as_db_error() {
        Some(db) => {
            let mut text = format!("{} (SQLSTATE {})", db.message(), db.code().code());
            if let Some(hint) = db.hint() {
                text.push_str("; hint: ");
                text.push_str(hint);
            }
            text.replace('\n', " ")
        }
        None => {
            // The client error's Display leaves out its cause ("connection refused"): add it.
            let mut text = error.to_string();
            let mut source = std::error::Error::source(error);
            while let Some(cause) = source {
                text.push_str(": ");
                text.push_str(&cause.to_string());
                source = cause.source();
            }
            text.replace('\n', " ")
        }
    }
}

/// The SQLSTATE of a server error, if it is one.
pub(crate) fn sqlstate(error: &tokio_postgres::Error) -> Option<&str> {
    error.as_db_error().map(|db| db.code().code())
}

/// Opens the control connection the commands work through.
pub async fn connect(config: &Config) -> Result<Control, OpsError> {
    Control::connect(&config.postgres)
        .await
        .map_err(|e| match e {
            ControlError::Connect { target, source } => OpsError::Connect { target, source },
            other => OpsError::Control(other),
        })
}
