//! Set selection of Busse et al. (SAC'15) §3, Figure 4 (c): which subtrees to coschedule.
//!
//! Walk from the root. At an inner node N with children L and R, split N (walk on into L and R
//! separately) iff [`splits`]`(d_N, d_L, d_R, t)`; otherwise N's tasks form one set and the
//! walk does not look further down. A leaf is a set of one task.
//!
//! The rule: split iff max(d_L, d_R) > t·d_N (the paper: the subtrees' dependency is "more
//! than a certain factor t" of the current tree's), or t·d_N = 0 with t finite. The second
//! clause covers the limits: with "more than" alone two leaves (d = 0) could never be
//! separated, so t = 0 would not give singletons, and a subtree without any communication
//! across it (d_N = 0) would be kept together. So:
//!
//! * t = +∞ never splits: one set of all tasks;
//! * t = 0 always splits: every task alone;
//! * d_N = 0 splits at any finite t;
//! * otherwise strictly "more than": in the paper's example the node {0,1,3,4} has d = 6 and
//!   children 9 and 7, and 9 = 1.5·6 does not split it (Figure 4c keeps {0,1,3,4} together).
//!
//! t must be ≥ 0 and not NaN.

use serde::Serialize;
use thiserror::Error;

use crate::matrix::CommMatrix;
use crate::method::GroupMethod;
use crate::tree::{Node, Tree};

/// The paper's threshold (§3, Figure 4c and all experiments in §5).
pub const DEFAULT_T: f64 = 1.5;

/// A threshold that is NaN or negative.
#[derive(Debug, Clone, Copy, PartialEq, Error)]
#[error("threshold t must be a number >= 0 (inf for one set), got {0}")]
pub struct ThresholdError(pub f64);

/// The sets chosen from the tree (at threshold `t`, or by modularity), with the tree.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Grouping {
    /// How the sets were chosen (JSON: `"paper"` or `"modularity"`).
    pub method: GroupMethod,
    /// The threshold (JSON: `null` for +∞, which JSON cannot express). Used by the paper's
    /// rule only; kept as given with [`GroupMethod::Modularity`].
    pub t: f64,
    /// The sets: each ascending, ordered by smallest task; every task in exactly one.
    pub sets: Vec<Vec<usize>>,
    /// For each set, the id of the tree node whose tasks it is.
    pub set_nodes: Vec<usize>,
    /// The dependency tree.
    pub tree: Tree,
    /// [`GroupMethod::Modularity`] only: the modularity Q of the sets (JSON: absent with the
    /// paper's rule).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub modularity: Option<f64>,
    /// [`GroupMethod::Modularity`] only, by node id: (Q of the node's tasks as one set, the
    /// highest Q of a cut of its two subtrees), for [`render_tree`](Self::render_tree).
    #[serde(skip)]
    pub(crate) scores: Vec<(f64, f64)>,
}

/// Whether the walk splits a node of dependency `d_node` whose children have `d_left` and
/// `d_right` (see the module docs).
pub fn splits(d_node: f64, d_left: f64, d_right: f64, t: f64) -> bool {
    if t.is_infinite() {
        return false;
    }
    let bar = t * d_node;
    bar == 0.0 || d_left.max(d_right) > bar
}

/// Check a threshold: a number ≥ 0 (+∞ allowed).
pub fn check_threshold(t: f64) -> Result<f64, ThresholdError> {
    if t.is_nan() || t < 0.0 {
        Err(ThresholdError(t))
    } else {
        Ok(t)
    }
}

/// Build the tree for `m` and select its sets at threshold `t`.
pub fn group(m: &CommMatrix, t: f64) -> Result<Grouping, ThresholdError> {
    check_threshold(t)?;
    Grouping::select(Tree::build(m), t)
}

impl Grouping {
    /// Select the sets of `tree` at threshold `t` (see the module docs).
    pub fn select(tree: Tree, t: f64) -> Result<Grouping, ThresholdError> {
        let t = check_threshold(t)?;
        let (sets, set_nodes) = cut(&tree, |node, l, r| splits(node.d, l.d, r.d, t));
        Ok(Grouping {
            method: GroupMethod::PaperSplit,
            t,
            sets,
            set_nodes,
            tree,
            modularity: None,
            scores: Vec::new(),
        })
    }

    /// The set each task belongs to, by task (index into [`sets`](Self::sets)).
    pub fn set_of_task(&self) -> Vec<usize> {
        let mut of = vec![0; self.tree.tasks()];
        for (k, set) in self.sets.iter().enumerate() {
            for &x in set {
                of[x] = k;
            }
        }
        of
    }
}

/// The walk shared by both methods: from the root, split an inner node (walk on into its
/// children) when `split(node, left, right)`, else its tasks form one set. Returns the sets
/// (ordered by smallest task) and their nodes.
pub(crate) fn cut(
    tree: &Tree,
    split: impl Fn(&Node, &Node, &Node) -> bool,
) -> (Vec<Vec<usize>>, Vec<usize>) {
    let mut found: Vec<(Vec<usize>, usize)> = Vec::new();
    // An explicit stack: a chain-shaped tree of 4096 tasks is 4095 levels deep.
    let mut stack = vec![tree.root];
    while let Some(id) = stack.pop() {
        let node = tree.node(id);
        match (node.left, node.right) {
            (Some(l), Some(r)) if split(node, tree.node(l), tree.node(r)) => {
                stack.push(r);
                stack.push(l);
            }
            _ => found.push((node.tasks.clone(), id)),
        }
    }
    found.sort_by_key(|(tasks, _)| tasks[0]);
    found.into_iter().unzip()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rule_at_its_limits() {
        assert!(splits(0.0, 0.0, 0.0, 0.0), "t = 0 separates leaves");
        assert!(
            splits(0.0, 0.0, 0.0, 1e300),
            "no communication across: split"
        );
        assert!(
            !splits(0.0, 5.0, 0.0, f64::INFINITY),
            "t = inf never splits"
        );
        assert!(!splits(6.0, 9.0, 7.0, 1.5), "9 is not more than 1.5 x 6");
        assert!(splits(1.0, 6.0, 0.0, 1.5));
        assert!(
            !splits(1e300, 1e300, 0.0, 1e300),
            "t x d overflows to inf: no split"
        );
    }

    #[test]
    fn bad_thresholds_are_refused() {
        let m = CommMatrix::new(vec![vec![0.0, 1.0], vec![1.0, 0.0]]).unwrap();
        assert!(group(&m, f64::NAN).is_err());
        let e = group(&m, -1.0).unwrap_err();
        assert_eq!(
            e.to_string(),
            "threshold t must be a number >= 0 (inf for one set), got -1"
        );
        assert_eq!(group(&m, f64::INFINITY).unwrap().sets, vec![vec![0, 1]]);
        assert_eq!(group(&m, 0.0).unwrap().sets, vec![vec![0], vec![1]]);
        assert_eq!(group(&m, 0.0).unwrap().set_of_task(), vec![0, 1]);
    }
}
