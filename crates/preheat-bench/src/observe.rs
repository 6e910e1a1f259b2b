//! The outside observer's overhead on warm requests (`preheat-observe`), by the agent bench's
//! method ([`crate::agent`]): per pair, two bundled servers on the same CPU, both without the
//! agent; the observer is attached to the second for the whole pair (`--aa`: to neither, the
//! noise floor); closed-loop GETs alternate between them in blocks (ABBA order). Throughput
//! loss per pair (blockwise median and whole-pair), p50 delta, reported as the median over pairs
//! with the range (goal ≤ 1%). The observer's reader thread runs on the client's CPU (the
//! bench pins itself to CPU 0, the servers to the last CPU), draining every
//! [`preheat_observe::session::DRAIN_EVERY`] as the outside preheater does, so its cost is in
//! the numbers (and its CPU time per request is reported).
//! As a check that it observed what was sent, its read periods per request on the second
//! server (1.0 when every request was seen once).
//!
//! What this design cannot see: a cost the observer puts on every process alike falls on both
//! servers' blocks and on the client in both, and cancels. Attaching programs to the syscall
//! tracepoints sends every system call of the machine through the kernel's tracepoint path;
//! that is such a cost (on the static Go server under `wrk`, ad hoc: 6–8% with the observer
//! attached to another, idle process; docs/results-log.md, session 25). So this measures what
//! observing the server costs it beyond that — a lower bound of the total. `toggle` measures
//! the total: one server, the observer attached for the whole pair, its programs detached in
//! the unobserved blocks and attached in the observed ones.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::{bail, Context, Result};
use preheat_launch::progress::Progress;
use preheat_model::stats::{summarize, Spread, Summary};
use preheat_observe::sampling::Sampling;
use preheat_observe::{Mechanism, Observer, Options, Report};
use serde::Serialize;

use crate::agent::{bench_block, bench_command, bench_server_of};
use crate::pairs::Pairs;
use preheat_launch::servers::ServerKind;

/// What `bench observe` compares.
#[derive(Debug, Clone)]
pub struct Setup {
    /// The server the requests go to (preheat-kv by default: the shortest request here, so
    /// the largest share) …
    pub server: ServerKind,
    /// … or, where given, a server of any kind by its command (`{port}` where its port goes),
    /// asked HTTP GETs of `command_path`.
    pub command: Option<Vec<String>>,
    pub command_path: String,
    /// The mechanism attached; `None`: the A/A control.
    pub mechanism: Option<Mechanism>,
    /// The eBPF programs on the syscall tracepoints instead of the scheduler form (as
    /// [`preheat_observe::Options::syscalls`]).
    pub syscalls: bool,
    /// One server, the observer's programs attached in every other block, instead of two
    /// servers with one observed throughout (what the observer costs every process is then in
    /// the comparison too).
    pub toggle: bool,
    /// Sampling under load, as the outside preheater does (`None`: observed throughout).
    pub sampling: Option<Sampling>,
}

