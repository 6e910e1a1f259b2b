//! Expected backend response time for the early-release rule.
//!
//! The paper triggers a burst "when some staged requests are in danger of missing their latency
//! deadlines". A buffered request is in danger once releasing it later would leave less than the
//! backend's response time before its bound. That response time is learned online like TCP's
//! retransmission timer (Jacobson/Karels, RFC 6298): a smoothed mean (EWMA, gain 1/8) and a
//! smoothed mean deviation (gain 1/4) of measured response times, and the *guard* reserved
//! before the bound is `mean + 4 × deviation + margin`. Until the first sample the guard is an
//! initial estimate plus the margin.

use std::time::Duration;

#[derive(Debug, Clone)]
pub struct ServiceEstimator {
    srtt_us: f64,
    rttvar_us: f64,
    samples: u64,
    initial: Duration,
    margin: Duration,
}

impl ServiceEstimator {
    /// `initial`: assumed response time before any sample; `margin`: fixed extra guard (timer
    /// lateness of the proxy itself, scheduling noise).
    pub fn new(initial: Duration, margin: Duration) -> ServiceEstimator {
        ServiceEstimator {
            srtt_us: 0.0,
            rttvar_us: 0.0,
            samples: 0,
            initial,
            margin,
        }
    }

    /// One measured response time (release of the request to the backend → its full response).
    pub fn sample(&mut self, rt: Duration) {
        let r = rt.as_secs_f64() * 1e6;
        if self.samples == 0 {
            self.srtt_us = r;
            self.rttvar_us = r / 2.0;
        } else {
            self.rttvar_us += ((self.srtt_us - r).abs() - self.rttvar_us) / 4.0;
            self.srtt_us += (r - self.srtt_us) / 8.0;
        }
        self.samples += 1;
    }

    pub fn samples(&self) -> u64 {
        self.samples
    }

    /// Smoothed response time (µs), 0 before the first sample.
    pub fn mean_us(&self) -> f64 {
        self.srtt_us
    }

    /// Smoothed mean deviation (µs).
    pub fn deviation_us(&self) -> f64 {
        self.rttvar_us
    }

    /// Time to reserve before a request's bound: release it no later than `arrival + bound −
    /// guard`.
    pub fn guard(&self) -> Duration {
        let expected = if self.samples == 0 {
            self.initial
        } else {
            Duration::from_secs_f64((self.srtt_us + 4.0 * self.rttvar_us).max(0.0) / 1e6)
        };
        expected + self.margin
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guard_tracks_mean_and_spread() {
        let ms = Duration::from_millis;
        let mut e = ServiceEstimator::new(ms(5), ms(2));
        assert_eq!(e.guard(), ms(7));
        e.sample(ms(10));
        // mean 10, deviation 5 → 30 + 2.
        assert_eq!(e.guard(), ms(32));
        for _ in 0..200 {
            e.sample(ms(10));
        }
        let g = e.guard().as_secs_f64() * 1e3;
        assert!((12.0..12.1).contains(&g), "{g}");
        // A slow phase raises it quickly (the deviation reacts first).
        for _ in 0..5 {
            e.sample(ms(100));
        }
        assert!(e.guard() > ms(100), "{:?}", e.guard());
        assert_eq!(e.samples(), 206);
    }
}
