//! One measured request of one mode, from the same starting point every time: a priming request
//! (every mode starts from a just-served state), the mode's way to go cold, the lead, the
//! request, and what the agent saw of it. The table's rounds and `auto`'s pilot both measure
//! through [`Bench::sample`].
//!
//! **The client does the same in every mode; only the server's state differs** (the paper's
//! client, on cores with their own last-level cache, flushes or not, triggers preheating or
//! not, then sends). So every mode's client spins through the lead before it sends — announced
//! modes because the request arrives `lead` after its announcement, the others so that their
//! client side (its CPU awake, its send path as warm) matches. Until commit 9682226 only the
//! announced modes did: hot and warm were a request sent right behind the priming one (the server
//! thread had barely blocked), cold a request sent by a client just back from its sleep. Hot is
//! therefore a server kept awake with warm caches that idled one lead, and warm one whose CPU
//! slept through it.
//!
//! **The client's CPU never sleeps.** The cold-making steps used to sleep the client (the idle
//! interval, the gap after the sweep, the control's wait) and moved it onto the server's CPU to
//! sweep, so its own CPU halted in the cold modes only. On the EPYC `haltpoll` host the client's
//! transmit path (the *wire* stage) then took 18–30 µs in cold-sweep and 9–12 µs in the
//! preheated modes against 3–4 µs hot and warm, and as long after a sleep with no sweep at all
//! (`cold-idle`): the client's own cold start, counted in every cold mode and left above the
//! floor by every strategy (why a slept vCPU's path is slower — the host's use of the idle core,
//! its sleep states — is not measured here). The paper's client runs on other cores, busy, with
//! a last-level cache of its own. So the client now spins through each of those waits, and a
//! sweeper thread pinned to the server's CPU sweeps while the client spins on its own
//! ([`crate::sweeper`]): only the server's CPU idles, sleeps and goes cold. Measured: *wire* in
//! cold-sweep 9–15 µs, with `auto` 6–7 µs (three runs against three of the old way, alternated);
//! on the Xeon `none` host the same change had measured no difference (README).
//!
//! **The client's own path stays warm.** Spinning still left the client's transmit and the
//! loopback's receive path (both on the client's CPU) colder after the milliseconds of a
//! cold-making step than after the one lead that precedes `hot` and `warm` — by the client's
//! own waiting, not by the sweep: `cold-idle`, which sweeps nothing, had as slow a *wire*
//! (14.8–27.4 µs against cold-sweep's 10.5–25.4 in six demo runs, slower in four).
//! So the client pings itself over the loopback through those waits ([`crate::warmth`], where
//! the measurements are), and the lead is the same plain spin in every mode.
//!
//! **Nothing talks to the server's processes between going cold and the send.** The agents'
//! counters are read before the cold-making step, and that step and the lead are
//! [`ColdPath`]'s, which holds no agent connection (see there for what it cost when the
//! counters were read after it).

use std::time::Duration;

use anyhow::Result;
use preheat_model::proto::{Announcement, Strategies};

use crate::hot::KeepAwake;
use crate::join::Join;
use crate::mode::{agent_preheat, AgentView, Mode, Sample, WakeAs};
use preheat_engine::time::{now_ns, spin_until};
use preheat_launch::agentctl::{AgentClient, Announcer};
use preheat_launch::servers::Requester;

/// Everything a sample needs: the client, the agents, and the way to cold and to the send.
pub(crate) struct Bench<'a> {
    pub client: Requester,
    pub agent: AgentClient,
    /// The agents of the server's other processes that serve the port, where its requests go
    /// to any worker (each is announced to, like `agent`).
    pub others: Vec<AgentClient>,
    /// The server's other agents, which join `others` once one serves a measured request.
    pub join: Join,
    pub cold: ColdPath,
    pub keep_awake: Option<&'a KeepAwake>,
    pub server_cpu: usize,
    /// Replies that were not what the server should answer.
    pub bad_replies: usize,
    /// Why the first wrong reply was wrong.
    pub first_bad: Option<String>,
    /// Whether the hot floor held the server's threads polling (see [`HotHold`]).
    pub hot_hold: HotHold,
    /// `--syscall-stages`: the observer on the serving process.
    pub sys: Option<crate::sysstages::SysStages>,
}

