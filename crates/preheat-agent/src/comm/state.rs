//! The detector's shared state: fixed-size, lock-free tables in the agent's own `.bss`, safe to
//! touch from the SIGSEGV handler (no allocation, no locks, only atomics).
//!
//! * **Slots** – the pages revoked in the current round: page address, original protection,
//!   and a state machine `FREE → ARMED → BUSY → OPEN`. Whoever moves a slot `ARMED → BUSY`
//!   (the faulting thread, the sampler at the end of a round, or a hooked map-changing call)
//!   owns the page's protection until it stores the next state; everyone else waits for `BUSY`
//!   to end. So no page is ever restored twice, and no restore races a program's own
//!   `mprotect`/`munmap` that went through the agent's hooks.
//! * **Threads** – tid → matrix index (first come, first served; [`MAX_COMM_THREADS`]).
//! * **Granules** – SPCD's "last two sharers" per granule, in an open-addressed hash table.
//! * **Matrix** – symmetric event counts.
//!
//! Touched from the fault handler and the hooks (hooked path): the lints below (see the crate
//! docs) reject panicking code in this file.
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

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering};

use preheat_model::comm::MAX_COMM_THREADS;

pub const MAX_SLOTS: usize = preheat_model::comm::MAX_PAGES_PER_ROUND as usize;
pub const PAGE: usize = 4096;

pub const FREE: u8 = 0;
pub const ARMED: u8 = 1;
pub const BUSY: u8 = 2;
pub const OPEN: u8 = 3;

/// One revoked page.
pub struct Slot {
    pub page: AtomicUsize,
    pub state: AtomicU8,
    /// The page's protection before we revoked it (`PROT_*` bits).
    pub prot: AtomicU8,
    /// Faults seen on this slot while `OPEN` (a fault racing our restore); a page that keeps
    /// faulting while open was re-protected behind our back and is released.
    pub open_faults: AtomicU32,
}

impl Slot {
    pub(crate) const fn new() -> Slot {
        Slot {
            page: AtomicUsize::new(0),
            state: AtomicU8::new(FREE),
            prot: AtomicU8::new(0),
            open_faults: AtomicU32::new(0),
        }
    }
}

pub static SLOTS: [Slot; MAX_SLOTS] = [const { Slot::new() }; MAX_SLOTS];

/// Bumped when a hooked call that changes mappings starts and when it ends: the sampler arms a
/// page only if no such call was in progress at its maps snapshot and none started since, or if
/// the call can see the page in its slot (sequentially consistent on both sides; see
/// `sampler::arm`).
pub static MAP_GEN: AtomicU64 = AtomicU64::new(0);
/// Hooked calls that change mappings and are in progress right now.
pub static MAP_BUSY: AtomicU32 = AtomicU32::new(0);

/// Bumped every time a slot is given up (its page restored or released): an access fault no
/// slot claims is stale (the page was given back between the fault and its handler) only if a
/// slot was given up since that thread's last unclaimed fault at the same address
/// (`signal::retry_unclaimed`).
pub static RESTORE_GEN: AtomicU64 = AtomicU64::new(0);

/// Note that a slot is being given up (before its state becomes FREE).
pub fn note_restore() {
    RESTORE_GEN.fetch_add(1, Ordering::SeqCst);
}

/// Slots possibly in use (a hint that lets hooks skip the scan entirely when zero).
pub static ARMED_COUNT: AtomicU32 = AtomicU32::new(0);

pub static THREAD_TIDS: [AtomicU32; MAX_COMM_THREADS] =
    [const { AtomicU32::new(0) }; MAX_COMM_THREADS];

/// Upper-triangle event counts, `i < j` at `i * MAX + j`.
pub static MATRIX: [AtomicU64; MAX_COMM_THREADS * MAX_COMM_THREADS] =
    [const { AtomicU64::new(0) }; MAX_COMM_THREADS * MAX_COMM_THREADS];

const GRANULES: usize = 16_384;
const PROBE: usize = 8;
/// Granule number + 1 (0 = empty).
static GRANULE_KEY: [AtomicU64; GRANULES] = [const { AtomicU64::new(0) }; GRANULES];
/// The last two sharers as thread index + 1 in the low and high 32 bits (0 = none).
static GRANULE_SHARERS: [AtomicU64; GRANULES] = [const { AtomicU64::new(0) }; GRANULES];

/// Counters reported with the matrix.
pub struct Counters {
    pub faults_induced: AtomicU64,
    pub faults_foreign: AtomicU64,
    pub efault_retries: AtomicU64,
    pub events: AtomicU64,
    pub rounds: AtomicU64,
    pub pages_revoked: AtomicU64,
    pub pages_released: AtomicU64,
    pub threads_dropped: AtomicU64,
    pub faults_uncounted: AtomicU64,
    pub pages_written: AtomicU64,
}

