//! Generated noisy block matrices with a planted answer, to measure how often a grouping method
//! recovers known groups ([`crate::compare`]). Everything here is **simulated**: no program ran.
//!
//! A matrix of n tasks (n drawn from [`Spec::tasks`]) holds k planted groups (k drawn from
//! [`Spec::groups`], at most n / [`Spec::min_size`]), each of at least `min_size` tasks; the
//! remaining tasks go to groups drawn uniformly, then the task numbers are shuffled. A pair's
//! mean count is [`Spec::within`] inside a group and `within · background` across groups; the
//! count is that mean times exp(σ·Z − σ²/2) with Z standard normal (multiplicative, log-normal
//! noise whose mean is the block's), rounded to a whole number of events. σ is the noise
//! level; σ = 0 gives the exact block matrix.
//!
//! Deterministic: everything is drawn from `StdRng::seed_from_u64(seed)`, and the structure and
//! every Z depend on the seed only, so the matrices of one seed at different noise levels are
//! the same planted groups under more or less of the same noise (paired comparisons).

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::matrix::CommMatrix;

/// What to generate (see the module docs). [`Spec::default`] is what `preheat groups compare`
/// uses.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Spec {
    /// Fewest and most tasks (inclusive).
    pub tasks: (usize, usize),
    /// Fewest and most planted groups (inclusive).
    pub groups: (usize, usize),
    /// Fewest tasks in a group.
    pub min_size: usize,
    /// Mean count of a pair inside a group.
    pub within: f64,
    /// Mean count of a pair across groups, as a fraction of `within`.
    pub background: f64,
}

impl Default for Spec {
    fn default() -> Self {
        Spec {
            tasks: (8, 16),
            groups: (2, 4),
            min_size: 2,
            within: 100.0,
            background: 0.1,
        }
    }
}

/// One generated matrix and its planted groups.
#[derive(Debug, Clone, PartialEq)]
pub struct Planted {
    /// The noisy matrix.
    pub matrix: CommMatrix,
    /// The planted groups, as [`crate::Grouping::sets`] orders sets: each ascending, ordered by
    /// smallest task.
    pub sets: Vec<Vec<usize>>,
}

impl Spec {
    /// Why this spec cannot generate matrices, if it cannot.
    pub fn check(&self) -> Result<(), String> {
        let ((n0, n1), (k0, k1)) = (self.tasks, self.groups);
        if n0 == 0 || n0 > n1 || n1 > crate::MAX_TASKS {
            return Err(format!(
                "tasks {n0}..={n1}: need 1 <= fewest <= most <= {}",
                crate::MAX_TASKS
            ));
        }
        if k0 == 0 || k0 > k1 || self.min_size == 0 || k0 * self.min_size > n0 {
            return Err(format!(
                "groups {k0}..={k1} of at least {} tasks do not fit {n0} tasks",
                self.min_size
            ));
        }
        let finite = self.within.is_finite() && self.background.is_finite();
        if !finite || self.within < 0.0 || self.background < 0.0 {
            return Err("within and background must be finite and >= 0".into());
        }
        Ok(())
    }

    /// The matrix of `seed` at noise level `noise` (σ ≥ 0; see the module docs).
    ///
    /// # Panics
    /// If [`check`](Self::check) fails or `noise` is negative or not finite.
    pub fn generate(&self, seed: u64, noise: f64) -> Planted {
        if let Err(e) = self.check() {
            panic!("planted::Spec: {e}");
        }
        assert!(noise.is_finite() && noise >= 0.0, "noise must be >= 0");
        let mut rng = StdRng::seed_from_u64(seed);
        let n = rng.gen_range(self.tasks.0..=self.tasks.1);
        let k_max = self.groups.1.min(n / self.min_size);
        let k = rng.gen_range(self.groups.0..=k_max);
        let mut group_of: Vec<usize> = (0..k)
            .flat_map(|g| std::iter::repeat_n(g, self.min_size))
            .collect();
        while group_of.len() < n {
            group_of.push(rng.gen_range(0..k));
        }
        group_of.shuffle(&mut rng);
        let across = self.within * self.background;
        let mut rows = vec![vec![0.0; n]; n];
        for x in 0..n {
            for y in x + 1..n {
                let mean = if group_of[x] == group_of[y] {
                    self.within
                } else {
                    across
                };
                let z = standard_normal(&mut rng);
                let v = (mean * (noise * z - noise * noise / 2.0).exp()).round();
                rows[x][y] = v;
                rows[y][x] = v;
            }
        }
        let mut sets: Vec<Vec<usize>> = (0..k)
            .map(|g| (0..n).filter(|&x| group_of[x] == g).collect())
            .collect();
        sets.sort_by_key(|s| s[0]);
        Planted {
            matrix: CommMatrix::new(rows).expect("generated entries are finite and symmetric"),
            sets,
        }
    }
}

/// A standard normal draw (Box–Muller, the cosine half).
fn standard_normal(rng: &mut StdRng) -> f64 {
    let u: f64 = 1.0 - rng.gen::<f64>(); // (0, 1]: ln(u) is finite
    let v: f64 = rng.gen();
    (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn noise_free_is_the_exact_block_matrix() {
        let spec = Spec::default();
        for seed in 0..50 {
            let p = spec.generate(seed, 0.0);
            let n = p.matrix.len();
            assert!((8..=16).contains(&n));
            assert!((2..=4).contains(&p.sets.len()));
            let mut all: Vec<usize> = p.sets.iter().flatten().copied().collect();
            all.sort_unstable();
            assert_eq!(all, (0..n).collect::<Vec<_>>());
            let mut group = vec![0; n];
            for (g, s) in p.sets.iter().enumerate() {
                assert!(s.len() >= 2);
                for &x in s {
                    group[x] = g;
                }
            }
            for x in 0..n {
                for y in 0..n {
                    let want = match (x == y, group[x] == group[y]) {
                        (true, _) => 0.0,
                        (false, true) => 100.0,
                        (false, false) => 10.0,
                    };
                    assert_eq!(p.matrix.get(x, y), want);
                }
            }
        }
    }

    #[test]
    fn a_seed_is_the_same_groups_at_every_noise_level() {
        let spec = Spec::default();
        let (a, b) = (spec.generate(7, 0.0), spec.generate(7, 0.5));
        assert_eq!(a.sets, b.sets);
        assert_ne!(a.matrix, b.matrix);
        assert_eq!(b, spec.generate(7, 0.5), "deterministic");
    }

    #[test]
    fn impossible_specs_are_refused() {
        let tight = Spec {
            tasks: (3, 3),
            groups: (2, 2),
            ..Spec::default()
        };
        assert!(tight.check().is_err());
        let negative = Spec {
            background: -1.0,
            ..Spec::default()
        };
        assert!(negative.check().is_err());
        assert!(Spec::default().check().is_ok());
    }
}
