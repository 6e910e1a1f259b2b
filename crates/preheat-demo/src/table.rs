//! The demo's table: response-time rows, the share of the cold overhead each mode removes, and
//! the split of that overhead by stage.
//!
//! * **Floor.** Shares are against the hot floor (`hot`: caches warm, every CPU kept awake by the
//!   calibrated mechanism, or none where none beat plain idle, the server's threads held) when
//!   it was measured **and shown to be one**: warm − hot per round, its median's 95% CI above 0
//!   ([`floor_check`]). Otherwise (no hot floor, or hot no faster than warm — e.g. a machine
//!   whose idle loop halts whatever PM QoS says) against `warm`, and the output says which and
//!   why. `removed = (cold − mode) / (cold −
//!   floor)` on p50s, with cold = cold-sweep. A share outside [−100%, 100%] means the floor or the
//!   baseline is not what it claims (e.g. a mode faster than the floor): it is flagged, never
//!   printed silently.
//! * **Mixed request kinds** (MariaDB's TPC-C-like mix: every mode of a round runs the round's
//!   transaction type, whose costs differ by multiples): the p50s of two modes would compare
//!   different mixes, so the total's shares are computed on per-round differences instead,
//!   `median_r(cold_r − mode_r) / median_r(cold_r − floor_r)` over the rounds that have all
//!   three, and the output says so. The stage shares stay on p50s.
//! * **Stages.** Every request's response time splits at the moment the server thread started on
//!   it (returned from its wait, as the agent saw): *start* (arrival and wake-up: send → server
//!   thread runs) and *serve* (server thread runs → the client has the reply: processing with
//!   whatever the caches lost, the kernel's send path and the client's receive). Each stage's
//!   share removed is computed like the total's, on that stage's p50s. The cold overhead's
//!   decomposition: wake-up = control − hot, cache and kernel-path loss = cold-sweep − control.
//!   *Wire* (send → the request leaves the client's transmit path, from the kernel's software
//!   transmit stamp) is the client's own part of *start*: the client's CPU never sleeps and
//!   the client never runs on the server's CPU (`measure`), but on a machine whose CPUs share
//!   caches with each other the cold-making step on the server's CPU can still cool the
//!   client's path, which no preheating on the server's side can remove. Each preheat mode's [`Residual`]
//!   splits what it leaves above the floor into wire, the rest of start, and serve.

use preheat_model::proto::Strategies;
use serde::Serialize;

use crate::mode::{Mode, Sample};
use preheat_model::stats::{summarize, Summary};

#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub mode: String,
    pub latency: Summary,
    /// Share of the cold-sweep p50 overhead removed, against the floor (`floor`).
    pub overhead_removed: Option<f64>,
    /// The same share against warm (caches warm, CPUs not kept awake), beside it.
    pub removed_vs_warm: Option<f64>,
    /// The share removed from the wire on: computed like `overhead_removed` on each request's
    /// response time less its wire stage (the client's own transmit), where stamps exist; the
    /// paper's quantity, whose client sits on another machine.
    pub removed_from_wire: Option<f64>,
    /// The floor of `overhead_removed`: "hot" or "warm" (no hot floor measured).
    pub floor: &'static str,
    /// Stage p50s, µs: send → the request is on the wire (the client's transmit; part of
    /// start), send → server thread runs, and server thread runs → reply read.
    pub wire_us_p50: Option<f64>,
    pub start_us_p50: Option<f64>,
    pub serve_us_p50: Option<f64>,
    /// Share removed of each stage's cold overhead (against the floor's stage p50).
    pub start_removed: Option<f64>,
    pub serve_removed: Option<f64>,
    /// Shares outside [−100%, 100%]: named here (the floor or baseline is suspect).
    pub flags: Vec<String>,
    pub ws_kib: Option<f64>,
    pub runs: Option<u64>,
    pub encoded_bytes: Option<u64>,
    pub preheat_us_p50: Option<f64>,
    pub gb_per_s: Option<f64>,
    pub completed_share: Option<f64>,
    pub worker_lead_us_p50: Option<f64>,
    pub trigger_lead_us_p50: Option<f64>,
    /// Server thread start − announced arrival, µs: p50 and p99.
    pub server_start_us_p50: Option<f64>,
    pub server_start_us_p99: Option<f64>,
    /// A preheat mode: what it leaves above the floor, by stage.
    pub residual: Option<Residual>,
    /// With `--syscall-stages`: the split at the server's system calls (p50s).
    pub syscall: Option<SysRow>,
}

