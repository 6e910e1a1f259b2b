//! The demo's table: response-time rows, the share of the cold overhead each mode removes, and
//! the split of that overhead by stage.
//!
//! * **Floor.** Shares are against the hot floor (`hot`: caches warm, every CPU kept awake) when
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

use preheat_model::proto::Strategies;
use serde::Serialize;

use super::{Mode, Output, Sample};
use preheat_model::stats::{summarize, Summary};

#[derive(Debug, Clone, Serialize)]
pub(super) struct Row {
    pub mode: String,
    pub latency: Summary,
    /// Share of the cold-sweep p50 overhead removed, against the floor (`floor`).
    pub overhead_removed: Option<f64>,
    /// The same share against warm (the paper's baseline), beside it.
    pub removed_vs_warm: Option<f64>,
    /// The floor of `overhead_removed`: "hot" or "warm" (no hot floor measured).
    pub floor: &'static str,
    /// Stage p50s, µs: send → server thread runs, and server thread runs → reply read.
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
}

/// The cold overhead and its split by cause, µs (p50 differences).
#[derive(Debug, Clone, Serialize)]
pub(super) struct Decomposition {
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
    let s = summarize(&v);
    (s.n > 0).then_some(s.p50)
}

/// Whether the hot floor is one in this run: warm − hot per round (the rounds that measured
/// both), its median with the 95% CI. Verified when the CI lies above 0.
#[derive(Debug, Clone, Serialize)]
pub(super) struct FloorCheck {
    pub verified: bool,
    pub warm_minus_hot_us_p50: f64,
    pub ci_us: [f64; 2],
    pub rounds: usize,
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
            } else {
                ": hot is not shown faster than warm here, so shares are against warm"
            }
        )
    }
}

