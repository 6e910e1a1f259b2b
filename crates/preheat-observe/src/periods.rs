//! Busy periods from a process's system calls (pure: no I/O, no clocks, deterministic).
//!
//! The input is the time-ordered stream of one process's syscall entries and exits (number, the
//! first two arguments on entry, the return value on exit), as the tracepoints deliver it; the
//! output is its busy periods attributed to the listening port. The model is the agent's
//! (`preheat-agent::track`), seen from outside, plus the hand-off:
//!
//! - A thread is *idle* inside a wait call: `epoll_wait`/`epoll_pwait`/`epoll_pwait2`, `poll`,
//!   `ppoll`, `select`, `pselect6`, the waiting `futex` operations and `futex_waitv`, `nanosleep`,
//!   `clock_nanosleep`, `pause`. A *candidate* busy period starts at the exit of every wait and
//!   ends at the thread's next wait entry; it is kept only if it touched the port.
//! - *Blocking readers* (threads never seen in an event wait: thread-per-connection servers, a
//!   reader thread blocked in `recv`): their `accept` on the listening socket and their reads on
//!   the port's connections are waits too, so the period starts when such a call returns.
//! - Attribution: an `accept` on the port's listening socket, or a read returning data
//!   (`read`, `readv`, `recvfrom`, `recvmsg`, `recvmmsg`) or a write attempted (`write`,
//!   `writev`, `sendto`, `sendmsg`, `sendmmsg`, `sendfile`: seen at entry, their exits are not
//!   traced) on one of its connections. The connections are
//!   the fds `accept` returned on the listening socket, and those the caller found open at attach
//!   ([`Tracker::add_connection`]); `close` forgets them.
//! - A period that read a request is [`Kind::Read`]; one that only wrote a reply on a connection
//!   whose last read was another thread's is a [`Kind::HandOff`] (the request followed to the
//!   thread that writes the reply, with the reading thread named); one that only wrote on a
//!   connection it read itself earlier is a [`Kind::Reply`]; one that only accepted,
//!   [`Kind::Accept`].
//!
//! Departures from the agent: a `futex` wait is a wait here (the agent does not hook it), so a
//! period interrupted by lock contention is split and only its parts that touched the port are
//! kept; periods still open when the observation ends are counted, not emitted.
#![forbid(unsafe_code)]

use std::collections::BTreeMap;

use crate::schedperiods::Readers;
pub use crate::schedperiods::SchedPeriod;

use serde::Serialize;

/// x86_64 system call numbers the tracker classifies.
pub mod nr {
    pub const READ: i64 = 0;
    pub const WRITE: i64 = 1;
    pub const CLOSE: i64 = 3;
    pub const POLL: i64 = 7;
    pub const READV: i64 = 19;
    pub const WRITEV: i64 = 20;
    pub const SELECT: i64 = 23;
    pub const PAUSE: i64 = 34;
    pub const NANOSLEEP: i64 = 35;
    pub const SENDFILE: i64 = 40;
    pub const ACCEPT: i64 = 43;
    pub const SENDTO: i64 = 44;
    pub const RECVFROM: i64 = 45;
    pub const SENDMSG: i64 = 46;
    pub const RECVMSG: i64 = 47;
    pub const FUTEX: i64 = 202;
    pub const CLOCK_NANOSLEEP: i64 = 230;
    pub const EPOLL_WAIT: i64 = 232;
    pub const PSELECT6: i64 = 270;
    pub const PPOLL: i64 = 271;
    pub const EPOLL_PWAIT: i64 = 281;
    pub const ACCEPT4: i64 = 288;
    pub const RECVMMSG: i64 = 299;
    pub const SENDMMSG: i64 = 307;
    pub const EPOLL_PWAIT2: i64 = 441;
    pub const FUTEX_WAITV: i64 = 449;

    /// The numbers whose exits the tracker needs (waits end, accepts return the connection,
    /// reads say whether data came); writes and closes are acted on at entry, so the exit
    /// events' filter keeps only these (fewer samples per request: the observer's cost).
    pub const EXITS: [i64; 19] = [
        READ,
        POLL,
        READV,
        SELECT,
        PAUSE,
        NANOSLEEP,
        ACCEPT,
        RECVFROM,
        RECVMSG,
        FUTEX,
        CLOCK_NANOSLEEP,
        EPOLL_WAIT,
        PSELECT6,
        PPOLL,
        EPOLL_PWAIT,
        ACCEPT4,
        RECVMMSG,
        EPOLL_PWAIT2,
        FUTEX_WAITV,
    ];

