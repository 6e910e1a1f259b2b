//! The demo's table as text: the response-time rows, the preheat modes' details, the flags and
//! skipped modes, the decomposition, the floor and the notes on what every column means.

use std::fmt::Write;

use preheat_model::stats::brackets_median;
use preheat_wake::predictor::PredictorResult;

use crate::output::Output;
use crate::table::mixed_kinds;

fn opt(v: Option<f64>, prec: usize) -> String {
    v.map(|x| format!("{x:.prec$}"))
        .unwrap_or_else(|| "-".into())
}

fn pct(v: Option<f64>) -> String {
    v.map(|x| format!("{:.0}%", x * 100.0))
        .unwrap_or_else(|| "-".into())
}

/// The text `preheat demo` prints for `o` (without `--json`), each line ending in a newline.
pub fn render(o: &Output) -> String {
    let mut out = String::new();
    // One line of the text (`w!()`: an empty one); writing to a String cannot fail.
    macro_rules! w {
        () => {
            out.push('\n')
        };
        ($($t:tt)*) => {{
            let _ = writeln!(out, $($t)*);
        }};
    }
    w!();
    w!(
        "{} — response time, µs [measured on this machine: {}; server CPU {}, client CPU {}; {} rounds; lead {} µs; over {}]",
        o.server, o.machine, o.server_cpu, o.client_cpu, o.rounds, o.lead_us, o.transport
    );
    if let Some(s) = &o.steer_rx {
        w!("{}", s.describe());
    }
    for line in record_lines(o) {
        w!("{line}");
    }
    let floor = o.rows.first().map_or("warm", |r| r.floor);
    w!(
        "{:<26} {:>4} {:>20} {:>7} {:>7} {:>8} {:>8} {:>6} {:>6} {:>7} {:>7} {:>8} {:>8}",
        "mode",
        "n",
        "p50 (95% CI)",
        "p99",
        "mean",
        "removed",
        "vs warm",
        "@wire",
        "wire",
        "start",
        "serve",
        "start rm",
        "serve rm"
    );
    for r in &o.rows {
        let l = &r.latency;
        w!(
            "{:<26} {:>4} {:>20} {:>7.1} {:>7.1} {:>8} {:>8} {:>6} {:>6} {:>7} {:>7} {:>8} {:>8}",
            r.mode,
            l.n,
            p50_cell(l),
            l.p99,
            l.mean,
            pct(r.overhead_removed),
            pct(r.removed_vs_warm),
            pct(r.removed_from_wire),
            opt(r.wire_us_p50, 1),
            opt(r.start_us_p50, 1),
            opt(r.serve_us_p50, 1),
            pct(r.start_removed),
            pct(r.serve_removed),
        );
    }
    w!();
    for line in preheat_lines(o) {
        w!("{line}");
    }
    w!();
    for r in &o.rows {
        for f in &r.flags {
            w!("FLAG {}: {f}", r.mode);
        }
    }
    for s in &o.skipped {
        w!("{:<26} n/a: {}", s.mode, s.reason);
    }
    for line in overhead_lines(o) {
        w!("{line}");
    }
    if let Some(h) = &o.hot_floor {
        w!("hot = warm caches, {h}.");
    }
    if let Some(c) = &o.floor_check {
        w!("{}.", c.describe());
    }
    w!("wake ran as {}.", o.wake_mechanism);
    for line in prefork_notes(o) {
        w!("{line}");
    }
    for line in auto_notes(o) {
        w!("{line}");
    }
    w!(
        "CPI: {}",
        if o.pmu {
            "a PMU exists, but CPI measurement is not implemented yet (n/a)"
        } else {
            "n/a (no hardware PMU on this machine: cycles and instructions cannot be counted)"
        }
    );
    for line in legend(o, floor) {
        w!("{line}");
    }
    out
}

/// A row's "p50 (95% CI)" cell; `*` where its rounds are too few for that interval (the legend
/// says what the range is then).
fn p50_cell(l: &preheat_model::stats::Summary) -> String {
    let mark = if brackets_median(l.n) { "" } else { "*" };
    format!("{:.1} ({:.1}–{:.1}){mark}", l.p50, l.p50_lo, l.p50_hi)
}

