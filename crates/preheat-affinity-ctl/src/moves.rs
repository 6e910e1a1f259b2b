//! Section 3 (Table 3) runs: several copies of a main workload plus interfering workloads on
//! all CPUs of the plan. High affinity: each copy pinned to its own CPU for the whole run (the
//! paper's "bound"). Low affinity: the controller moves every copy to the next CPU of the
//! rotation every quantum — an affinity-oblivious scheduler at its worst (the paper used the
//! Solaris time-sharing scheduler with affinity disabled; on Linux we cannot switch CFS's
//! affinity off, so the moves are made explicit). Interfering workloads are never bound.
//! With `--preheat` (bundled main workloads) each copy's warm thread is moved to
//! the destination first and woken there at real-time priority, so it loads the working set on
//! the destination CPU before the copy runs there; with high affinity it preheats every quantum
//! on the copy's own CPU (the baseline for what preheating gains besides affinity).

use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use preheat_affinity::Plan;
use preheat_engine::sched::{self, ThreadSched};

use super::control::{self, Mechanism};
use super::proc::Worker;
use super::run::{CellView, Copy, Experiment, MainSpec, QuantaReport, RunResult, RunSpec};

enum Main {
    Worker(Worker),
    Program {
        prog: preheat_launch::launch::Program,
        rx: mpsc::Receiver<std::io::Result<preheat_engine::os::Reaped>>,
    },
}

/// Every thread of `pid` and its descendants.
fn tids_of_tree(pid: u32) -> Vec<u32> {
    let mut pids = preheat_launch::launch::descendants(pid);
    pids.push(pid);
    let mut out = Vec::new();
    for p in pids {
        if let Ok(rd) = std::fs::read_dir(format!("/proc/{p}/task")) {
            out.extend(
                rd.flatten()
                    .filter_map(|e| e.file_name().to_str().and_then(|s| s.parse::<u32>().ok())),
            );
        }
    }
    out
}

fn move_to(tids: &[u32], cpu: usize) {
    for &t in tids {
        // A thread that has exited is simply gone.
        let _ = sched::set_thread_affinity(t, &[cpu]);
    }
}

pub fn execute(plan: &Plan, spec: &RunSpec) -> Result<RunResult> {
    let Experiment::Table3 { interfering, high } = &spec.experiment else {
        unreachable!("called for table3 runs")
    };
    let t3 = &plan.table3;
    if !t3.feasible {
        bail!(
            "Section 3 needs at least 2 CPUs to move between: {}",
            t3.notes.join("; ")
        );
    }
    let (mech, fallback) = Mechanism::best();
    let fifo = mech == Mechanism::FifoSwap;
    let mut notes: Vec<String> = fallback.into_iter().collect();
    if spec.preheat && (!fifo || !matches!(spec.main, MainSpec::Bundled(_))) {
        bail!(
            "--preheat with table3 needs a bundled main workload and real-time scheduling (the \
             warm thread must run on the destination before the copy)"
        );
    }
    let cpus: Vec<usize> = t3.cpus.iter().map(|&c| c as usize).collect();
    let n = t3.main_copies as usize;
    // Interfering workloads first (never bound), then the copies, each on its own CPU.
    let (interf, interf_progs) = start_interfering(plan, spec, interfering, &cpus)?;
    let mains = start_mains(plan, spec, &cpus, n)?;
    let saved = control::become_controller(*cpus.last().unwrap_or(&0), fifo)?;
    let t0 = Instant::now();
    let result = rotate(spec, *high, &cpus, &interf, &mains, t0);
    control::restore_self(&saved);
    let wall_s = t0.elapsed().as_secs_f64();
    drop(interf);
    drop(interf_progs);
    let (copies, pre_cpu, pre_n, work) = result?;
    drop(mains);
    let rate = copies.iter().map(|c| c.rate).sum::<f64>() / copies.len().max(1) as f64;
    let cpu_s = copies.iter().map(|c| c.cpu_s).sum::<f64>();
    let (workload_kind, stands_for) = spec.main.kind_and_standin();
    if !*high {
        notes.push(format!(
            "every {} ms each main copy moved to the next of CPUs {:?}; a move loses {}",
            spec.quantum_ms,
            cpus,
            t3.lost_on_move.join(", ")
        ));
    }
    Ok(RunResult {
        kind: "measured",
        experiment: "table3",
        workload: spec.main.name(),
        workload_kind,
        stands_for,
        cell: CellView {
            interleaved: None,
            concurrent: None,
            concurrent_cpu: None,
            quantum_ms: spec.quantum_ms,
            affinity: Some(if *high { "high" } else { "low" }.into()),
            retention: None,
            interfering: Some(interfering.name()),
            preheat: spec.preheat,
        },
        metric: match spec.main {
            MainSpec::Bundled(k) => format!("work per CPU-second ({})", k.unit().1),
            _ => "jobs per CPU-second".into(),
        },
        rate,
        work,
        cpu_s,
        wall_s,
        preheat_cpu_s: pre_cpu,
        preheats: pre_n,
        rate_with_preheat_cost: spec.preheat.then(|| work / (cpu_s + pre_cpu)),
        quanta: QuantaReport {
            requested_ms: spec.quantum_ms,
            mechanism: if *high { "pinned" } else { "affinity-moves" },
            main: None,
            vector: None,
            controller_late_us: None,
        },
        refill: Vec::new(),
        copies,
        pmu: None,
        notes,
    })
}

