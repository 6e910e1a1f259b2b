//! `preheat cosched run`: the options, and the report of a run (the run itself is
//! `preheat_cosched_run::run`).

use std::path::PathBuf;

use anyhow::{Context, Result};
use preheat_cosched_run::host::HostSpec;
use preheat_cosched_run::run::{self, Outcome, Params};
use preheat_cosched_run::watchdog::WatchdogCmd;
use preheat_cosim::scenario::Policy;

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
    /// partial-auto: how the sets are chosen from the tree: paper (the split rule at --t) or
    /// modularity (the cut with the highest modularity; see `preheat groups --help`).
    #[arg(long, default_value_t = preheat_group::GroupMethod::PaperSplit)]
    pub group_method: preheat_group::GroupMethod,
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

impl Options {
    /// The library's parameters.
    pub fn params(&self) -> Params {
        Params {
            policy: self.policy,
            slice_ms: self.slice_ms,
            duration: self.duration,
            cpus: self.cpus.clone(),
            regroup_s: self.regroup_s,
            t: self.t,
            group_method: self.group_method,
            reset_after_ms: self.reset_after_ms,
            noise_floor: None,
            journal: self.journal.clone(),
            watchdog: (!self.no_watchdog).then(watchdog),
        }
    }
}

/// The watchdog: this binary's `cosched restore --watch`. /proc/self/exe, not current_exe():
/// it still executes this very binary if the file was replaced (rebuilt) while we run.
pub fn watchdog() -> WatchdogCmd {
    WatchdogCmd {
        exe: PathBuf::from("/proc/self/exe"),
        args: vec!["cosched".into(), "restore".into(), "--watch".into()],
    }
}

/// A note of the library, on stderr.
pub fn say(line: &str) {
    eprintln!("{line}");
}

pub fn run(a: &RunArgs) -> Result<()> {
    let text = std::fs::read_to_string(&a.config)
        .with_context(|| format!("reading {}", a.config.display()))?;
    let spec: HostSpec = serde_json::from_str(&text)
        .with_context(|| format!("{}: not a coscheduler configuration", a.config.display()))?;
    let out = run::execute(&spec, &a.opts.params(), !a.json, &say)?;
    if a.json {
        println!("{}", serde_json::to_string(&out)?);
    } else {
        print!("{}", text_report(&out));
    }
    Ok(())
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
        s += &r.cost.render(r.ready_threads);
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
