//! Sampling under sustained load: the observer's programs detached most of the time while the
//! server is busy, attached throughout while it is not (pure: no I/O, deterministic).
//!
//! What a program on a tracepoint costs is mostly its dispatch, paid on every event of the
//! machine (`preheat bench observe --toggle` on preheat-kv, EPYC `haltpoll`, 2026-11-30: the
//! scheduler form's programs replaced by ones that return at once still cost 1.4–2.0% of the
//! loopback throughput in the host's fast state, against 1.8–2.6% as built), so no program
//! body makes a busy server's observation free. What preheat needs to see is the first
//! request after an idle — the cold one — and a server between bursts is by definition not
//! busy: so under sustained load (more than [`Sampling::above_per_s`] records a second over a
//! window of at least [`MIN_WINDOW_NS`]) the observer detaches its programs for
//! [`Sampling::pause_ns`], then attaches them again and looks once more. A server that goes
//! idle is fully observed again within one pause; one that stays busy is observed a window in
//! every pause. Every report says how much of the time the programs were away
//! ([`Sampled`]); `preheat observe` and the tests observe completely (no sampling) unless
//! asked.

#![forbid(unsafe_code)]

use serde::Serialize;

/// The shortest window over which a rate is judged (ns): a drain right after another says
/// little.
pub const MIN_WINDOW_NS: u64 = 20_000_000;

/// When to sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sampling {
    /// Records (busy periods, with the scheduler form) per second above which the server is
    /// busy.
    pub above_per_s: u64,
    /// How long the programs stay detached each time (ns).
    pub pause_ns: u64,
}

impl Default for Sampling {
    /// Above 10 000 periods a second (a request every 100 µs: far above what a demo's rounds
    /// or an idle-and-burst server make), detached for 450 ms at a time: with the 50 ms
    /// drains of the observer's callers, attached about a tenth of the time under load.
    fn default() -> Sampling {
        Sampling {
            above_per_s: 10_000,
            pause_ns: 450_000_000,
        }
    }
}

impl Sampling {
    /// The policy in words: "away 450 ms each time the server makes more than 10000 periods a
    /// second".
    pub fn describe(&self) -> String {
        format!(
            "away {} ms each time the server makes more than {} periods a second",
            self.pause_ns / 1_000_000,
            self.above_per_s
        )
    }
}

/// What the caller does with its programs after [`Sampler::step`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Keep,
    Detach,
    Attach,
}

/// How an observation was sampled (the report's `sampled`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Sampled {
    /// The rate above which the programs were detached (records a second).
    pub above_per_s: u64,
    /// Times they were detached.
    pub pauses: u64,
    /// The share of the observation they were away, 0–1.
    pub detached_share: f64,
}

/// The sampling state of one observation.
#[derive(Debug, Clone)]
pub struct Sampler {
    cfg: Sampling,
    start_ns: u64,
    window_start_ns: u64,
    window_records: u64,
    /// Detached since, until.
    paused: Option<(u64, u64)>,
    pauses: u64,
    detached_ns: u64,
}

impl Sampler {
    pub fn new(cfg: Sampling, now_ns: u64) -> Sampler {
        Sampler {
            cfg,
            start_ns: now_ns,
            window_start_ns: now_ns,
            window_records: 0,
            paused: None,
            pauses: 0,
            detached_ns: 0,
        }
    }

    /// A drain at `now_ns` found `records`: detach when the window's rate is above the
    /// threshold, attach again when a pause is over.
    pub fn step(&mut self, now_ns: u64, records: u64) -> Action {
        if let Some((since, until)) = self.paused {
            if now_ns < until {
                return Action::Keep;
            }
            self.paused = None;
            self.detached_ns += now_ns.saturating_sub(since);
            self.window_start_ns = now_ns;
            self.window_records = 0;
            return Action::Attach;
        }
        self.window_records += records;
        let window = now_ns.saturating_sub(self.window_start_ns);
        if window < MIN_WINDOW_NS {
            return Action::Keep;
        }
        let busy = u128::from(self.window_records) * 1_000_000_000
            > u128::from(self.cfg.above_per_s) * u128::from(window);
        self.window_start_ns = now_ns;
        self.window_records = 0;
        if !busy {
            return Action::Keep;
        }
        self.paused = Some((now_ns, now_ns.saturating_add(self.cfg.pause_ns)));
        self.pauses += 1;
        Action::Detach
    }

    /// Whether the programs are away now.
    pub fn detached(&self) -> bool {
        self.paused.is_some()
    }

    /// The summary at `now_ns` (a pause still running counts up to now).
    pub fn sampled(&self, now_ns: u64) -> Sampled {
        let running = self
            .paused
            .map_or(0, |(since, _)| now_ns.saturating_sub(since));
        let total = now_ns.saturating_sub(self.start_ns).max(1);
        Sampled {
            above_per_s: self.cfg.above_per_s,
            pauses: self.pauses,
            detached_share: (self.detached_ns + running) as f64 / total as f64,
        }
    }
}

