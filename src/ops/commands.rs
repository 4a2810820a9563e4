//! The operator commands' dispatch, for `main`: each command of the command line run, its
//! report printed for a human or as JSON, and the exit code it ends with (1 for a failure,
//! 2 for a usage error).

use std::io::IsTerminal;
use std::process::ExitCode;

use super::cli::{Command, DeadLettersCommand, DeadLettersListArgs, ReplayArgs, SlotCommand};
use super::{
    check, dead_letters, emit, format, release_hold, replay, slot, status, OpsError, EXIT_FAILURE,
};
use crate::config::Config;

/// `config --from-debezium FILE`: the TOML on stdout, each key left behind on stderr with its
/// reason; exit 0 when the file was translated, 1 when it cannot be read or is no outbox
/// router configuration.
pub fn from_debezium(path: &std::path::Path) -> ExitCode {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) => {
            eprintln!("outbox-relay: cannot read `{}`: {e}", path.display());
            return ExitCode::from(EXIT_FAILURE);
        }
    };
    match super::from_debezium::convert(&text) {
        Ok(converted) => {
            print!("{}", converted.toml);
            for left in &converted.unmapped {
                eprintln!("outbox-relay: not mapped: {left}");
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("outbox-relay: `{}`: {e}", path.display());
            ExitCode::from(EXIT_FAILURE)
        }
    }
}

/// Runs `config` (the configuration as loaded, secrets redacted), `check`, `status`, `slot …`,
/// `replay` or `dead-letters …`: prints the report, or one line saying what went wrong; exit 1
/// for a failure, 2 for a usage error. `run` is the relay's, started by `main`: nothing here.
pub async fn run(config: &Config, command: Command) -> ExitCode {
    let json = match &command {
        Command::Check(out) | Command::Status(out) => out.json,
        Command::Slot(SlotCommand::Create(out)) => out.json,
        Command::Slot(
            SlotCommand::Drop { out, .. }
            | SlotCommand::Advance { out, .. }
            | SlotCommand::ReleaseHold { out, .. },
        ) => out.json,
        Command::Replay(args) => args.out.json,
        Command::DeadLetters(DeadLettersCommand::List(args)) => args.out.json,
        Command::DeadLetters(DeadLettersCommand::Redrive(args)) => args.select.out.json,
        Command::Run | Command::Config(_) => false,
    };
    let succeeded = match command {
        Command::Check(_) => Ok(emit(&check::run(config).await, json)),
        Command::Status(_) => status::run(config).await.map(|r| emit(&r, json)),
        Command::Slot(SlotCommand::Create(_)) => slot::create(config).await.map(|r| emit(&r, json)),
        Command::Slot(SlotCommand::Drop { yes, force, .. }) => {
            slot::drop(config, yes, force).await.map(|r| emit(&r, json))
        }
        Command::Slot(SlotCommand::Advance { to, force, .. }) => slot::advance(config, to, force)
            .await
            .map(|r| emit(&r, json)),
        Command::Slot(SlotCommand::ReleaseHold { yes, table, .. }) => {
            release_hold::run(config, table.as_deref(), yes)
                .await
                .map(|r| emit(&r, json))
        }
        Command::Replay(args) => {
            let options = replay_options(args, json);
            replay::run(config, &options).await.map(|r| emit(&r, json))
        }
        Command::DeadLetters(DeadLettersCommand::List(args)) => {
            dead_letters::list(config, dead_letter_filter(args))
                .await
                .map(|r| emit(&r, json))
        }
        Command::DeadLetters(DeadLettersCommand::Redrive(args)) => {
            let options = dead_letters::RedriveOptions {
                filter: dead_letter_filter(args.select),
                dry_run: args.dry_run,
                max_redrives: args.max_redrives,
                group: args.group,
                progress: !json && std::io::stderr().is_terminal(),
            };
            dead_letters::redrive(config, options)
                .await
                .map(|r| emit(&r, json))
        }
        Command::Config(_) => {
            print!("{}", config.to_redacted_toml());
            Ok(true)
        }
        Command::Run => Ok(true),
    };
    match succeeded {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(EXIT_FAILURE),
        Err(e) => report_error(&e, json),
    }
}

fn dead_letter_filter(args: DeadLettersListArgs) -> dead_letters::Filter {
    dead_letters::Filter {
        reason: args.reason,
        event_id: args.event_id,
        topic: args.topic,
        since: args.since,
        until: args.until,
        limit: args.limit,
    }
}

fn replay_options(args: ReplayArgs, json: bool) -> replay::ReplayOptions {
    replay::ReplayOptions {
        selection: replay::Selection {
            since: args.since,
            until: args.until,
            from_id: args.from_id,
            to_id: args.to_id,
            aggregate_type: args.aggregate_type,
            event_type: args.event_type,
        },
        table: args.table,
        dry_run: args.dry_run,
        progress: !json && std::io::stderr().is_terminal(),
    }
}

/// One line on stderr; under --json also a JSON object on stdout, so scripts always parse.
fn report_error(error: &OpsError, json: bool) -> ExitCode {
    let code = error.exit_code();
    let message = error.to_string();
    eprintln!("outbox-relay: {message}");
    if json {
        format::print_json(&format::error_json(&message, code));
    }
    ExitCode::from(code)
}
