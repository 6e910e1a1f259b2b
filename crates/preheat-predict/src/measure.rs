//! What `io bench` and `io kernels` share: the dedicated measuring thread, its CPU-time
//! accounting, and the tables' optional numbers.

use anyhow::{anyhow, Context, Result};

/// Runs `body` on a new thread named `name` and returns its result; `who` names the thread in
/// errors ("spawning the {who} thread", "{who} thread panicked").
pub(crate) fn on_own_thread<T: Send + 'static>(
    name: &str,
    who: &str,
    body: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(body)
        .with_context(|| format!("spawning the {who} thread"))?
        .join()
        .map_err(|_| anyhow!("{who} thread panicked"))?
}

/// `acc` plus the thread CPU time between the readings `c0` and `c1` (ns); `None` once any
/// reading failed.
pub(crate) fn add_cpu_ns(acc: Option<u64>, c0: Option<u64>, c1: Option<u64>) -> Option<u64> {
    match (acc, c0, c1) {
        (Some(acc), Some(a), Some(b)) => Some(acc + b.saturating_sub(a)),
        _ => None,
    }
}

/// `v` with `prec` decimals, or "–" when there is none.
pub(crate) fn opt(v: Option<f64>, prec: usize) -> String {
    v.map_or_else(|| "–".into(), |x| format!("{x:.prec$}"))
}