    /// Every number the tracker looks at (the tracepoint filter keeps only these).
    pub const TRACED: [i64; 26] = [
        READ,
        WRITE,
        CLOSE,
        POLL,
        READV,
        WRITEV,
        SELECT,
        PAUSE,
        NANOSLEEP,
        SENDFILE,
        ACCEPT,
        SENDTO,
        RECVFROM,
        SENDMSG,
        RECVMSG,
        FUTEX,
        CLOCK_NANOSLEEP,
        EPOLL_WAIT,
        PSELECT6,
        PPOLL,
        EPOLL_PWAIT,
        ACCEPT4,
        RECVMMSG,
        SENDMMSG,
        EPOLL_PWAIT2,
        FUTEX_WAITV,
    ];
}

/// What a system call is to the tracker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// An event wait (epoll, poll, select): the thread is an event-loop thread.
    EventWait,
    /// Another wait (futex wait, sleeps).
    Wait,
    Accept,
    Read,
    Write,
    Close,
    Other,
}

/// The class of syscall `n` with first arguments `args` (the futex operation is the second).
pub fn classify(n: i64, args: [u64; 2]) -> Class {
    use nr::*;
    match n {
        EPOLL_WAIT | EPOLL_PWAIT | EPOLL_PWAIT2 | POLL | PPOLL | SELECT | PSELECT6 => {
            Class::EventWait
        }
        FUTEX => {
            // FUTEX_WAIT, FUTEX_LOCK_PI, FUTEX_WAIT_BITSET, FUTEX_WAIT_REQUEUE_PI,
            // FUTEX_LOCK_PI2 (the command without the PRIVATE and CLOCK_REALTIME flags).
            match args[1] & 0x7f {
                0 | 6 | 9 | 11 | 13 => Class::Wait,
                _ => Class::Other,
            }
        }
        FUTEX_WAITV | NANOSLEEP | CLOCK_NANOSLEEP | PAUSE => Class::Wait,
        ACCEPT | ACCEPT4 => Class::Accept,
        READ | READV | RECVFROM | RECVMSG | RECVMMSG => Class::Read,
        WRITE | WRITEV | SENDTO | SENDMSG | SENDMMSG | SENDFILE => Class::Write,
        CLOSE => Class::Close,
        _ => Class::Other,
    }
}

/// One syscall entry or exit of a thread of the observed process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SysEvent {
    /// CLOCK_MONOTONIC, ns.
    pub time_ns: u64,
    pub tid: u32,
    pub nr: i64,
    pub what: Edge,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Edge {
    /// Entry, with the first two arguments.
    Enter([u64; 2]),
    /// Exit, with the return value (negative errno on failure).
    Exit(i64),
    /// Exit, with the return value and the call's first argument (the second: 0): its entry
    /// may not have been recorded (the period programs, [`crate::periodprog`], leave out an
    /// event-loop thread's read and accept entries), so it stands for both where no entry of
    /// the same call is pending.
    ExitWith(i64, [u64; 2]),
}

/// The syscall a thread is blocked in, from `/proc/PID/task/TID/syscall` (`NR ARG1 … SP PC`;
/// `running` or `-1 SP PC` when it is not in one): its number and first two arguments, fed as
/// an entry at attach so the exit that follows is paired (a blocking `accept` then adopts the
/// connection it returns).
pub fn parse_proc_syscall(text: &str) -> Option<(i64, [u64; 2])> {
    let mut f = text.split_whitespace();
    let n: i64 = f.next()?.parse().ok()?;
    let hex = |s: Option<&str>| u64::from_str_radix(s?.trim_start_matches("0x"), 16).ok();
    let a0 = hex(f.next())?;
    let a1 = hex(f.next())?;
    (n >= 0).then_some((n, [a0, a1]))
}

