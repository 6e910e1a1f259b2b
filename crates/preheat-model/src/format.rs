//! The `.phws` working-set file format, version 1.
//!
//! ```text
//! offset size  field
//! 0      8     magic  = 89 'P' 'H' 'W' 'S' 0D 0A 1A   (PNG-style: catches text-mode mangling)
//! 8      2     format version, little endian (this crate writes and reads 1)
//! 10     2     flags, must be 0
//! 12     4     body length B, little endian
//! 16     B     body (below)
//! 16+B   4     CRC-32 (IEEE) of bytes 0 .. 16+B, little endian
//! ```
//!
//! Body, all integers LEB128 varints, strings as length + UTF-8:
//! `backend:u8, k, n, gap, created_unix_s, exe ident, region count, regions..., class count,
//! classes...` where an ident is `path, inode, build_id (length + bytes)`, a region is
//! `tag:u8 (0 file, 1 anon)` then an ident or `kind:u8, label, order`, and a class is `port,
//! samples, working set` ([`crate::ws::WorkingSet::encode`]).
//!
//! The decoder never panics and never allocates more than the input can describe: every count is
//! checked against the bytes that remain. Writing atomically is the caller's job (no I/O here).
//! "Never panics" is checked by clippy for this module (no indexing or slicing that could go out
//! of bounds, no unwrap/expect/panic; tests excepted) and by the fuzzer.

#![cfg_attr(
    not(test),
    deny(
        clippy::indexing_slicing,
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::unreachable,
        clippy::todo,
        clippy::unimplemented
    )
)]

use thiserror::Error;

use crate::profile::{Backend, BinaryIdent, FilterParams, Profile, RequestClass};
use crate::region::{AnonKind, FileIdent, RegionKey};
use crate::varint::{self, ReadError, Reader};
use crate::ws::{RegionRuns, Run, WorkingSet};

pub const MAGIC: [u8; 8] = [0x89, b'P', b'H', b'W', b'S', 0x0d, 0x0a, 0x1a];
pub const VERSION: u16 = 1;
const HEADER: usize = 16;

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum FormatError {
    #[error("not a preheat working-set file (bad magic)")]
    BadMagic,
    #[error("unsupported format version {found} (this build reads version {supported})")]
    UnsupportedVersion { found: u16, supported: u16 },
    #[error("unknown flags {0:#06x}")]
    UnknownFlags(u16),
    #[error("file is truncated (at byte {offset})")]
    Truncated { offset: usize },
    #[error("checksum mismatch: stored {stored:#010x}, computed {computed:#010x} (file corrupt)")]
    Checksum { stored: u32, computed: u32 },
    #[error("malformed body at byte {offset}: {what}")]
    Malformed { offset: usize, what: String },
    #[error("{0} unexpected bytes after the checksum")]
    Trailing(usize),
}

fn rd(e: ReadError) -> FormatError {
    match e {
        ReadError::Truncated { offset } => FormatError::Truncated {
            offset: offset + HEADER,
        },
        ReadError::BadVarint { offset } => FormatError::Malformed {
            offset: offset + HEADER,
            what: "bad varint".into(),
        },
    }
}

fn put_str(out: &mut Vec<u8>, s: &[u8]) {
    varint::put_u64(out, s.len() as u64);
    out.extend_from_slice(s);
}

fn put_ident(out: &mut Vec<u8>, f: &FileIdent) {
    put_str(out, f.path.as_bytes());
    varint::put_u64(out, f.inode);
    put_str(out, &f.build_id);
}

fn anon_code(k: AnonKind) -> u8 {
    match k {
        AnonKind::Heap => 0,
        AnonKind::Stack => 1,
        AnonKind::Bss => 2,
        AnonKind::Named => 3,
        AnonKind::Anon => 4,
    }
}

/// Serialize a profile to bytes.
pub fn encode_profile(p: &Profile) -> Vec<u8> {
    let mut body = Vec::new();
    body.push(p.backend.code());
    varint::put_u64(&mut body, p.filter.k as u64);
    varint::put_u64(&mut body, p.filter.n as u64);
    varint::put_u64(&mut body, p.filter.gap as u64);
    varint::put_u64(&mut body, p.created_unix_s);
    put_ident(&mut body, &p.binary.exe);
    varint::put_u64(&mut body, p.regions.len() as u64);
    for r in &p.regions {
        match r {
            RegionKey::File(f) => {
                body.push(0);
                put_ident(&mut body, f);
            }
            RegionKey::Anon { kind, label, order } => {
                body.push(1);
                body.push(anon_code(*kind));
                put_str(&mut body, label.as_bytes());
                varint::put_u64(&mut body, *order as u64);
            }
        }
    }
    varint::put_u64(&mut body, p.classes.len() as u64);
    for c in &p.classes {
        varint::put_u64(&mut body, c.port as u64);
        varint::put_u64(&mut body, c.samples as u64);
        c.ws.encode(&mut body);
    }
    let mut out = Vec::with_capacity(HEADER + body.len() + 4);
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(&body);
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

struct Body<'a> {
    r: Reader<'a>,
}

