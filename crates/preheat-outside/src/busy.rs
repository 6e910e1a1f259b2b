//! The server's busy periods for the port, from outside: the observer's live analysis turned
//! into the agent's per-port counters.

use std::sync::atomic::Ordering;

use preheat_observe::periods::{Kind, Period};

use crate::state::{Inner, Shared};

/// How often the observer's ring buffers are drained between status requests (which drain them
/// too): the observer's own interval for collecting callers.
pub use preheat_observe::session::DRAIN_EVERY;

/// The busy-period thread: drain until told to stop.
pub fn run(shared: &Shared) {
    while !shared.stop.load(Ordering::Acquire) {
        refresh(shared);
        std::thread::sleep(DRAIN_EVERY);
    }
}

/// Drain the observer now and count what ended since the last drain.
pub fn refresh(shared: &Shared) {
    let periods = shared.observer().take_periods();
    if periods.is_empty() {
        return;
    }
    count(&mut shared.inner(), &periods);
}

/// Count `periods` into the port's counters: the latest start of a request served (not of a
/// period that only accepted a connection) is the port's last start — where the observer knows
/// that a period answered a request another period began reading (a hand-off, or Go's read
/// ahead on another thread), the start of that one —, the thread that served it the one that
/// serves next.
pub fn count(inner: &mut Inner, periods: &[Period]) {
    for p in periods {
        let s = &mut inner.port;
        s.busy_periods += 1;
        s.busy_ns += p.end_ns.saturating_sub(p.start_ns);
        if p.kind != Kind::Accept && p.request_start() >= s.last_start_ns {
            s.last_start_ns = p.request_start();
            s.last_tid = p.tid;
        }
        inner.tids.insert(p.tid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn period(tid: u32, start_ns: u64, end_ns: u64) -> Period {
        Period {
            tid,
            start_ns,
            end_ns,
            kind: Kind::Read,
            reads: 1,
            writes: 1,
            first_read_ns: None,
            first_write_ns: None,
            request_start_ns: None,
        }
    }

    #[test]
    fn counts_periods_and_keeps_the_latest_start() {
        let mut inner = Inner::default();
        // Ended in this order; the second started later than the third.
        // The last one only accepted a connection: counted, not a request's start.
        let accept = Period {
            kind: Kind::Accept,
            ..period(9, 500, 510)
        };
        count(
            &mut inner,
            &[
                period(7, 100, 150),
                period(8, 300, 400),
                period(7, 200, 450),
                accept,
            ],
        );
        assert_eq!(inner.port.busy_periods, 4);
        assert_eq!(inner.port.busy_ns, 50 + 100 + 250 + 10);
        assert_eq!(inner.port.last_start_ns, 300);
        assert_eq!(inner.port.last_tid, 8);
        assert_eq!(inner.tids.len(), 3);
        // A reply whose request another period began reading: that start is the request's.
        let reply = Period {
            request_start_ns: Some(600),
            ..period(10, 650, 700)
        };
        count(&mut inner, &[period(11, 600, 620), reply]);
        assert_eq!((inner.port.last_start_ns, inner.port.last_tid), (600, 10));
    }
}
