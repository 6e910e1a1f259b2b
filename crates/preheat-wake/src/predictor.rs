//! Part of the calibration: whether this machine's CPUs keep their branch-prediction state
//! through a short idle ([`preheat_engine::predictor`] measures; this module keeps the result
//! with the calibration and says what it means).
//!
//! Where it is lost, a server with much code (a runtime's interpreter and JIT code, a
//! database) runs its first request after idle slowly although its lines may be cached, and
//! what restores it is executing that code — the `replay` strategy — not loading lines. The
//! demo prints that sentence only where this boot's calibration measured the loss.

use serde::{Deserialize, Serialize};

use preheat_engine::predictor::{self, Samples};
use preheat_model::stats::quantile_ci;

/// The idle (and spin) gap, µs: the scale of an announcement's lead.
pub const GAP_US: u64 = 200;

/// Samples per condition (each a few hundred µs).
pub const ROUNDS: usize = 41;

/// A slowdown after idle below this share of hot is not called a loss (however certain).
pub const MIN_SLOWDOWN: f64 = 0.2;

/// A p50 with its 95% confidence interval, µs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct P50 {
    pub p50_us: f64,
    pub ci_us: [f64; 2],
}

impl P50 {
    fn of(v: &[f64]) -> P50 {
        let mut s = v.to_vec();
        s.sort_by(f64::total_cmp);
        let (p50, lo, hi) = quantile_ci(&s, 0.5);
        P50 {
            p50_us: p50,
            ci_us: [lo, hi],
        }
    }
}

/// The measurement: branch-heavy code timed hot, after spinning and after idling `gap_us`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PredictorResult {
    /// Indirect call sites of the measured code.
    pub sites: usize,
    pub gap_us: u64,
    pub cpu: usize,
    /// Samples per condition.
    pub n: usize,
    pub hot: P50,
    pub after_spin: P50,
    pub after_sleep: P50,
}

impl PredictorResult {
    pub fn from_samples(s: &Samples, cpu: usize) -> PredictorResult {
        PredictorResult {
            sites: predictor::SITES,
            gap_us: s.gap_us,
            cpu,
            n: s.hot.len().min(s.after_spin.len()).min(s.after_sleep.len()),
            hot: P50::of(&s.hot),
            after_spin: P50::of(&s.after_spin),
            after_sleep: P50::of(&s.after_sleep),
        }
    }

    /// Whether an idle costs the state: after sleeping, the code ran slower than hot and than
    /// after spinning as long (each by its 95% interval), and by at least [`MIN_SLOWDOWN`].
    pub fn lost(&self) -> bool {
        let s = &self.after_sleep;
        s.ci_us[0] > self.hot.ci_us[1]
            && s.ci_us[0] > self.after_spin.ci_us[1]
            && s.p50_us >= self.hot.p50_us * (1.0 + MIN_SLOWDOWN)
    }

    /// One line with the numbers and the verdict (labelled measured, with sample counts).
    pub fn describe(&self) -> String {
        let verdict = if self.lost() {
            "lost when a CPU idles (so a server's code may run mispredicted after an idle \
             until it runs again: `replay` can restore that, loaded lines cannot)"
        } else {
            "not shown lost by an idle here"
        };
        format!(
            "branch prediction {verdict} [measured on CPU {}: {} indirect calls ran in {:.1} µs \
             (95% CI {:.1}–{:.1}) after a {} µs idle, {:.1} µs right after running, {:.1} µs \
             after spinning as long; p50s of n={} each]",
            self.cpu,
            self.sites,
            self.after_sleep.p50_us,
            self.after_sleep.ci_us[0],
            self.after_sleep.ci_us[1],
            self.gap_us,
            self.hot.p50_us,
            self.after_spin.p50_us,
            self.n,
        )
    }
}

/// Measure on `cpu`: the calling thread pinned there meanwhile, its affinity given back after.
pub fn measure_on(cpu: usize) -> Result<PredictorResult, String> {
    preheat_engine::os::on_cpu(cpu, || {
        PredictorResult::from_samples(&predictor::measure(GAP_US, ROUNDS), cpu)
    })
    .map_err(|e| format!("cannot run on CPU {cpu}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(p50: f64, lo: f64, hi: f64) -> P50 {
        P50 {
            p50_us: p50,
            ci_us: [lo, hi],
        }
    }

    fn result(hot: P50, spin: P50, sleep: P50) -> PredictorResult {
        PredictorResult {
            sites: 4096,
            gap_us: 200,
            cpu: 1,
            n: 41,
            hot,
            after_spin: spin,
            after_sleep: sleep,
        }
    }

    #[test]
    fn a_loss_must_show_against_hot_and_against_spinning() {
        // This machine kind (2026-11-29): 13.8 hot, 13.9 after a spin, 20.5 after an idle.
        let here = result(
            p(13.8, 13.7, 13.9),
            p(13.9, 13.8, 14.0),
            p(20.5, 20.4, 20.8),
        );
        assert!(here.lost());
        assert!(here.describe().starts_with("branch prediction lost"));
        assert!(here.describe().contains("n=41"), "{}", here.describe());
        // Slower after spinning as well: time passing, not the idle.
        let time = result(
            p(13.8, 13.7, 13.9),
            p(20.0, 19.0, 21.0),
            p(20.5, 20.4, 20.8),
        );
        assert!(!time.lost());
        // Certain but small.
        let small = result(
            p(13.8, 13.7, 13.9),
            p(13.9, 13.8, 14.0),
            p(15.0, 14.9, 15.1),
        );
        assert!(!small.lost());
        // Large but uncertain.
        let noisy = result(
            p(13.8, 13.0, 25.0),
            p(13.9, 13.0, 25.0),
            p(20.5, 14.0, 30.0),
        );
        assert!(!noisy.lost());
        assert!(noisy
            .describe()
            .starts_with("branch prediction not shown lost"));
    }

    #[test]
    fn from_samples_takes_medians() {
        let s = Samples {
            gap_us: 200,
            hot: vec![3.0, 1.0, 2.0],
            after_spin: vec![2.0, 2.0, 2.0],
            after_sleep: vec![9.0, 7.0, 8.0],
        };
        let r = PredictorResult::from_samples(&s, 1);
        assert_eq!((r.hot.p50_us, r.after_sleep.p50_us, r.n), (2.0, 8.0, 3));
    }

    #[test]
    fn measures_on_a_cpu() {
        let r = measure_on(0).expect("CPU 0 exists");
        assert_eq!((r.n, r.cpu, r.gap_us), (ROUNDS, 0, GAP_US));
        assert!(r.hot.p50_us > 0.0 && r.after_sleep.p50_us > 0.0, "{r:?}");
    }
}
