//! Which probe layout — stride and window — to record with, chosen from measurements of the
//! server's own memory, and how strict the noise vote must be for the false hits it leaves.
//!
//! The probe's false hits come from hardware prefetchers it cannot switch off (see
//! `preheat_engine::probe`), and prefetchers differ between CPUs. On the 2-vCPU EPYC machines
//! the probe was built on, stride 2 over 16-page windows served; on a Xeon (Sapphire Rapids)
//! host of the same machine kind that layout read 8–14% of preheat-kv's untouched lines as hits
//! in every sample without a request, and the vote then lost half of a request's lines (recall
//! 0.34–0.71 against the exact trace, 4 recordings), while stride 4 over 64-page windows read
//! 1–2% and kept 0.82–0.91 (most runs). A synthetic request on a private buffer did not rank the
//! layouts as the server's memory did, so the recording measures the server itself: before its
//! samples it takes [`PILOT_SAMPLES`] request-less samples of up to [`PILOT_CHUNKS`] chunks with
//! every [`CANDIDATES`] layout, and [`pick`] takes the cheapest whose share of lines read as
//! hits ties the lowest (a share above [`UNRELIABLE_SHARE`] ties nothing below it). A user's
//! `--stride`/`--window-pages` skip the pilot.
//!
//! A pilot can still mislead: on the Xeon host the default layout's request-less samples read
//! 0.6% in one pilot, 7–31% in nine others, and 18–43% in eight recordings forced onto it (one of
//! them kept 7361 lines where the wider layout keeps ~220). So a trial counts its *worst* sample,
//! and a recording whose own request-less samples read more than [`UNRELIABLE_SHARE`] of their
//! lines as hits is taken again with the next wider layout ([`wider`]); where none is left, the
//! recording says its estimate is unreliable.
//!
//! The share left after the choice also sets the noise vote ([`noise_k`]): a line counts as the
//! agent's own noise only if it shows up in more request-less samples than random false hits
//! would put it in, so a request's lines are not subtracted as noise on a CPU whose probe
//! reads many false hits.

use serde::Serialize;

/// A probe layout: `stride` passes per chunk (each probing every `stride`-th line), lines
/// probed in random order within windows of `window_pages` pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Layout {
    pub stride: u32,
    pub window_pages: u32,
}

/// The layouts tried, cheapest first (stride s costs s requests per chunk and sample). Stride 8
/// over 64-page windows read fewer false hits still on the Xeon host (~1.0% against 1.1–4.2%),
/// but with the noise rule of [`crate::record`] it recorded no better (recall 0.92, 0.92, 0.92
/// against 0.87, 0.92, 0.92) at twice the requests, which in the suite's debug builds made the
/// end-to-end tests that record take 409 s instead of ~130 s.
pub const CANDIDATES: [Layout; 2] = [
    Layout {
        stride: 2,
        window_pages: 16,
    },
    Layout {
        stride: 4,
        window_pages: 64,
    },
];

/// The layout where none is measured, and the default of each half of a user's choice.
pub const DEFAULT: Layout = CANDIDATES[0];

/// Request-less samples per candidate layout in the pilot.
pub const PILOT_SAMPLES: u32 = 2;

/// Chunks each pilot sample probes at most, spread evenly over the candidates (a server's whole
/// memory is not needed to compare layouts; its first chunks alone misled: preheat-kv's first
/// two of three read 0.4% with the default layout, all three 17%).
pub const PILOT_CHUNKS: usize = 4;

/// A layout whose hit share is at most `TIE` × the lowest (plus half a percentage point)
/// counts as equal; the cheapest of those is chosen.
pub const TIE: f64 = 1.5;

/// A share of untouched lines read as hits above which a recording's estimate is unreliable
/// (false hits in every sample survive the vote): on the Xeon host the wider layout read 0.9–6.0%
/// in ten recordings, the default one 4.5% once and 18–43% otherwise.
pub const UNRELIABLE_SHARE: f64 = 0.10;

/// The layout to take a recording's samples again with: the next wider one, where the pilot
/// chose `l` (`chosen_by_pilot`) and the recording's request-less samples read more than
/// [`UNRELIABLE_SHARE`] of their lines as hits (`hit_share`). A user's layout is kept.
pub fn retry(l: Layout, chosen_by_pilot: bool, hit_share: f64) -> Option<Layout> {
    (chosen_by_pilot && hit_share > UNRELIABLE_SHARE)
        .then(|| wider(l))
        .flatten()
}

/// The next candidate after `l` (wider, dearer), if any.
pub fn wider(l: Layout) -> Option<Layout> {
    let i = CANDIDATES.iter().position(|c| *c == l)?;
    CANDIDATES.get(i + 1).copied()
}

/// Chance, per line the server really touches, that random false hits alone make it look like
/// the agent's own noise ([`noise_k`]).
pub const NOISE_ALPHA: f64 = 0.01;

/// A layout a recording gave up on: the share of untouched lines its request-less samples
/// read as hits.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Retried {
    pub layout: Layout,
    pub hit_share: f64,
}

/// One candidate's pilot: the largest share of probed lines read as hits by one of its
/// request-less samples (the worst: see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Trial {
    pub layout: Layout,
    pub hit_share: f64,
    pub samples: u32,
}

