//! The paper's experiments (§4, Figures 6/7) at this machine's size (`cosched experiment`),
//! measured, with the simulator's prediction for the same configuration beside them.
//!
//! Two "VMs" running bundled NPB-style programs (`preheat-npb`, barrier-synchronised kernels
//! whose waiters spin, as OpenMP ranks do), of either kind ([`VmKind`], `experiment_vms`):
//! thread groups, whose vCPUs are a process's threads, or real QEMU guests (`--guests`), whose
//! vCPUs are QEMU's vCPU threads, the kernel running inside. One loop for both: the kind says
//! what a scenario's VMs are, how the simulator is calibrated and what a run measured. VM1 has as many vCPUs
//! as the host has CPUs (n), VM2 half (n/2) and runs one instance on all of them. Scenarios for
//! VM1: single (one instance on n/2 vCPUs, the rest idle), double (two instances of n/2), quad
//! (four of n/4; needs n ≥ 4, so on 2 CPUs it is simulated only). Every cell (kernel ×
//! scenario × policy) runs `--reps` times, repetitions interleaved and shuffled so drift from
//! other tenants spreads over all cells. The metric is the paper's: run time of VM2's instance
//! plus the mean run time of VM1's instances, for a fixed job (a run time is the job divided by
//! the instance's measured iteration rate: a guest's from its barrier phases per second of guest
//! time); improvement over full = T_full / T_policy − 1,
//! paired within a repetition, summarised as the median with a 95% interval over repetitions.

use anyhow::{bail, Context, Result};
use preheat_cosim::compare::{compare, Comparison};
use preheat_cosim::scenario::{Policy, Scenario, Setup};
use preheat_cosim::sim::SimParams;
use preheat_cosim::workload::PhaseDist;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use serde::Serialize;

use crate::experiment_vms::{barriers, Measured};
pub use crate::experiment_vms::{instance_rates, npb_argv, options, Calibration, VmKind};
use crate::guest_floor::{self, FloorCalibration};
use crate::run::{self, Params};
use crate::watchdog::WatchdogCmd;
use preheat_launch::progress::Progress;
use preheat_model::stats::{median, summarize};

/// The experiment's parameters (`preheat cosched experiment`'s options).
#[derive(Debug, Clone)]
pub struct ExperimentSpec {
    /// Kernels (mg, cg, is, ep).
    pub kernels: Vec<String>,
    /// Scenarios (quad needs ≥ 4 CPUs; on fewer it is skipped with a note).
    pub scenarios: Vec<Scenario>,
    /// Policies measured (full is always measured: it is the baseline).
    pub policies: Vec<Policy>,
    /// Repetitions of every cell (interleaved and shuffled).
    pub reps: usize,
    /// What the VMs are: thread groups or QEMU guests.
    pub vms: VmKind,
    /// Calibration runs per kernel (alone and side by side).
    pub calibration_runs: usize,
    /// Seconds each run lasts.
    pub seconds: f64,
    /// Slice length, ms.
    pub slice_ms: f64,
    /// partial-auto: regroup period, s.
    pub regroup_s: f64,
    /// partial-auto: the grouping threshold.
    pub t: f64,
    /// partial-auto: how the sets are chosen from the tree.
    pub group_method: preheat_group::GroupMethod,
    /// partial-auto on guests: calibrate the guest kernel's own sharing per kernel and take it
    /// off the matrices, this many times over (`None`: the matrices as detected; thread-group
    /// VMs never have one).
    pub noise_margin: Option<f64>,
    /// Seed of the shuffle (and of the simulator).
    pub seed: u64,
    /// The runs' watchdog (`None`: none).
    pub watchdog: Option<WatchdogCmd>,
}

