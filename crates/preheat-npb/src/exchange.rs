//! A rank's only door to shared memory: mailbox slots, the barrier, the stop rule.
//!
//! In NPB the exchange is implicit (threads read each other's parts of shared arrays between
//! OpenMP barriers). Here every shared access goes through [`Exchange`], which makes the
//! layout rules of [`crate::layout`] hold by construction and, when asked, records the pages
//! each rank wrote and read ([`PageSets`]) so tests can check them against the design.
//!
//! **Stop rule.** With `--iterations I` every rank knows the last iteration (`I − 1`). With
//! `--seconds S` rank 0 alone watches the clock and publishes the last iteration on the barrier
//! page ([`crate::barrier::Barrier::publish_stop`]); all ranks of the instance then stop after
//! the same iteration, so none is left waiting in a barrier.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use crate::barrier::Barrier;
use crate::layout::{pages_of, shared_offsets, slot_offset, Region, PAGE_BYTES, SLOT_WORDS};
use crate::pattern::Link;
use crate::spec::Limit;

/// The distinct shared pages one rank wrote and read, as page addresses.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PageSets {
    /// Pages the rank stored to (including atomic read-modify-writes).
    pub written: BTreeSet<usize>,
    /// Pages the rank loaded from (including atomic read-modify-writes).
    pub read: BTreeSet<usize>,
}

impl PageSets {
    fn note(set: &mut BTreeSet<usize>, words: &[AtomicU64]) {
        set.extend(pages_of(words).step_by(PAGE_BYTES));
    }
}

/// One rank's handle on its instance's shared region.
#[derive(Debug)]
pub struct Exchange<'a> {
    region: &'a [AtomicU64],
    /// Shared pages per mailbox ([`crate::layout::shared_offsets`]).
    extra: usize,
    barrier: Barrier<'a>,
    rank: usize,
    limit: Limit,
    started: Instant,
    log: Option<PageSets>,
}