pub static COUNTERS: Counters = Counters {
    faults_induced: AtomicU64::new(0),
    faults_foreign: AtomicU64::new(0),
    efault_retries: AtomicU64::new(0),
    events: AtomicU64::new(0),
    rounds: AtomicU64::new(0),
    pages_revoked: AtomicU64::new(0),
    pages_released: AtomicU64::new(0),
    threads_dropped: AtomicU64::new(0),
    faults_uncounted: AtomicU64::new(0),
    pages_written: AtomicU64::new(0),
};

/// Only the threads in [`COUNTED`] count ([`CommThreads::Vcpu`](preheat_model::comm::CommThreads)).
pub static ONLY_COUNTED: AtomicBool = AtomicBool::new(false);
/// The threads that count when [`ONLY_COUNTED`] (tids; 0 = empty). Only ever added to, by the
/// sampler, before it revokes pages in a round.
pub static COUNTED: [AtomicU32; 64] = [const { AtomicU32::new(0) }; 64];

/// Whether faults by `tid` go into the matrix (allocation-free: the handlers ask).
pub fn counted(tid: u32) -> bool {
    !ONLY_COUNTED.load(Ordering::Acquire)
        || COUNTED.iter().any(|t| t.load(Ordering::Acquire) == tid)
}

/// Let `tid` count (sampler thread; a full table drops it).
pub fn add_counted(tid: u32) {
    if COUNTED.iter().any(|t| t.load(Ordering::Acquire) == tid) {
        return;
    }
    for t in COUNTED.iter() {
        if t.compare_exchange(0, tid, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            return;
        }
    }
}

/// Forget the counted threads (a new session or a fork child).
pub fn reset_counted(only: bool) {
    for t in COUNTED.iter() {
        t.store(0, Ordering::Relaxed);
    }
    ONLY_COUNTED.store(only, Ordering::Release);
}

/// log2 of the granule size (12 = one page).
pub static GRANULE_SHIFT: AtomicU32 = AtomicU32::new(12);

/// Alternate signal stacks the program registered (never sampled): start and size.
static ALTSTACKS: [(AtomicU64, AtomicU64); 64] =
    [const { (AtomicU64::new(0), AtomicU64::new(0)) }; 64];

/// Remember an alternate signal stack (from the `sigaltstack` hook; allocation-free).
pub fn note_altstack(addr: u64, size: u64) {
    if addr == 0 {
        return;
    }
    for (a, n) in ALTSTACKS.iter() {
        if a.load(Ordering::Relaxed) == addr {
            n.store(size, Ordering::Relaxed);
            return;
        }
    }
    for (a, n) in ALTSTACKS.iter() {
        if a.compare_exchange(0, addr, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            n.store(size, Ordering::Relaxed);
            return;
        }
    }
}

/// The registered alternate signal stacks as `[start, end)`.
pub fn altstack_ranges() -> Vec<(u64, u64)> {
    ALTSTACKS
        .iter()
        .map(|(a, n)| (a.load(Ordering::Relaxed), n.load(Ordering::Relaxed)))
        .filter(|&(a, _)| a != 0)
        .map(|(a, n)| (a, a.saturating_add(n.max(4096))))
        .collect()
}

/// The slot holding `page`, if any (any state but FREE).
pub fn find_slot(page: usize) -> Option<&'static Slot> {
    if ARMED_COUNT.load(Ordering::Acquire) == 0 {
        return None;
    }
    SLOTS
        .iter()
        .find(|s| s.state.load(Ordering::Acquire) != FREE && s.page.load(Ordering::Acquire) == page)
}

/// Claim the next free slot of `slots` for `page` (state BUSY: the caller now owns the page's
/// protection and must store ARMED, or FREE after clearing the page).
pub fn claim_slot<'a>(
    slots: &mut impl Iterator<Item = &'a Slot>,
    page: u64,
    prot: u8,
) -> Option<&'a Slot> {
    let slot = slots.find(|s| {
        s.state
            .compare_exchange(FREE, BUSY, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
    })?;
    slot.prot.store(prot, Ordering::SeqCst);
    slot.page.store(page as usize, Ordering::SeqCst);
    Some(slot)
}

