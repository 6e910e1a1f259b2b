//! The two kinds of "VM" `cosched experiment` runs, behind one interface ([`VmKind`]): what a
//! scenario's VMs are ([`VmKind::host_of`]), how the simulator's phase rate and contention are
//! calibrated ([`VmKind::calibrate`]), and what a run measured ([`VmKind::measured`]).
//!
//! * **Thread groups** (the default): each VM is one `preheat-npb` process whose threads are the
//!   vCPUs; its rates are the JSON summary's (iterations over the run's wall time, each
//!   instance's slowest thread); calibrated by pinned copies without a coscheduler.
//! * **Guests** (`--guests`, issue 22): each VM is a QEMU guest (`preheat-guest`, TCG, one host
//!   thread per vCPU) running the same kernel inside; the metric is the guest's own progress,
//!   barrier phases per second of guest time from its console reports, over the window in which
//!   every guest computed at once under the controller (guests boot side by side but come up
//!   at different times; a report is placed in host time at its guest time plus the start its
//!   earliest report implies, since console lines can arrive late, never early). Phases are
//!   turned into iterations (÷ barriers per iteration), so both kinds share the experiment's
//!   metric. Calibrated by guests too: one boot of two 1-vCPU guests under full coscheduling
//!   (each vCPU pinned to a CPU of its own), the first computing alone before the second starts:
//!   its alone rate, then both rates side by side (the contention). `ep` has no barrier, so its
//!   guests report no phases: refused.
//!
//! **Boot per run.** Every run boots its guests afresh rather than keeping them up and restarting
//! kernels: the guest image's `/init` runs one workload and powers off, partial-auto needs the
//! agent (host-side detection) in QEMU from its start, and a fresh boot leaves no guest state
//! (page cache, scheduler placement, the detector's matrix) from the previous cell. The cost is
//! measured per run (`Cell::controller_start_s`: from starting QEMU to the controller's first
//! slice) and reported with the results.

use anyhow::{bail, Context, Result};
use preheat_cosim::scenario::{Policy, Scenario};
use preheat_npb::{Kernel, Progress};
use serde::Serialize;

use crate::host::{GuestVm, HostSpec, VmSpec};
use crate::run::{self, Outcome, Params};
use crate::watchdog::WatchdogCmd;
use preheat_launch::paths;
use preheat_model::stats::median;

/// What the experiment's VMs are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum VmKind {
    /// Thread groups: one `preheat-npb` process per VM.
    ThreadGroups,
    /// Real QEMU guests running `preheat-npb` inside.
    Guests,
}

impl std::fmt::Display for VmKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            VmKind::ThreadGroups => "thread groups",
            VmKind::Guests => "QEMU guests",
        })
    }
}

/// The workloads sleep this long after creating their threads, so the coscheduler (and for
/// partial-auto the reset of the matrix) is in place before the measured work begins.
pub(crate) const START_DELAY_MS: u64 = 1500;

/// A guest's kernel starts later: the controller starts once every guest is up, and guests
/// booted together come up up to ~1–2 s apart (measured).
const GUEST_START_DELAY_MS: u64 = 2500;

/// Guests report their progress this often (guest ms).
const GUEST_PROGRESS_MS: u64 = 500;

/// What one run measured of its VMs.
#[derive(Debug, Clone)]
pub(crate) struct Measured {
    /// Per instance: (VM index, iterations per second).
    pub rates: Vec<(usize, f64)>,
    /// When the measured window began, seconds after the run started its VMs.
    pub window_start_s: f64,
    /// Its length, s.
    pub window_s: f64,
}

impl VmKind {
    /// Refuse what this kind cannot run before anything starts.
    pub(crate) fn check_kernel(self, kernel: &str) -> Result<()> {
        let Some(k) = kernel_of(kernel) else {
            let known: Vec<&str> = Kernel::ALL.iter().map(|k| k.name()).collect();
            bail!("unknown kernel {kernel:?} ({})", known.join(", "));
        };
        if self == VmKind::Guests && k.barriers_per_iteration() == 0 {
            bail!(
                "{kernel} has no barrier, so a guest running it reports no progress (barrier \
                 phases): use mg, cg or is with --guests"
            );
        }
        Ok(())
    }

