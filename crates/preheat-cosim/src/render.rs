//! The simulated experiment as text (`preheat cosched simulate`'s table): every figure it
//! prints is simulated, and it says so in its first line.

use crate::compare::Comparison;
use crate::scenario::{Scenario, Setup};
use crate::workload::PhaseDist;

fn pct(x: f64) -> String {
    format!("{:.1}%", 100.0 * x)
}

fn signed_pct(x: Option<f64>) -> String {
    match x {
        Some(x) if x.is_finite() => format!("{:+.1}%", 100.0 * x),
        _ => "—".into(),
    }
}

fn secs(x: f64) -> String {
    if x.is_finite() {
        format!("{x:.3}")
    } else {
        "never".into()
    }
}

fn describe_phase(p: &PhaseDist) -> String {
    match p {
        PhaseDist::Fixed { us } => format!("{us} µs each"),
        PhaseDist::LogNormal { mean_us, cv } => format!("log-normal, mean {mean_us} µs, cv {cv}"),
        PhaseDist::Empirical { us } => {
            format!("{} measured times, mean {:.1} µs", us.len(), p.mean_us())
        }
    }
}

/// The text report of a simulated comparison, VM0 running `scenario`.
pub fn render(c: &Comparison, scenario: Scenario) -> String {
    let s = &c.setup;
    let p = &c.params;
    let mut out = String::new();
    let vms = describe_vms(s, scenario);
    let sync = s.instances.iter().all(|i| i.sync);
    out += &format!(
        "SIMULATED — a model, nothing measured: seed {}, {} s simulated per policy\n",
        p.seed, p.duration_s
    );
    out += &format!(
        "host {} CPUs; {}; {}\n",
        s.cpus,
        vms.join("; "),
        if sync {
            "threads meet at barriers"
        } else {
            "threads never wait (no barriers)"
        }
    );
    out += &format!(
        "model: slice {} ms, switch {} µs, barrier {} µs; phases {}; job = {} phases; \
         partial-auto regroups at {} s, {} slower; none: CFS model, {} ms slices\n\n",
        p.slice_us / 1e3,
        p.switch_us,
        p.barrier_us,
        describe_phase(&p.phase),
        p.job_phases,
        p.detect_s,
        pct(p.auto_overhead),
        p.cfs_slice_us / 1e3
    );
    let mut head = format!("{:<17}", "policy");
    for vm in 0..s.vm_vcpus.len() {
        head += &format!(" {:>9}", format!("VM{vm} run s"));
    }
    head += &format!(
        " {:>9} {:>6} {:>6} {:>6} {:>7} {:>12} {:>10}\n",
        "total s", "idle", "spin", "switch", "co-run", "improvement", "predicted"
    );
    out += &head;
    let mut notes = Vec::new();
    for o in &c.results {
        let r = &o.result;
        let name = if o.baseline_only {
            format!("{} (baseline)", o.policy)
        } else {
            o.policy.to_string()
        };
        let mut row = format!("{name:<17}");
        for v in &r.vms {
            row += &format!(" {:>9}", secs(v.run_time_s));
        }
        row += &format!(
            " {:>9} {:>6} {:>6} {:>6} {:>7} {:>12} {:>10}\n",
            secs(r.total_run_time_s),
            pct(r.idle_cpu_share),
            pct(r.spin_cpu_share),
            format!("{:.2}%", 100.0 * r.switch_cpu_share),
            r.corun_fraction.map_or("—".into(), pct),
            signed_pct(o.improvement_over_full),
            signed_pct(Some(o.predicted_improvement)),
        );
        out += &row;
        for (k, i) in r.instances.iter().enumerate() {
            if let Some(n) = &i.note {
                notes.push(format!("{}: instance {k} (VM{}) {n}", o.policy, i.vm));
            }
        }
    }
    out += "\nall figures simulated. run s: a job's run time (a VM's: mean over its instances); \
            total: their sum, the paper's metric;\n\
            idle/spin/switch: shares of CPU time (spin: vCPUs waiting at a barrier on a CPU); \
            co-run: share of a synchronised instance's\n\
            scheduled time with all its vCPUs on CPUs together; improvement: T_full / T_policy − 1; \
            predicted: closed form (fluid shares, no costs).\n\
            paper (§5): +33% expected for double and quad, up to +100% for single.\n";
    for n in notes {
        out += &format!("note: {n}\n");
    }
    out
}

/// Each VM of `s` in words: its vCPUs and instances (VM0 runs the `scenario`).
fn describe_vms(s: &Setup, scenario: Scenario) -> Vec<String> {
    s.vm_vcpus
        .iter()
        .enumerate()
        .map(|(vm, &n)| {
            let inst: Vec<usize> = s
                .instances
                .iter()
                .filter(|i| i.vm == vm)
                .map(|i| i.vcpus.len())
                .collect();
            let load = if vm == 0 {
                format!("{scenario}: ")
            } else {
                String::new()
            };
            format!(
                "VM{vm} {n} vCPUs ({load}{} instance{} × {} vCPUs)",
                inst.len(),
                if inst.len() == 1 { "" } else { "s" },
                inst.first().copied().unwrap_or(0)
            )
        })
        .collect()
}
