//! The agent's SIGSEGV and SIGBUS handler, and the program's own dispositions of both.
//!
//! Two parts of the agent must see a fault before the program does:
//!
//! * **The probe** ([`crate::control`]) loads and flushes lines of the host's live memory. It
//!   validates its ranges right before every pass, but a host thread can unmap, truncate or
//!   protect them in the microseconds between. Its loads and flushes are the engine's guarded
//!   routines (`preheat_engine::guard`), whose faulting instructions have known recovery
//!   points. For each pass ([`ProbePass`]) the agent's handler becomes the kernel's disposition
//!   of SIGSEGV and SIGBUS; a kernel-generated fault of the probing thread at a guarded
//!   instruction resumes at its recovery point, and the pass ends reporting it. Before and
//!   after the pass the program's own dispositions are back in the kernel.
//! * **Communication detection** ([`crate::comm`], opt-in) holds SIGSEGV from its start for the
//!   rest of the process's life; the faults it induced are claimed by its claim function
//!   ([`hold_for_comm`]).
//!
//! While the handler is installed for a signal, the program's disposition of it lives here,
//! double-buffered: the interposed `sigaction` and `signal` read and write this copy instead of
//! the kernel's, so the program sees exactly what it set and its handler is never hidden, and
//! when the agent lets go the copy goes back into the kernel. The kernel's action is derived
//! from the copy (`derive`): the program's `SA_ONSTACK`, `SA_NODEFER`, `SA_RESTART` and
//! `sa_mask`, so the kernel picks the same stack and blocks the same signals for the agent's
//! handler as it would for the program's (comm adds `SA_ONSTACK` and keeps SIGSEGV unblocked,
//! its documented difference: an induced fault must be handled even inside the program's
//! handler and on a thread near the end of its stack).
//!
//! A fault that is neither claimed nor resumed goes where the kernel would have sent it:
//! * program handler: called with the same `(sig, info, ucontext)` (or `(sig)` without
//!   `SA_SIGINFO`); the kernel already applied its mask and stack; `SA_RESETHAND` is honoured
//!   (the copy's handler reads `SIG_DFL` from then on, as the kernel resets it at delivery; the
//!   kernel keeps the agent's handler, which then takes the default path, until the agent lets
//!   go and the reset disposition goes into the kernel);
//! * `SIG_DFL` or `SIG_IGN` (the kernel forces the default action for a synchronous fault even
//!   when ignored): the kernel disposition is reset to `SIG_DFL` and the faulting instruction
//!   re-executes, so the process dies of the same signal with the same core dump and exit
//!   status. A signal sent with `kill`/`tgkill` is re-raised under `SIG_DFL`, or dropped under
//!   `SIG_IGN`.
//!
//! What it cannot see: a program that changes the disposition without the interposed calls (a
//! raw `rt_sigaction` system call, glibc's `sysv_signal`/`sigset`, which call the internal
//! `__sigaction`) while the agent holds the signal. When the probe lets go it finds the
//! kernel's action changed and keeps it (so the program's handler stays in place), and says so;
//! a probe fault in that window would have gone to the program (comm holds SIGSEGV for life and
//! has no such check). A child the program forks during a pass gets the program's dispositions
//! back from the fork handler; one started with `vfork`/`posix_spawn` (no fork handlers) execs
//! with the agent's handler reset to the default action, as exec does with every handler — a
//! SIGSEGV or SIGBUS the program *ignores* would not stay ignored in it.
//!
//! Cost: taking a signal is one `sigaction` (the swap; a query first when the program set its
//! disposition since the last pass), giving it back one more; measured here (2-vCPU EPYC KVM
//! guest, debug agent build, 2 × 2000 passes) 2.5-2.7 µs to begin a pass and 5.1 µs to end it,
//! against ~0.9 ms for the pass itself over 1 MiB. Masks are the kernel's 64 signals.
//!
//! The handler runs on any thread, in any state (hooked path): it never allocates, logs or
//! panics (the lints below), and preserves errno. Writers of the copy (the hooks, the probe,
//! comm's start) exclude each other with a spin flag held across one copy and at most three
//! `sigaction` calls. The handler takes it only to deliver a one-shot (`SA_RESETHAND`)
//! program handler, and never on a thread that holds it (it may have interrupted that write).
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

use std::sync::atomic::{AtomicUsize, Ordering};

use libc::{c_int, c_void, siginfo_t};

use crate::sys::{self, errno, real, set_errno};

extern "C" {
    /// glibc's public alias of `sigaction`: the real function even while we interpose
    /// `sigaction` itself (and usable before the constructor resolved anything).
    fn __sigaction(sig: c_int, act: *const libc::sigaction, old: *mut libc::sigaction) -> c_int;
}

/// One stored disposition (what the program set). The mask is the kernel's: 64 signals, the
/// first word of a glibc `sigset_t` (glibc fills the rest of a returned set with whatever its
mod disp;
mod pass;

use disp::*;
pub use pass::*;

// ------------------------------------------------------------------ communication detection