    /// The two VMs of a scenario on `cpus` CPUs: VM1 with `cpus` vCPUs, VM2 with half, each
    /// running `seconds` of work after its start delay.
    pub(crate) fn host_of(
        self,
        kernel: &str,
        scenario: Scenario,
        cpus: usize,
        seconds: f64,
    ) -> Result<HostSpec> {
        let half = cpus / 2;
        let (threads, instances) = match scenario {
            Scenario::Single => (half, 1),
            Scenario::Double => (cpus, 2),
            Scenario::Quad => {
                if cpus < 4 {
                    bail!(
                        "quad needs at least 4 CPUs (four instances of a quarter of VM1); this \
                         machine has {cpus}: use `preheat cosched simulate --scenario quad`"
                    );
                }
                (cpus, 4)
            }
        };
        let per = threads / instances;
        let vm1_sets: Vec<Vec<usize>> = (0..instances)
            .map(|i| (i * per..(i + 1) * per).collect())
            .collect();
        Ok(HostSpec {
            vms: vec![
                self.vm("vm1", kernel, cpus, (threads, instances), seconds, vm1_sets)?,
                self.vm(
                    "vm2",
                    kernel,
                    half,
                    (half, 1),
                    seconds,
                    vec![(0..half).collect()],
                )?,
            ],
        })
    }

    /// One VM of `vcpus` vCPUs running `instances` instances of `threads` threads in all.
    pub(crate) fn vm(
        self,
        name: &str,
        kernel: &str,
        vcpus: usize,
        (threads, instances): (usize, usize),
        seconds: f64,
        sets: Vec<Vec<usize>>,
    ) -> Result<VmSpec> {
        let mut vm = VmSpec {
            name: Some(name.into()),
            vcpus,
            command: Vec::new(),
            pid: None,
            guest: None,
            threads: String::new(),
            sets,
        };
        match self {
            VmKind::ThreadGroups => {
                vm.command = npb_argv(kernel, threads, instances, seconds)?;
                vm.threads = "npb-".into();
            }
            VmKind::Guests => {
                vm.guest = Some(guest_vm(kernel, (threads, instances), seconds, 0));
            }
        }
        Ok(vm)
    }

    /// What a run of this kind measured: every instance's rate over the measured window.
    pub(crate) fn measured(self, kernel: &str, out: &Outcome) -> Result<Measured> {
        match self {
            VmKind::ThreadGroups => {
                let mut rates = Vec::new();
                for (vi, vm) in out.vms.iter().enumerate() {
                    let r = instance_rates(&vm.stdout).with_context(|| vm.name.clone())?;
                    rates.extend(r.into_iter().map(|r| (vi, r)));
                }
                Ok(Measured {
                    rates,
                    window_start_s: START_DELAY_MS as f64 / 1e3,
                    window_s: summary_wall(&out.vms[0].stdout).unwrap_or(0.0),
                })
            }
            VmKind::Guests => {
                let reports: Vec<&[(f64, Progress)]> =
                    out.vms.iter().map(|v| v.progress.as_slice()).collect();
                let (from, to) = common_window(&reports, out.controller_start_s)?;
                let per_iteration = barriers(kernel).max(1) as f64;
                let mut rates = Vec::new();
                for (vi, r) in reports.iter().enumerate() {
                    match phase_rates_in(r, from, to) {
                        Some(phases) => {
                            rates.extend(phases.into_iter().map(|p| (vi, p / per_iteration)))
                        }
                        // Fewer than 2 progress reports in the window all guests computed in (it
                        // is short when they came up far apart, as on a slow host): no rate, a
                        // void run, which the experiment runs once more (`void_run`).
                        None => rates.push((vi, f64::NAN)),
                    }
                }
                Ok(Measured {
                    rates,
                    window_start_s: from,
                    window_s: to - from,
                })
            }
        }
    }

