//! One measured window: the quiet gate before it, and the machine's counters around it (CPU
//! use, the backend's wakeups, cpuidle residency).

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use preheat_power::residency::{MachineRoot, Snapshot};

use super::client::{Answers, LoadOpts, LoadRun};
use crate::cpu_use;

/// Waits until every CPU's deep-idle share over a 0.5 s probe reaches the gate (at most 60 s);
/// returns whether it did.
pub(super) fn quiet_gate(o: &LoadOpts<'_>, stop: &AtomicBool) -> bool {
    if o.quiet_gate <= 0.0 {
        return true;
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline && !stop.load(Ordering::SeqCst) {
        let Ok(a) = Snapshot::read(o.machine) else {
            return false;
        };
        std::thread::sleep(Duration::from_millis(500));
        let Ok(Ok(r)) = Snapshot::read(o.machine).map(|b| a.diff(&b)) else {
            return false;
        };
        // CPUs without idle counters never sleep in the counters' eyes: not gated on (without a
        // cpuidle driver the counters are /proc/stat's undivided idle time, one state per CPU).
        let r = r.report();
        let mut sleeping = r.per_cpu.iter().filter(|c| !c.states.is_empty()).peekable();
        if sleeping.peek().is_some() && sleeping.all(|c| c.deep_idle_share.value >= o.quiet_gate) {
            return true;
        }
    }
    false
}

/// The idle baseline: no load, residency over the same duration.
pub(super) fn run_idle(o: &LoadOpts<'_>, stop: &AtomicBool) -> LoadRun {
    std::thread::sleep(o.settle);
    let gate_met = quiet_gate(o, stop);
    let window = WindowStart::read(o);
    let start = Instant::now();
    while !stop.load(Ordering::SeqCst) && start.elapsed() < o.duration {
        std::thread::sleep(
            o.duration
                .saturating_sub(start.elapsed())
                .min(Duration::from_millis(250)),
        );
    }
    window.finish(o, start.elapsed(), gate_met)
}

/// The machine's counters at the start of a measured window: CPU use, the wakeups of the
/// backend we started, cpuidle residency.
pub(super) struct WindowStart {
    cpu_use: Option<cpu_use::CpuUseMark>,
    backend_wakeups: Option<u64>,
    residency: Result<Snapshot, String>,
}

impl WindowStart {
    pub(super) fn read(o: &LoadOpts<'_>) -> WindowStart {
        WindowStart {
            cpu_use: cpu_use::cpu_use_mark(o.own_pids),
            backend_wakeups: backend_wakeups(o.own_pids),
            residency: snapshot(o.machine),
        }
    }

    /// Reads the counters again (the window ends now): the window as a run with no requests
    /// counted yet.
    pub(super) fn finish(self, o: &LoadOpts<'_>, send_window: Duration, gate_met: bool) -> LoadRun {
        let after = snapshot(o.machine);
        let backend_wakeups = self
            .backend_wakeups
            .zip(backend_wakeups(o.own_pids))
            .map(|(a, b)| b.saturating_sub(a));
        let cpu_use = self
            .cpu_use
            .zip(cpu_use::cpu_use_mark(o.own_pids))
            .map(|(a, b)| cpu_use::cpu_use(&a, &b));
        LoadRun {
            sent: 0,
            answers: Answers::new(),
            unanswered: 0,
            send_errors: 0,
            send_lag_sum_us: 0,
            send_lag_max_us: 0,
            send_window,
            residency: match (self.residency, after) {
                (Ok(b), Ok(a)) => b.diff(&a).map_err(|e| e.to_string()),
                (Err(e), _) | (_, Err(e)) => Err(e),
            },
            gate_met,
            cpu_use,
            backend_wakeups,
        }
    }
}

/// The machine's cpuidle counters now; an error says why residency is unavailable.
fn snapshot(machine: &MachineRoot) -> Result<Snapshot, String> {
    Snapshot::read(machine).map_err(|e| e.to_string())
}

fn backend_wakeups(pids: &[u32]) -> Option<u64> {
    pids.first().and_then(|&p| cpu_use::process_wakeups(p))
}
