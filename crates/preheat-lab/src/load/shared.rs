//! What the client threads of a run share (the stop flags, the request tickets, the common start)
//! and what one thread measured: its histograms, counts, and the records of measured requests.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Barrier, OnceLock};

use anyhow::Result;
use hdrhistogram::Histogram;
use preheat_engine::time::now_ns;

use super::pacing::{nanos, Poisson};
use super::{LoadConfig, Mode, Record};
use crate::driver::Outcome;

/// Largest latency the histograms hold (60 s).
const HIST_MAX_NS: u64 = 60_000_000_000;

/// What one connection measured.
pub(super) struct ConnOut {
    pub(super) latency: Histogram<u64>,
    pub(super) late: Histogram<u64>,
    pub(super) errors: u64,
    pub(super) reconnects: u64,
    pub(super) wrong: u64,
    pub(super) scheduled: u64,
    pub(super) unscheduled: u64,
    pub(super) last_done_ns: u64,
    /// Measured by the event loop (false: the thread-per-connection loop).
    pub(super) event_loop: bool,
}

impl ConnOut {
    pub(super) fn new(event_loop: bool) -> ConnOut {
        ConnOut {
            latency: histogram(),
            late: histogram(),
            errors: 0,
            reconnects: 0,
            wrong: 0,
            scheduled: 0,
            unscheduled: 0,
            last_done_ns: 0,
            event_loop,
        }
    }
}

pub(super) fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, HIST_MAX_NS, 3).expect("valid histogram bounds")
}

/// Shared state of a run.
pub(super) struct Shared<'a> {
    pub(super) cfg: &'a LoadConfig,
    pub(super) stop: &'a AtomicBool,
    /// A connection failed for good: the others stop too.
    pub(super) abort: AtomicBool,
    /// Requests claimed (never more than `cfg.requests`).
    pub(super) claimed: AtomicU64,
    /// Requests measured (the progress count and the record sequence number).
    pub(super) completed: AtomicU64,
    pub(super) start: OnceLock<u64>,
    pub(super) setup: Barrier,
}

impl Shared<'_> {
    /// `stop` was asked for or a connection failed for good (requests left or not).
    pub(super) fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed) || self.abort.load(Ordering::Relaxed)
    }

    /// [`Shared::stopped`], or every request ticket is taken.
    pub(super) fn cancelled(&self) -> bool {
        self.stopped()
            || self
                .cfg
                .requests
                .is_some_and(|n| self.claimed.load(Ordering::Relaxed) >= n)
    }

    /// Take one of the `requests` tickets; false when they are gone.
    pub(super) fn claim(&self) -> bool {
        match self.cfg.requests {
            None => true,
            Some(n) => self
                .claimed
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| {
                    (c < n).then_some(c + 1)
                })
                .is_ok(),
        }
    }

    /// Give a ticket back (its request failed and was not measured).
    pub(super) fn unclaim(&self) {
        if self.cfg.requests.is_some() {
            self.claimed.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// The end of the measured phase that started at `start` (none without a duration).
    pub(super) fn deadline(&self, start: u64) -> Option<u64> {
        self.cfg.duration.map(|d| start.saturating_add(nanos(d)))
    }

    /// Connection `id`'s open-loop arrival process (seeded from `seed + id`) and its first
    /// send time: `start` plus the first gap in open loop, `start` otherwise.
    pub(super) fn arrivals(&self, id: usize, start: u64) -> (Poisson, u64) {
        let cfg = self.cfg;
        let mut arrivals = Poisson::new(
            cfg.rate / cfg.connections as f64,
            cfg.seed.wrapping_add(id as u64),
        );
        let mut first = start;
        if cfg.mode == Mode::Open {
            first += arrivals.next_gap_ns();
        }
        (arrivals, first)
    }

    /// A client thread's life: set up (cancelled by [`Shared::stopped`]), wait for the other
    /// threads, then measure from the common start. A failure in either phase stops the others.
    pub(super) fn client_thread<S>(
        &self,
        set_up: impl FnOnce(&dyn Fn() -> bool) -> Result<S>,
        measure: impl FnOnce(S, u64) -> Result<ConnOut>,
    ) -> Result<ConnOut> {
        let setup = set_up(&|| self.stopped());
        if setup.is_err() {
            self.abort.store(true, Ordering::Relaxed);
        }
        self.setup.wait();
        let setup = setup?;
        let start = *self.start.get_or_init(now_ns);
        let r = measure(setup, start);
        if r.is_err() {
            self.abort.store(true, Ordering::Relaxed);
        }
        r
    }
}

/// The times of one measured request (CLOCK_MONOTONIC ns).
#[derive(Clone, Copy)]
pub(super) struct Times {
    pub(super) intended: u64,
    pub(super) granted: u64,
    pub(super) sent: u64,
    pub(super) done: u64,
}

/// Count a measured request and hand its record to the writer.
#[allow(clippy::too_many_arguments)]
pub(super) fn measured(
    shared: &Shared<'_>,
    out: &mut ConnOut,
    tx: Option<&mpsc::Sender<Record>>,
    id: usize,
    t: Times,
    o: Outcome,
    scheduled: bool,
    gap_us: f64,
) {
    let cfg = shared.cfg;
    let latency = t.done.saturating_sub(t.intended);
    out.latency.saturating_record(latency.max(1));
    out.late
        .saturating_record(t.sent.saturating_sub(t.intended));
    if !o.ok {
        out.wrong += 1;
    }
    out.last_done_ns = out.last_done_ns.max(t.done);
    let seq = shared.completed.fetch_add(1, Ordering::Relaxed);
    if let Some(tx) = tx {
        // The writer only goes away after every sender is dropped, so this cannot fail;
        // if it did, losing a record must not stop the measurement.
        let _ = tx.send(Record {
            seq,
            conn: id as u32,
            mode: cfg.mode,
            gap_us,
            intended_ns: t.intended,
            granted_ns: t.granted,
            sent_ns: t.sent,
            done_ns: t.done,
            latency_us: latency as f64 / 1e3,
            kind: o.kind,
            ok: o.ok,
            scheduled,
            strategy: cfg.strategy.clone(),
        });
    }
}
