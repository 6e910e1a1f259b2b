//! How a requesting thread waits for an operation another thread completes (paper §2: the CPU
//! of a blocked requester sleeps; an anticipatory wakeup makes it ready shortly before the
//! predicted completion).
//!
//! The completer publishes completion through a [`Completion`] (an atomic word plus
//! timestamps; it always wakes futex waiters — the same primitive `std`'s `Condvar` uses
//! underneath, but with a nanosecond relative timeout). The requester waits by one of three
//! [`WaitPolicy`]s, and the [`WaitOutcome`] says what it saw:
//!
//! * `Block`: sleep until woken by the completion (the paper's "default"/interrupt style);
//! * `Spin`: poll from submission on (the CPU never sleeps: the paper's "disable all CPU
//!   sleeps" / busy-waiting);
//! * `BlockUntil(t)`: sleep until `t` (a timer wake-up, planned from a prediction), then poll.
//!
//! **Awake time** is user-visible: the time from the requester's last return from a blocking
//! call (or from submission, if it never blocked) until it saw the completion. It does not include
//! the kernel's wake-up path. **Censored** means the requester's last wake-up found the
//! operation already complete, so it only knows `latency ≤ resumed − submit` (always the case for
//! `Block`, unless the operation completed before the requester got to block at all).

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use preheat_engine::os::{futex_wait, futex_wake, gettid};
use preheat_engine::time::now_ns;

/// Completion state shared between a requester and the thread that completes its operation.
#[derive(Debug, Default)]
pub struct Completion {
    state: AtomicU32,
    start_ns: AtomicU64,
    done_ns: AtomicU64,
    alive: AtomicBool,
}

const PENDING: u32 = 0;
const DONE: u32 = 1;

impl Completion {
    pub fn new() -> Self {
        Self {
            alive: AtomicBool::new(true),
            ..Default::default()
        }
    }

    /// Arm for the next operation (requester, before submitting).
    pub fn reset(&self) {
        self.start_ns.store(0, Ordering::Relaxed);
        self.done_ns.store(0, Ordering::Relaxed);
        self.state.store(PENDING, Ordering::Release);
    }

    /// The completer started working on the operation.
    pub fn mark_started(&self, t: u64) {
        self.start_ns.store(t, Ordering::Relaxed);
    }

    /// Publish completion at time `t` and wake a blocked requester.
    pub fn complete(&self, t: u64) {
        self.done_ns.store(t, Ordering::Relaxed);
        self.state.store(DONE, Ordering::Release);
        futex_wake(&self.state, 1);
    }

    /// The completer is gone (its thread exits): waiters stop waiting.
    pub fn mark_dead(&self) {
        self.alive.store(false, Ordering::Release);
        futex_wake(&self.state, 1);
    }

    #[inline]
    pub fn is_done(&self) -> bool {
        self.state.load(Ordering::Acquire) == DONE
    }

    fn is_alive(&self) -> bool {
        self.alive.load(Ordering::Acquire)
    }

    pub fn started_ns(&self) -> u64 {
        self.start_ns.load(Ordering::Relaxed)
    }

    /// Completion timestamp taken by the completer (valid once [`Self::is_done`]).
    pub fn done_ns(&self) -> u64 {
        self.done_ns.load(Ordering::Relaxed)
    }
}

/// How the requester waits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitPolicy {
    Block,
    Spin,
    /// Block until this `CLOCK_MONOTONIC` ns, then spin.
    BlockUntil(u64),
}

/// What the requester saw.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WaitOutcome {
    /// When the requester saw the completion.
    pub seen_ns: u64,
    /// Its last return from a blocking call (or the submit time if it never blocked).
    pub resumed_ns: u64,
    /// Whether it blocked at all.
    pub blocked: bool,
    /// The last wake-up found the operation already done.
    pub censored: bool,
    /// The completer died before completing.
    pub abandoned: bool,
}

impl WaitOutcome {
    /// User-visible awake time (spinning plus time since the last wake-up), ns.
    pub fn awake_ns(&self) -> u64 {
        self.seen_ns.saturating_sub(self.resumed_ns)
    }
}

/// Safety net: blocking waits re-check liveness at least this often.
const LIVENESS_NS: u64 = 200_000_000;

/// Wait for `c` (armed before `submit_ns`) according to `policy`.
pub fn wait(c: &Completion, policy: WaitPolicy, submit_ns: u64) -> WaitOutcome {
    let mut resumed = submit_ns;
    let mut blocked = false;
    let deadline = match policy {
        WaitPolicy::Spin => 0,
        WaitPolicy::Block => u64::MAX,
        WaitPolicy::BlockUntil(t) => t,
    };
    loop {
        if c.is_done() {
            let seen = now_ns();
            return WaitOutcome {
                seen_ns: seen,
                resumed_ns: resumed,
                blocked,
                // Found done on a wake-up. Done before the requester ever blocked means it was
                // held up (preempted) between submitting and waiting: not a late wake-up.
                censored: blocked,
                abandoned: false,
            };
        }
        if !c.is_alive() {
            return abandoned(resumed, blocked);
        }
        let now = now_ns();
        if now >= deadline {
            break;
        }
        let timeout = (deadline - now).min(LIVENESS_NS);
        futex_wait(&c.state, PENDING, Some(timeout));
        blocked = true;
        resumed = now_ns();
    }
    // Spin phase: the requester is awake when the completion arrives.
    let mut i: u32 = 0;
    loop {
        if c.is_done() {
            return WaitOutcome {
                seen_ns: now_ns(),
                resumed_ns: resumed,
                blocked,
                censored: false,
                abandoned: false,
            };
        }
        std::hint::spin_loop();
        i = i.wrapping_add(1);
        if i & 31 == 0 {
            if !c.is_alive() {
                return abandoned(resumed, blocked);
            }
            // Let a completer that shares this CPU run at once (a few µs between yields; when
            // nothing else is runnable the yield returns immediately and the CPU stays awake).
            std::thread::yield_now();
        }
    }
}