impl<'a> Body<'a> {
    /// One region key: a file's identity (tag 0) or an anonymous region's kind, label and
    /// order (tag 1).
    fn region_key(&mut self) -> Result<RegionKey, FormatError> {
        let tag = self.r.u8().map_err(rd)?;
        Ok(match tag {
            0 => RegionKey::File(self.ident()?),
            1 => {
                let kc = self.r.u8().map_err(rd)?;
                let kind = match kc {
                    0 => AnonKind::Heap,
                    1 => AnonKind::Stack,
                    2 => AnonKind::Bss,
                    3 => AnonKind::Named,
                    4 => AnonKind::Anon,
                    _ => return Err(self.malformed(format!("anonymous kind {kc}"))),
                };
                let label = self.string("label")?;
                let order = self.v32("order")?;
                RegionKey::Anon { kind, label, order }
            }
            _ => return Err(self.malformed(format!("region tag {tag}"))),
        })
    }

    fn malformed(&self, what: impl Into<String>) -> FormatError {
        FormatError::Malformed {
            offset: self.r.pos() + HEADER,
            what: what.into(),
        }
    }
    fn v(&mut self) -> Result<u64, FormatError> {
        self.r.varint().map_err(rd)
    }
    fn v32(&mut self, what: &str) -> Result<u32, FormatError> {
        let v = self.v()?;
        u32::try_from(v).map_err(|_| self.malformed(format!("{what} {v} out of range")))
    }
    /// A count of items each needing at least `min_bytes` bytes: rejects counts the remaining
    /// input cannot hold, so a corrupt count cannot trigger a huge allocation.
    fn count(&mut self, what: &str, min_bytes: usize) -> Result<usize, FormatError> {
        let n = self.v()?;
        if n > (self.r.remaining() / min_bytes.max(1)) as u64 {
            return Err(self.malformed(format!("{what} count {n} exceeds the file size")));
        }
        Ok(n as usize)
    }
    fn bytes(&mut self, what: &str) -> Result<Vec<u8>, FormatError> {
        let n = self.count(what, 1)?;
        Ok(self.r.bytes(n).map_err(rd)?.to_vec())
    }
    fn string(&mut self, what: &str) -> Result<String, FormatError> {
        let b = self.bytes(what)?;
        String::from_utf8(b).map_err(|_| self.malformed(format!("{what} is not UTF-8")))
    }
    fn ident(&mut self) -> Result<FileIdent, FormatError> {
        Ok(FileIdent {
            path: self.string("path")?,
            inode: self.v()?,
            build_id: self.bytes("build-id")?,
        })
    }
    fn ws(&mut self, nregions: usize) -> Result<WorkingSet, FormatError> {
        let n = self.count("region runs", 2)?;
        let mut regions = Vec::with_capacity(n);
        let mut prev_region: Option<u32> = None;
        for _ in 0..n {
            let region = self.v32("region index")?;
            if region as usize >= nregions {
                return Err(self.malformed(format!("region index {region} >= {nregions}")));
            }
            if prev_region.is_some_and(|p| region <= p) {
                return Err(self.malformed("region runs not sorted by region"));
            }
            prev_region = Some(region);
            let nruns = self.count("runs", 2)?;
            let mut runs = Vec::with_capacity(nruns);
            let mut prev_end = 0u64;
            for i in 0..nruns {
                let delta = self.v()?;
                let len = self.v32("run length")?;
                if len == 0 {
                    return Err(self.malformed("empty run"));
                }
                if i > 0 && delta == 0 {
                    return Err(self.malformed("adjacent runs not merged"));
                }
                let start = prev_end
                    .checked_add(delta)
                    .filter(|s| s.checked_add(len as u64).is_some())
                    .ok_or_else(|| self.malformed("run overflows 64 bits"))?;
                let run = Run { start, len };
                prev_end = run.end();
                runs.push(run);
            }
            regions.push(RegionRuns { region, runs });
        }
        Ok(WorkingSet { regions })
    }
}

