//! `is`: stand-in for NPB IS — all-to-all exchange of bucketed keys.
//!
//! NPB IS sorts integer keys by bucket: each thread counts its keys per bucket, the bucket
//! counts are exchanged among all threads, and each thread then ranks the keys of the buckets
//! it owns. Here each rank generates keys with its own generator into a private key buffer and
//! counts them into a private histogram of [`SLOT_WORDS`] buckets per destination rank. Per
//! iteration a rank
//!
//! 1. generates and buckets `work` × [`KEYS_PER_UNIT`] keys,
//! 2. writes, into the mailbox it shares with every other rank, that rank's bucket counts,
//! 3. waits at the barrier, adds every rank's counts for its own buckets and ranks them
//!    (prefix sums), and
//! 4. waits at the barrier again.
//!
//! Differences from NPB: keys are never moved (only counts are exchanged), there is no
//! verification, and the key distribution is uniform; the all-to-all sharing and the two
//! barriers per iteration match.

use super::{lcg, mix, rank_rng, Outcome, RankSpec};
use crate::exchange::Exchange;
use crate::layout::{PAGE_WORDS, SLOT_WORDS};
use crate::pattern::Link;
use crate::private::Private;
use rand::Rng;

/// Words of the private key buffer (64 KiB).
pub const KEYS: usize = 16 * PAGE_WORDS;
/// Keys generated and bucketed per compute unit (≈ 1 µs).
pub const KEYS_PER_UNIT: usize = 512;

/// Allocate the key buffer and the histogram (`SLOT_WORDS` buckets per rank).
pub fn setup(spec: &RankSpec, links: &[Link]) -> Private {
    let mut p = Private::new(links, KEYS + spec.ranks * SLOT_WORDS);
    let mut rng = rank_rng(spec);
    for w in &mut p.data_mut()[..KEYS] {
        *w = rng.gen();
    }
    p
}

/// Generate `KEYS_PER_UNIT` keys at `from` and count them into `hist`.
fn bucket(keys: &mut [u64], hist: &mut [u64], ranks: usize, from: usize, state: &mut u64) {
    let window = &mut keys[from..from + KEYS_PER_UNIT];
    for k in window.iter_mut() {
        *k ^= lcg(state);
    }
    for &k in window.iter() {
        let dest = (((k >> 32) * ranks as u64) >> 32) as usize;
        hist[dest * SLOT_WORDS + (k as usize & (SLOT_WORDS - 1))] += 1;
    }
}

/// Iterate to the limit.
pub fn run(spec: &RankSpec, p: &mut Private, x: &mut Exchange) -> Outcome {
    let mut state = p.data()[0] | 1;
    let mut acc = 0u64;
    let mut cursor = 0;
    let mut k = 0u64;
    let mine = spec.rank * SLOT_WORDS..(spec.rank + 1) * SLOT_WORDS;
    loop {
        let parity = (k & 1) as usize;
        let (keys, rest) = p.data_mut().split_at_mut(KEYS);
        let hist = &mut rest[..spec.ranks * SLOT_WORDS];
        hist.fill(0);
        for _ in 0..spec.work {
            bucket(keys, hist, spec.ranks, cursor, &mut state);
            cursor = (cursor + KEYS_PER_UNIT) % KEYS;
        }
        for l in 0..p.link_count() {
            let link = p.link(l);
            let to = KEYS + link.partner * SLOT_WORDS;
            x.send(link, parity, &p.data()[to..to + SLOT_WORDS]);
        }
        x.barrier();
        for l in 0..p.link_count() {
            let link = p.link(l);
            let own = &mut p.data_mut()[KEYS..][mine.clone()];
            x.receive(link, parity, |i, w| own[i] += w);
        }
        let mut prefix = 0u64;
        for &count in &p.data()[KEYS..][mine.clone()] {
            prefix += count;
            acc = mix(acc, prefix);
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
        checksum: acc,
    }
}