/// The hot floor's hold of the server's threads: before the priming request of a `hot` sample,
/// the agents are asked to keep the server's threads polling their event waits until the
/// request (`Request::Hold`), as a `replay` warm-up leaves them. Without it the floor was no
/// lower bound where the CPUs cannot poll in idle: with the calibrated spinner instead (the
/// `none` variant's mechanism, emulated on the EPYC `haltpoll` host, 2026-11-29), a woken server
/// thread had to preempt the spinner (hot's *start* 20–25 µs) while `replay`'s hold kept it
/// running (*start* 11–19 µs), and `auto` removed 95–113% of the cold overhead, the demo
/// flagging every share above 100%. With the hold (same host later that day, the calibration
/// then choosing the spinner, kv demo, two runs each way alternated): hot 12.6 / 15.8 µs, below
/// warm (14.5 / 18.5), *start* 6.0 / 7.0 µs, against 25.6 / 33.7 µs without — above warm, no
/// floor. From outside the server there is no hold (the stand-in refuses it): the floor is
/// then the CPUs kept awake alone, as the outside `replay` is.
#[derive(Debug, Default)]
pub(crate) struct HotHold {
    /// `None`: not asked yet; `Some(Ok(()))`: held; `Some(Err(why))`: refused.
    pub held: Option<Result<(), String>>,
    /// The last priming request's duration, ns: the hold's expected arrival is one priming and
    /// one lead away.
    priming_ns: u64,
}

impl HotHold {
    /// The hot floor's note with the hold said.
    pub fn describe(&self, note: &str) -> String {
        match &self.held {
            Some(Ok(())) => format!(
                "{note}; the server's threads held polling their waits through the lead (the \
                 agent's hold, as `replay` leaves them)"
            ),
            Some(Err(why)) => format!("{note}; the server's threads not held ({why})"),
            None => note.to_string(),
        }
    }
}

/// How long a sample waits for the request's busy period to end before judging where it was
/// served (usually it has ended within the 300 µs every sample waits anyway).
const BUSY_PERIOD_WAIT_NS: u64 = 20_000_000;

/// Whether any agent's port saw a busy period more than `before` says.
fn any_new_period(views: &[AgentView], before: &[AgentView]) -> bool {
    views
        .iter()
        .zip(before)
        .any(|(v, b)| v.busy_periods > b.busy_periods)
}

/// From a just-served state to the moment the request is sent: the mode's cold-making step,
/// then the lead (announced where the mode announces). It holds **no connection to an agent**
/// on purpose: nothing may talk to the server's processes in between, or the server's CPU
/// wakes before the announcement and the preheated rows get a head start that `cold-sweep`
/// does not (an in-process agent's status exchange did that until commit f9a1118: its control
/// thread runs on the server's CPU, which then took the announcement in its polling idle phase).
pub(crate) struct ColdPath {
    pub announcer: Announcer,
    pub sweep: crate::sweeper::Sweeper,
    /// The client's own path, exercised through every wait of a cold-making step.
    pub warmth: crate::warmth::ClientWarmth,
    pub wake: WakeAs,
    pub port: u16,
    pub lead_us: u64,
    pub idle_ms: u64,
    pub post_gap_us: u64,
    /// The last sweep's duration (the control mode waits as long).
    pub sweep_ns_recent: u64,
}

impl ColdPath {
    /// Go cold the way `mode` does, then wait the lead (announcing what `mode` announces);
    /// the sweep's duration (µs, 0 without one) and the send time (the arrival).
    fn go_cold_and_announce(&mut self, mode: Mode) -> Result<(f64, u64)> {
        let sweep_us = self.go_cold(mode)?;
        let t_send = self.announce(mode.announced().unwrap_or(Strategies::NONE));
        Ok((sweep_us, t_send))
    }

    /// Go cold the way `mode` does; the sweep's duration, µs (0 without one). The client spins
    /// through every wait here and through the sweep (module docs: its CPU never sleeps), and
    /// keeps its own path warm meanwhile ([`crate::warmth`]).
    fn go_cold(&mut self, mode: Mode) -> Result<f64> {
        Ok(match mode {
            Mode::Hot | Mode::Warm => 0.0,
            Mode::ColdIdle => {
                self.warmth.until(now_ns() + self.idle_ms * 1_000_000)?;
                0.0
            }
            Mode::ColdSweep | Mode::Preheat(_) | Mode::Auto(_) | Mode::ConnPrimed(_) => {
                // On the server's CPU, by the sweeper: the client stays on its own
                // ([`crate::sweeper`]).
                let warmth = &mut self.warmth;
                let mut last = 0;
                let ns = self.sweep.sweep(|| warmth.tick(&mut last))?;
                self.sweep_ns_recent = ns;
                self.warmth.until(now_ns() + self.post_gap_us * 1000)?;
                ns as f64 / 1e3
            }
            Mode::Control => {
                self.warmth
                    .until(now_ns() + self.sweep_ns_recent + self.post_gap_us * 1000)?;
                0.0
            }
        })
    }

