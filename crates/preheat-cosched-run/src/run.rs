//! One coscheduler run: start (or attach to) the VMs, coschedule them for a while with
//! `preheat-cosched`'s controller, stop them, and return what was measured; [`execute`] is also
//! what the experiments call.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use preheat_cosched::control::{self, Config, Report, Vcpu};
use preheat_cosim::plan::CoSet;
use preheat_cosim::scenario::Policy;
use preheat_model::comm::CommConfig;
use serde::Serialize;

use crate::auto::{Auto, VmView};
use crate::host::{self, HostSpec, LiveVm};
use crate::watchdog::{self, WatchdogCmd};
use preheat_launch::paths;

/// How to coschedule (the CLI's `run` and `experiment` options).
#[derive(Debug, Clone)]
pub struct Params {
    /// none (plain Linux, measured only), full, partial-static, partial-auto.
    pub policy: Policy,
    /// Slice length, ms.
    pub slice_ms: f64,
    /// Run this long, s (the run also ends when every vCPU thread has exited).
    pub duration: f64,
    /// The CPUs the coscheduler owns (empty: all online CPUs).
    pub cpus: Vec<usize>,
    /// partial-auto: re-evaluate the sets every this many seconds.
    pub regroup_s: f64,
    /// partial-auto: the grouping threshold t (of the paper's rule).
    pub t: f64,
    /// partial-auto: how the sets are chosen from the tree (the paper's rule by default).
    pub group_method: preheat_group::GroupMethod,
    /// partial-auto: reset the communication matrix this long after the VMs start.
    pub reset_after_ms: u64,
    /// partial-auto: the guest kernel's own sharing, taken off each VM's matrix before grouping
    /// (`None`: the matrix as detected, the paper's way; see [`preheat_group::floor`]).
    pub noise_floor: Option<preheat_group::NoiseFloor>,
    /// The journal file (`None`: the run directory's).
    pub journal: Option<PathBuf>,
    /// The watchdog that restores the threads if this process dies (`None`: no watchdog; the
    /// next start still restores a journal left behind).
    pub watchdog: Option<WatchdogCmd>,
}

/// What one run produced.
#[derive(Debug, Serialize)]
pub struct Outcome {
    pub report: Report,
    pub vms: Vec<VmOutcome>,
    /// partial-auto: the last matrix of each VM (vCPU order).
    pub matrices: Vec<Option<Vec<Vec<u64>>>>,
    /// Seconds from starting the VMs' programs to the controller's first slice.
    pub controller_start_s: f64,
}

/// One VM after the run.
#[derive(Debug, Serialize)]
pub struct VmOutcome {
    pub name: String,
    pub pid: u32,
    pub vcpus: usize,
    pub threads: Vec<u32>,
    /// The standard output of a program we started (its last line, if JSON, parsed).
    #[serde(skip)]
    pub stdout: String,
    /// A guest: its workload's progress reports as they arrived, each with the host time, in
    /// seconds since the run started its VMs (the console is read by QEMU's main loop, so a
    /// line may arrive late; the report's own time is the guest's).
    #[serde(skip)]
    pub progress: Vec<(f64, preheat_npb::Progress)>,
}

/// The CPUs to use: the given ones (checked) or all online.
pub fn cpus_of(p: &Params) -> Result<Vec<usize>> {
    let online = preheat_engine::os::online_cpus();
    if p.cpus.is_empty() {
        return Ok((0..online).collect());
    }
    for &c in &p.cpus {
        preheat_engine::os::check_cpu(c).map_err(anyhow::Error::msg)?;
    }
    Ok(p.cpus.clone())
}

/// The regroup thread of a partial-auto run: its newest sets, its stop flag, its state at the
/// end.
type AutoThread = (Receiver<Vec<CoSet>>, Arc<AtomicBool>, JoinHandle<Auto>);

