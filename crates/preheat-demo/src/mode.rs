//! The demo's measurement vocabulary: its modes (how a request is made cold, what is announced),
//! one measured request ([`Sample`], as the JSON output's `samples` carry it), what the agent
//! says about a sample, and what the `wake` strategy runs as on this machine.

use anyhow::{bail, Result};
use preheat_model::proto::{Reply, Request, Strategies};
use serde::Serialize;

use preheat_launch::agentctl::AgentClient;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Hot,
    Warm,
    ColdIdle,
    ColdSweep,
    Control,
    Preheat(Strategies),
    /// `auto`: what its pilot chose (`NONE` until then, or when nothing was measured to help).
    Auto(Strategies),
    /// A diagnostic (`--connection-row`), not a strategy: after the cold-making step, one
    /// request on the measured connection, then the lead and `auto`'s announcement (its choice,
    /// as in [`Mode::Auto`]). What `auto` leaves above it is the state of the connection the
    /// request comes on, which a warm-up on a connection of its own does not reach.
    ConnPrimed(Strategies),
}

/// The name of [`Mode::ConnPrimed`]'s row.
pub(crate) const CONN_PRIMED: &str = "conn-primed";

impl Mode {
    pub(crate) fn name(self) -> String {
        match self {
            Mode::Hot => "hot".into(),
            Mode::Warm => "warm".into(),
            Mode::ColdIdle => "cold-idle".into(),
            Mode::ColdSweep => "cold-sweep".into(),
            Mode::Control => "control".into(),
            Mode::Preheat(s) => format!("preheat:{}", s.name()),
            Mode::Auto(_) => "preheat:auto".into(),
            Mode::ConnPrimed(_) => CONN_PRIMED.into(),
        }
    }

    /// What the mode announces (`None`: no announcement).
    pub(crate) fn announced(self) -> Option<Strategies> {
        match self {
            Mode::Preheat(s) => Some(s),
            Mode::Auto(s) | Mode::ConnPrimed(s) if !s.is_empty() => Some(s),
            _ => None,
        }
    }

    /// A preheat mode whose strategies include `replay`.
    pub(crate) fn replays(self) -> bool {
        matches!(self, Mode::Preheat(s) if s.contains(Strategies::REPLAY))
    }
}

/// The modes `a.strategies` asks for, after the baselines.
pub(crate) fn wanted_modes(a: &crate::params::DemoParams) -> Result<Vec<Mode>> {
    let mut wanted = vec![
        Mode::Hot,
        Mode::Warm,
        Mode::ColdIdle,
        Mode::ColdSweep,
        Mode::Control,
    ];
    for s in a.strategies.split(',').filter(|s| !s.trim().is_empty()) {
        let m = if s.trim() == "auto" {
            Mode::Auto(Strategies::NONE)
        } else {
            Mode::Preheat(Strategies::parse(s).map_err(anyhow::Error::msg)?)
        };
        if !wanted.contains(&m) {
            wanted.push(m);
        }
    }
    if a.connection_row {
        if !wanted.contains(&Mode::Auto(Strategies::NONE)) {
            bail!(
                "--connection-row compares against auto's row: add auto to --strategies (it is in the default)"
            );
        }
        wanted.push(Mode::ConnPrimed(Strategies::NONE));
    }
    Ok(wanted)
}

/// One measured request.
#[derive(Debug, Clone, Serialize)]
pub struct Sample {
    pub mode: String,
    pub round: usize,
    /// The request type (TPC-C-like: the round's transaction type; others: "request").
    pub kind: String,
    pub latency_us: f64,
    /// For preheat modes: what the agent reported for this announcement.
    pub lines_done: u64,
    pub lines_total: u64,
    pub preheat_us: f64,
    /// Arrival time minus the time the agent's worker started, µs.
    pub worker_lead_us: f64,
    /// Arrival time minus the time the agent's trigger thread received the announcement, µs.
    pub trigger_lead_us: f64,
    /// When the server thread started on the request (returned from its wait with it, as the
    /// agent saw), relative to the send time (announced modes: the announced arrival), µs.
    /// Every mode has it: the first stage of the response time (arrival and wake-up).
    pub server_start_us: f64,
    /// When the request left the client's transmit path (the kernel's software transmit stamp
    /// at the network device, loopback or veth), relative to the send time, µs; part of
    /// `server_start_us`. NaN where the client's socket gives no stamp.
    pub wire_us: f64,
    pub sweep_us: f64,
    /// Preheat modes: the preheated process's busy periods of the port grew while this sample
    /// was measured — false where no request of it reached that process (another process, a
    /// prefork server's other worker, answered); `None` for the other modes.
    pub served_by_preheated: Option<bool>,
    /// When the request was sent (announced modes: the announced arrival), `CLOCK_MONOTONIC`
    /// ns: what a trace of the same run (`perf record -k CLOCK_MONOTONIC`) is matched on.
    pub send_ns: u64,
    /// With `--syscall-stages`: the response time split at the server's system calls
    /// (the `sysstages` module), µs; NaN without the observer or where it saw no read and write.
    pub sys_to_event_us: f64,
    pub sys_to_read_us: f64,
    pub sys_compute_us: f64,
    pub sys_reply_us: f64,
}

