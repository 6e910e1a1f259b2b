//! Who talks to whom: each kernel's designed communication graph, and the truth derived from it.
//!
//! The graph is among the ranks of one instance; every instance of a run has the same graph
//! (the same program on the same input, as with the paper's identical NAS instances). Each edge
//! is one mailbox page ([`crate::layout`]):
//!
//! * `mg` (NPB MG/LU: nearest-neighbour halo exchange) — a ring, rank `r` with `r ± 1 mod n`;
//!   with two ranks a single edge, with three the ring is all-to-all.
//! * `cg` (NPB CG: irregular sparse exchange) — each rank picks, from a seeded generator,
//!   between 1 and `max(1, (n − 1) / 2)` distinct partners; edges are the symmetric union.
//! * `is` (NPB IS: all-to-all key exchange) — every pair.
//! * `ep` (NPB EP: embarrassingly parallel) — none, and no barrier either.
//!
//! Thread `j` of a run is rank `j mod n` of instance `j / n` (`n` ranks per instance).

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::spec::Kernel;

/// One rank's end of an edge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Link {
    /// The other rank.
    pub partner: usize,
    /// Index of the edge, i.e. of its mailbox page.
    pub edge: usize,
    /// This rank's side of the mailbox: 0 if it is the lower rank.
    pub side: usize,
}

/// The communication graph among the ranks of one instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pattern {
    ranks: usize,
    edges: Vec<(usize, usize)>,
}

impl Pattern {
    /// The graph of `kernel` for `ranks` ranks; `seed` matters only for `cg`.
    pub fn for_kernel(kernel: Kernel, ranks: usize, seed: u64) -> Pattern {
        match kernel {
            Kernel::Mg => Pattern::ring(ranks),
            Kernel::Cg => Pattern::sparse(ranks, seed),
            Kernel::Is => Pattern::all_to_all(ranks),
            Kernel::Ep => Pattern::from_edges(ranks, Vec::new()),
        }
    }

    fn from_edges(ranks: usize, mut edges: Vec<(usize, usize)>) -> Pattern {
        for e in &mut edges {
            *e = (e.0.min(e.1), e.0.max(e.1));
            assert!(e.0 != e.1 && e.1 < ranks, "bad edge {e:?}");
        }
        edges.sort_unstable();
        edges.dedup();
        Pattern { ranks, edges }
    }

    /// Rank `r` with `r + 1 mod n` for every `r` (duplicates merged).
    pub fn ring(ranks: usize) -> Pattern {
        let edges = if ranks < 2 {
            Vec::new()
        } else {
            (0..ranks).map(|r| (r, (r + 1) % ranks)).collect()
        };
        Pattern::from_edges(ranks, edges)
    }

    /// Every pair of ranks.
    pub fn all_to_all(ranks: usize) -> Pattern {
        let edges = (0..ranks)
            .flat_map(|a| (a + 1..ranks).map(move |b| (a, b)))
            .collect();
        Pattern::from_edges(ranks, edges)
    }

    /// Each rank with a seeded random subset of the others (at least one partner each).
    pub fn sparse(ranks: usize, seed: u64) -> Pattern {
        let mut edges = Vec::new();
        if ranks >= 2 {
            let mut rng = StdRng::seed_from_u64(seed ^ 0x6367_5f70_6174_7465);
            let max_degree = ((ranks - 1) / 2).max(1);
            for r in 0..ranks {
                let degree = rng.gen_range(1..=max_degree);
                for i in rand::seq::index::sample(&mut rng, ranks - 1, degree) {
                    let partner = if i >= r { i + 1 } else { i };
                    edges.push((r, partner));
                }
            }
        }
        Pattern::from_edges(ranks, edges)
    }

    /// Ranks per instance.
    pub fn ranks(&self) -> usize {
        self.ranks
    }

    /// The edges `(a, b)`, `a < b`, sorted; the index of an edge is its mailbox page's.
    pub fn edges(&self) -> &[(usize, usize)] {
        &self.edges
    }

    /// The edges at `rank`, in edge order.
    pub fn links(&self, rank: usize) -> Vec<Link> {
        self.edges
            .iter()
            .enumerate()
            .filter_map(|(edge, &(a, b))| {
                if rank == a {
                    Some(Link {
                        partner: b,
                        edge,
                        side: 0,
                    })
                } else if rank == b {
                    Some(Link {
                        partner: a,
                        edge,
                        side: 1,
                    })
                } else {
                    None
                }
            })
            .collect()
    }

