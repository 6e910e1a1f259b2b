//! Loads and flushes of memory the caller does not own, made recoverable: the probe's exception
//! table.
//!
//! The flush+reload probe ([`crate::probe`]) touches lines of a host process's live memory from
//! inside that process. Its ranges are checked against the mappings right before every pass,
//! but a host thread can unmap (or truncate, or `mprotect`) them in the microseconds between,
//! and the next load or flush then faults. So every load and flush of such memory is done by
//! one of the small assembly routines below, whose faulting instruction and recovery point are
//! known labels — what the Linux kernel does for its user-memory accessors (`__ex_table`):
//!
//! * `load` (one byte), `flush` (`clflushopt` or `clflush` one line) and `timed_load` (the
//!   probe's timed reload: `rdtscp; lfence; load; rdtscp; lfence`, or `lfence; rdtsc; lfence`
//!   around the load where the CPU has no `rdtscp`) each return a success flag;
//! * [`fixup`] maps the address of one of their memory-touching instructions to the address of
//!   the routine's recovery point, which returns "faulted" to the caller.
//!
//! A SIGSEGV/SIGBUS handler of the process (the agent's: `preheat_agent::faults`) that finds a
//! kernel-generated fault of a thread that is inside a guarded pass, at an instruction
//! [`fixup`] knows, sets the saved instruction pointer to what [`fixup`] returns and returns;
//! the routine then reports the fault instead of the process dying. Without such a handler the
//! routines fault exactly as a plain load or flush would, which is why they stay `unsafe fn`s.
//!
//! Each routine is a leaf that touches no stack and only caller-saved registers, so jumping to
//! its recovery point from the faulting instruction leaves nothing to undo: the recovery point
//! sets the return values and returns to the caller.
//!
//! Timing: the timed routine executes the same instructions between its two counter reads as
//! the inline sequence it replaced (the call and return lie outside them), and calibration
//! ([`crate::probe::calibrate`]) times through the same routine, so thresholds and reloads
//! measure alike.
//!
//! x86_64 only ([`SUPPORTED`]). Elsewhere the functions are plain accesses that never report a
//! fault and [`fixup`] knows no instruction: a fault kills the process, as before (the agent
//! therefore refuses to probe there).

use preheat_model::VirtAddr;

/// Whether loads and flushes here are recoverable (x86_64 builds).
pub const SUPPORTED: bool = cfg!(target_arch = "x86_64");

/// A guarded access faulted and was resumed at its recovery point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Faulted;

/// Load one byte at `addr` (the value is discarded).
///
/// # Safety
/// Either `addr` lies in a page that is mapped readable in this process, backed by memory, and
/// stays so for the call (as [`crate::cache::flush_line`] requires), or the calling thread has
/// a SIGSEGV and SIGBUS handler in place that resumes its faults at the instruction address
/// [`fixup`] returns (see the module docs). In the second case a fault returns `Err(Faulted)`;
/// without such a handler it kills the process.
#[inline(always)]
pub unsafe fn load(addr: VirtAddr) -> Result<(), Faulted> {
    // SAFETY: the caller's contract.
    unsafe { imp::load(addr.0 as usize) }
}

/// Flush the line containing `addr` from every cache level (`clflushopt` where available, else
/// `clflush`; unordered: fence before relying on it, see [`crate::cache::fence`]).
///
/// # Safety
/// As [`load`].
#[inline(always)]
pub unsafe fn flush(addr: VirtAddr) -> Result<(), Faulted> {
    // SAFETY: the caller's contract.
    unsafe { imp::flush(addr.0 as usize) }
}

/// Time a one-byte load of `addr` in TSC ticks, the reads of the counter ordered around it
/// (see [`crate::probe`]).
///
/// # Safety
/// As [`load`].
#[inline(always)]
pub unsafe fn timed_load(addr: VirtAddr) -> Result<u64, Faulted> {
    // SAFETY: the caller's contract.
    unsafe { imp::timed_load(addr.0 as usize) }
}

/// The recovery point for a fault at instruction address `ip`, if `ip` is the memory-touching
/// instruction of one of the guarded routines. Async-signal-safe (compares addresses only).
#[inline]
pub fn fixup(ip: usize) -> Option<usize> {
    imp::fixup(ip)
}

#[cfg(target_arch = "x86_64")]
mod imp {
    use super::Faulted;