/// What a busy period did on the port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Kind {
    /// Read a request on a connection of the port (and maybe answered it).
    Read,
    /// Wrote the reply to a request another thread read (`from`).
    HandOff { from: u32 },
    /// Wrote on a connection this thread read earlier, without reading.
    Reply,
    /// Only accepted a connection.
    Accept,
}

/// One busy period of one thread, attributed to the port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Period {
    pub tid: u32,
    /// CLOCK_MONOTONIC ns: the exit of the wait that ended the idle time.
    pub start_ns: u64,
    /// CLOCK_MONOTONIC ns: the entry of the next wait.
    pub end_ns: u64,
    #[serde(flatten)]
    pub kind: Kind,
    /// Reads that returned data on the port's connections.
    pub reads: u32,
    /// Writes on the port's connections (a hand-off thread that finds the next request already
    /// queued answers it without waiting: two replies, one busy period).
    pub writes: u32,
    /// CLOCK_MONOTONIC ns: the exit of the period's first read that returned data on a
    /// connection of the port (the request is in the server's hands), if it read one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_read_ns: Option<u64>,
    /// CLOCK_MONOTONIC ns: the entry of the period's first write on a connection of the port
    /// (the reply leaves the server's own code), if it wrote one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_write_ns: Option<u64>,
    /// CLOCK_MONOTONIC ns: where the period wrote a reply, the start of the period that first
    /// read its request (since the connection's last reply): this period's own start, or an
    /// earlier one's — of the thread that read it and handed it over, or of a runtime's read
    /// ahead on another thread (Go's background read). The scheduler form only (else `None`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_start_ns: Option<u64>,
}

impl Period {
    /// When the request this period served began being served: [`Period::request_start_ns`]
    /// where known, else the period's start.
    pub fn request_start(&self) -> u64 {
        self.request_start_ns.unwrap_or(self.start_ns)
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct Busy {
    start_ns: u64,
    accepted: bool,
    reads: u32,
    writes: u32,
    /// The reading thread of a connection this period wrote on, when another thread.
    from: Option<u32>,
    first_read_ns: Option<u64>,
    first_write_ns: Option<u64>,
}

#[derive(Debug, Default)]
struct Thread {
    /// The syscall entered and not yet exited: number and arguments.
    pending: Option<(i64, [u64; 2])>,
    busy: Option<Busy>,
    /// Seen in an event wait: its accepts and reads are not waits.
    event_loop: bool,
}

/// Counts about the stream itself.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct StreamCounts {
    pub events: u64,
    /// Candidate periods that never touched the port.
    pub unattributed: u64,
    /// Periods still open at the end (not emitted).
    pub open_at_end: u64,
    /// Exits without their entry (the thread was inside the call at attach).
    pub unpaired_exits: u64,
}

/// The state machine: feed events in time order ([`Tracker::feed`]), take the periods.
#[derive(Debug, Default)]
pub struct Tracker {
    listening: BTreeMap<u64, ()>,
    /// Connection fd → the thread that last read data from it.
    conns: BTreeMap<u64, Option<u32>>,
    threads: BTreeMap<u32, Thread>,
    periods: Vec<Period>,
    counts: StreamCounts,
    /// The calls inside a period are not stamped (the period programs): no first read or
    /// first write times.
    unstamped_calls: bool,
    /// The scheduler form: per connection, the thread that last read from it and where its
    /// open request began.
    readers: Readers,
}

impl Tracker {
    pub fn new() -> Tracker {
        Tracker::default()
    }

    /// The events' calls inside a busy period carry the period's start, not their own time
    /// ([`crate::periodprog`]): periods then have no `first_read_ns`/`first_write_ns`.
    pub fn unstamped_calls(&mut self) {
        self.unstamped_calls = true;
    }

    /// `fd` is a socket listening on the port.
    pub fn add_listener(&mut self, fd: u64) {
        self.listening.insert(fd, ());
    }

    /// `fd` is a connection of the port (found open at attach).
    pub fn add_connection(&mut self, fd: u64) {
        self.conns.insert(fd, None);
    }

    pub fn feed(&mut self, e: &SysEvent) {
        self.counts.events += 1;
        match e.what {
            Edge::Enter(args) => self.enter(e, args),
            Edge::Exit(ret) => self.exit(e, ret, None),
            Edge::ExitWith(ret, args) => self.exit(e, ret, Some(args)),
        }
    }

