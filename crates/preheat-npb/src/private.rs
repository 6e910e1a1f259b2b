//! A rank's private pages: its working data and its copy of its communication plan.
//!
//! NPB keeps each OpenMP thread's work on slices of shared arrays; here each rank owns its data
//! outright, in pages no other thread touches, allocated by the rank's own thread (so even the
//! first-touch page faults are its own). The plan — the rank's mailbox links — is copied into
//! the first page(s) of the same buffer, so the iteration loop reads nothing that the main
//! thread or another rank allocated (a small `Vec` could share a heap page with another
//! thread's data, which a page-level detector would report as communication).

use std::ops::Range;

use crate::layout::{Pages, MIN_REGION_PAGES, PAGE_WORDS};
use crate::pattern::Link;

/// Bit position of the edge index in an encoded link.
const EDGE_SHIFT: u32 = 32;
/// Bit position of the side in an encoded link (partner below it).
const SIDE_SHIFT: u32 = 31;

/// One rank's private buffer: plan pages, then data pages (at least 128 KiB of data).
#[derive(Debug)]
pub struct Private {
    pages: Pages<u64>,
    links: usize,
    plan_words: usize,
}

fn encode(l: Link) -> u64 {
    assert!(l.partner < 1 << SIDE_SHIFT && l.side < 2);
    ((l.edge as u64) << EDGE_SHIFT) | ((l.side as u64) << SIDE_SHIFT) | l.partner as u64
}

fn decode(w: u64) -> Link {
    Link {
        partner: (w & ((1 << SIDE_SHIFT) - 1)) as usize,
        side: ((w >> SIDE_SHIFT) & 1) as usize,
        edge: (w >> EDGE_SHIFT) as usize,
    }
}

impl Private {
    /// A zeroed buffer holding `links` and at least `data_words` words of data (rounded up to
    /// whole pages, at least [`MIN_REGION_PAGES`] of them). Call it on the rank's own thread.
    pub fn new(links: &[Link], data_words: usize) -> Private {
        let plan_pages = links.len().div_ceil(PAGE_WORDS).max(1);
        let data_pages = data_words.div_ceil(PAGE_WORDS).max(MIN_REGION_PAGES);
        let mut pages = Pages::new(plan_pages + data_pages, || 0u64);
        for (w, &l) in pages.words_mut().iter_mut().zip(links) {
            *w = encode(l);
        }
        Private {
            pages,
            links: links.len(),
            plan_words: plan_pages * PAGE_WORDS,
        }
    }

    /// Number of links in the plan.
    pub fn link_count(&self) -> usize {
        self.links
    }

    /// Link `k` of the plan (`k < link_count()`).
    pub fn link(&self, k: usize) -> Link {
        assert!(k < self.links);
        decode(self.pages.words()[k])
    }

    /// The data words.
    pub fn data(&self) -> &[u64] {
        &self.pages.words()[self.plan_words..]
    }

    /// The data words, mutably.
    pub fn data_mut(&mut self) -> &mut [u64] {
        let plan = self.plan_words;
        &mut self.pages.words_mut()[plan..]
    }

    /// Address range of the whole buffer (plan and data).
    pub fn addr_range(&self) -> Range<usize> {
        self.pages.addr_range()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_round_trips_and_data_is_big_enough() {
        let links = [
            Link {
                partner: 3,
                edge: 7,
                side: 1,
            },
            Link {
                partner: 0,
                edge: 70_000,
                side: 0,
            },
        ];
        let mut p = Private::new(&links, 100);
        assert_eq!(p.link_count(), 2);
        assert_eq!((p.link(0), p.link(1)), (links[0], links[1]));
        assert!(p.data().len() >= MIN_REGION_PAGES * PAGE_WORDS);
        p.data_mut()[0] = 5;
        assert_eq!(p.data()[0], 5);
        assert_eq!(p.addr_range().start % crate::layout::PAGE_BYTES, 0);
    }
}
