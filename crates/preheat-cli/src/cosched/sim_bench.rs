//! `preheat bench cosim`: how fast the simulator of `preheat cosched simulate` runs — simulated
//! CPU-seconds per wall-clock second (goal ≥ 1000) on a large host: `--cpus` CPUs, VMs of
//! `--cpus` and `--cpus / 2` vCPUs, the quad scenario, default parameters (1 ms log-normal
//! phases, 10 ms slices, 20 s simulated), every policy. The simulated work is identical in every
//! repetition (same seed); the speed is measured on this machine.

use std::time::Instant;

use anyhow::{bail, Result};
use preheat_cosim::scenario::{Policy, Scenario, Setup};
use preheat_cosim::sim::{simulate, SimParams};
use serde::Serialize;

use preheat_model::stats::{summarize, Summary};

/// The speed goal, simulated CPU-seconds per wall second.
const GOAL: f64 = 1000.0;

#[derive(Serialize)]
struct PolicySpeed {
    policy: Policy,
    /// Simulated CPU-s per wall s, over the repetitions.
    speed: Summary,
    events_per_wall_s_p50: f64,
}

#[derive(Serialize)]
struct Report {
    label: &'static str,
    what: &'static str,
    cpus: usize,
    vm_vcpus: Vec<usize>,
    scenario: Scenario,
    params: SimParams,
    reps: usize,
    /// All policies of one repetition together: simulated CPU-s / wall s.
    speed: Summary,
    policies: Vec<PolicySpeed>,
    goal: f64,
    meets_goal: bool,
}

pub fn run(reps: usize, cpus: usize, json: bool) -> Result<()> {
    if reps == 0 {
        bail!("--reps must be at least 1");
    }
    let vms = [cpus, cpus / 2];
    let setup = Setup::scenario(cpus, &vms, Scenario::Quad, true)?;
    let p = SimParams::default();
    let mut total = Vec::with_capacity(reps);
    let mut per: Vec<Vec<(f64, f64)>> = vec![Vec::new(); Policy::ALL.len()];
    // One unrecorded round first (page faults, frequency ramp-up).
    for policy in Policy::ALL {
        simulate(&setup, policy, &p)?;
    }
    for rep in 0..reps {
        eprint!("\rbench cosim: repetition {}/{reps}   ", rep + 1);
        let (mut cpu_s, mut wall_s) = (0.0, 0.0);
        for (k, policy) in Policy::ALL.into_iter().enumerate() {
            let t0 = Instant::now();
            let r = simulate(&setup, policy, &p)?;
            let w = t0.elapsed().as_secs_f64();
            cpu_s += r.simulated_cpu_s;
            wall_s += w;
            per[k].push((r.simulated_cpu_s / w, r.events as f64 / w));
        }
        total.push(cpu_s / wall_s);
    }
    eprintln!();
    let speed = summarize(&total);
    let report = Report {
        label: "measured",
        what: "simulated CPU-seconds per wall-clock second of preheat cosched simulate",
        cpus,
        vm_vcpus: vms.to_vec(),
        scenario: Scenario::Quad,
        params: p.clone(),
        reps,
        speed,
        policies: Policy::ALL
            .into_iter()
            .zip(&per)
            .map(|(policy, xs)| PolicySpeed {
                policy,
                speed: summarize(&xs.iter().map(|x| x.0).collect::<Vec<_>>()),
                events_per_wall_s_p50: summarize(&xs.iter().map(|x| x.1).collect::<Vec<_>>()).p50,
            })
            .collect(),
        goal: GOAL,
        meets_goal: speed.p50 >= GOAL,
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    println!(
        "simulator speed — measured on this machine, {reps} repetitions{}: {cpus} CPUs, VMs of \
         {} and {} vCPUs, quad, {} s simulated per policy (seed {})",
        if reps < 5 {
            " (fewer than 5: no headline)"
        } else {
            ""
        },
        vms[0],
        vms[1],
        p.duration_s,
        p.seed
    );
    println!(
        "{:<16} {:>28} {:>16}",
        "policy", "CPU-s simulated / wall s", "events / wall s"
    );
    for ps in &report.policies {
        println!(
            "{:<16} {:>10.0} [{:.0}–{:.0}] {:>16.2e}",
            ps.policy.to_string(),
            ps.speed.p50,
            ps.speed.min,
            ps.speed.max,
            ps.events_per_wall_s_p50
        );
    }
    println!(
        "{:<16} {:>10.0} [{:.0}–{:.0}]   (median [min–max])",
        "all policies", speed.p50, speed.min, speed.max
    );
    println!(
        "goal: ≥ {GOAL:.0} simulated CPU-s per wall s (median): {}",
        if report.meets_goal { "met" } else { "NOT met" }
    );
    Ok(())
}
