//! Perf ring-buffer samples and the eBPF observer's records → [`SysEvent`]s (pure: no I/O, never
//! panics on any input).
//!
//! A sample written with `PERF_SAMPLE_TID | PERF_SAMPLE_TIME | PERF_SAMPLE_RAW` is
//! `{header: type u32, misc u16, size u16; pid u32, tid u32; time u64; raw_size u32; raw}`;
//! the raw record of `raw_syscalls:sys_enter` is `{common_type u16, …; id i64 @8; args[6] @16}`,
//! of `sys_exit` `{common_type u16, …; id i64 @8; ret i64 @16}` (checked against the
//! tracepoints' `format` files at attach: [`crate::tracefs`]). `PERF_RECORD_LOST` records count
//! the samples the kernel dropped because the buffer was full.
#![forbid(unsafe_code)]

use crate::periods::{Edge, SchedPeriod, SysEvent};

const RECORD_LOST: u32 = 2;
const RECORD_SAMPLE: u32 = 9;

/// The tracepoint ids of the entry and exit events (the raw record's `common_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ids {
    pub enter: u16,
    pub exit: u16,
}

/// Little-endian integers at byte `at` of `b`; `None` past its end (the crate's one set of
/// readers: ring-buffer records here, the kernel's BTF in [`crate::btf`]).
pub(crate) fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(
        b.get(at..at.checked_add(2)?)?.try_into().ok()?,
    ))
}
pub(crate) fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(
        b.get(at..at.checked_add(4)?)?.try_into().ok()?,
    ))
}
pub(crate) fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(
        b.get(at..at.checked_add(8)?)?.try_into().ok()?,
    ))
}

/// One sample's body (after the 8-byte header).
fn sample(body: &[u8], ids: Ids, pid: Option<u32>) -> Option<SysEvent> {
    if pid.is_some_and(|p| u32_at(body, 0) != Some(p)) {
        return None;
    }
    let tid = u32_at(body, 4)?;
    let time_ns = u64_at(body, 8)?;
    let raw_size = u32_at(body, 16)? as usize;
    let raw = body.get(20..20usize.checked_add(raw_size)?)?;
    let ty = u16_at(raw, 0)?;
    let nr = u64_at(raw, 8)? as i64;
    let what = if ty == ids.enter {
        Edge::Enter([u64_at(raw, 16)?, u64_at(raw, 24)?])
    } else if ty == ids.exit {
        Edge::Exit(u64_at(raw, 16)? as i64)
    } else {
        return None;
    };
    Some(SysEvent {
        time_ns,
        tid,
        nr,
        what,
    })
}

/// Decode the records in `bytes` (whole records, as drained), appending the events of process
/// `pid` (`None`: of every process) to `out`; returns the number of samples the kernel reported
/// lost. Stops at a malformed header.
pub fn decode(bytes: &[u8], ids: Ids, pid: Option<u32>, out: &mut Vec<SysEvent>) -> u64 {
    let mut lost = 0u64;
    let mut at = 0usize;
    while let (Some(ty), Some(size)) = (u32_at(bytes, at), u16_at(bytes, at + 6)) {
        let size = usize::from(size);
        let Some(rec) = bytes.get(at..at + size).filter(|_| size >= 8) else {
            break;
        };
        let body = rec.get(8..).unwrap_or_default();
        match ty {
            RECORD_SAMPLE => out.extend(sample(body, ids, pid)),
            RECORD_LOST => lost = lost.saturating_add(u64_at(body, 8).unwrap_or(0)),
            _ => {}
        }
        at += size;
    }
    lost
}

/// Decode the eBPF observer's records as [`crate::bpf`]'s drain frames them (each: its length
/// as a u32, a u32 of zero, the record, padded to 8 bytes), appending their events to `out`:
/// per-call records ([`crate::bpfprog::RECORD_SIZE`] bytes, see [`crate::bpfprog`]) and period
/// records (the slot up to its last kept call: up to [`crate::periodprog::SLOT_SIZE`] bytes,
/// see [`crate::periodprog`]). The programs
/// already kept only the observed process; a record of another size or a truncated one ends
/// the decoding (never written by these programs). Returns the records decoded.
pub fn decode_bpf(bytes: &[u8], out: &mut Vec<SysEvent>) -> u64 {
    use crate::periodprog::{CALLS, CALL_SIZE, SLOT_SIZE};
    frames(bytes, |rec| {
        let len = rec.len();
        let calls = len.checked_sub(CALLS as usize);
        if len == crate::bpfprog::RECORD_SIZE {
            per_call(rec, out);
        } else if len <= SLOT_SIZE && calls.is_some_and(|c| c % CALL_SIZE as usize == 0) {
            period(rec, out);
        } else {
            return false;
        }
        true
    })
}

