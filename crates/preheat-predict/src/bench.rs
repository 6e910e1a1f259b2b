//! `preheat io bench`: the paper's Figure 1 experiment (repeated random reads with a varying
//! inter-I/O idle time; 99th-percentile latency and CPU cost per waiting policy) on a real file
//! (`O_DIRECT`, measured) or on the emulated SSD (emulated).
//!
//! Method: for each idle gap, one [`AnticipatoryReader`] per policy (fresh model, own helper
//! thread) on a dedicated requester thread; warm-up rounds first (not recorded; they train the
//! anticipatory model), then `requests` rounds in which every policy issues one read in shuffled
//! order, each read preceded by the idle gap (a sleep of the requester). Sizes are drawn
//! uniformly from the size list, offsets uniformly from the 4 KiB-aligned positions of the
//! device. Interleaving keeps slow drifts of the host (the notes: up to 2× between runs) out of
//! the comparison between policies.

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::anticipatory_read::{
    ensure_test_file, AnticipatoryReader, Device, EmulatedDevice, Feedback, FileDevice, Label,
    Policy, ReadRecord, ReaderConfig, ServiceModel, ALIGN,
};
use crate::linear::{ModelStats, OnlineFit, OpKind, PredictorConfig};
use crate::measure::{add_cpu_ns, on_own_thread, opt};
use crate::stats::{summarize, Summary};
use crate::wait::{loadavg, set_own_timer_slack, ThreadCpuClock};

/// `file:PATH` or `emulated`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeviceSpec {
    /// A file (created if missing; a directory means `DIR/preheat-io-bench.dat`).
    File(PathBuf),
    Emulated,
}

impl FromStr for DeviceSpec {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "emulated" {
            Ok(DeviceSpec::Emulated)
        } else if let Some(p) = s.strip_prefix("file:") {
            if p.is_empty() {
                Err("file: needs a path (file:PATH)".into())
            } else {
                Ok(DeviceSpec::File(PathBuf::from(p)))
            }
        } else {
            Err(format!("unknown device {s:?}: use file:PATH or emulated"))
        }
    }
}

/// Everything `io bench` needs.
#[derive(Clone, Debug)]
pub struct BenchConfig {
    pub device: DeviceSpec,
    pub model: ServiceModel,
    pub policies: Vec<Policy>,
    pub gaps_us: Vec<u64>,
    pub sizes_kib: Vec<u32>,
    /// Recorded requests per policy and gap.
    pub requests: usize,
    /// Unrecorded warm-up requests per policy and gap.
    pub warmup: usize,
    pub seed: u64,
    /// Size of the test file created when missing.
    pub file_mib: u64,
    pub requester_cpu: Option<usize>,
    pub helper_cpu: Option<usize>,
    pub feedback: Feedback,
    pub predictor: PredictorConfig,
    /// See [`ReaderConfig::min_spin_ns`].
    pub min_spin_ns: u64,
}

impl Default for BenchConfig {
    fn default() -> Self {
        Self {
            device: DeviceSpec::Emulated,
            model: ServiceModel::default(),
            policies: vec![Policy::Default, Policy::Awake, Policy::Anticipatory],
            gaps_us: vec![0, 100, 1000, 10_000],
            sizes_kib: vec![4, 16, 64],
            requests: 500,
            warmup: 64,
            seed: 1,
            file_mib: 256,
            requester_cpu: None,
            helper_cpu: None,
            feedback: Feedback::Requester,
            predictor: PredictorConfig::default(),
            min_spin_ns: ReaderConfig::default().min_spin_ns,
        }
    }
}

/// A least-squares line over (size, time) pairs, in µs and KiB.
#[derive(Clone, Copy, Debug, Serialize, PartialEq)]
pub struct FitStats {
    pub n: u64,
    pub intercept_us: Option<f64>,
    pub slope_us_per_kib: Option<f64>,
    pub pearson_r: Option<f64>,
}

