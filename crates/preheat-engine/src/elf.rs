//! ELF headers: what kind of program a file is — class, byte order, machine, type — and its
//! program headers, among them the interpreter (`PT_INTERP`) that makes it dynamically linked.
//! The one parser of them: the launcher's pre-flight asks whether the agent can be loaded into
//! a program, [`crate::maps`] reads load segments and build-ids through it.
//!
//! [`parse_header`], [`parse_program_headers`] and [`parse_section_headers`] work on bytes and
//! never panic: a truncated or garbage file is an [`ElfError`] naming what is wrong. [`read`]
//! reads a file with bounded reads (never more than [`MAX_READ`] at once); [`section`] finds a
//! section by name. A Go program's build information: [`go`].

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

pub mod go;

/// `p_type` of a loadable segment.
pub const PT_LOAD: u32 = 1;
/// `p_type` of the dynamic section's segment.
pub const PT_DYNAMIC: u32 = 2;
/// `p_type` of the interpreter's path (the dynamic linker).
pub const PT_INTERP: u32 = 3;
/// `p_type` of a notes segment.
pub const PT_NOTE: u32 = 4;
/// `e_type` of a position-dependent executable.
pub const ET_EXEC: u16 = 2;
/// `e_type` of a shared object or position-independent executable.
pub const ET_DYN: u16 = 3;
/// `p_flags` bit of an executable segment.
pub const PF_X: u32 = 1;
/// `p_flags` bit of a writable segment.
pub const PF_W: u32 = 2;
/// `sh_type` of a notes section.
pub const SHT_NOTE: u32 = 7;
/// `sh_type` of a section that takes no room in the file (`.bss`).
pub const SHT_NOBITS: u32 = 8;

/// The most bytes one read of [`read`] takes (headers and interpreter paths are tiny; this only
/// stops a malformed header from making us allocate gigabytes).
pub const MAX_READ: u64 = 1 << 20;

/// 32- or 64-bit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    Elf32,
    Elf64,
}

/// The fields of the ELF file header that say what the file is and where its program headers
/// are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub class: Class,
    pub little_endian: bool,
    /// `e_type` ([`ET_EXEC`], [`ET_DYN`], ...).
    pub kind: u16,
    /// `e_machine` (62: x86-64, 3: i386, 183: AArch64, ...).
    pub machine: u16,
    pub phoff: u64,
    pub phentsize: u16,
    pub phnum: u16,
    /// Where the section header table is (0: none), its entries' size and number, and the
    /// index of the section holding the sections' names.
    pub shoff: u64,
    pub shentsize: u16,
    pub shnum: u16,
    pub shstrndx: u16,
}

/// One program header (segment).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProgramHeader {
    /// `p_type` ([`PT_LOAD`], [`PT_INTERP`], ...).
    pub kind: u32,
    pub flags: u32,
    pub offset: u64,
    pub filesz: u64,
    pub align: u64,
}

/// Why a file is no ELF file we can read.
#[derive(Debug)]
pub enum ElfError {
    /// It does not start with the ELF magic number.
    NotElf,
    /// It ends inside the named part.
    Truncated(&'static str),
    /// A field has a value no valid file has.
    Invalid(String),
    /// It could not be opened or read.
    Io(io::Error),
}

impl std::fmt::Display for ElfError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ElfError::NotElf => write!(f, "not an ELF file (no ELF magic number)"),
            ElfError::Truncated(what) => write!(f, "a truncated ELF file (it ends in its {what})"),
            ElfError::Invalid(what) => write!(f, "a malformed ELF file ({what})"),
            ElfError::Io(e) => write!(f, "cannot be read ({e})"),
        }
    }
}

impl std::error::Error for ElfError {}

/// A common name of an `e_machine` value.
pub fn machine_name(machine: u16) -> String {
    match machine {
        3 => "i386".into(),
        8 => "MIPS".into(),
        20 => "PowerPC".into(),
        21 => "PowerPC64".into(),
        22 => "S/390".into(),
        40 => "ARM".into(),
        62 => "x86-64".into(),
        183 => "AArch64".into(),
        243 => "RISC-V".into(),
        258 => "LoongArch".into(),
        m => format!("machine {m}"),
    }
}