    // The routines. Each `*_at` label is the one instruction that touches the caller's address,
    // each `*_fixup` label the recovery point for a fault there. The labels are global but
    // hidden: one definition per linked object, invisible to other objects of the process (the
    // agent is preloaded into programs that may link this crate themselves).
    core::arch::global_asm!(
        ".pushsection .text.preheat_engine_guard,\"ax\",@progbits",
        // fn load(addr: rdi) -> eax: 0 loaded, 1 faulted.
        ".p2align 4",
        ".globl preheat_engine_guard_load",
        ".hidden preheat_engine_guard_load",
        ".type preheat_engine_guard_load,@function",
        "preheat_engine_guard_load:",
        ".globl preheat_engine_guard_load_at",
        ".hidden preheat_engine_guard_load_at",
        "preheat_engine_guard_load_at:",
        "    movzx eax, byte ptr [rdi]",
        "    xor eax, eax",
        "    ret",
        ".globl preheat_engine_guard_load_fixup",
        ".hidden preheat_engine_guard_load_fixup",
        "preheat_engine_guard_load_fixup:",
        "    mov eax, 1",
        "    ret",
        ".size preheat_engine_guard_load, . - preheat_engine_guard_load",
        // fn clflushopt(addr: rdi) -> eax: 0 flushed, 1 faulted.
        ".p2align 4",
        ".globl preheat_engine_guard_clflushopt",
        ".hidden preheat_engine_guard_clflushopt",
        ".type preheat_engine_guard_clflushopt,@function",
        "preheat_engine_guard_clflushopt:",
        ".globl preheat_engine_guard_clflushopt_at",
        ".hidden preheat_engine_guard_clflushopt_at",
        "preheat_engine_guard_clflushopt_at:",
        "    clflushopt byte ptr [rdi]",
        "    xor eax, eax",
        "    ret",
        ".globl preheat_engine_guard_clflushopt_fixup",
        ".hidden preheat_engine_guard_clflushopt_fixup",
        "preheat_engine_guard_clflushopt_fixup:",
        "    mov eax, 1",
        "    ret",
        ".size preheat_engine_guard_clflushopt, . - preheat_engine_guard_clflushopt",
        // fn clflush(addr: rdi) -> eax: 0 flushed, 1 faulted.
        ".p2align 4",
        ".globl preheat_engine_guard_clflush",
        ".hidden preheat_engine_guard_clflush",
        ".type preheat_engine_guard_clflush,@function",
        "preheat_engine_guard_clflush:",
        ".globl preheat_engine_guard_clflush_at",
        ".hidden preheat_engine_guard_clflush_at",
        "preheat_engine_guard_clflush_at:",
        "    clflush byte ptr [rdi]",
        "    xor eax, eax",
        "    ret",
        ".globl preheat_engine_guard_clflush_fixup",
        ".hidden preheat_engine_guard_clflush_fixup",
        "preheat_engine_guard_clflush_fixup:",
        "    mov eax, 1",
        "    ret",
        ".size preheat_engine_guard_clflush, . - preheat_engine_guard_clflush",
        // fn timed_rdtscp(addr: rdi) -> (rax: ticks, rdx: 0 loaded / 1 faulted).
        // rdtscp waits for every earlier instruction, the load included, to complete; lfence
        // keeps later instructions (the load, the next iteration) from starting before it.
        ".p2align 4",
        ".globl preheat_engine_guard_timed_rdtscp",
        ".hidden preheat_engine_guard_timed_rdtscp",
        ".type preheat_engine_guard_timed_rdtscp,@function",
        "preheat_engine_guard_timed_rdtscp:",
        "    rdtscp",
        "    lfence",
        "    shl rdx, 32",
        "    or rax, rdx",
        "    mov rsi, rax",
        ".globl preheat_engine_guard_timed_rdtscp_at",
        ".hidden preheat_engine_guard_timed_rdtscp_at",
        "preheat_engine_guard_timed_rdtscp_at:",
        "    movzx r8d, byte ptr [rdi]",
        "    rdtscp",
        "    lfence",
        "    shl rdx, 32",
        "    or rax, rdx",
        "    sub rax, rsi",
        "    xor edx, edx",
        "    ret",
        ".globl preheat_engine_guard_timed_rdtscp_fixup",
        ".hidden preheat_engine_guard_timed_rdtscp_fixup",
        "preheat_engine_guard_timed_rdtscp_fixup:",
        "    xor eax, eax",
        "    mov edx, 1",
        "    ret",
        ".size preheat_engine_guard_timed_rdtscp, . - preheat_engine_guard_timed_rdtscp",
        // fn timed_rdtsc(addr: rdi) -> as timed_rdtscp, for CPUs without rdtscp: the counter
        // read fenced on both sides, as `time::rdtscp` does there.
        ".p2align 4",
        ".globl preheat_engine_guard_timed_rdtsc",
        ".hidden preheat_engine_guard_timed_rdtsc",
        ".type preheat_engine_guard_timed_rdtsc,@function",
        "preheat_engine_guard_timed_rdtsc:",
        "    lfence",
        "    rdtsc",
        "    lfence",
        "    shl rdx, 32",
        "    or rax, rdx",
        "    mov rsi, rax",
        ".globl preheat_engine_guard_timed_rdtsc_at",
        ".hidden preheat_engine_guard_timed_rdtsc_at",
        "preheat_engine_guard_timed_rdtsc_at:",
        "    movzx r8d, byte ptr [rdi]",
        "    lfence",
        "    rdtsc",
        "    lfence",
        "    shl rdx, 32",
        "    or rax, rdx",
        "    sub rax, rsi",
        "    xor edx, edx",
        "    ret",
        ".globl preheat_engine_guard_timed_rdtsc_fixup",
        ".hidden preheat_engine_guard_timed_rdtsc_fixup",
        "preheat_engine_guard_timed_rdtsc_fixup:",
        "    xor eax, eax",
        "    mov edx, 1",
        "    ret",
        ".size preheat_engine_guard_timed_rdtsc, . - preheat_engine_guard_timed_rdtsc",
        ".popsection",
    );

