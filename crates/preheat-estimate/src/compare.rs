//! Precision and recall of one working set against another taken as ground
//! truth (typically `probe` against `trace`; `preheat ws compare`).
//!
//! Lines are compared in region-relative form. Only file-backed regions (code, read-only and
//! initialised data of the binary and its libraries) are comparable across backends: anonymous
//! memory is laid out differently under Valgrind (its own allocator), so anonymous lines are
//! counted and reported but not scored.

use std::collections::BTreeSet;

use anyhow::{Context, Result};
use preheat_model::{Profile, RegionKey};
use serde::Serialize;

/// Precision and recall over one kind of line.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Score {
    pub tested: u64,
    pub truth: u64,
    pub true_positives: u64,
    pub precision: f64,
    pub recall: f64,
}

impl Score {
    fn of(t: &BTreeSet<Key>, g: &BTreeSet<Key>) -> Score {
        let tp = t.intersection(g).count() as u64;
        Score {
            tested: t.len() as u64,
            truth: g.len() as u64,
            true_positives: tp,
            precision: if t.is_empty() {
                0.0
            } else {
                tp as f64 / t.len() as f64
            },
            recall: if g.is_empty() {
                0.0
            } else {
                tp as f64 / g.len() as f64
            },
        }
    }
}

type Key = (String, Vec<u8>, u64);

/// Which lines of files are code: those in an executable ELF load segment of the file (the
/// segments are read once per path). One classification for `ws compare` and the hybrid
/// backend's merge: a file line mapped twice (the page a read-only and an executable segment
/// share) counts as code.
#[derive(Default)]
pub struct CodeLines {
    segs: std::collections::BTreeMap<String, Vec<preheat_engine::maps::ElfSegment>>,
}

impl CodeLines {
    /// Whether line `line` (file offset / 64) of the file at `path` is code; `None` when the
    /// file has no readable ELF load segments.
    pub fn classify(&mut self, path: &str, line: u64) -> Option<bool> {
        let v = self
            .segs
            .entry(path.to_string())
            .or_insert_with(|| preheat_engine::maps::elf_load_segments(path).unwrap_or_default());
        let off = line * 64;
        (!v.is_empty()).then(|| {
            v.iter()
                .any(|s| s.exec && off >= s.offset & !63 && off < s.offset + s.filesz)
        })
    }

    /// [`Self::classify`], a file without ELF segments having no code.
    pub fn is_code(&mut self, path: &str, line: u64) -> bool {
        self.classify(path, line).unwrap_or(false)
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Comparison {
    pub port: u16,
    /// Lines in executable segments of their files (instruction fetches).
    pub code: Score,
    /// Lines in other segments (read-only and initialised data).
    pub data: Score,
    /// All scored lines (file-backed regions): the tested set and the truth.
    #[serde(flatten)]
    pub all: Score,
    /// Lines in anonymous regions, not scored.
    pub tested_anon_lines: u64,
    pub truth_anon_lines: u64,
}

/// The class for `port`, or the profile's only class when `port` is `None`.
fn class_of(p: &Profile, port: Option<u16>) -> Result<&preheat_model::RequestClass> {
    match port {
        Some(port) => p
            .class(port)
            .with_context(|| format!("no working set for port {port}")),
        None if p.classes.len() == 1 => Ok(&p.classes[0]),
        None => anyhow::bail!(
            "the profile has {} request classes; pick one with --port",
            p.classes.len()
        ),
    }
}

fn file_lines(p: &Profile, port: Option<u16>) -> Result<(BTreeSet<Key>, u64)> {
    let class = class_of(p, port)?;
    let mut set = BTreeSet::new();
    let mut anon = 0;
    for rr in &class.ws.regions {
        let n: u64 = rr.runs.iter().map(|r| r.len as u64).sum();
        match p.regions.get(rr.region as usize) {
            Some(RegionKey::File(f)) => {
                for run in &rr.runs {
                    for l in run.start..run.end() {
                        set.insert((f.path.clone(), f.build_id.clone(), l));
                    }
                }
            }
            _ => anon += n,
        }
    }
    Ok((set, anon))
}

/// Compare the classes of `port` (or each profile's only class: recordings of the same server
/// on different ports are comparable).
pub fn compare(tested: &Profile, truth: &Profile, port: Option<u16>) -> Result<Comparison> {
    let (t, ta) = file_lines(tested, port).context("tested profile")?;
    let (g, ga) = file_lines(truth, port).context("ground-truth profile")?;
    let mut code = CodeLines::default();
    let mut is_code = |k: &Key| code.is_code(&k.0, k.2);
    let (tc, td): (BTreeSet<Key>, BTreeSet<Key>) = t.iter().cloned().partition(|k| is_code(k));
    let (gc, gd): (BTreeSet<Key>, BTreeSet<Key>) = g.iter().cloned().partition(|k| is_code(k));
    Ok(Comparison {
        port: class_of(tested, port)?.port,
        code: Score::of(&tc, &gc),
        data: Score::of(&td, &gd),
        all: Score::of(&t, &g),
        tested_anon_lines: ta,
        truth_anon_lines: ga,
    })
}