/// One run of one cell.
#[derive(Debug, Clone, Serialize)]
pub struct Cell {
    pub kernel: String,
    pub scenario: Scenario,
    pub policy: Policy,
    pub rep: usize,
    /// Per instance: (vm, iterations per second).
    pub instance_rates: Vec<(usize, f64)>,
    /// Per VM: run time of the job, s (mean over its instances).
    pub vm_run_time_s: Vec<f64>,
    /// The paper's metric.
    pub total_run_time_s: f64,
    pub corun_fraction: Option<f64>,
    pub corun_lower: Option<f64>,
    pub idle_cpu_share: Option<f64>,
    pub planned_idle_share: f64,
    pub leak_share: f64,
    pub slice_us_p50: f64,
    pub slice_us_p99: f64,
    pub apply_us_p50: f64,
    /// Of which reading every vCPU thread's readiness, µs (median per slice).
    pub ready_us_p50: f64,
    /// partial-auto: each regroup (time since the controller started, the sets).
    pub regroups: Vec<preheat_cosched::control::Regroup>,
    /// Seconds from starting the programs (booting the guests) to the controller's first slice
    /// (the workloads start computing after a start delay).
    pub controller_start_s: f64,
    /// The measured window: when it began (seconds after the VMs were started) and how long it
    /// lasted (thread groups: the workloads' run; guests: while every guest computed).
    pub window_start_s: f64,
    pub window_s: f64,
    /// partial-auto: when the first regroup came, in seconds of the measured window
    /// (negative: before it began).
    pub first_regroup_s: Option<f64>,
    /// partial-auto: the last communication matrix of each VM (vCPU order; measured).
    pub matrices: Vec<Option<Vec<Vec<u64>>>>,
    /// Shares of the machine's CPU time during the run used by other processes (not this one
    /// or its workloads) and stolen by the hypervisor (measured, `/proc/stat`); `None` where
    /// unreadable.
    pub others_share: Option<f64>,
    pub steal_share: Option<f64>,
    pub notes: Vec<String>,
}

/// A run during which other processes used more than this share of the machine's CPU time, or
/// the hypervisor stole more, is flagged: its times say as much about that load as about the
/// policy (a `--quick` run beside two busy processes read plain Linux −27…−91% against full).
pub const FOREIGN_LOAD_FLAG: f64 = 0.05;

impl Cell {
    /// Whether the run overlapped load from outside ([`FOREIGN_LOAD_FLAG`]).
    pub fn foreign_load(&self) -> bool {
        self.others_share.unwrap_or(0.0) > FOREIGN_LOAD_FLAG
            || self.steal_share.unwrap_or(0.0) > FOREIGN_LOAD_FLAG
    }
}

/// Per kernel × scenario × policy: the improvement over full.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub kernel: String,
    pub scenario: Scenario,
    pub policy: Policy,
    pub n: usize,
    /// Measured: median over repetitions and its 95% interval.
    pub improvement_over_full: f64,
    pub ci_lo: f64,
    pub ci_hi: f64,
    /// The setup's closed-form prediction (the paper: 33% double/quad, up to 100% single).
    pub predicted: f64,
    /// The simulator, same configuration, measured phase time and switch cost.
    pub simulated: Option<f64>,
    /// Whether the simulated value lies within the measured interval.
    pub simulated_within_ci: Option<bool>,
    /// Medians over the row's runs: the co-run fraction of its multi-vCPU sets (`None`: it
    /// has none, e.g. partial-static in double), the same for full coscheduling (its
    /// baseline), the CPUs' idle share.
    pub corun_fraction_median: Option<f64>,
    pub full_corun_fraction_median: Option<f64>,
    pub idle_cpu_share_median: Option<f64>,
    /// Runs of this row or of its full-coscheduling baseline that overlapped load from outside
    /// ([`Cell::foreign_load`]).
    pub foreign_load_runs: usize,
}

/// The experiment's JSON.
#[derive(Debug, Serialize)]
pub struct Results {
    pub label: &'static str,
    /// What the VMs were.
    pub vms: VmKind,
    pub cpus: usize,
    pub vm_vcpus: Vec<usize>,
    pub seconds: f64,
    pub slice_ms: f64,
    pub reps: usize,
    /// partial-auto: regroup period (s) and grouping threshold.
    pub regroup_s: f64,
    pub t: f64,
    /// Per kernel, measured for the simulator: iteration time alone and contention.
    pub calibration: Vec<Calibration>,
    /// partial-auto on guests: per kernel, the guest kernel's own sharing (measured).
    pub noise_floors: Vec<FloorCalibration>,
    pub cells: Vec<Cell>,
    pub rows: Vec<Row>,
    pub notes: Vec<String>,
}

