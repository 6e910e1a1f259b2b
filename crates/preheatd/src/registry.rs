//! Which local agent serves which port.
//!
//! Agents register implicitly: each has a control socket `<run-dir>/agent-<pid>.sock` and a
//! trigger socket `<run-dir>/agent-<pid>.trig`. A scan lists the control sockets, skips pids
//! that no longer exist, asks each live agent for `Status` and records the listening ports it
//! has served (a port with at least one busy period: the agent then knows which CPU serves it).
//! Static routes (`--route PORT=PID`) add ports an agent has not served yet. The result is a
//! [`Routes`] snapshot (port → trigger sockets) that the dispatcher reads without blocking.
//!
//! A scan never removes or creates files: sockets of dead processes are left where they are
//! (the agent of the next process removes them).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use preheat_model::proto::{
    control_socket_name, trigger_socket_name, PortStats, PreheatStats, Reply, Request,
};

use crate::log::{log, log_limited};
use crate::stats::Stats;
use crate::RescanSignal;

/// Longest `Status` reply read from an agent (a reply lists ports and counters: a few KiB).
const MAX_REPLY: u64 = 1 << 20;

/// The fields of an agent's `Status` reply that preheatd uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentStatus {
    pub pid: u32,
    pub enabled: bool,
    pub ports: Vec<PortStats>,
    pub preheat: PreheatStats,
}

impl AgentStatus {
    /// Listening ports this agent has served (at least one busy period).
    pub fn served_ports(&self) -> BTreeSet<u16> {
        self.ports
            .iter()
            .filter(|p| p.busy_periods > 0)
            .map(|p| p.port)
            .collect()
    }
}

/// Ask the agent of `pid` in `run_dir` for its status over its control socket (one JSON line
/// each way), waiting at most about `timeout` for each of connect-write-read.
pub fn query_status(run_dir: &Path, pid: u32, timeout: Duration) -> io::Result<AgentStatus> {
    let path = run_dir.join(control_socket_name(pid));
    let stream = UnixStream::connect(&path)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    let mut line = serde_json::to_string(&Request::Status).map_err(io::Error::other)?;
    line.push('\n');
    (&stream).write_all(line.as_bytes())?;
    let mut buf = String::new();
    let n = BufReader::new((&stream).take(MAX_REPLY)).read_line(&mut buf)?;
    if n == 0 || !buf.ends_with('\n') {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("agent of pid {pid} closed the control connection without a full reply"),
        ));
    }
    match serde_json::from_str::<Reply>(buf.trim_end()) {
        Ok(Reply::Status {
            pid: reply_pid,
            enabled,
            ports,
            preheat,
            ..
        }) => {
            if reply_pid != pid {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("control socket of pid {pid} answered for pid {reply_pid}"),
                ));
            }
            Ok(AgentStatus {
                pid,
                enabled,
                ports,
                preheat,
            })
        }
        Ok(other) => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("agent of pid {pid} answered status with {other:?}"),
        )),
        Err(e) => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("agent of pid {pid} sent an unreadable reply: {e}"),
        )),
    }
}

pub use preheat_rundir::{control_socket_pids, pid_alive};

/// A `--route PORT=PID` static route.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StaticRoute {
    pub port: u16,
    pub pid: u32,
}

impl std::str::FromStr for StaticRoute {
    type Err = String;
    fn from_str(s: &str) -> Result<StaticRoute, String> {
        let (port, pid) = s
            .split_once('=')
            .ok_or_else(|| format!("route '{s}' is not PORT=PID"))?;
        let port: u16 = port
            .trim()
            .parse()
            .map_err(|_| format!("route '{s}': '{port}' is not a port number"))?;
        let pid: u32 = pid
            .trim()
            .parse()
            .map_err(|_| format!("route '{s}': '{pid}' is not a pid"))?;
        if port == 0 || pid == 0 {
            return Err(format!("route '{s}': port and pid must not be 0"));
        }
        Ok(StaticRoute { port, pid })
    }
}

