//! Page-granular memory: the rule that makes the sharing truth exact.
//!
//! A page-level communication detector (SPCD, Busse et al. §3; ours samples pages by revoking
//! access with `mprotect`) sees two threads communicate whenever both touch the same 4 KiB page.
//! NPB itself lets unrelated arrays share pages; these stand-ins do not. Every buffer here is an
//! over-allocated `Vec` whose used part starts at the first page boundary and is a whole number
//! of pages, so no other allocation can sit on a used page, whatever the allocator does.
//!
//! An instance's shared [`Region`] is laid out as:
//!
//! | page | content | touched by |
//! |---|---|---|
//! | 0 | the instance's barrier and its stop word ([`crate::barrier`]) | every rank of the instance |
//! | 1 + e·(1 + x) | the mailbox of pattern edge `e = (a, b)`, `a < b` | exactly ranks `a` and `b` |
//! | the next x | the edge's shared pages (`--shared-pages x`, default 0) | exactly ranks `a` and `b` |
//! | rest | padding up to [`MIN_REGION_PAGES`] (never touched) | nobody |
//!
//! A mailbox page holds [`SLOT_WORDS`] words per (parity, side): words
//! `parity·2·SLOT_WORDS + side·SLOT_WORDS ..`. Side 0 belongs to the lower rank. Each rank writes
//! its own side and reads its partner's, so each mailbox page is written *and* read by exactly
//! its pair. The parity (iteration number mod 2) double-buffers kernels with one barrier per
//! iteration.
//!
//! A mailbox is one page, so a pair shares one page (and the barrier page): little for a
//! sampling detector to find. `x` shared pages per edge grow what a pair shares without
//! changing the kernel: with every send a rank also writes one line of its side
//! ([`SHARED_SIDE_WORDS`]) on each of them, and with every receive reads its partner's, so
//! each is written and read by exactly the pair, every iteration.

use std::ops::Range;
use std::sync::atomic::AtomicU64;

/// Bytes per page (the detector's granularity).
pub const PAGE_BYTES: usize = 4096;
/// 64-bit words per page.
pub const PAGE_WORDS: usize = PAGE_BYTES / 8;
/// Smallest region or private buffer, in pages: 128 KiB, glibc's default mmap threshold, so a
/// region normally also gets its own mapping.
pub const MIN_REGION_PAGES: usize = 32;
/// Words one rank sends one partner per iteration (one quarter page).
pub const SLOT_WORDS: usize = PAGE_WORDS / 4;
/// Page index of the barrier inside a region.
pub const BARRIER_PAGE: usize = 0;
/// Word offset of side 1's line on a shared page (side 0's is at 0): half a page apart.
pub const SHARED_SIDE_WORDS: usize = PAGE_WORDS / 2;

/// A page-aligned run of whole pages of 8-byte elements inside one over-allocated `Vec`.
#[derive(Debug)]
pub struct Pages<T> {
    buf: Vec<T>,
    start: usize,
    len: usize,
}

impl<T> Pages<T> {
    /// `pages` whole pages, each element made by `fill`. The `Vec` gets one extra page so the
    /// used part can start at a page boundary.
    pub fn new(pages: usize, mut fill: impl FnMut() -> T) -> Pages<T> {
        assert_eq!(std::mem::size_of::<T>(), 8, "Pages holds 8-byte words");
        let len = pages * PAGE_WORDS;
        let buf: Vec<T> = (0..len + PAGE_WORDS).map(|_| fill()).collect();
        let addr = buf.as_ptr() as usize;
        let start = (PAGE_BYTES - addr % PAGE_BYTES) % PAGE_BYTES / 8;
        Pages { buf, start, len }
    }

    /// The used, page-aligned words.
    pub fn words(&self) -> &[T] {
        &self.buf[self.start..self.start + self.len]
    }

    /// The used, page-aligned words, mutably.
    pub fn words_mut(&mut self) -> &mut [T] {
        &mut self.buf[self.start..self.start + self.len]
    }

    /// Address range of the used part (page-aligned at both ends).
    pub fn addr_range(&self) -> Range<usize> {
        let a = self.words().as_ptr() as usize;
        a..a + self.len * 8
    }
}

/// Page index of the mailbox of edge `edge` inside a region whose edges have `extra` shared
/// pages each (they follow the mailbox).
pub fn pair_page(edge: usize, extra: usize) -> usize {
    1 + edge * (1 + extra)
}

/// Pages of a region holding `edges` mailboxes of `extra` shared pages each.
pub fn region_pages(edges: usize, extra: usize) -> usize {
    (1 + edges * (1 + extra)).max(MIN_REGION_PAGES)
}

