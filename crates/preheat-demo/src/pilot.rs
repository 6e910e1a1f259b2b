//! `auto`'s pilot: before the table's rounds, interleaved rounds of "none" (an unannounced
//! cold-sweep request) and every candidate set of strategies that can run on this server, at
//! the run's lead, from the same cold state; [`preheat_model::auto::choose`] then picks what
//! `auto` announces. The pilot's samples are not the table's: `auto` is measured again there.

use anyhow::Result;
use preheat_launch::progress::Progress;
use preheat_model::auto::{choose, AutoChoice, Pilot};
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

/// Run `rounds` pilot rounds over `cands` and choose.
pub(crate) fn run(
    bench: &mut Bench<'_>,
    cands: &[Strategies],
    rounds: usize,
    progress: &dyn Progress,
) -> Result<AutoChoice> {
    let modes: Vec<Mode> = std::iter::once(Mode::ColdSweep)
        .chain(cands.iter().map(|s| Mode::Preheat(*s)))
        .collect();
    progress.start((rounds * modes.len()) as u64, "auto pilot");
    // [mode][round]: latency (every mode once per round, so in round order) and, for replay
    // candidates, in flight.
    let mut lat: Vec<Vec<f64>> = vec![Vec::with_capacity(rounds); modes.len()];
    let mut flight: Vec<Vec<bool>> = vec![Vec::new(); modes.len()];
    let mut rng = rand::thread_rng();
    for round in 0..rounds {
        let mut order: Vec<usize> = (0..modes.len()).collect();
        order.shuffle(&mut rng);
        let kind = bench.client.new_round().unwrap_or("request");
        for i in order {
            let s = bench.sample(modes[i], round, kind)?;
            lat[i].push(s.latency_us);
            if modes[i].replays() && s.server_start_us.is_finite() {
                // The request's busy period began before its arrival: the server was still on
                // the warm-up when the request came.
                flight[i].push(s.server_start_us < 0.0);
            }
            progress.inc(1);
        }
    }
    progress.finish();
    let pilots: Vec<Pilot<'_>> = cands
        .iter()
        .enumerate()
        .map(|(j, s)| Pilot {
            strategies: *s,
            latency_us: &lat[j + 1],
            in_flight: modes[j + 1].replays().then_some(flight[j + 1].as_slice()),
        })
        .collect();
    Ok(choose(&lat[0], &pilots))
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
