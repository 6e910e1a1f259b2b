//! The user-space coscheduler's orchestration (partial coscheduling, Busse et al., SAC'15): the
//! mechanism — the controller, the journal, thread references — is `preheat-cosched`; the
//! planner and the simulator are `preheat-cosim`; this crate runs them on this machine.
//! `preheat cosched` parses the arguments and prints.
//!
//! * [`host`] — the "VMs": processes started or attached by pid, their vCPU threads, and the
//!   sets each policy starts with.
//! * [`run`] — one run: start the VMs, coschedule them ([`run::execute`]), stop them.
//! * `auto` — partial-auto: the sets regrouped at run time from the agents' SPCD matrices.
//! * [`guest_floor`] — partial-auto on guests: the guest kernel's own sharing, calibrated on a
//!   guest whose vCPUs share nothing, taken off the matrices before grouping.
//! * [`watchdog`] — the process that restores the threads if the controller dies (an
//!   executable given as [`watchdog::WatchdogCmd`]: the `preheat` binary's `cosched restore
//!   --watch`), the restore it and `restore` do, scratch directories left behind.
//! * [`experiment`] — the paper's experiments (Figures 6/7) at this machine's size, with the
//!   simulator's prediction beside them, on thread-group VMs or real QEMU guests (`experiment_vms`:
//!   the two kinds behind one loop); [`bench`](mod@bench) — the controller's overhead (a thread group, or one real guest).
//!
//! Modules in one direction: `host watchdog guest_floor` ← `auto` ← `run` ← `experiment_vms` ← `experiment` ← `bench`. No
//! `unsafe`: scheduling goes through `preheat-cosched` and `preheat-engine`, processes are
//! started and stopped through `preheat-launch`. Prints nothing: notes go to the caller's
//! closure, progress to a `preheat_launch::progress::Progress`.

mod auto;
pub mod bench;
pub mod experiment;
pub mod experiment_report;
mod experiment_vms;
pub mod guest_floor;
pub mod host;
pub mod run;
pub mod watchdog;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Set by SIGINT/SIGTERM ([`on_signal`]): the controller ends its run and restores the threads.
pub static STOP: AtomicBool = AtomicBool::new(false);
/// Set once the controller has restored everything.
pub static DONE: AtomicBool = AtomicBool::new(true);

/// The signal hook (for `preheat_launch::cleanup::on_signal`): stop the controller and wait
/// (≤ 2 s) until it has restored the threads.
pub fn on_signal() {
    STOP.store(true, Ordering::Relaxed);
    let t0 = Instant::now();
    while !DONE.load(Ordering::Relaxed) && t0.elapsed() < Duration::from_secs(2) {
        std::thread::sleep(Duration::from_millis(5));
    }
}