/// The kernels an experiment runs when none are named: all four, or with guests those with a
/// barrier (a guest's progress is counted in barrier phases).
pub fn default_kernels(guests: bool) -> Vec<String> {
    let all = ["mg", "cg", "is", "ep"];
    let n = if guests { 3 } else { 4 };
    all[..n].iter().map(|k| k.to_string()).collect()
}

/// Job size: iterations every instance must complete (run time = job / rate).
const JOB_ITERATIONS: f64 = 1000.0;

/// Run the experiment on this machine: calibrate every kernel, measure every cell `reps` times
/// in shuffled order (one step of `progress` per cell), and summarise. `say` hears what was
/// restored from a dead controller's journal.
pub fn run(e: &ExperimentSpec, progress: &dyn Progress, say: &dyn Fn(&str)) -> Result<Results> {
    let cpus = preheat_engine::os::online_cpus();
    if cpus < 2 || cpus % 2 == 1 {
        bail!("the experiment needs an even number of CPUs (VM2 has half of them); this machine has {cpus}");
    }
    for k in &e.kernels {
        e.vms.check_kernel(k)?;
    }
    if e.reps == 0 {
        bail!("--reps must be at least 1");
    }
    let mut policies = e.policies.clone();
    if !policies.contains(&Policy::Full) {
        policies.push(Policy::Full);
    }
    let mut notes = Vec::new();
    let mut scenarios = Vec::new();
    for &s in &e.scenarios {
        match e.vms.host_of("mg", s, cpus, e.seconds) {
            Ok(_) => scenarios.push(s),
            Err(err) => notes.push(format!("{s}: skipped: {err:#}")),
        }
    }
    let order = order_of(e, &scenarios, &policies);
    progress.start(order.len() as u64, "cosched");
    progress.label("calibrating");
    let mut calibration = Vec::new();
    for k in &e.kernels {
        let w = e.watchdog.as_ref();
        calibration.push(e.vms.calibrate(k, cpus, e.calibration_runs, w, say)?);
    }
    let noise_floors = noise_floors(e, &policies, progress)?;
    let mut cells = Vec::new();
    for (k, s, p, rep) in order {
        progress.label(&format!("{k} {s} {p} rep {}", rep + 1));
        let floor = noise_floors.iter().find(|f| f.kernel == k).map(|f| f.floor);
        let mut cell = measure_cell(e, cpus, (k.clone(), floor), s, p, rep, say)?;
        // A void run: an instance made no progress in the measured window, or too little to
        // measure (guests that came up too far apart, so one computed alone before the others
        // began, or the window they all computed in held under two of its progress reports):
        // run it once more.
        if let Some(why) = void_run(&cell) {
            let again = measure_cell(e, cpus, (k.clone(), floor), s, p, rep, say)?;
            let still = void_run(&again);
            notes.push(format!(
                "{k} {s} {p} repetition {}: {why}; run again{}",
                rep + 1,
                match &still {
                    Some(w) => format!(", and again void ({w}): no row for it in this repetition"),
                    None => String::new(),
                }
            ));
            cell = again;
        }
        cells.push(cell);
        progress.inc(1);
    }
    progress.finish();
    let loaded = cells.iter().filter(|c| c.foreign_load()).count();
    if loaded > 0 {
        notes.push(format!(
            "{loaded} of {} runs overlapped load from outside (other processes or the \
             hypervisor took more than {:.0}% of the machine's CPU time; measured): rows with \
             foreign_load_runs > 0 say as much about that load as about the policy",
            cells.len(),
            100.0 * FOREIGN_LOAD_FLAG
        ));
    }
    let rows = summarise(e, cpus, &scenarios, &policies, &calibration, &cells)?;
    Ok(Results {
        label: "measured",
        vms: e.vms,
        cpus,
        vm_vcpus: vec![cpus, cpus / 2],
        seconds: e.seconds,
        slice_ms: e.slice_ms,
        reps: e.reps,
        regroup_s: e.regroup_s,
        t: e.t,
        calibration,
        noise_floors,
        cells,
        rows,
        notes,
    })
}