    fn enter(&mut self, e: &SysEvent, args: [u64; 2]) {
        let class = classify(e.nr, args);
        let th = self.threads.entry(e.tid).or_default();
        th.pending = Some((e.nr, args));
        let fd = args[0];
        let blocking_wait = !th.event_loop
            && match class {
                Class::Accept => self.listening.contains_key(&fd),
                Class::Read => self.conns.contains_key(&fd),
                _ => false,
            };
        if class == Class::EventWait {
            th.event_loop = true;
        }
        if matches!(class, Class::EventWait | Class::Wait) || blocking_wait {
            self.end_busy(e.tid, e.time_ns);
        }
        if class == Class::Close {
            self.conns.remove(&fd);
            self.listening.remove(&fd);
        }
        if class == Class::Write {
            if let Some(reader) = self.conns.get(&fd) {
                let th = self.threads.entry(e.tid).or_default();
                let b = th.busy.get_or_insert(Busy {
                    start_ns: e.time_ns,
                    ..Busy::default()
                });
                b.writes = b.writes.saturating_add(1);
                if !self.unstamped_calls {
                    b.first_write_ns.get_or_insert(e.time_ns);
                }
                if let Some(r) = reader.filter(|r| *r != e.tid) {
                    b.from = Some(r);
                }
            }
        }
    }

    fn exit(&mut self, e: &SysEvent, ret: i64, with: Option<[u64; 2]>) {
        let th = self.threads.entry(e.tid).or_default();
        let pending = th.pending.take().filter(|(n, _)| *n == e.nr);
        let Some((n, args)) = pending.or(with.map(|a| (e.nr, a))) else {
            self.counts.unpaired_exits += 1;
            if matches!(classify(e.nr, [0, 0]), Class::EventWait | Class::Wait) {
                th.busy = Some(Busy {
                    start_ns: e.time_ns,
                    ..Busy::default()
                });
            }
            return;
        };
        let fd = args[0];
        let tid = e.tid;
        let now = e.time_ns;
        match classify(n, args) {
            Class::EventWait | Class::Wait => {
                th.busy = Some(Busy {
                    start_ns: now,
                    ..Busy::default()
                });
            }
            Class::Accept if ret >= 0 && self.listening.contains_key(&fd) => {
                self.conns.insert(ret as u64, None);
                th.busy
                    .get_or_insert(Busy {
                        start_ns: now,
                        ..Busy::default()
                    })
                    .accepted = true;
            }
            Class::Read if ret > 0 && self.conns.contains_key(&fd) => {
                self.conns.insert(fd, Some(tid));
                let b = th.busy.get_or_insert(Busy {
                    start_ns: now,
                    ..Busy::default()
                });
                b.reads = b.reads.saturating_add(1);
                if !self.unstamped_calls {
                    b.first_read_ns.get_or_insert(now);
                }
            }
            _ => {}
        }
    }

    fn end_busy(&mut self, tid: u32, now: u64) {
        let Some(b) = self.threads.get_mut(&tid).and_then(|t| t.busy.take()) else {
            return;
        };
        let kind = if b.reads > 0 {
            Kind::Read
        } else if let Some(from) = b.from {
            Kind::HandOff { from }
        } else if b.writes > 0 {
            Kind::Reply
        } else if b.accepted {
            Kind::Accept
        } else {
            self.counts.unattributed += 1;
            return;
        };
        self.periods.push(Period {
            tid,
            start_ns: b.start_ns,
            end_ns: now.max(b.start_ns),
            kind,
            reads: b.reads,
            writes: b.writes,
            first_read_ns: b.first_read_ns,
            first_write_ns: b.first_write_ns,
            request_start_ns: None,
        });
    }