/// One registered agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Agent {
    pub pid: u32,
    pub trigger: PathBuf,
    /// Ports it has served (from its last answered `Status`).
    pub served: BTreeSet<u16>,
    /// Ports routed to it by `--route`.
    pub routed: BTreeSet<u16>,
}

impl Agent {
    pub fn ports(&self) -> BTreeSet<u16> {
        self.served.union(&self.routed).copied().collect()
    }
}

/// An agent's trigger socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub pid: u32,
    pub trigger: PathBuf,
}

/// Snapshot of the registry as the dispatcher sees it: port → trigger sockets.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Routes {
    by_port: HashMap<u16, Vec<Target>>,
    pids: Vec<u32>,
}

impl Routes {
    /// Trigger sockets of the agents serving `port` (empty: none).
    pub fn targets(&self, port: u16) -> &[Target] {
        self.by_port.get(&port).map_or(&[], Vec::as_slice)
    }
    /// Registered agents, sorted.
    pub fn pids(&self) -> &[u32] {
        &self.pids
    }
    /// Number of ports with at least one agent.
    pub fn ports(&self) -> usize {
        self.by_port.len()
    }
}

/// The published [`Routes`]: replaced whole by the registry thread, read by the dispatcher
/// (one short read lock and an `Arc` clone per announcement) and the metrics endpoint.
#[derive(Debug, Default)]
pub struct RouteTable(RwLock<Arc<Routes>>);

impl RouteTable {
    pub fn new() -> RouteTable {
        RouteTable::default()
    }
    pub fn get(&self) -> Arc<Routes> {
        self.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }
    pub fn set(&self, r: Routes) {
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(r);
    }
}

/// What changed in a scan (for logs and tests).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScanChanges {
    /// Newly registered agents with their ports.
    pub added: Vec<(u32, BTreeSet<u16>)>,
    /// Agents whose ports changed, with the new ports.
    pub changed: Vec<(u32, BTreeSet<u16>)>,
    /// Agents removed (process gone, control socket gone or refusing).
    pub removed: Vec<u32>,
    /// Agents that did not answer `Status` (kept as they were if already registered).
    pub errors: Vec<(u32, String)>,
}

impl ScanChanges {
    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.changed.is_empty() && self.removed.is_empty()
    }
}

/// The agent registry of one run directory.
#[derive(Debug)]
pub struct Registry {
    run_dir: PathBuf,
    static_routes: Vec<StaticRoute>,
    agents: BTreeMap<u32, Agent>,
    status_timeout: Duration,
}

impl Registry {
    pub fn new(run_dir: PathBuf, static_routes: Vec<StaticRoute>) -> Registry {
        Registry {
            run_dir,
            static_routes,
            agents: BTreeMap::new(),
            status_timeout: Duration::from_secs(1),
        }
    }

    /// How long to wait for one agent's `Status` (default 1 s).
    pub fn with_status_timeout(mut self, t: Duration) -> Registry {
        self.status_timeout = t;
        self
    }

    pub fn run_dir(&self) -> &Path {
        &self.run_dir
    }

    pub fn agents(&self) -> &BTreeMap<u32, Agent> {
        &self.agents
    }

