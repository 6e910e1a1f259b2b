//! A noise floor for matrices detected from outside a guest (beyond the paper).
//!
//! The paper's split rule is relative: a node splits when a child's dependency exceeds t times
//! the node's, or when nothing crosses the node at all. For two tasks (a VM of two vCPUs) the
//! children are leaves (d = 0), so only a count of exactly zero splits them. SPCD run on a
//! *guest* never counts zero: the guest kernel's own data (run queues, timers, page tables) is
//! written by every vCPU, so two vCPUs whose workloads share nothing still fault on common
//! pages. Measured here (`preheat guest comm`, release build, 2026-11-27): 200–660 events per
//! 4 s between the vCPUs of a guest whose two instances share nothing, 940–1,060 when they
//! share.
//!
//! The floor cannot make weak sharing visible: with the two pages the bundled kernels share by
//! design, a sharing guest reads only ~2× the floor, so the margin decides between splitting a
//! sharing guest and keeping a non-sharing one (see [`DEFAULT_MARGIN`]); with more shared pages
//! the gap grows to 7–50× (`preheat guest comm --shared-pages`).
//!
//! So the matrix is judged against an absolute floor first: the guest kernel's own rate,
//! *events per counted fault*, measured on a calibration guest whose vCPUs' workloads share
//! nothing (normalised by faults, not seconds, because how many faults a run takes depends on
//! the sampler's speed and budget, not on the workload), as a median over calibration boots. A pair's count is sharing only above
//! `margin` times the noise expected for that pair's faults; what lies below is taken off and
//! the rest goes to the grouping unchanged. The expected noise of a pair assumes a VM's counted
//! faults fall evenly on its vCPUs (a pair's share of `faults` is 2/n), which holds exactly for
//! the two-vCPU guests measured here and is a model beyond them.

use serde::Serialize;

/// How far above the floor a pair's events must be to count: 1.5 times the calibrated noise.
/// Measured (`preheat guest comm --kernel mg`, release build, 3 s windows, 3 boots each): a
/// guest whose instances share nothing read 0.09–0.13 events per vCPU fault (median 0.12), one
/// whose two threads share their two pages 0.20–0.29; a margin of 1.5 over the median separates
/// all six, 2 would have split one sharing boot. Single boots of the nothing-shared guest
/// occasionally read far higher (0.24 once), which is why the floor is a median over boots.
pub const DEFAULT_MARGIN: f64 = 1.5;

/// The guest kernel's own cross-vCPU events per counted fault, and the margin above it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct NoiseFloor {
    /// Events per counted fault between two vCPUs whose workloads share nothing (measured).
    pub events_per_fault: f64,
    /// Events count as sharing only above `margin` × the expected noise.
    pub margin: f64,
}

impl NoiseFloor {
    /// The floor from a calibration in which two tasks that share nothing had `events` between
    /// them over `faults` counted faults; `None` without faults (nothing was measured).
    pub fn calibrated(events: u64, faults: u64, margin: f64) -> Option<NoiseFloor> {
        (faults > 0 && margin.is_finite() && margin >= 0.0).then(|| NoiseFloor {
            events_per_fault: events as f64 / faults as f64,
            margin,
        })
    }

    /// The noise expected between two of `tasks` tasks whose counted faults sum to `faults`.
    pub fn expected(&self, faults: u64, tasks: usize) -> f64 {
        if tasks < 2 {
            return 0.0;
        }
        self.events_per_fault * faults as f64 * 2.0 / tasks as f64
    }

    /// `m` (symmetric, `tasks` rows) with `margin` × the expected noise taken off every pair, at
    /// least 0; the diagonal stays as it is.
    pub fn above(&self, m: &[Vec<u64>], faults: u64) -> Vec<Vec<u64>> {
        let cut = self.margin * self.expected(faults, m.len());
        m.iter()
            .enumerate()
            .map(|(i, row)| {
                row.iter()
                    .enumerate()
                    .map(|(j, &v)| {
                        if i == j {
                            v
                        } else {
                            // Rounded to whole events; a count at or below the cut becomes 0.
                            (v as f64 - cut).max(0.0).round() as u64
                        }
                    })
                    .collect()
            })
            .collect()
    }
}

/// Regroup periods in a row that must group a VM otherwise before its sets change.
pub const PERIODS_TO_CHANGE: u32 = 2;

/// A VM's matrix over time, judged period by period against a floor, with hysteresis.
///
/// Beyond the paper, which groups the matrix accumulated since the reset: on guests that
/// matrix merges vCPUs after any burst of events (measured: 8 of 12 partial-auto runs whose
/// vCPUs share nothing merged 4–10 s into the run, after their cumulative counts jumped). So
/// each period is judged on its own increase (events and faults since the last regroup) and a
/// VM's sets change only when [`PERIODS_TO_CHANGE`] periods in a row group it the same other way:
/// sharing that lasts merges one period later than it would have, a burst does not.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PeriodTracker {
    /// The cumulative matrix and faults at the last regroup.
    last: Option<(Vec<Vec<u64>>, u64)>,
    /// The sets in force, and a different grouping seen in the periods right before (with
    /// how many).
    sets: Option<Vec<Vec<usize>>>,
    pending: Option<(Vec<Vec<usize>>, u32)>,
}

