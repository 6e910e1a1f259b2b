//! Flush+reload probing inside the server (paper §3.1, our user-space stand-in for an L2 tag
//! dump): one `ProbeCycle` per chunk and phase, and the waits for the server's threads to be
//! back in their wait call.

use std::net::TcpStream;
use std::os::fd::{AsRawFd, RawFd};
use std::time::Duration;

use preheat_engine::{os, probe, time};
use preheat_model::proto::{ProbeCycle, Range, Reply};

use super::ranges::validate_ranges;
use super::served::{connect_served_here, fresh_exchange};
use crate::faults::{self, ProbePass, PROBE_FAULTS};
use crate::log::log;
use crate::{sys, track};

/// The probe's loopback connection to a port, served by this process (see [`super::served`]).
pub(super) struct ProbeConn {
    port: u16,
    /// `None`: the server closes every connection; each measured request opens its own.
    stream: Option<TcpStream>,
}

/// `Request::ProbeConnect`: make `conn_slot` a connection to `port` this process serves (kept if
/// it already is one). The first request on a new connection takes other paths (accept,
/// buffers): it is never measured; it also shows whether this process serves the connection.
pub(super) fn probe_connect(
    conn_slot: &mut Option<ProbeConn>,
    port: u16,
    request: &str,
    until: &str,
) -> Result<(), String> {
    if conn_slot.as_ref().map(|c| c.port) == Some(port) {
        return Ok(());
    }
    *conn_slot = None;
    let s = connect_served_here(port, request.as_bytes(), until.as_bytes())?;
    *conn_slot = Some(ProbeConn {
        port,
        stream: s.stream,
    });
    Ok(())
}

/// `Request::ProbeAdopt`: make `conn_slot` the connection `fd` a caller passed, if this process
/// serves it (see [`super::served::adopt_served`]). Without `fd` (nothing came with the
/// request) it is an error.
pub(super) fn probe_adopt(
    conn_slot: &mut Option<ProbeConn>,
    fd: Option<std::os::fd::OwnedFd>,
    port: u16,
    request: &str,
    until: &str,
) -> Result<(), String> {
    *conn_slot = None;
    let fd = fd.ok_or("ProbeAdopt came without a file descriptor (SCM_RIGHTS)")?;
    let st = super::served::adopt_served(fd, port, request.as_bytes(), until.as_bytes())?;
    *conn_slot = Some(ProbeConn {
        port,
        stream: Some(st),
    });
    Ok(())
}

/// Samples taken again when a fresh connection's request was served by another process.
const FRESH_ATTEMPTS: u32 = 16;

/// `ProbeReload` waits at most this long for the server threads to return to their wait call.
const QUIESCE_MAX: Duration = Duration::from_millis(50);
const QUIESCE_POLL: Duration = Duration::from_micros(50);

/// Threads outside their wait calls are looked at this often (ns): one that did not run
/// between two looks is blocked somewhere the agent does not hook and counts as quiet. Long
/// enough that a thread that is runnable but waiting for its CPU (behind this spinning thread,
/// say: the scheduler's base slice is 0.75 ms) runs in between.
const STILL_NS: u64 = 2_000_000;

/// Whether every thread of `busy` stood still (its CPU time unchanged, or the thread gone)
/// since `cpu` last held it, a thread `cpu` does not hold yet counting as moving; `cpu` then
/// holds their CPU times now (one clock read per thread). `busy` threads are outside every
/// wait call the agent hooks, but a runtime's worker may be blocked elsewhere: a JVM thread
/// that once waited in `epoll_wait` parks on a futex, so it never looks quiet to
/// [`track::busy_threads`] (measured: every probe cycle of a JVM HTTP server waited out the
/// 50 ms bound three times, and a recording did not end in 15 minutes). No allocation when
/// `cpu` has room for `busy`.
fn all_still(busy: &[u32], cpu: &mut Vec<(u32, u64)>) -> bool {
    cpu.retain(|(t, _)| busy.contains(t));
    let mut still = !busy.is_empty();
    for &tid in busy {
        let Some(now) = time::thread_cpu_ns_of(tid) else {
            continue; // gone: quiet
        };
        match cpu.iter_mut().find(|(t, _)| *t == tid) {
            Some(e) => {
                still &= e.1 == now;
                e.1 = now;
            }
            None => {
                still = false;
                cpu.push((tid, now));
            }
        }
    }
    still
}

