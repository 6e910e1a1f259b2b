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
//! Both are hot-path functions (see the crate docs): no allocation, no locks, no logging.

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

#[cfg(target_arch = "x86_64")]
mod imp {
    use core::arch::x86_64::{__rdtscp, _mm_lfence, _rdtsc};

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
    #[inline(always)]
    pub fn rdtscp() -> u64 {
        super::now_ns()
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
    fn tsc_rate_is_positive() {
        let _shared = crate::test_lock::shared();
        let r = calibrate_tsc(2);
        assert!(r > 0.0, "rate {r}");
    }
}
