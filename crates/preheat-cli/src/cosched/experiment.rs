//! `preheat cosched experiment`: the options and the table (the experiment is
//! `preheat_cosched_run::experiment`).

use anyhow::{Context, Result};
use preheat_cosched_run::experiment::{self, ExperimentSpec, VmKind};
use preheat_cosim::scenario::{Policy, Scenario};

use crate::progress::Bars;

#[derive(clap::Args, Debug)]
pub struct ExperimentArgs {
    /// Kernels (mg, cg, is, ep) [default: all four; with --guests mg,cg,is].
    #[arg(long, value_delimiter = ',')]
    pub kernels: Vec<String>,
    /// Scenarios (single, double, quad; quad needs ≥ 4 CPUs).
    #[arg(long, value_delimiter = ',', default_value = "single,double")]
    pub scenarios: Vec<Scenario>,
    /// Policies measured (full is always measured: it is the baseline).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "none,full,partial-static,partial-auto"
    )]
    pub policies: Vec<Policy>,
    /// Repetitions of every cell (interleaved and shuffled).
    #[arg(long, default_value_t = 5)]
    pub reps: usize,
    /// Seconds each run lasts (defaults: 4 kernels × 2 scenarios × 4 policies × 5 repetitions
    /// of about 8 s each, ~22 minutes with the calibration).
    #[arg(long, default_value_t = 5.0)]
    pub seconds: f64,
    /// Slice length, ms.
    #[arg(long, default_value_t = 10.0)]
    pub slice_ms: f64,
    /// partial-auto: regroup period, s (the paper: 5 s in minutes-long runs; shorter here so a
    /// run of --seconds sees several).
    #[arg(long, default_value_t = 1.5)]
    pub regroup_s: f64,
    /// partial-auto: the grouping threshold.
    #[arg(long, default_value_t = preheat_group::DEFAULT_T)]
    pub t: f64,
    /// partial-auto: how the sets are chosen (paper or modularity; see `preheat groups --help`).
    #[arg(long, default_value_t = preheat_group::GroupMethod::PaperSplit)]
    pub group_method: preheat_group::GroupMethod,
    /// Every VM a real QEMU guest (issue 22; `preheat guest`): VM1 with 2 vCPUs, VM2 with 1
    /// (on 2 CPUs), booted for every run, the kernel inside; the metric is the guests' own
    /// barrier phases per second (kernels mg, cg, is: ep has no barrier to count).
    #[arg(long)]
    pub guests: bool,
    /// partial-auto on guests: group the matrices as detected, without first taking off the
    /// guest kernel's own sharing (a noise floor calibrated per kernel by one boot).
    #[arg(long)]
    pub no_noise_floor: bool,
    /// Calibration runs per kernel (alone and side by side; guests: one boot each).
    #[arg(long, default_value_t = 3)]
    pub calibration_runs: usize,
    /// Seed of the shuffle (and of the simulator).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Also write the JSON object here.
    #[arg(long)]
    pub out: Option<std::path::PathBuf>,
}

pub fn run(a: &ExperimentArgs) -> Result<()> {
    let spec = ExperimentSpec {
        kernels: match (a.kernels.is_empty(), a.guests) {
            (false, _) => a.kernels.clone(),
            (true, guests) => experiment::default_kernels(guests),
        },
        scenarios: a.scenarios.clone(),
        policies: a.policies.clone(),
        reps: a.reps,
        vms: if a.guests {
            VmKind::Guests
        } else {
            VmKind::ThreadGroups
        },
        calibration_runs: a.calibration_runs,
        seconds: a.seconds,
        slice_ms: a.slice_ms,
        regroup_s: a.regroup_s,
        t: a.t,
        group_method: a.group_method,
        noise_margin: (!a.no_noise_floor).then_some(preheat_group::floor::DEFAULT_MARGIN),
        seed: a.seed,
        watchdog: Some(super::run::watchdog()),
    };
    let results = experiment::run(&spec, &Bars::new(a.json), &super::run::say)?;
    let json = serde_json::to_string(&results)?;
    if let Some(p) = &a.out {
        std::fs::write(p, &json).with_context(|| format!("writing {}", p.display()))?;
    }
    if a.json {
        println!("{json}");
    } else {
        print!(
            "{}",
            preheat_cosched_run::experiment_report::table(&results)
        );
    }
    Ok(())
}
