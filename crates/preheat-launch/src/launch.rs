//! Starting servers with the agent attached, and stopping every process we started.
//!
//! Every process the CLI starts is registered in a global list; [`crate::cleanup`] stops them
//! on SIGINT/SIGTERM, and [`Server`]'s `Drop` stops them on every other exit path (errors
//! included), so no server outlives the command that started it.

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use preheat_engine::procstat::{parse_pid_stat, read_pid_stat};

use crate::agentctl;
use crate::paths;
use crate::preflight;

pub(crate) static STARTED: Mutex<Vec<u32>> = Mutex::new(Vec::new());
/// Scratch directories of this command, removed by the signal handler too (after the processes
/// that use them are stopped).
pub(crate) static SCRATCH: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// Servers started with the agent, and the run directory their agents log to: on SIGINT/SIGTERM
/// the handler removes the logs of their processes where
/// [`crate::cleanup::tidy_agent_logs_on_signal`] asked.
pub(crate) static AGENT_SERVERS: Mutex<Vec<(u32, PathBuf)>> = Mutex::new(Vec::new());

/// Remember a scratch directory for removal on SIGINT/SIGTERM (its guard removes it otherwise).
pub fn register_scratch(dir: &Path) {
    if let Ok(mut v) = SCRATCH.lock() {
        v.push(dir.to_path_buf());
    }
}

/// A scratch directory `<dir>/<prefix><our pid>-XXXX`: removed when the guard drops, by the
/// signal handler, and — if this process is killed outright — by the next command that calls
/// [`sweep_scratch`] with the same prefix (the pid in the name says whose it was).
pub fn owned_scratch(dir: &Path, prefix: &str) -> Result<tempfile::TempDir> {
    sweep_scratch(dir, prefix);
    let d = tempfile::Builder::new()
        .prefix(&format!("{prefix}{}-", std::process::id()))
        .tempdir_in(dir)
        .with_context(|| format!("creating a scratch directory in {}", dir.display()))?;
    register_scratch(d.path());
    Ok(d)
}

/// A scratch directory for one command (server data, logs, recorded profiles) under the system
/// temp dir, `preheat-<what>-<pid>-XXXX`: removed when the returned guard drops — after the
/// servers started in it, which are declared later and so are stopped first — by the
/// SIGINT/SIGTERM handler, and, when this process is killed outright, by the next command that
/// makes a scratch directory for the same `what` ([`owned_scratch`]).
pub fn scratch_dir(what: &str) -> Result<tempfile::TempDir> {
    owned_scratch(&std::env::temp_dir(), &format!("preheat-{what}-"))
        .with_context(|| format!("creating a scratch directory for {what}"))
}

/// A directory for a long-running command (`run`: it ends by a signal, and its
/// server's files are worth keeping for a look afterwards).
pub fn tempdir(what: &str) -> Result<PathBuf> {
    let d = std::env::temp_dir().join(format!("preheat-{what}-{}", std::process::id()));
    std::fs::create_dir_all(&d).with_context(|| format!("creating {}", d.display()))?;
    Ok(d)
}

