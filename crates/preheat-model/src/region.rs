//! Memory regions a working set is relative to.
//!
//! The paper records physical addresses from the L2 tag RAM; we record virtual addresses in user
//! space, so to survive ASLR and server restarts every line is stored relative to a *region*:
//!
//! * file-backed mappings are identified by path, inode and (when the file is an ELF object with a
//!   `.note.gnu.build-id`) build-id; the line index is the **file offset** / 64, so several
//!   mappings of one file (text, rodata, data) share one region;
//! * anonymous mappings by kind ([`AnonKind`]), a label and their order among mappings of the
//!   same kind and label in address order; the line index is the offset from the mapping start.
//!
//! A [`Mapping`] is the pure-data form of one `/proc/PID/maps` line plus the file identity the
//! engine looked up; parsing `/proc` lives in the engine crate.

use serde::{Deserialize, Serialize};

use crate::addr::{RegionLine, VirtAddr, LINE_SIZE};

/// Identity of a mapped file.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct FileIdent {
    pub path: String,
    pub inode: u64,
    /// GNU build-id of an ELF file, empty if the file has none (or is not ELF).
    pub build_id: Vec<u8>,
}

impl FileIdent {
    /// Whether `other` is the same build of the same file. With build-ids on both sides they
    /// decide; otherwise path and inode must match.
    pub fn same_build(&self, other: &FileIdent) -> bool {
        if !self.build_id.is_empty() && !other.build_id.is_empty() {
            return self.build_id == other.build_id;
        }
        self.path == other.path && self.inode == other.inode
    }
}

/// Kinds of anonymous regions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum AnonKind {
    /// `[heap]`: the brk heap.
    Heap,
    /// `[stack]`: the main thread's stack.
    Stack,
    /// An anonymous mapping directly following a mapping of a file (its `.bss`); label = path.
    Bss,
    /// A named anonymous mapping (`[anon:NAME]`); label = NAME.
    Named,
    /// Any other anonymous mapping (thread stacks, malloc arenas, mmap'd buffers).
    Anon,
}

/// What a region is, independent of where it is mapped.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum RegionKey {
    File(FileIdent),
    Anon {
        kind: AnonKind,
        label: String,
        order: u32,
    },
}

impl RegionKey {
    /// A short human-readable name.
    pub fn describe(&self) -> String {
        match self {
            RegionKey::File(f) => f.path.clone(),
            RegionKey::Anon { kind, label, order } => {
                if label.is_empty() {
                    format!("[{kind:?}#{order}]").to_lowercase()
                } else {
                    format!("[{kind:?} {label}#{order}]").to_lowercase()
                }
            }
        }
    }
}

/// One line of `/proc/PID/maps`, with the identity of its file when it has one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    pub read: bool,
    pub write: bool,
    pub exec: bool,
    pub shared: bool,
    /// File offset of `start` (0 for anonymous mappings).
    pub offset: u64,
    /// The pathname column as printed by the kernel (may be `[heap]`, `[stack]`, `[vdso]`,
    /// `[anon:name]`, a path, a path with ` (deleted)`, or empty).
    pub name: String,
    /// Identity of the backing file, `None` for anonymous and special mappings.
    pub file: Option<FileIdent>,
}

impl Mapping {
    pub fn len(&self) -> u64 {
        self.end - self.start
    }
    pub fn is_empty(&self) -> bool {
        self.end <= self.start
    }
    pub fn contains(&self, a: VirtAddr) -> bool {
        a.0 >= self.start && a.0 < self.end
    }
    /// Mappings preheat never records or touches: kernel-provided pages and guard pages.
    pub fn is_special(&self) -> bool {
        matches!(
            self.name.as_str(),
            "[vdso]" | "[vvar]" | "[vsyscall]" | "[vvar_vclock]" | "[uprobes]"
        ) || !self.read
    }
}

/// A snapshot of a process's mappings with a region assigned to each usable mapping.
///
/// `regions` is the list of distinct [`RegionKey`]s; `mapping_region[i]` is the index into
/// `regions` of `mappings[i]` (or `None` for special mappings).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegionTable {
    pub mappings: Vec<Mapping>,
    pub regions: Vec<RegionKey>,
    pub mapping_region: Vec<Option<u32>>,
}

impl RegionTable {
    /// Assign regions to `mappings` (which must be sorted by start address, as `/proc` prints
    /// them).
    pub fn build(mut mappings: Vec<Mapping>) -> RegionTable {
        mappings.sort_by_key(|m| m.start);
        let mut regions: Vec<RegionKey> = Vec::new();
        let mut mapping_region = Vec::with_capacity(mappings.len());
        let mut anon_counts: std::collections::BTreeMap<(AnonKind, String), u32> =
            Default::default();
        let mut prev_file: Option<(String, u64)> = None; // (path, end) of the previous file mapping
        for m in &mappings {
            if m.is_special() {
                mapping_region.push(None);
                continue;
            }
            let key = if let Some(f) = &m.file {
                prev_file = Some((f.path.clone(), m.end));
                RegionKey::File(f.clone())
            } else {
                let (kind, label) = match m.name.as_str() {
                    "[heap]" => (AnonKind::Heap, String::new()),
                    "[stack]" => (AnonKind::Stack, String::new()),
                    n if n.starts_with("[anon:") => (
                        AnonKind::Named,
                        n.trim_start_matches("[anon:")
                            .trim_end_matches(']')
                            .to_string(),
                    ),
                    _ => match &prev_file {
                        Some((path, end)) if *end == m.start => (AnonKind::Bss, path.clone()),
                        _ => (AnonKind::Anon, String::new()),
                    },
                };
                let counter = anon_counts.entry((kind, label.clone())).or_insert(0);
                let order = *counter;
                *counter += 1;
                if m.file.is_none() && kind != AnonKind::Bss {
                    prev_file = None;
                }
                RegionKey::Anon { kind, label, order }
            };
            let idx = match regions.iter().position(|r| *r == key) {
                Some(i) => i,
                None => {
                    regions.push(key);
                    regions.len() - 1
                }
            };
            mapping_region.push(Some(idx as u32));
        }
        RegionTable {
            mappings,
            regions,
            mapping_region,
        }
    }

