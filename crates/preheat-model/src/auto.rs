//! The `auto` strategy: which preheat strategies to announce for one server at one lead, chosen
//! from a pilot measured on that server rather than assumed.
//!
//! A strategy can hurt. A `replay` warm-up that is still being served when the real request
//! arrives makes the request wait behind it (a proxy forwards it to a backend that is then busy);
//! `lines` competes for the core with the server's own work; `wake` costs a system call. What
//! helps depends on the server, the lead and the machine, so the caller measures: a pilot of
//! interleaved rounds, each with one unannounced cold request ("none") and one request per
//! candidate set, all from the same cold state. [`choose`] compares each candidate with none
//! **per round** (the paired difference cancels the drift other tenants cause between rounds)
//! and picks the candidate whose median gain is largest among those whose gain's 95% confidence
//! interval lies above zero. When none does, `auto` announces nothing: it never picks a strategy
//! that was not measured to help.
//!
//! **Fewer strategies where more were not measured to add anything.** A candidate with fewer
//! strategies than that best one is preferred when the best was not measured faster than it
//! (the per-round difference between the two, paired like the gains, has a CI that reaches
//! zero): a strategy is only announced when it was measured to add to the others. Without this
//! rule a 15-round pilot on nginx picked `lines+replay` (120.5 µs faster than none) over
//! `replay` (120.4 µs), and the table then measured 79% against `replay`'s 90% (EPYC
//! `haltpoll`, 200 µs lead, 100 rounds): the extra strategy's cost was real, its gain was not.
//!
//! **A tie is measured further, not just broken.** When the best by median was not measured
//! faster than a simpler candidate, [`choose`] says so ([`AutoChoice::tie`]) and the caller
//! measures the two alone for more rounds; [`decide`] then judges them on all their paired
//! rounds, with the same rule. Fifteen rounds resolve a gain of tens of µs, not the 1–3 µs by
//! which `wake+lines+replay` led `replay` on preheat-kv (89–90% against 86–89% removed in the
//! table, EPYC `haltpoll`, 200 µs lead), where the simpler one was always kept.
//!
//! The pilot's samples are the pilot's only: a table that reports `auto` measures it again, so
//! the choice is not graded on the samples it was made from.

use serde::{Deserialize, Serialize};

use crate::proto::Strategies;
use crate::stats::{brackets_median, summarize, Summary};

/// What the pilot measured of one candidate against none.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// The median gain's 95% CI lies above zero.
    Helps,
    /// The median gain's 95% CI lies below zero: slower than announcing nothing.
    Hurts,
    /// The CI contains zero.
    NoMeasurableEffect,
    /// Too few paired rounds for a CI on the median.
    TooFewRounds,
}

/// One candidate's pilot result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Candidate {
    /// The strategies as announced (e.g. `wake+replay`).
    pub strategies: String,
    #[serde(skip)]
    pub bits: Strategies,
    /// Per-round gain, none − candidate (µs; positive: faster than none): median with its 95% CI.
    pub gain_us: Summary,
    pub verdict: Verdict,
    /// Rounds whose warm-up was still being served when the request arrived (replay only), of
    /// the rounds that said.
    pub in_flight: Option<(usize, usize)>,
}

impl Candidate {
    /// "wake+replay: 41.2 µs faster [35.0–47.9], 15 rounds: helps".
    pub fn describe(&self) -> String {
        let g = &self.gain_us;
        let (word, v) = if g.p50 >= 0.0 {
            ("faster", g.p50)
        } else {
            ("slower", -g.p50)
        };
        let verdict = match self.verdict {
            Verdict::Helps => "helps",
            Verdict::Hurts => "hurts",
            Verdict::NoMeasurableEffect => "no measurable effect",
            Verdict::TooFewRounds => "too few rounds to tell",
        };
        let mut s = format!(
            "{}: {v:.1} µs {word} than none [gain CI {:.1}–{:.1}], {} rounds: {verdict}",
            self.strategies, g.p50_lo, g.p50_hi, g.n
        );
        if let Some((k, n)) = self.in_flight {
            if k > 0 {
                s.push_str(&format!(
                    "; its warm-up was still being served at the arrival in {k} of {n}"
                ));
            }
        }
        s
    }
}

