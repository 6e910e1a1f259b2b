//! The CPU sleep plan (paper: "The operating system should aggregate such requests and maintain a
//! CPU sleep plan with high efficiency and (if desirable) proper energy accounting").
//!
//! Pure: no I/O, no clock. Every function takes the current `CLOCK_MONOTONIC` time as an
//! argument, so the daemon and the property tests drive it alike.
//!
//! * A [`WakeRequest`] asks that some CPUs stay out of deep idle during `[start, start+duration)`.
//!   [`Plan::add`] validates it against [`Limits`] and the online CPUs and records it as a
//!   [`Window`] owned by a connection.
//! * Per CPU, the plan is the union of its windows ([`union`]): overlapping *and* adjacent
//!   intervals are merged, so the mechanism is applied once per merged interval.
//! * Queries: [`Plan::awake_at`] (which CPUs must be awake at `t`), [`Plan::next_edge`] (the
//!   next instant after `t` where that set can change).
//! * Energy attribution ([`attribute`], [`Plan::advance`]): each nanosecond a CPU is kept awake
//!   is charged to the requesters whose windows cover it, split equally among the distinct
//!   requesters awake at that moment (the paper: "the energy use of a resource principal should
//!   include that of its anticipatory CPU wakeups even if the system idles for much of the
//!   wakeup durations"). The charges per CPU sum exactly to the length of the union.
//!
//! All intervals are half-open `[start_ns, end_ns)`.

use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// One second in nanoseconds.
pub const NS_PER_S: u64 = 1_000_000_000;

/// A `start_ns` of 0 means "from when the daemon receives the request" (a hold: the whole
/// duration counts from then, however late the request arrives).
pub const START_ON_RECEIPT: u64 = 0;

/// "Keep these CPUs out of deep idle from `start_ns` for `duration_ns`" (CLOCK_MONOTONIC ns;
/// [`START_ON_RECEIPT`] for "from receipt").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WakeRequest {
    /// Who asks (the resource principal charged for the awake time).
    pub requester: String,
    pub cpus: Vec<u32>,
    pub start_ns: u64,
    pub duration_ns: u64,
}

/// Bounds every request must respect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// Longest window (default 10 s).
    pub max_duration_ns: u64,
    /// How far in the future a window may start (default 60 s).
    pub max_ahead_ns: u64,
    /// Windows not yet ended, per requester name (default 64).
    pub max_pending_per_requester: usize,
    /// Windows not yet ended, in total (default 1024).
    pub max_pending_total: usize,
    /// Longest requester name in bytes (default 64).
    pub max_requester_len: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_duration_ns: 10 * NS_PER_S,
            max_ahead_ns: 60 * NS_PER_S,
            max_pending_per_requester: 64,
            max_pending_total: 1024,
            max_requester_len: 64,
        }
    }
}

/// Why a request was refused. The `Display` text is what the client sees.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Reject {
    #[error("malformed request: {0}")]
    Malformed(String),
    #[error("{field} is negative ({value}): times are CLOCK_MONOTONIC nanoseconds, ≥ 0")]
    Negative { field: &'static str, value: i64 },
    #[error("requester must be 1 to {max} printable characters, got {got:?}")]
    BadRequester { got: String, max: usize },
    #[error("duration_ns is 0: a window must last at least 1 ns")]
    ZeroDuration,
    #[error("duration {duration_ns} ns is longer than the limit of {max_ns} ns")]
    TooLong { duration_ns: u64, max_ns: u64 },
    #[error("start_ns + duration_ns overflows")]
    Overflow,
    #[error("the window already ended {ago_ns} ns ago (start {start_ns} + duration {duration_ns} ≤ now {now_ns})")]
    AlreadyEnded {
        start_ns: u64,
        duration_ns: u64,
        now_ns: u64,
        ago_ns: u64,
    },
    #[error("the window starts {ahead_ns} ns from now, more than the limit of {max_ns} ns")]
    TooFarAhead { ahead_ns: u64, max_ns: u64 },
    #[error("no CPUs given")]
    NoCpus,
    #[error("CPU {cpu} is not online (online: {online})")]
    OfflineCpu { cpu: u32, online: String },
    #[error("requester {requester:?} already has {pending} windows pending (limit {max})")]
    TooManyForRequester {
        requester: String,
        pending: usize,
        max: usize,
    },
    #[error("{pending} windows pending in total (limit {max})")]
    TooManyTotal { pending: usize, max: usize },
}

