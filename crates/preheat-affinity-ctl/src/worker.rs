//! `preheat affinity worker` (hidden): the processes of an affinity experiment — a base vector
//! or a bundled workload — started by the controller on a pinned CPU.
//!
//! Protocol on the pipes (one JSON object per line):
//! * stdout, first line: `{"ready":true,"pid":P,"main_tid":T,"warm_tid":W|null}` once every
//!   buffer is built and touched;
//! * a workload then waits for `g` on stdin and runs until it has used `--cpu-ms` of CPU time
//!   (its own thread's clock); every later `p` on stdin makes its warm thread load the workload's
//!   working set (the preheat engine's `load_runs`) — the controller triggers it when the
//!   workload is about to resume or move;
//! * a vector runs until SIGTERM;
//! * stdout, last line: the [`Outcome`].
//!
//! Both record their own run intervals from the clock: a step normally takes microseconds, so a
//! gap longer than the worker's `--gap-us` between two steps is a quantum boundary. The
//! workload also bins its progress by time since it last resumed: the refill profile.

use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use preheat_engine::basevec::BaseVector;
use preheat_engine::time::{now_ns, thread_cpu_ns};
use preheat_engine::workloads::{Kind, Workload};
use serde::{Deserialize, Serialize};

/// A pause between two steps longer than this is an interruption (steps take ≤ ~10 µs): the
/// step is left out of the refill bins. Whether it is also a quantum boundary is decided by the
/// worker's `--gap-us` (the controller passes half the quantum), so an interrupt or a kernel
/// thread inside a long quantum does not cut it in two.
pub const INTERRUPT_NS: u64 = 150_000;

/// Upper edges of the refill bins, µs since the workload resumed (the last bin is open).
pub const BIN_EDGES_US: [u64; 14] = [
    25, 50, 100, 200, 400, 800, 1600, 3200, 6400, 12_800, 25_600, 51_200, 102_400, 204_800,
];

/// A worker's command line: `ROLE FLAGS...`, as [`crate::run`]'s `workload_args`/`vector_args`
/// write it after the [`crate::proc::WorkerCmd`].
#[derive(clap::Parser)]
#[command(name = "preheat affinity worker")]
struct WorkerLine {
    #[command(subcommand)]
    role: Role,
}

/// What a worker process is.
#[derive(clap::Subcommand, Debug, Clone)]
pub enum Role {
    /// A base vector: step through its footprint until SIGTERM.
    Vector {
        /// zero, data or code.
        #[arg(long)]
        kind: String,
        #[arg(long)]
        bytes: usize,
        /// A pause longer than this (µs) is a quantum boundary.
        #[arg(long, default_value_t = 150)]
        gap_us: u64,
        /// The controller's pid (the worker dies with it).
        #[arg(long)]
        parent: u32,
    },
    /// A bundled workload: run until --cpu-ms of CPU time after `g` on stdin.
    Workload {
        #[arg(long)]
        kind: String,
        #[arg(long)]
        bytes: usize,
        #[arg(long)]
        cpu_ms: u64,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Start a warm thread that loads the working set on every `p` from stdin.
        #[arg(long)]
        preheat: bool,
        /// Each preheat stops after this long (µs), loaded or not.
        #[arg(long, default_value_t = 250)]
        preheat_budget_us: u64,
        /// Run a base vector (zero, data, code) as a thread of this process (same address
        /// space: no address-space switch between workload and vector).
        #[arg(long)]
        vector_kind: Option<String>,
        #[arg(long, default_value_t = 4096)]
        vector_bytes: usize,
        /// A pause longer than this (µs) is a quantum boundary.
        #[arg(long, default_value_t = 150)]
        gap_us: u64,
        #[arg(long)]
        parent: u32,
    },
}

/// Parse a worker's command line (its arguments after the [`crate::proc::WorkerCmd`]'s).
pub fn parse(args: &[String]) -> Result<Role, clap::Error> {
    use clap::Parser;
    let argv = std::iter::once("preheat affinity worker".to_string()).chain(args.iter().cloned());
    Ok(WorkerLine::try_parse_from(argv)?.role)
}