/// Little- or big-endian field reads that return `None` past the end.
#[derive(Clone, Copy)]
struct Fields<'a> {
    b: &'a [u8],
    le: bool,
}

impl Fields<'_> {
    fn bytes<const N: usize>(&self, at: usize) -> Option<[u8; N]> {
        self.b.get(at..at.checked_add(N)?)?.try_into().ok()
    }
    fn u16(&self, at: usize) -> Option<u16> {
        let b = self.bytes(at)?;
        Some(if self.le {
            u16::from_le_bytes(b)
        } else {
            u16::from_be_bytes(b)
        })
    }
    fn u32(&self, at: usize) -> Option<u32> {
        let b = self.bytes(at)?;
        Some(if self.le {
            u32::from_le_bytes(b)
        } else {
            u32::from_be_bytes(b)
        })
    }
    fn u64(&self, at: usize) -> Option<u64> {
        let b = self.bytes(at)?;
        Some(if self.le {
            u64::from_le_bytes(b)
        } else {
            u64::from_be_bytes(b)
        })
    }
    /// An address-sized field: 4 bytes in a 32-bit file, 8 in a 64-bit one.
    fn word(&self, class: Class, at: usize) -> Option<u64> {
        match class {
            Class::Elf32 => self.u32(at).map(u64::from),
            Class::Elf64 => self.u64(at),
        }
    }
}

/// The file header from the first bytes of a file (64 are enough for either class).
pub fn parse_header(b: &[u8]) -> Result<Header, ElfError> {
    if b.get(..4) != Some(b"\x7fELF".as_slice()) {
        return Err(ElfError::NotElf);
    }
    let ident = b.get(..16).ok_or(ElfError::Truncated("identification"))?;
    let class = match ident[4] {
        1 => Class::Elf32,
        2 => Class::Elf64,
        c => return Err(ElfError::Invalid(format!("class byte {c}"))),
    };
    let le = match ident[5] {
        1 => true,
        2 => false,
        d => return Err(ElfError::Invalid(format!("byte-order byte {d}"))),
    };
    let f = Fields { b, le };
    let t = || ElfError::Truncated("file header");
    let (phoff, shoff, ph) = match class {
        Class::Elf32 => (28, 32, 42),
        Class::Elf64 => (32, 40, 54),
    };
    Ok(Header {
        class,
        little_endian: le,
        kind: f.u16(16).ok_or_else(t)?,
        machine: f.u16(18).ok_or_else(t)?,
        phoff: f.word(class, phoff).ok_or_else(t)?,
        phentsize: f.u16(ph).ok_or_else(t)?,
        phnum: f.u16(ph + 2).ok_or_else(t)?,
        shoff: f.word(class, shoff).ok_or_else(t)?,
        shentsize: f.u16(ph + 4).ok_or_else(t)?,
        shnum: f.u16(ph + 6).ok_or_else(t)?,
        shstrndx: f.u16(ph + 8).ok_or_else(t)?,
    })
}

impl Header {
    /// The smallest program header entry of this class.
    fn min_phentsize(&self) -> u16 {
        match self.class {
            Class::Elf32 => 32,
            Class::Elf64 => 56,
        }
    }

    /// Where the program header table is: file offset and length in bytes. The kernel refuses
    /// a table over 64 KiB or without entries; so does this.
    pub fn program_table(&self) -> Result<(u64, u64), ElfError> {
        if self.phnum == 0 || self.phoff == 0 {
            return Err(ElfError::Invalid("no program headers".into()));
        }
        if self.phentsize < self.min_phentsize() {
            return Err(ElfError::Invalid(format!(
                "program header entries of {} bytes",
                self.phentsize
            )));
        }
        let len = u64::from(self.phentsize) * u64::from(self.phnum);
        if len > 65536 {
            return Err(ElfError::Invalid(format!(
                "{} program headers (the kernel takes at most 64 KiB of them)",
                self.phnum
            )));
        }
        Ok((self.phoff, len))
    }
}

