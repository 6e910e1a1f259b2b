//! Clocks.
//!
//! Two time bases:
//!
//! * [`now_ns`]: `CLOCK_MONOTONIC` in nanoseconds, the time base of announcements and preheat
//!   deadlines (paper §3.2/§3.3: the arbiter announces *when* a packet arrives; the preheat must
//!   stop at that time). It goes through the vDSO, so it costs tens of nanoseconds and never
//!   enters the kernel.
//! * [`rdtscp`]: the raw time-stamp counter, for timing single loads in the flush+reload probe
//!   (a stand-in for the paper's tag-RAM read, §3.1). On this machine the TSC advances in steps of
//!   ~26 ticks (~10 ns), which is still fine enough to tell a cache hit (52–160 ticks) from a DRAM
//!   access (≥ 338 ticks).
//!
//! * [`Deadline`]: a CLOCK_MONOTONIC deadline checked against the *unordered* TSC. The vDSO's
//!   clock read orders the TSC read (`lfence`/`rdtscp`), which waits for every older instruction
//!   — on a preheat walk that drains the prefetches in flight at every check (measured here: 16
//!   lines per check cost 30% of the walk's throughput). A plain `rdtsc` does not wait. The
//!   deadline is converted to TSC ticks with the rate measured between a reference pair taken by
//!   [`enable_tsc_deadlines`] (outside any hot path) and the pair the deadline is created with;
//!   without one (or without an invariant TSC) deadlines fall back to clock reads.
//!
//! * [`stamp`] / [`stamp_cpu`]: hot-path timestamps ("stamps") for code that must cost as little
//!   as possible per call (the agent's hooks on every request of the host). Once
//!   [`enable_tsc_stamps`] found an invariant TSC and `rdtscp` with the CPU number in `TSC_AUX`,
//!   a stamp is the raw TSC, and [`stamp_cpu`] takes the TSC and the CPU in one `rdtscp` instead
//!   of a vDSO clock read and `sched_getcpu`; otherwise a stamp is CLOCK_MONOTONIC ns. The read
//!   side converts with [`stamp_to_ns`], [`ns_to_stamp`] and [`stamp_span_ns`] at the rate of
//!   the same reference pair the deadlines use.
//!
//! All but the calibration and the conversions are hot-path functions (see the crate docs): no allocation, no locks,
//! no logging.

/// Busy-wait until CLOCK_MONOTONIC reaches `t_ns` (the CPU stays awake: no sleep, no yield).
///
/// Hot path: allocation-free, lock-free.
#[inline]
pub fn spin_until(t_ns: u64) {
    while now_ns() < t_ns {
        std::hint::spin_loop();
    }
}

/// CLOCK_MONOTONIC in nanoseconds (the time base of announcements).
///
/// Hot path: allocation-free, lock-free; a vDSO call on Linux.
#[inline]
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable `timespec` owned by this frame; CLOCK_MONOTONIC is
    // always supported on Linux, so the call only writes `ts` and cannot fail.
    unsafe {
        libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts);
    }
    (ts.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(ts.tv_nsec as u64)
}

/// CPU time of the calling thread in nanoseconds (`CLOCK_THREAD_CPUTIME_ID`: exact, including
/// the running slice, unlike `/proc/thread-self/schedstat`, which may lag by up to a tick).
/// A system call (about a microsecond in a VM): not for hot paths.
pub fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable `timespec` owned by this frame; the thread CPU clock of
    // the calling thread always exists, so the call only writes `ts`.
    unsafe {
        libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts);
    }
    (ts.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(ts.tv_nsec as u64)
}

/// CPU time in nanoseconds of thread `tid` of the calling process, through the per-thread CPU
/// clock Linux derives from a thread id; `None` if there is no such thread (any more). It
/// advances while the thread runs, including its current slice, and stands still while it is
/// blocked — whatever it blocks in. A system call (about a microsecond in a VM), no allocation.
pub fn thread_cpu_ns_of(tid: u32) -> Option<u64> {
    // Linux's encoding of a thread's CPU clock (`MAKE_THREAD_CPUCLOCK(tid, CPUCLOCK_SCHED)`):
    // the bitwise complement of the tid shifted left by 3, the per-thread flag (4) and
    // CPUCLOCK_SCHED (2).
    let clock = ((!(tid as libc::clockid_t)) << 3) | 6;
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable `timespec` owned by this frame; for a clock id that
    // names no thread of this process the call fails with EINVAL and writes nothing.
    let r = unsafe { libc::clock_gettime(clock, &mut ts) };
    (r == 0).then(|| {
        (ts.tv_sec as u64)
            .wrapping_mul(1_000_000_000)
            .wrapping_add(ts.tv_nsec as u64)
    })
}

