//! preheat-wake: anticipatory CPU wakeups (Zhang et al., *Sleeping CPUs*, §2, in
//! `../shared/papers/sleeping-cpus.txt`) as a user-space wake planner.
//!
//! Software that knows when work will arrive (an announced request, an SSD read that completes
//! in ~100 µs, an accelerator kernel of predictable length) asks for a window
//! `[start, start+duration)` during which some CPUs must not enter deep idle. The daemon
//! aggregates all requests into a per-CPU **sleep plan** (union of windows), keeps each CPU out
//! of deep idle through its windows with the best mechanism available, ends every window on time
//! by itself, and charges the awake time to the requesters (overlaps split equally: the paper's
//! energy attribution).
//!
//! | module | what |
//! |---|---|
//! | [`plan`] | pure: requests, validation, per-CPU union, `awake_at`/`next_edge`, energy attribution |
//! | [`lead`] | the timer-wake lead, learned online per CPU (start 50 µs) |
//! | [`keep_awake`] | mechanisms (per-CPU PM QoS `n/a`, `/dev/cpu_dma_latency`, spin), the restore journal |
//! | [`proto`] | the JSON-lines socket protocol |
//! | [`daemon`] | the daemon: per-CPU workers, end-of-window executor, connections |
//! | [`client`] | [`WakeClient`] for other crates |
//!
//! The CLI entry point is [`run`] with [`WakeArgs`] (`preheat wake serve|status|request|hold`).
//!
//! **Machine state.** Only `serve` changes anything, and only as root: per-CPU
//! `pm_qos_resume_latency_us` (original value journalled before the first change, restored at window
//! end, on exit, on SIGTERM/SIGINT, on error, and by the next daemon after a crash) and
//! `/dev/cpu_dma_latency` (an open fd; the kernel drops it when the process dies). Unprivileged
//! it says so and uses the spin fallback, which changes nothing.
//!
//! **Measured here** (2-vCPU KVM guest, haltpoll; futex wake of a thread on CPU 1 from CPU 0
//! after a 1 ms gap, 300 quiet-gated interleaved rounds each, p50/p99 µs; the `wake_latency`
//! benchmark): no window 33/80, window via pmqos 5.2/30, via dma 5.3/14, via spin 18/34. Spin
//! gains less because waking a thread on a *busy* vCPU needs a reschedule IPI (a VM exit), while
//! a CPU polling in idle is woken by a flag. Learned leads: 40–75 µs (pmqos, dma), 30–45 µs
//! (spin).
#![forbid(unsafe_code)]

pub mod bench;
pub mod calibrate;
pub mod client;
pub mod daemon;
pub mod keep_awake;
pub mod lead;
pub mod plan;
pub mod predictor;
pub mod proto;
pub mod spinners;

pub use client::{Accepted, ClientError, WakeClient};
pub use daemon::{Config, Daemon};
pub use keep_awake::{MechChoice, Mechanism};
pub use plan::{Limits, WakeRequest};

use anyhow::{bail, Context, Result};
use preheat_engine::time::now_ns;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// `preheat wake …`: the anticipatory-wakeup planner.
#[derive(Debug, Clone, clap::Args)]
pub struct WakeArgs {
    /// Run directory holding wake.sock and wake-journal.json
    /// [default: $PREHEAT_RUN_DIR, else /tmp/preheat]
    #[arg(long, global = true)]
    pub run_dir: Option<PathBuf>,
    #[command(subcommand)]
    pub cmd: WakeCmd,
}

