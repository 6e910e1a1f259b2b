//! Where the loopback's receive processing runs (`--steer-rx`): on the sending CPU, the
//! kernel's default — for a request, the client's — or steered to the server's CPU (RPS on `lo`,
//! [`preheat_engine::rxsteer`]), as a NIC's interrupt affinity puts a server's packets on the
//! server's core.
//!
//! Which is better differs by machine. On the Xeon `none` host steering helped (kv at a 200 µs
//! lead, two runs each way: `replay` 82/83% against 80/75%, *start* 25–29 against 31–33 µs); on
//! the EPYC `haltpoll` hosts it hurt (79–84% against 84–91%: an IPI into a busy vCPU). So `auto`
//! (the default) measures it before the table: paired rounds of one preheat mode (`auto`'s
//! choice, else the first one asked for), unsteered and steered in shuffled order within each
//! round, and steers only where steering's gain per round — on the response time from the wire
//! on, where the client's socket is stamped — has its 95% CI above zero
//! ([`preheat_model::auto::judge`]). The choice holds for every mode of the table; the
//! transport line names it. `on` and `off` skip the pilot. Over a veth pair, unprivileged,
//! or while another process steers, nothing is steered, and the output says why.

use anyhow::Result;
use preheat_engine::rxsteer::Steering;
use preheat_model::auto::{judge, Verdict};
use preheat_model::stats::Summary;
use rand::seq::SliceRandom;
use serde::Serialize;

use crate::measure::Bench;
use crate::mode::Mode;

/// `--steer-rx`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SteerRx {
    /// Measure both before the table and keep the better (see the module docs).
    #[default]
    Auto,
    On,
    Off,
}

/// What the run did with the receive path, and why.
#[derive(Debug, Clone, Serialize)]
pub struct SteerChoice {
    /// The table ran with the loopback's receive processing on the server's CPU.
    pub steered: bool,
    /// "measured" (auto's pilot), "given" (on/off), or "n/a" (could not steer).
    pub label: &'static str,
    pub why: String,
    /// The pilot: steering's gain per round over not steering, µs.
    pub gain_us: Option<Summary>,
}

impl SteerChoice {
    fn not(label: &'static str, why: String) -> SteerChoice {
        SteerChoice {
            steered: false,
            label,
            why,
            gain_us: None,
        }
    }

    /// The transport line's words.
    pub fn describe(&self) -> String {
        let what = if self.steered {
            "receive path steered to the server's CPU (RPS on lo)"
        } else {
            "receive path on the sending CPU (the kernel's default)"
        };
        format!("{what} [{}: {}]", self.label, self.why)
    }
}

/// Open steering for `mode` (before the pilots): the steering, unsteered for now where it
/// could be set up (`None` with the reason otherwise). What a killed run left is put back by
/// [`Steering::apply`] and by every `preheat` command at start-up.
pub(crate) fn open(
    mode: SteerRx,
    loopback: bool,
    server_cpu: usize,
) -> (Option<Steering>, Option<SteerChoice>) {
    if mode == SteerRx::Off {
        let why = "--steer-rx off".to_string();
        return (None, Some(SteerChoice::not("given", why)));
    }
    if !loopback {
        let why = "steering is built for the loopback; over the veth pair the kernel places the receive processing".to_string();
        return (None, Some(SteerChoice::not("n/a", why)));
    }
    match Steering::apply("lo", &[server_cpu]).and_then(|s| {
        s.set(false)?;
        Ok(s)
    }) {
        Ok(s) => (Some(s), None),
        Err(e) => {
            let why = format!("cannot steer lo's receive processing: {e}");
            eprintln!("demo: {why}");
            (None, Some(SteerChoice::not("n/a", why)))
        }
    }
}

/// Decide (and set) the table's steering: `on` as given, `auto` by a pilot of `rounds` paired
/// rounds of the first preheat mode in `modes`.
pub(crate) fn decide(
    mode: SteerRx,
    steering: &Steering,
    bench: &mut Bench<'_>,
    modes: &[Mode],
    rounds: usize,
) -> Result<SteerChoice> {
    if mode == SteerRx::On {
        steering.set(true)?;
        return Ok(SteerChoice {
            steered: true,
            label: "given",
            why: "--steer-rx on".into(),
            gain_us: None,
        });
    }
    let probe = modes.iter().copied().find(|m| match m {
        Mode::Auto(s) | Mode::Preheat(s) => !s.is_empty(),
        _ => false,
    });
    let Some(m) = probe else {
        steering.set(false)?;
        let why = "no preheat mode to measure it with: not steered".to_string();
        return Ok(SteerChoice::not("n/a", why));
    };
    eprintln!(
        "demo: steer-rx: {rounds} paired rounds of {} without and with lo's receive processing on the server's CPU",
        m.name()
    );
    let (mut off, mut on) = (Vec::new(), Vec::new());
    let mut wired = true;
    let mut rng = rand::thread_rng();
    for round in 0..rounds {
        let kind = bench.client.new_round().unwrap_or("request");
        let mut order = [false, true];
        order.shuffle(&mut rng);
        for steered in order {
            steering.set(steered)?;
            let s = bench.sample(m, round, kind)?;
            // From the wire on, where the client's socket is stamped: steering moves only what
            // follows the packet's transmit, and the client's own transmit varies by several µs
            // between requests on some hosts (see `table`'s wire stage).
            wired &= s.wire_us.is_finite();
            let t = if s.wire_us.is_finite() {
                s.latency_us - s.wire_us
            } else {
                s.latency_us
            };
            (if steered { &mut on } else { &mut off }).push(t);
        }
    }
    let (gain, verdict) = judge(&off, &on);
    let steered = verdict == Verdict::Helps;
    steering.set(steered)?;
    let why = pilot_sentence(&m.name(), &gain, wired, verdict);
    eprintln!("demo: steer-rx: {why}");
    Ok(SteerChoice {
        steered,
        label: "measured",
        why,
        gain_us: Some(gain),
    })
}

/// What the steering pilot measured and decided, in one sentence.
fn pilot_sentence(mode: &str, gain: &Summary, wired: bool, verdict: Verdict) -> String {
    format!(
        "{mode} with steering was {:.1} µs per round faster than without (median{}, 95% CI \
         {:.1}–{:.1}, {} paired rounds): {}",
        gain.p50,
        if wired { " from the wire on" } else { "" },
        gain.p50_lo,
        gain.p50_hi,
        gain.n,
        match verdict {
            Verdict::Helps => "steered",
            Verdict::TooFewRounds => "too few rounds for that interval, not steered",
            _ => "not shown faster, not steered",
        }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pilot_says_what_it_measured() {
        let gain = preheat_model::stats::summarize(&[3.0, 5.0, 6.8, 7.0, 9.0, 12.0, 14.6]);
        let s = pilot_sentence("preheat:auto", &gain, true, Verdict::Helps);
        assert!(
            s.starts_with("preheat:auto with steering was 7.0 µs per round faster"),
            "{s}"
        );
        assert!(
            s.contains("(median from the wire on, 95% CI") && s.ends_with(": steered"),
            "{s}"
        );
        let s = pilot_sentence("preheat:replay", &gain, false, Verdict::NoMeasurableEffect);
        assert!(
            s.contains("(median, 95% CI") && s.ends_with("not shown faster, not steered"),
            "{s}"
        );
        let s = pilot_sentence("preheat:replay", &gain, false, Verdict::TooFewRounds);
        assert!(
            s.ends_with("too few rounds for that interval, not steered"),
            "{s}"
        );
    }
}
