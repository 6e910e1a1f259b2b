//! The control thread: serves `<run-dir>/agent-<pid>.sock` (one JSON [`Request`] per line, one
//! JSON [`Reply`] per line; several clients at once), owns the loaded profile and the per-port
//! configuration, and publishes what the workers act on ([`crate::plan`]).
//!
//! Every request runs under `catch_unwind`: a panic disables the agent (hooks pass through),
//! records the reason for `Status`, is logged, and is answered with `Reply::Error`; the thread
//! keeps serving so the reason can be read. Errors never reach the host.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, IntoRawFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use preheat_engine::preheat::{split_runs, ParallelPreheater};
use preheat_engine::{maps, os, probe, time};
use preheat_model::proto::{LoadedClass, Range, Reply, Request};
use preheat_model::resolve::check_binary;
use preheat_model::{decode_profile, resolve_class, AbsRun, Mapping, RegionTable};

use crate::log::{self, log};
use crate::plan::{self, Plan, PortPlan, ReplayConn, Split, MAX_SPLIT};
use crate::stats::STATS;
use crate::{comm, config, fdreg, sys, threads, track};

/// Probe candidates are capped at this many bytes.
pub const CANDIDATE_CAP: u64 = 256 << 20;
/// Samples per class for `Calibrate`.
const CALIBRATE_SAMPLES: u32 = 2000;
/// Longest control request line.
const MAX_LINE: usize = 64 << 20;
/// `ProbeReload` waits at most this long for the server threads to return to their wait call.
const QUIESCE_MAX: Duration = Duration::from_millis(50);
const QUIESCE_POLL: Duration = Duration::from_micros(50);

struct LoadedProfile {
    path: String,
    classes: Vec<LoadedClass>,
    runs: BTreeMap<u16, Vec<AbsRun>>,
}

#[derive(Default)]
struct PortConfig {
    replay: Option<Arc<ReplayConn>>,
    split_cpus: Vec<u32>,
    par: Option<Arc<ParallelPreheater>>,
}

struct Client {
    stream: UnixStream,
    buf: Vec<u8>,
}

struct Control {
    /// The `ProbeCycle` connection (port, stream), kept open across cycles: closing it after
    /// every cycle makes the server handle the FIN during the next cycle's window.
    probe_conn: Option<(u16, TcpStream)>,
    profile: Option<LoadedProfile>,
    ports: BTreeMap<u16, PortConfig>,
    retired: Vec<Arc<Plan>>,
    next_reconnect: Option<Instant>,
}

/// Body of the control thread.
pub fn control_main(listener: UnixListener, wake_fd: RawFd, profile: Option<String>) {
    let mut c = Control {
        probe_conn: None,
        profile: None,
        ports: BTreeMap::new(),
        retired: Vec::new(),
        next_reconnect: None,
    };
    if let Some(p) = profile {
        match c.load_profile(&p) {
            Ok(Reply::Loaded {
                classes,
                skipped_regions,
                ..
            }) => log(&format!(
                "PREHEAT_PROFILE {p}: loaded {} classes ({}); {} regions skipped{}",
                classes.len(),
                classes
                    .iter()
                    .map(|c| format!("port {}: {} lines", c.port, c.lines))
                    .collect::<Vec<_>>()
                    .join(", "),
                skipped_regions.len(),
                if skipped_regions.is_empty() {
                    String::new()
                } else {
                    format!(": {}", skipped_regions.join("; "))
                }
            )),
            Ok(_) => {}
            Err(e) => log(&format!("PREHEAT_PROFILE not loaded: {e}")),
        }
    }
    if let Err(e) = listener.set_nonblocking(true) {
        log(&format!("control socket: {e}"));
    }
    let mut clients: Vec<Client> = Vec::new();
    loop {
        let mut fds = Vec::with_capacity(2 + clients.len());
        fds.push(pollfd(listener.as_raw_fd()));
        fds.push(pollfd(wake_fd));
        for cl in &clients {
            fds.push(pollfd(cl.stream.as_raw_fd()));
        }
        let timeout = c.poll_timeout_ms();
        match sys::poll(&mut fds, timeout) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                log(&format!("control thread: poll failed, stopping: {e}"));
                return;
            }
        }
        // An fd of ours was closed behind our back (close_range/closefrom in the host, which
        // the close hook cannot see): its number may already belong to the host, so never
        // touch or close it again. Stop serving; the host keeps running.
        if fds.iter().take(2).any(|f| f.revents & libc::POLLNVAL != 0) {
            log::disable("the agent's control socket was closed by the host; control stops".into());
            std::mem::forget(listener);
            std::mem::forget(clients);
            return;
        }
        if fds.get(1).is_some_and(|f| f.revents != 0) {
            sys::eventfd_clear(wake_fd);
        }
        c.maintain();
        // Clients (in reverse, so removal keeps indices valid).
        for i in (0..clients.len()).rev() {
            let revents = fds.get(i + 2).map_or(0, |f| f.revents);
            if revents & libc::POLLNVAL != 0 {
                let cl = clients.swap_remove(i);
                fdreg::unregister_fd(cl.stream.as_raw_fd());
                std::mem::forget(cl);
                continue;
            }
            if revents != 0 && !c.serve_client(&mut clients[i]) {
                let cl = clients.swap_remove(i);
                fdreg::unregister_fd(cl.stream.as_raw_fd());
            }
        }
        if fds.first().is_some_and(|f| f.revents != 0) {
            loop {
                match listener.accept() {
                    Ok((s, _)) => {
                        let _ = s.set_nonblocking(false);
                        let _ = s.set_write_timeout(Some(Duration::from_secs(5)));
                        fdreg::register_fd(s.as_raw_fd());
                        clients.push(Client {
                            stream: s,
                            buf: Vec::new(),
                        });
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(e) => {
                        log(&format!("control socket accept: {e}"));
                        break;
                    }
                }
            }
        }
    }
}