    /// A period of the scheduler form, fed in the order they started: a [`Kind::Read`] if it
    /// read, a [`Kind::HandOff`] if it only wrote on a connection another thread read last,
    /// else a [`Kind::Reply`]. Its calls are not stamped: no first read or write times.
    pub fn feed_period(&mut self, p: &SchedPeriod) {
        self.counts.events += 1;
        let (from, request_start_ns) = self.readers.note(p);
        let kind = match from {
            _ if p.reads > 0 => Kind::Read,
            Some(from) => Kind::HandOff { from },
            None if p.writes > 0 => Kind::Reply,
            None => {
                self.counts.unattributed += 1;
                return;
            }
        };
        self.periods.push(Period {
            tid: p.tid,
            start_ns: p.start_ns,
            end_ns: p.end_ns.max(p.start_ns),
            kind,
            reads: p.reads,
            writes: p.writes,
            first_read_ns: None,
            first_write_ns: None,
            request_start_ns,
        });
    }

    /// The periods that ended since the last call (in the order they ended), for a tracker fed
    /// live; [`Tracker::finish`] then returns only those not taken.
    pub fn take_periods(&mut self) -> Vec<Period> {
        std::mem::take(&mut self.periods)
    }

    /// The periods found so far (in the order they ended) and the stream's counts; periods
    /// still open are counted in `open_at_end`.
    pub fn finish(mut self) -> (Vec<Period>, StreamCounts) {
        self.counts.open_at_end = self.threads.values().filter(|t| t.busy.is_some()).count() as u64;
        (self.periods, self.counts)
    }
}

#[cfg(test)]
mod tests {
    use super::nr::*;
    use super::*;

    struct Script {
        t: u64,
        ev: Vec<SysEvent>,
    }

    impl Script {
        fn new() -> Script {
            Script {
                t: 1000,
                ev: Vec::new(),
            }
        }
        fn call(&mut self, tid: u32, n: i64, args: [u64; 2], ret: i64) -> &mut Script {
            self.t += 10;
            self.ev.push(SysEvent {
                time_ns: self.t,
                tid,
                nr: n,
                what: Edge::Enter(args),
            });
            self.t += 10;
            self.ev.push(SysEvent {
                time_ns: self.t,
                tid,
                nr: n,
                what: Edge::Exit(ret),
            });
            self
        }
        fn run(&self, listen: &[u64], conns: &[u64]) -> (Vec<Period>, StreamCounts) {
            let mut tr = Tracker::new();
            listen.iter().for_each(|fd| tr.add_listener(*fd));
            conns.iter().for_each(|fd| tr.add_connection(*fd));
            self.ev.iter().for_each(|e| tr.feed(e));
            tr.finish()
        }
    }

    #[test]
    fn event_loop_requests_are_read_periods() {
        let mut s = Script::new();
        s.call(1, EPOLL_WAIT, [4, 0], 1).call(1, ACCEPT4, [3, 0], 5);
        for _ in 0..3 {
            s.call(1, EPOLL_WAIT, [4, 0], 1)
                .call(1, READ, [5, 0], 10)
                .call(1, WRITE, [5, 0], 10)
                .call(1, READ, [5, 0], -11);
        }
        s.call(1, EPOLL_WAIT, [4, 0], 0);
        let (p, c) = s.run(&[3], &[]);
        let kinds: Vec<Kind> = p.iter().map(|p| p.kind).collect();
        assert_eq!(kinds, [Kind::Accept, Kind::Read, Kind::Read, Kind::Read]);
        assert_eq!(c.open_at_end, 1); // the candidate after the last wait
                                      // A period runs from the wait's exit to the next wait's entry.
        assert_eq!(p[1].start_ns, 1000 + 4 * 10 + 20);
        assert!(p.iter().all(|p| p.end_ns > p.start_ns && p.tid == 1));
    }

    #[test]
    fn a_period_stamps_its_first_read_and_first_write() {
        // wait(1000–1020) · read EAGAIN · read data (1060 exit) · other · write (1090 entry) ·
        // a second read and write · wait.
        let mut s = Script::new();
        s.call(1, EPOLL_WAIT, [4, 0], 1)
            .call(1, READ, [5, 0], -11)
            .call(1, READ, [5, 0], 10)
            .call(1, FUTEX, [0x1000, 0x81], 0)
            .call(1, WRITE, [5, 0], 10)
            .call(1, READ, [5, 0], 10)
            .call(1, WRITE, [5, 0], 10)
            .call(1, EPOLL_WAIT, [4, 0], 0);
        let (p, _) = s.run(&[3], &[5]);
        assert_eq!(p.len(), 1);
        assert_eq!(p[0].start_ns, 1020);
        assert_eq!(p[0].first_read_ns, Some(1060));
        assert_eq!(p[0].first_write_ns, Some(1090));
        // A period that only accepted has neither.
        let mut s = Script::new();
        s.call(1, EPOLL_WAIT, [4, 0], 1)
            .call(1, ACCEPT4, [3, 0], 5)
            .call(1, EPOLL_WAIT, [4, 0], 0);
        let (p, _) = s.run(&[3], &[]);
        assert_eq!((p[0].first_read_ns, p[0].first_write_ns), (None, None));
    }

