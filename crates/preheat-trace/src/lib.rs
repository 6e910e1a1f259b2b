//! The `trace` working-set backend: exact user-space ground truth.
//!
//! # What it measures
//!
//! The server runs under **phtrace**, a Valgrind tool of our own (C source in
//! `valgrind/phtrace.c`, built on first use by [`ensure_tool`]). phtrace instruments every
//! guest instruction fetch (all 64-byte lines covered by `[addr, addr + len)` of each
//! instruction) and every data load and store (plain, guarded, atomic CAS, LL/SC and the memory
//! effects of helper calls such as `fxsave`/`xsave`), and records, **per thread**, the set of
//! distinct 64-byte lines (`addr & !63`) touched during each *busy period*. The result is the
//! exact user-space instruction and data working set of a request:
//!
//! * no kernel lines (the TCP stack, the scheduler, the syscall path) — Valgrind sees user space
//!   only;
//! * no hardware-prefetched, speculative or page-walk lines, and no lines evicted and refetched:
//!   it is the set of lines the program *architecturally* touched, not what a cache held;
//! * no lines of Valgrind itself.
//!
//! # Busy periods (the contract)
//!
//! A thread's busy period **starts** when one of its event-wait system calls (`epoll_wait`,
//! `epoll_pwait`, `epoll_pwait2`, `poll`, `ppoll`, `select`, `pselect6`) returns a value
//! greater than zero, and **ends** when the same thread next enters one of these system calls.
//! Waits that time out, fail or are interrupted start nothing. Threads that never call these
//! system calls (e.g. workers fed through condition variables) produce no records. For a
//! single-threaded event loop one period is one loop iteration with work, which for one request
//! on one connection is one request; several requests ready at the same time share a period.
//!
//! Each period is appended to the dump file as one record as soon as it ends (see
//! [`parse_dump`] for the format); a period still open when its thread or the program exits is
//! written as *incomplete* ([`BusyPeriod::complete`] = false). With
//! [`TraceOptions::all`] phtrace instead records everything: a thread's records then partition
//! its whole execution at event-wait entries (start-up included).
//!
//! # How this differs from the paper
//!
//! The paper (§3.1) estimates the working set on an ARM Cortex-A15 by flushing the caches,
//! disabling hardware prefetching, letting the server handle requests and then reading the
//! last-level cache's tag RAM (`RAMINDEX`) to list the physical lines present, repeating this
//! eight times and keeping lines seen repeatedly. x86 has no architectural way to read cache tags,
//! so this backend instruments the program in Valgrind instead: it sees virtual addresses (which
//! [`to_region_lines`] turns into region-relative lines that survive ASLR), only user space, and
//! never suffers from capacity/conflict evictions or prefetcher noise. The repetition (k-of-n
//! filter) is left to the caller, which gets one record per busy period.
//!
//! # Cost
//!
//! The server runs under Valgrind's JIT, so this backend is for the **estimation phase only**:
//! never leave a production server running under it. phtrace keeps its own overhead small: an
//! inline direct-mapped filter in the generated code skips repeated accesses to recently seen
//! lines, so the per-thread hash set is only touched on a filter miss, and the instruction
//! counter is bumped once per straight-line segment, not per instruction. Measured here
//! (2 vCPUs): CPU-bound `gzip` runs 5–6× slower than natively (Valgrind's `none` tool alone:
//! 3.4×; `lackey --trace-mem=yes`, which prints every access, is several hundred to thousands of
//! times slower); a small server starts in about 0.4 s and answers a memcached GET in
//! 0.2–0.5 ms instead of tens of microseconds; the first requests are slower still (tens of ms)
//! while Valgrind translates their code.
//!
//! # Caveats
//!
//! * Under Valgrind the client's brk heap and main stack are anonymous mappings that Valgrind
//!   placed, not the kernel's `[heap]` and `[stack]`: the heap is the anonymous mapping right
//!   after the executable (so [`preheat_model::RegionTable`] calls it the executable's `.bss`)
//!   and the stack sits near `0x1fff000000`, among Valgrind's own anonymous mappings, which
//!   also shift the order numbers of anonymous regions. Lines in them translate consistently
//!   within one traced run, but not onto a native run of the same server. File-backed lines
//!   (code, read-only data, `.data`) translate identically.
//! * The first request after start-up touches more (lazy symbol binding, first-use paths):
//!   discard it, or let the k-of-n filter do so.
//! * `RLIMIT_NOFILE` is lowered to 1024 (soft) / at most 20000 (hard) with the `prlimit`
//!   utility when it is available, because servers that adjust their own descriptor limit can
//!   fail under Valgrind's descriptor reservation (seen with memcached); without `prlimit` the
//!   limit is left as is.
#![forbid(unsafe_code)]

mod dump;
mod server;
mod tool;

pub use dump::{parse_dump, BusyPeriod, HEADER_LEN, KIND_BUSY, KIND_INCOMPLETE, MAGIC, VERSION};
pub use server::{TraceOptions, TracedServer};
pub use tool::{ensure_tool, ToolPaths, TOOL_NAME};

use preheat_model::{LineSet, RegionTable, VirtAddr};

