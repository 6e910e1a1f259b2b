//! A kernel QEMU starts without a decompression in the guest: the ELF image inside Debian's
//! `vmlinuz` (a bzImage), started at its PVH entry point.
//!
//! A bzImage is a small real-mode setup, a decompressor and the compressed kernel. QEMU boots it
//! through firmware (SeaBIOS and its Linux loader) and the decompressor then unpacks ~60 MB
//! inside the guest — under TCG, emulated instruction by instruction. Debian's kernels are
//! built with `CONFIG_PVH`, so the unpacked ELF carries a Xen `PHYS32_ENTRY` note, and QEMU
//! given such an ELF as `-kernel` jumps straight to that entry. Measured on this machine kind
//! (2 vCPUs, TCG, Debian 6.1 kernel, time from starting QEMU to `/init`'s first line): bzImage
//! 5.2–6.4 s, the PVH ELF 2.0–2.6 s (3 runs each). The image build unpacks it once
//! ([`unpack`]); where it cannot (another compression, no PVH note), the image keeps the bzImage
//! and says so.

use std::io::{Read, Write};
use std::process::{Command, Stdio};

use preheat_engine::elf;

/// The Xen ELF note that names a kernel's 32-bit PVH entry point.
const XEN_ELFNOTE_PHYS32_ENTRY: u32 = 18;

/// Fields of the bzImage setup header (Linux's boot protocol, `Documentation/arch/x86/boot.rst`).
const SETUP_SECTS: usize = 0x1f1;
const HEADER_MAGIC: usize = 0x202;
const PROTOCOL_VERSION: usize = 0x206;
const PAYLOAD_OFFSET: usize = 0x248;
const PAYLOAD_LENGTH: usize = 0x24c;

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// The compressed kernel inside a bzImage: (its bytes, the compression's name).
fn payload(bz: &[u8]) -> Result<(&[u8], &'static str), String> {
    if bz.get(HEADER_MAGIC..HEADER_MAGIC + 4) != Some(b"HdrS") {
        return Err("not a bzImage (no HdrS setup header)".into());
    }
    let version = u16::from_le_bytes([bz[PROTOCOL_VERSION], bz[PROTOCOL_VERSION + 1]]);
    if version < 0x208 {
        return Err(format!(
            "boot protocol {}.{:02} names no payload (2.08 does)",
            version >> 8,
            version & 0xff
        ));
    }
    // The protected-mode code starts after the setup sectors (0 means 4) and the boot sector.
    let sects = match bz.get(SETUP_SECTS).copied().unwrap_or(0) {
        0 => 4,
        n => usize::from(n),
    };
    let (off, len) = (
        u32_at(bz, PAYLOAD_OFFSET).unwrap_or(0) as usize,
        u32_at(bz, PAYLOAD_LENGTH).unwrap_or(0) as usize,
    );
    let start = (sects + 1) * 512 + off;
    let data = bz
        .get(start..start.saturating_add(len))
        .filter(|d| !d.is_empty())
        .ok_or("the setup header's payload lies outside the file")?;
    let kind = match data {
        [0xfd, b'7', b'z', b'X', b'Z', 0, ..] => "xz",
        [0x1f, 0x8b, ..] => "gzip",
        [0x28, 0xb5, 0x2f, 0xfd, ..] => "zstd",
        [0x5d, 0, 0, ..] => "lzma",
        [0x02, 0x21, 0x4c, 0x18, ..] => "lz4",
        _ => "an unknown compression",
    };
    Ok((data, kind))
}

/// The ELF kernel inside the bzImage `bz`, if it is xz- or gzip-compressed (Debian's are xz) and
/// has a PVH entry; else why not.
pub fn unpack(bz: &[u8]) -> Result<Vec<u8>, String> {
    let (data, kind) = payload(bz)?;
    let mut out = Vec::new();
    match kind {
        "xz" => out = unxz(data)?,
        "gzip" => {
            flate2::read::GzDecoder::new(data)
                .read_to_end(&mut out)
                .map_err(|e| format!("unpacking the gzip payload: {e}"))?;
        }
        other => {
            return Err(format!(
                "the kernel is compressed with {other}, which is not unpacked here"
            ))
        }
    }
    if !has_pvh_entry(&out) {
        return Err("the unpacked kernel has no PVH entry (built without CONFIG_PVH)".into());
    }
    Ok(out)
}