/// The `count` entries of `size` bytes each of a header table (`len` bytes of `table`, named
/// `what` in errors), each read by `entry` from the fields at its offset.
fn entries<T>(
    h: &Header,
    table: &[u8],
    (len, count, size): (u64, u16, u16),
    what: &'static str,
    entry: impl Fn(Fields<'_>, usize) -> Option<T>,
) -> Result<Vec<T>, ElfError> {
    if (table.len() as u64) < len {
        return Err(ElfError::Truncated(what));
    }
    let f = Fields {
        b: table,
        le: h.little_endian,
    };
    (0..usize::from(count))
        .map(|i| entry(f, i * usize::from(size)).ok_or(ElfError::Truncated(what)))
        .collect()
}

/// The program headers from the bytes of their table (as [`Header::program_table`] locates it).
pub fn parse_program_headers(h: &Header, table: &[u8]) -> Result<Vec<ProgramHeader>, ElfError> {
    let (_, len) = h.program_table()?;
    let shape = (len, h.phnum, h.phentsize);
    entries(h, table, shape, "program headers", |f, e| {
        Some(match h.class {
            Class::Elf32 => ProgramHeader {
                kind: f.u32(e)?,
                offset: f.u32(e + 4)?.into(),
                filesz: f.u32(e + 16)?.into(),
                flags: f.u32(e + 24)?,
                align: f.u32(e + 28)?.into(),
            },
            Class::Elf64 => ProgramHeader {
                kind: f.u32(e)?,
                flags: f.u32(e + 4)?,
                offset: f.u64(e + 8)?,
                filesz: f.u64(e + 32)?,
                align: f.u64(e + 48)?,
            },
        })
    })
}

/// One section header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SectionHeader {
    /// Offset of its name in the section-name table.
    pub name: u32,
    /// `sh_type` ([`SHT_NOTE`], [`SHT_NOBITS`], ...).
    pub kind: u32,
    pub offset: u64,
    pub size: u64,
    pub align: u64,
}

impl Header {
    /// Where the section header table is: file offset and length in bytes; `None` if there is
    /// none we read (no table, extended numbering, entries too small, over [`MAX_READ`]).
    pub fn section_table(&self) -> Option<(u64, u64)> {
        let min = match self.class {
            Class::Elf32 => 40,
            Class::Elf64 => 64,
        };
        if self.shoff == 0 || self.shnum == 0 || self.shentsize < min {
            return None;
        }
        let len = u64::from(self.shentsize) * u64::from(self.shnum);
        (len <= MAX_READ).then_some((self.shoff, len))
    }
}

/// The section headers from the bytes of their table (as [`Header::section_table`] locates it).
pub fn parse_section_headers(h: &Header, table: &[u8]) -> Result<Vec<SectionHeader>, ElfError> {
    let Some((_, len)) = h.section_table() else {
        return Ok(Vec::new());
    };
    let (off, size, align) = match h.class {
        Class::Elf32 => (16, 20, 32),
        Class::Elf64 => (24, 32, 48),
    };
    let shape = (len, h.shnum, h.shentsize);
    entries(h, table, shape, "section headers", |f, e| {
        Some(SectionHeader {
            name: f.u32(e)?,
            kind: f.u32(e + 4)?,
            offset: f.word(h.class, e + off)?,
            size: f.word(h.class, e + size)?,
            align: f.word(h.class, e + align)?,
        })
    })
}

/// The section headers of the open ELF file `f` (of length `len`) with header `h`; `None` if
/// it has no table we read.
pub(crate) fn section_headers(f: &File, len: u64, h: &Header) -> Option<Vec<SectionHeader>> {
    let (off, size) = h.section_table()?;
    let table = read_at(f, len, off, size)?;
    parse_section_headers(h, &table).ok()
}

