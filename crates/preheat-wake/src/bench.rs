//! `preheat wake bench`: how long a blocked thread takes to run after it is woken, against the
//! idle gap before the wakeup, without and with a planned window (paper: anticipatory wakeups
//! hide the exit latency of sleep states).
//!
//! A sleeper thread pinned to one CPU blocks in one of four ways — a futex, a blocking socket
//! read, `epoll_wait` on that socket (what an event-loop server does), a timed sleep — and a
//! waker pinned to another CPU wakes it
//! after `gap` (futex wake / datagram; the sleep wakes by its timer). Latency = the sleeper's
//! first timestamp − the wake instant (for the timed sleep: − its due time). With a mechanism,
//! an in-process planner daemon is asked, when the gap starts, for a window around the wake
//! instant; it arms the CPU its own lead ahead. Rounds interleave gaps and waiters in shuffled
//! order; each mechanism is a block of its own (one planner owns PM QoS at a time), repeated.

use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use preheat_engine::{os, time::now_ns};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use serde::Serialize;

use crate::client::WakeClient;
use crate::daemon::{Config, Daemon};
use crate::keep_awake::MechChoice;

#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// Idle gaps before the wakeup, µs.
    #[arg(long, value_delimiter = ',', default_value = "10,100,1000,10000")]
    pub gaps_us: Vec<u64>,
    /// Measurements per (mechanism, gap, waiter).
    #[arg(long, default_value_t = 60)]
    pub rounds: usize,
    /// Mechanisms: none, and planner windows via pmqos, dma or spin (unavailable ones are
    /// skipped with the reason).
    #[arg(long, value_delimiter = ',', default_value = "none,pmqos,dma,spin")]
    pub mechs: Vec<String>,
    /// How the sleeper blocks: futex, socket (blocking read), epoll, sleep (timed).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "futex,socket,epoll,sleep"
    )]
    pub waiters: Vec<String>,
    /// Keep the mechanism in effect through the whole gap (a window from the gap's start)
    /// instead of a planned window around the wakeup: what the mechanism can do at best, as a
    /// hot floor holds it.
    #[arg(long)]
    pub held: bool,
    /// CPU of the sleeping thread.
    #[arg(long, default_value_t = 1)]
    pub sleeper_cpu: usize,
    /// CPU of the waker.
    #[arg(long, default_value_t = 0)]
    pub waker_cpu: usize,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
enum Waiter {
    Futex,
    Socket,
    Epoll,
    Sleep,
}

const WAITERS: [Waiter; 4] = [Waiter::Futex, Waiter::Socket, Waiter::Epoll, Waiter::Sleep];

#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Cell {
    pub label: String,
    pub mech: String,
    pub waiter: String,
    pub gap_us: u64,
    pub n: usize,
    pub p50_us: f64,
    /// 95% confidence interval of the p50 (order statistics).
    pub p50_ci_us: [f64; 2],
    pub p99_us: f64,
    pub mean_us: f64,
}

#[derive(Debug, Serialize)]
pub struct BenchReport {
    pub label: &'static str,
    pub sleeper_cpu: usize,
    pub waker_cpu: usize,
    pub cells: Vec<Cell>,
    pub skipped: Vec<String>,
}

/// Prefix of the bench's private run dirs in the temp dir (`<prefix><pid>-<tag>`).
const DIR_PREFIX: &str = "preheat-wake-bench-";