    /// What the timed routines return (in `rax`, `rdx`: a two-word `repr(C)` struct).
    #[repr(C)]
    struct Timed {
        ticks: u64,
        faulted: u64,
    }

    extern "C" {
        fn preheat_engine_guard_load(addr: usize) -> u32;
        fn preheat_engine_guard_clflushopt(addr: usize) -> u32;
        fn preheat_engine_guard_clflush(addr: usize) -> u32;
        fn preheat_engine_guard_timed_rdtscp(addr: usize) -> Timed;
        fn preheat_engine_guard_timed_rdtsc(addr: usize) -> Timed;
        // Labels, not functions: only their addresses are used (never called).
        fn preheat_engine_guard_load_at();
        fn preheat_engine_guard_load_fixup();
        fn preheat_engine_guard_clflushopt_at();
        fn preheat_engine_guard_clflushopt_fixup();
        fn preheat_engine_guard_clflush_at();
        fn preheat_engine_guard_clflush_fixup();
        fn preheat_engine_guard_timed_rdtscp_at();
        fn preheat_engine_guard_timed_rdtscp_fixup();
        fn preheat_engine_guard_timed_rdtsc_at();
        fn preheat_engine_guard_timed_rdtsc_fixup();
    }

    #[inline(always)]
    fn status(faulted: u32) -> Result<(), Faulted> {
        if faulted == 0 {
            Ok(())
        } else {
            Err(Faulted)
        }
    }

    /// # Safety
    /// As [`super::load`].
    #[inline(always)]
    pub unsafe fn load(addr: usize) -> Result<(), Faulted> {
        // SAFETY: the routine loads one byte at `addr` and otherwise follows the C calling
        // convention (caller-saved registers only, no stack); the caller guarantees the byte
        // readable or a handler that resumes a fault at the routine's recovery point.
        status(unsafe { preheat_engine_guard_load(addr) })
    }

    /// # Safety
    /// As [`super::flush`].
    #[inline(always)]
    pub unsafe fn flush(addr: usize) -> Result<(), Faulted> {
        let f = crate::cache::features();
        if f.clflushopt {
            // SAFETY: clflushopt support was checked via CPUID; the routine flushes the line
            // at `addr` (contents unchanged) under the C calling convention; the caller
            // guarantees the line readable or a handler that resumes a fault (as `load`).
            status(unsafe { preheat_engine_guard_clflushopt(addr) })
        } else if f.clflush {
            // SAFETY: as above, with clflush (checked via CPUID).
            status(unsafe { preheat_engine_guard_clflush(addr) })
        } else {
            Ok(())
        }
    }

