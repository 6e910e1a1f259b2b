//! Policies side by side, as the paper's Figures 6 and 7 show them: every policy's run time
//! against full coscheduling (the baseline), here with the closed-form expectation beside it.
//!
//! Every policy is simulated with the same seed (common random numbers), so differences come
//! from the policies, not from different draws. Full coscheduling is always simulated, as the
//! baseline, even when not asked for (then marked `baseline_only`).

use serde::{Deserialize, Serialize};

use crate::predict::predicted_improvement_with;
use crate::scenario::{Policy, Setup};
use crate::sim::{simulate, SimError, SimParams, SimResult};

/// One policy's outcome.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PolicyOutcome {
    pub policy: Policy,
    /// Simulated only as the baseline (not among the requested policies).
    pub baseline_only: bool,
    pub result: SimResult,
    /// T_full / T_policy − 1 (0.33 = 33% better than full), simulated; `None` when either run
    /// time is infinite (an instance completed no phase).
    pub improvement_over_full: Option<f64>,
    /// The closed-form ideal of [`crate::predict`] (with partial-auto's detection delay and
    /// overhead).
    pub predicted_improvement: f64,
}

/// Policies compared on one setup.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Comparison {
    /// Always "simulated": nothing here was measured on a machine.
    pub label: String,
    pub setup: Setup,
    pub params: SimParams,
    /// The baseline (full) first, then the other requested policies in order.
    pub results: Vec<PolicyOutcome>,
}

/// Simulate `policies` (duplicates dropped; full added as the baseline if missing).
pub fn compare(setup: &Setup, policies: &[Policy], p: &SimParams) -> Result<Comparison, SimError> {
    let mut order = vec![Policy::Full];
    for &q in policies {
        if !order.contains(&q) {
            order.push(q);
        }
    }
    let mut results = Vec::with_capacity(order.len());
    for &policy in &order {
        results.push((policy, simulate(setup, policy, p)?));
    }
    let t_full = results[0].1.total_run_time_s;
    let results = results
        .into_iter()
        .map(|(policy, result)| {
            let t = result.total_run_time_s;
            PolicyOutcome {
                policy,
                baseline_only: policy == Policy::Full && !policies.contains(&Policy::Full),
                improvement_over_full: (t.is_finite() && t_full.is_finite())
                    .then(|| t_full / t - 1.0),
                predicted_improvement: predicted_improvement_with(setup, policy, p),
                result,
            }
        })
        .collect();
    Ok(Comparison {
        label: "simulated".into(),
        setup: setup.clone(),
        params: p.clone(),
        results,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::Scenario;

    #[test]
    fn baseline_always_first() {
        let s = Setup::scenario(4, &[4, 2], Scenario::Double, true).unwrap();
        let p = SimParams {
            duration_s: 0.5,
            ..SimParams::default()
        };
        let c = compare(&s, &[Policy::PartialStatic, Policy::PartialStatic], &p).unwrap();
        assert_eq!(c.label, "simulated");
        assert_eq!(c.results.len(), 2);
        assert_eq!(c.results[0].policy, Policy::Full);
        assert!(c.results[0].baseline_only);
        assert_eq!(c.results[0].improvement_over_full, Some(0.0));
        assert!(!c.results[1].baseline_only);
        let c = compare(&s, &[Policy::PartialStatic, Policy::Full], &p).unwrap();
        assert!(!c.results[0].baseline_only);
        let json = serde_json::to_string(&c).unwrap();
        let back: Comparison = serde_json::from_str(&json).unwrap();
        assert_eq!(back.results.len(), 2);
        assert_eq!(back.setup, c.setup);
        assert_eq!(back.params, c.params);
    }
}
