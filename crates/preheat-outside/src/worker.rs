//! The outside agent's worker: one thread pinned to the server's CPU that takes announcements
//! from the agent's announcement socket and acts on them, in the agent's order — `replay` (the
//! warm-up, its reply read), `lines` (the loaded profile's lines, walked through the view of the
//! server's file-backed memory until the arrival; `no_profile` without one), then `wake` (a spin
//! through the arrival).
//!
//! `wake` keeps the CPUs polling in idle through the arrival (a CPU latency QoS request of 0 µs,
//! [`preheat_engine::latency`], held until [`POLL_AFTER_ARRIVAL_NS`] after it), or spins
//! where that cannot be had or the announcement says `spin` (where the calibration measured
//! spinning best: a host without a cpuidle driver). `replay` holds the same request through the
//! arrival: the agent's warm-up keeps the server thread itself polling until the request comes
//! (its hold), which from outside cannot be done, so the server's CPU is kept out of halt
//! instead and the request finds it polling (kv from outside on the EPYC `haltpoll` host, 40
//! rounds: `replay`'s *start* was 52 µs against 23 µs inside).
//!
//! The worker is a normal (`SCHED_OTHER`) thread and its spin yields the CPU on every turn, as
//! the agent's trigger thread does when it works inline on the serving CPU: a server thread
//! woken there runs at the next turn. As first built the worker was `SCHED_IDLE`, like the
//! agent's own workers; then a normal task that kept the CPU busy (CI, a MariaDB test beside a
//! demo) made it late for every announcement of a demo, and a `SCHED_IDLE` spin entered for
//! one announcement was starved there with the next ones queued behind it (tested in
//! `tests/outside.rs`, `timing::`).

use std::os::fd::AsRawFd;
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use preheat_engine::time::now_ns;
use preheat_model::proto::{Announcement, Strategies, ANNOUNCE_LEN};

use preheat_engine::latency::LatencyRequest;
use preheat_engine::os::Epoll;

use crate::replay::{Conn, WarmUp};
use crate::state::{Lines, Shared};

/// A `wake` spin ends this long after the announced arrival (the agent's bound; the agent
/// also stops as soon as the server thread runs, which cannot be seen from outside: the spin
/// yields every turn, so the rest of it runs only while the server has nothing to run)...
pub const WAKE_AFTER_ARRIVAL_NS: u64 = 200_000;
/// ...and never lasts longer than this in total.
pub const WAKE_MAX_NS: u64 = 1_000_000;
/// A `wake` or `replay` window of idle polling ends this long after the announced arrival, as
/// the spin does. (The agent holds its window 2 ms past the arrival, for requests of several
/// round trips; from outside the end of the request is seen only milliseconds later, and a
/// 2 ms window kept the CPUs polling into the demo's next sample: its `warm` rows read as hot,
/// 24.7 against hot's 19.4 µs on kv where they had read 51.0 against 24.1.)
pub const POLL_AFTER_ARRIVAL_NS: u64 = WAKE_AFTER_ARRIVAL_NS;
/// A warm-up's reply is given up this long after the announced arrival at the latest.
pub const REPLAY_AFTER_ARRIVAL: Duration = Duration::from_millis(50);
/// Bind the announcement socket at `path` (a stale file there is replaced). The worker waits
/// on it without a timeout — no periodic wake-up of the server's CPU — but for the end of an
/// open polling window, and is woken to stop by an empty datagram from its owner.
pub fn bind(path: &Path) -> Result<UnixDatagram> {
    let _ = std::fs::remove_file(path);
    UnixDatagram::bind(path)
        .with_context(|| format!("binding the announcement socket {}", path.display()))
}