    /// Announce `st` (as the calibrated wake mechanism runs it) `lead` ahead and wait for the
    /// arrival; the send time (the arrival). Nothing to announce: the same wait, unannounced.
    fn announce(&mut self, st: Strategies) -> u64 {
        let now = now_ns();
        let arrival = now + self.lead_us * 1000;
        if st.is_empty() {
            spin_until(arrival);
            return arrival;
        }
        self.announcer.send(Announcement {
            strategies: self.wake.apply(st),
            port: self.port,
            seq: 0,
            arrival_ns: arrival,
            sent_ns: now,
            budget_ns: 0,
        });
        spin_until(arrival);
        arrival
    }
}

impl<'a> Bench<'a> {
    pub fn new(
        (client, agent, others, join): (Requester, AgentClient, Vec<AgentClient>, Join),
        cold: ColdPath,
        keep_awake: Option<&'a KeepAwake>,
        server_cpu: usize,
    ) -> Bench<'a> {
        Bench {
            client,
            agent,
            others,
            join,
            cold,
            keep_awake,
            server_cpu,
            bad_replies: 0,
            first_bad: None,
            hot_hold: HotHold::default(),
            sys: None,
        }
    }

    /// Ask every agent of the server to hold its threads until one priming request and one
    /// lead from now ([`HotHold`]); once refused, never again.
    fn hold_server_threads(&mut self) {
        if matches!(self.hot_hold.held, Some(Err(_))) {
            return;
        }
        let arrival_ns = now_ns() + self.hot_hold.priming_ns + self.cold.lead_us * 1000;
        let req = preheat_model::proto::Request::Hold { arrival_ns };
        let mut refused = None;
        for a in std::iter::once(&mut self.agent).chain(self.others.iter_mut()) {
            if let Err(e) = a.call(&req) {
                refused = Some(format!("{e:#}"));
            }
        }
        self.hot_hold.held = Some(refused.map_or(Ok(()), Err));
    }

    /// Measure one request of `mode` in `round` (of request kind `kind`).
    pub fn sample(&mut self, mode: Mode, round: usize, kind: &str) -> Result<Sample> {
        let hot = match (mode, self.keep_awake) {
            (Mode::Hot, Some(k)) => Some(k),
            _ => None,
        };
        if let Some(k) = hot {
            k.hold();
            self.hold_server_threads();
        }
        let t_priming = now_ns();
        self.client.request_ok()?;
        self.hot_hold.priming_ns = now_ns() - t_priming;
        // The wire stage: the kernel stamps the connection's sends (enabled once; a connection
        // reopened inside the request is not stamped and gives none).
        self.client.stamp_sends();
        // The agents' counters before the announcement, read *before* going cold: after it,
        // the status exchange woke the server's CPU ([`ColdPath`]). Measured (kv, 200 µs lead,
        // EPYC haltpoll, scheduler trace): the trigger ran 28 µs after the send (p50, 50
        // rounds) against 43 µs for a stand-in outside the server, whose control thread runs
        // elsewhere.
        let before = match mode.announced() {
            Some(_) => Some(self.views()?),
            None => None,
        };
        // The same lead for every mode, announced or not (module docs).
        let (sweep_us, t_send) = self.go_cold_and_announce(mode)?;
        let ok = self.client.request()?;
        let t_done = now_ns();
        let wire = self.client.sent_at_ns();
        if let Some(k) = hot {
            k.release();
        }
        if !ok {
            self.bad_replies += 1;
            let why = self
                .client
                .last_error()
                .unwrap_or_else(|| "no reason given".into());
            eprintln!(
                "demo: a wrong reply in round {round} ({}): {why}",
                mode.name()
            );
            self.first_bad.get_or_insert(why);
        }
        let mut s = Sample::new(
            mode.name(),
            round,
            kind.to_string(),
            (t_done - t_send) as f64 / 1e3,
            sweep_us,
        );
        s.send_ns = t_send;
        if let Some(w) = wire.filter(|&w| w <= t_done) {
            s.wire_us = (w as f64 - t_send as f64).max(0.0) / 1e3;
        }
        // Give the server thread and the agent's worker time to finish their bookkeeping (the
        // busy period ends when the server waits again) before reading it.
        std::thread::sleep(Duration::from_micros(300));
        if let Some(sp) = self.sys.as_mut().and_then(|st| st.sample(t_send, t_done)) {
            (s.sys_to_event_us, s.sys_to_read_us) = (sp.to_event_us, sp.to_read_us);
            (s.sys_compute_us, s.sys_reply_us) = (sp.compute_us, sp.reply_us);
        }
        let views = self.views_after(before.as_deref())?;
        // The process that served the request: the one whose latest busy period started last
        // (one process, but for a server whose requests go to any worker).
        let Some(i) = (0..views.len()).max_by_key(|&i| views[i].last_start_ns) else {
            return Ok(s);
        };
        let view = &views[i];
        if before.is_some() && self.spare_served(&views, t_send)? {
            // A worker that was not announced to served it: what it measured is not a
            // preheated process's (and from the next request on, it is announced to).
            s.served_by_preheated = Some(false);
            return Ok(s);
        }
        if view.last_start_ns >= t_send.saturating_sub(self.cold.lead_us * 1000) {
            s.server_start_us = (view.last_start_ns as f64 - t_send as f64) / 1e3;
        }
        if let Some(b) = before {
            // At least one busy period: a warm-up and the measured request may share one (the
            // server picks both up in one wake-up), so more cannot be required. Requiring also
            // that the port's last period began after the announcement failed on the JVM
            // hand-off server in the suite (3 of 3 rounds of one mode read "not reached"; why
            // its last-ended period began earlier is not established). The count can include
            // the priming request's period where that ends only after `before` was read.
            s.served_by_preheated = Some(any_new_period(&views, &b));
            s.fill_agent(&b[i].preheat, &view.preheat);
        }
        Ok(s)
    }

    /// Go cold and announce as `mode` does ([`ColdPath`]); the diagnostic [`Mode::ConnPrimed`]
    /// makes its one request on the measured connection in between. The sweep's duration (µs)
    /// and the send time.
    fn go_cold_and_announce(&mut self, mode: Mode) -> Result<(f64, u64)> {
        let Mode::ConnPrimed(st) = mode else {
            return self.cold.go_cold_and_announce(mode);
        };
        let sweep_us = self.cold.go_cold(mode)?;
        if !self.client.request()? {
            self.bad_replies += 1;
        }
        Ok((sweep_us, self.cold.announce(st)))
    }

    /// Whether a spare served the request sent at `t_send` (no announced agent's busy period
    /// started then, a spare's did); that spare then joins the announced agents.
    fn spare_served(&mut self, views: &[AgentView], t_send: u64) -> Result<bool> {
        let from = t_send.saturating_sub(crate::join::SLACK_NS);
        if self.join.spares.is_empty() || views.iter().any(|v| v.last_start_ns >= from) {
            return Ok(false);
        }
        let Some((pid, c)) = self.join.served_by_spare(t_send)? else {
            return Ok(false);
        };
        eprintln!(
            "demo: pid {pid} served a measured request without being announced to: it gets the \
             working set and the warm-up and is announced to from now on"
        );
        self.cold.announcer.add(pid);
        self.others.push(c);
        Ok(true)
    }

    /// [`Bench::views`] once the request's busy period has ended where `before` (the views
    /// before going cold) is given. A busy period ends when the server waits again, which a
    /// loaded machine can delay past the sample's sleep (Node.js closes the connection and runs
    /// its next loop turn first: in a suite run one of three requests of a mode read as "not
    /// reached" so): it is waited for a little longer before the sample judges.
    fn views_after(&mut self, before: Option<&[AgentView]>) -> Result<Vec<AgentView>> {
        let mut views = self.views()?;
        if let Some(b) = before {
            let until = now_ns() + BUSY_PERIOD_WAIT_NS;
            while !any_new_period(&views, b) && now_ns() < until {
                std::thread::sleep(Duration::from_micros(500));
                views = self.views()?;
            }
        }
        Ok(views)
    }

    /// What every preheated agent saw: `agent` first, then `others`.
    fn views(&mut self) -> Result<Vec<AgentView>> {
        let port = self.cold.port;
        std::iter::once(&mut self.agent)
            .chain(self.others.iter_mut())
            .map(|a| agent_preheat(a, port))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hot_floor_says_whether_the_server_threads_were_held() {
        let mut h = HotHold::default();
        assert_eq!(h.describe("kept awake by dma"), "kept awake by dma");
        h.held = Some(Ok(()));
        assert!(h
            .describe("kept awake by dma")
            .ends_with("(the agent's hold, as `replay` leaves them)"));
        h.held = Some(Err("hold needs the in-process agent".into()));
        assert_eq!(
            h.describe("kept awake by spin"),
            "kept awake by spin; the server's threads not held (hold needs the in-process agent)"
        );
    }
}
