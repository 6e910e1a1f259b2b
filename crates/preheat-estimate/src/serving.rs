//! Which agent serves a connection, and connections served by a given agent's process (a
//! prefork server's workers share one listening socket).

use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use preheat_launch::agentctl::AgentClient;
use preheat_launch::launch::Server;
use preheat_launch::servers::Workload;
use preheat_model::proto::{Reply, Request};

/// Find the agent (process) that serves the connection `via`: the one whose busy periods for the
/// port grow when we send requests on it. In a prefork server (worker processes sharing one
/// listening socket, each with its own agent) that is the worker that accepted `via`; the agents
/// then open their own loopback connections only where this process serves them (the agent's
/// `control/served.rs`). Callers pass the connection they measure on, so the agent they preheat
/// through is the one whose worker answers their requests.
pub fn serving_agent(server: &Server, via: &mut preheat_launch::servers::Requester) -> Result<u32> {
    let pids = server.agent_pids();
    if pids.len() == 1 {
        return Ok(pids[0]);
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
    let mut seen = pids;
    for _ in 0..ROUNDS {
        let before: Vec<(u32, u64)> = seen.iter().map(|p| (*p, count(*p))).collect();
        for _ in 0..REQUESTS {
            via.request_ok()?;
        }
        std::thread::sleep(Duration::from_millis(20));
        seen = server.agent_pids();
        let best = seen
            .iter()
            .map(|p| {
                let b = before.iter().find(|(q, _)| q == p).map_or(0, |(_, b)| *b);
                (*p, count(*p).saturating_sub(b))
            })
            .max_by_key(|(_, g)| *g);
        // Every request of the round (sent one after the other, each a busy period of its
        // own): one stray earlier request counted by an agent that just appeared is not enough.
        if let Some((pid, g)) = best {
            if g >= REQUESTS {
                return Ok(pid);
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
