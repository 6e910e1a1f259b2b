//! History-based runtime prediction for repeated accelerator kernels (paper §2, "GPU Case
//! Study": iterative programs such as K-means launch similar kernels over and over, so the next
//! kernel's runtime can be predicted from the previous ones; the paper reports "about 87%
//! accuracy" for K-means and StreamCluster).
//!
//! Pure: no I/O, no clocks.
//!
//! The paper does not define its accuracy metric, so [`AccuracyReport`] gives both common
//! readings: the share of predictions within ±`tolerance` of the actual runtime (default ±10%),
//! and the mean absolute percentage error (MAPE) with `1 − MAPE` beside it.

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;

use serde::Serialize;

/// Which history statistic predicts the next runtime.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum HistoryKind {
    /// The previous runtime.
    Last,
    /// Exponentially weighted moving average with weight `alpha` on the newest sample.
    Ewma { alpha: f64 },
    /// Median of the last `k` runtimes (robust to single outliers such as a cold first launch).
    MedianOfLast { k: usize },
}

impl HistoryKind {
    pub fn name(&self) -> String {
        match self {
            HistoryKind::Last => "last".into(),
            HistoryKind::Ewma { alpha } => format!("ewma(alpha={alpha})"),
            HistoryKind::MedianOfLast { k } => format!("median(last {k})"),
        }
    }
}

#[derive(Clone, Debug, Default)]
struct KeyState {
    last: Option<f64>,
    ewma: Option<f64>,
    window: VecDeque<f64>,
}

/// Accuracy bookkeeping: every observation is scored against the prediction made before it.
#[derive(Clone, Debug)]
pub struct Accuracy {
    tolerance: f64,
    scored: u64,
    within: u64,
    sum_ape: f64,
    unpredicted: u64,
}

/// Prediction accuracy, as the paper reports it (see the module docs for the two readings).
#[derive(Clone, Copy, Debug, Serialize, PartialEq)]
pub struct AccuracyReport {
    /// Observations that had a prediction (and a positive actual runtime).
    pub scored: u64,
    /// Observations without a prediction yet (first launch of a kernel id).
    pub unpredicted: u64,
    /// The ± band, as a fraction (0.10 = ±10%).
    pub tolerance: f64,
    /// Share of scored predictions with |predicted − actual| ≤ tolerance · actual; in [0, 1].
    pub within_tolerance: Option<f64>,
    /// Mean absolute percentage error, as a fraction.
    pub mape: Option<f64>,
    /// max(0, 1 − MAPE), in [0, 1].
    pub one_minus_mape: Option<f64>,
}

impl Accuracy {
    pub fn new(tolerance: f64) -> Self {
        Self {
            tolerance: if tolerance.is_finite() {
                tolerance.abs()
            } else {
                0.1
            },
            scored: 0,
            within: 0,
            sum_ape: 0.0,
            unpredicted: 0,
        }
    }

    /// Score one prediction against the actual value.
    pub fn score(&mut self, predicted: Option<f64>, actual: f64) {
        let Some(p) = predicted.filter(|p| p.is_finite()) else {
            self.unpredicted += 1;
            return;
        };
        if !(actual.is_finite() && actual > 0.0) {
            return;
        }
        let ape = (p - actual).abs() / actual;
        self.scored += 1;
        self.sum_ape += ape;
        if ape <= self.tolerance {
            self.within += 1;
        }
    }

    pub fn report(&self) -> AccuracyReport {
        let n = self.scored as f64;
        let mape = (self.scored > 0).then(|| self.sum_ape / n);
        AccuracyReport {
            scored: self.scored,
            unpredicted: self.unpredicted,
            tolerance: self.tolerance,
            within_tolerance: (self.scored > 0).then(|| self.within as f64 / n),
            mape,
            one_minus_mape: mape.map(|m| (1.0 - m).clamp(0.0, 1.0)),
        }
    }
}

/// Runtime predictor keyed by kernel id.
#[derive(Clone, Debug)]
pub struct RuntimeHistory<K: Hash + Eq> {
    kind: HistoryKind,
    keys: HashMap<K, KeyState>,
    accuracy: Accuracy,
}

impl<K: Hash + Eq + Clone> RuntimeHistory<K> {
    pub fn new(kind: HistoryKind, tolerance: f64) -> Self {
        let kind = match kind {
            HistoryKind::Ewma { alpha } if !(alpha > 0.0 && alpha <= 1.0) => {
                HistoryKind::Ewma { alpha: 0.3 }
            }
            HistoryKind::MedianOfLast { k } => HistoryKind::MedianOfLast { k: k.max(1) },
            k => k,
        };
        Self {
            kind,
            keys: HashMap::new(),
            accuracy: Accuracy::new(tolerance),
        }
    }

    pub fn kind(&self) -> HistoryKind {
        self.kind
    }

