//! The second way to choose sets from the dependency tree: the cut with the highest
//! modularity. Not in the paper (its §6 names graph partitioning as the alternative it did not
//! take); selected with [`GroupMethod::Modularity`](crate::GroupMethod), the paper's rule
//! stays the default.
//!
//! # Mechanism
//!
//! Modularity (Newman and Girvan, 2004; weighted form) scores a partition of the tasks into
//! sets c:
//!
//! Q = Σ_c [ S(c) / W − (D(c) / 2W)² ]
//!
//! with W the total CE over all pairs of tasks, S(c) the total CE over the pairs inside c, and
//! D(c) the sum of the row totals D(x) = Σ_y CE(x, y) of c's tasks. The second term is the share
//! of W a matrix with the same row totals but no structure would put inside c (the
//! "configuration" null model, CE(x, y) ≈ D(x)·D(y) / 2W). Q > 0: the sets hold more
//! communication than chance; one set of all tasks has Q = 0.
//!
//! We keep the paper's tree (eq. 1, [`crate::tree`]) and choose, among all *cuts* of it (sets
//! of nodes whose tasks partition the tasks, the same kind of answer the paper's walk gives),
//! the one with the highest Q. Q adds over sets, so one pass from the leaves up finds it
//! exactly: best(v) = max(Q({v}), best(left) + best(right)), with S(v) = S(left) + S(right) +
//! d_v·|left|·|right| (eq. 1 undone) and D(v) = D(left) + D(right); O(n) after the tree. The
//! walk from the root then splits a node iff
//!
//! * the best cut of its two subtrees has a higher Q than the node as one set, by more than
//!   1e-12 (an exact tie keeps the tasks together), or
//! * d = 0: nothing crosses the node (as the paper's rule does at any finite t), so a task
//!   without communication stands alone, and every task does when the matrix is all zero
//!   (W = 0, where Q is taken as 0).
//!
//! # Why it is more robust on noisy matrices
//!
//! The paper's rule decides each node from one extreme number: the larger child's d is the d of
//! that child's *own last merge*, and the tree merges the most dependent pairs first. Inside a
//! true group with noisy counts, the pairs that happened to count high merge first, so a child's
//! d exceeds t = 1.5 times the group's d (a mean over all pairs across it) by chance, and the
//! group is split; a count spread of a factor e^0.3 is enough to do that often. Modularity
//! scores a set by all of its pairs (the sum S) and all row totals, so one noisy pair moves it
//! little, and splitting a true group gives up the communication of all pairs across the split,
//! far more than the null model expects there. Each decision also counts what the subtrees
//! below can reach (the optimal cut), rather than a test at one node at a time from the top.
//! There is no threshold, and like the paper's rule it is scale-free: multiplying the matrix by
//! a constant changes nothing. `preheat groups compare` (and [`crate::compare`]) measure both
//! on generated noisy block matrices with a planted answer.
//!
//! # Where it differs from the paper, and its known limits
//!
//! * t plays no part (the tree is the paper's; the cut is not).
//! * **A task that communicates little but evenly stays with the others.** The null model
//!   expects a light task to share little, so it is not set apart for that: in the paper's own
//!   example (Figure 3) task 2 has one event with each task, what its total (4 of 88) predicts,
//!   and modularity keeps all five tasks together (Q = 0), where Figure 4c sets task 2 apart.
//! * **Resolution limit** (Fortunato and Barthélemy, 2007): when larger sets hold most of the
//!   communication, two small sets whose mutual communication is above what the null model
//!   expects for them are kept together. Without noise, with k planted groups of one size s
//!   (in-group rate 1, background ρ), joining two groups changes Q by (2/k)(ρs/δ − 1/k), δ =
//!   s − 1 + (k − 1)sρ a task's total, which is < 0 exactly when ρ < (s − 1)/s: equal groups
//!   are recovered while the background is below half the in-group rate (a property test).
//!   Unequal groups can fall under it: in 3 of the first 2000 noise-free matrices of
//!   [`crate::planted::Spec::default`] (groups of 2 beside groups of 4–7, background 1/10)
//!   modularity joins two pairs that the paper's rule keeps apart; none among the 200 seeds
//!   `preheat groups compare` uses.
//! * A single group of uniformly noisy tasks: at high noise some cut of the tree has Q > 0 by
//!   chance and the group is split; the paper's rule keeps it whole more often there.
//! * Tasks that belong to no group but carry background communication are paired when their
//!   mutual communication is above what their row totals predict (the paper's rule never
//!   separates two leaves whose d is above 0, so it keeps such pairs too).