/// One refill bin: work done and time spent while the time since resuming was in
/// `[from_us, to_us)`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Bin {
    pub from_us: u64,
    pub to_us: Option<u64>,
    pub units: u64,
    pub ns: u64,
}

/// What a worker prints last.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Outcome {
    /// Work units done (workloads; 0 for vectors).
    pub work: u64,
    pub unit: String,
    /// CPU time of the measured thread, ns.
    pub cpu_ns: u64,
    pub wall_ns: u64,
    /// CPU time of the warm thread and how many preheats it ran.
    pub preheat_cpu_ns: u64,
    pub preheats: u64,
    pub preheat_lines: u64,
    /// Lengths of the runs between descheduling gaps, and of the gaps, ms (the run before the
    /// first gap and the last run are partial: left out).
    pub runs_ms: Vec<f64>,
    pub gaps_ms: Vec<f64>,
    pub bins: Vec<Bin>,
    /// The in-process vector's runs and gaps (`--vector-kind`), ms.
    #[serde(default)]
    pub vector_runs_ms: Vec<f64>,
    #[serde(default)]
    pub vector_gaps_ms: Vec<f64>,
}

/// The run/gap clock of a worker; see the module docs.
struct RunClock {
    /// A pause longer than this ends a run (a quantum boundary).
    gap_ns: u64,
    last: u64,
    resume: u64,
    runs: Vec<f64>,
    gaps: Vec<f64>,
    seen_gap: bool,
    units: [u64; BIN_EDGES_US.len() + 1],
    ns: [u64; BIN_EDGES_US.len() + 1],
}

impl RunClock {
    fn new(gap_ns: u64) -> RunClock {
        let t = now_ns();
        RunClock {
            gap_ns: gap_ns.max(INTERRUPT_NS),
            last: t,
            resume: t,
            runs: Vec::with_capacity(4096),
            gaps: Vec::with_capacity(4096),
            seen_gap: false,
            units: [0; BIN_EDGES_US.len() + 1],
            ns: [0; BIN_EDGES_US.len() + 1],
        }
    }

    /// After a step that did `units` of work.
    #[inline]
    fn tick(&mut self, units: u64) {
        let t = now_ns();
        let d = t.saturating_sub(self.last);
        if d > self.gap_ns {
            if self.seen_gap {
                self.runs.push((self.last - self.resume) as f64 / 1e6);
            }
            self.gaps.push(d as f64 / 1e6);
            self.seen_gap = true;
            self.resume = t;
        } else if d <= INTERRUPT_NS {
            let since_us = (self.last - self.resume) / 1000;
            let b = BIN_EDGES_US.partition_point(|&e| e <= since_us);
            self.units[b] += units;
            self.ns[b] += d;
        }
        self.last = t;
    }

    fn finish(self, out: &mut Outcome) {
        // Runs are counted from the first gap (the run before it began at start-up). A vector's
        // first gap is its wait, stopped, while the main workload starts: callers skip it.
        out.runs_ms = self.runs;
        out.gaps_ms = self.gaps;
        out.bins = (0..=BIN_EDGES_US.len())
            .map(|i| Bin {
                from_us: if i == 0 { 0 } else { BIN_EDGES_US[i - 1] },
                to_us: BIN_EDGES_US.get(i).copied(),
                units: self.units[i],
                ns: self.ns[i],
            })
            .filter(|b| b.ns > 0)
            .collect();
    }
}

fn ready(pid_main: u32, warm: Option<u32>, vector: Option<u32>) -> Result<()> {
    let mut o = std::io::stdout().lock();
    writeln!(
        o,
        "{}",
        serde_json::json!({"ready": true, "pid": std::process::id(), "main_tid": pid_main,
                           "warm_tid": warm, "vector_tid": vector})
    )?;
    o.flush()?;
    Ok(())
}

