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

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, AtomicUsize, Ordering};

use libc::{c_int, c_void, siginfo_t};

use crate::sys::{self, errno, real, set_errno};

extern "C" {
    /// glibc's public alias of `sigaction`: the real function even while we interpose
    /// `sigaction` itself (and usable before the constructor resolved anything).
    fn __sigaction(sig: c_int, act: *const libc::sigaction, old: *mut libc::sigaction) -> c_int;
}

/// One stored disposition (what the program set). The mask is the kernel's: 64 signals, the
/// first word of a glibc `sigset_t` (glibc fills the rest of a returned set with whatever its
/// stack held).
struct Disp {
    handler: AtomicUsize,
    flags: AtomicI32,
    mask: AtomicU64,
}

impl Disp {
    const fn new() -> Disp {
        Disp {
            handler: AtomicUsize::new(libc::SIG_DFL),
            flags: AtomicI32::new(0),
            mask: AtomicU64::new(0),
        }
    }
}

/// `holders` bit: communication detection (never released).
const COMM: u32 = 1;
/// `holders` bit: a probe pass.
const PROBE: u32 = 2;

/// One signal the agent may hold.
struct Held {
    sig: c_int,
    /// The program's disposition, double-buffered: a writer fills the inactive copy and then
    /// flips `current`, so the handler never waits for a writer.
    disps: [Disp; 2],
    current: AtomicUsize,
    /// `SA_RESETHAND`: the program handler the kernel would have reset to `SIG_DFL` by now, as
    /// it delivered it (0: none). Set by the agent's handler before it calls that handler (it
    /// cannot wait for a writer that it may have interrupted); [`Held::program`] applies it to
    /// whatever copy holds that handler; every store the program makes clears it.
    reset_pending: AtomicUsize,
    /// The agent's handler is the kernel's disposition (written under the writer flag).
    installed: AtomicBool,
    /// Who holds it ([`COMM`], [`PROBE`]; written under the writer flag).
    holders: AtomicU32,
    /// Not installed, and the copy is what the kernel holds (as the agent put it back): the
    /// next hold needs no query first. Cleared when the program sets the disposition.
    known: AtomicBool,
}

impl Held {
    const fn new(sig: c_int) -> Held {
        Held {
            sig,
            disps: [Disp::new(), Disp::new()],
            current: AtomicUsize::new(0),
            reset_pending: AtomicUsize::new(0),
            installed: AtomicBool::new(false),
            holders: AtomicU32::new(0),
            known: AtomicBool::new(false),
        }
    }

    fn disp(&self, i: usize) -> &Disp {
        if i & 1 == 0 {
            &self.disps[0]
        } else {
            &self.disps[1]
        }
    }

    /// Store `act` as the program's disposition (writer flag held).
    fn store_program(&self, act: &libc::sigaction) {
        let next = self.current.load(Ordering::Acquire) ^ 1;
        let d = self.disp(next);
        d.handler.store(act.sa_sigaction, Ordering::Relaxed);
        d.flags.store(act.sa_flags, Ordering::Relaxed);
        d.mask.store(mask_word(&act.sa_mask), Ordering::Relaxed);
        self.current.store(next, Ordering::Release);
    }

    /// The program's current disposition as a `sigaction` (its handler `SIG_DFL` once a
    /// one-shot handler was delivered: the kernel resets only the handler).
    fn program(&self) -> libc::sigaction {
        let d = self.disp(self.current.load(Ordering::Acquire));
        let mut a = empty_action();
        a.sa_sigaction = d.handler.load(Ordering::Relaxed);
        a.sa_flags = d.flags.load(Ordering::Relaxed);
        a.sa_mask = sigset_of(d.mask.load(Ordering::Relaxed));
        self.apply_reset(&mut a);
        a
    }

    /// The one-shot reset, if `a` holds the handler it is pending for.
    fn apply_reset(&self, a: &mut libc::sigaction) {
        let pending = self.reset_pending.load(Ordering::Acquire);
        if pending != 0 && a.sa_sigaction == pending {
            a.sa_sigaction = libc::SIG_DFL;
        }
    }

    /// The kernel action the agent installs for the current program disposition and holders.
    fn ours(&self) -> libc::sigaction {
        let comm = self.sig == libc::SIGSEGV && self.holders.load(Ordering::Relaxed) & COMM != 0;
        derive(&self.program(), on_fault as *const () as usize, comm)
    }

