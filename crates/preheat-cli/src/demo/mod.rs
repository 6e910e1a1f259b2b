//! `preheat demo`: the paper's Table 1 in miniature, on the bundled server (or memcached).
//!
//! 1. Start the server pinned to one CPU with the agent attached; the client runs on another.
//! 2. Record the per-request working set (probe backend by default) and load it into the agent.
//! 3. Run interleaved, shuffled rounds. Every round measures each mode once, in random order:
//!    * `hot` — the floor: right after a previous request, with the server's CPU kept out of
//!      idle (see [`preheat_demo::hot`]); skipped, saying why, where no mechanism allows it;
//!    * `warm` — right after a previous request;
//!    * `cold-idle` — after an idle gap (real idle: the vCPU halts, other tenants evict);
//!    * `cold-sweep` — after a 128 MiB eviction sweep on the server's CPU (emulates the cache
//!      loss of a deep sleep state, as the paper's flush) plus a short gap;
//!    * `control` — the same gap as `cold-sweep` without the sweep (separates wakeup cost from
//!      cache loss);
//!    * `preheat:S` — like `cold-sweep`, but the request is announced `lead` µs ahead and the
//!      agent applies strategies S (wake, lines, replay, combinations);
//!    * `preheat:auto` — the strategies a pilot before the rounds measured to help most
//!      ([`pilot`], [`preheat_model::auto`]), or nothing.
//! 4. Print response-time p50/p99 with 95% CIs and, for preheat rows, the working-set size, runs,
//!    encoded bytes, preheat time, GB/s and the share of the cold overhead removed — against the
//!    hot floor (warm beside it) — split by stage (see [`mod@table`]); flag every preheat mode
//!    measured slower than none (cold-sweep, per round) and every replay whose warm-up was still
//!    being served at the arrival.
//!
//! Response time is measured by the client from the moment it sends (for announced requests:
//! at the announced arrival time) until the full reply is read. Everything printed is measured
//! on this machine unless labeled otherwise; the paper's numbers are printed as the paper's.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use preheat_model::proto::{Reply, Request, Strategies};
use rand::seq::SliceRandom;
use serde::Serialize;

use preheat_estimate::serving::serving_agent;
use preheat_estimate::{read_profile, record, write_profile, RecordParams, RecordStats};
use preheat_launch::agentctl::{AgentClient, Announcer};
use preheat_launch::servers::{self, ServerKind};

mod custom;
mod measure;
mod pilot;
mod table;

pub use custom::CustomProtocol;

use measure::Bench;
use table::{decomposition, floor_check, print_table, table, Decomposition, FloorCheck, Row};

