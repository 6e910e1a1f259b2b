//! Whether a CPU keeps its branch-prediction state through a short idle: measured, not assumed.
//!
//! # Why
//!
//! On this project's machine kind (Firecracker guests on AMD EPYC hosts) the big runtimes lose
//! most of their first request after idle to something that loaded cache lines cannot restore:
//! Node.js, with 4.2 MiB of recorded lines loaded completely 2 ms ahead, still computed for
//! 297 µs against 108 µs hot, and the demo's *control* (an idle gap with no cache sweep) was
//! nearly as slow as its cold sweep (Node 293 µs, MariaDB: 441 of 573 µs of the cold overhead),
//! while one execution of the request's code (`replay`) brought it back to hot. A
//! branch-heavy kernel with almost no data shows the same (2026-11-29, 2 vCPUs of an AMD EPYC,
//! cpuidle `haltpoll`, 41 samples each): 4096 indirect calls took 13.8 µs back to back, 13.9 µs
//! after spinning 20 µs, **20.5 µs after sleeping 20 µs**, 32.9 µs after 20 ms either way
//! (a spin that long meets the timer ticks), and a 256 KiB data walk barely moved (2.6 → 3.4
//! µs). So here the predictors are reset when the CPU idles — every exit to the hypervisor
//! (a halt, a timer), most likely the host's indirect-branch barrier on VM exits — and only
//! running the code trains them again. Hosts differ; this module measures it.
//!
//! # How
//!
//! [`run_calls`] is straight-line code of [`SITES`] indirect calls, each site calling a fixed
//! one of [`TARGETS`] small functions through a table the compiler cannot see through
//! (`black_box`): each site needs its own branch-target entry, and next to no data is touched.
//! [`measure`] times it on the calling thread (the caller pins it) in three conditions,
//! interleaved round by round: right after running it (hot), after spinning `gap_us` (time
//! passes, the CPU stays busy), and after sleeping `gap_us` (the CPU idles). Nothing here
//! allocates on the measured path; the sample vectors are allocated up front.

use std::hint::black_box;
use std::time::Duration;

use crate::time::{now_ns, spin_until};

/// Indirect call sites in [`run_calls`].
pub const SITES: usize = 4096;

/// Distinct call targets.
pub const TARGETS: usize = 64;

type Target = fn(u64) -> u64;

#[inline(never)]
fn target<const K: u64>(x: u64) -> u64 {
    x.wrapping_mul(2 * K + 3).wrapping_add(K)
}

macro_rules! targets {
    ($($k:literal)*) => { [$(target::<$k> as Target),*] };
}

static TABLE: [Target; TARGETS] = targets!(
    0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31
    32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59 60 61 62 63
);

// One call site: site `i` calls target `(i × 37 + 11) mod TARGETS` (a fixed, scattered choice).
macro_rules! site {
    ($acc:ident, $t:ident, $i:expr) => {
        $acc = ($t[($i * 37 + 11) % TARGETS])($acc);
    };
}
macro_rules! sites16 {
    ($acc:ident, $t:ident, $b:expr) => {
        site!($acc, $t, $b);
        site!($acc, $t, $b + 1);
        site!($acc, $t, $b + 2);
        site!($acc, $t, $b + 3);
        site!($acc, $t, $b + 4);
        site!($acc, $t, $b + 5);
        site!($acc, $t, $b + 6);
        site!($acc, $t, $b + 7);
        site!($acc, $t, $b + 8);
        site!($acc, $t, $b + 9);
        site!($acc, $t, $b + 10);
        site!($acc, $t, $b + 11);
        site!($acc, $t, $b + 12);
        site!($acc, $t, $b + 13);
        site!($acc, $t, $b + 14);
        site!($acc, $t, $b + 15);
    };
}
macro_rules! sites256 {
    ($acc:ident, $t:ident, $b:expr) => {
        sites16!($acc, $t, $b);
        sites16!($acc, $t, $b + 16);
        sites16!($acc, $t, $b + 32);
        sites16!($acc, $t, $b + 48);
        sites16!($acc, $t, $b + 64);
        sites16!($acc, $t, $b + 80);
        sites16!($acc, $t, $b + 96);
        sites16!($acc, $t, $b + 112);
        sites16!($acc, $t, $b + 128);
        sites16!($acc, $t, $b + 144);
        sites16!($acc, $t, $b + 160);
        sites16!($acc, $t, $b + 176);
        sites16!($acc, $t, $b + 192);
        sites16!($acc, $t, $b + 208);
        sites16!($acc, $t, $b + 224);
        sites16!($acc, $t, $b + 240);
    };
}