/// An accepted request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Window {
    pub id: u64,
    pub requester: String,
    /// The connection that asked for it (closing it cancels the window if not yet started).
    pub owner: u64,
    /// Sorted, deduplicated.
    pub cpus: Vec<u32>,
    /// Clamped to the time it was accepted (a CPU cannot be woken in the past).
    pub start_ns: u64,
    pub end_ns: u64,
}

/// A half-open interval `[start_ns, end_ns)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Interval {
    pub start_ns: u64,
    pub end_ns: u64,
}

impl Interval {
    pub fn len(&self) -> u64 {
        self.end_ns.saturating_sub(self.start_ns)
    }
    pub fn is_empty(&self) -> bool {
        self.end_ns <= self.start_ns
    }
    pub fn contains(&self, t: u64) -> bool {
        self.start_ns <= t && t < self.end_ns
    }
}

/// Union of intervals: sorted, disjoint, non-adjacent, non-empty intervals covering exactly the
/// points covered by some input interval. Empty inputs are ignored.
pub fn union(intervals: impl IntoIterator<Item = Interval>) -> Vec<Interval> {
    let mut v: Vec<Interval> = intervals.into_iter().filter(|i| !i.is_empty()).collect();
    v.sort_unstable();
    let mut out: Vec<Interval> = Vec::with_capacity(v.len());
    for i in v {
        match out.last_mut() {
            // Overlapping or adjacent: extend.
            Some(last) if i.start_ns <= last.end_ns => last.end_ns = last.end_ns.max(i.end_ns),
            _ => out.push(i),
        }
    }
    out
}

/// Energy attribution on one CPU over `[from, to)`: every nanosecond covered by at least one
/// window is split equally among the *distinct* requesters whose windows cover it (a requester
/// with two overlapping windows counts once). Integer split: the remainder of a segment goes one
/// nanosecond each to the first requesters in name order, so the charges sum exactly to the
/// length of the union inside `[from, to)`.
pub fn attribute<'a>(
    windows: impl IntoIterator<Item = (&'a str, Interval)>,
    from: u64,
    to: u64,
) -> BTreeMap<String, u64> {
    let mut out: BTreeMap<String, u64> = BTreeMap::new();
    if to <= from {
        return out;
    }
    // Clip to [from, to) and collect edges.
    let clipped: Vec<(&str, Interval)> = windows
        .into_iter()
        .map(|(r, i)| {
            (
                r,
                Interval {
                    start_ns: i.start_ns.max(from),
                    end_ns: i.end_ns.min(to),
                },
            )
        })
        .filter(|(_, i)| !i.is_empty())
        .collect();
    if clipped.is_empty() {
        return out;
    }
    let mut edges: Vec<u64> = clipped
        .iter()
        .flat_map(|(_, i)| [i.start_ns, i.end_ns])
        .collect();
    edges.sort_unstable();
    edges.dedup();
    // Sweep: events sorted by time; +1/-1 per requester.
    let mut events: Vec<(u64, i32, &str)> = Vec::with_capacity(clipped.len() * 2);
    for (r, i) in &clipped {
        events.push((i.start_ns, 1, r));
        events.push((i.end_ns, -1, r));
    }
    events.sort_unstable_by_key(|e| e.0);
    let mut active: BTreeMap<&str, u32> = BTreeMap::new();
    let mut ei = 0;
    for w in edges.windows(2) {
        let (a, b) = (w[0], w[1]);
        while ei < events.len() && events[ei].0 <= a {
            let (_, d, r) = events[ei];
            let c = active.entry(r).or_insert(0);
            if d > 0 {
                *c += 1;
            } else {
                *c -= 1;
                if *c == 0 {
                    active.remove(r);
                }
            }
            ei += 1;
        }
        let k = active.len() as u64;
        if k == 0 {
            continue;
        }
        let len = b - a;
        let (q, rem) = (len / k, len % k);
        for (n, r) in active.keys().enumerate() {
            let share = q + u64::from((n as u64) < rem);
            if share > 0 {
                *out.entry((*r).to_string()).or_insert(0) += share;
            }
        }
    }
    out
}