fn pollfd(fd: RawFd) -> libc::pollfd {
    libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }
}

impl Control {
    fn poll_timeout_ms(&self) -> i32 {
        if !self.retired.is_empty() {
            return 100;
        }
        // Look for a wake planner once a second (when asked to use one).
        if self.next_reconnect.is_none() && config::config().is_some_and(|c| c.wake_planner) {
            return 1000;
        }
        match self.next_reconnect {
            Some(t) => t
                .saturating_duration_since(Instant::now())
                .as_millis()
                .clamp(1, 60_000) as i32,
            None => -1,
        }
    }

    /// Periodic work: drop retired plans nobody uses, reconnect broken replay connections.
    fn maintain(&mut self) {
        self.retired.retain(|p| Arc::strong_count(p) > 1);
        if let Some(cfg) = config::config().filter(|c| c.wake_planner) {
            crate::wakeplan::maintain(&cfg.run_dir);
        }
        let due = match self.next_reconnect {
            Some(t) => Instant::now() >= t,
            None => true,
        };
        let mut failed = false;
        for (port, pc) in &self.ports {
            let Some(conn) = &pc.replay else { continue };
            if !conn.broken.load(Ordering::Acquire) {
                continue;
            }
            if !due {
                failed = true;
                continue;
            }
            match connect_replay(*port) {
                Ok(fd) => {
                    if !conn.replace_fd(fd) {
                        log(&format!(
                            "replay connection of port {port}: a worker held the old one for > 100 ms; leaking its fd"
                        ));
                    }
                    conn.broken.store(false, Ordering::Release);
                    log(&format!("replay connection of port {port}: reconnected"));
                }
                Err(e) => {
                    failed = true;
                    log(&format!(
                        "replay connection of port {port}: reconnect failed: {e}"
                    ));
                }
            }
        }
        self.next_reconnect = failed.then(|| Instant::now() + Duration::from_secs(1));
    }

    /// Read what the client sent and answer every complete line. False: drop the client.
    fn serve_client(&mut self, cl: &mut Client) -> bool {
        let mut tmp = [0u8; 64 * 1024];
        let n = match cl.stream.read(&mut tmp) {
            Ok(0) => return false,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => return true,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return true,
            Err(_) => return false,
        };
        cl.buf.extend_from_slice(tmp.get(..n).unwrap_or(&[]));
        while let Some(nl) = cl.buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = cl.buf.drain(..=nl).collect();
            let text = String::from_utf8_lossy(&line);
            let text = text.trim();
            if text.is_empty() {
                continue;
            }
            let reply = self.handle_line(text);
            let mut out = serde_json::to_string(&reply).unwrap_or_else(|e| {
                format!(r#"{{"reply":"error","message":"cannot encode reply: {e}"}}"#)
            });
            out.push('\n');
            if cl.stream.write_all(out.as_bytes()).is_err() {
                return false;
            }
        }
        if cl.buf.len() > MAX_LINE {
            let _ = cl
                .stream
                .write_all(b"{\"reply\":\"error\",\"message\":\"request line too long\"}\n");
            return false;
        }
        true
    }

