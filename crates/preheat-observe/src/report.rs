//! The report of one observation: what ran, what was seen, the busy periods and their
//! per-thread summaries.

use std::collections::BTreeMap;

use preheat_model::stats::{summarize, Summary};
use serde::Serialize;

use crate::mechanism::Mechanism;
use crate::periods::{Kind, Period, StreamCounts};
use crate::sampling::Sampled;

/// The report of one observation (the JSON of `preheat observe --json`).
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub label: &'static str,
    pub mechanism: Mechanism,
    pub mechanism_detail: &'static str,
    /// Why the eBPF observer did not load, where it was asked for (the mechanism above ran).
    pub fallback: Option<String>,
    /// Why its programs are not BTF-typed, where they run and are not.
    pub untyped: Option<String>,
    /// Why its programs write a record per call instead of one per busy period, where they
    /// run and do.
    pub per_call: Option<String>,
    /// Why its programs are on the syscall tracepoints instead of the scheduler's and the
    /// socket layer's ([`crate::schedprog`]), where they run and are.
    pub syscalls: Option<String>,
    /// Records drained from the eBPF ring buffer (or perf samples read).
    pub records: u64,
    pub pid: u32,
    pub port: u16,
    /// CLOCK_MONOTONIC ns.
    pub start_ns: u64,
    pub end_ns: u64,
    pub tracefs_mounted_now: bool,
    pub listening_fds: Vec<u64>,
    pub connections_at_attach: usize,
    pub threads_attached: usize,
    /// Samples the kernel dropped (full ring buffer): periods may be missing or merged.
    pub lost_samples: u64,
    /// The scheduler form's calls written alone, as periods of their own from the call to the
    /// call, because another thread held the caller's slot (threads whose ids agree in the low
    /// bits): their requests are attributed, their periods' times are not known.
    pub written_alone: u64,
    /// How the observation was sampled under load, where it was ([`crate::sampling`]): the
    /// periods of the times the programs were away are not in it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sampled: Option<Sampled>,
    pub counts: StreamCounts,
    pub threads: Vec<ThreadSummary>,
    pub periods: Vec<Period>,
}

/// Which eBPF programs ran, one phrase, from the reasons a report carries (`syscalls`: why
/// they are on the syscall tracepoints; `untyped`: why not BTF-typed; `per_call`: why a record
/// per call).
pub fn programs(syscalls: Option<&str>, untyped: Option<&str>, per_call: Option<&str>) -> String {
    match (syscalls, untyped, per_call) {
        (None, _, _) => "on the scheduler's and socket tracepoints (sched_switch, skb_copy_datagram_iovec, sock_send_length), BTF-typed, one record per busy period (its calls counted in the kernel, unstamped)".to_string(),
        (Some(s), Some(u), _) => format!(
            "on the syscall tracepoints ({s}), not BTF-typed ({u}): each register read is a helper call"
        ),
        (Some(s), None, Some(p)) => {
            format!("on the syscall tracepoints ({s}), BTF-typed, a stamped record per call ({p})")
        }
        (Some(s), None, None) => format!(
            "on the syscall tracepoints ({s}), BTF-typed, one record per busy period (the calls inside it kept in the kernel, unstamped)"
        ),
    }
}

/// One thread's busy periods on the port.
#[derive(Debug, Clone, Serialize)]
pub struct ThreadSummary {
    pub tid: u32,
    pub comm: String,
    pub periods: usize,
    /// Its [`Kind::Read`] periods.
    pub read: usize,
    /// Requests it read: the reads that returned data in those periods (a period may read
    /// several when the next request was queued before the thread slept or waited again).
    pub requests: usize,
    pub hand_off: usize,
    pub reply: usize,
    pub accept: usize,
    /// Replies written in its hand-off periods (one period may answer several queued requests).
    pub hand_off_replies: usize,
    /// Reading threads whose requests this thread answered.
    pub hand_off_from: Vec<u32>,
    pub first_start_ns: u64,
    /// Busy-period durations, µs.
    pub duration_us: Summary,
}

/// Per-thread summaries of `periods`, by tid.
pub fn summarize_threads(pid: u32, periods: &[Period]) -> Vec<ThreadSummary> {
    let mut by: BTreeMap<u32, Vec<&Period>> = BTreeMap::new();
    periods
        .iter()
        .for_each(|p| by.entry(p.tid).or_default().push(p));
    by.into_iter()
        .map(|(tid, ps)| {
            let count = |f: fn(&Kind) -> bool| ps.iter().filter(|p| f(&p.kind)).count();
            let mut from: Vec<u32> = ps
                .iter()
                .filter_map(|p| match p.kind {
                    Kind::HandOff { from } => Some(from),
                    _ => None,
                })
                .collect();
            from.sort_unstable();
            from.dedup();
            let durations: Vec<f64> = ps
                .iter()
                .map(|p| (p.end_ns - p.start_ns) as f64 / 1e3)
                .collect();
            ThreadSummary {
                tid,
                comm: std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm"))
                    .map(|s| s.trim().to_string())
                    .unwrap_or_default(),
                periods: ps.len(),
                read: count(|k| matches!(k, Kind::Read)),
                requests: ps
                    .iter()
                    .filter(|p| p.kind == Kind::Read)
                    .map(|p| p.reads as usize)
                    .sum(),
                hand_off: count(|k| matches!(k, Kind::HandOff { .. })),
                reply: count(|k| matches!(k, Kind::Reply)),
                accept: count(|k| matches!(k, Kind::Accept)),
                hand_off_replies: ps
                    .iter()
                    .filter(|p| matches!(p.kind, Kind::HandOff { .. }))
                    .map(|p| p.writes as usize)
                    .sum(),
                hand_off_from: from,
                first_start_ns: ps.iter().map(|p| p.start_ns).min().unwrap_or(0),
                duration_us: summarize(&durations),
            }
        })
        .collect()
}