#[derive(clap::Args, Debug)]
pub struct DemoArgs {
    /// Server to run the demo on (a catalog server); or give any server's command after `--`
    /// with --port, --protocol and --request.
    #[arg(long, value_enum, default_value = "kv")]
    pub server: ServerKind,
    /// Any server: the port it listens on (it must listen there itself, e.g. from its own
    /// configuration).
    #[arg(long, requires = "command")]
    pub port: Option<u16>,
    /// Any server: its protocol.
    #[arg(long, value_enum, default_value = "http", requires = "command")]
    pub protocol: CustomProtocol,
    /// Any server: the request to measure — an HTTP path, a memcached or redis key, or raw
    /// request bytes (\r \n escapes) with --protocol raw. HTTP and redis replies are learned from
    /// one real exchange first and framed by their length.
    #[arg(long, requires = "command")]
    pub request: Option<String>,
    /// Any server, --protocol raw: the bytes its reply ends with (\r \n escapes).
    #[arg(long, default_value = "\\r\\n")]
    pub until: String,
    /// Any server: its command line (after --), started pinned to the server CPU with the agent
    /// attached.
    #[arg(last = true)]
    pub command: Vec<String>,
    /// Rounds (each measures every mode once, in shuffled order).
    #[arg(long, default_value_t = 150)]
    pub rounds: usize,
    /// Announcement lead time, µs (Fastpass schedules ~65 µs ahead).
    #[arg(long, default_value_t = 65)]
    pub lead_us: u64,
    /// Idle gap before a cold-idle request, ms.
    #[arg(long, default_value_t = 20)]
    pub idle_ms: u64,
    /// Eviction sweep size, MiB.
    #[arg(long, default_value_t = 128)]
    pub sweep_mib: usize,
    /// Gap after the sweep before the request, µs (the server CPU goes idle meanwhile).
    #[arg(long, default_value_t = 1000)]
    pub post_gap_us: u64,
    /// Preheat strategies to compare, comma separated (each may combine with +). `auto` runs a
    /// pilot first (--pilot-rounds rounds of every combination of wake, lines and replay that
    /// can run here, against announcing nothing) and announces the combination measured to help
    /// most — nothing, if none was measured to help; the table measures it again.
    #[arg(long, default_value = "auto,wake,lines,replay,wake+lines,all")]
    pub strategies: String,
    /// Rounds of `auto`'s pilot (each measures none and every candidate once).
    #[arg(long, default_value_t = 15)]
    pub pilot_rounds: usize,
    /// Use this working-set file instead of recording one.
    #[arg(long)]
    pub profile: Option<PathBuf>,
    /// Samples for the recording (the paper uses 8).
    #[arg(long, default_value_t = 8)]
    pub samples: u32,
    /// Keep lines seen in at least this many samples.
    #[arg(long, default_value_t = 6)]
    pub keep: u32,
    /// Merge runs separated by at most this many unused lines when encoding (paper §3.1: fewer,
    /// longer runs at the cost of loading a few lines nobody uses).
    #[arg(long, default_value_t = 0)]
    pub gap_merge: u32,
    /// Append every sample as one JSON line to this file as it is measured (an interrupted run
    /// keeps what it measured).
    #[arg(long)]
    pub records: Option<PathBuf>,
    /// Server CPU (default: the last CPU); the client uses another one.
    #[arg(long)]
    pub server_cpu: Option<usize>,
    /// Write all results (per-request records and the table) as JSON here.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Print the table as JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Hot,
    Warm,
    ColdIdle,
    ColdSweep,
    Control,
    Preheat(Strategies),
    /// `auto`: what its pilot chose (`NONE` until then, or when nothing was measured to help).
    Auto(Strategies),
}

impl Mode {
    fn name(self) -> String {
        match self {
            Mode::Hot => "hot".into(),
            Mode::Warm => "warm".into(),
            Mode::ColdIdle => "cold-idle".into(),
            Mode::ColdSweep => "cold-sweep".into(),
            Mode::Control => "control".into(),
            Mode::Preheat(s) => format!("preheat:{}", s.name()),
            Mode::Auto(_) => "preheat:auto".into(),
        }
    }

    /// What the mode announces (`None`: no announcement).
    fn announced(self) -> Option<Strategies> {
        match self {
            Mode::Preheat(s) => Some(s),
            Mode::Auto(s) if !s.is_empty() => Some(s),
            _ => None,
        }
    }

    /// A preheat mode whose strategies include `replay`.
    fn replays(self) -> bool {
        matches!(self, Mode::Preheat(s) if s.contains(Strategies::REPLAY))
    }
}

#[derive(Debug, Clone, Serialize)]
struct Sample {
    mode: String,
    round: usize,
    /// The request type (TPC-C-like: the round's transaction type; others: "request").
    kind: String,
    latency_us: f64,
    /// For preheat modes: what the agent reported for this announcement.
    lines_done: u64,
    lines_total: u64,
    preheat_us: f64,
    /// Arrival time minus the time the agent's worker started, µs.
    worker_lead_us: f64,
    /// Arrival time minus the time the agent's trigger thread received the announcement, µs.
    trigger_lead_us: f64,
    /// When the server thread started on the request (returned from its wait with it, as the
    /// agent saw), relative to the send time (announced modes: the announced arrival), µs.
    /// Every mode has it: the first stage of the response time (arrival and wake-up).
    server_start_us: f64,
    sweep_us: f64,
    /// Preheat modes: the preheated process's busy periods of the port grew while this sample
    /// was measured — false where no request of it reached that process (another process, a
    /// prefork server's other worker, answered); `None` for the other modes.
    served_by_preheated: Option<bool>,
}