    /// Rescan the run directory and the static routes' pids.
    pub fn scan(&mut self) -> ScanChanges {
        let mut ch = ScanChanges::default();
        let discovered: BTreeSet<u32> = control_socket_pids(&self.run_dir).into_iter().collect();
        let mut routed: BTreeMap<u32, BTreeSet<u16>> = BTreeMap::new();
        for r in &self.static_routes {
            routed.entry(r.pid).or_default().insert(r.port);
        }
        let candidates: BTreeSet<u32> = discovered
            .iter()
            .chain(routed.keys())
            .chain(self.agents.keys())
            .copied()
            .collect();
        for pid in candidates {
            let trigger = self.run_dir.join(trigger_socket_name(pid));
            let static_ports = routed.get(&pid).cloned().unwrap_or_default();
            let has_control = discovered.contains(&pid);
            let gone =
                !pid_alive(pid) || !has_control && (static_ports.is_empty() || !trigger.exists());
            if gone {
                if self.agents.remove(&pid).is_some() {
                    ch.removed.push(pid);
                }
                continue;
            }
            let served = if has_control {
                match query_status(&self.run_dir, pid, self.status_timeout) {
                    Ok(st) => Some(st.served_ports()),
                    Err(e) => {
                        let refused = matches!(
                            e.kind(),
                            io::ErrorKind::ConnectionRefused | io::ErrorKind::NotFound
                        );
                        ch.errors.push((pid, e.to_string()));
                        if refused && static_ports.is_empty() {
                            // A stale socket (dead or exiting process, or a pid reused by a
                            // process without an agent).
                            if self.agents.remove(&pid).is_some() {
                                ch.removed.push(pid);
                            }
                            continue;
                        }
                        None
                    }
                }
            } else {
                None
            };
            match self.agents.get_mut(&pid) {
                Some(a) => {
                    let before = a.ports();
                    if let Some(s) = served {
                        a.served = s;
                    }
                    a.routed = static_ports;
                    let after = a.ports();
                    if after != before {
                        ch.changed.push((pid, after));
                    }
                }
                None => {
                    // A new agent: only once it answered (or is routed statically).
                    if served.is_none() && static_ports.is_empty() {
                        continue;
                    }
                    let a = Agent {
                        pid,
                        trigger,
                        served: served.unwrap_or_default(),
                        routed: static_ports,
                    };
                    ch.added.push((pid, a.ports()));
                    self.agents.insert(pid, a);
                }
            }
        }
        ch
    }

    /// The current routes.
    pub fn routes(&self) -> Routes {
        let mut by_port: HashMap<u16, Vec<Target>> = HashMap::new();
        for a in self.agents.values() {
            for port in a.ports() {
                by_port.entry(port).or_default().push(Target {
                    pid: a.pid,
                    trigger: a.trigger.clone(),
                });
            }
        }
        Routes {
            by_port,
            pids: self.agents.keys().copied().collect(),
        }
    }
}

fn ports_list(p: &BTreeSet<u16>) -> String {
    if p.is_empty() {
        "no ports yet".into()
    } else {
        let v: Vec<String> = p.iter().map(u16::to_string).collect();
        format!(
            "port{} {}",
            if p.len() == 1 { "" } else { "s" },
            v.join(", ")
        )
    }
}

/// Log the notable parts of a scan.
pub fn log_changes(ch: &ScanChanges) {
    for (pid, ports) in &ch.added {
        log_limited("agent-added", || {
            format!("agent of pid {pid} registered: {}", ports_list(ports))
        });
    }
    for (pid, ports) in &ch.changed {
        log_limited("agent-changed", || {
            format!("agent of pid {pid} now serves {}", ports_list(ports))
        });
    }
    for pid in &ch.removed {
        log_limited("agent-removed", || format!("agent of pid {pid} is gone"));
    }
    for (pid, e) in &ch.errors {
        log_limited("agent-status", || {
            format!("agent of pid {pid} did not answer status: {e}")
        });
    }
}

/// Minimum time between two scans requested by the dispatcher (so a flood of announcements
/// for an unknown port cannot keep the agents' control threads busy).
pub const MIN_RESCAN_GAP: Duration = Duration::from_millis(50);

