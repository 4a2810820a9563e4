//! The `outbox-relay` command line.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use outbox_relay::config::{Config, LogFormat};
use outbox_relay::ops::{self, replay, slot, OpsError};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

#[derive(Parser)]
#[command(
    name = "outbox-relay",
    version,
    about = "Transactional outbox relay: PostgreSQL logical replication to Kafka"
)]
struct Cli {
    /// The config file (TOML). Every key can also be set as OUTBOX_RELAY__<SECTION>__<KEY>.
    #[arg(long, short, global = true, env = "OUTBOX_RELAY_CONFIG")]
    config: Option<PathBuf>,
    /// Log one JSON object per line (overrides relay.log_format).
    #[arg(long, global = true)]
    log_json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Stream the outbox to Kafka until SIGTERM or Ctrl-C.
    Run,
    /// Print the effective configuration, secrets redacted.
    Config,
    /// Pre-flight: check PostgreSQL and Kafka set-up; each problem comes with its fix.
    ///
    /// Exit 0 when there is no problem (warnings allowed), 1 otherwise.
    Check(JsonFlag),
    /// Where the relay stands: slot, lag, retained WAL, publication, outbox rows.
    ///
    /// Read-only; safe while the relay runs. Exit 1 when the slot is missing or lost.
    Status(JsonFlag),
    /// Create, drop or advance the replication slot; release its sweeper hold.
    #[command(subcommand)]
    Slot(SlotCommand),
    /// Re-publish events still in the outbox table (the rewind a slot cannot do).
    ///
    /// Rows are selected by the given filters (all must match) and sent in created_at, id order
    /// with the same topic, key, payload and headers as the live stream, plus the header
    /// `outbox-relay-replay: true`. Success is reported only once Kafka acknowledged every
    /// record; any failure exits 1.
    Replay(ReplayArgs),
    /// Read the dead-letter topic (`dead_letter.topic`).
    #[command(subcommand)]
    DeadLetters(DeadLettersCommand),
}

#[derive(Subcommand)]
enum DeadLettersCommand {
    /// List dead letters (reason, event id, original topic or table, error), filtered; reads
    /// the topic from its beginning to its current end and consumes nothing.
    List(DeadLettersListArgs),
    /// Send dead letters back: those of a mapping reason are mapped again with the current
    /// configuration, those Kafka refused are re-sent to their topic as they were.
    ///
    /// Reads from the position of its consumer group (--group), which is committed only once
    /// Kafka acknowledged what was sent: an interrupted redrive resumes, a finished one run
    /// again sends nothing. Records still unmappable are dead-lettered again with their
    /// redrive count raised; past --max-redrives a dead letter is left and reported. Exit 1
    /// when Kafka did not take a record (run it again).
    Redrive(DeadLettersRedriveArgs),
}

#[derive(Args)]
struct DeadLettersRedriveArgs {
    #[command(flatten)]
    select: DeadLettersListArgs,
    /// Decide and report, but send and commit nothing.
    #[arg(long)]
    dry_run: bool,
    /// Leave a dead letter that was redriven this many times already.
    #[arg(long, value_name = "N", default_value_t = ops::dead_letters::DEFAULT_MAX_REDRIVES)]
    max_redrives: u32,
    /// The consumer group holding the redrive's position. Filters pass over the dead letters
    /// they do not select; redrive those later with another group.
    #[arg(long, default_value = ops::dead_letters::REDRIVE_GROUP)]
    group: String,
}

#[derive(Args)]
struct DeadLettersListArgs {
    /// Only this reason: mapping, invalid_topic, too_large or rejected.
    #[arg(long)]
    reason: Option<String>,
    /// Only the dead letter of this event id (the record key).
    #[arg(long, value_name = "ID")]
    event_id: Option<String>,
    /// Only those of this original topic (or, for rows that never became a record, table).
    #[arg(long)]
    topic: Option<String>,
    /// Records timestamped at or after this RFC 3339 time (e.g. 2026-05-01T12:00:00Z).
    #[arg(long, value_name = "TIME")]
    since: Option<jiff::Timestamp>,
    /// Records timestamped before this RFC 3339 time.
    #[arg(long, value_name = "TIME")]
    until: Option<jiff::Timestamp>,
    /// Show (redrive: send) at most this many; the counts per reason cover all that match.
    #[arg(long, value_name = "N")]
    limit: Option<usize>,
    #[command(flatten)]
    out: JsonFlag,
}