impl Sample {
    /// A measured request; the agent's fields are filled in by the caller when it has them.
    fn new(mode: String, round: usize, kind: String, latency_us: f64, sweep_us: f64) -> Sample {
        Sample {
            mode,
            round,
            kind,
            latency_us,
            lines_done: 0,
            lines_total: 0,
            preheat_us: 0.0,
            worker_lead_us: 0.0,
            trigger_lead_us: 0.0,
            server_start_us: f64::NAN,
            sweep_us,
            served_by_preheated: None,
        }
    }

    /// What the agent did for this sample's announcement, from its counters before and after.
    fn fill_agent(
        &mut self,
        b: &preheat_model::proto::PreheatStats,
        after: &preheat_model::proto::PreheatStats,
    ) {
        let acted = after.preheats > b.preheats
            || after.wake_spins > b.wake_spins
            || after.wake_polled > b.wake_polled
            || after.replays > b.replays;
        if !acted {
            self.worker_lead_us = f64::NAN; // announcement not acted on (late/dropped)
            self.trigger_lead_us = f64::NAN;
            return;
        }
        // The lines counters are the agent's *last* lines preheat: only this announcement's if
        // it ran one (wake/replay alone leave them stale).
        if after.preheats > b.preheats {
            self.lines_done = after.last_lines_done;
            self.lines_total = after.last_lines_total;
            self.preheat_us = after.last_preheat_ns as f64 / 1e3;
        }
        self.worker_lead_us = after.last_lead_ns as f64 / 1e3;
        self.trigger_lead_us = after.last_trigger_lead_ns as f64 / 1e3;
    }
}

#[derive(Serialize)]
struct Skipped {
    mode: String,
    reason: String,
}

#[derive(Serialize)]
struct Output {
    server: String,
    machine: String,
    label: &'static str,
    rounds: usize,
    lead_us: u64,
    server_cpu: usize,
    client_cpu: usize,
    record: Option<RecordStats>,
    prepared: preheat_lab::servers::Prepared,
    /// Whether a hardware PMU exists; CPI is only measured with one (`null` otherwise).
    pmu: bool,
    cpi: Option<f64>,
    /// Modes that were asked for but cannot run on this server, with the reason.
    skipped: Vec<Skipped>,
    /// How the hot floor kept the CPUs out of idle (`None`: no hot floor; see skipped).
    hot_floor: Option<String>,
    /// Whether the hot floor measured below warm in this run (the shares use it only then).
    floor_check: Option<FloorCheck>,
    /// What the `wake` strategy ran as (the calibrated mechanism).
    wake_mechanism: String,
    /// This boot's keep-awake calibration (`None`: it failed; see skipped).
    calibration: Option<preheat_wake::calibrate::Calibration>,
    /// What `auto` chose, from which pilot (`None`: auto was not asked for).
    auto: Option<preheat_model::auto::AutoChoice>,
    /// The cold overhead split by cause (p50 differences).
    decomposition: Option<Decomposition>,
    /// The agent's preheat counters at the end of the run (all announced modes together).
    agent_counters: preheat_model::proto::PreheatStats,
    rows: Vec<Row>,
    samples: Vec<Sample>,
}

/// What the agent says after (or before) a sample.
struct AgentView {
    preheat: preheat_model::proto::PreheatStats,
    /// Start of the port's most recent busy period.
    last_start_ns: u64,
    /// The port's busy periods in the agent's process.
    busy_periods: u64,
}

/// The agent's preheat counters and the port's busy periods.
fn agent_preheat(c: &mut AgentClient, port: u16) -> Result<AgentView> {
    match c.call(&Request::Status)? {
        Reply::Status { preheat, ports, .. } => {
            let p = ports.iter().find(|p| p.port == port);
            Ok(AgentView {
                preheat,
                last_start_ns: p.map_or(0, |p| p.last_start_ns),
                busy_periods: p.map_or(0, |p| p.busy_periods),
            })
        }
        other => bail!("unexpected status reply {other:?}"),
    }
}