/// Matrix index of `tid`, claiming one on first sight; `None` when the table is full.
pub fn thread_index(tid: u32) -> Option<usize> {
    for (i, t) in THREAD_TIDS.iter().enumerate() {
        let cur = t.load(Ordering::Acquire);
        if cur == tid {
            return Some(i);
        }
        if cur == 0 {
            match t.compare_exchange(0, tid, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Some(i),
                Err(now) if now == tid => return Some(i),
                Err(_) => continue,
            }
        }
    }
    None
}

/// Record one sampled access by `thread` (matrix index) to `addr`: every other recent sharer
/// of the granule gets a communication event with it, then `thread` becomes the most recent
/// sharer (SPCD keeps the last two).
pub fn record_access(thread: usize, addr: usize) {
    let shift = GRANULE_SHIFT.load(Ordering::Relaxed);
    let key = ((addr >> shift) as u64).wrapping_add(1);
    let Some(slot) = granule_slot(key) else {
        return;
    };
    let me = (thread as u64).saturating_add(1);
    let Some(sharers) = GRANULE_SHARERS.get(slot) else {
        return;
    };
    let mut cur = sharers.load(Ordering::Acquire);
    loop {
        let (a, b) = (cur & 0xffff_ffff, cur >> 32);
        let next = if a == me {
            cur
        } else {
            // Newest first; `b` drops out.
            me | (a << 32)
        };
        match sharers.compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => {
                for other in [a, b] {
                    if other != 0 && other != me {
                        add_event(thread, other.saturating_sub(1) as usize);
                    }
                }
                return;
            }
            Err(now) => cur = now,
        }
    }
}

/// The granule table slot for `key` (claimed if new; the home slot is recycled when the
/// probe sequence is full, losing that granule's history).
fn granule_slot(key: u64) -> Option<usize> {
    let home = granule_home(key);
    for s in granule_probes(home) {
        let k = GRANULE_KEY.get(s)?;
        let cur = k.load(Ordering::Acquire);
        if cur == key {
            return Some(s);
        }
        if cur == 0 {
            match k.compare_exchange(0, key, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Some(s),
                Err(now) if now == key => return Some(s),
                Err(_) => continue,
            }
        }
    }
    GRANULE_KEY.get(home)?.store(key, Ordering::Release);
    GRANULE_SHARERS.get(home)?.store(0, Ordering::Release);
    Some(home)
}

/// Home slot of granule `key` in the granule table.
fn granule_home(key: u64) -> usize {
    (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 50) as usize % GRANULES
}

/// The probe sequence from `home`.
fn granule_probes(home: usize) -> impl Iterator<Item = usize> {
    (0..PROBE).map(move |i| home.wrapping_add(i) % GRANULES)
}

/// Whether two different threads are among the recorded sharers of the granule holding `addr`
/// (for the sampler's choice of pages to keep sampling; never from the handler).
pub fn granule_shared(addr: usize) -> bool {
    let shift = GRANULE_SHIFT.load(Ordering::Relaxed);
    let key = ((addr >> shift) as u64).wrapping_add(1);
    granule_probes(granule_home(key)).any(|s| {
        GRANULE_KEY
            .get(s)
            .is_some_and(|k| k.load(Ordering::Acquire) == key)
            && {
                let v = GRANULE_SHARERS
                    .get(s)
                    .map_or(0, |v| v.load(Ordering::Acquire));
                let (a, b) = (v & 0xffff_ffff, v >> 32);
                a != 0 && b != 0 && a != b
            }
    })
}

fn add_event(a: usize, b: usize) {
    let (i, j) = if a < b { (a, b) } else { (b, a) };
    if let Some(c) = MATRIX.get(i.saturating_mul(MAX_COMM_THREADS).saturating_add(j)) {
        c.fetch_add(1, Ordering::Relaxed);
        COUNTERS.events.fetch_add(1, Ordering::Relaxed);
    }
}

/// Threads seen so far (tids in matrix order).
pub fn threads() -> Vec<u32> {
    THREAD_TIDS
        .iter()
        .map(|t| t.load(Ordering::Acquire))
        .take_while(|&t| t != 0)
        .collect()
}

/// The symmetric matrix of the first `n` threads.
pub fn matrix(n: usize) -> Vec<Vec<u64>> {
    (0..n)
        .map(|i| (0..n).map(|j| pair_events(i, j)).collect())
        .collect()
}

/// Events between threads `i` and `j` (0 on the diagonal).
fn pair_events(i: usize, j: usize) -> u64 {
    if i == j {
        return 0;
    }
    let (a, b) = if i < j { (i, j) } else { (j, i) };
    MATRIX
        .get(a.saturating_mul(MAX_COMM_THREADS).saturating_add(b))
        .map_or(0, |c| c.load(Ordering::Relaxed))
}