/// Read the time-stamp counter (serialising enough for probe timing: `rdtscp` + `lfence`).
///
/// `rdtscp` waits until all earlier instructions have executed (so a load issued before it has
/// completed when the counter is read) and the trailing `lfence` keeps later instructions from
/// starting before the counter is read. On CPUs without `rdtscp` (none we support in practice)
/// it falls back to `lfence; rdtsc; lfence`. On other architectures it returns [`now_ns`].
///
/// Hot path: allocation-free, lock-free.
#[inline]
pub fn rdtscp() -> u64 {
    imp::rdtscp()
}

/// TSC ticks per nanosecond, measured against CLOCK_MONOTONIC over `ms` milliseconds
/// (at least 1 ms). Sleeps; not for the hot path. Returns 1.0 on architectures without a TSC
/// (where [`rdtscp`] already counts nanoseconds).
pub fn calibrate_tsc(ms: u64) -> f64 {
    // Take each (ns, tsc) pair between two clock reads and keep the tightest bracket, so the
    // pairing error is a few tens of nanoseconds however the thread is scheduled.
    fn pair() -> (f64, u64) {
        let mut best = (u64::MAX, 0.0, 0);
        for _ in 0..8 {
            let a = now_ns();
            let t = rdtscp();
            let b = now_ns();
            let width = b.saturating_sub(a);
            if width < best.0 {
                best = (width, (a as f64 + b as f64) / 2.0, t);
            }
        }
        (best.1, best.2)
    }
    let ms = ms.max(1);
    let (n0, t0) = pair();
    std::thread::sleep(std::time::Duration::from_millis(ms));
    let (n1, t1) = pair();
    let dn = n1 - n0;
    if dn <= 0.0 {
        return 1.0;
    }
    t1.wrapping_sub(t0) as f64 / dn
}

/// The reference pair (CLOCK_MONOTONIC ns, TSC) of [`enable_tsc_deadlines`]; 0: not enabled.
static REF_NS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
static REF_TSC: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// A reference pair must be at least this old for its rate to be used (the pairing error, tens
/// of ns, is then < 1e-6 of the interval).
const MIN_REFERENCE_AGE_NS: u64 = 50_000_000;

/// A (ns, tsc) pair read back to back, if the two clock reads around the TSC read were at most
/// 1 µs apart (no preemption in between).
#[inline]
fn tight_pair() -> Option<(u64, u64)> {
    let a = now_ns();
    let t = imp::rdtsc();
    let b = now_ns();
    (b.saturating_sub(a) <= 1_000).then(|| (a + (b - a) / 2, t))
}

/// TSC ticks per ns between the reference pair and (`ns`, `tsc`), if there is a reference at
/// least `min_age_ns` old and the rate is positive.
#[inline]
fn reference_rate(ns: u64, tsc: u64, min_age_ns: u64) -> Option<f64> {
    use std::sync::atomic::Ordering;
    let r_ns = REF_NS.load(Ordering::Acquire);
    if r_ns == 0 || ns < r_ns.saturating_add(min_age_ns) || ns == r_ns {
        return None;
    }
    let rate = tsc.wrapping_sub(REF_TSC.load(Ordering::Relaxed)) as f64 / (ns - r_ns) as f64;
    (rate > 0.0).then_some(rate)
}

/// Let [`Deadline`]s use the unordered TSC from now on (once 50 ms have
/// passed), if this CPU's TSC is invariant (constant rate, runs in deep idle, synchronised
/// across CPUs). Takes the reference pair; not for a hot path. Returns whether it is enabled.
pub fn enable_tsc_deadlines() -> bool {
    use std::sync::atomic::Ordering;
    if !imp::invariant_tsc() {
        return false;
    }
    if REF_NS.load(Ordering::Acquire) != 0 {
        return true;
    }
    for _ in 0..16 {
        if let Some((ns, tsc)) = tight_pair() {
            REF_TSC.store(tsc, Ordering::Relaxed);
            REF_NS.store(ns, Ordering::Release);
            return true;
        }
    }
    false
}