/// Parse and verify a `.phws` file.
pub fn decode_profile(buf: &[u8]) -> Result<Profile, FormatError> {
    let body = checked_body(buf)?;
    let mut b = Body {
        r: Reader::new(body),
    };
    let code = b.r.u8().map_err(rd)?;
    let backend = Backend::from_code(code).ok_or_else(|| b.malformed(format!("backend {code}")))?;
    let k = b.v32("k")?;
    let n = b.v32("n")?;
    let gap = b.v32("gap")?;
    if k == 0 || k > n {
        return Err(b.malformed(format!("filter k={k} n={n}")));
    }
    let created_unix_s = b.v()?;
    let exe = b.ident()?;
    let nregions = b.count("regions", 2)?;
    let mut regions = Vec::with_capacity(nregions);
    for _ in 0..nregions {
        regions.push(b.region_key()?);
    }
    let nclasses = b.count("classes", 3)?;
    let mut classes = Vec::with_capacity(nclasses);
    for _ in 0..nclasses {
        let port = b.v()?;
        let port = u16::try_from(port).map_err(|_| b.malformed(format!("port {port}")))?;
        if classes.iter().any(|c: &RequestClass| c.port == port) {
            return Err(b.malformed(format!("port {port} appears twice")));
        }
        let samples = b.v32("samples")?;
        let ws = b.ws(regions.len())?;
        classes.push(RequestClass { port, samples, ws });
    }
    if b.r.remaining() != 0 {
        return Err(b.malformed(format!("{} unread body bytes", b.r.remaining())));
    }
    Ok(Profile {
        binary: BinaryIdent { exe },
        backend,
        filter: FilterParams { k, n, gap },
        created_unix_s,
        regions,
        classes,
    })
}

/// The body of the `.phws` file `buf` once its header (magic, version, flags, length) and its
/// checksum are checked.
fn checked_body(buf: &[u8]) -> Result<&[u8], FormatError> {
    if !buf.starts_with(&MAGIC) {
        return Err(FormatError::BadMagic);
    }
    let mut h = Reader::new(buf);
    h.bytes(8).map_err(rd)?;
    let version = h
        .u16_le()
        .map_err(|_| FormatError::Truncated { offset: 8 })?;
    if version != VERSION {
        return Err(FormatError::UnsupportedVersion {
            found: version,
            supported: VERSION,
        });
    }
    let flags = h
        .u16_le()
        .map_err(|_| FormatError::Truncated { offset: 10 })?;
    if flags != 0 {
        return Err(FormatError::UnknownFlags(flags));
    }
    let body_len = h
        .u32_le()
        .map_err(|_| FormatError::Truncated { offset: 12 })? as usize;
    let total = HEADER
        .checked_add(body_len)
        .and_then(|t| t.checked_add(4))
        .ok_or(FormatError::Truncated { offset: 12 })?;
    if buf.len() < total {
        return Err(FormatError::Truncated { offset: buf.len() });
    }
    if buf.len() > total {
        return Err(FormatError::Trailing(buf.len() - total));
    }
    // `buf.len() == total >= HEADER + 4`, so neither of these fails.
    let (covered, crc) = buf
        .split_last_chunk::<4>()
        .ok_or(FormatError::Truncated { offset: buf.len() })?;
    let stored = u32::from_le_bytes(*crc);
    let computed = crc32fast::hash(covered);
    if stored != computed {
        return Err(FormatError::Checksum { stored, computed });
    }
    covered
        .get(HEADER..)
        .ok_or(FormatError::Truncated { offset: buf.len() })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::addr::RegionLine;
    use crate::ws::LineSet;

    pub(crate) fn sample() -> Profile {
        let lines = LineSet::from_lines(
            [(0u32, 10u64), (0, 11), (0, 12), (1, 3), (1, 900)]
                .into_iter()
                .map(|(region, line)| RegionLine { region, line }),
        );
        Profile {
            binary: BinaryIdent {
                exe: FileIdent {
                    path: "/usr/bin/memcached".into(),
                    inode: 42,
                    build_id: vec![0xab; 20],
                },
            },
            backend: Backend::Probe,
            filter: FilterParams::default(),
            created_unix_s: 1_700_000_000,
            regions: vec![
                RegionKey::File(FileIdent {
                    path: "/usr/bin/memcached".into(),
                    inode: 42,
                    build_id: vec![0xab; 20],
                }),
                RegionKey::Anon {
                    kind: AnonKind::Heap,
                    label: String::new(),
                    order: 0,
                },
            ],
            classes: vec![RequestClass {
                port: 11211,
                samples: 8,
                ws: WorkingSet::from_lines(&lines, 0),
            }],
        }
    }

    #[test]
    fn roundtrip() {
        let p = sample();
        let bytes = encode_profile(&p);
        assert_eq!(decode_profile(&bytes).unwrap(), p);
    }

    #[test]
    fn rejects_bad_input_with_the_right_error() {
        let bytes = encode_profile(&sample());
        assert_eq!(decode_profile(b"hello"), Err(FormatError::BadMagic));
        let mut v2 = bytes.clone();
        v2[8] = 2;
        assert_eq!(
            decode_profile(&v2),
            Err(FormatError::UnsupportedVersion {
                found: 2,
                supported: 1
            })
        );
        assert!(matches!(
            decode_profile(&bytes[..bytes.len() - 3]),
            Err(FormatError::Truncated { .. })
        ));
        let mut flipped = bytes.clone();
        let mid = bytes.len() / 2;
        flipped[mid] ^= 0x40;
        assert!(matches!(
            decode_profile(&flipped),
            Err(FormatError::Checksum { .. })
        ));
        let mut longer = bytes.clone();
        longer.push(0);
        assert_eq!(decode_profile(&longer), Err(FormatError::Trailing(1)));
    }
}
