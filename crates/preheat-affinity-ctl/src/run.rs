//! `preheat affinity run`: one run of one cell, measured.
//!
//! * Section 2 (`--interleave BV_X [--concurrent BV_Y]`): the main workload and the vector share
//!   the main CPU and alternate every quantum (see `control`); a concurrent vector runs on
//!   another CPU for the whole run.
//! * Section 3 (`--experiment table3`): main copies and interfering workloads on all CPUs; high
//!   affinity pins each copy to its CPU, low affinity moves every copy to the next CPU every
//!   quantum.
//! * Alone (no vector): the main workload by itself on the main CPU, the benchmark baseline.

use std::path::PathBuf;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use preheat_affinity::{Plan, VectorKind, VectorSpec};
use preheat_engine::perf::{Counters, Event};
use preheat_engine::sched::{self, ThreadSched};
use preheat_engine::workloads::Kind;
use serde::Serialize;

use super::control::{self, FifoVector, Mechanism, Side, Stoppable};
use super::proc::{self as aproc, Worker, WorkerCmd};
use super::programs::{self, Job};
use super::worker::Outcome;
use preheat_launch::launch::Program;

/// What the main workload is.
#[derive(Debug, Clone)]
pub enum MainSpec {
    Bundled(Kind),
    Preset(String),
    Argv(Vec<String>),
}

impl MainSpec {
    pub fn parse(workload: Option<&str>, argv: &[String]) -> Result<MainSpec> {
        match (workload, argv.is_empty()) {
            (Some(_), false) => bail!("give either --workload or a program after `--`, not both"),
            (None, true) => bail!("give --workload (chase, stream, branchy, gzip, xz, sqlite3, cc) or a program after `--`"),
            (None, false) => Ok(MainSpec::Argv(argv.to_vec())),
            (Some(w), true) => Ok(match Kind::parse(w) {
                Some(k) => MainSpec::Bundled(k),
                None => MainSpec::Preset(programs::known(w)?.name.to_string()),
            }),
        }
    }

    pub fn name(&self) -> String {
        match self {
            MainSpec::Bundled(k) => k.name().into(),
            MainSpec::Preset(p) => p.clone(),
            MainSpec::Argv(a) => a.join(" "),
        }
    }

    pub(super) fn kind_and_standin(&self) -> (&'static str, String) {
        match self {
            MainSpec::Bundled(k) => ("bundled", k.stands_for().into()),
            MainSpec::Preset(p) => (
                "program",
                programs::preset(p).map_or(String::new(), |p| p.stands_for.into()),
            ),
            MainSpec::Argv(_) => ("program", String::new()),
        }
    }
}

/// Which experiment a run belongs to.
#[derive(Debug, Clone)]
pub enum Experiment {
    Alone,
    Table2 {
        interleaved: String,
        concurrent: Option<String>,
    },
    Table3 {
        interfering: MainSpec,
        high: bool,
    },
}

/// Everything one run needs.
#[derive(Debug, Clone)]
pub struct RunSpec {
    pub experiment: Experiment,
    pub main: MainSpec,
    pub quantum_ms: f64,
    pub cpu: u32,
    pub cpu_ms: u64,
    pub preheat: bool,
    /// Working set of a bundled workload (default: chase L2 size, stream 2× LLC, branchy 16×
    /// L1i).
    pub ws_bytes: Option<usize>,
    /// Where program inputs are generated.
    pub scratch: PathBuf,
    /// Run the interleaved vector as a thread of a bundled workload's process instead of a
    /// process of its own (no address-space switch between the two).
    pub vector_in_process: bool,
    /// How to start the worker processes (vectors and bundled workloads).
    pub worker: WorkerCmd,
}

