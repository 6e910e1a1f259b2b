//! Cache-line primitives.
//!
//! The paper (§3.1) flushes the caches before recording and (§3.3) loads the working set into
//! the last-level cache. Here both are done per line from user space: `clflushopt`/`clflush`
//! to evict a line from every level of the coherence domain, `prefetcht0` to bring it back
//! (into all levels, and it also redoes the page walk, which matters here: the host backs guest
//! memory with 4 KiB pages, so a cold request also pays TLB misses).
//!
//! Every function here is a hot-path function (see the crate docs): no allocation, no locks, no
//! logging. [`features`] runs CPUID once (CPUID traps to the hypervisor in a VM, ~µs) and then
//! returns a cached copy; call it once at start-up so the first hot-path call is cheap.
//!
//! Flushes fault on an address that is not mapped readable, so [`flush_line`] and
//! [`flush_range`] are `unsafe fn`s; a prefetch never faults, so [`prefetch_line`] is safe.

use std::sync::OnceLock;

use preheat_model::VirtAddr;

/// CPU features relevant to preheating, from CPUID.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuFeatures {
    pub clflush: bool,
    pub clflushopt: bool,
    pub rdtscp: bool,
    /// `rdpid` (leaf 7 ECX bit 22): `TSC_AUX` alone, without reading the TSC.
    pub rdpid: bool,
    pub invariant_tsc: bool,
    /// Line size reported by CPUID (64 on every supported CPU).
    pub line_size: u32,
}

static FEATURES: OnceLock<CpuFeatures> = OnceLock::new();

/// CPUID feature bits (cached after the first call).
///
/// Leaf 1 EDX bit 19 (clflush) and EBX bits 15:8 × 8 (line size), leaf 7 EBX bit 23
/// (clflushopt), leaf 0x8000_0001 EDX bit 27 (rdtscp), leaf 0x8000_0007 EDX bit 8 (invariant
/// TSC). On other architectures everything is `false` and the line size is 64.
#[inline]
pub fn features() -> CpuFeatures {
    *FEATURES.get_or_init(imp::detect)
}

/// Flush the line containing `addr` from every cache level (clflushopt where available, else
/// clflush).
///
/// A flush never changes the contents of memory (dirty lines are written back), so it breaks no
/// Rust invariant of the memory it touches; but it is checked like a one-byte load, so an
/// address that is not mapped readable raises SIGSEGV (or SIGBUS past the end of a mapped file)
/// and kills the process. `clflushopt` is weakly ordered: use [`fence`] before relying on the
/// line being gone. No-op on architectures other than x86_64.
///
/// # Safety
/// The page containing `addr` must be mapped and readable in this process, backed by memory
/// (not past the end of a mapped file), and stay so for the duration of the call — nothing in
/// this or another thread may unmap it or revoke read access meanwhile.
#[inline]
pub unsafe fn flush_line(addr: VirtAddr) {
    // SAFETY: the caller guarantees the line is mapped and readable for the call.
    unsafe { imp::flush_line(addr.0 as usize) }
}

/// Flush every line of `[start, start + len)`, then fence.
///
/// # Safety
/// As [`flush_line`], for every page the range touches: mapped, readable, backed by memory,
/// and staying so for the duration of the call.
#[inline]
pub unsafe fn flush_range(start: VirtAddr, len: usize) {
    if len == 0 {
        return;
    }
    let line = LINE;
    let start = start.0 as usize;
    let mut a = start & !(line - 1);
    let end = start.saturating_add(len);
    while a < end {
        // SAFETY: `a` lies in a page of `[start, start + len)` (the first line may begin before
        // `start`, but in the same page), which the caller guarantees mapped and readable.
        unsafe { imp::flush_line(a) };
        a += line;
    }
    fence();
}

/// prefetcht0 the line at `addr`. Never faults, even for unmapped addresses, so any address is
/// allowed.
///
/// `prefetcht0` is a hint: it has no architectural effect, is dropped silently for unmapped or
/// non-cacheable addresses, but does perform the page walk for mapped ones. No-op on
/// architectures other than x86_64.
#[inline]
pub fn prefetch_line(addr: VirtAddr) {
    imp::prefetch_line(addr.0 as usize)
}

/// Store fence + load fence.
///
/// Implemented as `mfence; lfence`: `mfence` orders all earlier loads, stores and
/// `clflush`/`clflushopt` before later ones (a superset of `sfence`), `lfence` then keeps later
/// instructions from executing early. A `SeqCst` fence on other architectures.
#[inline]
pub fn fence() {
    imp::fence()
}

/// The line size all loops in this crate step by (x86_64 and aarch64 servers: 64 bytes).
pub(crate) const LINE: usize = 64;

#[cfg(target_arch = "x86_64")]
mod imp {
    use super::CpuFeatures;
    use core::arch::x86_64::{
        __cpuid, _mm_clflush, _mm_lfence, _mm_mfence, _mm_prefetch, CpuidResult, _MM_HINT_T0,
    };

    fn cpuid(leaf: u32) -> CpuidResult {
        // SAFETY: `cpuid` exists on every x86_64 CPU and only writes registers. Leaves above the
        // supported maximum return unspecified (but harmless) values; callers check the maximum.
        #[allow(unused_unsafe)]
        unsafe {
            __cpuid(leaf)
        }
    }