/// The recording's line and what its probe had to redo.
fn record_lines(o: &Output) -> Vec<String> {
    let mut out = String::new();
    let ws = &o.ws;
    macro_rules! w {
        ($($t:tt)*) => {{
            let _ = writeln!(out, $($t)*);
        }};
    }
    if let Some(why) = &o.outside {
        w!("agent outside the server: {why}");
    }
    if let Some(r) = &o.record {
        w!(
            "working set [measured, probe backend, keep >= k of {} samples]: {:.1} KiB, {} lines, {} runs, {} encoded bytes (raw {} B at 4 B/line); {} requests in {:.1} s",
            r.samples, ws.kib, ws.lines, ws.runs, ws.encoded_bytes, ws.raw_bytes, r.requests_sent, r.seconds
        );
        for note in r.redo_notes() {
            w!("  {note}");
        }
        if let Some(note) = r
            .chance_note()
            .filter(|n| n.starts_with("WARNING") || r.enriched.is_some())
        {
            w!("  [modeled] {note}");
        }
    }
    out.lines().map(String::from).collect()
}

/// The preheat modes' table: working set, preheat time and rate, completion, leads, the
/// server's start.
fn preheat_lines(o: &Output) -> Vec<String> {
    let mut v = Vec::new();
    v.push(format!(
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
    ));
    for r in o.rows.iter().filter(|r| r.mode.starts_with("preheat:")) {
        v.push(format!(
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
        ));
    }
    v
}

/// What the demo did for a server with several worker processes: whom it announced to, and
/// where `replay` warmed up (agent counters).
fn prefork_notes(o: &Output) -> Vec<String> {
    let mut out = Vec::new();
    if o.serving_pids.len() > 1 {
        out.push(format!(
            "announced to {} processes (pids {:?}): the server hands each request to any of its workers, so every worker that served one is preheated.",
            o.serving_pids.len(),
            o.serving_pids
        ));
    }
    if !o.joined_pids.is_empty() {
        out.push(format!(
            "{} of them (pids {:?}) joined during the measurement: each served one measured request before it was announced to (flagged in its mode's row).",
            o.joined_pids.len(),
            o.joined_pids
        ));
    }
    let c = &o.agent_counters;
    if c.replays_fresh > 0 {
        out.push(format!(
            "replay sent {} of {} warm-ups on a fresh connection each, served by whichever of the server's workers accepted it (the serving worker is busy with the client's connection, or the server closes its connections): they warm what the workers share — code, data from before the fork, the kernel's paths — not the serving worker's own data [agent counters].",
            c.replays_fresh,
            c.replays
        ));
    }
    out
}

/// What `auto` announced and why, with its pilot's candidates.
fn auto_notes(o: &Output) -> Vec<String> {
    let Some(c) = &o.auto else {
        return Vec::new();
    };
    let mut out = vec![format!(
        "auto announced {} [chosen from a pilot measured before the table, not from its rows]: {}.",
        c.chosen, c.why
    )];
    for cand in &c.candidates {
        out.push(format!("  pilot [measured] {}", cand.describe()));
    }
    out
}

/// The cold overhead by cause, what the best preheat mode leaves above the floor by stage, and
/// (`--syscall-stages`) the split at the server's system calls.
fn overhead_lines(o: &Output) -> Vec<String> {
    let mut v = Vec::new();
    if let Some(d) = &o.decomposition {
        v.push(format!(
            "cold overhead (cold-sweep − {}) {:.1} µs = wake-up (control − {}) {} + cache and kernel-path loss (cold-sweep − control) {} [p50 differences, measured]",
            d.floor,
            d.cold_overhead_us,
            d.floor,
            d.wakeup_us.map_or("-".into(), |x| format!("{x:.1} µs")),
            d.cache_us.map_or("-".into(), |x| format!("{x:.1} µs")),
        ));
    }
    v.extend(predictor_line(&o.predictor));
    v.extend(residual_line(o));
    if let Some(c) = &o.connection_state {
        let floor = explained_row(o).map_or("hot", |r| r.floor);
        v.push(crate::connection::line(c, floor));
    }
    v.extend(syscall_lines(o));
    v
}

