//! Section 2 (and a run alone): the main workload and a base vector share the main CPU and
//! alternate every quantum (the controller: `control`); a concurrent vector runs on another CPU
//! for the whole run. Started in [`start_processes`], driven in [`drive`], measured in
//! [`measured`] and checked in [`check_interleaved`].

use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use preheat_affinity::{Plan, VectorSpec};
use preheat_engine::perf::Counters;
use preheat_engine::sched::{self, ThreadSched};

use crate::control::{self, ControllerStats, FifoVector, Mechanism, Side, Stoppable};
use crate::proc::Worker;
use crate::programs::Job;
use crate::run::{
    job_for, pmu_open, pmu_read, quanta, reaped_cpu, refill, set, start_program, vector,
    vector_args, vector_kind, workload_args, CellView, Experiment, Late, MainSpec, Quanta,
    QuantaReport, RunResult, RunSpec,
};
use crate::worker::Outcome;

/// The processes of one cell, started (the vector held until the main workload runs).
struct Procs {
    conc: Option<Worker>,
    vec_worker: Option<Worker>,
    main_worker: Option<Worker>,
    /// The main program's job (not a bundled workload).
    job: Option<Job>,
}

/// What the main workload did, in the result's terms.
struct Measured {
    rate: f64,
    work: f64,
    cpu_s: f64,
    metric: String,
    main_runs: Option<Quanta>,
    refill_bins: Vec<crate::run::RefillBin>,
    pre_cpu: f64,
    pre_n: u64,
}

/// Run a Section 2 cell (or the workload alone) and measure it.
pub(crate) fn interleaved(plan: &Plan, spec: &RunSpec) -> Result<RunResult> {
    let (mech, fallback) = Mechanism::best();
    let mut notes: Vec<String> = fallback.into_iter().collect();
    if spec.preheat && mech != Mechanism::FifoSwap {
        bail!("--preheat needs real-time scheduling (the warm thread must run before the workload resumes)");
    }
    let fifo = mech == Mechanism::FifoSwap;
    let main_cpu = spec.cpu as usize;
    if spec.vector_in_process && (!fifo || !matches!(spec.main, MainSpec::Bundled(_))) {
        bail!(
            "a vector in the workload's process needs a bundled workload and real-time scheduling"
        );
    }
    let (interleaved, concurrent, conc_cpu) = vectors_of(plan, spec)?;
    let procs = start_processes(plan, spec, fifo, interleaved, concurrent, conc_cpu)?;
    let ctl_cpu = conc_cpu
        .or_else(|| plan.cpus.iter().copied().find(|&c| c != spec.cpu))
        .unwrap_or(spec.cpu) as usize;
    let saved = control::become_controller(ctl_cpu, fifo)?;
    // What the hypervisor took from each vCPU during the run (evidence for a void run).
    let steal0 = preheat_engine::os::steal_ms_per_cpu();
    let t0 = Instant::now();
    let mut counters = None;
    let result = drive(spec, fifo, &procs, &mut notes, &mut counters);
    control::restore_self(&saved);
    let wall_s = t0.elapsed().as_secs_f64();
    let Procs {
        conc,
        vec_worker,
        main_worker: _main_worker,
        job: _,
    } = procs;
    let vec_out = vec_worker.map(|w| w.stop()).transpose();
    let conc_out = conc.map(|w| w.stop()).transpose();
    let (outcome, prog_cpu, stats) = result?;
    let vec_out = vec_out?;
    conc_out?;
    let m = measured(outcome.as_ref(), prog_cpu, vec_out.as_ref())?;
    if interleaved.is_some() {
        let cpus = (ctl_cpu, main_cpu);
        check_interleaved(spec, &m, vec_out.as_ref(), &stats, steal0, cpus, wall_s)?;
        if let Some(q) = &m.main_runs {
            if q.p50_ms > 1.5 * spec.quantum_ms {
                notes.push(format!(
                    "the main workload ran {:.2} ms per quantum (p50) for {} ms requested: \
                     something else held the vector off",
                    q.p50_ms, spec.quantum_ms
                ));
            }
        }
    }
    let (workload_kind, stands_for) = spec.main.kind_and_standin();
    let quanta = quanta_report(
        spec,
        mech,
        interleaved.is_some(),
        &m,
        vec_out.as_ref(),
        outcome.as_ref(),
        &stats,
    );
    Ok(RunResult {
        kind: "measured",
        experiment: if interleaved.is_some() {
            "table2"
        } else {
            "alone"
        },
        workload: spec.main.name(),
        workload_kind,
        stands_for,
        cell: cell_view(plan, spec, interleaved, concurrent, conc_cpu),
        metric: m.metric,
        rate: m.rate,
        work: m.work,
        cpu_s: m.cpu_s,
        wall_s,
        preheat_cpu_s: m.pre_cpu,
        preheats: m.pre_n,
        rate_with_preheat_cost: spec.preheat.then(|| m.work / (m.cpu_s + m.pre_cpu)),
        quanta,
        refill: if interleaved.is_some() {
            m.refill_bins
        } else {
            Vec::new()
        },
        copies: Vec::new(),
        pmu: counters.as_ref().map(pmu_read),
        notes,
    })
}

