//! `preheat serve`: start a catalog server (memcached, nginx, redis, MariaDB, preheat-kv) on
//! loopback with its data set loaded, optionally with the agent and a working set, print where it
//! listens, and keep it running until SIGINT/SIGTERM (which stop it). The lab's peer check and
//! sweeps use it to get the same server configuration as `preheat demo`.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use preheat_model::proto::Request;
use serde::Serialize;

use preheat_launch::agentctl::AgentClient;
use preheat_launch::servers::{self, ServerKind};

#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    /// The server to start.
    #[arg(long, value_enum)]
    pub server: ServerKind,
    /// Port on 127.0.0.1 (default: a free one).
    #[arg(long)]
    pub port: Option<u16>,
    /// Attach the preheat agent (LD_PRELOAD).
    #[arg(long)]
    pub agent: bool,
    /// Load this working-set file into the agent (implies --agent).
    #[arg(long)]
    pub profile: Option<PathBuf>,
    /// Pin the server to this CPU (default: not pinned).
    #[arg(long)]
    pub cpu: Option<usize>,
    /// Directory for the server's configuration, data and log, kept when the server is stopped
    /// (default: a fresh temp dir, removed with the agents' logs when Ctrl-C or SIGTERM stops
    /// it).
    #[arg(long)]
    pub workdir: Option<PathBuf>,
    /// Print the ready line as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize)]
struct Ready<'a> {
    server: &'a str,
    port: u16,
    pid: u32,
    protocol: preheat_lab::driver::Protocol,
    key: &'a str,
    agent: bool,
    workdir: String,
    prepared: &'a preheat_lab::servers::Prepared,
}

pub fn run(a: ServeArgs) -> Result<()> {
    let agent = a.agent || a.profile.is_some();
    let (dir, fresh) = match &a.workdir {
        Some(d) => {
            std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
            (d.clone(), false)
        }
        // Nothing of a server in a temp dir outlives it: the signal handler removes the dir
        // (and the next `serve` those of `serve`s killed outright); an error exit keeps it for
        // a look. A server given a --workdir keeps it and its agents' logs.
        None => (preheat_launch::launch::scratch_dir("serve")?.keep(), true),
    };
    if fresh {
        preheat_launch::cleanup::tidy_agent_logs_on_signal();
    }
    let started = servers::start(
        a.server,
        a.port,
        &dir,
        servers::Placement {
            cpus: a.cpu.map(|c| vec![c]).unwrap_or_default(),
            agent,
            netns: None,
        },
    )
    .inspect_err(|_| {
        // A server that never started (not installed, port in use) leaves nothing worth a look
        // (no file, no log): remove the directory we made for it then.
        if fresh {
            preheat_launch::launch::remove_if_empty(&dir);
        }
    })?;
    let server = &started.server;
    if let Some(p) = &a.profile {
        let path = std::fs::canonicalize(p).with_context(|| format!("{}", p.display()))?;
        for pid in server.agent_pids() {
            AgentClient::connect(&server.run_dir, pid)?.call(&Request::LoadProfile {
                path: path.to_string_lossy().into_owned(),
            })?;
        }
    }
    let ready = Ready {
        server: a.server.name(),
        port: server.spec.port,
        pid: server.pid(),
        protocol: started.plan.workload.protocol,
        key: &started.plan.workload.key,
        agent,
        workdir: dir.to_string_lossy().into_owned(),
        prepared: &started.prepared,
    };
    if a.json {
        println!("{}", serde_json::to_string(&ready)?);
    } else {
        println!(
            "{} listening on 127.0.0.1:{} (pid {}, {:?}, request key/path {:?}, agent: {}); Ctrl-C stops it",
            ready.server, ready.port, ready.pid, ready.protocol, ready.key, agent
        );
    }
    use std::io::Write;
    std::io::stdout().flush()?;
    // Until SIGINT/SIGTERM (the launcher's handler stops the server and exits) or the server dies.
    loop {
        std::thread::sleep(Duration::from_millis(200));
        if !preheat_launch::launch::port_in_use(server.spec.port) {
            bail!(
                "{} stopped listening on port {}; its log:\n{}",
                ready.server,
                ready.port,
                server.log_tail()
            );
        }
    }
}

/// `preheat lab ARGS`: the Python experiment runner (`python3 -m preheat_lab ARGS`), with the
/// package from this source checkout (or `PREHEAT_PYTHON_DIR`) on `PYTHONPATH`.
pub fn lab(args: Vec<String>) -> Result<()> {
    use std::os::unix::process::CommandExt;
    let dir = match std::env::var_os("PREHEAT_PYTHON_DIR") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../python"),
    };
    if !dir.join("preheat_lab").is_dir() {
        bail!(
            "the lab's Python package is not at {}: run from a source checkout or set PREHEAT_PYTHON_DIR",
            dir.display()
        );
    }
    let dir = std::fs::canonicalize(&dir)?;
    let mut pp = dir.as_os_str().to_owned();
    if let Some(old) = std::env::var_os("PYTHONPATH") {
        pp.push(":");
        pp.push(old);
    }
    let mut cmd = std::process::Command::new("python3");
    cmd.arg("-m")
        .arg("preheat_lab")
        .args(&args)
        .env("PYTHONPATH", pp);
    if std::env::var_os("PREHEAT_BIN").is_none() {
        if let Ok(exe) = std::env::current_exe() {
            cmd.env("PREHEAT_BIN", exe);
        }
    }
    let err = cmd.exec();
    bail!("cannot run python3 -m preheat_lab: {err} (is python3 installed?)")
}