impl PeriodTracker {
    /// This period's matrix to group: the increase of the cumulative `m` (and `faults`) since
    /// the last call with the floor taken off. The first call, or one after the tasks changed,
    /// judges the whole of `m`.
    pub fn period(&mut self, floor: &NoiseFloor, m: &[Vec<u64>], faults: u64) -> Vec<Vec<u64>> {
        let same_shape =
            |a: &[Vec<u64>]| a.len() == m.len() && a.iter().zip(m).all(|(x, y)| x.len() == y.len());
        let (delta, dfaults) = match &self.last {
            Some((prev, pf)) if same_shape(prev) => {
                let d = m
                    .iter()
                    .zip(prev)
                    .map(|(r, p)| r.iter().zip(p).map(|(v, w)| v.saturating_sub(*w)).collect())
                    .collect();
                (d, faults.saturating_sub(*pf))
            }
            _ => (m.to_vec(), faults),
        };
        self.last = Some((m.to_vec(), faults));
        floor.above(&delta, dfaults)
    }

    /// The sets to use after a period that grouped the VM as `now`: the first grouping at
    /// once; later a different one only once [`PERIODS_TO_CHANGE`] periods in a row gave it.
    pub fn settle(&mut self, now: Vec<Vec<usize>>) -> Vec<Vec<usize>> {
        let Some(current) = &self.sets else {
            self.sets = Some(now.clone());
            return now;
        };
        if *current == now {
            self.pending = None;
            return now;
        }
        let seen = match &self.pending {
            Some((g, n)) if *g == now => n + 1,
            _ => 1,
        };
        if seen >= PERIODS_TO_CHANGE {
            self.sets = Some(now.clone());
            self.pending = None;
            return now;
        }
        self.pending = Some((now, seen));
        current.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{group, CommMatrix, DEFAULT_T};

    fn pair(e: u64) -> Vec<Vec<u64>> {
        vec![vec![0, e], vec![e, 0]]
    }

    fn sets(m: &[Vec<u64>]) -> Vec<Vec<usize>> {
        group(&CommMatrix::from_counts(m).unwrap(), DEFAULT_T)
            .unwrap()
            .sets
    }

    #[test]
    fn calibration_needs_faults() {
        assert_eq!(NoiseFloor::calibrated(10, 0, 2.0), None);
        let f = NoiseFloor::calibrated(232, 2600, 2.0).unwrap();
        assert!((f.events_per_fault - 232.0 / 2600.0).abs() < 1e-12);
        assert_eq!(NoiseFloor::calibrated(1, 1, f64::NAN), None);
    }

    #[test]
    fn the_paper_rule_keeps_any_nonzero_pair_together() {
        // Why the floor exists: two tasks split only at exactly zero events.
        assert_eq!(sets(&pair(1)), vec![vec![0, 1]]);
        assert_eq!(sets(&pair(0)), vec![vec![0], vec![1]]);
    }

    #[test]
    fn noise_is_taken_off_and_sharing_stays() {
        // `preheat guest comm --kernel mg` (release, 3 s): the nothing-shared guest's median,
        // 225 events over 1,927 vCPU faults; its other boots and the sharing guest's.
        let f = NoiseFloor::calibrated(225, 1927, DEFAULT_MARGIN).unwrap();
        for (e, faults) in [(200, 1561), (145, 1594), (225, 1927)] {
            assert_eq!(f.above(&pair(e), faults), pair(0), "{e}/{faults}");
            assert_eq!(sets(&f.above(&pair(e), faults)), vec![vec![0], vec![1]]);
        }
        for (e, faults) in [(474, 1841), (429, 2161), (700, 2392)] {
            let kept = f.above(&pair(e), faults);
            assert!(kept[0][1] > 0, "{e}/{faults}");
            assert_eq!(sets(&kept), vec![vec![0, 1]]);
        }
        // What is left of a sharing pair is its excess over 1.5 × the expected noise.
        let cut: f64 = 1.5 * 225.0 / 1927.0 * 2392.0;
        assert_eq!(
            f.above(&pair(700), 2392),
            pair((700.0 - cut).round() as u64)
        );
    }

    #[test]
    fn the_floor_scales_with_faults_and_spreads_over_pairs() {
        let f = NoiseFloor::calibrated(1, 10, 1.0).unwrap();
        assert_eq!(f.expected(100, 2), 10.0);
        assert_eq!(f.expected(200, 2), 20.0);
        // Four tasks: a pair's share of the faults is half.
        assert_eq!(f.expected(200, 4), 10.0);
        assert_eq!(f.expected(200, 1), 0.0);
        let m = vec![vec![7, 25], vec![25, 7]];
        assert_eq!(f.above(&m, 200), vec![vec![7, 5], vec![5, 7]]);
    }

    #[test]
    fn periods_are_judged_on_their_increase() {
        let f = NoiseFloor::calibrated(1, 10, 1.0).unwrap();
        let mut t = PeriodTracker::default();
        // First period: the whole matrix, 100 faults: 10 events of noise.
        assert_eq!(t.period(&f, &pair(15), 100), pair(5));
        // Second: 40 more events over 100 more faults, not 55 over 200.
        assert_eq!(t.period(&f, &pair(55), 200), pair(30));
        // Another task appears: the whole matrix again.
        let m3 = vec![vec![0, 60, 0], vec![60, 0, 0], vec![0, 0, 0]];
        assert_eq!(t.period(&f, &m3, 300)[0][1], 40);
    }

    #[test]
    fn sets_change_after_periods_in_a_row_agree() {
        let split = vec![vec![0], vec![1]];
        let one = vec![vec![0, 1]];
        let mut t = PeriodTracker::default();
        assert_eq!(t.settle(split.clone()), split);
        // A burst: one period says merge, the next says split again: no change.
        assert_eq!(t.settle(one.clone()), split);
        assert_eq!(t.settle(split.clone()), split);
        // Lasting sharing: two periods in a row merge it.
        assert_eq!(t.settle(one.clone()), split);
        assert_eq!(t.settle(one.clone()), one);
        assert_eq!(t.settle(one.clone()), one);
        // And back, the same way.
        assert_eq!(t.settle(split.clone()), one);
        assert_eq!(t.settle(split.clone()), split);
    }
}