/// The choice and the evidence for it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AutoChoice {
    /// What `auto` announces (`none`: nothing measured to help).
    pub chosen: String,
    #[serde(skip)]
    pub bits: Strategies,
    /// One sentence: why this one.
    pub why: String,
    pub candidates: Vec<Candidate>,
    /// (the simpler candidate chosen, the best by median) when the choice was such a tie: the
    /// two to measure further before [`decide`].
    #[serde(skip)]
    pub tie: Option<(Strategies, Strategies)>,
}

/// One candidate's pilot samples: the response time of each round (µs; NaN where the round has
/// none) and, for replay candidates, whether the warm-up was in flight at the arrival.
#[derive(Clone, Copy)]
pub struct Pilot<'a> {
    pub strategies: Strategies,
    pub latency_us: &'a [f64],
    pub in_flight: Option<&'a [bool]>,
}

/// The per-round gains of `cand` over `none` (rounds where both are finite).
fn paired_gains(none: &[f64], cand: &[f64]) -> Vec<f64> {
    none.iter()
        .zip(cand)
        .filter(|(a, b)| a.is_finite() && b.is_finite())
        .map(|(a, b)| a - b)
        .collect()
}

fn verdict(g: &Summary) -> Verdict {
    // A CI the sample cannot bracket reads as its extremes: not evidence.
    if !brackets_median(g.n) {
        Verdict::TooFewRounds
    } else if g.p50_lo > 0.0 {
        Verdict::Helps
    } else if g.p50_hi < 0.0 {
        Verdict::Hurts
    } else {
        Verdict::NoMeasurableEffect
    }
}

/// The per-round gain of `cand` over `none` (µs; both indexed by round) with its verdict: the
/// one judgement behind `auto`'s choice and the tables' "this strategy hurts" flags.
pub fn judge(none: &[f64], cand: &[f64]) -> (Summary, Verdict) {
    let g = summarize(&paired_gains(none, cand));
    let v = verdict(&g);
    (g, v)
}

