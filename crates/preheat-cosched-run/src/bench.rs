//! What the user-space coscheduler costs (`preheat bench cosched`; goal ≥ 0.97).
//!
//! One VM whose vCPUs are all the CPUs, one barrier-synchronised instance on all of them, one
//! set: under `full` the set runs in every slice, so what differs from plain Linux is only the
//! controller (waking every slice, reading schedstat, real-time classes). Useful work per
//! second = the instance's iterations per second; the ratio full / none is paired by
//! repetition, conditions interleaved in shuffled order; median over repetitions with its
//! range. Measured on this machine.

use anyhow::{bail, Context, Result};
use preheat_cosim::scenario::Policy;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use serde::Serialize;

use crate::experiment;
use crate::host::{HostSpec, VmSpec};
use crate::run;
use crate::watchdog::WatchdogCmd;
use preheat_launch::progress::Progress;
use preheat_model::stats::summarize;

/// The benchmark's result (measured).
#[derive(Debug, Serialize)]
pub struct BenchResult {
    pub label: &'static str,
    pub kernel: String,
    pub cpus: usize,
    pub seconds: f64,
    pub slice_ms: f64,
    pub reps: usize,
    /// Iterations per second per repetition.
    pub none_rates: Vec<f64>,
    pub full_rates: Vec<f64>,
    /// full / none per repetition.
    pub ratios: Vec<f64>,
    pub ratio_median: f64,
    pub ratio_min: f64,
    pub ratio_max: f64,
    pub goal: f64,
    /// The controller's cost per slice, µs (median over repetitions of each run's p50).
    pub apply_us_p50: f64,
}

/// Measure `kernel` on every CPU under none and full, `reps` paired repetitions of `seconds`
/// in shuffled order (one step of `progress` per run); `say` hears what was restored from a
/// dead controller's journal.
pub fn measure(
    kernel: &str,
    reps: usize,
    seconds: f64,
    slice_ms: f64,
    watchdog: Option<&WatchdogCmd>,
    progress: &dyn Progress,
    say: &dyn Fn(&str),
) -> Result<BenchResult> {
    if reps < 1 {
        bail!("--reps must be at least 1");
    }
    let cpus = preheat_engine::os::online_cpus();
    let spec = HostSpec {
        vms: vec![VmSpec {
            name: Some("vm".into()),
            vcpus: cpus,
            command: experiment::npb_argv(kernel, cpus, 1, seconds)?,
            pid: None,
            guest: None,
            threads: "npb-".into(),
            sets: vec![(0..cpus).collect()],
        }],
    };
    let mut order: Vec<(usize, Policy)> = (0..reps)
        .flat_map(|r| [(r, Policy::None), (r, Policy::Full)])
        .collect();
    order.shuffle(&mut rand::rngs::StdRng::seed_from_u64(7));
    progress.start(order.len() as u64, "cosched");
    let mut none = vec![f64::NAN; reps];
    let mut full = vec![f64::NAN; reps];
    let mut apply = Vec::new();
    for (r, p) in order {
        let opts = experiment::options(p, slice_ms, seconds, watchdog.cloned());
        let out = run::execute(&spec, &opts, false, say)?;
        let x = experiment::instance_rates(&out.vms[0].stdout)?
            .first()
            .copied()
            .context("the workload reported no instance")?;
        if p == Policy::Full {
            full[r] = x;
            apply.push(out.report.apply_us_p50);
        } else {
            none[r] = x;
        }
        progress.inc(1);
    }
    progress.finish();
    let ratios: Vec<f64> = full.iter().zip(&none).map(|(f, n)| f / n).collect();
    let s = summarize(&ratios);
    Ok(BenchResult {
        label: "measured",
        kernel: kernel.into(),
        cpus,
        seconds,
        slice_ms,
        reps,
        none_rates: none,
        full_rates: full,
        ratio_median: s.p50,
        ratio_min: s.min,
        ratio_max: s.max,
        ratios,
        goal: 0.97,
        apply_us_p50: summarize(&apply).p50,
    })
}
