//! The SIGSEGV side of the detector: the fault handler, and keeping the program's own SIGSEGV
//! disposition intact.
//!
//! Once detection is installed, the kernel's SIGSEGV disposition is ours for the rest of the
//! process's life (never uninstalled: with no revoked pages it simply passes every fault on).
//! The program's disposition lives in a double-buffered copy here: the `sigaction`/`signal` hooks
//! read and write it instead of the kernel's, so the program sees exactly what it set.
//!
//! A fault no revoked page claims is re-executed once first (it may be an induced fault whose
//! page the sampler restored before the handler looked); if the same thread faults again at the
//! same address, it goes where the kernel would have sent it:
//! * program handler: called with the same `(sig, info, ucontext)` (or `(sig)` without
//!   `SA_SIGINFO`), under the program's `sa_mask`; `SA_RESETHAND` honoured. Deliberate
//!   difference: SIGSEGV itself stays unblocked while it runs (our handler is `SA_NODEFER`), so a
//!   program handler that touches a revoked page is handled instead of killing the process.
//! * `SIG_DFL` or `SIG_IGN` (the kernel forces the default action for a synchronous SIGSEGV even
//!   when ignored): the kernel disposition is reset to `SIG_DFL` and the faulting instruction
//!   re-executes, so the process dies of the same SIGSEGV with the same core dump. A SIGSEGV
//!   sent with `kill`/`tgkill` is re-raised under `SIG_DFL`, or dropped under `SIG_IGN`.
//!
//! The fault handler runs on the host's threads (hooked path): the lints below (see the crate
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

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering};

use libc::{c_int, c_void, siginfo_t};

use super::state::{self, ARMED, BUSY, COUNTERS, OPEN, PAGE};
use crate::sys::{errno, set_errno};

/// `si_code` of a SIGSEGV for an access the page's protection forbids (asm-generic/siginfo.h).
const SEGV_ACCERR: c_int = 2;

extern "C" {
    /// glibc's public alias of `sigaction`: the real function even while we interpose
    /// `sigaction` itself (and usable before the constructor resolved anything).
    fn __sigaction(sig: c_int, act: *const libc::sigaction, old: *mut libc::sigaction) -> c_int;
}

/// One stored disposition (what the program set for SIGSEGV).
struct Disp {
    handler: AtomicUsize,
    flags: AtomicI32,
    mask: [AtomicU64; 16],
}

impl Disp {
    const fn new() -> Disp {
        Disp {
            handler: AtomicUsize::new(libc::SIG_DFL),
            flags: AtomicI32::new(0),
            mask: [const { AtomicU64::new(0) }; 16],
        }
    }
}

/// The program's SIGSEGV disposition, double-buffered: a writer fills the inactive copy and
/// then flips [`CURRENT`], so the fault handler never waits for a writer (it may interrupt one).
static DISPS: [Disp; 2] = [Disp::new(), Disp::new()];
static CURRENT: AtomicUsize = AtomicUsize::new(0);

/// Copy `i` (0 or 1; only the low bit counts) of [`DISPS`].
fn disp(i: usize) -> &'static Disp {
    if i & 1 == 0 {
        &DISPS[0]
    } else {
        &DISPS[1]
    }
}
/// Writers (the hooks, the installer) exclude each other with this flag; it is held across one
/// copy, never across a call that could block.
static WRITER: AtomicBool = AtomicBool::new(false);
/// Our handler is the kernel's SIGSEGV disposition.
pub static INSTALLED: AtomicBool = AtomicBool::new(false);

fn lock_writer() {
    while WRITER
        .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
        .is_err()
    {
        std::hint::spin_loop();
    }
}

fn unlock_writer() {
    WRITER.store(false, Ordering::Release);
}

fn sigset_words(s: &libc::sigset_t) -> [u64; 16] {
    let mut w = [0u64; 16];
    // SAFETY: sigset_t is 128 bytes of plain data on Linux/glibc; we copy at most its size.
    let bytes = unsafe {
        std::slice::from_raw_parts(
            s as *const libc::sigset_t as *const u8,
            std::mem::size_of::<libc::sigset_t>(),
        )
    };
    for (word, chunk) in w.iter_mut().zip(bytes.chunks(8)) {
        let mut b = [0u8; 8];
        for (d, s) in b.iter_mut().zip(chunk) {
            *d = *s;
        }
        *word = u64::from_ne_bytes(b);
    }
    w
}

fn words_sigset(w: &[u64; 16]) -> libc::sigset_t {
    // SAFETY: an all-zero sigset_t is the empty set.
    let mut s: libc::sigset_t = unsafe { std::mem::zeroed() };
    let n = std::mem::size_of::<libc::sigset_t>().min(16 * 8);
    // SAFETY: writes at most size_of::<sigset_t>() bytes into `s`.
    let bytes =
        unsafe { std::slice::from_raw_parts_mut(&mut s as *mut libc::sigset_t as *mut u8, n) };
    for (chunk, word) in bytes.chunks_mut(8).zip(w) {
        for (d, s) in chunk.iter_mut().zip(word.to_ne_bytes()) {
            *d = s;
        }
    }
    s
}

