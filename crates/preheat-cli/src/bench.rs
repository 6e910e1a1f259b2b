//! `preheat bench`: speed targets as ratios against baselines measured in the same run.
//!
//! * `preheat` — preheat throughput (GB/s of lines made cache-resident) for a synthetic working set
//!   shaped like recorded ones (short runs scattered over a large heap), each trial after an
//!   eviction sweep, methods interleaved in shuffled order:
//!   - `plain-load`: a plain loop loading one byte of each line in sorted order (the baseline the
//!     issue names);
//!   - `limit`: the machine's scattered-line limit on the same lines: the best of raw prefetch
//!     and raw independent loads over a flat address array (no RLE decoding, no deadline checks);
//!   - `preheat-1`: `preheat_runs` on one core (RLE runs, deadline checks);
//!   - `preheat-2`: the runs split across two cores with `ParallelPreheater`, its worker awake
//!     (as when an announcement has woken both cores);
//!   - `preheat-2-cold`: the same, but the worker sleeps and is woken by the call (its CPU may
//!     have halted: on our VMs this wakeup alone costs 20–90 µs).
//!
//!   - `preheat-1-nodl`: `preheat-1` without a deadline (no clock checks): what the checks cost.
//!
//!   `preheat-1` and `preheat-2` run with a deadline that is checked but never reached, as the
//!   agent runs them. The whole set repeats `--reps` times (default 5); each ratio is computed
//!   per repetition and reported as the median with its range.
//!   Goals: preheat-1 ≥ 90% of limit; preheat-2 ≥ 1.6× preheat-1. The time of a
//!   `preheat_runs` call is the time to *issue* the prefetches; the last few are still in flight
//!   when it returns (a bounded error of about one memory latency).
//! * `comm` — communication detection's overhead and accuracy on the bundled kernels
//!   (`preheat_comm::bench`).
//! * `agent` — agent overhead on warm requests: per pair, two bundled servers on the same CPU,
//!   one without and one with the agent, both alive for the whole pair; closed-loop GETs
//!   alternate between them in blocks (ABBA order), so drift and the host's stalls fall on both
//!   alike. Throughput loss (each server's requests over the time of its blocks; and, robust to
//!   a stall hitting one block, the median over block pairs) and p50 delta per pair, reported
//!   as the median over pairs with its range (goal ≤ 1% and ≤ 1 µs). `--aa` runs both servers
//!   without the agent: the benchmark's noise floor. What the hooks cost per request cycle
//!   without the network around it: `crates/preheat-agent/examples/hook_cost.rs`.

use anyhow::{bail, Context, Result};
use preheat_model::{AbsRun, VirtAddr};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use preheat_launch::servers::{self, ServerKind};
use preheat_model::comm::CommConfig;
use preheat_model::stats::{summarize, Spread, Summary};

#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub which: Which,
    /// Print JSON.
    #[arg(long, global = true)]
    pub json: bool,
}

