//! The demo's run: the paper's Table 1 in miniature, on a catalog server or any server given by
//! its command, as a pipeline (`wanted_modes` → `start_server` → `estimate` → `configure_replay`
//! → `choose_auto` → `measure_rounds` → the table) whose result is the serializable [`Output`]
//! (`output.rs`).
//!
//! 1. Start the server pinned to one CPU with the agent attached; the client runs on another.
//! 2. Record the per-request working set (probe backend by default) and load it into the agent.
//! 3. Run interleaved, shuffled rounds. Every round measures each mode once, in random order:
//!    * `hot` — the floor: right after a previous request, with the server's CPU kept out of
//!      idle (see [`crate::hot`]); skipped, saying why, where no mechanism allows it;
//!    * `warm` — right after a previous request;
//!    * `cold-idle` — after an idle gap (real idle: the vCPU halts, other tenants evict);
//!    * `cold-sweep` — after a 128 MiB eviction sweep on the server's CPU (emulates the cache
//!      loss of a deep sleep state, as the paper's flush) plus a short gap;
//!    * `control` — the same gap as `cold-sweep` without the sweep (separates wakeup cost from
//!      cache loss);
//!    * `preheat:S` — like `cold-sweep`, but the request is announced `lead` µs ahead and the
//!      agent applies strategies S (wake, lines, replay, combinations);
//!    * `preheat:auto` — the strategies a pilot before the rounds measured to help most
//!      (`pilot.rs`, [`preheat_model::auto`]), or nothing.
//! 4. Report response-time p50/p99 with 95% CIs and, for preheat rows, the working-set size, runs,
//!    encoded bytes, preheat time, GB/s and the share of the cold overhead removed — against the
//!    hot floor (warm beside it) — split by stage (see `table.rs`); flag every preheat mode
//!    measured slower than none (cold-sweep, per round) and every replay whose warm-up was still
//!    being served at the arrival.
//!
//! Response time is measured by the client from the moment it sends (for announced requests:
//! at the announced arrival time) until the full reply is read. Everything printed is measured
//! on this machine unless labeled otherwise; the paper's numbers are printed as the paper's.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use preheat_model::proto::{ReplayVia, Reply, Request, Strategies};
use rand::seq::SliceRandom;

use preheat_engine::netns::VethHost;
use preheat_estimate::serving::serving_agents;
use preheat_estimate::{read_profile, record, write_profile, RecordParams, RecordStats};
use preheat_launch::agentctl::{AgentClient, Announcer};
use preheat_launch::progress::Progress;
use preheat_launch::servers;

use crate::custom;
use crate::join::Join;
use crate::measure::{Bench, ColdPath};
use crate::mode::{agent_preheat, wanted_modes, Mode, Sample, WakeAs};
use crate::output::{Output, Skipped};
use crate::params::DemoParams;
use crate::pilot;
use crate::table::{decomposition, floor_check, table, Row};

/// Start the catalog server or the command after `--`, pinned to `server_cpu`, with the agent
/// inside it or (`outside::place`) outside it.
#[allow(clippy::type_complexity)]
fn start_server(
    a: &DemoParams,
    dir: &std::path::Path,
    (server_cpu, client_cpu): (usize, usize),
) -> Result<(
    preheat_launch::launch::Server,
    servers::Workload,
    preheat_lab::servers::Prepared,
    Option<preheat_outside::OutsideAgent>,
)> {
    let outside_why = crate::outside::place(a.agent, &a.command, a.netns, "demo")?;
    let inside = outside_why.is_none();
    let shown = if a.command.is_empty() {
        a.server.name().to_string()
    } else {
        a.command.join(" ")
    };
    eprintln!(
        "demo: starting {shown} on CPU {server_cpu}{} and loading its data; client on CPU \
         {client_cpu}",
        if inside { " with the agent" } else { "" }
    );
    let netns = if a.netns {
        let ns = VethHost::create().map_err(|e| anyhow::anyhow!("--netns: {e}"))?;
        eprintln!(
            "demo: the server runs in network namespace {}, reached over a veth pair ({} -> {})",
            ns.name(),
            ns.local,
            ns.remote
        );
        Some(Arc::new(ns))
    } else {
        None
    };
    let attach = |server: &preheat_launch::launch::Server| {
        outside_why
            .clone()
            .map(|why| crate::outside::attach(server, server_cpu, why, "demo"))
            .transpose()
    };
    if a.command.is_empty() {
        let at = servers::Placement {
            cpus: vec![server_cpu],
            agent: inside,
            netns,
        };
        let started = servers::start(a.server, None, dir, at)?;
        let outside = attach(&started.server)?;
        return Ok((started.server, started.workload, started.prepared, outside));
    }
    let custom = custom::CustomServer {
        command: &a.command,
        port: a.port,
        protocol: a.protocol,
        request: a.request.as_deref(),
        until: &a.until,
    };
    let (server, w) = custom.start(dir, vec![server_cpu], netns, inside)?;
    let outside = attach(&server)?;
    Ok((server, w, Default::default(), outside))
}

