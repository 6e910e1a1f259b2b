//! The event loop: threads each driving several connections (like wrk `-t T -c C`) through the
//! drivers' non-blocking [`Driver::send_request`](crate::driver::Driver::send_request) /
//! [`Driver::poll_reply`](crate::driver::Driver::poll_reply), waiting in `epoll_wait` or polling
//! every connection in turn ([`Wait::Spin`]).

use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use preheat_engine::time::now_ns;

use super::conn::{Conn, Connect};
use super::pacing::{nanos, sleep_before, Poisson};
use super::shared::{measured, ConnOut, Shared, Times};
use super::{Mode, Record};
use crate::driver::{Wait, REPLY_TIMEOUT};

/// One connection of a multiplexed thread.
struct Slot<'a> {
    conn: Conn<'a>,
    arrivals: Poisson,
    /// Open loop: the next intended send time.
    next_open: u64,
    /// The outstanding request: (intended, sent).
    pending: Option<(u64, u64)>,
    /// Sends no more (the run is ending for it); its outstanding reply is still collected.
    done: bool,
}

/// How a multiplexed thread waits: an epoll set over its sockets (`Wait::Block`, `Wait::Epoll`) or none
/// (`Wait::Spin`: poll every outstanding connection in turn).
struct Waiter {
    epoll: Option<preheat_engine::os::Epoll>,
    ready: Vec<i32>,
}

impl Waiter {
    fn watch(&self, conn: &Conn<'_>) -> Result<()> {
        if let (Some(ep), Some(fd)) = (&self.epoll, conn.driver.raw_fd()) {
            match ep.add_readable(fd) {
                Ok(()) => {}
                // Still the same socket (a reconnect was cut short by the stop flag).
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => {
                    return Err(e)
                        .with_context(|| format!("connection {}: adding to epoll", conn.id))
                }
            }
        }
        Ok(())
    }
}

/// A multiplexed thread: connect its connections and warm them up (one blocking request at a
/// time), wait for the others, then measure.
pub(super) fn mux_thread(
    t: usize,
    threads: usize,
    shared: &Shared<'_>,
    connect: Connect<'_>,
    tx: Option<mpsc::Sender<Record>>,
) -> Result<ConnOut> {
    shared.client_thread(
        |cancel| mux_set_up(t, threads, shared, connect, cancel),
        |(conns, waiter), start| mux_measure(shared, conns, waiter, tx, start),
    )
}

fn mux_set_up<'a>(
    t: usize,
    threads: usize,
    shared: &Shared<'_>,
    connect: Connect<'a>,
    cancel: &dyn Fn() -> bool,
) -> Result<(Vec<Conn<'a>>, Waiter)> {
    let cfg = shared.cfg;
    let waiter = Waiter {
        epoll: match cfg.wait {
            Wait::Block | Wait::Epoll => Some(
                preheat_engine::os::Epoll::new()
                    .with_context(|| format!("client thread {t}: creating an epoll instance"))?,
            ),
            Wait::Spin => None,
        },
        ready: vec![0; cfg.connections.div_ceil(threads).max(1)],
    };
    let mut conns = Vec::new();
    for id in (t..cfg.connections).step_by(threads) {
        let mut conn = Conn::open(id, connect)?;
        if conn.driver.raw_fd().is_none() {
            if cfg.wait == Wait::Epoll {
                bail!(
                    "connection {id}: wait epoll (the event loop) is not supported by the {} driver (it has no non-blocking, multiplexed path); use wait block",
                    conn.driver.protocol().name()
                );
            }
            bail!(
                "connection {id}: the {:?} driver cannot multiplex connections (threads {} < connections {}); use one thread per connection (threads 0)",
                conn.driver.protocol(),
                cfg.threads,
                cfg.connections
            );
        }
        for _ in 0..cfg.warmup {
            if cancel() {
                break;
            }
            conn.request(cancel)?;
        }
        waiter.watch(&conn)?;
        conns.push(conn);
    }
    Ok((conns, waiter))
}

