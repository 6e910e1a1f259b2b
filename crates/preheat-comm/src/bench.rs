//! What communication detection costs and how soon it finds the truth, on
//! the bundled NPB-style kernels (their true coscheduling sets are known by construction).
//!
//! * **Overhead** (goal ≤ 5%): a kernel's wall time for a fixed number of iterations with
//!   detection at the default budget, against the same kernel without the agent, paired by
//!   repetition, conditions interleaved in shuffled order; median ratio over the repetitions
//!   with its range.
//! * **Accuracy**: the share of detection runs whose groups (eq. 1, t = 1.5, over the kernel's
//!   threads, matrix reset after start-up as the paper does) equal the truth while the kernel
//!   runs, and the time after the reset from which they stay equal (the paper's daemon
//!   re-evaluated every 5 s).
//!
//! Everything is measured on this machine; `preheat bench comm` prints it.

use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use preheat_model::comm::{CommConfig, CommReport};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use serde::Serialize;

use crate::report::only_threads;
use crate::session::{follow, Follow, Followed};
use preheat_launch::paths;
use preheat_model::stats::summarize;

/// Settings of one benchmark run.
pub struct Settings {
    pub kernels: Vec<String>,
    pub reps: usize,
    pub iterations: u64,
    pub threads: usize,
    pub instances: usize,
    /// The detector's configuration for the detection runs.
    pub cfg: CommConfig,
}

/// Start-up delay of the kernels and the reset after it (the paper resets after start-up).
const START_DELAY_MS: u64 = 300;

/// One kernel's result (the JSON of `preheat bench comm --json`).
#[derive(Serialize)]
pub struct KernelResult {
    pub kernel: String,
    pub label: &'static str,
    pub reps: usize,
    /// Detection wall time / plain wall time, per repetition.
    pub overhead_ratios: Vec<f64>,
    pub overhead_median: f64,
    pub overhead_min: f64,
    pub overhead_max: f64,
    /// Runs whose groups equalled the truth at the last report taken while the kernel ran.
    pub correct_runs: usize,
    /// Seconds after the reset from which the groups stayed equal to the truth (correct runs).
    pub seconds_to_truth: Vec<f64>,
    pub seconds_to_truth_median: Option<f64>,
    /// Induced faults per second, per detection run.
    pub faults_per_s: Vec<f64>,
}

/// True coscheduling sets of the kernel's threads, from their names (`npb-K-iI-rR`): one set
/// per instance, except `ep` (no sharing: every thread alone).
fn truth_of(kernel: &str, names: &[String]) -> Vec<Vec<usize>> {
    if kernel == "ep" {
        return (0..names.len()).map(|i| vec![i]).collect();
    }
    let inst = |n: &str| {
        n.split('-')
            .find_map(|p| p.strip_prefix('i').and_then(|x| x.parse::<usize>().ok()))
    };
    let mut sets: std::collections::BTreeMap<Option<usize>, Vec<usize>> = Default::default();
    for (i, n) in names.iter().enumerate() {
        sets.entry(inst(n)).or_default().push(i);
    }
    let mut v: Vec<Vec<usize>> = sets.into_values().collect();
    v.sort();
    v
}

/// The coscheduling sets of the kernel threads in `r` (t = 1.5), with their names.
fn groups_of(r: &CommReport) -> Option<(Vec<String>, Vec<Vec<usize>>)> {
    let sub = only_threads(r, "npb-");
    if sub.threads.is_empty() {
        return None;
    }
    let m = preheat_group::CommMatrix::from_counts(&sub.matrix).ok()?;
    let g = preheat_group::group(&m, preheat_group::DEFAULT_T).ok()?;
    let mut sets = g.sets;
    sets.sort();
    Some((sub.threads.iter().map(|t| t.name.clone()).collect(), sets))
}

fn npb_argv(bin: &Path, kernel: &str, s: &Settings) -> Vec<String> {
    vec![
        bin.display().to_string(),
        kernel.to_string(),
        "--threads".into(),
        s.threads.to_string(),
        "--instances".into(),
        s.instances.to_string(),
        "--iterations".into(),
        s.iterations.to_string(),
        "--start-delay-ms".into(),
        START_DELAY_MS.to_string(),
        "--json".into(),
    ]
}

/// The kernel's JSON summary: the last line of its output that parses.
fn wall_of(stdout: &str) -> Result<f64> {
    stdout
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .and_then(|v| v["wall_s"].as_f64())
        .context("the kernel printed no JSON summary with wall_s")
}

fn plain_run(argv: &[String]) -> Result<f64> {
    let out = std::process::Command::new(&argv[0])
        .args(&argv[1..])
        .env_remove("LD_PRELOAD")
        .output()
        .with_context(|| format!("running {}", argv[0]))?;
    if !out.status.success() {
        bail!("{} failed: {}", argv.join(" "), out.status);
    }
    wall_of(&String::from_utf8_lossy(&out.stdout))
}

struct DetectOutcome {
    wall_s: f64,
    correct: bool,
    seconds_to_truth: Option<f64>,
    faults_per_s: f64,
}