/// The times the kernel's side was away (detached by the caller or the sampler), kept to drop
/// the periods that straddled one: a period open when the programs went away and closed after
/// they came back kept its slot open through a time nothing was seen, so it is no period. Only
/// the last [`AwayTimes::KEPT`] are kept (a drain analyses what settled within about a second).
#[derive(Debug, Clone, Default)]
pub struct AwayTimes {
    since: Option<u64>,
    past: Vec<(u64, u64)>,
}

impl AwayTimes {
    /// Away times kept.
    pub const KEPT: usize = 8;

    /// The programs are detached as of `now_ns` (read after detaching: a period opened while
    /// the detach was under way starts before it).
    pub fn went_away(&mut self, now_ns: u64) {
        self.since.get_or_insert(now_ns);
    }

    /// The programs are attached again as of `now_ns` (read before attaching: whatever closes
    /// after the attach ends at or after it).
    pub fn came_back(&mut self, now_ns: u64) {
        if let Some(since) = self.since.take() {
            if self.past.len() == Self::KEPT {
                self.past.remove(0);
            }
            self.past.push((since, now_ns));
        }
    }

    /// Whether the programs are away now.
    pub fn away(&self) -> bool {
        self.since.is_some()
    }

    /// Whether a period from `start_ns` to `end_ns` spans a time the programs were away: it
    /// began before they went and ended at or after they came back.
    pub fn spanned(&self, start_ns: u64, end_ns: u64) -> bool {
        self.past
            .iter()
            .any(|&(from, to)| start_ns < from && end_ns >= to)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn a_busy_server_is_sampled_an_idle_one_is_not() {
        let cfg = Sampling::default();
        let mut s = Sampler::new(cfg, 0);
        // 50 ms drains at 5 000 records a second: never detached.
        for i in 1..=20 {
            assert_eq!(s.step(i * 50 * MS, 250), Action::Keep);
        }
        assert_eq!(s.sampled(1000 * MS).pauses, 0);
        // 80 000 a second: detached at the next drain, for 450 ms, then attached again.
        assert_eq!(s.step(1050 * MS, 4000), Action::Detach);
        assert!(s.detached());
        for t in [1100, 1200, 1450] {
            assert_eq!(s.step(t * MS, 0), Action::Keep);
        }
        assert_eq!(s.step(1500 * MS, 0), Action::Attach);
        assert!(!s.detached());
        // Still busy: away again after a window.
        assert_eq!(s.step(1550 * MS, 4000), Action::Detach);
        let sampled = s.sampled(1600 * MS);
        assert_eq!(sampled.pauses, 2);
        // 450 ms and the 50 ms running, of 1600.
        assert!((sampled.detached_share - 500.0 / 1600.0).abs() < 1e-9);
        // The load stops: attached after the pause, and stays so.
        assert_eq!(s.step(2000 * MS, 0), Action::Attach);
        for t in 1..10 {
            assert_eq!(s.step((2000 + t * 50) * MS, 10), Action::Keep);
        }
    }

    #[test]
    fn short_windows_are_not_judged() {
        let mut s = Sampler::new(Sampling::default(), 0);
        // 1000 records within 5 ms: a burst, judged only with the window at 20 ms.
        assert_eq!(s.step(5 * MS, 1000), Action::Keep);
        assert_eq!(s.step(10 * MS, 0), Action::Keep);
        // 1000 over 20 ms is 50 000 a second.
        assert_eq!(s.step(20 * MS, 0), Action::Detach);
        // A clock that goes back is no rate at all.
        let mut s = Sampler::new(Sampling::default(), 100 * MS);
        assert_eq!(s.step(50 * MS, 1_000_000), Action::Keep);
    }
    #[test]
    fn periods_that_span_an_away_time_are_found() {
        let mut a = AwayTimes::default();
        assert!(!a.spanned(0, u64::MAX), "nothing was away yet");
        a.went_away(100);
        assert!(a.away());
        // Still away: nothing is known to be spanned until the programs are back.
        assert!(!a.spanned(50, 200));
        a.came_back(600);
        assert!(!a.away());
        // Closed before the programs went: a period.
        assert!(!a.spanned(10, 90));
        // Opened after they came back: a period.
        assert!(!a.spanned(600, 700));
        assert!(!a.spanned(650, 700));
        // Open through the whole time away (its slot kept it): not a period.
        assert!(a.spanned(90, 600));
        assert!(a.spanned(90, 700));
        // A second went_away while away keeps the first time.
        a.went_away(1000);
        a.went_away(1200);
        a.came_back(1500);
        // (From 1000: a period from 1100 would have opened while away.)
        assert!(!a.spanned(1100, 1600) && !a.spanned(900, 1400) && a.spanned(900, 1500));
        // A came_back without a went_away records nothing.
        a.came_back(2000);
        assert!(!a.spanned(1600, 2100));
        // Only the last KEPT times are kept.
        for i in 0..AwayTimes::KEPT as u64 {
            a.went_away(10_000 + i * 100);
            a.came_back(10_050 + i * 100);
        }
        assert!(!a.spanned(90, 700), "the oldest time was dropped");
        assert!(a.spanned(9_990, 10_060) && a.spanned(10_690, 10_760));
    }
}
