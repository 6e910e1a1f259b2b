//! Communication detection messages: the configuration of the agent's shared-pages sampler and
//! the communication report it returns.
//!
//! This is the data side of SPCD (Diener et al., *Communication-Based Mapping Using Shared
//! Pages*, IPDPS'13) as Busse et al. use it in *Partial Coscheduling of Virtual Machines Based on
//! Memory Access Patterns* (SAC'15, §2.2): access to a sample of the process's pages is revoked
//! so that the next access faults; a fault on a page (granule) that another thread touched
//! before is a *communication event* between the two threads; the events form a symmetric
//! thread × thread matrix. The mechanism itself lives in the agent (`preheat-agent::comm`).

use serde::{Deserialize, Serialize};

/// Most pages the sampler may revoke in one round.
pub const MAX_PAGES_PER_ROUND: u32 = 512;
/// Most threads a matrix holds (further threads are counted, not recorded).
pub const MAX_COMM_THREADS: usize = 256;

/// Which accesses an induced fault catches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum CommAccess {
    /// Pages are made read-only: writes fault. The kernel can still read them for the
    /// program's system calls (futex waits, `write`, `send`), so this is the safe default.
    #[default]
    Write,
    /// Pages are made inaccessible: reads and writes fault, as SPCD's cleared present bit. A
    /// system call that reads a sampled page fails with `EFAULT` (the agent retries the calls
    /// it interposes; glibc aborts on `EFAULT` from a condition-variable futex wait).
    Any,
}

impl CommAccess {
    pub fn name(self) -> &'static str {
        match self {
            CommAccess::Write => "write",
            CommAccess::Any => "any",
        }
    }
}

/// How pages are revoked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum CommMechanism {
    /// Chosen at start (see the agent's `comm` module); the report says which and why.
    #[default]
    Auto,
    /// `mprotect` and a SIGSEGV handler.
    Mprotect,
    /// userfaultfd write-protect with thread ids (writes only).
    Uffd,
}

impl CommMechanism {
    pub fn name(self) -> &'static str {
        match self {
            CommMechanism::Auto => "auto",
            CommMechanism::Mprotect => "mprotect",
            CommMechanism::Uffd => "uffd",
        }
    }
}

/// Which memory the sampler draws pages from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum CommRegion {
    /// Every eligible mapping (the heap, anonymous and shared memory).
    #[default]
    All,
    /// Only eligible mappings of exactly this many bytes: a QEMU guest's RAM, which QEMU maps
    /// as one anonymous mapping of exactly its `-m` size (measured with QEMU 7.2 TCG: see the
    /// agent's `comm::sampler`), so that QEMU's own memory and TCG's code buffers are never
    /// sampled.
    MappingBytes(u64),
}

impl CommRegion {
    /// Whether a mapping of `len` bytes may be sampled.
    pub fn admits(self, len: u64) -> bool {
        match self {
            CommRegion::All => true,
            CommRegion::MappingBytes(b) => len == b,
        }
    }
}

/// Whose faults count in the matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum CommThreads {
    /// Every thread of the program (but the agent's).
    #[default]
    All,
    /// Only a hypervisor's vCPU threads ([`is_vcpu_thread`]): the matrix is vCPU × vCPU. Faults
    /// by other threads (QEMU's main loop, its I/O workers) are handled and counted apart.
    Vcpu,
}

/// Whether a thread named `name` is a QEMU vCPU thread (`CPU 0/TCG`, `CPU 3/KVM`).
pub fn is_vcpu_thread(name: &str) -> bool {
    name.strip_prefix("CPU ")
        .and_then(|r| r.split_once('/'))
        .is_some_and(|(n, accel)| {
            !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) && !accel.is_empty()
        })
}

/// How a round's pages are found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum CommFocus {
    /// SPCD's way: pages that faulted last round again, the rest drawn at random from the
    /// resident pages.
    #[default]
    Random,
    /// Concentrate on written memory: the kernel tracks which pages were written since the
    /// last round (userfaultfd asynchronous write-protect read with `PAGEMAP_SCAN`, Linux ≥
    /// 6.7), and the draws come from those ([`split_round`]). Falls back to `random` (the
    /// report says why) where the kernel lacks it. Not with the `uffd` mechanism.
    Written,
}