#[derive(Debug, Clone, clap::Subcommand)]
pub enum WakeCmd {
    /// Run the wake planner daemon (restores every setting it changed on exit and SIGTERM;
    /// changes nothing unless root).
    Serve(ServeArgs),
    /// Show the daemon's plan, mechanisms, leads and per-requester awake time.
    Status {
        /// Print the raw JSON.
        #[arg(long)]
        json: bool,
    },
    /// Ask for one window and stay connected until it ends (closing would cancel it).
    Request {
        /// CPUs, e.g. `1` or `0-1,3`.
        #[arg(long, value_parser = parse_cpus)]
        cpus: CpuList,
        /// Start this many µs from now.
        #[arg(long, default_value_t = 0)]
        in_us: u64,
        /// Duration in µs.
        #[arg(long)]
        for_us: u64,
        /// Requester name charged for the awake time.
        #[arg(long, default_value = "cli")]
        requester: String,
    },
    /// Measure wake latency of blocked threads vs idle gap, without and with planned windows.
    Bench(crate::bench::BenchArgs),
    /// Measure which keep-awake mechanism works here (wake-up latency of a blocked thread after
    /// 10 ms idle, per mechanism and without one) and cache the best for this boot in the run
    /// directory; the demo's hot floor, its `wake` strategy and `serve --mech auto` use it.
    Calibrate {
        /// Samples per mechanism.
        #[arg(long, default_value_t = calibrate::DEFAULT_ROUNDS)]
        rounds: usize,
        /// Show the cached calibration of this boot without measuring (an error if there is
        /// none).
        #[arg(long, conflicts_with_all = ["rounds", "mechs"])]
        show: bool,
        /// The mechanisms the best may be chosen from (comma list of pmqos, dma, spin; plain
        /// idle is always measured to compare with). Limiting them keeps preheat off a
        /// mechanism on this machine (e.g. `spin` alone where system-wide PM QoS is unwanted),
        /// and emulates a machine where the others do not work: on one without a cpuidle
        /// driver PM QoS cannot make idle CPUs poll, and the calibration there picks `spin`.
        /// Kept with the calibration and named wherever it is shown.
        #[arg(
            long,
            value_delimiter = ',',
            value_parser = clap::builder::PossibleValuesParser::new(calibrate::MECHANISMS),
            default_values_t = calibrate::MECHANISMS.map(String::from)
        )]
        mechs: Vec<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Keep CPUs awake from now for N ms (stays connected until the end).
    Hold {
        #[arg(long, value_parser = parse_cpus)]
        cpus: CpuList,
        #[arg(long)]
        for_ms: u64,
        #[arg(long, default_value = "cli")]
        requester: String,
    },
}

#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// Mechanism: auto = the calibrated best (`preheat wake calibrate`) where this boot has a
    /// calibration, else per CPU pmqos if available, else dma, else spin.
    #[arg(long, value_enum, default_value_t = MechChoice::Auto)]
    pub mech: MechChoice,
    /// Windows not yet ended, per requester.
    #[arg(long, default_value_t = 64)]
    pub max_pending_per_requester: usize,
    /// Windows not yet ended, in total.
    #[arg(long, default_value_t = 1024)]
    pub max_pending_total: usize,
    /// Mode of wake.sock (octal); 600 = only this user may ask for wakeups.
    #[arg(long, default_value = "600", value_parser = parse_mode)]
    pub socket_mode: u32,
}

/// A CPU list argument (`1`, `0-3,5`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuList(pub Vec<u32>);

fn parse_cpus(s: &str) -> Result<CpuList, String> {
    let ok = !s.trim().is_empty()
        && s.split(',').all(|p| {
            let p = p.trim();
            !p.is_empty()
                && p.split('-').all(|n| n.trim().parse::<u32>().is_ok())
                && p.split('-').count() <= 2
        });
    if !ok {
        return Err(format!("{s:?} is not a CPU list such as 1 or 0-1,3"));
    }
    Ok(CpuList(preheat_engine::topology::parse_cpu_list(s)))
}

fn parse_mode(s: &str) -> Result<u32, String> {
    u32::from_str_radix(s, 8)
        .ok()
        .filter(|m| *m <= 0o777)
        .ok_or_else(|| format!("{s:?} is not an octal file mode such as 600"))
}

/// Run a `preheat wake` subcommand.
pub fn run(args: WakeArgs) -> Result<()> {
    let run_dir = args
        .run_dir
        .clone()
        .unwrap_or_else(preheat_rundir::run_dir_from_env);
    match args.cmd {
        WakeCmd::Serve(s) => serve(run_dir, s),
        WakeCmd::Bench(b) => crate::bench::run(b),
        WakeCmd::Calibrate {
            rounds,
            show,
            mechs,
            json,
        } => {
            let c = if show {
                calibrate::cached(&run_dir).with_context(|| {
                    format!(
                        "no calibration of this boot in {} (run: preheat wake calibrate)",
                        run_dir.display()
                    )
                })?
            } else {
                anyhow::ensure!(rounds >= 5, "--rounds must be at least 5");
                eprintln!(
                    "preheat wake: measuring wake-up latency after {} ms idle, {rounds} samples per mechanism",
                    calibrate::GAP_US / 1000
                );
                let c = calibrate::calibrate_among(rounds, &mechs)?;
                calibrate::store(&run_dir, &c)?;
                if c.disturbed() {
                    eprintln!(
                        "preheat wake: other processes loaded the CPUs during the calibration: repeat it on a quiet machine"
                    );
                }
                c
            };
            if json {
                println!("{}", serde_json::to_string_pretty(&c)?);
            } else {
                println!("{}", c.summary());
                if let Some(p) = &c.predictor {
                    println!("{}", p.describe());
                }
                for s in &c.skipped {
                    println!("  not measured: {s}");
                }
                println!(
                    "  cached for this boot in {}",
                    calibrate::cache_path(&run_dir).display()
                );
            }
            Ok(())
        }
        WakeCmd::Status { json } => {
            let st = WakeClient::connect(&run_dir)?.status()?;
            if json {
                println!("{}", serde_json::to_string_pretty(&st)?);
            } else {
                print!("{}", format_status(&st));
            }
            Ok(())
        }
        WakeCmd::Request {
            cpus,
            in_us,
            for_us,
            requester,
        } => hold_window(
            &run_dir,
            &requester,
            &cpus.0,
            in_us.saturating_mul(1000),
            for_us.saturating_mul(1000),
        ),
        WakeCmd::Hold {
            cpus,
            for_ms,
            requester,
        } => hold_window(
            &run_dir,
            &requester,
            &cpus.0,
            0,
            for_ms.saturating_mul(1_000_000),
        ),
    }
}

