//! The thread-per-connection loop: each connection has its own client thread and a synchronous
//! [`Driver::request`](crate::driver::Driver::request); the only loop for idle-gap mode and
//! announcements.

use std::sync::atomic::Ordering;
use std::sync::mpsc;

use anyhow::{Context, Result};
use preheat_engine::time::now_ns;

use super::conn::{Conn, Connect};
use super::pacing::{sleep_for, wait_until};
use super::shared::{measured, ConnOut, Shared, Times};
use super::{Announce, Mode, Record};

/// One connection's client thread: connect, warm up, wait for the others, then measure.
pub(super) fn connection(
    id: usize,
    shared: &Shared<'_>,
    connect: Connect<'_>,
    announce: Option<&(dyn Fn(usize) -> Result<Box<dyn Announce>> + Sync)>,
    tx: Option<mpsc::Sender<Record>>,
) -> Result<ConnOut> {
    shared.client_thread(
        |cancel| set_up(id, shared, connect, announce, cancel),
        |(conn, ann), start| measure(id, shared, conn, ann, tx, start),
    )
}

/// Connect, make the announcer, send the warm-up requests (unmeasured; their transport
/// failures count in `errors` all the same).
fn set_up<'a>(
    id: usize,
    shared: &Shared<'_>,
    connect: Connect<'a>,
    announce: Option<&(dyn Fn(usize) -> Result<Box<dyn Announce>> + Sync)>,
    cancel: &dyn Fn() -> bool,
) -> Result<(Conn<'a>, Option<Box<dyn Announce>>)> {
    let mut conn = Conn::open(id, connect)?;
    let ann = match announce {
        Some(f) => {
            Some(f(id).with_context(|| format!("connection {id}: setting up announcements"))?)
        }
        None => None,
    };
    for _ in 0..shared.cfg.warmup {
        if cancel() {
            break;
        }
        conn.request(cancel)?;
    }
    Ok((conn, ann))
}

fn measure(
    id: usize,
    shared: &Shared<'_>,
    mut conn: Conn<'_>,
    mut ann: Option<Box<dyn Announce>>,
    tx: Option<mpsc::Sender<Record>>,
    start: u64,
) -> Result<ConnOut> {
    let cfg = shared.cfg;
    let cancelled = || shared.cancelled();
    let deadline = shared.deadline(start);
    let past_deadline = |t: u64| deadline.is_some_and(|e| t >= e);
    let lead = ann.as_ref().map_or(0, |a| a.lead_ns());
    let (mut arrivals, mut next_open) = shared.arrivals(id, start);
    let mut out = ConnOut::new(false);
    let mut prev_done = start;
    loop {
        if cancelled() {
            break;
        }
        let earliest = match cfg.mode {
            Mode::Open => {
                let t = next_open;
                next_open = next_open.saturating_add(arrivals.next_gap_ns());
                if past_deadline(t) || !wait_until(t.saturating_sub(lead), &cancelled) {
                    break;
                }
                t
            }
            Mode::IdleGap => {
                if !sleep_for(cfg.gap, &cancelled) {
                    break;
                }
                now_ns()
            }
            Mode::Closed => now_ns(),
        };
        if past_deadline(earliest) && cfg.mode != Mode::Open {
            break;
        }
        if !shared.claim() {
            break;
        }
        let (granted, scheduled) = match ann.as_mut() {
            Some(a) => {
                let g = a.grant(earliest);
                if g.scheduled {
                    out.scheduled += 1;
                } else {
                    out.unscheduled += 1;
                }
                (g.send_at_ns, g.scheduled)
            }
            None => (earliest, false),
        };
        // Open loop: the Poisson time is the intended time, whatever the grant. Otherwise an
        // announced request is meant to arrive at the granted (announced) time.
        let intended = if cfg.mode == Mode::Open {
            earliest
        } else {
            granted
        };
        wait_until(granted, &|| false);
        // A connection the server ended is reopened before the request is timed.
        conn.ready(&|| shared.stop.load(Ordering::Relaxed))?;
        let sent = now_ns();
        let outcome = conn.request(&|| shared.stop.load(Ordering::Relaxed))?;
        let done = now_ns();
        let Some(o) = outcome else {
            shared.unclaim();
            continue;
        };
        let gap_us = if cfg.mode == Mode::IdleGap {
            intended.saturating_sub(prev_done) as f64 / 1e3
        } else {
            0.0
        };
        let times = Times {
            intended,
            granted,
            sent,
            done,
        };
        measured(
            shared,
            &mut out,
            tx.as_ref(),
            id,
            times,
            o,
            scheduled,
            gap_us,
        );
        prev_done = done;
    }
    out.errors = conn.errors;
    out.reconnects = conn.reconnects;
    Ok(out)
}