    /// # Safety
    /// As [`super::timed_load`].
    #[inline(always)]
    pub unsafe fn timed_load(addr: usize) -> Result<u64, Faulted> {
        let t = if crate::cache::features().rdtscp {
            // SAFETY: rdtscp support was checked via CPUID; otherwise as `load` (the routine
            // reads the counter, loads one byte at `addr`, reads the counter again).
            unsafe { preheat_engine_guard_timed_rdtscp(addr) }
        } else {
            // SAFETY: rdtsc and lfence are x86_64 baseline; otherwise as `load`.
            unsafe { preheat_engine_guard_timed_rdtsc(addr) }
        };
        if t.faulted == 0 {
            Ok(t.ticks)
        } else {
            Err(Faulted)
        }
    }

    pub fn fixup(ip: usize) -> Option<usize> {
        let table: [(unsafe extern "C" fn(), unsafe extern "C" fn()); 5] = [
            (
                preheat_engine_guard_load_at,
                preheat_engine_guard_load_fixup,
            ),
            (
                preheat_engine_guard_clflushopt_at,
                preheat_engine_guard_clflushopt_fixup,
            ),
            (
                preheat_engine_guard_clflush_at,
                preheat_engine_guard_clflush_fixup,
            ),
            (
                preheat_engine_guard_timed_rdtscp_at,
                preheat_engine_guard_timed_rdtscp_fixup,
            ),
            (
                preheat_engine_guard_timed_rdtsc_at,
                preheat_engine_guard_timed_rdtsc_fixup,
            ),
        ];
        table
            .iter()
            .find(|(at, _)| *at as usize == ip)
            .map(|(_, to)| *to as usize)
    }
}

#[cfg(not(target_arch = "x86_64"))]
mod imp {
    use super::Faulted;

    /// # Safety
    /// As [`super::load`] (unguarded here: the line must be mapped).
    #[inline(always)]
    pub unsafe fn load(addr: usize) -> Result<(), Faulted> {
        // SAFETY: the caller guarantees a mapped, readable byte (no fixup handler can help on
        // this architecture).
        std::hint::black_box(unsafe { std::ptr::read_volatile(addr as *const u8) });
        Ok(())
    }

    /// # Safety
    /// As [`super::flush`] (a no-op here).
    #[inline(always)]
    pub unsafe fn flush(_addr: usize) -> Result<(), Faulted> {
        Ok(())
    }

    /// # Safety
    /// As [`super::timed_load`] (unguarded here: the line must be mapped).
    #[inline(always)]
    pub unsafe fn timed_load(addr: usize) -> Result<u64, Faulted> {
        let t0 = crate::time::rdtscp();
        // SAFETY: as `load`.
        unsafe { load(addr) }?;
        Ok(crate::time::rdtscp().wrapping_sub(t0))
    }