/// Decode the scheduler form's records ([`crate::schedprog`]: the slot up to its last kept
/// call, framed as [`decode_bpf`] says) into `out`; a record of another size ends the
/// decoding. Returns the records decoded.
pub fn decode_sched(bytes: &[u8], out: &mut Vec<SchedPeriod>) -> u64 {
    use crate::schedprog as s;
    frames(bytes, |rec| {
        let calls = rec.len().checked_sub(s::CALLS as usize);
        if rec.len() > s::SLOT_SIZE || calls.is_none_or(|c| c % s::CALL_SIZE as usize != 0) {
            return false;
        }
        let word = |off: i16| u64_at(rec, off as usize).unwrap_or(0);
        let half = |off: i16| u32_at(rec, off as usize).unwrap_or(0);
        let held = calls.unwrap_or(0) / s::CALL_SIZE as usize;
        let mut p = SchedPeriod {
            tid: half(s::TAG),
            start_ns: word(s::START_NS),
            end_ns: word(s::END_NS),
            reads: half(s::READS),
            writes: half(s::WRITES),
            kept: (word(s::COUNT) as usize).min(held),
            ..SchedPeriod::default()
        };
        for (i, c) in p.calls.iter_mut().take(p.kept).enumerate() {
            let at = s::CALLS + (i as i16) * s::CALL_SIZE;
            let (addr, port_edge) = (half(at), half(at + 4));
            let conn = u64::from(addr) << 16 | u64::from(port_edge >> 16);
            *c = (conn, port_edge & 0xffff == u32::from(s::WRITE));
        }
        out.push(p);
        true
    })
}

/// Call `f` on every record of a drain (each framed as [`decode_bpf`] says) until a truncated
/// frame or `f` says stop; returns how many it took.
fn frames(bytes: &[u8], mut f: impl FnMut(&[u8]) -> bool) -> u64 {
    let mut at = 0usize;
    let mut n = 0;
    while let Some(len) = u32_at(bytes, at).map(|l| l as usize) {
        let Some(rec) = at
            .checked_add(8)
            .and_then(|s| bytes.get(s..s.checked_add(len)?))
        else {
            break;
        };
        if !f(rec) {
            break;
        }
        n += 1;
        at = match at.checked_add(8 + len.div_ceil(8) * 8) {
            Some(next) => next,
            None => break,
        };
    }
    n
}

/// One per-call record: edge 0 an entry with two arguments, 1 an exit, 2 an exit with its
/// first argument.
fn per_call(rec: &[u8], out: &mut Vec<SysEvent>) {
    let field = |i: usize| u64_at(rec, i * 8).unwrap_or(0);
    let (pid_tgid, edge, time_ns, nr) = (field(0), field(1), field(2), field(3));
    let what = match edge {
        0 => Edge::Enter([field(4), field(5)]),
        2 => Edge::ExitWith(field(4) as i64, [field(5), 0]),
        _ => Edge::Exit(field(4) as i64),
    };
    out.push(SysEvent {
        time_ns,
        tid: pid_tgid as u32,
        nr: nr as i64,
        what,
    });
}

