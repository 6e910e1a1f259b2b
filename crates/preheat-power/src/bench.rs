//! The slack-enabled-quiescence experiment (`preheat power quiesce-bench`), after Zhu et al.
//! §3: "The system can delay non-critical background tasks … while synchronous I/O operations
//! … are blocking the user response."
//!
//! Set-up: one or more background CPU hogs ([`crate::hogs`]: child processes running a shell
//! busy loop, registered in a [`BackgroundGroup`], pinned to the CPUs other than the critical
//! one), and a latency-critical request loop on CPU 0. Each request does a slow "I/O" — by default an
//! **emulated** 2 ms device wait (a blocking sleep), or real reads of a file (`--io-file`, no
//! O_DIRECT, so the page cache may serve them) — then a fixed amount of CPU work calibrated to
//! `work_us` on an idle machine. Latency is measured from the request's start to the end of its
//! CPU work.
//!
//! Modes, run in interleaved blocks (round `r` starts with mode `r mod 3`) so slow drift and other
//! tenants' load hit every mode alike:
//!
//! * `no-quiescence` — (a): the background runs all the time;
//! * `quiesce-during-io` — (b): the request starts freezing the background group when its I/O
//!   starts and starts thawing it when the I/O completes (one write each; the critical request
//!   never waits for the background to settle), so the background runs only while the critical
//!   work runs (piggybacked). Both writes, and one read of the freezer state to count whether
//!   the freeze had settled, are inside the measured latency;
//! * `background-frozen` — reference: the background group is frozen for the whole block (the
//!   floor: no background work at all).
//!
//! Per mode: the critical latency (p50/p99 with 95% CIs, sample count; measured), I/O wait
//! (emulated or measured), the machine's deep-idle residency share and busy share (measured from
//! cpuidle counters; machine-wide, so other tenants are in it — `other_cpu_share` estimates how
//! much), the CPU time the background got (measured), and modeled energy per request
//! ([`crate::energy`], labeled `modeled`). Mode (b) also reports how often the freeze had
//! settled before the I/O completed and what the freeze/thaw calls cost.
//!
//! Without root or a freezer only mode (a) runs, and the report says why quiescence is
//! unavailable.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::energy::{Bounds, EnergyReport, PowerProfile};
use crate::hogs::{self_cpu_ns, spawn_hogs, Hogs};
use crate::quiesce::{self, Backend, BackgroundGroup, FreezeState, Freezer, Preference};
use crate::residency::{is_poll, CounterKind, MachineRoot, Residency, ResidencyDiff, Snapshot};
use crate::stats::{summarize, Summary};
use crate::{Label, Quantity};

/// The slow "I/O" of each critical request.
#[derive(Clone, Debug, PartialEq)]
pub enum Io {
    /// A blocking sleep of this length standing in for a device wait (emulated).
    Emulated { wait: Duration },
    /// A real `pread` of `bytes` at a random aligned offset of `path` (measured; page cache
    /// allowed).
    File { path: PathBuf, bytes: usize },
}

/// Configuration of one bench run.
#[derive(Clone, Debug)]
pub struct BenchConfig {
    /// Total measuring time over all modes and rounds.
    pub duration: Duration,
    /// Rounds; each runs one block of every mode.
    pub rounds: u32,
    pub io: Io,
    /// CPU work per request, calibrated on this machine before the hogs start.
    pub work: Duration,
    /// Sleep between requests (background runs unfrozen then).
    pub think: Duration,
    /// Number of background hog processes.
    pub hogs: usize,
    /// Pin the critical loop to CPU 0 and the hogs to the other CPUs.
    pub pin: bool,
    pub freezer: Preference,
    pub profile: PowerProfile,
    /// The machine whose idle counters are read (normally the real one).
    pub machine: MachineRoot,
    /// Set to stop early (signal handler); the run then fails with "interrupted".
    pub stop: Arc<AtomicBool>,
}

impl Default for BenchConfig {
    fn default() -> Self {
        BenchConfig {
            duration: Duration::from_secs(9),
            rounds: 6,
            io: Io::Emulated {
                wait: Duration::from_millis(2),
            },
            work: Duration::from_micros(200),
            think: Duration::ZERO,
            hogs: 1,
            pin: true,
            freezer: Preference::Auto,
            profile: PowerProfile::default(),
            machine: MachineRoot::from_env(),
            stop: Arc::new(AtomicBool::new(false)),
        }
    }
}

