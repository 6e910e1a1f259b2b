//! Flush+reload working-set probe (our user-space stand-in for the paper's cache tag dump).
//!
//! Paper §3.1: flush the caches, disable the hardware prefetchers, let the server handle a
//! request, then read the last-level cache's tag RAM (RAMINDEX on Cortex-A15) to list every line
//! that was accessed; repeat 8 times and keep the lines seen repeatedly.
//!
//! Neither tag RAM nor prefetcher control is reachable here (x86_64 KVM guest, no MSR access, no
//! PMU), so we ask the cache line by line instead:
//!
//! 1. [`flush`] the candidate ranges (`clflushopt` every line) before the request;
//! 2. after the request, [`reload`] every candidate line: time a one-byte load with `rdtscp`; a
//!    line that loads faster than the [`calibrate`]d threshold was in some cache level, i.e. the
//!    server touched it.
//!
//! Where we deliberately differ, and what that costs (measured on this machine; numbers vary
//! up to 3× with load from other tenants and other processes on the 2 vCPUs — run
//! `cargo test -p preheat-engine --lib probe::report -- --ignored --nocapture` to re-measure):
//!
//! * **The prefetchers stay on** (no MSR access), so the probe itself must not trigger them: a
//!   sequential probe makes every line look like a hit (stream prefetcher), and so does any
//!   per-page monotonic order, even interleaved across pages. [`reload`] therefore probes a
//!   uniformly random permutation of all lines of a window of 16 pages and flushes each line
//!   right after probing it. That is the best order we found (descending blocks, frontiers,
//!   round-robin pages, prefetch-then-load timing, immediate follow-up of neighbours and
//!   prefetcher "de-training" were all equal or worse), but it is **not clean**: every probe
//!   that goes past L1 makes the adjacent-line prefetcher fetch X+1 (sometimes X−1), and if that
//!   neighbour has not been probed yet it reads as a hit. On a flushed, untouched region 15–50%
//!   of lines read as hits in a single pass. These false hits move with the random order, so
//!   the paper's repeat-and-vote step removes them — but only with many samples and a strict
//!   vote (the unit test takes 128 passes and keeps lines seen in ≥ 88, about 70%; a 50% vote
//!   keeps hundreds of false lines).
//! * **The cache holds more than the accessed lines.** One demand miss on X in a cold page also
//!   caches X+1 (91–99% of the time) and often X−1: those lines really are in the cache,
//!   consistently in every sample, so no vote removes them; the paper avoids this by disabling
//!   the prefetchers while recording. Expect a recorded set to contain about one extra line per
//!   run of accessed lines (for isolated lines that doubles the set). Preheating them costs
//!   little, since the hardware would fetch them too.
//! * **Probe on the CPU that ran the request.** Lines cached in another core's L2 reload at
//!   L3/cross-core latency and only 15–80% of them fall under a threshold calibrated on one
//!   core; a thread that migrates between request and reload loses part of the set.
//! * **Chunk size**: the probe's loads evict what they measure on large regions (fine ≤ 1 MiB,
//!   unreliable at 4 MiB, useless at 16–64 MiB in one pass); callers probe ≤ ~0.5–1 MiB of
//!   candidates per request.
//! * **Own pollution**: the probing thread's own code and libc use hit lines it shares with the
//!   server (libc); callers subtract samples taken without a request.
//!
//! Nothing here is on the hot path; [`reload`] allocates one index buffer per call.
//!
//! Flushing and reloading fault on an address that is not mapped readable, so [`flush`],
//! [`prepare_phase`], [`reload`] and [`reload_phase`] are `unsafe fn`s; [`calibrate`] works on
//! a buffer of its own and is safe. They touch the caller's lines only through the guarded
//! routines of [`crate::guard`]: where the calling thread has a handler that resumes faults
//! there, a line that faults ends the pass with `Err(Faulted)` instead of killing the process
//! (the agent probes a live server, whose threads may unmap memory at any time).

use preheat_model::proto::Range;
use preheat_model::VirtAddr;
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

pub use crate::guard::Faulted;

#[cfg(test)]
use crate::cache::flush_range;
use crate::cache::{fence, flush_line, LINE};
use crate::guard;

/// Page size the probe windows are measured in (spatial prefetchers work within 4 KiB pages).
const PAGE: u64 = 4096;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Calibration {
    pub hit_ticks_p50: u32,
    pub miss_ticks_p50: u32,
    /// Ticks below which a reload counts as a cache hit.
    pub threshold: u32,
    pub samples: u32,
}

