//! The base vectors (paper §2.1, after Doucette and Fedorova), sized from the machine.
//!
//! A base vector is a small program with a chosen cache footprint. The paper uses:
//!
//! * `BV_0` — a negligible footprint: interleaved with the benchmark it leaves the benchmark's
//!   L1 state intact (high L1 affinity). Ours touches one 4096-byte page.
//! * `BV_L1D` — a data footprint the size of the L1 D-cache (and a negligible code footprint):
//!   interleaved, it displaces the benchmark's L1d state (low D-cache affinity).
//! * `BV_L1I` — a code footprint the size of the L1 I-cache (negligible data).
//! * `BV_L2` — a data footprint the size of L2: run *concurrently* on a core sharing L2, it
//!   displaces the benchmark's L2 state (low L2 retention).
//!
//! Our machines have more levels, so after `BV_L1D` and `BV_L1I` there is one data vector per
//! further data or unified level: `BV_L2`, `BV_L3`, ..., where the **last** level is always named
//! `BV_LLC` — also when it is L2 (a Niagara-like machine has `BV_LLC` targeting L2 and no
//! separate `BV_L2`). The vector is the cache's full size; the CLI decides how to touch it.

use serde::{Deserialize, Serialize};

use crate::error::PlanError;
use crate::machine::{Cache, Machine};

/// Bytes of `BV_0`: one page, the paper's "negligible" footprint.
pub const BV_0_BYTES: u64 = 4096;

/// What a base vector fills.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum VectorKind {
    /// Negligible footprint (`BV_0`).
    Zero,
    /// Reads and writes a data buffer of `bytes`.
    Data,
    /// Executes `bytes` of code.
    Code,
}

/// One base vector of the plan (JSON: `{"name", "kind", "bytes", "target"}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VectorSpec {
    /// `BV_0`, `BV_L1D`, `BV_L1I`, `BV_L2`, ..., `BV_LLC`.
    pub name: String,
    pub kind: VectorKind,
    /// Footprint in bytes.
    pub bytes: u64,
    /// The cache it is sized to fill (its [`Cache::name`]); `None` for `BV_0`.
    pub target: Option<String>,
}

/// The base vectors of a main CPU and what could not be sized.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BaseVectors {
    /// In order `BV_0`, `BV_L1D`, `BV_L1I`, `BV_L2`, ..., `BV_LLC` (absent ones left out).
    pub vectors: Vec<VectorSpec>,
    /// One line per vector that is absent and why.
    pub notes: Vec<String>,
}

impl BaseVectors {
    /// The vector named `name`, if present.
    pub fn get(&self, name: &str) -> Option<&VectorSpec> {
        self.vectors.iter().find(|v| v.name == name)
    }
}

/// The name of the data vector for the `index`-th of `count` levels ≥ 2 that hold data (0 = the
/// lowest): `BV_LLC` for the last, `BV_L<level>` otherwise.
pub fn level_vector_name(cache: &Cache, index: usize, count: usize) -> String {
    if index + 1 == count {
        "BV_LLC".to_string()
    } else {
        format!("BV_L{}", cache.level)
    }
}

/// The name of the data vector that fills `cache` (a level ≥ 2 of `cpu`), if it is one.
pub fn vector_for_level(machine: &Machine, cpu: u32, cache: &Cache) -> Option<String> {
    let levels = machine.upper_levels(cpu);
    let index = levels.iter().position(|c| *c == cache)?;
    Some(level_vector_name(cache, index, levels.len()))
}

/// The base vectors for main CPU `cpu`, sized from its caches.
pub fn base_vectors(machine: &Machine, cpu: u32) -> Result<BaseVectors, PlanError> {
    if machine.cpu(cpu).is_none() {
        return Err(PlanError::CpuNotFound {
            cpu,
            known: machine.cpu_ids(),
        });
    }
    let mut vectors = vec![VectorSpec {
        name: "BV_0".into(),
        kind: VectorKind::Zero,
        bytes: BV_0_BYTES,
        target: None,
    }];
    let mut notes = Vec::new();
    let l1 = [
        (
            "BV_L1D",
            VectorKind::Data,
            machine.l1d(cpu),
            "data",
            "low-d",
        ),
        (
            "BV_L1I",
            VectorKind::Code,
            machine.l1i(cpu),
            "instruction",
            "low-i",
        ),
    ];
    for (name, kind, cache, what, column) in l1 {
        match cache {
            Some(c) => vectors.push(VectorSpec {
                name: name.into(),
                kind,
                bytes: c.bytes,
                target: Some(c.name()),
            }),
            None => notes.push(format!(
                "CPU {cpu} lists no L1 {what} cache (nor a unified L1): {name} is absent, so the \
                 {column} cells are omitted"
            )),
        }
    }
    let levels = machine.upper_levels(cpu);
    for (i, c) in levels.iter().enumerate() {
        vectors.push(VectorSpec {
            name: level_vector_name(c, i, levels.len()),
            kind: VectorKind::Data,
            bytes: c.bytes,
            target: Some(c.name()),
        });
    }
    if levels.is_empty() {
        notes.push(format!(
            "CPU {cpu} lists no data or unified cache beyond L1: there is no BV_L2 or BV_LLC, so \
             no low-retention cells"
        ));
    }
    Ok(BaseVectors { vectors, notes })
}
