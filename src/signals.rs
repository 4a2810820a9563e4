//! SIGTERM and SIGINT, from the first line of `main` to the relay's shutdown token.
//!
//! A pod stopped right after it started (a rolling deploy) must exit 0, not die of the
//! signal's default action while the configuration is read. So `main` calls [`early::install`]
//! before anything else, when no runtime exists yet: its handler only notes the signal. Once
//! the runtime runs, [`Signals::install`] takes over and [`Signals::cancel_on_first`] cancels
//! the shutdown token the relay was given, at once if a signal was noted meanwhile. Commands
//! other than `run` go back to the default actions ([`early::restore_default`]).
//!
//! Uses nothing of the crate. Its floor (`src/floors.rs`) is right under the relay and the
//! operator commands, which run until stopped, and over the data path, whose stages are handed
//! a token and never look at signals themselves.

use tokio_util::sync::CancellationToken;
use tracing::info;

/// SIGTERM and SIGINT for the runtime, taken over from the moment of [`Signals::install`]; one
/// that came earlier was noted by [`early`].
pub struct Signals {
    #[cfg(unix)]
    terminate: tokio::signal::unix::Signal,
    #[cfg(unix)]
    interrupt: tokio::signal::unix::Signal,
}

impl Signals {
    /// Registers now (inside the runtime, which delivers them later): `tokio::signal::ctrl_c()`
    /// would register only when first polled.
    #[cfg(unix)]
    pub fn install() -> std::io::Result<Signals> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Signals {
            terminate: signal(SignalKind::terminate())?,
            interrupt: signal(SignalKind::interrupt())?,
        })
    }

    #[cfg(not(unix))]
    pub fn install() -> std::io::Result<Signals> {
        Ok(Signals {})
    }

    /// Cancels `shutdown` at the first SIGTERM or SIGINT, or at once when one came before
    /// these handlers (checked after registering them, so none falls in between).
    pub async fn cancel_on_first(mut self, shutdown: CancellationToken) {
        if !early::received() {
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
pub mod early {
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

    /// Whether a signal was noted before the runtime took over.
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
pub mod early {
    pub fn install() -> std::io::Result<()> {
        Ok(())
    }
    pub fn restore_default() {}
    pub fn received() -> bool {
        false
    }
}