/// What the `wake` strategy runs as on this machine: the agent's idle polling
/// (`/dev/cpu_dma_latency`, every CPU) where the calibration measured polling mechanisms best
/// (or had no verdict), its spin on the server's core where spinning measured best.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WakeAs {
    Poll { calibrated: bool },
    Spin,
}

impl WakeAs {
    fn from_calibration(c: Option<&preheat_wake::calibrate::Calibration>) -> WakeAs {
        use preheat_wake::Mechanism;
        match c.and_then(|c| c.best) {
            Some(Mechanism::Spin) => WakeAs::Spin,
            Some(Mechanism::PmQos | Mechanism::DmaLatency) => WakeAs::Poll { calibrated: true },
            None => WakeAs::Poll { calibrated: false },
        }
    }

    /// The strategies to announce for `st`: `wake` replaced by `spin` where spinning is best.
    fn apply(self, st: Strategies) -> Strategies {
        if self == WakeAs::Spin && st.contains(Strategies::WAKE) {
            Strategies(st.0 & !Strategies::WAKE.0).union(Strategies::SPIN)
        } else {
            st
        }
    }

    fn describe(self) -> String {
        match self {
            WakeAs::Spin => "spin: the agent spins on the server's core through the arrival (the calibration measured spinning best here)".into(),
            WakeAs::Poll { calibrated: true } => "idle polling: the agent holds /dev/cpu_dma_latency at 0 µs for the window (the calibration measured idle polling best here)".into(),
            WakeAs::Poll { calibrated: false } => "idle polling: the agent holds /dev/cpu_dma_latency at 0 µs for the window (not shown by the calibration to beat plain idle here)".into(),
        }
    }
}

/// The modes `a.strategies` asks for, after the baselines.
fn wanted_modes(a: &DemoArgs) -> Result<Vec<Mode>> {
    let mut wanted = vec![
        Mode::Hot,
        Mode::Warm,
        Mode::ColdIdle,
        Mode::ColdSweep,
        Mode::Control,
    ];
    for s in a.strategies.split(',').filter(|s| !s.trim().is_empty()) {
        let m = if s.trim() == "auto" {
            Mode::Auto(Strategies::NONE)
        } else {
            Mode::Preheat(Strategies::parse(s).map_err(anyhow::Error::msg)?)
        };
        if !wanted.contains(&m) {
            wanted.push(m);
        }
    }
    Ok(wanted)
}

/// Start the catalog server or the command after `--`, pinned to `server_cpu` with the agent.
fn start_server(
    a: &DemoArgs,
    dir: &std::path::Path,
    server_cpu: usize,
) -> Result<(
    preheat_launch::launch::Server,
    servers::Workload,
    preheat_lab::servers::Prepared,
)> {
    if a.command.is_empty() {
        let started = servers::start(a.server, None, dir, vec![server_cpu], true)?;
        return Ok((started.server, started.workload, started.prepared));
    }
    let custom = custom::CustomServer {
        command: &a.command,
        port: a.port,
        protocol: a.protocol,
        request: a.request.as_deref(),
        until: &a.until,
    };
    let (server, w) = custom.start(dir, vec![server_cpu])?;
    Ok((server, w, Default::default()))
}