/// A CLOCK_MONOTONIC deadline, checked with the unordered TSC where
/// [`enable_tsc_deadlines`] allowed it (see the module docs), else with clock reads.
#[derive(Debug, Clone, Copy)]
pub struct Deadline {
    ns: u64,
    tsc: Option<u64>,
    /// Units of [`now`](Self::now) per microsecond: TSC ticks, or 1000 (ns).
    per_us: u64,
}

impl Deadline {
    /// A deadline at `deadline_ns` (CLOCK_MONOTONIC). Two clock reads and one TSC read.
    #[inline]
    pub fn at(deadline_ns: u64) -> Deadline {
        let tsc = tight_pair().and_then(|(ns, tsc)| {
            let rate = reference_rate(ns, tsc, MIN_REFERENCE_AGE_NS)?;
            // Whole ticks to go (0 when already passed); saturating float-to-int cast.
            let ticks = (deadline_ns.saturating_sub(ns) as f64 * rate) as u64;
            Some((tsc.saturating_add(ticks), ((rate * 1000.0) as u64).max(1)))
        });
        Deadline {
            ns: deadline_ns,
            tsc: tsc.map(|(t, _)| t),
            per_us: tsc.map_or(1000, |(_, per_us)| per_us),
        }
    }

    /// The deadline in CLOCK_MONOTONIC ns.
    pub fn ns(&self) -> u64 {
        self.ns
    }

    /// Whether the TSC (not clock reads) checks this deadline.
    pub fn uses_tsc(&self) -> bool {
        self.tsc.is_some()
    }

    /// The time now in this deadline's units (unordered TSC ticks, or CLOCK_MONOTONIC ns
    /// where the TSC does not check it): one `rdtsc` or one clock read.
    #[inline(always)]
    pub fn now(&self) -> u64 {
        match self.tsc {
            Some(_) => imp::rdtsc(),
            None => now_ns(),
        }
    }

    /// The deadline in the units of [`now`](Self::now).
    #[inline(always)]
    pub fn end(&self) -> u64 {
        self.tsc.unwrap_or(self.ns)
    }

    /// Units of [`now`](Self::now) per microsecond (TSC ticks, or 1000).
    pub fn units_per_us(&self) -> u64 {
        self.per_us
    }

    /// Whether the deadline has passed.
    #[inline(always)]
    pub fn passed(&self) -> bool {
        self.now() >= self.end()
    }
}

// ---- hot-path stamps

/// Stamps are TSC ticks (set once by [`enable_tsc_stamps`]); else CLOCK_MONOTONIC ns.
static STAMP_TSC: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
/// With TSC stamps: `rdpid` reads the CPU (else `rdtscp` does, with the stamp).
static STAMP_RDPID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// A reference pair must be at least this old before stamps are converted with its rate (the
/// conversion error is then ≤ ~3e-5 of a stamp's age; after 50 ms, ~1e-6).
const MIN_CONVERSION_AGE_NS: u64 = 1_000_000;

/// Let [`stamp`] and [`stamp_cpu`] read the TSC (and the CPU number from `TSC_AUX`, which Linux
/// sets to `node << 12 | cpu`) instead of CLOCK_MONOTONIC and `sched_getcpu`, if the TSC is
/// invariant, the kernel's clocksource is the TSC (so the kernel found the CPUs' TSCs in sync: a
/// busy period may start on one CPU and end on another), `rdtscp` exists and `TSC_AUX` agrees
/// with `sched_getcpu`. Takes the reference pair of [`enable_tsc_deadlines`]. Call it before the first stamp is taken (stamps taken before
/// are ns and would be misread); not for a hot path. Returns whether stamps are TSC ticks.
pub fn enable_tsc_stamps() -> bool {
    use std::sync::atomic::Ordering;
    if STAMP_TSC.load(Ordering::Acquire) {
        return true;
    }
    if !crate::cache::features().rdtscp || !enable_tsc_deadlines() {
        return false;
    }
    let clocksource =
        std::fs::read_to_string("/sys/devices/system/clocksource/clocksource0/current_clocksource")
            .unwrap_or_default();
    if clocksource.trim() != "tsc" {
        return false;
    }
    let aux_is_cpu = (0..16).any(|_| {
        let (_, a) = imp::rdtscp_aux();
        let cpu = crate::os::current_cpu();
        let (_, b) = imp::rdtscp_aux();
        a == b && a & 0xfff == cpu
    });
    if aux_is_cpu {
        STAMP_RDPID.store(crate::cache::features().rdpid, Ordering::Relaxed);
        STAMP_TSC.store(true, Ordering::Release);
    }
    aux_is_cpu
}

