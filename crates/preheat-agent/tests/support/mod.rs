//! Test support: locate (or build) the agent and the bundled server, start servers with the
//! agent attached, talk to agents, and speak memcached and HTTP as a client. Every wait is
//! bounded in time.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::{UnixDatagram, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use preheat_agent::socket_paths;
use preheat_model::proto::{
    Announcement, LoadedClass, PortStats, PreheatStats, Reply, Request, Strategies,
};

pub const IO_TIMEOUT: Duration = Duration::from_secs(10);
/// Agent settings a test must not inherit from the caller's environment.
pub const AGENT_ENV: [&str; 4] = [
    "PREHEAT_AGENT_ONLY",
    "PREHEAT_AGENT_DISABLE",
    "PREHEAT_PROFILE",
    "PREHEAT_AGENT_LOG",
];
/// Lead of test announcements: long enough that a loaded machine (tests run in parallel on
/// two CPUs) still delivers them, and lets the SCHED_IDLE workers run, before the announced
/// arrival. Tests wait for counters, never for the arrival; a `wake` spin is capped at 1 ms
/// whatever the lead.
pub const LEAD_NS: u64 = 2_000_000_000;

pub struct Artifacts {
    pub agent_so: PathBuf,
    pub kv_bin: PathBuf,
}

/// The built agent and preheat-kv (`target/debug`), built once per test binary with
/// `cargo build -p preheat-kv -p preheat-agent` (a no-op when they are up to date).
pub fn artifacts() -> &'static Artifacts {
    static A: OnceLock<Artifacts> = OnceLock::new();
    A.get_or_init(|| {
        let dir = preheat_testsupport::debug_dir();
        let st = preheat_testsupport::cargo_build(&["preheat-kv", "preheat-agent"]).status();
        let a = Artifacts {
            agent_so: dir.join("libpreheat_agent.so"),
            kv_bin: dir.join("preheat-kv"),
        };
        match st {
            Ok(s) if s.success() => {}
            other => {
                if !(a.agent_so.exists() && a.kv_bin.exists()) {
                    panic!(
                        "building preheat-kv and preheat-agent failed ({other:?}); build the workspace first (cargo build --workspace)"
                    );
                }
                eprintln!("warning: cargo build failed ({other:?}); using the existing artifacts");
            }
        }
        assert!(a.agent_so.exists(), "{} missing after build", a.agent_so.display());
        assert!(a.kv_bin.exists(), "{} missing after build", a.kv_bin.display());
        a
    })
}

