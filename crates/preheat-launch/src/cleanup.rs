//! Stopping everything a command started when it is stopped by SIGINT or SIGTERM. The processes, scratch directories and
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

/// Stop everything we started when SIGINT or SIGTERM arrives, then exit.
pub fn install_cleanup() {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let Ok(mut signals) = signal_hook::iterator::Signals::new([SIGINT, SIGTERM]) else {
        return;
    };
    std::thread::spawn(move || {
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
                h();
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
}