    /// Put the agent's action into the kernel (writer flag held): 0 or -1 as sigaction(2).
    fn install_ours(&self) -> c_int {
        let ours = self.ours();
        // SAFETY: a valid local action whose handler has the SA_SIGINFO signature and lives as
        // long as the process (the agent is never unloaded); null old pointer allowed.
        unsafe { __sigaction(self.sig, &ours, std::ptr::null_mut()) }
    }
}

static SEGV: Held = Held::new(libc::SIGSEGV);
static BUS: Held = Held::new(libc::SIGBUS);

fn held(sig: c_int) -> Option<&'static Held> {
    match sig {
        libc::SIGSEGV => Some(&SEGV),
        libc::SIGBUS => Some(&BUS),
        _ => None,
    }
}

/// Writers exclude each other with this flag (the holder's `pthread_self`, 0: free); it is held
/// across one copy and at most three `sigaction` calls, never across a call that could block.
static WRITER: AtomicUsize = AtomicUsize::new(0);

/// The calling thread's `pthread_self` (no system call: the thread pointer; usable in the
/// handler), a tag unique among the live threads.
fn this_thread() -> usize {
    // SAFETY: pthread_self has no preconditions; glibc's reads the thread pointer register
    // (async-signal-safe in practice, and allocation-free).
    unsafe { libc::pthread_self() as usize }
}

fn lock_writer() {
    let me = this_thread();
    while WRITER
        .compare_exchange(0, me, Ordering::Acquire, Ordering::Relaxed)
        .is_err()
    {
        std::hint::spin_loop();
    }
}

/// The writer flag, from the handler: false (not taken) if this very thread holds it (the
/// handler interrupted one of its writes); otherwise waits for the holder, another thread in
/// the middle of at most three `sigaction` calls.
fn lock_writer_from_handler() -> bool {
    let me = this_thread();
    loop {
        match WRITER.compare_exchange(0, me, Ordering::Acquire, Ordering::Relaxed) {
            Ok(_) => return true,
            Err(holder) if holder == me => return false,
            Err(_) => sys::sched_yield(),
        }
    }
}

fn unlock_writer() {
    WRITER.store(0, Ordering::Release);
}

fn empty_action() -> libc::sigaction {
    // SAFETY: an all-zero sigaction is valid plain data (SIG_DFL, no flags, empty mask).
    unsafe { std::mem::zeroed() }
}

/// The kernel's part of `s`: signals 1 to 64, its first 8 bytes.
fn mask_word(s: &libc::sigset_t) -> u64 {
    // SAFETY: a sigset_t is at least 8 bytes of plain data (128 on Linux/glibc); an unaligned
    // read of its first 8.
    unsafe { std::ptr::read_unaligned(s as *const libc::sigset_t as *const u64) }
}

/// The set holding the signals of `w` (signals 1 to 64), nothing else.
fn sigset_of(w: u64) -> libc::sigset_t {
    // SAFETY: an all-zero sigset_t is the empty set.
    let mut s: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: writes the first 8 of the 128 bytes of `s` (unaligned write of plain data).
    unsafe { std::ptr::write_unaligned(&mut s as *mut libc::sigset_t as *mut u64, w) };
    s
}

/// The kernel action for handler `ours` standing in for the program's disposition `prog`: the
/// program's stack, deferral and restart flags and its mask, so the kernel delivers to `ours`
/// as it would to the program's handler (a default or ignored disposition has neither). Under
/// communication detection (`comm`): always on the alternate stack where there is one, and
/// SIGSEGV never blocked.
fn derive(prog: &libc::sigaction, ours: usize, comm: bool) -> libc::sigaction {
    let mut a = empty_action();
    a.sa_sigaction = ours;
    a.sa_flags = libc::SA_SIGINFO;
    let h = prog.sa_sigaction;
    if h != libc::SIG_DFL && h != libc::SIG_IGN {
        a.sa_flags |= prog.sa_flags & (libc::SA_ONSTACK | libc::SA_NODEFER | libc::SA_RESTART);
        a.sa_mask = prog.sa_mask;
    }
    if comm {
        a.sa_flags |= libc::SA_ONSTACK | libc::SA_NODEFER;
        // SAFETY: `a.sa_mask` is a valid sigset and SIGSEGV a valid signal number.
        unsafe { libc::sigdelset(&mut a.sa_mask, libc::SIGSEGV) };
    }
    a
}

/// The same action as far as the kernel is concerned: handler, flags (but `SA_RESTORER`,
/// which glibc adds to every action it installs) and the kernel's 64 signals of the mask (glibc
/// returns whatever its stack held in the rest of a `sigset_t`).
fn same_action(a: &libc::sigaction, b: &libc::sigaction) -> bool {
    const SA_RESTORER: c_int = 0x0400_0000;
    a.sa_sigaction == b.sa_sigaction
        && a.sa_flags & !SA_RESTORER == b.sa_flags & !SA_RESTORER
        && mask_word(&a.sa_mask) == mask_word(&b.sa_mask)
}