/// Start the interfering workloads on all of `all` (never bound): workers, or programs that
/// repeat their job until stopped.
fn start_interfering(
    plan: &Plan,
    spec: &RunSpec,
    interfering: &MainSpec,
    all: &[usize],
) -> Result<(Vec<Worker>, Vec<preheat_launch::launch::Program>)> {
    let t3 = &plan.table3;
    let mut interf: Vec<Worker> = Vec::new();
    let mut interf_progs = Vec::new();
    for i in 0..t3.interfering as usize {
        match interfering {
            MainSpec::Bundled(k) => {
                let mut s = spec.clone();
                s.preheat = false;
                interf.push(Worker::start(
                    &spec.worker,
                    &format!("interfering {} #{i}", k.name()),
                    &super::run::workload_args(plan, *k, &s, 3_600_000, false),
                    all,
                )?);
            }
            other => {
                let job = super::run::job_for(other, spec, &format!("interf{i}"))?;
                // The interfering program repeats its job until stopped.
                let script = format!(
                    "while :; do {} >/dev/null 2>&1 {}; done",
                    job.argv
                        .iter()
                        .map(|a| format!("'{}'", a.replace('\'', "'\\''")))
                        .collect::<Vec<_>>()
                        .join(" "),
                    job.stdin
                        .as_ref()
                        .map_or(String::new(), |p| format!("< '{}'", p.display()))
                );
                let mut cmd = super::proc::dying_with_us("sh", &["-c".into(), script], None)?;
                cmd.current_dir(&job.dir);
                interf_progs.push(super::proc::spawn(&mut cmd, all)?);
            }
        }
    }
    Ok((interf, interf_progs))
}

/// Start the `n` main copies, each on its own CPU of `cpus` (a bundled workload's warm thread
/// at its real-time priority on the copy's CPU with `--preheat`).
fn start_mains(plan: &Plan, spec: &RunSpec, cpus: &[usize], n: usize) -> Result<Vec<Main>> {
    let mut mains: Vec<Main> = Vec::new();
    for (i, &cpu) in cpus.iter().enumerate().take(n) {
        match &spec.main {
            MainSpec::Bundled(k) => {
                let w = Worker::start(
                    &spec.worker,
                    &format!("main {} #{i}", k.name()),
                    &super::run::workload_args(plan, *k, spec, spec.cpu_ms, spec.preheat),
                    &[cpu],
                )?;
                if let (true, Some(t)) = (spec.preheat, w.ready.warm_tid) {
                    sched::set_thread_sched(t, ThreadSched::fifo(control::PRIO_WARM))
                        .context("warm thread priority")?;
                    sched::set_thread_affinity(t, &[cpu]).context("warm thread CPU")?;
                }
                mains.push(Main::Worker(w));
            }
            other => {
                let job = super::run::job_for(other, spec, &format!("main{i}"))?;
                let r = super::run::start_program(&job, &[cpu], None)?;
                mains.push(Main::Program {
                    prog: r.prog,
                    rx: r.rx,
                });
            }
        }
    }
    Ok(mains)
}

/// Work, preheat CPU time and preheats of the copies that finished.
#[derive(Default)]
struct Totals {
    pre_cpu: f64,
    pre_n: u64,
    work: f64,
}

