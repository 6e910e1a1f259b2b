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

use anyhow::{bail, Context, Result};
use preheat_affinity::{Plan, VectorKind, VectorSpec};
use preheat_engine::perf::{Counters, Event};
use preheat_engine::sched::{self, ThreadSched};
use preheat_engine::workloads::Kind;
use serde::Serialize;

use super::proc::{self as aproc, WorkerCmd};
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

    pub(crate) fn kind_and_standin(&self) -> (&'static str, String) {
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
pub(crate) fn pmu_open(pid: u32, inherit: bool, notes: &mut Vec<String>) -> Option<Counters> {
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
pub(crate) fn pmu_read(c: &Counters) -> Pmu {
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

pub(crate) fn quanta(v: &[f64]) -> Option<Quanta> {
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
pub(crate) fn refill(o: &Outcome) -> Vec<RefillBin> {
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

pub(crate) fn vector_kind(v: &VectorSpec) -> &'static str {
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

pub(crate) fn vector_args(v: &VectorSpec, quantum_ms: f64) -> Vec<String> {
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

pub(crate) fn workload_args(
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

pub(crate) fn vector<'p>(plan: &'p Plan, name: &str) -> Result<&'p VectorSpec> {
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

pub(crate) fn set(tid: u32, s: ThreadSched) -> Result<()> {
    sched::set_thread_sched(tid, s).with_context(|| format!("setting thread {tid} to {}", s.name()))
}

/// A started program and the thread that reaps it.
pub(crate) struct Reaping {
    pub prog: Program,
    pub rx: mpsc::Receiver<std::io::Result<preheat_engine::os::Reaped>>,
}

/// Start a job pinned to `cpus`, at `SCHED_FIFO` `fifo` if given, and a thread that reaps it.
pub(crate) fn start_program(job: &Job, cpus: &[usize], fifo: Option<i32>) -> Result<Reaping> {
    let mut cmd = job.command(fifo)?;
    let prog = aproc::spawn(&mut cmd, cpus).with_context(|| format!("starting {}", job.argv[0]))?;
    let pid = prog.pid();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(preheat_engine::os::wait_reap(pid));
    });
    Ok(Reaping { prog, rx })
}

pub(crate) fn job_for(main: &MainSpec, spec: &RunSpec, tag: &str) -> Result<Job> {
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

pub(crate) fn reaped_cpu(
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
        _ => super::interleaving::interleaved(plan, spec),
    }
}

/// A refill bin's label, for the human output.
pub fn bin_label(from: u64, to: Option<u64>) -> String {
    match to {
        Some(t) => format!("{from}–{t} µs"),
        None => format!("≥ {from} µs"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proc::Worker;
    use crate::worker::{parse, Role};

    fn spec(quantum_ms: f64, cpu: u32) -> RunSpec {
        RunSpec {
            experiment: Experiment::Alone,
            main: MainSpec::Bundled(Kind::Chase),
            quantum_ms,
            cpu,
            cpu_ms: 10,
            preheat: true,
            ws_bytes: Some(1 << 16),
            scratch: std::env::temp_dir(),
            vector_in_process: false,
            worker: WorkerCmd {
                exe: "/nonexistent/preheat".into(),
                args: vec!["affinity".into(), "worker".into()],
            },
        }
    }

    fn with_parent(mut a: Vec<String>) -> Vec<String> {
        a.extend(["--parent".into(), "1".into()]);
        a
    }

    /// The flags the controller writes for a worker are the flags the worker reads.
    #[test]
    fn worker_lines_written_are_worker_lines_read() {
        let plan = crate::topology::plan(None, 0, &[2, 10, 200]).unwrap();
        let v = &plan.vectors[0];
        match parse(&with_parent(vector_args(v, 2.0))).unwrap() {
            Role::Vector {
                bytes, gap_us: g, ..
            } => {
                assert_eq!(bytes, v.bytes as usize);
                assert_eq!(g.to_string(), gap_us(2.0));
            }
            r => panic!("{r:?}"),
        }
        let s = spec(4.0, 0);
        let a = with_parent(workload_args(&plan, Kind::Chase, &s, 10, true));
        match parse(&a).unwrap() {
            Role::Workload {
                kind,
                bytes,
                cpu_ms,
                preheat,
                preheat_budget_us,
                ..
            } => {
                assert_eq!(kind, "chase");
                assert_eq!((bytes, cpu_ms, preheat), (1 << 16, 10, true));
                assert_eq!(preheat_budget_us, 500);
            }
            r => panic!("{r:?}"),
        }
        assert!(parse(&["vector".into(), "--kind".into(), "zero".into()]).is_err());
    }

    /// A cell the controller cannot run is refused before any process starts, and a worker
    /// executable that does not exist is an error, not a wait.
    #[test]
    fn bad_cells_and_missing_workers_are_errors() {
        let plan = crate::topology::plan(None, 0, &[2, 10, 200]).unwrap();
        let e = execute(&plan, &spec(0.5, 0)).unwrap_err().to_string();
        assert!(e.contains("outside 1..10000"), "{e}");
        let e = execute(&plan, &spec(2.0, 100_000)).unwrap_err().to_string();
        assert!(e.contains("does not exist here"), "{e}");
        let w = &spec(2.0, 0).worker;
        assert!(Worker::start(w, "vector", &["vector".into()], &[0]).is_err());
    }
}
