//! `preheat cosched simulate`: the paper's experiment on a host of any size, simulated (the
//! model and its limits are in `preheat-cosim`). Every figure it prints is simulated.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use preheat_cosim::compare::compare;
use preheat_cosim::scenario::{Policy, Scenario, Setup};
use preheat_cosim::sim::{SimParams, SimResult};
use preheat_cosim::workload::PhaseDist;
use serde::Serialize;

pub const LONG_ABOUT: &str = "Simulate the experiment of Busse et al., *Partial Coscheduling of \
Virtual Machines* (SAC'15, §4–5), on a host of any size: deterministic for a seed, and every \
figure printed is SIMULATED, nothing is measured.\n\n\
Setup (the paper's): VMs given by --vm (default: one as large as the host and one half of it); \
the first VM runs the --scenario load — single: one instance on half its vCPUs (the other half \
idle), double: two instances on its halves, quad: four on its quarters — and every other VM runs \
one instance on all its vCPUs.\n\n\
Model: every thread of an instance computes a phase (--phase-us, log-normal with --phase-cv, or \
measured times from --phases), then waits at the instance's barrier (not with --no-sync); a \
waiting vCPU that is scheduled spins. Policies: full (one set per VM, idle vCPUs included: they \
reserve CPUs), partial-static (one set per instance), partial-auto (full until the first \
regrouping at --detect-s, then per instance, every phase --auto-overhead slower for the SPCD \
sampler), none (a model of plain Linux: vCPUs placed round-robin on CPUs, round-robin per CPU, \
a vCPU at a barrier yields to another on its CPU). The coscheduling policies run in slices of \
--slice-ms planned by the planner the real coscheduler uses (least attained service first, \
first fit), with --switch-us charged to a CPU whose vCPU changes. Not modelled: caches, memory \
bandwidth, SMT, guest housekeeping, NUMA — the paper's explanations for results below \
expectation.\n\n\
Metric (the paper's): a job is --job-phases phases; a VM's run time is the mean over its \
instances; the total is the sum over VMs; improvement = T_full / T_policy − 1. The paper expects \
+33% for double and quad and up to +100% for single (under full coscheduling half the host idles \
while the smaller VM runs); the closed-form prediction (fluid shares, no costs) is printed \
beside every simulated improvement. Full is always simulated as the baseline.";

/// (`LONG_ABOUT` is attached where the subcommand is declared, in `cosched/mod.rs`.)
#[derive(clap::Args)]
pub struct SimulateArgs {
    /// Host CPUs.
    #[arg(long, default_value_t = 8)]
    cpus: usize,
    /// vCPUs of one VM; repeat (or comma-separate) for more VMs; the first gets the scenario
    /// [default: --cpus, then --cpus / 2].
    #[arg(long = "vm", value_name = "VCPUS", value_delimiter = ',')]
    vms: Vec<usize>,
    /// The first VM's load: single, double or quad.
    #[arg(long)]
    scenario: String,
    /// Policies: none, full, partial-static, partial-auto (repeat or comma-separate).
    #[arg(
        long = "policy",
        value_name = "POLICY",
        value_delimiter = ',',
        default_value = "full,partial-static,partial-auto"
    )]
    policies: Vec<String>,
    #[arg(long, default_value_t = SimParams::default().seed)]
    seed: u64,
    /// Coscheduling slice, ms.
    #[arg(long, default_value_t = SimParams::default().slice_us / 1e3)]
    slice_ms: f64,
    /// Cost charged to a CPU whose vCPU changes, µs.
    #[arg(long, default_value_t = SimParams::default().switch_us)]
    switch_us: f64,
    /// Extra time of a barrier release, µs.
    #[arg(long, default_value_t = SimParams::default().barrier_us)]
    barrier_us: f64,
    /// Mean compute time of a thread between two barriers, µs.
    #[arg(long, default_value_t = 1000.0)]
    phase_us: f64,
    /// Coefficient of variation of the phase times (0: all equal).
    #[arg(long, default_value_t = 0.1)]
    phase_cv: f64,
    /// Measured phase times: a JSON array of µs, drawn uniformly (instead of --phase-us/-cv).
    #[arg(long, value_name = "FILE", conflicts_with_all = ["phase_us", "phase_cv"])]
    phases: Option<PathBuf>,
    /// Simulated time, s.
    #[arg(long, default_value_t = SimParams::default().duration_s)]
    duration_s: f64,
    /// Phases in one job (run time = job phases / simulated phase rate).
    #[arg(long, default_value_t = SimParams::default().job_phases)]
    job_phases: u64,
    /// partial-auto: the first regrouping, s (the paper's daemon: every 5 s).
    #[arg(long, default_value_t = SimParams::default().detect_s)]
    detect_s: f64,
    /// partial-auto: fractional slowdown for the SPCD sampler.
    #[arg(long, default_value_t = SimParams::default().auto_overhead)]
    auto_overhead: f64,
    /// Slowdown of compute when every CPU computes at once (cache and memory contention;
    /// linear in the other CPUs computing). `preheat cosched experiment` measures it.
    #[arg(long, default_value_t = SimParams::default().contention)]
    contention: f64,
    /// none: the CFS model's slice, ms.
    #[arg(long, default_value_t = SimParams::default().cfs_slice_us / 1e3)]
    cfs_slice_ms: f64,
    /// Threads never wait for each other (EP-like kernels): no barriers.
    #[arg(long)]
    no_sync: bool,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