/// Start everything, then every quantum: collect the copies that finished and (low affinity)
/// move every other copy to the next CPU of the rotation, until all are done.
fn rotate(
    spec: &RunSpec,
    high: bool,
    cpus: &[usize],
    interf: &[Worker],
    mains: &[Main],
    t0: Instant,
) -> Result<(Vec<Copy>, f64, u64, f64)> {
    for w in interf.iter() {
        w.send(b"g\n")?;
    }
    for m in mains.iter() {
        if let Main::Worker(w) = m {
            w.send(b"g\n")?;
        }
    }
    let q = Duration::from_secs_f64(spec.quantum_ms / 1e3);
    let mut copies: Vec<Option<Copy>> = vec![None; mains.len()];
    let mut tids: Vec<Vec<u32>> = mains
        .iter()
        .map(|m| match m {
            Main::Worker(w) => vec![w.ready.main_tid],
            Main::Program { prog, .. } => tids_of_tree(prog.pid()),
        })
        .collect();
    let mut totals = Totals::default();
    let limit = Duration::from_secs(60) + Duration::from_millis(40 * spec.cpu_ms);
    let mut k: usize = 0;
    loop {
        control::wait_until(t0 + q * (k as u32 + 1));
        k += 1;
        if t0.elapsed() > limit {
            bail!("the main copies did not finish within {limit:?}: stopped (void)");
        }
        collect_finished(mains, &mut copies, &mut totals)?;
        if copies.iter().all(Option::is_some) {
            break;
        }
        if high {
            // Pinned copies with --preheat: the same preheat every quantum on their own CPU
            // (the baseline that tells the preheat's affinity gain from its other gains,
            // e.g. undoing what the interfering workload evicted).
            if spec.preheat {
                for (i, m) in mains.iter().enumerate() {
                    if let (None, Main::Worker(w)) = (&copies[i], m) {
                        let _ = w.send(b"p\n");
                    }
                }
            }
            continue;
        }
        move_copies(spec, cpus, mains, &copies, &mut tids, k);
    }
    Ok((
        copies.into_iter().flatten().collect(),
        totals.pre_cpu,
        totals.pre_n,
        totals.work,
    ))
}

/// Record every copy that finished since the last quantum.
fn collect_finished(
    mains: &[Main],
    copies: &mut [Option<Copy>],
    totals: &mut Totals,
) -> Result<()> {
    for (i, m) in mains.iter().enumerate() {
        if copies[i].is_some() {
            continue;
        }
        match m {
            Main::Worker(w) => {
                if let Some(o) = w.try_outcome()? {
                    let cpu = o.cpu_ns as f64 / 1e9;
                    totals.pre_cpu += o.preheat_cpu_ns as f64 / 1e9;
                    totals.pre_n += o.preheats;
                    totals.work += o.work as f64;
                    copies[i] = Some(Copy {
                        rate: o.work as f64 / cpu,
                        cpu_s: cpu,
                    });
                }
            }
            Main::Program { rx, .. } => {
                if let Ok(r) = rx.try_recv() {
                    let cpu = super::run::reaped_cpu(r, "a main copy")?;
                    totals.work += 1.0;
                    copies[i] = Some(Copy {
                        rate: 1.0 / cpu,
                        cpu_s: cpu,
                    });
                }
            }
        }
    }
    Ok(())
}

/// Move every unfinished copy to the next CPU of the rotation (its warm thread first, woken
/// there, with `--preheat`); a program's threads are looked up again every 16 quanta.
fn move_copies(
    spec: &RunSpec,
    cpus: &[usize],
    mains: &[Main],
    copies: &[Option<Copy>],
    tids: &mut [Vec<u32>],
    k: usize,
) {
    if k.is_multiple_of(16) {
        for (i, m) in mains.iter().enumerate() {
            if let Main::Program { prog, .. } = m {
                tids[i] = tids_of_tree(prog.pid());
            }
        }
    }
    for (i, m) in mains.iter().enumerate() {
        if copies[i].is_some() {
            continue;
        }
        let dest = cpus[(i + k) % cpus.len()];
        if let (true, Main::Worker(w)) = (spec.preheat, m) {
            if let Some(t) = w.ready.warm_tid {
                let _ = sched::set_thread_affinity(t, &[dest]);
                let _ = w.send(b"p\n");
            }
        }
        move_to(&tids[i], dest);
    }
}
