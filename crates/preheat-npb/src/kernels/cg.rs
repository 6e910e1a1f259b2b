//! `cg`: stand-in for NPB CG — irregular, sparse exchange among a fixed subset of ranks.
//!
//! NPB CG runs conjugate-gradient iterations on a random sparse matrix; its sparse
//! matrix–vector products make each thread read vector parts owned by an irregular set of
//! other threads. Here each rank owns a private vector of [`XN`] words and a private sparse
//! structure (four seeded random column indices per row) and does integer "products"
//! (gathers through the column indices). The ranks it exchanges with are a seeded random
//! subset of its instance ([`crate::pattern::Pattern::sparse`]). Per iteration a rank
//!
//! 1. runs `work` units of [`ROWS_PER_UNIT`] sparse rows,
//! 2. sends each partner the vector part that partner owns (`SLOT_WORDS` words at
//!    `partner · SLOT_WORDS mod XN`),
//! 3. waits at the barrier — the only one per iteration, which is why the mailboxes are
//!    double-buffered by iteration parity — and adds what it received into its own part.
//!
//! Differences from NPB: no reductions, no convergence, integers; only the irregular,
//! seeded-random and fixed partner pattern and the one-barrier rhythm match.

use std::ops::Range;

use rand::Rng;

use super::{fold, rank_rng, Outcome, RankSpec};
use crate::exchange::Exchange;
use crate::layout::{PAGE_WORDS, SLOT_WORDS};
use crate::pattern::Link;
use crate::private::Private;

/// Vector words per rank (64 KiB); the sparse structure takes as many again.
pub const XN: usize = 16 * PAGE_WORDS;
/// Sparse rows (four gathers each) per compute unit (≈ 1 µs).
pub const ROWS_PER_UNIT: usize = 512;
/// Bits of one packed column index.
const COL_BITS: u32 = 16;

/// Allocate the vector and sparse structure and fill them from the rank's seed.
pub fn setup(spec: &RankSpec, links: &[Link]) -> Private {
    let mut p = Private::new(links, 2 * XN);
    let mut rng = rank_rng(spec);
    let (x, cols) = p.data_mut().split_at_mut(XN);
    for w in x.iter_mut() {
        *w = rng.gen();
    }
    for w in cols[..XN].iter_mut() {
        *w = (0..4).fold(0u64, |acc, j| {
            acc | (rng.gen_range(0..XN as u64) << (j * COL_BITS))
        });
    }
    p
}

/// Run `ROWS_PER_UNIT` sparse rows starting at row `from`.
fn rows(x: &mut [u64], cols: &[u64], from: usize) {
    let mask = (1u64 << COL_BITS) - 1;
    for r in from..from + ROWS_PER_UNIT {
        let c = cols[r];
        let s = x[(c & mask) as usize]
            .wrapping_add(x[((c >> COL_BITS) & mask) as usize].wrapping_mul(3))
            .wrapping_add(x[((c >> (2 * COL_BITS)) & mask) as usize].wrapping_mul(5))
            .wrapping_add(x[(c >> (3 * COL_BITS)) as usize].wrapping_mul(7));
        x[r] = x[r].rotate_left(5) ^ s;
    }
}

/// The vector part owned by `rank`.
fn part(rank: usize) -> Range<usize> {
    let start = rank * SLOT_WORDS % XN;
    start..start + SLOT_WORDS
}

/// Iterate to the limit.
pub fn run(spec: &RankSpec, p: &mut Private, x: &mut Exchange) -> Outcome {
    let mut cursor = 0;
    let mut k = 0u64;
    loop {
        let parity = (k & 1) as usize;
        let (vec, cols) = p.data_mut().split_at_mut(XN);
        for _ in 0..spec.work {
            rows(vec, cols, cursor);
            cursor = (cursor + ROWS_PER_UNIT) % XN;
        }
        for l in 0..p.link_count() {
            let link = p.link(l);
            x.send(link, parity, &p.data()[part(link.partner)]);
        }
        x.propose_stop(k);
        x.barrier();
        for l in 0..p.link_count() {
            let link = p.link(l);
            let mine = &mut p.data_mut()[part(spec.rank)];
            x.receive(link, parity, |i, w| mine[i] = mine[i].wrapping_add(w));
        }
        if x.finished(k) {
            break;
        }
        k += 1;
    }
    Outcome {
        iterations: k + 1,
        checksum: fold(&p.data()[..XN]),
    }
}
