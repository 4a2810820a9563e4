//! Operator commands: `check` (pre-flight), `status`, `slot create|drop|advance|release-hold`,
//! `replay` and `dead-letters list|redrive`.
//!
//! They share the relay's configuration and its control connection. Each command returns a
//! report that prints for a human ([`std::fmt::Display`]) or as JSON (`serde`), and says
//! whether it succeeded; `commands.rs` picks the form and the exit code (1 for a failure, 2 for a
//! usage error, see [`OpsError::exit_code`]).
//!
//! Names from the configuration are quoted as identifiers and values from the command line are
//! bound as parameters: nothing the operator types is spliced into SQL text.

pub mod check;
pub mod cli;
pub mod commands;
pub mod dead_letters;
pub mod format;
pub mod from_debezium;
pub mod release_hold;
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

/// Why an operator command failed. PostgreSQL errors (connecting, a query) are the control
/// connection's own [`ControlError`], printed on one line.
#[derive(Debug, thiserror::Error)]
pub enum OpsError {
    #[error(transparent)]
    Control(#[from] ControlError),
    #[error(transparent)]
    Mapping(#[from] MappingError),
    #[error(transparent)]
    Publish(#[from] PublishError),
    #[error(transparent)]
    Slot(#[from] slot::SlotError),
    #[error(transparent)]
    Replay(#[from] replay::ReplayError),
    #[error("cannot read the dead-letter topic `{topic}`: {problem}")]
    DeadLetters { topic: String, problem: String },
    /// `[outbox.serialization]`'s password or token file cannot be read.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
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

/// Opens the control connection the commands work through.
pub async fn connect(config: &Config) -> Result<Control, OpsError> {
    Ok(Control::connect(&config.postgres).await?)
}
