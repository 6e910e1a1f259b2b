//! From a network announcement to the local trigger datagrams.
//!
//! An accepted announcement ("a request for port P arrives at T") with at least the minimum
//! lead left is sent as a 40-byte [`Announcement`] to the trigger socket of every agent the
//! registry knows for P. Sends are non-blocking: an agent whose queue is full, or that died
//! since the last scan, costs one failed `send_to` and a count, never a wait.

use std::io;
use std::os::unix::net::UnixDatagram;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use preheat_model::proto::{Announcement, Strategies};

use crate::log::log_limited;
use crate::registry::RouteTable;
use crate::stats::Stats;
use crate::RescanSignal;

/// What became of one announcement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Less lead than the minimum when received (negative: arrival already past): dropped.
    Late { lead_ns: i64 },
    /// No agent serves the port: dropped (and a rescan requested).
    NoAgent,
    /// Sent to `sent` agents; `failed` sends failed.
    Dispatched {
        seq: u64,
        sent: usize,
        failed: usize,
    },
    /// Every send failed.
    Failed { failed: usize },
}

/// Sends announcements to the agents' trigger sockets.
pub struct Dispatcher {
    sock: UnixDatagram,
    strategies: Strategies,
    min_lead_ns: i64,
    seq: u64,
    table: Arc<RouteTable>,
    stats: Arc<Stats>,
    rescan: Arc<RescanSignal>,
}

impl Dispatcher {
    pub fn new(
        strategies: Strategies,
        min_lead: Duration,
        table: Arc<RouteTable>,
        stats: Arc<Stats>,
        rescan: Arc<RescanSignal>,
    ) -> io::Result<Dispatcher> {
        let sock = UnixDatagram::unbound()?;
        sock.set_nonblocking(true)?;
        Ok(Dispatcher {
            sock,
            strategies,
            min_lead_ns: i64::try_from(min_lead.as_nanos()).unwrap_or(i64::MAX),
            seq: 0,
            table,
            stats,
            rescan,
        })
    }