/// The worker thread: pin, say so on `ready`, then serve announcements until told to stop.
pub fn run(shared: &Shared, sock: UnixDatagram, ready: Sender<Result<(), String>>) {
    let setup = preheat_engine::os::pin_current_thread(shared.cfg.cpu)
        .map_err(|e| format!("CPU {}: {e}", shared.cfg.cpu))
        .and_then(|()| waiter(&sock).map_err(|e| format!("the announcement socket: {e}")));
    let ep = match setup {
        Ok(ep) => {
            let _ = ready.send(Ok(()));
            ep
        }
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let mut w = Worker {
        shared,
        conn: Conn::new(),
        warm_up: None,
        poll: Poll::Unopened,
        poll_until: 0,
    };
    // One byte more than an announcement: a longer datagram reads as too long, not truncated.
    let mut buf = [0u8; ANNOUNCE_LEN + 1];
    let mut ready_fds = [0i32; 1];
    loop {
        // While a polling window is open, wait for the next announcement only until its end
        // (to the microsecond: a socket's receive timeout counts in scheduler ticks, 4-10 ms,
        // which kept the CPUs polling into whatever came next).
        let _ = ep.wait_ready(w.poll_window_left(), &mut ready_fds);
        w.end_poll_window_if_over();
        loop {
            let got = sock.recv(&mut buf);
            if shared.stop.load(Ordering::Acquire) {
                return;
            }
            let Ok(n) = got else {
                break; // nothing more queued (the socket does not block)
            };
            match Announcement::decode(&buf[..n]) {
                Ok(a) => w.handle(&a),
                Err(_) => shared.inner().preheat.malformed += 1,
            }
        }
    }
}

/// The announcement socket made non-blocking, and an epoll instance that waits for it.
fn waiter(sock: &UnixDatagram) -> std::io::Result<Epoll> {
    sock.set_nonblocking(true)?;
    let ep = Epoll::new()?;
    ep.add_readable(sock.as_raw_fd())?;
    Ok(ep)
}

struct Worker<'a> {
    shared: &'a Shared,
    conn: Conn,
    /// The warm-up the connection was opened for (a new `configure` makes a new one).
    warm_up: Option<Arc<WarmUp>>,
    poll: Poll,
    /// End of the open polling window (CLOCK_MONOTONIC ns), 0 = none.
    poll_until: u64,
}

/// The worker's CPU latency request: opened at the first window that needs it.
enum Poll {
    Unopened,
    Open(LatencyRequest),
    /// It could not be opened (no device, not permitted): `wake` spins.
    Unavailable,
}

