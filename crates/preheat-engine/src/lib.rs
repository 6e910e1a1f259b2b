//! The one crate of preheat that owns `unsafe` and OS-specific code.
//!
//! Every `unsafe` block carries a `// SAFETY:` comment and every `unsafe fn` a `# Safety`
//! section (the workspace lints `clippy::undocumented_unsafe_blocks` and
//! `clippy::missing_safety_doc` check both). Other crates use the safe functions exported here,
//! and the few `unsafe fn`s below only where they can say why an address is valid.
//!
//! | module | paper mechanism |
//! |---|---|
//! | [`time`] | timestamps (TSC, CLOCK_MONOTONIC) for deadlines and probe timing |
//! | [`cache`] | line flush (clflush/clflushopt) and prefetch (prefetcht0) primitives |
//! | [`probe`] | flush+reload working-set estimation: our stand-in for §3.1's RAMINDEX tag dump |
//! | [`guard`] | the probe's loads and flushes as routines whose faults a handler can resume (an exception table) |
//! | [`preheat`] | §3.3 preheating: sorted RLE runs loaded in priority order, stopped at a deadline, optionally split across cores |
//! | [`sweep`] | an eviction sweep that emulates the cache loss of a deep sleep state |
//! | [`topology`] | CPUs, caches, cpuidle driver from sysfs |
//! | [`latency`] | one CPU latency QoS request (`/dev/cpu_dma_latency`): idle CPUs poll while it holds 0 µs |
//! | [`idle`] | idle counters per CPU: cpuidle states, or `/proc/stat` where the kernel has none |
//! | [`machine`] | where `/sys` and `/proc` are read from (the real machine, or a fake tree of a variant) |
//! | [`procstat`] | `/proc/stat`: per-CPU ticks and boot time; `/proc/PID/stat`: one process or thread |
//! | [`codegen`] | generated code of a chosen instruction footprint (W^X mapping, x86-64) |
//! | [`basevec`] | cache-affinity base vectors (`BV_0`, data, code) and their eviction check |
//! | [`perf`] | counting events of a thread or process (`perf_event_open`): IPC and misses per instruction where a PMU exists |
//! | [`workloads`] | the cache-affinity bundled workloads (chase ≈ mcf, stream ≈ art, branchy ≈ gcc) |
//! | [`maps`] | `/proc/PID/maps`, ELF build-ids, resident pages |
//! | [`fileview`] | another process's read-only file-backed memory mapped here (the same page-cache lines): probing and preheating it from outside |
//! | [`fdpass`] | a file descriptor passed over a Unix socket (`SCM_RIGHTS`): a connection the CLI hands an agent |
//! | [`elf`] | ELF file and program headers: class, machine, interpreter (is a program dynamically linked?) |
//! | [`os`] | thread pinning, scheduling class, timer slack, tids, futex |
//!
//! # Hot-path functions
//!
//! The agent calls these between an announcement and the request it announces, inside the
//! server process, possibly from a signal-free but latency-critical context. They **never
//! allocate, block, take locks, or log**, and must stay that way:
//!
//! * [`time::now_ns`], [`time::rdtscp`]
//! * everything in [`cache`] ([`cache::features`] runs CPUID once and caches it; call it once at
//!   start-up, since CPUID traps to the hypervisor on a VM)
//! * [`preheat::preheat_runs`] (and [`preheat::load_runs`])
//! * [`os::current_cpu`], [`os::gettid`]
//!
//! [`preheat::ParallelPreheater::run`] does not allocate either, but waits for its workers
//! (spinning, then `futex`).
//!
//! # Address contracts
//!
//! Addresses are [`preheat_model::VirtAddr`]s (in [`preheat_model::AbsRun`] runs and
//! [`preheat_model::proto::Range`] ranges as the model defines them), not bare integers.
//!
//! * **Fault-proof, safe:** prefetches never fault, so [`cache::prefetch_line`],
//!   [`preheat::preheat_runs`], [`preheat::ParallelPreheater::run`] and
//!   [`preheat::prefetch_addrs`] accept any address; [`maps::resident_ranges`] (mincore) and
//!   [`os::advise_hugepages`] (madvise) only ask the kernel, which validates the range.
//! * **`unsafe fn`:** functions that really *load* or *flush* an address the caller names —
//!   [`cache::flush_line`], [`cache::flush_range`], [`probe::flush`], [`probe::prepare_phase`],
//!   [`probe::reload`], [`probe::reload_phase`], [`preheat::load_runs`],
//!   [`preheat::plain_load`], [`preheat::independent_loads`], [`guard::load`], [`guard::flush`],
//!   [`guard::timed_load`] — fault (SIGSEGV, or SIGBUS past the end of a mapped file) and kill
//!   the process on an address that is not mapped readable. Their `# Safety` sections say what
//!   the caller guarantees: every line mapped, readable and backed by memory, staying so for the
//!   duration of the call (no thread may unmap it meanwhile). They never write memory and
//!   discard what they read. Obtain ranges from [`maps::read_maps`] /
//!   [`maps::resident_ranges`], and keep whoever could unmap them quiet.
//! * **Recoverable, still `unsafe fn`:** the probe's passes ([`probe::flush`],
//!   [`probe::prepare_phase`], [`probe::reload`], [`probe::reload_phase`]) touch the caller's
//!   lines only through [`guard`]'s routines, whose faulting instructions [`guard::fixup`]
//!   maps to recovery points. A caller that cannot keep the owner of the memory quiet (the agent
//!   probing a live server) installs a SIGSEGV/SIGBUS handler that resumes its own thread's
//!   faults there; the pass then returns `Err(Faulted)` instead of the process dying. Without
//!   such a handler the contract above holds unchanged.
//!
//! Functions that touch only memory the engine owns ([`probe::calibrate`],
//! [`basevec::Probe::flush`], [`sweep::EvictionBuffer::sweep`]) are safe.
//!
//! # Portability
//!
//! Linux only (sysfs, /proc, futex, sched_setaffinity). x86_64 is the target; on other
//! architectures flush and prefetch are no-ops and [`time::rdtscp`] returns
//! `CLOCK_MONOTONIC` nanoseconds, so the crate still builds.

