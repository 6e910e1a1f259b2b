//! Recording and loading the server's code and read-only data lines from outside: the agent's
//! probe requests (`calibrate`, `candidates`, `probe_connect`, `probe_cycle`) and its profile
//! requests (`load_profile`, `unload_profile`), answered through a
//! [`preheat_engine::fileview::FileView`] of the server's file-backed, read-only
//! mappings — the same page-cache pages, so the same cache lines. The CLI's recorder
//! (`preheat-estimate`) drives them exactly as it drives the agent, and `lines` then loads the
//! recorded lines through the view from the worker on the server's CPU.
//!
//! Where this differs from the agent's probe (`preheat-agent`'s `control/cycle.rs`):
//!
//! * Only file-backed, read-only memory: the executable's code and read-only data, and those of
//!   its libraries where it has any. Heap, stacks and a Go heap (anonymous memory) can neither
//!   be flushed nor timed from another process; their lines are not recorded.
//! * The server's threads are not seen entering their wait calls: after the request's reply
//!   the probe waits [`SETTLE`] for the server to finish (its CPU is free meanwhile), then
//!   reloads. Lines its other threads touch in that window (a Go runtime's background work)
//!   come in the request-less samples too, which the recorder subtracts.
//! * Our own mappings never go away, so nothing is validated between flush and reload.

use std::time::Duration;

use preheat_engine::{os, probe, time};
use preheat_model::proto::{LoadedClass, ProbeCycle, Reply, PROBE_CONN_CLOSED};
use preheat_model::{decode_profile, resolve_class, RegionTable};

use crate::replay::WarmUp;
use crate::state::{Lines, Shared};

/// Hit and miss reloads timed by a calibration (as the agent's).
const CALIBRATE_SAMPLES: u32 = 2000;
/// Candidates offered at most (as the agent's cap).
const CANDIDATE_CAP: u64 = 256 << 20;
/// How long a probe request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// After the reply, the server's thread finishes its request (writes, returns to its wait)
/// on its CPU before the reload. Twice the scheduler's base slice, so a thread that was
/// runnable behind ours has run.
pub const SETTLE: Duration = Duration::from_micros(1500);

/// Run `f` pinned to the server's CPU, then restore the calling thread's affinity.
fn on_server_cpu<T>(shared: &Shared, f: impl FnOnce() -> T) -> Result<T, String> {
    os::on_cpu(shared.cfg.cpu, f)
        .map_err(|e| format!("cannot run on the server's CPU {}: {e}", shared.cfg.cpu))
}

/// `calibrate`: the hit/miss threshold, timed on the server's CPU.
pub fn calibrate(shared: &Shared) -> Result<Reply, String> {
    let c = on_server_cpu(shared, || probe::calibrate(CALIBRATE_SAMPLES))?;
    Ok(Reply::Calibration {
        hit_ticks_p50: c.hit_ticks_p50,
        miss_ticks_p50: c.miss_ticks_p50,
        threshold: c.threshold,
        samples: c.samples,
    })
}

/// `candidates`: the server's resident file pages under the view (its addresses).
pub fn candidates(shared: &Shared) -> Result<Reply, String> {
    let ranges = shared
        .probe
        .view()?
        .resident(CANDIDATE_CAP)
        .map_err(|e| format!("reading pid {}'s page map: {e}", shared.cfg.pid))?;
    let total_bytes = ranges.iter().map(|r| r.len).sum();
    Ok(Reply::Candidates {
        ranges,
        total_bytes,
    })
}

/// `probe_connect`: a connection of the probe's own to the port, on which the server answered
/// `request` and its busy periods grew (this process serves it).
pub fn probe_connect(
    shared: &Shared,
    port: u16,
    request: String,
    until: String,
) -> Result<Reply, String> {
    shared.check_port(port)?;
    let w = WarmUp {
        request: request.into_bytes(),
        until: until.into_bytes(),
    };
    let before = busy_periods(shared);
    let mut conn = shared.probe.conn();
    conn.drop_connection();
    conn.exchange(port, &w, REQUEST_TIMEOUT)
        .map_err(|e| format!("the probe's request failed: {e:#}"))?;
    std::thread::sleep(SETTLE);
    if busy_periods(shared) <= before {
        conn.drop_connection();
        return Err(format!(
            "pid {} showed no busy period for the probe's request on port {port}: another \
             process serves the connection",
            shared.cfg.pid
        ));
    }
    Ok(Reply::Ok)
}

