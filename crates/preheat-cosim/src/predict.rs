//! The closed-form ideal the simulator is checked against: fluid shares, perfect packing, no
//! costs.
//!
//! The paper's expectations (§5) come from this reasoning: under full coscheduling VM1 (host
//! size) and VM2 (half) alternate, so each gets half the time and half the host idles while VM2
//! runs; partial coscheduling packs a part of VM1 next to VM2. We compute it for any setup:
//!
//! 1. **Share of each set.** Run the [`Planner`] for [`FLUID_SLICES`] equal slices with the
//!    simulator's ready flags and count how often each set is scheduled. The planner's least
//!    attained service rule is periodic with a short period for these setups, and the count is
//!    a multiple of every period up to 12 (27 720 = lcm(1..12)), so the shares are exact for the
//!    paper's cases (e.g. 2/3 for every set of double and quad) and within 1/27 720 otherwise.
//! 2. **Rate of an instance** (fraction of full speed): the smallest share over its vCPUs — a
//!    barrier-synchronised instance advances no faster than its least-scheduled member, and an
//!    unsynchronised job ends with its slowest thread. Under `none` a vCPU's share is 1/k on a
//!    CPU with k working vCPUs (the simulator's placement). That is only a rough guide: the
//!    simulator adds what it ignores in both directions — spinning when members' turns do not
//!    overlap, and time gained when a vCPU waiting at a barrier yields its CPU to another VM.
//! 3. **Run time** of a VM ∝ mean over its instances of 1 / rate; the metric is the sum over
//!    VMs, and the improvement is T_full / T_policy − 1.
//!
//! `partial-auto`'s steady state is `partial-static`'s; [`predicted_improvement_with`] adds its
//! detection delay and sampler overhead from [`SimParams`]. Switch costs, barrier costs and phase
//! imbalance are not in the prediction: they are what the simulator adds.

use crate::plan::{PlanError, Planner};
use crate::scenario::{ready_of, sets_for, Policy, Setup};
use crate::sim::SimParams;

/// Slices the planner is run for to measure fluid shares (lcm(1..12)).
pub const FLUID_SLICES: usize = 27_720;

/// Steady-state speed of each instance under `policy` as a fraction of running alone (1.0),
/// with no costs.
pub fn ideal_rates(setup: &Setup, policy: Policy) -> Result<Vec<f64>, PlanError> {
    let nv = setup.total_vcpus();
    let mut vcpu_share = vec![0.0; nv];
    match policy {
        Policy::None => {
            let working: Vec<usize> = setup
                .instance_of()
                .iter()
                .enumerate()
                .filter_map(|(v, i)| i.map(|_| v))
                .collect();
            let cpus = setup.cpus.max(1);
            let mut per_cpu = vec![0usize; cpus];
            for k in 0..working.len() {
                per_cpu[k % cpus] += 1;
            }
            for (k, &v) in working.iter().enumerate() {
                vcpu_share[v] = 1.0 / per_cpu[k % cpus] as f64;
            }
        }
        _ => {
            let steady = if policy == Policy::PartialAuto {
                Policy::PartialStatic
            } else {
                policy
            };
            let mut planner = Planner::new(setup.cpus, sets_for(setup, steady))?;
            let ready = ready_of(setup, planner.sets());
            let mut count = vec![0usize; planner.sets().len()];
            for _ in 0..FLUID_SLICES {
                let slice = planner.next_slice(&ready);
                for &s in &slice.sets {
                    count[s] += 1;
                }
                planner.charge(&slice, 1);
            }
            for (s, set) in planner.sets().iter().enumerate() {
                for &v in &set.members {
                    vcpu_share[v] = count[s] as f64 / FLUID_SLICES as f64;
                }
            }
        }
    }
    Ok(setup
        .instances
        .iter()
        .map(|i| {
            i.vcpus
                .iter()
                .map(|&v| vcpu_share[v])
                .fold(f64::INFINITY, f64::min)
        })
        .collect())
}

