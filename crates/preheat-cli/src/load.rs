//! `preheat load`: a load generator that can announce what it sends.
//!
//! Modes: `idle-gap` (one request after each idle gap: the cold-start case) and `closed` (back to
//! back). Latency is measured from the *intended* send time — for a request paced to an arbiter
//! allocation or a local announcement, the allocated/announced time — to the full reply, into
//! an HdrHistogram, so waiting for a slot or a late send is never hidden (no coordinated
//! omission).
//!
//! Announcing:
//! * `--arbiter ADDR --key-file K`: the sender side of the centrally arbitrated network (paper
//!   §3.2): each request is a demand to the arbiter; the request is sent at the allocated slot,
//!   and the arbiter announces it to the receiver's preheatd. If the arbiter does not answer in
//!   time the request goes out unscheduled (fail-open) and is counted as such.
//! * `--announce-local`: announce through the local trigger API to every agent in the run dir
//!   (same host), `--lead-us` ahead, then send at the announced time.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use hdrhistogram::Histogram;
use preheat_model::proto::{Announcement, Strategies};
use serde::Serialize;

use crate::agentctl::{self, Announcer};
use crate::launch::Client;
use crate::paths;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
pub enum Mode {
    /// One request after each idle gap (the cold-start case).
    IdleGap,
    /// Back to back on one connection.
    Closed,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
pub enum Protocol {
    /// memcached text protocol: `get KEY` (the bundled server speaks it too).
    Memcached,
    /// HTTP/1.1 GET with keep-alive.
    Http,
}

#[derive(clap::Args, Debug)]
pub struct LoadArgs {
    /// Server address, HOST:PORT.
    #[arg(long)]
    pub target: String,
    #[arg(long, value_enum, default_value = "memcached")]
    pub protocol: Protocol,
    /// Key (memcached) or path (HTTP) to request.
    #[arg(long, default_value = "key:42")]
    pub key: String,
    #[arg(long, value_enum, default_value = "idle-gap")]
    pub mode: Mode,
    /// Requests to send.
    #[arg(long, default_value_t = 200)]
    pub requests: u64,
    /// Idle gap before each request in idle-gap mode, ms.
    #[arg(long, default_value_t = 20)]
    pub gap_ms: u64,
    /// Announce each request to the agents in the run dir (same host) this far ahead.
    #[arg(long, conflicts_with = "arbiter")]
    pub announce_local: bool,
    /// Request a timeslot from this arbiter for each request and send at the allocated time.
    #[arg(long)]
    pub arbiter: Option<String>,
    /// Pre-shared key file for the arbiter (hex).
    #[arg(long, requires = "arbiter")]
    pub key_file: Option<PathBuf>,
    /// This host's IPv4 address as the arbiter knows it (default: the address used to reach it).
    #[arg(long)]
    pub my_ip: Option<std::net::Ipv4Addr>,
    /// Give up on an allocation after this long and send unscheduled, ms.
    #[arg(long, default_value_t = 5)]
    pub arbiter_timeout_ms: u64,
    /// Lead time of local announcements, µs.
    #[arg(long, default_value_t = 65)]
    pub lead_us: u64,
    /// Strategies requested by local announcements.
    #[arg(long, default_value = "wake+lines")]
    pub strategies: String,
    /// After each request, ask the agents in the run dir (same filesystem: works across network
    /// namespaces) when the server thread really started on it and whether the preheat for its
    /// announcement finished in time: announcement accuracy and completion before arrival.
    #[arg(long)]
    pub observe: bool,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Serialize)]
pub struct LoadReport {
    pub label: &'static str,
    pub target: String,
    pub mode: Mode,
    pub announce: String,
    pub requests: u64,
    pub errors: u64,
    pub scheduled: u64,
    pub unscheduled: u64,
    pub p50_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
    pub mean_us: f64,
    /// Wait from asking for a slot to the allocated send time, µs (p50), scheduled requests.
    pub slot_wait_us_p50: f64,
    /// How late requests were really sent after their intended time, µs (p50 and p99).
    pub send_late_us_p50: f64,
    pub send_late_us_p99: f64,
    /// With --observe: server thread start − intended (announced) arrival, µs, p50 / p99, and
    /// how many requests that measure covers.
    pub server_start_us_p50: Option<f64>,
    pub server_start_us_p99: Option<f64>,
    pub observed: u64,
    /// With --observe: announcements acted on, and lines preheats that finished before the
    /// announced arrival, as counted by the agents during the run.
    pub agent_announcements: u64,
    pub agent_preheats: u64,
    pub agent_preheats_completed: u64,
    pub agent_late: u64,
}

