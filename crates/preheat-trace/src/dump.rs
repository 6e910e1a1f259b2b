//! The phtrace dump format and its incremental parser.

use crate::TraceError;

/// `u32` magic at the start of every record: `0x50485452` ("PHTR" read as a big-endian word;
/// stored little endian like every field).
pub const MAGIC: u32 = 0x5048_5452;
/// The record version this crate reads and phtrace writes.
pub const VERSION: u16 = 1;
/// Record kind: a complete busy period.
pub const KIND_BUSY: u16 = 1;
/// Record kind: a period still open when its thread or the program exited.
pub const KIND_INCOMPLETE: u16 = 2;
/// Bytes in a record header.
pub const HEADER_LEN: usize = 40;

/// Upper bound on lines per record accepted by the parser (2^40 lines = 64 TiB of touched
/// memory); anything larger means the stream is corrupt.
const MAX_LINES: u64 = 1 << 40;

/// One recorded busy period of one thread.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BusyPeriod {
    /// Linux thread id (LWP) of the client thread, as seen in `/proc/PID/task`.
    pub tid: u32,
    /// Global record sequence number (0, 1, 2, … over all threads in write order).
    pub seq: u64,
    /// Guest instructions the thread executed during the period.
    pub instructions: u64,
    /// Distinct line addresses (`addr & !63`) touched, sorted ascending: instruction fetches and
    /// data accesses together.
    pub lines: Vec<u64>,
    /// False for a period cut short by thread or program exit.
    pub complete: bool,
}

fn u16_at(b: &[u8], o: usize) -> u16 {
    u16::from_le_bytes([b[o], b[o + 1]])
}
fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"))
}
fn u64_at(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"))
}

/// Parse as many whole records as `bytes` holds.
///
/// Record layout (little endian, 40-byte header = the natural C layout of the fields):
///
/// | offset | field | |
/// |---|---|---|
/// | 0 | `u32 magic` | [`MAGIC`] |
/// | 4 | `u16 version` | [`VERSION`] |
/// | 6 | `u16 kind` | [`KIND_BUSY`] or [`KIND_INCOMPLETE`] |
/// | 8 | `u32 tid` | Linux thread id |
/// | 12 | `u32 pad` | zero |
/// | 16 | `u64 seq` | |
/// | 24 | `u64 instructions` | |
/// | 32 | `u64 nlines` | |
/// | 40 | `u64 lines[nlines]` | sorted line addresses |
///
/// Returns the records and the number of bytes they occupy; a partially written trailing record
/// is not consumed (parse again once more bytes arrived). Errors on a bad magic, version or kind.
pub fn parse_dump(bytes: &[u8]) -> Result<(Vec<BusyPeriod>, usize), TraceError> {
    let mut out = Vec::new();
    let mut off = 0usize;
    while bytes.len() - off >= HEADER_LEN {
        let h = &bytes[off..];
        let magic = u32_at(h, 0);
        if magic != MAGIC {
            return Err(TraceError::BadMagic {
                offset: off,
                found: magic,
            });
        }
        let version = u16_at(h, 4);
        if version != VERSION {
            return Err(TraceError::BadVersion {
                offset: off,
                found: version,
            });
        }
        let kind = u16_at(h, 6);
        if kind != KIND_BUSY && kind != KIND_INCOMPLETE {
            return Err(TraceError::BadKind {
                offset: off,
                found: kind,
            });
        }
        let nlines = u64_at(h, 32);
        if nlines > MAX_LINES {
            return Err(TraceError::BadLength {
                offset: off,
                nlines,
            });
        }
        let body = nlines as usize * 8;
        if bytes.len() - off - HEADER_LEN < body {
            break; // truncated: wait for the rest
        }
        let lines = h[HEADER_LEN..HEADER_LEN + body]
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
            .collect();
        out.push(BusyPeriod {
            tid: u32_at(h, 8),
            seq: u64_at(h, 16),
            instructions: u64_at(h, 24),
            lines,
            complete: kind == KIND_BUSY,
        });
        off += HEADER_LEN + body;
    }
    Ok((out, off))
}

