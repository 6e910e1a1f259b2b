//! The text report of `preheat cosched experiment` (the CLI prints it).

use crate::experiment::{Results, VmKind};
use preheat_model::stats::median;

fn pct(v: f64) -> String {
    format!("{:+.0}%", 100.0 * v)
}

/// The experiment's text table: one row per kernel × scenario × policy, the calibration, the
/// legend and the notes.
pub fn table(r: &Results) -> String {
    let mut s = format!(
        "Partial coscheduling at this machine's size: {} CPUs, VM1 = {} vCPUs, VM2 = {}, the \
         VMs {} (measured; {} repetitions per cell, {} s runs, {} ms slices; improvement over \
         full coscheduling = T_full / T_policy − 1, median [95% interval])\n",
        r.cpus, r.vm_vcpus[0], r.vm_vcpus[1], r.vms, r.reps, r.seconds, r.slice_ms
    );
    s += &format!(
        "{:<6} {:<8} {:<15} {:>26} {:>10} {:>16} {:>11} {:>7}\n",
        "kernel", "scenario", "policy", "measured", "predicted", "simulated", "co-run/full", "idle"
    );
    for row in &r.rows {
        s += &format!(
            "{:<6} {:<8} {:<15} {:>26} {:>10} {:>16} {:>11} {:>7}\n",
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
            format!(
                "{}/{}",
                row.corun_fraction_median
                    .map_or("-".into(), |v| format!("{:.0}%", 100.0 * v)),
                row.full_corun_fraction_median
                    .map_or("-".into(), |v| format!("{:.0}%", 100.0 * v))
            ),
            row.idle_cpu_share_median
                .map_or("-".into(), |v| format!("{:.0}%", 100.0 * v)),
        );
        if row.foreign_load_runs > 0 {
            s += &format!(
                "       ^ {} of its runs (or of full's) overlapped load from outside: see the notes\n",
                row.foreign_load_runs
            );
        }
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
    for f in &r.noise_floors {
        s += &f.describe();
        s += "\n";
    }
    s += &windows(r);
    s += "co-run/full = median co-run fraction of the policy's multi-vCPU sets / of full \
          coscheduling's (measured; - = no such set); idle = the CPUs' idle share (measured).\n";
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

/// The runs' start-up and measured windows (for guests: the boot, and the window in which every
/// guest computed).
fn windows(r: &Results) -> String {
    let of = |f: &dyn Fn(&crate::experiment::Cell) -> f64| {
        let v: Vec<f64> = r.cells.iter().map(f).collect();
        let m = median(&v).unwrap_or(f64::NAN);
        let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        format!("{m:.1} s (range {lo:.1}–{hi:.1}, n={})", v.len())
    };
    let start = match r.vms {
        VmKind::Guests => "booting the guests",
        VmKind::ThreadGroups => "starting the programs",
    };
    format!(
        "per run (measured, median): {start} to the controller's first slice {}; measured \
         window {}\n",
        of(&|c| c.controller_start_s),
        of(&|c| c.window_s)
    )
}
