//! The report: what a mode measured, summed over its rounds (latency quantiles with their
//! order-statistic confidence intervals from [`preheat_model::stats`], the proxy's counters, CPU
//! use, residency).

use hdrhistogram::Histogram;
use preheat_model::stats::quantile_ranks;
use preheat_power::residency::{Residency, ResidencyDiff};
use serde::Serialize;

use super::client::{new_hist, LoadRun};
use super::Mode;
use crate::cpu_use::CpuUse;
use crate::framing::Framing;
use crate::proxy::StageCounters;

/// A quantile with its order-statistic 95% confidence interval (µs). A bound is `None` when the
/// sample is too small to bracket the quantile on that side.
#[derive(Debug, Clone, Serialize)]
pub struct Quantile {
    pub value_us: u64,
    pub ci95_lo_us: Option<u64>,
    pub ci95_hi_us: Option<u64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct LatencyReport {
    pub kind: &'static str,
    /// Completed requests measured (the sample count of every figure here).
    pub samples: u64,
    pub p50: Quantile,
    pub p99: Quantile,
    pub p999: Quantile,
    pub mean_us: f64,
    pub max_us: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct OverBound {
    pub kind: &'static str,
    /// Completed later than the bound after their intended send time, plus never answered.
    pub count: u64,
    /// Requests sent (the sample count).
    pub samples: u64,
    pub share: f64,
}

/// The proxy's view of a mode, summed over rounds.
#[derive(Debug, Clone, Serialize)]
pub struct StageSummary {
    pub kind: &'static str,
    pub bursts: u64,
    pub bursts_per_s: f64,
    pub bursts_early: u64,
    pub bursts_periodic: u64,
    pub bursts_final: u64,
    pub burst_max_requests: u64,
    pub requests_released: u64,
    pub held_mean_us: f64,
    pub held_max_us: u64,
    /// Learned backend response time at the end of the last round.
    pub service_ewma_us: f64,
    pub guard_us: f64,
    pub requests_failed: u64,
    pub backend_failures: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct ModeReport {
    pub mode: &'static str,
    pub rounds: u32,
    pub sent: u64,
    pub completed: u64,
    pub hits: u64,
    pub misses: u64,
    /// Error replies (`SERVER_ERROR`, `ERROR`, ...).
    pub errors: u64,
    /// Responses for another key than requested (must be 0).
    pub mismatched: u64,
    pub unanswered: u64,
    pub send_errors: u64,
    pub achieved_rate_per_s: f64,
    /// How late the client sent relative to the Poisson schedule (included in the latency).
    pub send_lag_mean_us: f64,
    pub send_lag_max_us: u64,
    pub latency: LatencyReport,
    pub over_bound: OverBound,
    pub stage: Option<StageSummary>,
    pub residency: Option<Residency>,
    pub residency_unavailable: Option<String>,
    /// CPU time of this benchmark (and the backend it started) vs other processes over the
    /// measured windows: residency is machine-wide, so a large `others_share` means other
    /// tenants shaped it.
    pub cpu_use: Option<CpuUse>,
    /// Wakeups of the backend process we started (voluntary context switches of all its
    /// threads), attributable to it alone; `None` for a backend we did not start.
    pub backend_wakeups: Option<u64>,
    pub backend_wakeups_per_s: Option<f64>,
    /// Each round's window on its own (spread between rounds = drift of the machine).
    pub per_round: Vec<RoundSummary>,
}

/// One measured window.
#[derive(Debug, Clone, Serialize)]
pub struct RoundSummary {
    pub round: u32,
    pub samples: u64,
    pub p999_us: u64,
    /// This round's window alone (the one residency shape, measured).
    pub residency: Option<Residency>,
    pub backend_wakeups_per_s: Option<f64>,
    pub quiet_gate_met: bool,
    pub own_cpu_share: Option<f64>,
    pub others_cpu_share: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    pub kind: &'static str,
    pub protocol: Framing,
    pub backend: String,
    pub placement: String,
    pub rate_per_s: f64,
    pub duration_s: f64,
    pub rounds: u32,
    pub connections: usize,
    pub period_ms: u64,
    pub bound_ms: u64,
    pub margin_ms: u64,
    pub modes: Vec<ModeReport>,
    pub notes: Vec<String>,
}

/// The `q` quantile of `h` with the order statistics bounding its 95% confidence interval
/// ([`quantile_ranks`]) read from the histogram.
fn quantile(h: &Histogram<u64>, q: f64) -> Quantile {
    let n = h.len();
    if n == 0 {
        return Quantile {
            value_us: 0,
            ci95_lo_us: None,
            ci95_hi_us: None,
        };
    }
    let ranks = quantile_ranks(n as usize, q);
    let at = |rank: usize| h.value_at_quantile(rank as f64 / n as f64);
    Quantile {
        value_us: h.value_at_quantile(q),
        ci95_lo_us: ranks.lo.map(at),
        ci95_hi_us: ranks.hi.map(at),
    }
}

fn latency_report(h: &Histogram<u64>) -> LatencyReport {
    LatencyReport {
        kind: "measured",
        samples: h.len(),
        p50: quantile(h, 0.5),
        p99: quantile(h, 0.99),
        p999: quantile(h, 0.999),
        mean_us: if h.is_empty() { 0.0 } else { h.mean() },
        max_us: h.max(),
    }
}

fn summarize_stage(runs: &[StageCounters], seconds: f64) -> StageSummary {
    let sum = |f: fn(&StageCounters) -> u64| runs.iter().map(f).sum::<u64>();
    let released = sum(|c| c.requests_released);
    let held_sum: f64 = runs
        .iter()
        .map(|c| c.held_mean_us * c.requests_released as f64)
        .sum();
    let last = runs.last();
    let bursts = sum(|c| c.bursts);
    StageSummary {
        kind: "measured",
        bursts,
        bursts_per_s: if seconds > 0.0 {
            bursts as f64 / seconds
        } else {
            0.0
        },
        bursts_early: sum(|c| c.bursts_early),
        bursts_periodic: sum(|c| c.bursts_periodic),
        bursts_final: sum(|c| c.bursts_final),
        burst_max_requests: runs.iter().map(|c| c.burst_max_requests).max().unwrap_or(0),
        requests_released: released,
        held_mean_us: if released > 0 {
            held_sum / released as f64
        } else {
            0.0
        },
        held_max_us: runs.iter().map(|c| c.held_max_us).max().unwrap_or(0),
        service_ewma_us: last.map_or(0.0, |c| c.service_ewma_us),
        guard_us: last.map_or(0.0, |c| c.guard_us),
        requests_failed: sum(|c| c.requests_failed),
        backend_failures: sum(|c| c.backend_failures),
    }
}

pub(super) struct ModeAcc {
    pub(super) runs: Vec<LoadRun>,
    pub(super) stage: Vec<StageCounters>,
    pub(super) stage_seconds: f64,
}

fn sum_cpu_use(parts: impl Iterator<Item = CpuUse>) -> Option<CpuUse> {
    let mut total: Option<(CpuUse, f64)> = None;
    for u in parts {
        // Capacity of the window, recovered from a share (0 when nothing ran).
        let cap = if u.own_share > 0.0 {
            u.own_cpu_s / u.own_share
        } else if u.others_share > 0.0 {
            u.others_cpu_s / u.others_share
        } else {
            0.0
        };
        total = Some(match total {
            None => (u, cap),
            Some((t, c)) => (
                CpuUse {
                    kind: "measured",
                    own_cpu_s: t.own_cpu_s + u.own_cpu_s,
                    machine_busy_cpu_s: t.machine_busy_cpu_s + u.machine_busy_cpu_s,
                    others_cpu_s: t.others_cpu_s + u.others_cpu_s,
                    own_share: 0.0,
                    others_share: 0.0,
                },
                c + cap,
            ),
        });
    }
    total.map(|(mut t, cap)| {
        if cap > 0.0 {
            t.own_share = t.own_cpu_s / cap;
            t.others_share = t.others_cpu_s / cap;
        }
        t
    })
}

pub(super) fn mode_report(mode: Mode, acc: &ModeAcc) -> ModeReport {
    let mut hist = new_hist();
    for r in &acc.runs {
        hist.add(&r.answers.hist).ok();
    }
    let sum = |f: fn(&LoadRun) -> u64| acc.runs.iter().map(f).sum::<u64>();
    let sent = sum(|r| r.sent);
    let window: f64 = acc.runs.iter().map(|r| r.send_window.as_secs_f64()).sum();
    let over = sum(|r| r.answers.late) + sum(|r| r.unanswered);
    let residency = summed_residency(&acc.runs);
    let backend_wk: Option<u64> = acc.runs.iter().map(|r| r.backend_wakeups).sum();
    let unavailable = acc
        .runs
        .iter()
        .find_map(|r| r.residency.as_ref().err().cloned());
    ModeReport {
        mode: mode.name(),
        rounds: acc.runs.len() as u32,
        sent,
        completed: sum(|r| r.answers.completed),
        hits: sum(|r| r.answers.hits),
        misses: sum(|r| r.answers.misses),
        errors: sum(|r| r.answers.errors),
        mismatched: sum(|r| r.answers.mismatched),
        unanswered: sum(|r| r.unanswered),
        send_errors: sum(|r| r.send_errors),
        achieved_rate_per_s: if window > 0.0 {
            sent as f64 / window
        } else {
            0.0
        },
        send_lag_mean_us: if sent > 0 {
            sum(|r| r.send_lag_sum_us) as f64 / sent as f64
        } else {
            0.0
        },
        send_lag_max_us: acc
            .runs
            .iter()
            .map(|r| r.send_lag_max_us)
            .max()
            .unwrap_or(0),
        latency: latency_report(&hist),
        over_bound: OverBound {
            kind: "measured",
            count: over,
            samples: sent,
            share: if sent > 0 {
                over as f64 / sent as f64
            } else {
                0.0
            },
        },
        stage: (mode == Mode::Staged).then(|| summarize_stage(&acc.stage, acc.stage_seconds)),
        residency: (residency.windows > 0).then(|| residency.report()),
        residency_unavailable: if residency.windows == 0 {
            unavailable
        } else {
            None
        },
        cpu_use: sum_cpu_use(acc.runs.iter().filter_map(|r| r.cpu_use)),
        backend_wakeups: backend_wk,
        backend_wakeups_per_s: backend_wk.map(|w| {
            let secs: f64 = acc
                .runs
                .iter()
                .filter_map(|r| r.residency.as_ref().ok().map(|x| x.wall_us as f64 / 1e6))
                .sum();
            let secs = if secs > 0.0 {
                secs
            } else {
                acc.runs.iter().map(|r| r.send_window.as_secs_f64()).sum()
            };
            w as f64 / secs.max(1e-9)
        }),
        per_round: acc
            .runs
            .iter()
            .enumerate()
            .map(|(i, r)| round_summary(i, r))
            .collect(),
    }
}

/// The rounds' windows summed into one (rounds whose CPUs or idle states differ from the first
/// are left out, with a note).
fn summed_residency(runs: &[LoadRun]) -> ResidencyDiff {
    let mut residency = ResidencyDiff::default();
    for (i, r) in runs.iter().enumerate() {
        if let Ok(d) = &r.residency {
            if let Err(e) = residency.accumulate(d) {
                residency
                    .notes
                    .push(format!("round {i} left out of the sum: {e}"));
            }
        }
    }
    residency
}

/// Round `i`'s own numbers.
fn round_summary(i: usize, r: &LoadRun) -> RoundSummary {
    let res = r.residency.as_ref().ok();
    RoundSummary {
        round: i as u32,
        samples: r.answers.hist.len(),
        p999_us: if r.answers.hist.is_empty() {
            0
        } else {
            r.answers.hist.value_at_quantile(0.999)
        },
        residency: res.map(|x| x.report()),
        backend_wakeups_per_s: r.backend_wakeups.map(|w| {
            w as f64
                / res
                    .map_or(r.send_window.as_secs_f64(), |x| x.wall_us as f64 / 1e6)
                    .max(1e-9)
        }),
        quiet_gate_met: r.gate_met,
        own_cpu_share: r.cpu_use.map(|u| u.own_share),
        others_cpu_share: r.cpu_use.map(|u| u.others_share),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantile_intervals_bracket() {
        let mut h = new_hist();
        for v in 1..=10_000u64 {
            h.record(v).unwrap();
        }
        let q = quantile(&h, 0.99);
        assert!((9890..=9910).contains(&q.value_us), "{q:?}");
        assert!(q.ci95_lo_us.unwrap() < q.value_us && q.value_us < q.ci95_hi_us.unwrap());
        // 100 samples cannot bracket p99.9 from above.
        let mut small = new_hist();
        for v in 1..=100u64 {
            small.record(v).unwrap();
        }
        assert_eq!(quantile(&small, 0.999).ci95_hi_us, None);
    }
}