/// Full distribution summary of a calibration run (TSC ticks).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CalibrationStats {
    pub hit_p10: u32,
    pub hit_p50: u32,
    pub hit_p90: u32,
    pub hit_p99: u32,
    pub miss_p1: u32,
    pub miss_p10: u32,
    pub miss_p50: u32,
    pub miss_p90: u32,
    /// Ticks below which a reload counts as a cache hit.
    pub threshold: u32,
    /// Samples per class.
    pub samples: u32,
}

impl CalibrationStats {
    pub fn calibration(&self) -> Calibration {
        Calibration {
            hit_ticks_p50: self.hit_p50,
            miss_ticks_p50: self.miss_p50,
            threshold: self.threshold,
            samples: self.samples,
        }
    }
}

/// Measure reload time of cached vs flushed lines in this process and derive a threshold.
///
/// See [`calibrate_stats`]; this returns its summary.
pub fn calibrate(samples: u32) -> Calibration {
    calibrate_stats(samples).calibration()
}

/// Measure reload times of lines just touched (hits) and just flushed (misses) at random lines
/// of a private 1 MiB buffer, `samples` of each (at least 64), interleaved.
///
/// threshold = midpoint of the hit p90 and the miss p10, clamped to
/// `[hit_p50 + 1, max(miss_p50, hit_p50 + 2)]`. On this machine hits are 52–160 ticks and DRAM
/// ≥ 338, so the threshold lands around 200–300.
pub fn calibrate_stats(samples: u32) -> CalibrationStats {
    let samples = samples.max(64);
    const BYTES: usize = 1 << 20;
    // Writing every byte gives every page its own physical frame (a read-only calloc'd buffer
    // would map all pages to the shared zero page, and its lines would alias).
    let buf = vec![0x5au8; BYTES];
    let base = buf.as_ptr() as usize;
    let mut rng = SmallRng::seed_from_u64(0x9e37_79b9_7f4a_7c15);
    let mut hits = Vec::with_capacity(samples as usize);
    let mut misses = Vec::with_capacity(samples as usize);
    for _ in 0..samples {
        let a = base + rng.gen_range(0..BYTES / LINE) * LINE;
        // SAFETY: `a` is a line inside `buf`, a live heap allocation of this function (mapped,
        // readable) that is dropped only after the loop.
        unsafe {
            // Miss: flush, fence, reload.
            flush_line(VirtAddr(a as u64));
            fence();
            misses.push(time_load(a));
            // Hit: the reload just brought it in; touch once more to be sure, then time.
            std::hint::black_box(load_byte(a));
            hits.push(time_load(a));
        }
    }
    hits.sort_unstable();
    misses.sort_unstable();
    let pct = |v: &[u32], p: usize| v[(v.len() - 1) * p / 100];
    let (hit_p50, hit_p90, miss_p10, miss_p50) = (
        pct(&hits, 50),
        pct(&hits, 90),
        pct(&misses, 10),
        pct(&misses, 50),
    );
    let mid = ((hit_p90 as u64 + miss_p10 as u64) / 2) as u32;
    let lo = hit_p50.saturating_add(1);
    let hi = miss_p50.max(hit_p50.saturating_add(2));
    let threshold = mid.clamp(lo, hi);
    drop(buf);
    CalibrationStats {
        hit_p10: pct(&hits, 10),
        hit_p50,
        hit_p90,
        hit_p99: pct(&hits, 99),
        miss_p1: pct(&misses, 1),
        miss_p10,
        miss_p50,
        miss_p90: pct(&misses, 90),
        threshold,
        samples,
    }
}

/// Flush every line of `ranges`, then fence. Contents are never changed.
///
/// Returns `Err(Faulted)` at the first line that faulted (see the `# Safety` section), with the
/// lines before it flushed.
///
/// # Safety
/// Every page of every range must be mapped and readable in this process, backed by memory
/// (not past the end of a mapped file), and stay so for the duration of the call; otherwise the
/// flush raises SIGSEGV (SIGBUS) and kills the process (see [`crate::cache::flush_line`]) —
/// unless the calling thread has a handler in place that resumes faults of the guarded routines
/// ([`crate::guard`]): then the pass ends with `Err(Faulted)`. Take ranges from resident,
/// readable mappings (e.g. [`crate::maps::resident_ranges`]) and make sure nothing unmaps them
/// meanwhile, or guard the call.
pub unsafe fn flush(ranges: &[Range]) -> Result<(), Faulted> {
    // SAFETY: the caller's contract; `Phase::ALL` selects every line.
    let r = unsafe { each_line(ranges, Phase::ALL, true, guard::flush) };
    fence();
    r
}

