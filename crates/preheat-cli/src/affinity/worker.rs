//! `preheat affinity worker` (hidden): a worker process started by the controller
//! (`preheat_affinity_ctl::proc::Worker`). Its flags are the controller's protocol, written and
//! parsed in `preheat_affinity_ctl::worker`; the binary only hands them over.

use anyhow::Result;
use preheat_affinity_ctl::worker;

#[derive(clap::Args)]
pub struct WorkerArgs {
    /// The role and its flags (`vector ...` or `workload ...`).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    args: Vec<String>,
}

pub fn run(a: WorkerArgs) -> Result<()> {
    worker::run(worker::parse(&a.args).unwrap_or_else(|e| e.exit()))
}
