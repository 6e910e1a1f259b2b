//! `preheat power …`: the command-line front end of this crate.
//!
//! [`run`] installs SIGINT/SIGTERM handlers (signal-hook flag) for its duration, so a signal
//! makes the running command stop at its next check and return through the normal drops: every
//! frozen group is thawed and every cgroup and child process removed before the error
//! "interrupted by signal" is returned.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::{Args, Subcommand};

use crate::bench::{self, BenchConfig, BenchReport, Io};
use crate::energy::{EnergyReport, PowerProfile};
use crate::quiesce::{self, Preference};
use crate::residency::{MachineRoot, Residency, Snapshot};
use crate::stats::Summary;

/// Sleep shaping: idle-state residency, modeled energy, slack-enabled quiescence.
#[derive(Debug, Args)]
pub struct PowerArgs {
    #[command(subcommand)]
    pub command: PowerCommand,
}

#[derive(Debug, Subcommand)]
pub enum PowerCommand {
    /// Measure the machine's idle-state residency over an interval and model its energy.
    Residency(ResidencyArgs),
    /// The slack-enabled quiescence experiment: a latency-critical request loop with a background
    /// CPU hog, without and with the background frozen during each request's I/O wait.
    QuiesceBench(QuiesceBenchArgs),
    /// Print a power profile as JSON (the default one, or --profile FILE after validation).
    Profile(ProfileArgs),
    /// Thaw and remove stale preheat-bg-* cgroups whose owner process is gone.
    Cleanup,
}

#[derive(Debug, Args)]
pub struct ResidencyArgs {
    /// Length of the interval, seconds.
    #[arg(long = "for-s", value_name = "S")]
    pub for_s: f64,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Power profile JSON file (default: the paper's Haswell figures).
    #[arg(long, value_name = "FILE")]
    pub profile: Option<PathBuf>,
    #[command(flatten)]
    pub machine: MachineArg,
}

/// `--machine-root DIR`: where `/sys` and `/proc` are read from.
#[derive(Debug, Clone, Args)]
pub struct MachineArg {
    /// Read the machine's idle counters under DIR instead of / (DIR/sys/devices/system/cpu,
    /// DIR/proc/stat): a fake tree of another machine variant, for tests. Default:
    /// $PREHEAT_MACHINE_ROOT, else /.
    #[arg(long = "machine-root", value_name = "DIR")]
    pub machine_root: Option<PathBuf>,
}

impl MachineArg {
    /// The machine to read.
    pub fn root(&self) -> MachineRoot {
        self.machine_root
            .as_ref()
            .map_or_else(MachineRoot::from_env, MachineRoot::at)
    }
}

#[derive(Debug, Args)]
pub struct QuiesceBenchArgs {
    /// Total measuring time over all modes, seconds.
    #[arg(long, default_value_t = 9.0, value_name = "S")]
    pub duration_s: f64,
    /// Interleaved rounds (each runs one block of every mode).
    #[arg(long, default_value_t = 6)]
    pub rounds: u32,
    /// Emulated device wait per request, µs (a blocking sleep; ignored with --io-file).
    #[arg(long, default_value_t = 2000, value_name = "US")]
    pub io_wait_us: u64,
    /// Real reads from this file instead of the emulated wait (pread, no O_DIRECT).
    #[arg(long, value_name = "PATH")]
    pub io_file: Option<PathBuf>,
    /// Bytes per read with --io-file.
    #[arg(long, default_value_t = 4096)]
    pub io_bytes: usize,
    /// CPU work per request, µs (calibrated on the idle machine).
    #[arg(long, default_value_t = 200, value_name = "US")]
    pub work_us: u64,
    /// Sleep between requests, µs.
    #[arg(long, default_value_t = 0, value_name = "US")]
    pub think_us: u64,
    /// Number of background CPU hogs.
    #[arg(long, default_value_t = 1)]
    pub hogs: usize,
    /// Do not pin the critical loop (CPU 0) and hogs (other CPUs).
    #[arg(long)]
    pub no_pin: bool,
    /// Which cgroup freezer to use.
    #[arg(long, value_enum, default_value_t = Preference::Auto)]
    pub freezer: Preference,
    /// Power profile JSON file (default: the paper's Haswell figures).
    #[arg(long, value_name = "FILE")]
    pub profile: Option<PathBuf>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub machine: MachineArg,
}

#[derive(Debug, Args)]
pub struct ProfileArgs {
    /// Validate and print this profile instead of the default.
    #[arg(long, value_name = "FILE")]
    pub profile: Option<PathBuf>,
}

/// Deregisters the signal handlers when dropped.
struct SignalGuard(Vec<signal_hook::SigId>);

impl Drop for SignalGuard {
    fn drop(&mut self) {
        for id in self.0.drain(..) {
            signal_hook::low_level::unregister(id);
        }
    }
}

fn install_signals(stop: &Arc<AtomicBool>) -> anyhow::Result<SignalGuard> {
    let mut ids = Vec::new();
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        ids.push(
            signal_hook::flag::register(sig, stop.clone()).context("installing signal handlers")?,
        );
    }
    Ok(SignalGuard(ids))
}

