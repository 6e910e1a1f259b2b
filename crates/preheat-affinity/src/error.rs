//! Why a plan cannot be made. Every message names the offending value and what would be valid.

/// A request the plan cannot honour.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error("CPU {cpu} is not in the machine (its CPUs: {known:?})")]
    CpuNotFound { cpu: u32, known: Vec<u32> },
    #[error("CPU {0} is listed twice (in the machine or in the CPU list)")]
    DuplicateCpu(u32),
    #[error(
        "main CPU {main} is not in the Table 3 CPU list {cpus:?} (the main copy must run on one \
         of the listed CPUs)"
    )]
    MainNotInList { main: u32, cpus: Vec<u32> },
    #[error(
        "no scheduling quanta given: Table 2 needs at least one (the paper uses 2, 10 and 200 ms)"
    )]
    EmptyQuanta,
    #[error("a scheduling quantum of 0 ms was given: every quantum must be at least 1 ms")]
    ZeroQuantum,
    #[error("the scheduling quantum {0} ms is given twice: cell ids would repeat")]
    DuplicateQuantum(u32),
}