/// Whether stamps are TSC ticks.
pub fn stamps_are_tsc() -> bool {
    STAMP_TSC.load(std::sync::atomic::Ordering::Relaxed)
}

/// A stamp (TSC ticks or CLOCK_MONOTONIC ns, see the module docs); never 0.
///
/// Hot path: one unordered `rdtsc`, or a vDSO clock read; touches no memory but one flag.
#[inline(always)]
pub fn stamp() -> u64 {
    if stamps_are_tsc() {
        imp::rdtsc().max(1)
    } else {
        now_ns().max(1)
    }
}

/// A stamp (never 0) and the CPU the calling thread runs on.
///
/// Hot path: `rdtsc` and `rdpid` (measured here: ~10 ns together against ~19 ns for one
/// `rdtscp` and ~26 ns for a vDSO clock read and `sched_getcpu`), or one `rdtscp` where `rdpid`
/// is missing, or a vDSO clock read and `sched_getcpu` (which may set errno where
/// the kernel lacks getcpu: callers that must preserve errno save it when
/// [`stamps_are_tsc`] is false).
#[inline(always)]
pub fn stamp_cpu() -> (u64, u32) {
    if stamps_are_tsc() {
        let (t, aux) = if STAMP_RDPID.load(std::sync::atomic::Ordering::Relaxed) {
            (imp::rdtsc(), imp::rdpid())
        } else {
            imp::rdtscp_aux()
        };
        (t.max(1), aux & 0xfff)
    } else {
        (now_ns().max(1), crate::os::current_cpu())
    }
}

/// The TSC rate against the reference and a (ns, tsc) pair of now; waits (once, right after
/// [`enable_tsc_stamps`]) until the reference is old enough to convert with.
fn conversion_now() -> Option<(u64, u64, f64)> {
    for _ in 0..1000 {
        if let Some((ns, tsc)) = tight_pair() {
            match reference_rate(ns, tsc, MIN_CONVERSION_AGE_NS) {
                Some(rate) => return Some((ns, tsc, rate)),
                None => std::thread::sleep(std::time::Duration::from_micros(100)),
            }
        }
    }
    None
}

/// The CLOCK_MONOTONIC ns of `stamp`. Read side (two clock reads and a TSC read; may sleep up to
/// 1 ms right after [`enable_tsc_stamps`]). 0 stays 0.
pub fn stamp_to_ns(stamp: u64) -> u64 {
    if stamp == 0 || !stamps_are_tsc() {
        return stamp;
    }
    match conversion_now() {
        Some((ns, tsc, rate)) => {
            if stamp <= tsc {
                ns.saturating_sub((tsc.wrapping_sub(stamp) as f64 / rate) as u64)
            } else {
                ns.saturating_add((stamp.wrapping_sub(tsc) as f64 / rate) as u64)
            }
        }
        None => stamp,
    }
}

/// The stamp of CLOCK_MONOTONIC `ns` (the inverse of [`stamp_to_ns`]). Read side.
pub fn ns_to_stamp(ns_at: u64) -> u64 {
    if !stamps_are_tsc() {
        return ns_at;
    }
    match conversion_now() {
        Some((ns, tsc, rate)) => {
            if ns_at <= ns {
                tsc.saturating_sub(((ns - ns_at) as f64 * rate) as u64)
            } else {
                tsc.saturating_add(((ns_at - ns) as f64 * rate) as u64)
            }
        }
        None => ns_at,
    }
}

/// The length in ns of a span of `stamps` (a difference of two stamps). Read side.
pub fn stamp_span_ns(stamps: u64) -> u64 {
    if !stamps_are_tsc() {
        return stamps;
    }
    match conversion_now() {
        Some((_, _, rate)) => (stamps as f64 / rate) as u64,
        None => stamps,
    }
}

#[cfg(target_arch = "x86_64")]
mod imp {
    use core::arch::x86_64::{__cpuid, __rdtscp, _mm_lfence, _rdtsc};

    /// The TSC without ordering: does not wait for older instructions (loads and prefetches in
    /// flight keep going).
    #[inline(always)]
    pub fn rdtsc() -> u64 {
        // SAFETY: `rdtsc` is part of the x86_64 baseline and touches no memory.
        #[allow(unused_unsafe)]
        unsafe {
            _rdtsc()
        }
    }

