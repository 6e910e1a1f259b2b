//! How the agent reports: a line in its log file, and disabling itself with a reason (hooks
//! become pass-through, the host keeps serving, `Status` says why). Never from a hooked path.

use std::os::unix::fs::OpenOptionsExt;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::forkcell::ForkCell;
use crate::{config, socket_paths, sys, track};

/// Why the agent disabled itself.
pub(crate) static DISABLED_REASON: ForkCell<Option<String>> = ForkCell::new(None);

/// Set once the run directory passed `runtime::check_run_dir` (the log is written there only
/// then).
pub(crate) static RUN_DIR_TRUSTED: AtomicBool = AtomicBool::new(false);

/// Append a line to the agent log (control, trigger and start-up paths only; never hooks).
///
/// The file is opened for every line (logging is rare), on whichever thread logs (host
/// threads log at start-up): a long-lived log fd in the host's table could be closed behind
/// the agent's back (`close_range` in a daemonising host) and its number reused for one of the
/// host's files, which the agent would then write into.
pub fn log(msg: &str) {
    let Some(cfg) = config::config() else { return };
    let pid = sys::getpid();
    if cfg.log.is_none() && !RUN_DIR_TRUSTED.load(Ordering::Relaxed) {
        // Never write into a run directory we did not accept (see `check_run_dir`).
        eprintln!("preheat-agent[{pid}]: {msg}");
        return;
    }
    let path = cfg
        .log
        .clone()
        .unwrap_or_else(|| socket_paths(&cfg.run_dir, pid).log);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let line = format!(
        "{}.{:06} preheat-agent[{pid}]: {msg}\n",
        t.as_secs(),
        t.subsec_micros()
    );
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .mode(0o600)
        .open(&path)
    {
        let _ = std::io::Write::write_all(&mut f, line.as_bytes());
    }
}

/// Disable the agent (hooks pass through) and record why.
pub fn disable(reason: String) {
    track::ENABLED.store(false, Ordering::SeqCst);
    log(&format!("agent disabled: {reason}"));
    DISABLED_REASON.with(|r| *r = Some(reason));
}

/// Why the agent disabled itself, if it did (for `Status`).
pub fn disabled_reason() -> Option<String> {
    DISABLED_REASON.with(|r| r.clone())
}

/// Forget why the agent disabled itself (it was enabled again).
pub fn clear_disabled_reason() {
    DISABLED_REASON.with(|r| *r = None);
}

/// Fork child: the child starts without a reason.
///
/// # Safety
/// Only from the `pthread_atfork` child handler (see [`ForkCell::reclaim_in_fork_child`]).
pub unsafe fn reset_after_fork() {
    // SAFETY: the caller is the fork child handler.
    unsafe { DISABLED_REASON.reclaim_in_fork_child(None) };
}

/// The message of a caught panic.
pub fn panic_message(p: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic".to_string()
    }
}
