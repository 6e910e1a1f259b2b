//! Order statistics with distribution-free 95% confidence intervals: the shared implementation in
//! [`preheat_model::stats`]; and the benchmarks' one way to report a ratio repeated over runs.

pub use preheat_model::stats::{summarize, Summary};
use serde::Serialize;

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
