//! The program's dispositions of SIGSEGV and SIGBUS while the agent holds them: a double-buffered
//! copy per signal, the writers' spin flag, and taking and giving back the kernel's disposition.

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, AtomicUsize, Ordering};

use libc::c_int;

use super::{__sigaction, on_fault};
use crate::sys;

/// stack held).
pub(super) struct Disp {
    pub(super) handler: AtomicUsize,
    pub(super) flags: AtomicI32,
    pub(super) mask: AtomicU64,
}

impl Disp {
    pub(super) const fn new() -> Disp {
        Disp {
            handler: AtomicUsize::new(libc::SIG_DFL),
            flags: AtomicI32::new(0),
            mask: AtomicU64::new(0),
        }
    }
}

/// `holders` bit: communication detection (never released).
pub(super) const COMM: u32 = 1;
/// `holders` bit: a probe pass.
pub(super) const PROBE: u32 = 2;

/// One signal the agent may hold.
pub(super) struct Held {
    pub(super) sig: c_int,
    /// The program's disposition, double-buffered: a writer fills the inactive copy and then
    /// flips `current`, so the handler never waits for a writer.
    pub(super) disps: [Disp; 2],
    pub(super) current: AtomicUsize,
    /// `SA_RESETHAND`: the program handler the kernel would have reset to `SIG_DFL` by now, as
    /// it delivered it (0: none). Set by the agent's handler before it calls that handler (it
    /// cannot wait for a writer that it may have interrupted); [`Held::program`] applies it to
    /// whatever copy holds that handler; every store the program makes clears it.
    pub(super) reset_pending: AtomicUsize,
    /// The agent's handler is the kernel's disposition (written under the writer flag).
    pub(super) installed: AtomicBool,
    /// Who holds it ([`COMM`], [`PROBE`]; written under the writer flag).
    pub(super) holders: AtomicU32,
    /// Not installed, and the copy is what the kernel holds (as the agent put it back): the
    /// next hold needs no query first. Cleared when the program sets the disposition.
    pub(super) known: AtomicBool,
}

impl Held {
    pub(super) const fn new(sig: c_int) -> Held {
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

    pub(super) fn disp(&self, i: usize) -> &Disp {
        if i & 1 == 0 {
            &self.disps[0]
        } else {
            &self.disps[1]
        }
    }

    /// Store `act` as the program's disposition (writer flag held).
    pub(super) fn store_program(&self, act: &libc::sigaction) {
        let next = self.current.load(Ordering::Acquire) ^ 1;
        let d = self.disp(next);
        d.handler.store(act.sa_sigaction, Ordering::Relaxed);
        d.flags.store(act.sa_flags, Ordering::Relaxed);
        d.mask.store(mask_word(&act.sa_mask), Ordering::Relaxed);
        self.current.store(next, Ordering::Release);
    }

    /// The program's current disposition as a `sigaction` (its handler `SIG_DFL` once a
    /// one-shot handler was delivered: the kernel resets only the handler).
    pub(super) fn program(&self) -> libc::sigaction {
        let d = self.disp(self.current.load(Ordering::Acquire));
        let mut a = empty_action();
        a.sa_sigaction = d.handler.load(Ordering::Relaxed);
        a.sa_flags = d.flags.load(Ordering::Relaxed);
        a.sa_mask = sigset_of(d.mask.load(Ordering::Relaxed));
        self.apply_reset(&mut a);
        a
    }

    /// The one-shot reset, if `a` holds the handler it is pending for.
    pub(super) fn apply_reset(&self, a: &mut libc::sigaction) {
        let pending = self.reset_pending.load(Ordering::Acquire);
        if pending != 0 && a.sa_sigaction == pending {
            a.sa_sigaction = libc::SIG_DFL;
        }
    }

    /// The kernel action the agent installs for the current program disposition and holders.
    pub(super) fn ours(&self) -> libc::sigaction {
        let comm = self.sig == libc::SIGSEGV && self.holders.load(Ordering::Relaxed) & COMM != 0;
        derive(&self.program(), on_fault as *const () as usize, comm)
    }

    /// Put the agent's action into the kernel (writer flag held): 0 or -1 as sigaction(2).
    pub(super) fn install_ours(&self) -> c_int {
        let ours = self.ours();
        // SAFETY: a valid local action whose handler has the SA_SIGINFO signature and lives as
        // long as the process (the agent is never unloaded); null old pointer allowed.
        unsafe { __sigaction(self.sig, &ours, std::ptr::null_mut()) }
    }
}

pub(super) static SEGV: Held = Held::new(libc::SIGSEGV);
pub(super) static BUS: Held = Held::new(libc::SIGBUS);

pub(super) fn held(sig: c_int) -> Option<&'static Held> {
    match sig {
        libc::SIGSEGV => Some(&SEGV),
        libc::SIGBUS => Some(&BUS),
        _ => None,
    }
}