#[derive(clap::Subcommand, Debug)]
pub enum Which {
    /// Preheat throughput vs a plain load loop and the scattered-line limit; 2 cores vs 1.
    Preheat {
        /// Working-set size in KiB (the paper's memcached set: 142 KiB).
        #[arg(long, default_value_t = 192)]
        ws_kib: u64,
        /// Trials per method in each repetition.
        #[arg(long, default_value_t = 40)]
        trials: usize,
        /// Repetitions (each a full set of interleaved trials; the ratios are reported as the
        /// median over repetitions with their range; >= 5 for a headline).
        #[arg(long, default_value_t = 5)]
        reps: usize,
    },
    /// Communication detection: overhead and accuracy on the bundled NPB-style kernels.
    Comm {
        /// Kernels (comma-separated: mg, cg, is, ep).
        #[arg(long, default_value = "mg,cg,is,ep", value_delimiter = ',')]
        kernels: Vec<String>,
        /// Repetitions per kernel and condition (≥ 5 for a headline).
        #[arg(long, default_value_t = 5)]
        reps: usize,
        /// Kernel iterations per run (fixed work, so wall times compare).
        #[arg(long, default_value_t = 8000)]
        iterations: u64,
        #[arg(long, default_value_t = 4)]
        threads: usize,
        #[arg(long, default_value_t = 2)]
        instances: usize,
        /// Pages revoked per round (default: the detector's default).
        #[arg(long)]
        pages: Option<u32>,
        /// Round length in ms (default: the detector's default).
        #[arg(long)]
        period_ms: Option<u32>,
        /// How pages are revoked.
        #[arg(long, value_enum, default_value = "auto")]
        mechanism: crate::comm::MechanismArg,
    },
    /// The user-space coscheduler's overhead: useful work per second of one set under it
    /// against plain Linux (goal >= 0.97).
    Cosched {
        /// Bundled kernel (mg, cg, is, ep).
        #[arg(long, default_value = "mg")]
        kernel: String,
        /// Paired repetitions (>= 5 for a headline).
        #[arg(long, default_value_t = 5)]
        reps: usize,
        /// Seconds per run.
        #[arg(long, default_value_t = 3.0)]
        seconds: f64,
        /// Slice length, ms.
        #[arg(long, default_value_t = 10.0)]
        slice_ms: f64,
    },
    /// Simulator speed: simulated CPU-seconds per wall second (`preheat cosched simulate`).
    Cosim {
        /// Repetitions (≥ 5 for a headline).
        #[arg(long, default_value_t = 5)]
        reps: usize,
        /// Host CPUs (VMs of this and half this many vCPUs, quad).
        #[arg(long, default_value_t = 64)]
        cpus: usize,
    },
    /// Agent overhead on warm requests (bundled server).
    Agent {
        /// Requests per configuration in each pair.
        #[arg(long, default_value_t = 40000)]
        requests: usize,
        /// Pairs (each pair gives one throughput ratio, reported as the median over pairs with
        /// its range; >= 5 for a headline; the A/A control moves a median of 15 by about ±0.6%).
        #[arg(long, default_value_t = 15)]
        pairs: usize,
        /// Blocks per configuration in a pair (requests alternate between the two servers in
        /// blocks, ABBA order).
        #[arg(long, default_value_t = 20)]
        blocks: usize,
        /// A/A control: run the second server without the agent too (the benchmark's noise
        /// floor).
        #[arg(long)]
        aa: bool,
        /// Attach the agent to the second server but switch its tracking off (`SetEnabled`):
        /// what interposition and the agent's threads cost without the busy-period tracking.
        #[arg(long, conflicts_with = "aa")]
        passthrough: bool,
    },
}

pub fn run(a: BenchArgs) -> Result<()> {
    match a.which {
        Which::Preheat {
            ws_kib,
            trials,
            reps,
        } => bench_preheat(ws_kib, trials, reps, a.json),
        Which::Agent {
            requests,
            pairs,
            blocks,
            aa,
            passthrough,
        } => bench_agent(requests, pairs, blocks, aa, passthrough, a.json),
        Which::Cosim { reps, cpus } => crate::cosched::sim_bench::run(reps, cpus, a.json),
        Which::Cosched {
            kernel,
            reps,
            seconds,
            slice_ms,
        } => crate::cosched::bench::run(&kernel, reps, seconds, slice_ms, a.json),
        Which::Comm {
            kernels,
            reps,
            iterations,
            threads,
            instances,
            pages,
            period_ms,
            mechanism,
        } => {
            let d = CommConfig::default();
            let s = preheat_comm::bench::Settings {
                kernels,
                reps,
                iterations,
                threads,
                instances,
                cfg: CommConfig {
                    pages: pages.unwrap_or(d.pages),
                    period_ms: period_ms.unwrap_or(d.period_ms),
                    mechanism: mechanism.into(),
                    ..d
                },
            };
            print_comm(&s, a.json)
        }
    }
}

#[derive(Serialize)]
struct MethodResult {
    method: &'static str,
    /// Time per trial, µs (all repetitions pooled).
    time_us: Summary,
    gb_per_s_p50: f64,
    /// GB/s of each repetition (its trials' p50): median and range.
    gb_per_s: Spread,
}

#[derive(Serialize)]
struct PreheatBench {
    label: &'static str,
    lines: u64,
    runs: u64,
    trials: usize,
    reps: usize,
    methods: Vec<MethodResult>,
    /// Per repetition: preheat-1 GB/s over the limit's (the better of limit-prefetch and
    /// limit-load); median and range over repetitions.
    preheat1_over_limit: Spread,
    preheat1_over_plain: Spread,
    /// What deadline checks cost: preheat-1 (deadline set, as the agent runs it) over
    /// preheat-1-nodl (no deadline).
    deadline_cost: Spread,
    preheat2_over_preheat1: Option<Spread>,
}