    fn handle_line(&mut self, text: &str) -> Reply {
        let req: Request = match serde_json::from_str(text) {
            Ok(r) => r,
            Err(e) => {
                return Reply::Error {
                    message: format!("bad request: {e}"),
                }
            }
        };
        let name = request_name(&req);
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.handle(req))) {
            Ok(Ok(r)) => r,
            Ok(Err(message)) => Reply::Error { message },
            Err(p) => {
                let msg = format!(
                    "internal error in request {name}: {}; the agent disabled itself (hooks pass through)",
                    log::panic_message(&p)
                );
                log::disable(msg.clone());
                Reply::Error { message: msg }
            }
        }
    }

    fn handle(&mut self, req: Request) -> Result<Reply, String> {
        match req {
            Request::Status => Ok(self.status()),
            Request::Candidates => candidates(),
            Request::Calibrate => {
                let c = probe::calibrate(CALIBRATE_SAMPLES);
                Ok(Reply::Calibration {
                    hit_ticks_p50: c.hit_ticks_p50,
                    miss_ticks_p50: c.miss_ticks_p50,
                    threshold: c.threshold,
                    samples: c.samples,
                })
            }
            Request::ProbeFlush { ranges } => {
                let valid = validate_ranges(&ranges)?;
                probe::flush(&valid);
                Ok(Reply::Ok)
            }
            Request::ProbeReload {
                ranges,
                threshold,
                window_pages,
                seed,
            } => {
                quiesce();
                let valid = validate_ranges(&ranges)?;
                let lines: u64 = valid.iter().map(|r| r.len.div_ceil(64)).sum();
                let mut hits = Vec::with_capacity(lines.min(1 << 22) as usize);
                let t0 = time::now_ns();
                let probed = probe::reload(&valid, threshold, window_pages, seed, &mut hits);
                let elapsed_ns = time::now_ns().saturating_sub(t0);
                Ok(Reply::Probed {
                    hits,
                    probed,
                    elapsed_ns,
                    window_ns: 0,
                })
            }
            Request::ProbeCycle {
                ranges,
                threshold,
                window_pages,
                seed,
                port,
                request,
                until,
                idle_ns,
                stride,
                phase,
            } => probe_cycle(
                &mut self.probe_conn,
                &ranges,
                threshold,
                window_pages,
                seed,
                port,
                request.as_deref(),
                &until,
                idle_ns,
                probe::Phase { stride, phase },
            ),
            Request::LoadProfile { path } => self.load_profile(&path),
            Request::UnloadProfile => {
                if let Some(p) = self.profile.take() {
                    log(&format!("profile {} unloaded", p.path));
                }
                self.republish();
                Ok(Reply::Ok)
            }
            Request::Configure {
                port,
                replay,
                replay_until,
                split_cpus,
            } => self.configure(port, replay, replay_until, split_cpus),
            Request::SetEnabled { enabled } => {
                let was = track::ENABLED.swap(enabled, Ordering::SeqCst);
                if enabled && !was {
                    track::forget_busy_periods();
                    if let Ok(mut g) = log::DISABLED_REASON.lock() {
                        *g = None;
                    }
                }
                log(&format!(
                    "agent {} by request",
                    if enabled { "enabled" } else { "disabled" }
                ));
                Ok(Reply::Ok)
            }
            Request::CommStart { config } => {
                comm::start(config, false)?;
                Ok(Reply::Ok)
            }
            Request::CommStop => {
                comm::stop();
                Ok(Reply::Comm(comm::report()))
            }
            Request::CommReset => {
                comm::reset();
                Ok(Reply::Ok)
            }
            Request::CommReport => Ok(Reply::Comm(comm::report())),
        }
    }

    fn status(&self) -> Reply {
        let reason = log::DISABLED_REASON.lock().ok().and_then(|g| g.clone());
        Reply::Status {
            pid: sys::getpid(),
            exe: std::fs::read_link("/proc/self/exe")
                .map(|p| p.to_string_lossy().into_owned())
                .unwrap_or_default(),
            enabled: track::ENABLED.load(Ordering::SeqCst) && track::ACTIVE.load(Ordering::SeqCst),
            disabled_reason: reason,
            threads_seen: track::threads_seen(),
            ports: track::port_stats(),
            preheat: STATS.snapshot(),
            profile: self.profile.as_ref().map(|p| p.path.clone()),
            classes: self
                .profile
                .as_ref()
                .map(|p| p.classes.clone())
                .unwrap_or_default(),
        }
    }

    fn load_profile(&mut self, path: &str) -> Result<Reply, String> {
        let bytes = std::fs::read(path).map_err(|e| format!("cannot read profile {path}: {e}"))?;
        let prof = decode_profile(&bytes).map_err(|e| format!("profile {path}: {e}"))?;
        let exe = maps::exe_ident(None)
            .map_err(|e| format!("cannot identify the running executable: {e}"))?;
        check_binary(&prof, &exe).map_err(|e| format!("profile {path} refused: {e}"))?;
        let table = RegionTable::build(
            maps::read_maps(None).map_err(|e| format!("cannot read /proc/self/maps: {e}"))?,
        );
        let mut classes = Vec::new();
        let mut runs = BTreeMap::new();
        let mut skipped = Vec::new();
        for class in &prof.classes {
            if runs.contains_key(&class.port) {
                skipped.push(format!(
                    "port {}: duplicate class ignored ({} lines)",
                    class.port,
                    class.ws.line_count()
                ));
                continue;
            }
            let r = resolve_class(&prof, class.port, &exe, &table)
                .map_err(|e| format!("profile {path} refused: {e}"))?;
            for s in &r.skipped_regions {
                skipped.push(format!(
                    "port {}: {}: {} ({} lines)",
                    r.port, s.region, s.reason, s.lines
                ));
            }
            classes.push(LoadedClass {
                port: r.port,
                lines: r.lines,
                runs: r.runs.len() as u64,
                skipped_lines: r.skipped_lines,
            });
            runs.insert(r.port, r.runs);
        }
        log(&format!(
            "profile {path} loaded: {} classes, {} lines, {} skipped lines",
            classes.len(),
            classes.iter().map(|c| c.lines).sum::<u64>(),
            classes.iter().map(|c| c.skipped_lines).sum::<u64>()
        ));
        self.profile = Some(LoadedProfile {
            path: path.to_string(),
            classes: classes.clone(),
            runs,
        });
        self.republish();
        Ok(Reply::Loaded {
            path: path.to_string(),
            classes,
            skipped_regions: skipped,
        })
    }

    fn configure(
        &mut self,
        port: u16,
        replay: Option<String>,
        replay_until: Option<String>,
        split_cpus: Vec<u32>,
    ) -> Result<Reply, String> {
        if port == 0 {
            return Err("configure: port 0 is not a port".into());
        }
        let online = os::online_cpus();
        if split_cpus.len() > MAX_SPLIT {
            return Err(format!(
                "configure: at most {MAX_SPLIT} split CPUs (got {})",
                split_cpus.len()
            ));
        }
        if let Some(bad) = split_cpus.iter().find(|&&c| c as usize >= online) {
            return Err(format!(
                "configure: split CPU {bad} does not exist ({online} CPUs online)"
            ));
        }
        let pc = self.ports.entry(port).or_default();
        // Split preheater (created here, in the process that uses it).
        if split_cpus != pc.split_cpus {
            pc.par = if split_cpus.is_empty() {
                None
            } else {
                let cpus: Vec<usize> = split_cpus.iter().map(|&c| c as usize).collect();
                Some(Arc::new(ParallelPreheater::new(&cpus).map_err(|e| {
                    format!("configure: cannot start split preheat workers on {cpus:?}: {e}")
                })?))
            };
            pc.split_cpus = split_cpus;
        }
        // Replay connection.
        let want = replay.filter(|r| !r.is_empty()).map(|r| {
            (
                r.into_bytes(),
                replay_until.unwrap_or_default().into_bytes(),
            )
        });
        let same = match (&want, &pc.replay) {
            (Some((req, until)), Some(c)) => {
                c.request == *req && c.until == *until && !c.broken.load(Ordering::Acquire)
            }
            (None, None) => true,
            _ => false,
        };
        let mut result = Ok(Reply::Ok);
        if !same {
            if let Some(old) = pc.replay.take() {
                old.replace_fd(-1);
            }
            if let Some((req, until)) = want {
                match connect_replay(port) {
                    Ok(fd) => {
                        pc.replay = Some(Arc::new(ReplayConn::new(port, req, until, fd)));
                        log(&format!("port {port}: replay connection open"));
                    }
                    Err(e) => {
                        result = Err(format!(
                            "configure: cannot open the replay connection to 127.0.0.1:{port}: {e}"
                        ))
                    }
                }
            }
        }
        self.republish();
        result
    }

    /// Build a plan from the profile and port configuration and publish it.
    fn republish(&mut self) {
        let mut ports: Vec<u16> = self.ports.keys().copied().collect();
        if let Some(p) = &self.profile {
            ports.extend(p.runs.keys().copied());
        }
        ports.sort_unstable();
        ports.dedup();
        let mut plan = Plan::default();
        for port in ports {
            let runs = self
                .profile
                .as_ref()
                .and_then(|p| p.runs.get(&port))
                .cloned()
                .unwrap_or_default();
            let pc = self.ports.get(&port);
            let split = pc.and_then(|pc| pc.par.clone()).map(|par| {
                let mut pieces = split_runs(&runs, par.workers() + 1).into_iter();
                let local = pieces.next().unwrap_or_default();
                Split {
                    par,
                    local,
                    pieces: pieces.collect(),
                }
            });
            plan.ports.push(PortPlan {
                port,
                runs,
                split,
                replay: pc.and_then(|pc| pc.replay.clone()),
            });
        }
        if let Some(old) = plan::publish(Arc::new(plan)) {
            self.retired.push(old);
        }
        self.retired.retain(|p| Arc::strong_count(p) > 1);
    }
}

