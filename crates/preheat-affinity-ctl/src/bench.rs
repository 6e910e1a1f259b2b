//! The interleaving controller's cost and accuracy, as ratios within
//! one run (`preheat affinity bench`).
//!
//! * Overhead: a bundled workload's work rate while the controller interleaves it with `BV_0`
//!   (run as a thread of the workload's process, so no address-space switch is counted; the
//!   same with `BV_0` as a process of its own is reported beside it)
//!   (negligible footprint: whatever is lost is the controller's and the switches' cost) against
//!   the same workload alone on the same CPU for the same CPU time. Pairs run back to back in
//!   alternating order; the median ratio over the repetitions with its range. Goal ≥ 0.98.
//! * Quantum accuracy: p99 of the achieved main-workload quanta against the requested 2 ms
//!   (goal: within 5%).

use anyhow::Result;
use serde::Serialize;

use crate::proc::WorkerCmd;
use crate::run::{self, Experiment, MainSpec, RunSpec};
use preheat_engine::workloads::Kind;
use preheat_launch::progress::Progress;

/// One benchmark: `reps` repetitions of three runs of `workload` (chase, stream or branchy) with
/// `ws_bytes` of working set, `cpu_ms` of CPU time each, interleaved every `quantum_ms`.
#[derive(Debug, Clone)]
pub struct BenchSpec {
    pub reps: usize,
    pub cpu_ms: u64,
    pub quantum_ms: f64,
    pub workload: String,
    pub ws_bytes: usize,
}

#[derive(Debug, Serialize)]
pub struct BenchResult {
    pub kind: &'static str,
    pub workload: String,
    pub reps: usize,
    pub cpu_ms: u64,
    pub quantum_ms: f64,
    pub mechanism: String,
    /// Interleaved with BV_0 (a thread of the workload's process) / alone, per repetition.
    pub overhead_ratios: Vec<f64>,
    /// Interleaved with BV_0 as a process of its own / alone: adds the cost of switching address
    /// spaces on this machine.
    pub process_vector_ratios: Vec<f64>,
    pub process_vector_median: f64,
    pub overhead_median: f64,
    pub overhead_min: f64,
    pub overhead_max: f64,
    pub overhead_goal: f64,
    /// Achieved main quanta p99 / requested, per interleaved run.
    pub quantum_p99_ratios: Vec<f64>,
    pub quantum_p99_ratio_median: f64,
    pub quantum_p50_ms_median: f64,
    pub quantum_goal: f64,
}

/// The median of the model's order statistics: the lower middle of an even sample, over the
/// finite values (NaN if there is none).
fn median(v: &[f64]) -> f64 {
    preheat_model::stats::median(v).unwrap_or(f64::NAN)
}

/// Measure the controller's overhead and quantum accuracy (see the module docs), reporting one
/// step per run to `progress` ("affinity", 3 × reps steps); workers are started with `worker`.
pub fn measure(a: &BenchSpec, worker: &WorkerCmd, progress: &dyn Progress) -> Result<BenchResult> {
    preheat_model::stats::require_repetitions(a.reps, "--reps", "repetition")
        .map_err(anyhow::Error::msg)?;
    let kind = Kind::parse(&a.workload)
        .ok_or_else(|| anyhow::anyhow!("--workload {:?}: chase, stream or branchy", a.workload))?;
    let plan = crate::topology::plan(None, 0, &[2, 10, 200])?;
    let dir = crate::scratch()?;
    let spec = |exp: Experiment, in_process: bool| RunSpec {
        experiment: exp,
        main: MainSpec::Bundled(kind),
        quantum_ms: a.quantum_ms,
        cpu: 0,
        cpu_ms: a.cpu_ms,
        preheat: false,
        ws_bytes: Some(a.ws_bytes),
        scratch: dir.path().to_path_buf(),
        vector_in_process: in_process,
        worker: worker.clone(),
    };
    let reps = a.reps;
    progress.start(3 * reps as u64, "affinity");
    let mut ratios = Vec::new();
    let mut proc_ratios = Vec::new();
    let mut p99s = Vec::new();
    let mut p50s = Vec::new();
    let mut mechanism = String::new();
    for i in 0..reps {
        // 0: alone, 1: BV_0 as a thread of the workload, 2: BV_0 as its own process. The order
        // rotates with the repetition so drift between runs cancels.
        let mut rate = [0.0; 3];
        for k in 0..3 {
            let which = (i + k) % 3;
            let exp = if which == 0 {
                Experiment::Alone
            } else {
                Experiment::Table2 {
                    interleaved: "BV_0".into(),
                    concurrent: None,
                }
            };
            let r = run::execute(&plan, &spec(exp, which == 1))?;
            if which == 1 {
                mechanism = r.quanta.mechanism.to_string();
                if let Some(m) = &r.quanta.main {
                    p99s.push(m.p99_ms / a.quantum_ms);
                    p50s.push(m.p50_ms);
                }
            }
            rate[which] = r.rate;
            progress.inc(1);
        }
        ratios.push(rate[1] / rate[0]);
        proc_ratios.push(rate[2] / rate[0]);
    }
    progress.finish();
    let res = BenchResult {
        kind: "measured",
        workload: a.workload.clone(),
        reps,
        cpu_ms: a.cpu_ms,
        quantum_ms: a.quantum_ms,
        mechanism,
        overhead_median: median(&ratios),
        overhead_min: ratios.iter().copied().fold(f64::INFINITY, f64::min),
        overhead_max: ratios.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        overhead_ratios: ratios,
        process_vector_median: median(&proc_ratios),
        process_vector_ratios: proc_ratios,
        overhead_goal: 0.98,
        quantum_p99_ratio_median: median(&p99s),
        quantum_p50_ms_median: median(&p50s),
        quantum_p99_ratios: p99s,
        quantum_goal: 1.05,
    };
    Ok(res)
}

#[cfg(test)]
mod tests {
    use super::median;

    #[test]
    fn median_is_the_models_lower_middle() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.0);
        assert!(median(&[]).is_nan());
        assert!(median(&[f64::NAN]).is_nan());
    }
}
