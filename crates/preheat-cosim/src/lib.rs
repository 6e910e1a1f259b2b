//! Partial coscheduling without an OS.
//!
//! Busse, Schönherr, Diener, Navaux and Heiß, *Partial Coscheduling of Virtual Machines Based on
//! Memory Access Patterns* (SAC'15) coschedule VMs in *sets*: all vCPUs of a set run at the same
//! time. Full coscheduling uses one set per VM, so a VM half the host's size leaves half the
//! host idle whenever it runs; partial coscheduling splits a VM into sets that follow the load
//! inside it (its NPB instances), so sets of different VMs fill a slice together. This crate
//! holds the parts that need no operating system:
//!
//! * [`plan`]: the slice planner — which sets run in the next slice and on which CPUs (least
//!   attained service first, first fit, stable placement). Shared with the real user-space
//!   coscheduler of `preheat cosched`.
//! * [`scenario`]: the paper's setup (§4: VM1 host-sized, VM2 half; single, double and quad
//!   loads) and the sets of each policy (none, full, partial-static, partial-auto).
//! * [`workload`]: the compute time of a thread between two barriers.
//! * [`sim`] (with the private `engine`): a deterministic discrete-event simulator of hosts of
//!   any size, reporting the paper's metric (§5: the VMs' run times summed).
//! * [`predict`]: the closed-form ideal (fluid shares, perfect packing, no costs) behind the
//!   paper's expectations of 33% (double, quad) and 100% (single).
//! * [`mod@compare`]: policies side by side against full coscheduling.
//! * [`render`]: a comparison as the text table `preheat cosched simulate` prints.
//!
//! Invariants: no I/O, no `unsafe`, no clocks, no global state; every result is deterministic
//! for a seed (`StdRng::seed_from_u64`). Everything the simulator reports is *simulated*.
#![forbid(unsafe_code)]

pub mod compare;
mod engine;
pub mod plan;
pub mod predict;
pub mod render;
pub mod scenario;
pub mod sim;
pub mod workload;

pub use compare::{compare, Comparison, PolicyOutcome};
pub use plan::{CoSet, PlanError, Planner, Slice};
pub use predict::{predicted_improvement, predicted_improvement_with};
pub use scenario::{sets_for, Instance, Policy, Scenario, ScenarioError, Setup};
pub use sim::{simulate, InstanceResult, SimError, SimParams, SimResult, VmResult};
pub use workload::PhaseDist;