/// The cheapest trial whose hit share ties the lowest ([`TIE`]); [`DEFAULT`] without trials.
///
/// A trial whose pilot already read more than [`UNRELIABLE_SHARE`] does not tie one that read
/// less: the recording would most likely take its samples again with the wider layout
/// ([`retry`]), paying for both. Measured (2026-11-29, EPYC `haltpoll`, a JVM hand-off server,
/// 121 chunks): the pilot read 14.9% with the default and 10.9% with the wider layout, which
/// tied; the recording's own request-less samples then read 10.8% with the default, were taken
/// again with the wider layout (7.6%), and the recording took 88.8 s. Where every trial read
/// more, the lowest is taken.
pub fn pick(trials: &[Trial]) -> Layout {
    let clean: Vec<&Trial> = trials
        .iter()
        .filter(|t| t.hit_share <= UNRELIABLE_SHARE)
        .collect();
    if clean.is_empty() {
        return trials
            .iter()
            .min_by(|a, b| a.hit_share.total_cmp(&b.hit_share))
            .map_or(DEFAULT, |t| t.layout);
    }
    let lowest = clean
        .iter()
        .map(|t| t.hit_share)
        .fold(f64::INFINITY, f64::min);
    clean
        .iter()
        .find(|t| t.hit_share <= lowest * TIE + 0.005)
        .map_or(DEFAULT, |t| t.layout)
}

/// The noise vote for `n` request-less samples whose probe reads a share `hit_share` of
/// untouched lines as hits: the smallest k ≥ `min` such that random false hits put a line in
/// at least k of them with probability ≤ [`NOISE_ALPHA`] (at most `n`).
pub fn noise_k(n: u32, hit_share: f64, min: u32) -> u32 {
    let n = n.max(1);
    (min.max(1)..=n)
        .find(|&k| preheat_model::stats::binomial_tail(n, hit_share, k) <= NOISE_ALPHA)
        .unwrap_or(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(i: usize, hit_share: f64) -> Trial {
        Trial {
            layout: CANDIDATES[i],
            hit_share,
            samples: PILOT_SAMPLES,
        }
    }

    #[test]
    fn the_cheapest_layout_that_ties_the_lowest_hit_share_wins() {
        // The Xeon host's pilot: the default reads 17-31%, the wider one 1-4%.
        assert_eq!(pick(&[t(0, 0.17), t(1, 0.031)]), CANDIDATES[1]);
        // A CPU where the default is as clean: it stays (fewer requests).
        assert_eq!(pick(&[t(0, 0.012), t(1, 0.010)]), CANDIDATES[0]);
        // Within the tie by the absolute half point alone.
        assert_eq!(pick(&[t(0, 0.004), t(1, 0.0)]), CANDIDATES[0]);
        assert_eq!(pick(&[t(0, 0.006), t(1, 0.0)]), CANDIDATES[1]);
        assert_eq!(pick(&[]), DEFAULT);
    }

    #[test]
    fn a_pilot_above_the_unreliable_share_ties_nothing() {
        // The JVM's pilot: 14.9% and 10.9% would tie (within 1.5x), but the default would be
        // taken again: every trial above 10%, so the lowest.
        assert_eq!(pick(&[t(0, 0.149), t(1, 0.109)]), CANDIDATES[1]);
        // The default above 10%, the wider one below: the wider one, however close.
        assert_eq!(pick(&[t(0, 0.11), t(1, 0.095)]), CANDIDATES[1]);
        // Both at or below 10%: the tie as before.
        assert_eq!(pick(&[t(0, 0.10), t(1, 0.08)]), CANDIDATES[0]);
        // Every trial above it and the default lowest: the default.
        assert_eq!(pick(&[t(0, 0.2), t(1, 0.3)]), CANDIDATES[0]);
    }

    #[test]
    fn each_layout_but_the_widest_has_a_wider_one() {
        assert_eq!(wider(CANDIDATES[0]), Some(CANDIDATES[1]));
        assert_eq!(wider(CANDIDATES[1]), None);
        let other = Layout {
            stride: 3,
            window_pages: 8,
        };
        assert_eq!(wider(other), None);
    }

    #[test]
    fn only_a_pilot_s_layout_that_reads_too_many_false_hits_is_retried() {
        // The Xeon host's recording forced onto the default: 42.5% of untouched lines as hits.
        assert_eq!(retry(CANDIDATES[0], true, 0.425), Some(CANDIDATES[1]));
        // The wider layout's worst recording there (6.0%), and the default at its best (4.5%).
        assert_eq!(retry(CANDIDATES[1], true, 0.060), None);
        assert_eq!(retry(CANDIDATES[0], true, 0.045), None);
        // Nothing wider left, or the user's own layout: kept (and called unreliable).
        assert_eq!(retry(CANDIDATES[1], true, 0.5), None);
        assert_eq!(retry(CANDIDATES[0], false, 0.5), None);
    }

    #[test]
    fn the_noise_vote_grows_with_the_false_hit_share() {
        // Few false hits: the configured minimum.
        assert_eq!(noise_k(8, 0.001, 2), 2);
        // 2%: two of eight happen by chance 1% of the time: one more.
        assert_eq!(noise_k(8, 0.02, 2), 3);
        // 10%: four of eight.
        assert_eq!(noise_k(8, 0.10, 2), 4);
        // A probe reading everything as a hit: only lines in every sample.
        assert_eq!(noise_k(8, 0.9, 2), 8);
        // Never below the minimum, never above n.
        assert_eq!(noise_k(8, 0.0, 5), 5);
        assert_eq!(noise_k(1, 0.5, 2), 1);
    }
}
