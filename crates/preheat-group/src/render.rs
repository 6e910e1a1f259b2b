//! The dependency tree of Busse et al. (SAC'15) §3, Figure 4, as indented text.
//!
//! One node per line, children indented by two spaces under their parent, left child first:
//!
//! ```text
//! d=1.000 {0,1,2,3,4}  [split: 6.000 > 1.5 x 1.000]
//!   d=6.000 {0,1,3,4}  [set 1: 9.000 <= 1.5 x 6.000]
//!     d=9.000 {0,3}
//!       task 0
//!       task 3
//!     d=7.000 {1,4}
//!       task 1
//!       task 4
//!   task 2  [set 2]
//! ```
//!
//! Inner nodes show d (eq. 1 between their children) and their tasks; leaves show their task
//! and its label when it differs from the task number. The walk's decisions are marked: nodes
//! it split, with the comparison that split them, and nodes that became sets, numbered as in
//! [`Grouping::sets`], with the comparison that kept them together. With
//! [`GroupMethod::Modularity`] the comparison is of Q: the node as one set against the best
//! cut of its subtrees (`[split: Q 0.412 split > 0.000 kept]`).

use std::fmt::Write;

use crate::method::GroupMethod;
use crate::modularity;
use crate::split::{splits, Grouping};

impl Grouping {
    /// The tree as indented text with the walk's decisions marked (see the module docs).
    /// `labels` name the tasks (may be empty).
    pub fn render_tree(&self, labels: &[String]) -> String {
        let tree = &self.tree;
        let mut set_no = vec![None; tree.nodes.len()];
        for (k, &id) in self.set_nodes.iter().enumerate() {
            set_no[id] = Some(k + 1);
        }
        let mut out = String::new();
        // (node, depth, whether the walk reached it); explicit stack for deep trees.
        let mut stack = vec![(tree.root, 0usize, true)];
        while let Some((id, depth, walked)) = stack.pop() {
            let node = tree.node(id);
            let _ = write!(out, "{:width$}", "", width = 2 * depth);
            match (node.left, node.right) {
                (Some(l), Some(r)) => {
                    let _ = write!(out, "d={:.3} {{{}}}", node.d, join(&node.tasks));
                    let reason = self.reason(id);
                    let below = match set_no[id] {
                        Some(k) if walked => {
                            let _ = write!(out, "  [set {k}: {reason}]");
                            false
                        }
                        _ if walked => {
                            let _ = write!(out, "  [split: {reason}]");
                            true
                        }
                        _ => false,
                    };
                    stack.push((r, depth + 1, below));
                    stack.push((l, depth + 1, below));
                }
                _ => {
                    let task = node.tasks[0];
                    let _ = write!(out, "task {task}");
                    if let Some(label) = labels.get(task).filter(|l| **l != task.to_string()) {
                        let _ = write!(out, " ({label})");
                    }
                    if let (Some(k), true) = (set_no[id], walked) {
                        let _ = write!(out, "  [set {k}]");
                    }
                }
            }
            out.push('\n');
        }
        out
    }
}

impl Grouping {
    /// Why the walk split inner node `id` or kept it as a set, as the comparison it made.
    fn reason(&self, id: usize) -> String {
        let tree = &self.tree;
        let node = tree.node(id);
        let (Some(l), Some(r)) = (node.left, node.right) else {
            return String::new();
        };
        if self.method == GroupMethod::Modularity {
            let (keep, below) = self.scores[id];
            return if node.d == 0.0 {
                "d = 0".to_string()
            } else if modularity::splits(node.d, keep, below) {
                format!("Q {below:.3} split > {keep:.3} kept")
            } else {
                format!("Q {keep:.3} kept >= {below:.3} split")
            };
        }
        let (dl, dr) = (tree.node(l).d, tree.node(r).d);
        let m = dl.max(dr);
        let bar = self.t * node.d;
        if self.t.is_infinite() {
            "t = inf".to_string()
        } else if splits(node.d, dl, dr, self.t) && bar == 0.0 {
            format!("t x d = {} x {:.3} = 0", self.t, node.d)
        } else if m > bar {
            format!("{m:.3} > {} x {:.3}", self.t, node.d)
        } else {
            format!("{m:.3} <= {} x {:.3}", self.t, node.d)
        }
    }
}

/// The long help of `preheat groups` (kept here with the code it describes; the CLI only
/// shows it).
pub const GROUPS_HELP: &str = "Group tasks into coscheduling sets from a communication matrix \
(Busse et al., Partial Coscheduling of Virtual Machines Based on Memory Access Patterns, SAC'15, §3).

Input (JSON, a file or `-` for standard input): an array of rows, CE(i,j) = communication events \
between tasks i and j (square, symmetric, non-negative; the diagonal is ignored and may be null), \
e.g. [[0,6,1],[6,0,2],[1,2,0]]; or an object with that array in a \"matrix\" field and optionally \
\"labels\" (n strings) or \"threads\" (n objects with tid/name) naming the tasks.

