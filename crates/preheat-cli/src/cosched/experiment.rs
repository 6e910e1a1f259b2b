//! `preheat cosched experiment`: the options and the table (the experiment is
//! `preheat_cosched_run::experiment`).

use anyhow::{Context, Result};
use preheat_cosched_run::experiment::{self, ExperimentSpec, Results};
use preheat_cosim::scenario::{Policy, Scenario};

use crate::progress::Bars;

#[derive(clap::Args, Debug)]
pub struct ExperimentArgs {
    /// Kernels (mg, cg, is, ep).
    #[arg(long, value_delimiter = ',', default_value = "mg,cg,is,ep")]
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
        kernels: a.kernels.clone(),
        scenarios: a.scenarios.clone(),
        policies: a.policies.clone(),
        reps: a.reps,
        seconds: a.seconds,
        slice_ms: a.slice_ms,
        regroup_s: a.regroup_s,
        t: a.t,
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
        print!("{}", table(&results));
    }
    Ok(())
}

fn pct(v: f64) -> String {
    format!("{:+.0}%", 100.0 * v)
}

fn table(r: &Results) -> String {
    let mut s = format!(
        "Partial coscheduling at this machine's size: {} CPUs, VM1 = {} vCPUs, VM2 = {} \
         (measured; {} repetitions per cell, {} s runs, {} ms slices; improvement over full \
         coscheduling = T_full / T_policy − 1, median [95% interval])\n",
        r.cpus, r.vm_vcpus[0], r.vm_vcpus[1], r.reps, r.seconds, r.slice_ms
    );
    s += &format!(
        "{:<6} {:<8} {:<15} {:>26} {:>10} {:>16} {:>9} {:>7}\n",
        "kernel", "scenario", "policy", "measured", "predicted", "simulated", "co-run", "idle"
    );
    for row in &r.rows {
        s += &format!(
            "{:<6} {:<8} {:<15} {:>26} {:>10} {:>16} {:>9} {:>7}\n",
            row.kernel,
            row.scenario.to_string(),
            row.policy.to_string(),
            format!(
                "{} [{}, {}] n={}",
                pct(row.improvement_over_full),
                pct(row.ci_lo),
                pct(row.ci_hi),
                row.n
            ),
            pct(row.predicted),
            match (row.simulated, row.simulated_within_ci) {
                (Some(v), Some(true)) => format!("{} (in CI)", pct(v)),
                (Some(v), _) => format!("{} (outside)", pct(v)),
                _ => "-".into(),
            },
            row.corun_fraction_median
                .map_or("-".into(), |v| format!("{:.0}%", 100.0 * v)),
            row.idle_cpu_share_median
                .map_or("-".into(), |v| format!("{:.0}%", 100.0 * v)),
        );
    }
    for c in &r.calibration {
        s += &format!(
            "calibration {}: iteration alone {:.0} µs, contention {:+.0}% when both instances \
             compute (measured, median of {} runs)\n",
            c.kernel,
            c.alone_iteration_us,
            100.0 * c.contention,
            c.runs
        );
    }
    s += "predicted = the setup's closed form (modeled: no contention, no costs); simulated = \
          preheat cosched simulate with the measured iteration time, contention and controller \
          cost (simulated). The paper (8 CPUs, \
          Gainestown): static partial close to +33% in quad, below it in double, up to +100% \
          in single for BT and EP; automatic lower (the paper's own figures).\n";
    for n in &r.notes {
        s += &format!("note: {n}\n");
    }
    s
}
