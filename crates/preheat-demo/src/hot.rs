//! The hot floor: every CPU kept out of idle while a request with warm caches is served.
//!
//! Back-to-back "warm" requests are not the fastest a server can answer: between two of them its
//! CPU may already halt, and waking a halted vCPU costs 20–90 µs here. The hot floor keeps the
//! CPUs awake with the mechanism this boot's calibration measured best
//! ([`preheat_wake::calibrate`]): idle polling through a per-CPU PM QoS resume-latency constraint
//! (as the wake planner arms it) or a `/dev/cpu_dma_latency` request, where the cpuidle driver
//! honours them; a `SCHED_IDLE` spinner per CPU ([`preheat_wake::spinners`]) where it does not.
//! Where no mechanism woke threads faster than plain idle, the CPUs are left in plain idle and
//! the floor is the server's threads held polling alone ([`KeepAwake::mechanism`] is `None`;
//! the demo's hold, `crate::measure::HotHold`); where that cannot be had either (a server
//! preheated from outside), there is no hot floor, and the demo says so. Whether the floor is
//! one is checked on the measurements themselves (hot below warm: the demo's table).
//!
//! Every CPU, not only the server's: a request's path can wake threads and take interrupts on
//! other CPUs (MariaDB's commits complete I/O there), and the agent's `wake` strategy, which
//! keeps every CPU polling for its window, measured MariaDB's new-order transactions *below* a
//! floor that held only the server's CPU (p50 2.44 vs 3.10 ms, 101 rounds). A floor must be
//! at least as awake as any strategy. The client's CPU polls too; it busy-polls its socket
//! anyway, so that changes nothing on the request's path. The mechanisms are the wake planner's ([`preheat_wake::keep_awake::Machine`]);
//! nothing else here changes machine state.
//!
//! Nothing is left behind: [`KeepAwake`] restores the CPU when dropped and from the CLI's signal
//! handler; a per-process journal in the run directory records what was changed, and the next
//! `preheat` command restores the journals of processes that died without restoring (SIGKILL;
//! [`restore_stale`]).
//! `/dev/cpu_dma_latency` needs no journal: the kernel drops the request with the process.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use keep_awake::{Journal, Machine, Mechanism, SysPaths};
use preheat_wake::calibrate::Calibration;
use preheat_wake::keep_awake;
use preheat_wake::spinners::Spinners;

/// The machine state of this process's hot floor (one per process; the signal handler's hook
/// restores it).
static MACHINE: Mutex<Option<Machine>> = Mutex::new(None);

const JOURNAL_PREFIX: &str = "hot-floor-";

/// CPUs that can be kept awake on demand.
pub struct KeepAwake {
    cpus: Vec<u32>,
    /// The `spin` mechanism's threads (the others need none).
    spinners: Option<Spinners>,
    /// The calibrated mechanism; `None` where none beat plain idle (the CPUs are left as they
    /// are: the floor is then the server's threads held alone).
    pub mechanism: Option<Mechanism>,
    /// The mechanism and the calibration it comes from (said next to the hot numbers).
    pub note: String,
}

