//! `preheat affinity worker` (hidden): the flags of a worker process started by the controller
//! (`preheat_affinity_ctl::proc::Worker`, which writes them) turned into its role; the worker
//! itself is `preheat_affinity_ctl::worker`.

use anyhow::Result;
use preheat_affinity_ctl::worker;

#[derive(clap::Args)]
pub struct WorkerArgs {
    #[command(subcommand)]
    role: RoleArgs,
}

#[derive(clap::Subcommand)]
enum RoleArgs {
    /// A base vector: step through its footprint until SIGTERM.
    Vector {
        /// zero, data or code.
        #[arg(long)]
        kind: String,
        #[arg(long)]
        bytes: usize,
        /// A pause longer than this (µs) is a quantum boundary.
        #[arg(long, default_value_t = 150)]
        gap_us: u64,
        /// The controller's pid (the worker dies with it).
        #[arg(long)]
        parent: u32,
    },
    /// A bundled workload: run until --cpu-ms of CPU time after `g` on stdin.
    Workload {
        #[arg(long)]
        kind: String,
        #[arg(long)]
        bytes: usize,
        #[arg(long)]
        cpu_ms: u64,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Start a warm thread that loads the working set on every `p` from stdin.
        #[arg(long)]
        preheat: bool,
        /// Each preheat stops after this long (µs), loaded or not.
        #[arg(long, default_value_t = 250)]
        preheat_budget_us: u64,
        /// Run a base vector (zero, data, code) as a thread of this process (same address
        /// space: no address-space switch between workload and vector).
        #[arg(long)]
        vector_kind: Option<String>,
        #[arg(long, default_value_t = 4096)]
        vector_bytes: usize,
        /// A pause longer than this (µs) is a quantum boundary.
        #[arg(long, default_value_t = 150)]
        gap_us: u64,
        #[arg(long)]
        parent: u32,
    },
}

pub fn run(a: WorkerArgs) -> Result<()> {
    worker::run(match a.role {
        RoleArgs::Vector {
            kind,
            bytes,
            gap_us,
            parent,
        } => worker::Role::Vector {
            kind,
            bytes,
            gap_us,
            parent,
        },
        RoleArgs::Workload {
            kind,
            bytes,
            cpu_ms,
            seed,
            preheat,
            preheat_budget_us,
            vector_kind,
            vector_bytes,
            gap_us,
            parent,
        } => worker::Role::Workload {
            kind,
            bytes,
            cpu_ms,
            seed,
            preheat,
            preheat_budget_us,
            vector_kind,
            vector_bytes,
            gap_us,
            parent,
        },
    })
}
