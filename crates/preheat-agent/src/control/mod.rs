//! The control thread: serves `<run-dir>/agent-<pid>.sock` (one JSON [`Request`] per line, one
//! JSON [`Reply`] per line; several clients at once), owns the loaded profile and the per-port
//! configuration, and publishes what the workers act on ([`crate::plan`]).
//!
//! Every request runs under `catch_unwind`: a panic disables the agent (hooks pass through),
//! records the reason for `Status`, is logged, and is answered with `Reply::Error`; the thread
//! keeps serving so the reason can be read. Errors never reach the host.
//!
//! This file is the thread and the request dispatch; the concepts behind the requests live
//! beside it: `cycle.rs` (flush+reload probe cycles), `ranges.rs` (probe candidates and range
//! validation), `profile.rs` (profile, per-port configuration, the published plan), `served.rs`
//! (loopback connections this process serves: prefork servers and servers that close every
//! connection).

mod cycle;
mod profile;
mod ranges;
mod served;

use std::collections::BTreeMap;
use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use preheat_engine::{probe, time};
use preheat_model::proto::{Range, Reply, Request, Strategies};

use crate::counters::STATS;
use crate::log::{self, log};
use crate::plan::Plan;
use crate::{comm, config, fdreg, sys, track};
use cycle::{guarded, probe_cycle, quiesce};
use profile::{LoadedProfile, PortConfig};
use ranges::{candidates, validate_ranges};

pub use ranges::CANDIDATE_CAP;

/// Samples per class for `Calibrate`.
const CALIBRATE_SAMPLES: u32 = 2000;
/// Longest control request line.
const MAX_LINE: usize = 64 << 20;
struct Client {
    stream: UnixStream,
    buf: Vec<u8>,
    /// The descriptor that came with the client's bytes (`SCM_RIGHTS`, sent with its
    /// `ProbeAdopt`): it goes to the next request line completed, and is closed if that does
    /// not take it.
    fd: Option<OwnedFd>,
}

struct Control {
    /// The `ProbeCycle` connection (port, stream), kept open across cycles: closing it after
    /// every cycle makes the server handle the FIN during the next cycle's window.
    probe_conn: Option<cycle::ProbeConn>,
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
        c.load_startup_profile(&p);
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
        // An fd of ours was closed behind our back (in a table shared with the host: a raw
        // close_range/closefrom in the host, which the hooks cannot see): its number may
        // already belong to the host, so never
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
            accept_clients(&listener, &mut clients);
        }
    }
}

