//! Order statistics with distribution-free 95% confidence intervals (binomial distribution of
//! order statistics, normal approximation), computed by [`preheat_model::stats`]; this module adds
//! the label and unit its reports carry.

use serde::{Deserialize, Serialize};

use crate::Label;

/// Quantiles of a labeled sample.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub label: Label,
    pub unit: String,
    /// Sample count.
    pub n: usize,
    pub mean: f64,
    pub p50: f64,
    /// 95% confidence interval of the median, `[lo, hi]`.
    pub p50_ci: [f64; 2],
    pub p99: f64,
    pub p99_ci: [f64; 2],
    pub min: f64,
    pub max: f64,
}

/// Summarise `values` (non-finite values are dropped). An empty sample gives `n = 0` and zeros.
pub fn summarize(values: &[f64], unit: &str, label: Label) -> Summary {
    let q = preheat_model::stats::summarize(values);
    if q.n == 0 {
        return Summary {
            label,
            unit: unit.into(),
            n: 0,
            mean: 0.0,
            p50: 0.0,
            p50_ci: [0.0, 0.0],
            p99: 0.0,
            p99_ci: [0.0, 0.0],
            min: 0.0,
            max: 0.0,
        };
    }
    Summary {
        label,
        unit: unit.into(),
        n: q.n,
        mean: q.mean,
        p50: q.p50,
        p50_ci: [q.p50_lo, q.p50_hi],
        p99: q.p99,
        p99_ci: [q.p99_lo, q.p99_hi],
        min: q.min,
        max: q.max,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_ci_brackets_the_truth() {
        let v: Vec<f64> = (1..=101).map(|x| x as f64).collect();
        let s = summarize(&v, "us", Label::Measured);
        assert_eq!(s.n, 101);
        assert_eq!(s.p50, 51.0);
        assert!(s.p50_ci[0] < 51.0 && s.p50_ci[1] > 51.0);
        assert_eq!((s.min, s.max), (1.0, 101.0));
        assert!(s.p99 >= 100.0);
    }

    #[test]
    fn empty_and_single() {
        assert_eq!(summarize(&[], "us", Label::Measured).n, 0);
        let s = summarize(&[3.0], "us", Label::Measured);
        assert_eq!((s.p50, s.p99, s.p50_ci), (3.0, 3.0, [3.0, 3.0]));
    }
}
