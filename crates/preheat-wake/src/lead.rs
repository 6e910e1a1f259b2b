//! The timer-wake lead, learned online.
//!
//! A thread that sleeps until `t` runs some time after `t` (on this machine 15–20 µs after a
//! short idle, ≥ 150 µs after 10 ms: the measured-here notes). To have a CPU awake *at* a
//! window's start, its worker sleeps until `start − lead` and the lead must cover that lag. We
//! learn it per CPU from every timed wake: `lateness = (time the mechanism was in effect) −
//! (planned arm time)`, tracked as an exponentially weighted mean and mean absolute deviation;
//! `lead = mean + 2·deviation` (about the 90th percentile for the roughly one-sided lag
//! distribution), clamped to [`LeadEstimator::MIN_NS`, `LeadEstimator::MAX_NS`]. Before any
//! sample the lead is [`LeadEstimator::INITIAL_NS`] (50 µs).

use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct LeadEstimator {
    mean_ns: f64,
    dev_ns: f64,
    samples: u64,
    outliers: u64,
    last_ns: u64,
}

impl Default for LeadEstimator {
    fn default() -> Self {
        Self::new()
    }
}

impl LeadEstimator {
    /// Lead before the first sample.
    pub const INITIAL_NS: u64 = 50_000;
    /// Never plan with less than this.
    pub const MIN_NS: u64 = 5_000;
    /// Nor more than this.
    pub const MAX_NS: u64 = 2_000_000;
    /// Samples above this are not timer lag (see [`LeadEstimator::observe`]).
    pub const OUTLIER_NS: u64 = 1_000_000;
    /// EWMA weight of a new sample.
    const ALPHA: f64 = 0.125;

    pub fn new() -> Self {
        LeadEstimator {
            mean_ns: 0.0,
            dev_ns: 0.0,
            samples: 0,
            outliers: 0,
            last_ns: 0,
        }
    }

    /// Record one observed lateness (ns after the planned arm time). A sample above
    /// [`LeadEstimator::OUTLIER_NS`] is ignored (returns false): the worker is `SCHED_IDLE`, so
    /// that much delay means real work held the CPU — which was then awake anyway — not timer
    /// lag.
    pub fn observe(&mut self, lateness_ns: u64) -> bool {
        self.last_ns = lateness_ns;
        if lateness_ns > Self::OUTLIER_NS {
            self.outliers += 1;
            return false;
        }
        let x = lateness_ns as f64;
        if self.samples == 0 {
            self.mean_ns = x;
            self.dev_ns = x / 2.0;
        } else {
            let d = (x - self.mean_ns).abs();
            self.mean_ns += Self::ALPHA * (x - self.mean_ns);
            self.dev_ns += Self::ALPHA * (d - self.dev_ns);
        }
        self.samples += 1;
        true
    }

    /// Samples ignored as outliers.
    pub fn outliers(&self) -> u64 {
        self.outliers
    }

    /// The lead to plan with now.
    pub fn lead_ns(&self) -> u64 {
        if self.samples == 0 {
            return Self::INITIAL_NS;
        }
        let l = self.mean_ns + 2.0 * self.dev_ns;
        (l.round() as u64).clamp(Self::MIN_NS, Self::MAX_NS)
    }

    pub fn samples(&self) -> u64 {
        self.samples
    }

    pub fn mean_lateness_ns(&self) -> u64 {
        self.mean_ns.round() as u64
    }

    pub fn last_lateness_ns(&self) -> u64 {
        self.last_ns
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_at_50us_and_converges_above_the_typical_lag() {
        let mut e = LeadEstimator::new();
        assert_eq!(e.lead_ns(), 50_000);
        // Lags around 20 µs with occasional 35 µs.
        for i in 0..200 {
            e.observe(if i % 10 == 0 { 35_000 } else { 20_000 });
        }
        let l = e.lead_ns();
        assert!(l > 21_500 && l < 40_000, "lead {l}");
        // Above ~90% of the samples.
        assert!(l >= 20_000);
    }

    #[test]
    fn clamps_outliers_and_floors() {
        let mut e = LeadEstimator::new();
        assert!(!e.observe(u64::MAX));
        assert_eq!((e.lead_ns(), e.samples(), e.outliers()), (50_000, 0, 1));
        assert!(e.observe(900_000));
        assert_eq!(e.lead_ns(), 1_800_000);
        let mut e = LeadEstimator::new();
        for _ in 0..100 {
            e.observe(0);
        }
        assert_eq!(e.lead_ns(), LeadEstimator::MIN_NS);
    }

    #[test]
    fn adapts_upwards_after_longer_idle() {
        let mut e = LeadEstimator::new();
        for _ in 0..50 {
            e.observe(20_000);
        }
        for _ in 0..50 {
            e.observe(150_000);
        }
        assert!(e.lead_ns() >= 140_000, "lead {}", e.lead_ns());
    }
}