/// Poll `f` every 10 ms until it returns true or `timeout` passes.
/// Every agent log in `run_dir`, each under its path (for a failure's message).
pub fn agent_logs(run_dir: &Path) -> String {
    std::fs::read_dir(run_dir)
        .map(|rd| {
            rd.flatten()
                .filter(|e| e.file_name().to_string_lossy().ends_with(".log"))
                .map(|e| {
                    format!(
                        "--- {}\n{}",
                        e.path().display(),
                        std::fs::read_to_string(e.path()).unwrap_or_default()
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

pub use preheat_testsupport::eventually as wait_until;

#[allow(unused_imports)] // not every test file that includes this module needs a port
pub use preheat_testsupport::free_port;

#[allow(unused_imports)] // not every test file that includes this module looks for programs
pub use preheat_testsupport::find_program;

/// A server process started with the agent; stopped (SIGTERM, then SIGKILL) on drop.
pub struct Server {
    pub name: String,
    pub child: Child,
    pub port: u16,
    pub dir: tempfile::TempDir,
    pub run_dir: PathBuf,
    pub log: PathBuf,
}

fn signal(pid: u32, sig: libc::c_int) {
    // SAFETY: kill(2) has no memory-safety preconditions; the pid is our own child.
    unsafe {
        libc::kill(pid as libc::pid_t, sig);
    }
}

impl Server {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn log_tail(&self) -> String {
        let s = std::fs::read_to_string(&self.log).unwrap_or_default();
        let agent_logs = agent_logs(&self.run_dir);
        let tail: String = s
            .lines()
            .rev()
            .take(40)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect::<Vec<_>>()
            .join("\n");
        format!("{} log:\n{tail}\nagent logs:\n{agent_logs}", self.name)
    }

    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    pub fn agent(&self) -> AgentClient {
        self.agent_of(self.pid())
    }

    pub fn agent_of(&self, pid: u32) -> AgentClient {
        let path = socket_paths(&self.run_dir, pid).control;
        assert!(
            wait_until(Duration::from_secs(10), || path.exists()),
            "no agent socket {} appeared\n{}",
            path.display(),
            self.log_tail()
        );
        AgentClient::connect(&path).unwrap_or_else(|e| {
            panic!("connecting to {}: {e}\n{}", path.display(), self.log_tail())
        })
    }

    /// Send raw bytes to the agent's announcement socket of `pid`.
    pub fn announce_raw(&self, pid: u32, bytes: &[u8]) {
        let path = socket_paths(&self.run_dir, pid).trigger;
        let s = UnixDatagram::unbound().unwrap();
        s.send_to(bytes, &path)
            .unwrap_or_else(|e| panic!("sending to {}: {e}", path.display()));
    }

    pub fn announce(&self, pid: u32, strategies: Strategies, lead_ns: u64, seq: u64) {
        let now = preheat_engine::time::now_ns();
        let a = Announcement {
            strategies,
            port: self.port,
            seq,
            arrival_ns: now + lead_ns,
            sent_ns: now,
            budget_ns: 0,
        };
        self.announce_raw(pid, &a.encode());
    }

    /// Stop the server: SIGTERM, wait up to 5 s, then SIGKILL.
    pub fn stop(&mut self) {
        if !self.alive() {
            return;
        }
        signal(self.pid(), libc::SIGTERM);
        if !wait_until(Duration::from_secs(5), || {
            matches!(self.child.try_wait(), Ok(Some(_)))
        }) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Start `cmd` with the agent attached; `port` is filled in by `ready` (which waits until the
/// server is ready and returns its port).
pub fn start_with_agent(
    name: &str,
    mut cmd: Command,
    dir: tempfile::TempDir,
    env: &[(&str, &str)],
    ready: impl FnOnce(&Path, &mut Child) -> Result<u16, String>,
) -> Server {
    let a = artifacts();
    let run_dir = dir.path().join("run");
    let log = dir.path().join(format!("{name}.log"));
    let logf = std::fs::File::create(&log).unwrap();
    cmd.stdin(Stdio::null())
        .stdout(logf.try_clone().unwrap())
        .stderr(logf)
        .env("LD_PRELOAD", &a.agent_so)
        .env("PREHEAT_RUN_DIR", &run_dir);
    for k in AGENT_ENV {
        cmd.env_remove(k);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {name}: {e}"));
    let port = match ready(dir.path(), &mut child) {
        Ok(p) => p,
        Err(e) => {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{name} did not become ready: {e}\nlog:\n{}\nagent logs in {}",
                std::fs::read_to_string(&log).unwrap_or_default(),
                run_dir.display()
            );
        }
    };
    Server {
        name: name.into(),
        child,
        port,
        dir,
        run_dir,
        log,
    }
}

/// Start preheat-kv (`--port 0`, preloaded items) with the agent and `env`.
pub fn start_kv(env: &[(&str, &str)]) -> Server {
    start_kv_in(tempfile::tempdir().unwrap(), env)
}

/// As [`start_kv`], in `dir` (the run directory is `dir/run`).
pub fn start_kv_in(dir: tempfile::TempDir, env: &[(&str, &str)]) -> Server {
    let a = artifacts();
    let ready = dir.path().join("ready");
    let mut cmd = Command::new(&a.kv_bin);
    cmd.args([
        "--port",
        "0",
        "--items",
        "100",
        "--value-size",
        "64",
        "--quiet",
    ])
    .arg("--ready-file")
    .arg(&ready);
    start_with_agent("preheat-kv", cmd, dir, env, |_, child| {
        port_from_ready_file(&ready, child)
    })
}

/// The port a test server wrote to its ready file as `ready PORT` (waiting up to 20 s, or until
/// the server exits).
pub fn port_from_ready_file(ready: &Path, child: &mut std::process::Child) -> Result<u16, String> {
    match ready_fields(ready, child)?.as_slice() {
        [port] if *port <= u16::MAX as u64 => Ok(*port as u16),
        other => Err(format!("{}: not `ready PORT`: {other:?}", ready.display())),
    }
}

/// The numbers a test server wrote to its ready file after `ready ` (waiting up to 20 s, or
/// until the server exits).
pub fn ready_fields(ready: &Path, child: &mut std::process::Child) -> Result<Vec<u64>, String> {
    let mut fields = None;
    wait_until(Duration::from_secs(20), || {
        if let Ok(s) = std::fs::read_to_string(ready) {
            fields = s
                .strip_prefix("ready ")
                .filter(|r| r.ends_with('\n'))
                .and_then(|r| {
                    r.split_whitespace()
                        .map(|f| f.parse::<u64>().ok())
                        .collect()
                });
        }
        fields.is_some() || !matches!(child.try_wait(), Ok(None))
    });
    fields.ok_or_else(|| format!("no ready file {}", ready.display()))
}

/// Compile the test program `tests/<rel>.c` into `dir` with the system C compiler, or None
/// (skip reported) when there is none.
pub fn compile_c(rel: &str, dir: &Path) -> Option<PathBuf> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/{rel}.c"));
    preheat_testsupport::compile_c(&src, dir)
}

#[allow(unused_imports)] // not every test binary that includes this module starts a server
pub use preheat_testsupport::wait_port;

// ---------------------------------------------------------------------- agent client

pub struct AgentClient {
    stream: BufReader<UnixStream>,
}

/// The fields of `Reply::Status`.
#[derive(Debug, Clone)]
pub struct StatusView {
    pub pid: u32,
    pub exe: String,
    pub enabled: bool,
    pub disabled_reason: Option<String>,
    pub threads_seen: u32,
    pub ports: Vec<PortStats>,
    pub preheat: PreheatStats,
    pub profile: Option<String>,
    pub classes: Vec<LoadedClass>,
}

impl StatusView {
    pub fn port(&self, port: u16) -> Option<&PortStats> {
        self.ports.iter().find(|p| p.port == port)
    }
    pub fn busy_periods(&self, port: u16) -> u64 {
        self.port(port).map_or(0, |p| p.busy_periods)
    }
}

impl AgentClient {
    pub fn connect(path: &Path) -> std::io::Result<AgentClient> {
        let s = UnixStream::connect(path)?;
        s.set_read_timeout(Some(Duration::from_secs(30)))?;
        s.set_write_timeout(Some(IO_TIMEOUT))?;
        Ok(AgentClient {
            stream: BufReader::new(s),
        })
    }

    pub fn call(&mut self, req: &Request) -> Reply {
        self.call_raw(&serde_json::to_string(req).unwrap())
    }

    /// As [`AgentClient::call`], but a closed connection (the process died) is an error
    /// instead of a panic, so the caller can say why.
    pub fn try_call(&mut self, req: &Request) -> Result<Reply, String> {
        let mut l = serde_json::to_string(req).map_err(|e| e.to_string())?;
        l.push('\n');
        self.stream
            .get_mut()
            .write_all(l.as_bytes())
            .map_err(|e| format!("writing to the agent: {e}"))?;
        let mut buf = String::new();
        match self.stream.read_line(&mut buf) {
            Ok(0) => Err("the agent closed the control connection".into()),
            Ok(_) => serde_json::from_str(buf.trim_end())
                .map_err(|e| format!("unreadable reply {buf:?}: {e}")),
            Err(e) => Err(format!("reading from the agent: {e}")),
        }
    }

    /// [`AgentClient::call`] passing the descriptor `fd` along (`SCM_RIGHTS`).
    pub fn call_with_fd(&mut self, req: &Request, fd: std::os::fd::RawFd) -> Reply {
        use std::os::fd::AsRawFd;
        let mut l = serde_json::to_string(req).unwrap();
        l.push('\n');
        let sock = self.stream.get_ref().as_raw_fd();
        preheat_engine::fdpass::send_with_fd(sock, l.as_bytes(), fd).unwrap();
        self.read_reply()
    }

    pub fn call_raw(&mut self, line: &str) -> Reply {
        let mut l = line.to_string();
        l.push('\n');
        self.stream.get_mut().write_all(l.as_bytes()).unwrap();
        self.read_reply()
    }

    fn read_reply(&mut self) -> Reply {
        let mut buf = String::new();
        let n = self.stream.read_line(&mut buf).unwrap();
        assert!(n > 0, "agent closed the control connection");
        serde_json::from_str(buf.trim_end())
            .unwrap_or_else(|e| panic!("unreadable reply {buf:?}: {e}"))
    }

    pub fn status(&mut self) -> StatusView {
        match self.call(&Request::Status) {
            Reply::Status {
                pid,
                exe,
                enabled,
                disabled_reason,
                threads_seen,
                ports,
                preheat,
                profile,
                classes,
            } => StatusView {
                pid,
                exe,
                enabled,
                disabled_reason,
                threads_seen,
                ports,
                preheat,
                profile,
                classes,
            },
            other => panic!("status: unexpected reply {other:?}"),
        }
    }

    pub fn ok(&mut self, req: &Request) {
        match self.call(req) {
            Reply::Ok => {}
            other => panic!("{req:?}: expected ok, got {other:?}"),
        }
    }

    pub fn error(&mut self, req: &Request) -> String {
        match self.call(req) {
            Reply::Error { message } => message,
            other => panic!("{req:?}: expected an error, got {other:?}"),
        }
    }

    /// Poll Status until `f` holds (at most `timeout`); returns the last status.
    pub fn wait_status(
        &mut self,
        timeout: Duration,
        mut f: impl FnMut(&StatusView) -> bool,
    ) -> (bool, StatusView) {
        let t0 = Instant::now();
        loop {
            let s = self.status();
            if f(&s) {
                return (true, s);
            }
            if t0.elapsed() >= timeout {
                return (false, s);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

// ---------------------------------------------------------------------- memcached client

/// A client connection to `127.0.0.1:port` with the test I/O timeouts and no Nagle delay,
/// buffered for reading replies.
fn client_stream(port: u16) -> BufReader<TcpStream> {
    let s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    s.set_write_timeout(Some(IO_TIMEOUT)).unwrap();
    s.set_nodelay(true).unwrap();
    BufReader::new(s)
}

pub struct Mc {
    r: BufReader<TcpStream>,
}

impl Mc {
    pub fn connect(port: u16) -> Mc {
        Mc {
            r: client_stream(port),
        }
    }

    fn line(&mut self) -> String {
        let mut l = String::new();
        self.r.read_line(&mut l).expect("reading a reply line");
        l
    }

    pub fn set(&mut self, key: &str, value: &[u8]) -> Result<(), String> {
        let mut req = format!("set {key} 0 0 {}\r\n", value.len()).into_bytes();
        req.extend_from_slice(value);
        req.extend_from_slice(b"\r\n");
        self.r
            .get_mut()
            .write_all(&req)
            .map_err(|e| e.to_string())?;
        let l = self.line();
        if l == "STORED\r\n" {
            Ok(())
        } else {
            Err(format!("set {key}: got {l:?}"))
        }
    }

    /// `Ok(None)` for a miss.
    pub fn get(&mut self, key: &str) -> Result<Option<Vec<u8>>, String> {
        self.r
            .get_mut()
            .write_all(format!("get {key}\r\n").as_bytes())
            .map_err(|e| e.to_string())?;
        let l = self.line();
        if l == "END\r\n" {
            return Ok(None);
        }
        let parts: Vec<&str> = l.trim_end().split(' ').collect();
        if parts.len() < 4 || parts[0] != "VALUE" || parts[1] != key {
            return Err(format!("get {key}: got {l:?}"));
        }
        let n: usize = parts[3]
            .parse()
            .map_err(|_| format!("bad length in {l:?}"))?;
        let mut data = vec![0u8; n + 2];
        self.r.read_exact(&mut data).map_err(|e| e.to_string())?;
        if &data[n..] != b"\r\n" {
            return Err(format!("get {key}: value not terminated by CRLF"));
        }
        data.truncate(n);
        let end = self.line();
        if end != "END\r\n" {
            return Err(format!("get {key}: expected END, got {end:?}"));
        }
        Ok(Some(data))
    }
}

/// Preloaded items: (count, expected value of `key:i`).
pub type Preloaded = (usize, fn(usize) -> Vec<u8>);

/// `threads` client threads × `ops` mixed set/get operations on distinct keys per thread, every
/// response verified. `preloaded(i)` gives the expected value of `key:i` (if the server has
/// preloaded items). Returns the number of verified operations.
pub fn mixed_load(port: u16, threads: usize, ops: usize, preloaded: Option<Preloaded>) -> usize {
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            std::thread::spawn(move || -> Result<usize, String> {
                let mut mc = Mc::connect(port);
                let mut mine: Vec<Option<Vec<u8>>> = vec![None; 16];
                let mut done = 0;
                for i in 0..ops {
                    let k = (i * 7 + t) % mine.len();
                    let key = format!("t{t}:k{k}");
                    match i % 4 {
                        0 | 2 => {
                            let v = format!("value-{t}-{i}-{}", "x".repeat(i % 50)).into_bytes();
                            mc.set(&key, &v)?;
                            mine[k] = Some(v);
                        }
                        1 => {
                            let got = mc.get(&key)?;
                            if got != mine[k] {
                                return Err(format!("get {key}: {got:?} != {:?}", mine[k]));
                            }
                        }
                        _ => match preloaded {
                            Some((n, f)) => {
                                let idx = (i + t) % n;
                                let got = mc.get(&format!("key:{idx}"))?;
                                if got.as_deref() != Some(&f(idx)[..]) {
                                    return Err(format!("get key:{idx}: wrong value {got:?}"));
                                }
                            }
                            None => {
                                let got = mc.get(&format!("absent:{t}:{i}"))?;
                                if got.is_some() {
                                    return Err("absent key found".into());
                                }
                            }
                        },
                    }
                    done += 1;
                }
                Ok(done)
            })
        })
        .collect();
    let mut total = 0;
    for h in handles {
        match h.join() {
            Ok(Ok(n)) => total += n,
            Ok(Err(e)) => panic!("client error: {e}"),
            Err(_) => panic!("client thread panicked"),
        }
    }
    total
}

/// Value of preloaded `key:i` in preheat-kv with `--value-size 64`: byte j = 'a' + (i+j) % 26.
pub fn kv_value(i: usize) -> Vec<u8> {
    (0..64).map(|j| b'a' + ((i + j) % 26) as u8).collect()
}

// ---------------------------------------------------------------------- HTTP client

pub struct Http {
    r: BufReader<TcpStream>,
}

impl Http {
    pub fn connect(port: u16) -> Http {
        Http {
            r: client_stream(port),
        }
    }

    /// Keep-alive GET; returns (status, body).
    pub fn get(&mut self, path: &str) -> Result<(u32, Vec<u8>), String> {
        self.r
            .get_mut()
            .write_all(format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n").as_bytes())
            .map_err(|e| e.to_string())?;
        let mut status_line = String::new();
        self.r
            .read_line(&mut status_line)
            .map_err(|e| e.to_string())?;
        let status: u32 = status_line
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| format!("bad status line {status_line:?}"))?;
        let mut len = None;
        loop {
            let mut h = String::new();
            self.r.read_line(&mut h).map_err(|e| e.to_string())?;
            if h == "\r\n" || h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                if k.eq_ignore_ascii_case("content-length") {
                    len = v.trim().parse::<usize>().ok();
                }
            }
        }
        let len = len.ok_or("no Content-Length")?;
        let mut body = vec![0u8; len];
        self.r.read_exact(&mut body).map_err(|e| e.to_string())?;
        Ok((status, body))
    }
}

/// Pids whose parent is `ppid` (from /proc/*/stat).
pub fn children_of(ppid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in rd.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if preheat_engine::procstat::read_pid_stat(pid).is_some_and(|s| s.ppid == ppid) {
            out.push(pid);
        }
    }
    out.sort_unstable();
    out
}