/// Short runs (geometric, mean ~2.5 lines) scattered over `heap`: every line lies inside it.
fn synthetic_ws(heap: &[u8], lines_wanted: u64, seed: u64) -> Vec<AbsRun> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let base = (heap.as_ptr() as u64 + 63) & !63;
    let nlines_heap = (heap.len() as u64 - 64) / 64;
    let mut starts = std::collections::BTreeMap::new();
    let mut total = 0;
    while total < lines_wanted {
        let mut len = 1u32;
        while rng.gen_bool(0.6) && len < 32 {
            len += 1;
        }
        let start = rng.gen_range(0..nlines_heap - 64);
        if starts.insert(start, len).is_none() {
            total += len as u64;
        }
    }
    // Merge overlaps so lines are distinct.
    let mut runs: Vec<AbsRun> = Vec::new();
    for (s, l) in starts {
        if let Some(last) = runs.last_mut() {
            let last_end = (last.addr.0 - base) / 64 + last.lines as u64;
            if s <= last_end {
                let end = (s + l as u64).max(last_end);
                last.lines = (end - (last.addr.0 - base) / 64) as u32;
                continue;
            }
        }
        runs.push(AbsRun {
            addr: VirtAddr(base + s * 64),
            lines: l,
            exec: false,
        });
    }
    runs
}

/// What every repetition of `bench preheat` measures on.
struct PreheatSetup<'a> {
    methods: Vec<&'static str>,
    trials: usize,
    runs: &'a [AbsRun],
    addrs: &'a preheat_engine::preheat::AddrsIn<'a>,
    /// `runs` split in two for `preheat-2`.
    pieces: Vec<Vec<AbsRun>>,
    sweep: &'a preheat_engine::sweep::EvictionBuffer,
    parallel: Option<&'a preheat_engine::preheat::ParallelPreheater>,
}

/// Times one repetition's trials (µs per method), methods interleaved in shuffled order, each
/// after an eviction sweep.
fn preheat_trials(
    set: &PreheatSetup<'_>,
    rng: &mut impl Rng,
) -> std::collections::BTreeMap<&'static str, Vec<f64>> {
    let PreheatSetup {
        methods,
        trials,
        runs,
        addrs,
        pieces,
        sweep,
        parallel,
    } = set;
    let (trials, parallel) = (*trials, *parallel);
    let mut times: std::collections::BTreeMap<&'static str, Vec<f64>> = Default::default();
    let mut sink = 0u64;
    for _ in 0..trials {
        let mut order = methods.to_vec();
        order.shuffle(rng);
        for m in order {
            sweep.sweep();
            if let Some(p) = parallel {
                if m == "preheat-2" {
                    // Workers awake (as when the announcement woke both cores): an empty job
                    // wakes the worker, which then lingers polling for the measured one.
                    p.set_linger(2_000_000);
                    p.run(&[], &[&[]], None);
                } else {
                    p.set_linger(0);
                    std::thread::sleep(std::time::Duration::from_millis(2));
                }
            }
            // A deadline the walk checks but never reaches (as the agent runs it: the lead
            // is always far longer than a preheat here).
            let far = preheat_engine::time::now_ns() + 1_000_000_000;
            let t0 = preheat_engine::time::now_ns();
            match m {
                "plain-load" => sink ^= addrs.plain_load(),
                "limit-prefetch" => preheat_engine::preheat::prefetch_addrs(addrs.addrs()),
                "limit-load" => sink ^= addrs.independent_loads(),
                "preheat-1" => {
                    preheat_engine::preheat::preheat_runs(runs, Some(far));
                }
                "preheat-1-nodl" => {
                    preheat_engine::preheat::preheat_runs(runs, None);
                }
                "preheat-2" => {
                    if let Some(p) = parallel {
                        let (a, b) = (
                            &pieces[0],
                            pieces.get(1).map(|v| v.as_slice()).unwrap_or(&[]),
                        );
                        p.run(a, &[b], Some(far));
                    }
                }
                _ => unreachable!(),
            }
            let dt = preheat_engine::time::now_ns() - t0;
            times.entry(m).or_default().push(dt as f64 / 1e3);
        }
    }
    std::hint::black_box(sink);
    times
}