/// The Table 2 cell this run measures (its affinity and retention from the plan, if the plan
/// has it).
fn cell_view(
    plan: &Plan,
    spec: &RunSpec,
    interleaved: Option<&VectorSpec>,
    concurrent: Option<&str>,
    conc_cpu: Option<u32>,
) -> CellView {
    let cell = plan.table2.cells.iter().find(|c| {
        Some(c.interleaved.as_str()) == interleaved.map(|v| v.name.as_str())
            && c.concurrent.as_deref() == concurrent
    });
    CellView {
        interleaved: interleaved.map(|v| v.name.clone()),
        concurrent: concurrent.map(str::to_string),
        concurrent_cpu: conc_cpu,
        quantum_ms: spec.quantum_ms,
        affinity: cell.map(|c| c.affinity.as_str().to_string()),
        retention: cell.map(|c| c.retention.as_str().to_string()),
        interfering: None,
        preheat: spec.preheat,
    }
}

/// The cell's vectors: the interleaved one, the concurrent one's name and the CPU it runs on.
fn vectors_of<'p>(
    plan: &'p Plan,
    spec: &'p RunSpec,
) -> Result<(Option<&'p VectorSpec>, Option<&'p str>, Option<u32>)> {
    let (interleaved, concurrent) = match &spec.experiment {
        Experiment::Table2 {
            interleaved,
            concurrent,
        } => (Some(vector(plan, interleaved)?), concurrent.as_deref()),
        _ => (None, None),
    };
    // A concurrent vector runs on a CPU that shares the retention level with the main CPU.
    let conc_cpu = match concurrent {
        Some(_) => Some(
            plan.table2
                .concurrent_cpu
                .filter(|&c| c != spec.cpu)
                .or_else(|| plan.cpus.iter().copied().find(|&c| c != spec.cpu))
                .context("a concurrent vector needs a second CPU")?,
        ),
        None => None,
    };
    Ok((interleaved, concurrent, conc_cpu))
}

/// What the run achieved of the requested quanta (the main workload's only when interleaved).
fn quanta_report(
    spec: &RunSpec,
    mech: Mechanism,
    interleaved: bool,
    m: &Measured,
    vec_out: Option<&Outcome>,
    outcome: Option<&Outcome>,
    stats: &ControllerStats,
) -> QuantaReport {
    QuantaReport {
        requested_ms: spec.quantum_ms,
        mechanism: if interleaved { mech.name() } else { "none" },
        main: m.main_runs.clone().filter(|_| interleaved),
        vector: vec_out
            .map(|v| &v.runs_ms)
            .or(outcome.map(|o| &o.vector_runs_ms))
            .and_then(|r| quanta(r)),
        controller_late_us: quanta(&stats.late_us).map(|q| Late {
            n: q.n,
            p50_us: q.p50_ms,
            p99_us: q.p99_ms,
        }),
    }
}