/// Record the working set (or take `--profile`), and load it into the agent of `pid`.
fn estimate(
    a: &DemoArgs,
    server: &preheat_launch::launch::Server,
    pid: u32,
    w: &servers::Workload,
    client: &mut servers::Requester,
    dir: &std::path::Path,
) -> Result<(PathBuf, Option<RecordStats>)> {
    let port = server.spec.port;
    let (path, stats) = match &a.profile {
        Some(p) => (relabel_port(p, port, dir)?, None),
        None => {
            let params = RecordParams {
                filter: preheat_model::FilterParams {
                    k: a.keep,
                    n: a.samples,
                    gap: a.gap_merge,
                },
                ..Default::default()
            };
            eprintln!(
                "demo: recording the working set (probe backend, {} samples, keep >= {})",
                a.samples, a.keep
            );
            let rec = record::record_probe(
                server,
                pid,
                w,
                &params,
                client,
                &crate::progress::Bars::new(false),
            )?;
            let path = dir.join(format!("{}.phws", server.spec.name));
            write_profile(&path, &rec.profile)?;
            (path, Some(rec.stats))
        }
    };
    AgentClient::connect(&server.run_dir, pid)?.call(&Request::LoadProfile {
        path: path.to_string_lossy().into_owned(),
    })?;
    Ok((path, stats))
}

/// Configure `port`'s warm-up request in the agent. Where the agent cannot open a replay
/// connection its process serves (e.g. the server closes every connection after its reply),
/// the replay modes are dropped into `skipped`, saying why; anything else fails the demo.
fn configure_replay(
    agent: &mut AgentClient,
    w: &servers::Workload,
    port: u16,
    modes: &mut Vec<Mode>,
    skipped: &mut Vec<Skipped>,
) -> Result<bool> {
    let (replay, replay_until) = w
        .raw
        .as_ref()
        .map(|r| {
            (
                String::from_utf8_lossy(&r.replay).into_owned(),
                String::from_utf8_lossy(&r.replay_until).into_owned(),
            )
        })
        .unzip();
    let wants_replay = replay.is_some();
    let Err(e) = agent.call(&Request::Configure {
        port,
        replay,
        replay_until,
        split_cpus: vec![],
    }) else {
        return Ok(wants_replay);
    };
    if !wants_replay {
        return Err(e);
    }
    agent.call(&Request::Configure {
        port,
        replay: None,
        replay_until: None,
        split_cpus: vec![],
    })?;
    let reason = format!("{e:#}");
    for m in modes.iter().filter(|m| m.replays()) {
        eprintln!("demo: skipping {}: {reason}", m.name());
        skipped.push(Skipped {
            mode: m.name(),
            reason: reason.clone(),
        });
    }
    modes.retain(|m| !m.replays());
    Ok(false)
}

/// Run `auto`'s pilot over what can run here and put its choice into `modes`.
fn choose_auto(
    bench: &mut Bench<'_>,
    modes: &mut [Mode],
    can_replay: bool,
    rounds: usize,
    quiet: bool,
) -> Result<Option<preheat_model::auto::AutoChoice>> {
    let Some(slot) = modes.iter_mut().find(|m| matches!(m, Mode::Auto(_))) else {
        return Ok(None);
    };
    let mut available = Strategies::WAKE.union(Strategies::LINES);
    if can_replay {
        available = available.union(Strategies::REPLAY);
    }
    let cands = pilot::candidates(available);
    eprintln!(
        "demo: auto: piloting {} candidates against none, {rounds} rounds",
        cands.len()
    );
    let choice = pilot::run(bench, &cands, rounds, quiet)?;
    eprintln!("demo: auto chose {}: {}", choice.chosen, choice.why);
    *slot = Mode::Auto(choice.bits);
    Ok(Some(choice))
}

/// The table's rounds: every mode once per round, in shuffled order.
fn measure_rounds(
    bench: &mut Bench<'_>,
    modes: &[Mode],
    rounds: usize,
    records: Option<&PathBuf>,
    quiet: bool,
) -> Result<Vec<Sample>> {
    let mut records = match records {
        Some(p) => Some(std::io::BufWriter::new(
            std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))?,
        )),
        None => None,
    };
    let pb = crate::progress::bar((rounds * modes.len()) as u64, "measuring", quiet);
    let mut rng = rand::thread_rng();
    let mut samples: Vec<Sample> = Vec::new();
    for round in 0..rounds {
        let mut order = modes.to_vec();
        order.shuffle(&mut rng);
        let kind = bench.client.new_round().unwrap_or("request");
        for mode in order {
            let s = bench.sample(mode, round, kind)?;
            if let Some(f) = records.as_mut() {
                use std::io::Write;
                serde_json::to_writer(&mut *f, &s)?;
                f.write_all(b"\n")?;
                f.flush()?;
            }
            samples.push(s);
            pb.inc(1);
        }
    }
    pb.finish_and_clear();
    if bench.bad_replies > 0 {
        bail!(
            "{} replies were wrong: the server misbehaved under the agent",
            bench.bad_replies
        );
    }
    Ok(samples)
}

