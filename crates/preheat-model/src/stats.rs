//! Order statistics with distribution-free 95% confidence intervals, shared by every crate that
//! reports latencies (CLI tables, I/O and power benchmarks): one method, one implementation; and
//! [`Spread`], the benchmarks' one way to report a quantity repeated over runs.

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

/// The order statistics (1-based ranks into the ascending sample) that estimate the `q`
/// quantile of `n` values and bound its 95% confidence interval: the binomial distribution of
/// order statistics, normal approximation. A bound is `None` when the sample is too small to
/// bracket the quantile on that side (its rank falls outside `1..=n`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuantileRanks {
    pub center: usize,
    pub lo: Option<usize>,
    pub hi: Option<usize>,
}

/// The ranks of [`QuantileRanks`] for the `q` quantile of `n ≥ 1` values. Every quantile with a
/// confidence interval in the project comes from these ranks, read from a sorted sample
/// ([`quantile_ci`]) or from a histogram's value at `rank / n`.
pub fn quantile_ranks(n: usize, q: f64) -> QuantileRanks {
    let nf = n as f64;
    let half = 1.96 * (nf * q * (1.0 - q)).sqrt();
    let rank = |r: f64| (r >= 1.0 && r <= nf).then_some(r as usize);
    QuantileRanks {
        center: ((nf * q).ceil().max(1.0) as usize).min(n.max(1)),
        lo: rank((nf * q - half).floor()),
        hi: rank((nf * q + half).ceil() + 1.0),
    }
}

/// Whether `n` values bracket a 95% confidence interval of their median ([`quantile_ranks`]:
/// 8 or more). Below that, [`quantile_ci`]'s "interval" is the smallest and largest value, which
/// is no evidence: the one criterion for every verdict and claim drawn from a median's interval.
pub fn brackets_median(n: usize) -> bool {
    let r = quantile_ranks(n, 0.5);
    n > 0 && r.lo.is_some() && r.hi.is_some()
}

/// A benchmark's repetition count `n` given by `flag` (`what`: one repetition's name), refused at
/// 0: it would report a spread of nothing.
pub fn require_repetitions(n: usize, flag: &str, what: &str) -> Result<(), String> {
    if n == 0 {
        return Err(format!(
            "{flag} 0: a benchmark needs at least one {what} (>= 5 for a headline)"
        ));
    }
    Ok(())
}

/// The `q` quantile of an ascending sample and its 95% confidence interval `(value, lo, hi)`
/// ([`quantile_ranks`]; a bound the sample cannot bracket is its smallest or largest value).
/// NaN for an empty sample.
pub fn quantile_ci(sorted: &[f64], q: f64) -> (f64, f64, f64) {
    let n = sorted.len();
    if n == 0 {
        return (f64::NAN, f64::NAN, f64::NAN);
    }
    let r = quantile_ranks(n, q);
    (
        sorted[r.center - 1],
        sorted[r.lo.unwrap_or(1) - 1],
        sorted[r.hi.unwrap_or(n) - 1],
    )
}

/// The median of the finite values (the lower middle of an even count, as in [`summarize`]);
/// `None` when there is none. Every median in the project is this one.
pub fn median(values: &[f64]) -> Option<f64> {
    let s = summarize(values);
    (s.n > 0).then_some(s.p50)
}

/// P(X ≥ k) for X ~ Binomial(n, p): the chance that an event of probability `p` per trial
/// happens in at least `k` of `n` independent trials.
pub fn binomial_tail(n: u32, p: f64, k: u32) -> f64 {
    let p = p.clamp(0.0, 1.0);
    if k == 0 {
        return 1.0;
    }
    if k > n || p == 0.0 {
        return 0.0;
    }
    if p == 1.0 {
        return 1.0;
    }
    // 1 − Σ_{i<k} C(n,i) p^i (1−p)^(n−i), each term from the last by their ratio (exact enough
    // for the small n here).
    let mut term = (1.0 - p).powi(n as i32);
    let mut below = 0.0;
    for i in 0..k {
        below += term;
        term *= (n - i) as f64 / (i + 1) as f64 * p / (1.0 - p);
    }
    (1.0 - below).clamp(0.0, 1.0)
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

/// A quantity measured once per repetition, reported as its median with the range (the
/// benchmarks' headline form: never one lucky run).
#[derive(Debug, Clone, Serialize)]
pub struct Spread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    /// Repetitions with a finite value.
    pub n: usize,
    /// Every repetition's value, in the order measured.
    pub values: Vec<f64>,
}

impl Spread {
    pub fn of(values: &[f64]) -> Spread {
        let s = summarize(values);
        Spread {
            median: s.p50,
            min: s.min,
            max: s.max,
            n: s.n,
            values: values.to_vec(),
        }
    }

    /// "0.91 median [0.88–0.93], n = 5" with `prec` decimals.
    pub fn show(&self, prec: usize) -> String {
        self.show_scaled(1.0, prec, "")
    }