fn load_profile(path: Option<&Path>) -> anyhow::Result<PowerProfile> {
    Ok(match path {
        Some(p) => PowerProfile::load(p)?,
        None => PowerProfile::default(),
    })
}

/// Run `preheat power …`.
pub fn run(args: PowerArgs) -> anyhow::Result<()> {
    let stop = Arc::new(AtomicBool::new(false));
    let _signals = install_signals(&stop)?;
    // Start-up: thaw and remove groups left by dead owners (SIGKILL, crash). Needs root; a
    // no-op otherwise.
    if quiesce::effective_uid() == Some(0) && !matches!(args.command, PowerCommand::Cleanup) {
        let r = quiesce::cleanup_stale();
        for d in &r.removed {
            eprintln!("preheat-power: removed stale cgroup {}", d.display());
        }
        for e in &r.errors {
            eprintln!("preheat-power: stale cgroup cleanup: {e}");
        }
    }
    match args.command {
        PowerCommand::Residency(a) => residency(a, &stop),
        PowerCommand::QuiesceBench(a) => quiesce_bench(a, &stop),
        PowerCommand::Profile(a) => {
            println!("{}", load_profile(a.profile.as_deref())?.to_json());
            Ok(())
        }
        PowerCommand::Cleanup => {
            if quiesce::effective_uid() != Some(0) {
                bail!("cleanup needs root (cgroups of other runs are root-owned)");
            }
            let r = quiesce::cleanup_stale();
            for d in &r.removed {
                println!("removed stale cgroup {}", d.display());
            }
            if r.removed.is_empty() {
                println!("no stale preheat-bg-* cgroups");
            }
            if !r.errors.is_empty() {
                bail!("stale cgroup cleanup failed: {}", r.errors.join("; "));
            }
            Ok(())
        }
    }
}

/// The JSON document of `preheat power residency --json`: the one residency shape
/// ([`Residency`], measured) and the energy modeled from it.
#[derive(Debug, serde::Serialize)]
pub struct ResidencyOutput {
    pub residency: Residency,
    /// Null where the model declines (see `energy_unavailable`).
    pub energy: Option<EnergyReport>,
    pub energy_unavailable: Option<String>,
}