/// The result of `bench observe` (its JSON).
#[derive(Serialize)]
pub struct ObserveBench {
    pub label: &'static str,
    /// The server observed: a catalog server's name, or the command's program.
    pub server: String,
    /// The mechanism attached to the second server; `None`: the A/A control.
    pub mechanism: Option<Mechanism>,
    pub mechanism_detail: Option<&'static str>,
    /// Why the eBPF programs were not BTF-typed in some pair (the first reason), where they ran.
    pub untyped: Option<String>,
    /// Why the programs wrote a record per call in some pair (the first reason), where they were
    /// typed; `None`: one record per busy period.
    pub per_call: Option<String>,
    /// Why the programs were on the syscall tracepoints in some pair (the first reason);
    /// `None`: the scheduler form ([`preheat_observe::schedprog`]).
    pub syscalls: Option<String>,
    /// One server, the observer's programs attached in every other block (`--toggle`), instead
    /// of two servers, one observed throughout.
    pub toggle: bool,
    /// How the observer sampled under load ([`preheat_observe::sampling`]; `None`: observed
    /// throughout). In the JSON: the rate above which its programs were away for a while each
    /// time.
    #[serde(rename = "sampled_above_per_s", serialize_with = "above_per_s")]
    pub sampling: Option<Sampling>,
    /// Per pair, where sampled: the share of the observation the programs were away.
    pub detached_share: Option<Spread>,
    pub requests_per_pair: usize,
    pub pairs: usize,
    pub blocks: usize,
    /// `/sys/devices/system/cpu/cpuidle/current_driver` (or "none").
    pub cpuidle: String,
    pub without: Summary,
    pub with: Summary,
    pub throughput_loss_per_pair: Spread,
    pub throughput_loss_blockwise_per_pair: Spread,
    pub p50_delta_us_per_pair: Spread,
    /// Per pair: requests the observer found read on the observed server (the reads in its
    /// read periods) per request sent to it.
    pub periods_per_request: Spread,
    /// Per pair: records the kernel wrote for the second server per request sent to it (each
    /// a ring-buffer write: the observer's cost per request is about this many).
    pub records_per_request: Spread,
    /// Per pair: syscall entries and exits the tracker analysed per request (the per-call
    /// programs write one record each; the period programs fewer, holding some in the kernel).
    pub calls_per_request: Spread,
    /// Per pair: CPU time the observer's reader thread took (draining and decoding; on the
    /// client's CPU), ns per request sent to the observed server.
    pub reader_ns_per_request: Spread,
    /// Samples the kernel dropped, over all pairs.
    pub lost_samples: u64,
}

/// An observer draining its buffers on a thread of its own until stopped.
struct Running {
    stop: Arc<AtomicBool>,
    obs: Arc<Mutex<Observer>>,
    /// The CPU time the reader thread took (ns).
    thread: std::thread::JoinHandle<u64>,
}

fn start_observer(pid: u32, port: u16, setup: &Setup, mechanism: Mechanism) -> Result<Running> {
    let mut opts = Options::new(pid, port);
    opts.mechanism = mechanism;
    opts.syscalls = setup.syscalls;
    opts.sampling = setup.sampling;
    let obs = Arc::new(Mutex::new(Observer::attach(opts)?));
    let stop = Arc::new(AtomicBool::new(false));
    let (s, o) = (stop.clone(), obs.clone());
    let thread = std::thread::spawn(move || {
        let cpu0 = preheat_engine::time::thread_cpu_ns();
        while !s.load(Ordering::Relaxed) {
            std::thread::sleep(preheat_observe::session::DRAIN_EVERY);
            o.lock().unwrap_or_else(|p| p.into_inner()).poll();
        }
        preheat_engine::time::thread_cpu_ns().saturating_sub(cpu0)
    });
    Ok(Running { stop, obs, thread })
}

/// The report, and the CPU time the reader thread took while the observer ran (ns).
fn stop_observer(r: Running) -> Result<(Report, u64)> {
    r.stop.store(true, Ordering::Relaxed);
    let cpu_ns = r
        .thread
        .join()
        .map_err(|_| anyhow::anyhow!("the observer thread panicked"))?;
    let o = Arc::try_unwrap(r.obs)
        .map_err(|_| anyhow::anyhow!("the observer is still shared"))?
        .into_inner()
        .unwrap_or_else(|p| p.into_inner());
    Ok((o.finish(), cpu_ns))
}

struct PairResult {
    lat: [Vec<f64>; 2],
    secs: [Vec<f64>; 2],
    report: Option<(Report, u64)>,
}

