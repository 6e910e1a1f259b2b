//! `preheat io kernels`: the paper's accelerator case (§2, "GPU Case Study") with a CPU worker
//! thread standing in for the accelerator.
//!
//! An iterative K-means (Lloyd) runs on synthetic Gaussian blobs. Each iteration the control
//! thread *launches* the assignment kernel on the worker thread (distances from every point to
//! every center, nearest center per point — the kernel the paper describes), *waits* for it,
//! then updates the centers itself; when no assignment changes, the clustering restarts from
//! fresh random centers, so the workload keeps going for the requested number of iterations.
//! Kernel runtimes vary from iteration to iteration (machine noise, restarts), which is what
//! history-based prediction has to cope with.
//!
//! The control thread waits in one of three [`WaitMode`]s:
//! * `interrupt` — block on the completion futex (the paper's default, interrupt-based);
//! * `busy` — poll from launch on (busy-waiting: the CPU never sleeps);
//! * `anticipatory` — block until `launch + predicted − margin`, then poll; the prediction comes
//!   from [`crate::history::RuntimeHistory`] keyed by kernel id, the margin from
//!   [`crate::linear::WakeMargin`] (backs off multiplicatively when the wake-up was late).
//!
//! The worker timestamps each kernel's end (like a GPU event), so the history gets exact
//! launch→done runtimes; a late wake-up only backs the margin off. Prediction accuracy is
//! scored on that launch→done series. Modes are interleaved in blocks of iterations in shuffled
//! order; each has its own worker and K-means state over the same points.
//!
//! Everything here runs on the real CPU: numbers are *measured*. "CPU awake" is the control
//! thread's user-visible awake time while waiting, not power (no RAPL on our VMs).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use anyhow::{anyhow, bail, Context, Result};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use preheat_engine::time::now_ns;

use crate::anticipatory_read::{std_normal, Label};
use crate::history::{AccuracyReport, HistoryKind, RuntimeHistory};
use crate::linear::{MarginConfig, WakeMargin};
use crate::measure::{add_cpu_ns, on_own_thread, opt};
use crate::stats::{summarize, Summary};
use crate::wait::{self, loadavg, set_own_timer_slack, Completion, ThreadCpuClock, WaitPolicy};

/// How the control thread waits for a kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum WaitMode {
    Interrupt,
    Busy,
    Anticipatory,
}

impl WaitMode {
    pub fn as_str(self) -> &'static str {
        match self {
            WaitMode::Interrupt => "interrupt",
            WaitMode::Busy => "busy",
            WaitMode::Anticipatory => "anticipatory",
        }
    }
}

/// Which history statistic drives the anticipatory wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum PredictorChoice {
    Last,
    Ewma,
    Median,
}

/// Everything `io kernels` needs.
#[derive(Clone, Debug)]
pub struct KernelsConfig {
    /// Iterations (kernel launches) per mode.
    pub iterations: usize,
    pub points: usize,
    pub k: usize,
    pub dims: usize,
    /// Iterations per interleaved block.
    pub block: usize,
    pub modes: Vec<WaitMode>,
    pub predictor: PredictorChoice,
    pub ewma_alpha: f64,
    pub median_k: usize,
    pub tolerance: f64,
    pub seed: u64,
    pub control_cpu: Option<usize>,
    pub worker_cpu: Option<usize>,
    pub margin: MarginConfig,
    /// A planned wake-up that left less than this much polling counts as late for the margin.
    pub min_spin_ns: u64,
}

impl Default for KernelsConfig {
    fn default() -> Self {
        Self {
            iterations: 300,
            points: 10240,
            k: 16,
            dims: 8,
            block: 10,
            modes: vec![WaitMode::Interrupt, WaitMode::Busy, WaitMode::Anticipatory],
            predictor: PredictorChoice::Median,
            ewma_alpha: 0.3,
            median_k: 5,
            tolerance: 0.10,
            seed: 1,
            control_cpu: None,
            worker_cpu: None,
            margin: MarginConfig::default(),
            min_spin_ns: 10_000,
        }
    }
}