fn residency(a: ResidencyArgs, stop: &AtomicBool) -> anyhow::Result<()> {
    if !(a.for_s.is_finite() && a.for_s > 0.0) {
        bail!("--for-s must be a positive number of seconds");
    }
    let profile = load_profile(a.profile.as_deref())?;
    let machine = a.machine.root();
    let before = Snapshot::read(&machine).context("reading idle residency")?;
    let end = Instant::now() + Duration::from_secs_f64(a.for_s);
    while let Some(left) = end.checked_duration_since(Instant::now()) {
        if stop.load(Ordering::Relaxed) {
            bail!("interrupted by signal");
        }
        if left.is_zero() {
            break;
        }
        std::thread::sleep(left.min(Duration::from_millis(100)));
    }
    let after = Snapshot::read(&machine).context("reading idle residency")?;
    let diff = before.diff(&after)?;
    let (energy, energy_unavailable) = match profile.model(&diff) {
        Ok(e) => (Some(e), None),
        Err(why) => (None, Some(why)),
    };
    let out = ResidencyOutput {
        residency: diff.report(),
        energy,
        energy_unavailable,
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    print!("{}", out.residency.render());
    match (&out.energy, &out.energy_unavailable) {
        (Some(e), _) => print_energy(e),
        (None, why) => println!(
            "  {}",
            why.as_deref().unwrap_or("modeled energy unavailable")
        ),
    }
    Ok(())
}

fn print_energy(e: &EnergyReport) {
    let p = &e.average_power;
    println!(
        "  modeled (profile {}): average power {:.2} W [{:.2}–{:.2}], energy {:.3} J [{:.3}–{:.3}]",
        e.profile,
        p.independent.value,
        p.max_overlap.value,
        p.min_overlap.value,
        e.energy.independent.value,
        e.energy.max_overlap.value,
        e.energy.min_overlap.value
    );
    println!(
        "  (modeled: CPU co-activity assumed independent; [max overlap – min overlap] bounds)"
    );
}

fn fmt_summary(s: &Summary) -> String {
    if s.n == 0 {
        return "n=0".into();
    }
    format!(
        "{:.1} ({:.1}–{:.1}) / {:.1}",
        s.p50, s.p50_ci[0], s.p50_ci[1], s.p99
    )
}

fn quiesce_bench(a: QuiesceBenchArgs, stop: &Arc<AtomicBool>) -> anyhow::Result<()> {
    if !(a.duration_s.is_finite() && a.duration_s > 0.0) {
        bail!("--duration-s must be a positive number of seconds");
    }
    let cfg = BenchConfig {
        duration: Duration::from_secs_f64(a.duration_s),
        rounds: a.rounds,
        io: match a.io_file {
            Some(path) => Io::File {
                path,
                bytes: a.io_bytes,
            },
            None => Io::Emulated {
                wait: Duration::from_micros(a.io_wait_us),
            },
        },
        work: Duration::from_micros(a.work_us),
        think: Duration::from_micros(a.think_us),
        hogs: a.hogs,
        pin: !a.no_pin,
        freezer: a.freezer,
        profile: load_profile(a.profile.as_deref())?,
        machine: a.machine.root(),
        stop: stop.clone(),
    };
    let report = bench::run_bench(&cfg)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_bench(&report);
    }
    Ok(())
}

/// Human-readable bench report.
pub fn print_bench(r: &BenchReport) {
    print_bench_setup(r);
    println!();
    print_bench_table(r);
    println!();
    print_bench_modes(r);
    println!();
    print_bench_labels(r);
}

/// The experiment, whether quiescence is available (and where), and the request and machine.
fn print_bench_setup(r: &BenchReport) {
    let c = &r.config;
    println!("{}", r.experiment);
    match (&r.quiescence.available, &r.quiescence.reason) {
        (true, _) => println!(
            "  freezer: cgroup {:?} at {}",
            r.quiescence.backend.expect("available implies a backend"),
            r.quiescence
                .group
                .as_ref()
                .map(|g| g.display().to_string())
                .unwrap_or_default()
        ),
        (false, reason) => {
            let reason = reason.as_deref().unwrap_or("unknown reason");
            println!(
                "  QUIESCENCE UNAVAILABLE: {}",
                reason
                    .strip_prefix("quiescence unavailable: ")
                    .unwrap_or(reason)
            )
        }
    }
    let io = match (&c.io_emulated_wait, &c.io_file) {
        (Some(w), _) => format!("{:.0} µs device wait (emulated: a sleep)", w.value),
        (None, Some(f)) => format!(
            "pread of {} B from {} (measured, page cache allowed)",
            c.io_bytes.unwrap_or(0),
            f.display()
        ),
        _ => "?".into(),
    };
    println!(
        "  request: {io}, then {:.0} µs CPU work (calibrated {:.0} µs, measured); {} hog(s); \
         critical CPU {:?}, hog CPUs {:?}; {} rounds × {:.2} s blocks; {} CPUs, idle states {:?}",
        c.work_target.value,
        c.work_calibrated.value,
        c.hogs,
        c.critical_cpu,
        c.hog_cpus,
        c.rounds,
        c.block.value,
        r.cpus,
        r.idle_states
    );
}