impl Worker<'_> {
    fn handle(&mut self, a: &Announcement) {
        let received = now_ns();
        // Counted under one lock before the strategies run (how `wake` runs is counted once
        // the latency request is armed, below).
        let (st, warm_up, lines) = {
            let mut inner = self.shared.inner();
            let p = &mut inner.preheat;
            p.announcements += 1;
            if !self.shared.enabled.load(Ordering::Acquire) || a.port != self.shared.cfg.port {
                return;
            }
            if received >= a.arrival_ns {
                p.late += 1;
                return;
            }
            let lead = (a.arrival_ns - received) as i64;
            p.last_trigger_lead_ns = lead;
            p.last_lead_ns = lead;
            p.local_handoffs += 1;
            let st = resolve(a.strategies, inner.auto, &mut inner.preheat);
            let lines = if st.contains(Strategies::LINES) {
                if inner.lines.is_none() {
                    inner.preheat.no_profile += 1;
                }
                inner.lines.clone()
            } else {
                None
            };
            (st, inner.warm_up.clone(), lines)
        };
        // Keep the CPUs out of halt through the arrival first: the warm-up's request and the
        // real one then find the server's CPU polling.
        let polled = (st.contains(Strategies::WAKE) || st.contains(Strategies::REPLAY))
            && self.hold_polling(a.arrival_ns);
        let spins = st.contains(Strategies::SPIN) || (st.contains(Strategies::WAKE) && !polled);
        if st.contains(Strategies::WAKE) || spins {
            let mut inner = self.shared.inner();
            if spins {
                inner.preheat.wake_spins += 1;
            } else {
                inner.preheat.wake_polled += 1;
            }
        }
        if st.contains(Strategies::REPLAY) {
            if let Some(w) = warm_up {
                self.replay(w, a.arrival_ns);
            }
        }
        if let Some(l) = lines {
            self.lines(&l, a, received);
        }
        if spins {
            spin_until(
                a.arrival_ns
                    .saturating_add(WAKE_AFTER_ARRIVAL_NS)
                    .min(received.saturating_add(WAKE_MAX_NS)),
            );
        }
    }

    /// Hold every CPU in its polling idle state until [`POLL_AFTER_ARRIVAL_NS`] after
    /// `arrival_ns`; false where no latency request can be had.
    fn hold_polling(&mut self, arrival_ns: u64) -> bool {
        if matches!(self.poll, Poll::Unopened) {
            self.poll = match LatencyRequest::open() {
                Ok(r) => Poll::Open(r),
                Err(_) => Poll::Unavailable,
            };
        }
        let Poll::Open(r) = &mut self.poll else {
            return false;
        };
        if r.arm().is_err() {
            return false;
        }
        self.poll_until = self
            .poll_until
            .max(arrival_ns.saturating_add(POLL_AFTER_ARRIVAL_NS));
        true
    }

    /// How long the open polling window has left (`None`: none open, wait without a timeout).
    fn poll_window_left(&self) -> Option<Duration> {
        (self.poll_until > 0)
            .then(|| Duration::from_nanos(self.poll_until.saturating_sub(now_ns()).max(1_000)))
    }

    /// Release the latency request once its window is over.
    fn end_poll_window_if_over(&mut self) {
        if self.poll_until > 0 && now_ns() >= self.poll_until {
            self.poll_until = 0;
            if let Poll::Open(r) = &mut self.poll {
                let _ = r.release();
            }
        }
    }

    /// Walk the loaded lines until the announcement's deadline (its budget where it has one,
    /// as the agent's), counted as the agent counts them.
    fn lines(&self, l: &Lines, a: &Announcement, now: u64) {
        let rep = preheat_engine::preheat::preheat_runs(&l.runs, Some(a.preheat_deadline(now)));
        let mut inner = self.shared.inner();
        let p = &mut inner.preheat;
        p.preheats += 1;
        p.completed += u64::from(rep.completed);
        p.lines_preheated += rep.lines_done;
        p.preheat_ns_total += rep.elapsed_ns;
        p.last_lines_done = rep.lines_done;
        p.last_lines_total = rep.lines_total;
        p.last_preheat_ns = rep.elapsed_ns;
    }

    fn replay(&mut self, w: Arc<WarmUp>, arrival_ns: u64) {
        if !self
            .warm_up
            .as_ref()
            .is_some_and(|old| Arc::ptr_eq(old, &w))
        {
            self.conn.drop_connection();
        }
        let opened = self.conn.opened;
        let timeout =
            Duration::from_nanos(arrival_ns.saturating_sub(now_ns())) + REPLAY_AFTER_ARRIVAL;
        let r = self.conn.exchange(self.shared.cfg.port, &w, timeout);
        self.warm_up = Some(w);
        let mut inner = self.shared.inner();
        inner.preheat.replays += 1;
        // A connection opened again (the server closed the last one): a fresh one, as the
        // agent counts them; the first connection is not.
        if self.conn.opened > opened && opened > 0 {
            inner.preheat.replays_fresh += 1;
        }
        if r.is_err() {
            inner.preheat.replay_errors += 1;
        }
    }
}

/// The strategies an announcement's `st` stands for: `auto` replaced by the port's choice (or
/// [`Strategies::AUTO_UNMEASURED`], counted), other bits kept.
pub fn resolve(
    st: Strategies,
    auto: Option<Strategies>,
    p: &mut preheat_model::proto::PreheatStats,
) -> Strategies {
    if !st.contains(Strategies::AUTO) {
        return st;
    }
    let chosen = auto.unwrap_or_else(|| {
        p.auto_unmeasured += 1;
        Strategies::AUTO_UNMEASURED
    });
    st.without(Strategies::AUTO).union(chosen)
}

/// Spin until `t_ns`, yielding the CPU every turn (a runnable server thread goes first).
fn spin_until(t_ns: u64) {
    while now_ns() < t_ns {
        std::thread::yield_now();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use preheat_model::proto::PreheatStats;

    #[test]
    fn auto_becomes_the_ports_choice_or_the_unmeasured_default() {
        let mut p = PreheatStats::default();
        let auto = Strategies::AUTO.union(Strategies::SPIN);
        assert_eq!(
            resolve(auto, Some(Strategies::REPLAY), &mut p),
            Strategies::REPLAY.union(Strategies::SPIN)
        );
        assert_eq!(p.auto_unmeasured, 0);
        assert_eq!(
            resolve(auto, None, &mut p),
            Strategies::AUTO_UNMEASURED.union(Strategies::SPIN)
        );
        assert_eq!(p.auto_unmeasured, 1);
        assert_eq!(resolve(Strategies::WAKE, None, &mut p), Strategies::WAKE);
    }
}
