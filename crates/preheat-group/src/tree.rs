//! The dependency tree of Busse et al. (SAC'15) §3, Figure 4 (a)–(b).
//!
//! Start with one leaf per task (d = 0). Repeatedly merge the two current subtrees with the
//! highest dependency d (eq. 1) into a new node whose d is the d between them, until one tree
//! is left.
//!
//! **Ties** (exactly equal d): the pair whose (smallest task of the subtree with the lower
//! smallest task, smallest task of the other) is lexicographically smallest merges first. The
//! merged node's left child is the subtree with the smaller smallest task.
//!
//! **Rounds.** Figure 4 merges several pairs per round. Eq. 1 is average linkage, which is
//! reducible (d(A∪B, C) ≤ max(d(A, C), d(B, C))), so a pair of subtrees that are each other's
//! best partner stays so while other pairs merge; merging one best pair at a time therefore
//! gives the same tree as merging mutually best pairs in rounds, barring ties.
//!
//! **How.** The private `chain` module finds the merges with the nearest-neighbour chain in
//! O(n²) time and memory; they are exactly the merges of the rule above. Each merge of that
//! rule comes strictly later in the order of pairs (higher d first, then the tie-break) than
//! the one before it: the pairs a merge creates are weighted means of pairs that came after
//! it. So sorting the merges by that order (children always before their parent) gives the
//! rule's merge order, which numbers the inner nodes.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use serde::Serialize;

use crate::chain::{self, Merge};
use crate::matrix::CommMatrix;

/// One node of the tree.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Node {
    /// Leaves are numbered by their task (0..n); inner nodes n, n+1, … in merge order.
    pub id: usize,
    /// The tasks below this node, ascending.
    pub tasks: Vec<usize>,
    /// Eq. 1 between the two children; 0 for a leaf.
    pub d: f64,
    /// The child with the smaller smallest task; `None` for a leaf.
    pub left: Option<usize>,
    /// The other child; `None` for a leaf.
    pub right: Option<usize>,
}

impl Node {
    /// A leaf holds one task and has no children.
    pub fn is_leaf(&self) -> bool {
        self.left.is_none()
    }
}

/// The binary dependency tree: n leaves and n − 1 inner nodes.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Tree {
    /// All nodes, indexed by id.
    pub nodes: Vec<Node>,
    /// The root's id (the last merge; the single leaf when n = 1).
    pub root: usize,
}

impl Tree {
    /// Build the tree for `m` (see the module docs for the rule and its tie-breaking).
    pub fn build(m: &CommMatrix) -> Tree {
        let n = m.len();
        let mut nodes: Vec<Node> = (0..n)
            .map(|i| Node {
                id: i,
                tasks: vec![i],
                d: 0.0,
                left: None,
                right: None,
            })
            .collect();
        let merges = chain::merges(m);
        // Replay in the rule's order: the first merge (in the order of pairs) among those
        // whose children are built. With exact arithmetic that is simply sorted order; the
        // readiness check keeps the tree well formed even if rounding disagreed.
        let mut parent = vec![None; merges.len()];
        let mut waiting = vec![0u8; merges.len()];
        for (i, x) in merges.iter().enumerate() {
            for c in [x.left, x.right].into_iter().flatten() {
                parent[c] = Some(i);
                waiting[i] += 1;
            }
        }
        let mut ready: BinaryHeap<Ready> = (0..merges.len())
            .filter(|&i| waiting[i] == 0)
            .map(|i| Ready(merges[i], i))
            .collect();
        let mut node_of = vec![0; merges.len()];
        while let Some(Ready(x, i)) = ready.pop() {
            let left = x.left.map_or(x.p, |c| node_of[c]);
            let right = x.right.map_or(x.q, |c| node_of[c]);
            let id = nodes.len();
            node_of[i] = id;
            nodes.push(Node {
                id,
                tasks: merge_sorted(&nodes[left].tasks, &nodes[right].tasks),
                d: x.d,
                left: Some(left),
                right: Some(right),
            });
            if let Some(up) = parent[i] {
                waiting[up] -= 1;
                if waiting[up] == 0 {
                    ready.push(Ready(merges[up], up));
                }
            }
        }
        Tree {
            root: nodes.len() - 1,
            nodes,
        }
    }