/// A mode's response time split at the server's system calls (the `sysstages` module): p50s, µs,
/// of the samples the observer saw a read and a write of.
#[derive(Debug, Clone, Serialize)]
pub struct SysRow {
    pub n: usize,
    pub to_event_us: f64,
    pub to_read_us: f64,
    pub compute_us: f64,
    pub reply_us: f64,
}

impl SysRow {
    fn of(mine: &[&Sample]) -> Option<SysRow> {
        let seen: Vec<&&Sample> = mine
            .iter()
            .filter(|s| s.sys_to_read_us.is_finite())
            .collect();
        let p50 = |f: fn(&Sample) -> f64| median(seen.iter().map(|s| f(s)).collect());
        Some(SysRow {
            n: seen.len(),
            to_event_us: p50(|s| s.sys_to_event_us)?,
            to_read_us: p50(|s| s.sys_to_read_us)?,
            compute_us: p50(|s| s.sys_compute_us)?,
            reply_us: p50(|s| s.sys_reply_us)?,
        })
    }
}

/// What a mode leaves above the floor, µs, by stage (differences of the stages' p50s, so the
/// parts need not add up to the total exactly).
#[derive(Debug, Clone, Serialize)]
pub struct Residual {
    pub total_us: f64,
    /// The client's own transmit path (wire), where the client's socket gives stamps.
    pub wire_us: Option<f64>,
    /// The rest of start: on the wire → the server thread runs (start alone without stamps).
    pub server_start_us: Option<f64>,
    pub serve_us: Option<f64>,
}

/// The cold overhead and its split by cause, µs (p50 differences).
#[derive(Debug, Clone, Serialize)]
pub struct Decomposition {
    pub floor: &'static str,
    pub cold_overhead_us: f64,
    /// control − floor: what waking the idle CPU costs by itself.
    pub wakeup_us: Option<f64>,
    /// cold-sweep − control: cache and kernel-path loss.
    pub cache_us: Option<f64>,
}

/// The median (the model's order statistic: the lower middle of an even sample, as the lab's),
/// `None` for no finite value.
fn median(v: Vec<f64>) -> Option<f64> {
    preheat_model::stats::median(&v)
}

/// Whether the hot floor is one in this run: warm − hot per round (the rounds that measured
/// both), its median with the 95% CI. Verified when the CI lies above 0 — and only where the
/// rounds can bracket a 95% interval of the median at all (`preheat_model::stats`'
/// ranks, as `auto`'s verdicts): fewer rounds' "interval" is their smallest and largest value,
/// and one round "verified" a floor from a single difference.
#[derive(Debug, Clone, Serialize)]
pub struct FloorCheck {
    pub verified: bool,
    pub warm_minus_hot_us_p50: f64,
    pub ci_us: [f64; 2],
    pub rounds: usize,
    /// Too few rounds for a 95% interval of the median: not verified, whatever the values.
    pub too_few_rounds: bool,
}

impl FloorCheck {
    /// One sentence for the output.
    pub fn describe(&self) -> String {
        format!(
            "hot floor {}: warm − hot per round p50 {:.1} µs (95% CI {:.1}–{:.1}, {} rounds, measured){}",
            if self.verified { "verified" } else { "NOT verified" },
            self.warm_minus_hot_us_p50,
            self.ci_us[0],
            self.ci_us[1],
            self.rounds,
            if self.verified {
                ""
            } else if self.too_few_rounds {
                ": too few rounds for a 95% interval of the median, so shares are against warm"
            } else {
                ": hot is not shown faster than warm here, so shares are against warm"
            }
        )
    }
}

/// The floor check of `samples` (`None` without hot or warm samples in a common round).
pub(crate) fn floor_check(samples: &[Sample]) -> Option<FloorCheck> {
    let hot: std::collections::BTreeMap<usize, f64> = samples
        .iter()
        .filter(|s| s.mode == "hot")
        .map(|s| (s.round, s.latency_us))
        .collect();
    let d: Vec<f64> = samples
        .iter()
        .filter(|s| s.mode == "warm")
        .filter_map(|w| hot.get(&w.round).map(|h| w.latency_us - h))
        .collect();
    let s = summarize(&d);
    let too_few_rounds = !preheat_model::stats::brackets_median(s.n);
    (s.n > 0).then_some(FloorCheck {
        verified: !too_few_rounds && s.p50_lo > 0.0,
        warm_minus_hot_us_p50: s.p50,
        ci_us: [s.p50_lo, s.p50_hi],
        rounds: s.n,
        too_few_rounds,
    })
}