/// The section named `name` of the ELF file at `path` (by the section-name table); `None` if
/// it has none, no section headers, or is no ELF file we read.
pub fn section(path: &Path, name: &str) -> Option<SectionHeader> {
    let f = File::open(path).ok()?;
    let len = f.metadata().ok()?.len();
    let h = parse_header(&read_at(&f, len, 0, len.min(64))?).ok()?;
    let sections = section_headers(&f, len, &h)?;
    let names = sections.get(usize::from(h.shstrndx))?;
    let names = read_at(&f, len, names.offset, names.size)?;
    sections.into_iter().find(|s| {
        usize::try_from(s.name)
            .ok()
            .and_then(|at| names.get(at..))
            .and_then(|n| n.split(|c| *c == 0).next())
            == Some(name.as_bytes())
    })
}

/// One note of a notes segment or section.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Note<'a> {
    /// The owner's name without its terminating NULs ("GNU", "Go", ...).
    pub name: &'a [u8],
    pub kind: u32,
    pub desc: &'a [u8],
}

/// The notes in `data` (little-endian; aligned to 8 if the segment or section says so, else 4),
/// up to the first malformed one.
pub fn notes(data: &[u8], align: u64) -> Vec<Note<'_>> {
    let align = if align == 8 { 8 } else { 4 };
    let up = |x: usize| x.checked_add(align - 1).map(|v| v & !(align - 1));
    let f = Fields { b: data, le: true };
    let mut out = Vec::new();
    let mut pos = 0usize;
    let mut next = || -> Option<()> {
        let namesz = usize::try_from(f.u32(pos)?).ok()?;
        let descsz = usize::try_from(f.u32(pos.checked_add(4)?)?).ok()?;
        let kind = f.u32(pos.checked_add(8)?)?;
        let name_start = pos.checked_add(12)?;
        let name_end = name_start.checked_add(namesz)?;
        let desc_start = up(name_end)?;
        let desc_end = desc_start.checked_add(descsz)?;
        let name = data.get(name_start..name_end)?;
        // The size counts the terminating NUL, and the Go linker pads its "Go" to 4 bytes.
        let name_len = name.iter().rposition(|c| *c != 0).map_or(0, |i| i + 1);
        out.push(Note {
            name: name.get(..name_len).unwrap_or(name),
            kind,
            desc: data.get(desc_start..desc_end)?,
        });
        let after = up(desc_end)?;
        (after > pos).then(|| pos = after)
    };
    while next().is_some() {}
    out
}

/// An ELF file's header, program headers, interpreter and notes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ElfFile {
    pub header: Header,
    pub segments: Vec<ProgramHeader>,
    /// The dynamic linker named by `PT_INTERP`; `None` in a statically linked program (and in a
    /// shared library).
    pub interp: Option<String>,
    /// The owner and type of each note in its notes segments (`("GNU", 3)`: a build-id;
    /// `("Go", 4)`: a Go build id).
    pub notes: Vec<(String, u32)>,
}

impl ElfFile {
    /// Whether the Go toolchain built it (it carries a Go build-id note).
    pub fn is_go(&self) -> bool {
        self.notes
            .iter()
            .any(|(owner, kind)| owner == "Go" && *kind == 4)
    }

    /// Whether it has a dynamic section (a static-pie program has one but no interpreter).
    pub fn has_dynamic(&self) -> bool {
        self.segments.iter().any(|s| s.kind == PT_DYNAMIC)
    }
}

/// `len` bytes at `off` of `f` (of length `file_len`); `None` past its end or over [`MAX_READ`].
pub(crate) fn read_at(f: &File, file_len: u64, off: u64, len: u64) -> Option<Vec<u8>> {
    if len > MAX_READ || off.checked_add(len)? > file_len {
        return None;
    }
    let mut buf = vec![0u8; usize::try_from(len).ok()?];
    f.read_exact_at(&mut buf, off).ok()?;
    Some(buf)
}

