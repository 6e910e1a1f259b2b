//! `preheat cosched run`: coschedule the VMs of a configuration file for a while and report what
//! was measured; [`execute`] is also what the experiments call.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use preheat_cosched::control::{self, Config, Report};
use preheat_cosched::journal;
use preheat_cosim::scenario::Policy;
use preheat_model::comm::CommConfig;
use serde::Serialize;

use super::auto::{Auto, VmView};
use super::host::{self, HostSpec};
use preheat_launch::paths;

#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// The VMs, as JSON: {"vms": [{"name": "vm1", "vcpus": 2, "command": ["prog", "arg"],
    /// "threads": "name-prefix", "sets": [[0, 1]]}, {"vcpus": 1, "pid": 1234}]}.
    #[arg(long)]
    pub config: PathBuf,
    #[command(flatten)]
    pub opts: Options,
    /// Print the report as one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// How to coschedule (shared by `run` and `experiment`).
#[derive(clap::Args, Debug, Clone)]
pub struct Options {
    /// none (plain Linux, measured only), full (each VM one set), partial-static (the
    /// configured sets), partial-auto (sets detected by SPCD + grouping, re-evaluated).
    #[arg(long, default_value = "full")]
    pub policy: Policy,
    /// Slice length, ms.
    #[arg(long, default_value_t = 10.0)]
    pub slice_ms: f64,
    /// Run this long, s (also ends when every vCPU thread has exited).
    #[arg(long, default_value_t = 10.0)]
    pub duration: f64,
    /// The CPUs the coscheduler owns [default: all online CPUs].
    #[arg(long, value_delimiter = ',')]
    pub cpus: Vec<usize>,
    /// partial-auto: re-evaluate the sets every this many seconds (the paper: 5).
    #[arg(long, default_value_t = 5.0)]
    pub regroup_s: f64,
    /// partial-auto: the grouping threshold t (the paper: 1.5).
    #[arg(long, default_value_t = preheat_group::DEFAULT_T)]
    pub t: f64,
    /// partial-auto: reset the communication matrix this long after the VMs start (the paper
    /// resets it after start-up, so initialisation and shared libraries do not count).
    #[arg(long, default_value_t = 500)]
    pub reset_after_ms: u64,
    /// The journal file [default: $PREHEAT_RUN_DIR or /tmp/preheat, file cosched-journal.json].
    #[arg(long)]
    pub journal: Option<PathBuf>,
    /// Do not start the watchdog process that restores the threads if this command dies
    /// (the next start still restores a journal left behind).
    #[arg(long)]
    pub no_watchdog: bool,
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
}

pub fn run(a: &RunArgs) -> Result<()> {
    let text = std::fs::read_to_string(&a.config)
        .with_context(|| format!("reading {}", a.config.display()))?;
    let spec: HostSpec = serde_json::from_str(&text)
        .with_context(|| format!("{}: not a coscheduler configuration", a.config.display()))?;
    let out = execute(&spec, &a.opts, !a.json)?;
    if a.json {
        println!("{}", serde_json::to_string(&out)?);
    } else {
        print!("{}", text_report(&out));
    }
    Ok(())
}

/// The CPUs to use: the given ones (checked) or all online.
pub fn cpus_of(o: &Options) -> Result<Vec<usize>> {
    let online = preheat_engine::os::online_cpus();
    if o.cpus.is_empty() {
        return Ok((0..online).collect());
    }
    for &c in &o.cpus {
        if c >= online {
            bail!(
                "CPU {c} does not exist (this machine has CPUs 0-{})",
                online - 1
            );
        }
    }
    Ok(o.cpus.clone())
}

/// The journal path of `o`.
pub fn journal_path(o: &Options) -> PathBuf {
    o.journal
        .clone()
        .unwrap_or_else(|| journal::default_path(&paths::run_dir()))
}

const SCRATCH_PREFIX: &str = "cosched-scratch-";

/// Remove the scratch directories of coschedulers that died (their pid no longer runs).
pub fn sweep_scratch(dir: &Path) {
    preheat_launch::launch::sweep_scratch(dir, SCRATCH_PREFIX);
}

