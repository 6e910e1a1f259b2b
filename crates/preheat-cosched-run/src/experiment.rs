//! The paper's experiments (§4, Figures 6/7) at this machine's size (`cosched experiment`),
//! measured, with the simulator's prediction for the same configuration beside them.
//!
//! Two "VMs" whose vCPUs are threads of bundled NPB-style programs (`preheat-npb`,
//! barrier-synchronised kernels whose waiters spin, as OpenMP ranks do): VM1 has as many vCPUs
//! as the host has CPUs (n), VM2 half (n/2) and runs one instance on all of them. Scenarios for
//! VM1: single (one instance on n/2 vCPUs, the rest idle), double (two instances of n/2), quad
//! (four of n/4; needs n ≥ 4, so on 2 CPUs it is simulated only). Every cell (kernel ×
//! scenario × policy) runs `--reps` times, repetitions interleaved and shuffled so drift from
//! other tenants spreads over all cells. The metric is the paper's: run time of VM2's instance
//! plus the mean run time of VM1's instances, for a fixed job (a run time is the job divided by
//! the instance's measured iteration rate); improvement over full = T_full / T_policy − 1,
//! paired within a repetition, summarised as the median with a 95% interval over repetitions.

use anyhow::{bail, Context, Result};
use preheat_cosim::compare::{compare, Comparison};
use preheat_cosim::scenario::{Policy, Scenario, Setup};
use preheat_cosim::sim::SimParams;
use preheat_cosim::workload::PhaseDist;
use preheat_npb::Kernel;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use serde::Serialize;

use crate::host::{HostSpec, VmSpec};
use crate::run::{self, Params};
use crate::watchdog::WatchdogCmd;
use preheat_launch::paths;
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
    /// partial-auto: each regroup (time since the controller started, the sets).
    pub regroups: Vec<preheat_cosched::control::Regroup>,
    /// Seconds from starting the programs to the controller's first slice (the workloads
    /// start computing `START_DELAY_MS` after they start).
    pub controller_start_s: f64,
    /// partial-auto: when the first regroup came, in seconds of the workloads' measured run
    /// (negative: before they started computing).
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
    pub corun_fraction_median: Option<f64>,
    pub idle_cpu_share_median: Option<f64>,
    /// Runs of this row or of its full-coscheduling baseline that overlapped load from outside
    /// ([`Cell::foreign_load`]).
    pub foreign_load_runs: usize,
}

/// The experiment's JSON.
#[derive(Debug, Serialize)]
pub struct Results {
    pub label: &'static str,
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
    pub cells: Vec<Cell>,
    pub rows: Vec<Row>,
    pub notes: Vec<String>,
}

/// The workloads sleep this long after creating their threads, so the coscheduler (and for
/// partial-auto the reset of the matrix) is in place before the measured work begins.
const START_DELAY_MS: u64 = 1500;

/// Job size: iterations every instance must complete (run time = job / rate).
const JOB_ITERATIONS: f64 = 1000.0;

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

/// The two VMs of a scenario on `cpus` CPUs.
fn host_of(kernel: &str, scenario: Scenario, cpus: usize, seconds: f64) -> Result<HostSpec> {
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
            VmSpec {
                name: Some("vm1".into()),
                vcpus: cpus,
                command: npb_argv(kernel, threads, instances, seconds)?,
                pid: None,
                guest: None,
                threads: "npb-".into(),
                sets: vm1_sets,
            },
            VmSpec {
                name: Some("vm2".into()),
                vcpus: half,
                command: npb_argv(kernel, half, 1, seconds)?,
                pid: None,
                guest: None,
                threads: "npb-".into(),
                sets: vec![(0..half).collect()],
            },
        ],
    })
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
        duration: seconds + START_DELAY_MS as f64 / 1e3 + 5.0,
        cpus: Vec::new(),
        regroup_s: 5.0,
        t: preheat_group::DEFAULT_T,
        group_method: preheat_group::GroupMethod::default(),
        reset_after_ms: 500,
        journal: None,
        watchdog,
    }
}

/// Iterations per second of each instance of one npb run, from its JSON summary.
pub fn instance_rates(stdout: &str) -> Result<Vec<f64>> {
    let v: serde_json::Value = stdout
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())
        .context("the workload printed no JSON summary")?;
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
fn barriers(kernel: &str) -> u32 {
    kernel_of(kernel).map_or(0, Kernel::barriers_per_iteration)
}

/// The bundled kernel of this name.
fn kernel_of(name: &str) -> Option<Kernel> {
    Kernel::ALL.into_iter().find(|k| k.name() == name)
}

/// Seconds of each calibration run (no coscheduler to wait for: no start delay). An iteration
/// of the bundled kernels takes 1.3–3.4 ms on this machine kind (measured), so a run completes
/// about 300 or more.
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