    /// CPUID 0x8000_0007 EDX bit 8: the TSC is invariant (constant rate in every P- and
    /// C-state). Linux also requires it to trust the TSC as its clocksource.
    pub fn invariant_tsc() -> bool {
        // SAFETY: `cpuid` exists on every x86_64 CPU and only writes registers; leaf
        // 0x8000_0000 reports the highest extended leaf, checked before 0x8000_0007 is read.
        #[allow(unused_unsafe)]
        unsafe {
            __cpuid(0x8000_0000).eax >= 0x8000_0007 && (__cpuid(0x8000_0007).edx >> 8) & 1 == 1
        }
    }

    /// `rdtscp` alone: the TSC (ordered after older instructions, later ones may start) and
    /// `TSC_AUX`. Only where `rdtscp` exists.
    #[inline(always)]
    pub fn rdtscp_aux() -> (u64, u32) {
        let mut aux = 0u32;
        // SAFETY: callers checked `rdtscp` via CPUID (`enable_tsc_stamps`); `aux` is a valid,
        // writable u32 on our stack.
        #[allow(unused_unsafe)]
        let t = unsafe { __rdtscp(&mut aux) };
        (t, aux)
    }

    /// `rdpid`: `TSC_AUX`. Only where `rdpid` exists.
    #[inline(always)]
    pub fn rdpid() -> u32 {
        let aux: u64;
        // SAFETY: callers checked `rdpid` via CPUID (`enable_tsc_stamps`); it only writes the
        // output register.
        unsafe {
            core::arch::asm!("rdpid {}", out(reg) aux, options(nomem, nostack, preserves_flags));
        }
        aux as u32
    }