fn vector(kind: &str, bytes: usize) -> Result<BaseVector> {
    Ok(match kind {
        "zero" => BaseVector::zero(),
        "data" => BaseVector::data(bytes),
        "code" => BaseVector::code(bytes).context("code base vector")?,
        k => bail!("unknown vector kind {k:?} (zero, data, code)"),
    })
}

/// Step `v` until `stop`, recording runs and gaps.
fn vector_loop(mut v: BaseVector, stop: &AtomicBool, gap_ns: u64) -> Outcome {
    let t0 = now_ns();
    let c0 = thread_cpu_ns();
    let mut clock = RunClock::new(gap_ns);
    while !stop.load(Ordering::Relaxed) {
        for _ in 0..16 {
            v.step();
            clock.tick(0);
        }
    }
    let mut out = Outcome {
        unit: "steps".into(),
        cpu_ns: thread_cpu_ns() - c0,
        wall_ns: now_ns() - t0,
        ..Outcome::default()
    };
    clock.finish(&mut out);
    out.bins.clear();
    out
}

fn finish(out: &Outcome) -> Result<()> {
    let mut o = std::io::stdout().lock();
    writeln!(o, "{}", serde_json::to_string(out)?)?;
    o.flush()?;
    Ok(())
}

/// Run as the worker `role` until done (a workload) or SIGTERM (a vector); see the module docs.
pub fn run(role: Role) -> Result<()> {
    match role {
        Role::Vector {
            kind,
            bytes,
            gap_us,
            parent,
        } => {
            preheat_engine::os::die_with_parent(parent)?;
            let mut v = vector(&kind, bytes)?;
            v.run_passes(1);
            let stop = Arc::new(AtomicBool::new(false));
            signal_hook::flag::register(signal_hook::consts::SIGTERM, Arc::clone(&stop))?;
            ready(preheat_engine::os::gettid(), None, None)?;
            finish(&vector_loop(v, &stop, gap_us * 1000))
        }
        Role::Workload {
            kind,
            bytes,
            cpu_ms,
            seed,
            preheat,
            preheat_budget_us,
            vector_kind,
            vector_bytes,
            gap_us,
            parent,
        } => {
            preheat_engine::os::die_with_parent(parent)?;
            let k = Kind::parse(&kind)
                .with_context(|| format!("unknown workload {kind:?} (chase, stream, branchy)"))?;
            let mut w = Workload::new(k, bytes, seed)
                .with_context(|| format!("building the {kind} workload"))?;
            for _ in 0..(bytes / 4096).max(16) {
                w.step();
            }
            let v = match vector_kind {
                Some(k) => {
                    let mut v = vector(&k, vector_bytes)?;
                    v.run_passes(1);
                    Some(v)
                }
                None => None,
            };
            workload(
                w,
                cpu_ms,
                preheat.then_some(preheat_budget_us),
                v,
                gap_us * 1000,
            )
        }
    }
}