/// Body of the registry thread: scan every `interval` and on request, publish the routes and
/// the agent count, until `shutdown`.
pub fn run_scanner(
    mut registry: Registry,
    table: Arc<RouteTable>,
    stats: Arc<Stats>,
    rescan: Arc<RescanSignal>,
    interval: Duration,
    shutdown: Arc<AtomicBool>,
) {
    let mut dir_missing_logged = false;
    loop {
        if !registry.run_dir.is_dir() {
            if !dir_missing_logged {
                dir_missing_logged = true;
                log(&format!(
                    "run directory {} does not exist (yet): no agents",
                    registry.run_dir.display()
                ));
            }
        } else {
            dir_missing_logged = false;
        }
        let ch = registry.scan();
        log_changes(&ch);
        let routes = registry.routes();
        let (agents, ports) = (routes.pids().len() as u64, routes.ports() as u64);
        table.set(routes);
        stats.set_registry(agents, ports);
        stats.scans.fetch_add(1, Ordering::Relaxed);
        let scanned = Instant::now();
        loop {
            if shutdown.load(Ordering::Relaxed) {
                return;
            }
            let left = interval.saturating_sub(scanned.elapsed());
            if left.is_zero() {
                break;
            }
            // Wake at least every 100 ms to notice shutdown.
            if rescan.wait(left.min(Duration::from_millis(100))) {
                let since = scanned.elapsed();
                if since < MIN_RESCAN_GAP {
                    std::thread::sleep(MIN_RESCAN_GAP - since);
                }
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn static_route_parse() {
        assert_eq!(
            "11211=42".parse::<StaticRoute>(),
            Ok(StaticRoute {
                port: 11211,
                pid: 42
            })
        );
        for bad in ["", "11211", "x=1", "1=x", "0=5", "5=0", "70000=1", "1=-3"] {
            assert!(bad.parse::<StaticRoute>().is_err(), "{bad}");
        }
    }

    #[test]
    fn missing_run_dir_has_no_agents() {
        let d = tempfile::tempdir().unwrap();
        let mut r = Registry::new(d.path().join("nope"), Vec::new());
        let ch = r.scan();
        assert!(ch.is_empty());
        assert!(r.routes().pids().is_empty());
    }

    #[test]
    fn stale_and_foreign_files_are_ignored_and_left_alone() {
        let d = tempfile::tempdir().unwrap();
        // A socket file name of a pid that does not exist (pid_max is at most 2^22), a
        // non-agent file, and a control "socket" of a live process that is no agent (us: a
        // plain file, so connecting fails).
        let dead = d.path().join(control_socket_name(4_194_305));
        std::fs::write(&dead, b"").unwrap();
        std::fs::write(d.path().join("agent-x.sock"), b"").unwrap();
        let me = std::process::id();
        std::fs::write(d.path().join(control_socket_name(me)), b"").unwrap();
        let mut r = Registry::new(d.path().to_path_buf(), Vec::new())
            .with_status_timeout(Duration::from_millis(200));
        let ch = r.scan();
        assert!(ch.added.is_empty(), "{ch:?}");
        assert_eq!(ch.errors.len(), 1, "{ch:?}");
        assert!(r.agents().is_empty());
        assert!(dead.exists(), "a scan must not remove files");
    }

    #[test]
    fn static_route_to_live_pid_without_agent_socket_needs_trigger_socket() {
        let d = tempfile::tempdir().unwrap();
        let me = std::process::id();
        let routes = vec![StaticRoute { port: 9, pid: me }];
        let mut r = Registry::new(d.path().to_path_buf(), routes.clone());
        assert!(
            r.scan().added.is_empty(),
            "no trigger socket: not registered"
        );
        // With a trigger socket (any file: the dispatcher's send will tell).
        let _sock =
            std::os::unix::net::UnixDatagram::bind(d.path().join(trigger_socket_name(me))).unwrap();
        let ch = r.scan();
        assert_eq!(ch.added, vec![(me, BTreeSet::from([9]))]);
        let routes = r.routes();
        assert_eq!(routes.targets(9).len(), 1);
        assert_eq!(routes.targets(9)[0].pid, me);
        assert!(routes.targets(10).is_empty());
        assert_eq!(routes.pids(), &[me]);
        // Dead pid in a static route: never registered.
        let mut r = Registry::new(
            d.path().to_path_buf(),
            vec![StaticRoute {
                port: 9,
                pid: 4_194_305,
            }],
        );
        assert!(r.scan().added.is_empty());
    }
}