/// How a focused round's `n` pages divide: up to half re-sampled pages that faulted last round
/// (`reuse` of them known), then pages written last round (`written` known), keeping an eighth
/// (at least one page) for uniform random draws so that memory the tracker misses is still
/// found. Returns `(reuse, written, random)`, summing to `n`.
pub fn split_round(n: usize, reuse: usize, written: usize) -> (usize, usize, usize) {
    let r = reuse.min(n / 2);
    let explore = if n > 1 { (n / 8).max(1) } else { 0 };
    let w = written.min(n - r - explore.min(n - r));
    (r, w, n - r - w)
}

/// The page at index `k` of the pages of `ranges` (`(start, bytes)`, page-aligned), counted in
/// order; `None` past the end.
pub fn nth_page(ranges: &[(u64, u64)], mut k: u64, page: u64) -> Option<u64> {
    for &(s, len) in ranges {
        let pages = len / page;
        if k < pages {
            return Some(s + k * page);
        }
        k -= pages;
    }
    None
}

/// Sampler configuration (defaults: 64 pages every 100 ms, at most 1000 induced faults/s,
/// one-page granules, write faults, all memory, all threads, random draws).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct CommConfig {
    /// Length of one sampling round, ms.
    pub period_ms: u32,
    /// Pages revoked per round (capped by `budget`).
    pub pages: u32,
    /// Granule: accesses within the same aligned `granule` bytes count as the same location.
    pub granule: u64,
    /// Most induced faults per second (each revoked page faults at most once per round, so
    /// the pages per round are capped at `budget * period`).
    pub budget: u32,
    pub access: CommAccess,
    pub mechanism: CommMechanism,
    /// Which mappings are sampled.
    pub region: CommRegion,
    /// Whose faults count.
    pub threads: CommThreads,
    /// How pages are found.
    pub focus: CommFocus,
}

impl Default for CommConfig {
    fn default() -> Self {
        CommConfig {
            period_ms: 100,
            pages: 64,
            granule: 4096,
            budget: 1000,
            access: CommAccess::Write,
            mechanism: CommMechanism::Auto,
            region: CommRegion::All,
            threads: CommThreads::All,
            focus: CommFocus::Random,
        }
    }
}

impl CommConfig {
    /// Host-side detection for a QEMU guest with `memory_mb` MiB: only its RAM is sampled,
    /// only vCPU threads count, draws concentrate on written pages, pages revoked by
    /// `mprotect`, in 10 ms rounds (at most 10,000 induced faults/s). Measured on `mg` (one
    /// run each): 100 ms rounds could not tell a guest whose threads share from one whose
    /// threads share nothing (117 vs 156 events); 10 ms rounds could (191 vs 85): a revoked
    /// page yields at most one event per round, so short rounds favour pages the vCPUs write
    /// alternately at a high rate (the workload's) over the guest kernel's slower sharing.
    pub fn guest(memory_mb: u32) -> CommConfig {
        CommConfig {
            period_ms: 10,
            budget: 10_000,
            region: CommRegion::MappingBytes(u64::from(memory_mb) << 20),
            threads: CommThreads::Vcpu,
            focus: CommFocus::Written,
            mechanism: CommMechanism::Mprotect,
            ..CommConfig::default()
        }
    }
}

impl CommConfig {
    /// Pages revoked per round after the fault budget: `min(pages, budget * period)`, ≥ 1.
    pub fn pages_per_round(&self) -> u32 {
        let by_budget = (u64::from(self.budget) * u64::from(self.period_ms) / 1000).max(1);
        (u64::from(self.pages).min(by_budget)) as u32
    }