    /// Calibrate the simulator for `kernel` on this kind of VM ([`Calibration`]), from `runs`
    /// runs of each.
    pub(crate) fn calibrate(
        self,
        kernel: &str,
        cpus: usize,
        runs: usize,
        watchdog: Option<&WatchdogCmd>,
        say: &dyn Fn(&str),
    ) -> Result<Calibration> {
        let (mut alone, mut pair) = (Vec::new(), Vec::new());
        for _ in 0..runs.max(1) {
            let (a, p) = match self {
                VmKind::ThreadGroups => threads_alone_and_pair(kernel, cpus)?,
                VmKind::Guests => guests_alone_and_pair(kernel, watchdog, say)?,
            };
            alone.push(a);
            pair.push(p);
        }
        let (a, p) = (median(&alone).unwrap_or(0.0), median(&pair).unwrap_or(0.0));
        if a <= 0.0 || p <= 0.0 {
            bail!("{kernel}: the calibration runs completed no iteration");
        }
        Ok(Calibration {
            kernel: kernel.into(),
            alone_iteration_us: 1e6 / a,
            contention: (a / p - 1.0).max(0.0),
            runs: alone.len(),
        })
    }
}

/// A guest VM running `kernel` for `seconds` after `extra_delay_ms` more than the guests' start
/// delay, reporting every [`GUEST_PROGRESS_MS`].
fn guest_vm(
    kernel: &str,
    (threads, instances): (usize, usize),
    seconds: f64,
    extra_delay_ms: u64,
) -> GuestVm {
    GuestVm {
        kernel: kernel.into(),
        threads: Some(threads),
        instances: Some(instances),
        seconds,
        start_delay_ms: Some(GUEST_START_DELAY_MS + extra_delay_ms),
        progress_ms: Some(GUEST_PROGRESS_MS),
    }
}

/// When a guest's kernel started computing, in host seconds of the run: a report arrives at
/// its start plus its guest time plus a delay ≥ 0 (the console), so the earliest start any
/// report implies is the closest.
fn compute_start(reports: &[(f64, Progress)]) -> Option<f64> {
    reports
        .iter()
        .map(|(at, p)| at - p.t_ms as f64 / 1e3)
        .min_by(f64::total_cmp)
}

/// A report's place in host time: its guest time after the guest's computed start.
fn placed(reports: &[(f64, Progress)]) -> Vec<(f64, &Progress)> {
    let start = compute_start(reports).unwrap_or(0.0);
    reports
        .iter()
        .map(|(_, p)| (start + p.t_ms as f64 / 1e3, p))
        .collect()
}

/// The window in which every guest computed and the controller ran: from the latest compute
/// start (not before `controller_start_s`) to the earliest last report.
fn common_window(reports: &[&[(f64, Progress)]], controller_start_s: f64) -> Result<(f64, f64)> {
    let mut from = controller_start_s;
    let mut to = f64::INFINITY;
    for r in reports {
        let (Some(start), Some(&(last, _))) = (compute_start(r), placed(r).last()) else {
            bail!("a guest reported no progress");
        };
        from = from.max(start);
        to = to.min(last);
    }
    if to <= from {
        bail!("the guests never computed at the same time under the controller ({from:.1} s to {to:.1} s)");
    }
    Ok((from, to))
}

/// Phases per second of guest time of each instance, between its first report placed at or
/// after `from` and its last placed at or before `to` (host seconds of the run); `None` with
/// fewer than 2 such reports.
fn phase_rates_in(reports: &[(f64, Progress)], from: f64, to: f64) -> Option<Vec<f64>> {
    // Reports are placed on a grid of guest time; allow a millisecond of rounding.
    let eps = 1e-3;
    let inside: Vec<&Progress> = placed(reports)
        .into_iter()
        .filter(|(t, _)| *t >= from - eps && *t <= to + eps)
        .map(|(_, p)| p)
        .collect();
    match (inside.first(), inside.last()) {
        (Some(a), Some(b)) if inside.len() >= 2 => preheat_guest::console::phase_rates(a, b),
        _ => None,
    }
}