/// Prediction accuracy of one history statistic on one mode's runtime series.
#[derive(Clone, Debug, Serialize)]
pub struct NamedAccuracy {
    pub predictor: String,
    pub accuracy: AccuracyReport,
}

/// One mode's result.
#[derive(Clone, Debug, Serialize)]
pub struct ModeResult {
    pub label: Label,
    pub mode: WaitMode,
    pub iterations: usize,
    /// Sum over iterations of launch → centers updated, ms.
    pub total_ms: f64,
    /// interrupt total / this total (> 1: faster than interrupt-style waiting).
    pub speedup_vs_interrupt: Option<f64>,
    /// Launch → control thread saw completion, µs.
    pub wait_us: Summary,
    /// Worker start → end of the kernel, µs.
    pub kernel_us: Summary,
    /// Launch → worker started, µs.
    pub dispatch_us: Summary,
    /// Control thread's user-visible awake time while waiting, per iteration, µs.
    pub awake_us: Summary,
    pub awake_total_ms: f64,
    /// This mode's awake total / busy-waiting's (the paper compares power to busy-waiting).
    pub awake_vs_busy: Option<f64>,
    /// Control thread CPU time from schedstat over this mode's blocks, ms (includes the
    /// center updates).
    pub cpu_ms_schedstat: Option<f64>,
    pub censored_share: f64,
    /// Anticipatory only: the final early-wake margin, µs.
    pub margin_us: Option<f64>,
    /// K-means restarts after convergence.
    pub restarts: usize,
    /// Accuracy of every history statistic on this mode's launch → done series.
    pub accuracy: Vec<NamedAccuracy>,
}

/// The whole `io kernels` result.
#[derive(Clone, Debug, Serialize)]
pub struct KernelsReport {
    pub label: Label,
    pub points: usize,
    pub k: usize,
    pub dims: usize,
    pub iterations_per_mode: usize,
    pub block: usize,
    pub predictor: String,
    pub tolerance: f64,
    pub control_cpu: Option<usize>,
    pub worker_cpu: Option<usize>,
    pub control_timer_slack_ns: Option<u64>,
    /// Accuracy of the predictor that drove the anticipatory mode, on its own series.
    pub anticipatory_accuracy: Option<AccuracyReport>,
    pub wall_s: f64,
    /// `/proc/loadavg` (1, 5, 15 min) before and after.
    pub loadavg_before: Option<[f64; 3]>,
    pub loadavg_after: Option<[f64; 3]>,
    pub modes: Vec<ModeResult>,
}

type Job = Box<dyn FnOnce() + Send>;

/// A worker thread standing in for an accelerator: runs launched kernels one at a time and
/// timestamps their start and end.
struct Accelerator {
    tx: Option<mpsc::Sender<Job>>,
    c: Arc<Completion>,
    handle: Option<JoinHandle<()>>,
}

impl Accelerator {
    fn new(cpu: Option<usize>) -> Result<Self> {
        let (tx, rx) = mpsc::channel::<Job>();
        let c = Arc::new(Completion::new());
        let c2 = c.clone();
        let handle = std::thread::Builder::new()
            .name("preheat-accel".into())
            .spawn(move || {
                struct Dead(Arc<Completion>);
                impl Drop for Dead {
                    fn drop(&mut self) {
                        self.0.mark_dead();
                    }
                }
                let _dead = Dead(c2.clone());
                if let Some(cpu) = cpu {
                    let _ = preheat_engine::os::pin_current_thread(cpu);
                }
                let _ = set_own_timer_slack(1);
                while let Ok(job) = rx.recv() {
                    c2.mark_started(now_ns());
                    job();
                    c2.complete(now_ns());
                }
            })?;
        Ok(Self {
            tx: Some(tx),
            c,
            handle: Some(handle),
        })
    }

    fn launch(&self, job: Job) -> Result<u64> {
        self.c.reset();
        let t = now_ns();
        self.tx
            .as_ref()
            .ok_or_else(|| anyhow!("worker gone"))?
            .send(job)
            .map_err(|_| anyhow!("worker gone"))?;
        Ok(t)
    }
}

