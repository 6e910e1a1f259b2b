//! Order statistics with distribution-free 95% confidence intervals (same method as the CLI's:
//! binomial distribution of order statistics, normal approximation).

use serde::Serialize;

/// Quantiles of a sample (µs unless stated otherwise where used).
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
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

fn quantile_ci(sorted: &[f64], q: f64) -> (f64, f64, f64) {
    let n = sorted.len();
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

/// Summary of the finite values; all-zero with `n = 0` for an empty sample.
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
    fn median_and_ci() {
        let v: Vec<f64> = (1..=101).map(|x| x as f64).collect();
        let s = summarize(&v);
        assert_eq!(s.p50, 51.0);
        assert!(s.p50_lo < 51.0 && s.p50_hi > 51.0);
        assert!(s.p99 >= 100.0);
        assert_eq!(summarize(&[]).n, 0);
        assert_eq!(summarize(&[3.0]).p99, 3.0);
    }
}