fn bench_preheat(ws_kib: u64, trials: usize, reps: usize, json: bool) -> Result<()> {
    let reps = reps.max(1);
    let ncpu = preheat_engine::os::online_cpus();
    let heap = vec![1u8; 256 << 20];
    let runs = synthetic_ws(&heap, ws_kib * 1024 / 64, 7);
    let addrs: Vec<VirtAddr> = runs
        .iter()
        .flat_map(|r| (0..r.lines as u64).map(move |i| r.addr.offset(i * 64)))
        .collect();
    let addrs = preheat_engine::preheat::AddrsIn::new(&heap, addrs)
        .map_err(|a| anyhow::anyhow!("synthetic line {:#x} outside its heap", a.0))?;
    let lines = addrs.addrs().len() as u64;
    let sweep = preheat_engine::sweep::EvictionBuffer::new(128 << 20);
    let parallel = if ncpu >= 2 {
        Some(
            preheat_engine::preheat::ParallelPreheater::new(&[1])
                .context("starting a preheat worker on CPU 1")?,
        )
    } else {
        None
    };
    preheat_engine::os::set_affinity(&[0])?;
    // Deadlines on the unordered TSC, as the agent checks them (its reference pair must age).
    if preheat_engine::time::enable_tsc_deadlines() {
        std::thread::sleep(std::time::Duration::from_millis(60));
    }
    let pieces = preheat_engine::preheat::split_runs(&runs, 2);
    let mut methods: Vec<&'static str> = vec![
        "plain-load",
        "limit-prefetch",
        "limit-load",
        "preheat-1",
        "preheat-1-nodl",
    ];
    if parallel.is_some() {
        methods.push("preheat-2");
    }
    let bytes = (lines * 64) as f64;
    let gbps = |us: &[f64]| bytes / (summarize(us).p50 * 1e3);
    let mut rng = rand::thread_rng();
    let pb = crate::progress::bar(reps as u64, "repetitions", json);
    let mut pooled: std::collections::BTreeMap<&str, Vec<f64>> = Default::default();
    let mut per_rep: std::collections::BTreeMap<&str, Vec<f64>> = Default::default();
    let set = PreheatSetup {
        methods,
        trials,
        runs: &runs,
        addrs: &addrs,
        pieces,
        sweep: &sweep,
        parallel: parallel.as_ref(),
    };
    for _ in 0..reps {
        let t = preheat_trials(&set, &mut rng);
        for (m, v) in t {
            per_rep.entry(m).or_default().push(gbps(&v));
            pooled.entry(m).or_default().extend(v);
        }
        pb.inc(1);
    }
    pb.finish_and_clear();
    let methods = set.methods;
    let res: Vec<MethodResult> = methods
        .iter()
        .map(|m| MethodResult {
            method: m,
            gb_per_s_p50: gbps(&pooled[m]),
            time_us: summarize(&pooled[m]),
            gb_per_s: Spread::of(&per_rep[m]),
        })
        .collect();
    let g = |m: &str| per_rep.get(m).cloned().unwrap_or_default();
    let ratio =
        |a: &[f64], b: &[f64]| -> Vec<f64> { a.iter().zip(b).map(|(x, y)| x / y).collect() };
    let limit: Vec<f64> = g("limit-prefetch")
        .iter()
        .zip(g("limit-load"))
        .map(|(a, b)| a.max(b))
        .collect();
    let p1 = g("preheat-1");
    let out = PreheatBench {
        label: "measured",
        lines,
        runs: runs.len() as u64,
        trials,
        reps,
        preheat1_over_limit: Spread::of(&ratio(&p1, &limit)),
        preheat1_over_plain: Spread::of(&ratio(&p1, &g("plain-load"))),
        deadline_cost: Spread::of(&ratio(&p1, &g("preheat-1-nodl"))),
        preheat2_over_preheat1: parallel
            .is_some()
            .then(|| Spread::of(&ratio(&g("preheat-2"), &p1))),
        methods: res,
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    println!(
        "preheat throughput [measured: {} lines ({:.0} KiB) in {} runs; {} repetitions x {} trials per method, interleaved, each after a 128 MiB sweep]",
        out.lines,
        (out.lines * 64) as f64 / 1024.0,
        out.runs,
        reps,
        trials
    );
    for r in &out.methods {
        println!(
            "  {:<15} p50 {:>8.1} µs (95% CI {:.1}–{:.1}, {} trials)  GB/s per repetition {}",
            r.method,
            r.time_us.p50,
            r.time_us.p50_lo,
            r.time_us.p50_hi,
            r.time_us.n,
            r.gb_per_s.show(2)
        );
    }
    println!(
        "  preheat-1 / limit = {} (goal >= 0.90)",
        out.preheat1_over_limit.show(2)
    );
    println!(
        "  preheat-1 / plain-load = {}",
        out.preheat1_over_plain.show(2)
    );
    println!(
        "  preheat-1 (deadline checked) / preheat-1-nodl = {}",
        out.deadline_cost.show(2)
    );
    println!(
        "  preheat-2 / preheat-1 = {} (goal >= 1.6)",
        out.preheat2_over_preheat1
            .as_ref()
            .map(|x| x.show(2))
            .unwrap_or_else(|| "n/a (1 CPU)".into())
    );
    println!("  (limit = the better of limit-prefetch and limit-load in each repetition; GB/s of a repetition = bytes / its trials' p50 time)");
    Ok(())
}

