//! The exact recording backends, the ground truth the probe is scored against: `trace` (every
//! user-space line a request's busy periods touch, from our Valgrind tool; no agent) and `step`
//! (every code line the serving thread executes, by single-stepping it with ptrace; no data).

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use preheat_model::proto::{Reply, Request};
use preheat_model::{filter_k_of_n, Backend, RegionTable};

use crate::params::{RecordParams, RecordStats, Recording};
use crate::profile::{file_ident, make_profile};
use crate::serving::served_by;
use preheat_launch::agentctl::AgentClient;
use preheat_launch::launch::{Client, Server};
use preheat_launch::progress::Progress;
use preheat_launch::servers::Workload;

/// Estimate with the `trace` backend: run the server under our Valgrind tool (no agent), send
/// the request `n` times with idle gaps, and take each request's busy periods (all threads) as
/// one sample of exact user-space lines.
pub fn record_trace(
    argv: &[String],
    port: u16,
    plan: Option<&preheat_lab::servers::Plan>,
    w: &Workload,
    p: &RecordParams,
    progress: &dyn Progress,
) -> Result<Recording> {
    use preheat_trace::{TraceOptions, TracedServer};
    let t0 = Instant::now();
    if preheat_launch::launch::port_in_use(port) {
        bail!("port {port} is already in use on 127.0.0.1");
    }
    let exe_path = preheat_engine::host::find_program(&argv[0])
        .or_else(|| Some(std::path::PathBuf::from(&argv[0])))
        .context("empty command")?;
    let exe = file_ident(&exe_path)?;
    if !p.quiet {
        eprintln!(
            "preheat: starting {} under the phtrace Valgrind tool (slow: ~100x)",
            exe.path
        );
    }
    let mut ts = TracedServer::spawn(argv, &TraceOptions::default())
        .map_err(|e| anyhow::anyhow!("trace backend unavailable: {e}"))?;
    let deadline = Instant::now() + Duration::from_secs(120);
    while !preheat_launch::launch::port_in_use(port) {
        if !ts.is_running() {
            bail!("server exited under valgrind; log:\n{}", ts.log());
        }
        if Instant::now() > deadline {
            bail!(
                "server did not listen on port {port} under valgrind within 120 s; log:\n{}",
                ts.log()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    if let Some(plan) = plan {
        preheat_launch::servers::prepare(plan, addr)?;
    }
    let mut client = w.connect(addr)?;
    crate::serving::warm_up(p, || client.request_ok().map(drop), progress)?;
    std::thread::sleep(Duration::from_millis(300));
    ts.read_new_periods()?;
    let pid = ts.pid();
    let table = RegionTable::build(
        preheat_engine::maps::read_maps(Some(pid))
            .context("reading the traced server's mappings")?,
    );
    let pb = progress;
    pb.start(p.filter.n as u64, "trace");
    let mut stats = RecordStats::started("trace", p);
    let mut samples = Vec::new();
    for _ in 0..p.filter.n {
        if !client.request()? {
            bail!("wrong reply from the server under valgrind");
        }
        stats.requests_sent += 1;
        // The busy period ends when the server waits again; give Valgrind time to write it.
        std::thread::sleep(Duration::from_millis(100));
        let periods = ts.read_new_periods()?;
        let lines: Vec<u64> = periods
            .iter()
            .filter(|b| b.complete)
            .flat_map(|b| b.lines.iter().copied())
            .collect();
        let (set, dropped) = preheat_trace::to_region_lines(&lines, &table);
        stats.unmapped_hits += dropped;
        stats.lines_per_sample.push(set.len() as u64);
        samples.push(set);
        pb.inc(1);
    }
    pb.finish();
    ts.stop();
    let lines = filter_k_of_n(&samples, p.filter.k as usize);
    stats.seconds = t0.elapsed().as_secs_f64();
    Ok(Recording {
        profile: make_profile(Backend::Trace, p.filter, exe, &table, port, &lines),
        stats,
    })
}

/// Estimate code lines with the `step` backend: for each sample, stop the thread that serves the
/// port (from the agent's per-port statistics), single-step it through one request, and keep
/// the executed lines; lines of the agent's own library are dropped (its hooks are not part of
/// the server). Code only: data addresses are not recorded.
///
/// `budget` bounds the whole stepping (the warm-up aside): one request single-stepped takes
/// ~10 µs per instruction, seconds for a managed runtime's; where the samples would take longer
/// (judged after each), the recording stops with an error saying so. `None`: no bound (the
/// user asked for step), each request's reply awaited up to [`STEP_REPLY_LIMIT`].
pub fn record_step(
    server: &Server,
    pid: u32,
    w: &Workload,
    p: &RecordParams,
    budget: Option<Duration>,
    progress: &dyn Progress,
) -> Result<Recording> {
    let t0 = Instant::now();
    let raw = w.raw.as_ref().context(
        "the step backend sends a fixed byte request; this workload has none (use --backend probe)",
    )?;
    let mut agent = AgentClient::connect(&server.run_dir, pid)?;
    let mut client = served_by(server, &mut agent, || {
        let mut c = Client::connect(server.addr())?;
        c.request(&raw.request, &raw.until)?;
        Ok(c)
    })?;
    crate::serving::warm_up(
        p,
        || client.request(&raw.request, &raw.until).map(drop),
        progress,
    )?;
    std::thread::sleep(Duration::from_millis(20));
    let (tid, table, exe) = step_target(server, &mut agent, pid)?;
    let pb = progress;
    pb.start(p.filter.n as u64, "step");
    let mut stats = RecordStats::started("step", p);
    let mut samples = Vec::new();
    // The tracer runs on the server's CPU where it has one: each step is then a switch on that
    // CPU, not a wake-up of another (measured: 17.5 against 29 µs per step, a C loop).
    let cpu = (server.spec.cpus.len() == 1).then(|| server.spec.cpus[0]);
    let reply_limit = budget.unwrap_or(STEP_REPLY_LIMIT);
    let stepping = Instant::now();
    // The samples to take: all asked for, unless the budget fits fewer (judged as they come).
    let mut want = p.filter.n;
    let mut i = 0;
    while i < want {
        let one = |c| step_one(tid, c, &raw.request, &raw.until, reply_limit);
        let (c, trace) = match cpu {
            Some(cpu) => preheat_engine::os::on_cpu(cpu, || one(client))
                .with_context(|| format!("pinning the tracer to CPU {cpu}"))??,
            None => one(client)?,
        };
        client = c;
        i += 1;
        stats.step_instructions.push(trace.instructions);
        stats.step_seconds = stepping.elapsed().as_secs_f64();
        if let Some(b) = budget {
            want = samples_in_budget(want, i, stats.step_seconds, b, trace.instructions)?;
        }
        stats.requests_sent += 1;
        let (set, unmapped) = table.relative_lines(trace.lines.iter().copied());
        stats.unmapped_hits += unmapped;
        stats.lines_per_sample.push(set.len() as u64);
        samples.push(set);
        pb.inc(1);
    }
    pb.finish();
    // Fewer samples than asked for: the vote keeps the same share of them.
    let filter = preheat_model::FilterParams {
        n: want,
        k: (p.filter.k * want).div_ceil(p.filter.n.max(1)).max(1),
        ..p.filter
    };
    stats.samples = want;
    let lines = filter_k_of_n(&samples, filter.k as usize);
    stats.seconds = t0.elapsed().as_secs_f64();
    Ok(Recording {
        profile: make_profile(Backend::Step, filter, exe, &table, server.spec.port, &lines),
        stats,
    })
}

/// The thread that serves the port (the agent's per-port statistics), the server's mappings
/// without the agent's own library (its hooks are not part of the server), and its executable.
fn step_target(
    server: &Server,
    agent: &mut AgentClient,
    pid: u32,
) -> Result<(u32, RegionTable, preheat_model::FileIdent)> {
    let tid = match agent.call(&Request::Status)? {
        Reply::Status { ports, .. } => ports
            .iter()
            .find(|x| x.port == server.spec.port)
            .map(|x| x.last_tid)
            .filter(|t| *t != 0),
        _ => None,
    }
    .context("the agent has not seen the port served yet")?;
    let agent_so = preheat_launch::paths::agent_so()
        .ok()
        .and_then(|p| std::fs::canonicalize(p).ok())
        .map(|p| p.to_string_lossy().into_owned());
    let maps: Vec<preheat_model::Mapping> = preheat_engine::maps::read_maps(Some(pid))
        .context("reading the server's mappings")?
        .into_iter()
        .filter(|m| agent_so.as_deref() != Some(m.name.as_str()))
        .collect();
    let table = RegionTable::build(maps);
    let exe = preheat_engine::maps::exe_ident(Some(pid))?;
    Ok((tid, table, exe))
}

/// How long a request whose server is single-stepped may take to be answered, where no budget
/// bounds it.
pub const STEP_REPLY_LIMIT: Duration = Duration::from_secs(300);

/// The most instructions one request may take to single-step.
const STEP_MAX_INSTRUCTIONS: u64 = 50_000_000;

/// The fewest samples the step backend takes where a budget cuts them short: fewer cannot be
/// voted on.
const MIN_STEP_SAMPLES: u32 = 3;

/// How many of the `want` samples fit `budget` after `done` of them took `seconds` (the last
/// one `instructions` long): `want` where all fit, fewer where at least [`MIN_STEP_SAMPLES`]
/// do, else an error saying why.
fn samples_in_budget(
    want: u32,
    done: u32,
    seconds: f64,
    budget: Duration,
    instructions: u64,
) -> Result<u32> {
    let each = seconds / f64::from(done);
    let fit = (budget.as_secs_f64() / each).floor() as u32;
    if fit >= want {
        return Ok(want);
    }
    if fit >= MIN_STEP_SAMPLES {
        return Ok(fit.max(done));
    }
    bail!(
        "one request single-stepped took {each:.1} s ({instructions} instructions): \
         {MIN_STEP_SAMPLES} samples would take {:.0} s, over the {:.0} s budget (`--backend \
         step` records anyway)",
        each * f64::from(MIN_STEP_SAMPLES),
        budget.as_secs_f64()
    )
}

/// Single-steps thread `tid` through one request sent on `client` (from another thread, so
/// the traced thread can be stopped meanwhile, blocked in the kernel while it waits, up to
/// `reply_limit`); returns the connection, to be used again, and what the thread executed
/// until its next wait.
fn step_one(
    tid: u32,
    client: Client,
    request: &[u8],
    until: &[u8],
    reply_limit: Duration,
) -> Result<(Client, preheat_engine::steptrace::StepTrace)> {
    let mut tracer = preheat_engine::steptrace::StepTracer::attach(tid).with_context(|| {
        format!("attaching ptrace to thread {tid} (needs root or ptrace_scope 0)")
    })?;
    let req = request.to_vec();
    let until = until.to_vec();
    let answered = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let answered2 = answered.clone();
    // The request goes on the persistent connection (as the probe's own request does).
    let mut c = client;
    let sender = std::thread::spawn(move || -> Result<Client> {
        std::thread::sleep(Duration::from_millis(5));
        let sent = c.request_blocking(&req, &until, reply_limit);
        // Also on failure (e.g. the reply timed out while the server was single-stepped):
        // the tracer then stops at the server's next wait instead of stepping into an
        // event wait no request will end (seen: a recording hung in waitpid).
        answered2.store(true, std::sync::atomic::Ordering::SeqCst);
        sent.map(|()| c)
    });
    let trace = tracer.trace_until_wait(STEP_MAX_INSTRUCTIONS, &|| {
        answered.load(std::sync::atomic::Ordering::SeqCst)
    })?;
    drop(tracer);
    let client = sender
        .join()
        .map_err(|_| anyhow::anyhow!("request thread panicked"))??;
    if !trace.reached_wait {
        bail!("the traced request did not finish within {STEP_MAX_INSTRUCTIONS} instructions");
    }
    Ok((client, trace))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_budget_takes_fewer_samples_or_gives_up() {
        let b = Duration::from_secs(10);
        // 0.5 s each: all 8 fit.
        assert_eq!(samples_in_budget(8, 1, 0.5, b, 1).unwrap(), 8);
        // 2.3 s each (the JVM's): 4 fit.
        assert_eq!(samples_in_budget(8, 1, 2.3, b, 1).unwrap(), 4);
        assert_eq!(samples_in_budget(4, 2, 4.6, b, 1).unwrap(), 4);
        // Never fewer than already taken.
        assert_eq!(samples_in_budget(8, 4, 12.0, b, 1).unwrap(), 4);
        // 93 s each (Node.js's): not even the fewest.
        let e = samples_in_budget(8, 1, 93.0, b, 4_820_314)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("4820314 instructions") && e.contains("10 s budget"),
            "{e}"
        );
    }
}