/// partial-auto on guests with a margin: each kernel's noise floor, as many calibration boots
/// each as the simulator's calibration has (none otherwise).
fn noise_floors(
    e: &ExperimentSpec,
    policies: &[Policy],
    progress: &dyn Progress,
) -> Result<Vec<FloorCalibration>> {
    let (Some(margin), VmKind::Guests) = (e.noise_margin, e.vms) else {
        return Ok(Vec::new());
    };
    if !policies.contains(&Policy::PartialAuto) {
        return Ok(Vec::new());
    }
    let mut floors = Vec::new();
    for k in &e.kernels {
        progress.label(&format!("{k}: partial-auto's noise floor"));
        floors.push(guest_floor::calibrate(k, margin, e.calibration_runs)?);
    }
    Ok(floors)
}

/// Why `cell`'s run measured nothing for some instance (`None`: every instance progressed).
fn void_run(cell: &Cell) -> Option<String> {
    void_rates(&cell.instance_rates, cell.window_s, cell.controller_start_s)
}

/// [`void_run`] of a run's instance rates, measured window and controller start.
fn void_rates(rates: &[(usize, f64)], window_s: f64, controller_start_s: f64) -> Option<String> {
    let idle: Vec<usize> = rates
        .iter()
        .filter(|(_, r)| !(r.is_finite() && *r > 0.0))
        .map(|(vm, _)| *vm)
        .collect();
    (!idle.is_empty()).then(|| {
        format!(
            "an instance of VM {idle:?} made no measurable progress in the {window_s:.1} s \
             measured window (the controller started {controller_start_s:.1} s after the VMs)"
        )
    })
}

/// The cells (kernel, scenario, policy, repetition), every repetition shuffled on its own.
fn order_of(
    e: &ExperimentSpec,
    scenarios: &[Scenario],
    policies: &[Policy],
) -> Vec<(String, Scenario, Policy, usize)> {
    let mut order = Vec::new();
    let mut rng = rand::rngs::StdRng::seed_from_u64(e.seed);
    for rep in 0..e.reps {
        let mut round = Vec::new();
        for k in &e.kernels {
            for &s in scenarios {
                for &p in policies {
                    round.push((k.clone(), s, p, rep));
                }
            }
        }
        round.shuffle(&mut rng);
        order.extend(round);
    }
    order
}

/// One run of one cell, coscheduled and measured.
fn measure_cell(
    e: &ExperimentSpec,
    cpus: usize,
    (k, noise_floor): (String, Option<preheat_group::NoiseFloor>),
    s: Scenario,
    p: Policy,
    rep: usize,
    say: &dyn Fn(&str),
) -> Result<Cell> {
    let spec = e.vms.host_of(&k, s, cpus, e.seconds)?;
    let opts = Params {
        regroup_s: e.regroup_s,
        t: e.t,
        group_method: e.group_method,
        reset_after_ms: 400,
        noise_floor,
        ..options(p, e.slice_ms, e.seconds, e.watchdog.clone())
    };
    let before = preheat_engine::procstat::machine_use();
    let out = run::execute(&spec, &opts, false, say)
        .with_context(|| format!("{k} {s} {p} repetition {}", rep + 1))?;
    let load = before
        .zip(preheat_engine::procstat::machine_use())
        .and_then(|(b, a)| preheat_engine::procstat::foreign_load(&b, &a));
    let m = e
        .vms
        .measured(&k, &out)
        .with_context(|| format!("{k} {s} {p} repetition {}", rep + 1))?;
    let vm_run = vm_run_times(&m, out.vms.len());
    let r = &out.report;
    let mut cell = Cell {
        kernel: k,
        scenario: s,
        policy: p,
        rep,
        instance_rates: m.rates.clone(),
        total_run_time_s: vm_run.iter().sum(),
        vm_run_time_s: vm_run,
        corun_fraction: r.corun_fraction,
        corun_lower: r.corun_lower,
        idle_cpu_share: r.idle_cpu_share,
        planned_idle_share: r.planned_idle_share,
        leak_share: r.leak_share,
        slice_us_p50: r.slice_us_p50,
        slice_us_p99: r.slice_us_p99,
        apply_us_p50: r.apply_us_p50,
        ready_us_p50: r.ready_us_p50,
        regroups: r.regroups.clone(),
        controller_start_s: out.controller_start_s,
        window_start_s: m.window_start_s,
        window_s: m.window_s,
        first_regroup_s: r
            .regroups
            .first()
            .map(|g| g.at_s - (m.window_start_s - out.controller_start_s)),
        matrices: out.matrices.clone(),
        others_share: load.map(|l| l.0),
        steal_share: load.map(|l| l.1),
        notes: r.notes.clone(),
    };
    if let (true, Some((others, steal))) = (cell.foreign_load(), load) {
        cell.notes.push(format!(
            "foreign load: other processes used {:.0}% of the machine's CPU time and the \
             hypervisor stole {:.0}% during this run (measured)",
            100.0 * others,
            100.0 * steal
        ));
    }
    Ok(cell)
}