/// `preheat`: the budget of one preheat, µs (None: no warm thread work).
fn workload(
    mut w: Workload,
    cpu_ms: u64,
    preheat: Option<u64>,
    v: Option<BaseVector>,
    gap_ns: u64,
) -> Result<()> {
    let budget_us = preheat.unwrap_or(0);
    let preheat = preheat.is_some();
    let go = Arc::new(AtomicBool::new(false));
    let preheat_cpu = Arc::new(AtomicU64::new(0));
    let preheats = Arc::new(AtomicU64::new(0));
    let lines = Arc::new(AtomicU64::new(0));
    let (tid_tx, tid_rx) = std::sync::mpsc::channel();
    // The warm thread below may load the workload's lines until the process exits (it lives as
    // long as stdin is open, past the end of this function): the warm set keeps their memory.
    let warm_set = w.warm_set();
    {
        let (go, preheat_cpu, preheats, lines) = (
            Arc::clone(&go),
            Arc::clone(&preheat_cpu),
            Arc::clone(&preheats),
            Arc::clone(&lines),
        );
        // The stdin reader: `g` starts the workload, `p` preheats (only with --preheat). It
        // lives until stdin closes; the process exits when the workload is done.
        std::thread::Builder::new()
            .name("affinity-warm".into())
            .spawn(move || {
                let _ = tid_tx.send(preheat_engine::os::gettid());
                let mut stdin = std::io::stdin().lock();
                let mut buf = [0u8; 256];
                loop {
                    let buf = match stdin.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => &buf[..n],
                    };
                    if buf.contains(&b'g') {
                        go.store(true, Ordering::Release);
                    }
                    // Triggers that arrived while a preheat ran are one preheat, not a queue.
                    if preheat && buf.contains(&b'p') {
                        let c = thread_cpu_ns();
                        let deadline = now_ns() + budget_us * 1000;
                        let r = warm_set.load(Some(deadline));
                        preheat_cpu.fetch_add(thread_cpu_ns() - c, Ordering::Relaxed);
                        preheats.fetch_add(1, Ordering::Relaxed);
                        lines.fetch_add(r.lines_done, Ordering::Relaxed);
                    }
                }
            })?;
    }
    let warm = tid_rx.recv_timeout(Duration::from_secs(5)).ok();
    let stop_vector = Arc::new(AtomicBool::new(false));
    let (vector_thread, vector_tid) = match v {
        Some(v) => {
            let (t, tid) = spawn_vector(v, Arc::clone(&stop_vector), gap_ns)?;
            (Some(t), tid)
        }
        None => (None, None),
    };
    ready(
        preheat_engine::os::gettid(),
        warm.filter(|_| preheat),
        vector_tid,
    )?;
    while !go.load(Ordering::Acquire) {
        std::thread::sleep(Duration::from_micros(200));
    }
    let target = cpu_ms * 1_000_000;
    let t0 = now_ns();
    let mut clock = RunClock::new(gap_ns);
    let (work, cpu) = run_for_cpu(&mut w, target, &mut clock);
    let mut out = Outcome {
        work,
        unit: w.kind().unit().1.into(),
        cpu_ns: cpu,
        wall_ns: now_ns() - t0,
        preheat_cpu_ns: preheat_cpu.load(Ordering::Relaxed),
        preheats: preheats.load(Ordering::Relaxed),
        preheat_lines: lines.load(Ordering::Relaxed),
        ..Outcome::default()
    };
    clock.finish(&mut out);
    stop_vector.store(true, Ordering::Relaxed);
    if let Some(t) = vector_thread {
        if let Ok(vo) = t.join() {
            out.vector_runs_ms = vo.runs_ms;
            out.vector_gaps_ms = vo.gaps_ms;
        }
    }
    finish(&out)
}

/// Step `w` until this thread has used `target` ns of CPU (checked every 256 steps), ticking
/// `clock`; returns (work done, CPU used in ns).
fn run_for_cpu(w: &mut Workload, target: u64, clock: &mut RunClock) -> (u64, u64) {
    let c0 = thread_cpu_ns();
    let mut work = 0u64;
    let cpu = loop {
        for _ in 0..256 {
            let u = w.step();
            work += u;
            clock.tick(u);
        }
        let c = thread_cpu_ns() - c0;
        if c >= target {
            break c;
        }
    };
    (work, cpu)
}

/// The base vector's thread (`affinity-vector`), until `stop`; with its tid, if it said it
/// within 5 s.
fn spawn_vector(
    v: BaseVector,
    stop: Arc<AtomicBool>,
    gap_ns: u64,
) -> Result<(std::thread::JoinHandle<Outcome>, Option<u32>)> {
    let (tx, rx) = std::sync::mpsc::channel();
    let t = std::thread::Builder::new()
        .name("affinity-vector".into())
        .spawn(move || {
            let _ = tx.send(preheat_engine::os::gettid());
            vector_loop(v, &stop, gap_ns)
        })?;
    Ok((t, rx.recv_timeout(Duration::from_secs(5)).ok()))
}