#[derive(Args)]
struct JsonFlag {
    /// Print the result as JSON on stdout (for scripts).
    #[arg(long)]
    json: bool,
}

#[derive(Subcommand)]
enum SlotCommand {
    /// Create the logical slot (pgoutput) if it does not exist. Idempotent.
    Create(JsonFlag),
    /// Drop the slot. Idempotent. Refuses while the slot is active unless --force.
    Drop {
        /// Confirm: the slot's position is lost, and events committed while no slot exists are
        /// never relayed.
        #[arg(long)]
        yes: bool,
        /// End the backend holding the slot first (pg_terminate_backend). Stop a running relay
        /// instead: it reconnects.
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        out: JsonFlag,
    },
    /// Skip forward: move the slot's confirmed position to an LSN, or to `now`.
    ///
    /// Events committed in between are not relayed. A slot cannot move backwards: to send
    /// events again, use `replay`. Refuses while the slot is active unless --force.
    Advance {
        /// The target position, like 0/16B3748, or `now` for the server's current position.
        #[arg(long, value_name = "LSN|now")]
        to: slot::AdvanceTarget,
        /// End the backend holding the slot first (pg_terminate_backend).
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        out: JsonFlag,
    },
    /// End the sweeper hold on the rows a new slot never streamed (a covering `replay`
    /// releases it by itself): they are then swept once older than the retention.
    ReleaseHold {
        /// Confirm: the held rows are deleted once they pass the retention.
        #[arg(long)]
        yes: bool,
        /// Only this outbox table's hold (`schema.table`, or a bare name in public).
        #[arg(long, value_name = "TABLE")]
        table: Option<String>,
        #[command(flatten)]
        out: JsonFlag,
    },
}

#[derive(Args)]
struct ReplayArgs {
    /// Rows with created_at at or after this time (PostgreSQL timestamptz input,
    /// e.g. '2026-05-01 12:00:00+00'; '-infinity' selects all).
    #[arg(long, value_name = "TIME", allow_hyphen_values = true)]
    since: Option<String>,
    /// Rows with created_at before this time.
    #[arg(long, value_name = "TIME", allow_hyphen_values = true)]
    until: Option<String>,
    /// Rows whose id is at least this (compared as the id column's type).
    #[arg(long, value_name = "ID", allow_hyphen_values = true)]
    from_id: Option<String>,
    /// Rows whose id is at most this.
    #[arg(long, value_name = "ID", allow_hyphen_values = true)]
    to_id: Option<String>,
    /// Rows of this aggregate type only.
    #[arg(long, value_name = "TYPE")]
    aggregate_type: Option<String>,
    /// Rows of this event type only.
    #[arg(long = "type", value_name = "TYPE")]
    event_type: Option<String>,
    /// Replay only this outbox table (`schema.table`, or a bare name in public); default: every
    /// configured table, merged in created_at order.
    #[arg(long, value_name = "TABLE")]
    table: Option<String>,
    /// Count and map the selected rows; send nothing.
    #[arg(long)]
    dry_run: bool,
    #[command(flatten)]
    out: JsonFlag,
}

