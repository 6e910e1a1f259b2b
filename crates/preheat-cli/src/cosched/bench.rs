//! `preheat bench cosched`: what the user-space coscheduler costs (goal ≥ 0.97).
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

use super::experiment;
use super::host::{HostSpec, VmSpec};
use super::run::{self};
use preheat_model::stats::summarize;

#[derive(Serialize)]
struct Results {
    label: &'static str,
    kernel: String,
    cpus: usize,
    seconds: f64,
    slice_ms: f64,
    reps: usize,
    /// Iterations per second per repetition.
    none_rates: Vec<f64>,
    full_rates: Vec<f64>,
    /// full / none per repetition.
    ratios: Vec<f64>,
    ratio_median: f64,
    ratio_min: f64,
    ratio_max: f64,
    goal: f64,
    /// The controller's cost per slice, µs (median over repetitions of each run's p50).
    apply_us_p50: f64,
}

pub fn run(kernel: &str, reps: usize, seconds: f64, slice_ms: f64, json: bool) -> Result<()> {
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
            threads: "npb-".into(),
            sets: vec![(0..cpus).collect()],
        }],
    };
    let mut order: Vec<(usize, Policy)> = (0..reps)
        .flat_map(|r| [(r, Policy::None), (r, Policy::Full)])
        .collect();
    order.shuffle(&mut rand::rngs::StdRng::seed_from_u64(7));
    let bar = crate::progress::bar(order.len() as u64, "cosched", json);
    let mut none = vec![f64::NAN; reps];
    let mut full = vec![f64::NAN; reps];
    let mut apply = Vec::new();
    for (r, p) in order {
        let opts = experiment::options(p, slice_ms, seconds);
        let out = run::execute(&spec, &opts, false)?;
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
        bar.inc(1);
    }
    bar.finish_and_clear();
    let ratios: Vec<f64> = full.iter().zip(&none).map(|(f, n)| f / n).collect();
    let s = summarize(&ratios);
    let res = Results {
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
    };
    if json {
        println!("{}", serde_json::to_string(&res)?);
    } else {
        println!(
            "coscheduler overhead ({} kernel, {} threads on {} CPUs, one set, {} ms slices, {} s \
             runs; measured, {} paired repetitions): useful work under the coscheduler / plain \
             Linux = {:.3} median [{:.3}-{:.3}] (goal >= {}); controller cost per slice p50 \
             {:.1} µs",
            res.kernel,
            cpus,
            cpus,
            slice_ms,
            seconds,
            reps,
            res.ratio_median,
            res.ratio_min,
            res.ratio_max,
            res.goal,
            res.apply_us_p50
        );
    }
    Ok(())
}
