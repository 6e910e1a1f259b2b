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

/// Sampler configuration (defaults: 64 pages every 100 ms, at most 1000 induced faults/s,
/// one-page granules, write faults).
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
    fn config_json_defaults() {
        let c: CommConfig = serde_json::from_str(r#"{"pages": 8, "access": "any"}"#).unwrap();
        assert_eq!(c.pages, 8);
        assert_eq!(c.access, CommAccess::Any);
        assert_eq!(c.period_ms, 100);
    }
}