/// Accept every pending connection on the control socket as a client.
fn accept_clients(listener: &UnixListener, clients: &mut Vec<Client>) {
    loop {
        match listener.accept() {
            Ok((s, _)) => {
                let _ = s.set_nonblocking(false);
                let _ = s.set_write_timeout(Some(Duration::from_secs(5)));
                fdreg::register_fd(s.as_raw_fd());
                clients.push(Client {
                    stream: s,
                    buf: Vec::new(),
                    fd: None,
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

fn pollfd(fd: RawFd) -> libc::pollfd {
    libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }
}

impl Control {
    fn poll_timeout_ms(&self) -> i32 {
        let t = self.base_timeout_ms();
        // Warm-up connections of fresh-connection ports are closed once answered.
        match self.fresh_reap_timeout_ms() {
            Some(f) if t < 0 || f < t => f,
            _ => t,
        }
    }

    fn base_timeout_ms(&self) -> i32 {
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

    /// Read what the client sent and answer every complete line. False: drop the client.
    fn serve_client(&mut self, cl: &mut Client) -> bool {
        let mut tmp = [0u8; 64 * 1024];
        let mut passed = Vec::new();
        let read =
            preheat_engine::fdpass::recv_with_fds(cl.stream.as_raw_fd(), &mut tmp, &mut passed);
        // A client sends one, with its `ProbeAdopt`; any others are closed here.
        if let Some(fd) = passed.pop() {
            cl.fd = Some(fd);
        }
        let n = match read {
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
            let reply = self.handle_line(text, cl.fd.take());
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

    /// Load the profile named by `PREHEAT_PROFILE` at start-up, and log what it holds.
    fn load_startup_profile(&mut self, p: &str) {
        match self.load_profile(p) {
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

    /// One request line; `fd`: a descriptor that came with it (see [`Client::fd`]).
    fn handle_line(&mut self, text: &str, fd: Option<OwnedFd>) -> Reply {
        let req: Request = match serde_json::from_str(text) {
            Ok(r) => r,
            Err(e) => {
                return Reply::Error {
                    message: format!("bad request: {e}"),
                }
            }
        };
        let name = req.name();
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.handle(req, fd))) {
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

    /// The probe's connection: opened here, handed over by the caller, or closed.
    fn probe_connection(&mut self, req: Request, fd: Option<OwnedFd>) -> Result<(), String> {
        match req {
            Request::ProbeConnect {
                port,
                request,
                until,
            } => cycle::probe_connect(&mut self.probe_conn, port, &request, &until),
            Request::ProbeAdopt {
                port,
                request,
                until,
            } => cycle::probe_adopt(&mut self.probe_conn, fd, port, &request, &until),
            _ => {
                self.probe_conn = None;
                Ok(())
            }
        }
    }

    fn handle(&mut self, req: Request, fd: Option<OwnedFd>) -> Result<Reply, String> {
        match req {
            Request::Status => Ok(self.status()),
            Request::Candidates => candidates(),
            Request::Calibrate => Ok(calibration()),
            Request::ProbeFlush { ranges } => {
                let valid = validate_ranges(&ranges)?;
                // SAFETY: `validate_ranges` just clipped `valid` to resident pages of readable,
                // probe-safe mappings in /proc/self/maps; the agent never unmaps host memory (a
                // page the comm detector protects is restored by its fault handler). The host is
                // not paused, though: a host thread may unmap these pages during the flush
                // (issue 13, bug 1), and `guarded` resumes the fault that makes.
                guarded("flush", || unsafe { probe::flush(&valid) })?;
                Ok(Reply::Ok)
            }
            Request::ProbeReload {
                ranges,
                threshold,
                window_pages,
                seed,
            } => probe_reload(&ranges, threshold, window_pages, seed),
            r @ (Request::ProbeConnect { .. }
            | Request::ProbeAdopt { .. }
            | Request::ProbeRelease) => self.probe_connection(r, fd).map(|()| Reply::Ok),
            Request::ProbeCycle(c) => probe_cycle(&mut self.probe_conn, &c),
            Request::LoadProfile { path } => self.load_profile(&path),
            Request::UnloadProfile => Ok(self.unload_profile()),
            Request::Configure {
                port,
                replay,
                replay_until,
                split_cpus,
                replay_via,
            } => self.configure(port, (replay, replay_until, replay_via), split_cpus),
            Request::ConfigureSession {
                port,
                request,
                until,
            } => self.configure_session(port, request, until, fd),
            Request::SetAuto { port, strategies } => {
                if strategies.is_some_and(|s| s.contains(Strategies::AUTO)) {
                    return Err("set_auto: a choice cannot itself be auto".into());
                }
                crate::plan::set_auto(port, strategies)?;
                log(&format!(
                    "port {port}: auto announcements do {}",
                    strategies.map_or_else(
                        || format!(
                            "{} (no measured choice)",
                            Strategies::AUTO_UNMEASURED.name()
                        ),
                        |s| s.name()
                    )
                ));
                Ok(Reply::Ok)
            }
            Request::SetEnabled { enabled } => {
                set_enabled(enabled);
                Ok(Reply::Ok)
            }
            Request::Hold { arrival_ns } => {
                if arrival_ns == 0 {
                    crate::hold::close();
                } else {
                    crate::hold::open(preheat_engine::time::now_ns(), arrival_ns);
                }
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
        let reason = log::disabled_reason();
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
}

/// `Request::Calibrate`: the probe's hit/miss threshold, measured now.
fn calibration() -> Reply {
    let c = probe::calibrate(CALIBRATE_SAMPLES);
    Reply::Calibration {
        hit_ticks_p50: c.hit_ticks_p50,
        miss_ticks_p50: c.miss_ticks_p50,
        threshold: c.threshold,
        samples: c.samples,
    }
}

/// `Request::ProbeReload`: once the server's threads are back in their wait calls, reload
/// every line of `ranges` still mapped and resident.
fn probe_reload(
    ranges: &[Range],
    threshold: u32,
    window_pages: u32,
    seed: u64,
) -> Result<Reply, String> {
    quiesce();
    let valid = validate_ranges(ranges)?;
    let lines: u64 = valid.iter().map(|r| r.len.div_ceil(64)).sum();
    let mut hits = Vec::with_capacity(lines.min(1 << 22) as usize);
    let mut t0 = 0;
    // SAFETY: `valid` was clipped just now (after `quiesce`: the host's tracked threads
    // are in their wait calls) to resident pages of readable, probe-safe mappings; the
    // agent never unmaps host memory (a page the comm detector protects is restored by
    // its fault handler). A host thread may still unmap them during the reload (issue
    // 13, bug 1), and `guarded` resumes the fault that makes.
    let probed = guarded("reload", || unsafe {
        t0 = time::now_ns();
        probe::reload(&valid, threshold, window_pages, seed, &mut hits)
    })?;
    let elapsed_ns = time::now_ns().saturating_sub(t0);
    Ok(Reply::Probed {
        hits,
        probed,
        elapsed_ns,
        window_ns: 0,
    })
}

/// `Request::SetEnabled`: switch the agent on or off (on again: with fresh busy periods and no
/// disabled reason).
fn set_enabled(enabled: bool) {
    let was = track::ENABLED.swap(enabled, Ordering::SeqCst);
    if enabled && !was {
        track::forget_busy_periods();
        log::clear_disabled_reason();
    }
    log(&format!(
        "agent {} by request",
        if enabled { "enabled" } else { "disabled" }
    ));
}
