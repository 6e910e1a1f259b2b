//! The SIGSEGV side of the detector: claiming the faults it induced.
//!
//! The handler itself, and keeping the program's own SIGSEGV disposition intact, are
//! [`crate::faults`]'s (shared with the probe): once detection is installed the agent holds
//! SIGSEGV for the rest of the process's life (never given back: with no revoked pages every
//! fault is simply passed on), and asks `claim` first about every SIGSEGV.
//!
//! A fault no revoked page claims is re-executed once first (it may be an induced fault whose
//! page the sampler restored before the handler looked); if the same thread faults again at the
//! same address, it goes where the kernel would have sent it ([`crate::faults`]). Deliberate
//! difference there: SIGSEGV itself stays unblocked while the program's handler runs (the
//! agent's handler is `SA_NODEFER` under detection), so a program handler that touches a
//! revoked page is handled instead of killing the process.
//!
//! The claim runs in the fault handler on the host's threads (hooked path): the lints below
//! (see the crate docs) reject panicking code in this file.
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

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use libc::c_int;

use super::state::{self, ARMED, BUSY, COUNTERS, OPEN, PAGE};

/// `si_code` of a SIGSEGV for an access the page's protection forbids (asm-generic/siginfo.h).
const SEGV_ACCERR: c_int = 2;

/// Detection claims SIGSEGV (set once by [`install`], never cleared).
pub static INSTALLED: AtomicBool = AtomicBool::new(false);

/// Make the agent's handler the kernel's SIGSEGV disposition for the rest of the process's life
/// (the program's kept as its copy, see [`crate::faults`]), with `claim` asked first about
/// every fault. Idempotent.
pub fn install() -> Result<(), String> {
    if INSTALLED.load(Ordering::Acquire) {
        return Ok(());
    }
    crate::faults::hold_for_comm(claim, foreign)?;
    INSTALLED.store(true, Ordering::Release);
    Ok(())
}

fn raw_tid() -> i64 {
    // SAFETY: gettid takes no arguments (async-signal-safe raw syscall).
    unsafe { libc::syscall(libc::SYS_gettid) }
}

/// `mprotect` through the raw system call (async-signal-safe; never our own hook).
pub fn raw_mprotect(page: usize, len: usize, prot: c_int) -> bool {
    // SAFETY: changes protections of pages the detector revoked itself (callers own the slot
    // in state BUSY, see `state`); no memory is accessed.
    unsafe { libc::syscall(libc::SYS_mprotect, page, len, prot) == 0 }
}

/// What a fault on one of our slots means.
enum Verdict {
    /// We restored the page (or someone else just did): re-execute the access.
    Retry,
    /// Not a page we revoked.
    NotOurs,
}

/// What [`take`] did with a slot.
#[derive(Debug, PartialEq, Eq)]
enum Take {
    /// The slot is ours (BUSY) and holds the faulting page.
    Owned,
    /// Its state was no longer the one read: look again.
    Changed,
    /// It was retired and reused for another page meanwhile: left as it was.
    Other,
}

/// Move `slot` from state `st` (ARMED or OPEN, as just read) to BUSY for `page`.
///
/// The slot's page was checked before, but between that read and the exchange the sampler may
/// have retired the slot and armed it again for another page (`ARMED → … → FREE → BUSY →
/// ARMED`: the same state, so the exchange alone succeeds): restoring our page then would leave
/// the other page revoked under a slot marked OPEN, and count a fault on a page that is not
/// revoked. So the page is read again once the slot is ours, and the slot is given back
/// unchanged if it no longer holds `page` (nobody else changes a BUSY slot).
fn take(slot: &state::Slot, st: u8, page: usize) -> Take {
    if slot
        .state
        .compare_exchange(st, BUSY, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return Take::Changed;
    }
    if slot.page.load(Ordering::Acquire) == page {
        return Take::Owned;
    }
    slot.state.store(st, Ordering::Release);
    Take::Other
}

