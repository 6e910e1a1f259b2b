//! The vote that turns samples into a working set (paper §3.1: estimation repeated 8 times,
//! keeping "only those memory locations which have been repeatedly accessed"), our noise
//! removal against request-less samples, the model of what the vote keeps by chance, and the
//! stricter test used where that model says the vote cannot tell.
//!
//! * [`filter_k_of_n`]: lines seen in at least `k` of `n` request samples (the paper's);
//! * [`remove_noise`]: less the lines that come about about as often without a request;
//! * [`chance_kept`]: how many lines those two keep although no request touches them (modeled);
//! * [`enrichment_p`], [`keep_enriched`], [`fdr_level`]: a one-sided Fisher exact test per line
//!   (seen more often with the request than without), at a Benjamini–Hochberg level.

use std::collections::BTreeMap;

use crate::addr::RegionLine;
use crate::ws::LineSet;

/// Keep the lines that occur in at least `k` of `samples` (the paper's stability filter).
/// `k == 0` is treated as 1 (union).
pub fn filter_k_of_n(samples: &[LineSet], k: usize) -> LineSet {
    let k = k.max(1) as u32;
    LineSet::from_sorted(
        sightings(samples)
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
    LineSet::from_sorted(
        lines
            .as_slice()
            .iter()
            .filter(|l| {
                let quiet = seen_in(noise, l) as usize;
                quiet < k || quiet + slack < seen_in(samples, l) as usize
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
    let mut by_s = vec![0u64; m as usize + 1];
    for c in sightings(noise).values() {
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

/// Every line seen in `sets`, with the number of sets it was seen in.
fn sightings(sets: &[LineSet]) -> BTreeMap<RegionLine, u32> {
    let mut counts = BTreeMap::new();
    for set in sets {
        for l in set.as_slice() {
            *counts.entry(*l).or_insert(0) += 1;
        }
    }
    counts
}

/// In how many of `sets` line `l` was seen.
fn seen_in(sets: &[LineSet], l: &RegionLine) -> u32 {
    sets.iter().filter(|x| x.contains(l)).count() as u32
}

/// The one-sided p-value of a line seen in `r` of `n` request samples and `s` of `m` request-less
/// ones, under the null that it comes about at the same rate in both (Fisher's exact test: the
/// chance that `n` windows drawn from all `n + m` hold at least `r` of its `r + s` sightings).
pub fn enrichment_p(r: u32, n: u32, s: u32, m: u32) -> f64 {
    let total = n + m;
    let seen = r + s;
    // ln C(a, b) from ln-factorials (exact enough for the dozens of samples here).
    let ln_fact = |x: u32| (1..=x).map(|i| f64::from(i).ln()).sum::<f64>();
    let ln_choose = |a: u32, b: u32| ln_fact(a) - ln_fact(b) - ln_fact(a - b);
    let denom = ln_choose(total, n);
    let hi = seen.min(n);
    (r..=hi)
        .filter(|&x| seen - x <= m)
        .map(|x| (ln_choose(seen, x) + ln_choose(total - seen, n - x) - denom).exp())
        .sum::<f64>()
        .min(1.0)
}

/// The lines of `lines` seen in at least `k` request samples whose [`enrichment_p`] is at most
/// `alpha`: seen significantly more often with the request than without it
/// ([`enrichment_ps`], then [`enriched_at`]).
pub fn keep_enriched(
    lines: &LineSet,
    samples: &[LineSet],
    noise: &[LineSet],
    k: usize,
    alpha: f64,
) -> LineSet {
    enriched_at(&enrichment_ps(lines, samples, noise, k), alpha)
}

/// The tested lines whose p-value is at most `alpha`.
pub fn enriched_at(tested: &[(RegionLine, f64)], alpha: f64) -> LineSet {
    LineSet::from_sorted(
        tested
            .iter()
            .filter(|&&(_, p)| p <= alpha)
            .map(|&(l, _)| l)
            .collect(),
    )
}

/// The Benjamini–Hochberg level for `p_values` (those of the lines that could be kept) among
/// `candidates` tests in all, at false-discovery rate `q`: the largest p-value `p₍ᵢ₎` (the i-th
/// smallest) with `p₍ᵢ₎ ≤ q · i / candidates`, or 0 where none is (nothing kept). Lines at or
/// below it are kept; of those, a share `q` or less is expected to be unrelated to the request.
pub fn fdr_level(p_values: &[f64], candidates: usize, q: f64) -> f64 {
    let mut sorted = p_values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let c = candidates.max(sorted.len()).max(1) as f64;
    sorted
        .iter()
        .enumerate()
        .rev()
        .find(|&(i, &p)| p <= q * (i + 1) as f64 / c)
        .map_or(0.0, |(_, &p)| p)
}

/// The lines of `lines` seen in at least `k` request samples, each with its p-value
/// ([`enrichment_p`]), in the order of `lines`.
pub fn enrichment_ps(
    lines: &LineSet,
    samples: &[LineSet],
    noise: &[LineSet],
    k: usize,
) -> Vec<(RegionLine, f64)> {
    let (n, m) = (samples.len() as u32, noise.len() as u32);
    lines
        .as_slice()
        .iter()
        .filter_map(|&l| {
            let r = seen_in(samples, &l);
            (r as usize >= k.max(1)).then(|| (l, enrichment_p(r, n, seen_in(noise, &l), m)))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ws::test_set as ls;

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
    fn fdr_level_is_benjamini_hochberg() {
        // Four tests in all, q = 0.1: thresholds 0.025, 0.05, 0.075, 0.1.
        assert_eq!(fdr_level(&[0.01, 0.04, 0.3], 4, 0.1), 0.04);
        assert_eq!(fdr_level(&[0.03, 0.04], 4, 0.1), 0.04);
        assert_eq!(fdr_level(&[0.06, 0.3], 4, 0.1), 0.0);
        // Many more tests than p-values: a stricter level.
        assert_eq!(fdr_level(&[0.01, 0.04], 1000, 0.1), 0.0);
        assert_eq!(fdr_level(&[], 10, 0.1), 0.0);
    }

    #[test]
    fn enrichment_p_matches_hand_counts() {
        // All 8 sightings in the 8 request windows of 16: 1 / C(16, 8).
        assert!((enrichment_p(8, 8, 0, 8) - 1.0 / 12870.0).abs() < 1e-12);
        // 8 with, 1 without: (C(9,8)·C(7,0)) / C(16,8).
        assert!((enrichment_p(8, 8, 1, 8) - 9.0 / 12870.0).abs() < 1e-12);
        // As often with as without: no evidence.
        assert!(enrichment_p(4, 8, 4, 8) > 0.5);
        // Never seen: nothing to test, p = 1.
        assert!((enrichment_p(0, 8, 0, 8) - 1.0).abs() < 1e-12);
    }

    #[test]
    fn keep_enriched_keeps_request_lines_and_drops_background() {
        // Line 1 in every request sample only; line 2 in every request sample and half the
        // request-less ones; line 3 in every request sample and one request-less one.
        let samples: Vec<LineSet> = (0..8u64).map(|_| ls(&[(0, 1), (0, 2), (0, 3)])).collect();
        let noise: Vec<LineSet> = (0..8u64)
            .map(|i| {
                ls(&if i % 2 == 0 {
                    vec![(0, 2)]
                } else if i == 1 {
                    vec![(0, 3)]
                } else {
                    vec![]
                })
            })
            .collect();
        let all = filter_k_of_n(&samples, 6);
        assert_eq!(all.len(), 3);
        let kept = keep_enriched(&all, &samples, &noise, 6, 0.001);
        assert_eq!(kept, ls(&[(0, 1), (0, 3)]));
        // Stricter: only the line never seen without a request.
        assert_eq!(
            keep_enriched(&all, &samples, &noise, 6, 1e-4),
            ls(&[(0, 1)])
        );
    }
}
