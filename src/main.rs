//! The `outbox-relay` command line.

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;
use outbox_relay::config::{Config, LogFormat};
use outbox_relay::ops::cli::{
    Cli, Command, ConfigArgs, DeadLettersCommand, DeadLettersListArgs, ReplayArgs, SlotCommand,
};
use outbox_relay::ops::{self, replay, slot, OpsError};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

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
    if let Command::Config(ConfigArgs {
        from_debezium: Some(path),
    }) = &cli.command
    {
        // A translation of another tool's file: no config of ours is read, nothing is reached.
        return from_debezium(path);
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
            (Command::Config(_), _) => {
                print!("{}", config.to_redacted_toml());
                ExitCode::SUCCESS
            }
            (command, _) => operator_command(&config, command).await,
        }
    })
}

/// `config --from-debezium FILE`: the TOML on stdout, each key left behind on stderr with its
/// reason; exit 0 when the file was translated, 1 when it cannot be read or is no outbox
/// router configuration.
fn from_debezium(path: &std::path::Path) -> ExitCode {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) => {
            eprintln!("outbox-relay: cannot read `{}`: {e}", path.display());
            return ExitCode::from(ops::EXIT_FAILURE);
        }
    };
    match ops::from_debezium::convert(&text) {
        Ok(converted) => {
            print!("{}", converted.toml);
            for left in &converted.unmapped {
                eprintln!("outbox-relay: not mapped: {left}");
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("outbox-relay: `{}`: {e}", path.display());
            ExitCode::from(ops::EXIT_FAILURE)
        }
    }
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
        Command::Run | Command::Config(_) => false,
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
        Command::Run | Command::Config(_) => Ok(true),
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