/// Seconds of each guest calibration phase (alone, then side by side).
const GUEST_CALIBRATION_S: f64 = 3.0;

/// One guest calibration: two 1-vCPU guests under full coscheduling (each vCPU pinned to a CPU
/// of its own, as in the experiment's coscheduled runs), the second starting
/// [`GUEST_CALIBRATION_S`] after the first; iterations per second of the first alone, and the
/// mean of both side by side.
fn guests_alone_and_pair(
    kernel: &str,
    watchdog: Option<&WatchdogCmd>,
    say: &dyn Fn(&str),
) -> Result<(f64, f64)> {
    let s = GUEST_CALIBRATION_S;
    let lead_ms = (s * 1e3) as u64;
    let spec = HostSpec {
        vms: ["alone", "pair"]
            .iter()
            .zip([(2.0 * s + 1.0, 0), (s, lead_ms)])
            .map(|(name, (seconds, delay))| VmSpec {
                name: Some(format!("cal-{name}")),
                vcpus: 1,
                command: Vec::new(),
                pid: None,
                guest: Some(guest_vm(kernel, (1, 1), seconds, delay)),
                threads: String::new(),
                sets: Vec::new(),
            })
            .collect(),
    };
    let out = run::execute(
        &spec,
        &options(Policy::Full, 10.0, 3.0 * s, watchdog.cloned()),
        false,
        say,
    )
    .with_context(|| format!("{kernel}: calibrating on guests"))?;
    let (first, second) = (&out.vms[0].progress, &out.vms[1].progress);
    let second_start = compute_start(second).context("the second guest reported no progress")?;
    let from = compute_start(first)
        .context("the first guest reported no progress")?
        .max(out.controller_start_s);
    let per_iteration = barriers(kernel).max(1) as f64;
    let alone = phase_rates_in(first, from, second_start)
        .and_then(|v| v.first().copied())
        .context("no alone window: the guests came up too far apart")?;
    let (pfrom, pto) = common_window(&[first, second], out.controller_start_s)?;
    let mut pair = Vec::new();
    for r in [first, second] {
        pair.extend(phase_rates_in(r, pfrom, pto).context("no side-by-side window")?);
    }
    let pair = pair.iter().sum::<f64>() / pair.len().max(1) as f64;
    Ok((alone / per_iteration, pair / per_iteration))
}

/// The bundled kernel's command line for a coscheduled VM: `seconds` of measured work after
/// `START_DELAY_MS`.
pub fn npb_argv(
    kernel: &str,
    threads: usize,
    instances: usize,
    seconds: f64,
) -> Result<Vec<String>> {
    npb_argv_delayed(kernel, threads, instances, seconds, START_DELAY_MS)
}

fn npb_argv_delayed(
    kernel: &str,
    threads: usize,
    instances: usize,
    seconds: f64,
    start_delay_ms: u64,
) -> Result<Vec<String>> {
    Ok(vec![
        paths::npb_bin()?.display().to_string(),
        kernel.to_string(),
        "--threads".into(),
        threads.to_string(),
        "--instances".into(),
        instances.to_string(),
        "--seconds".into(),
        format!("{seconds}"),
        "--start-delay-ms".into(),
        start_delay_ms.to_string(),
        "--json".into(),
    ])
}

/// How to coschedule bundled-kernel workloads of `seconds` (and their start delay) under
/// `policy`: the run ends when the workloads exit; the rest is `run`'s defaults.
pub fn options(
    policy: Policy,
    slice_ms: f64,
    seconds: f64,
    watchdog: Option<WatchdogCmd>,
) -> Params {
    Params {
        policy,
        slice_ms,
        duration: seconds + GUEST_START_DELAY_MS as f64 / 1e3 + 5.0,
        cpus: Vec::new(),
        regroup_s: 5.0,
        t: preheat_group::DEFAULT_T,
        group_method: preheat_group::GroupMethod::default(),
        reset_after_ms: 500,
        noise_floor: None,
        journal: None,
        watchdog,
    }
}

