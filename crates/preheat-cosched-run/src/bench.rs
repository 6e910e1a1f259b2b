//! What the user-space coscheduler costs (`preheat bench cosched`; goal ≥ 0.97, ≥ 0.95 on a
//! real guest).
//!
//! One VM whose vCPUs are all the CPUs, one barrier-synchronised instance on all of them, one
//! set: under `full` the set runs in every slice, so what differs from plain Linux is only the
//! controller (waking every slice, reading schedstat, real-time classes). Useful work per
//! second = the instance's iterations per second; the ratio full / none is paired by
//! repetition, conditions interleaved in shuffled order; median over repetitions with its
//! range. Measured on this machine.
//!
//! **A real guest** ([`measure_guest`], `--guest`): one 2-vCPU QEMU guest (TCG) running the
//! kernel, its one set coscheduled under `full`; useful work = its barrier phases per second of
//! guest time over the window in which it computed (`experiment_vms`, as the experiment
//! measures guests); pairs in ABBA order (none, full, full, none, ...), so a drift of the
//! machine over the benchmark weighs on both conditions alike. **Boot per run**, as the
//! experiment does: rates within one boot drift as much as between boots (the `GuestVm`
//! measurement: plain Linux before and after `full` within one boot 585/558, 466/446,
//! 521/623 phases/s), so two windows of one boot pair no better, and a fresh boot leaves no
//! state of the other condition behind; the boot (~7 s) is outside the measured window.

use anyhow::{bail, Context, Result};
use preheat_cosim::scenario::Policy;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use serde::Serialize;

use crate::experiment::{self, VmKind};
use crate::experiment_vms::barriers;
use crate::host::{HostSpec, VmSpec};
use crate::run;
use crate::watchdog::WatchdogCmd;
use preheat_launch::progress::Progress;
use preheat_model::stats::{summarize, Spread};

/// The benchmark's result (measured).
#[derive(Debug, Serialize)]
pub struct BenchResult {
    pub label: &'static str,
    pub kernel: String,
    /// What the VM is.
    pub vm: String,
    /// The unit of the rates: "iterations/s" (a thread group) or "phases/s" (a guest).
    pub rate_unit: &'static str,
    /// The order of the runs: "shuffled" or "ABBA".
    pub order: &'static str,
    pub cpus: usize,
    pub seconds: f64,
    pub slice_ms: f64,
    pub reps: usize,
    /// Useful work per second per repetition (`rate_unit`).
    pub none_rates: Vec<f64>,
    pub full_rates: Vec<f64>,
    /// full / none per repetition.
    pub ratios: Vec<f64>,
    pub ratio_median: f64,
    pub ratio_min: f64,
    pub ratio_max: f64,
    /// The ratio, rates under none and under full as median \[range\], n (measured).
    pub ratio: Spread,
    pub none: Spread,
    pub full: Spread,
    pub goal: f64,
    /// The controller's cost per slice, µs (median over repetitions of each run's p50).
    pub apply_us_p50: f64,
    /// A guest: each run's measured window, s (run order).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub windows_s: Vec<f64>,
    /// A guest: each run's start, from starting QEMU to the controller's first slice, s.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub boot_s: Vec<f64>,
}

/// Seconds of a guest's work per run by default (the window is this less the late start).
pub const GUEST_SECONDS: f64 = 8.0;

/// vCPUs of the benchmark's guest.
const GUEST_VCPUS: usize = 2;

/// Measure one 2-vCPU (`GUEST_VCPUS`) QEMU guest running `kernel` for `seconds` (guest time)
/// alone, under none and full, `pairs` paired boots in ABBA order (one step of `progress` per
/// run); the rates are its barrier phases per second.
pub fn measure_guest(
    kernel: &str,
    pairs: usize,
    seconds: f64,
    slice_ms: f64,
    watchdog: Option<&WatchdogCmd>,
    progress: &dyn Progress,
    say: &dyn Fn(&str),
) -> Result<BenchResult> {
    if pairs < 1 {
        bail!("--reps must be at least 1");
    }
    VmKind::Guests.check_kernel(kernel)?;
    let cpus = preheat_engine::os::online_cpus();
    let vm = VmKind::Guests.vm(
        "guest",
        kernel,
        GUEST_VCPUS,
        (GUEST_VCPUS, 1),
        seconds,
        Vec::new(),
    )?;
    let spec = HostSpec { vms: vec![vm] };
    spec.validate(cpus)?;
    let order: Vec<(usize, Policy)> = (0..pairs)
        .flat_map(|r| {
            let ab = [(r, Policy::None), (r, Policy::Full)];
            if r % 2 == 0 {
                ab
            } else {
                [ab[1], ab[0]]
            }
        })
        .collect();
    progress.start(order.len() as u64, "cosched");
    let (mut rates, mut apply) = ([vec![f64::NAN; pairs], vec![f64::NAN; pairs]], Vec::new());
    let (mut windows_s, mut boot_s) = (Vec::new(), Vec::new());
    for (r, p) in order {
        let opts = experiment::options(p, slice_ms, seconds, watchdog.cloned());
        let out = run::execute(&spec, &opts, false, say)?;
        let m = VmKind::Guests
            .measured(kernel, &out)
            .with_context(|| format!("the guest's run under {p}"))?;
        let x = m.rates.first().context("the guest reported no instance")?.1;
        rates[usize::from(p == Policy::Full)][r] = x * barriers(kernel).max(1) as f64;
        if p == Policy::Full {
            apply.push(out.report.apply_us_p50);
        }
        windows_s.push(m.window_s);
        boot_s.push(out.controller_start_s);
        progress.inc(1);
    }
    progress.finish();
    let [none, full] = rates;
    let vm = format!("one {GUEST_VCPUS}-vCPU QEMU guest (TCG), boot per run, on {cpus} CPUs");
    let mut res = result(kernel, vm, cpus, (seconds, slice_ms), none, full, &apply);
    res.rate_unit = "phases/s";
    res.order = "ABBA";
    res.goal = 0.95;
    res.windows_s = windows_s;
    res.boot_s = boot_s;
    Ok(res)
}

/// The result of paired rates (thread-group defaults: iterations/s, shuffled, goal 0.97).
fn result(
    kernel: &str,
    vm: String,
    cpus: usize,
    (seconds, slice_ms): (f64, f64),
    none: Vec<f64>,
    full: Vec<f64>,
    apply: &[f64],
) -> BenchResult {
    let ratios: Vec<f64> = full.iter().zip(&none).map(|(f, n)| f / n).collect();
    let s = summarize(&ratios);
    BenchResult {
        label: "measured",
        kernel: kernel.into(),
        vm,
        rate_unit: "iterations/s",
        order: "shuffled",
        cpus,
        seconds,
        slice_ms,
        reps: none.len(),
        ratio_median: s.p50,
        ratio_min: s.min,
        ratio_max: s.max,
        ratio: Spread::of(&ratios),
        none: Spread::of(&none),
        full: Spread::of(&full),
        ratios,
        none_rates: none,
        full_rates: full,
        goal: 0.97,
        apply_us_p50: summarize(apply).p50,
        windows_s: Vec::new(),
        boot_s: Vec::new(),
    }
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
    let vm = format!("{cpus} threads on {cpus} CPUs");
    Ok(result(
        kernel,
        vm,
        cpus,
        (seconds, slice_ms),
        none,
        full,
        &apply,
    ))
}