/// What this run measured of the server CPU's branch prediction through an idle: a statement
/// about the machine only where the run measured the loss.
fn predictor_line(p: &Result<PredictorResult, String>) -> Option<String> {
    let p = p.as_ref().ok().filter(|p| p.lost())?;
    Some(format!(
        "this machine: {}; part of the wake-up above may be that",
        p.describe()
    ))
}

/// The preheat mode whose residual the output explains: `auto` where it ran, else the one
/// that removed most.
fn explained_row(o: &Output) -> Option<&crate::table::Row> {
    let rows = || o.rows.iter().filter(|r| r.residual.is_some());
    rows().find(|r| r.mode == "preheat:auto").or_else(|| {
        rows().max_by(|a, b| {
            let k = |r: &crate::table::Row| r.overhead_removed.unwrap_or(f64::MIN);
            k(a).total_cmp(&k(b))
        })
    })
}

/// `--syscall-stages`: every mode's split at the server's system calls, and what the mode of
/// [`residual_line`] leaves above the floor in each part.
fn syscall_lines(o: &Output) -> Vec<String> {
    let mut v = Vec::new();
    match &o.syscall_stages {
        None => return v,
        Some(Err(why)) => {
            v.push(format!("syscall stages: n/a ({why})"));
            return v;
        }
        Some(Ok(what)) => v.push(format!(
            "syscall stages, µs p50 [measured with {what}]: to event = send → the server thread's wait returned with it (0 where it was busy); to read = send → its read of the request returned; compute = → its reply's write entered (its own work); reply = → the client has the reply"
        )),
    }
    v.push(format!(
        "  {:<26} {:>4} {:>9} {:>9} {:>9} {:>9}",
        "mode", "n", "to event", "to read", "compute", "reply"
    ));
    for r in &o.rows {
        if let Some(s) = &r.syscall {
            v.push(format!(
                "  {:<26} {:>4} {:>9.1} {:>9.1} {:>9.1} {:>9.1}",
                r.mode, s.n, s.to_event_us, s.to_read_us, s.compute_us, s.reply_us
            ));
        }
    }
    let best = explained_row(o);
    let floor = best.and_then(|b| o.rows.iter().find(|r| r.mode == b.floor));
    if let Some((b, f)) = best.zip(floor) {
        if let Some((bs, fs)) = b.syscall.as_ref().zip(f.syscall.as_ref()) {
            v.push(format!(
                "  left above the {} floor by {} at the server's system calls: to event {:+.1} µs, to read {:+.1} µs, compute {:+.1} µs, reply {:+.1} µs [p50 differences]",
                b.floor,
                b.mode,
                bs.to_event_us - fs.to_event_us,
                bs.to_read_us - fs.to_read_us,
                bs.compute_us - fs.compute_us,
                bs.reply_us - fs.reply_us
            ));
        }
    }
    v
}

/// Where the remaining gap of the preheat mode that removed most (auto where it ran) lies,
/// stage by stage.
fn residual_line(o: &Output) -> Option<String> {
    let r = explained_row(o)?;
    let d = r.residual.as_ref()?;
    let us = |x: Option<f64>| x.map_or("-".to_string(), |x| format!("{x:+.1} µs"));
    Some(match d.wire_us {
        Some(_) => format!(
            "left above the {} floor by {}: {:+.1} µs = wire (the client's own transmit) {} + start after the wire (the server's side) {} + serve {} [p50 differences, measured]",
            r.floor, r.mode, d.total_us, us(d.wire_us), us(d.server_start_us), us(d.serve_us)
        ),
        None => format!(
            "left above the {} floor by {}: {:+.1} µs = start {} + serve {} [p50 differences, measured; no transmit stamps from this client's socket]",
            r.floor, r.mode, d.total_us, us(d.server_start_us), us(d.serve_us)
        ),
    })
}

