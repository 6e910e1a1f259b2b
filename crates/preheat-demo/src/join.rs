//! Workers that join the announced set while the demo measures (issue 20, point 3).
//!
//! Where the server closes its connections, each request is a new connection that any worker
//! may accept, and which one does depends on the moment: `serving_agents` finds the workers
//! that served a few requests in a row before the measurement, but a worker that happened not
//! to serve those (lighttpd with two event-loop workers and keep-alive off: one worker took all
//! of them, then 7–29 of 60 measured requests per mode went to the other one, measured) is
//! never announced to, and its requests are served cold. So every announced sample also reads
//! the server's other agents (the spares: the master, workers not seen yet): a spare whose busy
//! period started at the arrival while no announced agent's did served the real request; it is
//! given the profile and the warm-up and announced to from the next request on, and the sample
//! is counted as not reaching a preheated process (it did not).

use std::path::PathBuf;

use anyhow::Result;
use preheat_launch::agentctl::AgentClient;
use preheat_model::proto::Request;

use crate::mode::agent_preheat;

/// A busy period that starts this little before the measured request's send time is that
/// request's (the agent's and the client's clocks are one, but the stamps differ by a few µs).
pub(crate) const SLACK_NS: u64 = 10_000;

/// What a joining agent is given, and the agents that may still join.
pub(crate) struct Join {
    pub port: u16,
    /// The working set (`None`: none recorded, the agent is outside the server).
    pub profile: Option<PathBuf>,
    /// The warm-up request and the end of its reply, where the announced agents replay.
    pub warm_up: Option<(Option<String>, Option<String>)>,
    /// (pid, agent) of the server's processes not announced to yet.
    pub spares: Vec<(u32, AgentClient)>,
    /// Pids that joined during the measurement, in order.
    pub joined: Vec<u32>,
}

impl Join {
    /// Give the agent `c` what every announced agent gets: the working set and the warm-up.
    pub fn give(&self, c: &mut AgentClient) -> Result<()> {
        if let Some(profile) = &self.profile {
            c.call(&Request::LoadProfile {
                path: profile.to_string_lossy().into_owned(),
            })?;
        }
        if let Some((replay, replay_until)) = &self.warm_up {
            c.call(&Request::Configure {
                port: self.port,
                replay: replay.clone(),
                replay_until: replay_until.clone(),
                split_cpus: vec![],
                replay_via: None,
            })?;
        }
        Ok(())
    }

    /// The spare that served the request sent at `t_send` (its busy period started then),
    /// configured and taken out of the spares; `None` when none did.
    pub fn served_by_spare(&mut self, t_send: u64) -> Result<Option<(u32, AgentClient)>> {
        let from = t_send.saturating_sub(SLACK_NS);
        let mut found = None;
        for (i, (_, c)) in self.spares.iter_mut().enumerate() {
            if agent_preheat(c, self.port)?.last_start_ns >= from {
                found = Some(i);
                break;
            }
        }
        let Some(i) = found else {
            return Ok(None);
        };
        let (pid, mut c) = self.spares.remove(i);
        self.give(&mut c)?;
        self.joined.push(pid);
        Ok(Some((pid, c)))
    }
}