fn request_name(r: &Request) -> &'static str {
    match r {
        Request::Status => "status",
        Request::Candidates => "candidates",
        Request::Calibrate => "calibrate",
        Request::ProbeFlush { .. } => "probe_flush",
        Request::ProbeReload { .. } => "probe_reload",
        Request::ProbeCycle { .. } => "probe_cycle",
        Request::LoadProfile { .. } => "load_profile",
        Request::UnloadProfile => "unload_profile",
        Request::Configure { .. } => "configure",
        Request::SetEnabled { .. } => "set_enabled",
        Request::CommStart { .. } => "comm_start",
        Request::CommStop => "comm_stop",
        Request::CommReset => "comm_reset",
        Request::CommReport => "comm_report",
    }
}

/// Open the persistent loopback replay connection (non-blocking, no Nagle).
fn connect_replay(port: u16) -> std::io::Result<RawFd> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let s = TcpStream::connect_timeout(&addr, Duration::from_secs(1))?;
    s.set_nodelay(true)?;
    s.set_nonblocking(true)?;
    let fd = s.into_raw_fd();
    fdreg::register_fd(fd);
    Ok(fd)
}

/// Wait (bounded) until every server thread seen in a wait call is back in it, so the request
/// that was just served has finished its busy period. Slots of threads that died are freed.
fn quiesce() {
    let t0 = Instant::now();
    let mut busy = Vec::new();
    loop {
        track::busy_threads(&mut busy);
        if busy.is_empty() {
            return;
        }
        if t0.elapsed() >= QUIESCE_MAX {
            for &tid in &busy {
                if !std::path::Path::new(&format!("/proc/self/task/{tid}")).exists() {
                    track::release_thread(tid);
                }
            }
            return;
        }
        std::thread::sleep(QUIESCE_POLL);
    }
}