/// Wait until no server thread is busy (outside its wait call and running, see
/// [`all_still`]) or `deadline_ns` passes, sleeping `poll` between looks (spinning without
/// one). Returns whether they are quiet. No allocation: `busy` and `cpu` are pre-sized.
fn wait_quiet(
    busy: &mut Vec<u32>,
    cpu: &mut Vec<(u32, u64)>,
    deadline_ns: u64,
    poll: Option<Duration>,
) -> bool {
    cpu.clear();
    let mut next_look = 0;
    loop {
        track::busy_threads(busy);
        if busy.is_empty() {
            return true;
        }
        let now = time::now_ns();
        if now >= next_look {
            if all_still(busy, cpu) {
                return true;
            }
            next_look = now + STILL_NS;
        }
        if now > deadline_ns {
            return false;
        }
        match poll {
            Some(d) => std::thread::sleep(d),
            None => std::hint::spin_loop(),
        }
    }
}

/// Wait (bounded by [`QUIESCE_MAX`]) until every server thread seen in a wait call is back in it
/// or blocked elsewhere, so the request that was just served has finished its busy period.
/// Slots of threads that died are freed.
pub(super) fn quiesce() {
    let mut busy = Vec::with_capacity(track::MAX_THREADS);
    let mut cpu = Vec::with_capacity(track::MAX_THREADS);
    let deadline = time::now_ns() + QUIESCE_MAX.as_nanos() as u64;
    if !wait_quiet(&mut busy, &mut cpu, deadline, Some(QUIESCE_POLL)) {
        for &tid in &busy {
            if !std::path::Path::new(&format!("/proc/self/task/{tid}")).exists() {
                track::release_thread(tid);
            }
        }
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
pub(super) fn probe_cycle(
    conn_slot: &mut Option<ProbeConn>,
    c: &ProbeCycle,
) -> Result<Reply, String> {
    const REPLY_MAX: usize = 1 << 20;
    let (ranges, port, request, until) = (&c.ranges, c.port, c.request.as_deref(), &c.until);
    let phase = probe::Phase::of(c);
    let mut busy: Vec<u32> = Vec::with_capacity(track::MAX_THREADS);
    let mut cpu: Vec<(u32, u64)> = Vec::with_capacity(track::MAX_THREADS);
    let mut reply = vec![0u8; REPLY_MAX];
    if let Some(req) = request {
        probe_connect(conn_slot, port, req, until)?;
    }
    let conn = conn_slot.as_ref();
    let fd = conn.and_then(|c| c.stream.as_ref()).map(|s| s.as_raw_fd());
    // A server that closes every connection: the measured request opens its own.
    let fresh = conn.is_some_and(|c| c.stream.is_none());
    let t_quiet = time::now_ns();
    quiesce_spin(&mut busy, &mut cpu, t_quiet + 50_000_000);
    let pin = pinning(port);
    // Validate only now, after the (unmeasured) first request on a new connection and with the
    // server's threads quiet: the prepare pass below loads and flushes every line, so it must
    // see the mappings as they are now, not as they were before the server served a request
    // (issue 13, bug 1).
    let valid = validate_ranges(ranges)?;
    let lines: u64 = valid.iter().map(|r| r.len.div_ceil(64)).sum();
    let mut hits = Vec::with_capacity(lines.min(1 << 22) as usize);
    // A server that closes every connection: the measured request opens a fresh one, which
    // another worker of a prefork server may accept; then the sample is taken again (flush
    // again), up to `FRESH_ATTEMPTS` times.
    let mut attempts = 0;
    let t_flushed = loop {
        pin(true);
        // SAFETY: `valid` was clipped just above (after the first request on a new connection,
        // with the host's tracked threads back in their wait calls) to resident pages of
        // readable, probe-safe mappings — on a repeated attempt re-checked unchanged right
        // before this pass; the agent never unmaps host memory (a page the comm detector
        // protects is restored by its fault handler). A host thread that unmaps them in the
        // microseconds since (issue 13, bug 1) makes a line fault: `guarded` runs the pass
        // with the thread's faults resumed at the engine's recovery points.
        let prepared = guarded("prepare", || unsafe { probe::prepare_phase(&valid, phase) });
        pin(false);
        prepared?;
        let t_flushed = time::now_ns();
        match (fd, request) {
            (None, Some(req)) if fresh => {
                if !fresh_request(conn_slot, port, req, until, &mut reply, attempts)? {
                    attempts += 1;
                    quiesce_spin(&mut busy, &mut cpu, time::now_ns() + 50_000_000);
                    unchanged_since_validation(&valid, port)?;
                    continue;
                }
            }
            (Some(fd), Some(req)) => kept_request(conn_slot, fd, req, until, &mut reply)?,
            _ => time::spin_until(t_flushed + c.idle_ns.min(100_000_000)),
        }
        break t_flushed;
    };
    quiesce_spin(&mut busy, &mut cpu, time::now_ns() + 50_000_000);
    // The server may have unmapped (or given back) memory while it served the request: a reload
    // of a page that is gone would kill it. Look again right before reloading and skip the round
    // if anything changed (issue 13, bug 1).
    unchanged_since_validation(&valid, port)?;
    pin(true);
    let mut t_reload = 0;
    // SAFETY: just above, with the host's tracked threads back in their wait calls, `valid` was
    // re-validated against /proc/self/maps and mincore (resident pages of readable, probe-safe
    // mappings) and found unchanged; the agent never unmaps host memory (a page the comm detector
    // protects is restored by its fault handler). A host thread that unmaps them in the
    // microseconds since (issue 13, bug 1) makes a line fault, which `guarded` resumes.
    let probed = guarded("reload", || unsafe {
        t_reload = time::now_ns();
        probe::reload_phase(
            &valid,
            c.threshold,
            c.window_pages,
            c.seed,
            phase,
            &mut hits,
        )
    });
    let elapsed_ns = time::now_ns().saturating_sub(t_reload);
    pin(false);
    let probed = probed?;
    Ok(Reply::Probed {
        hits,
        probed,
        elapsed_ns,
        window_ns: t_reload.saturating_sub(t_flushed),
    })
}

/// Pins the calling thread to the CPU that served `port` last (`true`), or back to the
/// affinity it has now (`false`).
fn pinning(port: u16) -> impl Fn(bool) {
    let saved = os::get_affinity();
    let server_cpu = track::target_cpu(port).0 as usize;
    move |on: bool| {
        let _ = if on {
            os::set_affinity(&[server_cpu])
        } else {
            os::set_affinity(&saved)
        };
    }
}

/// The measured request on a fresh connection (a server that closes every connection), the
/// `attempts`-th retry: `Ok(true)` if this process served it, `Ok(false)` if another one did
/// and the sample is to be taken again; after `FRESH_ATTEMPTS` (or on an error) the
/// connection slot is dropped and the cycle fails.
fn fresh_request(
    conn_slot: &mut Option<ProbeConn>,
    port: u16,
    req: &str,
    until: &str,
    reply: &mut [u8],
    attempts: u32,
) -> Result<bool, String> {
    match fresh_exchange(port, req.as_bytes(), until.as_bytes(), reply) {
        Ok(true) => Ok(true),
        Ok(false) if attempts + 1 < FRESH_ATTEMPTS => Ok(false),
        Ok(false) => {
            *conn_slot = None;
            Err(format!(
                "{FRESH_ATTEMPTS} requests on fresh connections to port {port} were \
                 all served by another process (a server that closes every \
                 connection and has several worker processes: the probe cannot \
                 choose the worker; record with keep-alive enabled, or one worker)"
            ))
        }
        Err(e) => {
            *conn_slot = None;
            Err(e)
        }
    }
}

/// The measured request on the kept connection `fd`; on an error the connection slot is
/// dropped.
fn kept_request(
    conn_slot: &mut Option<ProbeConn>,
    fd: RawFd,
    req: &str,
    until: &str,
    reply: &mut [u8],
) -> Result<(), String> {
    const REPLY_TIMEOUT_NS: u64 = 2_000_000_000;
    let r = exchange(
        fd,
        req.as_bytes(),
        until.as_bytes(),
        reply,
        REPLY_TIMEOUT_NS,
    );
    if r.is_err() {
        *conn_slot = None;
    }
    r
}

/// Run one pass that touches the host's memory (`pass`: a probe call) with the calling thread's
/// faults made recoverable ([`ProbePass`]): a line the host unmapped, truncated or protected
/// since the ranges were validated ends the pass instead of killing the host. Err (and a log
/// line): the pass could not be guarded and did not run, or it faulted (the round is skipped,
/// like a round whose mappings changed before it; `preheat record` repeats it).
pub(super) fn guarded<T>(
    what: &str,
    pass: impl FnOnce() -> Result<T, probe::Faulted>,
) -> Result<T, String> {
    let guard = ProbePass::begin().map_err(|e| {
        let msg = format!("probe {what} pass not run: {e}");
        log(&msg);
        msg
    })?;
    let r = pass();
    for note in guard.end() {
        log(&format!("probe {what} pass: {note}"));
    }
    r.map_err(|probe::Faulted| {
        let msg = format!(
            "a line faulted during the {what} pass ({}): the server unmapped, truncated or \
             protected memory under it (the agent recovered; {} probe faults in this process so \
             far): {}",
            faults::last_probe_fault(),
            PROBE_FAULTS.load(std::sync::atomic::Ordering::Relaxed),
            preheat_model::proto::ROUND_SKIPPED
        );
        log(&format!("probe: {msg}"));
        msg
    })
}

/// Err (and a log line) if the mappings under `valid` are not what they were when it was
/// validated: a page was unmapped, lost its read permission, or is no longer resident.
///
/// Called right before a pass that touches `valid` after the server ran: it shrinks the window in
/// which a mapping change can fault the host to the few microseconds between this look and the
/// pass, during which the server's threads are back in their wait calls (only a thread the
/// agent does not track, or the kernel reclaiming a page, could still change them: the pass is
/// guarded against that, see [`guarded`]).
fn unchanged_since_validation(valid: &[Range], port: u16) -> Result<(), String> {
    if validate_ranges(valid)? == valid {
        return Ok(());
    }
    let msg = format!(
        "the server's mappings changed while it served the request: {}",
        preheat_model::proto::ROUND_SKIPPED
    );
    log(&format!("probe cycle on port {port}: {msg}"));
    Err(msg)
}

/// Send `req` and spin on non-blocking raw receives until the reply ends with `until`.
pub(super) fn exchange(
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
            Ok(0) => return Err(preheat_model::proto::PROBE_CONN_CLOSED.into()),
            Ok(n) => {
                got += n;
                if buf[..got].ends_with(until) {
                    return Ok(());
                }
                // Part of the reply is here: acknowledge it at once, so a server that writes
                // its reply in pieces with Nagle on is not held until our delayed ACK (40 ms).
                let _ = preheat_engine::os::tcp_quickack(fd);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::hint::spin_loop(),
            Err(e) => return Err(format!("probe reply: {e}")),
        }
        if time::now_ns() > deadline {
            return Err("probe reply timed out".into());
        }
    }
}

/// [`wait_quiet`], spinning (between a flush and its reload the probe thread does not sleep).
fn quiesce_spin(busy: &mut Vec<u32>, cpu: &mut Vec<(u32, u64)>, deadline_ns: u64) {
    wait_quiet(busy, cpu, deadline_ns, None);
}