impl Sample {
    /// A measured request; the agent's fields are filled in by the caller when it has them.
    pub(crate) fn new(
        mode: String,
        round: usize,
        kind: String,
        latency_us: f64,
        sweep_us: f64,
    ) -> Sample {
        Sample {
            mode,
            round,
            kind,
            latency_us,
            lines_done: 0,
            lines_total: 0,
            preheat_us: 0.0,
            worker_lead_us: 0.0,
            trigger_lead_us: 0.0,
            server_start_us: f64::NAN,
            wire_us: f64::NAN,
            sweep_us,
            served_by_preheated: None,
            send_ns: 0,
            sys_to_event_us: f64::NAN,
            sys_to_read_us: f64::NAN,
            sys_compute_us: f64::NAN,
            sys_reply_us: f64::NAN,
        }
    }

    /// What the agent did for this sample's announcement, from its counters before and after.
    pub(crate) fn fill_agent(
        &mut self,
        b: &preheat_model::proto::PreheatStats,
        after: &preheat_model::proto::PreheatStats,
    ) {
        let acted = after.preheats > b.preheats
            || after.wake_spins > b.wake_spins
            || after.wake_polled > b.wake_polled
            || after.replays > b.replays;
        if !acted {
            self.worker_lead_us = f64::NAN; // announcement not acted on (late/dropped)
            self.trigger_lead_us = f64::NAN;
            return;
        }
        // The lines counters are the agent's *last* lines preheat: only this announcement's if
        // it ran one (wake/replay alone leave them stale).
        if after.preheats > b.preheats {
            self.lines_done = after.last_lines_done;
            self.lines_total = after.last_lines_total;
            self.preheat_us = after.last_preheat_ns as f64 / 1e3;
        }
        self.worker_lead_us = after.last_lead_ns as f64 / 1e3;
        self.trigger_lead_us = after.last_trigger_lead_ns as f64 / 1e3;
    }
}

/// What the agent says after (or before) a sample.
pub(crate) struct AgentView {
    pub preheat: preheat_model::proto::PreheatStats,
    /// Start of the port's most recent busy period.
    pub last_start_ns: u64,
    /// The port's busy periods in the agent's process.
    pub busy_periods: u64,
}

/// The agent's preheat counters and the port's busy periods.
pub(crate) fn agent_preheat(c: &mut AgentClient, port: u16) -> Result<AgentView> {
    match c.call(&Request::Status)? {
        Reply::Status { preheat, ports, .. } => {
            let p = ports.iter().find(|p| p.port == port);
            Ok(AgentView {
                preheat,
                last_start_ns: p.map_or(0, |p| p.last_start_ns),
                busy_periods: p.map_or(0, |p| p.busy_periods),
            })
        }
        other => bail!("unexpected status reply {other:?}"),
    }
}

/// What the `wake` strategy runs as on this machine: the agent's idle polling
/// (`/dev/cpu_dma_latency`, every CPU) where the calibration measured polling mechanisms best
/// (or had no verdict), its spin on the server's core where spinning measured best.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WakeAs {
    Poll { calibrated: bool },
    Spin,
}

impl WakeAs {
    pub(crate) fn from_calibration(c: Option<&preheat_wake::calibrate::Calibration>) -> WakeAs {
        use preheat_wake::Mechanism;
        match c.and_then(|c| c.best) {
            Some(Mechanism::Spin) => WakeAs::Spin,
            Some(Mechanism::PmQos | Mechanism::DmaLatency) => WakeAs::Poll { calibrated: true },
            None => WakeAs::Poll { calibrated: false },
        }
    }

    /// The strategies to announce for `st`: `wake` replaced by `spin` where spinning is best.
    pub(crate) fn apply(self, st: Strategies) -> Strategies {
        if self == WakeAs::Spin && st.contains(Strategies::WAKE) {
            Strategies(st.0 & !Strategies::WAKE.0).union(Strategies::SPIN)
        } else {
            st
        }
    }

