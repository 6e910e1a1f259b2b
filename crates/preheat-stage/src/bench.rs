//! `preheat stage bench`: the paper's staged-bursts experiment on one machine.
//!
//! An open-loop Poisson client (memcached `get key:N`, N uniform below `--keys`) runs against
//! (a) the backend directly and (b) through an in-process [`Stage`], for the same duration and
//! rate; rounds alternate the order. Latency is measured from each request's *intended* send
//! time to its full response (no coordinated omission) into an HdrHistogram; the cpuidle
//! counters are read around each measured window ([`preheat_power::residency`]).
//!
//! Placement: with two or more CPUs and pinning on, a backend we start runs on the last CPU
//! (`taskset`) and the client and proxy threads on CPU 0, so the backend CPU's residency shows
//! what staging does to the server's sleep. A backend we start is stopped on every exit path
//! (and, through `setpriv --pdeathsig`, even if this process dies).

use std::collections::VecDeque;
use std::ffi::OsString;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use hdrhistogram::Histogram;
use serde::Serialize;

use crate::cpu_use::{self, CpuUse};
use crate::framing::{memcached_response_len, Protocol};
use crate::proxy::{Stage, StageConfig, StageCounters};
use crate::BenchArgs;
use preheat_power::residency::{Residency, ResidencyDiff, Snapshot};

/// A quantile with its order-statistic 95% confidence interval (µs). A bound is `None` when the
/// sample is too small to bracket the quantile on that side.
#[derive(Debug, Clone, Serialize)]
pub struct Quantile {
    pub value_us: u64,
    pub ci95_lo_us: Option<u64>,
    pub ci95_hi_us: Option<u64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct LatencyReport {
    pub kind: &'static str,
    /// Completed requests measured (the sample count of every figure here).
    pub samples: u64,
    pub p50: Quantile,
    pub p99: Quantile,
    pub p999: Quantile,
    pub mean_us: f64,
    pub max_us: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct OverBound {
    pub kind: &'static str,
    /// Completed later than the bound after their intended send time, plus never answered.
    pub count: u64,
    /// Requests sent (the sample count).
    pub samples: u64,
    pub share: f64,
}

/// The proxy's view of a mode, summed over rounds.
#[derive(Debug, Clone, Serialize)]
pub struct StageSummary {
    pub kind: &'static str,
    pub bursts: u64,
    pub bursts_per_s: f64,
    pub bursts_early: u64,
    pub bursts_periodic: u64,
    pub bursts_final: u64,
    pub burst_max_requests: u64,
    pub requests_released: u64,
    pub held_mean_us: f64,
    pub held_max_us: u64,
    /// Learned backend response time at the end of the last round.
    pub service_ewma_us: f64,
    pub guard_us: f64,
    pub requests_failed: u64,
    pub backend_failures: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct ModeReport {
    pub mode: &'static str,
    pub rounds: u32,
    pub sent: u64,
    pub completed: u64,
    pub hits: u64,
    pub misses: u64,
    /// Error replies (`SERVER_ERROR`, `ERROR`, ...).
    pub errors: u64,
    /// Responses for another key than requested (must be 0).
    pub mismatched: u64,
    pub unanswered: u64,
    pub send_errors: u64,
    pub achieved_rate_per_s: f64,
    /// How late the client sent relative to the Poisson schedule (included in the latency).
    pub send_lag_mean_us: f64,
    pub send_lag_max_us: u64,
    pub latency: LatencyReport,
    pub over_bound: OverBound,
    pub stage: Option<StageSummary>,
    pub residency: Option<Residency>,
    pub residency_unavailable: Option<String>,
    /// CPU time of this benchmark (and the backend it started) vs other processes over the
    /// measured windows: residency is machine-wide, so a large `others_share` means other
    /// tenants shaped it.
    pub cpu_use: Option<CpuUse>,
    /// Wakeups of the backend process we started (voluntary context switches of all its
    /// threads), attributable to it alone; `None` for a backend we did not start.
    pub backend_wakeups: Option<u64>,
    pub backend_wakeups_per_s: Option<f64>,
    /// Each round's window on its own (spread between rounds = drift of the machine).
    pub per_round: Vec<RoundSummary>,
}

/// One measured window.
#[derive(Debug, Clone, Serialize)]
pub struct RoundSummary {
    pub round: u32,
    pub samples: u64,
    pub p999_us: u64,
    /// This round's window alone (the one residency shape, measured).
    pub residency: Option<Residency>,
    pub backend_wakeups_per_s: Option<f64>,
    pub quiet_gate_met: bool,
    pub own_cpu_share: Option<f64>,
    pub others_cpu_share: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    pub kind: &'static str,
    pub protocol: Protocol,
    pub backend: String,
    pub placement: String,
    pub rate_per_s: f64,
    pub duration_s: f64,
    pub rounds: u32,
    pub connections: usize,
    pub period_ms: u64,
    pub bound_ms: u64,
    pub margin_ms: u64,
    pub modes: Vec<ModeReport>,
    pub notes: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Direct,
    Staged,
    /// No load at all: what the machine's residency is without us (others included).
    Idle,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Direct => "direct",
            Mode::Staged => "staged",
            Mode::Idle => "idle (no load)",
        }
    }
}

/// Small deterministic PRNG (SplitMix64) for the Poisson schedule and keys.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in (0, 1].
    fn unit(&mut self) -> f64 {
        ((self.next() >> 11) as f64 + 1.0) / (1u64 << 53) as f64
    }

    fn exp(&mut self, rate: f64) -> Duration {
        Duration::from_secs_f64(-self.unit().ln() / rate)
    }
}

/// A backend process we started; stopped on drop.
struct BackendProc {
    child: Child,
    ready_file: Option<PathBuf>,
}

impl Drop for BackendProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(f) = &self.ready_file {
            let _ = std::fs::remove_file(f);
        }
    }
}

fn on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    })
}