/// Store `act` as the program's disposition (writer lock held by the caller).
fn store_program(act: &libc::sigaction) {
    let next = CURRENT.load(Ordering::Acquire) ^ 1;
    let d = disp(next);
    d.handler.store(act.sa_sigaction, Ordering::Relaxed);
    d.flags.store(act.sa_flags, Ordering::Relaxed);
    for (slot, w) in d.mask.iter().zip(sigset_words(&act.sa_mask)) {
        slot.store(w, Ordering::Relaxed);
    }
    CURRENT.store(next, Ordering::Release);
}

/// The program's current disposition as a `sigaction`.
fn load_program() -> libc::sigaction {
    let d = disp(CURRENT.load(Ordering::Acquire));
    // SAFETY: an all-zero sigaction is valid plain data (SIG_DFL, no flags, empty mask).
    let mut a: libc::sigaction = unsafe { std::mem::zeroed() };
    a.sa_sigaction = d.handler.load(Ordering::Relaxed);
    a.sa_flags = d.flags.load(Ordering::Relaxed);
    let mut w = [0u64; 16];
    for (x, slot) in w.iter_mut().zip(d.mask.iter()) {
        *x = slot.load(Ordering::Relaxed);
    }
    a.sa_mask = words_sigset(&w);
    a
}

/// Make our handler the kernel's SIGSEGV disposition, keeping what was there as the
/// program's. Idempotent.
pub fn install() -> Result<(), String> {
    if INSTALLED.load(Ordering::Acquire) {
        return Ok(());
    }
    lock_writer();
    let r = install_locked();
    unlock_writer();
    r
}

fn install_locked() -> Result<(), String> {
    if INSTALLED.load(Ordering::Acquire) {
        return Ok(());
    }
    // SAFETY: an all-zero sigaction is valid plain data.
    let mut ours: libc::sigaction = unsafe { std::mem::zeroed() };
    ours.sa_sigaction = on_segv as *const () as usize;
    ours.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_NODEFER | libc::SA_RESTART;
    // SAFETY: an all-zero sigaction is valid plain data (overwritten by the call below).
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: both pointers are valid locals; `on_segv` has the SA_SIGINFO handler signature
    // and lives as long as the process (the agent is never unloaded).
    let r = unsafe { __sigaction(libc::SIGSEGV, &ours, &mut old) };
    if r != 0 {
        return Err(format!(
            "cannot install the SIGSEGV handler: {}",
            std::io::Error::last_os_error()
        ));
    }
    store_program(&old);
    INSTALLED.store(true, Ordering::Release);
    Ok(())
}

/// The `sigaction` hook for SIGSEGV: read and write the program's disposition instead of the
/// kernel's once we are installed; the real call otherwise. Returns the C return value.
///
/// # Safety
/// `act` and `old` are null or valid for reading / writing a `sigaction`.
pub unsafe fn program_sigaction(act: *const libc::sigaction, old: *mut libc::sigaction) -> c_int {
    lock_writer();
    let r = if INSTALLED.load(Ordering::Acquire) {
        if !old.is_null() {
            // SAFETY: `old` is valid for writing (caller).
            unsafe { *old = load_program() };
        }
        if !act.is_null() {
            // SAFETY: `act` is valid for reading (caller).
            store_program(unsafe { &*act });
        }
        0
    } else {
        // SAFETY: forwarded unchanged under the caller's contract.
        unsafe { __sigaction(libc::SIGSEGV, act, old) }
    };
    unlock_writer();
    r
}