fn main() -> ExitCode {
    // Signals first, before anything else runs: a pod stopped right after it started (a rolling
    // deploy) must exit 0, not die of the signal's default action while the config is read.
    if let Err(e) = early_signal::install() {
        eprintln!("outbox-relay: cannot install the SIGTERM/SIGINT handlers: {e}");
        return ExitCode::FAILURE;
    }
    let cli = Cli::parse();
    if !matches!(cli.command, Command::Run) {
        // The other commands stop on a signal as any command does.
        early_signal::restore_default();
    }
    // One thread: the pipeline is a single sequential loop, and a second runtime thread only
    // adds a wake-up per readable socket (measured: half the CPU per event, bench/README.md).
    // librdkafka has its own threads.
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
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
    let config = match Config::load(cli.config.as_deref()) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("outbox-relay: {e}");
            return ExitCode::from(2);
        }
    };
    // The operator commands print their own results: only warnings and errors go to the log.
    let default_log = match cli.command {
        Command::Run | Command::Config => "info,rdkafka=warn",
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
            (Command::Config, _) => {
                print!("{}", config.to_redacted_toml());
                ExitCode::SUCCESS
            }
            (command, _) => operator_command(&config, command).await,
        }
    })
}

/// Runs `check`, `status`, `slot …` or `replay`: prints the report, or one line saying what
/// went wrong; exit 1 for a failure, 2 for a usage error.
async fn operator_command(config: &Config, command: Command) -> ExitCode {
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
        Command::Run | Command::Config => false,
    };
    let succeeded = match command {
        Command::Check(_) => Ok(ops::emit(&ops::check::run(config).await, json)),
        Command::Status(_) => ops::status::run(config).await.map(|r| ops::emit(&r, json)),
        Command::Slot(SlotCommand::Create(_)) => {
            slot::create(config).await.map(|r| ops::emit(&r, json))
        }
        Command::Slot(SlotCommand::Drop { yes, force, .. }) => slot::drop(config, yes, force)
            .await
            .map(|r| ops::emit(&r, json)),
        Command::Slot(SlotCommand::Advance { to, force, .. }) => slot::advance(config, to, force)
            .await
            .map(|r| ops::emit(&r, json)),
        Command::Slot(SlotCommand::ReleaseHold { yes, table, .. }) => {
            ops::release_hold::run(config, table.as_deref(), yes)
                .await
                .map(|r| ops::emit(&r, json))
        }
        Command::Replay(args) => {
            let options = replay_options(args, json);
            replay::run(config, &options)
                .await
                .map(|r| ops::emit(&r, json))
        }
        Command::DeadLetters(DeadLettersCommand::List(args)) => {
            ops::dead_letters::list(config, dead_letter_filter(args))
                .await
                .map(|r| ops::emit(&r, json))
        }
        Command::DeadLetters(DeadLettersCommand::Redrive(args)) => {
            let options = ops::dead_letters::RedriveOptions {
                filter: dead_letter_filter(args.select),
                dry_run: args.dry_run,
                max_redrives: args.max_redrives,
                group: args.group,
                progress: !json && std::io::stderr().is_terminal(),
            };
            ops::dead_letters::redrive(config, options)
                .await
                .map(|r| ops::emit(&r, json))
        }
        Command::Run | Command::Config => Ok(true),
    };
    match succeeded {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(ops::EXIT_FAILURE),
        Err(e) => report_error(&e, json),
    }
}

fn dead_letter_filter(args: DeadLettersListArgs) -> ops::dead_letters::Filter {
    ops::dead_letters::Filter {
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
        ops::format::print_json(&ops::format::error_json(&message, code));
    }
    ExitCode::from(code)
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

/// SIGTERM and SIGINT for the runtime, taken over from the moment of [`Signals::install`]; one
/// that came earlier was noted by [`early_signal`].
struct Signals {
    #[cfg(unix)]
    terminate: tokio::signal::unix::Signal,
    #[cfg(unix)]
    interrupt: tokio::signal::unix::Signal,
}

impl Signals {
    /// Registers now (inside the runtime, which delivers them later): `tokio::signal::ctrl_c()`
    /// would register only when first polled.
    #[cfg(unix)]
    fn install() -> std::io::Result<Signals> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Signals {
            terminate: signal(SignalKind::terminate())?,
            interrupt: signal(SignalKind::interrupt())?,
        })
    }

    #[cfg(not(unix))]
    fn install() -> std::io::Result<Signals> {
        Ok(Signals {})
    }

    /// Cancels `shutdown` at the first SIGTERM or SIGINT, or at once when one came before
    /// these handlers (checked after registering them, so none falls in between).
    async fn cancel_on_first(mut self, shutdown: CancellationToken) {
        if !early_signal::received() {
            self.recv().await;
        }
        info!("shutdown requested");
        shutdown.cancel();
    }

    #[cfg(unix)]
    async fn recv(&mut self) {
        tokio::select! {
            _ = self.terminate.recv() => {}
            _ = self.interrupt.recv() => {}
        }
    }

    #[cfg(not(unix))]
    async fn recv(&mut self) {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// SIGTERM and SIGINT from the first line of `main`, before the runtime exists: the handler
/// only notes the signal. tokio's handlers, installed later, call it too (signal-hook chains
/// to the previous handler), which does no harm.
///
/// Only the few milliseconds in which the kernel and the dynamic loader start the process
/// come before it; no program can catch a signal there.
#[cfg(unix)]
#[allow(
    unsafe_code,
    reason = "FFI: a signal handler before the runtime exists"
)]
mod early_signal {
    use std::sync::atomic::{AtomicI32, Ordering};