/// The three modes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    NoQuiescence,
    QuiesceDuringIo,
    BackgroundFrozen,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::NoQuiescence => "no-quiescence",
            Mode::QuiesceDuringIo => "quiesce-during-io",
            Mode::BackgroundFrozen => "background-frozen",
        }
    }
    pub fn description(self) -> &'static str {
        match self {
            Mode::NoQuiescence => "(a) background runs all the time",
            Mode::QuiesceDuringIo => {
                "(b) background frozen while each request waits on its I/O (slack-enabled quiescence)"
            }
            Mode::BackgroundFrozen => "reference: background frozen for the whole block",
        }
    }
}

/// Is quiescence available, and with which freezer.
#[derive(Clone, Debug, Serialize)]
pub struct QuiescenceStatus {
    pub available: bool,
    pub backend: Option<Backend>,
    pub group: Option<PathBuf>,
    pub reason: Option<String>,
}

/// What the run was configured to do, as run.
#[derive(Clone, Debug, Serialize)]
pub struct ConfigReport {
    /// "emulated" (sleep) or "file".
    pub io_kind: String,
    /// Emulated wait, or null for file reads.
    pub io_emulated_wait: Option<Quantity>,
    pub io_file: Option<PathBuf>,
    pub io_bytes: Option<usize>,
    pub work_target: Quantity,
    /// Calibrated work per request on the idle machine before the hogs started.
    pub work_calibrated: Quantity,
    pub work_iterations: u64,
    pub think: Quantity,
    pub hogs: usize,
    pub critical_cpu: Option<usize>,
    pub hog_cpus: Vec<Option<usize>>,
    pub rounds: u32,
    pub block: Quantity,
    pub profile: String,
}

/// Freeze/thaw statistics of mode (b).
#[derive(Clone, Debug, Serialize)]
pub struct FreezeStats {
    /// Requests that froze the background.
    pub holds: usize,
    /// Of those, how many found the group fully frozen when their I/O completed (measured).
    pub settled_before_io_done: usize,
    /// Cost of the freeze request (one write), µs, measured.
    pub hold_call: Summary,
    /// Cost of the thaw request (one write; the request does not wait for the thaw to
    /// settle), µs, measured.
    pub release_call: Summary,
}

/// Results of one mode, accumulated over its blocks.
#[derive(Clone, Debug, Serialize)]
pub struct ModeReport {
    pub mode: Mode,
    pub description: String,
    pub blocks: usize,
    pub requests: usize,
    pub duration: Quantity,
    /// Critical request latency, µs (measured).
    pub latency: Summary,
    /// The I/O part of each request, µs (label emulated for the sleep, measured for file reads).
    pub io_wait: Summary,
    /// Idle residency over the mode's blocks, the one shape of [`crate::residency`]
    /// (measured; POLL busy, deep idle = every non-POLL state).
    pub residency: Residency,
    /// Share of all CPU time (CPUs × wall) in deep idle states per the profile (measured).
    pub deep_idle_share: Quantity,
    /// Mean share of CPU time busy (POLL counts as busy) (measured).
    pub busy_share: Quantity,
    /// Idle-state entries per second, all CPUs (measured; null without entry counts).
    pub idle_transitions_per_s: Option<Quantity>,
    /// CPU time the background hogs got (measured).
    pub background_cpu: Quantity,
    /// background_cpu / (CPUs × wall) (measured).
    pub background_cpu_share: Quantity,
    /// Busy CPU time not accounted to this process or the hogs, / (CPUs × wall): other tenants
    /// and the idle task's POLL (measured, approximate).
    pub other_cpu_share: Quantity,
    /// Modeled energy over the mode's blocks (all values labeled modeled); null where the
    /// model declines (no per-state idle time: see `energy_unavailable`).
    pub energy: Option<EnergyReport>,
    /// Why there is no modeled energy on this machine.
    pub energy_unavailable: Option<String>,
    /// Modeled energy per critical request, J (labeled modeled).
    pub energy_per_request: Option<Bounds>,
    pub freeze: Option<FreezeStats>,
    /// Modeled energy per CPU-second of background work, above the `background-frozen`
    /// reference: (P̄_mode − P̄_ref) / (background CPU-s per s), J per CPU-second, with the same
    /// co-activity assumption applied to both modes (labeled modeled). The paper's argument in
    /// one number: background work co-running with critical work should cost the
    /// `additional_active_w` of a further CPU, not the `first_active_w` of waking the package.
    /// Null for the reference itself, without quiescence, or with < 1 ms of background CPU.
    pub background_energy: Option<Bounds>,
}