/// Make the agent's handler the kernel's disposition of `h.sig` for `holder` (the program's
/// current one kept as its copy). Not for hooked paths (it may fail with a message).
fn hold(h: &Held, holder: u32) -> Result<(), String> {
    lock_writer();
    let was_installed = h.installed.load(Ordering::Acquire);
    let r = if was_installed {
        h.holders.fetch_or(holder, Ordering::Relaxed);
        // The holders decide the kernel's flags (comm's): derive them again.
        h.install_ours()
    } else {
        hold_locked(h, holder)
    };
    unlock_writer();
    if r != 0 {
        return Err(format!(
            "cannot install the agent's handler for signal {}: {}",
            h.sig,
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

fn hold_locked(h: &Held, holder: u32) -> c_int {
    // The copy from the last release is the kernel's action unless the program set one since
    // (then ask the kernel first); one changed behind the hooks shows in the swap below.
    let cur = if h.known.load(Ordering::Relaxed) {
        h.program()
    } else {
        let mut cur = empty_action();
        // SAFETY: a valid local to write the current action to; null new action (query only).
        if unsafe { __sigaction(h.sig, std::ptr::null(), &mut cur) } != 0 {
            return -1;
        }
        // Ours already (a fork child of a process inside a pass, say): the copy is the
        // program's.
        if cur.sa_sigaction != on_fault as *const () as usize {
            h.store_program(&cur);
        }
        cur
    };
    h.holders.fetch_or(holder, Ordering::Relaxed);
    let ours = h.ours();
    let mut was = empty_action();
    // SAFETY: valid locals; the handler has the SA_SIGINFO signature and lives as long as the
    // process.
    if unsafe { __sigaction(h.sig, &ours, &mut was) } != 0 {
        h.holders.fetch_and(!holder, Ordering::Relaxed);
        return -1;
    }
    if !same_action(&was, &cur) && was.sa_sigaction != on_fault as *const () as usize {
        // Changed without our hooks: that is the program's now.
        h.store_program(&was);
        h.install_ours();
    }
    h.known.store(false, Ordering::Relaxed);
    h.installed.store(true, Ordering::Release);
    0
}

/// Why letting go of a signal did not go as planned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReleaseNote {
    /// The kernel's action was no longer the agent's: the program changed it without the
    /// interposed calls (or the kernel reset it for a fault of a thread that blocked the
    /// signal). It was kept.
    ChangedBehindOurBack(c_int),
    /// Putting the program's disposition back failed (the agent's handler stays, passing
    /// everything on).
    RestoreFailed(c_int, String),
}

impl std::fmt::Display for ReleaseNote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReleaseNote::ChangedBehindOurBack(sig) => write!(
                f,
                "the kernel's disposition of signal {sig} was no longer the agent's when the \
                 pass ended (changed without the interposed sigaction/signal — a raw \
                 rt_sigaction, sysv_signal, sigset — or reset to the default action for a \
                 fault of the program); what the kernel held was kept"
            ),
            ReleaseNote::RestoreFailed(sig, e) => write!(
                f,
                "cannot give signal {sig} back to the program ({e}); the agent's handler stays \
                 and passes every fault on"
            ),
        }
    }
}

/// Let go of `h.sig` for `holder`; the last holder puts the program's disposition back.
fn release(h: &Held, holder: u32) -> Result<(), ReleaseNote> {
    lock_writer();
    h.holders.fetch_and(!holder, Ordering::Relaxed);
    let r = if !h.installed.load(Ordering::Acquire) {
        Ok(())
    } else if h.holders.load(Ordering::Relaxed) != 0 {
        h.install_ours();
        Ok(())
    } else {
        release_locked(h)
    };
    unlock_writer();
    r
}

fn release_locked(h: &Held) -> Result<(), ReleaseNote> {
    let prog = h.program();
    let mut was = empty_action();
    // SAFETY: valid locals; `prog` is the program's own disposition (its handler, if any, is
    // the program's function with the flags it chose).
    if unsafe { __sigaction(h.sig, &prog, &mut was) } != 0 {
        return Err(ReleaseNote::RestoreFailed(
            h.sig,
            std::io::Error::last_os_error().to_string(),
        ));
    }
    h.installed.store(false, Ordering::Release);
    if was.sa_sigaction != on_fault as *const () as usize {
        // SAFETY: puts back the action the kernel held a moment ago (valid local).
        unsafe { __sigaction(h.sig, &was, std::ptr::null_mut()) };
        return Err(ReleaseNote::ChangedBehindOurBack(h.sig));
    }
    h.known.store(true, Ordering::Relaxed);
    // A one-shot handler delivered through ours while we swapped: the kernel would have reset
    // it by now.
    let now = h.program();
    if !same_action(&now, &prog) {
        // SAFETY: a valid local: the program's disposition with its handler reset.
        unsafe { __sigaction(h.sig, &now, std::ptr::null_mut()) };
    }
    Ok(())
}