    /// The signal received before the runtime took over, or 0.
    static RECEIVED: AtomicI32 = AtomicI32::new(0);
    const SIGNALS: [libc::c_int; 2] = [libc::SIGTERM, libc::SIGINT];

    extern "C" fn note(signal: libc::c_int) {
        // An atomic store is async-signal-safe.
        RECEIVED.store(signal, Ordering::SeqCst);
    }

    /// Catches SIGTERM and SIGINT, then unblocks them: a parent that blocked them across exec
    /// would leave the relay deaf to a stop, and one sent meanwhile is caught now.
    pub fn install() -> std::io::Result<()> {
        set_handler(note as *const () as libc::sighandler_t)?;
        let set = signal_set();
        // SAFETY: `set` is an initialised sigset_t; no old mask is asked for.
        match unsafe { libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut()) } {
            0 => Ok(()),
            e => Err(std::io::Error::from_raw_os_error(e)),
        }
    }

    /// A sigset_t holding [`SIGNALS`].
    fn signal_set() -> libc::sigset_t {
        let mut set = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
        // SAFETY: sigemptyset initialises the set it is given.
        unsafe { libc::sigemptyset(set.as_mut_ptr()) };
        // SAFETY: initialised just above.
        let mut set = unsafe { set.assume_init() };
        for signal in SIGNALS {
            // SAFETY: `set` is initialised and `signal` a valid signal number.
            unsafe { libc::sigaddset(&mut set, signal) };
        }
        set
    }

    /// Back to the default actions; a signal noted meanwhile is raised again, so that the
    /// process ends by it as if nothing had been installed.
    pub fn restore_default() {
        let _ = set_handler(libc::SIG_DFL);
        let signal = RECEIVED.load(Ordering::SeqCst);
        if signal != 0 {
            // SAFETY: raising a signal has no memory effects.
            unsafe { libc::raise(signal) };
        }
    }

    pub fn received() -> bool {
        RECEIVED.load(Ordering::SeqCst) != 0
    }

    fn set_handler(handler: libc::sighandler_t) -> std::io::Result<()> {
        // SAFETY: sigaction is plain data, for which all-zero bytes are a valid value.
        let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
        action.sa_sigaction = handler;
        action.sa_flags = libc::SA_RESTART;
        // SAFETY: `sa_mask` is a sigset_t inside `action`, owned here.
        unsafe { libc::sigemptyset(&mut action.sa_mask) };
        for signal in SIGNALS {
            // SAFETY: `action` is initialised; `handler` (ours, or SIG_DFL) only does an
            // atomic store; no old action is asked for.
            if unsafe { libc::sigaction(signal, &action, std::ptr::null_mut()) } != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok(())
    }
}

#[cfg(not(unix))]
mod early_signal {
    pub fn install() -> std::io::Result<()> {
        Ok(())
    }
    pub fn restore_default() {}
    pub fn received() -> bool {
        false
    }
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
