//! The Section 2 matrix (paper Table 2): L1 affinity × L2 retention × scheduling quantum.
//!
//! # The paper's cells
//!
//! The benchmark and a base vector are bound to the same CPU, so their quanta interleave and the
//! vector may displace the benchmark's L1 state at every quantum. Columns: interleaved `BV_L1D`
//! (low D-cache affinity), `BV_L1I` (low I-cache affinity), `BV_0` (high affinity). Rows: high L2
//! retention (nothing else runs) and low L2 retention (`BV_L2` runs concurrently on *another*
//! core that shares L2 with the benchmark's, displacing its L2 state while it is descheduled).
//! Each cell runs at 2, 10 and 200 ms quanta: 6 × 3 per benchmark and machine.
//!
//! # Generalisation to other machines
//!
//! The *retention level* is the lowest data or unified level ≥ 2 that the main CPU shares with
//! another CPU of the machine; the concurrent vector is that level's vector
//! ([`crate::vectors`]), on the lowest-numbered sharer.
//!
//! * Retention level L2 (Clovertown, Niagara): exactly the paper's cells (`paper_exact`).
//! * L2 private, a higher level shared (our 2-vCPU VMs: private 2 MiB L2, shared 32 MiB L3):
//!   nothing running elsewhere can displace a private L2, so the low row runs the shared
//!   level's vector concurrently (a `substitute` on each such cell says so), and extra cells
//!   interleave the L2 vector on the main CPU itself (affinity `low-d-l2`, both rows): that
//!   displaces L1d and L2 every quantum, so the benchmark reloads from beyond L2 — the paper's
//!   intent for low L2 retention.
//! * Nothing shared (one CPU, or every level private): the low row cannot be made and is
//!   omitted (a note says so); the `low-d-l2` cells remain when L2 is private.

use serde::{Deserialize, Serialize};

use crate::error::PlanError;
use crate::machine::{Cache, Machine};
use crate::vectors::{base_vectors, vector_for_level, BaseVectors};

/// The paper's scheduling quanta (§2.1): 2, 10 and 200 ms.
pub const DEFAULT_QUANTA_MS: [u32; 3] = [2, 10, 200];

/// The L1 affinity a cell creates, named after its interleaved vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Affinity {
    /// `BV_0` interleaved: L1 state kept.
    #[serde(rename = "high")]
    High,
    /// `BV_L1D` interleaved: L1 D-cache state displaced.
    #[serde(rename = "low-d")]
    LowD,
    /// `BV_L1I` interleaved: L1 I-cache state displaced.
    #[serde(rename = "low-i")]
    LowI,
    /// The L2 vector interleaved (substitute cells where L2 is private): L1d and L2 displaced.
    #[serde(rename = "low-d-l2")]
    LowDL2,
}

impl Affinity {
    /// The JSON spelling (`high`, `low-d`, `low-i`, `low-d-l2`).
    pub fn as_str(self) -> &'static str {
        match self {
            Affinity::High => "high",
            Affinity::LowD => "low-d",
            Affinity::LowI => "low-i",
            Affinity::LowDL2 => "low-d-l2",
        }
    }
}

/// L2 retention: `high` when nothing runs concurrently, `low` when a vector does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Retention {
    High,
    Low,
}

impl Retention {
    /// The JSON spelling (`high`, `low`).
    pub fn as_str(self) -> &'static str {
        match self {
            Retention::High => "high",
            Retention::Low => "low",
        }
    }
}

/// One experiment of Table 2 at one quantum.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cell {
    /// `<interleaved>.<retention>.q<quantum_ms>`, e.g. `BV_L1D.low.q2`.
    pub id: String,
    /// The vector bound to the main CPU with the workload.
    pub interleaved: String,
    /// The vector running concurrently on `concurrent_cpu` (low retention), else `None`.
    pub concurrent: Option<String>,
    pub concurrent_cpu: Option<u32>,
    pub affinity: Affinity,
    pub retention: Retention,
    pub quantum_ms: u32,
    /// Which Table 2 cell this stands for, in words.
    pub paper_cell: String,
    /// How this cell departs from the paper's, or `None` when it is the paper's.
    pub substitute: Option<String>,
}

