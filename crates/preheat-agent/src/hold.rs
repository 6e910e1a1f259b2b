//! The server thread's hold: after a `replay` warm-up, the server thread that served it polls its
//! event wait instead of blocking, until the announced request arrives.
//!
//! Why: a server thread blocked in `epoll_wait` must be woken when the request arrives. On the
//! VMs this project runs on that wake-up is the largest part of what remains of the cold
//! overhead once the caches are warm: a halted vCPU takes 20–90 µs to run a woken thread, and
//! one running another thread (the agent's worker, a spinner) needs a reschedule IPI, a VM exit;
//! only a CPU polling in idle skips both, and without a cpuidle driver none can. A thread that is
//! already running when the request arrives needs no wake-up at all. The warm-up brings the
//! server thread out of its wait anyway; the hold keeps it out until the arrival.
//!
//! The worker opens a window ([`open`]) just before it sends the warm-up (the demo's hot floor
//! opens one too, through `Request::Hold`, before its priming request): from then until
//! `arrival + HOLD_AFTER_ARRIVAL_NS` (at most `MAX_NS` from now), an `epoll_wait`/`epoll_pwait`
//! of a host thread with a non-zero timeout calls the real function with a zero timeout in a
//! loop ([`crate::hooks`]), returning as soon as it reports events or an error, or the caller's
//! own timeout expires; past the window it blocks as the caller asked, for what is left of its
//! timeout. The first events after the arrival close the window, so the thread blocks again as
//! soon as it has served the request. Outside a window a wait costs one atomic load more.
//!
//! On by default; `PREHEAT_NO_REPLAY_HOLD=1` turns it off. Measured on preheat-kv (`preheat demo
//! --lead-us 200 --rounds 100 --strategies replay,all`, release build, two runs with and two
//! without, interleaved; 2-vCPU EPYC, cpuidle `haltpoll`): `replay` removed 85% and 87% of the
//! cold overhead against the verified hot floor with the hold, 63% and 62% without;
//! `wake+lines+replay` 87% and 88% against 84% and 84% (the request's *start* 19–21 µs against
//! 22–23 µs, hot 8 µs). A debug build showed p99 outliers of 2.5–5.3 ms on replay rows with the
//! hold in two runs; the release runs did not (replay p99 75–86 µs with, 108–153 without).
//!
//! Hooked path: atomics and the engine's clock only.

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

use std::sync::atomic::{AtomicU64, Ordering};

/// How long after the announced arrival a late request is still waited for by polling.
pub const HOLD_AFTER_ARRIVAL_NS: u64 = 200_000;
/// The longest window, from its opening (a lead longer than this holds only its last part).
pub const MAX_NS: u64 = 2_000_000;

/// End of the open window (CLOCK_MONOTONIC ns; 0: none).
static UNTIL: AtomicU64 = AtomicU64::new(0);
/// The announced arrival of the open window.
static ARRIVAL: AtomicU64 = AtomicU64::new(0);

/// Open a window for a request announced to arrive at `arrival_ns` (called by the worker, `now`
/// its clock reading).
pub fn open(now: u64, arrival_ns: u64) {
    let until = arrival_ns
        .saturating_add(HOLD_AFTER_ARRIVAL_NS)
        .min(now.saturating_add(MAX_NS));
    ARRIVAL.store(arrival_ns, Ordering::Relaxed);
    UNTIL.store(until, Ordering::Release);
}

/// Close an open window (the next wait blocks as its caller asked).
pub fn close() {
    UNTIL.store(0, Ordering::Release);
}

/// The open window's end, if one is open and `now` is inside it (a passed window is closed).
#[inline(always)]
fn window(now: u64) -> Option<u64> {
    let until = UNTIL.load(Ordering::Acquire);
    if until == 0 {
        return None;
    }
    if now >= until {
        UNTIL.store(0, Ordering::Relaxed);
        return None;
    }
    Some(until)
}

/// Whether a window is open at all (one load; the hooks' fast path).
#[inline(always)]
pub fn any() -> bool {
    UNTIL.load(Ordering::Relaxed) != 0
}

/// Run a wait with the caller's `timeout_ms` (< 0: none) through the hold: `call(t)` is the
/// real wait with timeout `t` ms. Outside a window, or for a zero timeout, one call as asked.
#[inline(always)]
pub fn wait(timeout_ms: i32, mut call: impl FnMut(i32) -> i32) -> i32 {
    if timeout_ms == 0 || !any() {
        return call(timeout_ms);
    }
    let start = preheat_engine::time::now_ns();
    let Some(until) = window(start) else {
        return call(timeout_ms);
    };
    // The caller's own deadline, if it gave one.
    let deadline = u64::try_from(timeout_ms)
        .ok()
        .map(|ms| start.saturating_add(ms.saturating_mul(1_000_000)));
    let limit = deadline.map_or(until, |d| d.min(until));
    loop {
        let r = call(0);
        let now = preheat_engine::time::now_ns();
        if r != 0 {
            if r > 0 && now >= ARRIVAL.load(Ordering::Relaxed) {
                // The request (or whatever came after the arrival): block normally from now on.
                UNTIL.store(0, Ordering::Relaxed);
            }
            return r;
        }
        if now >= limit {
            return match deadline {
                Some(d) if now >= d => 0,
                // What is left of the caller's timeout, rounded up to whole ms.
                Some(d) => {
                    let left = d.saturating_sub(now).div_ceil(1_000_000);
                    call(i32::try_from(left).unwrap_or(i32::MAX))
                }
                None => call(-1),
            };
        }
        std::hint::spin_loop();
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::arithmetic_side_effects)]
mod tests {
    use super::*;

    // One test touches the process-wide window, so no two tests race on it.
    #[test]
    fn polls_inside_a_window_and_blocks_outside() {
        // No window: one call with the caller's timeout.
        let mut seen = Vec::new();
        assert_eq!(
            wait(-1, |t| {
                seen.push(t);
                1
            }),
            1
        );
        assert_eq!(seen, [-1]);
        // A window: zero-timeout calls until events come; after the arrival they close it.
        let now = preheat_engine::time::now_ns();
        open(now, now);
        let mut calls = 0;
        let r = wait(-1, |t| {
            assert_eq!(t, 0);
            calls += 1;
            i32::from(calls == 5)
        });
        assert_eq!((r, calls), (1, 5));
        assert!(!any(), "events after the arrival close the window");
        // A window that ends: the last call blocks as the caller asked.
        let now = preheat_engine::time::now_ns();
        open(now, now + 1_000_000 - HOLD_AFTER_ARRIVAL_NS); // ends 1 ms from now
        let mut last = 0;
        let r = wait(-1, |t| {
            last = t;
            if t == 0 {
                0
            } else {
                7
            }
        });
        assert_eq!((r, last), (7, -1));
        // The caller's own timeout ends the hold first: a timeout, as the caller asked.
        let now = preheat_engine::time::now_ns();
        open(now, now + 50_000_000);
        let t0 = std::time::Instant::now();
        assert_eq!(wait(1, |_| 0), 0);
        assert!(t0.elapsed() >= std::time::Duration::from_millis(1));
    }
}