/// Record the working set (or take `--profile`) and load it into the agent of `pid`: its
/// file, the recording's statistics, its size.
#[allow(clippy::type_complexity)]
fn estimate(
    a: &DemoParams,
    server: &preheat_launch::launch::Server,
    pid: u32,
    w: &servers::Workload,
    client: &mut servers::Requester,
    dir: &std::path::Path,
    progress: &dyn Progress,
) -> Result<(Option<PathBuf>, Option<RecordStats>, preheat_model::WsStats)> {
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
            let rec = record::record_probe(server, pid, w, &params, client, progress)?;
            let path = dir.join(format!("{}.phws", server.spec.name));
            write_profile(&path, &rec.profile)?;
            (path, Some(rec.stats))
        }
    };
    let loaded = AgentClient::connect(&server.run_dir, pid)?.call(&Request::LoadProfile {
        path: path.to_string_lossy().into_owned(),
    })?;
    // Regions the agent could not use (from outside the server: its anonymous memory).
    if let Reply::Loaded {
        skipped_regions, ..
    } = &loaded
    {
        for s in skipped_regions.iter().take(4) {
            eprintln!("demo: the profile's {s}");
        }
        if skipped_regions.len() > 4 {
            eprintln!(
                "demo: and {} more of the profile's regions skipped",
                skipped_regions.len() - 4
            );
        }
    }
    let ws = working_set(&path, port)?;
    Ok((Some(path), stats, ws))
}

/// The strategies `auto` may choose from: `wake`, `lines`, `replay` where the warm-up was
/// configured.
fn available(replay: bool) -> Strategies {
    let mut s = Strategies::WAKE.union(Strategies::LINES);
    if replay {
        s = s.union(Strategies::REPLAY);
    }
    s
}

/// The workload's warm-up request and the end of its reply, as the agent's `Configure` takes
/// them (`None`: the workload has no warm-up).
fn warm_up_request(w: &servers::Workload) -> (Option<String>, Option<String>) {
    w.raw
        .as_ref()
        .map(|r| {
            (
                String::from_utf8_lossy(&r.replay).into_owned(),
                String::from_utf8_lossy(&r.replay_until).into_owned(),
            )
        })
        .unzip()
}

/// Whether the workload speaks MySQL (its warm-up runs on a session opened for the agent).
fn is_mysql(w: &servers::Workload) -> bool {
    w.spec
        .as_ref()
        .is_some_and(|s| s.protocol == preheat_lab::driver::Protocol::Mysql)
}

/// Whether the workload has a `replay` warm-up: a fixed request the agent sends itself, or a
/// MySQL session opened for it.
fn has_warm_up(w: &servers::Workload) -> bool {
    w.raw.is_some() || is_mysql(w)
}

/// A MySQL server's warm-up: a session logged in and with the warm-up's statements prepared
/// ([`preheat_launch::mysql_session`]), its reply's end learned from one run, handed to the
/// agent (`ConfigureSession`), which then owns it.
fn configure_session(
    agent: &mut AgentClient,
    w: &servers::Workload,
    server: &preheat_launch::launch::Server,
) -> Result<()> {
    use std::os::fd::AsRawFd;
    let cfg = w
        .spec
        .as_ref()
        .and_then(|s| s.tpcc.clone())
        .unwrap_or_default();
    let mut s = preheat_launch::mysql_session::Session::open(
        server.addr(),
        &cfg.user,
        &cfg.database,
        &preheat_lab::tpcc::WARM_UP,
    )?;
    let until = s.learn()?;
    let request = s.request();
    let stream = s.into_stream();
    let req = Request::ConfigureSession {
        port: server.spec.port,
        request,
        until,
    };
    agent.call_with_fd(&req, stream.as_raw_fd())?;
    Ok(()) // our descriptor closes here; the agent holds its duplicate
}

