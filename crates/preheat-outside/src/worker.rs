//! The outside agent's worker: one thread pinned to the server's CPU that takes announcements
//! from the agent's announcement socket and acts on them, in the agent's order — `replay` (the
//! warm-up, its reply read), `lines` (the loaded profile's lines, walked through the view of the
//! server's file-backed memory until the arrival; `no_profile` without one), then `wake` (a spin
//! through the arrival).
//!
//! The worker is a normal (`SCHED_OTHER`) thread and its spin yields the CPU on every turn, as
//! the agent's trigger thread does when it works inline on the serving CPU: a server thread
//! woken there runs at the next turn. As first built the worker was `SCHED_IDLE`, like the
//! agent's own workers; then a normal task that kept the CPU busy (CI, a MariaDB test beside a
//! demo) made it late for every announcement of a demo, and a `SCHED_IDLE` spin entered for
//! one announcement was starved there with the next ones queued behind it (tested in
//! `tests/outside.rs`, `timing::`).

use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use preheat_engine::time::now_ns;
use preheat_model::proto::{Announcement, Strategies, ANNOUNCE_LEN};

use crate::replay::{Conn, WarmUp};
use crate::state::{Lines, Shared};

/// A `wake` spin ends this long after the announced arrival (the agent's bound; the agent
/// also stops as soon as the server thread runs, which cannot be seen from outside: the spin
/// yields every turn, so the rest of it runs only while the server has nothing to run)...
pub const WAKE_AFTER_ARRIVAL_NS: u64 = 200_000;
/// ...and never lasts longer than this in total.
pub const WAKE_MAX_NS: u64 = 1_000_000;
/// A warm-up's reply is given up this long after the announced arrival at the latest.
pub const REPLAY_AFTER_ARRIVAL: Duration = Duration::from_millis(50);
/// Bind the announcement socket at `path` (a stale file there is replaced). The worker blocks
/// on it without a timeout — no periodic wake-up of the server's CPU — and is woken to stop by
/// an empty datagram from its owner.
pub fn bind(path: &Path) -> Result<UnixDatagram> {
    let _ = std::fs::remove_file(path);
    UnixDatagram::bind(path)
        .with_context(|| format!("binding the announcement socket {}", path.display()))
}

/// The worker thread: pin, say so on `ready`, then serve announcements until told to stop.
pub fn run(shared: &Shared, sock: UnixDatagram, ready: Sender<Result<(), String>>) {
    let setup = preheat_engine::os::pin_current_thread(shared.cfg.cpu)
        .map_err(|e| format!("CPU {}: {e}", shared.cfg.cpu));
    let failed = setup.is_err();
    let _ = ready.send(setup);
    if failed {
        return;
    }
    let mut w = Worker {
        shared,
        conn: Conn::new(),
        warm_up: None,
    };
    // One byte more than an announcement: a longer datagram reads as too long, not truncated.
    let mut buf = [0u8; ANNOUNCE_LEN + 1];
    loop {
        let got = sock.recv(&mut buf);
        if shared.stop.load(Ordering::Acquire) {
            return;
        }
        let Ok(n) = got else {
            continue;
        };
        match Announcement::decode(&buf[..n]) {
            Ok(a) => w.handle(&a),
            Err(_) => shared.inner().preheat.malformed += 1,
        }
    }
}

struct Worker<'a> {
    shared: &'a Shared,
    conn: Conn,
    /// The warm-up the connection was opened for (a new `configure` makes a new one).
    warm_up: Option<Arc<WarmUp>>,
}

impl Worker<'_> {
    fn handle(&mut self, a: &Announcement) {
        let received = now_ns();
        // Everything counted under one lock, before the strategies run.
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
            if wakes(st) {
                inner.preheat.wake_spins += 1;
            }
            (st, inner.warm_up.clone(), lines)
        };
        if st.contains(Strategies::REPLAY) {
            if let Some(w) = warm_up {
                self.replay(w, a.arrival_ns);
            }
        }
        if let Some(l) = lines {
            self.lines(&l, a, received);
        }
        if wakes(st) {
            spin_until(
                a.arrival_ns
                    .saturating_add(WAKE_AFTER_ARRIVAL_NS)
                    .min(received.saturating_add(WAKE_MAX_NS)),
            );
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

/// Whether `st` asks for `wake` (outside the process always a spin).
fn wakes(st: Strategies) -> bool {
    st.contains(Strategies::WAKE) || st.contains(Strategies::SPIN)
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