/// The Table 2 matrix for one main CPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Table2Plan {
    /// The cache whose retention the low row destroys (`L2` on the paper's machines).
    pub retention_level: Option<String>,
    /// Where the concurrent vector runs (lowest-numbered CPU sharing `retention_level`).
    pub concurrent_cpu: Option<u32>,
    /// True when `retention_level` is L2: the cells are the paper's.
    pub paper_exact: bool,
    /// Row (high, low) × column (low-d, low-i, high, low-d-l2) × quantum, in that order.
    pub cells: Vec<Cell>,
    pub notes: Vec<String>,
}

/// Checks a list of quanta: non-empty, no zero, no repeats.
pub fn validate_quanta(quanta_ms: &[u32]) -> Result<(), PlanError> {
    if quanta_ms.is_empty() {
        return Err(PlanError::EmptyQuanta);
    }
    for (i, &q) in quanta_ms.iter().enumerate() {
        if q == 0 {
            return Err(PlanError::ZeroQuantum);
        }
        if quanta_ms[..i].contains(&q) {
            return Err(PlanError::DuplicateQuantum(q));
        }
    }
    Ok(())
}

/// A column of the matrix: the interleaved vector and what it does to the main CPU's caches.
struct Column {
    vector: String,
    affinity: Affinity,
}

/// The low row's concurrent vector: which level, which vector, on which CPU.
struct Concurrent<'a> {
    level: &'a Cache,
    vector: String,
    cpu: u32,
}

/// Builds Table 2 for `main_cpu` at the given quanta (see the module documentation).
pub fn plan_table2(
    machine: &Machine,
    main_cpu: u32,
    quanta_ms: &[u32],
) -> Result<Table2Plan, PlanError> {
    validate_quanta(quanta_ms)?;
    let bv = base_vectors(machine, main_cpu)?;
    let mut notes = bv.notes.clone();
    let levels = machine.upper_levels(main_cpu);
    let l2 = levels.iter().copied().find(|c| c.level == 2);
    let l2_vector = l2.and_then(|c| vector_for_level(machine, main_cpu, c));
    let l2_private = l2.is_some_and(|c| machine.sharers(main_cpu, c).is_empty());

    let concurrent = levels.iter().copied().find_map(|c| {
        let cpu = *machine.sharers(main_cpu, c).first()?;
        Some(Concurrent {
            level: c,
            vector: vector_for_level(machine, main_cpu, c)?,
            cpu,
        })
    });
    let paper_exact = concurrent.as_ref().is_some_and(|c| c.level.level == 2);

    let columns = columns(&bv, l2_private, &l2_vector);
    let substitutes = Substitutes::new(main_cpu, l2, &l2_vector, &concurrent, paper_exact);
    let beyond_l2 = levels.iter().find(|c| c.level > 2).map(|c| c.name());

    let mut rows = vec![Retention::High];
    if concurrent.is_some() {
        rows.push(Retention::Low);
    }
    let cells = cells(
        &rows,
        &columns,
        &concurrent,
        &substitutes,
        beyond_l2.as_deref(),
        quanta_ms,
    );

    notes.push(retention_note(
        machine,
        main_cpu,
        l2,
        l2_private,
        &l2_vector,
        &concurrent,
    ));
    notes.push(count_note(cells.len(), &columns, &rows, quanta_ms));

    Ok(Table2Plan {
        retention_level: concurrent.as_ref().map(concurrent_level_name),
        concurrent_cpu: concurrent.as_ref().map(|c| c.cpu),
        paper_exact,
        cells,
        notes,
    })
}

