//! Line sets, the k-of-n sample filter and run-length encoding (paper §3.1 and §3.3).
//!
//! * The paper repeats estimation 8 times and keeps "only those memory locations which have been
//!   repeatedly accessed"; [`filter_k_of_n`] keeps lines seen in at least `k` of the samples.
//! * The paper sorts lines by physical address and run-length encodes them; we sort by
//!   region-relative line (virtual order within a region: physical order is not visible from
//!   user space, and the host backs guest memory with 4 KiB pages anyway) and encode each
//!   region's lines as runs `(start, len)`.
//! * Gap merge (our extension): runs separated by at most `gap` lines are merged, trading a few
//!   extra lines for fewer runs.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::addr::{RegionLine, LINE_SIZE};
use crate::varint;

/// A sorted, de-duplicated set of region-relative lines.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LineSet(Vec<RegionLine>);

impl LineSet {
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

/// Keep the lines that occur in at least `k` of `samples` (the paper's stability filter).
/// `k == 0` is treated as 1 (union).
pub fn filter_k_of_n(samples: &[LineSet], k: usize) -> LineSet {
    let k = k.max(1);
    let mut counts: BTreeMap<RegionLine, usize> = BTreeMap::new();
    for s in samples {
        for l in s.as_slice() {
            *counts.entry(*l).or_insert(0) += 1;
        }
    }
    LineSet(
        counts
            .into_iter()
            .filter(|&(_, c)| c >= k)
            .map(|(l, _)| l)
            .collect(),
    )
}

/// The lines of `lines` that are not noise: a line is noise if it shows up in at least `k` of
/// the request-less samples `noise` **and** in nearly as many of them as of the request
/// samples `samples` (at most `slack` fewer). A line a request needs shows up in (nearly) every
/// request sample; if something else — the recording agent's own use of libc, say — brings it
/// in now and then without a request, it is still the request's line and stays. Only lines that
/// come about as often without the request as with it are taken for the noise they are.
pub fn remove_noise(
    lines: &LineSet,
    samples: &[LineSet],
    noise: &[LineSet],
    k: usize,
    slack: usize,
) -> LineSet {
    let k = k.max(1);
    let count = |sets: &[LineSet], l: &RegionLine| sets.iter().filter(|s| s.contains(l)).count();
    LineSet(
        lines
            .0
            .iter()
            .filter(|l| {
                let quiet = count(noise, l);
                quiet < k || quiet + slack < count(samples, l)
            })
            .copied()
            .collect(),
    )
}

/// How many of the lines the vote keeps ([`filter_k_of_n`] at `k`, then — with `noise_k` —
/// [`remove_noise`] at `noise_k` and `slack`) would be kept although no request touches them:
/// the expected number, modeled. Each line seen in `s` of the `m` request-less samples is taken
/// to come about in any window with probability `s / m`, requests or not (the null hypothesis
/// for a line the request does not touch; a line the request needs has `s` near 0 and adds
/// nearly nothing); the sum over lines of the chance that such a line passes the vote anyway,
/// with independent windows. A server whose other threads touch much of its memory at
/// intermediate rates (a JVM's) keeps many lines by chance; one whose background is rare or
/// constant (a line in every window is removed) keeps few. Lines never seen without a request
/// count as background of rate 0, so this is a lower bound for them.
pub fn chance_kept(
    samples: &[LineSet],
    noise: &[LineSet],
    k: usize,
    noise_k: Option<usize>,
    slack: usize,
) -> f64 {
    let (n, m) = (samples.len() as u32, noise.len() as u32);
    if m == 0 {
        return 0.0;
    }
    // How many lines were seen in exactly s request-less samples.
    let mut counts: BTreeMap<RegionLine, u32> = BTreeMap::new();
    for set in noise {
        for l in set.as_slice() {
            *counts.entry(*l).or_insert(0) += 1;
        }
    }
    let mut by_s = vec![0u64; m as usize + 1];
    for c in counts.values() {
        by_s[*c as usize] += 1;
    }
    let pmf = |t: u32, q: f64, i: u32| {
        crate::stats::binomial_tail(t, q, i) - crate::stats::binomial_tail(t, q, i + 1)
    };
    let k = k.max(1) as u32;
    let mut expected = 0.0;
    for (s, &lines) in by_s.iter().enumerate().skip(1) {
        if lines == 0 {
            continue;
        }
        let q = s as f64 / f64::from(m);
        // P(kept) = Σ over a request count r ≥ k and a request-less count s' of both chances,
        // where the vote keeps (r, s').
        let mut kept = 0.0;
        for r in k..=n {
            let pr = pmf(n, q, r);
            let stays = match noise_k {
                None => 1.0,
                Some(nk) => (0..=m)
                    .filter(|&s2| (s2 as usize) < nk.max(1) || s2 as usize + slack < r as usize)
                    .map(|s2| pmf(m, q, s2))
                    .sum(),
            };
            kept += pr * stays;
        }
        expected += lines as f64 * kept;
    }
    expected
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

#[cfg(test)]
mod tests {
    use super::*;

    fn ls(v: &[(u32, u64)]) -> LineSet {
        LineSet::from_lines(v.iter().map(|&(region, line)| RegionLine { region, line }))
    }

    #[test]
    fn noise_is_what_comes_as_often_without_the_request() {
        // Line 1: every request sample, 3 of 8 without (the agent's libc now and then): kept.
        // Line 2: every sample either way (the agent's own): removed. Line 3: 6 of 8 with the
        // request, 5 of 8 without: removed with slack 2. Line 4: once without: kept.
        let with: Vec<LineSet> = (0..8)
            .map(|i| ls(&[(0, 1), (0, 2), (0, if i < 6 { 3 } else { 9 }), (0, 4)]))
            .collect();
        let without: Vec<LineSet> = (0..8)
            .map(|i| {
                let mut v = vec![(0, 2)];
                if i < 3 {
                    v.push((0, 1));
                }
                if i < 5 {
                    v.push((0, 3));
                }
                if i == 0 {
                    v.push((0, 4));
                }
                ls(&v)
            })
            .collect();
        let lines = filter_k_of_n(&with, 6);
        assert_eq!(lines, ls(&[(0, 1), (0, 2), (0, 3), (0, 4)]));
        assert_eq!(
            remove_noise(&lines, &with, &without, 2, 2),
            ls(&[(0, 1), (0, 4)])
        );
        // A stricter vote keeps line 3 too; no slack removes only what is as frequent.
        assert_eq!(
            remove_noise(&lines, &with, &without, 6, 2),
            ls(&[(0, 1), (0, 3), (0, 4)])
        );
        assert_eq!(
            remove_noise(&lines, &with, &without, 2, 0),
            ls(&[(0, 1), (0, 3), (0, 4)])
        );
    }

    #[test]
    fn chance_kept_counts_background_lines_by_their_rate() {
        // Eight request and eight request-less samples. Line 1: the request's, never seen
        // without one; line 2: in every window (removed, never kept by chance); lines 3..=6:
        // in half of the request-less windows.
        let mut samples = Vec::new();
        let mut noise = Vec::new();
        for i in 0..8u64 {
            let half: Vec<(u32, u64)> = if i % 2 == 0 {
                (3..=6).map(|l| (0, l)).collect()
            } else {
                vec![]
            };
            let mut req = vec![(0, 1), (0, 2)];
            req.extend(half.iter().copied());
            samples.push(ls(&req));
            let mut quiet = vec![(0, 2)];
            quiet.extend(half);
            noise.push(ls(&quiet));
        }
        // Without noise removal: a rate-1/2 line passes 6 of 8 with P(X ≥ 6) = 37/256; the
        // line in every window surely.
        let want = 1.0 + 4.0 * 37.0 / 256.0;
        assert!((chance_kept(&samples, &noise, 6, None, 2) - want).abs() < 1e-9);
        // With it (noise_k 3, slack 2): the line in every window never stays; a rate-1/2
        // line stays only with few request-less sightings or many more with requests.
        let with = chance_kept(&samples, &noise, 6, Some(3), 2);
        assert!(with > 0.0 && with < 4.0 * 37.0 / 256.0, "{with}");
        // The request's own line adds nothing: it was never seen without a request.
        let only_request: Vec<LineSet> = (0..8).map(|_| ls(&[(0, 1)])).collect();
        let empty: Vec<LineSet> = (0..8).map(|_| ls(&[])).collect();
        assert_eq!(chance_kept(&only_request, &empty, 6, Some(3), 2), 0.0);
        // No request-less samples: nothing to model from.
        assert_eq!(chance_kept(&samples, &[], 6, Some(3), 2), 0.0);
    }

    #[test]
    fn filter_keeps_stable_lines() {
        let s = vec![
            ls(&[(0, 1), (0, 2), (1, 9)]),
            ls(&[(0, 1), (0, 3)]),
            ls(&[(0, 1), (0, 2)]),
        ];
        assert_eq!(filter_k_of_n(&s, 2), ls(&[(0, 1), (0, 2)]));
        assert_eq!(filter_k_of_n(&s, 3), ls(&[(0, 1)]));
        assert_eq!(filter_k_of_n(&s, 1).len(), 4);
    }

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