fn hold_window(
    run_dir: &std::path::Path,
    requester: &str,
    cpus: &[u32],
    in_ns: u64,
    dur_ns: u64,
) -> Result<()> {
    let mut c = WakeClient::connect(run_dir)?;
    let a = c.request_in(requester, cpus, in_ns, dur_ns)?;
    let now = now_ns();
    let leads: Vec<String> = a
        .lead_ns
        .iter()
        .map(|(c, l)| format!("cpu{c} {:.1} µs", *l as f64 / 1e3))
        .collect();
    println!(
        "window {} accepted: CPUs {} from +{:.1} µs for {:.1} µs via {} (lead {}); staying connected until it ends",
        a.id,
        plan::format_cpu_list(cpus),
        a.start_ns.saturating_sub(now) as f64 / 1e3,
        (a.end_ns - a.start_ns) as f64 / 1e3,
        a.mechanism,
        leads.join(", ")
    );
    let left = a.end_ns.saturating_sub(now_ns());
    std::thread::sleep(Duration::from_nanos(left));
    Ok(())
}

fn serve(run_dir: PathBuf, s: ServeArgs) -> Result<()> {
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, stop.clone()).context("installing signal handlers")?;
    }
    let mut cfg = Config::new(&run_dir);
    cfg.mech = s.mech;
    if s.mech == MechChoice::Auto {
        // The calibrated best where this boot has a calibration; the fixed order otherwise.
        match calibrate::checked(&run_dir) {
            calibrate::Checked::Holds(c) if c.best.is_some() => {
                cfg.mech = c.choice();
                eprintln!("preheat wake: mechanism from the calibration: {}", c.summary());
            }
            calibrate::Checked::Holds(c) => {
                eprintln!("preheat wake: {}; using pmqos, else dma, else spin", c.summary())
            }
            calibrate::Checked::Changed(_, why) => eprintln!(
                "preheat wake: {why} (calibrate again: preheat wake calibrate); using pmqos, else dma, else spin"
            ),
            calibrate::Checked::Missing => eprintln!(
                "preheat wake: not calibrated on this boot (preheat wake calibrate): using pmqos, else dma, else spin"
            ),
        }
    }
    cfg.socket_mode = s.socket_mode;
    cfg.limits.max_pending_per_requester = s.max_pending_per_requester;
    cfg.limits.max_pending_total = s.max_pending_total;
    let d = Daemon::start(cfg)?;
    for l in d.startup_report() {
        eprintln!("preheat wake: {l}");
    }
    eprintln!("preheat wake: serving on {}", d.socket_path().display());
    // The daemon restores everything when dropped, so an early return below is safe too.
    while !stop.load(Ordering::SeqCst) {
        if !d.is_healthy() {
            let restored = d.shutdown();
            for r in restored {
                eprintln!("preheat wake: {r}");
            }
            bail!("a daemon thread stopped unexpectedly; settings restored");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    eprintln!("preheat wake: signal received, restoring settings");
    for r in d.shutdown() {
        eprintln!("preheat wake: {r}");
    }
    eprintln!("preheat wake: stopped");
    Ok(())
}

/// Human-readable `status`.
pub fn format_status(st: &proto::Status) -> String {
    use std::fmt::Write;
    let us = |ns: u64| ns as f64 / 1e3;
    let rel = |t: u64| (t as i128 - st.now_ns as i128) as f64 / 1e3;
    let mut o = String::new();
    let _ = writeln!(
        o,
        "wake daemon pid {} in {}, up {:.1} s; {} accepted, {} rejected, {} cancelled, {} completed; {} connections; {} settings changed now",
        st.pid,
        st.run_dir,
        (st.now_ns - st.started_ns) as f64 / 1e9,
        st.accepted,
        st.rejected,
        st.cancelled,
        st.completed,
        st.connections,
        st.changed_now
    );
    for n in st.startup.iter().chain(&st.notes) {
        let _ = writeln!(o, "  note: {n}");
    }
    let _ = writeln!(o, "CPUs (times relative to now, µs):");
    for c in &st.cpus {
        let armed = match c.armed {
            Some(a) => format!("AWAKE via {} since {:+.1}", a.mechanism, rel(a.since_ns)),
            None => "may sleep".into(),
        };
        let plan: Vec<String> = c
            .plan
            .iter()
            .map(|i| format!("[{:+.1}, {:+.1})", rel(i.start_ns), rel(i.end_ns)))
            .collect();
        let _ = writeln!(
            o,
            "  cpu{}: {} | {armed} | lead {:.1} µs (measured lateness mean {:.1}, last {:.1}, {} samples) | plan {}",
            c.cpu,
            c.mechanism,
            us(c.lead_ns),
            us(c.mean_lateness_ns),
            us(c.last_lateness_ns),
            c.lead_samples,
            if plan.is_empty() { "empty".into() } else { plan.join(" ") }
        );
    }
    if !st.pending.is_empty() {
        let _ = writeln!(o, "pending windows:");
        for w in &st.pending {
            let _ = writeln!(
                o,
                "  #{} {} CPUs {} [{:+.1}, {:+.1}) µs via {} (connection {})",
                w.id,
                w.requester,
                plan::format_cpu_list(&w.cpus),
                rel(w.start_ns),
                rel(w.end_ns),
                proto::summarize(&w.mechanisms),
                w.connection
            );
        }
    }
    write_recent(&mut o, st);
    let _ = writeln!(
        o,
        "awake time charged per requester (planned windows, overlaps split equally):"
    );
    if st.awake.is_empty() {
        let _ = writeln!(o, "  none yet");
    }
    for (r, a) in &st.awake {
        let per: Vec<String> = a
            .per_cpu
            .iter()
            .map(|(c, ns)| format!("cpu{c} {:.3} ms", *ns as f64 / 1e6))
            .collect();
        let _ = writeln!(
            o,
            "  {r}: {:.3} ms ({})",
            a.total_ns as f64 / 1e6,
            per.join(", ")
        );
    }
    o
}

/// The recent windows of `st`, newest first (at most ten), for [`format_status`].
fn write_recent(o: &mut String, st: &proto::Status) {
    use std::fmt::Write;
    let us = |ns: u64| ns as f64 / 1e3;
    if !st.recent.is_empty() {
        let _ = writeln!(
            o,
            "recent windows (armed = how long before the start the CPU was kept awake):"
        );
        for w in st.recent.iter().rev().take(10) {
            let per: Vec<String> = w
                .per_cpu
                .iter()
                .map(|(c, r)| match r {
                    Some(r) => format!(
                        "cpu{c} {} armed {:+.1} µs",
                        r.mechanism,
                        r.armed_before_start_ns as f64 / 1e3
                    ),
                    None => format!("cpu{c} not armed"),
                })
                .collect();
            let ended = if w.outcome == "completed" {
                format!(", ended {:.1} µs late", us(w.ended_late_ns))
            } else {
                String::new()
            };
            let _ = writeln!(
                o,
                "  #{} {} {:.1} µs: {}{ended} ({})",
                w.id,
                w.requester,
                us(w.end_ns - w.start_ns),
                w.outcome,
                per.join(", ")
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        wake: WakeArgs,
    }

    #[test]
    fn cli_parses() {
        let c = Cli::try_parse_from([
            "x", "request", "--cpus", "1", "--in-us", "500", "--for-us", "200",
        ])
        .unwrap();
        match c.wake.cmd {
            WakeCmd::Request {
                cpus,
                in_us,
                for_us,
                ..
            } => {
                assert_eq!((cpus.0, in_us, for_us), (vec![1], 500, 200));
            }
            _ => panic!(),
        }
        let c = Cli::try_parse_from([
            "x",
            "--run-dir",
            "/r",
            "hold",
            "--cpus",
            "0-1",
            "--for-ms",
            "3",
        ])
        .unwrap();
        assert_eq!(c.wake.run_dir, Some(PathBuf::from("/r")));
        assert!(
            matches!(c.wake.cmd, WakeCmd::Hold { ref cpus, for_ms: 3, .. } if cpus.0 == vec![0, 1])
        );
        let c = Cli::try_parse_from(["x", "serve", "--mech", "pmqos"]).unwrap();
        assert!(matches!(
            c.wake.cmd,
            WakeCmd::Serve(ServeArgs {
                mech: MechChoice::PmQos,
                socket_mode: 0o600,
                ..
            })
        ));
        assert!(Cli::try_parse_from(["x", "request", "--cpus", "x", "--for-us", "1"]).is_err());
        assert!(Cli::try_parse_from(["x", "request", "--cpus", "1", "--for-us", "-5"]).is_err());
    }
}