/// `fn(si_code, address) -> bool`: comm's claim of a SIGSEGV (true: it restored the page; the
/// access re-executes). 0: none registered.
static COMM_CLAIM: AtomicUsize = AtomicUsize::new(0);
/// `fn(address)`: told about a SIGSEGV that goes on to the program (comm's flight recorder).
static COMM_FOREIGN: AtomicUsize = AtomicUsize::new(0);

type ClaimFn = fn(c_int, usize) -> bool;
type ForeignFn = fn(usize);

/// Communication detection's start: hold SIGSEGV for the rest of the process's life, with
/// `claim` asked first about every SIGSEGV and `foreign` told about each one passed on.
pub fn hold_for_comm(claim: ClaimFn, foreign: ForeignFn) -> Result<(), String> {
    hold(&SEGV, COMM)?;
    // Before any page is revoked (the caller's start goes on only after this returns).
    COMM_FOREIGN.store(foreign as usize, Ordering::Release);
    COMM_CLAIM.store(claim as usize, Ordering::Release);
    Ok(())
}

fn comm_claims(code: c_int, addr: usize) -> bool {
    let f = COMM_CLAIM.load(Ordering::Acquire);
    if f == 0 {
        return false;
    }
    // SAFETY: a non-zero value was stored from a `ClaimFn` by `hold_for_comm`.
    let f: ClaimFn = unsafe { std::mem::transmute::<usize, ClaimFn>(f) };
    f(code, addr)
}

fn comm_foreign(addr: usize) {
    let f = COMM_FOREIGN.load(Ordering::Acquire);
    if f != 0 {
        // SAFETY: a non-zero value was stored from a `ForeignFn` by `hold_for_comm`.
        let f: ForeignFn = unsafe { std::mem::transmute::<usize, ForeignFn>(f) };
        f(addr);
    }
}

// --------------------------------------------------------------------------- the handler

/// The SIGSEGV and SIGBUS handler.
extern "C" fn on_fault(sig: c_int, info: *mut siginfo_t, uctx: *mut c_void) {
    let saved = errno();
    let Some(h) = held(sig) else {
        return;
    };
    // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler.
    let (code, addr) = unsafe { ((*info).si_code, (*info).si_addr() as usize) };
    // Comm first: a page it revoked is given back and the access (the probe's too) re-executes.
    let ours = (sig == libc::SIGSEGV && comm_claims(code, addr))
        || (code > 0 && resume_probe(sig, code, addr, uctx));
    if !ours {
        if sig == libc::SIGSEGV {
            comm_foreign(addr);
        }
        // SAFETY: forwarding the kernel's own arguments.
        unsafe { chain(h, sig, info, uctx) };
    }
    set_errno(saved);
}

/// Deliver a fault that was not ours as the kernel would have.
///
/// # Safety
/// Called from the handler with the kernel's arguments.
unsafe fn chain(h: &Held, sig: c_int, info: *mut siginfo_t, uctx: *mut c_void) {
    let prog = h.program();
    let f = prog.sa_sigaction;
    // SAFETY: `info` is the kernel's siginfo.
    let user_sent = unsafe { (*info).si_code } <= 0;
    if f == libc::SIG_DFL || f == libc::SIG_IGN {
        if user_sent && f == libc::SIG_IGN {
            return;
        }
        let dfl = empty_action();
        // SAFETY: valid pointer to a local; sigaction is async-signal-safe.
        unsafe { __sigaction(sig, &dfl, std::ptr::null_mut()) };
        if user_sent {
            // SAFETY: signals our own thread; delivered when the mask allows (at the latest
            // when this handler returns).
            unsafe {
                libc::syscall(
                    libc::SYS_tgkill,
                    libc::getpid(),
                    preheat_engine::os::gettid(),
                    sig,
                )
            };
        }
        // A synchronous fault: returning re-executes the access, which now ends the process
        // with the default action (and its core dump) exactly as without us.
        return;
    }
    if prog.sa_flags & libc::SA_RESETHAND != 0 {
        reset_one_shot(h, f);
    }
    // The kernel delivered to us with the program's mask, stack and deferral (see `derive`).
    if prog.sa_flags & libc::SA_SIGINFO != 0 {
        type Action = extern "C" fn(c_int, *mut siginfo_t, *mut c_void);
        // SAFETY: the program installed `f` with SA_SIGINFO, so it has this signature.
        let f: Action = unsafe { std::mem::transmute::<usize, Action>(f) };
        f(sig, info, uctx);
    } else {
        type Handler = extern "C" fn(c_int);
        // SAFETY: the program installed `f` without SA_SIGINFO, so it has this signature.
        let f: Handler = unsafe { std::mem::transmute::<usize, Handler>(f) };
        f(sig);
    }
}

