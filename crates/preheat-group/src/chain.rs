//! Finding the merges of the dependency tree of Busse et al. (SAC'15) §3, Figure 4 (a)–(b),
//! with the nearest-neighbour chain.
//!
//! Pairs of current subtrees are ordered strictly by [`before`]: higher d (eq. 1) first, then
//! the lower (smallest task of the subtree with the lower smallest task, smallest task of the
//! other). Follow a chain from a subtree to its best partner, to that one's best partner, and so
//! on, until two subtrees are each other's best (a reciprocal pair, what Figure 4 merges in one
//! round); merge them and continue from the rest of the chain.
//!
//! Eq. 1 is average linkage, which is reducible: d(A∪B, C) is a weighted mean of d(A, C) and
//! d(B, C), so never above both. With the tie-break that still holds for the strict order (the
//! pair (A∪B, C) carries the tie-break position of (A, C) or of (B, C)). Hence a reciprocal pair
//! stays reciprocal while other pairs merge, the chain below a merge stays a chain, and the
//! merges found are exactly those of repeatedly merging the globally best pair, the same
//! argument that makes the paper's rounds of pairs equivalent to one merge at a time. Their
//! global order is recovered in [`crate::tree`].
//!
//! We keep the n×n table of CE *sums* between current subtrees: the Lance–Williams
//! average-linkage update d(A∪B, C) = (|A| d(A, C) + |B| d(B, C)) / (|A| + |B|) kept as
//! sum(A∪B, C) = sum(A, C) + sum(B, C), so no division rounds into later values and integer
//! counts stay exact. O(n²) memory, O(n²) time.

use crate::matrix::CommMatrix;

/// One merge: the subtrees whose smallest tasks are `p` < `q`, with their d, and the merges
/// that made them (`None`: the leaf).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Merge {
    pub p: usize,
    pub q: usize,
    pub d: f64,
    pub left: Option<usize>,
    pub right: Option<usize>,
}

/// Whether pair `a` (d, lower smallest task, other smallest task) comes before pair `b`.
pub(crate) fn before(a: (f64, usize, usize), b: (f64, usize, usize)) -> bool {
    a.0 > b.0 || (a.0 == b.0 && (a.1, a.2) < (b.1, b.2))
}

/// The n − 1 merges for `m`, in the order the chain found them.
pub(crate) fn merges(m: &CommMatrix) -> Vec<Merge> {
    let n = m.len();
    let mut w = Work {
        n,
        sum: m.entries().to_vec(),
        size: vec![1; n],
        alive: (0..n).collect(),
    };
    let mut made_by: Vec<Option<usize>> = vec![None; n];
    let mut out = Vec::with_capacity(n.saturating_sub(1));
    let mut chain: Vec<usize> = Vec::new();
    while w.alive.len() > 1 {
        let Some(&x) = chain.last() else {
            chain.push(w.alive[0]);
            continue;
        };
        let y = w.best_partner(x);
        if chain.len() < 2 || chain[chain.len() - 2] != y {
            chain.push(y);
            continue;
        }
        let (p, q) = (x.min(y), x.max(y));
        out.push(Merge {
            p,
            q,
            d: w.d(p, q),
            left: made_by[p],
            right: made_by[q],
        });
        made_by[p] = Some(out.len() - 1);
        w.merge(p, q);
        // With exact arithmetic neither appears below the top two; should rounding ever break
        // reducibility, drop the chain from there rather than follow a stale subtree.
        let cut = chain.iter().position(|&c| c == p || c == q).unwrap_or(0);
        chain.truncate(cut);
    }
    out
}

/// Current subtrees: each lives in the slot of its smallest task.
struct Work {
    n: usize,
    /// sum[a*n + c]: total CE between the subtrees in slots a and c (symmetric).
    sum: Vec<f64>,
    size: Vec<usize>,
    /// Occupied slots, ascending.
    alive: Vec<usize>,
}

impl Work {
    /// Eq. 1 between the subtrees in slots a and c.
    fn d(&self, a: usize, c: usize) -> f64 {
        self.sum[a * self.n + c] / (self.size[a] as f64 * self.size[c] as f64)
    }

    /// The pair (a, c) as an ordering key.
    fn key(&self, a: usize, c: usize) -> (f64, usize, usize) {
        (self.d(a, c), a.min(c), a.max(c))
    }

    /// The first pair of slot a under [`before`] (there are at least two subtrees).
    fn best_partner(&self, a: usize) -> usize {
        let mut best: Option<(usize, (f64, usize, usize))> = None;
        for &c in &self.alive {
            if c != a {
                let k = self.key(a, c);
                if !matches!(best, Some((_, bk)) if !before(k, bk)) {
                    best = Some((c, k));
                }
            }
        }
        best.expect("best_partner needs two subtrees").0
    }

    /// Merge slot q into slot p (p < q).
    fn merge(&mut self, p: usize, q: usize) {
        let n = self.n;
        for &c in &self.alive {
            if c != p && c != q {
                let s = self.sum[p * n + c] + self.sum[q * n + c];
                self.sum[p * n + c] = s;
                self.sum[c * n + p] = s;
            }
        }
        self.size[p] += self.size[q];
        let at = self.alive.binary_search(&q).expect("q is alive");
        self.alive.remove(at);
    }
}
