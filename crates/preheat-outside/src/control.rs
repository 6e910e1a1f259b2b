//! The agent's control socket, served from outside: JSON lines, one request and one reply each
//! ([`preheat_model::proto`]). `status`, `configure`, `set_auto` and `set_enabled` work as in
//! the agent; the probe's and the profile's requests through the view of the server's
//! read-only file-backed memory ([`crate::probe`]); the requests that need the server's memory
//! from inside (the flush and reload of arbitrary ranges, communication detection) are refused,
//! saying why.

use std::io::{BufRead, BufReader, ErrorKind, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use preheat_model::proto::{Reply, Request};

use crate::probe;
use crate::replay::{Conn, WarmUp};
use crate::state::Shared;

/// How often a connection's thread waiting for a request checks whether it should stop (the
/// accept loop is woken by a connection of the stopping owner instead). These threads run on
/// the caller's CPU, not the server's.
const STOP_CHECK: Duration = Duration::from_millis(500);
/// The longest request line taken.
const MAX_LINE: usize = 1 << 20;

/// Bind the control socket at `path` (a stale file there was removed by the caller).
pub fn bind(path: &Path) -> Result<UnixListener> {
    UnixListener::bind(path)
        .with_context(|| format!("binding the control socket {}", path.display()))
}

/// Accept control connections until told to stop (the owner sets the flag, then connects once
/// to wake the accept); each is served on a thread of its own (the demo holds several at once).
pub fn run(shared: &Arc<Shared>, listener: UnixListener) {
    let mut clients = Vec::new();
    loop {
        let accepted = listener.accept();
        if shared.stop.load(Ordering::Acquire) {
            break;
        }
        match accepted {
            Ok((s, _)) => {
                let sh = shared.clone();
                if let Ok(h) = std::thread::Builder::new()
                    .name("preheat-out-cl".into())
                    .spawn(move || serve(&sh, s))
                {
                    clients.push(h);
                }
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
        clients.retain(|h: &std::thread::JoinHandle<()>| !h.is_finished());
    }
    for h in clients {
        let _ = h.join();
    }
}

/// Serve one control connection until the peer closes it or we stop.
fn serve(shared: &Shared, s: UnixStream) {
    if s.set_nonblocking(false).is_err() || s.set_read_timeout(Some(STOP_CHECK)).is_err() {
        return;
    }
    let Ok(mut out) = s.try_clone() else {
        return;
    };
    let mut r = BufReader::new(s);
    let mut line = Vec::new();
    while !shared.stop.load(Ordering::Acquire) {
        match r.read_until(b'\n', &mut line) {
            Ok(0) => return,
            Ok(_) if line.ends_with(b"\n") => {}
            Ok(_) => continue,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                if line.len() > MAX_LINE {
                    return;
                }
                continue;
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(_) => return,
        }
        let reply = handle_line(shared, &line);
        line.clear();
        let mut text = serde_json::to_string(&reply).unwrap_or_else(|e| {
            format!(r#"{{"reply":"error","message":"cannot encode reply: {e}"}}"#)
        });
        text.push('\n');
        if out.write_all(text.as_bytes()).is_err() {
            return;
        }
    }
}

fn handle_line(shared: &Shared, line: &[u8]) -> Reply {
    match serde_json::from_slice::<Request>(line) {
        Ok(req) => handle(shared, req).unwrap_or_else(|message| Reply::Error { message }),
        Err(e) => Reply::Error {
            message: format!("bad request: {e}"),
        },
    }
}

/// One request's reply; `Err`: the error reply's message.
pub fn handle(shared: &Shared, req: Request) -> Result<Reply, String> {
    let cfg = &shared.cfg;
    match req {
        Request::Status => Ok(status(shared)),
        Request::Configure {
            port,
            replay,
            replay_until,
            replay_via,
            ..
        } => {
            shared.check_port(port)?;
            if replay_via.is_some() {
                return Err("a warm-up from another network namespace is not built for \
                            preheating from outside"
                    .into());
            }
            configure(shared, replay, replay_until)
        }
        Request::SetAuto { port, strategies } => {
            shared.check_port(port)?;
            shared.inner().auto = strategies;
            Ok(Reply::Ok)
        }
        Request::SetEnabled { enabled } => {
            shared.enabled.store(enabled, Ordering::Release);
            Ok(Reply::Ok)
        }
        Request::Calibrate => probe::calibrate(shared),
        Request::Candidates => probe::candidates(shared),
        Request::ProbeConnect {
            port,
            request,
            until,
        } => probe::probe_connect(shared, port, request, until),
        Request::ProbeCycle(c) => probe::probe_cycle(shared, c),
        Request::ProbeRelease => {
            shared.probe.conn().drop_connection();
            Ok(Reply::Ok)
        }
        Request::LoadProfile { path } => probe::load_profile(shared, &path),
        Request::UnloadProfile => {
            shared.inner().lines = None;
            Ok(Reply::Ok)
        }
        other => Err(format!(
            "{} needs the in-process agent, which pid {} runs without ({}); from outside only \
             status, configure, set_auto, set_enabled, the probe cycle on read-only \
             file-backed memory and its profiles are served",
            other.name(),
            cfg.pid,
            cfg.why
        )),
    }
}

/// Set the warm-up (or clear it), after checking it on a connection of its own: the server
/// must answer it with a reply that ends as said.
fn configure(
    shared: &Shared,
    replay: Option<String>,
    replay_until: Option<String>,
) -> Result<Reply, String> {
    let warm_up = match (replay, replay_until) {
        (Some(request), Some(until)) if !until.is_empty() => Some(WarmUp {
            request: request.into_bytes(),
            until: until.into_bytes(),
        }),
        (None, _) => None,
        _ => return Err("a warm-up needs the end of its reply (replay_until)".into()),
    };
    if let Some(w) = &warm_up {
        Conn::new()
            .exchange(shared.cfg.port, w, Duration::from_secs(5))
            .map_err(|e| format!("the warm-up request failed: {e:#}"))?;
    }
    shared.inner().warm_up = warm_up.map(Arc::new);
    Ok(Reply::Ok)
}

fn status(shared: &Shared) -> Reply {
    crate::busy::refresh(shared);
    let cfg = &shared.cfg;
    let exe = std::fs::read_link(format!("/proc/{}/exe", cfg.pid))
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default();
    let inner = shared.inner();
    Reply::Status {
        pid: cfg.pid,
        exe,
        enabled: shared.enabled.load(Ordering::Acquire),
        disabled_reason: None,
        threads_seen: inner.tids.len() as u32,
        ports: vec![inner.port.clone()],
        preheat: inner.preheat.clone(),
        profile: inner.lines.as_ref().map(|l| l.path.clone()),
        classes: inner.lines.iter().map(|l| l.class.clone()).collect(),
    }
}
