//! Agent overhead on warm requests: per pair, two bundled servers on the same CPU, one without
//! and one with the agent, both alive for the whole pair; closed-loop GETs alternate between
//! them in blocks (ABBA order), so drift and the host's stalls fall on both alike. Throughput
//! loss (each server's requests over the time of its blocks; and, robust to a stall hitting one
//! block, the median over block pairs) and p50 delta per pair, reported as the median over pairs
//! with its range (goal ≤ 1% and ≤ 1 µs). The A/A control runs both servers without the agent:
//! the benchmark's noise floor. What the hooks cost per request cycle without the network
//! around it: `crates/preheat-agent/examples/hook_cost.rs`.

use anyhow::{bail, Result};
use preheat_launch::progress::Progress;
use preheat_launch::servers::{self, ServerKind};
use preheat_model::stats::{summarize, Spread, Summary};
use serde::Serialize;

use crate::pairs::Pairs;

/// The result of `bench agent` (its JSON).
#[derive(Serialize)]
pub struct AgentBench {
    pub label: &'static str,
    /// Requests per configuration in each pair (split into `blocks` blocks).
    pub requests_per_pair: usize,
    pub pairs: usize,
    pub blocks: usize,
    /// A/A control: the "with" server ran without the agent too (the noise floor).
    pub aa_control: bool,
    /// The "with" server's agent was attached with tracking switched off (hooks pass through).
    pub passthrough: bool,
    /// Latencies pooled over all pairs.
    pub without: Summary,
    pub with: Summary,
    /// Per pair: 1 − with/without throughput (each configuration's requests over the time of
    /// its blocks); median and range over pairs.
    pub throughput_loss_per_pair: Spread,
    /// Per pair: 1 − the median over adjacent block pairs of with/without block throughput
    /// (robust to a stall of the host hitting one block).
    pub throughput_loss_blockwise_per_pair: Spread,
    /// Per pair: p50 with − p50 without, µs.
    pub p50_delta_us_per_pair: Spread,
}

/// One server of an agent-bench pair and its client connection. Dropped, it stops the server
/// and removes its agent's log (a benchmark run of 15 pairs left 15 to 30 behind in the run
/// directory before).
pub(crate) struct BenchServer {
    pub(crate) conn: servers::Requester,
    pub(crate) server: preheat_launch::launch::Server,
    _scratch: tempfile::TempDir,
}

impl Drop for BenchServer {
    fn drop(&mut self) {
        self.server.stop_removing_logs(&[]);
    }
}

/// Connect to a started server and warm it up (1000 requests).
fn warmed(
    server: preheat_launch::launch::Server,
    workload: &servers::Workload,
    scratch: tempfile::TempDir,
) -> Result<BenchServer> {
    let mut conn = workload.connect(server.addr())?;
    for _ in 0..1000 {
        conn.request_ok()?;
    }
    Ok(BenchServer {
        conn,
        server,
        _scratch: scratch,
    })
}

/// A server given by its command (`{port}` in an argument is replaced by a free port), pinned
/// as the bench's servers are, without the agent, answering HTTP GETs of `path` on keep-alive
/// connections; warmed up.
pub(crate) fn bench_command(command: &[String], path: &str) -> Result<BenchServer> {
    let ncpu = preheat_engine::os::online_cpus();
    let scratch = preheat_launch::launch::scratch_dir("bench")?;
    let port = preheat_engine::host::free_port()?;
    let argv: Vec<String> = command
        .iter()
        .map(|a| a.replace("{port}", &port.to_string()))
        .collect();
    if argv == command {
        bail!("the server's command has no {{port}} argument: say where its port goes, e.g. `-- ./server {{port}}`");
    }
    let spec = preheat_launch::launch::ServerSpec {
        name: argv.first().cloned().unwrap_or_default(),
        argv,
        port,
        agent: false,
        cpus: vec![ncpu - 1],
        env: Vec::new(),
        agent_only: None,
        netns: None,
    };
    let server = preheat_launch::launch::start(
        spec,
        &preheat_launch::paths::run_dir(),
        scratch.path(),
        std::time::Duration::from_secs(20),
    )?;
    warmed(server, &servers::Workload::http_get(path), scratch)
}

/// A bench server: without the agent (`None`), with it tracking (`Some(true)`), or with it
/// attached but tracking switched off (`Some(false)`: the hooks pass through).
pub(crate) fn bench_server(agent: Option<bool>) -> Result<BenchServer> {
    bench_server_of(ServerKind::Kv, agent)
}

/// As [`bench_server`], a server of `kind` (a catalog server: its Debian package installed).
pub(crate) fn bench_server_of(kind: ServerKind, agent: Option<bool>) -> Result<BenchServer> {
    let ncpu = preheat_engine::os::online_cpus();
    let scratch = preheat_launch::launch::scratch_dir("bench")?;
    let started = servers::start(
        kind,
        None,
        scratch.path(),
        servers::Placement {
            cpus: vec![ncpu - 1],
            agent: agent.is_some(),
            netns: None,
        },
    )?;
    if agent == Some(false) {
        let mut c = preheat_launch::agentctl::AgentClient::connect(
            &preheat_launch::paths::run_dir(),
            started.server.pid(),
        )?;
        c.call(&preheat_model::proto::Request::SetEnabled { enabled: false })?;
    }
    warmed(started.server, &started.workload, scratch)
}