    /// The node with this id.
    ///
    /// # Panics
    /// If there is no such node.
    pub fn node(&self, id: usize) -> &Node {
        &self.nodes[id]
    }

    /// Number of tasks (leaves).
    pub fn tasks(&self) -> usize {
        self.nodes[self.root].tasks.len()
    }
}

/// A merge ready to be numbered, ordered so the heap's maximum is the first pair in the
/// order of pairs.
struct Ready(Merge, usize);

impl Ord for Ready {
    fn cmp(&self, other: &Self) -> Ordering {
        let (a, b) = (&self.0, &other.0);
        a.d.total_cmp(&b.d)
            .then_with(|| (b.p, b.q).cmp(&(a.p, a.q)))
            .then_with(|| other.1.cmp(&self.1))
    }
}

impl PartialOrd for Ready {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Ready {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Ready {}

/// The union of two disjoint ascending lists, ascending.
fn merge_sorted(x: &[usize], y: &[usize]) -> Vec<usize> {
    let mut out = Vec::with_capacity(x.len() + y.len());
    let (mut i, mut j) = (0, 0);
    while i < x.len() && j < y.len() {
        if x[i] < y[j] {
            out.push(x[i]);
            i += 1;
        } else {
            out.push(y[j]);
            j += 1;
        }
    }
    out.extend_from_slice(&x[i..]);
    out.extend_from_slice(&y[j..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    #[test]
    fn one_task_is_a_single_leaf() {
        let t = Tree::build(&CommMatrix::new(vec![vec![3.0]]).unwrap());
        assert_eq!(t.root, 0);
        assert_eq!(t.nodes.len(), 1);
        assert!(t.node(0).is_leaf());
    }

    #[test]
    fn ties_merge_the_lowest_pair_first() {
        // All pairs equal: (0,1) first, then ({0,1},2) at the same d, then ({0,1,2},3).
        let m = CommMatrix::new(vec![vec![1.0; 4]; 4]).unwrap();
        let t = Tree::build(&m);
        let inner: Vec<_> = t.nodes[4..].iter().map(|x| x.tasks.clone()).collect();
        assert_eq!(inner, vec![vec![0, 1], vec![0, 1, 2], vec![0, 1, 2, 3]]);
        assert_eq!(t.node(5).left, Some(4));
        assert_eq!(t.node(5).right, Some(2));
    }

    #[test]
    fn ties_between_disjoint_pairs_take_the_lowest_smallest_tasks() {
        // (2,3) and (0,1)... equal d = 5; (0,1) first although (2,3) was listed first.
        let m = CommMatrix::new(vec![
            vec![0.0, 5.0, 0.0, 0.0],
            vec![5.0, 0.0, 0.0, 0.0],
            vec![0.0, 0.0, 0.0, 5.0],
            vec![0.0, 0.0, 5.0, 0.0],
        ])
        .unwrap();
        let t = Tree::build(&m);
        assert_eq!(t.node(4).tasks, vec![0, 1]);
        assert_eq!(t.node(5).tasks, vec![2, 3]);
        assert_eq!(t.node(6).d, 0.0);
    }

    #[test]
    fn five_hundred_twelve_tasks() {
        let n = 512;
        // Pseudo-random (a fixed seed), symmetric, integer counts below 1000.
        let mut rng = StdRng::seed_from_u64(0x9e37_79b9_7f4a_7c15);
        let upper: Vec<Vec<f64>> = (0..n)
            .map(|i| {
                (0..n)
                    .map(|j| {
                        if j > i {
                            rng.gen_range(0..1000) as f64
                        } else {
                            0.0
                        }
                    })
                    .collect()
            })
            .collect();
        let rows: Vec<Vec<f64>> = (0..n)
            .map(|i| (0..n).map(|j| upper[i.min(j)][i.max(j)]).collect())
            .collect();
        let t = Tree::build(&CommMatrix::new(rows).unwrap());
        assert_eq!(t.nodes.len(), 2 * n - 1);
        assert_eq!(t.node(t.root).tasks, (0..n).collect::<Vec<_>>());
    }
}