/// One pair: two servers, the observer attached to the second for the whole pair; or, with
/// `toggle`, one server whose observer's programs are detached in the first configuration's
/// blocks and attached in the second's.
fn bench_pair(requests: usize, blocks: usize, setup: &Setup, first: usize) -> Result<PairResult> {
    let toggle = setup.toggle;
    let mut servers = Vec::with_capacity(2);
    for _ in 0..if toggle { 1 } else { 2 } {
        servers.push(match &setup.command {
            Some(cmd) => bench_command(cmd, &setup.command_path)?,
            None => bench_server_of(setup.server, None)?,
        });
    }
    if !toggle && first == 1 {
        // Started (and warmed) in alternating order across pairs.
        servers.reverse();
    }
    let observed = servers.len() - 1;
    let obs = match setup.mechanism {
        Some(m) => {
            let pid = serving_pid(servers[observed].server.pid());
            let port = servers[observed].server.addr().port();
            Some(start_observer(pid, port, setup, m).context("attaching the observer")?)
        }
        None => None,
    };
    let per_block = (requests / blocks).max(1);
    let mut out = PairResult {
        lat: [Vec::with_capacity(requests), Vec::with_capacity(requests)],
        secs: [Vec::new(), Vec::new()],
        report: None,
    };
    for blk in 0..2 * blocks {
        let k = usize::from((blk % 2 == 1) ^ ((blk / 2) % 2 == 1)) ^ first;
        if let (true, Some(r)) = (toggle, &obs) {
            let mut o = r.obs.lock().unwrap_or_else(|p| p.into_inner());
            if k == 0 {
                o.pause()?;
            } else {
                o.resume()?;
            }
        }
        let c = &mut servers[k.min(observed)].conn;
        let secs = bench_block(c, per_block, &mut out.lat[k])?;
        out.secs[k].push(secs);
    }
    out.report = obs.map(stop_observer).transpose()?;
    Ok(out)
}

/// The process that serves: the server's first child where it has one (nginx's worker under
/// its master), else the server itself.
fn serving_pid(pid: u32) -> u32 {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .ok()
        .and_then(|c| c.split_whitespace().next()?.parse().ok())
        .unwrap_or(pid)
}

fn cpuidle() -> String {
    std::fs::read_to_string("/sys/devices/system/cpu/cpuidle/current_driver")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "none".into())
}

/// Measure `pairs` pairs of `requests` requests per server in `blocks` blocks each, the
/// observer attached to the second server — or, with `setup.toggle`, on one server, the
/// observer's programs attached in every other block.
pub fn measure(
    requests: usize,
    pairs: usize,
    blocks: usize,
    setup: &Setup,
    progress: &dyn Progress,
) -> Result<ObserveBench> {
    preheat_model::stats::require_repetitions(pairs, "--pairs", "pair")
        .map_err(anyhow::Error::msg)?;
    let (mechanism, toggle) = (setup.mechanism, setup.toggle);
    if preheat_engine::os::online_cpus() >= 2 {
        preheat_engine::os::set_affinity(&[0])?;
    }
    let blocks = blocks.max(1);
    let per_block = (requests / blocks).max(1);
    let mut acc = Pairs::default();
    let (mut ppr, mut spr, mut rpr, mut cpr) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut away = Vec::new();
    let mut lost = 0;
    let (mut untyped, mut per_call, mut why_syscalls) = (None, None, None);
    progress.start(pairs as u64, "pairs");
    for i in 0..pairs {
        let r = bench_pair(requests, blocks, setup, i % 2)?;
        if let Some((rep, reader_ns)) = &r.report {
            // A fallback would measure another mechanism than the one named: refuse it.
            if Some(rep.mechanism) != mechanism {
                bail!(
                    "the observer ran {:?} instead of {:?}: {}",
                    rep.mechanism,
                    mechanism,
                    rep.fallback.as_deref().unwrap_or("no reason given")
                );
            }
            let reads: usize = rep.threads.iter().map(|t| t.requests).sum();
            // Per request sent to the observed server (in its blocks).
            let sent = (per_block * blocks) as f64;
            ppr.push(reads as f64 / sent);
            spr.push(rep.records as f64 / sent);
            cpr.push(rep.counts.events as f64 / sent);
            rpr.push(*reader_ns as f64 / sent);
            away.extend(rep.sampled.map(|s| s.detached_share));
            lost += rep.lost_samples;
            untyped = untyped.or_else(|| rep.untyped.clone());
            per_call = per_call.or_else(|| rep.per_call.clone());
            why_syscalls = why_syscalls.or_else(|| rep.syscalls.clone());
        }
        acc.add(per_block, &r.secs, r.lat);
        progress.inc(1);
    }
    progress.finish();
    Ok(ObserveBench {
        label: "measured",
        server: match &setup.command {
            Some(cmd) => cmd.first().cloned().unwrap_or_default(),
            None => setup.server.name().to_string(),
        },
        mechanism,
        mechanism_detail: mechanism.map(Mechanism::describe),
        untyped,
        per_call,
        syscalls: why_syscalls,
        toggle,
        sampling: setup.sampling,
        detached_share: (!away.is_empty()).then(|| Spread::of(&away)),
        requests_per_pair: per_block * blocks,
        pairs,
        blocks,
        cpuidle: cpuidle(),
        without: summarize(&acc.without),
        with: summarize(&acc.with),
        throughput_loss_per_pair: Spread::of(&acc.loss),
        throughput_loss_blockwise_per_pair: Spread::of(&acc.loss_blk),
        p50_delta_us_per_pair: Spread::of(&acc.dp50),
        periods_per_request: Spread::of(&ppr),
        records_per_request: Spread::of(&spr),
        calls_per_request: Spread::of(&cpr),
        reader_ns_per_request: Spread::of(&rpr),
        lost_samples: lost,
    })
}

