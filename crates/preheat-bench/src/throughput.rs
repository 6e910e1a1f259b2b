//! Preheat throughput (GB/s of lines made cache-resident) for a synthetic working set shaped
//! like recorded ones (short runs scattered over a large heap), each trial after an eviction
//! sweep, methods interleaved in shuffled order:
//! - `plain-load`: a plain loop loading one byte of each line in sorted order (the baseline the
//!   issue names);
//! - `limit`: the machine's scattered-line limit on the same lines: the best of raw prefetch
//!   and raw independent loads over a flat address array (no RLE decoding, no deadline checks);
//! - `preheat-1`: `preheat_runs` on one core (RLE runs, deadline checks);
//! - `preheat-2`: the runs split across two cores with `ParallelPreheater`, its worker awake
//!   (as when an announcement has woken both cores);
//! - `preheat-1-nodl`: `preheat-1` without a deadline (no clock checks): what the checks cost.
//!
//! `preheat-1` and `preheat-2` run with a deadline that is checked but never reached, as the
//! agent runs them: [`DEADLINE_AHEAD_NS`] ahead, an announcement lead within the range the demo
//! and lab use (65 µs–1 ms) and about 5× the walk's time at the default size (the checks come
//! more often as a deadline nears, so how far it is matters). The whole set repeats (default
//! 5); each ratio is computed per repetition and reported as the median with its range. Goals: preheat-1 ≥ 90% of limit; preheat-2 ≥ 1.6×
//! preheat-1. The time of a `preheat_runs` call is the time to *issue* the prefetches; the last
//! few are still in flight when it returns (a bounded error of about one memory latency).

use std::collections::BTreeMap;

use anyhow::{Context, Result};
use preheat_engine::preheat::{AddrsIn, ParallelPreheater};
use preheat_engine::sweep::EvictionBuffer;
use preheat_launch::progress::Progress;
use preheat_model::stats::{summarize, Spread, Summary};
use preheat_model::{AbsRun, VirtAddr};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::Serialize;

/// One method's times and rates.
#[derive(Serialize)]
pub struct MethodResult {
    pub method: &'static str,
    /// Time per trial, µs (all repetitions pooled).
    pub time_us: Summary,
    pub gb_per_s_p50: f64,
    /// GB/s of each repetition (its trials' p50): median and range.
    pub gb_per_s: Spread,
}

/// The result of `bench preheat` (its JSON).
#[derive(Serialize)]
pub struct PreheatBench {
    pub label: &'static str,
    pub lines: u64,
    pub runs: u64,
    pub trials: usize,
    pub reps: usize,
    pub methods: Vec<MethodResult>,
    /// Per repetition: preheat-1 GB/s over the limit's (the better of limit-prefetch and
    /// limit-load); median and range over repetitions.
    pub preheat1_over_limit: Spread,
    pub preheat1_over_plain: Spread,
    /// What deadline checks cost: preheat-1 (deadline set, as the agent runs it) over
    /// preheat-1-nodl (no deadline).
    pub deadline_cost: Spread,
    pub preheat2_over_preheat1: Option<Spread>,
}

/// How far ahead of a trial its deadline is (ns).
pub const DEADLINE_AHEAD_NS: u64 = 500_000;

/// Short runs (geometric, mean ~2.5 lines) scattered over `heap`: every line lies inside it.
fn synthetic_ws(heap: &[u8], lines_wanted: u64, seed: u64) -> Vec<AbsRun> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let base = (heap.as_ptr() as u64 + 63) & !63;
    let nlines_heap = (heap.len() as u64 - 64) / 64;
    let mut starts = BTreeMap::new();
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
    addrs: &'a AddrsIn<'a>,
    /// `runs` split in two for `preheat-2`.
    pieces: Vec<Vec<AbsRun>>,
    sweep: &'a EvictionBuffer,
    parallel: Option<&'a ParallelPreheater>,
}

