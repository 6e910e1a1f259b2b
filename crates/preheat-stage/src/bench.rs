//! `preheat stage bench`: the paper's staged-bursts experiment on one machine.
//!
//! An open-loop Poisson client (memcached `get key:N`, N uniform below `--keys`) runs against
//! (a) the backend directly and (b) through an in-process [`Stage`], for the same duration and
//! rate; rounds alternate the order. Latency is measured from each request's *intended* send
//! time to its full response (no coordinated omission) into an HdrHistogram; the cpuidle
//! counters are read around each measured window ([`preheat_power::residency`]).
//!
//! Placement: with two or more CPUs and pinning on, a backend we start runs on the last CPU
//! (`taskset`) and the client and proxy threads on CPU 0, so the backend CPU's residency shows
//! what staging does to the server's sleep. A backend we start is stopped on every exit path
//! (and, through `setpriv --pdeathsig`, even if this process dies).

mod backend;
mod client;
mod render;
mod report;
mod window;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};

use crate::framing::Framing;
use crate::proxy::{Stage, StageConfig, StageCounters};
use crate::BenchArgs;
use backend::{resolve, start_cmd, start_kv, BackendProc};
use client::{run_load, LoadOpts, LoadRun};
use report::{mode_report, ModeAcc};
use window::run_idle;

pub use backend::kv_binary;
pub use report::{
    BenchReport, LatencyReport, ModeReport, OverBound, Quantile, RoundSummary, StageSummary,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Direct,
    Staged,
    /// No load at all: what the machine's residency is without us (others included).
    Idle,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Direct => "direct",
            Mode::Staged => "staged",
            Mode::Idle => "idle (no load)",
        }
    }
}

/// Runs the benchmark described by `args` and returns its report (see the module docs).
pub fn bench(args: &BenchArgs) -> Result<BenchReport> {
    if args.protocol != Framing::Memcached {
        bail!("stage bench drives the memcached text protocol only (--protocol memcached)");
    }
    if !(args.rate > 0.0 && args.rate.is_finite()) {
        bail!("--rate must be positive");
    }
    if !(args.duration_s > 0.0 && args.duration_s.is_finite()) {
        bail!("--duration-s must be positive");
    }
    if args.rounds == 0 || args.connections == 0 || args.keys == 0 {
        bail!("--rounds, --connections and --keys must be at least 1");
    }
    args.staging.check()?;
    let stop = Arc::new(AtomicBool::new(false));
    let mut sig_ids = Vec::new();
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        // A second signal while stopping exits at once.
        sig_ids.push(signal_hook::flag::register_conditional_shutdown(
            sig,
            130,
            stop.clone(),
        )?);
        sig_ids.push(signal_hook::flag::register(sig, stop.clone())?);
    }
    let args2 = args.clone();
    let stop2 = stop.clone();
    // A dedicated thread, so pinning never changes the caller's affinity.
    let result = std::thread::Builder::new()
        .name("stage-bench".into())
        .spawn(move || bench_pinned(&args2, &stop2))
        .context("starting the benchmark thread")?
        .join()
        .map_err(|_| anyhow::anyhow!("the benchmark thread panicked"));
    for id in sig_ids {
        signal_hook::low_level::unregister(id);
    }
    let report = result??;
    if stop.load(Ordering::SeqCst) {
        bail!("interrupted");
    }
    Ok(report)
}