use crate::matrix::CommMatrix;
use crate::method::GroupMethod;
use crate::split::{cut, Grouping};
use crate::tree::Tree;

/// How much higher (in Q) a split must score to be taken: below it a tie keeps tasks together.
pub const SPLIT_MARGIN: f64 = 1e-12;

/// The modularity Q of `sets` (a partition of `m`'s tasks; see the module docs). 0 when `m`
/// has no communication at all.
///
/// # Panics
/// If a set names a task out of range.
pub fn modularity(m: &CommMatrix, sets: &[Vec<usize>]) -> f64 {
    let n = m.len();
    let row: Vec<f64> = (0..n).map(|x| (0..n).map(|y| m.get(x, y)).sum()).collect();
    let two_w: f64 = row.iter().sum();
    if two_w == 0.0 {
        return 0.0;
    }
    sets.iter()
        .map(|c| {
            let inside: f64 = c
                .iter()
                .enumerate()
                .flat_map(|(i, &x)| c[i + 1..].iter().map(move |&y| (x, y)))
                .map(|(x, y)| m.get(x, y))
                .sum();
            let d: f64 = c.iter().map(|&x| row[x]).sum();
            2.0 * inside / two_w - (d / two_w).powi(2)
        })
        .sum()
}

impl Grouping {
    /// Choose the sets of `tree` (built from `m`) by the highest modularity over its cuts (see
    /// the module docs). `t` is only recorded.
    ///
    /// # Panics
    /// If `tree` does not have `m`'s number of tasks.
    pub fn select_modularity(tree: Tree, m: &CommMatrix, t: f64) -> Grouping {
        let n = m.len();
        assert_eq!(tree.tasks(), n, "the tree is not of this matrix");
        // Per node: S (CE inside), D (row totals), then (Q as one set, best Q of a cut below).
        let mut inside = vec![0.0; tree.nodes.len()];
        let mut total: Vec<f64> = (0..n).map(|x| (0..n).map(|y| m.get(x, y)).sum()).collect();
        total.resize(tree.nodes.len(), 0.0);
        // Inner nodes are numbered in merge order, after their children.
        for node in &tree.nodes[n..] {
            let (l, r) = (node.left.unwrap_or(0), node.right.unwrap_or(0));
            let across = node.d * tree.node(l).tasks.len() as f64 * tree.node(r).tasks.len() as f64;
            inside[node.id] = inside[l] + inside[r] + across;
            total[node.id] = total[l] + total[r];
        }
        let two_w: f64 = total[..n].iter().sum();
        let whole = |id: usize| {
            if two_w == 0.0 {
                0.0
            } else {
                2.0 * inside[id] / two_w - (total[id] / two_w).powi(2)
            }
        };
        let mut scores: Vec<(f64, f64)> = Vec::with_capacity(tree.nodes.len());
        let mut best = vec![0.0; tree.nodes.len()];
        for node in &tree.nodes {
            let keep = whole(node.id);
            let below = match (node.left, node.right) {
                (Some(l), Some(r)) => best[l] + best[r],
                _ => keep,
            };
            best[node.id] = if splits(node.d, keep, below) {
                below
            } else {
                keep
            };
            scores.push((keep, below));
        }
        let (sets, set_nodes) = cut(&tree, |node, _, _| {
            let (keep, below) = scores[node.id];
            splits(node.d, keep, below)
        });
        Grouping {
            method: GroupMethod::Modularity,
            t,
            modularity: Some(best[tree.root]),
            sets,
            set_nodes,
            tree,
            scores,
        }
    }
}