impl Drop for Accelerator {
    fn drop(&mut self) {
        self.tx.take();
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// Synthetic points: `k` Gaussian blobs in `d` dimensions.
fn make_points(n: usize, k: usize, d: usize, rng: &mut StdRng) -> Vec<f32> {
    let centers: Vec<f32> = (0..k * d).map(|_| rng.gen_range(-10.0..10.0)).collect();
    let mut p = Vec::with_capacity(n * d);
    for i in 0..n {
        let c = i % k;
        for j in 0..d {
            p.push(centers[c * d + j] + std_normal(rng) as f32 * 1.5);
        }
    }
    p
}

/// The assignment kernel: nearest center for every point; returns how many changed.
fn assign_kernel(points: &[f32], centers: &[f32], d: usize, assign: &mut [u32]) -> u64 {
    let k = centers.len() / d;
    let mut changed = 0;
    for (i, p) in points.chunks_exact(d).enumerate() {
        let mut best = 0u32;
        let mut best_d = f32::INFINITY;
        for c in 0..k {
            let q = &centers[c * d..(c + 1) * d];
            let dist: f32 = p.iter().zip(q).map(|(a, b)| (a - b) * (a - b)).sum();
            if dist < best_d {
                best_d = dist;
                best = c as u32;
            }
        }
        if assign[i] != best {
            assign[i] = best;
            changed += 1;
        }
    }
    changed
}

/// One mode's K-means state.
struct KMeans {
    points: Arc<Vec<f32>>,
    d: usize,
    k: usize,
    centers: Arc<Mutex<Vec<f32>>>,
    assign: Arc<Mutex<Vec<u32>>>,
    changed: Arc<AtomicU64>,
    rng: StdRng,
    restarts: usize,
}

impl KMeans {
    fn new(points: Arc<Vec<f32>>, d: usize, k: usize, seed: u64) -> Self {
        let n = points.len() / d;
        let mut s = Self {
            points,
            d,
            k,
            centers: Arc::new(Mutex::new(vec![0.0; k * d])),
            assign: Arc::new(Mutex::new(vec![u32::MAX; n])),
            changed: Arc::new(AtomicU64::new(0)),
            rng: StdRng::seed_from_u64(seed),
            restarts: 0,
        };
        s.init_centers();
        s
    }

    fn init_centers(&mut self) {
        let n = self.points.len() / self.d;
        let mut c = self.centers.lock().unwrap_or_else(|p| p.into_inner());
        for j in 0..self.k {
            let i = self.rng.gen_range(0..n);
            c[j * self.d..(j + 1) * self.d]
                .copy_from_slice(&self.points[i * self.d..(i + 1) * self.d]);
        }
    }

    fn kernel(&self) -> Job {
        let (points, centers, assign, changed, d) = (
            self.points.clone(),
            self.centers.clone(),
            self.assign.clone(),
            self.changed.clone(),
            self.d,
        );
        Box::new(move || {
            let c = centers.lock().unwrap_or_else(|p| p.into_inner()).clone();
            let mut a = assign.lock().unwrap_or_else(|p| p.into_inner());
            changed.store(assign_kernel(&points, &c, d, &mut a), Ordering::Release);
        })
    }

    /// The CPU-side update step (after the kernel completed).
    fn update(&mut self) {
        if self.changed.load(Ordering::Acquire) == 0 {
            self.restarts += 1;
            self.init_centers();
            return;
        }
        let (d, k) = (self.d, self.k);
        let mut sums = vec![0.0f64; k * d];
        let mut counts = vec![0u64; k];
        {
            let a = self.assign.lock().unwrap_or_else(|p| p.into_inner());
            for (i, &c) in a.iter().enumerate() {
                let c = c as usize;
                counts[c] += 1;
                for j in 0..d {
                    sums[c * d + j] += self.points[i * d + j] as f64;
                }
            }
        }
        let mut centers = self.centers.lock().unwrap_or_else(|p| p.into_inner());
        for c in 0..k {
            if counts[c] > 0 {
                for j in 0..d {
                    centers[c * d + j] = (sums[c * d + j] / counts[c] as f64) as f32;
                }
            }
        }
    }
}

const KERNEL_ID: &str = "kmeans.assign";

struct ModeState {
    mode: WaitMode,
    accel: Accelerator,
    km: KMeans,
    histories: Vec<RuntimeHistory<&'static str>>,
    driver: usize,
    margin: WakeMargin,
    min_spin_ns: u64,
    done: usize,
    total_ns: u64,
    wait_ns: Vec<u64>,
    kernel_ns: Vec<u64>,
    dispatch_ns: Vec<u64>,
    awake_ns: Vec<u64>,
    censored: usize,
    cpu_ns: Option<u64>,
}

impl ModeState {
    /// A fresh state for `mode`: its own accelerator and k-means, one history per predictor
    /// kind (`driver` drives the waits); a CPU-time count when the thread's clock is open.
    fn new(
        cfg: &KernelsConfig,
        mode: WaitMode,
        points: &Arc<Vec<f32>>,
        kinds: &[HistoryKind],
        driver: usize,
        clock: bool,
    ) -> Result<ModeState> {
        Ok(ModeState {
            mode,
            accel: Accelerator::new(cfg.worker_cpu)?,
            km: KMeans::new(points.clone(), cfg.dims, cfg.k, cfg.seed ^ 0x5EED),
            histories: kinds
                .iter()
                .map(|&k| RuntimeHistory::new(k, cfg.tolerance))
                .collect(),
            driver,
            margin: WakeMargin::new(cfg.margin),
            min_spin_ns: cfg.min_spin_ns,
            done: 0,
            total_ns: 0,
            wait_ns: Vec::new(),
            kernel_ns: Vec::new(),
            dispatch_ns: Vec::new(),
            awake_ns: Vec::new(),
            censored: 0,
            cpu_ns: clock.then_some(0),
        })
    }

    /// This mode's result; speedup against the interrupt mode's total `t_int`, awake time
    /// against the busy mode's `a_busy` (ns).
    fn result(&self, t_int: Option<f64>, a_busy: Option<f64>) -> ModeResult {
        let us = |v: &[u64]| summarize(&v.iter().map(|&x| x as f64 / 1e3).collect::<Vec<_>>());
        let s = self;
        let awake_total = s.awake_ns.iter().sum::<u64>() as f64;
        ModeResult {
            label: Label::Measured,
            mode: s.mode,
            iterations: s.done,
            total_ms: s.total_ns as f64 / 1e6,
            speedup_vs_interrupt: t_int
                .filter(|_| s.total_ns > 0)
                .map(|t| t / s.total_ns as f64),
            wait_us: us(&s.wait_ns),
            kernel_us: us(&s.kernel_ns),
            dispatch_us: us(&s.dispatch_ns),
            awake_us: us(&s.awake_ns),
            awake_total_ms: awake_total / 1e6,
            awake_vs_busy: a_busy.filter(|&b| b > 0.0).map(|b| awake_total / b),
            cpu_ms_schedstat: s.cpu_ns.map(|c| c as f64 / 1e6),
            censored_share: s.censored as f64 / s.done.max(1) as f64,
            margin_us: (s.mode == WaitMode::Anticipatory).then(|| s.margin.margin_ns() / 1e3),
            restarts: s.km.restarts,
            accuracy: s
                .histories
                .iter()
                .map(|h| NamedAccuracy {
                    predictor: h.kind().name(),
                    accuracy: h.accuracy(),
                })
                .collect(),
        }
    }
}

/// Run the accelerator experiment (blocking; the control loop runs on a dedicated thread).
pub fn run_kernels(cfg: &KernelsConfig) -> Result<KernelsReport> {
    if cfg.iterations == 0 || cfg.modes.is_empty() {
        bail!("need at least one iteration and one mode");
    }
    if cfg.points == 0 || cfg.k == 0 || cfg.dims == 0 || cfg.k > cfg.points {
        bail!("need points ≥ k ≥ 1 and dims ≥ 1");
    }
    let cfg2 = cfg.clone();
    on_own_thread("preheat-kernels-ctl", "control", move || control(&cfg2))
}

fn control(cfg: &KernelsConfig) -> Result<KernelsReport> {
    let t0 = Instant::now();
    let loadavg_before = loadavg();
    if let Some(cpu) = cfg.control_cpu {
        preheat_engine::os::pin_current_thread(cpu)
            .with_context(|| format!("pinning the control thread to CPU {cpu}"))?;
    }
    let slack = set_own_timer_slack(1).ok();
    let clock = ThreadCpuClock::open().ok();
    let mut rng = StdRng::seed_from_u64(cfg.seed);
    let points = Arc::new(make_points(cfg.points, cfg.k, cfg.dims, &mut rng));
    let kinds = [
        HistoryKind::Last,
        HistoryKind::Ewma {
            alpha: cfg.ewma_alpha,
        },
        HistoryKind::MedianOfLast { k: cfg.median_k },
    ];
    let driver = match cfg.predictor {
        PredictorChoice::Last => 0,
        PredictorChoice::Ewma => 1,
        PredictorChoice::Median => 2,
    };
    let mut states = Vec::new();
    for &mode in &cfg.modes {
        states.push(ModeState::new(
            cfg,
            mode,
            &points,
            &kinds,
            driver,
            clock.is_some(),
        )?);
    }
    let mut order: Vec<usize> = (0..states.len()).collect();
    let block = cfg.block.max(1);
    while states.iter().any(|s| s.done < cfg.iterations) {
        order.shuffle(&mut rng);
        for &i in &order {
            let s = &mut states[i];
            let n = block.min(cfg.iterations - s.done);
            if n == 0 {
                continue;
            }
            let c0 = clock.as_ref().and_then(|c| c.now().ok());
            for _ in 0..n {
                iteration(s)?;
            }
            let c1 = clock.as_ref().and_then(|c| c.now().ok());
            s.cpu_ns = add_cpu_ns(s.cpu_ns, c0, c1);
        }
    }
    let total_of = |m: WaitMode| {
        states
            .iter()
            .find(|s| s.mode == m)
            .map(|s| s.total_ns as f64)
    };
    let awake_of = |m: WaitMode| {
        states
            .iter()
            .find(|s| s.mode == m)
            .map(|s| s.awake_ns.iter().sum::<u64>() as f64)
    };
    let (t_int, a_busy) = (total_of(WaitMode::Interrupt), awake_of(WaitMode::Busy));
    let mut modes = Vec::new();
    let mut anticipatory_accuracy = None;
    for s in &states {
        if s.mode == WaitMode::Anticipatory {
            anticipatory_accuracy = Some(s.histories[s.driver].accuracy());
        }
        modes.push(s.result(t_int, a_busy));
    }
    Ok(KernelsReport {
        label: Label::Measured,
        points: cfg.points,
        k: cfg.k,
        dims: cfg.dims,
        iterations_per_mode: cfg.iterations,
        block,
        predictor: kinds[driver].name(),
        tolerance: cfg.tolerance,
        control_cpu: cfg.control_cpu,
        worker_cpu: cfg.worker_cpu,
        control_timer_slack_ns: slack,
        anticipatory_accuracy,
        wall_s: t0.elapsed().as_secs_f64(),
        loadavg_before,
        loadavg_after: loadavg(),
        modes,
    })
}

fn iteration(s: &mut ModeState) -> Result<()> {
    let launch = s.accel.launch(s.km.kernel())?;
    let policy = match s.mode {
        WaitMode::Interrupt => WaitPolicy::Block,
        WaitMode::Busy => WaitPolicy::Spin,
        WaitMode::Anticipatory => match s.histories[s.driver].predict(&KERNEL_ID) {
            Some(p) => WaitPolicy::BlockUntil(launch + (p - s.margin.margin_ns()).max(0.0) as u64),
            None => WaitPolicy::Block,
        },
    };
    let o = wait::wait(&s.accel.c, policy, launch);
    if o.abandoned {
        bail!("worker thread died");
    }
    let done = s.accel.c.done_ns();
    let started = s.accel.c.started_ns();
    s.km.update();
    let end = now_ns();
    let actual = done.saturating_sub(launch);
    for h in &mut s.histories {
        h.observe(KERNEL_ID, actual as f64);
    }
    if s.mode == WaitMode::Anticipatory && matches!(policy, WaitPolicy::BlockUntil(_)) {
        if o.censored || (o.blocked && o.awake_ns() < s.min_spin_ns) {
            s.margin.on_late();
        } else {
            s.margin.on_in_time();
        }
    }
    s.censored += o.censored as usize;
    s.total_ns += end.saturating_sub(launch);
    s.wait_ns.push(o.seen_ns.saturating_sub(launch));
    s.kernel_ns.push(done.saturating_sub(started));
    s.dispatch_ns.push(started.saturating_sub(launch));
    s.awake_ns.push(o.awake_ns());
    s.done += 1;
    Ok(())
}

/// Human-readable table; every row is labeled.
pub fn print_kernels(r: &KernelsReport) {
    println!(
        "[{}] K-means assignment kernel on a worker thread: {} points × {} centers × {} dims; \
         {} iterations per mode in interleaved blocks of {}; control CPU {:?}, worker CPU {:?}; \
         anticipatory predictor {}",
        r.label.as_str(),
        r.points,
        r.k,
        r.dims,
        r.iterations_per_mode,
        r.block,
        r.control_cpu,
        r.worker_cpu,
        r.predictor
    );
    println!(
        "{:<9} {:<13} {:>10} {:>8} {:>16} {:>16} {:>10} {:>9} {:>9} {:>9}",
        "label",
        "mode",
        "total ms",
        "speedup",
        "wait p50/p99 µs",
        "kernel p50 µs",
        "awake ms",
        "vs busy",
        "cpu ms",
        "censored"
    );
    for m in &r.modes {
        println!(
            "{:<9} {:<13} {:>10.2} {:>8} {:>16} {:>16.1} {:>10.2} {:>9} {:>9} {:>8.1}%",
            m.label.as_str(),
            m.mode.as_str(),
            m.total_ms,
            opt(m.speedup_vs_interrupt, 3),
            format!("{:.1}/{:.1}", m.wait_us.p50, m.wait_us.p99),
            m.kernel_us.p50,
            m.awake_total_ms,
            opt(m.awake_vs_busy, 2),
            opt(m.cpu_ms_schedstat, 1),
            m.censored_share * 100.0
        );
    }
    for m in &r.modes {
        for a in &m.accuracy {
            println!(
                "[{}] accuracy on {} series, {}: within ±{:.0}%: {} (n={}), MAPE {}",
                m.label.as_str(),
                m.mode.as_str(),
                a.predictor,
                a.accuracy.tolerance * 100.0,
                opt(a.accuracy.within_tolerance, 3),
                a.accuracy.scored,
                opt(a.accuracy.mape, 3)
            );
        }
    }
    println!(
        "speedup = interrupt total / mode total (launch → centers updated); awake = control \
         thread's user-visible awake time while waiting (not power); paper: ~10% speedup, 87% \
         accuracy, 56% power saved vs busy-waiting. Wall {:.1} s; load average before/after \
         {:?}/{:?}.",
        r.wall_s,
        r.loadavg_before.map(|l| l[0]),
        r.loadavg_after.map(|l| l[0])
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_assigns_nearest() {
        let points = [0.0f32, 0.0, 10.0, 10.0, 9.0, 9.0];
        let centers = [0.0f32, 0.0, 10.0, 10.0];
        let mut a = vec![u32::MAX; 3];
        assert_eq!(assign_kernel(&points, &centers, 2, &mut a), 3);
        assert_eq!(a, vec![0, 1, 1]);
        assert_eq!(assign_kernel(&points, &centers, 2, &mut a), 0);
    }
}