Tree: the dependency between two disjoint task sets X and Y is eq. 1, d = sum of CE(x,y) over \
x in X, y in Y, divided by |X|*|Y|. Starting from one leaf per task (d = 0), the two subtrees with \
the highest d are merged into a node carrying that d, until one tree is left (ties: the pair with \
the lowest smallest tasks).

Sets, --method paper (the default, the paper's rule): walking from the root, a node splits into \
its two subtrees when the larger of their d is more than t times its own d (or t*d = 0); \
otherwise its tasks form one coscheduling set. Larger t keeps more tasks together: t = 0 puts \
every task alone, t = inf gives one set. The paper uses t = 1.5.

Sets, --method modularity (not in the paper; more robust on noisy matrices): of all ways to cut \
the same tree into sets, the one with the highest modularity Q = sum over sets of (CE inside / \
all CE) - (row totals of the set / twice all CE)^2, i.e. the most communication inside sets \
beyond what the tasks' totals alone would put there. No threshold (--t is ignored); a node \
without communication across it (d = 0) splits. Weaker than the paper's rule on one noisy group \
(splits it more often) and on small groups beside a large one (may join them). `preheat groups \
compare` measures both on generated matrices with planted groups (simulated).

Prints the tree (each node's d and tasks, with the walk's decisions) and the sets; --json prints \
{\"method\", \"t\", \"sets\", \"set_nodes\", \"tree\", \"labels\"} (with modularity also \
\"modularity\", the Q of the sets).";

impl Grouping {
    /// The text of `preheat groups`: the matrix's name and size, the tree with the walk's
    /// decisions ([`render_tree`](Self::render_tree)), and the sets, each with its labels
    /// when they are not the task numbers.
    pub fn render(&self, name: &str, labels: &[String]) -> String {
        let mut out = format!("{name}: {} tasks\n", self.tree.tasks());
        out.push_str("dependency tree (d: eq. 1 between a node's two children; leaves 0):\n");
        out.push_str(&self.render_tree(labels));
        let _ = match self.method {
            GroupMethod::PaperSplit => write!(
                out,
                "sets at t = {} (a node splits when a child's d is more than t times its own)",
                self.t
            ),
            GroupMethod::Modularity => write!(
                out,
                "sets by modularity (the cut of the tree with the highest Q = {:.3})",
                self.modularity.unwrap_or(0.0)
            ),
        };
        let _ = writeln!(out, ": {}", self.sets.len());
        for (k, set) in self.sets.iter().enumerate() {
            let _ = write!(out, "  set {}: {{{}}}", k + 1, join(set));
            let named: Vec<String> = set
                .iter()
                .map(|&x| labels.get(x).cloned().unwrap_or_else(|| x.to_string()))
                .collect();
            if set.iter().zip(&named).any(|(x, l)| *l != x.to_string()) {
                let _ = write!(out, "  ({})", named.join(", "));
            }
            out.push('\n');
        }
        out
    }
}

/// Tasks as `0,1,3`.
pub fn join(tasks: &[usize]) -> String {
    let mut s = String::new();
    for (i, x) in tasks.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        let _ = write!(s, "{x}");
    }
    s
}

#[cfg(test)]
mod tests {
    use crate::{group, group_with, CommMatrix, GroupMethod};

    #[test]
    fn modularity_marks_compare_q() {
        let m = CommMatrix::new(vec![
            vec![0.0, 10.0, 0.5, 0.5],
            vec![10.0, 0.0, 0.5, 0.5],
            vec![0.5, 0.5, 0.0, 10.0],
            vec![0.5, 0.5, 10.0, 0.0],
        ])
        .unwrap();
        let g = group_with(&m, GroupMethod::Modularity, 1.5).unwrap();
        assert_eq!(
            g.render_tree(&[]),
            "d=0.500 {0,1,2,3}  [split: Q 0.409 split > 0.000 kept]\n\
             \x20 d=10.000 {0,1}  [set 1: Q 0.205 kept >= -0.125 split]\n\
             \x20   task 0\n\
             \x20   task 1\n\
             \x20 d=10.000 {2,3}  [set 2: Q 0.205 kept >= -0.125 split]\n\
             \x20   task 2\n\
             \x20   task 3\n"
        );
    }

    #[test]
    fn marks_splits_sets_and_labels() {
        let m = CommMatrix::new(vec![
            vec![0.0, 4.0, 0.0],
            vec![4.0, 0.0, 1.0],
            vec![0.0, 1.0, 0.0],
        ])
        .unwrap()
        .with_labels(vec!["a".into(), "1".into(), "c".into()])
        .unwrap();
        let g = group(&m, 1.5).unwrap();
        let text = g.render_tree(m.labels());
        assert_eq!(
            text,
            "d=0.500 {0,1,2}  [split: 4.000 > 1.5 x 0.500]\n\
             \x20 d=4.000 {0,1}  [set 1: 0.000 <= 1.5 x 4.000]\n\
             \x20   task 0 (a)\n\
             \x20   task 1\n\
             \x20 task 2 (c)  [set 2]\n"
        );
    }
}