/// Run the [`SITES`] indirect calls once, folding `acc` through them.
#[inline(never)]
#[rustfmt::skip]
pub fn run_calls(mut acc: u64) -> u64 {
    let t: &[Target; TARGETS] = black_box(&TABLE);
    sites256!(acc, t, 0); sites256!(acc, t, 256); sites256!(acc, t, 512); sites256!(acc, t, 768);
    sites256!(acc, t, 1024); sites256!(acc, t, 1280); sites256!(acc, t, 1536); sites256!(acc, t, 1792);
    sites256!(acc, t, 2048); sites256!(acc, t, 2304); sites256!(acc, t, 2560); sites256!(acc, t, 2816);
    sites256!(acc, t, 3072); sites256!(acc, t, 3328); sites256!(acc, t, 3584); sites256!(acc, t, 3840);
    acc
}

/// The three conditions' samples, µs each (see the module docs).
#[derive(Debug, Clone, PartialEq)]
pub struct Samples {
    pub gap_us: u64,
    /// Right after running the code.
    pub hot: Vec<f64>,
    /// After spinning `gap_us` (the CPU stays busy).
    pub after_spin: Vec<f64>,
    /// After sleeping `gap_us` (the CPU idles).
    pub after_sleep: Vec<f64>,
}

/// Time [`run_calls`] `rounds` times in each condition on the calling thread, after `gap_us`
/// of spinning or sleeping; the conditions' order rotates from round to round. About
/// `rounds` × (2 × `gap_us` + 100 µs). The caller pins the thread to the CPU it asks about.
pub fn measure(gap_us: u64, rounds: usize) -> Samples {
    let mut s = Samples {
        gap_us,
        hot: Vec::with_capacity(rounds),
        after_spin: Vec::with_capacity(rounds),
        after_sleep: Vec::with_capacity(rounds),
    };
    let mut acc = black_box(1u64);
    for _ in 0..3 {
        acc = run_calls(acc);
    }
    for round in 0..rounds {
        for k in 0..3 {
            match (round + k) % 3 {
                0 => acc = run_calls(acc),
                1 => spin_until(now_ns() + gap_us * 1000),
                _ => std::thread::sleep(Duration::from_micros(gap_us)),
            }
            let t0 = now_ns();
            acc = run_calls(acc);
            let us = now_ns().saturating_sub(t0) as f64 / 1000.0;
            match (round + k) % 3 {
                0 => s.hot.push(us),
                1 => s.after_spin.push(us),
                _ => s.after_sleep.push(us),
            }
        }
    }
    black_box(acc);
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_site_calls_its_target() {
        // The fold is deterministic: run it by hand over the same choice of targets.
        let mut want = 5u64;
        for i in 0..SITES {
            want = TABLE[(i * 37 + 11) % TARGETS](want);
        }
        assert_eq!(run_calls(5), want);
    }

    #[test]
    fn measures_each_condition_once_per_round() {
        let s = measure(20, 4);
        for v in [&s.hot, &s.after_spin, &s.after_sleep] {
            assert_eq!(v.len(), 4);
            assert!(v.iter().all(|x| x.is_finite() && *x > 0.0), "{v:?}");
        }
        assert_eq!(s.gap_us, 20);
    }
}