/// Start the cell's processes: the concurrent vector on `conc_cpu`, the interleaved vector
/// (held, stopped, until the main workload runs) and the main workload's worker on the main CPU,
/// or the main program's job (started by [`drive`]).
fn start_processes(
    plan: &Plan,
    spec: &RunSpec,
    fifo: bool,
    interleaved: Option<&VectorSpec>,
    concurrent: Option<&str>,
    conc_cpu: Option<u32>,
) -> Result<Procs> {
    let main_cpu = spec.cpu as usize;
    let in_process = spec.vector_in_process;
    let conc = match concurrent {
        Some(name) => {
            let v = vector(plan, name)?;
            Some(Worker::start(
                &spec.worker,
                &format!("concurrent {name}"),
                &vector_args(v, spec.quantum_ms),
                &[conc_cpu.unwrap_or(0) as usize],
            )?)
        }
        None => None,
    };
    let vec_worker = match interleaved {
        Some(v) if !in_process => {
            let w = Worker::start(
                &spec.worker,
                &format!("vector {}", v.name),
                &vector_args(v, spec.quantum_ms),
                &[main_cpu],
            )?;
            // Held (stopped) until the main workload runs: a spinning real-time vector would
            // starve the main workload's start-up in the normal class on the same CPU.
            Stoppable(w.ready.pid).hold()?;
            if fifo {
                set(
                    w.ready.main_tid,
                    ThreadSched::fifo(control::PRIO_VECTOR_WAIT),
                )?;
            }
            Some(w)
        }
        _ => None,
    };
    let main_worker = match &spec.main {
        MainSpec::Bundled(k) => {
            let mut args = workload_args(plan, *k, spec, spec.cpu_ms, spec.preheat);
            if let (true, Some(v)) = (in_process, interleaved) {
                args.extend([
                    "--vector-kind".into(),
                    vector_kind(v).into(),
                    "--vector-bytes".into(),
                    v.bytes.to_string(),
                ]);
            }
            let w = Worker::start(
                &spec.worker,
                &format!("workload {}", k.name()),
                &args,
                &[main_cpu],
            )?;
            if fifo {
                set(w.ready.main_tid, ThreadSched::fifo(control::PRIO_MAIN))?;
                if let Some(t) = w.ready.warm_tid {
                    set(t, ThreadSched::fifo(control::PRIO_WARM))?;
                }
            }
            if let Some(t) = w.ready.vector_tid {
                set(t, ThreadSched::fifo(control::PRIO_VECTOR_WAIT))?;
            }
            Some(w)
        }
        _ => None,
    };
    let job = match &spec.main {
        MainSpec::Bundled(_) => None,
        m => Some(job_for(m, spec, "main")?),
    };
    Ok(Procs {
        conc,
        vec_worker,
        main_worker,
        job,
    })
}

