//! `preheat cosched`: partial coscheduling (Busse et al., SAC'15) on a stock kernel — the
//! user-space coscheduler (`run`: the mechanism in `preheat-cosched`, the run loop, watchdog
//! and experiments in `preheat-cosched-run`), the paper's experiments at this machine's size
//! (`experiment`), the simulator for larger hosts (`simulate`, in `preheat-cosim`), and
//! `restore` for what a dead controller left behind. Here: the arguments and the printing.

pub mod bench;
pub mod experiment;
pub mod run;
pub mod sim_bench;
pub mod simulate;

use std::path::PathBuf;
use std::sync::atomic::Ordering;

use anyhow::Result;
use preheat_cosched_run::{on_signal, watchdog};

/// A run ended by SIGINT/SIGTERM (threads restored) exits with 128 + the signal, as the
/// signal handler would.
fn exit_if_signalled(r: Result<()>) -> Result<()> {
    let sig = preheat_launch::cleanup::SIGNALLED.load(Ordering::SeqCst);
    if sig != 0 {
        eprintln!("preheat cosched: stopped by signal {sig}; every thread it changed is restored");
        std::process::exit(128 + sig);
    }
    r
}

#[derive(clap::Args)]
pub struct CoschedArgs {
    #[command(subcommand)]
    cmd: CoschedCmd,
}

const RUN_ABOUT: &str = "Coschedule the threads of \"VMs\" (processes whose threads are virtual \
CPUs) from user space on a stock kernel, as the coscheduling kernel of Busse et al. (SAC'15, \
§2.1) does: the host runs in slices (--slice-ms); in each slice the planner chooses sets (least \
attained service first, packed onto the free CPUs), every member of a chosen set runs at \
SCHED_FIFO on its own CPU, and every other managed thread waits at a lower real-time priority \
behind a chosen one. Policies: none (plain Linux, measured only), full (each VM is one set: a \
small VM leaves CPUs idle), partial-static (the configured sets), partial-auto (sets detected at \
run time: the agent's SPCD matrix, reset after start-up, grouped with eq. 1 at threshold t, \
re-evaluated every --regroup-s).\n\n\
Measured and printed: achieved slice lengths, the controller's cost per slice, the co-run \
fraction of every set (from schedstat at slice boundaries, with a lower bound), the leak (run \
time of threads that were not chosen), the CPUs' idle share.\n\n\
Every thread's class, priority and affinity is journaled before it is changed and restored at \
exit, on error, on SIGINT/SIGTERM, by a watchdog process if this command is killed (SIGKILL \
included), and by the next start. Needs CAP_SYS_NICE for real-time scheduling; without it only \
--policy none works.";

#[derive(clap::Subcommand)]
enum CoschedCmd {
    /// Coschedule the VMs of a configuration file and report what was measured.
    #[command(long_about = RUN_ABOUT)]
    Run(run::RunArgs),
    /// The paper's experiments (Figures 6/7) at this machine's size: measured, with the
    /// simulator's prediction for the same configuration beside them.
    Experiment(experiment::ExperimentArgs),
    /// Simulate a host (any size) under each coscheduling policy: deterministic for a seed; every
    /// figure it prints is simulated.
    #[command(long_about = simulate::LONG_ABOUT)]
    Simulate(simulate::SimulateArgs),
    /// Restore threads a dead controller left changed (from its journal); with --watch, wait
    /// for a controller to die first (the watchdog `run` starts).
    Restore {
        /// The journal [default: $PREHEAT_RUN_DIR or /tmp/preheat, file cosched-journal.json].
        #[arg(long)]
        journal: Option<PathBuf>,
        /// Wait until --controller exits, then restore (or exit when the journal is removed).
        #[arg(long, requires = "controller")]
        watch: bool,
        /// The controller's pid (with --watch).
        #[arg(long)]
        controller: Option<u32>,
    },
}

pub fn run(a: CoschedArgs) -> Result<()> {
    match a.cmd {
        CoschedCmd::Run(r) => {
            preheat_launch::cleanup::on_signal(on_signal);
            exit_if_signalled(run::run(&r))
        }
        CoschedCmd::Experiment(e) => {
            preheat_launch::cleanup::on_signal(on_signal);
            exit_if_signalled(experiment::run(&e))
        }
        CoschedCmd::Simulate(s) => simulate::run(&s),
        CoschedCmd::Restore {
            journal,
            watch,
            controller,
        } => {
            let path = watchdog::journal_path(journal.as_deref());
            if watch {
                for o in watchdog::watch(&path, controller.unwrap_or(0))? {
                    eprintln!("preheat cosched watchdog: {o}");
                }
                return Ok(());
            }
            match watchdog::restore(&path)? {
                None => println!(
                    "nothing to restore ({} absent, empty or its controller runs)",
                    path.display()
                ),
                Some(out) => {
                    for o in out {
                        println!("{o}");
                    }
                }
            }
            Ok(())
        }
    }
}
