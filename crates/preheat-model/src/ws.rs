//! Line sets, the k-of-n sample filter and run-length encoding (paper §3.1 and §3.3).
//!
//! * The paper repeats estimation 8 times and keeps "only those memory locations which have been
//!   repeatedly accessed"; that vote is [`crate::vote`].
//! * The paper sorts lines by physical address and run-length encodes them; we sort by
//!   region-relative line (virtual order within a region: physical order is not visible from
//!   user space, and the host backs guest memory with 4 KiB pages anyway) and encode each
//!   region's lines as runs `(start, len)`.
//! * Gap merge (our extension): runs separated by at most `gap` lines are merged, trading a few
//!   extra lines for fewer runs.

use serde::{Deserialize, Serialize};

use crate::addr::{RegionLine, LINE_SIZE};
use crate::varint;

/// A sorted, de-duplicated set of region-relative lines.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LineSet(Vec<RegionLine>);

impl LineSet {
    /// From lines already sorted and de-duplicated (the vote's filters keep their input's
    /// order).
    pub(crate) fn from_sorted(lines: Vec<RegionLine>) -> LineSet {
        debug_assert!(lines.windows(2).all(|w| w[0] < w[1]));
        LineSet(lines)
    }

    /// Build from any iterator (sorts and de-duplicates).
    pub fn from_lines(lines: impl IntoIterator<Item = RegionLine>) -> LineSet {
        let mut v: Vec<RegionLine> = lines.into_iter().collect();
        v.sort_unstable();
        v.dedup();
        LineSet(v)
    }
    pub fn as_slice(&self) -> &[RegionLine] {
        &self.0
    }
    pub fn len(&self) -> usize {
        self.0.len()
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    pub fn contains(&self, l: &RegionLine) -> bool {
        self.0.binary_search(l).is_ok()
    }
    /// Lines of `self` not in `other`.
    pub fn difference(&self, other: &LineSet) -> LineSet {
        LineSet(
            self.0
                .iter()
                .filter(|l| !other.contains(l))
                .copied()
                .collect(),
        )
    }
    /// Number of lines present in both sets.
    pub fn intersection_len(&self, other: &LineSet) -> usize {
        self.0.iter().filter(|l| other.contains(l)).count()
    }
}

/// A run of consecutive lines inside one region: lines `start .. start + len`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Run {
    pub start: u64,
    pub len: u32,
}

impl Run {
    pub fn end(&self) -> u64 {
        self.start + self.len as u64
    }
}

/// Run-length encode sorted, de-duplicated line indices of one region, merging runs separated
/// by at most `gap` missing lines (`gap == 0`: exact encoding). Runs never exceed `u32::MAX`.
pub fn encode_runs(sorted_lines: &[u64], gap: u32) -> Vec<Run> {
    let mut runs: Vec<Run> = Vec::new();
    for &l in sorted_lines {
        if let Some(last) = runs.last_mut() {
            let end = last.end();
            if l < end {
                continue; // duplicate or unsorted input: already covered
            }
            let new_len = l - last.start + 1;
            if l - end <= gap as u64 && new_len <= u32::MAX as u64 {
                last.len = new_len as u32;
                continue;
            }
        }
        runs.push(Run { start: l, len: 1 });
    }
    runs
}

/// The runs of one region.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegionRuns {
    pub region: u32,
    pub runs: Vec<Run>,
}

/// A working set: per region, sorted non-overlapping runs. Regions are sorted by index.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkingSet {
    pub regions: Vec<RegionRuns>,
}

/// Size metrics of a working set, including the paper's (§3.3: "14528 bytes (one 32-bit address
/// per 64-byte cache line) down to 4596 bytes").
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct WsStats {
    /// Lines covered by the runs (after gap merge: including merged-in gap lines).
    pub lines: u64,
    pub runs: u64,
    pub regions: u64,
    /// `lines * 64 / 1024`.
    pub kib: f64,
    /// The paper's uncompressed metric: 4 bytes per line.
    pub raw_bytes: u64,
    /// The paper's RLE metric: one 32-bit address and one 16-bit length per run (6 bytes).
    pub rle_bytes_paper: u64,
    /// Bytes our file format actually spends on the runs (delta + varint encoded).
    pub encoded_bytes: u64,
}