fn busy_periods(shared: &Shared) -> u64 {
    crate::busy::refresh(shared);
    shared.inner().port.busy_periods
}

/// `probe_cycle`: flush the lines of `c.ranges` of its phase on the server's CPU, send the
/// request from here (or let `idle_ns` pass), let the server settle, reload on its CPU.
pub fn probe_cycle(shared: &Shared, c: ProbeCycle) -> Result<Reply, String> {
    shared.check_port(c.port)?;
    let phase = probe::Phase::of(&c);
    let view = shared.probe.view()?;
    let mut conn = shared.probe.conn();
    let w = c.request.map(|r| WarmUp {
        request: r.into_bytes(),
        until: c.until.into_bytes(),
    });
    if let Some(w) = &w {
        if conn.opened == 0 {
            // The first request on a connection takes other paths (accept): never measured.
            conn.exchange(c.port, w, REQUEST_TIMEOUT)
                .map_err(|e| format!("{e:#}: {PROBE_CONN_CLOSED}"))?;
        }
    }
    on_server_cpu(shared, || view.prepare_phase(&c.ranges, phase))?;
    let t_flushed = time::now_ns();
    match &w {
        Some(w) => {
            let opened = conn.opened;
            conn.exchange(c.port, w, REQUEST_TIMEOUT)
                .map_err(|e| format!("{e:#}: {PROBE_CONN_CLOSED}"))?;
            if conn.opened > opened {
                // The server had closed the connection: this request took the accept path.
                return Err(format!("a new probe connection: {PROBE_CONN_CLOSED}"));
            }
            std::thread::sleep(SETTLE);
        }
        None => std::thread::sleep(Duration::from_nanos(c.idle_ns.min(100_000_000))),
    }
    let lines: u64 = c.ranges.iter().map(|r| r.len.div_ceil(64)).sum();
    let mut hits = Vec::with_capacity(lines.min(1 << 22) as usize);
    let (t_reload, probed, elapsed_ns) = on_server_cpu(shared, || {
        let t = time::now_ns();
        let probed = view.reload_phase(
            &c.ranges,
            c.threshold,
            c.window_pages,
            c.seed,
            phase,
            &mut hits,
        );
        (t, probed, time::now_ns().saturating_sub(t))
    })?;
    Ok(Reply::Probed {
        hits,
        probed,
        elapsed_ns,
        window_ns: t_reload.saturating_sub(t_flushed),
    })
}

/// `load_profile`: resolve the profile's class for the port against the view (file regions
/// only; the rest is listed as skipped) and make it what `lines` loads.
pub fn load_profile(shared: &Shared, path: &str) -> Result<Reply, String> {
    let view = shared.probe.view()?;
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read profile {path}: {e}"))?;
    let prof = decode_profile(&bytes).map_err(|e| format!("profile {path}: {e}"))?;
    let pid = shared.cfg.pid;
    let exe = preheat_engine::maps::exe_ident(Some(pid))
        .map_err(|e| format!("cannot identify pid {pid}'s executable: {e}"))?;
    let table = RegionTable::build(view.local_mappings());
    let port = shared.cfg.port;
    let r = resolve_class(&prof, port, &exe, &table)
        .map_err(|e| format!("profile {path} refused: {e}"))?;
    let mut skipped: Vec<String> = r
        .skipped_regions
        .iter()
        .map(|s| {
            format!(
                "port {port}: {}: {} ({} lines; from outside only file-backed read-only \
                 memory is reachable)",
                s.region, s.reason, s.lines
            )
        })
        .collect();
    skipped.extend(
        prof.classes
            .iter()
            .filter(|c| c.port != port)
            .map(|c| format!("port {}: not the port preheated from outside", c.port)),
    );
    let class = LoadedClass {
        port,
        lines: r.lines,
        runs: r.runs.len() as u64,
        skipped_lines: r.skipped_lines,
    };
    let mut inner = shared.inner();
    inner.lines = Some(std::sync::Arc::new(Lines {
        path: path.to_string(),
        class: class.clone(),
        runs: r.runs,
    }));
    Ok(Reply::Loaded {
        path: path.to_string(),
        classes: vec![class],
        skipped_regions: skipped,
    })
}
