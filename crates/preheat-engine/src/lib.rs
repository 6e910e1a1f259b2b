//! The one crate of preheat that owns `unsafe` and OS-specific code.
//!
//! Every `unsafe` block carries a `// SAFETY:` comment. Other crates (agent, CLI, daemons) use
//! only the safe functions exported here.
//!
//! | module | paper mechanism |
//! |---|---|
//! | [`time`] | timestamps (TSC, CLOCK_MONOTONIC) for deadlines and probe timing |
//! | [`cache`] | line flush (clflush/clflushopt) and prefetch (prefetcht0) primitives |
//! | [`probe`] | flush+reload working-set estimation: our stand-in for §3.1's RAMINDEX tag dump |
//! | [`preheat`] | §3.3 preheating: sorted RLE runs loaded in priority order, stopped at a deadline, optionally split across cores |
//! | [`sweep`] | an eviction sweep that emulates the cache loss of a deep sleep state |
//! | [`topology`] | CPUs, caches, cpuidle driver from sysfs |
//! | [`maps`] | `/proc/PID/maps`, ELF build-ids, resident pages |
//! | [`os`] | thread pinning, scheduling class, tids |

pub mod cache;
pub mod maps;
pub mod os;
pub mod preheat;
pub mod probe;
pub mod sweep;
pub mod time;
pub mod topology;