/// The whole bench report.
#[derive(Clone, Debug, Serialize)]
pub struct BenchReport {
    pub experiment: String,
    pub quiescence: QuiescenceStatus,
    pub config: ConfigReport,
    pub cpus: usize,
    pub idle_states: Vec<String>,
    pub modes: Vec<ModeReport>,
    pub notes: Vec<String>,
}

/// Fixed CPU work: `iters` rounds of xorshift. The xorshift here is the work itself (a fixed
/// instruction sequence per round), not a random number generator: keep it, not `rand`.
pub fn burn(iters: u64) -> u64 {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for i in 0..std::hint::black_box(iters) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x = x.wrapping_add(i);
    }
    std::hint::black_box(x)
}

/// Iterations of [`burn`] that take `target` on this machine now (best of 7 trials).
pub fn calibrate(target: Duration) -> (u64, Duration) {
    const PROBE: u64 = 200_000;
    let best = (0..7)
        .map(|_| {
            let t = Instant::now();
            burn(PROBE);
            t.elapsed()
        })
        .min()
        .unwrap_or(Duration::from_micros(1))
        .max(Duration::from_nanos(1));
    let iters = ((target.as_nanos() as f64 / best.as_nanos() as f64) * PROBE as f64).round() as u64;
    let iters = iters.max(1);
    let t = Instant::now();
    burn(iters);
    (iters, t.elapsed())
}

#[derive(Default)]
struct Acc {
    blocks: usize,
    latency_us: Vec<f64>,
    io_us: Vec<f64>,
    hold_us: Vec<f64>,
    release_us: Vec<f64>,
    settled: usize,
    residency: ResidencyDiff,
    hog_ns: u64,
    self_ns: u64,
}

struct IoState {
    io: Io,
    file: Option<File>,
    slots: u64,
    rng: StdRng,
    buf: Vec<u8>,
}

impl IoState {
    fn new(io: &Io) -> anyhow::Result<IoState> {
        let (file, slots, buf) = match io {
            Io::Emulated { .. } => (None, 0, Vec::new()),
            Io::File { path, bytes } => {
                if *bytes == 0 {
                    bail!("--io-bytes must be > 0");
                }
                let f = File::open(path).with_context(|| format!("opening {}", path.display()))?;
                let len = f.metadata()?.len();
                let slots = len / *bytes as u64;
                if slots == 0 {
                    bail!(
                        "{} is smaller than one read of {bytes} bytes",
                        path.display()
                    );
                }
                (Some(f), slots, vec![0u8; *bytes])
            }
        };
        Ok(IoState {
            io: io.clone(),
            file,
            slots,
            rng: StdRng::seed_from_u64(0x2545_F491_4F6C_DD1D),
            buf,
        })
    }

    fn run(&mut self) -> anyhow::Result<()> {
        match &self.io {
            Io::Emulated { wait } => std::thread::sleep(*wait),
            Io::File { path, .. } => {
                let off = self.rng.gen_range(0..self.slots) * self.buf.len() as u64;
                let f = self.file.as_ref().expect("file mode has a file");
                f.read_exact_at(&mut self.buf, off)
                    .with_context(|| format!("reading {} at {off}", path.display()))?;
            }
        }
        Ok(())
    }
}

