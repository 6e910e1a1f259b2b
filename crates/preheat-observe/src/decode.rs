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

use crate::periods::{Edge, SysEvent};

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

/// Decode the eBPF observer's records (whole [`crate::bpfprog::RECORD_SIZE`]-byte records, as
/// drained; see [`crate::bpfprog`] for the layout), appending their events to `out`. The
/// program already kept only the observed process; a trailing partial record is ignored.
pub fn decode_bpf(bytes: &[u8], out: &mut Vec<SysEvent>) {
    for rec in bytes.chunks_exact(crate::bpfprog::RECORD_SIZE) {
        let field = |i: usize| u64_at(rec, i * 8).unwrap_or(0);
        let (pid_tgid, edge, time_ns, nr) = (field(0), field(1), field(2), field(3));
        let what = if edge == 0 {
            Edge::Enter([field(4), field(5)])
        } else {
            Edge::Exit(field(4) as i64)
        };
        out.push(SysEvent {
            time_ns,
            tid: pid_tgid as u32,
            nr: nr as i64,
            what,
        });
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

    #[test]
    fn bpf_records() {
        let mut b = Vec::new();
        for v in [(1u64 << 32) | 7, 0, 100, 232, 4, 9] {
            b.extend(v.to_le_bytes());
        }
        for v in [(1u64 << 32) | 7, 1, 200, 232, (-4i64) as u64, 0] {
            b.extend(v.to_le_bytes());
        }
        b.extend([1, 2, 3]);
        let mut out = Vec::new();
        decode_bpf(&b, &mut out);
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
            ]
        );
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