/// (cold − mode) / (cold − floor), when the overhead is positive.
fn share(cold: Option<f64>, floor: Option<f64>, mode: Option<f64>) -> Option<f64> {
    match (cold, floor, mode) {
        (Some(c), Some(f), Some(m)) if c > f => Some((c - m) / (c - f)),
        _ => None,
    }
}

/// Whether the samples mix request kinds (see the module docs).
pub(crate) fn mixed_kinds(samples: &[Sample]) -> bool {
    samples
        .first()
        .is_some_and(|f| samples.iter().any(|s| s.kind != f.kind))
}

/// The share removed on per-round differences: `median_r(cold_r − mode_r) / median_r(cold_r −
/// floor_r)` over the rounds where cold-sweep, the floor and the mode were all measured.
fn paired_share(samples: &[Sample], floor: &str, mode: &str) -> Option<f64> {
    let (floors, modes) = (round_map(samples, floor), round_map(samples, mode));
    let mut d_mode = Vec::new();
    let mut d_floor = Vec::new();
    for c in samples.iter().filter(|s| s.mode == "cold-sweep") {
        if let (Some(f), Some(m)) = (floors.get(&c.round), modes.get(&c.round)) {
            d_mode.push(c.latency_us - m);
            d_floor.push(c.latency_us - f);
        }
    }
    match (median(d_mode), median(d_floor)) {
        (Some(m), Some(f)) if f > 0.0 => Some(m / f),
        _ => None,
    }
}

/// The p50s of one mode: total, wire (part of start), start stage, start after the wire,
/// serve stage.
struct Stages {
    total: Option<f64>,
    /// Response time less the wire stage.
    from_wire: Option<f64>,
    wire: Option<f64>,
    start: Option<f64>,
    after_wire: Option<f64>,
    serve: Option<f64>,
}

fn stages(samples: &[Sample], name: &str) -> Stages {
    let mine: Vec<&Sample> = samples.iter().filter(|s| s.mode == name).collect();
    let with_start: Vec<&&Sample> = mine
        .iter()
        .filter(|s| s.server_start_us.is_finite())
        .collect();
    let wired = || with_start.iter().filter(|s| s.wire_us.is_finite());
    Stages {
        total: median(mine.iter().map(|s| s.latency_us).collect()),
        wire: median(wired().map(|s| s.wire_us).collect()),
        from_wire: median(wired().map(|s| s.latency_us - s.wire_us).collect()),
        after_wire: median(
            wired()
                .map(|s| (s.server_start_us - s.wire_us).max(0.0))
                .collect(),
        ),
        start: median(
            with_start
                .iter()
                .map(|s| s.server_start_us.max(0.0))
                .collect(),
        ),
        serve: median(
            with_start
                .iter()
                .map(|s| s.latency_us - s.server_start_us.max(0.0))
                .collect(),
        ),
    }
}

/// The floor's name and stage p50s: hot when measured and verified ([`floor_check`]), else warm.
fn floor(samples: &[Sample]) -> (&'static str, Stages) {
    if floor_check(samples).is_some_and(|c| c.verified) {
        ("hot", stages(samples, "hot"))
    } else {
        ("warm", stages(samples, "warm"))
    }
}

pub(crate) fn decomposition(samples: &[Sample]) -> Option<Decomposition> {
    let (name, f) = floor(samples);
    let cold = stages(samples, "cold-sweep").total?;
    let control = stages(samples, "control").total;
    let f = f.total?;
    Some(Decomposition {
        floor: name,
        cold_overhead_us: cold - f,
        wakeup_us: control.map(|c| c - f),
        cache_us: control.map(|c| cold - c),
    })
}

