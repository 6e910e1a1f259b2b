//! The per-instance barrier and stop word, living on the instance's barrier page.
//!
//! NPB's OpenMP kernels synchronise with the runtime's barriers, whose waiters spin before they
//! sleep; that spinning is what makes coscheduling matter (a descheduled rank stalls all
//! others). This stand-in is a centralised sense-reversing barrier on atomics: waiters spin a
//! few rounds and then `yield_now`, never sleep in the kernel, so a waiting rank keeps using
//! its CPU as an OpenMP rank does. No futex, no `std::sync::Barrier` (whose mutex would live
//! in heap memory outside the instance's pages).
//!
//! The page also holds the *stop word* for `--seconds` runs: the last iteration every rank
//! performs, published by rank 0 (see [`Barrier::publish_stop`]). Everything here is on the
//! barrier page of one instance, so barrier traffic is sharing among that instance's ranks only.

use std::sync::atomic::{AtomicU64, Ordering};

/// Word offsets on the barrier page; one cache line apart so arrivals do not slow the
/// waiters' polling more than necessary.
const COUNT: usize = 0;
const GENERATION: usize = 8;
const STOP_AFTER: usize = 16;

/// Value of the stop word while no last iteration is decided.
pub const NEVER: u64 = u64::MAX;

/// Spins with `spin_loop` before a waiter starts yielding its CPU.
const SPINS_BEFORE_YIELD: u32 = 64;

/// Initialise a barrier page (called once, before any rank runs).
pub fn init(page: &[AtomicU64]) {
    page[COUNT].store(0, Ordering::Relaxed);
    page[GENERATION].store(0, Ordering::Relaxed);
    page[STOP_AFTER].store(NEVER, Ordering::Relaxed);
}

/// Barrier phases completed so far on an initialised barrier `page`: the generation counter,
/// read without ordering (a progress report, not a synchronisation).
pub fn phases(page: &[AtomicU64]) -> u64 {
    page[GENERATION].load(Ordering::Relaxed)
}

/// A view of one instance's barrier page for `ranks` participants.
#[derive(Debug, Clone, Copy)]
pub struct Barrier<'a> {
    page: &'a [AtomicU64],
    ranks: u64,
}

impl<'a> Barrier<'a> {
    /// Use `page` (initialised with [`init`]) as the barrier of `ranks` ranks.
    pub fn new(page: &'a [AtomicU64], ranks: usize) -> Barrier<'a> {
        assert!(page.len() > STOP_AFTER && ranks > 0);
        Barrier {
            page,
            ranks: ranks as u64,
        }
    }

    /// The words this barrier touches (for page accounting).
    pub fn page(&self) -> &'a [AtomicU64] {
        self.page
    }

    /// Wait until all ranks have called `wait` for the current round. Every write a rank made
    /// before its call is visible to every rank after theirs.
    pub fn wait(&self) {
        let generation = &self.page[GENERATION];
        let seen = generation.load(Ordering::Acquire);
        // The generation cannot advance before this rank arrives, so `seen` is this round's.
        if self.page[COUNT].fetch_add(1, Ordering::AcqRel) + 1 == self.ranks {
            self.page[COUNT].store(0, Ordering::Relaxed);
            // Release publishes the reset and every arrival (the fetch_adds form one release
            // sequence that the last arriver acquired).
            generation.store(seen.wrapping_add(1), Ordering::Release);
            return;
        }
        let mut spins = 0u32;
        while generation.load(Ordering::Acquire) == seen {
            if spins < SPINS_BEFORE_YIELD {
                spins += 1;
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }

    /// Publish `last` as the last iteration, unless one is already published. Rank 0 calls it
    /// during iteration `k` with `last = k + 1`, before that iteration's final barrier: any rank
    /// reading the word after a barrier then sees either [`NEVER`] or `k + 1`, both consistent
    /// with having run only up to `k`, so all ranks stop after the same iteration.
    pub fn publish_stop(&self, last: u64) {
        let _ = self.page[STOP_AFTER].compare_exchange(
            NEVER,
            last,
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
    }

    /// The published last iteration, or [`NEVER`].
    pub fn stop_after(&self) -> u64 {
        self.page[STOP_AFTER].load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::Region;
    use std::sync::atomic::AtomicU64;

    #[test]
    fn barrier_orders_writes_across_rounds() {
        let region = Region::new(0, 0);
        let data: Vec<AtomicU64> = (0..4).map(|_| AtomicU64::new(0)).collect();
        let barrier = Barrier::new(region.barrier_page(), 4);
        std::thread::scope(|s| {
            for r in 0..4 {
                let data = &data;
                s.spawn(move || {
                    for round in 1..=200u64 {
                        data[r].store(round, Ordering::Relaxed);
                        barrier.wait();
                        for d in data.iter() {
                            assert_eq!(d.load(Ordering::Relaxed), round);
                        }
                        barrier.wait();
                    }
                });
            }
        });
    }

    #[test]
    fn stop_is_published_once() {
        let region = Region::new(0, 0);
        let b = Barrier::new(region.barrier_page(), 1);
        assert_eq!(b.stop_after(), NEVER);
        b.publish_stop(5);
        b.publish_stop(9);
        assert_eq!(b.stop_after(), 5);
        b.wait();
        b.wait();
        assert_eq!(phases(region.barrier_page()), 2);
    }
}
