//! The one progress bar style of the CLI (hidden when `quiet`, e.g. with `--json`), and the bar
//! behind the libraries' [`Progress`] reports.

use std::sync::Mutex;

use indicatif::{ProgressBar, ProgressStyle};
use preheat_launch::progress::Progress;

/// A bar of `total` steps labelled `what`.
pub fn bar(total: u64, what: &str, quiet: bool) -> ProgressBar {
    if quiet {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new(total);
    pb.set_style(
        ProgressStyle::with_template("{msg:>12} [{bar:30}] {pos}/{len} ({eta})")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    pb.set_message(what.to_string());
    pb
}

/// A library's progress drawn as [`bar`]s: one per piece of work it starts.
pub struct Bars {
    quiet: bool,
    current: Mutex<Option<ProgressBar>>,
}

impl Bars {
    pub fn new(quiet: bool) -> Bars {
        Bars {
            quiet,
            current: Mutex::new(None),
        }
    }

    fn with(&self, f: impl FnOnce(&mut Option<ProgressBar>)) {
        let mut g = self.current.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut g);
    }
}

impl Progress for Bars {
    fn start(&self, total: u64, label: &str) {
        self.with(|c| {
            if let Some(old) = c.take() {
                old.finish_and_clear();
            }
            *c = Some(bar(total, label, self.quiet));
        });
    }

    fn inc(&self, n: u64) {
        self.with(|c| {
            if let Some(b) = c {
                b.inc(n);
            }
        });
    }

    fn finish(&self) {
        self.with(|c| {
            if let Some(b) = c.take() {
                b.finish_and_clear();
            }
        });
    }

    fn label(&self, what: &str) {
        self.with(|c| {
            if let Some(b) = c {
                b.set_message(what.to_string());
            }
        });
    }
}
