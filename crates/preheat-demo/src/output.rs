//! A demo run's result (`run.rs` makes it, `render.rs` prints it, `--json` serializes it).

use serde::Serialize;

use preheat_estimate::RecordStats;

use crate::mode::Sample;
use crate::table::{Decomposition, FloorCheck, Row};

/// A mode that was asked for but cannot run here, and why.
#[derive(Debug, Serialize)]
pub struct Skipped {
    pub mode: String,
    pub reason: String,
}

/// A demo run's result: `preheat demo --json` prints it, `--out` writes it.
#[derive(Debug, Serialize)]
pub struct Output {
    /// The processes announced to: one, or every worker where the server's requests go to any
    /// of them.
    pub serving_pids: Vec<u32>,
    /// Those of `serving_pids` that joined during the measurement: each served one measured
    /// request unannounced (a sample flagged as not reaching a preheated process), then was
    /// announced to (see `join`).
    pub joined_pids: Vec<u32>,
    pub server: String,
    pub machine: String,
    pub label: &'static str,
    pub rounds: usize,
    pub lead_us: u64,
    pub server_cpu: usize,
    pub client_cpu: usize,
    /// How requests reach the server: the loopback, or a veth pair into the network namespace
    /// the server runs in (checked on the server's process).
    pub transport: String,
    /// Pings the client sent itself through the cold-making steps' waits, to keep its own
    /// network path warm (the `warmth` module).
    pub client_pings: u64,
    /// Where the loopback's receive processing ran, and why (`None`: not decided, no pilot).
    pub steer_rx: Option<crate::SteerChoice>,
    pub record: Option<RecordStats>,
    pub prepared: preheat_lab::servers::Prepared,
    /// Whether a hardware PMU exists; CPI is only measured with one (`null` otherwise).
    pub pmu: bool,
    pub cpi: Option<f64>,
    /// Modes that were asked for but cannot run on this server, with the reason.
    pub skipped: Vec<Skipped>,
    /// How the hot floor kept the CPUs out of idle (`None`: no hot floor; see skipped).
    pub hot_floor: Option<String>,
    /// Whether the hot floor measured below warm in this run (the shares use it only then).
    pub floor_check: Option<FloorCheck>,
    /// What the `wake` strategy ran as (the calibrated mechanism).
    pub wake_mechanism: String,
    /// `--syscall-stages`: the observer that split the response times at the server's system
    /// calls, or why it could not attach (`None`: not asked for).
    pub syscall_stages: Option<Result<String, String>>,
    /// `None`: the agent ran inside the server; else how the server was preheated from outside
    /// it (the agent cannot be loaded into it, or `--agent outside`).
    pub outside: Option<String>,
    /// This boot's keep-awake calibration (`None`: it failed; see skipped).
    pub calibration: Option<preheat_wake::calibrate::Calibration>,
    /// Whether the server's CPU kept its branch-prediction state through a short idle,
    /// measured at the start of this run (or why not).
    pub predictor: Result<preheat_wake::predictor::PredictorResult, String>,
    /// What `auto` chose, from which pilot (`None`: auto was not asked for).
    pub auto: Option<preheat_model::auto::AutoChoice>,
    /// The cold overhead split by cause (p50 differences).
    pub decomposition: Option<Decomposition>,
    /// `--connection-row`: what the state of the connection the request comes on costs
    /// (`auto` less `conn-primed`).
    pub connection_state: Option<crate::connection::ConnectionState>,
    /// The agent's preheat counters at the end of the run (all announced modes together).
    pub agent_counters: preheat_model::proto::PreheatStats,
    pub rows: Vec<Row>,
    pub samples: Vec<Sample>,
    /// The working set's size (the text table's working-set line; not in the JSON).
    #[serde(skip)]
    pub ws: preheat_model::WsStats,
}
