//! `preheat affinity bench`: the arguments and the printing; the measurement is
//! `preheat_affinity_ctl::bench`.

use anyhow::Result;
use preheat_affinity_ctl::bench::{measure, BenchSpec};
use preheat_affinity_ctl::proc::WorkerCmd;

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

pub fn run(a: BenchArgs) -> Result<()> {
    preheat_launch::cleanup::install_cleanup();
    let spec = BenchSpec {
        reps: a.reps,
        cpu_ms: a.cpu_ms,
        quantum_ms: a.quantum_ms,
        workload: a.workload.clone(),
        ws_bytes: a.ws_bytes,
    };
    let bar = crate::progress::Bars::new(a.json);
    let res = measure(&spec, &WorkerCmd::this_binary()?, &bar)?;
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
