//! The order in which cells are run: repetitions interleaved, items shuffled within a round.
//!
//! The paper runs each experiment three times. Running one cell's repetitions back to back lets
//! a slow drift of the machine (thermal state, a noisy neighbour on a VM host) fall on one cell;
//! interleaving them (round `r` runs every item once before round `r + 1` starts) and shuffling
//! the items inside each round spreads it over all cells. Deterministic for a seed
//! (`StdRng::seed_from_u64`, one generator for all rounds), so a schedule can be reproduced.

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;

/// `(repetition, item)` pairs: `reps` rounds, each a permutation of `0..n_items`.
/// Empty when either count is 0.
pub fn schedule(n_items: usize, reps: usize, seed: u64) -> Vec<(usize, usize)> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut out = Vec::with_capacity(n_items.saturating_mul(reps));
    let mut order: Vec<usize> = (0..n_items).collect();
    for rep in 0..reps {
        order.sort_unstable();
        order.shuffle(&mut rng);
        out.extend(order.iter().map(|&item| (rep, item)));
    }
    out
}