/// `data` decompressed by `xz` (xz-utils; the kernel's stream uses the x86 BCJ filter, which
/// the pure-Rust xz decoders lack). Only the first stream: what follows it in a bzImage is not
/// xz.
fn unxz(data: &[u8]) -> Result<Vec<u8>, String> {
    let xz = preheat_engine::host::find_program("xz")
        .ok_or("xz is not installed (Debian package xz-utils)")?;
    let mut child = Command::new(xz)
        .args(["--decompress", "--stdout", "--single-stream"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("starting xz: {e}"))?;
    let mut stdin = child.stdin.take().ok_or("xz's stdin")?;
    let out = std::thread::scope(|s| {
        // Fed from a thread of its own: xz writes while it reads, and both pipes are bounded.
        let feeder = s.spawn(move || stdin.write_all(data));
        let out = child.wait_with_output();
        (feeder.join(), out)
    });
    match out {
        (_, Err(e)) => Err(format!("running xz: {e}")),
        (_, Ok(o)) if !o.status.success() => Err(format!(
            "xz could not unpack the kernel: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        (_, Ok(o)) => Ok(o.stdout),
    }
}

/// Whether the ELF image `b` has a Xen `PHYS32_ENTRY` note (a PVH entry point).
pub fn has_pvh_entry(b: &[u8]) -> bool {
    let Ok(h) = elf::parse_header(b.get(..64).unwrap_or_default()) else {
        return false;
    };
    let Some(phdrs) = h
        .program_table()
        .ok()
        .and_then(|(off, len)| b.get(off as usize..(off + len) as usize))
        .and_then(|t| elf::parse_program_headers(&h, t).ok())
    else {
        return false;
    };
    phdrs
        .iter()
        .filter(|p| p.kind == elf::PT_NOTE)
        .filter_map(|p| {
            b.get(p.offset as usize..(p.offset + p.filesz) as usize)
                .map(|d| (d, p.align))
        })
        .any(|(d, align)| {
            elf::notes(d, align)
                .iter()
                .any(|n| n.name == b"Xen" && n.kind == XEN_ELFNOTE_PHYS32_ENTRY)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A bzImage-shaped file: setup header fields, one setup sector, `payload` after it.
    fn bz(payload: &[u8], version: u16) -> Vec<u8> {
        let mut b = vec![0u8; 2 * 512];
        b[SETUP_SECTS] = 1;
        b[HEADER_MAGIC..HEADER_MAGIC + 4].copy_from_slice(b"HdrS");
        b[PROTOCOL_VERSION..PROTOCOL_VERSION + 2].copy_from_slice(&version.to_le_bytes());
        b[PAYLOAD_OFFSET..PAYLOAD_OFFSET + 4].copy_from_slice(&16u32.to_le_bytes());
        b[PAYLOAD_LENGTH..PAYLOAD_LENGTH + 4]
            .copy_from_slice(&(payload.len() as u32).to_le_bytes());
        b.extend_from_slice(&[0u8; 16]);
        b.extend_from_slice(payload);
        b.extend_from_slice(b"trailer");
        b
    }

    #[test]
    fn payload_is_found_by_the_setup_header() {
        let gz = bz(&[0x1f, 0x8b, 8, 0, 1, 2], 0x20f);
        let (d, kind) = payload(&gz).unwrap();
        assert_eq!((d.len(), kind), (6, "gzip"));
        let (_, kind) = payload(&bz(&[0x28, 0xb5, 0x2f, 0xfd, 9], 0x20f)).unwrap();
        assert_eq!(kind, "zstd");
        assert!(payload(&bz(&[1, 2, 3], 0x207))
            .unwrap_err()
            .contains("2.07"));
        assert!(payload(b"not a kernel at all")
            .unwrap_err()
            .contains("HdrS"));
        let mut short = bz(&[1, 2, 3], 0x20f);
        short.truncate(1000);
        assert!(payload(&short).unwrap_err().contains("outside"));
    }

    #[test]
    fn a_kernel_without_a_pvh_note_is_refused() {
        let mut gz = Vec::new();
        {
            use std::io::Write;
            let mut e = flate2::write::GzEncoder::new(&mut gz, flate2::Compression::fast());
            e.write_all(b"\x7fELF but not really").unwrap();
        }
        assert!(unpack(&bz(&gz, 0x20f))
            .unwrap_err()
            .contains("no PVH entry"));
        assert!(unpack(&bz(&[0x28, 0xb5, 0x2f, 0xfd, 9], 0x20f))
            .unwrap_err()
            .contains("zstd"));
        assert!(!has_pvh_entry(b"short"));
    }
}