#[derive(Serialize)]
struct AgentBench {
    label: &'static str,
    /// Requests per configuration in each pair (split into `blocks` blocks).
    requests_per_pair: usize,
    pairs: usize,
    blocks: usize,
    /// A/A control: the "with" server ran without the agent too (the noise floor).
    aa_control: bool,
    /// The "with" server's agent was attached with tracking switched off (hooks pass through).
    passthrough: bool,
    /// Latencies pooled over all pairs.
    without: Summary,
    with: Summary,
    /// Per pair: 1 − with/without throughput (each configuration's requests over the time of
    /// its blocks); median and range over pairs.
    throughput_loss_per_pair: Spread,
    /// Per pair: 1 − the median over adjacent block pairs of with/without block throughput
    /// (robust to a stall of the host hitting one block).
    throughput_loss_blockwise_per_pair: Spread,
    /// Per pair: p50 with − p50 without, µs.
    p50_delta_us_per_pair: Spread,
}

/// One server of an agent-bench pair and its client connection.
struct BenchServer {
    _scratch: tempfile::TempDir,
    _started: servers::Started,
    conn: servers::Requester,
}

/// A bench server: without the agent (`None`), with it tracking (`Some(true)`), or with it
/// attached but tracking switched off (`Some(false)`: the hooks pass through).
fn bench_server(agent: Option<bool>) -> Result<BenchServer> {
    let ncpu = preheat_engine::os::online_cpus();
    let scratch = preheat_launch::launch::scratch_dir("bench")?;
    let started = servers::start(
        ServerKind::Kv,
        None,
        scratch.path(),
        vec![ncpu - 1],
        agent.is_some(),
    )?;
    if agent == Some(false) {
        let mut c = preheat_launch::agentctl::AgentClient::connect(
            &preheat_launch::paths::run_dir(),
            started.server.pid(),
        )?;
        c.call(&preheat_model::proto::Request::SetEnabled { enabled: false })?;
    }
    let mut conn = started.workload.connect(started.server.addr())?;
    for _ in 0..1000 {
        conn.request_ok()?;
    }
    Ok(BenchServer {
        _scratch: scratch,
        _started: started,
        conn,
    })
}