/// The bundled server: `PREHEAT_KV_BIN`, or next to this executable (`target/<profile>/`, also
/// from `target/<profile>/deps/`), built with cargo from this checkout when missing.
pub fn kv_binary() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("PREHEAT_KV_BIN") {
        let p = PathBuf::from(p);
        if !p.is_file() {
            bail!("PREHEAT_KV_BIN={} does not exist", p.display());
        }
        return Ok(p);
    }
    let exe = std::env::current_exe().context("cannot find the running executable")?;
    let dir = exe.parent().unwrap_or(Path::new(".")).to_path_buf();
    let candidates = [dir.join("preheat-kv"), dir.join("../preheat-kv")];
    if let Some(p) = candidates.iter().find(|p| p.is_file()) {
        return Ok(p.clone());
    }
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../Cargo.toml");
    if !manifest.is_file() {
        bail!(
            "the bundled server preheat-kv is not next to {} and no source checkout is available; set PREHEAT_KV_BIN",
            exe.display()
        );
    }
    let release = dir.ends_with("release") || dir.parent().is_some_and(|p| p.ends_with("release"));
    let profile = if release { "release" } else { "dev" };
    eprintln!("preheat stage: building the bundled server (cargo build --profile {profile} -p preheat-kv) ...");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let st = Command::new(cargo)
        .args(["build", "--quiet", "--profile", profile, "-p", "preheat-kv"])
        .arg("--manifest-path")
        .arg(&manifest)
        .status()
        .context("running cargo to build preheat-kv")?;
    if !st.success() {
        bail!("building preheat-kv failed ({st})");
    }
    candidates
        .iter()
        .find(|p| p.is_file())
        .cloned()
        .with_context(|| format!("preheat-kv still missing next to {}", exe.display()))
}

/// Wraps a command so it dies with us (`setpriv --pdeathsig KILL`) and runs on `cpu`.
fn wrapped(program: OsString, args: Vec<OsString>, cpu: Option<usize>) -> Command {
    let mut argv: Vec<OsString> = Vec::new();
    if on_path("setpriv").is_some() {
        argv.extend(["setpriv", "--pdeathsig", "KILL"].map(OsString::from));
    }
    if let Some(cpu) = cpu {
        argv.extend([
            OsString::from("taskset"),
            "-c".into(),
            cpu.to_string().into(),
        ]);
    }
    argv.push(program);
    argv.extend(args);
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    cmd
}

fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn resolve(text: &str) -> Result<SocketAddr> {
    text.to_socket_addrs()
        .with_context(|| format!("resolving {text}"))?
        .next()
        .with_context(|| format!("{text}: no address"))
}