fn mux_measure(
    shared: &Shared<'_>,
    conns: Vec<Conn<'_>>,
    mut waiter: Waiter,
    tx: Option<mpsc::Sender<Record>>,
    start: u64,
) -> Result<ConnOut> {
    let deadline = shared.deadline(start);
    let mut slots: Vec<Slot<'_>> = conns
        .into_iter()
        .map(|conn| {
            let (arrivals, next_open) = shared.arrivals(conn.id, start);
            Slot {
                conn,
                arrivals,
                next_open,
                pending: None,
                done: false,
            }
        })
        .collect();
    let mut out = ConnOut::new(true);
    // Spin mode: yield the CPU each turn after this long without a reply (see the drivers'
    // busy-poll: an unpinned client must not keep the server off its CPU).
    let mut last_progress = Instant::now();
    loop {
        let next_send = send_due(shared, &mut slots, &waiter, deadline)?;
        if slots.iter().all(|s| s.done && s.pending.is_none()) {
            break;
        }
        // Wait for replies (or the next send time) and collect what is complete.
        if waiter.epoll.is_some() {
            collect_ready(
                shared,
                &mut slots,
                &mut waiter,
                &mut out,
                tx.as_ref(),
                next_send,
            )?;
        } else {
            let outstanding = slots.iter().any(|s| s.pending.is_some());
            let progress = collect_spinning(shared, &mut slots, &mut out, tx.as_ref())?;
            if !outstanding {
                // Nothing to poll: sleep until shortly before the next send.
                if next_send == u64::MAX {
                    std::thread::sleep(Duration::from_millis(1));
                } else {
                    std::thread::sleep(sleep_before(next_send, now_ns()));
                }
            } else if progress {
                last_progress = Instant::now();
            } else if last_progress.elapsed() > SPIN_YIELD_AFTER {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
    }
    out.errors = slots.iter().map(|s| s.conn.errors).sum();
    out.reconnects = slots.iter().map(|s| s.conn.reconnects).sum();
    Ok(out)
}

/// Send on every connection whose time has come and that has nothing outstanding; mark done
/// those past the deadline, out of requests or stopping. Returns the next intended send time
/// of the others (`u64::MAX`: none).
fn send_due(
    shared: &Shared<'_>,
    slots: &mut [Slot<'_>],
    waiter: &Waiter,
    deadline: Option<u64>,
) -> Result<u64> {
    let stop_only = || shared.stopped();
    let stopping = shared.cancelled();
    let mut next_send = u64::MAX;
    let mut now = now_ns();
    for s in slots {
        if s.pending.is_some() || s.done {
            continue;
        }
        if stopping {
            s.done = true;
            continue;
        }
        let intended = match shared.cfg.mode {
            Mode::Open => s.next_open,
            _ => now,
        };
        if deadline.is_some_and(|e| intended >= e) {
            s.done = true;
            continue;
        }
        if intended > now {
            next_send = next_send.min(intended);
            continue;
        }
        if !shared.claim() {
            s.done = true;
            continue;
        }
        if shared.cfg.mode == Mode::Open {
            s.next_open = s.next_open.saturating_add(s.arrivals.next_gap_ns());
        }
        // A connection the server ended is reopened before the request is timed.
        if s.conn.ready(&stop_only)? {
            waiter.watch(&s.conn)?;
        }
        let sent = now_ns();
        match s.conn.driver.send_request() {
            Ok(()) => s.pending = Some((intended, sent)),
            Err(e) => {
                shared.unclaim();
                s.conn.failed(e, &stop_only)?;
                waiter.watch(&s.conn)?;
            }
        }
        now = sent;
    }
    Ok(next_send)
}

/// Epoll mode: wait until a socket is readable or the next send time, collect the replies
/// that are complete, and let the driver time out replies overdue without readiness.
fn collect_ready(
    shared: &Shared<'_>,
    slots: &mut [Slot<'_>],
    waiter: &mut Waiter,
    out: &mut ConnOut,
    tx: Option<&mpsc::Sender<Record>>,
    next_send: u64,
) -> Result<()> {
    let stop_only = || shared.stopped();
    let Some(ep) = &waiter.epoll else {
        return Ok(());
    };
    let timeout = sleep_before(next_send, now_ns());
    let n = ep
        .wait_ready(Some(timeout), &mut waiter.ready)
        .context("waiting for replies in epoll")?;
    for k in 0..n {
        let fd = waiter.ready[k];
        let Some(i) = slots
            .iter()
            .position(|s| s.conn.driver.raw_fd() == Some(fd))
        else {
            // A socket that was replaced (it leaves the set when closed).
            let _ = ep.remove(fd);
            continue;
        };
        let s = &mut slots[i];
        if s.pending.is_none() {
            if s.done {
                let _ = ep.remove(fd);
            } else {
                // Data or the end of the stream with nothing outstanding: the
                // connection is out of step or closed; reopen it.
                let e = anyhow::anyhow!(
                    "the server sent data or closed the connection while no request was outstanding"
                );
                s.conn.failed(e, &stop_only)?;
                waiter.watch(&s.conn)?;
            }
            continue;
        }
        poll_slot(shared, s, out, tx, &stop_only)?;
        if s.conn.driver.raw_fd() != Some(fd) {
            waiter.watch(&s.conn)?; // reopened
        }
    }
    // Replies overdue without readiness: let the driver report the timeout.
    let reply_timeout_ns = nanos(REPLY_TIMEOUT);
    let now = now_ns();
    for s in slots {
        if s.pending
            .is_some_and(|(_, sent)| now.saturating_sub(sent) > reply_timeout_ns)
        {
            poll_slot(shared, s, out, tx, &stop_only)?;
            waiter.watch(&s.conn)?;
        }
    }
    Ok(())
}

/// Spin mode: poll every outstanding connection once; whether a reply was complete.
fn collect_spinning(
    shared: &Shared<'_>,
    slots: &mut [Slot<'_>],
    out: &mut ConnOut,
    tx: Option<&mpsc::Sender<Record>>,
) -> Result<bool> {
    let stop_only = || shared.stopped();
    let mut progress = false;
    for s in slots {
        if s.pending.is_some() {
            progress |= poll_slot(shared, s, out, tx, &stop_only)?;
        }
    }
    Ok(progress)
}

/// Spin mode, multiplexed: yield each turn after this long without a complete reply.
const SPIN_YIELD_AFTER: Duration = Duration::from_micros(200);

/// Collect the outstanding reply of `s` if it is complete: record it (true), or on a transport
/// failure count it and reopen the connection (the request is not measured).
fn poll_slot(
    shared: &Shared<'_>,
    s: &mut Slot<'_>,
    out: &mut ConnOut,
    tx: Option<&mpsc::Sender<Record>>,
    cancel: &dyn Fn() -> bool,
) -> Result<bool> {
    let Some((intended, sent)) = s.pending else {
        return Ok(false);
    };
    match s.conn.driver.poll_reply() {
        Ok(None) => Ok(false),
        Ok(Some(o)) => {
            let done = now_ns();
            s.pending = None;
            s.conn.fails_in_row = 0;
            let times = Times {
                intended,
                granted: intended,
                sent,
                done,
            };
            measured(shared, out, tx, s.conn.id, times, o, false, 0.0);
            Ok(true)
        }
        Err(e) => {
            s.pending = None;
            shared.unclaim();
            s.conn.failed(e, cancel)?;
            Ok(false)
        }
    }
}