/// [`ObserveBench::sampling`] as its rate threshold (or null).
fn above_per_s<S: serde::Serializer>(s: &Option<Sampling>, ser: S) -> Result<S::Ok, S::Error> {
    serde::Serialize::serialize(&s.map(|s| s.above_per_s), ser)
}

impl ObserveBench {
    /// The report as text (what `preheat bench` prints without `--json`).
    pub fn render(&self) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        let typed = match self.mechanism {
            Some(Mechanism::Bpf) => format!(
                ", {}",
                preheat_observe::report::programs(
                    self.syscalls.as_deref(),
                    self.untyped.as_deref(),
                    self.per_call.as_deref()
                )
            ),
            _ => String::new(),
        };
        let with_label = format!(
            "{}{typed}",
            self.mechanism_detail.unwrap_or("no observer (A/A control)")
        );
        let sampled = match self.sampling {
            Some(s) => format!(
                ", sampled under load as the outside preheater does (its programs {})",
                s.describe()
            ),
            None => ", observing throughout (no sampling)".to_string(),
        };
        let with_label = format!("{with_label}{sampled}");
        let design = if self.toggle {
            format!("per pair one server, observed by {with_label}, its programs detached in the unobserved blocks and attached in the observed ones (so what the observer costs every process is in the comparison)")
        } else {
            format!("per pair two servers on the same CPU, the second observed by {with_label} (what the observer costs every process alike falls on both and cancels: a lower bound)")
        };
        let _ = writeln!(s,
            "outside observer's overhead on warm requests to {} [measured: {} pairs; {design}; {} requests each in {} alternating blocks (ABBA), closed loop, 1 connection each; cpuidle {}]",
            self.server,
            self.pairs, self.requests_per_pair, self.blocks, self.cpuidle
        );
        for (name, x) in [("unobserved", &self.without), ("observed", &self.with)] {
            let _ = writeln!(
                s,
                "  {name}: p50 {:.2} µs (95% CI {:.2}–{:.2}), p99 {:.2} µs, n = {}",
                x.p50, x.p50_lo, x.p50_hi, x.p99, x.n
            );
        }
        let _ = writeln!(
            s,
            "  throughput loss per pair (median of its {} block ratios) {} (goal <= 1%)",
            self.blocks,
            self.throughput_loss_blockwise_per_pair
                .show_scaled(100.0, 2, "%")
        );
        let _ = writeln!(
            s,
            "  throughput loss per pair, whole blocks {}",
            self.throughput_loss_per_pair.show_scaled(100.0, 2, "%")
        );
        let _ = writeln!(
            s,
            "  p50 delta per pair {}",
            self.p50_delta_us_per_pair.show_scaled(1.0, 3, " µs")
        );
        if self.mechanism.is_some() {
            let _ = writeln!(s,
                "  requests found read per request sent {}; records per request {}; calls analysed per request {}; lost records {}",
                self.periods_per_request.show_scaled(1.0, 3, ""),
                self.records_per_request.show_scaled(1.0, 2, ""),
                self.calls_per_request.show_scaled(1.0, 2, ""),
                self.lost_samples
            );
            if let Some(d) = &self.detached_share {
                let _ = writeln!(
                    s,
                    "  share of the observation the programs were away (sampling) {}",
                    d.show_scaled(100.0, 0, "%")
                );
            }
            let _ = writeln!(
                s,
                "  the reader thread's CPU time per request (draining and decoding, on the client's CPU) {}",
                self.reader_ns_per_request.show_scaled(1.0, 0, " ns")
            );
        }
        s
    }
}
