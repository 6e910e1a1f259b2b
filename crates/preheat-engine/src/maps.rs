//! `/proc/PID/maps`, ELF build-ids and resident pages.
//!
//! The paper records *physical* addresses from the cache tags (§3.1) and preheats them directly
//! (§3.3). We work in user space with virtual addresses, so a working set is stored relative to
//! the process's mappings (`preheat_model::region`): files by path, inode and GNU build-id,
//! anonymous memory by kind and order. This module supplies the raw material: the parsed maps,
//! file identities, and (for the probe) which pages of a range are resident, since probing or
//! flushing a non-resident page would fault it in or crash.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::MetadataExt;

use preheat_model::{FileIdent, Mapping};

use crate::elf::{self, read_at};

/// Parse the text of a maps file (no file identity filled in).
///
/// Lines look like `start-end perms offset dev inode   pathname`; the pathname may be empty,
/// contain spaces, or end in ` (deleted)` (kept verbatim in [`Mapping::name`]). Lines that do
/// not parse are skipped.
pub fn parse_maps(text: &str) -> Vec<Mapping> {
    text.lines().filter_map(parse_line).collect()
}

/// Split off the next space-separated field of `rest`.
fn next_field<'a>(rest: &mut &'a str) -> Option<&'a str> {
    let s = rest.trim_start_matches(' ');
    if s.is_empty() {
        return None;
    }
    let end = s.find(' ').unwrap_or(s.len());
    *rest = &s[end..];
    Some(&s[..end])
}

fn parse_line(line: &str) -> Option<Mapping> {
    let mut rest = line;
    let range = next_field(&mut rest)?;
    let perms = next_field(&mut rest)?.as_bytes();
    let offset = next_field(&mut rest)?;
    let dev = next_field(&mut rest)?;
    let inode = next_field(&mut rest)?;
    let (s, e) = range.split_once('-')?;
    let start = u64::from_str_radix(s, 16).ok()?;
    let end = u64::from_str_radix(e, 16).ok()?;
    if end < start || perms.len() != 4 || !dev.contains(':') {
        return None;
    }
    let flag = |i: usize, c: u8| match perms[i] {
        x if x == c => Some(true),
        b'-' => Some(false),
        _ => None,
    };
    let shared = match perms[3] {
        b's' => true,
        b'p' => false,
        _ => return None,
    };
    let _ = inode.parse::<u64>().ok()?;
    Some(Mapping {
        start,
        end,
        read: flag(0, b'r')?,
        write: flag(1, b'w')?,
        exec: flag(2, b'x')?,
        shared,
        offset: u64::from_str_radix(offset, 16).ok()?,
        name: rest
            .trim_start_matches(' ')
            .trim_end_matches('\r')
            .to_string(),
        file: None,
    })
}

/// The inode column of a maps line (needed by [`read_maps`]; not part of [`Mapping`]).
fn line_inode(line: &str) -> Option<u64> {
    let mut rest = line;
    for _ in 0..4 {
        next_field(&mut rest)?;
    }
    next_field(&mut rest)?.parse().ok()
}

const DELETED: &str = " (deleted)";

/// Read `/proc/<pid>/maps` (or `/proc/self/maps` for `None`) and fill in file identities
/// (inode from the maps line, build-id from the ELF notes; cached per path within the call).
///
/// Only mappings whose name starts with `/` and whose inode is non-zero get a
/// [`FileIdent`]. For a file shown as `path (deleted)` the identity's path is `path` without the
/// suffix (so it still matches profiles recorded before the file was replaced); its build-id is
/// read through `/proc/<pid>/map_files/` when permitted (the file at `path` is another file or
/// none), else left empty so that path and inode decide.
pub fn read_maps(pid: Option<u32>) -> std::io::Result<Vec<Mapping>> {
    let proc = proc_dir(pid);
    let text = std::fs::read_to_string(format!("{proc}/maps"))?;
    let mut out = Vec::new();
    let mut cache: HashMap<(String, u64), Vec<u8>> = HashMap::new();
    for line in text.lines() {
        let Some(mut m) = parse_line(line) else {
            continue;
        };
        let inode = line_inode(line).unwrap_or(0);
        if m.name.starts_with('/') && inode != 0 {
            let (path, deleted) = match m.name.strip_suffix(DELETED) {
                Some(p) => (p.to_string(), true),
                None => (m.name.clone(), false),
            };
            let build_id = cache
                .entry((m.name.clone(), inode))
                .or_insert_with(|| {
                    if deleted {
                        elf_build_id(&format!("{proc}/map_files/{:x}-{:x}", m.start, m.end))
                    } else {
                        elf_build_id(&path)
                    }
                    .unwrap_or_default()
                })
                .clone();
            m.file = Some(FileIdent {
                path,
                inode,
                build_id,
            });
        }
        out.push(m);
    }
    Ok(out)
}