/// Times one repetition's trials (µs per method), methods interleaved in shuffled order, each
/// after an eviction sweep.
fn preheat_trials(set: &PreheatSetup<'_>, rng: &mut impl Rng) -> BTreeMap<&'static str, Vec<f64>> {
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
    let mut times: BTreeMap<&'static str, Vec<f64>> = Default::default();
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
            // A deadline the walk checks but never reaches (see the module docs).
            let far = preheat_engine::time::now_ns() + DEADLINE_AHEAD_NS;
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

/// Pins this thread to CPU 0, starts the worker on CPU 1 (with ≥ 2 CPUs) and turns TSC deadlines
/// on, as the agent runs.
fn prepare() -> Result<Option<ParallelPreheater>> {
    let parallel = if preheat_engine::os::online_cpus() >= 2 {
        Some(ParallelPreheater::new(&[1]).context("starting a preheat worker on CPU 1")?)
    } else {
        None
    };
    preheat_engine::os::set_affinity(&[0])?;
    // Deadlines on the unordered TSC, as the agent checks them (its reference pair must age).
    if preheat_engine::time::enable_tsc_deadlines() {
        std::thread::sleep(std::time::Duration::from_millis(60));
    }
    Ok(parallel)
}

/// Per method: GB/s of each repetition (its trials' p50) and the trials' times pooled.
type Times = BTreeMap<&'static str, Vec<f64>>;

/// Measure `reps` repetitions of `trials` trials per method on a working set of `ws_kib` KiB.
pub fn measure(
    ws_kib: u64,
    trials: usize,
    reps: usize,
    progress: &dyn Progress,
) -> Result<PreheatBench> {
    preheat_model::stats::require_repetitions(reps, "--reps", "repetition")
        .map_err(anyhow::Error::msg)?;
    let heap = vec![1u8; 256 << 20];
    let runs = synthetic_ws(&heap, ws_kib * 1024 / 64, 7);
    let addrs: Vec<VirtAddr> = runs
        .iter()
        .flat_map(|r| (0..r.lines as u64).map(move |i| r.addr.offset(i * 64)))
        .collect();
    let addrs = AddrsIn::new(&heap, addrs)
        .map_err(|a| anyhow::anyhow!("synthetic line {:#x} outside its heap", a.0))?;
    let lines = addrs.addrs().len() as u64;
    let sweep = EvictionBuffer::new(128 << 20);
    let parallel = prepare()?;
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
    progress.start(reps as u64, "repetitions");
    let (mut pooled, mut per_rep) = (Times::new(), Times::new());
    let set = PreheatSetup {
        methods,
        trials,
        runs: &runs,
        addrs: &addrs,
        pieces: preheat_engine::preheat::split_runs(&runs, 2),
        sweep: &sweep,
        parallel: parallel.as_ref(),
    };
    for _ in 0..reps {
        let t = preheat_trials(&set, &mut rng);
        for (m, v) in t {
            per_rep.entry(m).or_default().push(gbps(&v));
            pooled.entry(m).or_default().extend(v);
        }
        progress.inc(1);
    }
    progress.finish();
    let methods = set
        .methods
        .iter()
        .map(|m| MethodResult {
            method: m,
            gb_per_s_p50: gbps(&pooled[m]),
            time_us: summarize(&pooled[m]),
            gb_per_s: Spread::of(&per_rep[m]),
        })
        .collect();
    Ok(ratios(
        &per_rep,
        methods,
        lines,
        runs.len() as u64,
        trials,
        reps,
    ))
}

/// The result with its per-repetition ratios.
fn ratios(
    per_rep: &Times,
    methods: Vec<MethodResult>,
    lines: u64,
    runs: u64,
    trials: usize,
    reps: usize,
) -> PreheatBench {
    let g = |m: &str| per_rep.get(m).cloned().unwrap_or_default();
    let ratio =
        |a: &[f64], b: &[f64]| -> Vec<f64> { a.iter().zip(b).map(|(x, y)| x / y).collect() };
    let limit: Vec<f64> = g("limit-prefetch")
        .iter()
        .zip(g("limit-load"))
        .map(|(a, b)| a.max(b))
        .collect();
    let p1 = g("preheat-1");
    PreheatBench {
        label: "measured",
        lines,
        runs,
        trials,
        reps,
        preheat1_over_limit: Spread::of(&ratio(&p1, &limit)),
        preheat1_over_plain: Spread::of(&ratio(&p1, &g("plain-load"))),
        deadline_cost: Spread::of(&ratio(&p1, &g("preheat-1-nodl"))),
        preheat2_over_preheat1: per_rep
            .contains_key("preheat-2")
            .then(|| Spread::of(&ratio(&g("preheat-2"), &p1))),
        methods,
    }
}

impl PreheatBench {
    /// The report as text (what `preheat bench` prints without `--json`).
    pub fn render(&self) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        let _ = writeln!(s,
            "preheat throughput [measured: {} lines ({:.0} KiB) in {} runs; {} repetitions x {} trials per method, interleaved, each after a 128 MiB sweep; deadlines {} µs ahead]",
            self.lines,
            (self.lines * 64) as f64 / 1024.0,
            self.runs,
            self.reps,
            self.trials,
            DEADLINE_AHEAD_NS / 1000
        );
        for r in &self.methods {
            let _ =
                writeln!(s,
                "  {:<15} p50 {:>8.1} µs (95% CI {:.1}–{:.1}, {} trials)  GB/s per repetition {}",
                r.method,
                r.time_us.p50,
                r.time_us.p50_lo,
                r.time_us.p50_hi,
                r.time_us.n,
                r.gb_per_s.show(2)
            );
        }
        let _ = writeln!(
            s,
            "  preheat-1 / limit = {} (goal >= 0.90)",
            self.preheat1_over_limit.show(2)
        );
        let _ = writeln!(
            s,
            "  preheat-1 / plain-load = {}",
            self.preheat1_over_plain.show(2)
        );
        let _ = writeln!(
            s,
            "  preheat-1 (deadline checked) / preheat-1-nodl = {}",
            self.deadline_cost.show(2)
        );
        let _ = writeln!(
            s,
            "  preheat-2 / preheat-1 = {} (goal >= 1.6)",
            self.preheat2_over_preheat1
                .as_ref()
                .map(|x| x.show(2))
                .unwrap_or_else(|| "n/a (1 CPU)".into())
        );
        let _ = writeln!(s, "  (limit = the better of limit-prefetch and limit-load in each repetition; GB/s of a repetition = bytes / its trials' p50 time)");
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_synthetic_working_set_is_distinct_sorted_lines_inside_the_heap() {
        let heap = vec![0u8; 4 << 20];
        let runs = synthetic_ws(&heap, 2000, 7);
        let (lo, hi) = (
            heap.as_ptr() as u64,
            heap.as_ptr() as u64 + heap.len() as u64,
        );
        let lines: u64 = runs.iter().map(|r| r.lines as u64).sum();
        // Asked for 2000; overlapping runs merged count once, the last run may overshoot.
        assert!((1000..2032).contains(&lines), "{lines} lines");
        for w in runs.windows(2) {
            assert!(
                w[0].addr.0 + w[0].lines as u64 * 64 < w[1].addr.0,
                "overlap or touch"
            );
        }
        for r in &runs {
            assert_eq!(r.addr.0 % 64, 0);
            assert!(r.addr.0 >= lo && r.addr.0 + r.lines as u64 * 64 <= hi);
        }
    }
}
