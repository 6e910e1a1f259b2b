//! The probe's passes: while one is open, a fault of the probing thread at a guarded
//! instruction resumes at its recovery point.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use libc::{c_int, c_void};

use super::disp::*;

/// The thread inside a probe pass (`pthread_self`, 0: none).
pub(super) static PROBE_THREAD: AtomicUsize = AtomicUsize::new(0);
/// A probe pass is open (one at a time: the holders bit is not a count).
pub(super) static PASS_OPEN: AtomicBool = AtomicBool::new(false);
/// Faults of the probe resumed at a recovery point, for the process's life.
pub static PROBE_FAULTS: AtomicU64 = AtomicU64::new(0);
/// The last one: signal, `si_code`, address (for the log).
pub(super) static LAST_FAULT: [AtomicU64; 3] = [const { AtomicU64::new(0) }; 3];

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

    pub(super) fn close(&mut self) -> Vec<ReleaseNote> {
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
pub(super) fn resume_probe(sig: c_int, code: c_int, addr: usize, uctx: *mut c_void) -> bool {
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
pub(super) fn resume_at_fixup(uctx: *mut c_void) -> bool {
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
pub(super) fn resume_at_fixup(_uctx: *mut c_void) -> bool {
    false
}