impl KeepAwake {
    /// Prepare to keep every online CPU awake with the calibrated mechanism (changes nothing
    /// yet); where no mechanism measured faster wake-ups than plain idle, one that keeps
    /// nothing awake (`mechanism` `None`). `Err` says why the hot floor cannot be measured
    /// here: the chosen mechanism is unavailable to this process.
    pub fn open(run_dir: &Path, calibration: &Calibration) -> Result<KeepAwake, String> {
        let cpus: Vec<u32> = (0..preheat_engine::os::online_cpus() as u32).collect();
        let Some(best) = calibration.best else {
            return Ok(KeepAwake {
                cpus,
                spinners: None,
                mechanism: None,
                note: format!(
                    "no CPU kept awake: {} (the CPUs left in plain idle)",
                    calibration.summary()
                ),
            });
        };
        // (A killed run's journal was restored when this command started: main calls
        // `restore_stale` for every command.)
        let paths = SysPaths::default();
        std::fs::create_dir_all(run_dir).map_err(|e| format!("{}: {e}", run_dir.display()))?;
        let journal = journal_path(run_dir, std::process::id());
        let m = Machine::open(paths, journal, calibration.choice(), &cpus);
        if let Some(c) = cpus.iter().find(|&&c| m.mechanism(c) != best) {
            return Err(format!(
                "the calibrated mechanism {best} is unavailable on cpu{c} to this process ({})",
                m.notes().join("; ")
            ));
        }
        let spinners = if best == Mechanism::Spin {
            Some(Spinners::start(&cpus).map_err(|e| format!("starting spinners: {e}"))?)
        } else {
            None
        };
        let note = format!("every CPU kept awake by {best} ({})", calibration.summary());
        let mut slot = MACHINE
            .lock()
            .map_err(|_| "the hot floor's state is poisoned".to_string())?;
        if slot.is_some() {
            return Err("the hot floor is already in use in this process".into());
        }
        *slot = Some(m);
        preheat_launch::cleanup::on_signal(restore_now);
        Ok(KeepAwake {
            cpus,
            spinners,
            mechanism: Some(best),
            note,
        })
    }

    /// Keep the CPUs out of idle from now on (until [`KeepAwake::release`]).
    pub fn hold(&self) {
        if let Some(s) = &self.spinners {
            s.hold();
        }
        if let Ok(mut g) = MACHINE.lock() {
            if let Some(m) = g.as_mut() {
                let now = preheat_engine::time::now_ns();
                for &cpu in &self.cpus {
                    m.arm(cpu, now);
                }
            }
        }
    }

    /// Let the CPUs sleep again.
    pub fn release(&self) {
        if let Some(s) = &self.spinners {
            s.release();
        }
        if let Ok(mut g) = MACHINE.lock() {
            if let Some(m) = g.as_mut() {
                for &cpu in &self.cpus {
                    m.disarm(cpu);
                }
            }
        }
    }
}

impl Drop for KeepAwake {
    fn drop(&mut self) {
        restore_now();
    }
}

/// Restore everything the hot floor changed and remove its journal (idempotent).
fn restore_now() {
    // try_lock: the signal hook must not wait for a holder that the signal interrupted.
    let Ok(mut g) = MACHINE.try_lock() else {
        return;
    };
    if let Some(mut m) = g.take() {
        m.disarm_all();
        if m.journal().entries.is_empty() {
            let _ = std::fs::remove_file(m.journal_path());
        }
    }
}

fn journal_path(run_dir: &Path, pid: u32) -> PathBuf {
    run_dir.join(format!("{JOURNAL_PREFIX}{pid}-{}", Journal::FILE))
}

/// Restore the journals of hot floors whose processes are gone (killed before they could
/// restore). Every `preheat` command calls this at start; it reads one directory.
pub fn restore_stale(run_dir: &Path) {
    let paths = SysPaths::default();
    for (path, pid) in preheat_engine::host::left_by_the_dead(run_dir, JOURNAL_PREFIX) {
        match keep_awake::restore_journal(&paths, &path) {
            Ok(outcomes) => {
                for o in outcomes {
                    eprintln!("preheat: hot floor of a killed run (pid {pid}): {o}");
                }
                if Journal::load(&path).is_ok_and(|j| j.entries.is_empty()) {
                    let _ = std::fs::remove_file(&path);
                }
            }
            Err(err) => eprintln!(
                "preheat: could not restore {} (left in place): {err}",
                path.display()
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn journal_names_carry_the_pid() {
        // No process has pid u32::MAX - 1 (pid_max is at most 2^22).
        let dir = tempfile::tempdir().unwrap();
        let p = journal_path(dir.path(), u32::MAX - 1);
        std::fs::write(&p, "{}").unwrap();
        let found = preheat_engine::host::left_by_the_dead(dir.path(), JOURNAL_PREFIX);
        assert_eq!(found, [(p, u32::MAX - 1)]);
    }
}