/// `n` closed-loop requests on `c`: latencies (µs) appended to `lat`; returns the block's time (s).
fn bench_block(c: &mut servers::Requester, n: usize, lat: &mut Vec<f64>) -> Result<f64> {
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

fn bench_agent(
    requests: usize,
    pairs: usize,
    blocks: usize,
    aa: bool,
    passthrough: bool,
    json: bool,
) -> Result<()> {
    let second = match (aa, passthrough) {
        (true, _) => None,
        (false, p) => Some(!p),
    };
    if preheat_engine::os::online_cpus() >= 2 {
        preheat_engine::os::set_affinity(&[0])?;
    }
    let blocks = blocks.max(1);
    let per_block = (requests / blocks).max(1);
    let (mut with, mut without) = (Vec::new(), Vec::new());
    let (mut loss, mut loss_blk, mut dp50) = (Vec::new(), Vec::new(), Vec::new());
    let pb = crate::progress::bar(pairs as u64, "pairs", json);
    for i in 0..pairs {
        let r = bench_pair(requests, blocks, second, i % 2)?;
        let tput = |k: usize| (per_block * r.secs[k].len()) as f64 / r.secs[k].iter().sum::<f64>();
        loss.push(1.0 - tput(1) / tput(0));
        let ratios: Vec<f64> = r.secs[0]
            .iter()
            .zip(&r.secs[1])
            .map(|(wo, w)| wo / w)
            .collect();
        loss_blk.push(1.0 - summarize(&ratios).p50);
        dp50.push(summarize(&r.lat[1]).p50 - summarize(&r.lat[0]).p50);
        let [l0, l1] = r.lat;
        without.extend(l0);
        with.extend(l1);
        pb.inc(1);
    }
    pb.finish_and_clear();
    let out = AgentBench {
        label: "measured",
        requests_per_pair: per_block * blocks,
        pairs,
        blocks,
        aa_control: aa,
        passthrough: passthrough && !aa,
        without: summarize(&without),
        with: summarize(&with),
        throughput_loss_per_pair: Spread::of(&loss),
        throughput_loss_blockwise_per_pair: Spread::of(&loss_blk),
        p50_delta_us_per_pair: Spread::of(&dp50),
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    let with_label = if aa {
        "without agent (A/A control)"
    } else if passthrough {
        "with agent, tracking off"
    } else {
        "with agent"
    };
    println!(
        "agent overhead on warm GETs to preheat-kv [measured: {} pairs; per pair a server without and one {} on the same CPU, {} requests each in {} alternating blocks (ABBA), closed loop, 1 connection each]",
        pairs, with_label, out.requests_per_pair, blocks
    );
    println!(
        "  without agent: p50 {:.2} µs (95% CI {:.2}–{:.2}), p99 {:.2} µs",
        out.without.p50, out.without.p50_lo, out.without.p50_hi, out.without.p99
    );
    println!(
        "  {with_label}: p50 {:.2} µs (95% CI {:.2}–{:.2}), p99 {:.2} µs",
        out.with.p50, out.with.p50_lo, out.with.p50_hi, out.with.p99
    );
    println!(
        "  throughput loss per pair (median of its {} block ratios) {} (goal <= 1%)",
        blocks,
        out.throughput_loss_blockwise_per_pair
            .show_scaled(100.0, 2, "%")
    );
    println!(
        "  throughput loss per pair, each server's requests over the time of its blocks (a host stall in one block moves it) {}",
        out.throughput_loss_per_pair.show_scaled(100.0, 2, "%")
    );
    println!(
        "  p50 delta per pair {} (goal <= 1 µs)",
        out.p50_delta_us_per_pair.show_scaled(1.0, 3, " µs")
    );
    Ok(())
}

/// Run the communication bench (a line on stderr per trial) and print its table (or JSON).
fn print_comm(s: &preheat_comm::bench::Settings, json: bool) -> Result<()> {
    let results = preheat_comm::bench::run(s, |t| {
        eprint!(
            "\rbench comm: trial {}/{} ({}, {})        ",
            t.n,
            t.total,
            t.kernel,
            if t.detection { "detection" } else { "plain" }
        );
    })?;
    eprintln!();
    if json {
        println!("{}", serde_json::to_string_pretty(&results)?);
        return Ok(());
    }
    println!(
        "communication detection on preheat-npb ({} threads, {} instances, {} iterations; \
         {} pages per {} ms, at most {} faults/s, mechanism {}) — measured, {} repetitions",
        s.threads,
        s.instances,
        s.iterations,
        s.cfg.pages_per_round(),
        s.cfg.period_ms,
        s.cfg.budget,
        s.cfg.mechanism.name(),
        s.reps
    );
    println!(
        "{:<7} {:>22} {:>16} {:>22} {:>14}",
        "kernel",
        "overhead (time ratio)",
        "groups = truth",
        "seconds to truth (p50)",
        "faults/s (p50)"
    );
    for r in &results {
        println!(
            "{:<7} {:>8.3} [{:.3}–{:.3}] {:>11}/{:<4} {:>22} {:>14.0}",
            r.kernel,
            r.overhead_median,
            r.overhead_min,
            r.overhead_max,
            r.correct_runs,
            r.reps,
            r.seconds_to_truth_median
                .map_or("never".to_string(), |x| format!("{x:.2}")),
            summarize(&r.faults_per_s).p50
        );
    }
    println!("goal: overhead ≤ 1.05 (median); the paper's daemon re-evaluated every 5 s");
    Ok(())
}