/// Configure `port`'s warm-up request in the agent. Where the agent cannot open a replay
/// connection its process serves (e.g. the server closes every connection after its reply),
/// the replay modes are dropped into `skipped`, saying why; anything else fails the demo.
///
/// A server in a network namespace of its own (`--netns`) gets its warm-ups from this
/// process's namespace, to the server's end of the veth pair: the path the client's requests
/// take (the agent opens that connection in our namespace).
fn configure_replay(
    agent: &mut AgentClient,
    w: &servers::Workload,
    server: &preheat_launch::launch::Server,
    modes: &mut Vec<Mode>,
    skipped: &mut Vec<Skipped>,
) -> Result<bool> {
    let port = server.spec.port;
    let (replay, replay_until) = warm_up_request(w);
    let wants_replay = has_warm_up(w);
    let replay_via = server.spec.netns.as_ref().map(|veth| ReplayVia {
        netns: format!("/proc/{}/ns/net", std::process::id()),
        addr: veth.remote.into(),
    });
    let configured = agent
        .call(&Request::Configure {
            port,
            replay,
            replay_until,
            split_cpus: vec![],
            replay_via,
        })
        .and_then(|_| {
            if !is_mysql(w) {
                return Ok(());
            }
            configure_session(agent, w, server).context("opening the warm-up's MySQL session")
        });
    let e = match configured {
        Ok(()) => return Ok(wants_replay),
        Err(e) if !wants_replay => return Err(e),
        Err(e) => e,
    };
    agent.call(&Request::Configure {
        port,
        replay: None,
        replay_until: None,
        split_cpus: vec![],
        replay_via: None,
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
    available: Strategies,
    rounds: usize,
    progress: &dyn Progress,
) -> Result<Option<preheat_model::auto::AutoChoice>> {
    let Some(slot) = modes.iter_mut().find(|m| matches!(m, Mode::Auto(_))) else {
        return Ok(None);
    };
    let cands = pilot::candidates(available);
    eprintln!(
        "demo: auto: piloting {} candidates against none, {rounds} rounds",
        cands.len()
    );
    let choice = pilot::run(bench, &cands, rounds, progress)?;
    eprintln!("demo: auto chose {}: {}", choice.chosen, choice.why);
    *slot = Mode::Auto(choice.bits);
    for m in modes.iter_mut() {
        if let Mode::ConnPrimed(s) = m {
            *s = choice.bits;
        }
    }
    Ok(Some(choice))
}

/// The table's rounds: every mode once per round, in shuffled order.
fn measure_rounds(
    bench: &mut Bench<'_>,
    modes: &[Mode],
    rounds: usize,
    records: Option<&PathBuf>,
    progress: &dyn Progress,
) -> Result<Vec<Sample>> {
    let mut records = match records {
        Some(p) => Some(std::io::BufWriter::new(
            std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))?,
        )),
        None => None,
    };
    progress.start((rounds * modes.len()) as u64, "measuring");
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
            progress.inc(1);
        }
    }
    progress.finish();
    if bench.bad_replies > 0 {
        bail!(
            "{} replies were wrong: the server misbehaved under the agent (the first: {})",
            bench.bad_replies,
            bench.first_bad.as_deref().unwrap_or_default()
        );
    }
    Ok(samples)
}