/// The summary JSON line of one npb run.
fn summary_of(stdout: &str) -> Option<serde_json::Value> {
    stdout
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())
}

fn summary_wall(stdout: &str) -> Option<f64> {
    summary_of(stdout)?["wall_s"].as_f64()
}

/// Iterations per second of each instance of one npb run, from its JSON summary.
pub fn instance_rates(stdout: &str) -> Result<Vec<f64>> {
    let v = summary_of(stdout).context("the workload printed no JSON summary")?;
    let wall = v["wall_s"].as_f64().context("summary without wall_s")?;
    let instances = v["instances"]
        .as_u64()
        .context("summary without instances")? as usize;
    let mut iters = vec![u64::MAX; instances];
    for t in v["per_thread"]
        .as_array()
        .context("summary without per_thread")?
    {
        let i = t["instance"].as_u64().unwrap_or(0) as usize;
        let n = t["iterations"].as_u64().unwrap_or(0);
        if i < instances {
            iters[i] = iters[i].min(n);
        }
    }
    if wall <= 0.0 {
        bail!("the workload ran for no time");
    }
    Ok(iters
        .iter()
        .map(|&n| if n == u64::MAX { 0.0 } else { n as f64 / wall })
        .collect())
}

/// Barriers per iteration of a bundled kernel (0 for a name it does not know).
pub(crate) fn barriers(kernel: &str) -> u32 {
    kernel_of(kernel).map_or(0, Kernel::barriers_per_iteration)
}

/// The bundled kernel of this name.
fn kernel_of(name: &str) -> Option<Kernel> {
    Kernel::ALL.into_iter().find(|k| k.name() == name)
}

/// Seconds of each thread-group calibration run (no coscheduler to wait for: no start delay).
/// An iteration of the bundled kernels takes 1.3–3.4 ms on this machine kind (measured), so a
/// run completes about 300 or more.
const CALIBRATION_S: f64 = 1.0;

/// Iterations per second of `copies` processes of one instance of `threads` threads each,
/// started together, [`CALIBRATION_S`] of work, copy k pinned to CPUs k·threads ..
/// (k+1)·threads − 1 (no coscheduler). Pinning keeps the scheduler's placement out of the
/// measurement: two copies on their own CPUs differ from one alone only by what they share
/// (caches, memory).
fn rates_of_copies(kernel: &str, threads: usize, copies: usize) -> Result<Vec<f64>> {
    let argv = npb_argv_delayed(kernel, threads, 1, CALIBRATION_S, 0)?;
    let mut children = Vec::new();
    for k in 0..copies {
        let cpus: Vec<usize> = (k * threads..(k + 1) * threads).collect();
        let mut cmd = std::process::Command::new(&argv[0]);
        cmd.args(&argv[1..])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        children.push(
            preheat_launch::launch::spawn_pinned(&mut cmd, &cpus)
                .with_context(|| format!("running {}", argv[0]))?,
        );
    }
    let mut rates = Vec::new();
    for c in children {
        let out = c.wait_with_output()?;
        if !out.status.success() {
            bail!(
                "{} failed: {}",
                argv[0],
                String::from_utf8_lossy(&out.stderr)
            );
        }
        rates.extend(instance_rates(&String::from_utf8_lossy(&out.stdout))?);
    }
    Ok(rates)
}

/// One thread-group calibration: an instance of n/2 threads alone, then two side by side (the
/// mean of their rates).
fn threads_alone_and_pair(kernel: &str, cpus: usize) -> Result<(f64, f64)> {
    let alone = rates_of_copies(kernel, cpus / 2, 1)?
        .first()
        .copied()
        .unwrap_or(0.0);
    let rs = rates_of_copies(kernel, cpus / 2, 2)?;
    let pair = rs.iter().sum::<f64>() / rs.len().max(1) as f64;
    Ok((alone, pair))
}