/// Start the main program's job on the main CPU (in its real-time class under `fifo`, waited
/// for: until it has entered it, a running vector would starve it).
fn start_main_program(
    j: &Job,
    main_cpu: usize,
    fifo: bool,
    notes: &mut Vec<String>,
    counters: &mut Option<Counters>,
) -> Result<crate::run::Reaping> {
    let sc = fifo.then_some(control::PRIO_MAIN);
    let p = start_program(j, &[main_cpu], sc)?;
    *counters = pmu_open(p.prog.pid(), true, notes);
    if fifo {
        // The program enters its class through `setpriv` and `chrt` execs: until it
        // has, it is in the normal class and a running vector would starve it.
        let pid = p.prog.pid();
        let t0 = Instant::now();
        while !sched::thread_sched(pid).is_ok_and(|s| s.is_realtime())
            && t0.elapsed() < Duration::from_secs(5)
        {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    Ok(p)
}

/// Let the main workload run, interleaved with the vector (if any) until it is done: its
/// outcome (a worker) or its CPU time (a program), and what the controller measured.
fn drive(
    spec: &RunSpec,
    fifo: bool,
    procs: &Procs,
    notes: &mut Vec<String>,
    counters: &mut Option<Counters>,
) -> Result<(Option<Outcome>, Option<f64>, ControllerStats)> {
    let main_cpu = spec.cpu as usize;
    let (main_worker, vec_worker) = (&procs.main_worker, &procs.vec_worker);
    let mut program = None;
    if let Some(w) = main_worker {
        *counters = pmu_open(w.ready.main_tid, false, notes);
    }
    match (main_worker, &procs.job) {
        (Some(w), _) => w.send(b"g\n")?,
        (None, Some(j)) => program = Some(start_main_program(j, main_cpu, fifo, notes, counters)?),
        _ => unreachable!(),
    }
    // The main workload runs: under priority swapping the vector may now wait behind it.
    if let (true, Some(vw)) = (fifo, vec_worker) {
        Stoppable(vw.ready.pid).run()?;
    }
    let mut outcome = None;
    let mut prog_cpu = None;
    // A run that makes no progress (e.g. a workload starved by something else at a real-time
    // priority) ends with an error instead of hanging the experiment.
    let limit = Duration::from_secs(30) + Duration::from_millis(20 * spec.cpu_ms);
    let limit = if main_worker.is_some() {
        limit
    } else {
        Duration::from_secs(600)
    };
    let started = Instant::now();
    let mut done = || -> Result<bool> {
        if started.elapsed() > limit {
            bail!(
                "the main workload did not finish within {limit:?}: stopped (its measurement \
                 is void)"
            );
        }
        if let Some(w) = main_worker {
            if outcome.is_none() {
                outcome = w.try_outcome()?;
            }
            return Ok(outcome.is_some());
        }
        if let Some(p) = &program {
            match p.rx.try_recv() {
                Ok(r) => {
                    prog_cpu = Some(reaped_cpu(r, &spec.main.name())?);
                    return Ok(true);
                }
                Err(mpsc::TryRecvError::Empty) => return Ok(false),
                Err(mpsc::TryRecvError::Disconnected) => bail!("lost the program's reaper"),
            }
        }
        Ok(true)
    };
    let program_pid = program.as_ref().map(|p| p.prog.pid());
    let stats = alternate(spec, fifo, procs, program_pid, &mut done)?;
    if let Some(p) = program {
        drop(p.prog);
    }
    Ok((outcome, prog_cpu, stats))
}

/// Alternate the vector (if any) with the main workload every quantum until `done` (else just
/// wait for it): what the controller measured about itself.
fn alternate(
    spec: &RunSpec,
    fifo: bool,
    procs: &Procs,
    program_pid: Option<u32>,
    done: &mut dyn FnMut() -> Result<bool>,
) -> Result<ControllerStats> {
    let (main_worker, vec_worker) = (&procs.main_worker, &procs.vec_worker);
    let q = Duration::from_secs_f64(spec.quantum_ms / 1e3);
    let vec_ids = match (vec_worker, main_worker) {
        (Some(vw), _) => Some((vw.ready.main_tid, vw.ready.pid)),
        (None, Some(mw)) => mw.ready.vector_tid.map(|t| (t, 0)),
        _ => None,
    };
    Ok(match vec_ids {
        Some((vtid, vpid)) => {
            let mut fv = FifoVector(vtid);
            let mut sv = Stoppable(vpid);
            let main_group = main_worker
                .as_ref()
                .map(|w| w.ready.pid)
                .or(program_pid)
                .unwrap_or(0);
            let mut sm = Stoppable(main_group);
            let warm = spec.preheat;
            let (vside, mside): (&mut dyn Side, Option<&mut dyn Side>) = if fifo {
                (&mut fv, None)
            } else {
                (&mut sv, Some(&mut sm))
            };
            control::interleave(
                q,
                vside,
                mside,
                || {
                    if warm {
                        // The warm thread (FIFO 4) wakes and loads before the workload resumes.
                        if let Some(w) = main_worker {
                            // A write to a worker that just finished fails; not an error.
                            let _ = w.send(b"p\n");
                        }
                    }
                    Ok(())
                },
                done,
            )?
        }
        None => {
            while !done()? {
                std::thread::sleep(Duration::from_millis(2));
            }
            ControllerStats::default()
        }
    })
}

/// The main workload's rate, work, CPU time, metric, quanta, refill profile and preheat cost:
/// from a worker's outcome, or (a program) from its CPU time and the vector's gaps.
fn measured(
    outcome: Option<&Outcome>,
    prog_cpu: Option<f64>,
    vec_out: Option<&Outcome>,
) -> Result<Measured> {
    Ok(match outcome {
        Some(o) => {
            let cpu = o.cpu_ns as f64 / 1e9;
            Measured {
                rate: o.work as f64 / cpu,
                work: o.work as f64,
                cpu_s: cpu,
                metric: format!("work per CPU-second ({})", o.unit),
                main_runs: quanta(&o.runs_ms),
                refill_bins: refill(o),
                pre_cpu: o.preheat_cpu_ns as f64 / 1e9,
                pre_n: o.preheats,
            }
        }
        None => {
            let cpu = prog_cpu.context("the program's CPU time")?;
            // The program's quanta are the vector's gaps (its first gap is the wait, stopped,
            // while the program started; the last one ends when the program does).
            let gaps: Vec<f64> = vec_out
                .map(|v| {
                    let g = &v.gaps_ms;
                    g.get(1..g.len().saturating_sub(1)).unwrap_or(&[]).to_vec()
                })
                .unwrap_or_default();
            Measured {
                rate: 1.0 / cpu,
                work: 1.0,
                cpu_s: cpu,
                metric: "jobs per CPU-second".to_string(),
                main_runs: quanta(&gaps),
                refill_bins: Vec::new(),
                pre_cpu: 0.0,
                pre_n: 0,
            }
        }
    })
}

/// A workload that ran several quanta of CPU without one complete quantum between the
/// vector's was not interleaved (the two did not alternate on one CPU): the run measured
/// something else, so it fails, saying what each piece saw. `cpus`: the controller's and the
/// workload's.
fn check_interleaved(
    spec: &RunSpec,
    m: &Measured,
    vec_out: Option<&Outcome>,
    stats: &ControllerStats,
    steal0: Option<Vec<u64>>,
    (ctl_cpu, main_cpu): (usize, usize),
    wall_s: f64,
) -> Result<()> {
    if m.main_runs.is_some() || m.cpu_s * 1e3 <= 3.0 * spec.quantum_ms {
        return Ok(());
    }
    let (vpauses, vcpu_ms) = vec_out.map_or((0, 0.0), |v| (v.gaps_ms.len(), v.cpu_ns as f64 / 1e6));
    let steal = match (steal0, preheat_engine::os::steal_ms_per_cpu()) {
        (Some(a), Some(b)) => {
            let d = |c: usize| {
                b.get(c)
                    .zip(a.get(c))
                    .map_or(0, |(y, x)| y.saturating_sub(*x))
            };
            format!(
                "; the hypervisor withheld {} ms from the controller's CPU {ctl_cpu} and {} ms \
                 from the workload's CPU {main_cpu} (steal)",
                d(ctl_cpu),
                d(main_cpu)
            )
        }
        _ => String::new(),
    };
    bail!(
        "not interleaved: the main workload ran {:.0} ms of CPU in {:.0} ms without a complete \
         quantum (vector process: {vpauses} pause(s), {vcpu_ms:.0} ms CPU; {} controller \
         switches{steal}): the measurement is void",
        m.cpu_s * 1e3,
        wall_s * 1e3,
        stats.switches
    )
}