/// The paper's metric for given instance rates: Σ over VMs of the mean of 1 / rate over its
/// instances (in units of one job's run time alone).
pub fn metric(setup: &Setup, rates: &[f64]) -> f64 {
    (0..setup.vm_vcpus.len())
        .map(|vm| {
            let t: Vec<f64> = setup
                .instances
                .iter()
                .zip(rates)
                .filter(|(i, _)| i.vm == vm)
                .map(|(_, &r)| 1.0 / r)
                .collect();
            t.iter().sum::<f64>() / t.len().max(1) as f64
        })
        .sum()
}

/// The ideal improvement of `policy` over full coscheduling, T_full / T_policy − 1 (0.33 =
/// 33%), in steady state (partial-auto = partial-static). NaN when the setup cannot be planned.
pub fn predicted_improvement(setup: &Setup, policy: Policy) -> f64 {
    let t = |p| ideal_rates(setup, p).map(|r| metric(setup, &r));
    match (t(Policy::Full), t(policy)) {
        (Ok(full), Ok(other)) => full / other - 1.0,
        _ => f64::NAN,
    }
}

/// [`predicted_improvement`] with partial-auto's detection delay (full coscheduling until the
/// first slice boundary at or after `detect_s`) and sampler overhead over `duration_s`.
pub fn predicted_improvement_with(setup: &Setup, policy: Policy, p: &SimParams) -> f64 {
    if policy != Policy::PartialAuto {
        return predicted_improvement(setup, policy);
    }
    let (Ok(full), Ok(stat)) = (
        ideal_rates(setup, Policy::Full),
        ideal_rates(setup, Policy::PartialStatic),
    ) else {
        return f64::NAN;
    };
    let dur = p.duration_s;
    let slice_s = p.slice_us / 1e6;
    let before = ((p.detect_s / slice_s).ceil() * slice_s).min(dur);
    let auto: Vec<f64> = full
        .iter()
        .zip(&stat)
        .map(|(f, s)| (f * before + s * (dur - before)) / dur / (1.0 + p.auto_overhead))
        .collect();
    metric(setup, &full) / metric(setup, &auto) - 1.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::Scenario;

    #[test]
    fn paper_expectations() {
        let s = |sc| Setup::scenario(8, &[8, 4], sc, true).unwrap();
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
        assert!(close(
            predicted_improvement(&s(Scenario::Double), Policy::PartialStatic),
            1.0 / 3.0
        ));
        assert!(close(
            predicted_improvement(&s(Scenario::Quad), Policy::PartialStatic),
            1.0 / 3.0
        ));
        assert!(close(
            predicted_improvement(&s(Scenario::Single), Policy::PartialStatic),
            1.0
        ));
        assert_eq!(
            predicted_improvement(&s(Scenario::Double), Policy::Full),
            0.0
        );
        // No coscheduling, double: half of VM0 shares CPUs with VM1 (rate 1/2), the other
        // half runs alone: T = (2 + 1)/2 + 2 = 3.5 against 4.
        assert!(close(
            predicted_improvement(&s(Scenario::Double), Policy::None),
            4.0 / 3.5 - 1.0
        ));
    }

    #[test]
    fn auto_pays_detection_and_overhead() {
        let s = Setup::scenario(8, &[8, 4], Scenario::Double, true).unwrap();
        let p = SimParams {
            duration_s: 20.0,
            detect_s: 5.0,
            auto_overhead: 0.0,
            ..SimParams::default()
        };
        // Rates: 1/2 for 5 s, 2/3 for 15 s: 0.625 against 0.5.
        let x = predicted_improvement_with(&s, Policy::PartialAuto, &p);
        assert!((x - 0.25).abs() < 1e-9, "{x}");
        let slower = SimParams {
            auto_overhead: 0.02,
            ..p.clone()
        };
        assert!(predicted_improvement_with(&s, Policy::PartialAuto, &slower) < x);
        assert!(
            (predicted_improvement(&s, Policy::PartialAuto) - 1.0 / 3.0).abs() < 1e-9,
            "steady state = static"
        );
    }
}
