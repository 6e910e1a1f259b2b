//! Native code-line tracing by single-stepping a thread with ptrace (x86_64 Linux).
//!
//! Ground truth for *code* lines that needs no binary translation: the `trace` backend runs the
//! server under Valgrind, whose emulated CPU makes glibc and other CPU-dispatching code choose
//! different paths than a native run. Here the real thread is stopped after every instruction
//! and its instruction pointer recorded — about 5–10 µs per instruction, so only for short
//! sections (one request: a few thousand instructions). Data addresses are not recorded.
//!
//! Use: [`StepTracer::attach`] a thread that is blocked in its event-wait call, let a request
//! arrive, [`StepTracer::trace_until_wait`] steps until the thread is about to enter an
//! event-wait syscall again, then detach (on drop). Requires ptrace permission (root or
//! `kernel.yama.ptrace_scope` = 0 with the same user).

use std::collections::BTreeSet;
use std::io;

/// Event-wait syscalls that end a busy period (x86_64 numbers).
const WAIT_SYSCALLS: [u64; 7] = [
    232, // epoll_wait
    281, // epoll_pwait
    441, // epoll_pwait2
    7,   // poll
    271, // ppoll
    23,  // select
    270, // pselect6
];

pub struct StepTracer {
    tid: i32,
    attached: bool,
}

/// What one traced section executed.
#[derive(Debug, Clone, Default)]
pub struct StepTrace {
    /// Distinct 64-byte code lines (addresses) the thread executed.
    pub lines: BTreeSet<u64>,
    pub instructions: u64,
    /// The section ended at an event-wait syscall (false: the step budget ran out).
    pub reached_wait: bool,
}

fn errno_err(what: &str) -> io::Error {
    let e = io::Error::last_os_error();
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

impl StepTracer {
    /// Seize `tid` and stop it (PTRACE_SEIZE + PTRACE_INTERRUPT), waiting until it stops.
    pub fn attach(tid: u32) -> io::Result<StepTracer> {
        let tid = tid as i32;
        // SAFETY: ptrace with null addr/data for SEIZE and INTERRUPT; no memory is passed.
        unsafe {
            if libc::ptrace(libc::PTRACE_SEIZE, tid, 0usize, 0usize) != 0 {
                return Err(errno_err("PTRACE_SEIZE"));
            }
            if libc::ptrace(libc::PTRACE_INTERRUPT, tid, 0usize, 0usize) != 0 {
                let e = errno_err("PTRACE_INTERRUPT");
                libc::ptrace(libc::PTRACE_DETACH, tid, 0usize, 0usize);
                return Err(e);
            }
        }
        let t = StepTracer {
            tid,
            attached: true,
        };
        t.wait_stop()?;
        Ok(t)
    }

    fn wait_stop(&self) -> io::Result<i32> {
        let mut status = 0i32;
        loop {
            // SAFETY: `status` is a valid out-pointer; __WALL so threads (not only children) work.
            let r = unsafe { libc::waitpid(self.tid, &mut status, libc::__WALL) };
            if r == self.tid {
                return Ok(status);
            }
            if r < 0 && io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
                return Err(errno_err("waitpid"));
            }
        }
    }

    fn regs(&self) -> io::Result<libc::user_regs_struct> {
        // SAFETY: zeroed is a valid bit pattern for this plain C struct.
        let mut regs: libc::user_regs_struct = unsafe { std::mem::zeroed() };
        // SAFETY: PTRACE_GETREGS writes one user_regs_struct to the pointer we pass.
        let r = unsafe {
            libc::ptrace(
                libc::PTRACE_GETREGS,
                self.tid,
                0usize,
                &mut regs as *mut libc::user_regs_struct,
            )
        };
        if r != 0 {
            return Err(errno_err("PTRACE_GETREGS"));
        }
        Ok(regs)
    }

    /// Read 8 bytes of the tracee's memory at `addr`.
    fn peek(&self, addr: u64) -> io::Result<u64> {
        // SAFETY: PEEKTEXT reads the tracee's memory; errors are reported through errno.
        unsafe {
            *libc::__errno_location() = 0;
            let v = libc::ptrace(libc::PTRACE_PEEKTEXT, self.tid, addr as usize, 0usize);
            if v == -1 && *libc::__errno_location() != 0 {
                return Err(errno_err("PTRACE_PEEKTEXT"));
            }
            Ok(v as u64)
        }
    }

    /// Single-step until the thread is about to execute a `syscall` instruction for an
    /// event-wait call at a moment when `done()` is true (the caller's signal that the request
    /// was answered), or `max_steps`. A thread stopped inside a blocking call resumes it on the
    /// first step: that step returns only when the call does; waits entered before `done()`
    /// (e.g. the server's own wait after the attach interrupted it) are stepped through.
    pub fn trace_until_wait(
        &mut self,
        max_steps: u64,
        done: &dyn Fn() -> bool,
    ) -> io::Result<StepTrace> {
        let mut out = StepTrace::default();
        let mut prev: Option<u64> = None;
        for _ in 0..max_steps {
            // SAFETY: single-step the stopped tracee; no memory passed.
            if unsafe { libc::ptrace(libc::PTRACE_SINGLESTEP, self.tid, 0usize, 0usize) } != 0 {
                return Err(errno_err("PTRACE_SINGLESTEP"));
            }
            let st = self.wait_stop()?;
            if libc::WIFEXITED(st) || libc::WIFSIGNALED(st) {
                self.attached = false;
                return Err(io::Error::other("the traced thread exited"));
            }
            let regs = self.regs()?;
            let ip = regs.rip;
            out.instructions += 1;
            // The line of this instruction, and of the bytes since the previous one when the
            // step was sequential (an instruction can straddle two lines).
            out.lines.insert(ip & !63);
            if let Some(p) = prev {
                if ip > p && ip - p <= 15 {
                    let mut l = p & !63;
                    while l <= (ip - 1) & !63 {
                        out.lines.insert(l);
                        l += 64;
                    }
                }
            }
            prev = Some(ip);
            // About to execute `syscall` (0f 05) with an event-wait number in rax?
            let word = self.peek(ip)?;
            if word & 0xffff == 0x050f && WAIT_SYSCALLS.contains(&regs.rax) && done() {
                out.reached_wait = true;
                return Ok(out);
            }
        }
        Ok(out)
    }
}

impl Drop for StepTracer {
    fn drop(&mut self) {
        if self.attached {
            // SAFETY: detach the (stopped) tracee, letting it run on; no memory passed.
            unsafe { libc::ptrace(libc::PTRACE_DETACH, self.tid, 0usize, 0usize) };
        }
    }
}