pub(crate) fn table(modes: &[Mode], samples: &[Sample], ws: &preheat_model::WsStats) -> Vec<Row> {
    let (floor_name, fl) = floor(samples);
    let warm = stages(samples, "warm");
    let cold = stages(samples, "cold-sweep");
    let mixed = mixed_kinds(samples);
    modes
        .iter()
        .map(|m| {
            let name = m.name();
            let mine: Vec<&Sample> = samples.iter().filter(|s| s.mode == name).collect();
            let lat: Vec<f64> = mine.iter().map(|s| s.latency_us).collect();
            let latency = summarize(&lat);
            let st = stages(samples, &name);
            let baseline = matches!(m, Mode::Hot | Mode::Warm | Mode::ColdSweep);
            let pick = |x: Option<f64>| if baseline { None } else { x };
            let removed = pick(if mixed {
                paired_share(samples, floor_name, &name)
            } else {
                share(cold.total, fl.total, st.total)
            });
            let from_wire = pick(if mixed {
                None
            } else {
                share(cold.from_wire, fl.from_wire, st.from_wire)
            });
            let start_removed = pick(share(cold.start, fl.start, st.start));
            let serve_removed = pick(share(cold.serve, fl.serve, st.serve));
            let vs_warm = if matches!(m, Mode::Hot | Mode::Warm | Mode::ColdSweep) {
                None
            } else if mixed {
                paired_share(samples, "warm", &name)
            } else {
                share(cold.total, warm.total, st.total)
            };
            let flags = [
                ("removed", removed, floor_name),
                ("removed from the wire", from_wire, floor_name),
                ("start removed", start_removed, floor_name),
                ("serve removed", serve_removed, floor_name),
                ("removed vs warm", vs_warm, "warm"),
            ]
            .iter()
            .filter_map(|&(what, v, base)| {
                // Against warm, more than all of it is expected where a mode keeps the CPU
                // awake (warm's CPU slept through the lead): only a loss that large is flagged.
                let odd = |x: f64| {
                    if base == "warm" && what == "removed vs warm" {
                        x < -1.0
                    } else {
                        x.abs() > 1.0
                    }
                };
                v.filter(|&x| odd(x)).map(|x| {
                    format!(
                        "{what} {:.0}% is outside ±100%: the {base} floor or the cold baseline \
                         is not what it claims for this mode",
                        x * 100.0
                    )
                })
            })
            .collect();
            let mut row = Row {
                mode: name.clone(),
                latency,
                overhead_removed: removed,
                removed_vs_warm: vs_warm,
                removed_from_wire: from_wire,
                floor: floor_name,
                wire_us_p50: st.wire,
                start_us_p50: st.start,
                serve_us_p50: st.serve,
                start_removed,
                serve_removed,
                flags,
                ws_kib: None,
                runs: None,
                encoded_bytes: None,
                preheat_us_p50: None,
                gb_per_s: None,
                completed_share: None,
                worker_lead_us_p50: None,
                trigger_lead_us_p50: None,
                server_start_us_p50: None,
                server_start_us_p99: None,
                residual: None,
                syscall: SysRow::of(&mine),
            };
            if let Mode::Preheat(s) | Mode::Auto(s) = m {
                preheat_columns(&mut row, *s, samples, &mine, ws);
                row.residual = residual(&st, &fl);
            }
            row
        })
        .collect()
}

/// What mode `a` leaves above mode `b`, by stage: the same differences as a mode's residual
/// above its floor.
pub(crate) fn difference(samples: &[Sample], a: &str, b: &str) -> Option<Residual> {
    residual(&stages(samples, a), &stages(samples, b))
}

/// What `mode` leaves above the floor `fl`, by stage (`None` without both totals).
fn residual(mode: &Stages, fl: &Stages) -> Option<Residual> {
    let d = |a: Option<f64>, b: Option<f64>| a.zip(b).map(|(a, b)| a - b);
    let wire = d(mode.wire, fl.wire);
    Some(Residual {
        total_us: d(mode.total, fl.total)?,
        wire_us: wire,
        server_start_us: if wire.is_some() {
            d(mode.after_wire, fl.after_wire)
        } else {
            d(mode.start, fl.start)
        },
        serve_us: d(mode.serve, fl.serve),
    })
}