/// The matrix's columns: the paper's three interleaved vectors that the machine has, then the
/// L2 vector (`low-d-l2`) when L2 is private.
fn columns(bv: &BaseVectors, l2_private: bool, l2_vector: &Option<String>) -> Vec<Column> {
    let mut columns: Vec<Column> = [
        ("BV_L1D", Affinity::LowD),
        ("BV_L1I", Affinity::LowI),
        ("BV_0", Affinity::High),
    ]
    .into_iter()
    .filter(|(name, _)| bv.get(name).is_some())
    .map(|(name, affinity)| Column {
        vector: name.to_string(),
        affinity,
    })
    .collect();
    if l2_private {
        if let Some(v) = l2_vector {
            columns.push(Column {
                vector: v.clone(),
                affinity: Affinity::LowDL2,
            });
        }
    }
    columns
}

/// The `substitute` texts shared by many cells.
struct Substitutes {
    /// Low retention made at a level other than L2 (`None` when it is the paper's, or absent).
    retention: Option<String>,
    /// The `low-d-l2` cells' stand-in for low L2 retention (`None` without an L2 vector).
    l2: Option<String>,
}

impl Substitutes {
    /// The texts for this machine's retention level and L2 vector.
    fn new(
        main_cpu: u32,
        l2: Option<&Cache>,
        l2_vector: &Option<String>,
        concurrent: &Option<Concurrent<'_>>,
        paper_exact: bool,
    ) -> Self {
        let retention = concurrent.as_ref().filter(|_| !paper_exact).map(|c| {
            let why = match l2 {
                Some(_) => format!("no CPU shares L2 with CPU {main_cpu} (private)"),
                None => format!("CPU {main_cpu} lists no L2"),
            };
            format!(
                "{why}; low retention is made at {}, shared with CPU {}: {} runs concurrently there",
                concurrent_level_name(c),
                c.cpu,
                c.vector
            )
        });
        let l2 = l2_vector.as_ref().map(|v| {
            format!(
                "L2 is private here: {v} interleaved on the same CPU displaces it, so the workload \
                 reloads from beyond L2 (the paper's intent for low L2 retention)"
            )
        });
        Substitutes { retention, l2 }
    }

    /// The `substitute` of the cells in column `affinity` and row `retention`.
    fn for_cell(&self, affinity: Affinity, retention: Retention) -> Option<String> {
        match (affinity, retention) {
            (Affinity::LowDL2, Retention::High) => self.l2.clone(),
            (Affinity::LowDL2, Retention::Low) => match (&self.l2, &self.retention) {
                (Some(a), Some(b)) => Some(format!("{a}; {b}")),
                (a, b) => a.clone().or_else(|| b.clone()),
            },
            (_, Retention::Low) => self.retention.clone(),
            (_, Retention::High) => None,
        }
    }
}

/// The cells: row × column × quantum, in that order.
fn cells(
    rows: &[Retention],
    columns: &[Column],
    concurrent: &Option<Concurrent<'_>>,
    substitutes: &Substitutes,
    beyond_l2: Option<&str>,
    quanta_ms: &[u32],
) -> Vec<Cell> {
    let mut cells = Vec::new();
    for &retention in rows {
        for col in columns {
            let (conc, conc_cpu) = match (retention, concurrent) {
                (Retention::Low, Some(c)) => (Some(c.vector.clone()), Some(c.cpu)),
                _ => (None, None),
            };
            let paper_cell = paper_cell(retention, col, concurrent, beyond_l2);
            let substitute = substitutes.for_cell(col.affinity, retention);
            for &q in quanta_ms {
                cells.push(Cell {
                    id: format!("{}.{}.q{q}", col.vector, retention.as_str()),
                    interleaved: col.vector.clone(),
                    concurrent: conc.clone(),
                    concurrent_cpu: conc_cpu,
                    affinity: col.affinity,
                    retention,
                    quantum_ms: q,
                    paper_cell: paper_cell.clone(),
                    substitute: substitute.clone(),
                });
            }
        }
    }
    cells
}