    /// Whether every pair of ranks shares a mailbox.
    pub fn is_all_to_all(&self) -> bool {
        self.edges.len() == self.ranks * self.ranks.saturating_sub(1) / 2
    }
}

/// The true coscheduling sets by construction, as global thread indices: one set per instance
/// for the synchronised kernels, every thread alone for `ep`.
pub fn truth(kernel: Kernel, threads: usize, instances: usize) -> Vec<Vec<usize>> {
    let ranks = threads / instances;
    if kernel.synchronised() {
        (0..instances)
            .map(|i| (i * ranks..(i + 1) * ranks).collect())
            .collect()
    } else {
        (0..threads).map(|j| vec![j]).collect()
    }
}

/// Mailbox pages (each with its `extra` shared pages) shared by each pair of threads
/// (`threads × threads`, zero diagonal).
pub fn pair_page_matrix(pattern: &Pattern, instances: usize, extra: usize) -> Vec<Vec<u32>> {
    let per_edge = 1 + extra as u32;
    let ranks = pattern.ranks();
    let threads = ranks * instances;
    let mut m = vec![vec![0u32; threads]; threads];
    for i in 0..instances {
        for &(a, b) in pattern.edges() {
            m[i * ranks + a][i * ranks + b] += per_edge;
            m[i * ranks + b][i * ranks + a] += per_edge;
        }
    }
    m
}

/// The designed page-sharing matrix (`threads × threads`, zero diagonal): 1 where two threads
/// share any page — a mailbox, or the barrier page, which all ranks of a synchronised
/// instance share — else 0. A perfect page-level detector sees exactly this graph;
/// [`pair_page_matrix`] tells the mailbox edges apart from the barrier-only ones.
pub fn pattern_matrix(kernel: Kernel, pattern: &Pattern, instances: usize) -> Vec<Vec<u8>> {
    let ranks = pattern.ranks();
    let pairs = pair_page_matrix(pattern, instances, 0);
    let threads = ranks * instances;
    (0..threads)
        .map(|x| {
            (0..threads)
                .map(|y| {
                    let barrier = kernel.synchronised() && x != y && x / ranks == y / ranks;
                    u8::from(barrier || pairs[x][y] > 0)
                })
                .collect()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_shapes() {
        assert!(Pattern::ring(1).edges().is_empty());
        assert_eq!(Pattern::ring(2).edges(), &[(0, 1)]);
        assert!(Pattern::ring(3).is_all_to_all());
        let r4 = Pattern::ring(4);
        assert_eq!(r4.edges(), &[(0, 1), (0, 3), (1, 2), (2, 3)]);
        assert!(!r4.is_all_to_all());
        let l = r4.links(0);
        assert_eq!(l.iter().map(|l| l.partner).collect::<Vec<_>>(), vec![1, 3]);
        assert_eq!(r4.links(3)[0].side, 1);
    }

    #[test]
    fn sparse_is_seeded_and_connects_every_rank() {
        for n in 2..12 {
            let p = Pattern::sparse(n, 42);
            assert_eq!(p, Pattern::sparse(n, 42));
            for r in 0..n {
                assert!(!p.links(r).is_empty(), "rank {r} of {n} has no partner");
            }
        }
        assert!((0..20).any(|s| !Pattern::sparse(8, s).is_all_to_all()));
    }

    #[test]
    fn truth_and_matrices() {
        assert_eq!(truth(Kernel::Mg, 4, 2), vec![vec![0, 1], vec![2, 3]]);
        assert_eq!(truth(Kernel::Ep, 2, 1), vec![vec![0], vec![1]]);
        let p = Pattern::ring(4);
        let m = pattern_matrix(Kernel::Mg, &p, 2);
        assert_eq!(m[0][2], 1, "barrier-only pair is marked");
        assert_eq!(m[0][4], 0, "instances never share");
        let pp = pair_page_matrix(&p, 2, 0);
        assert_eq!((pp[0][2], pp[0][1], pp[4][7]), (0, 1, 1));
        let e = pattern_matrix(Kernel::Ep, &Pattern::for_kernel(Kernel::Ep, 2, 0), 1);
        assert_eq!(e, vec![vec![0, 0], vec![0, 0]]);
    }
}
