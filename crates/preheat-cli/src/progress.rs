//! The one progress bar style of the CLI (hidden when `quiet`, e.g. with `--json`).

use indicatif::{ProgressBar, ProgressStyle};

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