    #[inline(always)]
    pub fn rdtscp() -> u64 {
        if crate::cache::features().rdtscp {
            let mut aux = 0u32;
            // SAFETY: `rdtscp` is available (checked via CPUID in `features()`); `aux` is a
            // valid, writable u32 on our stack. `lfence` is SSE2, part of the x86_64 baseline.
            #[allow(unused_unsafe)]
            unsafe {
                let t = __rdtscp(&mut aux);
                _mm_lfence();
                t
            }
        } else {
            // SAFETY: `rdtsc` and `lfence` are part of the x86_64 baseline; neither touches
            // memory.
            #[allow(unused_unsafe)]
            unsafe {
                _mm_lfence();
                let t = _rdtsc();
                _mm_lfence();
                t
            }
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
mod imp {
    pub fn rdtscp_aux() -> (u64, u32) {
        (super::now_ns(), 0)
    }

    pub fn rdpid() -> u32 {
        0
    }

    #[inline(always)]
    pub fn rdtscp() -> u64 {
        super::now_ns()
    }

    #[inline(always)]
    pub fn rdtsc() -> u64 {
        super::now_ns()
    }

    pub fn invariant_tsc() -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn monotonic_and_plausible() {
        let _shared = crate::test_lock::shared();
        let a = now_ns();
        let b = now_ns();
        assert!(b >= a);
        assert!(a > 0);
        let t0 = rdtscp();
        let t1 = rdtscp();
        // The TSC is invariant on supported machines; on a VM it still never goes backwards on
        // one CPU, but the thread may migrate, so only check it is non-zero.
        assert!(t0 > 0 && t1 > 0);
    }

    #[test]
    fn tsc_deadlines_pass_when_the_clock_does() {
        let _shared = crate::test_lock::shared();
        if !enable_tsc_deadlines() {
            return preheat_testsupport::skip("invariant-tsc", "no invariant TSC");
        }
        std::thread::sleep(std::time::Duration::from_nanos(
            MIN_REFERENCE_AGE_NS + 1_000_000,
        ));
        // A deadline 2 ms ahead: not passed at once; passed by the time the clock says so, and
        // not much earlier than the clock (the rate is right to well under 1%). Each check is
        // bracketed by clock reads so that a preemption (the suite runs tests side by side) can
        // only make the bounds looser, never fail them: "early" compares the clock read *after*
        // the check that said passed, "late" the clock read *before* the last check that said
        // not yet.
        // A deadline takes the TSC only from a tight (clock, TSC) pair, which a preemption
        // between the reads denies (the suite runs tests side by side: one CI run got none at
        // the first try); the test is about passing, so it takes the first of many tries.
        let d = (0..1000)
            .map(|_| Deadline::at(now_ns() + 2_000_000))
            .find(Deadline::uses_tsc)
            .expect("no tight (clock, TSC) pair in 1000 tries");
        assert!(!d.passed());
        let mut last_not_yet = 0;
        let passed_by = loop {
            let before = now_ns();
            if d.passed() {
                break now_ns();
            }
            last_not_yet = before;
            std::hint::spin_loop();
        };
        let early = d.ns().saturating_sub(passed_by);
        assert!(
            early < 50_000,
            "passed {early} ns before the clock deadline"
        );
        let late = last_not_yet.saturating_sub(d.ns());
        assert!(
            late < 1_000_000,
            "not passed {late} ns after the clock deadline"
        );
        // Past deadlines have passed; without a reference pair, clock reads decide.
        assert!(Deadline::at(now_ns().saturating_sub(1)).passed());
        let c = Deadline {
            ns: now_ns() + 1_000_000_000,
            tsc: None,
            per_us: 1000,
        };
        assert!(!c.passed());
        assert_eq!(c.end(), c.ns());
        // A TSC deadline counts in ticks: as many per µs as the measured rate says.
        let rate = calibrate_tsc(5) * 1000.0;
        let per_us = d.units_per_us() as f64;
        assert!(
            (per_us - rate).abs() < rate * 0.05,
            "{per_us} against {rate}"
        );
    }

    #[test]
    fn another_threads_cpu_time_stands_still_while_it_blocks() {
        let (tx, rx) = std::sync::mpsc::channel();
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            tx.send(crate::os::gettid()).unwrap();
            let _ = go_rx.recv();
            // Spin 5 ms of CPU time.
            let t0 = thread_cpu_ns();
            while thread_cpu_ns() < t0 + 5_000_000 {
                std::hint::spin_loop();
            }
        });
        let tid = rx.recv().unwrap();
        // Blocked in recv (a futex): its CPU time does not move.
        std::thread::sleep(std::time::Duration::from_millis(5));
        let a = thread_cpu_ns_of(tid).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let b = thread_cpu_ns_of(tid).unwrap();
        assert!(b - a < 1_000_000, "a blocked thread ran {} ns", b - a);
        go_tx.send(()).unwrap();
        t.join().unwrap();
        // Once it ended, its clock is gone too. `join` returns when the kernel clears the
        // thread's tid word, which happens in its exit path *before* the task is released, so
        // the clock can still answer for a moment after the join (seen in CI): wait for it to
        // go, bounded generously (this is not a timing assertion, only "eventually").
        assert!(b >= a);
        let gone = preheat_testsupport::eventually(std::time::Duration::from_secs(2), || {
            thread_cpu_ns_of(tid).is_none()
        });
        assert!(
            gone,
            "thread {tid}'s CPU clock still answers 2 s after it was joined"
        );
        // Our own thread's clock agrees with CLOCK_THREAD_CPUTIME_ID.
        let me = crate::os::gettid();
        let (x, y, z) = (
            thread_cpu_ns(),
            thread_cpu_ns_of(me).unwrap(),
            thread_cpu_ns(),
        );
        assert!(x <= y && y <= z, "{x} {y} {z}");
    }

    #[test]
    fn stamps_convert_to_the_clock() {
        let _shared = crate::test_lock::shared();
        let tsc = enable_tsc_stamps();
        if !tsc {
            preheat_testsupport::skip("invariant-tsc", "no invariant TSC with rdtscp");
        }
        let (s0, cpu) = stamp_cpu();
        let n0 = now_ns();
        assert!(cpu < 4096 && s0 > 0);
        std::thread::sleep(std::time::Duration::from_millis(3));
        let s1 = stamp();
        let n1 = now_ns();
        // Converted stamps land within 100 µs of the clock reads next to them (the rate's error
        // over a few ms is far below that; preemption between the reads is not).
        for (s, n) in [(s0, n0), (s1, n1)] {
            let c = stamp_to_ns(s);
            assert!(c.abs_diff(n) < 100_000, "stamp {s} -> {c} ns, clock {n}");
            assert!(
                stamp_to_ns(ns_to_stamp(c)).abs_diff(c) < 2_000,
                "round trip"
            );
        }
        let span = stamp_span_ns(s1 - s0);
        assert!(
            span.abs_diff(n1 - n0) < 200_000,
            "span {span} vs {}",
            n1 - n0
        );
    }

    #[test]
    fn tsc_rate_is_positive() {
        let _shared = crate::test_lock::shared();
        let r = calibrate_tsc(2);
        assert!(r > 0.0, "rate {r}");
    }
}