/// `n` closed-loop requests on `c`: latencies (µs) appended to `lat`; returns the block's time (s).
pub(crate) fn bench_block(c: &mut servers::Requester, n: usize, lat: &mut Vec<f64>) -> Result<f64> {
    let t0 = preheat_engine::time::now_ns();
    for _ in 0..n {
        let a = preheat_engine::time::now_ns();
        if !c.request()? {
            bail!("wrong reply during the benchmark");
        }
        lat.push((preheat_engine::time::now_ns() - a) as f64 / 1e3);
    }
    Ok((preheat_engine::time::now_ns() - t0) as f64 / 1e9)
}

/// One pair: a server without and one with the agent (without, for the A/A control), both alive
/// on the same CPU, requests alternating between them in blocks (ABBA order), so drift over
/// time and the host's stalls fall on both alike.
struct PairResult {
    lat: [Vec<f64>; 2],
    secs: [Vec<f64>; 2],
}

fn bench_pair(
    requests: usize,
    blocks: usize,
    second: Option<bool>,
    first: usize,
) -> Result<PairResult> {
    let mut srv: Vec<BenchServer> = Vec::with_capacity(2);
    // Start (and warm) them in alternating order across pairs.
    let order = if first == 0 { [0, 1] } else { [1, 0] };
    let mut slots: [Option<BenchServer>; 2] = [None, None];
    for k in order {
        slots[k] = Some(bench_server(if k == 1 { second } else { None })?);
    }
    srv.extend(slots.into_iter().flatten());
    let per_block = (requests / blocks).max(1);
    let mut out = PairResult {
        lat: [Vec::with_capacity(requests), Vec::with_capacity(requests)],
        secs: [Vec::new(), Vec::new()],
    };
    for b in 0..2 * blocks {
        let k = usize::from((b % 2 == 1) ^ ((b / 2) % 2 == 1)) ^ first;
        let secs = bench_block(&mut srv[k].conn, per_block, &mut out.lat[k])?;
        out.secs[k].push(secs);
    }
    Ok(out)
}

/// Measure `pairs` pairs of `requests` requests per server in `blocks` blocks each; `aa`: the
/// A/A control, `passthrough`: the agent attached with tracking off.
pub fn measure(
    requests: usize,
    pairs: usize,
    blocks: usize,
    aa: bool,
    passthrough: bool,
    progress: &dyn Progress,
) -> Result<AgentBench> {
    preheat_model::stats::require_repetitions(pairs, "--pairs", "pair")
        .map_err(anyhow::Error::msg)?;
    let second = match (aa, passthrough) {
        (true, _) => None,
        (false, p) => Some(!p),
    };
    if preheat_engine::os::online_cpus() >= 2 {
        preheat_engine::os::set_affinity(&[0])?;
    }
    let blocks = blocks.max(1);
    let per_block = (requests / blocks).max(1);
    let mut acc = Pairs::default();
    progress.start(pairs as u64, "pairs");
    for i in 0..pairs {
        let r = bench_pair(requests, blocks, second, i % 2)?;
        acc.add(per_block, &r.secs, r.lat);
        progress.inc(1);
    }
    progress.finish();
    let out = AgentBench {
        label: "measured",
        requests_per_pair: per_block * blocks,
        pairs,
        blocks,
        aa_control: aa,
        passthrough: passthrough && !aa,
        without: summarize(&acc.without),
        with: summarize(&acc.with),
        throughput_loss_per_pair: Spread::of(&acc.loss),
        throughput_loss_blockwise_per_pair: Spread::of(&acc.loss_blk),
        p50_delta_us_per_pair: Spread::of(&acc.dp50),
    };
    Ok(out)
}

impl AgentBench {
    /// The report as text (what `preheat bench` prints without `--json`).
    pub fn render(&self) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        let with_label = if self.aa_control {
            "without agent (A/A control)"
        } else if self.passthrough {
            "with agent, tracking off"
        } else {
            "with agent"
        };
        let _ = writeln!(s,
            "agent overhead on warm GETs to preheat-kv [measured: {} pairs; per pair a server without and one {} on the same CPU, {} requests each in {} alternating blocks (ABBA), closed loop, 1 connection each]",
            self.pairs, with_label, self.requests_per_pair, self.blocks
        );
        let _ = writeln!(
            s,
            "  without agent: p50 {:.2} µs (95% CI {:.2}–{:.2}), p99 {:.2} µs",
            self.without.p50, self.without.p50_lo, self.without.p50_hi, self.without.p99
        );
        let _ = writeln!(
            s,
            "  {with_label}: p50 {:.2} µs (95% CI {:.2}–{:.2}), p99 {:.2} µs",
            self.with.p50, self.with.p50_lo, self.with.p50_hi, self.with.p99
        );
        let _ = writeln!(
            s,
            "  throughput loss per pair (median of its {} block ratios) {} (goal <= 1%)",
            self.blocks,
            self.throughput_loss_blockwise_per_pair
                .show_scaled(100.0, 2, "%")
        );
        let _ = writeln!(s,
            "  throughput loss per pair, each server's requests over the time of its blocks (a host stall in one block moves it) {}",
            self.throughput_loss_per_pair.show_scaled(100.0, 2, "%")
        );
        let _ = writeln!(
            s,
            "  p50 delta per pair {} (goal <= 1 µs)",
            self.p50_delta_us_per_pair.show_scaled(1.0, 3, " µs")
        );
        s
    }
}