/// The keep-awake calibration (measured once per boot, cached in the run directory) and the hot
/// floor's mechanism from it, or why there is none (into `skipped`).
fn keep_awake(
    server: &preheat_launch::launch::Server,
    skipped: &mut Vec<Skipped>,
) -> (
    Option<preheat_wake::calibrate::Calibration>,
    Option<preheat_demo::hot::KeepAwake>,
) {
    let calibration =
        preheat_wake::calibrate::load_or_calibrate(&preheat_launch::paths::run_dir(), |m| {
            eprintln!("demo: {m}")
        })
        .map_err(|e| format!("the keep-awake calibration failed: {e:#}"));
    let keep = calibration
        .as_ref()
        .map_err(String::clone)
        .and_then(|c| preheat_demo::hot::KeepAwake::open(&server.run_dir, c));
    match keep {
        Ok(k) => (calibration.ok(), Some(k)),
        Err(why) => {
            skipped.push(Skipped {
                mode: Mode::Hot.name(),
                reason: format!("{why}: shares removed are against warm instead of the hot floor"),
            });
            (calibration.ok(), None)
        }
    }
}

pub fn run(a: DemoArgs) -> Result<()> {
    let ncpu = preheat_engine::os::online_cpus();
    if ncpu < 2 {
        bail!(
            "the demo needs 2 CPUs (server and client on different CPUs); this machine has {ncpu}"
        );
    }
    let server_cpu = a.server_cpu.unwrap_or(ncpu - 1);
    let client_cpu = if server_cpu == 0 { 1 } else { 0 };
    let wanted = wanted_modes(&a)?;
    preheat_engine::os::set_affinity(&[client_cpu]).context("pinning the client")?;

    let scratch = preheat_launch::launch::scratch_dir("demo")?;
    let dir = scratch.path().to_path_buf();
    let shown = if a.command.is_empty() {
        a.server.name().to_string()
    } else {
        a.command.join(" ")
    };
    eprintln!(
        "demo: starting {shown} on CPU {server_cpu} with the agent and loading its data; client on CPU {client_cpu}"
    );
    let (server, w, prepared) = start_server(&a, &dir, server_cpu)?;
    let port = server.spec.port;
    let mut client = w.connect(server.addr())?;
    let mut skipped = Vec::new();
    let (calibration, keep_awake) = keep_awake(&server, &mut skipped);
    let wake = WakeAs::from_calibration(calibration.as_ref());
    let mut modes = Vec::new();
    for m in wanted {
        match m {
            Mode::Hot if keep_awake.is_none() => {}
            Mode::Preheat(st) if st.contains(Strategies::REPLAY) && w.raw.is_none() => {
                skipped.push(Skipped {
                    mode: m.name(),
                    reason: format!(
                        "replay needs a fixed request the agent can send itself; {} has none (a MySQL session needs a handshake)",
                        server.spec.name
                    ),
                })
            }
            m => modes.push(m),
        }
    }
    for s in &skipped {
        eprintln!("demo: skipping {}: {}", s.mode, s.reason);
    }
    // The agent of the process that serves *this* client's connection (prefork servers have one
    // per worker).
    let pid = serving_agent(&server, &mut client)?;
    let (profile_path, rec_stats) = estimate(&a, &server, pid, &w, &mut client, &dir)?;
    let profile = read_profile(&profile_path)?;
    let ws_stats = profile.class(port).map(|c| c.ws.stats()).with_context(|| {
        format!(
            "{} has no working set for port {port}",
            profile_path.display()
        )
    })?;
    let mut agent = AgentClient::connect(&server.run_dir, pid)?;
    let can_replay = configure_replay(&mut agent, &w, port, &mut modes, &mut skipped)?;
    let mut bench = Bench {
        client,
        agent,
        announcer: Announcer::new(&server.run_dir, &[pid])?,
        sweep: preheat_engine::sweep::EvictionBuffer::new(a.sweep_mib << 20),
        keep_awake: keep_awake.as_ref(),
        wake,
        port,
        server_cpu,
        client_cpu,
        lead_us: a.lead_us,
        idle_ms: a.idle_ms,
        post_gap_us: a.post_gap_us,
        sweep_ns_recent: 5_000_000,
        bad_replies: 0,
    };
    let auto = choose_auto(&mut bench, &mut modes, can_replay, a.pilot_rounds, a.json)?;
    let samples = measure_rounds(&mut bench, &modes, a.rounds, a.records.as_ref(), a.json)?;

    let hot_floor = keep_awake.as_ref().map(|k| k.note.clone());
    let agent_counters = agent_preheat(&mut bench.agent, port)?.preheat;
    drop(bench);
    drop(keep_awake);
    let mut rows = table(&modes, &samples, &ws_stats);
    flag_served_elsewhere(&mut rows, &samples, pid);
    let machine = format!(
        "{} CPUs, cpuidle {}",
        ncpu,
        preheat_engine::topology::read()
            .cpuidle_driver
            .unwrap_or_else(|| "none".into())
    );
    let out = Output {
        server: server.spec.name.clone(),
        machine,
        label: "measured",
        rounds: a.rounds,
        lead_us: a.lead_us,
        server_cpu,
        client_cpu,
        record: rec_stats,
        prepared,
        pmu: preheat_engine::topology::has_pmu(),
        cpi: None,
        skipped,
        hot_floor,
        floor_check: floor_check(&samples),
        wake_mechanism: wake.describe(),
        calibration,
        auto,
        decomposition: decomposition(&samples),
        agent_counters,
        rows,
        samples,
    };
    if let Some(p) = &a.out {
        std::fs::write(p, serde_json::to_vec_pretty(&out)?)
            .with_context(|| format!("writing {}", p.display()))?;
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        print_table(&out, &ws_stats);
    }
    Ok(())
}