impl FitStats {
    /// `fit` has x in bytes and y in ns.
    pub fn from_fit(fit: &OnlineFit) -> Self {
        let line = fit.line();
        Self {
            n: fit.n(),
            intercept_us: line.map(|(a, _)| a / 1e3),
            slope_us_per_kib: line.map(|(_, b)| b * 1024.0 / 1e3),
            pearson_r: fit.pearson_r(),
        }
    }
}

/// One (policy, gap) cell. Every number in it carries the cell's `label`.
#[derive(Clone, Debug, Serialize)]
pub struct Cell {
    pub label: Label,
    pub policy: Policy,
    pub gap_us: u64,
    pub requests: usize,
    /// Submit → requester saw completion, µs.
    pub latency_us: Summary,
    /// The requester's user-visible awake time per request (spin + since last wake-up), µs.
    pub awake_us: Summary,
    /// The requester thread's CPU time per request from the scheduler (schedstat), µs;
    /// includes the accounting overhead given in the report.
    pub cpu_us_per_request_schedstat: Option<f64>,
    /// Share of requests whose last requester wake-up found the read already done.
    pub censored_share: f64,
    pub censored: usize,
    /// Recorded requests for which the anticipatory model was not ready (spun instead).
    pub bootstrap: usize,
    /// The online model at the end of the cell (what the policy's requester fed it).
    pub model: ModelStats,
    /// Offline fit of the helper's completion times (submit → helper saw done) vs size over
    /// all recorded requests: the paper's predictability measure.
    pub device_fit: FitStats,
    /// Offline fit of the requester-observed latency vs size.
    pub latency_fit: FitStats,
    /// Submit → helper started the read (the helper-thread hop), µs.
    pub dispatch_us: Summary,
    /// Submit → helper saw the read complete, µs.
    pub device_us: Summary,
    /// Emulated device only: its sampled service times, µs.
    pub modeled_service_us: Option<Summary>,
    /// Anticipatory only: planned block time, µs.
    pub planned_wake_us: Option<Summary>,
    /// Anticipatory only: timer-wake lag (actual − planned wake-up, for wake-ups that found
    /// the read still pending), µs.
    pub wake_lag_us: Option<Summary>,
}

/// The whole `io bench` result.
#[derive(Clone, Debug, Serialize)]
pub struct BenchReport {
    pub label: Label,
    pub device: String,
    pub device_bytes: u64,
    pub sizes_kib: Vec<u32>,
    pub requests_per_cell: usize,
    pub warmup_per_cell: usize,
    pub requester_cpu: Option<usize>,
    pub helper_cpu: Option<usize>,
    /// Requester's timer slack after trying to set it to 1 ns (`None`: could not set).
    pub requester_timer_slack_ns: Option<u64>,
    pub feedback: Feedback,
    pub predictor: PredictorConfig,
    pub min_spin_us: f64,
    pub emulated_model: Option<ServiceModel>,
    /// CPU time of one empty schedstat measurement pair, µs (measured).
    pub schedstat_overhead_us: Option<f64>,
    pub wall_s: f64,
    /// `/proc/loadavg` (1, 5, 15 min) before and after: other work on the machine competes
    /// with the helper and requester threads.
    pub loadavg_before: Option<[f64; 3]>,
    pub loadavg_after: Option<[f64; 3]>,
    pub cells: Vec<Cell>,
}

fn resolve_file(p: &Path) -> PathBuf {
    if p.is_dir() {
        p.join("preheat-io-bench.dat")
    } else {
        p.to_path_buf()
    }
}

fn open_device(cfg: &BenchConfig, path: Option<&Path>, seed: u64) -> Result<Box<dyn Device>> {
    let max_len = *cfg.sizes_kib.iter().max().unwrap_or(&4) as usize * 1024;
    Ok(match path {
        Some(p) => Box::new(FileDevice::open(p, max_len)?),
        None => Box::new(EmulatedDevice::new(cfg.model, seed)),
    })
}