/// The plan: accepted windows not yet ended, plus the awake time already charged.
#[derive(Debug, Clone)]
pub struct Plan {
    limits: Limits,
    next_id: u64,
    windows: Vec<Window>,
    /// Everything before this instant has been charged and expired.
    accounted_until: u64,
    /// requester → CPU → awake ns charged so far.
    awake: BTreeMap<String, BTreeMap<u32, u64>>,
    /// Windows that ended, not yet returned by [`Plan::advance`].
    ended: Vec<Window>,
}

impl Plan {
    /// An empty plan whose accounting starts at `now`.
    pub fn new(limits: Limits, now: u64) -> Plan {
        Plan {
            limits,
            next_id: 1,
            windows: Vec::new(),
            accounted_until: now,
            awake: BTreeMap::new(),
            ended: Vec::new(),
        }
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Windows not yet ended (as of the last [`Plan::advance`]), by id.
    pub fn windows(&self) -> &[Window] {
        &self.windows
    }

    /// Check `req` at time `now` against the limits, the online CPUs and the pending windows.
    /// Returns the normalized CPU list (sorted, deduplicated). Counts as pending only windows
    /// that end after `now`.
    pub fn validate(
        &self,
        req: &WakeRequest,
        now: u64,
        online: &[u32],
    ) -> Result<Vec<u32>, Reject> {
        let l = &self.limits;
        if req.requester.is_empty()
            || req.requester.len() > l.max_requester_len
            || req.requester.chars().any(|c| c.is_control())
        {
            return Err(Reject::BadRequester {
                got: req.requester.chars().take(80).collect(),
                max: l.max_requester_len,
            });
        }
        if req.duration_ns == 0 {
            return Err(Reject::ZeroDuration);
        }
        if req.duration_ns > l.max_duration_ns {
            return Err(Reject::TooLong {
                duration_ns: req.duration_ns,
                max_ns: l.max_duration_ns,
            });
        }
        let end = req
            .start_ns
            .checked_add(req.duration_ns)
            .ok_or(Reject::Overflow)?;
        if end <= now {
            return Err(Reject::AlreadyEnded {
                start_ns: req.start_ns,
                duration_ns: req.duration_ns,
                now_ns: now,
                ago_ns: now - end,
            });
        }
        let ahead = req.start_ns.saturating_sub(now);
        if ahead > l.max_ahead_ns {
            return Err(Reject::TooFarAhead {
                ahead_ns: ahead,
                max_ns: l.max_ahead_ns,
            });
        }
        if req.cpus.is_empty() {
            return Err(Reject::NoCpus);
        }
        let mut cpus = req.cpus.clone();
        cpus.sort_unstable();
        cpus.dedup();
        if let Some(&cpu) = cpus.iter().find(|c| !online.contains(c)) {
            return Err(Reject::OfflineCpu {
                cpu,
                online: format_cpu_list(online),
            });
        }
        let pending: Vec<&Window> = self.windows.iter().filter(|w| w.end_ns > now).collect();
        let mine = pending
            .iter()
            .filter(|w| w.requester == req.requester)
            .count();
        if mine >= l.max_pending_per_requester {
            return Err(Reject::TooManyForRequester {
                requester: req.requester.clone(),
                pending: mine,
                max: l.max_pending_per_requester,
            });
        }
        if pending.len() >= l.max_pending_total {
            return Err(Reject::TooManyTotal {
                pending: pending.len(),
                max: l.max_pending_total,
            });
        }
        Ok(cpus)
    }

    /// Validate and insert `req` for connection `owner`. Charges and expires up to `now` first.
    /// A window that started in the past is clamped to start at `now`.
    pub fn add(
        &mut self,
        req: &WakeRequest,
        now: u64,
        online: &[u32],
        owner: u64,
    ) -> Result<Window, Reject> {
        self.charge_until(now);
        let now = now.max(self.accounted_until);
        let cpus = self.validate(req, now, online)?;
        let w = Window {
            id: self.next_id,
            requester: req.requester.clone(),
            owner,
            cpus,
            start_ns: req.start_ns.max(now),
            end_ns: req.start_ns + req.duration_ns,
        };
        self.next_id += 1;
        self.windows.push(w.clone());
        Ok(w)
    }

    /// Remove the windows of `owner` that have not started by `now` (a client went away).
    /// Windows already running are kept: they end on their own.
    pub fn cancel_future(&mut self, owner: u64, now: u64) -> Vec<Window> {
        self.charge_until(now);
        let now = now.max(self.accounted_until);
        let (gone, keep): (Vec<Window>, Vec<Window>) = std::mem::take(&mut self.windows)
            .into_iter()
            .partition(|w| w.owner == owner && w.start_ns > now);
        self.windows = keep;
        gone
    }

    /// Remove window `id` of `owner` if it has not started by `now`.
    pub fn cancel(&mut self, owner: u64, id: u64, now: u64) -> Option<Window> {
        self.charge_until(now);
        let now = now.max(self.accounted_until);
        let i = self
            .windows
            .iter()
            .position(|w| w.id == id && w.owner == owner && w.start_ns > now)?;
        Some(self.windows.remove(i))
    }

    /// Charge awake time up to `now` and drop the windows that ended by then. Returns every
    /// window that ended since the last call (including those dropped while [`Plan::add`] or
    /// a cancel charged time). Time never goes backwards: an earlier `now` charges nothing.
    pub fn advance(&mut self, now: u64) -> Vec<Window> {
        self.charge_until(now);
        std::mem::take(&mut self.ended)
    }

    fn charge_until(&mut self, now: u64) {
        if now <= self.accounted_until {
            return;
        }
        let from = self.accounted_until;
        for cpu in self.cpus() {
            let charged = attribute(
                self.windows
                    .iter()
                    .filter(|w| w.cpus.contains(&cpu))
                    .map(|w| (w.requester.as_str(), w.interval())),
                from,
                now,
            );
            for (r, ns) in charged {
                *self.awake.entry(r).or_default().entry(cpu).or_insert(0) += ns;
            }
        }
        self.accounted_until = now;
        let (gone, keep): (Vec<Window>, Vec<Window>) = std::mem::take(&mut self.windows)
            .into_iter()
            .partition(|w| w.end_ns <= now);
        self.windows = keep;
        self.ended.extend(gone);
    }

    /// CPUs that have at least one window.
    pub fn cpus(&self) -> BTreeSet<u32> {
        self.windows
            .iter()
            .flat_map(|w| w.cpus.iter().copied())
            .collect()
    }

    /// The sleep plan of `cpu`: the union of its windows.
    pub fn cpu_plan(&self, cpu: u32) -> Vec<Interval> {
        union(
            self.windows
                .iter()
                .filter(|w| w.cpus.contains(&cpu))
                .map(Window::interval),
        )
    }

    /// CPUs that must be awake at `t` (sorted).
    pub fn awake_at(&self, t: u64) -> Vec<u32> {
        self.windows
            .iter()
            .filter(|w| w.interval().contains(t))
            .flat_map(|w| w.cpus.iter().copied())
            .collect::<BTreeSet<u32>>()
            .into_iter()
            .collect()
    }

    /// The first instant after `t` at which some CPU's awake state changes (a start or end of
    /// a merged interval of some CPU's plan), if any.
    pub fn next_edge(&self, t: u64) -> Option<u64> {
        self.cpus()
            .into_iter()
            .flat_map(|c| self.cpu_plan(c))
            .flat_map(|i| [i.start_ns, i.end_ns])
            .filter(|&e| e > t)
            .min()
    }

    /// Awake time charged so far: requester → CPU → ns.
    pub fn awake_ns(&self) -> &BTreeMap<String, BTreeMap<u32, u64>> {
        &self.awake
    }

    /// Everything before this instant has been charged.
    pub fn accounted_until(&self) -> u64 {
        self.accounted_until
    }
}

impl Window {
    pub fn interval(&self) -> Interval {
        Interval {
            start_ns: self.start_ns,
            end_ns: self.end_ns,
        }
    }
}

/// `[0, 1, 2, 5]` → `"0-2,5"`.
pub fn format_cpu_list(cpus: &[u32]) -> String {
    let mut v = cpus.to_vec();
    v.sort_unstable();
    v.dedup();
    let mut parts = Vec::new();
    let mut i = 0;
    while i < v.len() {
        let mut j = i;
        while j + 1 < v.len() && v[j + 1] == v[j] + 1 {
            j += 1;
        }
        parts.push(if i == j {
            v[i].to_string()
        } else {
            format!("{}-{}", v[i], v[j])
        });
        i = j + 1;
    }
    if parts.is_empty() {
        "none".to_string()
    } else {
        parts.join(",")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MS: u64 = 1_000_000;

    fn iv(a: u64, b: u64) -> Interval {
        Interval {
            start_ns: a,
            end_ns: b,
        }
    }

    fn req(r: &str, cpus: &[u32], start: u64, dur: u64) -> WakeRequest {
        WakeRequest {
            requester: r.into(),
            cpus: cpus.to_vec(),
            start_ns: start,
            duration_ns: dur,
        }
    }

    #[test]
    fn union_merges_overlapping_and_adjacent() {
        assert_eq!(
            union([iv(5, 7), iv(0, 2), iv(2, 3), iv(6, 9), iv(11, 12), iv(4, 4)]),
            vec![iv(0, 3), iv(5, 9), iv(11, 12)]
        );
        assert!(union([]).is_empty());
    }

    #[test]
    fn attribution_splits_overlap_equally() {
        // a: [0,10), b: [5,15) → a 5 + 2.5, b 2.5 + 5.
        let m = attribute([("a", iv(0, 10)), ("b", iv(5, 15))], 0, 100);
        assert_eq!(m["a"] + m["b"], 15);
        assert_eq!(m["a"], 8); // 5 alone + 3 (remainder ns goes to "a")
        assert_eq!(m["b"], 7);
        // The same requester twice counts once.
        let m = attribute(
            [("a", iv(0, 10)), ("a", iv(0, 10)), ("b", iv(0, 10))],
            0,
            100,
        );
        assert_eq!((m["a"], m["b"]), (5, 5));
        // Clipping.
        let m = attribute([("a", iv(0, 10))], 3, 6);
        assert_eq!(m["a"], 3);
    }

    #[test]
    fn rejections_are_specific() {
        let now = 100 * NS_PER_S;
        let online = [0, 1];
        let mut p = Plan::new(
            Limits {
                max_pending_per_requester: 2,
                max_pending_total: 3,
                ..Limits::default()
            },
            now,
        );
        let e = |p: &Plan, r: WakeRequest| p.validate(&r, now, &online).unwrap_err();
        assert_eq!(e(&p, req("a", &[1], now, 0)), Reject::ZeroDuration);
        assert!(matches!(
            e(&p, req("a", &[1], now, 11 * NS_PER_S)),
            Reject::TooLong { .. }
        ));
        assert!(matches!(
            e(&p, req("a", &[1], now + 61 * NS_PER_S, MS)),
            Reject::TooFarAhead { .. }
        ));
        assert!(matches!(
            e(&p, req("a", &[1], now - 2 * MS, MS)),
            Reject::AlreadyEnded { ago_ns, .. } if ago_ns == MS
        ));
        assert_eq!(e(&p, req("a", &[], now, MS)), Reject::NoCpus);
        assert!(matches!(
            e(&p, req("a", &[7], now, MS)),
            Reject::OfflineCpu { cpu: 7, .. }
        ));
        assert!(matches!(
            e(&p, req("", &[1], now, MS)),
            Reject::BadRequester { .. }
        ));
        assert_eq!(e(&p, req("a", &[1], u64::MAX, 2)), Reject::Overflow);
        p.add(&req("a", &[1], now + MS, MS), now, &online, 1)
            .unwrap();
        p.add(&req("a", &[1, 1, 0], now + MS, MS), now, &online, 1)
            .unwrap();
        assert!(matches!(
            e(&p, req("a", &[1], now, MS)),
            Reject::TooManyForRequester {
                pending: 2,
                max: 2,
                ..
            }
        ));
        p.add(&req("b", &[0], now, MS), now, &online, 2).unwrap();
        assert!(matches!(
            e(&p, req("c", &[1], now, MS)),
            Reject::TooManyTotal { pending: 3, max: 3 }
        ));
        // After they ended, room again.
        p.advance(now + 10 * MS);
        assert!(p
            .validate(&req("a", &[1], now + 10 * MS, MS), now + 10 * MS, &online)
            .is_ok());
        assert_eq!(p.windows().len(), 0);
        // Every message names the problem.
        assert!(Reject::TooLong {
            duration_ns: 11 * NS_PER_S,
            max_ns: 10 * NS_PER_S
        }
        .to_string()
        .contains("longer than the limit"));
    }

    #[test]
    fn past_start_is_clamped_and_cancel_keeps_running() {
        let now = 1000;
        let mut p = Plan::new(Limits::default(), now);
        let w = p.add(&req("a", &[0], 500, 1000), now, &[0], 9).unwrap();
        assert_eq!((w.start_ns, w.end_ns), (1000, 1500));
        p.add(&req("a", &[0], 5000, 1000), now, &[0], 9).unwrap();
        p.add(&req("b", &[0], 5000, 1000), now, &[0], 8).unwrap();
        let gone = p.cancel_future(9, 1200);
        assert_eq!(gone.len(), 1);
        assert_eq!(gone[0].start_ns, 5000);
        assert_eq!(p.windows().len(), 2);
        assert_eq!(p.awake_at(1300), vec![0]);
        assert_eq!(p.next_edge(1300), Some(1500));
        assert_eq!(p.next_edge(1500), Some(5000));
        assert_eq!(p.next_edge(6000), None);
        p.advance(10_000);
        assert_eq!(p.awake_ns()["a"][&0], 500);
        assert_eq!(p.awake_ns()["b"][&0], 1000);
    }

    #[test]
    fn cpu_list_format() {
        assert_eq!(format_cpu_list(&[0, 1, 2, 5, 7, 8]), "0-2,5,7-8");
        assert_eq!(format_cpu_list(&[]), "none");
    }

    fn arb_windows() -> impl Strategy<Value = Vec<(u8, Vec<u32>, u64, u64)>> {
        prop::collection::vec(
            (
                0u8..4,
                prop::collection::vec(0u32..4, 1..4),
                0u64..2000,
                1u64..500,
            ),
            0..24,
        )
    }

    fn build(ws: &[(u8, Vec<u32>, u64, u64)]) -> Plan {
        let online = [0, 1, 2, 3];
        let mut p = Plan::new(Limits::default(), 0);
        for (i, (r, cpus, s, d)) in ws.iter().enumerate() {
            p.add(&req(&format!("r{r}"), cpus, *s, *d), 0, &online, i as u64)
                .unwrap();
        }
        p
    }

    proptest! {
        #[test]
        fn union_covers_exactly_the_windows(ws in arb_windows(), probes in prop::collection::vec(0u64..2600, 64)) {
            let p = build(&ws);
            for cpu in 0..4u32 {
                let u = p.cpu_plan(cpu);
                // Sorted, disjoint, non-adjacent, non-empty.
                for w in u.windows(2) {
                    prop_assert!(w[0].end_ns < w[1].start_ns);
                }
                prop_assert!(u.iter().all(|i| !i.is_empty()));
                // Covers exactly the requested points.
                for &t in &probes {
                    let in_union = u.iter().any(|i| i.contains(t));
                    let in_some = ws.iter().any(|(_, c, s, d)| c.contains(&cpu) && *s <= t && t < s + d);
                    prop_assert_eq!(in_union, in_some, "cpu {} t {}", cpu, t);
                    prop_assert_eq!(p.awake_at(t).contains(&cpu), in_some);
                }
                // Every window edge is inside or on the union.
                for (_, c, s, d) in &ws {
                    if c.contains(&cpu) {
                        prop_assert!(u.iter().any(|i| i.start_ns <= *s && s + d <= i.end_ns));
                    }
                }
            }
        }

        #[test]
        fn next_edge_is_the_first_change(ws in arb_windows(), t in 0u64..2600) {
            let p = build(&ws);
            let e = p.next_edge(t);
            let before = p.awake_at(t);
            match e {
                None => {
                    for x in t + 1..2600 { prop_assert_eq!(p.awake_at(x), before.clone()); }
                }
                Some(e) => {
                    prop_assert!(e > t);
                    for x in t + 1..e { prop_assert_eq!(p.awake_at(x), before.clone()); }
                    prop_assert_ne!(p.awake_at(e), p.awake_at(e - 1));
                }
            }
        }

        #[test]
        fn accounting_sums_to_union_length(ws in arb_windows(), cuts in prop::collection::vec(0u64..2600, 0..6)) {
            // Charged incrementally at arbitrary instants, the awake time per CPU sums to the
            // union's length and equals a one-shot attribution.
            let mut p = build(&ws);
            let lens: Vec<u64> = (0..4).map(|c| p.cpu_plan(c).iter().map(Interval::len).sum()).collect();
            let mut cuts = cuts;
            cuts.sort_unstable();
            for c in cuts { p.advance(c); }
            p.advance(3000);
            prop_assert!(p.windows().is_empty());
            for cpu in 0..4u32 {
                let sum: u64 = p.awake_ns().values().filter_map(|m| m.get(&cpu)).sum();
                prop_assert_eq!(sum, lens[cpu as usize], "cpu {}", cpu);
            }
            // Nobody is charged more than the union of their own windows, nor less than
            // their exclusive time divided by the number of requesters.
            for (r, m) in p.awake_ns() {
                for (&cpu, &ns) in m {
                    let own: u64 = union(ws.iter().filter(|(rr, c, _, _)| format!("r{rr}") == *r && c.contains(&cpu))
                        .map(|(_, _, s, d)| iv(*s, s + d))).iter().map(Interval::len).sum();
                    prop_assert!(ns <= own);
                }
            }
        }

        #[test]
        fn every_window_ends_exactly_once(ws in arb_windows(), cuts in prop::collection::vec(0u64..2600, 0..6), extra_at in 0u64..2600) {
            let mut p = build(&ws);
            let n = p.windows().len();
            let mut cuts = cuts;
            cuts.sort_unstable();
            let mut ended: Vec<u64> = Vec::new();
            for c in cuts {
                ended.extend(p.advance(c).iter().map(|w| w.id));
            }
            // An add charges time too; the windows it expires are still reported.
            let late = p.add(&req("late", &[0], extra_at.max(p.accounted_until()), 1), extra_at, &[0, 1, 2, 3], 99);
            ended.extend(p.advance(5000).iter().map(|w| w.id));
            ended.sort_unstable();
            let before = ended.len();
            ended.dedup();
            prop_assert_eq!(before, ended.len());
            prop_assert_eq!(ended.len(), n + usize::from(late.is_ok()));
        }

        #[test]
        fn one_requester_gets_the_whole_union(ws in arb_windows()) {
            let ws: Vec<_> = ws.into_iter().map(|(_, c, s, d)| (0u8, c, s, d)).collect();
            let mut p = build(&ws);
            let lens: Vec<u64> = (0..4).map(|c| p.cpu_plan(c).iter().map(Interval::len).sum()).collect();
            p.advance(5000);
            for cpu in 0..4u32 {
                let got = p.awake_ns().get("r0").and_then(|m| m.get(&cpu)).copied().unwrap_or(0);
                prop_assert_eq!(got, lens[cpu as usize]);
            }
        }

        #[test]
        fn cancel_future_keeps_running_windows(ws in arb_windows(), t in 0u64..2600, owner in 0u64..24) {
            let mut p = build(&ws);
            let before: Vec<Window> = p.windows().to_vec();
            let gone = p.cancel_future(owner, t);
            for w in &gone {
                prop_assert!(w.owner == owner && w.start_ns > t);
            }
            for w in before.iter().filter(|w| w.end_ns > t) {
                let cancelled = gone.iter().any(|g| g.id == w.id);
                let kept = p.windows().iter().any(|k| k.id == w.id);
                prop_assert!(cancelled != kept);
                if w.start_ns <= t { prop_assert!(kept); }
            }
        }
    }
}
