//! The Section 3 experiment (paper Table 3): L2 affinity of multiprogrammed workloads.
//!
//! # The paper's experiment
//!
//! Several copies of one *main* benchmark run together with *interfering* benchmarks at a 2 ms
//! quantum. High affinity: each main copy is bound to its own core for the whole run. Low
//! affinity: nothing is bound and an affinity-oblivious scheduler moves the copies between
//! cores. Interfering benchmarks are never bound. Table 3 rotates the roles: each benchmark is
//! main once, with the next benchmark in the list interfering ([`pairs`]). The paper's row
//! shapes are "2× main + 1 interfering" (printed under MMP) and "4× main + 2× interfering"
//! (printed under UMP).
//!
//! # Our shape
//!
//! We take one main copy per listed CPU (`main_copies = n`, at least 2) and `max(1, n / 2)`
//! interfering copies — the paper's ratio: with 2 CPUs the 2 + 1 row, with 4 the 4 + 2 row.
//! What a move costs is read off the topology: a low-affinity move is modelled as a rotation of
//! the copies, CPU `cpus[i]` → `cpus[i + 1]` (cyclic), and for the main CPU we list which of its
//! caches the next CPU does not share (`lost_on_move`) and which it does (`kept_on_move`).

use serde::{Deserialize, Serialize};

use crate::error::PlanError;
use crate::machine::{Cache, Machine};

/// The Table 3 experiment for a list of CPUs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Table3Plan {
    /// False when the experiment cannot be run here (fewer than 2 CPUs); `notes` says why.
    pub feasible: bool,
    /// The CPUs the copies run on, in rotation order.
    pub cpus: Vec<u32>,
    /// Copies of the main workload: one per CPU (0 when infeasible).
    pub main_copies: u32,
    /// Copies of the interfering workload: `max(1, main_copies / 2)` (0 when infeasible).
    pub interfering: u32,
    /// Names of the main CPU's caches the CPU it moves to does not share (level order).
    pub lost_on_move: Vec<String>,
    /// Names of the main CPU's caches the CPU it moves to shares (level order).
    pub kept_on_move: Vec<String>,
    pub notes: Vec<String>,
}

/// The paper's Table 3 rotation: every workload is main once, interfering is the next one in
/// the list (the last takes the first). One workload interferes with itself; none gives none.
pub fn pairs<'a>(workloads: &[&'a str]) -> Vec<(&'a str, &'a str)> {
    let n = workloads.len();
    (0..n)
        .map(|i| (workloads[i], workloads[(i + 1) % n]))
        .collect()
}

