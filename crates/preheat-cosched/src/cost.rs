//! Where the controller's time per slice goes: each stage of a switch, timed every slice, and
//! each kind of scheduling call, timed every call (all measured on this machine).
//!
//! A switch is: read every managed thread's readiness, plan the slice, demote what it does not
//! choose, read the run clocks, account the slice that ended, raise what it chooses. The
//! scheduling calls are `sched_setaffinity` (moving a thread that runs on another CPU waits for
//! the kernel's migration) and `sched_setscheduler`.

use std::time::Instant;

use preheat_model::stats::{summarize, Summary};
use serde::Serialize;

/// The stages of a switch, in order (the discriminant indexes [`STAGE_NAMES`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stage {
    Readiness,
    Plan,
    Demote,
    Clocks,
    Account,
    Raise,
}

const STAGE_NAMES: [&str; 6] = ["readiness", "plan", "demote", "clocks", "account", "raise"];

/// The kinds of scheduling call (the discriminant indexes [`CALL_NAMES`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Call {
    Affinity,
    Priority,
}

const CALL_NAMES: [&str; 2] = ["affinity", "priority"];

/// One stage's time per slice, µs (slices where it ran).
#[derive(Debug, Clone, Serialize)]
pub struct StageCost {
    pub stage: &'static str,
    pub p50_us: f64,
    pub p99_us: f64,
    pub slices: usize,
}

/// One kind of scheduling call: how many, and their time, µs.
#[derive(Debug, Clone, Serialize)]
pub struct CallCost {
    pub call: &'static str,
    pub count: usize,
    pub mean_us: f64,
    pub p50_us: f64,
    pub p99_us: f64,
}

/// The breakdown of a run's controller cost (measured).
#[derive(Debug, Clone, Default, Serialize)]
pub struct CostReport {
    pub stages: Vec<StageCost>,
    pub calls: Vec<CallCost>,
}

impl CostReport {
    /// Two lines for the run's table: the stages' p50 / p99 (`threads`: how many threads a
    /// readiness reading covers) and the calls' counts and times. Empty without stages.
    pub fn render(&self, threads: usize) -> String {
        if self.stages.is_empty() {
            return String::new();
        }
        let stages: Vec<String> = self
            .stages
            .iter()
            .map(|s| {
                let what = match s.stage {
                    "readiness" => format!("readiness ({threads} threads)"),
                    other => other.to_string(),
                };
                format!("{what} {:.1} / {:.1}", s.p50_us, s.p99_us)
            })
            .collect();
        let calls: Vec<String> = self
            .calls
            .iter()
            .map(|c| {
                format!(
                    "{} {} × mean {:.1} (p50 {:.1} / p99 {:.1})",
                    c.call, c.count, c.mean_us, c.p50_us, c.p99_us
                )
            })
            .collect();
        let calls = if calls.is_empty() {
            "none".to_string()
        } else {
            calls.join(", ")
        };
        format!(
            "  of which, per slice (p50 / p99 µs): {}\n  scheduling calls (µs): {calls}\n",
            stages.join(", ")
        )
    }
}

/// What a run's switches and calls took, µs each.
#[derive(Debug, Default)]
pub(crate) struct Costs {
    stages: [Vec<f64>; 6],
    calls: [Vec<f64>; 2],
}

/// Each named kind that was timed at least once: its name, its count and their summary.
fn timed<'a>(
    names: &'a [&'static str],
    samples: &'a [Vec<f64>],
) -> impl Iterator<Item = (&'static str, usize, Summary)> + 'a {
    names
        .iter()
        .zip(samples)
        .filter(|(_, v)| !v.is_empty())
        .map(|(name, v)| (*name, v.len(), summarize(v)))
}

fn us_since(t: Instant) -> f64 {
    t.elapsed().as_nanos() as f64 / 1e3
}

impl Costs {
    /// Record that `stage` took from `since` to now.
    pub(crate) fn stage(&mut self, stage: Stage, since: Instant) {
        self.stages[stage as usize].push(us_since(since));
    }

    /// Record one `call` that took from `since` to now.
    pub(crate) fn call(&mut self, call: Call, since: Instant) {
        self.calls[call as usize].push(us_since(since));
    }

    /// The readiness readings so far, µs (the report's `ready_us`).
    pub(crate) fn readiness(&self) -> &[f64] {
        &self.stages[Stage::Readiness as usize]
    }

    pub(crate) fn report(&self) -> CostReport {
        CostReport {
            stages: timed(&STAGE_NAMES, &self.stages)
                .map(|(stage, slices, s)| StageCost {
                    stage,
                    p50_us: s.p50,
                    p99_us: s.p99,
                    slices,
                })
                .collect(),
            calls: timed(&CALL_NAMES, &self.calls)
                .map(|(call, count, s)| CallCost {
                    call,
                    count,
                    mean_us: s.mean,
                    p50_us: s.p50,
                    p99_us: s.p99,
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stages_and_calls_are_reported_in_order_and_only_when_they_ran() {
        let mut c = Costs::default();
        let t = Instant::now();
        c.stage(Stage::Raise, t);
        c.stage(Stage::Readiness, t);
        c.stage(Stage::Readiness, t);
        c.call(Call::Priority, t);
        let r = c.report();
        let names: Vec<&str> = r.stages.iter().map(|s| s.stage).collect();
        assert_eq!(names, ["readiness", "raise"]);
        assert_eq!(r.stages[0].slices, 2);
        assert_eq!(c.readiness().len(), 2);
        assert_eq!(r.calls.len(), 1);
        assert_eq!((r.calls[0].call, r.calls[0].count), ("priority", 1));
        assert!(r.calls[0].mean_us >= 0.0);
        let text = r.render(3);
        assert!(
            text.contains("readiness (3 threads)") && text.contains("priority 1 ×"),
            "{text}"
        );
        assert_eq!(CostReport::default().render(3), "");
    }
}