/// Word offset, inside a region, of the slot of `side` for `parity` in the mailbox of `edge`.
pub fn slot_offset(edge: usize, extra: usize, side: usize, parity: usize) -> usize {
    debug_assert!(side < 2 && parity < 2);
    pair_page(edge, extra) * PAGE_WORDS + (parity * 2 + side) * SLOT_WORDS
}

/// Word offsets, inside a region, of `side`'s line on each of the `extra` shared pages of
/// `edge`.
pub fn shared_offsets(edge: usize, extra: usize, side: usize) -> impl Iterator<Item = usize> {
    debug_assert!(side < 2);
    let first = pair_page(edge, extra) + 1;
    (first..first + extra).map(move |p| p * PAGE_WORDS + side * SHARED_SIDE_WORDS)
}

/// The page addresses spanned by `words`.
pub fn pages_of<T>(words: &[T]) -> Range<usize> {
    let a = words.as_ptr() as usize;
    let end = a + std::mem::size_of_val(words);
    a / PAGE_BYTES * PAGE_BYTES..end.div_ceil(PAGE_BYTES) * PAGE_BYTES
}

/// The shared memory of one instance: barrier page, mailbox pages, padding.
#[derive(Debug)]
pub struct Region {
    pages: Pages<AtomicU64>,
    edges: usize,
    extra: usize,
}

impl Region {
    /// A zeroed region for `edges` mailboxes of `extra` shared pages each, barrier
    /// initialised. Allocated (and so touched) by the calling thread, which is the main thread
    /// before any worker runs.
    pub fn new(edges: usize, extra: usize) -> Region {
        let pages = Pages::new(region_pages(edges, extra), || AtomicU64::new(0));
        let region = Region {
            pages,
            edges,
            extra,
        };
        crate::barrier::init(region.barrier_page());
        region
    }

    /// All words of the region.
    pub fn words(&self) -> &[AtomicU64] {
        self.pages.words()
    }

    /// The barrier page.
    pub fn barrier_page(&self) -> &[AtomicU64] {
        let w = self.words();
        &w[BARRIER_PAGE * PAGE_WORDS..(BARRIER_PAGE + 1) * PAGE_WORDS]
    }

    /// Number of mailboxes.
    pub fn edges(&self) -> usize {
        self.edges
    }

    /// Shared pages per mailbox (beyond the mailbox page).
    pub fn extra(&self) -> usize {
        self.extra
    }

    /// Address range of the whole region.
    pub fn addr_range(&self) -> Range<usize> {
        self.pages.addr_range()
    }

    /// Address of page `page` of the region.
    pub fn page_addr(&self, page: usize) -> usize {
        self.addr_range().start + page * PAGE_BYTES
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_are_aligned_and_whole() {
        for n in [1, 2, 33] {
            let p: Pages<u64> = Pages::new(n, || 7);
            let r = p.addr_range();
            assert_eq!(r.start % PAGE_BYTES, 0);
            assert_eq!(r.end - r.start, n * PAGE_BYTES);
            assert_eq!(pages_of(p.words()), r);
        }
    }

    #[test]
    fn slots_stay_inside_their_page() {
        for extra in [0, 3] {
            for edge in 0..3 {
                for side in 0..2 {
                    for parity in 0..2 {
                        let o = slot_offset(edge, extra, side, parity);
                        assert_eq!(o / PAGE_WORDS, pair_page(edge, extra));
                        assert_eq!((o + SLOT_WORDS - 1) / PAGE_WORDS, pair_page(edge, extra));
                    }
                }
            }
        }
    }

    #[test]
    fn shared_pages_follow_their_mailbox_and_no_other() {
        let extra = 3;
        let mut owner = vec![None; region_pages(4, extra)];
        for edge in 0..4 {
            owner[pair_page(edge, extra)] = Some(edge);
            for side in 0..2 {
                let pages: Vec<usize> = shared_offsets(edge, extra, side)
                    .map(|o| o / PAGE_WORDS)
                    .collect();
                assert_eq!(pages.len(), extra);
                for p in pages {
                    assert!(owner[p].is_none() || owner[p] == Some(edge), "page {p}");
                    owner[p] = Some(edge);
                }
            }
        }
        // Mailbox and shared pages of the four edges: 4 · (1 + 3) pages after the barrier.
        assert_eq!(owner.iter().flatten().count(), 16);
        assert!(owner[BARRIER_PAGE].is_none());
        assert_eq!(shared_offsets(0, 0, 0).count(), 0);
    }

    #[test]
    fn regions_are_at_least_128_kib() {
        let r = Region::new(2, 0);
        assert!(r.addr_range().len() >= 128 * 1024);
        assert_eq!(Region::new(100, 0).addr_range().len(), 101 * PAGE_BYTES);
        assert_eq!(Region::new(100, 2).addr_range().len(), 301 * PAGE_BYTES);
    }
}
