//! The two ways a request is announced ahead of its arrival: to the agents of the run directory
//! (same host) or through the arbiter of the centrally arbitrated network.

use std::sync::{Arc, Mutex};

use preheat_lab::load::{Announce, Grant};
use preheat_launch::agentctl::Announcer;
use preheat_model::proto::{Announcement, Strategies};

/// Local announcements: `arrival = max(earliest, now + lead)`, announced to every agent of the
/// run dir at once; the request is sent at the arrival time. If no agent accepted the
/// datagram the request counts as unscheduled (it still goes out at that time).
pub(crate) struct LocalAnnounce {
    pub announcer: Announcer,
    pub lead_ns: u64,
    pub port: u16,
    pub strategies: Strategies,
}

impl Announce for LocalAnnounce {
    fn grant(&mut self, earliest_ns: u64) -> Grant {
        let now = preheat_engine::time::now_ns();
        let arrival = earliest_ns.max(now + self.lead_ns);
        let accepted = self.announcer.send(Announcement {
            strategies: self.strategies,
            port: self.port,
            seq: 0,
            arrival_ns: arrival,
            sent_ns: now,
            budget_ns: 0,
        });
        Grant {
            send_at_ns: arrival,
            scheduled: accepted > 0,
        }
    }

    fn lead_ns(&self) -> u64 {
        self.lead_ns
    }
}

/// The arbiter: one demand per request; scheduled → send at the slot, unscheduled → now
/// (fail-open).
pub(crate) struct ArbiterAnnounce {
    pub sender: preheat_net::sender::Sender,
    pub dst_ip: u32,
    pub port: u16,
    pub waits: Arc<Mutex<Vec<f64>>>,
}

impl Announce for ArbiterAnnounce {
    fn grant(&mut self, _earliest_ns: u64) -> Grant {
        let now = preheat_engine::time::now_ns();
        match self.sender.request(self.dst_ip, self.port, 1) {
            preheat_net::sender::Grant::Scheduled { send_at_ns } => {
                if let Ok(mut w) = self.waits.lock() {
                    w.push(send_at_ns.saturating_sub(now) as f64 / 1e3);
                }
                Grant {
                    send_at_ns,
                    scheduled: true,
                }
            }
            preheat_net::sender::Grant::Unscheduled { .. } => Grant {
                send_at_ns: preheat_engine::time::now_ns(),
                scheduled: false,
            },
        }
    }
}