fn bench_pinned(args: &BenchArgs, stop: &AtomicBool) -> Result<BenchReport> {
    let cpus = preheat_engine::os::online_cpus();
    let pin = !args.no_pin && cpus >= 2;
    let mut notes = Vec::new();
    // Whether we start the backend (false: an external server, `--backend` alone).
    let we_start = args.backend.is_none() || args.backend_cmd.is_some();
    let backend_cpu = (pin && we_start).then_some(cpus - 1);
    if backend_cpu.is_some() && preheat_engine::host::find_program("taskset").is_none() {
        notes.push("taskset not found: the backend is not pinned".to_string());
    }
    let backend_cpu =
        backend_cpu.filter(|_| preheat_engine::host::find_program("taskset").is_some());
    if pin {
        if let Err(e) = preheat_engine::os::set_affinity(&[0]) {
            notes.push(format!("could not pin the client and proxy to CPU 0: {e}"));
        }
    }
    let (backend_proc, backend, desc) = start_backend(args, backend_cpu, stop)?;
    let bound = Duration::from_millis(args.staging.bound_ms);
    let own_pids: Vec<u32> = backend_proc.iter().map(|p| p.child.id()).collect();
    let machine = args.machine.root();
    let opts = LoadOpts {
        rate: args.rate,
        duration: Duration::from_secs_f64(args.duration_s),
        connections: args.connections,
        keys: args.keys,
        bound,
        settle: Duration::from_millis(args.settle_ms),
        seed: args.seed,
        machine: &machine,
        quiet_gate: args.quiet_gate_pct / 100.0,
        own_pids: &own_pids,
    };
    let mut modes_run = vec![Mode::Direct, Mode::Staged];
    if args.idle_baseline {
        modes_run.push(Mode::Idle);
    }
    let mut accs: Vec<ModeAcc> = modes_run
        .iter()
        .map(|_| ModeAcc {
            runs: Vec::new(),
            stage: Vec::new(),
            stage_seconds: 0.0,
        })
        .collect();
    let runner = Runner {
        args,
        backend,
        stop,
    };
    let mut retried = 0;
    for round in 0..args.rounds {
        // Change the order every round so drift of the machine does not favour one mode.
        let mut order: Vec<usize> = (0..modes_run.len()).collect();
        if modes_run.len() == 2 {
            if round % 2 == 1 {
                order.reverse();
            }
        } else {
            order.rotate_left(round as usize % modes_run.len());
        }
        for i in order {
            if stop.load(Ordering::SeqCst) {
                bail!("interrupted");
            }
            let seeded = LoadOpts {
                seed: args.seed.wrapping_add(round as u64),
                ..opts
            };
            retried += runner.measure(modes_run[i], &seeded, round, &mut accs[i], &mut notes)?;
        }
    }
    let modes: Vec<ModeReport> = modes_run
        .iter()
        .zip(&accs)
        .map(|(m, acc)| mode_report(*m, acc))
        .collect();
    closing_notes(args, &accs, &modes, retried, &mut notes);
    Ok(BenchReport {
        kind: "measured",
        protocol: args.protocol,
        backend: desc,
        placement: placement(pin, backend_cpu, we_start),
        rate_per_s: args.rate,
        duration_s: args.duration_s,
        rounds: args.rounds,
        connections: args.connections,
        period_ms: args.staging.period_ms,
        bound_ms: args.staging.bound_ms,
        margin_ms: args.staging.margin_ms,
        modes,
        notes,
    })
}

/// The backend: a command we start (`--backend-cmd`), an external server (`--backend`) or
/// the bundled preheat-kv; (our process if we started one, its address, a description).
fn start_backend(
    args: &BenchArgs,
    backend_cpu: Option<usize>,
    stop: &AtomicBool,
) -> Result<(Option<BackendProc>, SocketAddr, String)> {
    Ok(match (&args.backend_cmd, &args.backend) {
        (Some(cmd), b) => {
            let (p, a) = start_cmd(cmd, b.as_deref(), backend_cpu, stop)?;
            (Some(p), a, format!("{cmd:?} at {a}"))
        }
        (None, Some(b)) => {
            let a = resolve(b)?;
            (None, a, format!("external server at {a}"))
        }
        (None, None) => {
            let (p, a) = start_kv(backend_cpu, stop)?;
            let desc = format!("bundled preheat-kv at {a} (pid {})", p.child.id());
            (Some(p), a, desc)
        }
    })
}

