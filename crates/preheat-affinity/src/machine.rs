//! The machine as the plan sees it: CPUs and the caches each one can use.
//!
//! Plain data, filled in by the caller (the CLI converts the engine's sysfs topology into it;
//! tests build machines in code). Nothing here reads the system. A cache appears once per CPU
//! that uses it, with the full list of CPUs sharing it (`shared_cpus`, as sysfs'
//! `shared_cpu_list`), so "is this cache shared with CPU n" is a lookup in that list.

use serde::{Deserialize, Serialize};

/// What a cache holds (sysfs `type`). Ordered Data < Instruction < Unified, which with the
/// level gives the usual listing order L1d, L1i, L2, L3.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum CacheKind {
    Data,
    Instruction,
    Unified,
}

/// One cache as seen from one CPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cache {
    /// 1 for L1, 2 for L2, ...
    pub level: u32,
    pub kind: CacheKind,
    /// Capacity in bytes.
    pub bytes: u64,
    /// Line size in bytes.
    pub line: u32,
    /// Every CPU using this cache, the owner included (sysfs `shared_cpu_list`).
    pub shared_cpus: Vec<u32>,
}

impl Cache {
    /// The usual short name: `L1d`, `L1i`, a unified L1 is `L1`; unified higher levels are
    /// `L2`, `L3`, ...; a split higher level (rare) gets the same `d`/`i` suffix as L1.
    pub fn name(&self) -> String {
        match self.kind {
            CacheKind::Data => format!("L{}d", self.level),
            CacheKind::Instruction => format!("L{}i", self.level),
            CacheKind::Unified => format!("L{}", self.level),
        }
    }

    /// Whether `cpu` uses this cache.
    pub fn is_shared_with(&self, cpu: u32) -> bool {
        self.shared_cpus.contains(&cpu)
    }

    /// Whether the cache holds data (data or unified): the kinds a data vector can fill.
    pub fn holds_data(&self) -> bool {
        matches!(self.kind, CacheKind::Data | CacheKind::Unified)
    }
}

/// One logical CPU and its caches.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cpu {
    /// The CPU number the OS uses (affinity masks, sysfs `cpuN`).
    pub cpu: u32,
    /// Physical package (socket / chip) id.
    pub package: u32,
    /// Its caches, in any order.
    pub caches: Vec<Cache>,
}

/// A machine: its online CPUs.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Machine {
    pub cpus: Vec<Cpu>,
}

impl Machine {
    /// CPU `n`, if the machine has it.
    pub fn cpu(&self, n: u32) -> Option<&Cpu> {
        self.cpus.iter().find(|c| c.cpu == n)
    }

    /// The CPU numbers, ascending and without repeats.
    pub fn cpu_ids(&self) -> Vec<u32> {
        let mut ids: Vec<u32> = self.cpus.iter().map(|c| c.cpu).collect();
        ids.sort_unstable();
        ids.dedup();
        ids
    }

    /// The caches of `cpu` in level order (L1d, L1i, L2, L3); empty if the CPU is unknown.
    pub fn caches(&self, cpu: u32) -> Vec<&Cache> {
        let mut caches: Vec<&Cache> = self
            .cpu(cpu)
            .map(|c| c.caches.iter().collect())
            .unwrap_or_default();
        caches.sort_by_key(|c| (c.level, c.kind));
        caches
    }

    /// The L1 data cache of `cpu`; a unified L1 serves as one.
    pub fn l1d(&self, cpu: u32) -> Option<&Cache> {
        self.l1(cpu, CacheKind::Data)
    }

    /// The L1 instruction cache of `cpu`; a unified L1 serves as one.
    pub fn l1i(&self, cpu: u32) -> Option<&Cache> {
        self.l1(cpu, CacheKind::Instruction)
    }

    fn l1(&self, cpu: u32, kind: CacheKind) -> Option<&Cache> {
        let caches = self.caches(cpu);
        let at_l1 = |k: CacheKind| caches.iter().copied().find(|c| c.level == 1 && c.kind == k);
        at_l1(kind).or_else(|| at_l1(CacheKind::Unified))
    }

    /// The data or unified caches of `cpu` at levels ≥ 2, one per level, in level order.
    /// Instruction-only caches are skipped; a level with both a data and a unified entry (not
    /// seen in practice) keeps the data one.
    pub fn upper_levels(&self, cpu: u32) -> Vec<&Cache> {
        let mut out: Vec<&Cache> = Vec::new();
        for c in self.caches(cpu) {
            if c.level >= 2 && c.holds_data() && out.last().is_none_or(|l| l.level != c.level) {
                out.push(c);
            }
        }
        out
    }

    /// The last-level cache of `cpu`: the highest data or unified level ≥ 2 (`None` when the
    /// topology lists nothing beyond L1).
    pub fn llc(&self, cpu: u32) -> Option<&Cache> {
        self.upper_levels(cpu).last().copied()
    }

    /// The other CPUs of this machine that share `cache` with `cpu`, ascending. CPUs named in
    /// `shared_cpus` but absent from the machine (offline) are left out: nothing can run there.
    pub fn sharers(&self, cpu: u32, cache: &Cache) -> Vec<u32> {
        let mut out: Vec<u32> = cache
            .shared_cpus
            .iter()
            .copied()
            .filter(|&c| c != cpu && self.cpu(c).is_some())
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }
}