/// Judge every candidate against `none` (indexed by round, like every candidate's samples) and
/// choose: the largest median gain among the candidates that help; nothing if none does.
pub fn choose(none: &[f64], pilots: &[Pilot<'_>]) -> AutoChoice {
    let candidates: Vec<Candidate> = pilots
        .iter()
        .map(|p| {
            let (gain_us, verdict) = judge(none, p.latency_us);
            Candidate {
                strategies: p.strategies.name(),
                bits: p.strategies,
                verdict,
                gain_us,
                in_flight: p
                    .in_flight
                    .map(|f| (f.iter().filter(|x| **x).count(), f.len())),
            }
        })
        .collect();
    let helpers = candidates
        .iter()
        .filter(|c| c.verdict == Verdict::Helps)
        .count();
    let best = (0..candidates.len())
        .filter(|&i| candidates[i].verdict == Verdict::Helps)
        .max_by(|&a, &b| {
            candidates[a]
                .gain_us
                .p50
                .total_cmp(&candidates[b].gain_us.p50)
        });
    let mut tie = None;
    let (bits, why) = match best {
        Some(b) => {
            let c = &candidates[b];
            let largest = format!(
                "{} had the largest median gain of the {helpers} candidates measured to help \
                 ({:.1} µs per round, CI {:.1}–{:.1}, {} paired rounds)",
                c.strategies, c.gain_us.p50, c.gain_us.p50_lo, c.gain_us.p50_hi, c.gain_us.n
            );
            match simpler_tie(&candidates, pilots, b) {
                Some((s, over)) => {
                    let t = &candidates[s];
                    tie = Some((t.bits, c.bits));
                    (
                        t.bits,
                        format!(
                            "{} ({:.1} µs faster than none per round, CI {:.1}–{:.1}) has fewer \
                             strategies and {} was not measured faster than it ({:.1} µs per \
                             round, CI {:.1}–{:.1}): {largest}",
                            t.strategies,
                            t.gain_us.p50,
                            t.gain_us.p50_lo,
                            t.gain_us.p50_hi,
                            c.strategies,
                            over.p50,
                            over.p50_lo,
                            over.p50_hi
                        ),
                    )
                }
                None => (c.bits, largest),
            }
        }
        None => (
            Strategies::NONE,
            format!(
                "none of the {} candidates was measured to help (no gain CI above zero): auto \
                 announces nothing",
                candidates.len()
            ),
        ),
    };
    AutoChoice {
        chosen: bits.name(),
        bits,
        why,
        candidates,
        tie,
    }
}

/// Settle `first`'s tie between a simpler candidate and the best by median from more rounds of
/// the two alone: `none`, `simpler` and `best` hold every paired round of the two, the first
/// pilot's included. The rule is [`choose`]'s on those two; the first pilot's candidates stay
/// the evidence shown, and the reason says both steps.
pub fn decide(first: &AutoChoice, none: &[f64], simpler: Pilot<'_>, best: Pilot<'_>) -> AutoChoice {
    let two = choose(none, &[simpler, best]);
    let rounds = paired_gains(none, best.latency_us).len();
    AutoChoice {
        chosen: two.chosen,
        bits: two.bits,
        why: format!(
            "{rounds} paired rounds of the two alone decided between them: {} (the first \
             pilot: {})",
            two.why, first.why
        ),
        candidates: first.candidates.clone(),
        tie: None,
    }
}

/// Whether a tie between `simpler` and `best` (their latencies, paired by round) is still open
/// and leans toward `best`: `best` was not measured faster, yet its median per-round gain over
/// `simpler` is positive — more rounds may settle it either way. A tie settled (`best` measured
/// faster) or leaning toward `simpler` (a gain ≤ 0) needs no more rounds.
pub fn tie_leans_to_best(simpler: &[f64], best: &[f64]) -> bool {
    let (over, v) = judge(simpler, best);
    v != Verdict::Helps && over.n > 0 && over.p50 > 0.0
}

/// How many of `wake`, `lines` and `replay` `s` announces.
fn size(s: Strategies) -> u32 {
    (s.0 & Strategies::ALL.0).count_ones()
}

/// The candidate with the fewest strategies (then the largest median gain) among those that
/// help, have fewer strategies than `candidates[best]`, and that `best` was not measured faster
/// than (the per-round difference's CI reaches zero); with that difference. `None`: the best
/// stands.
fn simpler_tie(
    candidates: &[Candidate],
    pilots: &[Pilot<'_>],
    best: usize,
) -> Option<(usize, Summary)> {
    let b = &candidates[best];
    (0..candidates.len())
        .filter(|&i| {
            candidates[i].verdict == Verdict::Helps && size(candidates[i].bits) < size(b.bits)
        })
        .filter_map(|i| {
            let (over, v) = judge(pilots[i].latency_us, pilots[best].latency_us);
            (v != Verdict::Helps).then_some((i, over))
        })
        .min_by(|(x, _), (y, _)| {
            let (cx, cy) = (&candidates[*x], &candidates[*y]);
            size(cx.bits)
                .cmp(&size(cy.bits))
                .then(cy.gain_us.p50.total_cmp(&cx.gain_us.p50))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pilot(s: Strategies, v: &[f64]) -> Pilot<'_> {
        Pilot {
            strategies: s,
            latency_us: v,
            in_flight: None,
        }
    }

    /// Twenty rounds whose level drifts (other tenants): none at `base + drift`, a candidate at
    /// `base + drift − gain ± jitter`.
    fn rounds(base: f64, gain: f64) -> (Vec<f64>, Vec<f64>) {
        let drift = |r: usize| 10.0 * ((r * 7) % 5) as f64;
        let jitter = |r: usize| ((r * 13) % 7) as f64 - 3.0;
        let none = (0..20).map(|r| base + drift(r)).collect();
        let cand = (0..20)
            .map(|r| base + drift(r) - gain + jitter(r))
            .collect();
        (none, cand)
    }

    #[test]
    fn picks_the_largest_gain_among_those_that_help() {
        let (none, small) = rounds(170.0, 20.0);
        let (_, large) = rounds(170.0, 90.0);
        let (_, hurt) = rounds(170.0, -40.0);
        let c = choose(
            &none,
            &[
                pilot(Strategies::WAKE, &small),
                pilot(Strategies::ALL, &large),
                pilot(Strategies::REPLAY, &hurt),
            ],
        );
        assert_eq!(c.bits, Strategies::ALL, "{c:?}");
        assert_eq!(c.chosen, "wake+lines+replay");
        let v: Vec<Verdict> = c.candidates.iter().map(|c| c.verdict).collect();
        assert_eq!(v, [Verdict::Helps, Verdict::Helps, Verdict::Hurts]);
        assert!(c.candidates[2].describe().contains("slower than none"));
    }

    #[test]
    fn prefers_fewer_strategies_when_more_were_not_measured_to_add() {
        // `lines+replay` has a slightly larger median gain than `replay`, within the noise: the
        // per-round difference between the two reaches zero, so `replay` is announced.
        let (none, replay) = rounds(170.0, 90.0);
        let both: Vec<f64> = replay
            .iter()
            .enumerate()
            .map(|(r, x)| x - 1.0 + ((r * 5) % 3) as f64 - 0.5)
            .collect();
        let (_, wake) = rounds(170.0, 20.0);
        let c = choose(
            &none,
            &[
                pilot(Strategies::WAKE, &wake),
                pilot(Strategies::REPLAY, &replay),
                pilot(Strategies::LINES.union(Strategies::REPLAY), &both),
            ],
        );
        assert!(
            c.candidates[2].gain_us.p50 >= c.candidates[1].gain_us.p50,
            "the test's premise: {c:?}"
        );
        assert_eq!(c.bits, Strategies::REPLAY, "{}", c.why);
        assert!(c.why.contains("fewer strategies"), "{}", c.why);
        let lr = Strategies::LINES.union(Strategies::REPLAY);
        assert_eq!(c.tie, Some((Strategies::REPLAY, lr)));
        // `wake` helps too but much less: `replay` was measured faster than it, so it stays out.
        assert!(
            c.why.contains("lines+replay was not measured faster"),
            "{}",
            c.why
        );
    }

    #[test]
    fn a_tie_is_decided_by_the_further_rounds() {
        // The first pilot: `wake+lines+replay` leads `replay` by 2 µs per round, within its
        // noise, so `replay` is chosen and the tie reported.
        let jitter = |r: usize, k: usize| ((r * k) % 9) as f64 - 4.0;
        let none: Vec<f64> = (0..60)
            .map(|r| 170.0 + 10.0 * ((r * 7) % 5) as f64)
            .collect();
        let replay: Vec<f64> = none
            .iter()
            .enumerate()
            .map(|(r, x)| x - 90.0 + jitter(r, 5))
            .collect();
        let all: Vec<f64> = none
            .iter()
            .enumerate()
            .map(|(r, x)| x - 93.0 + jitter(r, 7))
            .collect();
        let first = choose(
            &none[..15],
            &[
                pilot(Strategies::REPLAY, &replay[..15]),
                pilot(Strategies::ALL, &all[..15]),
            ],
        );
        assert_eq!(
            first.tie,
            Some((Strategies::REPLAY, Strategies::ALL)),
            "{}",
            first.why
        );
        // Sixty paired rounds show the 3 µs: the best is announced, and the reason says why.
        let d = decide(
            &first,
            &none,
            pilot(Strategies::REPLAY, &replay),
            pilot(Strategies::ALL, &all),
        );
        assert_eq!(d.bits, Strategies::ALL, "{}", d.why);
        assert_eq!(d.tie, None);
        assert!(
            d.why.starts_with("60 paired rounds of the two alone"),
            "{}",
            d.why
        );
        assert_eq!(d.candidates, first.candidates);
        // Where the further rounds show no difference either, the simpler one stays.
        let same: Vec<f64> = replay
            .iter()
            .enumerate()
            .map(|(r, x)| x + jitter(r, 2))
            .collect();
        let d = decide(
            &first,
            &none,
            pilot(Strategies::REPLAY, &replay),
            pilot(Strategies::ALL, &same),
        );
        assert_eq!(d.bits, Strategies::REPLAY, "{}", d.why);
    }

    #[test]
    fn a_tie_leaning_to_the_best_asks_for_more_rounds() {
        // best ahead by a median of 1 µs against 10 µs of noise over 15 rounds: open.
        let noise = |r: usize| 10.0 * (((r * 7919) % 13) as f64 / 6.0 - 1.0);
        let simpler: Vec<f64> = (0..15).map(|r| 50.0 + noise(r)).collect();
        let ahead: Vec<f64> = (0..15)
            .map(|r| 49.0 + noise(r) + noise(r + 3) * 0.5)
            .collect();
        assert!(tie_leans_to_best(&simpler, &ahead));
        // Behind or equal: settled toward the simpler one.
        let behind: Vec<f64> = simpler.iter().map(|x| x + 1.0).collect();
        assert!(!tie_leans_to_best(&simpler, &behind));
        assert!(!tie_leans_to_best(&simpler, &simpler));
        // Measured faster in every round: settled toward the best.
        let faster: Vec<f64> = simpler.iter().map(|x| x - 5.0).collect();
        assert!(!tie_leans_to_best(&simpler, &faster));
    }

    #[test]
    fn keeps_more_strategies_when_they_were_measured_to_add() {
        let (none, replay) = rounds(170.0, 60.0);
        let (_, both) = rounds(170.0, 90.0);
        let c = choose(
            &none,
            &[
                pilot(Strategies::REPLAY, &replay),
                pilot(Strategies::LINES.union(Strategies::REPLAY), &both),
            ],
        );
        assert_eq!(
            c.bits,
            Strategies::LINES.union(Strategies::REPLAY),
            "{}",
            c.why
        );
        assert!(c.why.contains("largest median gain"), "{}", c.why);
    }

    #[test]
    fn announces_nothing_when_nothing_helps() {
        let (none, hurt) = rounds(170.0, -40.0);
        let (_, same) = rounds(170.0, 0.0);
        let c = choose(
            &none,
            &[
                pilot(Strategies::REPLAY, &hurt),
                pilot(Strategies::WAKE, &same),
            ],
        );
        assert_eq!(c.bits, Strategies::NONE);
        assert_eq!(c.candidates[1].verdict, Verdict::NoMeasurableEffect);
        assert!(c.why.contains("announces nothing"), "{}", c.why);
    }

    #[test]
    fn pairs_by_round_so_drift_does_not_hide_a_gain() {
        // The drift (0–40 µs) is larger than the gain (8 µs): unpaired CIs would overlap.
        let (none, cand) = rounds(100.0, 8.0);
        let c = choose(&none, &[pilot(Strategies::LINES, &cand)]);
        assert_eq!(c.candidates[0].verdict, Verdict::Helps, "{c:?}");
    }

    #[test]
    fn too_few_rounds_is_said_and_never_chosen() {
        let c = choose(&[100.0, 101.0], &[pilot(Strategies::WAKE, &[50.0, 51.0])]);
        assert_eq!(c.candidates[0].verdict, Verdict::TooFewRounds);
        assert_eq!(c.bits, Strategies::NONE);
    }

    #[test]
    fn rounds_missing_a_sample_are_left_out_and_in_flight_is_counted() {
        let (none, mut cand) = rounds(170.0, 50.0);
        cand[3] = f64::NAN;
        let flight = [true, false, false, true];
        let c = choose(
            &none,
            &[Pilot {
                strategies: Strategies::REPLAY,
                latency_us: &cand,
                in_flight: Some(&flight),
            }],
        );
        assert_eq!(c.candidates[0].gain_us.n, 19);
        assert_eq!(c.candidates[0].in_flight, Some((2, 4)));
        assert!(c.candidates[0]
            .describe()
            .contains("still being served at the arrival in 2 of 4"));
    }
}