// ------------------------------------------------------------------------ the probe's passes

/// The thread inside a probe pass (`pthread_self`, 0: none).
static PROBE_THREAD: AtomicUsize = AtomicUsize::new(0);
/// A probe pass is open (one at a time: the holders bit is not a count).
static PASS_OPEN: AtomicBool = AtomicBool::new(false);
/// Faults of the probe resumed at a recovery point, for the process's life.
pub static PROBE_FAULTS: AtomicU64 = AtomicU64::new(0);
/// The last one: signal, `si_code`, address (for the log).
static LAST_FAULT: [AtomicU64; 3] = [const { AtomicU64::new(0) }; 3];

/// The last probe fault resumed: signal, `si_code` and address, e.g. "SIGBUS (code 2) at
/// 0x7f..." (for the log line of the pass it ended).
pub fn last_probe_fault() -> String {
    let [sig, code, addr] = LAST_FAULT.each_ref().map(|a| a.load(Ordering::Relaxed));
    let name = match sig as c_int {
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGBUS => "SIGBUS",
        _ => "no signal",
    };
    format!("{name} (code {}) at {addr:#x}", code as c_int)
}

/// One probe pass: while it exists, the calling thread's faults at the engine's guarded
/// instructions are resumed at their recovery points (the pass reports `Faulted`), and every
/// other fault goes where it would have gone without the agent. End it with [`ProbePass::end`]
/// as soon as the pass is over (dropping it ends it too, without the report).
pub struct ProbePass {
    open: bool,
}

impl ProbePass {
    /// Hold SIGSEGV and SIGBUS for a pass of the calling thread. Fails (nothing held) where the
    /// handler cannot be installed or faults cannot be resumed (not x86_64): the caller must
    /// not touch memory it does not own then.
    pub fn begin() -> Result<ProbePass, String> {
        if !preheat_engine::guard::SUPPORTED {
            return Err(
                "the probe's loads can be made fault-proof only on x86_64; probing a \
                        live process without that could crash it, so it is refused here"
                    .into(),
            );
        }
        if PASS_OPEN.swap(true, Ordering::SeqCst) {
            return Err("another probe pass is running".into());
        }
        if let Err(e) = hold(&SEGV, PROBE) {
            PASS_OPEN.store(false, Ordering::SeqCst);
            return Err(e);
        }
        if let Err(e) = hold(&BUS, PROBE) {
            let _ = release(&SEGV, PROBE);
            PASS_OPEN.store(false, Ordering::SeqCst);
            return Err(e);
        }
        PROBE_THREAD.store(this_thread(), Ordering::SeqCst);
        Ok(ProbePass { open: true })
    }

    /// End the pass: the program's dispositions go back into the kernel. Returns what did not
    /// go as planned (for the log).
    pub fn end(mut self) -> Vec<ReleaseNote> {
        self.close()
    }

    fn close(&mut self) -> Vec<ReleaseNote> {
        if !std::mem::replace(&mut self.open, false) {
            return Vec::new();
        }
        PROBE_THREAD.store(0, Ordering::SeqCst);
        let notes = [release(&BUS, PROBE), release(&SEGV, PROBE)]
            .into_iter()
            .filter_map(Result::err)
            .collect();
        PASS_OPEN.store(false, Ordering::SeqCst);
        notes
    }
}

impl Drop for ProbePass {
    fn drop(&mut self) {
        let _ = self.close();
    }
}

/// Resume a kernel-generated fault of the thread inside a probe pass at a guarded instruction.
fn resume_probe(sig: c_int, code: c_int, addr: usize, uctx: *mut c_void) -> bool {
    let probing = PROBE_THREAD.load(Ordering::SeqCst);
    if probing == 0 || uctx.is_null() || probing != this_thread() {
        return false;
    }
    let resumed = resume_at_fixup(uctx);
    if resumed {
        for (slot, v) in LAST_FAULT
            .iter()
            .zip([sig as u64, code as u64, addr as u64])
        {
            slot.store(v, Ordering::Relaxed);
        }
    }
    resumed
}

