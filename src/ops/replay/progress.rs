//! The progress bar on stderr (`indicatif`): done/total, rate, ETA. Drawn only when asked for,
//! which `main` does when stderr is a terminal and the output is not `--json`.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressState, ProgressStyle};

/// `[########----------------]  1200/5000  24%  830 records/s  ETA 5s`
const TEMPLATE: &str = "[{bar:24}] {pos}/{len} {percent:>3}%  {rate}  ETA {eta}";
/// Redraws per second at most.
const REFRESH_HZ: u8 = 4;

/// The bar, or nothing when it is off or there is nothing to count.
pub(crate) struct Progress {
    bar: Option<ProgressBar>,
}

impl Progress {
    pub(crate) fn new(enabled: bool, total: u64) -> Progress {
        if !enabled || total == 0 {
            return Progress { bar: None };
        }
        let bar = ProgressBar::with_draw_target(
            Some(total),
            ProgressDrawTarget::stderr_with_hz(REFRESH_HZ),
        );
        bar.set_style(style());
        Progress { bar: Some(bar) }
    }

    /// `done` records so far (acknowledged, or mapped in a dry run).
    pub(crate) fn update(&mut self, done: u64) {
        if let Some(bar) = &self.bar {
            bar.set_position(done);
        }
    }

    /// Removes the bar before the report is printed.
    pub(crate) fn clear(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
    }
}

fn style() -> ProgressStyle {
    ProgressStyle::with_template(TEMPLATE)
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .with_key(
            "rate",
            |state: &ProgressState, w: &mut dyn std::fmt::Write| {
                let _ = write!(w, "{:.0} records/s", state.per_sec());
            },
        )
        .progress_chars("#-")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_template_parses() {
        assert!(ProgressStyle::with_template(TEMPLATE).is_ok());
    }

    #[test]
    fn off_unless_asked_and_there_is_something_to_count() {
        assert!(Progress::new(false, 10).bar.is_none());
        assert!(Progress::new(true, 0).bar.is_none());
        let mut progress = Progress::new(true, 10);
        progress.update(5);
        assert_eq!(progress.bar.as_ref().map(|b| b.position()), Some(5));
        progress.clear();
        assert!(progress.bar.is_none());
    }
}