fn proc_dir(pid: Option<u32>) -> String {
    match pid {
        Some(p) => format!("/proc/{p}"),
        None => "/proc/self".to_string(),
    }
}

/// GNU build-id of an ELF file (`.note.gnu.build-id` / PT_NOTE), `None` if absent or not ELF.
///
/// Handles 64-bit little-endian ELF (everything we run on); anything else, any non-regular
/// file, and any malformed or truncated file gives `None`. Reads are bounded; never panics.
pub fn elf_build_id(path: &str) -> Option<Vec<u8>> {
    let meta = std::fs::metadata(path).ok()?;
    if !meta.is_file() {
        return None; // never open devices or FIFOs
    }
    let f = File::open(path).ok()?;
    build_id_of(&f, meta.len())
}

/// A loadable segment of an ELF file: file offsets `[offset, offset + filesz)` and whether it
/// is executable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ElfSegment {
    pub offset: u64,
    pub filesz: u64,
    pub exec: bool,
}

/// The PT_LOAD segments of an ELF file ([`crate::elf::read`]); `None` if it is not one.
pub fn elf_load_segments(path: &str) -> Option<Vec<ElfSegment>> {
    let f = elf::read(std::path::Path::new(path)).ok()?;
    Some(
        f.segments
            .iter()
            .filter(|s| s.kind == elf::PT_LOAD)
            .map(|s| ElfSegment {
                offset: s.offset,
                filesz: s.filesz,
                exec: s.flags & elf::PF_X != 0,
            })
            .collect(),
    )
}

fn build_id_of(f: &File, file_len: u64) -> Option<Vec<u8>> {
    let header = elf::parse_header(&read_at(f, file_len, 0, file_len.min(64))?).ok()?;
    if !header.little_endian {
        return None;
    }
    // Program headers: PT_NOTE segments (present in every linked executable and library).
    let table = header
        .program_table()
        .ok()
        .and_then(|(off, len)| read_at(f, file_len, off, len));
    if let Some(segments) = table.and_then(|t| elf::parse_program_headers(&header, &t).ok()) {
        for s in segments.iter().filter(|s| s.kind == elf::PT_NOTE) {
            if let Some(id) = read_at(f, file_len, s.offset, s.filesz)
                .and_then(|n| find_gnu_build_id(&n, s.align))
            {
                return Some(id);
            }
        }
    }
    // Section headers: SHT_NOTE sections (object files, or stripped program headers).
    elf::section_headers(f, file_len, &header)?
        .iter()
        .filter(|s| s.kind == elf::SHT_NOTE)
        .find_map(|s| {
            read_at(f, file_len, s.offset, s.size).and_then(|n| find_gnu_build_id(&n, s.align))
        })
}

/// The descriptor of the first `NT_GNU_BUILD_ID` note named "GNU" in `data`.
fn find_gnu_build_id(data: &[u8], align: u64) -> Option<Vec<u8>> {
    const NT_GNU_BUILD_ID: u32 = 3;
    elf::notes(data, align)
        .into_iter()
        .find(|n| n.kind == NT_GNU_BUILD_ID && n.name == b"GNU" && !n.desc.is_empty())
        .map(|n| n.desc.to_vec())
}

/// Identity of the executable of `pid` (`/proc/<pid>/exe`).
///
/// The path is the link target (without a ` (deleted)` suffix); inode and build-id are read
/// through `/proc/<pid>/exe` itself, so they describe the running binary even if the file has
/// since been replaced or deleted.
pub fn exe_ident(pid: Option<u32>) -> std::io::Result<FileIdent> {
    let link = format!("{}/exe", proc_dir(pid));
    let target = std::fs::read_link(&link)?;
    let target = target.to_string_lossy();
    let path = target.strip_suffix(DELETED).unwrap_or(&target).to_string();
    let inode = std::fs::metadata(&link)?.ino();
    Ok(FileIdent {
        path,
        inode,
        build_id: elf_build_id(&link).unwrap_or_default(),
    })
}

/// Resident sub-ranges of `[start, start+len)` in this process (mincore), as (start, len).
///
/// Pages are checked with `mincore(2)`; unmapped pages (ENOMEM) count as not resident. The
/// result is sorted, coalesced and clipped to the requested range (its inner boundaries are
/// page-aligned). For file mappings, "resident" means in the page cache. Only meaningful for
/// the calling process's own address space.
///
/// Any range is allowed (fault-proof): mincore only inspects page tables and reports unmapped
/// pages as an error, never touching the memory. The result is a snapshot: a page it lists can
/// be unmapped the next moment by another thread.
pub fn resident_ranges(start: u64, len: u64) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    if len == 0 {
        return out;
    }
    let page = crate::sweep::page_size() as u64;
    let end = start.saturating_add(len);
    let a = start & !(page - 1);
    let b = end
        .checked_add(page - 1)
        .map_or(end & !(page - 1), |x| x & !(page - 1));
    const CHUNK_PAGES: u64 = 1 << 16;
    let mut vec: Vec<u8> = Vec::new();
    let mut p = a;
    while p < b {
        let n = CHUNK_PAGES.min((b - p) / page);
        scan(p, n as usize, page, &mut vec, &mut out);
        p += n * page;
    }
    // Clip to [start, end).
    out.retain_mut(|(s, l)| {
        let e = (*s + *l).min(end);
        *s = (*s).max(start);
        *l = e.saturating_sub(*s);
        *l > 0
    });
    out
}