fn request_bytes(a: &LoadArgs, host: &str) -> (Vec<u8>, Vec<u8>) {
    match a.protocol {
        Protocol::Memcached => (
            format!("get {}\r\n", a.key).into_bytes(),
            b"END\r\n".to_vec(),
        ),
        Protocol::Http => (
            format!("GET {} HTTP/1.1\r\nHost: {host}\r\n\r\n", a.key).into_bytes(),
            Vec::new(),
        ),
    }
}

pub fn run(a: LoadArgs) -> Result<()> {
    let report = generate(&a)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!(
            "{} requests to {} ({:?}, announce: {}) [measured, {} samples]: p50 {:.1} µs, p90 {:.1}, p99 {:.1}, max {:.1}; sent late by p50 {:.1} / p99 {:.1} µs; scheduled {}, unscheduled {}, errors {}",
            report.requests,
            report.target,
            report.mode,
            report.announce,
            report.requests - report.errors,
            report.p50_us,
            report.p90_us,
            report.p99_us,
            report.max_us,
            report.send_late_us_p50,
            report.send_late_us_p99,
            report.scheduled,
            report.unscheduled,
            report.errors
        );
        if a.observe {
            println!(
                "  observed at the agents [measured, {} samples]: server thread started p50 {} / p99 {} µs after the announced arrival; announcements {}, preheats {} ({} finished before arrival), late {}",
                report.observed,
                report.server_start_us_p50.map(|x| format!("{x:.1}")).unwrap_or_else(|| "-".into()),
                report.server_start_us_p99.map(|x| format!("{x:.1}")).unwrap_or_else(|| "-".into()),
                report.agent_announcements,
                report.agent_preheats,
                report.agent_preheats_completed,
                report.agent_late
            );
        }
    }
    Ok(())
}

pub fn generate(a: &LoadArgs) -> Result<LoadReport> {
    let target: SocketAddr = a
        .target
        .to_socket_addrs()
        .with_context(|| format!("resolving {}", a.target))?
        .next()
        .with_context(|| format!("{} resolves to nothing", a.target))?;
    let host = a
        .target
        .rsplit_once(':')
        .map(|x| x.0)
        .unwrap_or(&a.target)
        .to_string();
    let (req, until) = request_bytes(a, &host);
    let strategies = Strategies::parse(&a.strategies).map_err(anyhow::Error::msg)?;
    let mut client = Client::connect(target)?;
    let mut local = if a.announce_local {
        let dir = paths::run_dir();
        let pids = agentctl::discover(&dir);
        if pids.is_empty() {
            bail!("--announce-local: no agents in {}", dir.display());
        }
        Some(Announcer::new(&dir, &pids)?)
    } else {
        None
    };
    let mut sender = match &a.arbiter {
        Some(arb) => {
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
            Some(
                preheat_net::sender::Sender::new(
                    arb,
                    key,
                    my_ip.to_bits(),
                    Duration::from_millis(a.arbiter_timeout_ms),
                )
                .context("creating the arbiter sender")?,
            )
        }
        None => None,
    };
    let dst_ip = match target.ip() {
        std::net::IpAddr::V4(v4) => v4.to_bits(),
        std::net::IpAddr::V6(_) if sender.is_some() => {
            bail!("--arbiter: the arbiter names hosts by IPv4 address; {target} is IPv6")
        }
        std::net::IpAddr::V6(_) => 0,
    };
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3)?;
    let mut waits = Vec::new();
    let mut late = Vec::new();
    let mut starts = Vec::new();
    let observer = if a.observe {
        Some(Observer::new(target.port()))
    } else {
        None
    };
    let totals0 = observer.as_ref().map(|o| o.totals());
    let (mut errors, mut scheduled, mut unscheduled) = (0u64, 0u64, 0u64);
    // One warm-up request: the connection and the server's path for it exist.
    let _ = client.request(&req, &until);
    for _ in 0..a.requests {
        if a.mode == Mode::IdleGap {
            std::thread::sleep(Duration::from_millis(a.gap_ms));
        }
        let now = preheat_engine::time::now_ns();
        let intended = if let Some(s) = sender.as_mut() {
            match s.request(dst_ip, target.port(), 1) {
                preheat_net::sender::Grant::Scheduled { send_at_ns } => {
                    scheduled += 1;
                    waits.push(send_at_ns.saturating_sub(now) as f64 / 1e3);
                    s.wait_until(send_at_ns);
                    send_at_ns
                }
                preheat_net::sender::Grant::Unscheduled { .. } => {
                    unscheduled += 1;
                    preheat_engine::time::now_ns()
                }
            }
        } else if let Some(ann) = local.as_mut() {
            let arrival = now + a.lead_us * 1000;
            ann.send(Announcement {
                strategies,
                port: target.port(),
                seq: 0,
                arrival_ns: arrival,
                sent_ns: now,
                budget_ns: 0,
            });
            while preheat_engine::time::now_ns() < arrival {
                std::hint::spin_loop();
            }
            arrival
        } else {
            now
        };
        late.push(preheat_engine::time::now_ns().saturating_sub(intended) as f64 / 1e3);
        let ok = match a.protocol {
            Protocol::Memcached => client.request(&req, &until).is_ok(),
            Protocol::Http => client.request_http(&req).is_ok(),
        };
        let done = preheat_engine::time::now_ns();
        if !ok {
            errors += 1;
            client = Client::connect(target)?;
            continue;
        }
        hist.record(done.saturating_sub(intended).max(1))?;
        if let Some(o) = &observer {
            if let Some(start) = o.last_start(intended) {
                starts.push((start as f64 - intended as f64) / 1e3);
            }
        }
    }
    let totals = match (&observer, totals0) {
        (Some(o), Some(t0)) => {
            let t1 = o.totals();
            [t1[0] - t0[0], t1[1] - t0[1], t1[2] - t0[2], t1[3] - t0[3]]
        }
        _ => [0; 4],
    };
    let start = crate::stats::summarize(&starts);
    let us = |q: f64| hist.value_at_quantile(q) as f64 / 1e3;
    waits.sort_by(|x, y| x.total_cmp(y));
    let late = crate::stats::summarize(&late);
    Ok(LoadReport {
        label: "measured",
        target: a.target.clone(),
        mode: a.mode,
        announce: if a.arbiter.is_some() {
            "arbiter".into()
        } else if a.announce_local {
            format!("local {} µs, {}", a.lead_us, strategies.name())
        } else {
            "none".into()
        },
        requests: a.requests,
        errors,
        scheduled,
        unscheduled,
        p50_us: us(0.5),
        p90_us: us(0.9),
        p99_us: us(0.99),
        max_us: hist.max() as f64 / 1e3,
        mean_us: hist.mean() / 1e3,
        slot_wait_us_p50: waits.get(waits.len() / 2).copied().unwrap_or(0.0),
        send_late_us_p50: late.p50,
        send_late_us_p99: late.p99,
        server_start_us_p50: (start.n > 0).then_some(start.p50),
        server_start_us_p99: (start.n > 0).then_some(start.p99),
        observed: start.n as u64,
        agent_announcements: totals[0],
        agent_preheats: totals[1],
        agent_preheats_completed: totals[2],
        agent_late: totals[3],
    })
}