#[cfg(target_arch = "x86_64")]
fn resume_at_fixup(uctx: *mut c_void) -> bool {
    let uc = uctx as *mut libc::ucontext_t;
    // SAFETY: the kernel passes a valid, writable ucontext to an SA_SIGINFO handler; the saved
    // registers are plain integers. Writing the saved instruction pointer makes the thread
    // resume there when the handler returns (rt_sigreturn restores it).
    let Some(rip) = (unsafe { (*uc).uc_mcontext.gregs.get_mut(libc::REG_RIP as usize) }) else {
        return false;
    };
    match preheat_engine::guard::fixup(*rip as usize) {
        Some(to) => {
            *rip = to as i64;
            PROBE_FAULTS.fetch_add(1, Ordering::Relaxed);
            true
        }
        None => false,
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn resume_at_fixup(_uctx: *mut c_void) -> bool {
    false
}

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
        let back = sigset_of(mask_word(&s));
        // SAFETY: valid local sigsets.
        unsafe {
            assert_eq!(libc::sigismember(&back, libc::SIGUSR1), 1);
            assert_eq!(libc::sigismember(&back, 40), 1);
            assert_eq!(libc::sigismember(&back, libc::SIGSEGV), 0);
        }
    }

    extern "C" fn program_handler(_: c_int) {}

    /// `SA_RESETHAND` as the handler records it: a copy holding that handler reads `SIG_DFL`
    /// (flags and mask kept, as the kernel does) — also one stored again from the kernel (a
    /// pass that began after the kernel got the handler back) — until the program chooses a
    /// disposition.
    #[test]
    fn one_shot_handlers_reset_like_the_kernels() {
        let h = Held::new(libc::SIGUSR2);
        let handler = program_handler as *const () as usize;
        let mut once = empty_action();
        once.sa_sigaction = handler;
        once.sa_flags = libc::SA_RESETHAND | libc::SA_ONSTACK;
        h.store_program(&once);
        assert!(same_action(&h.program(), &once));
        h.reset_pending.store(handler, Ordering::Release);
        let reset = h.program();
        assert_eq!(reset.sa_sigaction, libc::SIG_DFL);
        assert_eq!(reset.sa_flags, once.sa_flags);
        h.store_program(&once);
        assert_eq!(h.program().sa_sigaction, libc::SIG_DFL);
        let mut other = once;
        other.sa_sigaction = libc::SIG_IGN;
        h.store_program(&other);
        assert!(same_action(&h.program(), &other));
    }

    /// The kernel action stands in for the program's: its stack, deferral, restart flags and
    /// mask, never its one-shot flag; nothing of a default disposition; comm's additions.
    #[test]
    fn derived_actions_deliver_as_the_program_asked() {
        let mut prog = empty_action();
        prog.sa_sigaction = program_handler as *const () as usize;
        prog.sa_flags = libc::SA_ONSTACK | libc::SA_RESTART | libc::SA_RESETHAND;
        // SAFETY: valid local sigset and signal numbers.
        unsafe {
            libc::sigaddset(&mut prog.sa_mask, libc::SIGUSR1);
            libc::sigaddset(&mut prog.sa_mask, libc::SIGSEGV);
        }
        let ours = 0x1234;
        let a = derive(&prog, ours, false);
        assert_eq!(a.sa_sigaction, ours);
        assert_eq!(
            a.sa_flags,
            libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_RESTART
        );
        assert_eq!(mask_word(&a.sa_mask), mask_word(&prog.sa_mask));
        prog.sa_flags = libc::SA_NODEFER;
        assert_eq!(
            derive(&prog, ours, false).sa_flags,
            libc::SA_SIGINFO | libc::SA_NODEFER
        );
        let c = derive(&prog, ours, true);
        assert_eq!(
            c.sa_flags,
            libc::SA_SIGINFO | libc::SA_NODEFER | libc::SA_ONSTACK
        );
        // SAFETY: valid local sigset.
        unsafe {
            assert_eq!(libc::sigismember(&c.sa_mask, libc::SIGSEGV), 0);
            assert_eq!(libc::sigismember(&c.sa_mask, libc::SIGUSR1), 1);
        }
        let mut dfl = prog;
        dfl.sa_sigaction = libc::SIG_DFL;
        let d = derive(&dfl, ours, false);
        assert_eq!(d.sa_flags, libc::SA_SIGINFO);
        assert_eq!(mask_word(&d.sa_mask), 0);
        assert!(same_action(&d, &derive(&dfl, ours, false)));
        assert!(!same_action(&d, &a));
    }
}
