//! The report as text (`preheat observe` prints it).

use std::fmt::Write;

use crate::periods::Kind;
use crate::report::Report;

macro_rules! outln {
    ($out:expr, $($arg:tt)*) => {
        // Writing to a String cannot fail.
        let _ = writeln!($out, $($arg)*);
    };
}

/// The report as text: a header, counts, one line per thread and, with `periods`, one per busy
/// period.
pub fn text(r: &Report, periods: bool) -> String {
    let mut out = String::new();
    outln!(
        out,
        "busy periods of process {} on port {} [measured, from outside: {}; {:.2} s, {} threads attached]",
        r.pid,
        r.port,
        r.mechanism_detail,
        (r.end_ns - r.start_ns) as f64 / 1e9,
        r.threads_attached
    );
    notes(&mut out, r);
    if r.tracefs_mounted_now {
        outln!(
            out,
            "  (tracefs was not mounted: mounted it privately to read the tracepoints' ids, then unmounted it)"
        );
    }
    outln!(
        out,
        "  {} events (calls, or the scheduler form's periods) in {} records, {} lost records, {} calls written alone (slot held), {} candidate periods without the port, {} open at the end",
        r.counts.events, r.records, r.lost_samples, r.written_alone, r.counts.unattributed, r.counts.open_at_end
    );
    if let Some(s) = &r.sampled {
        outln!(
            out,
            "  sampled under load: the programs were away {:.0}% of the time ({} times, each time the server made more than {} periods a second): the periods of those times are not here",
            s.detached_share * 100.0,
            s.pauses,
            s.above_per_s
        );
    }
    if r.threads.is_empty() {
        outln!(out, "  no busy period on the port (no request arrived?)");
    }
    outln!(
        out,
        "  {:>8} {:<16} {:>7} {:>6} {:>8} {:>8} {:>6} {:>6} {:>10} {:>10} {:>10}  hand-offs from",
        "tid",
        "thread",
        "periods",
        "read",
        "requests",
        "hand-off",
        "reply",
        "accept",
        "p50 µs",
        "p99 µs",
        "max µs"
    );
    for t in &r.threads {
        let from: Vec<String> = t.hand_off_from.iter().map(u32::to_string).collect();
        outln!(
            out,
            "  {:>8} {:<16} {:>7} {:>6} {:>8} {:>8} {:>6} {:>6} {:>10.1} {:>10.1} {:>10.1}  {}",
            t.tid,
            if t.comm.is_empty() {
                "(exited)"
            } else {
                &t.comm
            },
            t.periods,
            t.read,
            t.requests,
            t.hand_off,
            t.reply,
            t.accept,
            t.duration_us.p50,
            t.duration_us.p99,
            t.duration_us.max,
            if from.is_empty() {
                "-".into()
            } else {
                from.join(",")
            }
        );
    }
    if periods {
        outln!(out, "  {:>8} {:>14} {:>10}  kind", "tid", "start (s)", "µs");
        for p in &r.periods {
            let kind = match p.kind {
                Kind::Read => "read".to_string(),
                Kind::HandOff { from } => format!("hand-off from {from}"),
                Kind::Reply => "reply".into(),
                Kind::Accept => "accept".into(),
            };
            outln!(
                out,
                "  {:>8} {:>14.6} {:>10.1}  {kind}",
                p.tid,
                p.start_ns.saturating_sub(r.start_ns) as f64 / 1e9,
                (p.end_ns - p.start_ns) as f64 / 1e3
            );
        }
    }
    out
}

/// What ran instead of the default, or how the default records: one line each.
fn notes(out: &mut String, r: &Report) {
    if let Some(why) = &r.fallback {
        outln!(
            out,
            "  (the eBPF observer did not load, so perf samples ran: {why})"
        );
    }
    if r.mechanism == crate::Mechanism::Bpf && r.fallback.is_none() {
        let programs = crate::report::programs(
            r.syscalls.as_deref(),
            r.untyped.as_deref(),
            r.per_call.as_deref(),
        );
        outln!(out, "  (programs {programs}; --per-call times each call)");
    }
}