/// Remove this process's bench dirs: for a signal handler (the CLI registers it with the
/// launcher's `on_signal`), where no drop runs. A demo stopped by SIGTERM while it calibrated
/// left one behind in a CI-like suite run.
pub fn remove_own_dirs() {
    // First: no bench makes a new one from now on (a calibration runs on in another thread
    // until the process exits; see `BenchDir::new`).
    STOPPING.store(true, Ordering::SeqCst);
    let own = format!("{DIR_PREFIX}{}-", std::process::id());
    let Ok(rd) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for e in rd.flatten() {
        if e.file_name().to_string_lossy().starts_with(&own) {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// Set by [`remove_own_dirs`]: the process is stopping.
static STOPPING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// A private run dir for the bench's own planner, removed on drop (and by
/// [`remove_own_dirs`] on a signal; those of processes killed outright by the next bench).
struct BenchDir(std::path::PathBuf);

impl BenchDir {
    fn new(tag: &str) -> Result<BenchDir> {
        let tmp = std::env::temp_dir();
        preheat_engine::host::remove_left_by_the_dead(&tmp, DIR_PREFIX);
        let p = tmp.join(format!("{DIR_PREFIX}{}-{tag}", std::process::id()));
        std::fs::create_dir_all(&p).with_context(|| format!("creating {}", p.display()))?;
        let dir = BenchDir(p);
        // Checked after creating: either this sees the flag (and the drop removes the dir) or
        // the remover, which sets it first, sees the dir.
        if STOPPING.load(Ordering::SeqCst) {
            bail!("the process is stopping");
        }
        Ok(dir)
    }
    fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for BenchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The sleeper's side of one measurement.
struct Shared {
    /// Round number the sleeper should run next (futex word it waits for as a "go").
    go: AtomicU32,
    /// Futex word of the futex waiter.
    word: AtomicU32,
    kind: AtomicU32,
    due_ns: AtomicU64,
    /// Sleeper's timestamp after waking, and round done.
    woke_ns: AtomicU64,
    done: AtomicU32,
}

fn sleeper(sh: Arc<Shared>, sock: UnixDatagram, cpu: usize) {
    use std::os::fd::AsRawFd;
    let _ = os::pin_current_thread(cpu);
    let ep = os::Epoll::new().and_then(|e| e.add_readable(sock.as_raw_fd()).map(|_| e));
    let _ = os::set_timer_slack_ns(1);
    let mut last = 0u32;
    let mut buf = [0u8; 8];
    loop {
        let g = sh.go.load(Ordering::Acquire);
        if g == last {
            os::futex_wait(&sh.go, g, None);
            continue;
        }
        last = g;
        if g == u32::MAX {
            return;
        }
        match sh.kind.load(Ordering::Relaxed) {
            0 => {
                while sh.word.load(Ordering::Acquire) == 0 {
                    os::futex_wait(&sh.word, 0, None);
                }
            }
            1 => {
                let _ = sock.recv(&mut buf);
            }
            2 => {
                // As an event-loop server waits: epoll_wait, then read what is ready.
                if let Ok(ep) = &ep {
                    let _ = ep.wait(-1);
                }
                let _ = sock.recv(&mut buf);
            }
            _ => {
                let due = sh.due_ns.load(Ordering::Relaxed);
                let now = now_ns();
                if due > now {
                    std::thread::sleep(Duration::from_nanos(due - now));
                }
            }
        }
        sh.woke_ns.store(now_ns(), Ordering::Release);
        sh.done.store(g, Ordering::Release);
    }
}

pub fn run(a: BenchArgs) -> Result<()> {
    if os::online_cpus() < 2 {
        bail!("the wake bench needs two CPUs (sleeper and waker)");
    }
    let report = bench(&a)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    println!(
        "wake latency of a blocked thread on CPU {} woken from CPU {} [measured; p50 (95% CI) / p99 µs]",
        report.sleeper_cpu, report.waker_cpu
    );
    for c in &report.cells {
        println!(
            "  {:<6} {:<6} gap {:>6} µs: {:>7.1} ({:.1}–{:.1}) / {:>7.1}  (n={})",
            c.mech, c.waiter, c.gap_us, c.p50_us, c.p50_ci_us[0], c.p50_ci_us[1], c.p99_us, c.n
        );
    }
    for s in &report.skipped {
        println!("  skipped: {s}");
    }
    Ok(())
}

pub fn bench(a: &BenchArgs) -> Result<BenchReport> {
    let (tx, rx) = UnixDatagram::pair().context("socket pair")?;
    let sh = Arc::new(Shared {
        go: AtomicU32::new(0),
        word: AtomicU32::new(0),
        kind: AtomicU32::new(0),
        due_ns: AtomicU64::new(0),
        woke_ns: AtomicU64::new(0),
        done: AtomicU32::new(0),
    });
    let sh2 = sh.clone();
    let cpu = a.sleeper_cpu;
    let th = std::thread::spawn(move || sleeper(sh2, rx, cpu));
    let saved = os::get_affinity();
    let _ = os::pin_current_thread(a.waker_cpu);
    let mut cells = Vec::new();
    let mut skipped = Vec::new();
    let mut round = 0u32;
    let mut rng = StdRng::seed_from_u64(0x2545_f491_4f6c_dd1d);
    let waiters = parse_waiters(&a.waiters)?;
    if waiters.is_empty() || a.gaps_us.is_empty() || a.rounds == 0 {
        bail!("the bench needs at least one waiter, one gap and one round");
    }
    for mech in &a.mechs {
        let choice = mech_choice(mech)?;
        let tmp = BenchDir::new(mech)?;
        let daemon = match choice {
            None => None,
            Some(c) => match start_planner(c, mech, tmp.path().join("run"), a.sleeper_cpu) {
                Ok(d) => Some(d),
                Err(why) => {
                    skipped.push(format!("{mech}: {why}"));
                    continue;
                }
            },
        };
        let mut client = match &daemon {
            Some(_) => Some(
                WakeClient::connect(&tmp.path().join("run"))
                    .map_err(|e| anyhow::anyhow!("connecting to the bench planner: {e}"))?,
            ),
            None => None,
        };
        let mut samples: std::collections::BTreeMap<(u64, usize), Vec<f64>> = Default::default();
        for (gap_us, w) in round_plan(a, &waiters, &mut rng) {
            round = round.wrapping_add(1).max(1);
            let us = measure_wake(&sh, &tx, client.as_mut(), a, round, gap_us, WAITERS[w])?;
            samples.entry((gap_us, w)).or_default().push(us);
            // Let the window end before the next round starts.
            std::thread::sleep(Duration::from_micros(400));
        }
        drop(client);
        if let Some(d) = daemon {
            d.shutdown();
        }
        for ((gap_us, w), v) in samples {
            let s = preheat_model::stats::summarize(&v);
            cells.push(Cell {
                label: "measured".into(),
                mech: mech.clone(),
                waiter: format!("{:?}", WAITERS[w]).to_lowercase(),
                gap_us,
                n: s.n,
                p50_us: s.p50,
                p50_ci_us: [s.p50_lo, s.p50_hi],
                p99_us: s.p99,
                mean_us: s.mean,
            });
        }
    }
    sh.go.store(u32::MAX, Ordering::Release);
    os::futex_wake(&sh.go, 1);
    let _ = tx.send(&[0]);
    let _ = th.join();
    let _ = os::set_affinity(&saved);
    Ok(BenchReport {
        label: "measured",
        sleeper_cpu: a.sleeper_cpu,
        waker_cpu: a.waker_cpu,
        cells,
        skipped,
    })
}

/// The waiters named on the command line, as indices into [`WAITERS`].
fn parse_waiters(names: &[String]) -> Result<Vec<usize>> {
    names
        .iter()
        .map(|w| {
            WAITERS
                .iter()
                .position(|x| format!("{x:?}").eq_ignore_ascii_case(w))
                .with_context(|| format!("unknown waiter {w} (futex, socket, epoll, sleep)"))
        })
        .collect()
}

/// The mechanism named on the command line (`None`: no planner).
fn mech_choice(mech: &str) -> Result<Option<MechChoice>> {
    Ok(match mech {
        "none" => None,
        "pmqos" => Some(MechChoice::PmQos),
        "dma" => Some(MechChoice::Dma),
        "spin" => Some(MechChoice::Spin),
        other => bail!("unknown mechanism {other} (none, pmqos, dma, spin)"),
    })
}

/// The bench's own planner in `run`, using mechanism `mech` for the sleeper's CPU; `Err`: why
/// this mechanism is skipped (it did not start, or chose another mechanism).
fn start_planner(
    c: MechChoice,
    mech: &str,
    run: PathBuf,
    sleeper_cpu: usize,
) -> Result<Daemon, String> {
    let mut cfg = Config::new(run);
    cfg.mech = c;
    let d = Daemon::start(cfg).map_err(|e| e.to_string())?;
    let mechs = d.startup_report().join("; ");
    if !mechs.contains(&format!("cpu{sleeper_cpu} {mech}")) {
        d.shutdown();
        return Err(format!("the planner chose otherwise ({mechs})"));
    }
    Ok(d)
}

/// Every (gap, waiter) `a.rounds` times, interleaved (a fixed seed: the same order every run).
fn round_plan(a: &BenchArgs, waiters: &[usize], rng: &mut StdRng) -> Vec<(u64, usize)> {
    let mut plan: Vec<(u64, usize)> = Vec::new();
    for _ in 0..a.rounds {
        for &g in &a.gaps_us {
            for &w in waiters {
                plan.push((g, w));
            }
        }
    }
    plan.shuffle(rng);
    plan
}

/// One measurement (round `round`): the sleeper blocks as `waiter`, the planner (if any) is
/// asked for its window, the sleeper is woken `gap_us` later. Returns its wake latency, µs.
fn measure_wake(
    sh: &Shared,
    tx: &UnixDatagram,
    client: Option<&mut WakeClient>,
    a: &BenchArgs,
    round: u32,
    gap_us: u64,
    waiter: Waiter,
) -> Result<f64> {
    sh.word.store(0, Ordering::Release);
    sh.kind.store(waiter as u32, Ordering::Relaxed);
    let start = now_ns();
    let due = start + gap_us * 1000;
    sh.due_ns.store(due, Ordering::Relaxed);
    sh.go.store(round, Ordering::Release);
    os::futex_wake(&sh.go, 1);
    if let Some(c) = client {
        ask_window(c, a, gap_us, due);
    }
    // Wait (spin at the end) until the wake instant.
    loop {
        let now = now_ns();
        if now >= due {
            break;
        }
        if due - now > 300_000 {
            std::thread::sleep(Duration::from_nanos(due - now - 250_000));
        } else {
            std::hint::spin_loop();
        }
    }
    let t0 = now_ns();
    match waiter {
        Waiter::Futex => {
            sh.word.store(1, Ordering::Release);
            os::futex_wake(&sh.word, 1);
        }
        Waiter::Socket | Waiter::Epoll => {
            let _ = tx.send(&[1]);
        }
        Waiter::Sleep => {}
    }
    let t_wait = now_ns();
    while sh.done.load(Ordering::Acquire) != round {
        if now_ns() - t_wait > 1_000_000_000 {
            bail!("the sleeper did not wake within 1 s");
        }
        std::hint::spin_loop();
    }
    let woke = sh.woke_ns.load(Ordering::Acquire);
    let base = if waiter == Waiter::Sleep { due } else { t0 };
    Ok(woke.saturating_sub(base) as f64 / 1e3)
}

/// Ask the planner for the sleeper's CPU's window of a wakeup at `due`, `gap_us` from now.
fn ask_window(c: &mut WakeClient, a: &BenchArgs, gap_us: u64, due: u64) {
    if a.held {
        // From now (as the planner receives it) until well after the wake instant.
        let _ = c.request_in("bench", &[a.sleeper_cpu as u32], 0, gap_us * 1000 + 300_000);
    } else {
        // A window from a little before the wake instant until well after it.
        let lead = 30_000u64.min(gap_us * 1000 / 2);
        let _ = c.request_in(
            "bench",
            &[a.sleeper_cpu as u32],
            due - lead - now_ns().min(due - lead),
            lead + 300_000,
        );
    }
}