    /// Check every field; the error names the field and its allowed range.
    pub fn validate(&self) -> Result<(), String> {
        if !(1..=60_000).contains(&self.period_ms) {
            return Err(format!(
                "period {} ms is out of range (1 to 60000 ms)",
                self.period_ms
            ));
        }
        if !(1..=MAX_PAGES_PER_ROUND).contains(&self.pages) {
            return Err(format!(
                "pages per round {} is out of range (1 to {MAX_PAGES_PER_ROUND})",
                self.pages
            ));
        }
        if !self.granule.is_power_of_two() || !(4096..=1 << 30).contains(&self.granule) {
            return Err(format!(
                "granule {} bytes must be a power of two from 4096 (one page) to 1 GiB",
                self.granule
            ));
        }
        if self.budget == 0 {
            return Err("fault budget must be at least 1 fault/s".into());
        }
        if self.mechanism == CommMechanism::Uffd && self.access == CommAccess::Any {
            return Err(
                "the userfaultfd mechanism sees writes only: use access write (or mechanism \
                 mprotect for reads too)"
                    .into(),
            );
        }
        if self.mechanism == CommMechanism::Uffd && self.focus == CommFocus::Written {
            return Err(
                "focus written tracks writes with a userfaultfd of its own: use mechanism \
                 mprotect (or auto) with it"
                    .into(),
            );
        }
        if self.region == CommRegion::MappingBytes(0) {
            return Err("region mapping_bytes must be at least one page".into());
        }
        Ok(())
    }
}

/// One thread of a communication matrix.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommThread {
    pub tid: u32,
    /// `/proc/PID/task/TID/comm`, or empty once the thread has exited.
    pub name: String,
    pub alive: bool,
}

/// What the sampler measured since it started or was last reset.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CommReport {
    /// Sampling is running.
    pub active: bool,
    /// The mechanism in use (`mprotect` or `uffd`) and, when it was chosen automatically, why.
    pub mechanism: String,
    pub config: CommConfig,
    /// Threads in matrix order.
    pub threads: Vec<CommThread>,
    /// Symmetric communication events between threads (`matrix[i][j]` = events between
    /// `threads[i]` and `threads[j]`; diagonal 0).
    pub matrix: Vec<Vec<u64>>,
    /// Sum of the upper triangle.
    pub events: u64,
    /// Faults the sampler induced and handled.
    pub faults_induced: u64,
    /// Faults that were not ours, passed on to the program's own handler or default action.
    pub faults_foreign: u64,
    /// System calls of hooked functions that failed with EFAULT on a sampled page and were
    /// retried after restoring the pages.
    pub efault_retries: u64,
    /// Sampling rounds completed.
    pub rounds: u64,
    /// Pages revoked, summed over rounds.
    pub pages_revoked: u64,
    /// Pages the sampler found changed under it (unmapped or re-protected) and released.
    pub pages_released: u64,
    /// Faults by threads beyond [`MAX_COMM_THREADS`] (not in the matrix).
    pub threads_dropped: u64,
    /// Induced faults by threads the configuration does not count ([`CommThreads::Vcpu`]:
    /// QEMU's other threads), handled but not in the matrix.
    #[serde(default)]
    pub faults_uncounted: u64,
    /// Pages the written-page tracker reported, summed over rounds ([`CommFocus::Written`]).
    #[serde(default)]
    pub pages_written: u64,
    /// How pages were found: the focus in use, or why `written` fell back to `random`.
    #[serde(default)]
    pub focus: String,
    /// Time covered by this report, ns (since start or the last reset).
    pub elapsed_ns: u64,
    /// Why detection stopped itself, if it did.
    pub disabled_reason: Option<String>,
}

impl CommReport {
    /// Events per second over the report's time.
    pub fn events_per_s(&self) -> f64 {
        per_s(self.events, self.elapsed_ns)
    }
    /// Induced faults per second over the report's time.
    pub fn faults_per_s(&self) -> f64 {
        per_s(self.faults_induced, self.elapsed_ns)
    }
    /// Induced faults of the threads the matrix counts (with [`CommThreads::Vcpu`], QEMU's vCPU
    /// threads: its other threads' faults are handled but not counted).
    pub fn counted_faults(&self) -> u64 {
        self.faults_induced.saturating_sub(self.faults_uncounted)
    }
}

/// Events in a symmetric matrix: the sum of its upper triangle.
pub fn events_of(matrix: &[Vec<u64>]) -> u64 {
    matrix
        .iter()
        .enumerate()
        .map(|(i, row)| row.iter().skip(i + 1).sum::<u64>())
        .sum()
}