/// One policy in the `--json` object.
#[derive(Serialize)]
struct PolicyJson<'a> {
    baseline_only: bool,
    improvement_over_full: Option<f64>,
    predicted_improvement: f64,
    #[serde(flatten)]
    result: &'a SimResult,
}

/// The `--json` object.
#[derive(Serialize)]
struct Report<'a> {
    label: &'a str,
    setup: &'a Setup,
    params: &'a SimParams,
    policies: Vec<PolicyJson<'a>>,
}

fn read_phases(path: &Path) -> Result<Vec<f64>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading --phases {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| {
        format!(
            "--phases {}: expected a JSON array of phase times in µs",
            path.display()
        )
    })
}

fn params(a: &SimulateArgs) -> Result<SimParams> {
    let phase = match &a.phases {
        Some(path) => PhaseDist::Empirical {
            us: read_phases(path)?,
        },
        None => PhaseDist::mean_cv(a.phase_us, a.phase_cv),
    };
    Ok(SimParams {
        slice_us: a.slice_ms * 1e3,
        switch_us: a.switch_us,
        barrier_us: a.barrier_us,
        phase,
        duration_s: a.duration_s,
        job_phases: a.job_phases,
        detect_s: a.detect_s,
        auto_overhead: a.auto_overhead,
        cfs_slice_us: a.cfs_slice_ms * 1e3,
        contention: a.contention,
        seed: a.seed,
    })
}

pub fn run(a: &SimulateArgs) -> Result<()> {
    let scenario: Scenario = a.scenario.parse()?;
    let mut policies = Vec::new();
    for p in &a.policies {
        policies.push(p.parse::<Policy>()?);
    }
    if policies.is_empty() {
        bail!("no policy given");
    }
    let vms = if a.vms.is_empty() {
        vec![a.cpus, a.cpus / 2]
    } else {
        a.vms.clone()
    };
    let setup = Setup::scenario(a.cpus, &vms, scenario, !a.no_sync)?;
    let p = params(a)?;
    let c = compare(&setup, &policies, &p)?;
    if a.json {
        let report = Report {
            label: &c.label,
            setup: &c.setup,
            params: &c.params,
            policies: c
                .results
                .iter()
                .map(|o| PolicyJson {
                    baseline_only: o.baseline_only,
                    improvement_over_full: o.improvement_over_full,
                    predicted_improvement: o.predicted_improvement,
                    result: &o.result,
                })
                .collect(),
        };
        println!("{}", serde_json::to_string(&report)?);
        return Ok(());
    }
    print!("{}", preheat_cosim::render::render(&c, scenario));
    Ok(())
}
