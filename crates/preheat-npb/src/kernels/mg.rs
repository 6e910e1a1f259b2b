//! `mg`: stand-in for NPB MG (and LU) — regular nearest-neighbour halo exchange.
//!
//! NPB MG relaxes a 3-D grid partitioned among threads, which read their neighbours' boundary
//! planes between sweeps. Here each rank owns a private 1-D ring-shaped grid of 128 KiB and
//! relaxes it with an in-place integer three-point stencil (Gauss–Seidel order, wrapping
//! arithmetic so values never settle). The ranks of an instance form a ring; per iteration a
//! rank
//!
//! 1. relaxes `work` windows of [`UNIT`] grid points,
//! 2. writes its boundary ([`SLOT_WORDS`] words) into the mailbox with each ring neighbour
//!    (its right boundary towards `rank + 1`, its left towards `rank − 1`),
//! 3. waits at the barrier, folds each neighbour's halo into its own boundary, and
//! 4. waits at the barrier again (so nobody overwrites a halo still being read).
//!
//! Differences from NPB: one dimension, one level (no V-cycle), integers, private grids
//! instead of a shared array; only the who-talks-to-whom and the two barriers per step match.

use std::ops::Range;

use rand::Rng;

use super::{fold, rank_rng, Outcome, RankSpec};
use crate::exchange::Exchange;
use crate::layout::{PAGE_WORDS, SLOT_WORDS};
use crate::pattern::Link;
use crate::private::Private;

/// Grid points per rank (128 KiB).
pub const GRID: usize = 32 * PAGE_WORDS;
/// Grid points relaxed per compute unit (≈ 1 µs).
pub const UNIT: usize = 768;

/// Allocate the rank's grid and fill it from the rank's seed.
pub fn setup(spec: &RankSpec, links: &[Link]) -> Private {
    let mut p = Private::new(links, GRID);
    let mut rng = rank_rng(spec);
    for w in &mut p.data_mut()[..GRID] {
        *w = rng.gen();
    }
    p
}

/// Relax the `UNIT` points starting at `from`, wrapping around the end of the grid.
fn relax(g: &mut [u64], from: usize) {
    let n = g.len();
    let mut left = g[(from + n - 1) % n];
    let end = from + UNIT;
    for (lo, hi) in [(from, end.min(n)), (0, end.saturating_sub(n))] {
        for i in lo..hi {
            let right = if i + 1 == n { g[0] } else { g[i + 1] };
            let v = (left >> 1)
                .wrapping_add(right >> 1)
                .wrapping_add(g[i].wrapping_mul(0x2545_f491_4f6c_dd1d))
                .rotate_left(17);
            g[i] = v;
            left = v;
        }
    }
}

/// The part of the grid exchanged with `link`'s partner.
fn boundary(link: Link, right: usize) -> Range<usize> {
    if link.partner == right {
        GRID - SLOT_WORDS..GRID
    } else {
        0..SLOT_WORDS
    }
}

/// Iterate to the limit.
pub fn run(spec: &RankSpec, p: &mut Private, x: &mut Exchange) -> Outcome {
    let right = (spec.rank + 1) % spec.ranks;
    let mut cursor = 0;
    let mut k = 0u64;
    loop {
        let parity = (k & 1) as usize;
        let grid = &mut p.data_mut()[..GRID];
        for _ in 0..spec.work {
            relax(grid, cursor);
            cursor = (cursor + UNIT) % GRID;
        }
        for l in 0..p.link_count() {
            let link = p.link(l);
            x.send(link, parity, &p.data()[boundary(link, right)]);
        }
        x.barrier();
        for l in 0..p.link_count() {
            let link = p.link(l);
            let halo = &mut p.data_mut()[boundary(link, right)];
            x.receive(link, parity, |i, w| {
                halo[i] = halo[i].wrapping_add(w.rotate_left(7));
            });
        }
        x.propose_stop(k);
        x.barrier();
        if x.finished(k) {
            break;
        }
        k += 1;
    }
    Outcome {
        iterations: k + 1,
        checksum: fold(&p.data()[..GRID]),
    }
}