/// Read the headers and interpreter of the ELF file at `path`. Only regular files are opened
/// (never a device or FIFO).
pub fn read(path: &Path) -> Result<ElfFile, ElfError> {
    let meta = std::fs::metadata(path).map_err(ElfError::Io)?;
    if !meta.is_file() {
        return Err(ElfError::Invalid("not a regular file".into()));
    }
    let f = File::open(path).map_err(ElfError::Io)?;
    let len = meta.len();
    let head = read_at(&f, len, 0, len.min(64)).ok_or(ElfError::Truncated("file header"))?;
    let header = parse_header(&head)?;
    let (off, size) = header.program_table()?;
    let table = read_at(&f, len, off, size).ok_or(ElfError::Truncated("program headers"))?;
    let segments = parse_program_headers(&header, &table)?;
    let interp = match segments.iter().find(|s| s.kind == PT_INTERP) {
        None => None,
        Some(s) if s.filesz > 4096 => {
            return Err(ElfError::Invalid(format!(
                "an interpreter path of {} bytes",
                s.filesz
            )))
        }
        Some(s) => {
            let b =
                read_at(&f, len, s.offset, s.filesz).ok_or(ElfError::Truncated("interpreter"))?;
            let end = b.iter().position(|c| *c == 0).unwrap_or(b.len());
            Some(String::from_utf8_lossy(&b[..end]).into_owned())
        }
    };
    let notes = segments
        .iter()
        .filter(|s| s.kind == PT_NOTE && header.little_endian)
        .filter_map(|s| read_at(&f, len, s.offset, s.filesz).map(|b| (b, s.align)))
        .flat_map(|(b, align)| {
            notes(&b, align)
                .iter()
                .map(|n| (String::from_utf8_lossy(n.name).into_owned(), n.kind))
                .collect::<Vec<_>>()
        })
        .collect();
    Ok(ElfFile {
        header,
        segments,
        interp,
        notes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 64-bit little-endian x86-64 header of type `kind` with program headers `phdrs`
    /// (kind, offset, filesz) right after it, then `tail`.
    fn elf64(kind: u16, phdrs: &[(u32, u64, u64)], tail: &[u8]) -> Vec<u8> {
        let mut b = vec![0u8; 64];
        b[..4].copy_from_slice(b"\x7fELF");
        b[4] = 2;
        b[5] = 1;
        b[6] = 1;
        b[16..18].copy_from_slice(&kind.to_le_bytes());
        b[18..20].copy_from_slice(&62u16.to_le_bytes());
        b[32..40].copy_from_slice(&64u64.to_le_bytes());
        b[54..56].copy_from_slice(&56u16.to_le_bytes());
        b[56..58].copy_from_slice(&(phdrs.len() as u16).to_le_bytes());
        for (k, off, size) in phdrs {
            let mut e = vec![0u8; 56];
            e[..4].copy_from_slice(&k.to_le_bytes());
            e[4..8].copy_from_slice(&PF_X.to_le_bytes());
            e[8..16].copy_from_slice(&off.to_le_bytes());
            e[32..40].copy_from_slice(&size.to_le_bytes());
            e[48..56].copy_from_slice(&8u64.to_le_bytes());
            b.extend(e);
        }
        b.extend_from_slice(tail);
        b
    }

    /// A 32-bit big-endian header (MIPS) with one PT_LOAD entry.
    fn elf32_be() -> Vec<u8> {
        let mut b = vec![0u8; 52];
        b[..4].copy_from_slice(b"\x7fELF");
        b[4] = 1;
        b[5] = 2;
        b[16..18].copy_from_slice(&ET_EXEC.to_be_bytes());
        b[18..20].copy_from_slice(&8u16.to_be_bytes());
        b[28..32].copy_from_slice(&52u32.to_be_bytes());
        b[42..44].copy_from_slice(&32u16.to_be_bytes());
        b[44..46].copy_from_slice(&1u16.to_be_bytes());
        let mut e = vec![0u8; 32];
        e[..4].copy_from_slice(&PT_LOAD.to_be_bytes());
        e[4..8].copy_from_slice(&0x1000u32.to_be_bytes());
        e[16..20].copy_from_slice(&0x2000u32.to_be_bytes());
        b.extend(e);
        b
    }

    fn file(bytes: &[u8]) -> tempfile::NamedTempFile {
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(f.path(), bytes).unwrap();
        f
    }

    #[test]
    fn reads_interpreter_and_segments_of_a_crafted_file() {
        let interp = b"/lib64/ld-linux-x86-64.so.2\0";
        let at = 64 + 2 * 56;
        let b = elf64(
            ET_DYN,
            &[(PT_INTERP, at, interp.len() as u64), (PT_DYNAMIC, 0, 0)],
            interp,
        );
        let f = read(file(&b).path()).unwrap();
        assert_eq!(f.header.class, Class::Elf64);
        assert_eq!(machine_name(f.header.machine), "x86-64");
        assert_eq!(f.interp.as_deref(), Some("/lib64/ld-linux-x86-64.so.2"));
        assert!(f.has_dynamic());
        assert_eq!(f.segments[0].align, 8);
    }

    #[test]
    fn notes_are_read_up_to_the_first_malformed_one() {
        // As the Go linker writes it: the name's size 4, "Go" padded with two NULs.
        let mut go = Vec::new();
        go.extend(4u32.to_le_bytes());
        go.extend(2u32.to_le_bytes());
        go.extend(4u32.to_le_bytes());
        go.extend(b"Go\0\0ab\0\0");
        let mut two = go.clone();
        two.extend(&go[..14]); // a second note cut short
        let n = notes(&two, 4);
        assert_eq!(n.len(), 1);
        assert_eq!(
            (n[0].name, n[0].kind, n[0].desc),
            (&b"Go"[..], 4, &b"ab"[..])
        );
        let at = 64 + 56;
        let b = elf64(ET_EXEC, &[(PT_NOTE, at, go.len() as u64)], &go);
        assert!(read(file(&b).path()).unwrap().is_go());
        assert!(!read(Path::new("/proc/self/exe")).unwrap().is_go());
        assert!(notes(&[0xff; 11], 4).is_empty());
        let huge = [0xffu8; 12];
        assert!(notes(&huge, 8).is_empty());
    }

    #[test]
    fn sections_by_name_in_a_crafted_file_and_this_binary() {
        // Two sections after the header: the names, then ".go.buildinfo" (both 32 bytes).
        let names = b"\0.shstrtab\0.go.buildinfo\0\0\0\0\0\0\0";
        let data_at = 64 + 56;
        let mut b = elf64(ET_EXEC, &[(PT_LOAD, 0, 64)], names);
        b.extend([7u8; 32]);
        let shoff = b.len() as u64;
        for (name, kind, off) in [(0u32, 0u32, 0u64), (1, 3, data_at), (11, 1, data_at + 32)] {
            let mut e = vec![0u8; 64];
            e[..4].copy_from_slice(&name.to_le_bytes());
            e[4..8].copy_from_slice(&kind.to_le_bytes());
            e[24..32].copy_from_slice(&off.to_le_bytes());
            e[32..40].copy_from_slice(&32u64.to_le_bytes());
            b.extend(e);
        }
        b[40..48].copy_from_slice(&shoff.to_le_bytes());
        b[58..60].copy_from_slice(&64u16.to_le_bytes());
        b[60..62].copy_from_slice(&3u16.to_le_bytes());
        b[62..64].copy_from_slice(&1u16.to_le_bytes());
        let f = file(&b);
        let s = section(f.path(), ".go.buildinfo").unwrap();
        assert_eq!((s.offset, s.size, s.kind), (data_at + 32, 32, 1));
        assert_eq!(section(f.path(), ".shstrtab").unwrap().kind, 3);
        assert_eq!(section(f.path(), ".go"), None, "whole names only");
        // A table cut short is no table; so are entries too small for their class.
        assert_eq!(section(file(&b[..b.len() - 1]).path(), ".shstrtab"), None);
        b[58..60].copy_from_slice(&32u16.to_le_bytes());
        assert_eq!(section(file(&b).path(), ".shstrtab"), None);
        let me = Path::new("/proc/self/exe");
        assert!(section(me, ".text").is_some_and(|s| s.size > 0));
        assert_eq!(section(me, ".go.buildinfo"), None);
        assert_eq!(section(Path::new("/dev/null"), ".text"), None);
    }

    #[test]
    fn a_file_without_interpreter_is_static() {
        let b = elf64(ET_EXEC, &[(PT_LOAD, 0, 64)], &[]);
        let f = read(file(&b).path()).unwrap();
        assert_eq!(f.interp, None);
        assert!(!f.has_dynamic());
        assert_eq!(f.segments[0].flags, PF_X);
    }

    #[test]
    fn reads_32_bit_big_endian_headers() {
        let b = elf32_be();
        let h = parse_header(&b).unwrap();
        assert_eq!((h.class, h.little_endian), (Class::Elf32, false));
        assert_eq!(machine_name(h.machine), "MIPS");
        let p = parse_program_headers(&h, &b[52..]).unwrap();
        assert_eq!(p[0].kind, PT_LOAD);
        assert_eq!((p[0].offset, p[0].filesz), (0x1000, 0x2000));
    }

    #[test]
    fn garbage_and_truncation_are_errors_not_panics() {
        assert!(matches!(parse_header(b""), Err(ElfError::NotElf)));
        assert!(matches!(
            parse_header(b"#!/bin/sh\n"),
            Err(ElfError::NotElf)
        ));
        assert!(matches!(
            parse_header(b"\x7fELF\x02\x01"),
            Err(ElfError::Truncated("identification"))
        ));
        let good = elf64(ET_EXEC, &[(PT_LOAD, 0, 64)], &[]);
        // Every prefix of a valid file is an error naming where it ends, never a panic.
        for n in 0..good.len() {
            let e = read(file(&good[..n]).path()).unwrap_err();
            assert!(
                matches!(e, ElfError::NotElf | ElfError::Truncated(_)),
                "{n} bytes: {e}"
            );
        }
        let mut bad = good.clone();
        bad[4] = 9;
        assert!(matches!(parse_header(&bad), Err(ElfError::Invalid(_))));
        bad = good.clone();
        bad[5] = 0;
        assert!(matches!(parse_header(&bad), Err(ElfError::Invalid(_))));
        // Entries too small, far too many, or a table past the end of the file.
        for (at, v) in [(54usize, 8u16), (56, 0xffff), (56, 0)] {
            bad = good.clone();
            bad[at..at + 2].copy_from_slice(&v.to_le_bytes());
            assert!(matches!(read(file(&bad).path()), Err(ElfError::Invalid(_))));
        }
        bad = good.clone();
        bad[32..40].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(matches!(
            read(file(&bad).path()),
            Err(ElfError::Truncated("program headers"))
        ));
        // An interpreter segment past the end, or absurdly long.
        for size in [1000u64, 1 << 40] {
            let b = elf64(ET_EXEC, &[(PT_INTERP, 64 + 56, size)], b"/x\0");
            let e = read(file(&b).path()).unwrap_err();
            assert!(
                matches!(e, ElfError::Truncated(_) | ElfError::Invalid(_)),
                "{e}"
            );
        }
        // Random bytes after the magic number.
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..2000 {
            let mut b = b"\x7fELF".to_vec();
            for _ in 0..(x % 200) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                b.push(x as u8);
            }
            if let Ok(h) = parse_header(&b) {
                let _ = parse_program_headers(&h, b.get(64..).unwrap_or_default());
            }
        }
    }

    #[test]
    fn reads_this_test_binary_and_refuses_what_is_no_file() {
        let me = read(Path::new("/proc/self/exe")).unwrap();
        assert!(me.segments.iter().any(|s| s.kind == PT_LOAD));
        assert!(me.interp.is_some(), "the test binary is dynamically linked");
        assert!(matches!(
            read(Path::new("/nonexistent")),
            Err(ElfError::Io(_))
        ));
        assert!(matches!(
            read(Path::new("/dev/null")),
            Err(ElfError::Invalid(_))
        ));
    }
}
