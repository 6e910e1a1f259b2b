//! `ep`: stand-in for NPB EP — embarrassingly parallel, no sharing at all.
//!
//! NPB EP generates pairs of uniform random numbers, turns the pairs inside the unit circle
//! into Gaussian deviates (Marsaglia's polar method) and counts them in square annuli; threads
//! only combine their sums at the very end. Here each rank does the same on private pages:
//! per compute unit it fills a private buffer with [`PAIRS_PER_UNIT`] pairs from its own
//! generator, then transforms and counts them. There is no barrier and no shared page during
//! the run; each rank checks its own iteration count or clock, and the sums leave the thread
//! only through its join handle.
//!
//! Differences from NPB: a 64-bit LCG instead of NPB's 46-bit `randlc`, and much smaller
//! batches; the numerics are otherwise the same idea.

use rand::Rng;

use super::{lcg, mix, rank_rng, Outcome, RankSpec};
use crate::exchange::Exchange;
use crate::layout::PAGE_WORDS;
use crate::pattern::Link;
use crate::private::Private;

/// Uniform pairs generated and transformed per compute unit (≈ 1 µs).
pub const PAIRS_PER_UNIT: usize = 52;
/// Words of the private pair buffer (128 KiB; units cycle through it).
const BUFFER: usize = 32 * PAGE_WORDS;
/// Number of annuli counted.
const ANNULI: usize = 10;

/// Allocate the pair buffer and the annulus counters, seed the generator state.
pub fn setup(spec: &RankSpec, links: &[Link]) -> Private {
    let mut p = Private::new(links, BUFFER + ANNULI + 1);
    p.data_mut()[BUFFER + ANNULI] = rank_rng(spec).gen::<u64>() | 1;
    p
}

/// Unit-interval double from a generator word (53 random bits).
fn uniform(w: u64) -> f64 {
    (w >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// Iterate to the limit.
pub fn run(spec: &RankSpec, p: &mut Private, x: &mut Exchange) -> Outcome {
    let (buffer, rest) = p.data_mut().split_at_mut(BUFFER);
    let (annuli, state) = rest.split_at_mut(ANNULI);
    let state = &mut state[0];
    let (mut sx, mut sy) = (0.0f64, 0.0f64);
    let mut cursor = 0;
    let mut done = 0u64;
    loop {
        for _ in 0..spec.work {
            if cursor + 2 * PAIRS_PER_UNIT > BUFFER {
                cursor = 0;
            }
            let window = &mut buffer[cursor..cursor + 2 * PAIRS_PER_UNIT];
            for w in window.iter_mut() {
                *w = lcg(state);
            }
            for pair in window.chunks_exact(2) {
                let a = 2.0 * uniform(pair[0]) - 1.0;
                let b = 2.0 * uniform(pair[1]) - 1.0;
                let t = a * a + b * b;
                if t <= 1.0 && t > 0.0 {
                    let f = (-2.0 * t.ln() / t).sqrt();
                    let (gx, gy) = (a * f, b * f);
                    let l = gx.abs().max(gy.abs()) as usize;
                    annuli[l.min(ANNULI - 1)] += 1;
                    sx += gx;
                    sy += gy;
                }
            }
            cursor += 2 * PAIRS_PER_UNIT;
        }
        done += 1;
        if x.limit().reached(done, x.started()) {
            break;
        }
    }
    let checksum = annuli
        .iter()
        .fold(mix(sx.to_bits(), sy.to_bits()), |h, &c| mix(h, c));
    Outcome {
        iterations: done,
        checksum,
    }
}