// The engine is where preheat's unsafe lives (cache instructions, raw loads, syscalls, generated
// code): the workspace denies `unsafe_code`, this crate allows it.
#![allow(unsafe_code)]
// Part of "hot-path functions never log", checked: the engine's library code prints nothing at
// all (its tests may). Allocation and blocking are not lint-checkable; they stay a review rule.
#![cfg_attr(
    not(test),
    deny(clippy::print_stdout, clippy::print_stderr, clippy::dbg_macro)
)]

pub mod basevec;
pub mod cache;
pub mod codegen;
pub mod elf;
pub mod fdpass;
pub mod fileview;
pub mod guard;
pub mod host;
pub mod idle;
pub mod latency;
pub mod machine;
pub mod maps;
pub mod netns;
pub mod os;
pub mod perf;
pub mod pidlock;
pub mod predictor;
pub mod preheat;
pub mod probe;
pub mod procstat;
pub mod rxsteer;
pub mod sched;
pub mod steptrace;
pub mod sweep;
pub mod time;
pub mod topology;
pub mod txstamp;
pub mod workloads;

/// Serialises the cache-timing test against the rest of the suite: the flush+reload test holds
/// the lock exclusively, every other test shares it, so no other test of this crate thrashes
/// the caches (or steals the CPU) while the probe is validated.
#[cfg(test)]
pub(crate) mod test_lock {
    use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

    static LOCK: RwLock<()> = RwLock::new(());

    pub fn shared() -> RwLockReadGuard<'static, ()> {
        LOCK.read().unwrap_or_else(|e| e.into_inner())
    }

    pub fn exclusive() -> RwLockWriteGuard<'static, ()> {
        LOCK.write().unwrap_or_else(|e| e.into_inner())
    }
}