/// The columns of a preheating mode (`st`: its strategies) in `row`, from its samples `mine`:
/// harm flags, leads, the server's start, and with `lines` the working set and its preheating.
fn preheat_columns(
    row: &mut Row,
    st: Strategies,
    samples: &[Sample],
    mine: &[&Sample],
    ws: &preheat_model::WsStats,
) {
    row.flags.extend(harm_flags(
        samples,
        &row.mode,
        st.contains(Strategies::REPLAY),
    ));
    row.worker_lead_us_p50 = median(mine.iter().map(|s| s.worker_lead_us).collect());
    row.trigger_lead_us_p50 = median(mine.iter().map(|s| s.trigger_lead_us).collect());
    let starts: Vec<f64> = mine.iter().map(|s| s.server_start_us).collect();
    let start = summarize(&starts);
    if start.n > 0 {
        row.server_start_us_p50 = Some(start.p50);
        row.server_start_us_p99 = Some(start.p99);
    }
    if st.contains(Strategies::LINES) {
        row.ws_kib = Some(ws.kib);
        row.runs = Some(ws.runs);
        row.encoded_bytes = Some(ws.encoded_bytes);
        let with_lines: Vec<&&Sample> = mine.iter().filter(|s| s.lines_total > 0).collect();
        row.preheat_us_p50 = median(with_lines.iter().map(|s| s.preheat_us).collect());
        let gbps: Vec<f64> = with_lines
            .iter()
            .filter(|s| s.preheat_us > 0.0)
            .map(|s| (s.lines_done * 64) as f64 / (s.preheat_us * 1e3))
            .collect();
        row.gb_per_s = median(gbps);
        if !mine.is_empty() {
            row.completed_share = Some(
                with_lines
                    .iter()
                    .filter(|s| s.lines_done == s.lines_total)
                    .count() as f64
                    / mine.len() as f64,
            );
        }
    }
}

/// Round → latency of `mode` (a round measures each mode once; the first sample counts).
fn round_map(samples: &[Sample], mode: &str) -> std::collections::BTreeMap<usize, f64> {
    round_map_of(samples, mode, |s| s.latency_us)
}

/// Round → `field` of `mode`'s sample (the first of the round).
fn round_map_of(
    samples: &[Sample],
    mode: &str,
    field: fn(&Sample) -> f64,
) -> std::collections::BTreeMap<usize, f64> {
    let mut m = std::collections::BTreeMap::new();
    for s in samples.iter().filter(|s| s.mode == mode) {
        m.entry(s.round).or_insert(field(s));
    }
    m
}

/// `field` of `mode`'s samples, indexed by round (NaN where a round has none).
fn by_round_of(samples: &[Sample], mode: &str, field: fn(&Sample) -> f64) -> Vec<f64> {
    let rounds = samples.iter().map(|s| s.round + 1).max().unwrap_or(0);
    let m = round_map_of(samples, mode, field);
    (0..rounds)
        .map(|r| m.get(&r).copied().unwrap_or(f64::NAN))
        .collect()
}

/// The latencies of `mode`, indexed by round.
fn by_round(samples: &[Sample], mode: &str) -> Vec<f64> {
    by_round_of(samples, mode, |s| s.latency_us)
}

/// When the server thread started on `mode`'s request, indexed by round.
fn starts_by_round(samples: &[Sample], mode: &str) -> Vec<f64> {
    by_round_of(samples, mode, |s| s.server_start_us)
}