/// The table: one line per mode with its latency, residency, CPU times and energy per request.
fn print_bench_table(r: &BenchReport) {
    println!(
        "  {:<20} {:>6} {:>28} {:>9} {:>7} {:>8} {:>8} {:>24}",
        "mode",
        "n",
        "latency p50 (95% CI) / p99 µs",
        "deep-idle",
        "busy",
        "bg CPU",
        "other",
        "J/request [bounds]"
    );
    for m in &r.modes {
        let energy = m.energy_per_request.as_ref().map_or_else(
            || "unavailable".to_string(),
            |e| {
                format!(
                    "{:.4} [{:.4}–{:.4}]",
                    e.independent.value, e.max_overlap.value, e.min_overlap.value
                )
            },
        );
        println!(
            "  {:<20} {:>6} {:>28} {:>8.1}% {:>6.1}% {:>7.3}s {:>7.1}% {:>24}",
            m.mode_name(),
            m.requests,
            fmt_summary(&m.latency),
            100.0 * m.deep_idle_share.value,
            100.0 * m.busy_share.value,
            m.background_cpu.value,
            100.0 * m.other_cpu_share.value,
            energy
        );
    }
}

/// Each mode in words: its average power, the background's energy cost, the freezer's timing.
fn print_bench_modes(r: &BenchReport) {
    for m in &r.modes {
        let power = m.energy.as_ref().map_or_else(
            || "modeled energy unavailable".to_string(),
            |e| {
                let p = &e.average_power;
                format!(
                    "modeled average power {:.2} W [{:.2}–{:.2}]",
                    p.independent.value, p.max_overlap.value, p.min_overlap.value
                )
            },
        );
        println!(
            "  {}: {}; {power} over {:.2} s",
            m.mode_name(),
            m.description,
            m.duration.value
        );
        if let Some(b) = &m.background_energy {
            println!(
                "    background work costs {:.1} J per CPU-second above the reference [{:.1} max \
                 overlap, {:.1} min overlap] (modeled)",
                b.independent.value, b.max_overlap.value, b.min_overlap.value
            );
        }
        if let Some(f) = &m.freeze {
            println!(
                "    freeze settled before the I/O completed in {}/{} requests; freeze write p50 \
                 {:.1} / p99 {:.1} µs, thaw write p50 {:.1} / p99 {:.1} µs (measured)",
                f.settled_before_io_done,
                f.holds,
                f.hold_call.p50,
                f.hold_call.p99,
                f.release_call.p50,
                f.release_call.p99
            );
        }
    }
}

/// What is measured, emulated and modeled, then the report's notes.
fn print_bench_labels(r: &BenchReport) {
    let c = &r.config;
    println!(
        "  labels: latency, residency shares and CPU times measured; I/O wait {}; energy modeled \
         (profile {}, co-activity independent, bounds = max/min overlap)",
        if c.io_emulated_wait.is_some() {
            "emulated"
        } else {
            "measured"
        },
        c.profile
    );
    for n in &r.notes {
        println!("  note: {n}");
    }
}

impl crate::bench::ModeReport {
    fn mode_name(&self) -> &'static str {
        self.mode.name()
    }
}
