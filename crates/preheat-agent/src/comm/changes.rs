//! The last hooked map changes, by generation: which address ranges the calls that changed
//! mappings since a maps snapshot touched, so the sampler can tell whether a page it chose from
//! that snapshot is still what the snapshot said.
//!
//! Every bump of [`state::MAP_GEN`] (a hooked `mmap`/`munmap`/`mprotect`/`mremap`/… beginning,
//! the new range of an `mremap`, its end) goes through [`note`], which records the range it is
//! about in a ring of [`RING`] entries indexed by the generation. Before, the sampler could only
//! see *that* the maps had changed and had to read them again: a program that changes its
//! mappings all the time (an allocator returning memory, a runtime mapping and unmapping
//! buffers) left it no quiet moment, and nothing was ever revoked — measured on the agent's
//! `churn` test program, 0 pages in 39 rounds, 6 runs of 6 on a quiet machine. Now a page is
//! revoked when none of the changes since the snapshot touched it, and only an overwritten or
//! half-written entry sends the sampler back to reading the maps.
//!
//! An entry is written like a sequence lock: generation 0, range, generation. A reader trusts a
//! range only if the generation reads the same before and after it, and only while fewer than
//! [`RING`] changes happened since its snapshot (so no later change can have reused the entry:
//! a writer of generation g + RING bumps the generation to it before writing).
//!
//! Hooked path (the writers run inside the host's calls): no allocation, locks, logging or
//! panics; the lints below check the last part.
#![deny(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects,
    clippy::unreachable,
    clippy::todo,
    clippy::unimplemented
)]

use std::sync::atomic::{AtomicU64, Ordering};

use super::state;

/// Entries in the ring (a power of two): enough for the changes of one maps read and a round's
/// arming in a program that changes its mappings every few microseconds (with 64, the agent's
/// `churn` test program still outran it in half of its runs: measured, 3 of 6). 24 KiB.
pub const RING: u64 = 1024;

struct Entry {
    gen: AtomicU64,
    start: AtomicU64,
    end: AtomicU64,
}

static ENTRIES: [Entry; RING as usize] = [const {
    Entry {
        gen: AtomicU64::new(0),
        start: AtomicU64::new(0),
        end: AtomicU64::new(0),
    }
}; RING as usize];

fn entry(gen: u64) -> Option<&'static Entry> {
    ENTRIES.get((gen % RING) as usize)
}

/// Bump [`state::MAP_GEN`] for a change of `[start, end)` and record the range.
pub fn note(start: usize, end: usize) {
    let g = state::MAP_GEN
        .fetch_add(1, Ordering::SeqCst)
        .wrapping_add(1);
    if let Some(e) = entry(g) {
        e.gen.store(0, Ordering::SeqCst);
        e.start.store(start as u64, Ordering::SeqCst);
        e.end.store(end as u64, Ordering::SeqCst);
        e.gen.store(g, Ordering::SeqCst);
    }
}

/// Whether a change with a generation in `(since, now]` touched `page`: `Some(false)` none did,
/// `Some(true)` one did, `None` unknown (too many changes since, or an entry not yet or no
/// longer readable: read the maps again).
pub fn touched(since: u64, now: u64, page: u64) -> Option<bool> {
    if now < since || now.wrapping_sub(since) >= RING {
        return None;
    }
    let mut hit = false;
    let mut g = since;
    while g < now {
        g = g.wrapping_add(1);
        let e = entry(g)?;
        let before = e.gen.load(Ordering::SeqCst);
        let (start, end) = (e.start.load(Ordering::SeqCst), e.end.load(Ordering::SeqCst));
        if before != g || e.gen.load(Ordering::SeqCst) != g {
            return None;
        }
        hit |= start <= page && page < end;
    }
    // No entry read can have been reused by a later change (see the module docs).
    if state::MAP_GEN.load(Ordering::SeqCst).wrapping_sub(since) >= RING {
        return None;
    }
    Some(hit)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic, clippy::arithmetic_side_effects)]
mod tests {
    use super::*;

    /// One test for the whole ring: the tests of this crate share the process's statics.
    #[test]
    fn changes_since_a_snapshot_are_told_apart() {
        let g0 = state::MAP_GEN.load(Ordering::SeqCst);
        note(0x1000, 0x5000);
        note(0x9000, 0xa000);
        let now = state::MAP_GEN.load(Ordering::SeqCst);
        assert_eq!(now, g0 + 2);
        assert_eq!(touched(g0, now, 0x2000), Some(true));
        assert_eq!(touched(g0, now, 0x9000), Some(true));
        assert_eq!(touched(g0, now, 0x5000), Some(false), "end is exclusive");
        assert_eq!(touched(g0, now, 0x7000), Some(false));
        assert_eq!(touched(now, now, 0x2000), Some(false), "nothing since");
        // Only changes after the snapshot count.
        assert_eq!(touched(g0 + 1, now, 0x2000), Some(false));
        // A half-written entry is unknown.
        entry(now).unwrap().gen.store(0, Ordering::SeqCst);
        assert_eq!(touched(g0, now, 0x7000), None);
        // So is a window longer than the ring.
        for _ in 0..RING {
            note(0x100_0000, 0x100_1000);
        }
        let later = state::MAP_GEN.load(Ordering::SeqCst);
        assert_eq!(touched(g0, later, 0x7000), None);
        assert_eq!(touched(later - 3, later, 0x7000), Some(false));
    }
}