/// Remove `dir` (a [`tempdir`]) when it holds no file, at most empty directories: a server that
/// was refused or never started leaves nothing worth a look there.
pub fn remove_if_empty(dir: &Path) {
    fn holds_a_file(dir: &Path) -> bool {
        let Ok(rd) = std::fs::read_dir(dir) else {
            return true;
        };
        rd.flatten().any(|e| match e.file_type() {
            Ok(t) if t.is_dir() => holds_a_file(&e.path()),
            _ => true,
        })
    }
    if !holds_a_file(dir) {
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// Remove the `<prefix><pid>-*` scratch directories in `dir` whose process no longer runs (the
/// engine's, which the wake bench uses too: `preheat-wake` cannot depend on this crate).
pub use preheat_engine::host::remove_left_by_the_dead as sweep_scratch;

/// All descendants of `pid` (children, grandchildren, ...), from /proc.
pub fn descendants(pid: u32) -> Vec<u32> {
    let mut parent_of = Vec::new();
    if let Ok(rd) = std::fs::read_dir("/proc") {
        for e in rd.flatten() {
            let Some(p) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            if let Some(stat) = read_pid_stat(p) {
                parent_of.push((p, stat.ppid));
            }
        }
    }
    let mut set = BTreeSet::from([pid]);
    loop {
        let before = set.len();
        for (p, pp) in &parent_of {
            if set.contains(pp) {
                set.insert(*p);
            }
        }
        if set.len() == before {
            break;
        }
    }
    set.remove(&pid);
    set.into_iter().collect()
}

fn alive(pid: u32) -> bool {
    // A zombie still has /proc/<pid>; treat it as gone.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|s| !parse_pid_stat(&s).is_some_and(|s| s.is_zombie()))
}

/// Send `sig` to `pid`; one that is already gone is no error here.
fn signal(pid: u32, sig: i32) {
    let _ = preheat_engine::os::send_signal(pid, sig, false);
}

/// SIGTERM `pid` and its descendants, wait up to `grace`, then SIGKILL what is left.
pub fn stop_tree(pid: u32, grace: Duration) {
    let mut all = descendants(pid);
    all.push(pid);
    for p in &all {
        signal(*p, libc::SIGTERM);
    }
    let t0 = Instant::now();
    while all.iter().any(|p| alive(*p)) && t0.elapsed() < grace {
        std::thread::sleep(Duration::from_millis(10));
    }
    for p in all.iter().filter(|p| alive(**p)) {
        signal(*p, libc::SIGKILL);
    }
}

/// Live (not zombie) processes whose process group is `pgid`, from /proc.
fn group_members(pgid: u32) -> Vec<u32> {
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    rd.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|p| read_pid_stat(*p).is_some_and(|s| !s.is_zombie() && s.pgrp == pgid))
        .collect()
}

/// After [`stop_tree`] of a server started in its own process group: SIGKILL what is left of
/// the group — a prefork master may have forked a replacement worker while its workers were
/// being stopped, which no list of descendants taken before held — and wait (bounded) until
/// none is left.
fn stop_group(pgid: u32, grace: Duration) {
    let t0 = Instant::now();
    loop {
        let left = group_members(pgid);
        if left.is_empty() || t0.elapsed() > grace {
            return;
        }
        for p in left {
            signal(p, libc::SIGKILL);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// How to start a server and talk to it.
#[derive(Debug, Clone)]
pub struct ServerSpec {
    pub name: String,
    pub argv: Vec<String>,
    pub port: u16,
    /// Attach the agent with LD_PRELOAD.
    pub agent: bool,
    /// Pin the server to these CPUs (empty: no pinning).
    pub cpus: Vec<usize>,
    pub env: Vec<(String, String)>,
    /// Only attach the agent to processes with this executable basename.
    pub agent_only: Option<String>,
    /// Start the server in this network namespace, reached over a veth pair (`None`: ours,
    /// on the loopback). Kept alive as long as the server.
    pub netns: Option<std::sync::Arc<preheat_engine::netns::VethHost>>,
}

impl ServerSpec {
    /// Where clients reach the server: 127.0.0.1, or the namespace's end of the veth pair.
    pub fn addr(&self) -> SocketAddr {
        let ip = match &self.netns {
            Some(ns) => ns.remote,
            None => std::net::Ipv4Addr::LOCALHOST,
        };
        SocketAddr::from((ip, self.port))
    }
}

/// A running server; stopped on drop (then its network namespace, if it has one, is removed).
pub struct Server {
    pub spec: ServerSpec,
    child: Child,
    pub run_dir: PathBuf,
    pub log: PathBuf,
    /// Stopped already ([`Server::stop`]): the drop has nothing left to do.
    stopped: bool,
}

impl Server {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether the server process has exited (reaped here, so an exited one is never mistaken
    /// for a running one by its zombie's `/proc` entry).
    pub fn exited(&mut self) -> bool {
        !matches!(self.child.try_wait(), Ok(None))
    }

    /// The server process and its descendants.
    pub fn tree(&self) -> Vec<u32> {
        let mut v = descendants(self.pid());
        v.push(self.pid());
        v
    }

    /// Pids of the processes of this server that have an agent.
    pub fn agent_pids(&self) -> Vec<u32> {
        let tree = self.tree();
        agentctl::discover(&self.run_dir)
            .into_iter()
            .filter(|p| tree.contains(p))
            .collect()
    }

    /// Stop the server and, unless `keep_logs`, then remove the agents' logs (`agent-PID.log` in
    /// the run directory, which outlives it) of its processes and of `also` (processes that
    /// served and may have exited already). Stopped first, so no agent writes to its log after.
    /// A command keeps them where it failed (for the diagnosis) or was asked to; without this a
    /// day of demos had piled up 260 logs there.
    pub fn stop_and_tidy(mut self, also: &[u32], keep_logs: bool) {
        if !keep_logs {
            self.stop_removing_logs(also);
        }
        // Otherwise `self` drops here: the server stops.
    }

    /// Stop the server now, then remove its processes' and `also`'s agent logs (what
    /// [`Server::stop_and_tidy`] does, for an owner that cannot give the server up, such as a
    /// bench server's drop).
    pub fn stop_removing_logs(&mut self, also: &[u32]) {
        let mut pids = self.tree();
        pids.extend_from_slice(also);
        let logs: Vec<std::path::PathBuf> = pids
            .into_iter()
            .map(|p| crate::paths::agent_log(&self.run_dir, p))
            .collect();
        self.stop();
        for l in logs {
            let _ = std::fs::remove_file(l);
        }
    }

    /// Stop the server and its processes now (what dropping it does; once).
    pub fn stop(&mut self) {
        if std::mem::replace(&mut self.stopped, true) {
            return;
        }
        let pid = self.pid();
        stop_tree(pid, Duration::from_secs(3));
        // Before reaping the server: while it is an unreaped zombie its pid (the group's id)
        // cannot be reused by an unrelated process.
        stop_group(pid, Duration::from_secs(3));
        let _ = self.child.wait();
        if let Ok(mut v) = STARTED.lock() {
            v.retain(|p| *p != pid);
        }
        if let Ok(mut v) = AGENT_SERVERS.lock() {
            v.retain(|(p, _)| *p != pid);
        }
        // A server that dies of the signal (Python's default SIGTERM) never runs its agents'
        // exit handlers, which remove their sockets: remove those of every process now gone.
        agentctl::discover(&self.run_dir);
    }

    /// Where clients reach it: 127.0.0.1, or the namespace's end of the veth pair.
    pub fn addr(&self) -> SocketAddr {
        self.spec.addr()
    }

    pub fn log_tail(&self) -> String {
        let s = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = s.lines().collect();
        lines[lines.len().saturating_sub(15)..].join("\n")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Spawn `cmd` with its CPU mask set to `cpus` (empty: ours). Children inherit the mask of the
/// thread that spawns them, so this thread is pinned for the moment of the spawn.
pub fn spawn_pinned(cmd: &mut Command, cpus: &[usize]) -> std::io::Result<Child> {
    if cpus.is_empty() {
        return cmd.spawn();
    }
    let saved = preheat_engine::os::get_affinity();
    preheat_engine::os::set_affinity(cpus)?;
    let spawned = cmd.spawn();
    let _ = preheat_engine::os::set_affinity(&saved);
    spawned
}

/// A program we started (not a server): registered for the signal handler, and stopped with its
/// descendants when dropped if it still runs.
pub struct Program {
    pub child: Child,
}

impl Program {
    /// Spawn `cmd` and register it.
    pub fn spawn(cmd: &mut Command) -> std::io::Result<Program> {
        let child = cmd.spawn()?;
        if let Ok(mut v) = STARTED.lock() {
            v.push(child.id());
        }
        Ok(Program { child })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Program {
    fn drop(&mut self) {
        let pid = self.child.id();
        if let Ok(None) = self.child.try_wait() {
            stop_tree(pid, Duration::from_secs(2));
        }
        let _ = self.child.wait();
        if let Ok(mut v) = STARTED.lock() {
            v.retain(|p| *p != pid);
        }
    }
}

/// Whether something already listens on 127.0.0.1:`port`.
pub fn port_in_use(port: u16) -> bool {
    listens(SocketAddr::from(([127, 0, 0, 1], port)))
}

/// Whether something accepts connections at `addr` (not a loopback socket connected to itself).
fn listens(addr: SocketAddr) -> bool {
    preheat_engine::host::accepts_connections(addr, Duration::from_millis(200))
}

/// Give `cmd` (a program the agent is attached to) `run_dir` as its agents' run directory,
/// after checking that their sockets fit there (a clear error instead of an agent that cannot
/// listen and a caller that waits for it).
pub fn agent_run_dir(cmd: &mut Command, run_dir: &Path) -> Result<()> {
    preheat_rundir::check_socket_paths_fit(run_dir).map_err(anyhow::Error::msg)?;
    cmd.env("PREHEAT_RUN_DIR", run_dir);
    Ok(())
}

/// Load the agent into the program `cmd` starts (`program`, its first argument): the pre-flight
/// first ([`preflight::check`]: a program the agent cannot reach is an error naming the reason
/// and what to do, before anything starts), then `LD_PRELOAD`. The one way a command starts a
/// program with the agent.
pub fn attach_agent(
    cmd: &mut Command,
    program: &str,
    needs: preflight::Needs,
) -> Result<preflight::Ready> {
    let agent = paths::agent_so()?;
    let ready = preflight::check(program, &agent, needs)?;
    cmd.env("LD_PRELOAD", &agent);
    Ok(ready)
}

/// Why no agent answers in a server that listens: what the pre-flight ruled out and what each
/// of its processes is (`preflight::diagnose`).
fn no_agent_report(ready: &preflight::Ready, pids: &[u32], agent: &Path) -> String {
    let mut s = format!(
        "ruled out before the start: {}
not checked: programs it starts later, security \
         modules (SELinux, AppArmor)",
        ready.ruled_out.join("; ")
    );
    for line in preflight::diagnose(pids, agent) {
        s.push_str("\n  ");
        s.push_str(&line);
    }
    s
}

/// Start `spec`, wait until it accepts connections on its port (and, with the agent, until an
/// agent answers), or fail with the server's log. A program the agent cannot be loaded into is
/// refused before it starts ([`attach_agent`]), and a server none of whose processes can have
/// it (a wrapper that ran a static program) as soon as it listens.
pub fn start(
    spec: ServerSpec,
    run_dir: &Path,
    log_dir: &Path,
    timeout: Duration,
) -> Result<Server> {
    if spec.netns.is_none() && port_in_use(spec.port) {
        bail!(
            "port {} is already in use on 127.0.0.1: stop whatever listens there or pick another port",
            spec.port
        );
    }
    let Some(prog) = spec.argv.first() else {
        bail!("empty server command");
    };
    let mut cmd = Command::new(prog);
    let ready = if spec.agent {
        let ready = attach_agent(&mut cmd, prog, preflight::Needs::Hooks)?;
        agent_run_dir(&mut cmd, run_dir)?;
        Some(ready)
    } else {
        None
    };
    std::fs::create_dir_all(run_dir).with_context(|| format!("creating {}", run_dir.display()))?;
    std::fs::create_dir_all(log_dir)?;
    let log = log_dir.join(format!("{}.log", spec.name));
    let logf = std::fs::File::create(&log)?;
    cmd.args(&spec.argv[1..])
        .stdin(Stdio::null())
        .stdout(logf.try_clone()?)
        .stderr(logf);
    for (k, v) in &spec.env {
        cmd.env(k, v);
    }
    // Its own process group: a server that signals its group (lighttpd's master stops its
    // workers with kill(0, SIGTERM)) must not signal us and whoever started us.
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    if let Some(only) = spec.agent_only.as_ref().filter(|_| spec.agent) {
        cmd.env("PREHEAT_AGENT_ONLY", only);
    }
    if let Some(ns) = &spec.netns {
        ns.enter_on_spawn(&mut cmd)?;
    }
    let child =
        spawn_pinned(&mut cmd, &spec.cpus).with_context(|| format!("cannot start {prog}"))?;
    STARTED.lock().map(|mut v| v.push(child.id())).ok();
    if spec.agent {
        AGENT_SERVERS
            .lock()
            .map(|mut v| v.push((child.id(), run_dir.to_path_buf())))
            .ok();
    }
    let mut srv = Server {
        spec,
        child,
        run_dir: run_dir.to_path_buf(),
        log,
        stopped: false,
    };
    let t0 = Instant::now();
    loop {
        if let Ok(Some(st)) = srv.child.try_wait() {
            bail!(
                "{} exited during start-up ({st}); its log ({}):\n{}",
                srv.spec.name,
                srv.log.display(),
                srv.log_tail()
            );
        }
        if listens(srv.addr()) {
            break;
        }
        if t0.elapsed() > timeout {
            bail!(
                "{} did not listen on {} within {:?}; its log:\n{}",
                srv.spec.name,
                srv.addr(),
                timeout,
                srv.log_tail()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    if let Some(ready) = ready {
        let agent = paths::agent_so()?;
        if !preflight::any_reachable(&srv.tree(), &agent) {
            bail!(
                "{} listens, but none of its processes can have the agent:\n{}",
                srv.spec.name,
                no_agent_report(&ready, &srv.tree(), &agent)
            );
        }
        let remaining = timeout
            .saturating_sub(t0.elapsed())
            .max(Duration::from_secs(2));
        agentctl::wait_for_agents(&srv.run_dir, || srv.tree(), remaining)
            .map_err(|e| anyhow!("{e}\n{}", no_agent_report(&ready, &srv.tree(), &agent)))?;
    }
    Ok(srv)
}

/// A request/response client (one TCP connection, Nagle off) that busy-polls its socket, so a
/// measured latency contains the server's response time and not the wakeup of the client's own
/// (v)CPU from idle, which adds tens of µs to every request on our VMs.
pub struct Client {
    s: TcpStream,
    buf: Vec<u8>,
    /// When the requests reached the wire, once asked for ([`Client::stamp_sends`]).
    stamps: preheat_engine::txstamp::SendStamps,
}

/// How long a reply may take before the client gives up.
const REPLY_TIMEOUT: Duration = Duration::from_secs(10);

impl Client {
    /// Ask the kernel to stamp this connection's requests as they reach the wire (software
    /// transmit stamps); false where it cannot.
    pub fn stamp_sends(&mut self) -> bool {
        self.stamps.enable(std::os::fd::AsRawFd::as_raw_fd(&self.s))
    }

    /// When the last request reached the wire (`CLOCK_MONOTONIC` ns), where stamped.
    pub fn sent_at_ns(&self) -> Option<u64> {
        self.stamps.last_ns()
    }

    /// The connection's socket.
    pub fn raw_fd(&self) -> std::os::fd::RawFd {
        std::os::fd::AsRawFd::as_raw_fd(&self.s)
    }

    pub fn connect(addr: SocketAddr) -> Result<Client> {
        let s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))
            .with_context(|| format!("connecting to {addr}"))?;
        s.set_nodelay(true)?;
        s.set_nonblocking(true)?;
        Ok(Client {
            s,
            buf: Vec::with_capacity(64 * 1024),
            stamps: Default::default(),
        })
    }

    /// Send `req` and read until the reply ends with `until`. Returns the reply.
    pub fn request(&mut self, req: &[u8], until: &[u8]) -> Result<&[u8]> {
        self.exchange(req, |buf| buf.ends_with(until).then_some(()), REPLY_TIMEOUT)
    }

    /// As [`Client::request`], but blocked in the kernel while waiting instead of polling
    /// (the client's latency does not matter, its CPU does: a request whose server is being
    /// single-stepped takes seconds), for at most `timeout`.
    pub fn request_blocking(&mut self, req: &[u8], until: &[u8], timeout: Duration) -> Result<()> {
        // Each blocked read wakes at least once a second to check the deadline.
        self.s.set_nonblocking(false)?;
        self.s
            .set_read_timeout(Some(timeout.min(Duration::from_secs(1))))?;
        self.s.set_write_timeout(Some(timeout))?;
        let r = self
            .exchange(req, |buf| buf.ends_with(until).then_some(()), timeout)
            .map(drop);
        self.s.set_nonblocking(true)?;
        r
    }

    /// Send `req`, then read until `complete` says the reply is whole, for at most `timeout`:
    /// polling on the non-blocking socket, or (where it blocks, with a read timeout) waiting in
    /// the kernel.
    fn exchange(
        &mut self,
        req: &[u8],
        complete: impl Fn(&[u8]) -> Option<()>,
        timeout: Duration,
    ) -> Result<&[u8]> {
        let t0 = Instant::now();
        let mut sent = 0;
        while sent < req.len() {
            match self.s.write(&req[sent..]) {
                Ok(n) => sent += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if t0.elapsed() > timeout {
                        bail!("could not send the request within {timeout:?}");
                    }
                    std::hint::spin_loop()
                }
                Err(e) => return Err(e).context("sending the request"),
            }
        }
        // Before the reply (see `SendStamps`).
        self.stamps.sent(std::os::fd::AsRawFd::as_raw_fd(&self.s));
        self.buf.clear();
        let mut chunk = [0u8; 16384];
        loop {
            match self.s.read(&mut chunk) {
                Ok(0) => bail!("server closed the connection"),
                Ok(n) => {
                    self.buf.extend_from_slice(&chunk[..n]);
                    if complete(&self.buf).is_some() {
                        return Ok(&self.buf);
                    }
                    if self.buf.len() > 16 << 20 {
                        bail!("reply larger than 16 MiB without terminator");
                    }
                }
                // A blocking socket's read timeout is WouldBlock too.
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if t0.elapsed() > timeout {
                        bail!("no complete reply within {timeout:?}");
                    }
                    std::hint::spin_loop();
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e).context("reading the reply"),
            }
        }
    }
}

/// Unescape `\r`, `\n`, `\t`, `\\` in a request given on the command line.
pub fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut it = s.chars();
    while let Some(c) = it.next() {
        if c == '\\' {
            match it.next() {
                Some('r') => out.push('\r'),
                Some('n') => out.push('\n'),
                Some('t') => out.push('\t'),
                Some('\\') => out.push('\\'),
                Some(o) => {
                    out.push('\\');
                    out.push(o)
                }
                None => out.push('\\'),
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unescape_turns_command_line_escapes_into_bytes() {
        assert_eq!(unescape(r"get k\r\n"), "get k\r\n");
        assert_eq!(unescape(r"a\tb\\c\q\"), "a\tb\\c\\q\\");
    }

    #[test]
    fn sweep_removes_only_scratch_of_dead_processes() {
        let dir = tempfile::tempdir().unwrap();
        let mine = owned_scratch(dir.path(), "t-").unwrap();
        // No process has pid u32::MAX - 1 (pid_max is at most 2^22).
        let dead = dir.path().join(format!("t-{}-x", u32::MAX - 1));
        let other = dir.path().join("u-1-x");
        std::fs::create_dir(&dead).unwrap();
        std::fs::create_dir(&other).unwrap();
        sweep_scratch(dir.path(), "t-");
        assert!(mine.path().is_dir() && other.is_dir() && !dead.exists());
    }

    #[test]
    fn a_dropped_program_is_stopped_with_its_children() {
        let p = Program::spawn(Command::new("sh").args(["-c", "sleep 30 & wait"])).unwrap();
        let pid = p.pid();
        let t0 = Instant::now();
        while descendants(pid).is_empty() && t0.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(10));
        }
        let kids = descendants(pid);
        assert!(!kids.is_empty(), "sh started its sleeps");
        drop(p);
        assert!(
            kids.iter().all(|k| !alive(*k)),
            "children stopped: {kids:?}"
        );
        assert!(STARTED.lock().unwrap().iter().all(|p| *p != pid));
    }
}