fn detect_run(argv: &[String], kernel: &str, cfg: CommConfig) -> Result<DetectOutcome> {
    let dir = tempfile::Builder::new()
        .prefix("preheat-bench-comm-")
        .tempdir()?;
    let out = dir.path().join("stdout");
    let f = Follow {
        argv,
        cfg,
        reset_after_ms: START_DELAY_MS,
        duration: None,
        stdout: Some(out.clone()),
        poll: Duration::from_millis(250),
    };
    let mut since: Option<f64> = None;
    let mut correct = false;
    let mut faults_per_s = 0.0;
    let Followed { status, note, .. } = follow(&f, |p| {
        let Some(t) = p.since_reset else { return };
        let r = p.report;
        faults_per_s = r.faults_per_s();
        let ok = groups_of(r).is_some_and(|(names, sets)| sets == truth_of(kernel, &names));
        if ok && !correct {
            since = Some(t.as_secs_f64());
        }
        correct = ok;
    })?;
    if let Some(note) = note {
        eprintln!("{note}");
    }
    if !status.success() {
        bail!("{} under detection failed: {status}", argv.join(" "));
    }
    let text = std::fs::read_to_string(&out)?;
    Ok(DetectOutcome {
        wall_s: wall_of(&text)?,
        correct,
        seconds_to_truth: if correct { since } else { None },
        faults_per_s,
    })
}

/// Where the benchmark is: trial `n` of `total` (1-based), on `kernel`, with detection or plain.
pub struct Trial<'a> {
    pub n: usize,
    pub total: usize,
    pub kernel: &'a str,
    pub detection: bool,
}

/// Plain wall times and detection outcomes, [kernel][repetition].
type Measured = (Vec<Vec<f64>>, Vec<Vec<Option<DetectOutcome>>>);

/// Every (kernel, repetition) plain and under detection, in shuffled order.
fn trials(s: &Settings, mut on_trial: impl FnMut(Trial)) -> Result<Measured> {
    let bin = paths::npb_bin()?;
    let mut trials: Vec<(usize, usize, bool)> = Vec::new();
    for rep in 0..s.reps {
        for k in 0..s.kernels.len() {
            trials.push((rep, k, false));
            trials.push((rep, k, true));
        }
    }
    trials.shuffle(&mut rand::rngs::StdRng::seed_from_u64(11));
    let mut plain = vec![vec![f64::NAN; s.reps]; s.kernels.len()];
    let mut detect: Vec<Vec<Option<DetectOutcome>>> = (0..s.kernels.len())
        .map(|_| (0..s.reps).map(|_| None).collect())
        .collect();
    for (n, &(rep, k, with)) in trials.iter().enumerate() {
        let kernel = &s.kernels[k];
        on_trial(Trial {
            n: n + 1,
            total: trials.len(),
            kernel,
            detection: with,
        });
        let argv = npb_argv(&bin, kernel, s);
        if with {
            detect[k][rep] = Some(detect_run(&argv, kernel, s.cfg)?);
        } else {
            plain[k][rep] = plain_run(&argv)?;
        }
    }
    Ok((plain, detect))
}

/// Run the benchmark (`on_trial` is told before every trial) and return a result per kernel.
pub fn run(s: &Settings, on_trial: impl FnMut(Trial)) -> Result<Vec<KernelResult>> {
    if s.reps == 0 || s.kernels.is_empty() {
        bail!("need at least one kernel and one repetition");
    }
    let (plain, detect) = trials(s, on_trial)?;
    let mut results = Vec::new();
    for (k, kernel) in s.kernels.iter().enumerate() {
        let runs: Vec<&DetectOutcome> = detect[k].iter().flatten().collect();
        let ratios: Vec<f64> = runs
            .iter()
            .zip(&plain[k])
            .map(|(d, p)| d.wall_s / p)
            .collect();
        let overhead = summarize(&ratios);
        let secs: Vec<f64> = runs.iter().filter_map(|d| d.seconds_to_truth).collect();
        results.push(KernelResult {
            kernel: kernel.clone(),
            label: "measured",
            reps: s.reps,
            overhead_median: overhead.p50,
            overhead_min: overhead.min,
            overhead_max: overhead.max,
            overhead_ratios: ratios,
            correct_runs: runs.iter().filter(|d| d.correct).count(),
            seconds_to_truth_median: (!secs.is_empty()).then(|| summarize(&secs).p50),
            seconds_to_truth: secs,
            faults_per_s: runs.iter().map(|d| d.faults_per_s).collect(),
        });
    }
    Ok(results)
}

/// The results as a text table (what `preheat bench comm` prints without `--json`).
pub fn render(s: &Settings, results: &[KernelResult]) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(
        out,
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
    let _ = writeln!(
        out,
        "{:<7} {:>22} {:>16} {:>22} {:>14}",
        "kernel",
        "overhead (time ratio)",
        "groups = truth",
        "seconds to truth (p50)",
        "faults/s (p50)"
    );
    for r in results {
        let _ = writeln!(
            out,
            "{:<7} {:>8.3} [{:.3}–{:.3}] {:>11}/{:<4} {:>22} {:>14.0}",
            r.kernel,
            r.overhead_median,
            r.overhead_min,
            r.overhead_max,
            r.correct_runs,
            r.reps,
            r.seconds_to_truth_median
                .map_or("never".to_string(), |x| format!("{x:.2}")),
            preheat_model::stats::summarize(&r.faults_per_s).p50
        );
    }
    let _ = writeln!(
        out,
        "goal: overhead ≤ 1.05 (median); the paper's daemon re-evaluated every 5 s"
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truth_from_names() {
        let names: Vec<String> = [
            "npb-mg-i1-r0",
            "npb-mg-i0-r0",
            "npb-mg-i1-r1",
            "npb-mg-i0-r1",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert_eq!(truth_of("mg", &names), vec![vec![0, 2], vec![1, 3]]);
        assert_eq!(
            truth_of("ep", &names),
            vec![vec![0], vec![1], vec![2], vec![3]]
        );
    }
}
