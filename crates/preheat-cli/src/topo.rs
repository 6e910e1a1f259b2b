//! `preheat topology`: what this machine offers preheat, and what it lacks.

use anyhow::Result;
use preheat_engine::cache::CpuFeatures;
use serde::Serialize;

#[derive(Serialize)]
struct Report {
    cpus: usize,
    cpu_model: String,
    clflush: bool,
    clflushopt: bool,
    rdtscp: bool,
    invariant_tsc: bool,
    pmu: bool,
    root: bool,
    cpuidle_driver: Option<String>,
    cpuidle_governor: Option<String>,
    idle_states: Vec<String>,
    caches: Vec<String>,
    backends: Vec<(String, String)>,
    /// The keep-awake calibration of this boot (`preheat wake calibrate`), if one was measured.
    keep_awake: Option<preheat_wake::calibrate::Calibration>,
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(2) == Some("0"))
        })
        .unwrap_or(false)
}

pub fn print(json: bool) -> Result<()> {
    let t = preheat_engine::topology::read();
    let f = preheat_engine::cache::features();
    let pmu = preheat_engine::topology::has_pmu();
    let caches = t
        .cpus
        .first()
        .map(|c| {
            c.caches
                .iter()
                .map(|k| {
                    format!(
                        "L{} {} {} KiB shared by CPUs {:?}",
                        k.level,
                        k.kind,
                        k.size_bytes / 1024,
                        k.shared_cpus
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    let backends = backends(&f, pmu);
    let r = Report {
        cpus: t.cpus.len(),
        cpu_model: preheat_engine::topology::cpu_model(),
        clflush: f.clflush,
        clflushopt: f.clflushopt,
        rdtscp: f.rdtscp,
        invariant_tsc: f.invariant_tsc,
        pmu,
        root: is_root(),
        cpuidle_driver: t.cpuidle_driver.clone(),
        cpuidle_governor: t.cpuidle_governor.clone(),
        idle_states: t
            .cpus
            .first()
            .map(|c| c.idle_states.clone())
            .unwrap_or_default(),
        caches,
        backends,
        keep_awake: preheat_wake::calibrate::cached(&preheat_launch::paths::run_dir()),
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&r)?);
        return Ok(());
    }
    println!("{} CPUs: {}", r.cpus, r.cpu_model);
    println!(
        "features: clflush {} clflushopt {} rdtscp {} invariant-tsc {}; PMU {}; root {}",
        r.clflush, r.clflushopt, r.rdtscp, r.invariant_tsc, r.pmu, r.root
    );
    println!(
        "cpuidle: driver {} governor {} states {:?}",
        r.cpuidle_driver.as_deref().unwrap_or("none"),
        r.cpuidle_governor.as_deref().unwrap_or("none"),
        r.idle_states
    );
    for c in &r.caches {
        println!("cache: {c}");
    }
    for (b, s) in &r.backends {
        println!("backend {b}: {s}");
    }
    match &r.keep_awake {
        Some(c) => {
            println!("keep-awake: {}", c.summary());
            if let Some(p) = &c.predictor {
                println!("idle: {}", p.describe());
            }
        }
        None => println!(
            "keep-awake: not calibrated on this boot (preheat wake calibrate; the demo calibrates on first use)"
        ),
    }
    Ok(())
}

/// Each estimation backend and whether it works here (and why not).
fn backends(f: &CpuFeatures, pmu: bool) -> Vec<(String, String)> {
    vec![
        (
            "probe".to_string(),
            if f.clflush && f.rdtscp {
                "available (flush+reload timing)".to_string()
            } else {
                "unavailable: needs clflush and rdtscp".to_string()
            },
        ),
        (
            "step".to_string(),
            match preheat_estimate::hybrid::ptrace_denied() {
                None => "ptrace permitted by policy (native code lines)".to_string(),
                Some(why) => format!("unavailable: {why}"),
            },
        ),
        (
            "hybrid".to_string(),
            match preheat_estimate::hybrid::ptrace_denied() {
                None => "step code lines + probe data lines (the auto default)".to_string(),
                Some(why) => format!("unavailable ({why}); auto uses probe"),
            },
        ),
        (
            "trace".to_string(),
            "Valgrind tool (built on first use; needs valgrind, gcc, make)".to_string(),
        ),
        (
            "pmu".to_string(),
            if pmu {
                "PMU present (IBS/PEBS sampling not implemented yet)".to_string()
            } else {
                "unavailable: no hardware PMU exposed (perf_event_open of cycles fails)".to_string()
            },
        ),
    ]
}