/// Time a one-byte load of every line of `ranges` in random order within windows of
/// `window_pages` pages, clflush after each probe; push the addresses of lines that loaded in
/// fewer than `threshold` ticks into `hits`. Returns the number of lines probed.
///
/// Windows are aligned to `window_pages × 4 KiB` (clipped to the range), `window_pages == 0`
/// is treated as 1; callers normally pass 16. The permutation inside each window comes from a
/// xorshift generator seeded with `seed` (use a different seed per repetition, so prefetcher
/// false hits differ between repetitions and the k-of-n vote removes them). Hit addresses are
/// line-aligned. Every probed line is left flushed.
///
/// Call it from the CPU that ran the request (pin the thread; see the module docs), and vote
/// over many calls with different seeds: a single pass also reports lines that the hardware
/// prefetcher pulled in after an earlier probe.
///
/// A line that faulted (see below) ends the pass: `Err(Faulted)`, with the hits found before it
/// in `hits` (the caller decides whether a pass cut short counts).
///
/// # Safety
/// Every line of `ranges` must be mapped and readable in this process, backed by memory (not
/// past the end of a mapped file), and stay so for the duration of the call (nothing in this or
/// another thread may unmap it or revoke read access meanwhile); an unmapped line raises
/// SIGSEGV and kills the process — unless the calling thread has a handler in place that
/// resumes faults of the guarded routines ([`crate::guard`]), which turns it into
/// `Err(Faulted)`. Take ranges from resident, readable mappings (e.g.
/// [`crate::maps::resident_ranges`]). The loaded values are discarded, so concurrent *writers*
/// are harmless.
pub unsafe fn reload(
    ranges: &[Range],
    threshold: u32,
    window_pages: u32,
    seed: u64,
    hits: &mut Vec<u64>,
) -> Result<u64, Faulted> {
    // SAFETY: the caller's contract is this function's, and `Phase::ALL` probes a subset of
    // `ranges`.
    unsafe { reload_phase(ranges, threshold, window_pages, seed, Phase::ALL, hits) }
}

/// Lines probed in one phase of a strided probe: those with `(addr / 64) % stride == phase`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Phase {
    pub stride: u32,
    pub phase: u32,
}

impl Phase {
    /// The phase a probe cycle request names.
    pub fn of(c: &preheat_model::proto::ProbeCycle) -> Phase {
        Phase {
            stride: c.stride,
            phase: c.phase,
        }
    }

    /// Every line (stride 1).
    pub const ALL: Phase = Phase {
        stride: 1,
        phase: 0,
    };

    #[inline(always)]
    fn selects(self, addr: u64) -> bool {
        let stride = self.stride.max(1) as u64;
        (addr / LINE as u64) % stride == (self.phase as u64 % stride)
    }
}

/// Prepare a strided probe pass (our answer to prefetchers we cannot turn off): load every line
/// of `ranges` that is *not* in `phase`, then flush every line that is, and fence.
///
/// Afterwards the probed lines are out of the cache while their neighbours are in it. A demand
/// miss of the server on a probed line X makes the adjacent-line / next-line prefetchers fetch
/// X±1 — lines of another phase, which are not probed; a demand access to a neighbour hits and
/// triggers no fetch of X. The same holds for the probe's own misses in [`reload_phase`]. So
/// prefetcher-induced lines mostly land outside the measured phase, and `stride` passes with
/// `phase = 0 .. stride` cover every line.
///
/// Returns `Err(Faulted)` at the first line that faulted (see [`flush`]).
///
/// # Safety
/// As [`flush`] and [`reload`]: every page of every range must be mapped and readable, backed
/// by memory, and stay so for the duration of the call, or the call guarded ([`crate::guard`]).
pub unsafe fn prepare_phase(ranges: &[Range], phase: Phase) -> Result<(), Faulted> {
    // SAFETY: the caller's contract, for the unprobed lines.
    let r = unsafe { each_line(ranges, phase, false, guard::load) };
    // SAFETY: the caller's contract, for the probed lines.
    let r = r.and_then(|()| unsafe { each_line(ranges, phase, true, guard::flush) });
    fence();
    r
}