/// The note counting the cells: columns × rows × quanta.
fn count_note(n_cells: usize, columns: &[Column], rows: &[Retention], quanta_ms: &[u32]) -> String {
    format!(
        "{} cells: {} interleaved vector{} ({}) × {} retention row{} × {} quant{} ({} ms)",
        n_cells,
        columns.len(),
        if columns.len() == 1 { "" } else { "s" },
        columns
            .iter()
            .map(|c| c.vector.as_str())
            .collect::<Vec<_>>()
            .join(", "),
        rows.len(),
        if rows.len() == 1 { "" } else { "s" },
        quanta_ms.len(),
        if quanta_ms.len() == 1 { "um" } else { "a" },
        quanta_ms
            .iter()
            .map(|q| q.to_string())
            .collect::<Vec<_>>()
            .join(", "),
    )
}

fn concurrent_level_name(c: &Concurrent<'_>) -> String {
    c.level.name()
}

/// The Table 2 cell a cell stands for, in the paper's words (plus how a substitute makes it).
fn paper_cell(
    retention: Retention,
    col: &Column,
    concurrent: &Option<Concurrent<'_>>,
    beyond_l2: Option<&str>,
) -> String {
    let row = match retention {
        Retention::High => "high L2 retention",
        Retention::Low => "low L2 retention",
    };
    match col.affinity {
        Affinity::LowD => format!("{row}, low L1 D-cache affinity"),
        Affinity::LowI => format!("{row}, low L1 I-cache affinity"),
        Affinity::High => format!("{row}, high L1 cache affinity"),
        Affinity::LowDL2 => {
            let how = match (retention, concurrent) {
                (Retention::Low, Some(c)) => format!(
                    "made by interleaving {}, with {} displaced too by {} on CPU {}",
                    col.vector,
                    c.level.name(),
                    c.vector,
                    c.cpu
                ),
                _ => match beyond_l2 {
                    Some(next) => format!(
                        "made by interleaving {}; {next} keeps its state",
                        col.vector
                    ),
                    None => format!(
                        "made by interleaving {}; reloads come from memory",
                        col.vector
                    ),
                },
            };
            format!("low L2 retention, low L1 D-cache affinity ({how})")
        }
    }
}

/// One note saying how retention is made on this machine.
fn retention_note(
    machine: &Machine,
    main_cpu: u32,
    l2: Option<&Cache>,
    l2_private: bool,
    l2_vector: &Option<String>,
    concurrent: &Option<Concurrent<'_>>,
) -> String {
    let stand_in = match (l2_private, l2_vector) {
        (true, Some(v)) => format!(
            "; the low-d-l2 cells ({v} interleaved on CPU {main_cpu}) make L2 retention low the \
             only way a private L2 allows"
        ),
        _ => String::new(),
    };
    match concurrent {
        Some(c) if c.level.level == 2 => format!(
            "L2 of CPU {main_cpu} is shared with CPUs {:?}: low L2 retention is made as in the \
             paper, {}{} running concurrently on CPU {} (the lowest-numbered sharer); these are \
             the paper's cells",
            machine.sharers(main_cpu, c.level),
            c.vector,
            if c.vector == "BV_L2" {
                ""
            } else {
                " (L2 is the last level here, so its vector is named BV_LLC: the paper's BV_L2)"
            },
            c.cpu
        ),
        Some(c) => format!(
            "{}: the low-retention row runs {} concurrently on CPU {}, which shares {} — it \
             lowers {} retention, not L2's{stand_in}",
            match l2 {
                Some(_) => format!(
                    "L2 of CPU {main_cpu} is private, so nothing running elsewhere can displace it"
                ),
                None => format!("CPU {main_cpu} lists no L2"),
            },
            c.vector,
            c.cpu,
            c.level.name(),
            c.level.name()
        ),
        None if machine.cpu_ids().len() < 2 => format!(
            "the machine has one CPU: nothing can run concurrently, so the low-retention row is \
             omitted{stand_in}"
        ),
        None => format!(
            "no cache level ≥ 2 of CPU {main_cpu} is shared with another CPU: nothing running \
             concurrently can displace its state, so the low-retention row is omitted{stand_in}"
        ),
    }
}