/// What every column and share of the table means (the lines after it).
fn legend(o: &Output, floor: &str) -> Vec<String> {
    let mut v = Vec::new();
    if mixed_kinds(&o.samples) {
        v.push(format!("removed = median over rounds of (cold-sweep − mode) / median over rounds of (cold-sweep − {floor}): the request kinds differ between rounds (every mode of a round runs the same kind), so p50s of different modes would compare different mixes; vs warm = the same against warm (caches warm, CPUs not kept awake: above 100% where a mode also removed the wake-up);"));
    } else {
        v.push(format!("removed = (cold-sweep p50 − mode p50) / (cold-sweep p50 − {floor} p50); vs warm = the same against warm (caches warm, CPUs not kept awake: above 100% where a mode also removed the wake-up);"));
    }
    v.push(format!("every mode's client waits the lead ({lead} µs) after the mode's cold-making step, then sends (announced modes: announced that far ahead): the client does the same in every row; through the cold-making step's waits it pings itself over the loopback every {every} µs ({pings} pings in this run), so its own network path is as warm as after the priming request that precedes hot and warm (without, it cooled on this machine kind while it waited: see wire);", lead = o.lead_us, every = crate::warmth::EVERY_NS / 1000, pings = o.client_pings));
    v.push("start = send (announced modes: the announced arrival) → the server thread runs with the request; serve = from then until the client has the reply;".into());
    v.push("wire = send → the request leaves the client's transmit path (the kernel's software transmit stamp at the network device), part of start: the client's own path (its CPU never sleeps, it never runs on the server's CPU, and it stays warm through the waits), which a cold-making step on the server's CPU can still cool where the CPUs share caches; @wire = removed, computed on each response time less its wire (from the request on the wire on: the paper's measure, its client on another machine);".into());
    if o.connection_state.is_some() {
        v.push(format!("{} = a diagnostic row (--connection-row), not a strategy: after the cold-making step the client sends one request on the measured connection, then waits the lead and announces what auto chose; auto − {} is what the state of the connection the request comes on costs, which a warm-up on a connection of its own does not reach;", crate::mode::CONN_PRIMED, crate::mode::CONN_PRIMED));
    }
    if o.rows.iter().any(|r| !brackets_median(r.latency.n)) {
        v.push("* = fewer than 8 rounds: the interval shown is the smallest and largest value, not a 95% confidence interval;".into());
    }
    v.push("start rm / serve rm = each stage's share removed, computed like removed on that stage's p50s. preheat = agent-reported time to issue the lines (p50);".into());
    v.push("lead t/w = announced arrival − when the agent's trigger thread got the announcement / when its worker started on the server CPU (p50); server start p50/p99.".into());
    v.push("paper (Table 1, Odroid-XU3 ARM, not this machine): memcached warm 178.8 / cold 238.8 / preheated 188.5 µs, 142.3 KiB, preheat 53.0 µs (84% removed);".into());
    v.push("  nginx 367.6 / 498.0 / 388.5 µs, 235.8 KiB, 77.4 µs (84% removed).".into());
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use preheat_wake::predictor::P50;

    #[test]
    fn an_interval_of_too_few_rounds_is_marked() {
        use preheat_model::stats::summarize;
        let few = summarize(&[10.0, 11.0, 12.0]);
        assert_eq!(p50_cell(&few), "11.0 (10.0–12.0)*");
        let v: Vec<f64> = (0..30).map(|i| 10.0 + i as f64 * 0.1).collect();
        assert!(!p50_cell(&summarize(&v)).ends_with('*'));
    }

    #[test]
    fn the_machine_sentence_only_where_the_run_measured_the_loss() {
        let p = |x: f64| P50 {
            p50_us: x,
            ci_us: [x - 0.1, x + 0.1],
        };
        let mut r = PredictorResult {
            sites: 4096,
            gap_us: 200,
            cpu: 1,
            n: 41,
            hot: p(11.0),
            after_spin: p(11.5),
            after_sleep: p(19.0),
        };
        let line = predictor_line(&Ok(r.clone())).expect("lost: said");
        assert!(
            line.starts_with("this machine: branch prediction lost"),
            "{line}"
        );
        assert!(
            line.contains("measured on CPU 1") && line.contains("n=41"),
            "{line}"
        );
        r.after_sleep = p(11.2);
        assert_eq!(predictor_line(&Ok(r)), None);
        assert_eq!(predictor_line(&Err("no CPU".into())), None);
    }
}