#[cfg(test)]
pub(crate) fn encode_record(p: &BusyPeriod) -> Vec<u8> {
    let mut v = Vec::with_capacity(HEADER_LEN + 8 * p.lines.len());
    v.extend_from_slice(&MAGIC.to_le_bytes());
    v.extend_from_slice(&VERSION.to_le_bytes());
    let kind = if p.complete {
        KIND_BUSY
    } else {
        KIND_INCOMPLETE
    };
    v.extend_from_slice(&kind.to_le_bytes());
    v.extend_from_slice(&p.tid.to_le_bytes());
    v.extend_from_slice(&0u32.to_le_bytes());
    v.extend_from_slice(&p.seq.to_le_bytes());
    v.extend_from_slice(&p.instructions.to_le_bytes());
    v.extend_from_slice(&(p.lines.len() as u64).to_le_bytes());
    for l in &p.lines {
        v.extend_from_slice(&l.to_le_bytes());
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn period(seq: u64, n: u64, complete: bool) -> BusyPeriod {
        BusyPeriod {
            tid: 4242,
            seq,
            instructions: 1000 + seq,
            lines: (0..n).map(|i| 0x5555_0000_0000 + i * 64).collect(),
            complete,
        }
    }

    #[test]
    fn parses_records_and_magic_bytes_are_little_endian() {
        let a = period(0, 3, true);
        let b = period(1, 0, true);
        let c = period(2, 5, false);
        let mut bytes = encode_record(&a);
        assert_eq!(&bytes[..4], b"RTHP", "0x50485452 little endian");
        bytes.extend(encode_record(&b));
        bytes.extend(encode_record(&c));
        let (got, used) = parse_dump(&bytes).unwrap();
        assert_eq!(used, bytes.len());
        assert_eq!(got, vec![a, b, c]);
        assert!(parse_dump(&[]).unwrap().0.is_empty());
    }

    #[test]
    fn truncated_record_is_kept_for_later_at_every_cut() {
        let a = period(0, 4, true);
        let b = period(1, 7, true);
        let ra = encode_record(&a);
        let mut bytes = ra.clone();
        bytes.extend(encode_record(&b));
        for cut in 0..bytes.len() {
            let (got, used) = parse_dump(&bytes[..cut]).unwrap();
            if cut < ra.len() {
                assert!(got.is_empty(), "cut {cut}");
                assert_eq!(used, 0);
            } else {
                assert_eq!(got, vec![a.clone()], "cut {cut}");
                assert_eq!(used, ra.len());
                // Feeding the remainder plus the rest yields the second record.
                let (rest, used2) = parse_dump(&bytes[used..]).unwrap();
                assert_eq!(rest, vec![b.clone()]);
                assert_eq!(used2, bytes.len() - used);
            }
        }
    }

    #[test]
    fn rejects_bad_magic_version_kind_and_length() {
        let good = encode_record(&period(0, 1, true));
        let mut bad = good.clone();
        bad[0] ^= 1;
        assert!(matches!(
            parse_dump(&bad),
            Err(TraceError::BadMagic { offset: 0, .. })
        ));
        let mut two = good.clone();
        let mut bad_version = good.clone();
        bad_version[4] = 2;
        two.extend(&bad_version);
        let err = parse_dump(&two).unwrap_err();
        assert!(
            matches!(err, TraceError::BadVersion { offset, found: 2 } if offset == good.len()),
            "{err}"
        );
        assert!(err.to_string().contains("version 2"));
        let mut bad_kind = good.clone();
        bad_kind[6] = 9;
        assert!(matches!(
            parse_dump(&bad_kind),
            Err(TraceError::BadKind { found: 9, .. })
        ));
        let mut huge = good.clone();
        huge[32..40].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(matches!(
            parse_dump(&huge),
            Err(TraceError::BadLength { .. })
        ));
    }
}