fn per_s(n: u64, ns: u64) -> f64 {
    if ns == 0 {
        0.0
    } else {
        n as f64 * 1e9 / ns as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budget_caps_pages() {
        let c = CommConfig::default();
        assert_eq!(c.pages_per_round(), 64);
        let c = CommConfig {
            budget: 100,
            ..CommConfig::default()
        };
        assert_eq!(c.pages_per_round(), 10);
        let c = CommConfig {
            budget: 1,
            period_ms: 1,
            ..CommConfig::default()
        };
        assert_eq!(c.pages_per_round(), 1);
    }

    #[test]
    fn validation_names_the_field() {
        assert!(CommConfig::default().validate().is_ok());
        let bad = |c: CommConfig, word: &str| {
            let e = c.validate().unwrap_err();
            assert!(e.contains(word), "{e}");
        };
        bad(
            CommConfig {
                period_ms: 0,
                ..Default::default()
            },
            "period",
        );
        bad(
            CommConfig {
                pages: 100_000,
                ..Default::default()
            },
            "pages",
        );
        bad(
            CommConfig {
                granule: 5000,
                ..Default::default()
            },
            "granule",
        );
        bad(
            CommConfig {
                budget: 0,
                ..Default::default()
            },
            "budget",
        );
        bad(
            CommConfig {
                mechanism: CommMechanism::Uffd,
                access: CommAccess::Any,
                ..Default::default()
            },
            "writes only",
        );
    }

    #[test]
    fn regions_threads_and_focus() {
        let g = CommConfig::guest(256);
        assert!(g.validate().is_ok());
        assert!(g.region.admits(256 << 20));
        assert!(!g.region.admits((256 << 20) + 4096));
        assert!(CommRegion::All.admits(4096));
        let j = serde_json::to_string(&g).unwrap();
        assert!(j.contains(r#""region":{"mapping_bytes":268435456}"#), "{j}");
        let back: CommConfig = serde_json::from_str(&j).unwrap();
        assert_eq!(back, g);
        let c: CommConfig =
            serde_json::from_str(r#"{"threads": "vcpu", "focus": "written"}"#).unwrap();
        assert_eq!(
            (c.threads, c.focus),
            (CommThreads::Vcpu, CommFocus::Written)
        );
        assert!(CommConfig {
            mechanism: CommMechanism::Uffd,
            ..g
        }
        .validate()
        .unwrap_err()
        .contains("mprotect"));
        for (name, yes) in [
            ("CPU 0/TCG", true),
            ("CPU 12/KVM", true),
            ("CPU 1/", false),
            ("CPU x/TCG", false),
            ("qemu-system-x86", false),
            ("call_rcu", false),
        ] {
            assert_eq!(is_vcpu_thread(name), yes, "{name}");
        }
    }

    #[test]
    fn round_split_keeps_exploring() {
        // Nothing known: all random.
        assert_eq!(split_round(64, 0, 0), (0, 0, 64));
        // Plenty known: half reuse, an eighth random, the rest written.
        assert_eq!(split_round(64, 100, 1000), (32, 24, 8));
        // Few written pages: the rest is random.
        assert_eq!(split_round(64, 4, 10), (4, 10, 50));
        assert_eq!(split_round(1, 5, 5), (0, 1, 0));
        for n in 0..40 {
            for r in 0..50 {
                for w in [0, 3, 100] {
                    let (a, b, c) = split_round(n, r, w);
                    assert_eq!(a + b + c, n);
                    assert!(a <= r && b <= w);
                }
            }
        }
    }

    #[test]
    fn nth_page_counts_across_ranges() {
        let r = [(0x1000, 0x2000), (0x10000, 0x1000)];
        assert_eq!(nth_page(&r, 0, 4096), Some(0x1000));
        assert_eq!(nth_page(&r, 1, 4096), Some(0x2000));
        assert_eq!(nth_page(&r, 2, 4096), Some(0x10000));
        assert_eq!(nth_page(&r, 3, 4096), None);
    }

    #[test]
    fn config_json_defaults() {
        let c: CommConfig = serde_json::from_str(r#"{"pages": 8, "access": "any"}"#).unwrap();
        assert_eq!(c.pages, 8);
        assert_eq!(c.access, CommAccess::Any);
        assert_eq!(c.period_ms, 100);
    }
}