impl WorkingSet {
    /// Build from a line set with gap merge `gap`.
    pub fn from_lines(lines: &LineSet, gap: u32) -> WorkingSet {
        let mut regions = Vec::new();
        let s = lines.as_slice();
        let mut i = 0;
        while i < s.len() {
            let region = s[i].region;
            let j = i + s[i..].partition_point(|l| l.region == region);
            let idx: Vec<u64> = s[i..j].iter().map(|l| l.line).collect();
            regions.push(RegionRuns {
                region,
                runs: encode_runs(&idx, gap),
            });
            i = j;
        }
        WorkingSet { regions }
    }

    /// Expand back into lines.
    pub fn to_lines(&self) -> LineSet {
        LineSet::from_lines(self.regions.iter().flat_map(|r| {
            r.runs.iter().flat_map(move |run| {
                (run.start..run.end()).map(move |line| RegionLine {
                    region: r.region,
                    line,
                })
            })
        }))
    }

    pub fn line_count(&self) -> u64 {
        self.regions
            .iter()
            .flat_map(|r| r.runs.iter())
            .map(|r| r.len as u64)
            .sum()
    }

    pub fn stats(&self) -> WsStats {
        let lines = self.line_count();
        let runs: u64 = self.regions.iter().map(|r| r.runs.len() as u64).sum();
        WsStats {
            lines,
            runs,
            regions: self.regions.len() as u64,
            kib: (lines * LINE_SIZE) as f64 / 1024.0,
            raw_bytes: lines * 4,
            rle_bytes_paper: runs * 6,
            encoded_bytes: self.encoded_len() as u64,
        }
    }

    /// Exactly what [`WorkingSet::encode`] appends.
    pub fn encoded_len(&self) -> usize {
        let mut v = Vec::new();
        self.encode(&mut v);
        v.len()
    }

    /// Append the compact encoding: region count; per region: region index, run count, and per
    /// run the gap from the previous run's end and the length, all varints.
    pub fn encode(&self, out: &mut Vec<u8>) {
        varint::put_u64(out, self.regions.len() as u64);
        for r in &self.regions {
            varint::put_u64(out, r.region as u64);
            varint::put_u64(out, r.runs.len() as u64);
            let mut prev_end = 0u64;
            for run in &r.runs {
                varint::put_u64(out, run.start - prev_end);
                varint::put_u64(out, run.len as u64);
                prev_end = run.end();
            }
        }
    }
}

/// Tests' shorthand: the set of `(region, line)` pairs.
#[cfg(test)]
pub(crate) fn test_set(v: &[(u32, u64)]) -> LineSet {
    LineSet::from_lines(v.iter().map(|&(region, line)| RegionLine { region, line }))
}

#[cfg(test)]
mod tests {
    use super::test_set as ls;
    use super::*;

    #[test]
    fn rle_and_gap_merge() {
        let lines = [1u64, 2, 3, 7, 8, 10, 20];
        assert_eq!(
            encode_runs(&lines, 0),
            vec![
                Run { start: 1, len: 3 },
                Run { start: 7, len: 2 },
                Run { start: 10, len: 1 },
                Run { start: 20, len: 1 }
            ]
        );
        assert_eq!(
            encode_runs(&lines, 1),
            vec![
                Run { start: 1, len: 3 },
                Run { start: 7, len: 4 },
                Run { start: 20, len: 1 }
            ]
        );
        assert_eq!(
            encode_runs(&lines, 3),
            vec![Run { start: 1, len: 10 }, Run { start: 20, len: 1 }]
        );
    }

    #[test]
    fn paper_metric() {
        let ws = WorkingSet::from_lines(&ls(&[(0, 0), (0, 1), (0, 2), (0, 5)]), 0);
        let st = ws.stats();
        assert_eq!(st.lines, 4);
        assert_eq!(st.runs, 2);
        assert_eq!(st.raw_bytes, 16);
        assert_eq!(st.rle_bytes_paper, 12);
        assert_eq!(st.kib, 0.25);
    }
}