/// Start the VMs, coschedule them, stop them, and return what was measured. `say` hears what
/// was restored from a dead controller's journal and, when `verbose`, what the run is about to
/// do.
pub fn execute(spec: &HostSpec, p: &Params, verbose: bool, say: &dyn Fn(&str)) -> Result<Outcome> {
    let cpus = cpus_of(p)?;
    spec.validate(cpus.len())?;
    let positive = |x: f64| x.is_finite() && x > 0.0;
    if !positive(p.slice_ms) || !positive(p.duration) {
        bail!("--slice-ms and --duration must be positive");
    }
    let journal = watchdog::journal_path(p.journal.as_deref());
    if let Some(dir) = journal.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    watchdog::restore_leftover(&journal, say)?;
    let _lock = take_lock(&journal.with_extension("lock"))?;
    // The VMs' outputs and agent sockets live next to the journal, in a directory named with
    // our pid: removed when this run ends, and by the next start (or `restore`) if we died.
    let jdir = journal.parent().unwrap_or(Path::new(".")).to_path_buf();
    let scratch = preheat_launch::launch::owned_scratch(&jdir, watchdog::SCRATCH_PREFIX)?;
    let run_dir = scratch.path().join("run");
    std::fs::create_dir_all(&run_dir)?;
    let comm_cfg = CommConfig::default();
    let auto = p.policy == Policy::PartialAuto;
    let launched = Instant::now();
    let mut vms = host::start(
        spec,
        &host::Start {
            comm: auto.then_some(&comm_cfg),
            out_dir: scratch.path(),
            run_dir: &run_dir,
        },
    )?;
    let vcpus = host::vcpus(&vms);
    let sets = host::initial_sets(&vms, p.policy)?;
    let auto_thread = if auto {
        if verbose {
            say(&format!(
                "partial-auto: waiting {} ms, then resetting the communication matrices",
                p.reset_after_ms
            ));
        }
        Some(start_auto(&vms, &run_dir, p, cpus.len(), &vcpus)?)
    } else {
        None
    };
    let cfg = Config {
        cpus,
        slice: Duration::from_secs_f64(p.slice_ms / 1e3),
        policy: p.policy,
        duration: Duration::from_secs_f64(p.duration),
        journal: journal.clone(),
        // The regroup thread decides when; the controller only looks for new sets each slice.
        regroup_every: auto.then(|| Duration::from_secs_f64(p.slice_ms / 1e3)),
    };
    if verbose {
        say(&format!(
            "coscheduling {} vCPUs of {} VMs on CPUs {:?}: policy {}, {} ms slices, {} s ...",
            vcpus.len(),
            vms.len(),
            cfg.cpus,
            p.policy,
            p.slice_ms,
            p.duration
        ));
    }
    let controller_start_s = launched.elapsed().as_secs_f64();
    let (report, auto_state) = control_loop(&cfg, vcpus, sets, p, &journal, auto_thread)?;
    Ok(Outcome {
        report,
        vms: stop_vms(&mut vms, launched),
        matrices: auto_state.map(|a| a.matrices).unwrap_or_default(),
        controller_start_s,
    })
}

/// partial-auto: wait for the VMs' agents and the start-up, then start the regroup thread.
fn start_auto(
    vms: &[LiveVm],
    run_dir: &Path,
    p: &Params,
    cpus: usize,
    vcpus: &[Vcpu],
) -> Result<AutoThread> {
    let started = || -> Vec<u32> {
        vms.iter()
            .filter(|v| v.started_by_us())
            .map(|v| v.pid)
            .collect()
    };
    if let Err(e) =
        preheat_launch::agentctl::wait_for_agents(run_dir, started, Duration::from_secs(10))
    {
        // Started programs passed the pre-flight: say what each process is now (one may have
        // run another program the agent cannot reach).
        let found: String = preheat_launch::preflight::diagnose(&started(), &paths::agent_so()?)
            .iter()
            .map(|l| format!("\n  {l}"))
            .collect();
        bail!("partial-auto needs the agent in every VM it starts: {e:#}{found}");
    }
    std::thread::sleep(Duration::from_millis(p.reset_after_ms));
    let grouping = (p.group_method, p.t, p.noise_floor);
    let a = Auto::new(vms, run_dir, &paths::run_dir(), grouping, cpus);
    Ok(a.spawn(
        vms.iter().map(VmView::of).collect(),
        vcpus.to_vec(),
        Duration::from_secs_f64(p.regroup_s.max(0.1)),
    ))
}

