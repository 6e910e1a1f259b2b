//! Go programs: whether the Go toolchain built a file, and what its build information says
//! (the Go version, whether cgo was enabled), so a message about a Go program can say what to
//! rebuild it with.
//!
//! Two marks, either enough: the Go build-id note (`.note.go.buildid`, absent from programs
//! built with `-ldflags=-buildid=`, as reproducible builds do), and the build information the
//! linker always writes (`.go.buildinfo`: a 32-byte header starting with [`MAGIC`], then, since
//! Go 1.18, the version and the module information as varint-prefixed strings). It is found as
//! Go's own `debug/buildinfo` finds it: the `.go.buildinfo` section, else the first writable,
//! non-executable load segment (a program without section headers), searched at 16-byte
//! alignment in its first 64 KiB. [`parse_build_info`] works on bytes and never panics.

use std::fs::File;
use std::path::Path;

use preheat_model::varint::Reader;

use super::{read_at, ElfFile, PF_W, PF_X, PT_LOAD, SHT_NOBITS};

/// The first bytes of a Go program's build information.
pub const MAGIC: &[u8; 14] = b"\xff Go buildinf:";
/// Its alignment, and the length of its header.
const ALIGN: usize = 16;
const HEADER_LEN: usize = 32;
/// The most bytes searched for it.
const SEARCH: u64 = 64 << 10;

/// What a Go program's build information says; `None` fields are not recorded there (a Go
/// program older than 1.18, or one known only by its build-id note).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GoBuild {
    /// The toolchain that built it (`go1.22.5`).
    pub version: Option<String>,
    /// Its `CGO_ENABLED` build setting.
    pub cgo_enabled: Option<bool>,
}

impl GoBuild {
    /// "go1.22.5, built with CGO_ENABLED=0": what is known, for a message (empty if nothing).
    pub fn describe(&self) -> String {
        let cgo = self
            .cgo_enabled
            .map(|c| format!("built with CGO_ENABLED={}", u8::from(c)));
        [self.version.clone(), cgo]
            .into_iter()
            .flatten()
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// The build information in `data` (the start of the `.go.buildinfo` section or of the data
/// segment): the first [`MAGIC`] at a 16-byte boundary followed by a whole header; `None` if
/// there is none. The version and settings are filled in from the inline format (Go 1.18 and
/// later); an older program's pointer format leaves them `None`.
pub fn parse_build_info(data: &[u8]) -> Option<GoBuild> {
    let at = (0..data.len())
        .step_by(ALIGN)
        .find(|&i| data.get(i..i + MAGIC.len()) == Some(MAGIC.as_slice()))?;
    let info = data.get(at..)?;
    let flags = *info.get(MAGIC.len() + 1)?;
    let mut r = Reader::new(info);
    r.bytes(HEADER_LEN).ok()?;
    const INLINE_STRINGS: u8 = 2;
    if flags & INLINE_STRINGS == 0 {
        return Some(GoBuild::default());
    }
    let mut string = || -> Option<String> {
        let len = usize::try_from(r.varint().ok()?).ok()?;
        Some(String::from_utf8_lossy(r.bytes(len).ok()?).into_owned())
    };
    let version = string().filter(|v| !v.is_empty());
    let modinfo = string().unwrap_or_default();
    let cgo_enabled =
        modinfo
            .lines()
            .find_map(|l| match l.strip_prefix("build\tCGO_ENABLED=")?.trim() {
                "1" => Some(true),
                "0" => Some(false),
                _ => None,
            });
    Some(GoBuild {
        version,
        cgo_enabled,
    })
}

/// Whether the Go toolchain built `f` (read from `path`), and its build information as far as
/// it is recorded; `None` if it is no Go program.
pub fn build(path: &Path, f: &ElfFile) -> Option<GoBuild> {
    read_build_info(path, f).or_else(|| f.is_go().then(GoBuild::default))
}

fn read_build_info(path: &Path, f: &ElfFile) -> Option<GoBuild> {
    let (offset, size) = match super::section(path, ".go.buildinfo") {
        Some(s) if s.kind != SHT_NOBITS => (s.offset, s.size),
        Some(_) => return None,
        None => f
            .segments
            .iter()
            .find(|s| s.kind == PT_LOAD && s.flags & (PF_X | PF_W) == PF_W)
            .map(|s| (s.offset, s.filesz))?,
    };
    let file = File::open(path).ok()?;
    let len = file.metadata().ok()?.len();
    let want = size.min(SEARCH).min(len.saturating_sub(offset));
    parse_build_info(&read_at(&file, len, offset, want)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Go 1.18+ build information blob, `pad` bytes into its data.
    fn blob(pad: usize, version: &str, modinfo: &str) -> Vec<u8> {
        let mut b = vec![0u8; pad];
        b.extend_from_slice(MAGIC);
        b.push(8); // pointer size
        b.push(2); // inline strings, little-endian
        b.resize(pad + HEADER_LEN, 0);
        for s in [version, modinfo] {
            preheat_model::varint::put_u64(&mut b, s.len() as u64);
            b.extend_from_slice(s.as_bytes());
        }
        b
    }

    #[test]
    fn reads_version_and_cgo_setting() {
        let m = "0w\u{af}\u{c}\u{92}t\u{8}\u{2}A\u{e1}\u{c1}\u{7}\u{e6}\u{d6}\u{18}\u{e6}path\tx\n\
                 build\t-compiler=gc\nbuild\tCGO_ENABLED=0\nbuild\tGOOS=linux\n";
        let g = parse_build_info(&blob(32, "go1.22.5", m)).unwrap();
        assert_eq!(g.version.as_deref(), Some("go1.22.5"));
        assert_eq!(g.cgo_enabled, Some(false));
        assert_eq!(g.describe(), "go1.22.5, built with CGO_ENABLED=0");
        let g = parse_build_info(&blob(0, "go1.21.0", "build\tCGO_ENABLED=1\n")).unwrap();
        assert_eq!(g.cgo_enabled, Some(true));
        // Nothing recorded: known to be Go, nothing more.
        let g = parse_build_info(&blob(0, "", "")).unwrap();
        assert_eq!(g, GoBuild::default());
        assert_eq!(g.describe(), "");
    }

    #[test]
    fn the_magic_counts_only_at_16_byte_boundaries_and_whole() {
        assert!(parse_build_info(&blob(8, "go1.22.5", "")).is_none());
        assert!(parse_build_info(&blob(48, "go1.22.5", "")).is_some());
        let mut b = blob(0, "go1.22.5", "");
        b[15] = 0; // the old pointer format: Go, but nothing read
        assert_eq!(parse_build_info(&b), Some(GoBuild::default()));
        assert!(parse_build_info(&b[..20]).is_none(), "a cut header");
        assert!(parse_build_info(b"").is_none());
    }

    #[test]
    fn garbage_is_none_or_partial_never_a_panic() {
        let good = blob(16, "go1.22.5", "build\tCGO_ENABLED=0\n");
        for n in 0..good.len() {
            let _ = parse_build_info(&good[..n]);
        }
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..2000 {
            let mut b = MAGIC.to_vec();
            for _ in 0..(x % 80) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                b.push(x as u8);
            }
            let _ = parse_build_info(&b);
        }
    }

    #[test]
    fn this_test_binary_is_no_go_program() {
        let me = Path::new("/proc/self/exe");
        assert_eq!(build(me, &super::super::read(me).unwrap()), None);
    }
}