/// Run the benchmark (blocking; the requests are issued from a dedicated thread).
pub fn run_bench(cfg: &BenchConfig) -> Result<BenchReport> {
    if cfg.policies.is_empty() || cfg.gaps_us.is_empty() || cfg.sizes_kib.is_empty() {
        bail!("need at least one policy, gap and size");
    }
    if cfg.sizes_kib.iter().any(|&s| s == 0 || s % 4 != 0) {
        bail!("sizes must be positive multiples of 4 KiB (O_DIRECT alignment)");
    }
    if cfg.requests == 0 {
        bail!("--requests must be positive");
    }
    let path = match &cfg.device {
        DeviceSpec::File(p) => {
            let p = resolve_file(p);
            ensure_test_file(&p, cfg.file_mib << 20, cfg.seed)
                .with_context(|| format!("creating test file {}", p.display()))?;
            Some(p)
        }
        DeviceSpec::Emulated => None,
    };
    let cfg2 = cfg.clone();
    on_own_thread("preheat-io-requester", "requester", move || {
        requester(&cfg2, path.as_deref())
    })
}

/// Shuts the bench's own wake planner down (restoring every setting it changed) and removes
/// its run dir, on every exit path.
struct PlannerGuard(Option<preheat_wake::daemon::Daemon>, std::path::PathBuf);

impl Drop for PlannerGuard {
    fn drop(&mut self) {
        if let Some(d) = self.0.take() {
            d.shutdown();
        }
        let _ = std::fs::remove_dir_all(&self.1);
    }
}

