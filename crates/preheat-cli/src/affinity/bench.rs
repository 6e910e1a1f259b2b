//! `preheat affinity bench`: the interleaving controller's cost and accuracy, as ratios within
//! one run.
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

use super::run::{self, Experiment, MainSpec, RunSpec};
use preheat_engine::workloads::Kind;

#[derive(clap::Args)]
pub struct BenchArgs {
    /// Repetitions (pairs of alone + interleaved).
    #[arg(long, default_value_t = 7)]
    reps: usize,
    /// CPU time of the workload per run, ms.
    #[arg(long, default_value_t = 800)]
    cpu_ms: u64,
    /// Quantum, ms.
    #[arg(long, default_value_t = 2.0)]
    quantum_ms: f64,
    /// The bundled workload.
    #[arg(long, default_value = "chase")]
    workload: String,
    /// Its working set, bytes. Default 16 KiB: resident in L1 whatever else runs, so any loss
    /// is the controller's and the switches' (with a larger working set the loss also contains
    /// the decay of the workload's cache state while it is away — what the experiments
    /// measure, not overhead).
    #[arg(long, default_value_t = 16 << 10)]
    ws_bytes: usize,
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Serialize)]
struct BenchResult {
    kind: &'static str,
    workload: String,
    reps: usize,
    cpu_ms: u64,
    quantum_ms: f64,
    mechanism: String,
    /// Interleaved with BV_0 (a thread of the workload's process) / alone, per repetition.
    overhead_ratios: Vec<f64>,
    /// Interleaved with BV_0 as a process of its own / alone: adds the cost of switching address
    /// spaces on this machine.
    process_vector_ratios: Vec<f64>,
    process_vector_median: f64,
    overhead_median: f64,
    overhead_min: f64,
    overhead_max: f64,
    overhead_goal: f64,
    /// Achieved main quanta p99 / requested, per interleaved run.
    quantum_p99_ratios: Vec<f64>,
    quantum_p99_ratio_median: f64,
    quantum_p50_ms_median: f64,
    quantum_goal: f64,
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    if s.is_empty() {
        f64::NAN
    } else {
        s[s.len() / 2]
    }
}

pub fn run(a: BenchArgs) -> Result<()> {
    preheat_launch::launch::install_cleanup();
    let kind = Kind::parse(&a.workload)
        .ok_or_else(|| anyhow::anyhow!("--workload {:?}: chase, stream or branchy", a.workload))?;
    let plan = super::topology::plan(None, 0, &[2, 10, 200])?;
    let dir = super::scratch()?;
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
    };
    let reps = a.reps.max(1);
    let pb = crate::progress::bar(3 * reps as u64, "affinity", a.json);
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
            pb.inc(1);
        }
        ratios.push(rate[1] / rate[0]);
        proc_ratios.push(rate[2] / rate[0]);
    }
    pb.finish_and_clear();
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
    if a.json {
        println!("{}", serde_json::to_string_pretty(&res)?);
        return Ok(());
    }
    println!(
        "preheat affinity bench (measured on this machine; {} repetitions x 3 runs of {} ms CPU each, {})",
        res.reps, res.cpu_ms, res.workload
    );
    println!(
        "  controller overhead: work rate interleaved with BV_0 (a thread of the workload) every {} ms / alone = {:.3} median [range {:.3}–{:.3}], n = {} (goal ≥ {:.2}: {})",
        res.quantum_ms,
        res.overhead_median,
        res.overhead_min,
        res.overhead_max,
        res.overhead_ratios.len(),
        res.overhead_goal,
        if res.overhead_median >= res.overhead_goal { "met" } else { "NOT met" }
    );
    println!(
        "  with BV_0 as a process of its own (address-space switches every quantum): {:.3} median [range {:.3}–{:.3}] — the machine's cost of switching processes, not the controller's",
        res.process_vector_median,
        res.process_vector_ratios.iter().copied().fold(f64::INFINITY, f64::min),
        res.process_vector_ratios.iter().copied().fold(f64::NEG_INFINITY, f64::max),
    );
    println!(
        "  quantum accuracy ({}): achieved p99 / requested = {:.3} median over {} runs (p50 {:.3} ms; goal ≤ {:.2}: {})",
        res.mechanism,
        res.quantum_p99_ratio_median,
        res.quantum_p99_ratios.len(),
        res.quantum_p50_ms_median,
        res.quantum_goal,
        if res.quantum_p99_ratio_median <= res.quantum_goal { "met" } else { "NOT met" }
    );
    Ok(())
}
