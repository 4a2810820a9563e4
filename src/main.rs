//! The `outbox-relay` command line, in its order: the signals (`outbox_relay::signals`), the
//! arguments, the runtime, the configuration and the log, then the command — `run` streams
//! (`outbox_relay::relay::run`), the operator commands are `outbox_relay::ops::commands`.

use std::process::ExitCode;

use clap::Parser;
use outbox_relay::config::{Config, LogFormat};
use outbox_relay::ops::cli::{Cli, Command, ConfigArgs};
use outbox_relay::ops::commands;
use outbox_relay::signals::{early, Signals};
use tokio_util::sync::CancellationToken;
use tracing::warn;

fn main() -> ExitCode {
    // Signals first, before anything else runs: a pod stopped right after it started (a rolling
    // deploy) must exit 0, not die of the signal's default action while the config is read.
    if let Err(e) = early::install() {
        eprintln!("outbox-relay: cannot install the SIGTERM/SIGINT handlers: {e}");
        return ExitCode::FAILURE;
    }
    let cli = Cli::parse();
    if !matches!(cli.command, Command::Run) {
        // The other commands stop on a signal as any command does.
        early::restore_default();
    }
    let runtime = match runtime() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("outbox-relay: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let signals = match cli.command {
        Command::Run => match runtime.block_on(async { Signals::install() }) {
            Ok(signals) => Some(signals),
            Err(e) => {
                eprintln!("outbox-relay: cannot install the SIGTERM/SIGINT handlers: {e}");
                return ExitCode::FAILURE;
            }
        },
        _ => None,
    };
    if let Command::Config(ConfigArgs {
        from_debezium: Some(path),
    }) = &cli.command
    {
        // A translation of another tool's file: no config of ours is read, nothing is reached.
        return commands::from_debezium(path);
    }
    let config = match Config::load(cli.config.as_deref()) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("outbox-relay: {e}");
            return ExitCode::from(2);
        }
    };
    // The operator commands print their own results: only warnings and errors go to the log.
    let default_log = match cli.command {
        Command::Run | Command::Config(_) => "info,rdkafka=warn",
        _ => "warn,rdkafka=error",
    };
    let log_format = if cli.log_json {
        LogFormat::Json
    } else {
        config.relay.log_format
    };
    init_logging(log_format, default_log);
    runtime.block_on(async {
        match (cli.command, signals) {
            (Command::Run, Some(signals)) => run(config, signals).await,
            (command, _) => commands::run(&config, command).await,
        }
    })
}

/// Streams until a signal (exit 0) or an error that needs an operator: exit 3 when the slot is
/// lost or dropped (events may be missing), 1 otherwise.
async fn run(config: Config, signals: Signals) -> ExitCode {
    let shutdown = CancellationToken::new();
    tokio::spawn(signals.cancel_on_first(shutdown.clone()));
    for (key, value, why) in config.kafka.unsafe_properties() {
        warn!(property = %key, value = %value, reason = why,
            "unsafe Kafka setting accepted (kafka.allow_unsafe_kafka_settings = true)");
    }
    match outbox_relay::relay::run(config, shutdown).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("outbox-relay: relay failed: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

/// One thread: the pipeline is a single sequential loop, and a second runtime thread only adds
/// a wake-up per readable socket (measured: half the CPU per event, bench/README.md).
/// librdkafka has its own threads.
fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
}

fn init_logging(format: LogFormat, default_filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("OUTBOX_RELAY_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
}
