//! Progress of a long measurement, reported by the libraries and drawn by the CLI: the libraries
//! never draw (the CLI's `progress.rs` implements this with a bar, hidden with `--json`).

/// Where a library reports how far a counted piece of work has got.
pub trait Progress {
    /// A new piece of work of `total` steps, called `label`.
    fn start(&self, total: u64, label: &str);
    /// `n` more steps done.
    fn inc(&self, n: u64);
    /// The piece of work is over (the display, if any, goes away).
    fn finish(&self);
    /// What the current step is doing, in a few words (shown in place of the label; default:
    /// ignored).
    fn label(&self, _what: &str) {}
}

/// Reports nothing: quiet runs and tests.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoProgress;

impl Progress for NoProgress {
    fn start(&self, _total: u64, _label: &str) {}
    fn inc(&self, _n: u64) {}
    fn finish(&self) {}
}