    #[test]
    fn other_fds_and_timeouts_are_not_attributed() {
        let mut s = Script::new();
        s.call(1, EPOLL_WAIT, [4, 0], 1)
            .call(1, READ, [9, 0], 10)
            .call(1, WRITE, [9, 0], 10)
            .call(1, EPOLL_WAIT, [4, 0], 0)
            .call(1, EPOLL_WAIT, [4, 0], 0);
        let (p, c) = s.run(&[3], &[5]);
        assert!(p.is_empty());
        assert_eq!(c.unattributed, 2);
    }

    #[test]
    fn hand_off_is_attributed_to_the_writer() {
        // Thread 1 blocks in recv on connection 5 and queues the request; thread 2 waits on a
        // futex, wakes, and writes the reply.
        let mut s = Script::new();
        s.call(2, FUTEX, [0x1000, 0x80], -11);
        for _ in 0..2 {
            s.call(1, RECVFROM, [5, 0], 20)
                .call(1, FUTEX, [0x1000, 0x81], 1)
                .call(2, FUTEX, [0x1000, 0x80], 0)
                .call(2, SENDTO, [5, 0], 20);
        }
        s.call(1, RECVFROM, [5, 0], 20)
            .call(2, FUTEX, [0x1000, 0x80], 0);
        let (p, _) = s.run(&[3], &[5]);
        let by = |tid: u32| {
            p.iter()
                .filter(|p| p.tid == tid)
                .map(|p| p.kind)
                .collect::<Vec<_>>()
        };
        assert_eq!(by(1), [Kind::Read, Kind::Read]);
        assert_eq!(
            by(2),
            [Kind::HandOff { from: 1 }, Kind::HandOff { from: 1 }]
        );
    }

    #[test]
    fn close_forgets_and_accept_adopts() {
        let mut s = Script::new();
        s.call(1, EPOLL_WAIT, [4, 0], 1)
            .call(1, CLOSE, [5, 0], 0)
            .call(1, EPOLL_WAIT, [4, 0], 1)
            .call(1, READ, [5, 0], 10)
            .call(1, EPOLL_WAIT, [4, 0], 1)
            .call(1, ACCEPT, [3, 0], 5)
            .call(1, READ, [5, 0], 10)
            .call(1, EPOLL_WAIT, [4, 0], 0);
        let (p, c) = s.run(&[3], &[5]);
        assert_eq!(p.len(), 1);
        assert_eq!(p[0].kind, Kind::Read);
        assert_eq!(c.unattributed, 2);
    }

    #[test]
    fn blocking_accept_and_read_threads() {
        // Thread-per-connection: thread 1 blocks in accept, thread 2 in read on the connection.
        let mut s = Script::new();
        s.call(1, ACCEPT4, [3, 0], 7)
            .call(2, READ, [7, 0], 30)
            .call(2, WRITE, [7, 0], 30);
        s.call(2, READ, [7, 0], 30)
            .call(2, WRITE, [7, 0], 30)
            .call(2, READ, [7, 0], 0);
        s.call(1, ACCEPT4, [3, 0], -4);
        let (p, _) = s.run(&[3], &[]);
        let kinds: Vec<(u32, Kind)> = p.iter().map(|p| (p.tid, p.kind)).collect();
        assert_eq!(kinds, [(2, Kind::Read), (2, Kind::Read), (1, Kind::Accept)]);
    }