/// Handle a fault at `addr` if it is on a page we hold (a slot in any state but FREE).
///
/// Whatever the slot's state says, a fault on a page we hold is answered by restoring the
/// page's original protection (self-healing: the kernel's view wins over our bookkeeping). Only
/// the first restore after the page was revoked counts as an induced fault; a page that keeps
/// faulting after many restores is not ours to fix (the program re-protected it behind us).
fn on_fault(addr: usize) -> Verdict {
    let page = addr & !(PAGE - 1);
    let tid = raw_tid() as u64;
    state::trace(
        state::ev::FAULT,
        tid,
        page,
        u64::from(state::ARMED_COUNT.load(Ordering::Relaxed)),
    );
    let Some(slot) = state::find_slot(page) else {
        state::trace(state::ev::NOT_FOUND, tid, page, 0);
        return Verdict::NotOurs;
    };
    loop {
        let st = slot.state.load(Ordering::Acquire);
        state::trace(state::ev::STATE, tid, page, u64::from(st));
        if st == BUSY {
            // Someone is changing this page's protection right now: one syscall.
            // SAFETY: sched_yield has no arguments.
            unsafe { libc::syscall(libc::SYS_sched_yield) };
            continue;
        }
        if st != ARMED && st != OPEN {
            return Verdict::NotOurs;
        }
        if slot.page.load(Ordering::Acquire) != page {
            return Verdict::NotOurs;
        }
        match take(slot, st, page) {
            Take::Owned => {}
            Take::Changed => continue,
            Take::Other => {
                state::trace(state::ev::REUSED, tid, page, u64::from(st));
                return Verdict::NotOurs;
            }
        }
        let prot = c_int::from(slot.prot.load(Ordering::Relaxed));
        if !raw_mprotect(page, PAGE, prot) {
            // The page is gone (unmapped behind us): not ours after all.
            slot.page.store(0, Ordering::Release);
            slot.state.store(state::FREE, Ordering::Release);
            return Verdict::NotOurs;
        }
        let repeats = if st == ARMED {
            slot.open_faults.store(0, Ordering::Relaxed);
            0
        } else {
            slot.open_faults
                .fetch_add(1, Ordering::Relaxed)
                .saturating_add(1)
        };
        slot.state.store(OPEN, Ordering::Release);
        state::trace(state::ev::CLAIM, tid, page, u64::from(st));
        if st == ARMED {
            COUNTERS.faults_induced.fetch_add(1, Ordering::Relaxed);
            if !state::counted(tid as u32) {
                COUNTERS.faults_uncounted.fetch_add(1, Ordering::Relaxed);
            } else if !crate::track::is_agent_thread() {
                match state::thread_index(tid as u32) {
                    Some(t) => state::record_access(t, addr),
                    None => {
                        COUNTERS.threads_dropped.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }
        return if repeats < 64 {
            Verdict::Retry
        } else {
            Verdict::NotOurs
        };
    }
}

/// The last fault each thread could not attribute (tid, address), by `tid % len`.
const UNCLAIMED_LEN: usize = 256;
static UNCLAIMED: [AtomicU64; UNCLAIMED_LEN] = [const { AtomicU64::new(0) }; UNCLAIMED_LEN];

/// [`state::RESTORE_GEN`] at each thread's last unclaimed fault, beside [`UNCLAIMED`].
static UNCLAIMED_GEN: [AtomicU64; UNCLAIMED_LEN] = [const { AtomicU64::new(0) }; UNCLAIMED_LEN];

/// A fault no slot claims may still be ours: the access faulted on a revoked page, and the
/// sampler restored and retired that page before this handler looked. Re-executing tells: a
/// stale fault succeeds, a genuine one faults again at the same address. So an unclaimed access
/// fault of a thread at an address is retried; a second one at the same address goes on — unless
/// a page was given back since the first ([`state::RESTORE_GEN`]): then it may be the same race
/// again, a round later (a thread hammering one address, a QEMU vCPU on a guest's barrier word
/// with 10 ms rounds, met it: measured, QEMU was killed), and it is retried too.
fn retry_unclaimed(tid: u32, addr: usize) -> bool {
    let key = (u64::from(tid) << 48) ^ (addr as u64 & 0xffff_ffff_ffff);
    let i = tid as usize % UNCLAIMED_LEN;
    let (Some(slot), Some(gen)) = (UNCLAIMED.get(i), UNCLAIMED_GEN.get(i)) else {
        return false;
    };
    let now = state::RESTORE_GEN.load(Ordering::SeqCst);
    if slot.load(Ordering::Relaxed) == key && gen.load(Ordering::Relaxed) == now {
        slot.store(0, Ordering::Relaxed);
        false
    } else {
        slot.store(key, Ordering::Relaxed);
        gen.store(now, Ordering::Relaxed);
        true
    }
}

/// Whether a SIGSEGV with `code` at `addr` is one the detector induced (it restored the page,
/// or it retries an unclaimed access fault once: see the module docs). Called first by the
/// agent's fault handler; true: the access re-executes.
fn claim(code: c_int, addr: usize) -> bool {
    code == SEGV_ACCERR && {
        let tid = raw_tid() as u32;
        if matches!(on_fault(addr), Verdict::Retry) {
            // A claimed fault ends any earlier unclaimed one of this thread.
            if let Some(u) = UNCLAIMED.get(tid as usize % UNCLAIMED_LEN) {
                u.store(0, Ordering::Relaxed);
            }
            true
        } else {
            retry_unclaimed(tid, addr)
        }
    }
}

/// A SIGSEGV the handler passes on to the program (flight recorder and counter).
fn foreign(addr: usize) {
    let page = addr & !(PAGE - 1);
    state::trace(state::ev::CHAIN, raw_tid() as u64, page, 0);
    COUNTERS.faults_foreign.fetch_add(1, Ordering::Relaxed);
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    use super::*;

    /// A slot reused for another page between the handler's reads and its exchange (same
    /// state both times) is left alone, with its page and state as they were.
    #[test]
    fn a_slot_reused_for_another_page_is_not_taken() {
        let (p, q) = (0x7000_0000_usize, 0x7000_1000_usize);
        let slot = state::Slot::new();
        slot.page.store(q, Ordering::SeqCst);
        slot.state.store(ARMED, Ordering::SeqCst);
        // The handler read (ARMED, p); the slot now holds q, ARMED again.
        assert_eq!(take(&slot, ARMED, p), Take::Other);
        assert_eq!(slot.state.load(Ordering::SeqCst), ARMED);
        assert_eq!(slot.page.load(Ordering::SeqCst), q);
        // A state that changed since it was read: look again.
        assert_eq!(take(&slot, OPEN, q), Take::Changed);
        // The slot's own page: taken.
        assert_eq!(take(&slot, ARMED, q), Take::Owned);
        assert_eq!(slot.state.load(Ordering::SeqCst), BUSY);
    }
}
