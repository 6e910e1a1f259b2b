//! The run schedule: every (repetition, item) once, rounds in order, deterministic.

use std::collections::BTreeSet;

use preheat_affinity::schedule;
use proptest::prelude::*;

proptest! {
    #[test]
    fn every_pair_once_rounds_in_order_deterministic(n in 0usize..40, reps in 0usize..6, seed: u64) {
        let s = schedule(n, reps, seed);
        prop_assert_eq!(s.len(), n * reps);
        let set: BTreeSet<(usize, usize)> = s.iter().copied().collect();
        prop_assert_eq!(set.len(), s.len());
        prop_assert!(s.iter().all(|&(r, i)| r < reps && i < n));
        // Round r is a contiguous block, and the blocks come in order.
        for (k, &(r, _)) in s.iter().enumerate() {
            prop_assert_eq!(r, k / n.max(1));
        }
        prop_assert_eq!(s, schedule(n, reps, seed));
    }
}

#[test]
fn rounds_are_shuffled() {
    let s = schedule(20, 3, 7);
    let rounds: Vec<Vec<usize>> = s
        .chunks(20)
        .map(|c| c.iter().map(|&(_, i)| i).collect())
        .collect();
    let identity: Vec<usize> = (0..20).collect();
    assert!(rounds.iter().any(|r| *r != identity));
    assert!(rounds[0] != rounds[1] || rounds[1] != rounds[2]);
    assert_ne!(schedule(20, 3, 7), schedule(20, 3, 8));
}