/// Per VM: the mean run time of its instances for the job ([`JOB_ITERATIONS`] at each one's
/// measured rate; infinite for an instance that made no progress).
fn vm_run_times(m: &Measured, vms: usize) -> Vec<f64> {
    (0..vms)
        .map(|vi| {
            let times: Vec<f64> = m
                .rates
                .iter()
                .filter(|(v, _)| *v == vi)
                .map(|&(_, r)| {
                    if r > 0.0 {
                        JOB_ITERATIONS / r
                    } else {
                        f64::INFINITY
                    }
                })
                .collect();
            times.iter().sum::<f64>() / times.len().max(1) as f64
        })
        .collect()
}

fn summarise(
    e: &ExperimentSpec,
    cpus: usize,
    scenarios: &[Scenario],
    policies: &[Policy],
    calibration: &[Calibration],
    cells: &[Cell],
) -> Result<Vec<Row>> {
    let mut rows = Vec::new();
    for k in &e.kernels {
        let Some(cal) = calibration.iter().find(|c| &c.kernel == k) else {
            continue;
        };
        for &s in scenarios {
            // The simulator on the same configuration.
            let sync = barriers(k) > 0;
            let setup = Setup::scenario(cpus, &[cpus, cpus / 2], s, sync)
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            let params = sim_params(e, k, s, cal, cells);
            let sim = compare(&setup, policies, &params).ok();
            for &p in policies {
                if p == Policy::Full {
                    continue;
                }
                if let Some(row) = row_of(e, (k, s, p), &setup, sim.as_ref(), cells) {
                    rows.push(row);
                }
            }
        }
    }
    Ok(rows)
}

/// The simulator's parameters for kernel `k` in scenario `s`: the measured iteration time,
/// contention, controller cost and (partial-auto) detection delay.
fn sim_params(
    e: &ExperimentSpec,
    k: &str,
    s: Scenario,
    cal: &Calibration,
    cells: &[Cell],
) -> SimParams {
    let switch_us = median(
        &cells
            .iter()
            .filter(|c| c.policy != Policy::None)
            .map(|c| c.apply_us_p50)
            .collect::<Vec<_>>(),
    )
    .unwrap_or(5.0);
    // partial-auto: the simulated detection delay is the measured one (the first
    // regroup, in time of the workloads' run), not the nominal period.
    let detect_s = median(
        &cells
            .iter()
            .filter(|c| c.kernel == k && c.scenario == s && c.policy == Policy::PartialAuto)
            .filter_map(|c| c.first_regroup_s)
            .collect::<Vec<_>>(),
    )
    .unwrap_or(e.regroup_s)
    .max(0.0);
    SimParams {
        slice_us: e.slice_ms * 1e3,
        switch_us,
        phase: PhaseDist::Fixed {
            us: cal.alone_iteration_us / barriers(k).max(1) as f64,
        },
        contention: cal.contention,
        // The measured window (thread groups: --seconds; guests: while all computed).
        duration_s: median(
            &cells
                .iter()
                .filter(|c| c.kernel == k && c.scenario == s && c.window_s > 0.0)
                .map(|c| c.window_s)
                .collect::<Vec<_>>(),
        )
        .unwrap_or(e.seconds),
        detect_s,
        seed: e.seed,
        ..SimParams::default()
    }
}