/// The floor check of `samples` (`None` without hot or warm samples in a common round).
pub(super) fn floor_check(samples: &[Sample]) -> Option<FloorCheck> {
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
    (s.n > 0).then_some(FloorCheck {
        verified: s.p50_lo > 0.0,
        warm_minus_hot_us_p50: s.p50,
        ci_us: [s.p50_lo, s.p50_hi],
        rounds: s.n,
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
pub(super) fn mixed_kinds(samples: &[Sample]) -> bool {
    samples
        .first()
        .is_some_and(|f| samples.iter().any(|s| s.kind != f.kind))
}

/// The share removed on per-round differences: `median_r(cold_r − mode_r) / median_r(cold_r −
/// floor_r)` over the rounds where cold-sweep, the floor and the mode were all measured.
fn paired_share(samples: &[Sample], floor: &str, mode: &str) -> Option<f64> {
    // round → latency of one mode (a round measures each mode once; the first sample counts).
    let by_round = |name: &str| {
        let mut m = std::collections::BTreeMap::new();
        for s in samples.iter().filter(|s| s.mode == name) {
            m.entry(s.round).or_insert(s.latency_us);
        }
        m
    };
    let (floors, modes) = (by_round(floor), by_round(mode));
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

/// The p50s of one mode: total, start stage, serve stage.
struct Stages {
    total: Option<f64>,
    start: Option<f64>,
    serve: Option<f64>,
}

fn stages(samples: &[Sample], name: &str) -> Stages {
    let mine: Vec<&Sample> = samples.iter().filter(|s| s.mode == name).collect();
    let with_start: Vec<&&Sample> = mine
        .iter()
        .filter(|s| s.server_start_us.is_finite())
        .collect();
    Stages {
        total: median(mine.iter().map(|s| s.latency_us).collect()),
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

pub(super) fn decomposition(samples: &[Sample]) -> Option<Decomposition> {
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

pub(super) fn table(modes: &[Mode], samples: &[Sample], ws: &preheat_model::WsStats) -> Vec<Row> {
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
                ("start removed", start_removed, floor_name),
                ("serve removed", serve_removed, floor_name),
                ("removed vs warm", vs_warm, "warm"),
            ]
            .iter()
            .filter_map(|&(what, v, base)| {
                v.filter(|x| x.abs() > 1.0).map(|x| {
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
                floor: floor_name,
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
            };
            if let Mode::Preheat(st) | Mode::Auto(st) = m {
                row.flags
                    .extend(harm_flags(samples, &name, st.contains(Strategies::REPLAY)));
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
                    let with_lines: Vec<&&Sample> =
                        mine.iter().filter(|s| s.lines_total > 0).collect();
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
            row
        })
        .collect()
}

/// The latencies of `mode`, indexed by round (NaN where a round has none).
fn by_round(samples: &[Sample], mode: &str) -> Vec<f64> {
    let rounds = samples.iter().map(|s| s.round + 1).max().unwrap_or(0);
    let mut v = vec![f64::NAN; rounds];
    for s in samples.iter().filter(|s| s.mode == mode) {
        v[s.round] = s.latency_us;
    }
    v
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
        }
    }
    flags
}

fn opt(v: Option<f64>, prec: usize) -> String {
    v.map(|x| format!("{x:.prec$}"))
        .unwrap_or_else(|| "-".into())
}

fn pct(v: Option<f64>) -> String {
    v.map(|x| format!("{:.0}%", x * 100.0))
        .unwrap_or_else(|| "-".into())
}

pub(super) fn print_table(o: &Output, ws: &preheat_model::WsStats) {
    println!();
    println!(
        "{} — response time, µs [measured on this machine: {}; server CPU {}, client CPU {}; {} rounds; lead {} µs]",
        o.server, o.machine, o.server_cpu, o.client_cpu, o.rounds, o.lead_us
    );
    if let Some(r) = &o.record {
        println!(
            "working set [measured, probe backend, keep >= k of {} samples]: {:.1} KiB, {} lines, {} runs, {} encoded bytes (raw {} B at 4 B/line); {} requests in {:.1} s",
            r.samples, ws.kib, ws.lines, ws.runs, ws.encoded_bytes, ws.raw_bytes, r.requests_sent, r.seconds
        );
    }
    let floor = o.rows.first().map_or("warm", |r| r.floor);
    println!(
        "{:<26} {:>4} {:>20} {:>7} {:>7} {:>8} {:>8} {:>7} {:>7} {:>8} {:>8}",
        "mode",
        "n",
        "p50 (95% CI)",
        "p99",
        "mean",
        "removed",
        "vs warm",
        "start",
        "serve",
        "start rm",
        "serve rm"
    );
    for r in &o.rows {
        let l = &r.latency;
        println!(
            "{:<26} {:>4} {:>20} {:>7.1} {:>7.1} {:>8} {:>8} {:>7} {:>7} {:>8} {:>8}",
            r.mode,
            l.n,
            format!("{:.1} ({:.1}–{:.1})", l.p50, l.p50_lo, l.p50_hi),
            l.p99,
            l.mean,
            pct(r.overhead_removed),
            pct(r.removed_vs_warm),
            opt(r.start_us_p50, 1),
            opt(r.serve_us_p50, 1),
            pct(r.start_removed),
            pct(r.serve_removed),
        );
    }
    println!();
    println!(
        "{:<26} {:>7} {:>5} {:>6} {:>8} {:>6} {:>6} {:>9} {:>12}",
        "preheat mode",
        "WS KiB",
        "runs",
        "enc B",
        "preheat",
        "GB/s",
        "done",
        "lead t/w",
        "server start"
    );
    for r in o.rows.iter().filter(|r| r.mode.starts_with("preheat:")) {
        println!(
            "{:<26} {:>7} {:>5} {:>6} {:>8} {:>6} {:>6} {:>9} {:>12}",
            r.mode,
            opt(r.ws_kib, 1),
            r.runs.map(|x| x.to_string()).unwrap_or_else(|| "-".into()),
            r.encoded_bytes
                .map(|x| x.to_string())
                .unwrap_or_else(|| "-".into()),
            opt(r.preheat_us_p50, 1),
            opt(r.gb_per_s, 2),
            pct(r.completed_share),
            match (r.trigger_lead_us_p50, r.worker_lead_us_p50) {
                (Some(t), Some(w)) => format!("{t:.0}/{w:.0}"),
                _ => "-".into(),
            },
            match (r.server_start_us_p50, r.server_start_us_p99) {
                (Some(a), Some(b)) => format!("{a:.0}/{b:.0}"),
                _ => "-".into(),
            },
        );
    }
    println!();
    for r in &o.rows {
        for f in &r.flags {
            println!("FLAG {}: {f}", r.mode);
        }
    }
    for s in &o.skipped {
        println!("{:<26} n/a: {}", s.mode, s.reason);
    }
    if let Some(d) = &o.decomposition {
        println!(
            "cold overhead (cold-sweep − {}) {:.1} µs = wake-up (control − {}) {} + cache and kernel-path loss (cold-sweep − control) {} [p50 differences, measured]",
            d.floor,
            d.cold_overhead_us,
            d.floor,
            d.wakeup_us.map_or("-".into(), |x| format!("{x:.1} µs")),
            d.cache_us.map_or("-".into(), |x| format!("{x:.1} µs")),
        );
    }
    if let Some(h) = &o.hot_floor {
        println!("hot = warm caches, {h}.");
    }
    if let Some(c) = &o.floor_check {
        println!("{}.", c.describe());
    }
    println!("wake ran as {}.", o.wake_mechanism);
    if let Some(c) = &o.auto {
        println!(
            "auto announced {} [chosen from a pilot measured before the table, not from its rows]: {}.",
            c.chosen, c.why
        );
        for cand in &c.candidates {
            println!("  pilot [measured] {}", cand.describe());
        }
    }
    println!(
        "CPI: {}",
        if o.pmu {
            "a PMU exists, but CPI measurement is not implemented yet (n/a)"
        } else {
            "n/a (no hardware PMU on this machine: cycles and instructions cannot be counted)"
        }
    );
    if mixed_kinds(&o.samples) {
        println!("removed = median over rounds of (cold-sweep − mode) / median over rounds of (cold-sweep − {floor}): the request kinds differ between rounds (every mode of a round runs the same kind), so p50s of different modes would compare different mixes; vs warm = the same against warm (the paper's baseline);");
    } else {
        println!("removed = (cold-sweep p50 − mode p50) / (cold-sweep p50 − {floor} p50); vs warm = the same against warm (the paper's baseline);");
    }
    println!("start = send (announced modes: the announced arrival) → the server thread runs with the request; serve = from then until the client has the reply;");
    println!("start rm / serve rm = each stage's share removed, computed like removed on that stage's p50s. preheat = agent-reported time to issue the lines (p50);");
    println!("lead t/w = announced arrival − when the agent's trigger thread got the announcement / when its worker started on the server CPU (p50); server start p50/p99.");
    println!("paper (Table 1, Odroid-XU3 ARM, not this machine): memcached warm 178.8 / cold 238.8 / preheated 188.5 µs, 142.3 KiB, preheat 53.0 µs (84% removed);");
    println!("  nginx 367.6 / 498.0 / 388.5 µs, 235.8 KiB, 77.4 µs (84% removed).");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(mode: &str, round: usize, kind: &str, latency_us: f64) -> Sample {
        Sample::new(mode.into(), round, kind.into(), latency_us, 0.0)
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
}
