//! Properties of the grouping of Busse et al. (SAC'15) §3 on random matrices: eq. 1 at every
//! node, the split rule's limits, invariance under renumbering the tasks (both methods), the
//! modularity cut as the best cut of the tree, and agreement with a direct (slow)
//! transcription of the merge rule, ties included.

use preheat_group::modularity::modularity;
use preheat_group::{group, group_with, CommMatrix, GroupMethod, Tree};
use proptest::prelude::*;

/// A symmetric matrix from its upper triangle (row by row, zero diagonal).
fn from_upper(n: usize, upper: &[f64]) -> Vec<Vec<f64>> {
    let at = |i: usize, j: usize| {
        let (i, j) = (i.min(j), i.max(j));
        upper[i * n - i * (i + 1) / 2 + j - i - 1]
    };
    (0..n)
        .map(|i| {
            (0..n)
                .map(|j| if i == j { 0.0 } else { at(i, j) })
                .collect()
        })
        .collect()
}

/// Matrices of 1..=12 tasks with continuous entries (ties have probability 0).
fn continuous() -> impl Strategy<Value = Vec<Vec<f64>>> {
    (1usize..=12).prop_flat_map(|n| {
        proptest::collection::vec(0.0f64..100.0, n * (n - 1) / 2)
            .prop_map(move |u| from_upper(n, &u))
    })
}

/// Matrices of 1..=9 tasks with small integer entries (many ties).
fn tied() -> impl Strategy<Value = Vec<Vec<f64>>> {
    (1usize..=9).prop_flat_map(|n| {
        proptest::collection::vec(0u8..4, n * (n - 1) / 2).prop_map(move |u| {
            let u: Vec<f64> = u.into_iter().map(f64::from).collect();
            from_upper(n, &u)
        })
    })
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
}

/// The merge rule transcribed directly: recompute eq. 1 for every pair of current subtrees in
/// every step; highest d first, ties to the lowest (smallest task, smallest task) pair.
/// Returns the inner nodes' (tasks, d) in merge order.
fn naive(m: &CommMatrix) -> Vec<(Vec<usize>, f64)> {
    let mut current: Vec<Vec<usize>> = (0..m.len()).map(|i| vec![i]).collect();
    let mut out = Vec::new();
    while current.len() > 1 {
        let mut best: Option<(f64, usize, usize)> = None;
        for i in 0..current.len() {
            for j in i + 1..current.len() {
                let d = m.dependency(&current[i], &current[j]);
                // `current` stays ordered by smallest task, so (i, j) orders like the tasks.
                match best {
                    Some((bd, _, _)) if d <= bd => {}
                    _ => best = Some((d, i, j)),
                }
            }
        }
        let (d, i, j) = best.unwrap();
        let b = current.remove(j);
        current[i].extend(b);
        current[i].sort_unstable();
        out.push((current[i].clone(), d));
    }
    out
}