/// The row of one (kernel, scenario, policy): the improvement over full paired by repetition,
/// beside the prediction and the simulator (`None`: no repetition measured both).
fn row_of(
    e: &ExperimentSpec,
    (k, s, p): (&str, Scenario, Policy),
    setup: &Setup,
    sim: Option<&Comparison>,
    cells: &[Cell],
) -> Option<Row> {
    let cell = |p: Policy, rep: usize| {
        cells
            .iter()
            .find(|c| c.kernel == k && c.scenario == s && c.policy == p && c.rep == rep)
    };
    let mut imp = Vec::new();
    for rep in 0..e.reps {
        if let (Some(f), Some(c)) = (cell(Policy::Full, rep), cell(p, rep)) {
            if c.total_run_time_s.is_finite() && c.total_run_time_s > 0.0 {
                imp.push(f.total_run_time_s / c.total_run_time_s - 1.0);
            }
        }
    }
    if imp.is_empty() {
        return None;
    }
    let sm = summarize(&imp);
    let simulated = sim.and_then(|c| {
        c.results
            .iter()
            .find(|r| r.policy == p)
            .and_then(|r| r.improvement_over_full)
    });
    let of_policy = |p: Policy, f: &dyn Fn(&Cell) -> Option<f64>| {
        median(
            &cells
                .iter()
                .filter(|c| c.kernel == k && c.scenario == s && c.policy == p)
                .filter_map(f)
                .collect::<Vec<_>>(),
        )
    };
    Some(Row {
        kernel: k.to_string(),
        scenario: s,
        policy: p,
        n: imp.len(),
        improvement_over_full: sm.p50,
        ci_lo: sm.p50_lo,
        ci_hi: sm.p50_hi,
        predicted: preheat_cosim::predict::predicted_improvement(setup, p),
        simulated,
        simulated_within_ci: simulated.map(|v| v >= sm.p50_lo && v <= sm.p50_hi),
        corun_fraction_median: of_policy(p, &|c: &Cell| c.corun_fraction),
        full_corun_fraction_median: of_policy(Policy::Full, &|c: &Cell| c.corun_fraction),
        idle_cpu_share_median: of_policy(p, &|c: &Cell| c.idle_cpu_share),
        foreign_load_runs: cells
            .iter()
            .filter(|c| {
                c.kernel == k && c.scenario == s && (c.policy == p || c.policy == Policy::Full)
            })
            .filter(|c| c.foreign_load())
            .count(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_with_an_instance_that_made_no_progress_is_void() {
        assert_eq!(
            void_rates(&[(0, 210.0), (0, 190.5), (1, 150.0)], 2.5, 4.6),
            None
        );
        // Seen in a suite run: partial-auto, VM2's guest computed before the window began.
        let why = void_rates(&[(0, 223.5), (0, 211.8), (1, 0.0)], 2.16, 8.36).unwrap();
        assert!(
            why.contains("VM [1]") && why.contains("2.2 s") && why.contains("8.4 s"),
            "{why}"
        );
        assert!(void_rates(&[(0, f64::NAN)], 1.0, 1.0).is_some());
    }

    #[test]
    fn every_repetition_holds_every_cell_once() {
        let e = ExperimentSpec {
            kernels: vec!["mg".into(), "ep".into()],
            scenarios: vec![Scenario::Single, Scenario::Double],
            policies: vec![Policy::Full, Policy::None],
            reps: 3,
            seconds: 1.0,
            slice_ms: 10.0,
            regroup_s: 1.0,
            t: 1.5,
            group_method: preheat_group::GroupMethod::default(),
            noise_margin: None,
            seed: 1,
            vms: VmKind::ThreadGroups,
            calibration_runs: 1,
            watchdog: None,
        };
        let order = order_of(&e, &e.scenarios, &e.policies);
        assert_eq!(order.len(), 24);
        for rep in 0..3 {
            let round = &order[rep * 8..(rep + 1) * 8];
            assert!(round.iter().all(|c| c.3 == rep));
            let mut cells: Vec<String> = round.iter().map(|c| format!("{c:?}")).collect();
            cells.sort();
            cells.dedup();
            assert_eq!(cells.len(), 8);
        }
    }
}