    /// Index of the mapping containing `a`.
    pub fn mapping_of(&self, a: VirtAddr) -> Option<usize> {
        let i = self.mappings.partition_point(|m| m.end <= a.0);
        (i < self.mappings.len() && self.mappings[i].contains(a)).then_some(i)
    }

    /// Translate an absolute address into a region-relative line, `None` if the address lies in
    /// no usable mapping.
    pub fn to_relative(&self, a: VirtAddr) -> Option<RegionLine> {
        let i = self.mapping_of(a)?;
        let region = self.mapping_region[i]?;
        let m = &self.mappings[i];
        let rel = a.0 - m.start + if m.file.is_some() { m.offset } else { 0 };
        Some(RegionLine {
            region,
            line: rel / LINE_SIZE,
        })
    }

    /// Translate absolute line addresses into a region-relative line set. Returns the set and
    /// how many addresses lay in no usable mapping (dropped, counted).
    pub fn relative_lines(
        &self,
        addrs: impl IntoIterator<Item = u64>,
    ) -> (crate::ws::LineSet, u64) {
        let mut dropped = 0u64;
        let set = crate::ws::LineSet::from_lines(addrs.into_iter().filter_map(|a| {
            let r = self.to_relative(VirtAddr(a));
            if r.is_none() {
                dropped += 1;
            }
            r
        }));
        (set, dropped)
    }

    /// Where region `region`'s line `line` is mapped now, `None` if it is not mapped.
    pub fn to_absolute(&self, region: u32, line: u64) -> Option<VirtAddr> {
        let rel = line.checked_mul(LINE_SIZE)?;
        for (i, m) in self.mappings.iter().enumerate() {
            if self.mapping_region[i] != Some(region) {
                continue;
            }
            let base = if m.file.is_some() { m.offset } else { 0 };
            if rel >= base && rel - base < m.len() {
                return Some(VirtAddr(m.start + (rel - base)));
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str, start: u64, end: u64, offset: u64, exec: bool) -> Mapping {
        Mapping {
            start,
            end,
            read: true,
            write: !exec,
            exec,
            shared: false,
            offset,
            name: path.into(),
            file: Some(FileIdent {
                path: path.into(),
                inode: 7,
                build_id: vec![1, 2, 3],
            }),
        }
    }
    fn anon(name: &str, start: u64, end: u64) -> Mapping {
        Mapping {
            start,
            end,
            read: true,
            write: true,
            exec: false,
            shared: false,
            offset: 0,
            name: name.into(),
            file: None,
        }
    }

    #[test]
    fn file_mappings_share_a_region_and_use_file_offsets() {
        let t = RegionTable::build(vec![
            file("/bin/x", 0x1000, 0x3000, 0, false),
            file("/bin/x", 0x3000, 0x5000, 0x2000, true),
            anon("", 0x5000, 0x6000), // bss
            anon("[heap]", 0x10000, 0x20000),
            anon("[vdso]", 0x30000, 0x31000),
        ]);
        assert_eq!(t.regions.len(), 3);
        let a = t.to_relative(VirtAddr(0x3040)).unwrap();
        assert_eq!(a.region, 0);
        assert_eq!(a.line, (0x2000 + 0x40) / 64);
        assert_eq!(t.to_absolute(0, a.line), Some(VirtAddr(0x3040)));
        assert!(matches!(
            &t.regions[1],
            RegionKey::Anon { kind: AnonKind::Bss, label, .. } if label == "/bin/x"
        ));
        assert!(
            t.to_relative(VirtAddr(0x30010)).is_none(),
            "vdso is special"
        );
        assert!(t.to_relative(VirtAddr(0x9000)).is_none(), "unmapped");
        let (set, dropped) = t.relative_lines([0x3040, 0x3050, 0x9000, 0x30010]);
        assert_eq!(set.len(), 1, "0x3040 and 0x3050 share a line");
        assert_eq!(dropped, 2, "unmapped and special addresses are counted");
    }

    #[test]
    fn relative_form_survives_relocation() {
        let a = RegionTable::build(vec![
            file("/bin/x", 0x1000, 0x3000, 0, true),
            anon("[heap]", 0x10000, 0x20000),
        ]);
        let b = RegionTable::build(vec![
            file("/bin/x", 0x7f00_0000, 0x7f00_2000, 0, true),
            anon("[heap]", 0x5500_0000, 0x5501_0000),
        ]);
        for addr in [0x1040u64, 0x2fc0, 0x10080, 0x1ffc0] {
            let rel = a.to_relative(VirtAddr(addr)).unwrap();
            let key = &a.regions[rel.region as usize];
            let rb = b.regions.iter().position(|r| r == key).unwrap() as u32;
            let moved = b.to_absolute(rb, rel.line).unwrap();
            assert_eq!(b.to_relative(moved).unwrap().line, rel.line);
        }
    }
}
