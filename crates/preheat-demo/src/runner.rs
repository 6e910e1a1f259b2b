//! `preheat run`: a server kept running until it exits or the command is stopped, with the
//! agent inside it or — where the agent cannot be loaded (a static binary, a Go program; root)
//! — preheated from outside it ([`crate::outside`]), and configured for its port: a profile,
//! the `replay` warm-up, what `auto` does (a demo's measured choice). `preheat announce` then
//! reaches it either way (the outside agent binds the agent's sockets for the server's pid).

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use anyhow::{bail, Result};
use preheat_launch::agentctl::AgentClient;
use preheat_launch::{cleanup, launch, paths};
use preheat_model::proto::{Request, Strategies};

use crate::params::AgentPlace;
use crate::saved::SavedChoice;

/// What `preheat run` is asked for.
#[derive(Debug, Clone)]
pub struct RunServer {
    /// The server's command line.
    pub command: Vec<String>,
    /// The port it serves.
    pub port: u16,
    /// A working set to load into its agent.
    pub profile: Option<PathBuf>,
    /// The `replay` warm-up request and the end of its reply (`\r \n` escapes).
    pub replay: Option<String>,
    pub replay_until: String,
    /// A demo's `--out` file whose `auto` choice `auto` announcements then do.
    pub auto_choice: Option<PathBuf>,
    /// Where the agent runs (as the demo's `--agent`).
    pub agent: AgentPlace,
    /// Preheated from outside, the server is pinned to this CPU, where the outside worker runs.
    pub cpu: usize,
}

/// The outside agent's sockets, removed on SIGINT/SIGTERM (the launcher's handler exits the
/// process without dropping it).
static OUTSIDE_SOCKETS: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

fn remove_outside_sockets() {
    if let Ok(v) = OUTSIDE_SOCKETS.lock() {
        for p in v.iter() {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// A server `preheat run` started and configured: what to tell the user, and the wait for its
/// end.
pub struct Running {
    server: launch::Server,
    /// Kept alive while the server runs (its drop removes its sockets).
    _outside: Option<preheat_outside::OutsideAgent>,
    /// What was set up, a line each (the CLI prints them).
    pub report: Vec<String>,
}

impl Running {
    /// Keep it running; returns only when the server exited (an error with its log's tail).
    pub fn wait(mut self) -> Result<()> {
        loop {
            std::thread::sleep(Duration::from_millis(500));
            if self.server.exited() {
                bail!("server exited; log:\n{}", self.server.log_tail());
            }
        }
    }
}

/// Start the server and configure its agents (or its outside agent).
pub fn run_server(o: &RunServer) -> Result<Running> {
    preheat_engine::os::check_cpu(o.cpu).map_err(|e| anyhow::anyhow!("--cpu: {e}"))?;
    // A profile that cannot be read is refused before the server starts (its agents would
    // otherwise be asked to load it only after the server's start-up).
    if let Some(p) = &o.profile {
        preheat_estimate::read_profile(p)?;
    }
    let auto = o
        .auto_choice
        .as_deref()
        .map(crate::read_saved_choice)
        .transpose()?;
    let outside_why = crate::outside::place(o.agent, &o.command, false, "preheat")?;
    let inside = outside_why.is_none();
    let spec = launch::ServerSpec {
        name: "server".into(),
        argv: o.command.clone(),
        port: o.port,
        agent: inside,
        cpus: if inside { vec![] } else { vec![o.cpu] },
        env: vec![],
        agent_only: None,
        netns: None,
    };
    let dir = launch::tempdir("run")?;
    let server = launch::start(spec, &paths::run_dir(), &dir, Duration::from_secs(20))
        .inspect_err(|_| launch::remove_if_empty(&dir))?;
    let outside = outside_why
        .map(|why| crate::outside::attach(&server, o.cpu, why, "preheat"))
        .transpose()?;
    if let Some(a) = &outside {
        if let Ok(mut v) = OUTSIDE_SOCKETS.lock() {
            v.extend(a.sockets().iter().cloned());
        }
        cleanup::on_signal(remove_outside_sockets);
    }
    let pids = match &outside {
        Some(a) => vec![a.pid()],
        None => server.agent_pids(),
    };
    let mut report = configure(o, &server.run_dir, &pids, auto.as_ref())?;
    report.push(match &auto {
        Some(c) => format!("auto for port {}: {}", o.port, c.describe()),
        None => format!(
            "auto for port {}: {} (no measured choice: give --auto-choice a demo's --out file)",
            o.port,
            Strategies::AUTO_UNMEASURED.name()
        ),
    });
    let place = match &outside {
        Some(_) => format!(" (preheated from outside it, on CPU {})", o.cpu),
        None => String::new(),
    };
    report.push(format!(
        "server pid {} on port {} with agents {pids:?}{place}; log {}; Ctrl-C stops it",
        server.pid(),
        o.port,
        server.log.display()
    ));
    Ok(Running {
        server,
        _outside: outside,
        report,
    })
}

/// Load the profile, set `auto`'s choice and configure the port in every agent of `pids`; the
/// profiles' load reports, a line each. A prefork server's master (and any process that does
/// not serve the port) cannot open a replay connection it serves itself: said per process, an
/// error only if none could.
fn configure(
    o: &RunServer,
    run_dir: &Path,
    pids: &[u32],
    auto: Option<&SavedChoice>,
) -> Result<Vec<String>> {
    let mut report = Vec::new();
    let mut configured = 0;
    for &pid in pids {
        let mut c = AgentClient::connect(run_dir, pid)?;
        if let Some(p) = &o.profile {
            let r = c.call(&Request::LoadProfile {
                path: std::fs::canonicalize(p)?.to_string_lossy().into_owned(),
            })?;
            report.push(format!("pid {pid}: {}", serde_json::to_string(&r)?));
        }
        if let Some(choice) = auto {
            c.call(&Request::SetAuto {
                port: o.port,
                strategies: Some(choice.strategies),
            })?;
        }
        match c.call(&Request::Configure {
            port: o.port,
            replay: o.replay.as_deref().map(launch::unescape),
            replay_until: Some(launch::unescape(&o.replay_until)),
            split_cpus: vec![],
            replay_via: None,
        }) {
            Ok(_) => configured += 1,
            Err(e) if pids.len() > 1 => eprintln!("preheat: pid {pid} not configured: {e:#}"),
            Err(e) => return Err(e),
        }
    }
    if configured == 0 && !pids.is_empty() {
        bail!(
            "no agent of the server could be configured for port {} (see above)",
            o.port
        );
    }
    Ok(report)
}
