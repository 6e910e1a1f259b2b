//! The scheduler form's periods as the tracker takes them (pure: no I/O, deterministic): the
//! decoded record ([`crate::decode::decode_sched`]) and the per-connection table that follows a
//! request from the period that read it to the one that answers it
//! ([`crate::periods::Tracker::feed_period`]).
#![forbid(unsafe_code)]

/// A busy period as the scheduler form writes it ([`crate::schedprog`]): bounded by the
/// scheduler (switched in, switched out asleep), its reads and writes on the port counted,
/// the connections of its first calls kept. [`crate::periods::Tracker::feed_period`] attributes it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SchedPeriod {
    pub tid: u32,
    pub start_ns: u64,
    pub end_ns: u64,
    pub reads: u32,
    pub writes: u32,
    /// The first `kept` calls' connections (the peer's address and port), in order: `true`
    /// for a write.
    pub calls: [(u64, bool); crate::schedprog::EVENTS],
    pub kept: usize,
}

impl SchedPeriod {
    /// The kept calls.
    pub fn calls(&self) -> &[(u64, bool)] {
        self.calls.get(..self.kept).unwrap_or(&self.calls)
    }
}

/// Connections whose reading thread (and open request) the tracker remembers for the scheduler
/// form, in a direct-mapped table (no allocation per call, and bounded: that form sees no
/// close): two connections that map to one entry forget each other, so a hand-off on one of
/// them may read as a reply, its request's start as the writing period's.
const READERS: usize = 1 << 12;

/// An entry of the readers' table (a thread id of 0: empty).
#[derive(Debug, Clone, Copy, Default)]
struct Reader {
    conn: u64,
    tid: u32,
    request_start_ns: u64,
}

/// The entry of connection `conn` in the readers' table.
fn reader_entry(conn: u64) -> usize {
    (conn.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 52) as usize % READERS
}

/// Per connection (by [`reader_entry`]), the thread that last read from it and the start of
/// the first period that read its open request (0: none open); empty until the first period.
#[derive(Debug, Default)]
pub(crate) struct Readers(Vec<Reader>);

impl Readers {
    /// Take `p`'s calls in order: a read makes its thread the connection's reader and, where no
    /// request is open on it, opens one at `p`'s start; a write answers the open request.
    /// Returns the reader of a connection `p` wrote on when another thread (the hand-off's
    /// source), and the start of the first request `p` answered.
    pub(crate) fn note(&mut self, p: &SchedPeriod) -> (Option<u32>, Option<u64>) {
        if self.0.is_empty() {
            self.0 = vec![Reader::default(); READERS];
        }
        let (mut from, mut request_start_ns) = (None, None);
        for &(conn, write) in p.calls() {
            let Some(e) = self.0.get_mut(reader_entry(conn)) else {
                continue;
            };
            let known = e.conn == conn && e.tid != 0;
            if !write {
                let open = if known { e.request_start_ns } else { 0 };
                *e = Reader {
                    conn,
                    tid: p.tid,
                    request_start_ns: if open != 0 { open } else { p.start_ns },
                };
            } else if known {
                if e.tid != p.tid {
                    from = Some(e.tid);
                }
                if e.request_start_ns != 0 {
                    request_start_ns.get_or_insert(e.request_start_ns);
                }
                e.request_start_ns = 0;
            }
        }
        (from, request_start_ns)
    }
}