    /// Predicted runtime of the next launch of `key` (same unit as observed), `None` before the
    /// first observation of that key.
    pub fn predict(&self, key: &K) -> Option<f64> {
        let s = self.keys.get(key)?;
        match self.kind {
            HistoryKind::Last => s.last,
            HistoryKind::Ewma { .. } => s.ewma,
            HistoryKind::MedianOfLast { .. } => median(s.window.iter().copied()),
        }
    }

    /// Record the actual runtime of a launch of `key`; scores the prediction that was current
    /// before it and returns that prediction.
    pub fn observe(&mut self, key: K, actual: f64) -> Option<f64> {
        let predicted = self.predict(&key);
        self.accuracy.score(predicted, actual);
        if !actual.is_finite() {
            return predicted;
        }
        let s = self.keys.entry(key).or_default();
        s.last = Some(actual);
        if let HistoryKind::Ewma { alpha } = self.kind {
            s.ewma = Some(match s.ewma {
                None => actual,
                Some(e) => e + alpha * (actual - e),
            });
        }
        if let HistoryKind::MedianOfLast { k } = self.kind {
            if s.window.len() == k {
                s.window.pop_front();
            }
            s.window.push_back(actual);
        }
        predicted
    }

    pub fn accuracy(&self) -> AccuracyReport {
        self.accuracy.report()
    }
}

/// The median of the window: the project's one median ([`preheat_model::stats::quantile_ci`]:
/// the lower middle of an even count, as every table and report takes it).
fn median(it: impl Iterator<Item = f64>) -> Option<f64> {
    preheat_model::stats::median(&it.collect::<Vec<f64>>())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn last_ewma_median() {
        let mut l = RuntimeHistory::new(HistoryKind::Last, 0.1);
        let mut e = RuntimeHistory::new(HistoryKind::Ewma { alpha: 0.5 }, 0.1);
        let mut m = RuntimeHistory::new(HistoryKind::MedianOfLast { k: 3 }, 0.1);
        for v in [100.0, 200.0, 120.0, 1000.0] {
            l.observe("k", v);
            e.observe("k", v);
            m.observe("k", v);
        }
        assert_eq!(l.predict(&"k"), Some(1000.0));
        // 100 → 150 → 135 → 567.5
        assert_eq!(e.predict(&"k"), Some(567.5));
        assert_eq!(m.predict(&"k"), Some(200.0));
        assert_eq!(m.predict(&"other"), None);
        // A window not full yet, of an even count: its lower middle (the project's median).
        let mut m = RuntimeHistory::new(HistoryKind::MedianOfLast { k: 3 }, 0.1);
        m.observe("k", 300.0);
        m.observe("k", 100.0);
        assert_eq!(m.predict(&"k"), Some(100.0));
    }

    #[test]
    fn keys_are_independent() {
        let mut h = RuntimeHistory::new(HistoryKind::Last, 0.1);
        h.observe(1u32, 10.0);
        h.observe(2u32, 20.0);
        assert_eq!(h.predict(&1), Some(10.0));
        assert_eq!(h.predict(&2), Some(20.0));
    }

    #[test]
    fn accuracy_counts() {
        let mut h = RuntimeHistory::new(HistoryKind::Last, 0.1);
        for v in [100.0, 105.0, 130.0, 130.0] {
            h.observe("k", v);
        }
        let a = h.accuracy();
        assert_eq!(a.unpredicted, 1);
        assert_eq!(a.scored, 3);
        // 100→105: 4.8% in; 105→130: 19% out; 130→130: 0% in.
        assert!((a.within_tolerance.unwrap() - 2.0 / 3.0).abs() < 1e-12);
        let mape = (5.0 / 105.0 + 25.0 / 130.0) / 3.0;
        assert!((a.mape.unwrap() - mape).abs() < 1e-12);
    }

    proptest! {
        #[test]
        fn accuracy_in_unit_interval(
            vals in prop::collection::vec(0.0f64..1e7, 0..100),
            kind in 0usize..3,
        ) {
            let kind = [HistoryKind::Last, HistoryKind::Ewma { alpha: 0.3 }, HistoryKind::MedianOfLast { k: 5 }][kind];
            let mut h = RuntimeHistory::new(kind, 0.1);
            for v in vals {
                h.observe(0u8, v);
            }
            let a = h.accuracy();
            for x in [a.within_tolerance, a.one_minus_mape].into_iter().flatten() {
                prop_assert!((0.0..=1.0).contains(&x));
            }
            prop_assert!(a.mape.iter().all(|&m| m >= 0.0));
        }

        #[test]
        fn constant_runtime_is_predicted_exactly(v in 1.0f64..1e7, n in 2usize..50) {
            for kind in [HistoryKind::Last, HistoryKind::Ewma { alpha: 0.3 }, HistoryKind::MedianOfLast { k: 5 }] {
                let mut h = RuntimeHistory::new(kind, 0.1);
                for _ in 0..n {
                    h.observe("k", v);
                }
                let a = h.accuracy();
                prop_assert_eq!(a.within_tolerance, Some(1.0));
                prop_assert!(a.mape.unwrap() < 1e-12);
            }
        }
    }
}