/// The keep-awake calibration (measured once per boot, cached in the run directory) and the hot
/// floor's mechanism from it, or why there is none (into `skipped`). Without a mechanism the
/// floor is the server's threads held alone, which a server preheated from `outside` cannot
/// have.
fn keep_awake(
    server: &preheat_launch::launch::Server,
    outside: bool,
    skipped: &mut Vec<Skipped>,
) -> (
    Option<preheat_wake::calibrate::Calibration>,
    Option<crate::hot::KeepAwake>,
) {
    let calibration =
        preheat_wake::calibrate::load_or_calibrate(&preheat_launch::paths::run_dir(), |m| {
            eprintln!("demo: {m}")
        })
        .map_err(|e| format!("the keep-awake calibration failed: {e:#}"));
    let keep = calibration
        .as_ref()
        .map_err(String::clone)
        .and_then(|c| crate::hot::KeepAwake::open(&server.run_dir, c))
        .and_then(|k| match k.mechanism {
            None if outside => Err(format!(
                "{}; and the server's threads cannot be held from outside the process",
                k.note
            )),
            _ => Ok(k),
        });
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

/// The modes of `wanted` that can run here: `hot` only with a keep-awake mechanism, replay
/// strategies only where the workload has a fixed request the agent can send (the others into
/// `skipped`, saying why).
fn runnable_modes(
    wanted: Vec<Mode>,
    has_hot: bool,
    w: &servers::Workload,
    server: &str,
    skipped: &mut Vec<Skipped>,
) -> Vec<Mode> {
    let mut modes = Vec::new();
    for m in wanted {
        match m {
            Mode::Hot if !has_hot => {}
            Mode::Preheat(st) if st.contains(Strategies::REPLAY) && !has_warm_up(w) => skipped
                .push(Skipped {
                    mode: m.name(),
                    reason: format!(
                        "replay needs a fixed request the agent can send itself, or a session \
                         opened for it (MySQL); {server} has neither"
                    ),
                }),
            m => modes.push(m),
        }
    }
    modes
}

/// The machine line of the output: CPUs and the cpuidle driver.
fn machine(ncpu: usize) -> String {
    format!(
        "{} CPUs, cpuidle {}",
        ncpu,
        preheat_engine::topology::read()
            .cpuidle_driver
            .unwrap_or_else(|| "none".into())
    )
}

/// Run the demo: start the server, estimate its working set, pilot `auto`, measure the rounds
/// and compute the table. The recording reports its progress to `recording`, the pilot and
/// the rounds to `measuring`; notes go to stderr (`demo: ...`). The server and everything
/// started for it are stopped before this returns.
pub fn run(a: &DemoParams, recording: &dyn Progress, measuring: &dyn Progress) -> Result<Output> {
    a.check()?;
    let (ncpu, server_cpu, client_cpu) = placement(a)?;
    let wanted = wanted_modes(a)?;
    preheat_engine::os::set_affinity(&[client_cpu]).context("pinning the client")?;
    // Before the server starts, with its CPU idle (~20 ms).
    let predictor = preheat_wake::predictor::measure_on(server_cpu);

    let scratch = preheat_launch::launch::scratch_dir("demo")?;
    let dir = scratch.path().to_path_buf();
    let (server, w, prepared, outside) = start_server(a, &dir, (server_cpu, client_cpu))?;
    let outside_why = outside.as_ref().map(|o| o.describe());
    let port = server.spec.port;
    let mut client = w.connect(server.addr())?;
    let mut skipped = Vec::new();
    let (calibration, keep_awake) = keep_awake(&server, outside.is_some(), &mut skipped);
    let wake = WakeAs::from_calibration(calibration.as_ref());
    let has_hot = keep_awake.is_some();
    let mut modes = runnable_modes(wanted, has_hot, &w, &server.spec.name, &mut skipped);
    for s in &skipped {
        eprintln!("demo: skipping {}: {}", s.mode, s.reason);
    }
    // The agent of the process that serves *this* client's connection (prefork servers have one
    // per worker).
    let serving = find_serving(&server, &mut client)?;
    let pid = serving.primary;
    // Outside the server the same recording runs through the outside agent's probe, on the
    // server's file-backed read-only memory only (`preheat_outside::probe`).
    let (profile_path, rec_stats, ws_stats) =
        estimate(a, &server, pid, &w, &mut client, &dir, recording)?;
    let mut agent = AgentClient::connect(&server.run_dir, pid)?;
    let can_replay = configure_replay(&mut agent, &w, &server, &mut modes, &mut skipped)?;
    let (others, join) =
        configure_others(&server, &serving, profile_path.as_deref(), &w, can_replay)?;
    let cold = cold_path(a, &server, &serving.all, server_cpu, wake)?;
    let agents = (client, agent, others, join);
    let mut bench = Bench::new(agents, cold, keep_awake.as_ref(), server_cpu);
    let syscall_stages = a
        .syscall_stages
        .then(|| attach_syscall_stages(&mut bench, pid, port));
    let loopback = server.spec.netns.is_none();
    let available = available(can_replay);
    let (auto, steer_rx, samples) =
        pilots_and_rounds(a, &mut bench, &mut modes, available, loopback, measuring)?;

    let hot_floor = keep_awake
        .as_ref()
        .map(|k| bench.hot_hold.describe(&k.note));
    let agent_counters = agent_preheat(&mut bench.agent, port)?.preheat;
    let joined_pids = std::mem::take(&mut bench.join.joined);
    let client_pings = bench.cold.warmth.pings;
    let serving_pids = [serving.all, joined_pids.clone()].concat();
    drop(bench);
    drop(keep_awake);
    let mut rows = table(&modes, &samples, &ws_stats);
    flag_served_elsewhere(&mut rows, &samples, pid);
    let auto_chose = auto.as_ref().map_or(Strategies::NONE, |c| c.bits);
    let out = Output {
        serving_pids,
        joined_pids,
        server: server.spec.name.clone(),
        machine: machine(ncpu),
        label: "measured",
        rounds: a.rounds,
        lead_us: a.lead_us,
        server_cpu,
        client_cpu,
        transport: transport(&server, can_replay),
        client_pings,
        steer_rx,
        record: rec_stats,
        prepared,
        pmu: preheat_engine::topology::has_pmu(),
        cpi: None,
        skipped,
        hot_floor,
        floor_check: floor_check(&samples),
        wake_mechanism: wake.ran_as(outside_why.is_some(), &agent_counters),
        syscall_stages,
        outside: outside_why,
        calibration,
        predictor,
        auto,
        decomposition: decomposition(&samples),
        connection_state: crate::connection::connection_state(&rows, &samples, auto_chose),
        agent_counters,
        rows,
        samples,
        ws: ws_stats,
    };
    drop(outside);
    server.stop_and_tidy(&out.serving_pids, a.keep_agent_logs); // a failed demo keeps its logs
    Ok(out)
}

/// Attach the syscall observer to the serving process for `--syscall-stages`: what it is, or
/// why it could not attach (the demo runs on without the split).
fn attach_syscall_stages(bench: &mut Bench<'_>, pid: u32, port: u16) -> Result<String, String> {
    match crate::sysstages::SysStages::attach(pid, port) {
        Ok(st) => {
            let what = format!(
                "the syscall observer attached to pid {pid} ({}; every mode alike)",
                st.described
            );
            bench.sys = Some(st);
            Ok(what)
        }
        Err(e) => {
            let why = format!("{e:#}");
            eprintln!("demo: --syscall-stages: {why}; no split at the system calls");
            Err(why)
        }
    }
}

/// The way from a just-served state to the send: announcing to `pids`, sweeping on
/// `server_cpu`, the client's own path kept warm meanwhile.
fn cold_path(
    a: &DemoParams,
    server: &preheat_launch::launch::Server,
    pids: &[u32],
    server_cpu: usize,
    wake: WakeAs,
) -> Result<ColdPath> {
    Ok(ColdPath {
        announcer: Announcer::new(&server.run_dir, pids)?,
        sweep: crate::sweeper::Sweeper::start(
            preheat_engine::sweep::EvictionBuffer::new(a.sweep_mib << 20),
            server_cpu,
        )?,
        warmth: crate::warmth::ClientWarmth::new()?,
        wake,
        port: server.spec.port,
        lead_us: a.lead_us,
        idle_ms: a.idle_ms,
        post_gap_us: a.post_gap_us,
        sweep_ns_recent: 5_000_000,
    })
}

/// `auto`'s pilot, the receive-steering choice, then the table's rounds (steering put back
/// after them).
#[allow(clippy::type_complexity)]
fn pilots_and_rounds(
    a: &DemoParams,
    bench: &mut Bench<'_>,
    modes: &mut [Mode],
    available: Strategies,
    loopback: bool,
    measuring: &dyn Progress,
) -> Result<(
    Option<preheat_model::auto::AutoChoice>,
    Option<crate::SteerChoice>,
    Vec<Sample>,
)> {
    let (steering, mut steer_rx) = crate::steer::open(a.steer_rx, loopback, bench.server_cpu);
    let auto = choose_auto(bench, modes, available, a.pilot_rounds, measuring)?;
    if let Some(s) = &steering {
        steer_rx = Some(crate::steer::decide(
            a.steer_rx,
            s,
            bench,
            modes,
            a.pilot_rounds,
        )?);
    }
    let samples = measure_rounds(bench, modes, a.rounds, a.records.as_ref(), measuring)?;
    // The machine's receive path back as it was before anything else happens.
    drop(steering);
    Ok((auto, steer_rx, samples))
}

/// How requests reach `server` (see [`Output::transport`]), and where a replay's warm-ups come
/// from (`replays`: the replay modes run).
fn transport(server: &preheat_launch::launch::Server, replays: bool) -> String {
    match &server.spec.netns {
        None => "loopback".into(),
        Some(ns) => format!(
            "veth {} -> {} (server in network namespace {}{}){}",
            ns.local,
            ns.remote,
            ns.name(),
            if ns.holds(server.pid()) {
                ""
            } else {
                ": NOT verified on its process"
            },
            if replays {
                "; replay warm-ups come over the veth pair too"
            } else {
                ""
            }
        ),
    }
}

/// The agents of the processes that serve the port ([`serving_agents`]); where that is more
/// than one (any worker accepts the next connection), said on stderr.
fn find_serving(
    server: &preheat_launch::launch::Server,
    client: &mut servers::Requester,
) -> Result<preheat_estimate::serving::Serving> {
    let serving = serving_agents(server, client)?;
    let (port, pid) = (server.spec.port, serving.primary);
    if serving.all.len() > 1 {
        eprintln!(
            "demo: port {port}'s requests go to any of {} processes (pids {:?}; the server \
             closes its connections and any worker accepts the next): announcements go to all \
             of them; recording through pid {pid}, which served most",
            serving.all.len(),
            serving.all
        );
    }
    Ok(serving)
}

/// The agents of the server's processes other than the primary that serve the port (see
/// [`serving_agents`]): each gets the profile and, where the primary replays, the same warm-up.
/// The server's remaining agents go to `join`'s spares (they join once one serves a measured
/// request: [`crate::join`]).
fn configure_others(
    server: &preheat_launch::launch::Server,
    serving: &preheat_estimate::serving::Serving,
    profile: Option<&Path>,
    w: &servers::Workload,
    replay: bool,
) -> Result<(Vec<AgentClient>, Join)> {
    let mut join = Join {
        port: server.spec.port,
        profile: profile.map(Path::to_path_buf),
        warm_up: replay.then(|| warm_up_request(w)),
        spares: Vec::new(),
        joined: Vec::new(),
    };
    let mut out = Vec::new();
    for &pid in serving.all.iter().filter(|p| **p != serving.primary) {
        let mut c = AgentClient::connect(&server.run_dir, pid)?;
        join.give(&mut c)?;
        out.push(c);
    }
    for pid in server.agent_pids() {
        if !serving.all.contains(&pid) {
            join.spares
                .push((pid, AgentClient::connect(&server.run_dir, pid)?));
        }
    }
    Ok((out, join))
}

/// (online CPUs, the server's CPU, the client's CPU): the server on `--server-cpu` or the
/// last CPU, the client on another one.
fn placement(a: &DemoParams) -> Result<(usize, usize, usize)> {
    let ncpu = preheat_engine::os::online_cpus();
    if ncpu < 2 {
        bail!(
            "the demo needs 2 CPUs (server and client on different CPUs); this machine has {ncpu}"
        );
    }
    let server_cpu = a.server_cpu.unwrap_or(ncpu - 1);
    preheat_engine::os::check_cpu(server_cpu).map_err(|e| anyhow::anyhow!("--server-cpu: {e}"))?;
    let client_cpu = if server_cpu == 0 { 1 } else { 0 };
    Ok((ncpu, server_cpu, client_cpu))
}

/// The statistics of the working set for `port` in the profile at `profile_path`.
fn working_set(profile_path: &Path, port: u16) -> Result<preheat_model::WsStats> {
    let profile = read_profile(profile_path)?;
    profile.class(port).map(|c| c.ws.stats()).with_context(|| {
        format!(
            "{} has no working set for port {port}",
            profile_path.display()
        )
    })
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
