//! Giving revoked pages back on the host's own calls: a hooked call that changes mappings
//! ([`MapChange`]) or failed with `EFAULT` on a revoked page ([`efault_retry`]), and keeping
//! SIGSEGV unblocked ([`strip_segv`]).
//!
//! Hooked path (see the crate docs): called from the interposed functions on the host's
//! threads, so nothing here allocates, locks, logs or panics; the lints below make the compiler
//! check the last part.
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

use std::sync::atomic::Ordering;

use super::state::{self, ARMED, ARMED_COUNT, BUSY, COUNTERS, FREE, OPEN, PAGE, SLOTS};
use super::{changes, signal};

/// What a hooked map change does with a revoked page in its range.
#[derive(Clone, Copy)]
pub enum Release {
    /// Put the page's original protection back (before the program's call changes it).
    Restore,
    /// A new mapping with this protection now lives there: give the page that protection
    /// (the page may have been revoked after the mapping appeared) and forget it.
    NewMapping(i32),
}

/// A hooked call that changes mappings, from before its real call until after it (drop).
/// While one exists the sampler revokes nothing new (see `sampler::arm`).
pub struct MapChange {
    active: bool,
    /// The range announced at the start (noted again at the end: `super::changes`).
    start: usize,
    end: usize,
}

impl MapChange {
    /// Announce a change and give back every revoked page in `[start, start + len)`.
    pub fn begin(start: usize, len: usize, how: Release) -> MapChange {
        let end = start.saturating_add(len);
        if !signal::INSTALLED.load(Ordering::Relaxed) {
            return MapChange {
                active: false,
                start,
                end,
            };
        }
        state::MAP_BUSY.fetch_add(1, Ordering::SeqCst);
        changes::note(start, end);
        release_range(start, len, how);
        MapChange {
            active: true,
            start,
            end,
        }
    }

    /// Give back revoked pages in a further range (the new mapping, after the real call).
    pub fn also(&self, start: usize, len: usize, how: Release) {
        if self.active {
            changes::note(start, start.saturating_add(len));
            release_range(start, len, how);
        }
    }
}

impl Drop for MapChange {
    fn drop(&mut self) {
        if self.active {
            changes::note(self.start, self.end);
            state::MAP_BUSY.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// Give back every revoked page in `[start, start + len)` (inside a [`MapChange`]).
fn release_range(start: usize, len: usize, how: Release) {
    if len == 0 || ARMED_COUNT.load(Ordering::SeqCst) == 0 {
        return;
    }
    let end = start.saturating_add(len);
    for s in SLOTS.iter() {
        loop {
            let page = s.page.load(Ordering::SeqCst);
            if page == 0 || page.saturating_add(PAGE) <= start || page >= end {
                break;
            }
            let st = s.state.load(Ordering::SeqCst);
            match st {
                FREE => break,
                ARMED | OPEN => {
                    if s.state
                        .compare_exchange(st, BUSY, Ordering::SeqCst, Ordering::SeqCst)
                        .is_err()
                    {
                        continue;
                    }
                    let prot = match how {
                        Release::Restore => i32::from(s.prot.load(Ordering::Relaxed)),
                        Release::NewMapping(p) => p,
                    };
                    if st == ARMED || matches!(how, Release::NewMapping(_)) {
                        signal::raw_mprotect(page, PAGE, prot);
                    }
                    if st == ARMED {
                        COUNTERS.pages_released.fetch_add(1, Ordering::Relaxed);
                    }
                    state::trace(state::ev::HOOK_RELEASE, u64::from(st), page, prot as u64);
                    state::note_restore();
                    s.page.store(0, Ordering::SeqCst);
                    s.state.store(FREE, Ordering::SeqCst);
                    break;
                }
                _ => {
                    // BUSY: another thread is changing this page's protection; one syscall.
                    // SAFETY: sched_yield has no arguments.
                    unsafe { libc::syscall(libc::SYS_sched_yield) };
                }
            }
        }
    }
}

/// After a hooked call failed with EFAULT: if pages are revoked, restore them all (they stay
/// counted as faulted this round) and say the call should be retried once.
///
/// Inlined into every hook: one load when nothing is revoked; the rest is out of line (a
/// smaller hook frame for the common case).
#[inline(always)]
pub fn efault_retry(failed: bool) -> bool {
    if !failed || ARMED_COUNT.load(Ordering::Acquire) == 0 {
        return false;
    }
    efault_release()
}

/// [`efault_retry`] with pages revoked.
#[cold]
#[inline(never)]
fn efault_release() -> bool {
    if crate::sys::errno() != libc::EFAULT {
        return false;
    }
    let mut any = false;
    for s in SLOTS.iter() {
        if s.state
            .compare_exchange(ARMED, BUSY, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            let page = s.page.load(Ordering::Relaxed);
            signal::raw_mprotect(page, PAGE, i32::from(s.prot.load(Ordering::Relaxed)));
            state::trace(state::ev::EFAULT, 0, page, 0);
            state::note_restore();
            s.state.store(OPEN, Ordering::Release);
            any = true;
        }
    }
    if any {
        COUNTERS.efault_retries.fetch_add(1, Ordering::Relaxed);
    }
    any
}

/// Whether signal masks must keep SIGSEGV unblocked (detection installed in this process).
#[inline]
pub fn strip_segv() -> bool {
    signal::INSTALLED.load(Ordering::Relaxed)
}