fn wait_connectable(addr: SocketAddr, child: &mut Child, stop: &AtomicBool) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return Ok(());
        }
        if let Some(st) = child.try_wait()? {
            bail!("the backend exited before accepting connections ({st})");
        }
        if Instant::now() > deadline || stop.load(Ordering::SeqCst) {
            bail!("the backend did not accept connections on {addr} within 10 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Starts the bundled preheat-kv on a free port (reported through its ready file).
fn start_kv(cpu: Option<usize>, stop: &AtomicBool) -> Result<(BackendProc, SocketAddr)> {
    let bin = kv_binary()?;
    let ready = std::env::temp_dir().join(format!(
        "preheat-stage-kv-{}-{}.ready",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    ));
    let args: Vec<OsString> = vec![
        "--port".into(),
        "0".into(),
        "--quiet".into(),
        "--ready-file".into(),
        ready.clone().into(),
    ];
    let child = wrapped(bin.clone().into(), args, cpu)
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    let mut proc = BackendProc {
        child,
        ready_file: Some(ready.clone()),
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(text) = std::fs::read_to_string(&ready) {
            if let Some(port) = text
                .strip_prefix("ready ")
                .and_then(|p| p.trim().parse::<u16>().ok())
            {
                return Ok((proc, SocketAddr::from(([127, 0, 0, 1], port))));
            }
        }
        if let Some(st) = proc.child.try_wait()? {
            bail!("preheat-kv exited at start ({st})");
        }
        if Instant::now() > deadline || stop.load(Ordering::SeqCst) {
            bail!("preheat-kv did not become ready within 10 s");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Starts `--backend-cmd` through `sh -c 'exec ...'`, `{port}` replaced by a free port.
fn start_cmd(
    cmd: &str,
    backend: Option<&str>,
    cpu: Option<usize>,
    stop: &AtomicBool,
) -> Result<(BackendProc, SocketAddr)> {
    let (cmd, addr) = if cmd.contains("{port}") {
        let port = free_port()?;
        let addr = match backend {
            Some(b) => resolve(b)?,
            None => SocketAddr::from(([127, 0, 0, 1], port)),
        };
        (cmd.replace("{port}", &port.to_string()), addr)
    } else {
        let Some(b) = backend else {
            bail!("--backend-cmd needs a {{port}} placeholder or --backend ADDR to say where the backend listens");
        };
        (cmd.to_string(), resolve(b)?)
    };
    let child = wrapped(
        "sh".into(),
        vec!["-c".into(), format!("exec {cmd}").into()],
        cpu,
    )
    .spawn()
    .with_context(|| format!("starting backend command {cmd:?}"))?;
    let mut proc = BackendProc {
        child,
        ready_file: None,
    };
    wait_connectable(addr, &mut proc.child, stop)?;
    Ok((proc, addr))
}

struct Pending {
    intended: Instant,
    key: u32,
    record: bool,
}

#[derive(Default)]
struct Outstanding {
    n: u64,
}

struct ConnTrack {
    queue: Mutex<VecDeque<Pending>>,
}

struct ReaderResult {
    hist: Histogram<u64>,
    completed: u64,
    hits: u64,
    misses: u64,
    errors: u64,
    mismatched: u64,
    late: u64,
    protocol_errors: u64,
}

struct LoadRun {
    hist: Histogram<u64>,
    sent: u64,
    completed: u64,
    hits: u64,
    misses: u64,
    errors: u64,
    mismatched: u64,
    late: u64,
    unanswered: u64,
    send_errors: u64,
    send_lag_sum_us: u64,
    send_lag_max_us: u64,
    send_window: Duration,
    residency: Result<ResidencyDiff, String>,
    /// Whether the quiet gate was met before the window (true when there is no gate).
    gate_met: bool,
    cpu_use: Option<CpuUse>,
    /// Voluntary context switches of the backend we started (its wakeups) over the window.
    backend_wakeups: Option<u64>,
}

fn new_hist() -> Histogram<u64> {
    Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("valid histogram bounds")
}

/// (hit, miss, error) for one `get` response.
fn classify(resp: &[u8]) -> (bool, bool, bool) {
    if resp.starts_with(b"VALUE ") {
        (true, false, false)
    } else if resp == b"END\r\n" || resp == b"END\n" {
        (false, true, false)
    } else {
        (false, false, true)
    }
}

fn key_of(resp: &[u8]) -> Option<u32> {
    let line = resp.split(|&b| b == b' ').nth(1)?;
    std::str::from_utf8(line.strip_prefix(b"key:")?)
        .ok()?
        .parse()
        .ok()
}

fn reader(
    mut stream: TcpStream,
    track: Arc<ConnTrack>,
    outstanding: Arc<(Mutex<Outstanding>, Condvar)>,
    bound: Duration,
) -> ReaderResult {
    let mut r = ReaderResult {
        hist: new_hist(),
        completed: 0,
        hits: 0,
        misses: 0,
        errors: 0,
        mismatched: 0,
        late: 0,
        protocol_errors: 0,
    };
    let mut buf: Vec<u8> = Vec::with_capacity(64 * 1024);
    let mut chunk = vec![0u8; 64 * 1024];
    'outer: loop {
        let n = match stream.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let now = Instant::now();
        buf.extend_from_slice(&chunk[..n]);
        let mut off = 0;
        let mut done = 0u64;
        loop {
            match memcached_response_len(&buf[off..]) {
                Ok(Some(len)) => {
                    let resp = &buf[off..off + len];
                    off += len;
                    let Some(p) = track
                        .queue
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .pop_front()
                    else {
                        r.protocol_errors += 1;
                        continue;
                    };
                    done += 1;
                    if !p.record {
                        continue;
                    }
                    let lat = now.saturating_duration_since(p.intended);
                    let us = (lat.as_micros() as u64).max(1);
                    let _ = r.hist.record(us.min(60_000_000));
                    r.completed += 1;
                    if lat > bound {
                        r.late += 1;
                    }
                    let (hit, miss, err) = classify(resp);
                    if hit {
                        r.hits += 1;
                        if key_of(resp) != Some(p.key) {
                            r.mismatched += 1;
                        }
                    }
                    r.misses += miss as u64;
                    r.errors += err as u64;
                }
                Ok(None) => break,
                Err(_) => {
                    r.protocol_errors += 1;
                    break 'outer;
                }
            }
        }
        buf.drain(..off);
        if done > 0 {
            let (m, cv) = &*outstanding;
            let mut o = m.lock().unwrap_or_else(|e| e.into_inner());
            o.n = o.n.saturating_sub(done);
            if o.n == 0 {
                cv.notify_all();
            }
        }
    }
    r
}

struct LoadOpts<'a> {
    rate: f64,
    duration: Duration,
    connections: usize,
    keys: u32,
    bound: Duration,
    settle: Duration,
    seed: u64,
    sysfs: &'a Path,
    /// Our other processes (the backend we started), for [`CpuUse`].
    own_pids: &'a [u32],
    /// Wait (≤ 60 s) until every CPU was deep idle at least this share over 0.5 s (0: off).
    quiet_gate: f64,
}

/// Waits until every CPU's deep-idle share over a 0.5 s probe reaches the gate (at most 60 s);
/// returns whether it did.
fn quiet_gate(o: &LoadOpts<'_>, stop: &AtomicBool) -> bool {
    if o.quiet_gate <= 0.0 {
        return true;
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline && !stop.load(Ordering::SeqCst) {
        let Ok(a) = Snapshot::read(o.sysfs) else {
            return false;
        };
        std::thread::sleep(Duration::from_millis(500));
        let Ok(Ok(r)) = Snapshot::read(o.sysfs).map(|b| a.diff(&b)) else {
            return false;
        };
        // CPUs without cpuidle states never sleep in the counters' eyes: not gated on.
        let r = r.report();
        let mut sleeping = r.per_cpu.iter().filter(|c| !c.states.is_empty()).peekable();
        if sleeping.peek().is_some() && sleeping.all(|c| c.deep_idle_share.value >= o.quiet_gate) {
            return true;
        }
    }
    false
}

/// The idle baseline: no load, residency over the same duration.
fn run_idle(o: &LoadOpts<'_>, stop: &AtomicBool) -> LoadRun {
    std::thread::sleep(o.settle);
    let gate_met = quiet_gate(o, stop);
    let window = WindowStart::read(o);
    let start = Instant::now();
    while !stop.load(Ordering::SeqCst) && start.elapsed() < o.duration {
        std::thread::sleep(
            o.duration
                .saturating_sub(start.elapsed())
                .min(Duration::from_millis(250)),
        );
    }
    window.finish(o, start.elapsed(), gate_met)
}

/// The machine's counters at the start of a measured window: CPU use, the wakeups of the
/// backend we started, cpuidle residency.
struct WindowStart {
    cpu_use: Option<cpu_use::CpuUseMark>,
    backend_wakeups: Option<u64>,
    residency: Result<Snapshot, String>,
}

impl WindowStart {
    fn read(o: &LoadOpts<'_>) -> WindowStart {
        WindowStart {
            cpu_use: cpu_use::cpu_use_mark(o.own_pids),
            backend_wakeups: backend_wakeups(o.own_pids),
            residency: snapshot(o.sysfs),
        }
    }

    /// Reads the counters again (the window ends now): the window as a run with no requests
    /// counted yet.
    fn finish(self, o: &LoadOpts<'_>, send_window: Duration, gate_met: bool) -> LoadRun {
        let after = snapshot(o.sysfs);
        let backend_wakeups = self
            .backend_wakeups
            .zip(backend_wakeups(o.own_pids))
            .map(|(a, b)| b.saturating_sub(a));
        let cpu_use = self
            .cpu_use
            .zip(cpu_use::cpu_use_mark(o.own_pids))
            .map(|(a, b)| cpu_use::cpu_use(&a, &b));
        LoadRun {
            hist: new_hist(),
            sent: 0,
            completed: 0,
            hits: 0,
            misses: 0,
            errors: 0,
            mismatched: 0,
            late: 0,
            unanswered: 0,
            send_errors: 0,
            send_lag_sum_us: 0,
            send_lag_max_us: 0,
            send_window,
            residency: match (self.residency, after) {
                (Ok(b), Ok(a)) => b.diff(&a).map_err(|e| e.to_string()),
                (Err(e), _) | (_, Err(e)) => Err(e),
            },
            gate_met,
            cpu_use,
            backend_wakeups,
        }
    }
}

/// The machine's cpuidle counters now; an error says why residency is unavailable.
fn snapshot(sysfs: &Path) -> Result<Snapshot, String> {
    Snapshot::read(sysfs).map_err(|e| e.to_string())
}

fn backend_wakeups(pids: &[u32]) -> Option<u64> {
    pids.first().and_then(|&p| cpu_use::process_wakeups(p))
}

/// Waits until no request is outstanding, or the deadline; false on timeout.
fn wait_drained(outstanding: &(Mutex<Outstanding>, Condvar), deadline: Instant) -> bool {
    let (m, cv) = outstanding;
    let mut o = m.lock().unwrap_or_else(|e| e.into_inner());
    while o.n > 0 {
        let now = Instant::now();
        if now >= deadline {
            return false;
        }
        o = cv
            .wait_timeout(o, deadline - now)
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
    true
}

fn run_load(target: SocketAddr, o: &LoadOpts<'_>, stop: &AtomicBool) -> Result<LoadRun> {
    let outstanding = Arc::new((Mutex::new(Outstanding::default()), Condvar::new()));
    let mut conns = Vec::new();
    let mut readers = Vec::new();
    for _ in 0..o.connections.max(1) {
        let s = TcpStream::connect_timeout(&target, Duration::from_secs(2))
            .with_context(|| format!("connecting to {target}"))?;
        s.set_nodelay(true)?;
        let track = Arc::new(ConnTrack {
            queue: Mutex::new(VecDeque::new()),
        });
        let (rs, t, out, bound) = (s.try_clone()?, track.clone(), outstanding.clone(), o.bound);
        readers.push(
            std::thread::Builder::new()
                .name("bench-reader".into())
                .spawn(move || reader(rs, t, out, bound))?,
        );
        conns.push((s, track));
    }
    let send = |i: usize, p: Pending| -> std::io::Result<()> {
        let (s, track) = &conns[i % conns.len()];
        let req = format!("get key:{}\r\n", p.key);
        outstanding.0.lock().unwrap_or_else(|e| e.into_inner()).n += 1;
        track
            .queue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push_back(p);
        (&*s).write_all(req.as_bytes())
    };
    // Warm-up: one request per connection (opens the proxy's backend connections, trains its
    // response-time estimate), not recorded.
    for i in 0..conns.len() {
        let p = Pending {
            intended: Instant::now(),
            key: i as u32 % o.keys.max(1),
            record: false,
        };
        send(i, p).context("warm-up request")?;
    }
    if !wait_drained(
        &outstanding,
        Instant::now() + o.bound * 2 + Duration::from_secs(5),
    ) {
        bail!("no answer to warm-up requests from {target}");
    }
    std::thread::sleep(o.settle);
    let gate_met = quiet_gate(o, stop);

    let mut rng = Rng(o.seed);
    let window = WindowStart::read(o);
    let start = Instant::now();
    let end = start + o.duration;
    let mut t = start;
    let (mut sent, mut send_errors, mut lag_sum, mut lag_max) = (0u64, 0u64, 0u64, 0u64);
    loop {
        t += rng.exp(o.rate);
        if t >= end || stop.load(Ordering::SeqCst) {
            break;
        }
        let now = Instant::now();
        if t > now {
            std::thread::sleep(t - now);
        }
        let lag = Instant::now().saturating_duration_since(t).as_micros() as u64;
        lag_sum += lag;
        lag_max = lag_max.max(lag);
        let key = (rng.next() % o.keys.max(1) as u64) as u32;
        let p = Pending {
            intended: t,
            key,
            record: true,
        };
        match send(sent as usize, p) {
            Ok(()) => sent += 1,
            Err(_) => {
                send_errors += 1;
                break;
            }
        }
    }
    let send_window = Instant::now().saturating_duration_since(start);
    wait_drained(
        &outstanding,
        Instant::now() + o.bound * 2 + Duration::from_secs(2),
    );
    let window = window.finish(o, send_window, gate_met);
    let mut unanswered = 0;
    for (s, track) in &conns {
        unanswered += track
            .queue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|p| p.record)
            .count() as u64;
        let _ = s.shutdown(std::net::Shutdown::Both);
    }
    let mut run = LoadRun {
        sent,
        unanswered,
        send_errors,
        send_lag_sum_us: lag_sum,
        send_lag_max_us: lag_max,
        ..window
    };
    for h in readers {
        let r = h
            .join()
            .map_err(|_| anyhow::anyhow!("a bench reader thread panicked"))?;
        run.hist.add(&r.hist).ok();
        run.completed += r.completed;
        run.hits += r.hits;
        run.misses += r.misses;
        run.errors += r.errors + r.protocol_errors;
        run.mismatched += r.mismatched;
        run.late += r.late;
    }
    Ok(run)
}

fn quantile(h: &Histogram<u64>, q: f64) -> Quantile {
    let n = h.len();
    if n == 0 {
        return Quantile {
            value_us: 0,
            ci95_lo_us: None,
            ci95_hi_us: None,
        };
    }
    let nf = n as f64;
    let half = 1.96 * (nf * q * (1.0 - q)).sqrt();
    let lo = (nf * q - half).floor();
    let hi = (nf * q + half).ceil() + 1.0;
    let at = |rank: f64| h.value_at_quantile((rank / nf).clamp(0.0, 1.0));
    Quantile {
        value_us: h.value_at_quantile(q),
        ci95_lo_us: (lo >= 1.0).then(|| at(lo)),
        ci95_hi_us: (hi <= nf).then(|| at(hi)),
    }
}

fn latency_report(h: &Histogram<u64>) -> LatencyReport {
    LatencyReport {
        kind: "measured",
        samples: h.len(),
        p50: quantile(h, 0.5),
        p99: quantile(h, 0.99),
        p999: quantile(h, 0.999),
        mean_us: if h.is_empty() { 0.0 } else { h.mean() },
        max_us: h.max(),
    }
}

fn summarize_stage(runs: &[StageCounters], seconds: f64) -> StageSummary {
    let sum = |f: fn(&StageCounters) -> u64| runs.iter().map(f).sum::<u64>();
    let released = sum(|c| c.requests_released);
    let held_sum: f64 = runs
        .iter()
        .map(|c| c.held_mean_us * c.requests_released as f64)
        .sum();
    let last = runs.last();
    let bursts = sum(|c| c.bursts);
    StageSummary {
        kind: "measured",
        bursts,
        bursts_per_s: if seconds > 0.0 {
            bursts as f64 / seconds
        } else {
            0.0
        },
        bursts_early: sum(|c| c.bursts_early),
        bursts_periodic: sum(|c| c.bursts_periodic),
        bursts_final: sum(|c| c.bursts_final),
        burst_max_requests: runs.iter().map(|c| c.burst_max_requests).max().unwrap_or(0),
        requests_released: released,
        held_mean_us: if released > 0 {
            held_sum / released as f64
        } else {
            0.0
        },
        held_max_us: runs.iter().map(|c| c.held_max_us).max().unwrap_or(0),
        service_ewma_us: last.map_or(0.0, |c| c.service_ewma_us),
        guard_us: last.map_or(0.0, |c| c.guard_us),
        requests_failed: sum(|c| c.requests_failed),
        backend_failures: sum(|c| c.backend_failures),
    }
}

struct ModeAcc {
    runs: Vec<LoadRun>,
    stage: Vec<StageCounters>,
    stage_seconds: f64,
}

fn sum_cpu_use(parts: impl Iterator<Item = CpuUse>) -> Option<CpuUse> {
    let mut total: Option<(CpuUse, f64)> = None;
    for u in parts {
        // Capacity of the window, recovered from a share (0 when nothing ran).
        let cap = if u.own_share > 0.0 {
            u.own_cpu_s / u.own_share
        } else if u.others_share > 0.0 {
            u.others_cpu_s / u.others_share
        } else {
            0.0
        };
        total = Some(match total {
            None => (u, cap),
            Some((t, c)) => (
                CpuUse {
                    kind: "measured",
                    own_cpu_s: t.own_cpu_s + u.own_cpu_s,
                    machine_busy_cpu_s: t.machine_busy_cpu_s + u.machine_busy_cpu_s,
                    others_cpu_s: t.others_cpu_s + u.others_cpu_s,
                    own_share: 0.0,
                    others_share: 0.0,
                },
                c + cap,
            ),
        });
    }
    total.map(|(mut t, cap)| {
        if cap > 0.0 {
            t.own_share = t.own_cpu_s / cap;
            t.others_share = t.others_cpu_s / cap;
        }
        t
    })
}

fn mode_report(mode: Mode, acc: &ModeAcc) -> ModeReport {
    let mut hist = new_hist();
    for r in &acc.runs {
        hist.add(&r.hist).ok();
    }
    let sum = |f: fn(&LoadRun) -> u64| acc.runs.iter().map(f).sum::<u64>();
    let sent = sum(|r| r.sent);
    let window: f64 = acc.runs.iter().map(|r| r.send_window.as_secs_f64()).sum();
    let over = sum(|r| r.late) + sum(|r| r.unanswered);
    // The rounds' windows summed into one (rounds whose CPUs or idle states differ from the
    // first are left out, with a note).
    let mut residency = ResidencyDiff::default();
    for (i, r) in acc.runs.iter().enumerate() {
        if let Ok(d) = &r.residency {
            if let Err(e) = residency.accumulate(d) {
                residency
                    .notes
                    .push(format!("round {i} left out of the sum: {e}"));
            }
        }
    }
    let backend_wk: Option<u64> = acc.runs.iter().map(|r| r.backend_wakeups).sum();
    let unavailable = acc
        .runs
        .iter()
        .find_map(|r| r.residency.as_ref().err().cloned());
    ModeReport {
        mode: mode.name(),
        rounds: acc.runs.len() as u32,
        sent,
        completed: sum(|r| r.completed),
        hits: sum(|r| r.hits),
        misses: sum(|r| r.misses),
        errors: sum(|r| r.errors),
        mismatched: sum(|r| r.mismatched),
        unanswered: sum(|r| r.unanswered),
        send_errors: sum(|r| r.send_errors),
        achieved_rate_per_s: if window > 0.0 {
            sent as f64 / window
        } else {
            0.0
        },
        send_lag_mean_us: if sent > 0 {
            sum(|r| r.send_lag_sum_us) as f64 / sent as f64
        } else {
            0.0
        },
        send_lag_max_us: acc
            .runs
            .iter()
            .map(|r| r.send_lag_max_us)
            .max()
            .unwrap_or(0),
        latency: latency_report(&hist),
        over_bound: OverBound {
            kind: "measured",
            count: over,
            samples: sent,
            share: if sent > 0 {
                over as f64 / sent as f64
            } else {
                0.0
            },
        },
        stage: (mode == Mode::Staged).then(|| summarize_stage(&acc.stage, acc.stage_seconds)),
        residency: (residency.windows > 0).then(|| residency.report()),
        residency_unavailable: if residency.windows == 0 {
            unavailable
        } else {
            None
        },
        cpu_use: sum_cpu_use(acc.runs.iter().filter_map(|r| r.cpu_use)),
        backend_wakeups: backend_wk,
        backend_wakeups_per_s: backend_wk.map(|w| {
            let secs: f64 = acc
                .runs
                .iter()
                .filter_map(|r| r.residency.as_ref().ok().map(|x| x.wall_us as f64 / 1e6))
                .sum();
            let secs = if secs > 0.0 {
                secs
            } else {
                acc.runs.iter().map(|r| r.send_window.as_secs_f64()).sum()
            };
            w as f64 / secs.max(1e-9)
        }),
        per_round: acc
            .runs
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let res = r.residency.as_ref().ok();
                RoundSummary {
                    round: i as u32,
                    samples: r.hist.len(),
                    p999_us: if r.hist.is_empty() {
                        0
                    } else {
                        r.hist.value_at_quantile(0.999)
                    },
                    residency: res.map(|x| x.report()),
                    backend_wakeups_per_s: r.backend_wakeups.map(|w| {
                        w as f64
                            / res
                                .map_or(r.send_window.as_secs_f64(), |x| x.wall_us as f64 / 1e6)
                                .max(1e-9)
                    }),
                    quiet_gate_met: r.gate_met,
                    own_cpu_share: r.cpu_use.map(|u| u.own_share),
                    others_cpu_share: r.cpu_use.map(|u| u.others_share),
                }
            })
            .collect(),
    }
}

/// Runs the benchmark described by `args` and returns its report (see the module docs).
pub fn bench(args: &BenchArgs) -> Result<BenchReport> {
    if args.protocol != Protocol::Memcached {
        bail!("stage bench drives the memcached text protocol only (--protocol memcached)");
    }
    if !(args.rate > 0.0 && args.rate.is_finite()) {
        bail!("--rate must be positive");
    }
    if !(args.duration_s > 0.0 && args.duration_s.is_finite()) {
        bail!("--duration-s must be positive");
    }
    if args.rounds == 0 || args.connections == 0 || args.keys == 0 {
        bail!("--rounds, --connections and --keys must be at least 1");
    }
    args.staging.check()?;
    let stop = Arc::new(AtomicBool::new(false));
    let mut sig_ids = Vec::new();
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        // A second signal while stopping exits at once.
        sig_ids.push(signal_hook::flag::register_conditional_shutdown(
            sig,
            130,
            stop.clone(),
        )?);
        sig_ids.push(signal_hook::flag::register(sig, stop.clone())?);
    }
    let args2 = args.clone();
    let stop2 = stop.clone();
    // A dedicated thread, so pinning never changes the caller's affinity.
    let result = std::thread::Builder::new()
        .name("stage-bench".into())
        .spawn(move || bench_pinned(&args2, &stop2))
        .context("starting the benchmark thread")?
        .join()
        .map_err(|_| anyhow::anyhow!("the benchmark thread panicked"));
    for id in sig_ids {
        signal_hook::low_level::unregister(id);
    }
    let report = result??;
    if stop.load(Ordering::SeqCst) {
        bail!("interrupted");
    }
    Ok(report)
}

fn bench_pinned(args: &BenchArgs, stop: &AtomicBool) -> Result<BenchReport> {
    let cpus = preheat_engine::os::online_cpus();
    let pin = !args.no_pin && cpus >= 2;
    let mut notes = Vec::new();
    let mut we_start = args.backend.is_none() || args.backend_cmd.is_some();
    let backend_cpu = (pin && we_start).then_some(cpus - 1);
    if backend_cpu.is_some() && on_path("taskset").is_none() {
        notes.push("taskset not found: the backend is not pinned".to_string());
    }
    let backend_cpu = backend_cpu.filter(|_| on_path("taskset").is_some());
    if pin {
        if let Err(e) = preheat_engine::os::set_affinity(&[0]) {
            notes.push(format!("could not pin the client and proxy to CPU 0: {e}"));
        }
    }
    let (backend_proc, backend, desc) = match (&args.backend_cmd, &args.backend) {
        (Some(cmd), b) => {
            let (p, a) = start_cmd(cmd, b.as_deref(), backend_cpu, stop)?;
            (Some(p), a, format!("{cmd:?} at {a}"))
        }
        (None, Some(b)) => {
            we_start = false;
            let a = resolve(b)?;
            (None, a, format!("external server at {a}"))
        }
        (None, None) => {
            let (p, a) = start_kv(backend_cpu, stop)?;
            let desc = format!("bundled preheat-kv at {a} (pid {})", p.child.id());
            (Some(p), a, desc)
        }
    };
    let placement = match (pin, backend_cpu) {
        (true, Some(c)) => format!("backend on CPU {c}, client and proxy on CPU 0"),
        (true, None) if !we_start => {
            "client and proxy on CPU 0; backend placement not controlled".to_string()
        }
        (true, None) => "client and proxy on CPU 0; backend not pinned".to_string(),
        (false, _) => "not pinned".to_string(),
    };
    let bound = Duration::from_millis(args.staging.bound_ms);
    let own_pids: Vec<u32> = backend_proc.iter().map(|p| p.child.id()).collect();
    let opts = LoadOpts {
        rate: args.rate,
        duration: Duration::from_secs_f64(args.duration_s),
        connections: args.connections,
        keys: args.keys,
        bound,
        settle: Duration::from_millis(args.settle_ms),
        seed: args.seed,
        sysfs: &args.sysfs_cpu,
        quiet_gate: args.quiet_gate_pct / 100.0,
        own_pids: &own_pids,
    };
    let mut modes_run = vec![Mode::Direct, Mode::Staged];
    if args.idle_baseline {
        modes_run.push(Mode::Idle);
    }
    let mut accs: Vec<ModeAcc> = modes_run
        .iter()
        .map(|_| ModeAcc {
            runs: Vec::new(),
            stage: Vec::new(),
            stage_seconds: 0.0,
        })
        .collect();
    let mut retried = 0;
    for round in 0..args.rounds {
        // Change the order every round so drift of the machine does not favour one mode.
        let mut order: Vec<usize> = (0..modes_run.len()).collect();
        if modes_run.len() == 2 {
            if round % 2 == 1 {
                order.reverse();
            }
        } else {
            order.rotate_left(round as usize % modes_run.len());
        }
        for i in order {
            if stop.load(Ordering::SeqCst) {
                bail!("interrupted");
            }
            let seeded = LoadOpts {
                seed: args.seed.wrapping_add(round as u64),
                ..opts
            };
            let acc = &mut accs[i];
            let max_others = args.max_others_pct / 100.0;
            for attempt in 1..=3 {
                let (run, counters) = match modes_run[i] {
                    Mode::Direct => (run_load(backend, &seeded, stop)?, None),
                    Mode::Idle => (run_idle(&seeded, stop), None),
                    Mode::Staged => {
                        let mut cfg = StageConfig::new(
                            SocketAddr::from(([127, 0, 0, 1], 0)),
                            backend,
                            args.protocol,
                        );
                        args.staging.apply(&mut cfg);
                        let stage = Stage::start(cfg)?;
                        let run = run_load(stage.local_addr(), &seeded, stop);
                        let counters = stage.shutdown();
                        (run?, Some(counters))
                    }
                };
                let others = run.cpu_use.map_or(0.0, |u| u.others_share);
                let noisy = max_others > 0.0 && others > max_others;
                if noisy && attempt < 3 && !stop.load(Ordering::SeqCst) {
                    retried += 1;
                    continue;
                }
                if noisy {
                    notes.push(format!(
                        "{} round {round}: other processes used {:.0}% of the CPUs even on the third attempt (kept)",
                        modes_run[i].name(),
                        100.0 * others
                    ));
                }
                if let Some(c) = counters {
                    acc.stage_seconds += run.send_window.as_secs_f64();
                    acc.stage.push(c);
                }
                acc.runs.push(run);
                break;
            }
        }
    }
    if retried > 0 {
        notes.push(format!(
            "{retried} window(s) were measured again because other processes used more than {}% of the CPUs",
            args.max_others_pct
        ));
    }
    let modes: Vec<ModeReport> = modes_run
        .iter()
        .zip(&accs)
        .map(|(m, acc)| mode_report(*m, acc))
        .collect();
    if args.quiet_gate_pct > 0.0 {
        let missed = accs
            .iter()
            .flat_map(|a| &a.runs)
            .filter(|r| !r.gate_met)
            .count();
        if missed > 0 {
            notes.push(format!(
                "{missed} window(s) started without the quiet gate ({}% deep idle on every CPU) met within 60 s",
                args.quiet_gate_pct
            ));
        }
    }
    if modes.iter().any(|m| m.hits == 0 && m.misses > 0) {
        notes.push("every GET missed: the backend holds no key:N items".to_string());
    }
    notes.push(
        "residency covers the whole machine over each measured window (other processes included); the stage counts include warm-up and the final drain".to_string(),
    );
    Ok(BenchReport {
        kind: "measured",
        protocol: args.protocol,
        backend: desc,
        placement,
        rate_per_s: args.rate,
        duration_s: args.duration_s,
        rounds: args.rounds,
        connections: args.connections,
        period_ms: args.staging.period_ms,
        bound_ms: args.staging.bound_ms,
        margin_ms: args.staging.margin_ms,
        modes,
        notes,
    })
}

fn fmt_q(q: &Quantile) -> String {
    let v = |x: u64| {
        if x >= 10_000 {
            format!("{:.1} ms", x as f64 / 1e3)
        } else {
            format!("{x} µs")
        }
    };
    let lo = q.ci95_lo_us.map_or("?".to_string(), v);
    let hi = q.ci95_hi_us.map_or("?".to_string(), v);
    format!("{} ({lo}–{hi})", v(q.value_us))
}

impl BenchReport {
    /// Human-readable report: one column per mode.
    pub fn render(&self) -> String {
        let mut rows: Vec<(String, Vec<String>)> = Vec::new();
        let mut row = |name: &str, f: &dyn Fn(&ModeReport) -> String| {
            rows.push((name.to_string(), self.modes.iter().map(f).collect()));
        };
        row("requests sent / answered", &|m| {
            format!("{} / {}", m.sent, m.completed)
        });
        row("achieved rate /s", &|m| {
            format!("{:.1}", m.achieved_rate_per_s)
        });
        let lat = |m: &ModeReport, q: &Quantile| {
            if m.latency.samples == 0 {
                "–".to_string()
            } else {
                fmt_q(q)
            }
        };
        row("latency p50 (95% CI)", &|m| lat(m, &m.latency.p50));
        row("latency p99 (95% CI)", &|m| lat(m, &m.latency.p99));
        row("latency p99.9 (95% CI)", &|m| lat(m, &m.latency.p999));
        row("latency max", &|m| {
            if m.latency.samples == 0 {
                "–".to_string()
            } else {
                format!("{:.1} ms", m.latency.max_us as f64 / 1e3)
            }
        });
        row("over the bound", &|m| {
            format!(
                "{} of {} ({:.2}%)",
                m.over_bound.count,
                m.over_bound.samples,
                100.0 * m.over_bound.share
            )
        });
        row("errors / mismatched / unanswered", &|m| {
            format!("{} / {} / {}", m.errors, m.mismatched, m.unanswered)
        });
        row("bursts (early)", &|m| match &m.stage {
            Some(s) => format!("{} ({}), {:.2}/s", s.bursts, s.bursts_early, s.bursts_per_s),
            None => "–".into(),
        });
        row("held in stage mean / max", &|m| match &m.stage {
            Some(s) => format!(
                "{:.1} / {:.1} ms",
                s.held_mean_us / 1e3,
                s.held_max_us as f64 / 1e3
            ),
            None => "–".into(),
        });
        row("deep idle (mean over CPUs)", &|m| match &m.residency {
            Some(r) => format!("{:.1}%", 100.0 * r.deep_idle_share.value),
            None => "unavailable".into(),
        });
        row("backend wakeups/s", &|m| match m.backend_wakeups_per_s {
            Some(w) => format!("{w:.1}"),
            None => "–".into(),
        });
        row("CPU time: ours / other processes", &|m| match &m.cpu_use {
            Some(u) => format!(
                "{:.1}% / {:.1}%",
                100.0 * u.own_share,
                100.0 * u.others_share
            ),
            None => "–".into(),
        });
        let cpus: Vec<u32> = self
            .modes
            .iter()
            .find_map(|m| m.residency.as_ref())
            .map(|r| r.per_cpu.iter().map(|c| c.cpu).collect())
            .unwrap_or_default();
        for cpu in cpus {
            row(&format!("cpu{cpu} deep idle / wakeups/s"), &|m| {
                m.residency
                    .as_ref()
                    .and_then(|r| r.per_cpu.iter().find(|c| c.cpu == cpu))
                    .map_or("–".into(), |c| {
                        format!(
                            "{:.1}% / {:.0}",
                            100.0 * c.deep_idle_share.value,
                            c.wakeups_per_s.value
                        )
                    })
            });
        }
        let width = rows.iter().map(|r| r.0.chars().count()).max().unwrap_or(0) + 2;
        let colw = rows
            .iter()
            .flat_map(|r| r.1.iter().map(|c| c.chars().count()))
            .max()
            .unwrap_or(0)
            .max(8)
            + 3;
        let mut out = format!(
            "preheat stage bench: {} open-loop Poisson at {}/s, {} s × {} round(s), {} connection(s), period {} ms, bound {} ms\nbackend: {}\nplacement: {}\n\n",
            self.protocol,
            self.rate_per_s,
            self.duration_s,
            self.rounds,
            self.connections,
            self.period_ms,
            self.bound_ms,
            self.backend,
            self.placement
        );
        let pad =
            |s: &str, w: usize| format!("{s}{}", " ".repeat(w.saturating_sub(s.chars().count())));
        out.push_str(&pad("", width));
        for m in &self.modes {
            out.push_str(&pad(m.mode, colw));
        }
        out.push('\n');
        for (name, cells) in &rows {
            out.push_str(&pad(name, width));
            for c in cells {
                out.push_str(&pad(c, colw));
            }
            out.push('\n');
        }
        let n: Vec<String> = self
            .modes
            .iter()
            .map(|m| {
                format!(
                    "{}: n = {} latency samples, residency over {:.1} s × {} CPUs",
                    m.mode,
                    m.latency.samples,
                    m.residency.as_ref().map_or(0.0, |r| r.interval.value),
                    m.residency.as_ref().map_or(0, |r| r.cpus_measured)
                )
            })
            .collect();
        out.push_str(&format!(
            "\nAll numbers measured here ({}). Latency from the intended send time to the full response; POLL residency counted as busy.\n",
            n.join("; ")
        ));
        out.push_str("\nper window (round: p99.9; deep idle per CPU; wakeups/s per CPU; backend wakeups/s; CPU used by other processes):\n");
        for m in &self.modes {
            for r in &m.per_round {
                let per_cpu = r.residency.iter().flat_map(|x| &x.per_cpu);
                let pct: Vec<String> = per_cpu
                    .clone()
                    .map(|c| format!("{:.1}%", 100.0 * c.deep_idle_share.value))
                    .collect();
                let wk: Vec<String> = per_cpu
                    .map(|c| format!("{:.0}", c.wakeups_per_s.value))
                    .collect();
                out.push_str(&format!(
                    "  {} r{}: {}; {}; {}; {}; {}\n",
                    m.mode,
                    r.round,
                    if r.samples > 0 {
                        format!("p99.9 {:.1} ms (n = {})", r.p999_us as f64 / 1e3, r.samples)
                    } else {
                        "no requests".to_string()
                    },
                    pct.join(" "),
                    wk.join(" "),
                    r.backend_wakeups_per_s
                        .map_or("–".to_string(), |w| format!("{w:.1}")),
                    r.others_cpu_share
                        .map_or("–".to_string(), |o| format!("{:.1}%", 100.0 * o)),
                ));
            }
        }
        for m in &self.modes {
            if let Some(u) = &m.residency_unavailable {
                out.push_str(&format!("{}: {u}\n", m.mode));
            }
        }
        for note in &self.notes {
            out.push_str(&format!("note: {note}\n"));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poisson_schedule_has_the_right_mean() {
        let mut r = Rng(7);
        let n = 20_000;
        let total: f64 = (0..n).map(|_| r.exp(100.0).as_secs_f64()).sum();
        let mean = total / n as f64;
        assert!((mean - 0.01).abs() < 0.0005, "{mean}");
    }

    #[test]
    fn quantile_intervals_bracket() {
        let mut h = new_hist();
        for v in 1..=10_000u64 {
            h.record(v).unwrap();
        }
        let q = quantile(&h, 0.99);
        assert!((9890..=9910).contains(&q.value_us), "{q:?}");
        assert!(q.ci95_lo_us.unwrap() < q.value_us && q.value_us < q.ci95_hi_us.unwrap());
        // 100 samples cannot bracket p99.9 from above.
        let mut small = new_hist();
        for v in 1..=100u64 {
            small.record(v).unwrap();
        }
        assert_eq!(quantile(&small, 0.999).ci95_hi_us, None);
    }

    #[test]
    fn response_classification() {
        assert_eq!(key_of(b"VALUE key:42 0 3\r\nabc\r\nEND\r\n"), Some(42));
        assert_eq!(classify(b"END\r\n"), (false, true, false));
        assert_eq!(classify(b"SERVER_ERROR x\r\n"), (false, false, true));
    }
}