    pub fn fixup(_ip: usize) -> Option<usize> {
        None
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;

    /// Faults the test handler resumed.
    static RESUMED: AtomicUsize = AtomicUsize::new(0);

    /// A test SIGSEGV/SIGBUS handler: resume a fault at a guarded instruction at its recovery
    /// point; any other fault goes back to the previous disposition (re-installed, and the
    /// access re-executes under it).
    extern "C" fn resume(sig: libc::c_int, _info: *mut libc::siginfo_t, uctx: *mut libc::c_void) {
        let uc = uctx as *mut libc::ucontext_t;
        // SAFETY: the kernel passes a valid ucontext to an SA_SIGINFO handler.
        let rip = unsafe { &mut (*uc).uc_mcontext.gregs[libc::REG_RIP as usize] };
        if let Some(to) = fixup(*rip as usize) {
            *rip = to as i64;
            RESUMED.fetch_add(1, Ordering::SeqCst);
            return;
        }
        let i = if sig == libc::SIGSEGV { 0 } else { 1 };
        let old = OLD[i].load(Ordering::SeqCst) as *const libc::sigaction;
        // SAFETY: `old` points to the leaked previous action saved by `with_handler`.
        unsafe { libc::sigaction(sig, old, std::ptr::null_mut()) };
    }

    static OLD: [AtomicUsize; 2] = [AtomicUsize::new(0), AtomicUsize::new(0)];
    /// One test at a time swaps the handlers.
    static SWAP: Mutex<()> = Mutex::new(());

    /// Run `f` with a handler installed for SIGSEGV and SIGBUS that resumes faults at
    /// [`fixup`]'s recovery points (any thread: only the tests fault there); put the previous
    /// actions back.
    pub(crate) fn with_resume_handler(f: impl FnOnce()) {
        let _one = SWAP.lock().unwrap_or_else(|e| e.into_inner());
        let sigs = [libc::SIGSEGV, libc::SIGBUS];
        for (i, sig) in sigs.into_iter().enumerate() {
            // SAFETY: all-zero sigactions are valid plain data; the pointers are valid, the
            // handler has the SA_SIGINFO signature and lives for the whole test binary.
            unsafe {
                let mut act: libc::sigaction = std::mem::zeroed();
                act.sa_sigaction = resume as *const () as usize;
                act.sa_flags = libc::SA_SIGINFO;
                let old: &'static mut libc::sigaction = Box::leak(Box::new(std::mem::zeroed()));
                assert_eq!(libc::sigaction(sig, &act, &mut *old), 0);
                OLD[i].store(old as *mut libc::sigaction as usize, Ordering::SeqCst);
            }
        }
        f();
        for (i, sig) in sigs.into_iter().enumerate() {
            let old = OLD[i].load(Ordering::SeqCst) as *const libc::sigaction;
            // SAFETY: `old` is the saved previous action.
            unsafe { libc::sigaction(sig, old, std::ptr::null_mut()) };
        }
    }

    /// Every guarded access reports a fault on a page that is gone, one without read access
    /// and one past the end of a file (SIGBUS), and works on a mapped page.
    #[test]
    fn faults_are_recovered_at_the_fixup() {
        let _shared = crate::test_lock::shared();
        if !SUPPORTED {
            return;
        }
        const PAGE: usize = 4096;
        // SAFETY: plain anonymous and memfd mappings owned by this test; the file is closed
        // after mapping (the mapping keeps it), every mapping is unmapped at the end.
        unsafe {
            let anon = libc::mmap(
                std::ptr::null_mut(),
                3 * PAGE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            ) as usize;
            assert_ne!(anon, libc::MAP_FAILED as usize);
            *(anon as *mut u8) = 1;
            assert_eq!(libc::munmap((anon + PAGE) as *mut libc::c_void, PAGE), 0);
            assert_eq!(
                libc::mprotect(
                    (anon + 2 * PAGE) as *mut libc::c_void,
                    PAGE,
                    libc::PROT_NONE
                ),
                0
            );
            let fd = libc::memfd_create(c"guard-test".as_ptr(), 0);
            assert!(fd >= 0);
            assert_eq!(libc::ftruncate(fd, PAGE as libc::off_t), 0);
            let file = libc::mmap(
                std::ptr::null_mut(),
                2 * PAGE,
                libc::PROT_READ,
                libc::MAP_SHARED,
                fd,
                0,
            ) as usize;
            assert_ne!(file, libc::MAP_FAILED as usize);
            libc::close(fd);
            let before = RESUMED.load(Ordering::SeqCst);
            let mut results = Vec::new();
            with_resume_handler(|| {
                for a in [anon, anon + PAGE, anon + 2 * PAGE, file, file + PAGE] {
                    let a = VirtAddr(a as u64);
                    results.push((load(a).is_ok(), flush(a).is_ok(), timed_load(a).is_ok()));
                }
            });
            assert_eq!(
                results,
                [
                    (true, true, true),
                    (false, false, false),
                    (false, false, false),
                    (true, true, true),
                    (false, false, false),
                ]
            );
            // The flush of a page without read access faults too where the CPU checks it
            // like a load (every x86_64 CPU); 9 faults resumed in all.
            assert_eq!(RESUMED.load(Ordering::SeqCst) - before, 9);
            libc::munmap(anon as *mut libc::c_void, 3 * PAGE);
            libc::munmap(file as *mut libc::c_void, 2 * PAGE);
        }
    }

    #[test]
    fn fixup_knows_only_the_guarded_instructions() {
        assert_eq!(fixup(0), None);
        assert_eq!(
            fixup(fixup_knows_only_the_guarded_instructions as *const () as usize),
            None
        );
    }
}
