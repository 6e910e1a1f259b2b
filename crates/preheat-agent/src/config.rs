//! The agent's configuration, read from the environment once by the constructor (so a fork
//! child never touches the environment, whose lock another parent thread may have held), and
//! the path of the agent's own shared object.

use std::path::PathBuf;
use std::sync::OnceLock;

/// Configuration from the environment, read once by the constructor.
#[derive(Debug, Clone)]
pub struct Config {
    pub run_dir: PathBuf,
    pub profile: Option<String>,
    pub log: Option<PathBuf>,
    /// `PREHEAT_WAKE_PLANNER=1`: the `wake` strategy asks a running wake planner for a window
    /// instead of spinning (see [`crate::wakeplan`]; off by default: measured slower here).
    pub wake_planner: bool,
    /// The `wake` strategy keeps the CPUs polling in idle where it may (see
    /// [`crate::idlepoll`]); `PREHEAT_NO_IDLE_POLL=1` makes it spin instead.
    pub idle_poll: bool,
    /// After a `replay` warm-up the server thread polls its event wait until the arrival (see
    /// [`crate::hold`]); `PREHEAT_NO_REPLAY_HOLD=1` lets it block instead (to compare the two).
    pub replay_hold: bool,
    /// `PREHEAT_COMM=1`: start communication detection with the agent (see [`crate::comm`]).
    pub comm: Option<preheat_model::comm::CommConfig>,
    /// `PREHEAT_COMM_OUT`: write the final communication report there at exit.
    pub comm_out: Option<String>,
    /// `PREHEAT_AGENT_SHARED_FDS=1`: the agent's threads share the host's file table instead
    /// of one of their own (see [`crate::fdreg`]; for comparison and as an escape hatch).
    pub shared_fds: bool,
}

static CONFIG: OnceLock<Config> = OnceLock::new();
/// Path of the agent's shared object (from `dladdr`).
static AGENT_SO: OnceLock<String> = OnceLock::new();

/// The configuration, once the constructor attached the agent.
pub fn config() -> Option<&'static Config> {
    CONFIG.get()
}

/// Path of the agent's shared object, once the constructor found it.
pub fn agent_so_path() -> Option<&'static str> {
    AGENT_SO.get().map(|s| s.as_str())
}

/// Whether a replay opens the server thread's hold window (default on; `PREHEAT_NO_REPLAY_HOLD=1`
/// turns it off).
pub fn replay_hold() -> bool {
    CONFIG.get().is_some_and(|c| c.replay_hold)
}

/// Constructor only: set the configuration (first call wins).
pub(crate) fn set(cfg: Config) {
    let _ = CONFIG.set(cfg);
}

/// Constructor only: remember the agent's shared object (first call wins).
pub(crate) fn set_agent_so(path: String) {
    let _ = AGENT_SO.set(path);
}