/// Apply `op` to every line of `ranges` that `phase` selects (`selected`) or does not select
/// (`!selected`), in address order; stop at the first `Err`.
///
/// # Safety
/// `op` is [`guard::load`] or [`guard::flush`], and the ranges meet their contract.
#[inline(always)]
unsafe fn each_line(
    ranges: &[Range],
    phase: Phase,
    selected: bool,
    op: unsafe fn(VirtAddr) -> Result<(), Faulted>,
) -> Result<(), Faulted> {
    let line = LINE as u64;
    for r in ranges {
        let end = r.start.saturating_add(r.len);
        let mut a = r.start & !(line - 1);
        while a < end {
            if phase.selects(a) == selected {
                // SAFETY: `a` is a line of a page of `r` (the first may begin before `r.start`,
                // in the same page): mapped readable or guarded (the caller's contract).
                unsafe { op(VirtAddr(a)) }?;
            }
            a += line;
        }
    }
    Ok(())
}

/// [`reload`] restricted to the lines of `phase` (see [`prepare_phase`]); returns lines probed.
///
/// # Safety
/// As [`reload`]: every page of every range must be mapped and readable, backed by memory, and
/// stay so for the duration of the call, or the call guarded ([`crate::guard`]).
pub unsafe fn reload_phase(
    ranges: &[Range],
    threshold: u32,
    window_pages: u32,
    seed: u64,
    phase: Phase,
    hits: &mut Vec<u64>,
) -> Result<u64, Faulted> {
    let wbytes = window_pages.max(1) as u64 * PAGE;
    let line = LINE as u64;
    let mut idx: Vec<u32> = Vec::with_capacity((wbytes / line) as usize);
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut probed = 0u64;
    for r in ranges {
        if r.len == 0 {
            continue;
        }
        let start = r.start & !(line - 1);
        let end = match r
            .start
            .checked_add(r.len)
            .and_then(|e| e.checked_add(line - 1))
        {
            Some(e) => e & !(line - 1),
            None => !(line - 1),
        };
        let mut w = start;
        while w < end {
            let wend = (w / wbytes + 1).saturating_mul(wbytes).min(end);
            idx.clear();
            let n = ((wend - w) / line) as u32;
            idx.extend((0..n).filter(|i| phase.selects(w + *i as u64 * line)));
            idx.shuffle(&mut rng);
            for &i in &idx {
                let a = (w + i as u64 * line) as usize;
                let v = VirtAddr(a as u64);
                // SAFETY: `a` is a line of a page of `r` (`w` starts at `r`'s first line, `a` ends
                // before `r`'s last line ends), which the caller guarantees mapped and readable
                // or guards.
                let t = unsafe { guard::timed_load(v) };
                // SAFETY: as the timed load, the same line.
                let t = t.and_then(|t| unsafe { guard::flush(v) }.map(|()| t));
                let Ok(t) = t else {
                    fence();
                    return Err(Faulted);
                };
                if t < threshold as u64 {
                    hits.push(a as u64);
                }
            }
            probed += idx.len() as u64;
            w = wend;
        }
    }
    fence();
    Ok(probed)
}

/// Ticks for a one-byte load of `addr` (`rdtscp; lfence; load; rdtscp; lfence`, through
/// [`guard::timed_load`], the same sequence the probe's reloads time): `rdtscp` waits for the
/// load to complete before reading the counter.
///
/// # Safety
/// As [`load_byte`].
#[inline(always)]
unsafe fn time_load(addr: usize) -> u32 {
    // SAFETY: the caller guarantees `addr` mapped and readable for the call.
    match unsafe { guard::timed_load(VirtAddr(addr as u64)) } {
        Ok(t) => t.min(u32::MAX as u64) as u32,
        Err(Faulted) => u32::MAX,
    }
}

/// One volatile byte load of `addr`.
///
/// # Safety
/// `addr` must lie in a page that is mapped and readable in this process, backed by memory, and
/// stays so for the duration of the call. Concurrent writers are allowed: the byte is read with
/// a volatile load (exactly once, cannot tear) and only timed or black-boxed, never interpreted.
#[inline(always)]
unsafe fn load_byte(addr: usize) -> u8 {
    // SAFETY: the caller guarantees a mapped, readable byte, and a `u8` read has no alignment
    // requirement. A write racing with it (the probed server's threads) is, strictly, a data
    // race in Rust's memory model; we rely on the volatile load being one byte-sized `mov`
    // (never elided, duplicated or torn) whose value is never interpreted, only timed.
    unsafe { std::ptr::read_volatile(addr as *const u8) }
}

#[cfg(test)]
mod tests;