/// Reads the agents of the run dir, over control connections opened once.
struct Observer {
    agents: std::cell::RefCell<Vec<agentctl::AgentClient>>,
    port: u16,
}

impl Observer {
    fn new(port: u16) -> Observer {
        let dir = paths::run_dir();
        let agents = agentctl::discover(&dir)
            .into_iter()
            .filter_map(|pid| agentctl::AgentClient::connect(&dir, pid).ok())
            .collect();
        Observer {
            agents: std::cell::RefCell::new(agents),
            port,
        }
    }

    /// Status of every agent that still answers (agents that went away are dropped).
    fn statuses(&self) -> Vec<preheat_model::proto::Reply> {
        let mut out = Vec::new();
        self.agents.borrow_mut().retain_mut(|c| {
            match c.call(&preheat_model::proto::Request::Status) {
                Ok(r) => {
                    out.push(r);
                    true
                }
                Err(_) => false,
            }
        });
        out
    }

    /// The latest busy-period start for the port at or after `after_ns` − 1 ms, over all agents.
    /// The agent records a period when it ends, so poll briefly.
    fn last_start(&self, after_ns: u64) -> Option<u64> {
        let t0 = std::time::Instant::now();
        loop {
            let best = self
                .statuses()
                .into_iter()
                .filter_map(|r| match r {
                    preheat_model::proto::Reply::Status { ports, .. } => ports
                        .iter()
                        .find(|p| p.port == self.port)
                        .map(|p| p.last_start_ns),
                    _ => None,
                })
                .max();
            if let Some(b) = best.filter(|b| *b + 1_000_000 >= after_ns) {
                return Some(b);
            }
            if t0.elapsed() > Duration::from_millis(20) {
                return None;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// Summed agent counters: announcements, preheats, completed, late.
    fn totals(&self) -> [u64; 4] {
        let mut t = [0u64; 4];
        for r in self.statuses() {
            if let preheat_model::proto::Reply::Status { preheat, .. } = r {
                t[0] += preheat.announcements;
                t[1] += preheat.preheats;
                t[2] += preheat.completed;
                t[3] += preheat.late;
            }
        }
        t
    }
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
