//! Stopping everything a command started when it is stopped: on SIGINT or SIGTERM, and when a
//! print finds its output closed (the reader went away). The processes, scratch directories and
//! agent-carrying servers come from [`crate::launch`]'s registries; the hooks registered here run
//! first.

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use crate::agentctl;
use crate::launch::{descendants, stop_tree, AGENT_SERVERS, SCRATCH, STARTED};
use crate::paths;

/// Whether the signal handler removes the agent logs of the servers it stops.
static TIDY_AGENT_LOGS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// A command that removes its servers' agent logs when it ends well (the demo, `record`) removes
/// them when a signal stops it too; a long-running one (`serve`, `run`) keeps them as the logs
/// of the server it ran.
pub fn tidy_agent_logs_on_signal() {
    TIDY_AGENT_LOGS.store(true, std::sync::atomic::Ordering::SeqCst);
}

/// Every process of the agent-carrying servers still running (each server's and its
/// descendants'), with its run directory: read before the handler stops them.
fn agent_processes() -> Vec<(u32, PathBuf)> {
    let servers: Vec<(u32, PathBuf)> = AGENT_SERVERS.lock().map(|v| v.clone()).unwrap_or_default();
    let mut out = Vec::new();
    for (pid, rd) in servers {
        out.push((pid, rd.clone()));
        out.extend(descendants(pid).into_iter().map(|p| (p, rd.clone())));
    }
    out
}

/// Functions run first when SIGINT/SIGTERM arrives (before processes are stopped), e.g. to
/// let a controller restore the scheduling of the threads it manages.
static HOOKS: Mutex<Vec<fn()>> = Mutex::new(Vec::new());

/// The signal that arrived (0: none yet).
pub static SIGNALLED: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

/// Run `f` first when SIGINT or SIGTERM arrives (it must return within about a second).
pub fn on_signal(f: fn()) {
    if let Ok(mut v) = HOOKS.lock() {
        v.push(f);
    }
}

/// The name of [`install_cleanup`]'s thread.
const CLEANUP_THREAD: &str = "preheat-cleanup";

/// Stop everything we started when SIGINT or SIGTERM arrives, then exit. Also when a print finds
/// its output closed (`stop_on_closed_output`).
pub fn install_cleanup() {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let Ok(mut signals) = signal_hook::iterator::Signals::new([SIGINT, SIGTERM]) else {
        return;
    };
    let spawned = std::thread::Builder::new()
        .name(CLEANUP_THREAD.into())
        .spawn(move || {
            if let Some(sig) = signals.forever().next() {
                // Not eprintln!: it panics where stderr is a closed pipe (a caller that went away),
                // and this thread must get to the cleanup and the exit whatever stderr is.
                use std::io::Write;
                let _ = writeln!(
                    std::io::stderr(),
                    "\npreheat: signal {sig}: stopping the processes it started"
                );
                SIGNALLED.store(sig, std::sync::atomic::Ordering::SeqCst);
                let hooks: Vec<fn()> = HOOKS.lock().map(|v| v.clone()).unwrap_or_default();
                for h in hooks {
                    // A hook that panics (a print to a closed stderr) must not stop the cleanup.
                    let _ = std::panic::catch_unwind(h);
                }
                let agents = agent_processes();
                let pids: Vec<u32> = STARTED.lock().map(|v| v.clone()).unwrap_or_default();
                for pid in pids {
                    stop_tree(pid, Duration::from_secs(2));
                }
                // The sockets of agents whose process died of the signal (no exit handler ran),
                // as `Server`'s drop removes them; their logs where the command asked.
                let tidy = TIDY_AGENT_LOGS.load(std::sync::atomic::Ordering::SeqCst);
                for (pid, rd) in &agents {
                    if tidy {
                        let _ = std::fs::remove_file(paths::agent_log(rd, *pid));
                    }
                }
                let mut dirs: Vec<&PathBuf> = agents.iter().map(|(_, rd)| rd).collect();
                dirs.sort_unstable();
                dirs.dedup();
                for rd in dirs {
                    agentctl::discover(rd);
                }
                let dirs: Vec<PathBuf> = SCRATCH.lock().map(|v| v.clone()).unwrap_or_default();
                for d in dirs {
                    let _ = std::fs::remove_dir_all(d);
                }
                preheat_engine::netns::remove_own();
                preheat_engine::rxsteer::restore_own();
                std::process::exit(128 + sig);
            }
        });
    if spawned.is_ok() {
        stop_on_closed_output();
    }
}

/// A print to a closed standard output or error (the reader went away: `preheat demo 2>&1 |
/// head`, a pager quit early) panics in std's print macros. Without this the command unwound
/// with a panic nobody reads, exit 101, and kept the agents' logs as after a failure. Instead it
/// stops as on SIGTERM: the panicking thread signals the process and waits, and
/// [`install_cleanup`]'s thread stops what the command started and exits (128 + 15). Every other
/// panic, and one on that thread itself, goes to the previous hook unchanged.
fn stop_on_closed_output() {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let on_cleanup = std::thread::current().name() == Some(CLEANUP_THREAD);
        if !on_cleanup && closed_output(info.payload()) {
            let sig = signal_hook::consts::SIGTERM;
            if preheat_engine::os::send_signal(std::process::id(), sig, false).is_ok() {
                loop {
                    std::thread::park();
                }
            }
        }
        previous(info);
    }));
}

/// Whether a panic's payload is std's print macros failing on a closed pipe
/// ("failed printing to stderr: Broken pipe (os error 32)").
fn closed_output(payload: &(dyn std::any::Any + Send)) -> bool {
    let msg = payload
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| payload.downcast_ref::<&str>().copied())
        .unwrap_or("");
    msg.starts_with("failed printing to std") && msg.contains("os error 32")
}

#[cfg(test)]
mod tests {
    use super::closed_output;

    #[test]
    fn only_a_print_to_a_closed_pipe_is_a_closed_output() {
        let p = |s: &str| -> Box<dyn std::any::Any + Send> { Box::new(s.to_string()) };
        assert!(closed_output(&*p(
            "failed printing to stderr: Broken pipe (os error 32)"
        )));
        assert!(closed_output(&*p(
            "failed printing to stdout: Broken pipe (os error 32)"
        )));
        // Other print failures and other panics are not.
        assert!(!closed_output(&*p(
            "failed printing to stdout: No space left on device (os error 28)"
        )));
        assert!(!closed_output(&*p("index out of bounds")));
        let s: Box<dyn std::any::Any + Send> = Box::new("os error 32");
        assert!(!closed_output(&*s));
        let n: Box<dyn std::any::Any + Send> = Box::new(32u32);
        assert!(!closed_output(&*n));
    }
}