    /// Why this mechanism, from the calibration.
    pub(crate) fn why(self) -> &'static str {
        match self {
            WakeAs::Spin => "the calibration measured spinning best here",
            WakeAs::Poll { calibrated: true } => "the calibration measured idle polling best here",
            WakeAs::Poll { calibrated: false } => {
                "not shown by the calibration to beat plain idle here"
            }
        }
    }

    pub(crate) fn describe(self) -> String {
        match self {
            WakeAs::Spin => format!(
                "spin: the agent spins on the server's core through the arrival ({})",
                self.why()
            ),
            WakeAs::Poll { .. } => format!(
                "idle polling: the agent holds /dev/cpu_dma_latency at 0 µs for the window ({})",
                self.why()
            ),
        }
    }

    /// What the `wake` strategy ran as, from the agent's counters of this run (`wake_polled`,
    /// `wake_spins`; the outside stand-in counts the same), with the calibration's reason where it
    /// ran as the calibration chose.
    pub(crate) fn ran_as(
        self,
        outside: bool,
        counted: &preheat_model::proto::PreheatStats,
    ) -> String {
        let who = if outside {
            "from outside the server, a thread on its core"
        } else {
            "the agent"
        };
        let (polled, spun) = (counted.wake_polled, counted.wake_spins);
        let yielding = if outside { ", yielding every turn" } else { "" };
        let ran = match (polled > 0, spun > 0) {
            (false, false) => {
                return format!(
                    "nothing: no wake was counted in this run (intended: {})",
                    self.describe()
                )
            }
            (true, false) => format!(
                "idle polling: {who} holds /dev/cpu_dma_latency at 0 µs for the window ({polled} \
                 windows counted)"
            ),
            (false, true) => format!(
                "spin: {who} spins on the server's core through the arrival{yielding} ({spun} \
                 counted)"
            ),
            (true, true) => format!(
                "idle polling for {polled} windows and a spin for {spun} (a spin where too little \
                 lead was left to poll first, /dev/cpu_dma_latency could not be held, or an \
                 announcement asked for one)"
            ),
        };
        // As calibrated: (almost) every wake ran the calibrated way; a few spins of a short lead
        // before a polled window do not change what ran.
        let as_calibrated = match self {
            WakeAs::Spin => spun > 0 && polled * 100 <= spun,
            WakeAs::Poll { .. } => polled > 0 && spun * 100 <= polled,
        };
        if as_calibrated {
            format!("{ran}; {}", self.why())
        } else {
            format!(
                "{ran}; not what the calibration chose ({})",
                self.describe()
            )
        }
    }
}

#[cfg(test)]
mod ran_as_tests {
    use super::*;
    use preheat_model::proto::PreheatStats;

    fn counted(polled: u64, spun: u64) -> PreheatStats {
        PreheatStats {
            wake_polled: polled,
            wake_spins: spun,
            ..Default::default()
        }
    }

    #[test]
    fn the_wake_line_says_what_the_counters_saw() {
        let poll = WakeAs::Poll { calibrated: true };
        // Outside the server, polled as calibrated (the line used to say "spin" there).
        let s = poll.ran_as(true, &counted(12, 0));
        assert!(
            s.starts_with("idle polling: from outside the server"),
            "{s}"
        );
        assert!(s.contains("12 windows counted") && s.contains("measured idle polling best"));
        // Inside, calibrated polling that spun (no device): said, with the calibration's choice.
        let s = poll.ran_as(false, &counted(0, 7));
        assert!(
            s.starts_with("spin: the agent") && s.contains("7 counted"),
            "{s}"
        );
        assert!(s.contains("not what the calibration chose"), "{s}");
        // A spin host, spinning as chosen.
        let s = WakeAs::Spin.ran_as(true, &counted(0, 3));
        assert!(
            s.contains("yielding every turn") && s.contains("spinning best"),
            "{s}"
        );
        // Both, and none.
        let s = poll.ran_as(false, &counted(2, 1));
        assert!(
            s.contains("idle polling for 2 windows and a spin for 1"),
            "{s}"
        );
        assert!(s.contains("not what the calibration chose"), "{s}");
        // One spin of a short lead among 510 polled windows is still the calibrated way.
        let s = poll.ran_as(false, &counted(510, 1));
        assert!(s.contains("measured idle polling best"), "{s}");
        assert!(poll
            .ran_as(false, &counted(0, 0))
            .starts_with("nothing: no wake was counted"));
    }
}
