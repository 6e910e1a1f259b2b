//! `preheat affinity topology`: the arguments and the printing; the plan, the verification and
//! the metric are `preheat_affinity_ctl::topology`.

use std::path::PathBuf;

use anyhow::{bail, Result};
use preheat_affinity::{Table2Plan, VectorKind, VectorSpec};
use preheat_affinity_ctl::topology::{metric, plan, verify};

#[derive(clap::Args)]
pub struct TopologyArgs {
    /// Read the topology from this directory instead of /sys/devices/system/cpu (a snapshot, or
    /// a test's fake tree).
    #[arg(long, value_name = "DIR")]
    pub sysfs: Option<PathBuf>,
    /// The CPU the main workload runs on.
    #[arg(long, default_value_t = 0)]
    pub cpu: u32,
    /// Quanta of the Table 2 matrix, ms.
    #[arg(long, value_delimiter = ',', default_value = "2,10,200")]
    pub quanta: Vec<u32>,
    /// Measure what each base vector displaces on this machine (not with --sysfs): seconds, up to
    /// a minute where the last-level cache is large (its vector reads all of it, 15 times over).
    #[arg(long)]
    pub verify: bool,
    /// With --verify: only these base vectors (comma separated, e.g. BV_L1D,BV_L2); default every
    /// vector sized to a cache level.
    #[arg(long, value_delimiter = ',', requires = "verify")]
    pub vectors: Vec<String>,
    #[arg(long)]
    pub json: bool,
}

fn human_bytes(b: u64) -> String {
    if b >= 1 << 20 && b.is_multiple_of(1 << 20) {
        format!("{} MiB", b >> 20)
    } else if b >= 1 << 10 {
        format!("{} KiB", b >> 10)
    } else {
        format!("{b} B")
    }
}

fn vector_line(v: &VectorSpec) -> String {
    let kind = match v.kind {
        VectorKind::Zero => "negligible footprint",
        VectorKind::Data => "reads a buffer of",
        VectorKind::Code => "executes jumps spanning",
    };
    match &v.target {
        Some(t) => format!("  {:<7} {kind} {} (the {t})", v.name, human_bytes(v.bytes)),
        None => format!("  {:<7} {kind}", v.name),
    }
}

pub fn run(a: TopologyArgs) -> Result<()> {
    if a.verify && a.sysfs.is_some() {
        bail!("--verify measures this machine; it cannot be combined with --sysfs");
    }
    let plan = plan(a.sysfs.as_deref(), a.cpu, &a.quanta)?;
    let eviction = if a.verify {
        if !a.json {
            eprintln!("measuring each base vector's eviction on CPU {} ...", a.cpu);
        }
        Some(verify(&plan, a.cpu, 15, &a.vectors)?)
    } else {
        None
    };
    let (pmu, metric) = metric();
    if a.json {
        let mut v = serde_json::to_value(&plan)?;
        v["source"] = serde_json::json!(a
            .sysfs
            .as_ref()
            .map_or("sysfs".to_string(), |p| p.display().to_string()));
        v["eviction"] = serde_json::to_value(&eviction)?;
        v["pmu"] = pmu.into();
        v["metric"] = metric.into();
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    println!("Caches of CPU {} (from sysfs):", plan.main_cpu);
    for c in &plan.caches {
        let shared = if c.shared_cpus.len() > 1 {
            format!("shared by CPUs {:?}", c.shared_cpus)
        } else {
            "private".to_string()
        };
        println!("  {:<4} {:>9}  {shared}", c.name, human_bytes(c.bytes));
    }
    println!("\nBase vectors (sized from those caches):");
    for v in &plan.vectors {
        println!("{}", vector_line(v));
    }
    print_table2(&plan.table2);
    let t3 = &plan.table3;
    if t3.feasible {
        println!(
            "\nSection 3 (Table 3): {} main copies + {} interfering on CPUs {:?}; a move loses {} and keeps {}",
            t3.main_copies,
            t3.interfering,
            t3.cpus,
            if t3.lost_on_move.is_empty() { "nothing".into() } else { t3.lost_on_move.join(", ") },
            if t3.kept_on_move.is_empty() { "nothing".into() } else { t3.kept_on_move.join(", ") },
        );
    } else {
        println!("\nSection 3 (Table 3): not possible here");
    }
    for n in &t3.notes {
        println!("  note: {n}");
    }
    println!("\nMetric: {metric}");
    if let Some(ev) = eviction {
        println!("\n(\"not measurable\": even the reference eviction did not slow the probe by 10%: refills \
                  are hidden here — by the front end for code, by other tenants' use of a shared level)");
        println!("\nEviction by each base vector (measured on CPU {}; medians of the probe passes per condition):", plan.main_cpu);
        for e in ev {
            let share = match e.share {
                Some(s) => format!("evicts {:>5.1}%", 100.0 * s),
                None => "not measurable by timing:".to_string(),
            };
            println!(
                "  {:<7} {share} of a resident {}-sized probe (probe pass {:.1} µs resident, {:.1} after, {:.1} after {}; n = {})",
                e.vector,
                e.level,
                e.resident_ns / 1e3,
                e.after_ns / 1e3,
                e.reference_ns / 1e3,
                e.reference,
                e.samples
            );
        }
    }
    Ok(())
}

/// Section 2 of the plan in words: Table 2's cells, where low retention comes from, its notes
/// and substitutes.
fn print_table2(t2: &Table2Plan) {
    println!(
        "\nSection 2 (Table 2): {} cells; low retention made at {} {}{}",
        t2.cells.len(),
        t2.retention_level.as_deref().unwrap_or("no shared level"),
        t2.concurrent_cpu
            .map_or(String::new(), |c| format!("(concurrent vector on CPU {c})")),
        if t2.paper_exact {
            ", exactly the paper's cells"
        } else {
            ", with substitutes"
        }
    );
    for n in &t2.notes {
        println!("  note: {n}");
    }
    let mut subs: Vec<&str> = t2
        .cells
        .iter()
        .filter_map(|c| c.substitute.as_deref())
        .collect();
    subs.sort();
    subs.dedup();
    for s in subs {
        println!("  substitute: {s}");
    }
}
