//! Client side of the agent's control socket and of the announcement (trigger) channel.

use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::{UnixDatagram, UnixStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use preheat_model::proto::{Announcement, Reply, Request};

use crate::paths;

/// A connection to one agent.
pub struct AgentClient {
    pub pid: u32,
    stream: BufReader<UnixStream>,
    path: PathBuf,
}

impl AgentClient {
    pub fn connect(run_dir: &Path, pid: u32) -> Result<AgentClient> {
        let path = paths::control_socket(run_dir, pid);
        let s = UnixStream::connect(&path).with_context(|| {
            format!(
                "cannot connect to the agent of pid {pid} at {} (is the server running with the agent attached?)",
                path.display()
            )
        })?;
        s.set_read_timeout(Some(Duration::from_secs(30)))?;
        Ok(AgentClient {
            pid,
            stream: BufReader::new(s),
            path,
        })
    }

    /// Send one request and read its reply. `Reply::Error` becomes an `Err`.
    pub fn call(&mut self, req: &Request) -> Result<Reply> {
        self.call_passing(req, None)
    }

    /// [`AgentClient::call`], passing the descriptor `fd` along with the request (`SCM_RIGHTS`:
    /// the agent gets a duplicate; `Request::ProbeAdopt`).
    pub fn call_with_fd(&mut self, req: &Request, fd: RawFd) -> Result<Reply> {
        self.call_passing(req, Some(fd))
    }

    fn call_passing(&mut self, req: &Request, fd: Option<RawFd>) -> Result<Reply> {
        let mut line = serde_json::to_string(req)?;
        line.push('\n');
        let sock = self.stream.get_mut();
        match fd {
            None => sock.write_all(line.as_bytes()),
            Some(fd) => preheat_engine::fdpass::send_with_fd(sock.as_raw_fd(), line.as_bytes(), fd),
        }
        .with_context(|| format!("writing to {}", self.path.display()))?;
        let mut buf = String::new();
        let n = self
            .stream
            .read_line(&mut buf)
            .with_context(|| format!("reading from {}", self.path.display()))?;
        if n == 0 {
            bail!("agent of pid {} closed the control connection", self.pid);
        }
        let reply: Reply = serde_json::from_str(buf.trim_end())
            .with_context(|| format!("agent of pid {} sent an unreadable reply", self.pid))?;
        if let Reply::Error { message } = reply {
            bail!("agent of pid {}: {message}", self.pid);
        }
        Ok(reply)
    }

    /// The agent's communication report (`CommReport`: its SPCD matrix so far).
    pub fn comm_report(&mut self) -> Result<preheat_model::comm::CommReport> {
        match self.call(&Request::CommReport)? {
            Reply::Comm(r) => Ok(r),
            other => bail!("unexpected reply {other:?}"),
        }
    }
}

/// Pids with a live agent control socket in `run_dir`. Sockets of dead processes are removed.
pub fn discover(run_dir: &Path) -> Vec<u32> {
    preheat_rundir::remove_dead(run_dir)
}

/// Wait until at least one agent among the processes of `tree` answers its control socket.
pub fn wait_for_agents(
    run_dir: &Path,
    tree: impl Fn() -> Vec<u32>,
    timeout: Duration,
) -> Result<Vec<u32>> {
    let t0 = Instant::now();
    loop {
        let procs = tree();
        let live: Vec<u32> = discover(run_dir)
            .into_iter()
            .filter(|p| procs.contains(p))
            .filter(|p| AgentClient::connect(run_dir, *p).is_ok())
            .collect();
        if !live.is_empty() {
            return Ok(live);
        }
        if t0.elapsed() > timeout {
            bail!(
                "no agent answered in {} within {:?}: was the server started with the agent (LD_PRELOAD)?",
                run_dir.display(),
                timeout
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Sends announcements to agents' trigger sockets.
pub struct Announcer {
    sock: UnixDatagram,
    /// The run directory the agents' trigger sockets are in.
    run_dir: PathBuf,
    targets: Vec<PathBuf>,
    pub seq: u64,
}

impl Announcer {
    pub fn new(run_dir: &Path, pids: &[u32]) -> Result<Announcer> {
        let sock = UnixDatagram::unbound()?;
        sock.set_nonblocking(true)?;
        Ok(Announcer {
            sock,
            run_dir: run_dir.to_path_buf(),
            targets: pids
                .iter()
                .map(|p| paths::trigger_socket(run_dir, *p))
                .collect(),
            seq: 0,
        })
    }

    /// Announce to the agent of `pid` too, from the next [`Announcer::send`] on.
    pub fn add(&mut self, pid: u32) {
        self.targets.push(paths::trigger_socket(&self.run_dir, pid));
    }

    /// Send `a` (its seq is filled in) to every target; returns how many accepted it.
    pub fn send(&mut self, mut a: Announcement) -> usize {
        self.seq += 1;
        a.seq = self.seq;
        let bytes = a.encode();
        self.targets
            .iter()
            .filter(|t| self.sock.send_to(&bytes, t).is_ok())
            .count()
    }
}