/// A preheat mode measured slower than announcing nothing (cold-sweep, per round: the judgement
/// `auto` chooses by), and a replay mode whose warm-up was still being served at the arrival
/// (the request's busy period began before it), said as flags.
fn harm_flags(samples: &[Sample], mode: &str, replays: bool) -> Vec<String> {
    use preheat_model::auto::{judge, Verdict};
    let mut flags = Vec::new();
    let (g, v) = judge(&by_round(samples, "cold-sweep"), &by_round(samples, mode));
    if v == Verdict::Hurts {
        flags.push(format!(
            "slower than announcing nothing: cold-sweep − this mode per round is {:.1} µs \
             median [{:.1}–{:.1}], {} rounds [measured]: this strategy hurts here",
            g.p50, g.p50_lo, g.p50_hi, g.n
        ));
    }
    if replays {
        let starts: Vec<f64> = samples
            .iter()
            .filter(|s| s.mode == mode && s.server_start_us.is_finite())
            .map(|s| s.server_start_us)
            .collect();
        let early = starts.iter().filter(|x| **x < 0.0).count();
        if early > 0 {
            flags.push(format!(
                "the warm-up was still being served when the request arrived in {early} of {} \
                 rounds [measured: the request's busy period began before its arrival]: the \
                 request waited behind it; a longer lead, or no replay, avoids that",
                starts.len()
            ));
        } else {
            // The warm-up's own busy period ended after the arrival: the request's started
            // later than with no warm-up at all.
            let cold = starts_by_round(samples, "cold-sweep");
            let (g, v) = judge(&cold, &starts_by_round(samples, mode));
            if v == Verdict::Hurts {
                flags.push(format!(
                    "the server thread started on the request {:.0} µs later than without \
                     preheating (cold-sweep − this mode's start per round {:.1} µs median \
                     [{:.1}–{:.1}], {} rounds [measured]): the warm-up still held the server at \
                     the arrival; a lead about that much longer would let it finish first",
                    -g.p50, g.p50, g.p50_lo, g.p50_hi, g.n
                ));
            }
        }
    }
    flags
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(mode: &str, round: usize, kind: &str, latency_us: f64) -> Sample {
        Sample::new(mode.into(), round, kind.into(), latency_us, 0.0)
    }

    /// Hot 2 µs below warm in every round: verified from enough rounds, never from a handful
    /// (one round once "verified" a floor from a single difference, its "CI" that difference).
    #[test]
    fn a_floor_is_verified_only_from_rounds_that_bracket_an_interval() {
        let rounds = |n: usize| -> Vec<Sample> {
            (0..n)
                .flat_map(|r| {
                    let j = r as f64 * 0.01;
                    [
                        sample("hot", r, "request", 10.0 + j),
                        sample("warm", r, "request", 12.0 + j),
                    ]
                })
                .collect()
        };
        for n in [1, 2, 5, 7] {
            let c = floor_check(&rounds(n)).unwrap();
            assert!(!c.verified && c.too_few_rounds, "{n} rounds: {c:?}");
            assert!(c.describe().contains("too few rounds"), "{}", c.describe());
        }
        let c = floor_check(&rounds(30)).unwrap();
        assert!(c.verified && !c.too_few_rounds, "{c:?}");
        // Enough rounds but hot not below warm: not verified, and not for too few rounds.
        let mut flat = rounds(30);
        for x in flat.iter_mut().filter(|x| x.mode == "warm") {
            x.latency_us -= 2.0;
        }
        let c = floor_check(&flat).unwrap();
        assert!(!c.verified && !c.too_few_rounds, "{c:?}");
        assert!(c.describe().contains("not shown faster"));
    }

    /// A mode that leaves 10 µs above hot, 8 of them in the client's own transmit (wire): the
    /// residual names the stages, and the share from the wire on sees the server's part.
    #[test]
    fn the_wire_splits_what_a_mode_leaves() {
        let mut s = Vec::new();
        // (mode, total, wire, server start) per sample; serve = total − start.
        let modes = [
            ("hot", 20.0, 2.0, 10.0),
            ("warm", 26.0, 2.0, 16.0),
            ("cold-sweep", 120.0, 20.0, 75.0),
            ("preheat:replay", 30.0, 10.0, 19.0),
        ];
        for r in 0..9 {
            for &(m, total, wire, start) in &modes {
                let mut x = sample(m, r, "request", total + r as f64 * 0.1);
                x.wire_us = wire;
                x.server_start_us = start;
                s.push(x);
            }
        }
        let ws = preheat_model::WorkingSet::default().stats();
        let rows = table(
            &[
                Mode::Hot,
                Mode::Warm,
                Mode::ColdSweep,
                Mode::Preheat(Strategies::REPLAY),
            ],
            &s,
            &ws,
        );
        let p = rows.iter().find(|r| r.mode == "preheat:replay").unwrap();
        let close = |a: Option<f64>, b: f64| (a.unwrap() - b).abs() < 1e-6;
        assert!(close(p.overhead_removed, 0.9), "{:?}", p.overhead_removed);
        // From the wire on: hot 18, cold 100, mode 20 → 80/82.
        assert!(
            close(p.removed_from_wire, 80.0 / 82.0),
            "{:?}",
            p.removed_from_wire
        );
        assert!(close(p.wire_us_p50, 10.0));
        let d = p.residual.as_ref().unwrap();
        assert!((d.total_us - 10.0).abs() < 1e-6);
        assert!(close(d.wire_us, 8.0));
        assert!(close(d.server_start_us, 1.0), "{d:?}");
        assert!(close(d.serve_us, 1.0), "{d:?}");
        // Baselines have neither.
        let hot = rows.iter().find(|r| r.mode == "hot").unwrap();
        assert!(hot.removed_from_wire.is_none() && hot.residual.is_none());
        // Without stamps: no wire, no share from it, start alone in the residual.
        for x in &mut s {
            x.wire_us = f64::NAN;
        }
        let rows = table(&[Mode::Hot, Mode::Preheat(Strategies::REPLAY)], &s, &ws);
        let p = rows.iter().find(|r| r.mode == "preheat:replay").unwrap();
        assert!(p.removed_from_wire.is_none() && p.wire_us_p50.is_none());
        let d = p.residual.as_ref().unwrap();
        assert!(
            d.wire_us.is_none() && close(d.server_start_us, 9.0),
            "{d:?}"
        );
    }

    /// Five rounds of a cheap kind, four of a costly one (1 ms dearer); within every round but
    /// one the mode removes exactly half the cold overhead, and one cheap round of the mode is an
    /// outlier. The mode's p50 then jumps into the costly cluster (a share far below −100%),
    /// while the paired share still sees the half.
    #[test]
    fn mixed_kinds_are_compared_within_rounds() {
        let mut s = Vec::new();
        for r in 0..9 {
            let (kind, base) = if r < 5 {
                ("cheap", 100.0)
            } else {
                ("costly", 1100.0)
            };
            s.push(sample("hot", r, kind, base));
            s.push(sample("cold-sweep", r, kind, base + 400.0));
            let outlier = if r == 0 { 5000.0 } else { 0.0 };
            s.push(sample("preheat:wake", r, kind, base + 200.0 + outlier));
        }
        let p50 = |m: &str| stages(&s, m).total;
        let naive = share(p50("cold-sweep"), p50("hot"), p50("preheat:wake")).unwrap();
        assert!(
            naive < -1.0,
            "the p50 share was meant to be misled here: {naive}"
        );
        assert!(mixed_kinds(&s));
        let share = paired_share(&s, "hot", "preheat:wake").unwrap();
        assert!((share - 0.5).abs() < 1e-9, "{share}");
        // One kind only: not mixed.
        let one: Vec<Sample> = s.iter().filter(|x| x.kind == "cheap").cloned().collect();
        assert!(!mixed_kinds(&one));
        assert!(!mixed_kinds(&[]));
    }

    /// A replay mode slower than cold-sweep in every round, whose warm-up was still being served
    /// at the arrival in 3 rounds, gets both flags; a faster one gets neither.
    #[test]
    fn strategies_that_hurt_are_flagged() {
        let mut s = Vec::new();
        for r in 0..12 {
            let jitter = (r % 3) as f64;
            s.push(sample("cold-sweep", r, "request", 200.0 + jitter));
            let mut slow = sample("preheat:replay", r, "request", 260.0 - jitter);
            slow.server_start_us = if r < 3 { -20.0 } else { 30.0 };
            s.push(slow);
            let mut fast = sample("preheat:wake", r, "request", 120.0 + jitter);
            fast.server_start_us = 10.0;
            s.push(fast);
        }
        let f = harm_flags(&s, "preheat:replay", true);
        assert_eq!(f.len(), 2, "{f:?}");
        assert!(f[0].contains("this strategy hurts here"), "{}", f[0]);
        assert!(f[1].contains("in 3 of 12 rounds"), "{}", f[1]);
        assert!(harm_flags(&s, "preheat:wake", true).is_empty());
    }

    /// A warm-up that takes longer than the lead (Node.js at 200 µs: the request started ~400
    /// µs after its arrival, against ~45 µs cold) is said, with how much longer a lead needs.
    #[test]
    fn a_warm_up_longer_than_the_lead_is_said() {
        let mut s = Vec::new();
        for r in 0..12 {
            let jitter = (r % 3) as f64;
            let mut cold = sample("cold-sweep", r, "request", 460.0 + jitter);
            cold.server_start_us = 45.0 + jitter;
            s.push(cold);
            let mut slow = sample("preheat:replay", r, "request", 470.0 - jitter);
            slow.server_start_us = 400.0 - jitter;
            s.push(slow);
            let mut lines = sample("preheat:lines", r, "request", 380.0 + jitter);
            lines.server_start_us = 30.0;
            s.push(lines);
        }
        let f = harm_flags(&s, "preheat:replay", true);
        assert_eq!(f.len(), 2, "{f:?}");
        assert!(
            f[1].contains("started on the request 353 µs later"),
            "{}",
            f[1]
        );
        assert!(f[1].contains("a lead about that much longer"), "{}", f[1]);
        assert!(harm_flags(&s, "preheat:lines", false).is_empty());
    }
}
