//! Native code-line tracing by single-stepping a thread with ptrace (x86_64 Linux).
//!
//! Ground truth for *code* lines that needs no binary translation: the `trace` backend runs the
//! server under Valgrind, whose emulated CPU makes glibc and other CPU-dispatching code choose
//! different paths than a native run. Here the real thread is stopped after every instruction
//! and its instruction pointer recorded — about 5–20 µs per instruction in this machine kind's
//! guests (a trap and two switches each; run the tracer on the traced thread's CPU, where it is
//! a switch on one CPU instead of a wake-up of another), so only for short sections (one
//! request: thousands of instructions for a C server, millions for a managed runtime). Data
//! addresses are not recorded.
//!
//! Use: [`StepTracer::attach`] a thread that is blocked in its event-wait call, let a request
//! arrive, [`StepTracer::trace_until_wait`] steps until the thread is about to enter an
//! event-wait syscall again — or, once the request was answered, a futex wait: a pool thread
//! handed the request (a JVM's executor) parks on a futex between requests — then detach (on
//! drop). Requires ptrace permission (root or `kernel.yama.ptrace_scope` = 0 with the same
//! user).
//!
//! Signals reach the thread as they would untraced: a signal stop during the trace is passed
//! on with the next step (a runtime that uses its own signals — the JVM's safepoint polls and
//! implicit null checks fault on purpose, Go preempts with `SIGURG` — otherwise re-executes the
//! faulting instruction for ever, or loses the signal).

use std::collections::BTreeSet;
use std::io;

/// `futex` and `futex_waitv` (x86_64 numbers), and the futex operations that wait.
const FUTEX: u64 = 202;
const FUTEX_WAITV: u64 = 449;
const FUTEX_WAIT: u64 = 0;
const FUTEX_WAIT_BITSET: u64 = 9;
const FUTEX_CMD_MASK: u64 = 0x7f;

/// Whether syscall `nr`, with `a1` its second argument (a futex operation), parks the thread.
fn is_futex_wait(nr: u64, a1: u64) -> bool {
    nr == FUTEX_WAITV
        || (nr == FUTEX && matches!(a1 & FUTEX_CMD_MASK, FUTEX_WAIT | FUTEX_WAIT_BITSET))
}

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
    /// event-wait call or a futex wait at a moment when `done()` is true (the caller's signal
    /// that the request was answered), or `max_steps`. A thread stopped inside a blocking call
    /// resumes it on the first step: that step returns only when the call does; waits entered
    /// before `done()` (e.g. the server's own wait after the attach interrupted it, a lock
    /// taken while serving) are stepped through. A signal that stops the thread meanwhile is
    /// delivered with the next step.
    pub fn trace_until_wait(
        &mut self,
        max_steps: u64,
        done: &dyn Fn() -> bool,
    ) -> io::Result<StepTrace> {
        // A step into a blocking call returns only when the call does; a request that never
        // reaches the server would leave the wait below blocked for ever. A watchdog stops the
        // tracee with SIGSTOP when one step takes longer than STEP_LIMIT: the wait returns, the
        // trace ends with an error, and the detach (signal 0) discards the SIGSTOP.
        let watch = Watchdog::start(self.tid);
        let r = self.steps(max_steps, done, &watch);
        watch.finish();
        r
    }

    fn steps(
        &mut self,
        max_steps: u64,
        done: &dyn Fn() -> bool,
        watch: &Watchdog,
    ) -> io::Result<StepTrace> {
        let mut out = StepTrace::default();
        let mut prev: Option<u64> = None;
        // A signal the thread stopped with, delivered with the next step.
        let mut pending: usize = 0;
        for _ in 0..max_steps {
            watch.step_started();
            // SAFETY: single-step the stopped tracee, delivering `pending` (0: none, else a
            // signal number it stopped with); no memory passed.
            if unsafe { libc::ptrace(libc::PTRACE_SINGLESTEP, self.tid, 0usize, pending) } != 0 {
                return Err(errno_err("PTRACE_SINGLESTEP"));
            }
            pending = 0;
            let st = self.wait_stop()?;
            if watch.fired() {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "the traced thread did not stop within {STEP_LIMIT:?} (blocked in a call \
                         nothing answered: did the request reach the server?)"
                    ),
                ));
            }
            if libc::WIFEXITED(st) || libc::WIFSIGNALED(st) {
                self.attached = false;
                return Err(io::Error::other("the traced thread exited"));
            }
            if let Some(sig) = passed_signal(st) {
                // A signal-delivery stop: nothing executed; the signal goes on with the next
                // step (its handler, if any, is traced as the thread's own code).
                pending = sig as usize;
                continue;
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
            // About to execute `syscall` (0f 05) for an event wait or a futex wait? (The
            // instruction is read only where the registers name such a call: one system call
            // fewer per step elsewhere.)
            let waits = WAIT_SYSCALLS.contains(&regs.rax) || is_futex_wait(regs.rax, regs.rsi);
            if waits && self.peek(ip)? & 0xffff == 0x050f && done() {
                out.reached_wait = true;
                return Ok(out);
            }
        }
        Ok(out)
    }
}