/// What the simulator needs to know of a kernel on this machine (measured, median of the
/// calibration runs): the iteration time of an instance of n/2 threads alone on its CPUs, and
/// the contention: how much slower each of two such instances (two processes, or two guests, as
/// VM1 and VM2 are, each on its half of the CPUs) runs when both compute at once on all n CPUs
/// (alone rate / pair rate − 1).
#[derive(Debug, Clone, Serialize)]
pub struct Calibration {
    pub kernel: String,
    pub alone_iteration_us: f64,
    pub contention: f64,
    pub runs: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(t: f64, t_ms: u64, phases: u64) -> (f64, Progress) {
        (
            t,
            Progress {
                t_ms,
                phases: vec![phases],
            },
        )
    }

    #[test]
    fn instance_rates_take_each_instances_slowest_thread() {
        let out = "starting\n{\"wall_s\": 2.0, \"instances\": 2, \"per_thread\": [\
            {\"instance\": 0, \"iterations\": 10}, {\"instance\": 0, \"iterations\": 8}, \
            {\"instance\": 1, \"iterations\": 4}]}\n";
        assert_eq!(instance_rates(out).unwrap(), vec![4.0, 2.0]);
        assert!(instance_rates("no summary").is_err());
    }

    #[test]
    fn kernels_by_their_command_line_names() {
        assert_eq!(kernel_of("cg"), Some(Kernel::Cg));
        assert_eq!(kernel_of("CG"), None);
        assert_eq!(barriers("nope"), 0);
        assert!(VmKind::Guests.check_kernel("ep").is_err());
        assert!(VmKind::ThreadGroups.check_kernel("ep").is_ok());
        assert!(VmKind::Guests.check_kernel("nope").is_err());
    }

    /// Late console lines do not move a report: its place is its guest time after the start
    /// the earliest report implies; the window is the one every guest computed in.
    #[test]
    fn guest_rates_over_the_common_window() {
        // Guest A starts at 10 s, reports every 0.5 s at 1000 phases/s, one line 0.8 s late.
        let a: Vec<(f64, Progress)> = (1..=10)
            .map(|k| {
                let late = if k == 3 { 0.8 } else { 0.0 };
                at(10.0 + 0.5 * k as f64 + late, 500 * k, 500 * k)
            })
            .collect();
        // Guest B starts at 11 s at 400 phases/s, for 3 s.
        let b: Vec<(f64, Progress)> = (1..=6)
            .map(|k| at(11.0 + 0.5 * k as f64, 500 * k, 200 * k))
            .collect();
        assert_eq!(compute_start(&a), Some(10.0));
        let (from, to) = common_window(&[&a, &b], 9.0).unwrap();
        assert_eq!((from, to), (11.0, 14.0));
        assert_eq!(phase_rates_in(&a, from, to), Some(vec![1000.0]));
        assert_eq!(phase_rates_in(&b, from, to), Some(vec![400.0]));
        // The controller started later than both: the window follows it.
        assert_eq!(common_window(&[&a, &b], 12.0).unwrap().0, 12.0);
        assert!(common_window(&[&a, &b], 20.0).is_err());
        assert!(phase_rates_in(&b, 13.9, 14.0).is_none());
    }

    #[test]
    fn both_kinds_build_the_same_shape() {
        for kind in [VmKind::ThreadGroups, VmKind::Guests] {
            let h = kind.host_of("mg", Scenario::Double, 2, 3.0);
            let Ok(h) = h else { continue }; // thread groups need the npb binary's path
            assert_eq!(h.vms.len(), 2);
            assert_eq!((h.vms[0].vcpus, h.vms[1].vcpus), (2, 1));
            assert_eq!(h.vms[0].sets, vec![vec![0], vec![1]]);
            if kind == VmKind::Guests {
                let g = h.vms[0].guest.as_ref().unwrap();
                assert_eq!((g.threads, g.instances), (Some(2), Some(2)));
                assert!(h.validate(2).is_ok());
            }
        }
        assert!(VmKind::Guests
            .host_of("mg", Scenario::Quad, 2, 3.0)
            .is_err());
    }
}