/// Whether a node of dependency `d` whose tasks score `keep` as one set, and whose subtrees'
/// best cut scores `below`, is split (see the module docs).
pub fn splits(d: f64, keep: f64, below: f64) -> bool {
    d == 0.0 || below > keep + SPLIT_MARGIN
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::group_with;

    fn m(rows: Vec<Vec<f64>>) -> CommMatrix {
        CommMatrix::new(rows).unwrap()
    }

    #[test]
    fn two_blocks_and_the_paper_example() {
        // Two pairs, strong inside, weak across: Q = 2·(10/22 − (22/44)²) > 0, split.
        let two = m(vec![
            vec![0.0, 10.0, 0.5, 0.5],
            vec![10.0, 0.0, 0.5, 0.5],
            vec![0.5, 0.5, 0.0, 10.0],
            vec![0.5, 0.5, 10.0, 0.0],
        ]);
        let g = group_with(&two, GroupMethod::Modularity, 1.5).unwrap();
        assert_eq!(g.sets, vec![vec![0, 1], vec![2, 3]]);
        let q = g.modularity.unwrap();
        assert!((q - modularity(&two, &g.sets)).abs() < 1e-12);
        assert!((q - (2.0 * (10.0 / 22.0) - 0.5)).abs() < 1e-12, "{q}");
        // Figure 3: task 2's one event with each task is what its total (4 of 88) predicts, so
        // modularity keeps it with the rest, unlike Figure 4c ({0,1,3,4} and {2}, Q < 0).
        let fig3 = CommMatrix::from_json_str(
            "[[0,6,1,9,6],[6,0,1,6,7],[1,1,0,1,1],[9,6,1,0,6],[6,7,1,6,0]]",
        )
        .unwrap();
        let g = group_with(&fig3, GroupMethod::Modularity, 1.5).unwrap();
        assert_eq!(g.sets, vec![vec![0, 1, 2, 3, 4]]);
        assert_eq!(g.modularity, Some(0.0));
        assert!(modularity(&fig3, &[vec![0, 1, 3, 4], vec![2]]) < 0.0);
    }

    #[test]
    fn no_communication_leaves_every_task_alone() {
        let zero = m(vec![vec![0.0; 3]; 3]);
        let g = group_with(&zero, GroupMethod::Modularity, 1.5).unwrap();
        assert_eq!(g.sets, vec![vec![0], vec![1], vec![2]]);
        assert_eq!(g.modularity, Some(0.0));
        assert_eq!(modularity(&zero, &g.sets), 0.0);
        let one = m(vec![vec![0.0]]);
        let g = group_with(&one, GroupMethod::Modularity, 1.5).unwrap();
        assert_eq!(g.sets, vec![vec![0]]);
    }

    #[test]
    fn uniform_matrix_is_one_set_and_ties_keep_together() {
        // Every split of a uniform matrix has Q < 0; a ring of 4 splits at Q = 0 exactly.
        let uniform = m(vec![vec![3.0; 5]; 5]);
        let g = group_with(&uniform, GroupMethod::Modularity, 1.5).unwrap();
        assert_eq!(g.sets, vec![(0..5).collect::<Vec<_>>()]);
        let ring = m(vec![
            vec![0.0, 1.0, 0.0, 1.0],
            vec![1.0, 0.0, 1.0, 0.0],
            vec![0.0, 1.0, 0.0, 1.0],
            vec![1.0, 0.0, 1.0, 0.0],
        ]);
        assert_eq!(modularity(&ring, &[vec![0, 1], vec![2, 3]]), 0.0);
        let g = group_with(&ring, GroupMethod::Modularity, 1.5).unwrap();
        assert_eq!(g.sets, vec![vec![0, 1, 2, 3]]);
    }

    #[test]
    fn scale_does_not_matter() {
        let a = m(vec![
            vec![0.0, 7.0, 1.0, 0.0],
            vec![7.0, 0.0, 2.0, 1.0],
            vec![1.0, 2.0, 0.0, 5.0],
            vec![0.0, 1.0, 5.0, 0.0],
        ]);
        let b = m((0..4)
            .map(|i| (0..4).map(|j| 1000.0 * a.get(i, j)).collect())
            .collect());
        let (ga, gb) = (
            group_with(&a, GroupMethod::Modularity, 1.5).unwrap(),
            group_with(&b, GroupMethod::Modularity, 1.5).unwrap(),
        );
        assert_eq!(ga.sets, gb.sets);
        assert_eq!(ga.sets, vec![vec![0, 1], vec![2, 3]]);
    }
}