/// Run the experiment. See the module documentation.
pub fn run_bench(cfg: &BenchConfig) -> anyhow::Result<BenchReport> {
    if cfg.rounds == 0 || cfg.duration.is_zero() {
        bail!("duration and rounds must be > 0");
    }
    let first = Snapshot::read(&cfg.machine).context("reading cpuidle residency")?;
    let ncpu = first.cpus.len();
    let idle_states: Vec<String> = first
        .cpus
        .iter()
        .find(|c| !c.states.is_empty())
        .map(|c| c.states.iter().map(|s| s.name.clone()).collect())
        .unwrap_or_default();
    let mut io = IoState::new(&cfg.io)?;

    // Calibrate before any hog runs.
    let online = preheat_engine::os::online_cpus().max(1);
    let critical_cpu = (cfg.pin && online >= 2).then_some(0usize);
    let (iters, calibrated) =
        on_cpu(critical_cpu, || calibrate(cfg.work)).expect("calibration does not panic");

    // Order matters for drop: hogs first (dropped last), then the group (dropped first, thaws).
    let mut hogs = Hogs::default();
    let (mut group, status) = background_group(cfg.freezer);
    let hog_cpus = spawn_hogs(cfg.hogs, online, critical_cpu, &mut hogs, group.as_mut())?;

    let modes: Vec<Mode> = if group.is_some() {
        vec![
            Mode::NoQuiescence,
            Mode::QuiesceDuringIo,
            Mode::BackgroundFrozen,
        ]
    } else {
        vec![Mode::NoQuiescence]
    };
    let block = cfg.duration / (cfg.rounds * modes.len() as u32);
    let mut accs: Vec<Acc> = modes.iter().map(|_| Acc::default()).collect();

    // The critical loop, on its own (pinned) thread.
    let result: anyhow::Result<()> = on_cpu(critical_cpu, || -> anyhow::Result<()> {
        for round in 0..cfg.rounds as usize {
            for k in 0..modes.len() {
                let mi = (round + k) % modes.len();
                let mode = modes[mi];
                if cfg.stop.load(Ordering::Relaxed) {
                    bail!("interrupted by signal");
                }
                let g = group.as_mut();
                run_block(cfg, mode, block, iters, &mut io, g, &hogs, &mut accs[mi])?;
            }
        }
        Ok(())
    })
    .unwrap_or_else(|_| Err(anyhow::anyhow!("the critical loop panicked")));
    // Clean up now (and also on the error path, before returning it).
    if let Some(g) = group.take() {
        g.close().context("removing the background cgroup")?;
    }
    drop(hogs);
    result?;

    let mut reports = Vec::new();
    for (mode, acc) in modes.iter().zip(accs) {
        reports.push(mode_report(cfg, *mode, acc, ncpu)?);
    }
    add_background_energy(&mut reports);
    let (io_kind, io_emulated_wait, io_file, io_bytes) = io_config(&cfg.io);
    Ok(BenchReport {
        experiment: "slack-enabled quiescence (Zhu et al. §3)".into(),
        notes: report_notes(cfg, first.kind, status.available),
        quiescence: status,
        config: ConfigReport {
            io_kind,
            io_emulated_wait,
            io_file,
            io_bytes,
            work_target: Quantity::new(cfg.work.as_secs_f64() * 1e6, "us", Label::Emulated),
            work_calibrated: Quantity::measured(calibrated.as_secs_f64() * 1e6, "us"),
            work_iterations: iters,
            think: Quantity::new(cfg.think.as_secs_f64() * 1e6, "us", Label::Emulated),
            hogs: cfg.hogs,
            critical_cpu,
            hog_cpus,
            rounds: cfg.rounds,
            block: Quantity::measured(block.as_secs_f64(), "s"),
            profile: cfg.profile.name.clone(),
        },
        cpus: ncpu,
        idle_states,
        modes: reports,
    })
}

/// Run `f` on a thread of its own, pinned to `cpu` if given; `Err` if it panicked.
fn on_cpu<T: Send>(cpu: Option<usize>, f: impl FnOnce() -> T + Send) -> std::thread::Result<T> {
    std::thread::scope(|s| {
        s.spawn(|| {
            if let Some(c) = cpu {
                let _ = preheat_engine::os::pin_current_thread(c);
            }
            f()
        })
        .join()
    })
}

/// The cgroup the hogs go into (after removing stale ones), or why quiescence is unavailable.
fn background_group(freezer: Preference) -> (Option<BackgroundGroup>, QuiescenceStatus) {
    let unavailable = |backend, reason: String| QuiescenceStatus {
        available: false,
        backend,
        group: None,
        reason: Some(reason),
    };
    let f = match Freezer::detect(freezer) {
        Err(e) => return (None, unavailable(None, e.to_string())),
        Ok(f) => f,
    };
    let stale = quiesce::cleanup_stale();
    for e in stale.errors {
        eprintln!("preheat-power: stale cgroup cleanup: {e}");
    }
    let backend = f.backend();
    match BackgroundGroup::create(f) {
        Ok(g) => {
            let dir = g.dir().to_path_buf();
            (
                Some(g),
                QuiescenceStatus {
                    available: true,
                    backend: Some(backend),
                    group: Some(dir),
                    reason: None,
                },
            )
        }
        Err(e) => (None, unavailable(Some(backend), e.to_string())),
    }
}

