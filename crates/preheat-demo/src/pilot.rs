//! `auto`'s pilot: before the table's rounds, interleaved rounds of "none" (an unannounced
//! cold-sweep request) and every candidate set of strategies that can run on this server, at
//! the run's lead, from the same cold state; [`preheat_model::auto::choose`] then picks what
//! `auto` announces. Where that was a tie between a simpler candidate and the best by median,
//! [`DECIDE_ROUNDS`] more rounds of none and the two alone settle it
//! ([`preheat_model::auto::decide`]); while the tie stays open and leans toward the best
//! ([`preheat_model::auto::tie_leans_to_best`]), up to [`DECIDE_STAGES`] such stages in all.
//! Why more than one: on preheat-kv (2026-11-29, EPYC `haltpoll`, 200 µs) 45 paired rounds left
//! `lines+replay` ahead of `replay` by 0.8 µs per round with a CI from −0.1 to 3.5, `auto` took
//! `replay`, and tables with both rows measured `wake+lines+replay` 0.5–2.7 µs (p50) faster than
//! `replay` in every one of 24 runs of that session. The pilot's samples are not the table's: `auto` is
//! measured again there.

use anyhow::Result;
use preheat_launch::progress::Progress;
use preheat_model::auto::{choose, decide, tie_leans_to_best, AutoChoice, Pilot};
use preheat_model::proto::Strategies;
use rand::seq::SliceRandom;

use crate::measure::Bench;
use crate::mode::Mode;

/// Every non-empty combination of `wake`, `lines` and `replay` that `available` allows.
pub(crate) fn candidates(available: Strategies) -> Vec<Strategies> {
    (1..=Strategies::ALL.0)
        .map(Strategies)
        .filter(|s| available.contains(*s))
        .collect()
}

/// Further rounds of none and the two tied candidates alone (three samples a round): 15 paired
/// rounds resolve tens of µs, 45 a few.
pub(crate) const DECIDE_ROUNDS: usize = 30;

/// At most this many stages of [`DECIDE_ROUNDS`] settle a tie (each costs about a second).
pub(crate) const DECIDE_STAGES: usize = 4;

/// Run `rounds` pilot rounds over `cands` and choose (settling a tie with [`DECIDE_ROUNDS`]).
pub(crate) fn run(
    bench: &mut Bench<'_>,
    cands: &[Strategies],
    rounds: usize,
    progress: &dyn Progress,
) -> Result<AutoChoice> {
    let modes: Vec<Mode> = std::iter::once(Mode::ColdSweep)
        .chain(cands.iter().map(|s| Mode::Preheat(*s)))
        .collect();
    // [mode][round]: latency (every mode once per round, so in round order) and, for replay
    // candidates, in flight.
    let mut lat: Vec<Vec<f64>> = vec![Vec::with_capacity(rounds); modes.len()];
    let mut flight: Vec<Vec<bool>> = vec![Vec::new(); modes.len()];
    let all: Vec<usize> = (0..modes.len()).collect();
    let stage = Stage {
        modes: &modes,
        which: &all,
        first_round: 0,
        rounds,
        label: "auto pilot",
    };
    stage.run(bench, &mut lat, &mut flight, progress)?;
    let first = choose(&lat[0], &pilots(cands, &modes, &lat, &flight));
    let Some((simpler, best)) = first.tie else {
        return Ok(first);
    };
    // `lat`'s index of a candidate (the tie is between two of `cands`).
    let pos = |s: Strategies| {
        cands
            .iter()
            .position(|c| *c == s)
            .map(|k| k + 1)
            .ok_or_else(|| anyhow::anyhow!("auto's tie names {} outside its candidates", s.name()))
    };
    let (i, j) = (pos(simpler)?, pos(best)?);
    for n in 0..DECIDE_STAGES {
        let stage = Stage {
            modes: &modes,
            which: &[0, i, j],
            first_round: rounds + n * DECIDE_ROUNDS,
            rounds: DECIDE_ROUNDS,
            label: "auto pilot: deciding a tie",
        };
        stage.run(bench, &mut lat, &mut flight, progress)?;
        if !tie_leans_to_best(&lat[i], &lat[j]) {
            break;
        }
    }
    // None and the two were measured in every round of both stages, paired by round.
    let two = |k: usize| Pilot {
        strategies: cands[k - 1],
        latency_us: &lat[k],
        in_flight: None,
    };
    Ok(decide(&first, &lat[0], two(i), two(j)))
}

/// Rounds of some of the pilot's modes, each round in shuffled order.
struct Stage<'a> {
    modes: &'a [Mode],
    /// Indices into `modes` measured in every round.
    which: &'a [usize],
    /// The first round's number (the rounds continue the pilot's).
    first_round: usize,
    rounds: usize,
    label: &'static str,
}

impl Stage<'_> {
    /// Append each round's latency (and, for replay modes, whether the warm-up was in flight)
    /// to `lat[mode]` and `flight[mode]`.
    fn run(
        &self,
        bench: &mut Bench<'_>,
        lat: &mut [Vec<f64>],
        flight: &mut [Vec<bool>],
        progress: &dyn Progress,
    ) -> Result<()> {
        progress.start((self.rounds * self.which.len()) as u64, self.label);
        let mut rng = rand::thread_rng();
        for round in self.first_round..self.first_round + self.rounds {
            let mut order = self.which.to_vec();
            order.shuffle(&mut rng);
            let kind = bench.client.new_round().unwrap_or("request");
            for i in order {
                let s = bench.sample(self.modes[i], round, kind)?;
                lat[i].push(s.latency_us);
                if self.modes[i].replays() && s.server_start_us.is_finite() {
                    // The request's busy period began before its arrival: the server was still
                    // on the warm-up when the request came.
                    flight[i].push(s.server_start_us < 0.0);
                }
                progress.inc(1);
            }
        }
        progress.finish();
        Ok(())
    }
}

/// The candidates' pilot samples (`lat[0]` is none's).
fn pilots<'a>(
    cands: &[Strategies],
    modes: &[Mode],
    lat: &'a [Vec<f64>],
    flight: &'a [Vec<bool>],
) -> Vec<Pilot<'a>> {
    cands
        .iter()
        .enumerate()
        .map(|(j, s)| Pilot {
            strategies: *s,
            latency_us: &lat[j + 1],
            in_flight: modes[j + 1].replays().then_some(flight[j + 1].as_slice()),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_are_the_combinations_available() {
        let all = candidates(Strategies::ALL);
        assert_eq!(all.len(), 7);
        let names: Vec<String> = candidates(Strategies::WAKE.union(Strategies::LINES))
            .iter()
            .map(|s| s.name())
            .collect();
        assert_eq!(names, ["wake", "lines", "wake+lines"]);
    }
}