/// Builds Table 3 for `main_cpu` on `cpus` (rotation order; `main_cpu` must be listed).
pub fn plan_table3(
    machine: &Machine,
    main_cpu: u32,
    cpus: &[u32],
) -> Result<Table3Plan, PlanError> {
    for (i, &c) in cpus.iter().enumerate() {
        if machine.cpu(c).is_none() {
            return Err(PlanError::CpuNotFound {
                cpu: c,
                known: machine.cpu_ids(),
            });
        }
        if cpus[..i].contains(&c) {
            return Err(PlanError::DuplicateCpu(c));
        }
    }
    if machine.cpu(main_cpu).is_none() {
        return Err(PlanError::CpuNotFound {
            cpu: main_cpu,
            known: machine.cpu_ids(),
        });
    }
    let Some(pos) = cpus.iter().position(|&c| c == main_cpu) else {
        return Err(PlanError::MainNotInList {
            main: main_cpu,
            cpus: cpus.to_vec(),
        });
    };
    let n = cpus.len();
    if n < 2 {
        return Ok(Table3Plan {
            feasible: false,
            cpus: cpus.to_vec(),
            main_copies: 0,
            interfering: 0,
            lost_on_move: Vec::new(),
            kept_on_move: Vec::new(),
            notes: vec![format!(
                "Table 3 needs at least 2 CPUs (one main copy per CPU, and a CPU to move to); \
                 {n} listed, so it is not run"
            )],
        });
    }
    let main_copies = n as u32;
    let interfering = (main_copies / 2).max(1);
    let target = cpus[(pos + 1) % n];
    let caches = machine.caches(main_cpu);
    let (kept, lost): (Vec<&Cache>, Vec<&Cache>) =
        caches.iter().partition(|c| c.is_shared_with(target));
    let names = |v: &[&Cache]| v.iter().map(|c| c.name()).collect::<Vec<_>>();
    let (lost_on_move, kept_on_move) = (names(&lost), names(&kept));

    let shape = match (main_copies, interfering) {
        (2, 1) => " — the paper's row printed under MMP (2× main + 1 interfering)",
        (4, 2) => " — the paper's row printed under UMP (4× main + 2× interfering)",
        _ => " — the paper's ratio of 2 main copies per interfering one (its rows: 2 + 1, 4 + 2)",
    };
    let list = |v: &[String]| {
        if v.is_empty() {
            "nothing".to_string()
        } else {
            v.join(", ")
        }
    };
    let notes = vec![
        format!(
            "row shape: {main_copies}× main (one per listed CPU) + {interfering}× interfering \
             (max(1, copies / 2)){shape}; interfering copies are never bound"
        ),
        format!(
            "a low-affinity move is taken as a rotation CPU i → the next listed CPU: CPU \
             {main_cpu} → CPU {target} loses {} and keeps {}",
            list(&lost_on_move),
            list(&kept_on_move)
        ),
        machine_class(machine, main_cpu, cpus),
    ];
    Ok(Table3Plan {
        feasible: true,
        cpus: cpus.to_vec(),
        main_copies,
        interfering,
        lost_on_move,
        kept_on_move,
        notes,
    })
}

/// Which of the paper's machine classes the listed CPUs resemble, by how the main CPU's L2 (and
/// anything beyond it) is shared among them.
fn machine_class(machine: &Machine, main_cpu: u32, cpus: &[u32]) -> String {
    let others: Vec<u32> = cpus.iter().copied().filter(|&c| c != main_cpu).collect();
    let shared_with = |c: &Cache| -> Vec<u32> {
        others
            .iter()
            .copied()
            .filter(|&o| c.is_shared_with(o))
            .collect()
    };
    let levels = machine.upper_levels(main_cpu);
    let Some(l2) = levels.iter().copied().find(|c| c.level == 2) else {
        return match levels.iter().find(|c| !shared_with(c).is_empty()) {
            Some(c) => format!(
                "CPU {main_cpu} lists no L2; {} is shared with CPUs {:?}: not one of the paper's \
                 classes (UMP = each L2 private to one core, MMP = L2 shared by a pair)",
                c.name(),
                shared_with(c)
            ),
            None => format!(
                "CPU {main_cpu} lists no L2 and shares no cache with the listed CPUs: a move can \
                 lose only its private state (the paper's Section 3 is about L2 affinity)"
            ),
        };
    };
    let l2_sharers = shared_with(l2);
    if !others.is_empty() && l2_sharers.len() == others.len() {
        return "multicore uniprocessor, like the paper's Niagara (one L2 for every listed CPU): \
                a move loses only L1 state, so L2 affinity does not vary; the paper did not run \
                Section 3 on this class"
            .to_string();
    }
    if !l2_sharers.is_empty() {
        return format!(
            "multicore multiprocessor (MMP, like the paper's Clovertown on both chips): CPU \
             {main_cpu} shares L2 with CPUs {l2_sharers:?} only, so a move inside that group \
             keeps L2 and a move out of it loses L2"
        );
    }
    match levels
        .iter()
        .find(|c| c.level > 2 && !shared_with(c).is_empty())
    {
        Some(h) => format!(
            "L2 private to each core, as in the paper's UMP (conventional multiprocessor), but {} \
             is shared with CPUs {:?}, a level the paper's machines lack: a move loses L1 and L2 \
             and reloads from {} rather than from memory",
            h.name(),
            shared_with(h),
            h.name()
        ),
        None => "conventional multiprocessor (UMP, like the paper's Clovertown with one core per \
                 chip): each L2 private to one core and nothing shared beyond it, so a move \
                 loses all cached state"
            .to_string(),
    }
}
