//! Cache affinity on multicore: a machine's cache topology turned into an experiment matrix.
//!
//! Implements the experimental design of Kazempour, Fedorova and Alagheband, *Performance
//! Implications of Cache Affinity on Multicore Processors* (`../shared/papers/cache-affinity.txt`):
//!
//! * [`vectors`]: the base vectors of §2.1 (`BV_0`, `BV_L1D`, `BV_L1I`, `BV_L2`), sized from the
//!   main CPU's caches.
//! * [`table2`]: the §2 matrix (Table 2): low/high L1 D- and I-cache affinity made by a vector
//!   interleaved on the benchmark's CPU, × high/low L2 retention made by a vector running
//!   concurrently on a CPU that shares L2, × the 2, 10 and 200 ms quanta.
//! * [`table3`]: the §3 experiment (Table 3): copies of a main workload with interfering ones,
//!   bound (high affinity) or free (low affinity); what a move between two CPUs loses.
//! * [`mod@schedule`]: the run order (repetitions interleaved, shuffled within a round).
//! * [`machine`]: the plain topology types the rest reads.
//!
//! # Where we deliberately differ from the paper
//!
//! * **Any topology, not two machines.** The paper's machines have two levels and a shared L2
//!   (Niagara: one for all cores; Clovertown: one per pair). Ours may have private L2s and a
//!   shared L3. Low retention is therefore made at the *lowest shared level* (`retention_level`),
//!   which is L2 on the paper's machines (`paper_exact`); where L2 is private we add
//!   `low-d-l2` cells that interleave the L2 vector, and every such departure carries a
//!   `substitute` text. Where nothing is shared the low-retention row is omitted, not faked.
//! * **Vectors for every level.** After the L1 vectors there is one data vector per further
//!   level, the last always named `BV_LLC` (even when it is L2).
//! * **Table 3 scales with the machine:** one main copy per CPU and half as many interfering
//!   (the paper's 2 + 1 and 4 + 2 rows), and the cost of a move is read off the topology.
//! * **Repetitions** are interleaved and shuffled ([`schedule()`]) instead of run back to back.
//! * The metric (the paper's IPC and misses per instruction need a PMU our VMs lack) and the
//!   vectors' code are the CLI's business; this crate only plans.
//!
//! Invariants: `#![forbid(unsafe_code)]`; no I/O, no clocks, no global state; every result is a
//! function of its arguments (the schedule of its seed).
#![forbid(unsafe_code)]

pub mod error;
pub mod machine;
pub mod schedule;
pub mod table2;
pub mod table3;
pub mod vectors;

use serde::{Deserialize, Serialize};

pub use error::PlanError;
pub use machine::{Cache, CacheKind, Cpu, Machine};
pub use schedule::schedule;
pub use table2::{plan_table2, Affinity, Cell, Retention, Table2Plan, DEFAULT_QUANTA_MS};
pub use table3::{pairs, plan_table3, Table3Plan};
pub use vectors::{base_vectors, BaseVectors, VectorKind, VectorSpec};

/// A cache of the main CPU as the JSON contract shows it (its [`Cache`] plus its name).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheView {
    /// `L1d`, `L1i`, `L2`, ... ([`Cache::name`]).
    pub name: String,
    pub level: u32,
    pub kind: CacheKind,
    pub bytes: u64,
    pub line: u32,
    pub shared_cpus: Vec<u32>,
}

impl From<&Cache> for CacheView {
    fn from(c: &Cache) -> Self {
        CacheView {
            name: c.name(),
            level: c.level,
            kind: c.kind,
            bytes: c.bytes,
            line: c.line,
            shared_cpus: c.shared_cpus.clone(),
        }
    }
}

/// The whole plan for one main CPU. `serde_json::to_value(&plan)` gives the contract's keys
/// `cpus, main_cpu, caches, vectors, table2, table3` (docs/affinity-json.md); the CLI adds
/// `source`, `eviction`, `pmu` and `metric`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    /// Every CPU of the machine, ascending.
    pub cpus: Vec<u32>,
    pub main_cpu: u32,
    /// The main CPU's caches in level order.
    pub caches: Vec<CacheView>,
    pub vectors: Vec<VectorSpec>,
    pub table2: Table2Plan,
    pub table3: Table3Plan,
}

/// The plan for `main_cpu` at the given quanta (e.g. [`DEFAULT_QUANTA_MS`]), Table 3 on every
/// CPU of the machine.
pub fn plan(machine: &Machine, main_cpu: u32, quanta_ms: &[u32]) -> Result<Plan, PlanError> {
    plan_with_cpus(machine, main_cpu, quanta_ms, &machine.cpu_ids())
}

/// As [`plan`], with Table 3 on `table3_cpus` (rotation order; must include `main_cpu`).
pub fn plan_with_cpus(
    machine: &Machine,
    main_cpu: u32,
    quanta_ms: &[u32],
    table3_cpus: &[u32],
) -> Result<Plan, PlanError> {
    let mut seen = Vec::with_capacity(machine.cpus.len());
    for c in &machine.cpus {
        if seen.contains(&c.cpu) {
            return Err(PlanError::DuplicateCpu(c.cpu));
        }
        seen.push(c.cpu);
    }
    let vectors = base_vectors(machine, main_cpu)?.vectors;
    let table2 = plan_table2(machine, main_cpu, quanta_ms)?;
    let table3 = plan_table3(machine, main_cpu, table3_cpus)?;
    Ok(Plan {
        cpus: machine.cpu_ids(),
        main_cpu,
        caches: machine
            .caches(main_cpu)
            .into_iter()
            .map(CacheView::from)
            .collect(),
        vectors,
        table2,
        table3,
    })
}
