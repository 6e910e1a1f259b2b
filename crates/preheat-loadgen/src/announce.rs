//! The two ways a request is announced ahead of its arrival: to the agents of the run directory
//! (same host) or through the arbiter of the centrally arbitrated network.

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use preheat_lab::load::{Announce, Grant};
use preheat_launch::agentctl::{self, Announcer};
use preheat_launch::paths;
use preheat_model::proto::{Announcement, Strategies};

use crate::params::LoadParams;

/// Local announcements: `arrival = max(earliest, now + lead)`, announced to every agent of the
/// run dir at once; the request is sent at the arrival time. If no agent accepted the
/// datagram the request counts as unscheduled (it still goes out at that time).
struct LocalAnnounce {
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
struct ArbiterAnnounce {
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

/// Makes the announcer of connection N.
type MakeAnnouncer = Box<dyn Fn(usize) -> Result<Box<dyn Announce>> + Sync>;

/// The announcer maker `a` asks for (`None`: requests are not announced): local
/// announcements to every agent of the run directory, or the arbiter's sender; the arbiter's
/// slot waits go into `slot_waits`.
pub(crate) fn announcers(
    a: &LoadParams,
    target: SocketAddr,
    strategies: Strategies,
    slot_waits: &Arc<Mutex<Vec<f64>>>,
) -> Result<Option<MakeAnnouncer>> {
    Ok(if a.announce_local {
        let dir = paths::run_dir();
        let pids = agentctl::discover(&dir);
        if pids.is_empty() {
            bail!(
                "--announce-local: no agents in {} (start the server with the agent: preheat run)",
                dir.display()
            );
        }
        let (lead_ns, port) = (a.lead_us * 1000, target.port());
        Some(Box::new(move |_conn| {
            Ok(Box::new(LocalAnnounce {
                announcer: Announcer::new(&dir, &pids)?,
                lead_ns,
                port,
                strategies,
            }) as Box<dyn Announce>)
        }))
    } else if let Some(arb) = &a.arbiter {
        let arb: SocketAddr = arb
            .to_socket_addrs()
            .with_context(|| format!("resolving {arb}"))?
            .next()
            .context("arbiter address resolves to nothing")?;
        let key_file = a.key_file.as_ref().context("--arbiter needs --key-file")?;
        let key = preheat_net::wire::Key::from_file(key_file)
            .map_err(|e| anyhow::anyhow!("{}: {e}", key_file.display()))?;
        let my_ip = match a.my_ip {
            Some(ip) => ip,
            None => local_ipv4_towards(arb)?,
        };
        let dst_ip = match target.ip() {
            std::net::IpAddr::V4(v4) => v4.to_bits(),
            std::net::IpAddr::V6(_) => {
                bail!("--arbiter: the arbiter names hosts by IPv4 address; {target} is IPv6")
            }
        };
        let timeout = Duration::from_millis(a.arbiter_timeout_ms);
        let waits = Arc::clone(slot_waits);
        let port = target.port();
        Some(Box::new(move |_conn| {
            let sender =
                preheat_net::sender::Sender::new(arb, key.clone(), my_ip.to_bits(), timeout)
                    .context("creating the arbiter sender")?;
            Ok(Box::new(ArbiterAnnounce {
                sender,
                dst_ip,
                port,
                waits: waits.clone(),
            }) as Box<dyn Announce>)
        }))
    } else {
        None
    })
}

/// The local IPv4 address the kernel would use to reach `to`.
fn local_ipv4_towards(to: SocketAddr) -> Result<std::net::Ipv4Addr> {
    let s = std::net::UdpSocket::bind("0.0.0.0:0")?;
    s.connect(to)?;
    match s.local_addr()?.ip() {
        std::net::IpAddr::V4(v4) => Ok(v4),
        other => bail!("no IPv4 route to {to} (local address {other})"),
    }
}