/// One period record: the opening wait's exit (unless a partial record of the same period
/// carried it), the kept calls (at the period's start: they are not stamped), and, in a record
/// that closes the period, the closing call's entry.
fn period(rec: &[u8], out: &mut Vec<SysEvent>) {
    use crate::periodprog as p;
    let word = |off: i16| u64_at(rec, off as usize).unwrap_or(0);
    let tid = u32_at(rec, p::TAG as usize).unwrap_or(0);
    let flags = u32_at(rec, p::FLAGS as usize).unwrap_or(0) as i32;
    let start = word(p::START_NS);
    let mut push = |time_ns: u64, nr: u64, what: Edge| {
        out.push(SysEvent {
            time_ns,
            tid,
            nr: nr as i64,
            what,
        })
    };
    if flags & p::flag::START_SENT == 0 {
        push(
            start,
            word(p::START_NR),
            Edge::Exit(word(p::START_RET) as i64),
        );
    }
    let held = rec.len().saturating_sub(p::CALLS as usize) / p::CALL_SIZE as usize;
    // What the record holds bounds the count (a record is at most a slot: EVENTS calls).
    let count = (word(p::COUNT) as usize).min(held);
    for i in 0..count {
        let at = p::CALLS + (i as i16) * p::CALL_SIZE;
        let (head, a0, a1) = (word(at), word(at + 8), word(at + 16));
        let nr = head & 0xffff_ffff;
        if head >> 32 == 0 {
            push(start, nr, Edge::Enter([a0, a1]));
        } else {
            push(start, nr, Edge::ExitWith(a1 as i64, [a0, 0]));
        }
    }
    if flags & p::flag::END != 0 {
        let end = word(p::END_NS);
        push(
            end,
            word(p::END_NR),
            Edge::Enter([word(p::END_A0), word(p::END_A1)]),
        );
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn record(ty: u16, tid: u32, time: u64, nr: i64, a: u64, b: u64) -> Vec<u8> {
        let mut raw = Vec::new();
        raw.extend(ty.to_le_bytes());
        raw.extend([0u8; 6]);
        raw.extend(nr.to_le_bytes());
        raw.extend(a.to_le_bytes());
        raw.extend(b.to_le_bytes());
        raw.extend([0u8; 32]);
        let mut body = Vec::new();
        body.extend(tid.to_le_bytes());
        body.extend(tid.to_le_bytes());
        body.extend(time.to_le_bytes());
        body.extend((raw.len() as u32).to_le_bytes());
        body.extend(raw);
        while (body.len() + 8) % 8 != 0 {
            body.push(0);
        }
        let mut r = Vec::new();
        r.extend(RECORD_SAMPLE.to_le_bytes());
        r.extend(0u16.to_le_bytes());
        r.extend(((body.len() + 8) as u16).to_le_bytes());
        r.extend(body);
        r
    }

    #[test]
    fn samples_and_lost() {
        let ids = Ids {
            enter: 443,
            exit: 444,
        };
        let mut b = record(443, 7, 100, 232, 4, 0);
        b.extend(record(444, 7, 200, 232, 1, 0));
        b.extend(record(999, 7, 250, 0, 0, 0));
        b.extend(RECORD_LOST.to_le_bytes());
        b.extend([0, 0, 24, 0]);
        b.extend(1u64.to_le_bytes());
        b.extend(5u64.to_le_bytes());
        let mut out = Vec::new();
        assert_eq!(decode(&b, ids, None, &mut out), 5);
        assert_eq!(
            out,
            [
                SysEvent {
                    time_ns: 100,
                    tid: 7,
                    nr: 232,
                    what: Edge::Enter([4, 0])
                },
                SysEvent {
                    time_ns: 200,
                    tid: 7,
                    nr: 232,
                    what: Edge::Exit(1)
                },
            ]
        );
        let mut other = Vec::new();
        decode(&b, ids, Some(8), &mut other);
        assert!(other.is_empty());
    }

    /// `words` framed as the drain frames a record.
    fn framed(words: &[u64]) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend(((words.len() * 8) as u32).to_le_bytes());
        b.extend(0u32.to_le_bytes());
        words.iter().for_each(|w| b.extend(w.to_le_bytes()));
        b
    }

    #[test]
    fn bpf_records() {
        let mut b = framed(&[(1u64 << 32) | 7, 0, 100, 232, 4, 9]);
        b.extend(framed(&[(1u64 << 32) | 7, 1, 200, 232, (-4i64) as u64, 0]));
        b.extend(framed(&[(1u64 << 32) | 7, 2, 300, 0, 12, 5]));
        b.extend([1, 2, 3]);
        let mut out = Vec::new();
        assert_eq!(decode_bpf(&b, &mut out), 3);
        assert_eq!(
            out,
            [
                SysEvent {
                    time_ns: 100,
                    tid: 7,
                    nr: 232,
                    what: Edge::Enter([4, 9])
                },
                SysEvent {
                    time_ns: 200,
                    tid: 7,
                    nr: 232,
                    what: Edge::Exit(-4)
                },
                SysEvent {
                    time_ns: 300,
                    tid: 7,
                    nr: 0,
                    what: Edge::ExitWith(12, [5, 0])
                },
            ]
        );
    }

    #[test]
    fn period_records() {
        use crate::periodprog::{flag, SLOT_SIZE};
        // epoll_wait returned 1 at 1000; read(5) returned 12; sendto(5, …); epoll_wait entry
        // (fd 4) at 1500.
        let mut w = vec![0u64; SLOT_SIZE / 8];
        w[0] = 7 | (((flag::EVENT_LOOP | flag::END) as u64) << 32);
        (w[1], w[2], w[3], w[4]) = (1000, 232, 1, 2);
        (w[5], w[6], w[7], w[8]) = (1500, 232, 4, 0x10);
        (w[9], w[10], w[11]) = (1 << 32, 5, 12);
        (w[12], w[13], w[14]) = (44, 5, 0x7000);
        let mut out = Vec::new();
        assert_eq!(decode_bpf(&framed(&w), &mut out), 1);
        let ev = |time_ns, nr, what| SysEvent {
            time_ns,
            tid: 7,
            nr,
            what,
        };
        assert_eq!(
            out,
            [
                ev(1000, 232, Edge::Exit(1)),
                ev(1000, 0, Edge::ExitWith(12, [5, 0])),
                ev(1000, 44, Edge::Enter([5, 0x7000])),
                ev(1500, 232, Edge::Enter([4, 0x10])),
            ]
        );
        // The record as the program writes it: up to its last kept call; a count beyond what
        // the record holds is clamped to it.
        let mut short = Vec::new();
        assert_eq!(decode_bpf(&framed(&w[..15]), &mut short), 1);
        assert_eq!(short, out);
        w[4] = 5;
        let mut short = Vec::new();
        decode_bpf(&framed(&w[..15]), &mut short);
        assert_eq!(short.len(), 4);
        w[4] = 2;
        // A record cut inside a call, or shorter than the fixed part, ends the decoding.
        assert_eq!(decode_bpf(&framed(&w[..14]), &mut Vec::new()), 0);
        assert_eq!(decode_bpf(&framed(&w[..8]), &mut Vec::new()), 0);
        // A partial record (no end) whose start went out before: only its calls.
        w[0] = 7 | (((flag::START_SENT) as u64) << 32);
        w[4] = 1;
        let mut out = Vec::new();
        decode_bpf(&framed(&w), &mut out);
        assert_eq!(out, [ev(1000, 0, Edge::ExitWith(12, [5, 0]))]);
        // A count past the slot's calls is clamped; a record of another size ends the decoding.
        w[4] = 99;
        let mut out = Vec::new();
        decode_bpf(&framed(&w), &mut out);
        assert_eq!(out.len(), crate::periodprog::EVENTS);
        let mut out = Vec::new();
        assert_eq!(decode_bpf(&framed(&[1, 2, 3]), &mut out), 0);
        for cut in 0..framed(&w).len() {
            decode_bpf(&framed(&w)[..cut], &mut out);
        }
    }

    #[test]
    fn scheduler_records() {
        use crate::schedprog::{flag, READ, WRITE};
        // Thread 7 switched in at 1000 and out at 1500; read and wrote on 127.0.0.1:0x9c40
        // (network order as the socket holds it); three reads and one write counted.
        let addr = u64::from(u32::from_le_bytes([127, 0, 0, 1]));
        let call = |edge: u16| addr | (u64::from(0x9c40u32 << 16 | u32::from(edge)) << 32);
        let w = [
            7 | ((flag::OPEN | flag::END) as u64) << 32,
            1000,
            1500,
            3 | 1 << 32,
            2,
            call(READ),
            call(WRITE),
        ];
        let mut out = Vec::new();
        assert_eq!(decode_sched(&framed(&w), &mut out), 1);
        let conn = addr << 16 | 0x9c40;
        assert_eq!(out.len(), 1);
        let p = out[0];
        assert_eq!(
            (p.tid, p.start_ns, p.end_ns, p.reads, p.writes),
            (7, 1000, 1500, 3, 1)
        );
        assert_eq!(p.calls(), [(conn, false), (conn, true)]);
        // A count beyond the calls the record holds is clamped; a record of another size
        // (44 bytes: half a call) ends the decoding; truncations never panic.
        let mut more = w;
        more[4] = 99;
        out.clear();
        assert_eq!(decode_sched(&framed(&more), &mut out), 1);
        assert_eq!(out[0].calls().len(), 2);
        let mut bad = framed(&w);
        bad[0] = 44;
        assert_eq!(decode_sched(&bad, &mut out), 0);
        let full = framed(&w);
        for cut in 0..full.len() {
            decode_sched(&full[..cut], &mut out);
        }
    }

    #[test]
    fn truncated_and_garbage_never_panic() {
        let ids = Ids { enter: 1, exit: 2 };
        let full = record(1, 7, 100, 0, 5, 0);
        for cut in 0..full.len() {
            let mut out = Vec::new();
            decode(&full[..cut], ids, None, &mut out);
            assert!(out.is_empty());
        }
        let mut out = Vec::new();
        decode(&[9, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3], ids, None, &mut out);
        decode(&[0xff; 64], ids, None, &mut out);
        assert!(out.is_empty());
    }
}