/// `SA_RESETHAND`: the kernel resets the handler to `SIG_DFL` as it delivers it; we are about
/// to deliver `handler`, so reset it now: recorded at once for [`Held::program`], then, under
/// the writer flag, made true in the kernel too if the agent let go of the signal meanwhile (a
/// pass ended between the kernel's delivery to us and this point and put `handler` back).
fn reset_one_shot(h: &Held, handler: usize) {
    h.reset_pending.store(handler, Ordering::Release);
    if !lock_writer_from_handler() {
        return;
    }
    if !h.installed.load(Ordering::Acquire) && h.reset_pending.load(Ordering::Acquire) == handler {
        let mut k = empty_action();
        // SAFETY: a query into a valid local; sigaction is async-signal-safe.
        let queried = unsafe { __sigaction(h.sig, std::ptr::null(), &mut k) } == 0;
        if queried && k.sa_sigaction == handler {
            k.sa_sigaction = libc::SIG_DFL;
            // SAFETY: a valid local (the kernel's action with the handler reset).
            unsafe { __sigaction(h.sig, &k, std::ptr::null_mut()) };
        }
    }
    unlock_writer();
}

// ------------------------------------------------------------------------------- hooks

/// `sigaction` for SIGSEGV and SIGBUS while the agent holds them: read and write the program's
/// copy (and derive the kernel's action from it again); the real call otherwise. Returns the
/// C return value.
///
/// # Safety
/// As sigaction(2): `act` and `old` are null or valid for reading / writing a `sigaction`.
pub unsafe fn program_sigaction(
    sig: c_int,
    act: *const libc::sigaction,
    old: *mut libc::sigaction,
) -> c_int {
    let Some(h) = held(sig) else {
        // SAFETY: forwarded unchanged under the caller's contract.
        return unsafe { __sigaction(sig, act, old) };
    };
    lock_writer();
    let r = if h.installed.load(Ordering::Acquire) {
        // Read the new action first: `act` and `old` may be the same object.
        // SAFETY: `act` is null or valid for reading (caller).
        let new = (!act.is_null()).then(|| unsafe { *act });
        if !old.is_null() {
            // SAFETY: `old` is valid for writing (caller).
            unsafe { *old = h.program() };
        }
        if let Some(new) = new {
            // The program chose a disposition: a one-shot reset recorded before is done with.
            h.reset_pending.store(0, Ordering::Release);
            h.store_program(&new);
            h.install_ours();
        }
        0
    } else {
        // SAFETY: forwarded unchanged under the caller's contract.
        let r = unsafe { __sigaction(sig, act, old) };
        if !act.is_null() {
            // As above: the kernel holds what the program chose, no longer our copy.
            h.reset_pending.store(0, Ordering::Release);
            h.known.store(false, Ordering::Relaxed);
        }
        r
    };
    unlock_writer();
    r
}

/// # Safety
/// Same contract as sigaction(2).
#[no_mangle]
pub unsafe extern "C" fn sigaction(
    sig: c_int,
    act: *const libc::sigaction,
    old: *mut libc::sigaction,
) -> c_int {
    // SAFETY: pointers forwarded under the caller's contract.
    unsafe { program_sigaction(sig, act, old) }
}

/// # Safety
/// Same contract as signal(3) (BSD semantics, as glibc's).
#[no_mangle]
pub unsafe extern "C" fn signal(sig: c_int, handler: libc::sighandler_t) -> libc::sighandler_t {
    type SignalFn = unsafe extern "C" fn(c_int, libc::sighandler_t) -> libc::sighandler_t;
    if held(sig).is_none() {
        // SAFETY: `SignalFn` is signal(3)'s exact C signature, the type `REAL_SIGNAL` was
        // resolved for.
        if let Some(f) = unsafe { real::<SignalFn>(&sys::REAL_SIGNAL) } {
            // SAFETY: the real signal(3), arguments forwarded unchanged under the caller's
            // contract.
            return unsafe { f(sig, handler) };
        }
    }
    let mut act = empty_action();
    act.sa_sigaction = handler;
    act.sa_flags = libc::SA_RESTART;
    // SAFETY: valid local sigset; a signal number out of range only makes sigaddset fail,
    // and the sigaction below then reports the error.
    unsafe { libc::sigaddset(&mut act.sa_mask, sig) };
    let mut old = empty_action();
    // SAFETY: valid pointers to locals.
    let r = unsafe { program_sigaction(sig, &act, &mut old) };
    if r != 0 {
        libc::SIG_ERR
    } else {
        old.sa_sigaction
    }
}

// ------------------------------------------------------------------------------- fork

/// Fork child: the thread that was inside a probe pass does not exist here. Give the program
/// its dispositions back where only the probe held them (comm keeps SIGSEGV, as before), and
/// take back the writer flag a vanished parent thread may have held.
pub fn reset_after_fork() {
    WRITER.store(0, Ordering::Release);
    PROBE_THREAD.store(0, Ordering::SeqCst);
    for h in [&SEGV, &BUS] {
        if h.holders.load(Ordering::Relaxed) & PROBE != 0 {
            let _ = release(h, PROBE);
        }
    }
    PASS_OPEN.store(false, Ordering::SeqCst);
}