/// Flag preheat modes with samples none of whose requests reached the preheated process (the
/// agent of `pid` saw no busy period): their numbers are not about a preheated server.
fn flag_served_elsewhere(rows: &mut [Row], samples: &[Sample], pid: u32) {
    for r in rows.iter_mut() {
        let of_mode = samples.iter().filter(|s| s.mode == r.mode);
        let judged: Vec<bool> = of_mode.filter_map(|s| s.served_by_preheated).collect();
        let missed = judged.iter().filter(|ok| !**ok).count();
        if missed > 0 {
            r.flags.push(format!(
                "{missed} of {} requests [measured] did not reach the preheated process (pid \
                 {pid} saw no busy period): another process answered (a prefork server that \
                 closes its connections picks any worker)",
                judged.len()
            ));
        }
    }
}

/// A recorded profile for a catalog server names the port it was recorded on, which is a fresh
/// one each run: a profile whose only class is for another port is used for `port` (a copy in
/// `dir`, with a note). Several classes and none for `port`: an error naming them.
fn relabel_port(path: &std::path::Path, port: u16, dir: &std::path::Path) -> Result<PathBuf> {
    let mut p = read_profile(path)?;
    if p.class(port).is_some() {
        return Ok(path.to_path_buf());
    }
    if p.classes.len() != 1 {
        anyhow::bail!(
            "{} has no working set for port {port} and {} classes (ports {:?}): cannot tell which to use",
            path.display(),
            p.classes.len(),
            p.classes.iter().map(|c| c.port).collect::<Vec<_>>()
        );
    }
    eprintln!(
        "demo: using the working set {} recorded for port {} on this run's port {port}",
        path.display(),
        p.classes[0].port
    );
    p.classes[0].port = port;
    let out = dir.join("profile-this-port.phws");
    write_profile(&out, &p)?;
    Ok(out)
}
