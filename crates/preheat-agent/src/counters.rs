//! Counters of the preheat path (trigger thread and workers): lock-free atomics.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};

use preheat_model::proto::PreheatStats;

pub struct Stats {
    /// Every datagram received on the trigger socket (`malformed` and `late` are subsets;
    /// `late` also counts announcements a worker could only start on after the arrival).
    pub announcements: AtomicU64,
    pub malformed: AtomicU64,
    pub late: AtomicU64,
    pub no_profile: AtomicU64,
    pub preheats: AtomicU64,
    pub completed: AtomicU64,
    pub lines_preheated: AtomicU64,
    pub wake_spins: AtomicU64,
    pub replays: AtomicU64,
    pub replay_errors: AtomicU64,
    pub preheat_ns_total: AtomicU64,
    pub last_lines_done: AtomicU64,
    pub last_lines_total: AtomicU64,
    pub last_preheat_ns: AtomicU64,
    pub last_lead_ns: AtomicI64,
    pub last_trigger_lead_ns: AtomicI64,
    /// Announcements the trigger thread handled itself, already on the serving CPU.
    pub local_handoffs: AtomicU64,
    /// `wake` handled by asking the wake planner for a window instead of spinning.
    pub wake_planned: AtomicU64,
    /// `wake` handled by keeping the CPUs polling in idle (see `crate::idlepoll`).
    pub wake_polled: AtomicU64,
    /// `replay` warm-ups sent on a fresh connection (see `crate::fresh`).
    pub replays_fresh: AtomicU64,
    /// `auto` announcements for a port without a measured choice.
    pub auto_unmeasured: AtomicU64,
    /// Not in `PreheatStats`: announcements dropped because the agent was disabled, and lines
    /// skipped because the profile was being swapped (also counted in `no_profile`).
    pub disabled_drops: AtomicU64,
    pub profile_busy: AtomicU64,
    /// Announcements a worker never saw because a newer one for it arrived first.
    pub superseded: AtomicU64,
}

pub static STATS: Stats = Stats::new();

impl Stats {
    const fn new() -> Stats {
        Stats {
            announcements: AtomicU64::new(0),
            malformed: AtomicU64::new(0),
            late: AtomicU64::new(0),
            no_profile: AtomicU64::new(0),
            preheats: AtomicU64::new(0),
            completed: AtomicU64::new(0),
            lines_preheated: AtomicU64::new(0),
            wake_spins: AtomicU64::new(0),
            replays: AtomicU64::new(0),
            replay_errors: AtomicU64::new(0),
            preheat_ns_total: AtomicU64::new(0),
            last_lines_done: AtomicU64::new(0),
            last_lines_total: AtomicU64::new(0),
            last_preheat_ns: AtomicU64::new(0),
            last_lead_ns: AtomicI64::new(0),
            last_trigger_lead_ns: AtomicI64::new(0),
            local_handoffs: AtomicU64::new(0),
            wake_planned: AtomicU64::new(0),
            wake_polled: AtomicU64::new(0),
            replays_fresh: AtomicU64::new(0),
            auto_unmeasured: AtomicU64::new(0),
            disabled_drops: AtomicU64::new(0),
            profile_busy: AtomicU64::new(0),
            superseded: AtomicU64::new(0),
        }
    }

    pub fn snapshot(&self) -> PreheatStats {
        PreheatStats {
            announcements: self.announcements.load(Relaxed),
            malformed: self.malformed.load(Relaxed),
            late: self.late.load(Relaxed),
            no_profile: self.no_profile.load(Relaxed),
            preheats: self.preheats.load(Relaxed),
            completed: self.completed.load(Relaxed),
            lines_preheated: self.lines_preheated.load(Relaxed),
            wake_spins: self.wake_spins.load(Relaxed),
            replays: self.replays.load(Relaxed),
            replay_errors: self.replay_errors.load(Relaxed),
            preheat_ns_total: self.preheat_ns_total.load(Relaxed),
            last_lines_done: self.last_lines_done.load(Relaxed),
            last_lines_total: self.last_lines_total.load(Relaxed),
            last_preheat_ns: self.last_preheat_ns.load(Relaxed),
            last_lead_ns: self.last_lead_ns.load(Relaxed),
            last_trigger_lead_ns: self.last_trigger_lead_ns.load(Relaxed),
            local_handoffs: self.local_handoffs.load(Relaxed),
            wake_planned: self.wake_planned.load(Relaxed),
            wake_polled: self.wake_polled.load(Relaxed),
            replays_fresh: self.replays_fresh.load(Relaxed),
            auto_unmeasured: self.auto_unmeasured.load(Relaxed),
        }
    }

    pub fn reset(&self) {
        for c in [
            &self.announcements,
            &self.malformed,
            &self.late,
            &self.no_profile,
            &self.preheats,
            &self.completed,
            &self.lines_preheated,
            &self.wake_spins,
            &self.replays,
            &self.replay_errors,
            &self.preheat_ns_total,
            &self.last_lines_done,
            &self.last_lines_total,
            &self.last_preheat_ns,
            &self.disabled_drops,
            &self.profile_busy,
            &self.superseded,
            &self.local_handoffs,
            &self.wake_planned,
            &self.wake_polled,
            &self.replays_fresh,
            &self.auto_unmeasured,
        ] {
            c.store(0, Relaxed);
        }
        self.last_lead_ns.store(0, Relaxed);
        self.last_trigger_lead_ns.store(0, Relaxed);
    }
}