#[derive(Debug, Clone, Serialize)]
pub struct Quanta {
    pub n: usize,
    pub p50_ms: f64,
    pub p99_ms: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Late {
    pub n: usize,
    pub p50_us: f64,
    pub p99_us: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct QuantaReport {
    pub requested_ms: f64,
    pub mechanism: &'static str,
    pub main: Option<Quanta>,
    pub vector: Option<Quanta>,
    /// How late the controller issued its switches (measured by itself).
    pub controller_late_us: Option<Late>,
}

#[derive(Debug, Clone, Serialize)]
pub struct RefillBin {
    pub from_us: u64,
    pub to_us: Option<u64>,
    pub rate_rel: f64,
    pub units: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Copy {
    pub rate: f64,
    pub cpu_s: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct CellView {
    pub interleaved: Option<String>,
    pub concurrent: Option<String>,
    pub concurrent_cpu: Option<u32>,
    pub quantum_ms: f64,
    pub affinity: Option<String>,
    pub retention: Option<String>,
    pub interfering: Option<String>,
    pub preheat: bool,
}

/// The JSON of one run (docs/affinity-json.md).
#[derive(Debug, Clone, Serialize)]
pub struct RunResult {
    pub kind: &'static str,
    pub experiment: &'static str,
    pub workload: String,
    pub workload_kind: &'static str,
    pub stands_for: String,
    pub cell: CellView,
    pub metric: String,
    pub rate: f64,
    pub work: f64,
    pub cpu_s: f64,
    pub wall_s: f64,
    pub preheat_cpu_s: f64,
    pub preheats: u64,
    pub rate_with_preheat_cost: Option<f64>,
    pub quanta: QuantaReport,
    pub refill: Vec<RefillBin>,
    pub copies: Vec<Copy>,
    /// Hardware counters of the main workload where a PMU exists (null otherwise).
    pub pmu: Option<Pmu>,
    pub notes: Vec<String>,
}

/// IPC and misses per instruction of the main workload (perf_event, user space), measured.
#[derive(Debug, Clone, Serialize)]
pub struct Pmu {
    pub cycles: Option<u64>,
    pub instructions: Option<u64>,
    pub ipc: Option<f64>,
    pub l1d_mpi: Option<f64>,
    pub l1i_mpi: Option<f64>,
    pub llc_mpi: Option<f64>,
}

const PMU_EVENTS: [Event; 5] = [
    Event::Cycles,
    Event::Instructions,
    Event::L1dMisses,
    Event::L1iMisses,
    Event::LlcMisses,
];

/// Start counting the main workload's events, if this machine has a PMU.
pub(super) fn pmu_open(pid: u32, inherit: bool, notes: &mut Vec<String>) -> Option<Counters> {
    if !preheat_engine::perf::hw_available() {
        return None;
    }
    match Counters::open(pid, &PMU_EVENTS, inherit) {
        Ok(c) => Some(c),
        Err(e) => {
            notes.push(format!("PMU present but counters could not be opened: {e}"));
            None
        }
    }
}

/// IPC and MPI from the counters.
pub(super) fn pmu_read(c: &Counters) -> Pmu {
    let v = c.read();
    let get = |ev: Event| v.iter().find(|x| x.0 == ev).and_then(|x| x.1);
    let ins = get(Event::Instructions).filter(|&i| i > 0);
    let per = |ev: Event| Some(get(ev)? as f64 / ins? as f64);
    Pmu {
        cycles: get(Event::Cycles),
        instructions: ins,
        ipc: get(Event::Cycles)
            .filter(|&c| c > 0)
            .and_then(|c| Some(ins? as f64 / c as f64)),
        l1d_mpi: per(Event::L1dMisses),
        l1i_mpi: per(Event::L1iMisses),
        llc_mpi: per(Event::LlcMisses),
    }
}

fn quanta(v: &[f64]) -> Option<Quanta> {
    if v.is_empty() {
        return None;
    }
    let s = preheat_model::stats::summarize(v);
    Some(Quanta {
        n: s.n,
        p50_ms: s.p50,
        p99_ms: s.p99,
    })
}

/// The refill profile: rate per bin relative to the rate later than 10 ms into a quantum (or,
/// when quanta are shorter, in the last bin with work).
fn refill(o: &Outcome) -> Vec<RefillBin> {
    let rate = |u: u64, ns: u64| if ns == 0 { 0.0 } else { u as f64 / ns as f64 };
    let (lu, lns) = o
        .bins
        .iter()
        .filter(|b| b.from_us >= 10_000)
        .fold((0, 0), |a, b| (a.0 + b.units, a.1 + b.ns));
    let reference = if lns > 0 {
        rate(lu, lns)
    } else {
        o.bins.last().map_or(0.0, |b| rate(b.units, b.ns))
    };
    if reference <= 0.0 {
        return Vec::new();
    }
    o.bins
        .iter()
        .map(|b| RefillBin {
            from_us: b.from_us,
            to_us: b.to_us,
            rate_rel: rate(b.units, b.ns) / reference,
            units: b.units,
        })
        .collect()
}

fn vector_kind(v: &VectorSpec) -> &'static str {
    match v.kind {
        VectorKind::Zero => "zero",
        VectorKind::Data => "data",
        VectorKind::Code => "code",
    }
}

/// The pause that ends a run in a worker: half the quantum (at least the interruption floor).
fn gap_us(quantum_ms: f64) -> String {
    ((quantum_ms * 500.0) as u64).max(150).to_string()
}

fn vector_args(v: &VectorSpec, quantum_ms: f64) -> Vec<String> {
    let kind = vector_kind(v);
    vec![
        "vector".into(),
        "--kind".into(),
        kind.into(),
        "--bytes".into(),
        v.bytes.to_string(),
        "--gap-us".into(),
        gap_us(quantum_ms),
    ]
}

/// The default working set of a bundled workload on this plan's machine.
pub fn default_ws(plan: &Plan, k: Kind) -> usize {
    let size = |name: &str| {
        plan.caches
            .iter()
            .find(|c| c.name == name)
            .map(|c| c.bytes as usize)
    };
    let llc = plan.caches.last().map_or(8 << 20, |c| c.bytes as usize);
    match k {
        Kind::Chase => size("L2").unwrap_or(llc / 4).max(64 << 10),
        Kind::Stream => 2 * llc,
        Kind::Branchy => 16 * size("L1i").unwrap_or(32 << 10),
    }
}

pub(super) fn workload_args(
    plan: &Plan,
    k: Kind,
    spec: &RunSpec,
    cpu_ms: u64,
    preheat: bool,
) -> Vec<String> {
    let mut a = vec![
        "workload".into(),
        "--kind".into(),
        k.name().into(),
        "--bytes".into(),
        spec.ws_bytes
            .unwrap_or_else(|| default_ws(plan, k))
            .to_string(),
        "--cpu-ms".into(),
        cpu_ms.to_string(),
        "--gap-us".into(),
        gap_us(spec.quantum_ms),
    ];
    if preheat {
        // Each preheat is bounded: an eighth of the quantum, at most 2 ms (a working set larger
        // than what the quantum can use, e.g. stream's, is loaded only as far as that).
        let budget_us = (spec.quantum_ms * 1000.0 / 8.0).clamp(50.0, 2000.0) as u64;
        a.extend([
            "--preheat".into(),
            "--preheat-budget-us".into(),
            budget_us.to_string(),
        ]);
    }
    a
}

fn vector<'p>(plan: &'p Plan, name: &str) -> Result<&'p VectorSpec> {
    plan.vectors
        .iter()
        .find(|v| v.name == name)
        .with_context(|| {
            format!(
                "no base vector {name} on this machine (there are {})",
                plan.vectors
                    .iter()
                    .map(|v| v.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })
}

fn set(tid: u32, s: ThreadSched) -> Result<()> {
    sched::set_thread_sched(tid, s).with_context(|| format!("setting thread {tid} to {}", s.name()))
}

/// A started program and the thread that reaps it.
pub(super) struct Reaping {
    pub prog: Program,
    pub rx: mpsc::Receiver<std::io::Result<preheat_engine::os::Reaped>>,
}

/// Start a job pinned to `cpus`, at `SCHED_FIFO` `fifo` if given, and a thread that reaps it.
pub(super) fn start_program(job: &Job, cpus: &[usize], fifo: Option<i32>) -> Result<Reaping> {
    let mut cmd = job.command(fifo)?;
    let prog = aproc::spawn(&mut cmd, cpus).with_context(|| format!("starting {}", job.argv[0]))?;
    let pid = prog.pid();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(preheat_engine::os::wait_reap(pid));
    });
    Ok(Reaping { prog, rx })
}

pub(super) fn job_for(main: &MainSpec, spec: &RunSpec, tag: &str) -> Result<Job> {
    match main {
        MainSpec::Preset(p) => programs::prepare(p, &spec.scratch.join(format!("{p}-{tag}"))),
        MainSpec::Argv(a) => Ok(Job {
            argv: a.clone(),
            stdin: None,
            dir: std::env::current_dir()?,
        }),
        MainSpec::Bundled(_) => unreachable!("bundled workloads run as workers"),
    }
}

pub(super) fn reaped_cpu(
    r: std::io::Result<preheat_engine::os::Reaped>,
    what: &str,
) -> Result<f64> {
    let r = r.with_context(|| format!("waiting for {what}"))?;
    if r.code != Some(0) {
        bail!(
            "{what} failed ({}): its measurement is void",
            match (r.code, r.signal) {
                (Some(c), _) => format!("exit code {c}"),
                (_, Some(s)) => format!("killed by signal {s}"),
                _ => "unknown status".into(),
            }
        );
    }
    Ok(r.cpu_ns as f64 / 1e9)
}

/// Run one cell.
pub fn execute(plan: &Plan, spec: &RunSpec) -> Result<RunResult> {
    if !(1.0..=10_000.0).contains(&spec.quantum_ms) {
        bail!(
            "--quantum-ms {} is outside 1..10000: below 1 ms the controller's switch (tens of µs \
             here) is no longer small against the quantum",
            spec.quantum_ms
        );
    }
    if plan.cpus.iter().all(|&c| c != spec.cpu) {
        bail!(
            "CPU {} does not exist here (CPUs {:?})",
            spec.cpu,
            plan.cpus
        );
    }
    match &spec.experiment {
        Experiment::Table3 { .. } => super::moves::execute(plan, spec),
        _ => interleaved(plan, spec),
    }
}

fn interleaved(plan: &Plan, spec: &RunSpec) -> Result<RunResult> {
    let (mech, fallback) = Mechanism::best();
    let mut notes: Vec<String> = fallback.into_iter().collect();
    if spec.preheat && mech != Mechanism::FifoSwap {
        bail!("--preheat needs real-time scheduling (the warm thread must run before the workload resumes)");
    }
    let fifo = mech == Mechanism::FifoSwap;
    let main_cpu = spec.cpu as usize;
    let in_process = spec.vector_in_process;
    if in_process && (!fifo || !matches!(spec.main, MainSpec::Bundled(_))) {
        bail!(
            "a vector in the workload's process needs a bundled workload and real-time scheduling"
        );
    }
    let (interleaved, concurrent) = match &spec.experiment {
        Experiment::Table2 {
            interleaved,
            concurrent,
        } => (Some(vector(plan, interleaved)?), concurrent.as_deref()),
        _ => (None, None),
    };
    // A concurrent vector runs on a CPU that shares the retention level with the main CPU.
    let conc_cpu = match concurrent {
        Some(_) => Some(
            plan.table2
                .concurrent_cpu
                .filter(|&c| c != spec.cpu)
                .or_else(|| plan.cpus.iter().copied().find(|&c| c != spec.cpu))
                .context("a concurrent vector needs a second CPU")?,
        ),
        None => None,
    };
    let conc = match concurrent {
        Some(name) => {
            let v = vector(plan, name)?;
            Some(Worker::start(
                &spec.worker,
                &format!("concurrent {name}"),
                &vector_args(v, spec.quantum_ms),
                &[conc_cpu.unwrap_or(0) as usize],
            )?)
        }
        None => None,
    };
    let vec_worker = match interleaved {
        Some(v) if !in_process => {
            let w = Worker::start(
                &spec.worker,
                &format!("vector {}", v.name),
                &vector_args(v, spec.quantum_ms),
                &[main_cpu],
            )?;
            // Held (stopped) until the main workload runs: a spinning real-time vector would
            // starve the main workload's start-up in the normal class on the same CPU.
            Stoppable(w.ready.pid).hold()?;
            if fifo {
                set(
                    w.ready.main_tid,
                    ThreadSched::fifo(control::PRIO_VECTOR_WAIT),
                )?;
            }
            Some(w)
        }
        _ => None,
    };
    let mut main_worker = match &spec.main {
        MainSpec::Bundled(k) => {
            let mut args = workload_args(plan, *k, spec, spec.cpu_ms, spec.preheat);
            if let (true, Some(v)) = (in_process, interleaved) {
                args.extend([
                    "--vector-kind".into(),
                    vector_kind(v).into(),
                    "--vector-bytes".into(),
                    v.bytes.to_string(),
                ]);
            }
            let w = Worker::start(
                &spec.worker,
                &format!("workload {}", k.name()),
                &args,
                &[main_cpu],
            )?;
            if fifo {
                set(w.ready.main_tid, ThreadSched::fifo(control::PRIO_MAIN))?;
                if let Some(t) = w.ready.warm_tid {
                    set(t, ThreadSched::fifo(control::PRIO_WARM))?;
                }
            }
            if let Some(t) = w.ready.vector_tid {
                set(t, ThreadSched::fifo(control::PRIO_VECTOR_WAIT))?;
            }
            Some(w)
        }
        _ => None,
    };
    let job = match &spec.main {
        MainSpec::Bundled(_) => None,
        m => Some(job_for(m, spec, "main")?),
    };
    let ctl_cpu = conc_cpu
        .or_else(|| plan.cpus.iter().copied().find(|&c| c != spec.cpu))
        .unwrap_or(spec.cpu) as usize;
    let saved = control::become_controller(ctl_cpu, fifo)?;
    // What the hypervisor took from each vCPU during the run (evidence for a void run).
    let steal0 = preheat_engine::os::steal_ms_per_cpu();
    let t0 = Instant::now();
    let mut counters = None;
    let result = (|| -> Result<(Option<Outcome>, Option<f64>, control::ControllerStats)> {
        let mut program = None;
        if let Some(w) = &main_worker {
            counters = pmu_open(w.ready.main_tid, false, &mut notes);
        }
        match (&mut main_worker, &job) {
            (Some(w), _) => w.send(b"g\n")?,
            (None, Some(j)) => {
                let sc = fifo.then_some(control::PRIO_MAIN);
                let p = start_program(j, &[main_cpu], sc)?;
                counters = pmu_open(p.prog.pid(), true, &mut notes);
                if fifo {
                    // The program enters its class through `setpriv` and `chrt` execs: until it
                    // has, it is in the normal class and a running vector would starve it.
                    let pid = p.prog.pid();
                    let t0 = Instant::now();
                    while !sched::thread_sched(pid).is_ok_and(|s| s.is_realtime())
                        && t0.elapsed() < Duration::from_secs(5)
                    {
                        std::thread::sleep(Duration::from_micros(200));
                    }
                }
                program = Some(p);
            }
            _ => unreachable!(),
        }
        // The main workload runs: under priority swapping the vector may now wait behind it.
        if let (true, Some(vw)) = (fifo, &vec_worker) {
            Stoppable(vw.ready.pid).run()?;
        }
        let mut outcome = None;
        let mut prog_cpu = None;
        // A run that makes no progress (e.g. a workload starved by something else at a real-time
        // priority) ends with an error instead of hanging the experiment.
        let limit = Duration::from_secs(30) + Duration::from_millis(20 * spec.cpu_ms);
        let limit = if main_worker.is_some() {
            limit
        } else {
            Duration::from_secs(600)
        };
        let started = Instant::now();
        let mut done = || -> Result<bool> {
            if started.elapsed() > limit {
                bail!(
                    "the main workload did not finish within {limit:?}: stopped (its measurement \
                     is void)"
                );
            }
            if let Some(w) = &main_worker {
                if outcome.is_none() {
                    outcome = w.try_outcome()?;
                }
                return Ok(outcome.is_some());
            }
            if let Some(p) = &program {
                match p.rx.try_recv() {
                    Ok(r) => {
                        prog_cpu = Some(reaped_cpu(r, &spec.main.name())?);
                        return Ok(true);
                    }
                    Err(mpsc::TryRecvError::Empty) => return Ok(false),
                    Err(mpsc::TryRecvError::Disconnected) => bail!("lost the program's reaper"),
                }
            }
            Ok(true)
        };
        let q = Duration::from_secs_f64(spec.quantum_ms / 1e3);
        let vec_ids = match (&vec_worker, &main_worker) {
            (Some(vw), _) => Some((vw.ready.main_tid, vw.ready.pid)),
            (None, Some(mw)) => mw.ready.vector_tid.map(|t| (t, 0)),
            _ => None,
        };
        let stats = match vec_ids {
            Some((vtid, vpid)) => {
                let mut fv = FifoVector(vtid);
                let mut sv = Stoppable(vpid);
                let main_group = main_worker
                    .as_ref()
                    .map(|w| w.ready.pid)
                    .or(program.as_ref().map(|p| p.prog.pid()))
                    .unwrap_or(0);
                let mut sm = Stoppable(main_group);
                let warm = spec.preheat;
                let main_ref = &main_worker;
                let (vside, mside): (&mut dyn Side, Option<&mut dyn Side>) = if fifo {
                    (&mut fv, None)
                } else {
                    (&mut sv, Some(&mut sm))
                };
                control::interleave(
                    q,
                    vside,
                    mside,
                    || {
                        if warm {
                            // The warm thread (FIFO 4) wakes and loads before the workload resumes.
                            if let Some(w) = main_ref {
                                // A write to a worker that just finished fails; not an error.
                                let _ = w.send(b"p\n");
                            }
                        }
                        Ok(())
                    },
                    &mut done,
                )?
            }
            None => {
                while !done()? {
                    std::thread::sleep(Duration::from_millis(2));
                }
                control::ControllerStats::default()
            }
        };
        if let Some(p) = program {
            drop(p.prog);
        }
        Ok((outcome, prog_cpu, stats))
    })();
    control::restore_self(&saved);
    let wall_s = t0.elapsed().as_secs_f64();
    let vec_out = vec_worker.map(|w| w.stop()).transpose();
    let conc_out = conc.map(|w| w.stop()).transpose();
    let (outcome, prog_cpu, stats) = result?;
    let vec_out = vec_out?;
    conc_out?;
    let (workload_kind, stands_for) = spec.main.kind_and_standin();
    let (rate, work, cpu_s, metric, main_runs, refill_bins, pre_cpu, pre_n) = match &outcome {
        Some(o) => {
            let cpu = o.cpu_ns as f64 / 1e9;
            (
                o.work as f64 / cpu,
                o.work as f64,
                cpu,
                format!("work per CPU-second ({})", o.unit),
                quanta(&o.runs_ms),
                refill(o),
                o.preheat_cpu_ns as f64 / 1e9,
                o.preheats,
            )
        }
        None => {
            let cpu = prog_cpu.context("the program's CPU time")?;
            // The program's quanta are the vector's gaps (its first gap is the wait, stopped,
            // while the program started; the last one ends when the program does).
            let gaps: Vec<f64> = vec_out
                .as_ref()
                .map(|v| {
                    let g = &v.gaps_ms;
                    g.get(1..g.len().saturating_sub(1)).unwrap_or(&[]).to_vec()
                })
                .unwrap_or_default();
            (
                1.0 / cpu,
                1.0,
                cpu,
                "jobs per CPU-second".to_string(),
                quanta(&gaps),
                Vec::new(),
                0.0,
                0,
            )
        }
    };
    // A workload that ran several quanta of CPU without one complete quantum between the
    // vector's was not interleaved (the two did not alternate on one CPU): the run measured
    // something else, so it fails, saying what each piece saw.
    if interleaved.is_some() && main_runs.is_none() && cpu_s * 1e3 > 3.0 * spec.quantum_ms {
        let (vpauses, vcpu_ms) = vec_out
            .as_ref()
            .map_or((0, 0.0), |v| (v.gaps_ms.len(), v.cpu_ns as f64 / 1e6));
        let steal = match (steal0, preheat_engine::os::steal_ms_per_cpu()) {
            (Some(a), Some(b)) => {
                let d = |c: usize| {
                    b.get(c)
                        .zip(a.get(c))
                        .map_or(0, |(y, x)| y.saturating_sub(*x))
                };
                format!(
                    "; the hypervisor withheld {} ms from the controller's CPU {ctl_cpu} and {} ms \
                     from the workload's CPU {main_cpu} (steal)",
                    d(ctl_cpu),
                    d(main_cpu)
                )
            }
            _ => String::new(),
        };
        bail!(
            "not interleaved: the main workload ran {:.0} ms of CPU in {:.0} ms without a complete \
             quantum (vector process: {vpauses} pause(s), {vcpu_ms:.0} ms CPU; {} controller \
             switches{steal}): the measurement is void",
            cpu_s * 1e3,
            wall_s * 1e3,
            stats.switches
        );
    }
    if let Some(m) = &main_runs {
        if interleaved.is_some() && m.p50_ms > 1.5 * spec.quantum_ms {
            notes.push(format!(
                "the main workload ran {:.2} ms per quantum (p50) for {} ms requested: something \
                 else held the vector off",
                m.p50_ms, spec.quantum_ms
            ));
        }
    }
    let cell = plan.table2.cells.iter().find(|c| {
        Some(c.interleaved.as_str()) == interleaved.map(|v| v.name.as_str())
            && c.concurrent.as_deref() == concurrent
    });
    Ok(RunResult {
        kind: "measured",
        experiment: if interleaved.is_some() {
            "table2"
        } else {
            "alone"
        },
        workload: spec.main.name(),
        workload_kind,
        stands_for,
        cell: CellView {
            interleaved: interleaved.map(|v| v.name.clone()),
            concurrent: concurrent.map(str::to_string),
            concurrent_cpu: conc_cpu,
            quantum_ms: spec.quantum_ms,
            affinity: cell.map(|c| c.affinity.as_str().to_string()),
            retention: cell.map(|c| c.retention.as_str().to_string()),
            interfering: None,
            preheat: spec.preheat,
        },
        metric,
        rate,
        work,
        cpu_s,
        wall_s,
        preheat_cpu_s: pre_cpu,
        preheats: pre_n,
        rate_with_preheat_cost: spec.preheat.then(|| work / (cpu_s + pre_cpu)),
        quanta: QuantaReport {
            requested_ms: spec.quantum_ms,
            mechanism: if interleaved.is_some() {
                mech.name()
            } else {
                "none"
            },
            main: main_runs.filter(|_| interleaved.is_some()),
            vector: vec_out
                .as_ref()
                .map(|v| &v.runs_ms)
                .or(outcome.as_ref().map(|o| &o.vector_runs_ms))
                .and_then(|r| quanta(r)),
            controller_late_us: quanta(&stats.late_us).map(|q| Late {
                n: q.n,
                p50_us: q.p50_ms,
                p99_us: q.p99_ms,
            }),
        },
        refill: if interleaved.is_some() {
            refill_bins
        } else {
            Vec::new()
        },
        copies: Vec::new(),
        pmu: counters.as_ref().map(pmu_read),
        notes,
    })
}

/// A refill bin's label, for the human output.
pub fn bin_label(from: u64, to: Option<u64>) -> String {
    match to {
        Some(t) => format!("{from}–{t} µs"),
        None => format!("≥ {from} µs"),
    }
}
