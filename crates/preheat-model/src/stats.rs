//! Order statistics with distribution-free 95% confidence intervals, shared by every crate that
//! reports latencies (CLI tables, I/O and power benchmarks): one method, one implementation.

use serde::{Deserialize, Serialize};

/// Quantiles of a sample, with 95% confidence intervals from the binomial distribution of order
/// statistics (normal approximation): no distributional assumption about latencies.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub n: usize,
    pub mean: f64,
    pub p50: f64,
    pub p50_lo: f64,
    pub p50_hi: f64,
    pub p99: f64,
    pub p99_lo: f64,
    pub p99_hi: f64,
    pub min: f64,
    pub max: f64,
}

/// The `q` quantile of an ascending sample and its 95% confidence interval `(value, lo, hi)`
/// (binomial distribution of order statistics, normal approximation). NaN for an empty sample.
pub fn quantile_ci(sorted: &[f64], q: f64) -> (f64, f64, f64) {
    let n = sorted.len();
    if n == 0 {
        return (f64::NAN, f64::NAN, f64::NAN);
    }
    let nf = n as f64;
    let at = |r: f64| sorted[(r.round().max(1.0) as usize).min(n) - 1];
    let center = at((nf * q).ceil());
    let half = 1.96 * (nf * q * (1.0 - q)).sqrt();
    (
        center,
        at((nf * q - half).floor()),
        at((nf * q + half).ceil() + 1.0),
    )
}

pub fn summarize(values: &[f64]) -> Summary {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        return Summary::default();
    }
    let (p50, p50_lo, p50_hi) = quantile_ci(&v, 0.5);
    let (p99, p99_lo, p99_hi) = quantile_ci(&v, 0.99);
    Summary {
        n: v.len(),
        mean: v.iter().sum::<f64>() / v.len() as f64,
        p50,
        p50_lo,
        p50_hi,
        p99,
        p99_lo,
        p99_hi,
        min: v[0],
        max: v[v.len() - 1],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_and_ci_bracket_the_truth() {
        let v: Vec<f64> = (1..=101).map(|x| x as f64).collect();
        let s = summarize(&v);
        assert_eq!(s.p50, 51.0);
        assert!(s.p50_lo < 51.0 && s.p50_hi > 51.0);
        assert!(s.p50_lo >= 40.0 && s.p50_hi <= 62.0);
        assert_eq!(s.min, 1.0);
        assert_eq!(s.max, 101.0);
        assert!(s.p99 >= 100.0);
    }

    #[test]
    fn empty_and_single() {
        assert_eq!(summarize(&[]).n, 0);
        let s = summarize(&[3.0]);
        assert_eq!((s.p50, s.p99, s.p50_lo, s.p50_hi), (3.0, 3.0, 3.0, 3.0));
    }
}