/// The controller's run (under the watchdog, ended early by [`crate::STOP`]), then the regroup
/// thread's state; its notes join the report's.
fn control_loop(
    cfg: &Config,
    vcpus: Vec<Vcpu>,
    sets: Vec<CoSet>,
    p: &Params,
    journal: &Path,
    auto_thread: Option<AutoThread>,
) -> Result<(Report, Option<Auto>)> {
    let watchdog = match &p.watchdog {
        Some(cmd) if p.policy != Policy::None => Some(watchdog::start(cmd, journal)?),
        _ => None,
    };
    crate::STOP.store(false, Ordering::Relaxed);
    crate::DONE.store(false, Ordering::Relaxed);
    let report = control::run(
        cfg,
        vcpus,
        sets,
        |_| {
            auto_thread
                .as_ref()
                .and_then(|(rx, _, _)| rx.try_iter().last())
        },
        &crate::STOP,
    );
    crate::DONE.store(true, Ordering::Relaxed);
    drop(watchdog);
    let auto_state = auto_thread.and_then(|(_, stop, h)| {
        stop.store(true, Ordering::Relaxed);
        h.join().ok()
    });
    let mut report = report?;
    if let Some(a) = &auto_state {
        report.notes.extend(a.notes.iter().cloned());
    }
    Ok((report, auto_state))
}

/// Let programs that end by themselves (a bounded workload) finish and print, then stop the
/// rest; what each VM was and printed (a guest: its kernel's summary line and progress reports,
/// from its console, timed from `launched`).
fn stop_vms(vms: &mut [LiveVm], launched: Instant) -> Vec<VmOutcome> {
    let t0 = Instant::now();
    let wait = || Duration::from_secs(5).saturating_sub(t0.elapsed());
    let mut printed = Vec::with_capacity(vms.len());
    for vm in vms.iter_mut() {
        if let Some(p) = vm.program.as_mut() {
            while t0.elapsed() < Duration::from_secs(5) {
                if let Ok(Some(_)) = p.child.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        vm.program = None;
        // A guest powers off once its kernel has printed its summary.
        printed.push(vm.guest.as_mut().map(|g| {
            let _ = g.wait_exit(wait());
            let summary = g.summary().map(|v| v.to_string()).unwrap_or_default();
            (summary, guest_progress(g, launched))
        }));
        vm.guest = None;
    }
    vms.iter()
        .zip(printed)
        .map(|(vm, printed)| {
            let (stdout, progress) = printed.unwrap_or_else(|| {
                let out = vm
                    .stdout
                    .as_ref()
                    .and_then(|p| std::fs::read_to_string(p).ok());
                (out.unwrap_or_default(), Vec::new())
            });
            VmOutcome {
                name: vm.name.clone(),
                pid: vm.pid,
                vcpus: vm.spec.vcpus,
                threads: vm.threads.iter().map(|t| t.tid).collect(),
                stdout,
                progress,
            }
        })
        .collect()
}

/// A guest's progress reports, each with its arrival in seconds since `launched`.
fn guest_progress(
    g: &preheat_guest::Guest,
    launched: Instant,
) -> Vec<(f64, preheat_npb::Progress)> {
    // QEMU started this long after `launched` (both clocks read now).
    let offset = launched.elapsed().as_secs_f64() - g.elapsed().as_secs_f64();
    g.history
        .iter()
        .filter_map(|t| match &t.event {
            preheat_guest::Event::Progress(p) => Some((offset + t.at.as_secs_f64(), p.clone())),
            _ => None,
        })
        .collect()
}

/// One coscheduler per machine (per journal): two would fight over the same CPUs with
/// real-time priorities. The engine's single-instance lock (flock: a dead owner's lock is free
/// again, and two starters cannot both take it).
fn take_lock(path: &Path) -> Result<preheat_engine::pidlock::PidLock> {
    use preheat_engine::pidlock::{LockError, PidLock};
    match PidLock::take(path) {
        Ok(l) => Ok(l),
        Err(LockError::Held(pid)) => bail!(
            "another coscheduler (pid {}) is running with the journal next to {}: two would \
             fight over the same CPUs; wait for it or stop it",
            pid.map_or("?".into(), |p| p.to_string()),
            path.display()
        ),
        Err(LockError::Io(e)) => {
            Err(e).with_context(|| format!("taking the lock {}", path.display()))
        }
    }
}
