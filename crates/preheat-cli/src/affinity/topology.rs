//! `preheat affinity topology`: the machine's caches (sysfs, or a snapshot of it), the base
//! vectors sized from them, the experiment matrix this machine allows and why, and (with
//! `--verify`) what each base vector really displaces here (measured).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use preheat_affinity::{Cache, CacheKind, Cpu, Machine, Plan, VectorKind, VectorSpec};
use preheat_engine::basevec::{self, BaseVector, Probe, Reference};
use serde::Serialize;

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
    /// Measure what each base vector displaces on this machine (a few seconds; not with --sysfs).
    #[arg(long)]
    pub verify: bool,
    #[arg(long)]
    pub json: bool,
}

/// The engine's sysfs topology as the plan's machine.
pub fn machine(sysfs: Option<&Path>) -> Machine {
    let t = match sysfs {
        Some(root) => preheat_engine::topology::read_from(root),
        None => preheat_engine::topology::read(),
    };
    Machine {
        cpus: t
            .cpus
            .iter()
            .map(|c| Cpu {
                cpu: c.cpu,
                package: c.package_id,
                caches: c
                    .caches
                    .iter()
                    .filter_map(|k| {
                        let kind = match k.kind.as_str() {
                            "Data" => CacheKind::Data,
                            "Instruction" => CacheKind::Instruction,
                            "Unified" => CacheKind::Unified,
                            _ => return None,
                        };
                        Some(Cache {
                            level: k.level,
                            kind,
                            bytes: k.size_bytes,
                            line: k.line_size,
                            shared_cpus: k.shared_cpus.clone(),
                        })
                    })
                    .collect(),
            })
            .collect(),
    }
}

/// The plan for `cpu` on the live machine (or a snapshot).
pub fn plan(sysfs: Option<&Path>, cpu: u32, quanta: &[u32]) -> Result<Plan> {
    let m = machine(sysfs);
    if m.cpus.is_empty() {
        bail!(
            "no CPUs found under {} (is it a sysfs cpu directory with an `online` file?)",
            sysfs.map_or("/sys/devices/system/cpu".into(), |p| p
                .display()
                .to_string())
        );
    }
    Ok(preheat_affinity::plan(&m, cpu, quanta)?)
}

/// One base vector's measured eviction.
#[derive(Debug, Clone, Serialize)]
pub struct EvictionRow {
    pub vector: String,
    pub level: String,
    /// Null when the reference eviction was not measurably slower than a resident probe.
    pub share: Option<f64>,
    pub resident_ns: f64,
    pub after_ns: f64,
    pub reference_ns: f64,
    pub reference: String,
    pub samples: usize,
    pub kind: &'static str,
}

/// Measure every sized vector's eviction of its own level on `cpu` (pinned; restored after).
pub fn verify(plan: &Plan, cpu: u32, samples: usize) -> Result<Vec<EvictionRow>> {
    let saved = preheat_engine::os::get_affinity();
    preheat_engine::os::pin_current_thread(cpu as usize)
        .with_context(|| format!("pinning to CPU {cpu}"))?;
    let r = verify_pinned(plan, samples);
    let _ = preheat_engine::os::set_affinity(&saved);
    r
}

fn verify_pinned(plan: &Plan, samples: usize) -> Result<Vec<EvictionRow>> {
    let mut out = Vec::new();
    let last = plan.vectors.iter().rfind(|v| v.kind == VectorKind::Data);
    for v in &plan.vectors {
        let Some(level) = v.target.clone() else {
            continue;
        };
        let bytes = v.bytes as usize;
        let is_last = last.is_some_and(|l| l.name == v.name);
        let (probe, mut vector, mut refv, reference) = match v.kind {
            VectorKind::Zero => continue,
            VectorKind::Code => (
                Probe::code(bytes, 11)?,
                BaseVector::code(bytes)?,
                Some(BaseVector::code(4 * bytes)?),
                format!("a code vector 4x the {level} size"),
            ),
            // The last level is shared (here with other tenants): a probe of its full size is
            // never resident, so the probe is half of it.
            VectorKind::Data if is_last => (
                Probe::data(bytes / 2, 11),
                BaseVector::data(bytes),
                None,
                format!("the probe's lines flushed (reload from memory); probe = half the {level}"),
            ),
            VectorKind::Data => (
                Probe::data(bytes, 11),
                BaseVector::data(bytes),
                Some(BaseVector::data(4 * bytes)),
                format!("a data vector 4x the {level} size"),
            ),
        };
        // Passes over small probes take a microsecond or less: time more of them.
        let n = if bytes <= 256 << 10 {
            samples.max(51)
        } else {
            samples
        };
        let r = match refv.as_mut() {
            Some(rv) => basevec::verify(&probe, &mut vector, Reference::Vector(rv), n),
            None => basevec::verify(&probe, &mut vector, Reference::Flush, n),
        };
        out.push(EvictionRow {
            vector: v.name.clone(),
            level,
            share: r.share,
            resident_ns: r.resident_ns,
            after_ns: r.after_ns,
            reference_ns: r.reference_ns,
            reference,
            samples: r.samples,
            kind: "measured",
        });
    }
    Ok(out)
}

/// The metric this machine allows.
pub fn metric() -> (bool, String) {
    let pmu = preheat_engine::topology::has_pmu();
    let m = if pmu {
        "work per CPU-second, and IPC and misses per instruction from the PMU (perf_event, user \
         space; Section 2 runs)"
    } else {
        "work per CPU-second (no PMU: IPC and misses per instruction are not available)"
    };
    (pmu, m.to_string())
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
        Some(verify(&plan, a.cpu, 15)?)
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
    let t2 = &plan.table2;
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