/// What the simulator needs to know of a kernel on this machine (measured, median of 3
/// alternating runs): the iteration time of an instance of n/2 threads alone on its CPUs, and
/// the contention: how much slower each of two such instances (two processes, as VM1 and VM2
/// are, each pinned to its half of the CPUs) runs when both compute at once on all n CPUs
/// (alone rate / pair rate − 1).
#[derive(Debug, Clone, Serialize)]
pub struct Calibration {
    pub kernel: String,
    pub alone_iteration_us: f64,
    pub contention: f64,
    pub runs: usize,
}

fn calibrate(kernel: &str, cpus: usize) -> Result<Calibration> {
    let (mut alone, mut pair) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        if let Some(&r) = rates_of_copies(kernel, cpus / 2, 1)?.first() {
            alone.push(r);
        }
        let rs = rates_of_copies(kernel, cpus / 2, 2)?;
        if !rs.is_empty() {
            pair.push(rs.iter().sum::<f64>() / rs.len() as f64);
        }
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

/// Run the experiment on this machine: calibrate every kernel, measure every cell `reps` times
/// in shuffled order (one step of `progress` per cell), and summarise. `say` hears what was
/// restored from a dead controller's journal.
pub fn run(e: &ExperimentSpec, progress: &dyn Progress, say: &dyn Fn(&str)) -> Result<Results> {
    let cpus = preheat_engine::os::online_cpus();
    if cpus < 2 || cpus % 2 == 1 {
        bail!("the experiment needs an even number of CPUs (VM2 has half of them); this machine has {cpus}");
    }
    for k in &e.kernels {
        if kernel_of(k).is_none() {
            let known: Vec<&str> = Kernel::ALL.iter().map(|k| k.name()).collect();
            bail!("unknown kernel {k:?} ({})", known.join(", "));
        }
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
        match host_of("mg", s, cpus, e.seconds) {
            Ok(_) => scenarios.push(s),
            Err(err) => notes.push(format!("{s}: skipped: {err:#}")),
        }
    }
    let order = order_of(e, &scenarios, &policies);
    progress.start(order.len() as u64, "cosched");
    progress.label("calibrating");
    let mut calibration = Vec::new();
    for k in &e.kernels {
        calibration.push(calibrate(k, cpus)?);
    }
    let mut cells = Vec::new();
    for (k, s, p, rep) in order {
        progress.label(&format!("{k} {s} {p} rep {}", rep + 1));
        cells.push(measure_cell(e, cpus, k, s, p, rep, say)?);
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
        cpus,
        vm_vcpus: vec![cpus, cpus / 2],
        seconds: e.seconds,
        slice_ms: e.slice_ms,
        reps: e.reps,
        regroup_s: e.regroup_s,
        t: e.t,
        calibration,
        cells,
        rows,
        notes,
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
    k: String,
    s: Scenario,
    p: Policy,
    rep: usize,
    say: &dyn Fn(&str),
) -> Result<Cell> {
    let spec = host_of(&k, s, cpus, e.seconds)?;
    let opts = Params {
        regroup_s: e.regroup_s,
        t: e.t,
        group_method: e.group_method,
        reset_after_ms: 400,
        ..options(p, e.slice_ms, e.seconds, e.watchdog.clone())
    };
    let before = preheat_engine::procstat::machine_use();
    let out = run::execute(&spec, &opts, false, say)
        .with_context(|| format!("{k} {s} {p} repetition {}", rep + 1))?;
    let load = before
        .zip(preheat_engine::procstat::machine_use())
        .and_then(|(b, a)| preheat_engine::procstat::foreign_load(&b, &a));
    let mut instance_rates_v = Vec::new();
    let mut vm_run = Vec::new();
    for (vi, vm) in out.vms.iter().enumerate() {
        let rates =
            instance_rates(&vm.stdout).with_context(|| format!("{k} {s} {p}: {}", vm.name))?;
        let times: Vec<f64> = rates
            .iter()
            .map(|&r| {
                if r > 0.0 {
                    JOB_ITERATIONS / r
                } else {
                    f64::INFINITY
                }
            })
            .collect();
        vm_run.push(times.iter().sum::<f64>() / times.len().max(1) as f64);
        instance_rates_v.extend(rates.iter().map(|&r| (vi, r)));
    }
    let r = &out.report;
    let mut cell = Cell {
        kernel: k,
        scenario: s,
        policy: p,
        rep,
        instance_rates: instance_rates_v,
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
        regroups: r.regroups.clone(),
        controller_start_s: out.controller_start_s,
        first_regroup_s: r
            .regroups
            .first()
            .map(|g| g.at_s - (START_DELAY_MS as f64 / 1e3 - out.controller_start_s)),
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
        duration_s: e.seconds,
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
    let of = |f: &dyn Fn(&Cell) -> Option<f64>| {
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
        corun_fraction_median: of(&|c: &Cell| c.corun_fraction),
        idle_cpu_share_median: of(&|c: &Cell| c.idle_cpu_share),
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
            seed: 1,
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