/// The report's description of the I/O: (kind, emulated wait, file, bytes per read).
fn io_config(io: &Io) -> (String, Option<Quantity>, Option<PathBuf>, Option<usize>) {
    match io {
        Io::Emulated { wait } => (
            "emulated".to_string(),
            Some(Quantity::new(
                wait.as_secs_f64() * 1e6,
                "us",
                Label::Emulated,
            )),
            None,
            None,
        ),
        Io::File { path, bytes } => ("file".to_string(), None, Some(path.clone()), Some(*bytes)),
    }
}

/// What a reader of the report must know about how it was measured.
fn report_notes(cfg: &BenchConfig, counters: CounterKind, quiescence: bool) -> Vec<String> {
    let mut notes = vec![
        "residency is machine-wide: other tenants' load is included (see other_cpu_share)".into(),
        "energy is modeled from residency and the power profile, not measured (no RAPL here)"
            .into(),
    ];
    if counters != CounterKind::Cpuidle {
        notes.push(format!(
            "{}: residency shares come from /proc/stat; modeled energy and idle-state entries \
             are unavailable",
            crate::residency::NO_CPUIDLE_REASON
        ));
    }
    notes.extend([
        "in quiesce-during-io the background only runs while the critical request computes, so \
         it gets less CPU (background_cpu): compare energy together with the background work done"
            .into(),
    ]);
    if matches!(cfg.io, Io::File { .. }) {
        notes
            .push("file reads are plain pread (no O_DIRECT): the page cache may serve them".into());
    }
    if !quiescence {
        notes.push("quiescence unavailable: only mode (a) was run".into());
    }
    notes
}

#[allow(clippy::too_many_arguments)]
fn run_block(
    cfg: &BenchConfig,
    mode: Mode,
    block: Duration,
    iters: u64,
    io: &mut IoState,
    mut group: Option<&mut BackgroundGroup>,
    hogs: &Hogs,
    acc: &mut Acc,
) -> anyhow::Result<()> {
    let freeze_all = mode == Mode::BackgroundFrozen;
    let quiesce = mode == Mode::QuiesceDuringIo;
    if freeze_all {
        group
            .as_deref_mut()
            .context("reference mode without a group")?
            .hold()?;
    }
    let snap0 = Snapshot::read(&cfg.machine)?;
    let hog0 = hogs.cpu_ns();
    let self0 = self_cpu_ns();
    let end = Instant::now() + block;
    let mut outcome = Ok(());
    while Instant::now() < end && !cfg.stop.load(Ordering::Relaxed) {
        let t0 = Instant::now();
        if quiesce {
            let g = group
                .as_deref_mut()
                .context("quiesce mode without a group")?;
            let h = Instant::now();
            if let Err(e) = g.begin_hold() {
                outcome = Err(e.into());
                break;
            }
            acc.hold_us.push(h.elapsed().as_secs_f64() * 1e6);
        }
        let ti = Instant::now();
        let io_result = io.run();
        acc.io_us.push(ti.elapsed().as_secs_f64() * 1e6);
        if quiesce {
            let g = group
                .as_deref_mut()
                .context("quiesce mode without a group")?;
            if matches!(g.state(), Ok(FreezeState::Frozen)) {
                acc.settled += 1;
            }
            let r = Instant::now();
            if let Err(e) = g.begin_release() {
                outcome = Err(e.into());
                break;
            }
            acc.release_us.push(r.elapsed().as_secs_f64() * 1e6);
        }
        if let Err(e) = io_result {
            outcome = Err(e);
            break;
        }
        burn(iters);
        acc.latency_us.push(t0.elapsed().as_secs_f64() * 1e6);
        if !cfg.think.is_zero() {
            std::thread::sleep(cfg.think);
        }
    }
    let snap1 = Snapshot::read(&cfg.machine);
    let hog1 = hogs.cpu_ns();
    let self1 = self_cpu_ns();
    if freeze_all {
        if let Some(g) = group {
            g.release()?;
        }
    }
    outcome?;
    let diff = snap0.diff(&snap1?)?;
    acc.residency.accumulate(&diff)?;
    acc.hog_ns += hog1.saturating_sub(hog0);
    acc.self_ns += self1.saturating_sub(self0);
    acc.blocks += 1;
    Ok(())
}

