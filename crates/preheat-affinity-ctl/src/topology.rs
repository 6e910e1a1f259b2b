//! `preheat affinity topology`: the machine's caches (sysfs, or a snapshot of it), the base
//! vectors sized from them, the experiment matrix this machine allows and why, and (with
//! `--verify`) what each base vector really displaces here (measured).

use std::path::Path;

use anyhow::{bail, Context, Result};
use preheat_affinity::{Cache, CacheKind, Cpu, Machine, Plan, VectorKind};
use preheat_engine::basevec::{self, BaseVector, Probe, Reference};
use serde::Serialize;

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

/// Measure every sized vector's eviction of its own level on `cpu` (pinned; restored after);
/// only the vectors named in `only`, where it names any (an unknown name is an error).
pub fn verify(plan: &Plan, cpu: u32, samples: usize, only: &[String]) -> Result<Vec<EvictionRow>> {
    let sized: Vec<&str> = plan
        .vectors
        .iter()
        .filter(|v| v.target.is_some() && v.kind != VectorKind::Zero)
        .map(|v| v.name.as_str())
        .collect();
    if let Some(bad) = only.iter().find(|n| !sized.contains(&n.as_str())) {
        anyhow::bail!(
            "no base vector {bad} to verify here; the sized ones are {}",
            sized.join(", ")
        );
    }
    let saved = preheat_engine::os::get_affinity();
    preheat_engine::os::pin_current_thread(cpu as usize)
        .with_context(|| format!("pinning to CPU {cpu}"))?;
    let r = verify_pinned(plan, samples, only);
    let _ = preheat_engine::os::set_affinity(&saved);
    r
}

fn verify_pinned(plan: &Plan, samples: usize, only: &[String]) -> Result<Vec<EvictionRow>> {
    let mut out = Vec::new();
    let last = plan.vectors.iter().rfind(|v| v.kind == VectorKind::Data);
    for v in &plan.vectors {
        let Some(level) = v.target.clone() else {
            continue;
        };
        if !only.is_empty() && !only.contains(&v.name) {
            continue;
        }
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
            // A data probe is half its level. One of the level's full size is not resident even
            // undisturbed: it walks each set's ways in a fixed cyclic order, so one foreign line
            // in a set (the stack, the clock's page) makes LRU evict the very line needed next,
            // and that set misses on every pass. Measured on an EPYC (L1d 32 KiB, 3 runs each):
            // a full-size probe read 0.9–2.0 µs "resident" against 1.8–2.2 µs evicted, once
            // within the noise (a CI failure at share 0.36); half the level read 0.36–0.38 µs
            // against 0.80–0.81 µs, share 0.98 each time. A vector of the level's size still
            // displaces all of it. (Half-size code probes measured no steadier, so code keeps the
            // full size.) The last level is also shared, here with other tenants.
            VectorKind::Data if is_last => (
                Probe::data(bytes / 2, 11),
                BaseVector::data(bytes),
                None,
                format!("the probe's lines flushed (reload from memory); probe = half the {level}"),
            ),
            // The reference is a data vector twice the level: a cyclic pass over twice the
            // capacity displaces every older line of a half-size probe, and it presses on the
            // next level half as hard as the 4x it was. With 4x the L1d (128 KiB against a
            // 1 MiB L2) the reference read 1202 and 1332 ns in 2 of 13 debug-build runs on an
            // EPYC (against ~780 ns the others, and the vector's own ~760), so the share of a
            // vector that had displaced the whole L1d read 0.40–0.48 (a CI failure).
            VectorKind::Data => (
                Probe::data(bytes / 2, 11),
                BaseVector::data(bytes),
                Some(BaseVector::data(2 * bytes)),
                format!("a data vector 2x the {level} size; probe = half the {level}"),
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