impl<'a> Exchange<'a> {
    /// A handle for `rank` on `region`, whose barrier is `barrier`; `trace` turns page
    /// recording on (tests only: it allocates while the kernel runs).
    pub fn new(
        region: &'a Region,
        barrier: Barrier<'a>,
        rank: usize,
        limit: Limit,
        trace: bool,
    ) -> Exchange<'a> {
        Exchange {
            region: region.words(),
            extra: region.extra(),
            barrier,
            rank,
            limit,
            started: Instant::now(),
            log: trace.then(PageSets::default),
        }
    }

    /// Mark the start of the measured run (the `--seconds` clock starts here).
    pub fn start(&mut self) {
        self.started = Instant::now();
    }

    /// When [`Exchange::start`] was called.
    pub fn started(&self) -> Instant {
        self.started
    }

    /// The run limit.
    pub fn limit(&self) -> Limit {
        self.limit
    }

    fn slot(&self, link: Link, side: usize, parity: usize) -> &'a [AtomicU64] {
        let o = slot_offset(link.edge, self.extra, side, parity);
        &self.region[o..o + SLOT_WORDS]
    }

    /// Write `src` (at most [`SLOT_WORDS`] words) into this rank's slot of `link`'s mailbox,
    /// and this rank's line of each of the mailbox's shared pages.
    pub fn send(&mut self, link: Link, parity: usize, src: &[u64]) {
        let slot = self.slot(link, link.side, parity);
        for (d, &s) in slot.iter().zip(src) {
            d.store(s, Ordering::Relaxed);
        }
        let stamp = src.first().copied().unwrap_or(0);
        for o in shared_offsets(link.edge, self.extra, link.side) {
            self.region[o].store(stamp, Ordering::Relaxed);
            if let Some(log) = &mut self.log {
                PageSets::note(&mut log.written, &self.region[o..o + 1]);
            }
        }
        if let Some(log) = &mut self.log {
            PageSets::note(&mut log.written, slot);
        }
    }

    /// Read the partner's slot of `link`'s mailbox, calling `f(i, word)` for each word.
    pub fn receive(&mut self, link: Link, parity: usize, mut f: impl FnMut(usize, u64)) {
        let slot = self.slot(link, 1 - link.side, parity);
        for (i, w) in slot.iter().enumerate() {
            f(i, w.load(Ordering::Relaxed));
        }
        for o in shared_offsets(link.edge, self.extra, 1 - link.side) {
            std::hint::black_box(self.region[o].load(Ordering::Relaxed));
            if let Some(log) = &mut self.log {
                PageSets::note(&mut log.read, &self.region[o..o + 1]);
            }
        }
        if let Some(log) = &mut self.log {
            PageSets::note(&mut log.read, slot);
        }
    }

    /// Wait at the instance barrier.
    pub fn barrier(&mut self) {
        self.barrier.wait();
        if let Some(log) = &mut self.log {
            PageSets::note(&mut log.written, self.barrier.page());
            PageSets::note(&mut log.read, self.barrier.page());
        }
    }

    /// The stop rule's first half: call once in iteration `k`, before its last barrier.
    pub fn propose_stop(&mut self, k: u64) {
        if let Limit::Seconds(d) = self.limit {
            if self.rank == 0 && self.started.elapsed() >= d {
                self.barrier.publish_stop(k + 1);
            }
        }
    }

    /// The stop rule's second half: call after iteration `k`'s last barrier; true if `k` was
    /// the last iteration.
    pub fn finished(&mut self, k: u64) -> bool {
        match self.limit {
            Limit::Iterations(n) => k + 1 >= n,
            Limit::Seconds(_) => {
                if let Some(log) = &mut self.log {
                    PageSets::note(&mut log.read, self.barrier.page());
                }
                k >= self.barrier.stop_after()
            }
        }
    }

    /// The recorded pages, if recording was on.
    pub fn into_pages(self) -> Option<PageSets> {
        self.log
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn mailbox_round_trip_and_pages() {
        let region = Region::new(1, 0);
        let link0 = Link {
            partner: 1,
            edge: 0,
            side: 0,
        };
        let link1 = Link {
            partner: 0,
            edge: 0,
            side: 1,
        };
        let b = Barrier::new(region.barrier_page(), 1);
        let lim = Limit::Iterations(1);
        let mut x0 = Exchange::new(&region, b, 0, lim, true);
        let mut x1 = Exchange::new(&region, b, 1, lim, true);
        x0.send(link0, 1, &[1, 2, 3]);
        let mut got = Vec::new();
        x1.receive(link1, 1, |i, w| {
            if i < 3 {
                got.push(w)
            }
        });
        assert_eq!(got, vec![1, 2, 3]);
        let mailbox = region.page_addr(1);
        let p0 = x0.into_pages().unwrap();
        let p1 = x1.into_pages().unwrap();
        assert_eq!(
            p0.written.iter().copied().collect::<Vec<_>>(),
            vec![mailbox]
        );
        assert_eq!(p1.read.iter().copied().collect::<Vec<_>>(), vec![mailbox]);
    }

    #[test]
    fn shared_pages_are_written_and_read_by_the_pair() {
        // Two edges of two shared pages each; the pair of edge 1 uses pages 4, 5 and 6.
        let region = Region::new(2, 2);
        let link = |side| Link {
            partner: 1 - side,
            edge: 1,
            side,
        };
        let b = Barrier::new(region.barrier_page(), 1);
        let lim = Limit::Iterations(1);
        let mut x0 = Exchange::new(&region, b, 0, lim, true);
        let mut x1 = Exchange::new(&region, b, 1, lim, true);
        x0.send(link(0), 0, &[9]);
        x1.send(link(1), 0, &[8]);
        x0.receive(link(0), 0, |_, _| {});
        x1.receive(link(1), 0, |_, _| {});
        let want: Vec<usize> = (4..7).map(|p| region.page_addr(p)).collect();
        for x in [x0, x1] {
            let p = x.into_pages().unwrap();
            assert_eq!(p.written.iter().copied().collect::<Vec<_>>(), want);
            assert_eq!(p.read.iter().copied().collect::<Vec<_>>(), want);
        }
    }

    #[test]
    fn seconds_limit_stops_one_iteration_later() {
        let region = Region::new(0, 0);
        let b = Barrier::new(region.barrier_page(), 1);
        let mut x = Exchange::new(&region, b, 0, Limit::Seconds(Duration::ZERO), false);
        x.start();
        x.propose_stop(3);
        x.barrier();
        assert!(!x.finished(3));
        assert!(x.finished(4));
    }
}