/// mincore `pages` pages at `addr`; on ENOMEM (part unmapped) bisect down to single pages.
fn scan(addr: u64, pages: usize, page: u64, vec: &mut Vec<u8>, out: &mut Vec<(u64, u64)>) {
    if pages == 0 {
        return;
    }
    vec.clear();
    vec.resize(pages, 0);
    // SAFETY: `addr` is page-aligned; `vec` holds exactly one byte per page of the range, which
    // is all mincore writes. mincore only inspects page tables: an address that is not ours or
    // not mapped gives an error (ENOMEM), never a fault, and no memory of the range is accessed.
    let r = unsafe {
        libc::mincore(
            addr as usize as *mut libc::c_void,
            pages * page as usize,
            vec.as_mut_ptr() as *mut _,
        )
    };
    if r == 0 {
        for (i, &v) in vec.iter().enumerate() {
            if v & 1 != 0 {
                let s = addr + i as u64 * page;
                match out.last_mut() {
                    Some((ls, ll)) if *ls + *ll == s => *ll += page,
                    _ => out.push((s, page)),
                }
            }
        }
    } else if io::Error::last_os_error().raw_os_error() == Some(libc::ENOMEM) && pages > 1 {
        let h = pages / 2;
        scan(addr, h, page, vec, out);
        scan(addr + h as u64 * page, pages - h, page, vec, out);
    }
    // Any other error (or a single unmapped page): not resident.
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_typical_lines() {
        let _shared = crate::test_lock::shared();
        let text = "\
55d4c8a00000-55d4c8a28000 r--p 00000000 08:01 1835055                    /usr/bin/my prog
55d4c8a28000-55d4c8b00000 r-xp 00028000 08:01 1835055                    /usr/bin/my prog
7f1e2c000000-7f1e2c021000 rw-p 00000000 00:00 0 
7f1e2d000000-7f1e2d100000 rw-s 00000000 00:05 4321                       /dev/shm/x (deleted)
7ffd1c9e0000-7ffd1ca01000 rw-p 00000000 00:00 0                          [stack]
garbage line
12-zz r--p 0 0:0 0
ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0                  [vsyscall]
";
        let m = parse_maps(text);
        assert_eq!(m.len(), 6);
        assert_eq!(m[0].name, "/usr/bin/my prog");
        assert_eq!((m[0].start, m[0].end), (0x55d4c8a00000, 0x55d4c8a28000));
        assert!(m[0].read && !m[0].write && !m[0].exec && !m[0].shared);
        assert!(m[1].exec && m[1].offset == 0x28000);
        assert_eq!(m[2].name, "");
        assert!(m[2].write && m[2].file.is_none());
        assert!(m[3].shared);
        assert_eq!(m[3].name, "/dev/shm/x (deleted)");
        assert_eq!(m[4].name, "[stack]");
        assert!(!m[5].read && m[5].exec);
        assert!(m.iter().all(|m| m.file.is_none()));
    }

    #[test]
    fn reads_own_maps_with_build_ids() {
        let _shared = crate::test_lock::shared();
        let maps = read_maps(None).unwrap();
        assert!(!maps.is_empty());
        let exe = exe_ident(None).unwrap();
        let mine = maps
            .iter()
            .filter_map(|m| m.file.as_ref())
            .find(|f| f.path == exe.path)
            .expect("the test binary is mapped");
        assert_eq!(mine.inode, exe.inode);
        assert_eq!(mine.build_id, exe.build_id);
        assert!(
            !exe.build_id.is_empty(),
            "rustc links with --build-id: {exe:?}"
        );
        // Anonymous mappings have no identity.
        assert!(maps
            .iter()
            .filter(|m| m.name.is_empty())
            .all(|m| m.file.is_none()));
    }

    #[test]
    fn build_ids() {
        let _shared = crate::test_lock::shared();
        let me = elf_build_id("/proc/self/exe").expect("test binary has a build-id");
        assert!(me.len() >= 8 && me.len() <= 64);
        for p in ["/bin/true", "/usr/bin/true"] {
            if std::path::Path::new(p).exists() {
                let id = elf_build_id(p).expect("Debian binaries carry a build-id");
                assert_eq!(id.len(), 20);
            }
        }
        assert_eq!(elf_build_id("/nonexistent"), None);
        assert_eq!(elf_build_id("/proc/self"), None); // directory
        assert_eq!(elf_build_id("/dev/null"), None); // device
        let dir = tempfile::tempdir().unwrap();
        let text = dir.path().join("text");
        std::fs::write(
            &text,
            b"#!/bin/sh\necho hello, this is not an ELF file at all\n",
        )
        .unwrap();
        assert_eq!(elf_build_id(text.to_str().unwrap()), None);
        // Truncated copies of a real ELF that end inside the ELF header or the program header
        // table (so neither the PT_NOTE segment nor the section headers are in the file).
        let full = std::fs::read("/proc/self/exe").unwrap();
        for cut in [0usize, 4, 63, 64, 65, 100, 200] {
            let p = dir.path().join(format!("cut{cut}"));
            std::fs::write(&p, &full[..cut.min(full.len())]).unwrap();
            assert_eq!(elf_build_id(p.to_str().unwrap()), None, "cut {cut}");
        }
    }

    #[test]
    fn malformed_elf_never_panics() {
        let _shared = crate::test_lock::shared();
        let full = std::fs::read("/proc/self/exe").unwrap();
        let head = &full[..full.len().min(8192)];
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("bad");
        let mut rng = 0x1234_5678_9abc_def1u64;
        for _ in 0..300 {
            let mut b = head.to_vec();
            for _ in 0..8 {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                let i = 16 + (rng as usize % (b.len().min(1024) - 16));
                b[i] = (rng >> 32) as u8;
            }
            std::fs::write(&p, &b).unwrap();
            let _ = elf_build_id(p.to_str().unwrap());
        }
        // Notes parser on garbage.
        assert_eq!(find_gnu_build_id(&[0xff; 40], 4), None);
        assert_eq!(find_gnu_build_id(&[], 8), None);
        let mut n = Vec::new();
        n.extend_from_slice(&4u32.to_le_bytes());
        n.extend_from_slice(&3u32.to_le_bytes());
        n.extend_from_slice(&3u32.to_le_bytes());
        n.extend_from_slice(b"GNU\0\x01\x02\x03\0");
        assert_eq!(find_gnu_build_id(&n, 4), Some(vec![1, 2, 3]));
        assert_eq!(find_gnu_build_id(&n[..18], 4), None);
    }

    #[test]
    fn resident_pages() {
        let _shared = crate::test_lock::shared();
        let page = crate::sweep::page_size();
        // A low, fixed address far below where the kernel places mappings (top-down), so no
        // other test thread's mmap can land in the hole we punch into it.
        let want = 0x4000_0000usize;
        // SAFETY: MAP_FIXED_NOREPLACE never replaces an existing mapping; checked below.
        let p = unsafe {
            libc::mmap(
                want as *mut libc::c_void,
                8 * page,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED || p as usize != want {
            return preheat_testsupport::skip!("mmap-fixed", "cannot map at {want:#x}");
        }
        let base = p as usize;
        // Touch pages 0, 1 and 5; unmap page 7.
        for i in [0, 1, 5] {
            // SAFETY: inside the mapping, writable.
            unsafe { *((base + i * page) as *mut u8) = 1 };
        }
        // SAFETY: page 7 lies inside our mapping.
        unsafe { libc::munmap((base + 7 * page) as *mut libc::c_void, page) };
        let b = base as u64;
        let pg = page as u64;
        let r = resident_ranges(b, 8 * pg);
        assert_eq!(r, vec![(b, 2 * pg), (b + 5 * pg, pg)]);
        // Unmapped pages before the mapping, too.
        let r = resident_ranges(b - 5 * pg, 13 * pg);
        assert_eq!(r, vec![(b, 2 * pg), (b + 5 * pg, pg)]);
        // Clipping to an unaligned request.
        let r = resident_ranges(b + 100, pg);
        assert_eq!(r, vec![(b + 100, pg)]);
        assert!(resident_ranges(b, 0).is_empty());
        assert!(resident_ranges(b + 7 * pg, pg).is_empty());
        assert!(resident_ranges(0xffff_ffff_ffff_0000, 0x1_0000).is_empty());
        // SAFETY: unmapping the rest of our own mapping.
        unsafe { libc::munmap(p, 7 * page) };
    }

    #[test]
    fn load_segments_of_an_executable() {
        let exe = std::env::current_exe().unwrap();
        let segs = elf_load_segments(exe.to_str().unwrap()).expect("test binary is ELF");
        assert!(segs.iter().any(|s| s.exec && s.filesz > 0));
        assert!(segs.iter().any(|s| !s.exec));
        assert!(elf_load_segments("/proc/self/status").is_none());
    }
}