proptest! {
    #[test]
    fn every_task_in_exactly_one_set(rows in continuous(), t in 0.0f64..5.0) {
        let m = CommMatrix::new(rows).unwrap();
        let g = group(&m, t).unwrap();
        let mut all: Vec<usize> = g.sets.iter().flatten().copied().collect();
        all.sort_unstable();
        prop_assert_eq!(all, (0..m.len()).collect::<Vec<_>>());
        for s in &g.sets {
            prop_assert!(s.windows(2).all(|w| w[0] < w[1]));
        }
        prop_assert!(g.sets.windows(2).all(|w| w[0][0] < w[1][0]));
    }

    #[test]
    fn limits_of_t(rows in continuous()) {
        let m = CommMatrix::new(rows).unwrap();
        let n = m.len();
        prop_assert_eq!(group(&m, f64::INFINITY).unwrap().sets, vec![(0..n).collect::<Vec<_>>()]);
        prop_assert_eq!(group(&m, 0.0).unwrap().sets, (0..n).map(|x| vec![x]).collect::<Vec<_>>());
    }

    #[test]
    fn inner_d_is_eq_1_of_the_children(rows in continuous()) {
        let m = CommMatrix::new(rows).unwrap();
        let tree = Tree::build(&m);
        prop_assert_eq!(tree.nodes.len(), 2 * m.len() - 1);
        for node in &tree.nodes {
            if let (Some(l), Some(r)) = (node.left, node.right) {
                let (l, r) = (tree.node(l), tree.node(r));
                let direct = m.dependency(&l.tasks, &r.tasks);
                prop_assert!(close(node.d, direct), "node {}: {} vs {}", node.id, node.d, direct);
                prop_assert!(l.tasks[0] < r.tasks[0]);
                // Average linkage has no inversions: a parent is never more dependent than
                // an inner child (why rounds of pairs give the same tree).
                for c in [l, r] {
                    prop_assert!(c.is_leaf() || node.d <= c.d * (1.0 + 1e-12));
                }
            }
        }
    }

    #[test]
    fn renumbering_tasks_renumbers_the_answer(
        (rows, perm) in continuous().prop_flat_map(|rows| {
            let n = rows.len();
            (Just(rows), Just((0..n).collect::<Vec<usize>>()).prop_shuffle())
        }),
        t in 0.0f64..5.0,
    ) {
        let n = rows.len();
        let mut permuted = vec![vec![0.0; n]; n];
        for i in 0..n {
            for j in 0..n {
                permuted[perm[i]][perm[j]] = rows[i][j];
            }
        }
        let (m, mp) = (CommMatrix::new(rows).unwrap(), CommMatrix::new(permuted).unwrap());
        let (a, b) = (group(&m, t).unwrap(), group(&mp, t).unwrap());
        for method in GroupMethod::ALL {
            let (a, b) = (group_with(&m, method, t).unwrap(), group_with(&mp, method, t).unwrap());
            let mut mapped: Vec<Vec<usize>> = a
                .sets
                .iter()
                .map(|s| {
                    let mut s: Vec<usize> = s.iter().map(|&x| perm[x]).collect();
                    s.sort_unstable();
                    s
                })
                .collect();
            mapped.sort();
            prop_assert_eq!(&mapped, &b.sets, "{}", method);
        }
        // The whole tree renumbers too: the same subtrees with the same d.
        let subtrees = |g: &preheat_group::Grouping, map: &dyn Fn(usize) -> usize| {
            let mut v: Vec<(Vec<usize>, f64)> = g.tree.nodes[n..]
                .iter()
                .map(|x| {
                    let mut s: Vec<usize> = x.tasks.iter().map(|&y| map(y)).collect();
                    s.sort_unstable();
                    (s, x.d)
                })
                .collect();
            v.sort_by(|p, q| p.0.cmp(&q.0));
            v
        };
        let (sa, sb) = (subtrees(&a, &|x| perm[x]), subtrees(&b, &|x| x));
        prop_assert_eq!(sa.len(), sb.len());
        for ((ta, da), (tb, db)) in sa.iter().zip(&sb) {
            prop_assert_eq!(ta, tb);
            prop_assert!(close(*da, *db));
        }
    }

    #[test]
    fn modularity_is_the_best_cut_of_the_tree(rows in continuous(), t in 0.0f64..5.0) {
        let m = CommMatrix::new(rows).unwrap();
        let g = group_with(&m, GroupMethod::Modularity, t).unwrap();
        let mut all: Vec<usize> = g.sets.iter().flatten().copied().collect();
        all.sort_unstable();
        prop_assert_eq!(all, (0..m.len()).collect::<Vec<_>>());
        let q = g.modularity.unwrap();
        prop_assert!((q - modularity(&m, &g.sets)).abs() < 1e-9);
        // The paper's sets are a cut of the same tree, and so is one set of all tasks (Q = 0).
        prop_assert!(q >= modularity(&m, &group(&m, t).unwrap().sets) - 1e-9);
        prop_assert!(q >= -1e-12);
    }

    #[test]
    fn agrees_with_the_direct_transcription(rows in tied()) {
        let m = CommMatrix::new(rows).unwrap();
        let tree = Tree::build(&m);
        let fast: Vec<(Vec<usize>, f64)> = tree.nodes[m.len()..]
            .iter()
            .map(|x| (x.tasks.clone(), x.d))
            .collect();
        prop_assert_eq!(fast, naive(&m));
    }
}
