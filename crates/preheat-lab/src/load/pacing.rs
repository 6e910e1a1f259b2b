//! When requests go out: the open-loop arrival process and waiting for a send time (sleep until
//! shortly before it, then spin).

use std::time::{Duration, Instant};

use preheat_engine::time::now_ns;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Sleep until this long before a send time, then spin.
const SPIN_NS: u64 = 150_000;
/// Longest single sleep, so `stop` is noticed promptly.
const MAX_SLEEP: Duration = Duration::from_millis(20);

/// The open-loop arrival process of one connection: exponential inter-arrival gaps (ns) at
/// `rate_per_s`, drawn from `rand`'s `StdRng` seeded with `seed`, so a seed gives the same
/// schedule on every machine (for a given version of the `rand` crate).
#[derive(Debug, Clone)]
pub struct Poisson {
    rng: StdRng,
    mean_ns: f64,
}

impl Poisson {
    pub fn new(rate_per_s: f64, seed: u64) -> Poisson {
        Poisson {
            rng: StdRng::seed_from_u64(seed),
            mean_ns: 1e9 / rate_per_s,
        }
    }

    /// The next inter-arrival gap, ns.
    pub fn next_gap_ns(&mut self) -> u64 {
        // u in (0, 1] (one minus a draw from [0, 1)), so ln(u) is finite.
        let u = 1.0 - self.rng.gen::<f64>();
        (-u.ln() * self.mean_ns).round() as u64
    }
}

impl Iterator for Poisson {
    type Item = u64;
    fn next(&mut self) -> Option<u64> {
        Some(self.next_gap_ns())
    }
}

/// The first `n` inter-arrival gaps (ns) of a Poisson process at `rate_per_s` with `seed`: a
/// pure function (same inputs, same schedule). Connection `c` of an open-loop run uses
/// `poisson_gaps_ns(rate / connections, seed + c, ..)`; its intended send times are the run
/// start plus the running sums.
pub fn poisson_gaps_ns(rate_per_s: f64, seed: u64, n: usize) -> Vec<u64> {
    Poisson::new(rate_per_s, seed).take(n).collect()
}

/// Wait until `t_ns` (CLOCK_MONOTONIC): sleep until ~150 µs before, then spin. Returns false if
/// `cancel` said so while sleeping (it is not polled during the final spin).
pub fn wait_until(t_ns: u64, cancel: &dyn Fn() -> bool) -> bool {
    loop {
        let now = now_ns();
        if now >= t_ns {
            return true;
        }
        let sleep = sleep_before(t_ns, now);
        if sleep.is_zero() {
            std::hint::spin_loop();
        } else {
            if cancel() {
                return false;
            }
            std::thread::sleep(sleep);
        }
    }
}

/// Sleep `d` (really sleep: the idle gap is the point), in slices so `cancel` is noticed.
pub(super) fn sleep_for(d: Duration, cancel: &dyn Fn() -> bool) -> bool {
    let end = Instant::now() + d;
    loop {
        if cancel() {
            return false;
        }
        let now = Instant::now();
        if now >= end {
            return true;
        }
        std::thread::sleep((end - now).min(MAX_SLEEP));
    }
}

/// `d` in ns (saturating).
pub(super) fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// How long to sleep before a send at `t_ns` when it is `now_ns`: until ~150 µs before it (the
/// rest is spun), at most [`MAX_SLEEP`]; zero when it is that close already.
pub(super) fn sleep_before(t_ns: u64, now_ns: u64) -> Duration {
    Duration::from_nanos(t_ns.saturating_sub(now_ns).saturating_sub(SPIN_NS)).min(MAX_SLEEP)
}
