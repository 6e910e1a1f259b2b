//! Everything preheatd counts: the receiver's gate counters, drops, dispatches, the registry's
//! size and the lead histogram, updated with relaxed atomics on the receive path (no locks, no
//! allocation), and their snapshots. [`crate::metrics`] exposes them; the receive loop, the
//! dispatcher and the registry update them.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};

/// Upper bounds of the lead histogram, ns (announced arrival − receipt time); the `+Inf`
/// bucket follows. 65 µs is the Fastpass lead the paper uses.
pub const LEAD_BOUNDS_NS: [i64; 9] = [
    0, 5_000, 10_000, 20_000, 40_000, 65_000, 100_000, 200_000, 1_000_000,
];

/// Histogram of announcement leads.
#[derive(Debug, Default)]
pub struct LeadHistogram {
    /// Per bucket (not cumulative); the last one is `+Inf`.
    buckets: [AtomicU64; 10],
    sum_ns: AtomicI64,
    count: AtomicU64,
}

impl LeadHistogram {
    pub fn observe(&self, lead_ns: i64) {
        let i = LEAD_BOUNDS_NS
            .iter()
            .position(|b| lead_ns <= *b)
            .unwrap_or(LEAD_BOUNDS_NS.len());
        self.buckets[i].fetch_add(1, Relaxed);
        self.sum_ns.fetch_add(lead_ns, Relaxed);
        self.count.fetch_add(1, Relaxed);
    }

    pub fn snapshot(&self) -> LeadSnapshot {
        LeadSnapshot {
            buckets: std::array::from_fn(|i| self.buckets[i].load(Relaxed)),
            sum_ns: self.sum_ns.load(Relaxed),
            count: self.count.load(Relaxed),
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LeadSnapshot {
    pub buckets: [u64; 10],
    pub sum_ns: i64,
    pub count: u64,
}

/// The receiver's gate counters (a copy of `preheat_net::wire::Counters`, so this module does
/// not depend on the network crate).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GateCounters {
    pub received: u64,
    pub malformed: u64,
    pub bad_mac: u64,
    pub replayed: u64,
    pub stale: u64,
    pub rate_limited: u64,
    pub accepted: u64,
}

/// Everything preheatd counts.
#[derive(Debug, Default)]
pub struct Stats {
    received: AtomicU64,
    malformed: AtomicU64,
    bad_mac: AtomicU64,
    replayed: AtomicU64,
    stale: AtomicU64,
    rate_limited: AtomicU64,
    accepted: AtomicU64,
    /// Dropped: less lead than `--min-lead-us` when received.
    pub late: AtomicU64,
    /// Dropped: no agent serves the port.
    pub no_agent: AtomicU64,
    /// Announcements delivered to at least one agent.
    pub dispatched: AtomicU64,
    /// Trigger datagrams that could not be sent (one per agent and announcement).
    pub send_errors: AtomicU64,
    /// Registry scans done.
    pub scans: AtomicU64,
    agents: AtomicU64,
    ports: AtomicU64,
    pub lead: LeadHistogram,
}

impl Stats {
    pub fn new() -> Stats {
        Stats::default()
    }

    /// Publish the receiver's counters (they are owned by the receive loop).
    pub fn set_gate(&self, g: &GateCounters) {
        self.received.store(g.received, Relaxed);
        self.malformed.store(g.malformed, Relaxed);
        self.bad_mac.store(g.bad_mac, Relaxed);
        self.replayed.store(g.replayed, Relaxed);
        self.stale.store(g.stale, Relaxed);
        self.rate_limited.store(g.rate_limited, Relaxed);
        self.accepted.store(g.accepted, Relaxed);
    }

    pub fn gate(&self) -> GateCounters {
        GateCounters {
            received: self.received.load(Relaxed),
            malformed: self.malformed.load(Relaxed),
            bad_mac: self.bad_mac.load(Relaxed),
            replayed: self.replayed.load(Relaxed),
            stale: self.stale.load(Relaxed),
            rate_limited: self.rate_limited.load(Relaxed),
            accepted: self.accepted.load(Relaxed),
        }
    }

    /// Publish the registry's size.
    pub fn set_registry(&self, agents: u64, ports: u64) {
        self.agents.store(agents, Relaxed);
        self.ports.store(ports, Relaxed);
    }

    pub fn snapshot(&self) -> StatsSnapshot {
        StatsSnapshot {
            gate: self.gate(),
            late: self.late.load(Relaxed),
            no_agent: self.no_agent.load(Relaxed),
            dispatched: self.dispatched.load(Relaxed),
            send_errors: self.send_errors.load(Relaxed),
            scans: self.scans.load(Relaxed),
            agents: self.agents.load(Relaxed),
            ports: self.ports.load(Relaxed),
            lead: self.lead.snapshot(),
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    pub gate: GateCounters,
    pub late: u64,
    pub no_agent: u64,
    pub dispatched: u64,
    pub send_errors: u64,
    pub scans: u64,
    pub agents: u64,
    pub ports: u64,
    pub lead: LeadSnapshot,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets() {
        let h = LeadHistogram::default();
        for lead in [-3_000, 0, 1, 5_000, 5_001, 65_000, 2_000_000] {
            h.observe(lead);
        }
        let s = h.snapshot();
        assert_eq!(s.buckets, [2, 2, 1, 0, 0, 1, 0, 0, 0, 1]);
        assert_eq!(s.count, 7);
        assert_eq!(s.sum_ns, -3_000 + 1 + 5_000 + 5_001 + 65_000 + 2_000_000);
    }
}
