//! Which agent serves a connection, and connections served by a given agent's process (a
//! prefork server's workers share one listening socket).

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use preheat_launch::agentctl::AgentClient;
use preheat_launch::launch::Server;
use preheat_launch::progress::Progress;
use preheat_launch::servers::Workload;
use preheat_model::proto::{Reply, Request};

/// The agents (processes) that serve a port's requests sent on one client connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Serving {
    /// The one that served most of them (all of them, where one process serves the
    /// connection): the one recorded and measured through.
    pub primary: u32,
    /// Every agent that served one of them, `primary` first; more than one where the server
    /// hands each request to any of its workers (a prefork server that closes its
    /// connections).
    pub all: Vec<u32>,
}

/// Find the agent (process) that serves the connection `via`: the one whose busy periods for the
/// port grow when we send requests on it. In a prefork server (worker processes sharing one
/// listening socket, each with its own agent) that is the worker that accepted `via`; the agents
/// then open their own loopback connections only where this process serves them (the agent's
/// `control/served.rs`). Callers pass the connection they measure on, so the agent they preheat
/// through is the one whose worker answers their requests. See [`serving_agents`] for servers
/// whose requests go to any worker.
pub fn serving_agent(server: &Server, via: &mut preheat_launch::servers::Requester) -> Result<u32> {
    serving_agents(server, via).map(|s| s.primary)
}

/// [`serving_agent`], and where no single process serves the requests of `via` (the server
/// closes the connection after each reply and any worker accepts the next), every process that
/// served some: an announcement must then reach all of them.
pub fn serving_agents(
    server: &Server,
    via: &mut preheat_launch::servers::Requester,
) -> Result<Serving> {
    let pids = server.agent_pids();
    if pids.len() == 1 {
        return Ok(Serving {
            primary: pids[0],
            all: pids,
        });
    }
    let count = |pid: u32| -> u64 {
        AgentClient::connect(&server.run_dir, pid)
            .and_then(|mut c| port_busy_periods(&mut c, server.spec.port))
            .unwrap_or(0)
    };
    const REQUESTS: u64 = 4;
    // A prefork server's workers start their agents after the master's (which `launch` waited
    // for): an agent that appears while we look counts from zero, and a round in which no agent
    // saw all the requests (they went to a worker whose agent was not up yet) is repeated.
    const ROUNDS: usize = 10;
    // Rounds in which the agents together saw every request but none saw them all, before
    // the requests are taken to go to any worker.
    const SPREAD_ROUNDS: usize = 3;
    let mut seen = pids;
    let mut spread: Vec<(u32, u64)> = Vec::new();
    let mut spread_rounds = 0;
    for _ in 0..ROUNDS {
        let before: Vec<(u32, u64)> = seen.iter().map(|p| (*p, count(*p))).collect();
        for _ in 0..REQUESTS {
            via.request_ok()?;
        }
        std::thread::sleep(Duration::from_millis(20));
        seen = server.agent_pids();
        let gains: Vec<(u32, u64)> = seen
            .iter()
            .map(|p| {
                let b = before.iter().find(|(q, _)| q == p).map_or(0, |(_, b)| *b);
                (*p, count(*p).saturating_sub(b))
            })
            .collect();
        // Every request of the round (sent one after the other, each a busy period of its
        // own): one stray earlier request counted by an agent that just appeared is not enough.
        if let Some(&(pid, g)) = gains.iter().max_by_key(|(_, g)| *g) {
            if g >= REQUESTS {
                return Ok(Serving {
                    primary: pid,
                    all: vec![pid],
                });
            }
        }
        if gains.iter().map(|(_, g)| g).sum::<u64>() >= REQUESTS {
            spread_rounds += 1;
            for (p, g) in gains.into_iter().filter(|(_, g)| *g > 0) {
                match spread.iter_mut().find(|(q, _)| *q == p) {
                    Some(e) => e.1 += g,
                    None => spread.push((p, g)),
                }
            }
            if spread_rounds >= SPREAD_ROUNDS {
                spread.sort_by_key(|(p, g)| (std::cmp::Reverse(*g), *p));
                return Ok(Serving {
                    primary: spread[0].0,
                    all: spread.into_iter().map(|(p, _)| p).collect(),
                });
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    bail!(
        "none of the server's {} agents ({seen:?}) saw the requests sent to port {} ({ROUNDS} \
         rounds of {REQUESTS}): its serving threads are not tracked (they neither wait in \
         epoll/poll/select nor block reading an accepted connection)",
        seen.len(),
        server.spec.port
    )
}

/// The busy periods of `port` the agent behind `agent` has seen.
fn port_busy_periods(agent: &mut AgentClient, port: u16) -> Result<u64> {
    Ok(match agent.call(&Request::Status)? {
        Reply::Status { ports, .. } => ports
            .iter()
            .find(|p| p.port == port)
            .map_or(0, |p| p.busy_periods),
        _ => 0,
    })
}

/// Open connections with `open` (which sends one request on each) until one is served by the
/// agent's process: a prefork server's worker that accepts from the shared listening socket may
/// be another one. Such connections are closed and another is opened, up to a bound.
pub(crate) fn served_by<T>(
    server: &Server,
    agent: &mut AgentClient,
    mut open: impl FnMut() -> Result<T>,
) -> Result<T> {
    const ATTEMPTS: usize = 24;
    for _ in 0..ATTEMPTS {
        let before = port_busy_periods(agent, server.spec.port)?;
        let c = open()?;
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_millis(50) {
            if port_busy_periods(agent, server.spec.port)? > before {
                return Ok(c);
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    bail!(
        "none of {ATTEMPTS} connections to port {} was served by pid {}",
        server.spec.port,
        agent.pid
    )
}

/// A connection of workload `w` that the process of the agent `pid` serves (see `served_by`).
pub fn connect_served_by(
    server: &Server,
    pid: u32,
    w: &Workload,
) -> Result<preheat_launch::servers::Requester> {
    let mut agent = AgentClient::connect(&server.run_dir, pid)?;
    served_by(server, &mut agent, || {
        let mut c = w.connect(server.addr())?;
        c.request_ok()?;
        Ok(c)
    })
}

/// Sends `p.warm_up` requests through `send` before the samples, with a progress bar when
/// there are many (under Valgrind a JVM's thousands take minutes).
pub fn warm_up(
    p: &crate::params::RecordParams,
    mut send: impl FnMut() -> Result<()>,
    progress: &dyn Progress,
) -> Result<()> {
    let many = p.warm_up > crate::params::DEFAULT_WARM_UP;
    if many {
        progress.start(u64::from(p.warm_up), "warm-up");
    }
    for _ in 0..p.warm_up {
        send().context("a warm-up request")?;
        if many {
            progress.inc(1);
        }
    }
    if many {
        progress.finish();
    }
    Ok(())
}