/// `sigaction` for any other signal (forwarded unchanged).
///
/// # Safety
/// As sigaction(2).
pub unsafe fn real_sigaction(
    sig: c_int,
    act: *const libc::sigaction,
    old: *mut libc::sigaction,
) -> c_int {
    // SAFETY: forwarded unchanged under the caller's contract.
    unsafe { __sigaction(sig, act, old) }
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
        if slot
            .state
            .compare_exchange(st, BUSY, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            continue;
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
            if !crate::track::is_agent_thread() {
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

/// A fault no slot claims may still be ours: the access faulted on a revoked page, and the
/// sampler restored and retired that page before this handler looked. Re-executing tells: a
/// stale fault succeeds, a genuine one faults again at the same address. So the first
/// unclaimed access fault of a thread at an address is retried once; the second goes on.
fn retry_unclaimed(tid: u32, addr: usize) -> bool {
    let key = (u64::from(tid) << 48) ^ (addr as u64 & 0xffff_ffff_ffff);
    let Some(slot) = UNCLAIMED.get(tid as usize % UNCLAIMED_LEN) else {
        return false;
    };
    if slot.load(Ordering::Relaxed) == key {
        slot.store(0, Ordering::Relaxed);
        false
    } else {
        slot.store(key, Ordering::Relaxed);
        true
    }
}

/// The SIGSEGV handler.
extern "C" fn on_segv(sig: c_int, info: *mut siginfo_t, uctx: *mut c_void) {
    let saved = errno();
    // SAFETY: the kernel passes a valid siginfo for an SA_SIGINFO handler.
    let (code, addr) = unsafe { ((*info).si_code, (*info).si_addr() as usize) };
    let ours = code == SEGV_ACCERR && {
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
    };
    if !ours {
        let page = addr & !(PAGE - 1);
        state::trace(state::ev::CHAIN, raw_tid() as u64, page, 0);
        COUNTERS.faults_foreign.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarding the kernel's own arguments.
        unsafe { chain(sig, info, uctx) };
    }
    set_errno(saved);
}

/// Deliver a fault that was not ours as the kernel would have.
///
/// # Safety
/// Called from the SIGSEGV handler with the kernel's arguments.
unsafe fn chain(sig: c_int, info: *mut siginfo_t, uctx: *mut c_void) {
    let prog = load_program();
    let h = prog.sa_sigaction;
    // SAFETY: `info` is the kernel's siginfo.
    let user_sent = unsafe { (*info).si_code } <= 0;
    if h == libc::SIG_DFL || h == libc::SIG_IGN {
        if user_sent && h == libc::SIG_IGN {
            return;
        }
        // SAFETY: an all-zero sigaction is SIG_DFL with no flags and an empty mask.
        let dfl: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: valid pointer to a local; sigaction is async-signal-safe.
        unsafe { __sigaction(libc::SIGSEGV, &dfl, std::ptr::null_mut()) };
        if user_sent {
            // SAFETY: signals our own thread; delivered when this handler returns.
            unsafe { libc::syscall(libc::SYS_tgkill, libc::getpid(), raw_tid(), libc::SIGSEGV) };
        }
        // A synchronous fault: returning re-executes the access, which now kills the process
        // with SIGSEGV (and its core dump) exactly as without us.
        return;
    }
    if prog.sa_flags & libc::SA_RESETHAND != 0 {
        reset_program_disposition_from_handler();
    }
    // Block the program's sa_mask for the duration of its handler (SIGSEGV stays unblocked).
    let mut mask = prog.sa_mask;
    // SAFETY: `mask` is a valid local sigset.
    unsafe { libc::sigdelset(&mut mask, libc::SIGSEGV) };
    // SAFETY: an all-zero sigset is valid storage for the old mask.
    let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointers to locals; the kernel's sigset size is 8 bytes.
    unsafe {
        libc::syscall(
            libc::SYS_rt_sigprocmask,
            libc::SIG_BLOCK,
            &mask,
            &mut old,
            8,
        )
    };
    if prog.sa_flags & libc::SA_SIGINFO != 0 {
        type Action = extern "C" fn(c_int, *mut siginfo_t, *mut c_void);
        // SAFETY: the program installed `h` with SA_SIGINFO, so it has this signature.
        let f: Action = unsafe { std::mem::transmute::<usize, Action>(h) };
        f(sig, info, uctx);
    } else {
        type Handler = extern "C" fn(c_int);
        // SAFETY: the program installed `h` without SA_SIGINFO, so it has this signature.
        let f: Handler = unsafe { std::mem::transmute::<usize, Handler>(h) };
        f(sig);
    }
    // SAFETY: restores the mask saved above.
    unsafe {
        libc::syscall(
            libc::SYS_rt_sigprocmask,
            libc::SIG_SETMASK,
            &old,
            std::ptr::null_mut::<libc::sigset_t>(),
            8,
        )
    };
}

/// `SA_RESETHAND`: the program's handler is one-shot; from now on its disposition is SIG_DFL.
/// (From the handler: a writer may be interrupted mid-copy on this very thread, so this takes
/// the lock only if it is free and otherwise leaves the disposition alone.)
fn reset_program_disposition_from_handler() {
    if WRITER
        .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
        .is_ok()
    {
        // SAFETY: an all-zero sigaction is SIG_DFL.
        let dfl: libc::sigaction = unsafe { std::mem::zeroed() };
        store_program(&dfl);
        unlock_writer();
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

    #[test]
    fn sigset_roundtrip() {
        // SAFETY: zeroed sigset is empty; sigaddset on a valid local.
        let mut s: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: `s` is a valid, initialised local sigset; both signal numbers are in range.
        unsafe {
            libc::sigaddset(&mut s, libc::SIGUSR1);
            libc::sigaddset(&mut s, 40);
        }
        let back = words_sigset(&sigset_words(&s));
        // SAFETY: valid local sigsets.
        unsafe {
            assert_eq!(libc::sigismember(&back, libc::SIGUSR1), 1);
            assert_eq!(libc::sigismember(&back, 40), 1);
            assert_eq!(libc::sigismember(&back, libc::SIGSEGV), 0);
        }
    }
}