fn abandoned(resumed: u64, blocked: bool) -> WaitOutcome {
    WaitOutcome {
        seen_ns: now_ns(),
        resumed_ns: resumed,
        blocked,
        censored: false,
        abandoned: true,
    }
}

/// Spin (with occasional yields) until `deadline_ns`; sleeps first while more than
/// `sleep_above_ns` remain. Used by the emulated device to deliver a completion on time.
pub fn pause_until(deadline_ns: u64, sleep_above_ns: u64) {
    let mut i: u32 = 0;
    loop {
        let now = now_ns();
        if now >= deadline_ns {
            return;
        }
        let rem = deadline_ns - now;
        if rem > sleep_above_ns {
            std::thread::sleep(std::time::Duration::from_nanos(rem - sleep_above_ns));
            continue;
        }
        std::hint::spin_loop();
        i = i.wrapping_add(1);
        if i & 511 == 0 {
            std::thread::yield_now();
        }
    }
}

/// Set the calling thread's timer slack (default 50 µs on Linux, which would delay every timed
/// wake-up by up to that much) through `/proc/<tid>/timerslack_ns`. Only this thread changes;
/// no machine state. Returns the value in force afterwards.
pub fn set_own_timer_slack(ns: u64) -> io::Result<u64> {
    let path = format!("/proc/{}/timerslack_ns", gettid());
    std::fs::write(&path, ns.to_string())?;
    Ok(std::fs::read_to_string(&path)?.trim().parse().unwrap_or(ns))
}

/// `/proc/loadavg`'s first three fields (1, 5, 15 min), to label how busy the machine was.
pub fn loadavg() -> Option<[f64; 3]> {
    let s = std::fs::read_to_string("/proc/loadavg").ok()?;
    let mut it = s.split_whitespace().map(|f| f.parse::<f64>().ok());
    Some([it.next()??, it.next()??, it.next()??])
}

/// The calling thread's CPU time from the scheduler (`/proc/thread-self/schedstat`, first field,
/// ns). The kernel updates that field on scheduling events only, so [`Self::now`] yields first
/// (a `sched_yield` brings the accounting up to date).
pub struct ThreadCpuClock {
    file: File,
}

impl ThreadCpuClock {
    /// Open for the calling thread (must be read from the same thread).
    pub fn open() -> io::Result<Self> {
        Ok(Self {
            file: File::open("/proc/thread-self/schedstat")?,
        })
    }

    pub fn now(&self) -> io::Result<u64> {
        std::thread::yield_now();
        let mut buf = [0u8; 128];
        let n = self.file.read_at(&mut buf, 0)?;
        std::str::from_utf8(&buf[..n])
            .ok()
            .and_then(|s| s.split_whitespace().next())
            .and_then(|f| f.parse().ok())
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "bad schedstat"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn block_spin_and_timed() {
        for policy in ["block", "spin", "until"] {
            let c = Arc::new(Completion::new());
            c.reset();
            let c2 = c.clone();
            let submit = now_ns();
            let h = std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(5));
                c2.mark_started(now_ns());
                c2.complete(now_ns());
            });
            let p = match policy {
                "block" => WaitPolicy::Block,
                "spin" => WaitPolicy::Spin,
                _ => WaitPolicy::BlockUntil(submit + 1_000_000),
            };
            let o = wait(&c, p, submit);
            h.join().unwrap();
            assert!(!o.abandoned);
            assert!(o.seen_ns >= c.done_ns());
            assert!(o.resumed_ns >= submit && o.seen_ns >= o.resumed_ns);
            match policy {
                "block" => assert!(o.censored || !o.blocked),
                "spin" => assert!(!o.censored && !o.blocked && o.resumed_ns == submit),
                _ => assert!(o.blocked),
            }
        }
    }

    #[test]
    fn late_timed_wake_is_censored() {
        let c = Arc::new(Completion::new());
        c.reset();
        let c2 = c.clone();
        let h = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(1));
            c2.complete(now_ns());
        });
        let o = wait(&c, WaitPolicy::BlockUntil(now_ns() + 50_000_000), now_ns());
        h.join().unwrap();
        assert!(o.blocked && o.censored);
        // Done before the requester waited at all: not a late wake-up.
        let o = wait(&c, WaitPolicy::BlockUntil(now_ns() + 1_000_000), now_ns());
        assert!(!o.blocked && !o.censored);
    }

    #[test]
    fn dead_completer_ends_wait() {
        let c = Arc::new(Completion::new());
        c.reset();
        let c2 = c.clone();
        let h = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(2));
            c2.mark_dead();
        });
        let o = wait(&c, WaitPolicy::Block, now_ns());
        h.join().unwrap();
        assert!(o.abandoned);
    }

    #[test]
    fn schedstat_clock_advances() {
        let Ok(clk) = ThreadCpuClock::open() else {
            preheat_testsupport::skip("schedstat", "/proc/thread-self/schedstat unavailable");
            return;
        };
        let a = clk.now().unwrap();
        let t = now_ns();
        while now_ns() - t < 5_000_000 {
            std::hint::spin_loop();
        }
        let b = clk.now().unwrap();
        assert!(b > a);
    }
}