fn add_background_energy(reports: &mut [ModeReport]) {
    let Some(reference) = reports
        .iter()
        .find(|m| m.mode == Mode::BackgroundFrozen)
        .and_then(|m| m.energy.as_ref())
        .map(|e| e.average_power.clone())
    else {
        return;
    };
    for m in reports.iter_mut() {
        let bg_rate = if m.duration.value > 0.0 {
            m.background_cpu.value / m.duration.value
        } else {
            0.0
        };
        if m.mode == Mode::BackgroundFrozen || m.background_cpu.value < 1e-3 || bg_rate <= 0.0 {
            continue;
        }
        let Some(p) = m.energy.as_ref().map(|e| &e.average_power) else {
            continue;
        };
        let f = |a: &Quantity, r: &Quantity| {
            Quantity::modeled((a.value - r.value) / bg_rate, "J/CPU-s")
        };
        m.background_energy = Some(Bounds {
            independent: f(&p.independent, &reference.independent),
            max_overlap: f(&p.max_overlap, &reference.max_overlap),
            min_overlap: f(&p.min_overlap, &reference.min_overlap),
        });
    }
}

fn mode_report(cfg: &BenchConfig, mode: Mode, acc: Acc, ncpu: usize) -> anyhow::Result<ModeReport> {
    if acc.residency.windows == 0 {
        bail!("no block of this mode completed");
    }
    let res = acc.residency;
    let profile = &cfg.profile;
    let wall_s = res.wall_us as f64 / 1e6;
    let cpu_s = wall_s * ncpu as f64;
    // The profile classifies cpuidle states; an undivided /proc/stat idle time is idle as a whole.
    let per_state = res.kind == CounterKind::Cpuidle;
    let busy = if per_state {
        res.busy(|n| !profile.is_active(n))
    } else {
        res.busy_default()
    };
    let busy_us: u64 = busy.iter().map(|b| b.busy_us).sum();
    let busy_s = busy_us as f64 / 1e6;
    let hog_s = acc.hog_ns as f64 / 1e9;
    let self_s = acc.self_ns as f64 / 1e9;
    let share = |x: f64| if cpu_s > 0.0 { x / cpu_s } else { 0.0 };
    let (energy, energy_unavailable) = match profile.model(&res) {
        Ok(e) => (Some(e), None),
        Err(why) => (None, Some(why)),
    };
    let requests = acc.latency_us.len();
    let energy_per_request = energy
        .as_ref()
        .map(|e| e.energy.per(requests as f64, "J/request"));
    let io_label = match cfg.io {
        Io::Emulated { .. } => Label::Emulated,
        Io::File { .. } => Label::Measured,
    };
    let freeze = (mode == Mode::QuiesceDuringIo).then(|| FreezeStats {
        holds: acc.hold_us.len(),
        settled_before_io_done: acc.settled,
        hold_call: summarize(&acc.hold_us, "us", Label::Measured),
        release_call: summarize(&acc.release_us, "us", Label::Measured),
    });
    Ok(ModeReport {
        mode,
        description: mode.description().into(),
        blocks: acc.blocks,
        requests,
        duration: Quantity::measured(wall_s, "s"),
        latency: summarize(&acc.latency_us, "us", Label::Measured),
        io_wait: summarize(&acc.io_us, "us", io_label),
        residency: res.report(),
        deep_idle_share: Quantity::measured(
            if per_state {
                res.share_of_states(|n| profile.is_deep(n))
            } else {
                res.share_of_states(|n| !is_poll(n))
            },
            "share",
        ),
        busy_share: Quantity::measured(share(busy_s).clamp(0.0, 1.0), "share"),
        idle_transitions_per_s: (per_state && wall_s > 0.0)
            .then(|| Quantity::measured(res.transitions() as f64 / wall_s, "1/s")),
        background_cpu: Quantity::measured(hog_s, "s"),
        background_cpu_share: Quantity::measured(share(hog_s), "share"),
        other_cpu_share: Quantity::measured(share((busy_s - hog_s - self_s).max(0.0)), "share"),
        energy,
        energy_unavailable,
        energy_per_request,
        freeze,
        background_energy: None,
    })
}