    #[test]
    fn exits_at_attach_and_open_periods() {
        let mut s = Script::new();
        s.ev.push(SysEvent {
            time_ns: 5,
            tid: 1,
            nr: EPOLL_WAIT,
            what: Edge::Exit(1),
        });
        s.call(1, READ, [5, 0], 10);
        let (p, c) = s.run(&[], &[5]);
        assert!(p.is_empty());
        assert_eq!((c.unpaired_exits, c.open_at_end), (1, 1));
    }

    #[test]
    fn scheduler_periods_follow_the_hand_off() {
        let period = |tid, start_ns, reads, writes, calls: &[(u64, bool)]| {
            let mut p = SchedPeriod {
                tid,
                start_ns,
                end_ns: start_ns + 10,
                reads,
                writes,
                kept: calls.len(),
                ..SchedPeriod::default()
            };
            p.calls[..calls.len()].copy_from_slice(calls);
            p
        };
        let mut t = Tracker::new();
        // An event loop reads and answers connection 1; a reader thread 7 hands connection 2
        // to a worker 8; then 8 answers connection 3, read by nobody it knows; a period with
        // nothing on the port is not one.
        t.feed_period(&period(5, 100, 1, 1, &[(1, false), (1, true)]));
        t.feed_period(&period(7, 200, 1, 0, &[(2, false)]));
        t.feed_period(&period(8, 210, 0, 2, &[(2, true), (2, true)]));
        t.feed_period(&period(8, 300, 0, 1, &[(3, true)]));
        t.feed_period(&period(9, 400, 0, 0, &[]));
        // More calls than kept: counted all the same.
        t.feed_period(&period(5, 500, 9, 9, &[(1, false)]));
        let (ps, counts) = t.finish();
        let kinds: Vec<Kind> = ps.iter().map(|p| p.kind).collect();
        assert_eq!(
            kinds,
            [
                Kind::Read,
                Kind::Read,
                Kind::HandOff { from: 7 },
                Kind::Reply,
                Kind::Read
            ]
        );
        assert_eq!((ps[2].writes, ps[4].reads), (2, 9));
        // The request each reply answered began with the period that read it: the event
        // loop's own, the reader's for the hand-off; unknown for connection 3.
        let starts: Vec<Option<u64>> = ps.iter().map(|p| p.request_start_ns).collect();
        assert_eq!(starts, [Some(100), None, Some(200), None, None]);
        assert_eq!(ps[2].request_start(), 200);
        assert_eq!(ps[3].request_start(), 300);
        assert!(ps
            .iter()
            .all(|p| p.first_read_ns.is_none() && p.end_ns == p.start_ns + 10));
        assert_eq!((counts.events, counts.unattributed), (6, 1));
    }

    #[test]
    fn proc_syscall_lines() {
        let l = "43 0x3 0x7ffd2c1e0f10 0x7ffd2c1e0f0c 0x0 0x0 0x0 0x7ffd2c1e0ee8 0x7f3c8a1b2c3d\n";
        assert_eq!(parse_proc_syscall(l), Some((43, [3, 0x7ffd2c1e0f10])));
        assert_eq!(parse_proc_syscall("running\n"), None);
        assert_eq!(
            parse_proc_syscall("-1 0x7ffd2c1e0ee8 0x7f3c8a1b2c3d\n"),
            None
        );
        assert_eq!(parse_proc_syscall(""), None);
    }

    #[test]
    fn every_call_whose_exit_matters_is_kept_at_exit() {
        // Waits (their exit starts a period), accepts (the connection) and reads (whether data
        // came): futex_waitv's exit was missing from the list once.
        for &n in &TRACED {
            let class = classify(n, [0, 0x80]);
            let needs_exit = matches!(
                class,
                Class::EventWait | Class::Wait | Class::Accept | Class::Read
            );
            assert_eq!(EXITS.contains(&n), needs_exit, "syscall {n} ({class:?})");
        }
    }

    #[test]
    fn futex_operations() {
        assert_eq!(classify(FUTEX, [0, 0x80]), Class::Wait);
        assert_eq!(classify(FUTEX, [0, 0x189]), Class::Wait);
        assert_eq!(classify(FUTEX, [0, 0x81]), Class::Other);
        assert_eq!(classify(SENDFILE, [0, 0]), Class::Write);
    }
}