/// Zero the matrix, the sharer history and the counters (not the slots: revoked pages stay
/// revoked until the round ends; not the thread table: indices stay stable).
pub fn reset_counts() {
    for c in MATRIX.iter() {
        c.store(0, Ordering::Relaxed);
    }
    for (k, s) in GRANULE_KEY.iter().zip(GRANULE_SHARERS.iter()) {
        k.store(0, Ordering::Relaxed);
        s.store(0, Ordering::Relaxed);
    }
    let c = &COUNTERS;
    for a in [
        &c.faults_induced,
        &c.faults_foreign,
        &c.efault_retries,
        &c.events,
        &c.rounds,
        &c.pages_revoked,
        &c.pages_released,
        &c.threads_dropped,
        &c.faults_uncounted,
        &c.pages_written,
    ] {
        a.store(0, Ordering::Relaxed);
    }
}

/// Forget the threads too (a fork child has other tids).
pub fn reset_threads() {
    for t in THREAD_TIDS.iter() {
        t.store(0, Ordering::Relaxed);
    }
}

#[cfg(test)]
#[allow(
    clippy::unwrap_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]
mod tests {
    use super::*;

    // One test touches the global tables, so the others cannot race it.
    #[test]
    fn sharers_make_events() {
        reset_counts();
        reset_threads();
        let a = thread_index(1001).unwrap();
        let b = thread_index(1002).unwrap();
        let c = thread_index(1003).unwrap();
        assert_eq!(thread_index(1001), Some(a));
        // a then b on one page: one event; a again: one more (b is a recent sharer).
        record_access(a, 0x10_0000);
        record_access(b, 0x10_0008);
        record_access(a, 0x10_0100);
        // c on another page alone: nothing.
        record_access(c, 0x20_0000);
        let m = matrix(3);
        assert_eq!(m[a][b], 2);
        assert_eq!(m[b][a], 2);
        assert_eq!(m[a][c], 0);
        assert_eq!(COUNTERS.events.load(Ordering::Relaxed), 2);
        // Same thread twice: no self-event.
        record_access(c, 0x20_0010);
        assert_eq!(matrix(3)[c][c], 0);
        // Only the last two sharers count: a, b, then c sees b and a.
        record_access(c, 0x10_0000);
        let m = matrix(3);
        assert_eq!(m[c][a] + m[c][b], 2);
        reset_counts();
        assert_eq!(matrix(3)[a][b], 0);
        reset_threads();
    }
}

/// Flight recorder: the last [`TRACE`]`.len()` detector events (fault, claim, arm, restore,
/// release, chain), written lock-free from the handler, the sampler and the hooks, read from a
/// core dump (`gdb`: `preheat_agent::comm::state::TRACE`, `TRACE_PAGE`, `TRACE_POS`) when a host
/// dies. Two relaxed stores per event.
pub mod ev {
    pub const FAULT: u64 = 1;
    pub const CLAIM: u64 = 2;
    pub const NOT_FOUND: u64 = 5;
    pub const ARM: u64 = 6;
    pub const RETIRE_RESTORE: u64 = 7;
    pub const RETIRE_OPEN: u64 = 8;
    pub const CHAIN: u64 = 9;
    pub const RETIRE_RELEASE: u64 = 10;
    pub const STATE: u64 = 11;
    pub const EFAULT: u64 = 12;
    pub const HOOK_RELEASE: u64 = 13;
    /// A handler found its slot retired and reused for another page (`signal::take`).
    pub const REUSED: u64 = 14;
}

/// Event words: `kind << 56 | (tid & 0xffffff) << 32 | extra`.
const TRACE_LEN: usize = 8192;
pub static TRACE: [AtomicU64; TRACE_LEN] = [const { AtomicU64::new(0) }; TRACE_LEN];
/// The page of each event.
pub static TRACE_PAGE: [AtomicU64; TRACE_LEN] = [const { AtomicU64::new(0) }; TRACE_LEN];
/// Events recorded so far (the ring index is this modulo the length).
pub static TRACE_POS: AtomicU64 = AtomicU64::new(0);

/// Record one event (allocation-free, async-signal-safe).
pub fn trace(kind: u64, tid: u64, page: usize, extra: u64) {
    let i = TRACE_POS.fetch_add(1, Ordering::Relaxed) as usize % TRACE_LEN;
    if let (Some(w), Some(p)) = (TRACE.get(i), TRACE_PAGE.get(i)) {
        w.store(
            (kind << 56) | ((tid & 0xff_ffff) << 32) | (extra & 0xffff_ffff),
            Ordering::Relaxed,
        );
        p.store(page as u64, Ordering::Relaxed);
    }
}