/// Writers exclude each other with this flag (the holder's `pthread_self`, 0: free); it is held
/// across one copy and at most three `sigaction` calls, never across a call that could block.
pub(super) static WRITER: AtomicUsize = AtomicUsize::new(0);

/// The calling thread's `pthread_self` (no system call: the thread pointer; usable in the
/// handler), a tag unique among the live threads.
pub(super) fn this_thread() -> usize {
    // SAFETY: pthread_self has no preconditions; glibc's reads the thread pointer register
    // (async-signal-safe in practice, and allocation-free).
    unsafe { libc::pthread_self() as usize }
}

pub(super) fn lock_writer() {
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
pub(super) fn lock_writer_from_handler() -> bool {
    let me = this_thread();
    loop {
        match WRITER.compare_exchange(0, me, Ordering::Acquire, Ordering::Relaxed) {
            Ok(_) => return true,
            Err(holder) if holder == me => return false,
            Err(_) => sys::sched_yield(),
        }
    }
}

pub(super) fn unlock_writer() {
    WRITER.store(0, Ordering::Release);
}

pub(super) fn empty_action() -> libc::sigaction {
    // SAFETY: an all-zero sigaction is valid plain data (SIG_DFL, no flags, empty mask).
    unsafe { std::mem::zeroed() }
}

/// The kernel's part of `s`: signals 1 to 64, its first 8 bytes.
pub(super) fn mask_word(s: &libc::sigset_t) -> u64 {
    // SAFETY: a sigset_t is at least 8 bytes of plain data (128 on Linux/glibc); an unaligned
    // read of its first 8.
    unsafe { std::ptr::read_unaligned(s as *const libc::sigset_t as *const u64) }
}

/// The set holding the signals of `w` (signals 1 to 64), nothing else.
pub(super) fn sigset_of(w: u64) -> libc::sigset_t {
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
pub(super) fn derive(prog: &libc::sigaction, ours: usize, comm: bool) -> libc::sigaction {
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
pub(super) fn same_action(a: &libc::sigaction, b: &libc::sigaction) -> bool {
    const SA_RESTORER: c_int = 0x0400_0000;
    a.sa_sigaction == b.sa_sigaction
        && a.sa_flags & !SA_RESTORER == b.sa_flags & !SA_RESTORER
        && mask_word(&a.sa_mask) == mask_word(&b.sa_mask)
}

/// Make the agent's handler the kernel's disposition of `h.sig` for `holder` (the program's
/// current one kept as its copy). Not for hooked paths (it may fail with a message).
pub(super) fn hold(h: &Held, holder: u32) -> Result<(), String> {
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

pub(super) fn hold_locked(h: &Held, holder: u32) -> c_int {
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
pub(super) fn release(h: &Held, holder: u32) -> Result<(), ReleaseNote> {
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

pub(super) fn release_locked(h: &Held) -> Result<(), ReleaseNote> {
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
