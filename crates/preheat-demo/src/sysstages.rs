//! The serve stage split at the server's own system calls (`--syscall-stages`).
//!
//! The demo's stages (*wire*, *start*, *serve*) end where the agent sees the server thread
//! leave its wait. What *serve* holds — the server's own code, or the kernel taking the reply
//! to the client — decides which strategy can still remove it: lines and warm-ups reach the
//! first, nothing on the server's side reaches the second. With `--syscall-stages` the demo
//! attaches the outside observer ([`preheat_observe::session::Observer`], syscall tracepoints
//! through `perf_event_open`, root) to the serving process for the pilot and the rounds, and
//! splits every sample's response time at the server's first read that returned data after
//! the send and at the first write on a connection of the port after that read:
//!
//! * *to read* = send (announced modes: the announced arrival) → that read returned: arrival,
//!   wake-up, the event and the read call itself; of it *to event* = → the wait that started the
//!   read's busy period returned (0 where the thread was busy already at the send);
//! * *compute* = → the reply's write entered: the server's own work on the request;
//! * *reply* = → the client has the whole reply: the write call, the transmit and the
//!   client's receive.
//!
//! The observer costs the traced process about 0.13 µs per traced system call with its eBPF
//! programs, ~0.45 µs with perf samples where those do not load (its crate docs), every mode
//! alike; the split is for comparing modes within
//! the run, and the output says the observer was attached. Why it was built: a `perf` trace of
//! the same split (2026-11-29, EPYC `haltpoll`, kv, 200 µs lead, 150 rounds) put what `replay`
//! leaves above the held hot floor in the server's own code (*compute* 3.5 µs against 1.2 µs,
//! the event to the read 3.6 against 2.3 µs) and nothing in the reply's system call (5.2
//! against 5.2 µs) or its delivery (5.5 against 5.7 µs).

use anyhow::{Context, Result};
use preheat_observe::periods::Period;
use preheat_observe::session::{Observer, Options};

/// How long periods are kept after they started (ns): a sample's request is served well within.
const KEEP_NS: u64 = 50_000_000;

/// A sample's split (µs).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Split {
    pub to_event_us: f64,
    pub to_read_us: f64,
    pub compute_us: f64,
    pub reply_us: f64,
}

/// The observer attached to the serving process, and the busy periods it found lately.
pub(crate) struct SysStages {
    obs: Observer,
    periods: Vec<Period>,
    /// The observer's mechanism, said in the output.
    pub described: String,
}

impl SysStages {
    /// Attach to `pid`, whose requests come on `port`.
    pub fn attach(pid: u32, port: u16) -> Result<SysStages> {
        // Each call stamped: the split needs the first read's and first write's times.
        let opts = Options {
            per_call: true,
            ..Options::new(pid, port)
        };
        let obs = Observer::attach(opts)
            .with_context(|| format!("attaching the syscall observer to pid {pid}"))?;
        let described = format!("{}; {}", obs.what_runs(), obs.mechanism().cost());
        Ok(SysStages {
            obs,
            periods: Vec::new(),
            described,
        })
    }

    /// The split of the request sent at `t_send` whose reply was complete at `t_done`
    /// (`CLOCK_MONOTONIC` ns), from the periods ended so far; `None` where the observer saw no
    /// read and write of it.
    pub fn sample(&mut self, t_send: u64, t_done: u64) -> Option<Split> {
        self.periods.extend(self.obs.take_periods());
        let floor = t_send.saturating_sub(KEEP_NS);
        self.periods.retain(|p| p.end_ns >= floor);
        split(&self.periods, t_send, t_done)
    }
}

/// The split of one request (module docs): the first read after `t_send` that returned data,
/// then the first write after it, by any thread (a hand-off server writes from another).
pub(crate) fn split(periods: &[Period], t_send: u64, t_done: u64) -> Option<Split> {
    let (event, read) = periods
        .iter()
        .filter_map(|p| p.first_read_ns.map(|r| (p.start_ns, r)))
        .filter(|&(_, r)| r >= t_send && r <= t_done)
        .min_by_key(|&(_, r)| r)?;
    let write = periods
        .iter()
        .filter_map(|p| p.first_write_ns)
        .filter(|&w| w >= read && w <= t_done)
        .min()?;
    let us = |a: u64, b: u64| (b - a) as f64 / 1e3;
    Some(Split {
        to_event_us: us(t_send, event.max(t_send)),
        to_read_us: us(t_send, read),
        compute_us: us(read, write),
        reply_us: us(write, t_done),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use preheat_observe::periods::Kind;

    fn period(tid: u32, start: u64, read: Option<u64>, write: Option<u64>, end: u64) -> Period {
        Period {
            tid,
            start_ns: start,
            end_ns: end,
            kind: if read.is_some() {
                Kind::Read
            } else {
                Kind::HandOff { from: 1 }
            },
            reads: u32::from(read.is_some()),
            writes: u32::from(write.is_some()),
            first_read_ns: read,
            first_write_ns: write,
            request_start_ns: None,
        }
    }

    #[test]
    fn splits_at_the_first_read_after_the_send_and_the_write_after_it() {
        // A warm-up served before the send (read 100, write 150), the request read at 1_300
        // and answered at 4_300, its reply complete at 10_000.
        let p = [
            period(7, 90, Some(100), Some(150), 200),
            period(7, 1_200, Some(1_300), Some(4_300), 4_400),
        ];
        let s = split(&p, 1_000, 10_000).unwrap();
        assert_eq!(s.to_event_us, 0.2);
        assert_eq!(s.to_read_us, 0.3);
        assert_eq!(s.compute_us, 3.0);
        assert_eq!(s.reply_us, 5.7);
        // Nothing read after the send: no split.
        assert!(split(&p[..1], 1_000, 10_000).is_none());
    }

    #[test]
    fn a_hand_off_writes_from_another_thread() {
        // Thread 1 reads at 2_000; thread 2 writes the reply at 5_000.
        let p = [
            period(1, 1_900, Some(2_000), None, 2_100),
            period(2, 4_900, None, Some(5_000), 5_100),
        ];
        let s = split(&p, 1_000, 8_000).unwrap();
        assert_eq!((s.to_read_us, s.compute_us, s.reply_us), (1.0, 3.0, 3.0));
        assert_eq!(s.to_event_us, 0.9);
        // A thread already busy at the send: its event is the send itself.
        let busy = [period(1, 500, Some(2_000), Some(3_000), 3_100)];
        assert_eq!(split(&busy, 1_000, 8_000).unwrap().to_event_us, 0.0);
    }
}
