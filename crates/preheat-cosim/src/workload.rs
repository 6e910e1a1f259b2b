//! The work of one thread between two barriers (a *phase*).
//!
//! NPB kernels alternate computation and barriers: every thread of an instance computes its
//! share of an iteration, then waits until all have arrived. The simulator draws the compute time
//! of each thread for each phase from a [`PhaseDist`]:
//!
//! * `Fixed`: every phase takes the same time (the idealised case the paper's expectations
//!   assume: no imbalance inside an instance).
//! * `LogNormal`: positive, right-skewed imbalance with a given mean and coefficient of variation
//!   (standard deviation / mean).
//! * `Empirical`: uniform draws from measured phase times (e.g. from the bundled NPB kernels).
//!
//! The paper does not model phases (it measures real NPB runs); this is our model.

use rand::rngs::StdRng;
use rand::Rng;
use serde::{Deserialize, Serialize};

/// Distribution of one thread's compute time between two barriers, in µs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum PhaseDist {
    Fixed { us: f64 },
    LogNormal { mean_us: f64, cv: f64 },
    Empirical { us: Vec<f64> },
}

/// A phase distribution that cannot be sampled.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PhaseError {
    #[error("phase time {0} µs: must be positive and finite")]
    BadTime(f64),
    #[error("phase coefficient of variation {0}: must be ≥ 0 and finite")]
    BadCv(f64),
    #[error("no measured phase times (the empirical distribution needs at least one)")]
    Empty,
}

impl PhaseDist {
    /// `Fixed` when `cv == 0`, else `LogNormal`.
    pub fn mean_cv(mean_us: f64, cv: f64) -> PhaseDist {
        if cv == 0.0 {
            PhaseDist::Fixed { us: mean_us }
        } else {
            PhaseDist::LogNormal { mean_us, cv }
        }
    }

    pub fn validate(&self) -> Result<(), PhaseError> {
        let time = |x: f64| {
            if x > 0.0 && x.is_finite() {
                Ok(())
            } else {
                Err(PhaseError::BadTime(x))
            }
        };
        match self {
            PhaseDist::Fixed { us } => time(*us),
            PhaseDist::LogNormal { mean_us, cv } => {
                time(*mean_us)?;
                if *cv >= 0.0 && cv.is_finite() {
                    Ok(())
                } else {
                    Err(PhaseError::BadCv(*cv))
                }
            }
            PhaseDist::Empirical { us } => {
                if us.is_empty() {
                    return Err(PhaseError::Empty);
                }
                us.iter().try_for_each(|&x| time(x))
            }
        }
    }

    /// The mean phase time, µs.
    pub fn mean_us(&self) -> f64 {
        match self {
            PhaseDist::Fixed { us } => *us,
            PhaseDist::LogNormal { mean_us, .. } => *mean_us,
            PhaseDist::Empirical { us } => us.iter().sum::<f64>() / us.len().max(1) as f64,
        }
    }

    /// One phase time, µs (positive). Call [`PhaseDist::validate`] first. (Draws in a loop
    /// go faster through [`PhaseDist::sampler`].)
    pub fn sample(&self, rng: &mut StdRng) -> f64 {
        self.sampler().sample(rng)
    }

    /// A sampler with the distribution's constants precomputed.
    pub fn sampler(&self) -> Sampler {
        match self {
            PhaseDist::Fixed { us } => Sampler::Fixed(*us),
            PhaseDist::LogNormal { mean_us, cv } => {
                // ln X ~ N(mu, s²) with s² = ln(1 + cv²), mu = ln(mean) − s²/2, so that
                // E[X] = mean and sd(X)/E[X] = cv.
                let s2 = (1.0 + cv * cv).ln();
                Sampler::LogNormal {
                    mu: mean_us.ln() - s2 / 2.0,
                    s: s2.sqrt(),
                    spare: None,
                }
            }
            PhaseDist::Empirical { us } => Sampler::Empirical(us.clone()),
        }
    }
}

/// Draws from a [`PhaseDist`] (see [`PhaseDist::sampler`]).
#[derive(Debug, Clone)]
pub enum Sampler {
    Fixed(f64),
    LogNormal { mu: f64, s: f64, spare: Option<f64> },
    Empirical(Vec<f64>),
}

impl Sampler {
    /// One phase time, µs.
    pub fn sample(&mut self, rng: &mut StdRng) -> f64 {
        match self {
            Sampler::Fixed(us) => *us,
            Sampler::LogNormal { mu, s, spare } => {
                // Standard normal draws by Box–Muller, two per pair of uniforms.
                let z = match spare.take() {
                    Some(z) => z,
                    None => {
                        let u1 = 1.0 - rng.gen::<f64>(); // (0, 1]
                        let u2 = rng.gen::<f64>();
                        let r = (-2.0 * u1.ln()).sqrt();
                        let (sin, cos) = (std::f64::consts::TAU * u2).sin_cos();
                        *spare = Some(r * sin);
                        r * cos
                    }
                };
                (*mu + *s * z).exp()
            }
            Sampler::Empirical(us) => us[rng.gen_range(0..us.len())],
        }
    }
}

impl Default for PhaseDist {
    /// 1 ms phases with 10% variation.
    fn default() -> Self {
        PhaseDist::LogNormal {
            mean_us: 1000.0,
            cv: 0.1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn validation() {
        assert!(PhaseDist::Fixed { us: 0.0 }.validate().is_err());
        assert!(PhaseDist::Fixed { us: f64::NAN }.validate().is_err());
        assert!(PhaseDist::LogNormal {
            mean_us: 10.0,
            cv: -1.0
        }
        .validate()
        .is_err());
        assert_eq!(
            PhaseDist::Empirical { us: vec![] }.validate(),
            Err(PhaseError::Empty)
        );
        assert!(PhaseDist::Empirical {
            us: vec![1.0, f64::INFINITY]
        }
        .validate()
        .is_err());
        assert!(PhaseDist::default().validate().is_ok());
        assert_eq!(PhaseDist::mean_cv(5.0, 0.0), PhaseDist::Fixed { us: 5.0 });
    }

    #[test]
    fn lognormal_moments() {
        let d = PhaseDist::LogNormal {
            mean_us: 1000.0,
            cv: 0.3,
        };
        let mut rng = StdRng::seed_from_u64(7);
        let mut sm = d.sampler();
        let xs: Vec<f64> = (0..200_000).map(|_| sm.sample(&mut rng)).collect();
        let mean = xs.iter().sum::<f64>() / xs.len() as f64;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / xs.len() as f64;
        assert!((mean / 1000.0 - 1.0).abs() < 0.01, "{mean}");
        assert!(
            (var.sqrt() / mean - 0.3).abs() < 0.01,
            "{}",
            var.sqrt() / mean
        );
        assert!(xs.iter().all(|&x| x > 0.0));
    }

    #[test]
    fn empirical_draws_from_the_list() {
        let d = PhaseDist::Empirical {
            us: vec![1.0, 2.0, 3.0],
        };
        let mut rng = StdRng::seed_from_u64(1);
        let mut seen = [false; 3];
        for _ in 0..100 {
            seen[d.sample(&mut rng) as usize - 1] = true;
        }
        assert_eq!(seen, [true; 3]);
        assert_eq!(d.mean_us(), 2.0);
        let json = serde_json::to_string(&d).unwrap();
        assert_eq!(json, r#"{"kind":"empirical","us":[1.0,2.0,3.0]}"#);
    }
}