/// The signal a wait status reports a signal-delivery stop for, to be passed on: not the
/// trap of a step, not a group stop or another ptrace event (`status >> 16` set), not the
/// watchdog's `SIGSTOP`.
fn passed_signal(status: i32) -> Option<i32> {
    if !libc::WIFSTOPPED(status) || status >> 16 != 0 {
        return None;
    }
    let sig = libc::WSTOPSIG(status);
    (sig != libc::SIGTRAP && sig != libc::SIGSTOP).then_some(sig)
}

/// The longest one single step may take: a step into a blocking call returns when the call does
/// (the request under trace arrives within milliseconds; nothing legitimate waits this long).
const STEP_LIMIT: std::time::Duration = std::time::Duration::from_secs(20);

/// Stops a tracee whose current step has taken longer than [`STEP_LIMIT`] (see
/// [`StepTracer::trace_until_wait`]). One thread per trace, parked between checks.
struct Watchdog {
    shared: std::sync::Arc<WatchState>,
    thread: Option<std::thread::JoinHandle<()>>,
}

struct WatchState {
    /// CLOCK_MONOTONIC ns when the current step started (0: none).
    step_ns: std::sync::atomic::AtomicU64,
    fired: std::sync::atomic::AtomicBool,
    stop: std::sync::atomic::AtomicBool,
}

impl Watchdog {
    fn start(tid: i32) -> Watchdog {
        use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
        let shared = std::sync::Arc::new(WatchState {
            step_ns: AtomicU64::new(0),
            fired: AtomicBool::new(false),
            stop: AtomicBool::new(false),
        });
        let st = shared.clone();
        let thread = std::thread::Builder::new()
            .name("step-watchdog".into())
            .spawn(move || {
                let limit = STEP_LIMIT.as_nanos() as u64;
                while !st.stop.load(Ordering::Acquire) {
                    std::thread::park_timeout(std::time::Duration::from_millis(100));
                    let t = st.step_ns.load(Ordering::Acquire);
                    if t != 0 && crate::time::now_ns().saturating_sub(t) > limit {
                        st.fired.store(true, Ordering::Release);
                        // SAFETY: tkill sends SIGSTOP to one thread id; no memory involved. A
                        // stale tid (the tracee exited) at worst fails with ESRCH.
                        unsafe { libc::syscall(libc::SYS_tkill, tid, libc::SIGSTOP) };
                        return;
                    }
                }
            })
            .ok();
        Watchdog { shared, thread }
    }

    #[inline]
    fn step_started(&self) {
        self.shared
            .step_ns
            .store(crate::time::now_ns(), std::sync::atomic::Ordering::Release);
    }

    fn fired(&self) -> bool {
        self.shared.fired.load(std::sync::atomic::Ordering::Acquire)
    }

    fn finish(mut self) {
        self.shared
            .stop
            .store(true, std::sync::atomic::Ordering::Release);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn futex_waits_are_told_from_other_futex_calls() {
        // FUTEX_WAIT and FUTEX_WAIT_BITSET, private or not; futex_waitv.
        for op in [0, 9, 128, 128 | 9] {
            assert!(is_futex_wait(FUTEX, op), "{op}");
        }
        assert!(is_futex_wait(FUTEX_WAITV, 0));
        // FUTEX_WAKE (1, private 129) and other calls are not.
        for op in [1, 129, 5] {
            assert!(!is_futex_wait(FUTEX, op), "{op}");
        }
        assert!(!is_futex_wait(0, 0));
    }

    #[test]
    fn only_signal_delivery_stops_are_passed_on() {
        // Stop statuses: (signal << 8) | 0x7f; ptrace events in the bits above 16.
        let stop = |sig: i32| (sig << 8) | 0x7f;
        assert_eq!(passed_signal(stop(libc::SIGSEGV)), Some(libc::SIGSEGV));
        assert_eq!(passed_signal(stop(libc::SIGURG)), Some(libc::SIGURG));
        assert_eq!(passed_signal(stop(libc::SIGTRAP)), None);
        assert_eq!(passed_signal(stop(libc::SIGSTOP)), None);
        // PTRACE_EVENT_STOP (128) with SIGSTOP: a group stop.
        assert_eq!(passed_signal(stop(libc::SIGSTOP) | (128 << 16)), None);
        // Exited (status 0) is no stop.
        assert_eq!(passed_signal(0), None);
    }
}