    /// Values times `scale` with a unit: `show_scaled(100.0, 1, "%")` gives
    /// "7.9% median [-0.6%–8.6%], n = 5".
    pub fn show_scaled(&self, scale: f64, prec: usize, unit: &str) -> String {
        if self.n == 0 {
            // No repetition gave a value: no number, not the zeros of an empty summary.
            return "n/a (nothing measured), n = 0".into();
        }
        format!(
            "{:.prec$}{unit} median [{:.prec$}{unit}–{:.prec$}{unit}], n = {}",
            self.median * scale,
            self.min * scale,
            self.max * scale,
            self.n
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eight_values_are_the_fewest_that_bracket_a_median_interval() {
        assert!(!brackets_median(0) && !brackets_median(1) && !brackets_median(7));
        assert!((8..200).all(brackets_median));
    }

    #[test]
    fn a_spread_of_nothing_shows_no_number() {
        let s = Spread::of(&[]);
        assert_eq!(s.show(2), "n/a (nothing measured), n = 0");
        assert_eq!(
            Spread::of(&[f64::NAN]).show_scaled(100.0, 1, "%"),
            s.show(2)
        );
        assert_eq!(Spread::of(&[0.5]).show(1), "0.5 median [0.5–0.5], n = 1");
    }

    #[test]
    fn binomial_tail_matches_hand_counts() {
        // 8 fair coins: P(≥ 7 heads) = (8 + 1) / 256.
        assert!((binomial_tail(8, 0.5, 7) - 9.0 / 256.0).abs() < 1e-12);
        // P(≥ 2 of 8) at 2%: 1 - 0.98^8 - 8·0.02·0.98^7.
        let want = 1.0 - 0.98f64.powi(8) - 8.0 * 0.02 * 0.98f64.powi(7);
        assert!((binomial_tail(8, 0.02, 2) - want).abs() < 1e-12);
        assert_eq!(binomial_tail(8, 0.3, 0), 1.0);
        assert_eq!(binomial_tail(8, 0.3, 9), 0.0);
        assert_eq!(binomial_tail(8, 0.0, 1), 0.0);
        assert!((binomial_tail(8, 1.0, 8) - 1.0).abs() < 1e-12);
    }

    #[test]
    fn median_is_the_lower_middle_of_the_finite_values() {
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[f64::NAN]), None);
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.0));
        assert_eq!(median(&[f64::NAN, 5.0, 1.0]), Some(1.0));
        assert_eq!(
            median(&[4.0, 1.0, 3.0, 2.0]),
            Some(summarize(&[1.0, 2.0, 3.0, 4.0]).p50)
        );
    }

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
    fn ranks_bracket_or_say_they_cannot() {
        let r = quantile_ranks(10_000, 0.99);
        assert_eq!(r.center, 9_900);
        let (lo, hi) = (r.lo.unwrap(), r.hi.unwrap());
        assert!(lo < 9_900 && 9_900 < hi && hi <= 10_000, "{r:?}");
        // 100 values cannot bracket p99.9 from above; one value brackets nothing.
        assert_eq!(quantile_ranks(100, 0.999).hi, None);
        assert_eq!(
            quantile_ranks(1, 0.5),
            QuantileRanks {
                center: 1,
                lo: None,
                hi: None
            }
        );
    }

    #[test]
    fn ci_matches_the_ranks() {
        let v: Vec<f64> = (1..=1000).map(|x| x as f64).collect();
        for q in [0.01, 0.5, 0.9, 0.99, 0.999] {
            let r = quantile_ranks(v.len(), q);
            let (c, lo, hi) = quantile_ci(&v, q);
            assert_eq!(c, r.center as f64);
            assert_eq!(lo, r.lo.unwrap_or(1) as f64);
            assert_eq!(hi, r.hi.unwrap_or(1000) as f64);
        }
    }

    #[test]
    fn empty_and_single() {
        assert_eq!(summarize(&[]).n, 0);
        let s = summarize(&[3.0]);
        assert_eq!((s.p50, s.p99, s.p50_lo, s.p50_hi), (3.0, 3.0, 3.0, 3.0));
    }

    #[test]
    fn spread_is_the_median_with_the_range() {
        let s = Spread::of(&[0.9, 0.7, 1.1, 0.8, 1.0]);
        assert_eq!((s.median, s.min, s.max, s.n), (0.9, 0.7, 1.1, 5));
        assert_eq!(s.show(2), "0.90 median [0.70–1.10], n = 5");
        assert_eq!(Spread::of(&[1.0, f64::NAN]).n, 1);
        assert_eq!(
            Spread::of(&[0.01, 0.02, 0.03]).show_scaled(100.0, 1, "%"),
            "2.0% median [1.0%–3.0%], n = 3"
        );
    }
}
