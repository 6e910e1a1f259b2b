//! Group detection for partial coscheduling.
//!
//! This crate implements §3 ("Group detection") of Busse, Schönherr, Diener, Navaux and Heiß,
//! *Partial Coscheduling of Virtual Machines Based on Memory Access Patterns* (SAC'15): from a
//! communication matrix (CE(x, y), the communication events between tasks x and y, as SPCD
//! produces it, Figure 3) it builds a binary dependency tree and walks it to choose the sets of
//! tasks that should be coscheduled.
//!
//! * [`matrix`]: the validated [`CommMatrix`] and the dependency d of eq. 1 between two disjoint
//!   task sets X and Y: the sum of CE(x, y) over x ∈ X, y ∈ Y divided by |X|·|Y|.
//! * [`mod@json`]: reading a matrix from JSON (an array of rows, or an object with a `matrix`
//!   field and optional `labels` or `threads`).
//! * [`tree`]: the dependency tree. Start with one leaf per task (d = 0); repeatedly merge the
//!   two subtrees with the highest d into a new node whose d is the d between them.
//! * [`split`]: set selection. Walk from the root and split a node into its two subtrees when a
//!   subtree's d is more than t times the node's own d; every node that is not split is a set.
//! * [`render`]: the tree as indented text, with the walk's decisions marked.
//! * [`modularity`]: a second way to choose the sets, not in the paper: of all cuts of the same
//!   tree, the one whose sets have the highest modularity Q (no threshold). More robust on
//!   noisy matrices; the module doc says why and where it is weaker. [`GroupMethod`] chooses
//!   ([`GroupMethod::PaperSplit`] is the default), [`group_with`] groups with either.
//! * [`floor`]: a noise floor for matrices detected from outside a guest, not in the paper:
//!   the guest kernel's own sharing (events per fault, calibrated on a guest whose vCPUs share
//!   nothing) taken off before grouping, so that the relative rule can separate two vCPUs at
//!   all ([`NoiseFloor`]).
//! * [`planted`] and [`compare`]: generated noisy block matrices with a planted answer
//!   (seeded, **simulated**), and how often each method recovers it per noise level.
//!
//! # Where we deliberately differ from the paper
//!
//! * **One merge at a time.** Figure 4 merges in rounds of pairs. We merge one pair (the one
//!   with the highest d) per step. Eq. 1 is average linkage, which is *reducible*: merging A
//!   and B never makes the union more dependent on a third subtree C than A or B was
//!   (d(A∪B, C) ≤ max(d(A, C), d(B, C))). So pairs that are each other's best partner stay so
//!   while other pairs merge, and merging such pairs in rounds gives the same tree as one
//!   merge at a time (barring ties). The paper's own example (Figure 3) gives the same tree.
//! * **Deterministic ties.** Among pairs with exactly equal d we merge the pair whose
//!   (smallest task of the subtree with the lower smallest task, smallest task of the other) is
//!   lexicographically smallest; the paper leaves ties open. Children are ordered so that the
//!   child with the smaller smallest task is on the left.
//! * **The split rule at its limits.** The paper splits when the subtrees' d is "more than"
//!   t times the node's d. We read "the subtrees' d" as the larger of the two children's d (a
//!   leaf has d = 0, so requiring both would never split off a single task, which Figure 4c
//!   does). Strictly "more than" alone would never separate two leaves (both d = 0) and never
//!   split a subtree without any communication across it, so t → 0 would not give singletons;
//!   we therefore also split whenever t·d = 0 for a finite t. Otherwise we keep the paper's
//!   strict "more than": it decides the paper's own example, where node {0,1,3,4} has d = 6
//!   and a child with d = 9 = 1.5·6 (with `≥` it would split into {0,3} and {1,4}, unlike
//!   Figure 4c). See [`split::splits`].
//! * **How the merges are found.** Not by recomputing eq. 1 for all pairs in every step: we
//!   keep, for every pair of current subtrees, the *sum* of CE between them and update it on a
//!   merge (sum(A∪B, C) = sum(A, C) + sum(B, C), the Lance–Williams average-linkage rule
//!   d(A∪B, C) = (|A| d(A, C) + |B| d(B, C)) / (|A| + |B|) without the division), and follow
//!   nearest-neighbour chains to reciprocal best pairs, which by reducibility are exactly the
//!   merges of the one-at-a-time rule; sorting them restores its order. O(n²) time and memory
//!   (n = 4096 takes well under a second in release builds). d = sum / (|X|·|Y|) is eq. 1 up to
//!   floating-point rounding, and exact for integer counts.
//! * **Input hygiene.** The diagonal is ignored (a task does not communicate with itself);
//!   the matrix must be symmetric (SPCD counts each event for the pair) up to a relative
//!   tolerance of 1e-9, and nearly equal mirror entries are replaced by their mean.
//!
//! # Paper example
//!
//! For the matrix of Figure 3 the tree merges {0,3} (d = 9), {1,4} (d = 7), {0,1,3,4}
//! (d = 6, eq. 1: (6+6+6+6)/4) and the root {0,…,4} (d = 1). With t = 1.5 the root splits
//! (6 > 1.5·1) and {0,1,3,4} does not (max(9, 7) = 9 is not more than 1.5·6 = 9), giving the
//! sets {0,1,3,4} and {2}.
//!
//! ```
//! use preheat_group::{group, CommMatrix};
//! let m = CommMatrix::from_json_str(
//!     "[[0,6,1,9,6],[6,0,1,6,7],[1,1,0,1,1],[9,6,1,0,6],[6,7,1,6,0]]",
//! )
//! .unwrap();
//! let g = group(&m, 1.5).unwrap();
//! assert_eq!(g.sets, vec![vec![0, 1, 3, 4], vec![2]]);
//! ```
//!
//! Invariants: no I/O, no `unsafe`, no global state; every result is a deterministic function
//! of the input.
#![forbid(unsafe_code)]

mod chain;
pub mod compare;
pub mod floor;
pub mod json;
pub mod matrix;
pub mod method;
pub mod modularity;
pub mod planted;
pub mod render;
pub mod split;
pub mod tree;

pub use floor::NoiseFloor;
pub use matrix::{CommMatrix, MatrixError, MAX_TASKS};
pub use method::GroupMethod;
pub use split::{group, Grouping, ThresholdError, DEFAULT_T};
pub use tree::{Node, Tree};

/// Build the tree for `m` and choose its sets with `method` (`t`: the paper's threshold, checked
/// with either method, used by [`GroupMethod::PaperSplit`] only).
pub fn group_with(m: &CommMatrix, method: GroupMethod, t: f64) -> Result<Grouping, ThresholdError> {
    let t = split::check_threshold(t)?;
    let tree = Tree::build(m);
    match method {
        GroupMethod::PaperSplit => Grouping::select(tree, t),
        GroupMethod::Modularity => Ok(Grouping::select_modularity(tree, m, t)),
    }
}