/// `Request::ProbeCycle`. Everything that allocates, reads `/proc` or connects happens before
/// the flush; between flush and reload the thread only issues raw send/recv syscalls and spins,
/// so the probed window holds the request and little else.
///
/// The preparation (load the unprobed phase, flush the probed one) and the reload run pinned to
/// the CPU that served the port last: unprobed lines must sit in *that* core's L2 (an L2 miss
/// there could make its adjacent-line prefetcher fetch a probed line), and lines in another
/// core's L2 reload too slowly to count as hits. In between, the thread is unpinned so it never
/// competes with the server for its CPU.
#[allow(clippy::too_many_arguments)]
fn probe_cycle(
    conn_slot: &mut Option<(u16, TcpStream)>,
    ranges: &[Range],
    threshold: u32,
    window_pages: u32,
    seed: u64,
    port: u16,
    request: Option<&str>,
    until: &str,
    idle_ns: u64,
    phase: probe::Phase,
) -> Result<Reply, String> {
    const REPLY_MAX: usize = 1 << 20;
    const REPLY_TIMEOUT_NS: u64 = 2_000_000_000;
    let valid = validate_ranges(ranges)?;
    let lines: u64 = valid.iter().map(|r| r.len.div_ceil(64)).sum();
    let mut hits = Vec::with_capacity(lines.min(1 << 22) as usize);
    let mut busy: Vec<u32> = Vec::with_capacity(track::MAX_THREADS);
    let mut reply = vec![0u8; REPLY_MAX];
    if request.is_some() && conn_slot.as_ref().map(|c| c.0) != Some(port) {
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let st = TcpStream::connect_timeout(&addr, Duration::from_secs(1))
            .map_err(|e| format!("probe connection to port {port}: {e}"))?;
        st.set_nodelay(true).map_err(|e| e.to_string())?;
        st.set_nonblocking(true).map_err(|e| e.to_string())?;
        let fd = st.as_raw_fd();
        *conn_slot = Some((port, st));
        // The first request on a new connection takes other paths (accept, buffers): not
        // measured.
        if let Some(req) = request {
            let r = exchange(
                fd,
                req.as_bytes(),
                until.as_bytes(),
                &mut reply,
                REPLY_TIMEOUT_NS,
            );
            if r.is_err() {
                *conn_slot = None;
            }
            r?;
        }
    }
    let fd = conn_slot.as_ref().map(|c| c.1.as_raw_fd());
    let t_quiet = time::now_ns();
    quiesce_spin(&mut busy, t_quiet + 50_000_000);
    let saved = os::get_affinity();
    let server_cpu = track::target_cpu(port).0 as usize;
    let pin = |on: bool| {
        let _ = if on {
            os::set_affinity(&[server_cpu])
        } else {
            os::set_affinity(&saved)
        };
    };
    pin(true);
    probe::prepare_phase(&valid, phase);
    pin(false);
    let t_flushed = time::now_ns();
    match (fd, request) {
        (Some(fd), Some(req)) => {
            let r = exchange(
                fd,
                req.as_bytes(),
                until.as_bytes(),
                &mut reply,
                REPLY_TIMEOUT_NS,
            );
            if r.is_err() {
                pin(false);
                *conn_slot = None;
            }
            r?
        }
        _ => {
            let end = t_flushed + idle_ns.min(100_000_000);
            while time::now_ns() < end {
                std::hint::spin_loop();
            }
        }
    }
    quiesce_spin(&mut busy, time::now_ns() + 50_000_000);
    // The server may have unmapped (or given back) memory while it served the request: a reload
    // of a page that is gone would kill it. Look again right before reloading and skip the round
    // if anything changed (issue 13, bug 1: this narrows the window to the next few
    // microseconds, during which the server's threads are quiet; it does not close it).
    if validate_ranges(&valid)? != valid {
        return Err(
            "the server's mappings changed while it served the request: round skipped".into(),
        );
    }
    pin(true);
    let t_reload = time::now_ns();
    let probed = probe::reload_phase(&valid, threshold, window_pages, seed, phase, &mut hits);
    let elapsed_ns = time::now_ns().saturating_sub(t_reload);
    pin(false);
    Ok(Reply::Probed {
        hits,
        probed,
        elapsed_ns,
        window_ns: t_reload.saturating_sub(t_flushed),
    })
}