/// Restore a journal a dead controller left behind (prints what it did).
pub fn restore_leftover(path: &Path) -> Result<()> {
    if let Some(outcomes) = journal::restore_if_orphaned(path)
        .with_context(|| format!("restoring {}", path.display()))?
    {
        eprintln!(
            "preheat cosched: a previous controller died; restored from {}:",
            path.display()
        );
        for o in outcomes {
            eprintln!("  {o}");
        }
    }
    Ok(())
}

/// Start the VMs, coschedule them, stop them, and return what was measured.
pub fn execute(spec: &HostSpec, o: &Options, progress: bool) -> Result<Outcome> {
    let cpus = cpus_of(o)?;
    spec.validate(cpus.len())?;
    let positive = |x: f64| x.is_finite() && x > 0.0;
    if !positive(o.slice_ms) || !positive(o.duration) {
        bail!("--slice-ms and --duration must be positive");
    }
    let journal = journal_path(o);
    if let Some(dir) = journal.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    restore_leftover(&journal)?;
    let _lock = take_lock(&journal.with_extension("lock"))?;
    // The VMs' outputs and agent sockets live next to the journal, in a directory named with
    // our pid: removed when this run ends, and by the next start (or `restore`) if we died.
    let jdir = journal.parent().unwrap_or(Path::new(".")).to_path_buf();
    let scratch = preheat_launch::launch::owned_scratch(&jdir, SCRATCH_PREFIX)?;
    let run_dir = scratch.path().join("run");
    std::fs::create_dir_all(&run_dir)?;
    let comm_cfg = CommConfig::default();
    let auto = o.policy == Policy::PartialAuto;
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
    let sets = host::initial_sets(&vms, o.policy)?;
    let mut auto_thread = None;
    if auto {
        if progress {
            eprintln!(
                "partial-auto: waiting {} ms, then resetting the communication matrices",
                o.reset_after_ms
            );
        }
        preheat_launch::agentctl::wait_for_agents(
            &run_dir,
            || {
                vms.iter()
                    .filter(|v| v.program.is_some())
                    .map(|v| v.pid)
                    .collect()
            },
            Duration::from_secs(10),
        )
        .context("partial-auto needs the agent in every VM it starts")?;
        std::thread::sleep(Duration::from_millis(o.reset_after_ms));
        let a = Auto::new(&vms, &run_dir, &paths::run_dir(), o.t, cpus.len());
        auto_thread = Some(a.spawn(
            vms.iter().map(VmView::of).collect(),
            vcpus.clone(),
            Duration::from_secs_f64(o.regroup_s.max(0.1)),
        ));
    }
    let watchdog = if o.policy != Policy::None && !o.no_watchdog {
        Some(start_watchdog(&journal)?)
    } else {
        None
    };
    let cfg = Config {
        cpus,
        slice: Duration::from_secs_f64(o.slice_ms / 1e3),
        policy: o.policy,
        duration: Duration::from_secs_f64(o.duration),
        journal: journal.clone(),
        // The regroup thread decides when; the controller only looks for new sets each slice.
        regroup_every: auto.then(|| Duration::from_secs_f64(o.slice_ms / 1e3)),
    };
    if progress {
        eprintln!(
            "coscheduling {} vCPUs of {} VMs on CPUs {:?}: policy {}, {} ms slices, {} s ...",
            vcpus.len(),
            vms.len(),
            cfg.cpus,
            o.policy,
            o.slice_ms,
            o.duration
        );
    }
    super::STOP.store(false, std::sync::atomic::Ordering::Relaxed);
    super::DONE.store(false, std::sync::atomic::Ordering::Relaxed);
    let controller_start_s = launched.elapsed().as_secs_f64();
    let report = control::run(
        &cfg,
        vcpus,
        sets,
        |_| {
            auto_thread
                .as_ref()
                .and_then(|(rx, _, _)| rx.try_iter().last())
        },
        &super::STOP,
    );
    super::DONE.store(true, std::sync::atomic::Ordering::Relaxed);
    drop(watchdog);
    let auto_state = auto_thread.and_then(|(_, stop, h)| {
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        h.join().ok()
    });
    let mut report = report?;
    if let Some(a) = &auto_state {
        report.notes.extend(a.notes.iter().cloned());
    }
    // Let programs that end by themselves (a bounded workload) finish and print, then stop the
    // rest.
    let t0 = Instant::now();
    for vm in &mut vms {
        if let Some(p) = vm.program.as_mut() {
            while t0.elapsed() < Duration::from_secs(5) {
                if let Ok(Some(_)) = p.child.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        vm.program = None;
    }
    let outs = vms
        .iter()
        .map(|vm| VmOutcome {
            name: vm.name.clone(),
            pid: vm.pid,
            vcpus: vm.spec.vcpus,
            threads: vm.threads.iter().map(|t| t.tid).collect(),
            stdout: vm
                .stdout
                .as_ref()
                .and_then(|p| std::fs::read_to_string(p).ok())
                .unwrap_or_default(),
        })
        .collect();
    Ok(Outcome {
        report,
        vms: outs,
        matrices: auto_state.map(|a| a.matrices).unwrap_or_default(),
        controller_start_s,
    })
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

/// The watchdog: a `preheat cosched restore --watch` process in its own process group (so a
/// terminal's Ctrl-C does not reach it), killed when dropped.
struct Watchdog(std::process::Child);

impl Drop for Watchdog {
    fn drop(&mut self) {
        // It exits by itself once the journal is gone; give it a moment, then make sure.
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_millis(500) {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_watchdog(journal: &Path) -> Result<Watchdog> {
    use std::os::unix::process::CommandExt;
    // /proc/self/exe, not current_exe(): it still executes this very binary if the file was
    // replaced (rebuilt) while we run.
    let child = Command::new("/proc/self/exe")
        .args(["cosched", "restore", "--watch", "--controller"])
        .arg(std::process::id().to_string())
        .arg("--journal")
        .arg(journal)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .process_group(0)
        .spawn()
        .context("starting the watchdog")?;
    Ok(Watchdog(child))
}

/// The text report.
pub fn text_report(o: &Outcome) -> String {
    let r = &o.report;
    let mut s = String::new();
    s += &format!(
        "policy {} on CPUs {:?}, {:.1} s, {} slices (measured on this machine)\n",
        r.policy, r.cpus, r.elapsed_s, r.slices
    );
    for vm in &o.vms {
        s += &format!(
            "  {}: pid {}, {} vCPUs, vCPU threads {:?}\n",
            vm.name, vm.pid, vm.vcpus, vm.threads
        );
    }
    if r.policy != "none" {
        s += &format!(
            "  slice length: requested {:.0} µs, achieved p50 {:.0} / p99 {:.0} / max {:.0} µs \
             (n = {})\n",
            r.requested_slice_us, r.slice_us_p50, r.slice_us_p99, r.slice_us_max, r.slices
        );
        s += &format!(
            "  controller cost per slice: p50 {:.1} / p99 {:.1} µs; {} scheduling syscalls\n",
            r.apply_us_p50, r.apply_us_p99, r.syscalls
        );
        s += &format!(
            "  leak (run time of threads not chosen for the slice): {:.2}%\n",
            100.0 * r.leak_share
        );
        s += &format!(
            "  CPU-slots the plans left idle: {:.1}%\n",
            100.0 * r.planned_idle_share
        );
    }
    if let Some(i) = r.idle_cpu_share {
        s += &format!(
            "  idle share of these CPUs (/proc/stat): {:.1}%\n",
            100.0 * i
        );
    }
    for set in &r.sets {
        if let (Some(f), Some(lo)) = (set.corun_fraction, set.corun_lower) {
            s += &format!(
                "  set {:?}: co-run fraction {:.1}% (lower bound {:.1}%; {} windows)\n",
                set.members,
                100.0 * f,
                100.0 * lo,
                set.windows
            );
        }
    }
    for g in &r.regroups {
        s += &format!("  regroup at {:.1} s: sets {:?}\n", g.at_s, g.sets);
    }
    for (i, v) in r.vcpu_run_s.iter().enumerate() {
        s += &format!("  vCPU {i}: ran {v:.2} s\n");
    }
    for n in &r.notes {
        s += &format!("  note: {n}\n");
    }
    s
}