fn requester(cfg: &BenchConfig, path: Option<&Path>) -> Result<BenchReport> {
    let t0 = Instant::now();
    let loadavg_before = loadavg();
    if let Some(cpu) = cfg.requester_cpu {
        preheat_engine::os::pin_current_thread(cpu)
            .with_context(|| format!("pinning the requester to CPU {cpu}"))?;
    }
    let slack = set_own_timer_slack(1).ok();
    let clock = ThreadCpuClock::open().ok();
    let overhead = clock.as_ref().and_then(clock_overhead_us);
    let probe = open_device(cfg, path, cfg.seed)?;
    let (label, device, device_bytes) = (probe.label(), probe.describe(), probe.capacity());
    drop(probe);
    let max_len = *cfg.sizes_kib.iter().max().unwrap() as u64 * 1024;
    if device_bytes < max_len {
        bail!("{device} is smaller than the largest request ({max_len} B)");
    }
    let slots = (device_bytes - max_len) / ALIGN as u64 + 1;
    let mut cells = Vec::new();
    // `window` needs a wake planner: our own, in-process, for the run (it restores whatever it
    // changes when dropped; unprivileged it only spins).
    let planner = if cfg.policies.contains(&Policy::Window) {
        let dir = std::env::temp_dir().join(format!("preheat-io-planner-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let d = preheat_wake::daemon::Daemon::start(preheat_wake::daemon::Config::new(&dir))
            .context("starting the wake planner for the window policy")?;
        Some((PlannerGuard(Some(d), dir.clone()), dir))
    } else {
        None
    };
    let my_cpu = preheat_engine::os::current_cpu();
    for (gi, &gap) in cfg.gaps_us.iter().enumerate() {
        let planner_dir = planner.as_ref().map(|(_, dir)| dir.as_path());
        let mut readers = gap_readers(cfg, path, gi, planner_dir, my_cpu)?;
        let mut rng = StdRng::seed_from_u64(cfg.seed.wrapping_mul(0x9E37_79B9) ^ gap);
        let mut recs: Vec<Vec<ReadRecord>> = vec![Vec::with_capacity(cfg.requests); readers.len()];
        let mut cpu_ns: Vec<Option<u64>> = vec![clock.as_ref().map(|_| 0); readers.len()];
        let mut order: Vec<usize> = (0..readers.len()).collect();
        for round in 0..cfg.warmup + cfg.requests {
            order.shuffle(&mut rng);
            for &i in &order {
                if gap > 0 {
                    std::thread::sleep(Duration::from_micros(gap));
                }
                let len = *cfg.sizes_kib.choose(&mut rng).unwrap() as usize * 1024;
                let offset = rng.gen_range(0..slots) * ALIGN as u64;
                let c0 = clock.as_ref().and_then(|c| c.now().ok());
                let rec = readers[i].read(offset, len).with_context(|| {
                    format!("read of {len} B at {offset} on {}", readers[i].describe())
                })?;
                let c1 = clock.as_ref().and_then(|c| c.now().ok());
                if round >= cfg.warmup {
                    recs[i].push(rec);
                    cpu_ns[i] = add_cpu_ns(cpu_ns[i], c0, c1);
                }
            }
        }
        for (i, r) in readers.iter().enumerate() {
            cells.push(cell(label, r, gap, &recs[i], cpu_ns[i]));
        }
    }
    Ok(BenchReport {
        label,
        device,
        device_bytes,
        sizes_kib: cfg.sizes_kib.clone(),
        requests_per_cell: cfg.requests,
        warmup_per_cell: cfg.warmup,
        requester_cpu: cfg.requester_cpu,
        helper_cpu: cfg.helper_cpu,
        requester_timer_slack_ns: slack,
        feedback: cfg.feedback,
        predictor: cfg.predictor,
        min_spin_us: cfg.min_spin_ns as f64 / 1e3,
        emulated_model: path.is_none().then_some(cfg.model),
        schedstat_overhead_us: overhead,
        wall_s: t0.elapsed().as_secs_f64(),
        loadavg_before,
        loadavg_after: loadavg(),
        cells,
    })
}

/// The mean cost of reading the thread's CPU clock, µs (over 200 pairs of reads).
fn clock_overhead_us(c: &ThreadCpuClock) -> Option<f64> {
    let mut total = 0u64;
    for _ in 0..200 {
        let a = c.now().ok()?;
        let b = c.now().ok()?;
        total += b.saturating_sub(a);
    }
    Some(total as f64 / 200.0 / 1e3)
}

/// One reader per policy for gap number `gi`, each on a device of its own; a `window` reader
/// asks the planner in `planner_dir` to keep `my_cpu` awake.
fn gap_readers(
    cfg: &BenchConfig,
    path: Option<&Path>,
    gi: usize,
    planner_dir: Option<&Path>,
    my_cpu: u32,
) -> Result<Vec<AnticipatoryReader>> {
    let mut readers = Vec::new();
    for (pi, &policy) in cfg.policies.iter().enumerate() {
        let dev = open_device(cfg, path, cfg.seed ^ ((gi as u64) << 32) ^ pi as u64)?;
        readers.push(AnticipatoryReader::new(
            dev,
            ReaderConfig {
                policy,
                feedback: cfg.feedback,
                predictor: cfg.predictor,
                helper_cpu: cfg.helper_cpu,
                min_spin_ns: cfg.min_spin_ns,
            },
        )?);
        if let (Policy::Window, Some(dir)) = (policy, planner_dir) {
            let client = preheat_wake::client::WakeClient::connect(dir)
                .map_err(|e| anyhow::anyhow!("connecting to the wake planner: {e}"))?;
            if let Some(r) = readers.last_mut() {
                r.set_window_client(client, my_cpu);
            }
        }
    }
    Ok(readers)
}

fn us(v: impl Iterator<Item = u64>) -> Summary {
    summarize(&v.map(|x| x as f64 / 1e3).collect::<Vec<_>>())
}

fn cell(
    label: Label,
    r: &AnticipatoryReader,
    gap: u64,
    recs: &[ReadRecord],
    cpu_ns: Option<u64>,
) -> Cell {
    let n = recs.len();
    let mut device_fit = OnlineFit::new();
    let mut latency_fit = OnlineFit::new();
    for x in recs {
        device_fit.push(x.len as f64, x.device_ns as f64);
        latency_fit.push(x.len as f64, x.latency_ns as f64);
    }
    let censored = recs.iter().filter(|x| x.censored).count();
    let modeled: Vec<u64> = recs.iter().filter_map(|x| x.modeled_ns).collect();
    let planned: Vec<u64> = recs.iter().filter_map(|x| x.planned_wake_ns).collect();
    let lag: Vec<u64> = recs
        .iter()
        .filter(|x| x.blocked && !x.censored)
        .filter_map(|x| x.planned_wake_ns.map(|p| x.resumed_ns.saturating_sub(p)))
        .collect();
    Cell {
        label,
        policy: r.policy(),
        gap_us: gap,
        requests: n,
        latency_us: us(recs.iter().map(|x| x.latency_ns)),
        awake_us: us(recs.iter().map(|x| x.awake_ns)),
        cpu_us_per_request_schedstat: cpu_ns.filter(|_| n > 0).map(|c| c as f64 / n as f64 / 1e3),
        censored_share: if n > 0 {
            censored as f64 / n as f64
        } else {
            0.0
        },
        censored,
        bootstrap: recs.iter().filter(|x| x.bootstrap).count(),
        model: r.predictor().stats(OpKind::Read),
        device_fit: FitStats::from_fit(&device_fit),
        latency_fit: FitStats::from_fit(&latency_fit),
        dispatch_us: us(recs.iter().map(|x| x.dispatch_ns)),
        device_us: us(recs.iter().map(|x| x.device_ns)),
        modeled_service_us: (!modeled.is_empty()).then(|| us(modeled.into_iter())),
        planned_wake_us: (!planned.is_empty()).then(|| us(planned.into_iter())),
        wake_lag_us: (!lag.is_empty()).then(|| us(lag.into_iter())),
    }
}

/// Human-readable table; every row is prefixed with its label.
pub fn print_bench(r: &BenchReport) {
    println!(
        "[{}] device: {} ({} MiB); sizes {:?} KiB; {} requests per cell after {} warm-up; \
         requester CPU {:?}, helper CPU {:?}, requester timer slack {:?} ns; feedback {:?}",
        r.label.as_str(),
        r.device,
        r.device_bytes >> 20,
        r.sizes_kib,
        r.requests_per_cell,
        r.warmup_per_cell,
        r.requester_cpu,
        r.helper_cpu,
        r.requester_timer_slack_ns,
        r.feedback
    );
    println!(
        "{:<10} {:<13} {:>7} {:>22} {:>22} {:>8} {:>8} {:>9} {:>7} {:>7} {:>8} {:>8}",
        "label",
        "policy",
        "gap_us",
        "p50 µs (95% CI)",
        "p99 µs (95% CI)",
        "awake µs",
        "cpu µs",
        "censored",
        "r dev",
        "r model",
        "margin",
        "n"
    );
    for c in &r.cells {
        println!(
            "{:<10} {:<13} {:>7} {:>22} {:>22} {:>8.1} {:>8} {:>8.1}% {:>7} {:>7} {:>8.1} {:>8}",
            c.label.as_str(),
            c.policy.as_str(),
            c.gap_us,
            format!(
                "{:.1} ({:.1}–{:.1})",
                c.latency_us.p50, c.latency_us.p50_lo, c.latency_us.p50_hi
            ),
            format!(
                "{:.1} ({:.1}–{:.1})",
                c.latency_us.p99, c.latency_us.p99_lo, c.latency_us.p99_hi
            ),
            c.awake_us.mean,
            opt(c.cpu_us_per_request_schedstat, 1),
            c.censored_share * 100.0,
            opt(c.device_fit.pearson_r, 3),
            opt(c.model.pearson_r, 3),
            c.model.margin_us,
            c.requests
        );
    }
    println!(
        "awake = requester's user-visible awake time per request (spin + since last wake-up), mean; \
         cpu = requester CPU time per request from schedstat (incl. {} µs accounting); \
         r dev = Pearson r of helper-side completion time vs size; r model = the online model's r \
         (fed only exact samples); margin = final early-wake margin (µs). Wall {:.1} s; \
         load average before/after {:?}/{:?}.",
        opt(r.schedstat_overhead_us, 1),
        r.wall_s,
        r.loadavg_before.map(|l| l[0]),
        r.loadavg_after.map(|l| l[0])
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_spec_parses() {
        assert_eq!("emulated".parse::<DeviceSpec>(), Ok(DeviceSpec::Emulated));
        assert_eq!(
            "file:/tmp/x".parse::<DeviceSpec>(),
            Ok(DeviceSpec::File("/tmp/x".into()))
        );
        assert!("file:".parse::<DeviceSpec>().is_err());
        assert!("disk".parse::<DeviceSpec>().is_err());
    }
}