/// Send `req` and spin on non-blocking raw receives until the reply ends with `until`.
fn exchange(
    fd: RawFd,
    req: &[u8],
    until: &[u8],
    buf: &mut [u8],
    timeout_ns: u64,
) -> Result<(), String> {
    let deadline = time::now_ns() + timeout_ns;
    let mut sent = 0;
    while sent < req.len() {
        match sys::send_nonblocking(fd, &req[sent..]) {
            Ok(n) => sent += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::hint::spin_loop(),
            Err(e) => return Err(format!("probe request: {e}")),
        }
        if time::now_ns() > deadline {
            return Err("probe request: send timed out".into());
        }
    }
    let mut got = 0;
    loop {
        if got == buf.len() {
            return Err("probe reply larger than 1 MiB without its terminator".into());
        }
        match sys::recv_nonblocking(fd, &mut buf[got..]) {
            Ok(0) => return Err("server closed the probe connection".into()),
            Ok(n) => {
                got += n;
                if buf[..got].ends_with(until) {
                    return Ok(());
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::hint::spin_loop(),
            Err(e) => return Err(format!("probe reply: {e}")),
        }
        if time::now_ns() > deadline {
            return Err("probe reply timed out".into());
        }
    }
}

/// Spin (no sleeping, no allocation: `busy` is pre-sized) until no server thread is busy or
/// `deadline_ns` passes.
fn quiesce_spin(busy: &mut Vec<u32>, deadline_ns: u64) {
    loop {
        track::busy_threads(busy);
        if busy.is_empty() || time::now_ns() > deadline_ns {
            return;
        }
        std::hint::spin_loop();
    }
}

/// Mappings the probe may touch: readable, not special, not device memory.
fn probe_safe(m: &Mapping) -> bool {
    if m.is_special() || !m.read {
        return false;
    }
    let n = m.name.as_str();
    !(n.starts_with("/dev/") && !n.starts_with("/dev/shm/") && !n.starts_with("/dev/zero"))
}

/// Clip `ranges` to what is mapped, readable and resident now (`/proc/self/maps` and mincore):
/// flushing or loading an unmapped address would SIGSEGV the host, a page past the end of a
/// truncated file SIGBUS.
fn validate_ranges(ranges: &[Range]) -> Result<Vec<Range>, String> {
    let text = std::fs::read_to_string("/proc/self/maps")
        .map_err(|e| format!("cannot read /proc/self/maps: {e}"))?;
    let mut maps = maps::parse_maps(&text);
    maps.sort_by_key(|m| m.start);
    let mut out = Vec::new();
    for r in ranges {
        let (lo, hi) = (r.start, r.start.saturating_add(r.len));
        let first = maps.partition_point(|m| m.end <= lo);
        for m in maps.iter().skip(first) {
            if m.start >= hi {
                break;
            }
            if !probe_safe(m) {
                continue;
            }
            let (a, b) = (lo.max(m.start), hi.min(m.end));
            if a < b {
                for (s, l) in maps::resident_ranges(a, b - a) {
                    out.push(Range { start: s, len: l });
                }
            }
        }
    }
    Ok(out)
}

/// Resident ranges of the process's usable mappings, excluding the agent's own library, data
/// and thread stacks, capped at [`CANDIDATE_CAP`].
fn candidates() -> Result<Reply, String> {
    let maps = maps::read_maps(None).map_err(|e| format!("cannot read /proc/self/maps: {e}"))?;
    let so = config::agent_so_path();
    let mut own: Vec<u64> = threads::agent_stack_addresses();
    own.extend(track::static_addresses());
    own.push(candidates as *const () as u64);
    let mut ranges = Vec::new();
    let mut total = 0u64;
    let mut capped = false;
    'maps: for m in &maps {
        if !probe_safe(m) {
            continue;
        }
        let path = m.file.as_ref().map(|f| f.path.as_str()).unwrap_or(&m.name);
        if so.is_some_and(|so| so == path || so == m.name) {
            continue;
        }
        if own.iter().any(|&a| a >= m.start && a < m.end) {
            continue;
        }
        for (s, l) in maps::resident_ranges(m.start, m.len()) {
            let l = l.min(CANDIDATE_CAP - total);
            if l == 0 {
                capped = true;
                break 'maps;
            }
            ranges.push(Range { start: s, len: l });
            total += l;
        }
    }
    if capped || total >= CANDIDATE_CAP {
        log(&format!(
            "candidates capped at {} MiB (the process has more resident memory)",
            CANDIDATE_CAP >> 20
        ));
    }
    Ok(Reply::Candidates {
        ranges,
        total_bytes: total,
    })
}