    pub fn detect() -> CpuFeatures {
        let max = cpuid(0).eax;
        let max_ext = cpuid(0x8000_0000).eax;
        let l1 = cpuid(1);
        let clflush = l1.edx & (1 << 19) != 0;
        let line = ((l1.ebx >> 8) & 0xff) * 8;
        let clflushopt = max >= 7 && cpuid(7).ebx & (1 << 23) != 0;
        let rdtscp = max_ext >= 0x8000_0001 && cpuid(0x8000_0001).edx & (1 << 27) != 0;
        let rdpid = max >= 7 && cpuid(7).ecx & (1 << 22) != 0;
        let invariant_tsc = max_ext >= 0x8000_0007 && cpuid(0x8000_0007).edx & (1 << 8) != 0;
        CpuFeatures {
            clflush,
            clflushopt,
            rdtscp,
            rdpid,
            invariant_tsc,
            line_size: if line == 0 { 64 } else { line },
        }
    }

    /// `clflushopt` on the line containing `p`.
    ///
    /// # Safety
    /// The CPU must support `clflushopt` (CPUID.7.EBX[23]), and the line at `p` must be mapped
    /// readable for the call (see [`super::flush_line`]).
    // core::arch has no `_mm_clflushopt`, so this is one instruction of inline assembly. It
    // needs no `#[target_feature]`: the assembler accepts the instruction unconditionally and
    // the runtime check in `flush_line` guards its execution.
    #[inline(always)]
    unsafe fn clflushopt(p: usize) {
        // SAFETY: caller guarantees CPU support and a mapped, readable line (so no fault). The
        // instruction reads no Rust-visible state and leaves memory contents unchanged; the asm
        // block is not marked `nomem`, so the compiler treats it as touching memory and does not
        // move loads/stores across it.
        unsafe {
            core::arch::asm!("clflushopt byte ptr [{0}]", in(reg) p, options(nostack, preserves_flags));
        }
    }

    /// # Safety
    /// As [`super::flush_line`]: the line at `addr` is mapped readable for the call.
    #[inline(always)]
    pub unsafe fn flush_line(addr: usize) {
        let f = super::features();
        if f.clflushopt {
            // SAFETY: clflushopt support was just checked via CPUID. Flushing never changes
            // memory contents, and the caller guarantees the line is mapped and readable, so
            // it does not fault.
            unsafe { clflushopt(addr) }
        } else if f.clflush {
            // SAFETY: clflush support was checked via CPUID. `_mm_clflush` only evicts the line
            // (writing it back if dirty): no Rust-visible memory changes. The caller guarantees
            // the line is mapped and readable, so it does not fault.
            unsafe { _mm_clflush(addr as *const u8) }
        }
    }

    #[inline(always)]
    pub fn prefetch_line(addr: usize) {
        // SAFETY: `prefetcht0` (SSE, x86_64 baseline) is a pure hint: it never faults, even on
        // unmapped or kernel addresses, and has no architectural effect, so any address is fine.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(addr as *const i8) }
    }

    #[inline(always)]
    pub fn fence() {
        // SAFETY: `mfence`/`lfence` are SSE2 (x86_64 baseline) and touch no memory.
        #[allow(unused_unsafe)]
        unsafe {
            _mm_mfence();
            _mm_lfence();
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
mod imp {
    use super::CpuFeatures;

    pub fn detect() -> CpuFeatures {
        CpuFeatures {
            clflush: false,
            clflushopt: false,
            rdtscp: false,
            rdpid: false,
            invariant_tsc: false,
            line_size: 64,
        }
    }
    /// # Safety
    /// None here (a no-op); the contract is that of [`super::flush_line`].
    #[inline(always)]
    pub unsafe fn flush_line(_addr: usize) {}
    #[inline(always)]
    pub fn prefetch_line(_addr: usize) {}
    #[inline(always)]
    pub fn fence() {
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn features_are_sane_and_cached() {
        let _shared = crate::test_lock::shared();
        let f = features();
        assert_eq!(f, features());
        assert!(f.line_size == 64 || f.line_size == 128, "{f:?}");
        #[cfg(target_arch = "x86_64")]
        assert!(f.clflush, "every x86_64 CPU has clflush: {f:?}");
    }

    #[test]
    fn flush_and_prefetch_keep_contents() {
        let _shared = crate::test_lock::shared();
        let mut v = vec![0u8; 4096 * 3];
        for (i, b) in v.iter_mut().enumerate() {
            *b = i as u8;
        }
        let p = VirtAddr::from_ptr(v.as_ptr());
        // SAFETY: the range and the line lie inside `v`, a live heap allocation of this test
        // (mapped, readable) that nothing frees before the end of the test.
        unsafe {
            flush_range(p.offset(5), v.len() - 10);
            flush_line(p);
        }
        fence();
        for i in (0..v.len() as u64).step_by(64) {
            prefetch_line(p.offset(i));
        }
        // Prefetching unmapped and kernel addresses must not fault.
        prefetch_line(VirtAddr(0));
        prefetch_line(VirtAddr(64));
        prefetch_line(VirtAddr(0xffff_ffff_ff60_0000));
        for (i, b) in v.iter().enumerate() {
            assert_eq!(*b, i as u8);
        }
        // SAFETY: an empty range touches no memory.
        unsafe { flush_range(p, 0) };
    }
}