/// Where the backend and the client run, in words.
fn placement(pin: bool, backend_cpu: Option<usize>, we_start: bool) -> String {
    match (pin, backend_cpu) {
        (true, Some(c)) => format!("backend on CPU {c}, client and proxy on CPU 0"),
        (true, None) if !we_start => {
            "client and proxy on CPU 0; backend placement not controlled".to_string()
        }
        (true, None) => "client and proxy on CPU 0; backend not pinned".to_string(),
        (false, _) => "not pinned".to_string(),
    }
}

/// What every measured window of a run shares: the arguments, the backend, the stop flag.
struct Runner<'a> {
    args: &'a BenchArgs,
    backend: SocketAddr,
    stop: &'a AtomicBool,
}

impl Runner<'_> {
    /// Round `round`'s window of `mode` into `acc`, measured again (at most three attempts)
    /// while other processes use more than `--max-others-pct` of the CPUs (noted when the third
    /// is still noisy); returns how many windows were measured again.
    fn measure(
        &self,
        mode: Mode,
        o: &LoadOpts<'_>,
        round: u32,
        acc: &mut ModeAcc,
        notes: &mut Vec<String>,
    ) -> Result<u32> {
        let max_others = self.args.max_others_pct / 100.0;
        let mut retried = 0;
        for attempt in 1..=3 {
            let (run, counters) = self.window(mode, o)?;
            let others = run.cpu_use.map_or(0.0, |u| u.others_share);
            let noisy = max_others > 0.0 && others > max_others;
            if noisy && attempt < 3 && !self.stop.load(Ordering::SeqCst) {
                retried += 1;
                continue;
            }
            if noisy {
                notes.push(format!(
                    "{} round {round}: other processes used {:.0}% of the CPUs even on the third attempt (kept)",
                    mode.name(),
                    100.0 * others
                ));
            }
            if let Some(c) = counters {
                acc.stage_seconds += run.send_window.as_secs_f64();
                acc.stage.push(c);
            }
            acc.runs.push(run);
            break;
        }
        Ok(retried)
    }

    /// One measured window of `mode` (through a stage of its own for `Staged`): the load's
    /// run and the stage's counters.
    fn window(&self, mode: Mode, o: &LoadOpts<'_>) -> Result<(LoadRun, Option<StageCounters>)> {
        Ok(match mode {
            Mode::Direct => (run_load(self.backend, o, self.stop)?, None),
            Mode::Idle => (run_idle(o, self.stop), None),
            Mode::Staged => {
                let mut cfg = StageConfig::new(
                    SocketAddr::from(([127, 0, 0, 1], 0)),
                    self.backend,
                    self.args.protocol,
                );
                self.args.staging.apply(&mut cfg);
                let stage = Stage::start(cfg)?;
                let run = run_load(stage.local_addr(), o, self.stop);
                let counters = stage.shutdown();
                (run?, Some(counters))
            }
        })
    }
}

/// The notes about the whole run: windows measured again, quiet gates missed, keys missing,
/// what residency covers.
fn closing_notes(
    args: &BenchArgs,
    accs: &[ModeAcc],
    modes: &[ModeReport],
    retried: u32,
    notes: &mut Vec<String>,
) {
    if retried > 0 {
        notes.push(format!(
            "{retried} window(s) were measured again because other processes used more than {}% of the CPUs",
            args.max_others_pct
        ));
    }
    if args.quiet_gate_pct > 0.0 {
        let missed = accs
            .iter()
            .flat_map(|a| &a.runs)
            .filter(|r| !r.gate_met)
            .count();
        if missed > 0 {
            notes.push(format!(
                "{missed} window(s) started without the quiet gate ({}% deep idle on every CPU) met within 60 s",
                args.quiet_gate_pct
            ));
        }
    }
    if modes.iter().any(|m| m.hits == 0 && m.misses > 0) {
        notes.push("every GET missed: the backend holds no key:N items".to_string());
    }
    notes.push(
        "residency covers the whole machine over each measured window (other processes included); the stage counts include warm-up and the final drain".to_string(),
    );
}