    /// The daemon's own sequence number of the last announcement it sent.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// Dispatch "a request for `port` arrives at `arrival_ns`", received at `now_ns` (both
    /// `CLOCK_MONOTONIC` of this host; `now_ns` also becomes the datagram's `sent_ns`).
    pub fn dispatch(&mut self, port: u16, arrival_ns: u64, now_ns: u64) -> Outcome {
        let lead_ns = (i128::from(arrival_ns) - i128::from(now_ns))
            .clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64;
        self.stats.lead.observe(lead_ns);
        if lead_ns < self.min_lead_ns {
            self.stats.late.fetch_add(1, Relaxed);
            log_limited("late", || {
                format!(
                    "dropped a late announcement for port {port}: {:.1} µs lead when received, \
                     minimum {:.1} µs",
                    lead_ns as f64 / 1e3,
                    self.min_lead_ns as f64 / 1e3
                )
            });
            return Outcome::Late { lead_ns };
        }
        let routes = self.table.get();
        let targets = routes.targets(port);
        if targets.is_empty() {
            self.stats.no_agent.fetch_add(1, Relaxed);
            self.rescan.request();
            log_limited("no-agent", || {
                format!("dropped an announcement for port {port}: no local agent serves it")
            });
            return Outcome::NoAgent;
        }
        self.seq += 1;
        let bytes = Announcement {
            strategies: self.strategies,
            port,
            seq: self.seq,
            arrival_ns,
            sent_ns: now_ns,
            budget_ns: 0,
        }
        .encode();
        let (mut sent, mut failed) = (0usize, 0usize);
        for t in targets {
            match self.sock.send_to(&bytes, &t.trigger) {
                Ok(_) => sent += 1,
                Err(e) => {
                    failed += 1;
                    self.stats.send_errors.fetch_add(1, Relaxed);
                    if matches!(
                        e.kind(),
                        io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused
                    ) {
                        // The agent is gone: do not wait for the next periodic scan.
                        self.rescan.request();
                    }
                    log_limited("send-error", || {
                        format!(
                            "cannot send an announcement for port {port} to the agent of pid {} \
                             ({}): {e}",
                            t.pid,
                            t.trigger.display()
                        )
                    });
                }
            }
        }
        if sent > 0 {
            self.stats.dispatched.fetch_add(1, Relaxed);
            Outcome::Dispatched {
                seq: self.seq,
                sent,
                failed,
            }
        } else {
            Outcome::Failed { failed }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::{Registry, StaticRoute};
    use preheat_model::proto::trigger_socket_name;

    const MS: u64 = 1_000_000;

    fn setup(
        dir: &std::path::Path,
        routes: Vec<StaticRoute>,
    ) -> (Dispatcher, Arc<Stats>, Arc<RescanSignal>, Registry) {
        let table = Arc::new(RouteTable::new());
        let stats = Arc::new(Stats::new());
        let rescan = Arc::new(RescanSignal::new());
        let mut reg = Registry::new(dir.to_path_buf(), routes);
        reg.scan();
        table.set(reg.routes());
        let d = Dispatcher::new(
            Strategies::WAKE.union(Strategies::LINES),
            Duration::from_micros(5),
            table,
            stats.clone(),
            rescan.clone(),
        )
        .unwrap();
        (d, stats, rescan, reg)
    }

    #[test]
    fn dispatch_late_no_agent_and_send() {
        let dir = tempfile::tempdir().unwrap();
        let me = std::process::id();
        // Our own "trigger socket" stands in for an agent's (the real agent is exercised by the
        // integration tests).
        let rx = UnixDatagram::bind(dir.path().join(trigger_socket_name(me))).unwrap();
        rx.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let (mut d, stats, rescan, _reg) = setup(
            dir.path(),
            vec![StaticRoute {
                port: 4242,
                pid: me,
            }],
        );
        let now = 1_000 * MS;

        // Late: lead below 5 µs, and already past.
        assert_eq!(
            d.dispatch(4242, now + 4_999, now),
            Outcome::Late { lead_ns: 4_999 }
        );
        assert_eq!(
            d.dispatch(4242, now - MS, now),
            Outcome::Late {
                lead_ns: -(MS as i64)
            }
        );
        assert_eq!(stats.late.load(Relaxed), 2);

        // Unknown port: no_agent, and a rescan is requested.
        assert_eq!(d.dispatch(1, now + MS, now), Outcome::NoAgent);
        assert_eq!(stats.no_agent.load(Relaxed), 1);
        assert!(rescan.wait(Duration::from_millis(1)));

        // Dispatched: the datagram is the trigger announcement.
        let out = d.dispatch(4242, now + 65_000, now);
        assert_eq!(
            out,
            Outcome::Dispatched {
                seq: 1,
                sent: 1,
                failed: 0
            }
        );
        let mut buf = [0u8; 128];
        let n = rx.recv(&mut buf).unwrap();
        let a = Announcement::decode(&buf[..n]).unwrap();
        assert_eq!(
            a,
            Announcement {
                strategies: Strategies(3),
                port: 4242,
                seq: 1,
                arrival_ns: now + 65_000,
                sent_ns: now,
                budget_ns: 0,
            }
        );
        assert_eq!(stats.dispatched.load(Relaxed), 1);
        let lead = stats.lead.snapshot();
        assert_eq!(lead.count, 4);
        assert_eq!(lead.buckets[0], 1, "the past one");

        // The "agent" goes away: the send fails, is counted, and never blocks.
        drop(rx);
        assert_eq!(
            d.dispatch(4242, now + MS, now),
            Outcome::Failed { failed: 1 }
        );
        assert_eq!(stats.send_errors.load(Relaxed), 1);
        assert!(rescan.wait(Duration::from_millis(1)));
    }

    #[test]
    fn full_agent_queue_never_blocks() {
        let dir = tempfile::tempdir().unwrap();
        let me = std::process::id();
        let _rx = UnixDatagram::bind(dir.path().join(trigger_socket_name(me))).unwrap();
        let (mut d, stats, _rescan, _reg) =
            setup(dir.path(), vec![StaticRoute { port: 7, pid: me }]);
        let t0 = std::time::Instant::now();
        let mut failed = 0;
        for i in 0..5_000u64 {
            if let Outcome::Failed { .. } = d.dispatch(7, 10 * MS + i, MS) {
                failed += 1;
            }
        }
        assert!(failed > 0, "a receive queue that is never read fills up");
        assert_eq!(stats.send_errors.load(Relaxed), failed);
        assert!(t0.elapsed() < Duration::from_secs(20));
    }
}