/// Errors of the trace backend.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// Something the backend needs is not installed: the trace backend is unavailable.
    #[error(
        "trace backend unavailable: {what} not found (install the Debian package `{package}`)"
    )]
    Missing {
        /// What is missing, e.g. "the Valgrind tool headers (pub_tool_basics.h)".
        what: String,
        /// The Debian package that provides it.
        package: &'static str,
    },
    /// This CPU architecture is not supported by phtrace.
    #[error("trace backend unavailable: unsupported architecture {0}")]
    UnsupportedArch(&'static str),
    /// Building the phtrace tool failed.
    #[error("building the phtrace Valgrind tool in {dir} failed:\n{output}")]
    Build { dir: String, output: String },
    /// An I/O error, with what was being done.
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    /// A dump record does not start with the `PHTR` magic.
    #[error("bad phtrace record at byte {offset}: magic {found:#010x}, expected {MAGIC:#010x}")]
    BadMagic { offset: usize, found: u32 },
    /// A dump record has a version this crate does not understand.
    #[error("unsupported phtrace record version {found} at byte {offset} (expected {VERSION})")]
    BadVersion { offset: usize, found: u16 },
    /// A dump record has an unknown kind.
    #[error("unknown phtrace record kind {found} at byte {offset}")]
    BadKind { offset: usize, found: u16 },
    /// A dump record claims more lines than can exist.
    #[error("implausible phtrace record at byte {offset}: {nlines} lines")]
    BadLength { offset: usize, nlines: u64 },
}

impl TraceError {
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> TraceError {
        TraceError::Io {
            context: context.into(),
            source,
        }
    }

    /// Whether the error means "the trace backend cannot run on this machine" (a missing
    /// prerequisite or an unsupported architecture) rather than a failure.
    pub fn is_unavailable(&self) -> bool {
        matches!(
            self,
            TraceError::Missing { .. } | TraceError::UnsupportedArch(_)
        )
    }
}

/// Whether a mapping name belongs to Valgrind itself (its tool binaries, its preload objects or
/// anything under a `valgrind` library directory).
fn is_valgrind_file(name: &str) -> bool {
    let base = name.rsplit('/').next().unwrap_or(name);
    name.contains("/valgrind/") || base.starts_with("vgpreload_") || base.starts_with("phtrace-")
}

/// Translate absolute line addresses (as recorded by phtrace in the traced process) into
/// region-relative lines of `table` (built from that process's `/proc/PID/maps`).
///
/// Returns the set and the number of lines dropped because they lie in no usable mapping
/// (unmapped since, or special such as `[vdso]`) or in Valgrind's own files.
pub fn to_region_lines(lines: &[u64], table: &RegionTable) -> (LineSet, u64) {
    let own = |l: &u64| {
        table
            .mapping_of(VirtAddr(*l))
            .is_some_and(|i| is_valgrind_file(&table.mappings[i].name))
    };
    let valgrind = lines.iter().filter(|l| own(l)).count() as u64;
    let (set, dropped) = table.relative_lines(lines.iter().copied().filter(|l| !own(l)));
    (set, dropped + valgrind)
}

/// Jaccard similarity |a ∩ b| / |a ∪ b| of two sorted, de-duplicated slices (1.0 for two empty
/// slices). Handy to compare the line sets of two busy periods.
pub fn jaccard(a: &[u64], b: &[u64]) -> f64 {
    let (mut i, mut j, mut inter) = (0, 0, 0usize);
    while i < a.len() && j < b.len() {
        match a[i].cmp(&b[j]) {
            std::cmp::Ordering::Less => i += 1,
            std::cmp::Ordering::Greater => j += 1,
            std::cmp::Ordering::Equal => {
                inter += 1;
                i += 1;
                j += 1;
            }
        }
    }
    let union = a.len() + b.len() - inter;
    if union == 0 {
        1.0
    } else {
        inter as f64 / union as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use preheat_model::{FileIdent, Mapping};

    fn mapping(name: &str, start: u64, end: u64, offset: u64, file: bool) -> Mapping {
        Mapping {
            start,
            end,
            read: true,
            write: !file,
            exec: file,
            shared: false,
            offset,
            name: name.into(),
            file: file.then(|| FileIdent {
                path: name.into(),
                inode: 1,
                build_id: vec![],
            }),
        }
    }

    #[test]
    fn region_lines_drop_unmapped_special_and_valgrind_lines() {
        let table = RegionTable::build(vec![
            mapping("/usr/bin/server", 0x1000, 0x3000, 0x4000, true),
            mapping("[heap]", 0x10000, 0x20000, 0, false),
            mapping(
                "/usr/libexec/valgrind/vgpreload_core-amd64-linux.so",
                0x30000,
                0x31000,
                0,
                true,
            ),
            mapping("[vdso]", 0x40000, 0x41000, 0, false),
        ]);
        let lines = [0x1000, 0x1040, 0x2fc0, 0x10000, 0x30040, 0x40000, 0x90000];
        let (set, dropped) = to_region_lines(&lines, &table);
        assert_eq!(dropped, 3);
        assert_eq!(set.len(), 4);
        let first = set.as_slice()[0];
        assert_eq!(first.line, 0x4000 / 64);
    }

    #[test]
    fn jaccard_basics() {
        assert_eq!(jaccard(&[], &[]), 1.0);
        assert_eq!(jaccard(&[1, 2, 3], &[1, 2, 3]), 1.0);
        assert_eq!(jaccard(&[1, 2], &[3, 4]), 0.0);
        assert!((jaccard(&[1, 2, 3], &[2, 3, 4]) - 0.5).abs() < 1e-12);
    }

    #[test]
    fn valgrind_file_names() {
        assert!(is_valgrind_file(
            "/usr/libexec/valgrind/vgpreload_core-amd64-linux.so"
        ));
        assert!(is_valgrind_file(
            "/root/.cache/preheat/phtrace-abc/phtrace-amd64-linux"
        ));
        assert!(!is_valgrind_file("/usr/lib/x86_64-linux-gnu/libc.so.6"));
        assert!(!is_valgrind_file("[heap]"));
    }
}
