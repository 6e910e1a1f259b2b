//! Messages between the CLI, the agent and announcers.
//!
//! Two channels, both local to a host:
//!
//! * **Control** (`<run-dir>/agent-<pid>.sock`, a Unix stream socket): one JSON [`Request`] per
//!   line, one JSON [`Reply`] per line. Used by `preheat record`, `preheat agent status`,
//!   profile loading and configuration. Never on a latency-critical path.
//! * **Announcements** (`<run-dir>/agent-<pid>.trig`, a Unix datagram socket): fixed 40-byte
//!   binary [`Announcement`]s: "a request for port P arrives at time T". This is the trigger API:
//!   the load generator sends them today; the network arbiter's receiver daemon will send the same
//!   datagrams unchanged.
//!
//! Times are `CLOCK_MONOTONIC` nanoseconds of the receiving host.

use serde::{Deserialize, Serialize};

use crate::comm::{CommConfig, CommReport};
use crate::varint::Reader;
use thiserror::Error;

/// Default directory for agent sockets (overridden by `PREHEAT_RUN_DIR`).
pub const DEFAULT_RUN_DIR: &str = "/tmp/preheat";

/// File name of the control socket of the agent in process `pid` (inside the run dir).
pub fn control_socket_name(pid: u32) -> String {
    format!("agent-{pid}.sock")
}

/// File name of the announcement socket of the agent in process `pid`.
pub fn trigger_socket_name(pid: u32) -> String {
    format!("agent-{pid}.trig")
}

/// File name of the log of the agent in process `pid`.
pub fn log_name(pid: u32) -> String {
    format!("agent-{pid}.log")
}

/// The pid of an agent control socket's file name, `None` for any other name.
pub fn pid_of_control_socket(name: &str) -> Option<u32> {
    name.strip_prefix("agent-")?
        .strip_suffix(".sock")?
        .parse()
        .ok()
}

/// Preheat strategies, composable as bit flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct Strategies(pub u8);

impl Strategies {
    /// Keep the server's core from announcement to arrival out of halt (anticipatory wakeup,
    /// Zhu et al.) by the best mechanism the agent has: idle polling through the PM QoS device
    /// where it may open it (root), else spinning on the core.
    pub const WAKE: Strategies = Strategies(1);
    /// Prefetch the recorded working set (the paper's preheating).
    pub const LINES: Strategies = Strategies(2);
    /// Send a configured idempotent warm-up request through the real kernel path.
    pub const REPLAY: Strategies = Strategies(4);
    /// Keep the core awake by spinning on it, whatever else the agent could do (the mechanism
    /// `wake` falls back to; named on its own to compare the two in one run).
    pub const SPIN: Strategies = Strategies(8);
    /// Whatever was measured to help this port most ([`crate::auto`]): the agent replaces this
    /// bit by the port's configured choice (`Request::SetAuto`), or by
    /// [`Strategies::AUTO_UNMEASURED`] where none was configured. Other bits sent with it are
    /// kept.
    pub const AUTO: Strategies = Strategies(16);
    /// What `auto` does for a port with no measured choice: `wake+lines`, the default before
    /// `auto` (never measured slower than announcing nothing on the servers tried; the agent
    /// counts such announcements, `auto_unmeasured`).
    pub const AUTO_UNMEASURED: Strategies = Strategies(3);
    /// `wake+lines+replay`.
    pub const ALL: Strategies = Strategies(7);
    /// Every bit an announcement may carry.
    pub const KNOWN: Strategies = Strategies(31);
    pub const NONE: Strategies = Strategies(0);

    pub fn contains(self, o: Strategies) -> bool {
        self.0 & o.0 == o.0 && o.0 != 0
    }
    pub fn union(self, o: Strategies) -> Strategies {
        Strategies(self.0 | o.0)
    }
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }
    /// These strategies without the bits of `o`.
    pub fn without(self, o: Strategies) -> Strategies {
        Strategies(self.0 & !o.0)
    }
    /// Parse `wake+lines`, `lines,replay`, `all`, `none`.
    pub fn parse(s: &str) -> Result<Strategies, String> {
        let mut out = Strategies::NONE;
        for part in s.split(['+', ',']) {
            out = out.union(match part.trim() {
                "wake" => Strategies::WAKE,
                "lines" => Strategies::LINES,
                "replay" => Strategies::REPLAY,
                "spin" => Strategies::SPIN,
                "auto" => Strategies::AUTO,
                "all" => Strategies::ALL,
                "none" | "" => Strategies::NONE,
                other => {
                    return Err(format!(
                    "unknown strategy '{other}' (use auto, wake, spin, lines, replay, all, none; join with +)"
                ))
                }
            });
        }
        Ok(out)
    }
    /// `wake+lines` etc.
    pub fn name(self) -> String {
        let mut v = Vec::new();
        if self.contains(Strategies::AUTO) {
            v.push("auto");
        }
        if self.contains(Strategies::SPIN) {
            v.push("spin");
        } else if self.contains(Strategies::WAKE) {
            v.push("wake");
        }
        if self.contains(Strategies::LINES) {
            v.push("lines");
        }
        if self.contains(Strategies::REPLAY) {
            v.push("replay");
        }
        if v.is_empty() {
            "none".into()
        } else {
            v.join("+")
        }
    }
}

/// The end of the agent's error message for a probe cycle it skipped because the server's
/// mappings changed while it served the request (the CLI repeats such a cycle).
pub const ROUND_SKIPPED: &str = "round skipped";

/// How a probe cycle's error ends when the server closed the agent's probe connection (an idle
/// timeout of its keep-alive connections: Node's is 5 s): the client connects the probe anew
/// and repeats the cycle.
pub const PROBE_CONN_CLOSED: &str = "server closed the probe connection";

pub const ANNOUNCE_MAGIC: [u8; 4] = *b"PHAN";
pub const ANNOUNCE_VERSION: u8 = 1;
pub const ANNOUNCE_LEN: usize = 40;

/// "A request for `port` arrives at `arrival_ns`": the trigger datagram.
///
/// Layout (little endian): magic `PHAN`, version u8, strategies u8, port u16, seq u64,
/// arrival_ns u64, sent_ns u64, budget_ns u64 (how long preheating may take at most; 0 = until
/// arrival).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Announcement {
    pub strategies: Strategies,
    pub port: u16,
    pub seq: u64,
    pub arrival_ns: u64,
    pub sent_ns: u64,
    pub budget_ns: u64,
}

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum AnnounceError {
    #[error("announcement has {0} bytes, expected {ANNOUNCE_LEN}")]
    Length(usize),
    #[error("announcement has a bad magic")]
    Magic,
    #[error("announcement version {0} unsupported (expected {ANNOUNCE_VERSION})")]
    Version(u8),
    #[error("announcement has unknown strategy bits {0:#04x}")]
    Strategy(u8),
}

impl Announcement {
    /// When a `lines` walk that starts at `now_ns` must stop: `budget_ns` after the send (after
    /// `now_ns` where the sender gave no send time) where there is a budget, else the arrival.
    pub fn preheat_deadline(&self, now_ns: u64) -> u64 {
        if self.budget_ns == 0 {
            return self.arrival_ns;
        }
        let base = if self.sent_ns > 0 {
            self.sent_ns
        } else {
            now_ns
        };
        base.saturating_add(self.budget_ns)
    }

    pub fn encode(&self) -> [u8; ANNOUNCE_LEN] {
        let mut b = [0u8; ANNOUNCE_LEN];
        b[0..4].copy_from_slice(&ANNOUNCE_MAGIC);
        b[4] = ANNOUNCE_VERSION;
        b[5] = self.strategies.0;
        b[6..8].copy_from_slice(&self.port.to_le_bytes());
        b[8..16].copy_from_slice(&self.seq.to_le_bytes());
        b[16..24].copy_from_slice(&self.arrival_ns.to_le_bytes());
        b[24..32].copy_from_slice(&self.sent_ns.to_le_bytes());
        b[32..40].copy_from_slice(&self.budget_ns.to_le_bytes());
        b
    }

    /// Decode without allocating (usable on the agent's trigger path). Never panics (checked by
    /// clippy: no indexing, slicing or unwrapping here).
    #[deny(
        clippy::indexing_slicing,
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::unreachable
    )]
    pub fn decode(b: &[u8]) -> Result<Announcement, AnnounceError> {
        if b.len() != ANNOUNCE_LEN {
            return Err(AnnounceError::Length(b.len()));
        }
        // The length is right, so no read below runs out of bytes.
        let mut r = Reader::new(b);
        let short = |_| AnnounceError::Length(b.len());
        if r.array::<4>().map_err(short)? != ANNOUNCE_MAGIC {
            return Err(AnnounceError::Magic);
        }
        let version = r.u8().map_err(short)?;
        if version != ANNOUNCE_VERSION {
            return Err(AnnounceError::Version(version));
        }
        let strategies = r.u8().map_err(short)?;
        if strategies & !Strategies::KNOWN.0 != 0 {
            return Err(AnnounceError::Strategy(strategies));
        }
        Ok(Announcement {
            strategies: Strategies(strategies),
            port: r.u16_le().map_err(short)?,
            seq: r.u64_le().map_err(short)?,
            arrival_ns: r.u64_le().map_err(short)?,
            sent_ns: r.u64_le().map_err(short)?,
            budget_ns: r.u64_le().map_err(short)?,
        })
    }
}

/// An address range `[start, start + len)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Range {
    pub start: u64,
    pub len: u64,
}

/// Where a replay connection comes from when the server is reached over a network device rather
/// than its loopback (a server in a network namespace of its own behind a veth pair): opened in
/// the network namespace `netns` (a file such as `/proc/PID/ns/net`) to `addr`, so the warm-up
/// takes the path the clients' requests take. (The persistent replay connection only: a server
/// that closes every connection still gets its fresh warm-up connections on its loopback.)
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplayVia {
    pub netns: String,
    pub addr: std::net::IpAddr,
}

/// One `Request::ProbeCycle`: its fields sit beside `cmd` in the request's JSON object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProbeCycle {
    pub ranges: Vec<Range>,
    pub threshold: u32,
    pub window_pages: u32,
    pub seed: u64,
    pub port: u16,
    pub request: Option<String>,
    pub until: String,
    pub idle_ns: u64,
    /// Strided probing: only lines with `(addr / 64) % stride == phase` are flushed and
    /// probed; the others are kept cached so prefetches triggered by demand misses land on
    /// unprobed lines. Stride 1 probes every line.
    #[serde(default = "one")]
    pub stride: u32,
    #[serde(default)]
    pub phase: u32,
}

/// Control requests (CLI → agent), one JSON object per line, tagged by `cmd`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case")]
pub enum Request {
    /// Agent state and per-port counters.
    Status,
    /// Resident address ranges of the process's usable mappings (excluding the agent's own
    /// library and buffers): the candidate lines for the probe backend.
    Candidates,
    /// Calibrate the flush+reload hit/miss threshold in this process.
    Calibrate,
    /// Flush every line of `ranges` (start of one probe pass).
    ProbeFlush { ranges: Vec<Range> },
    /// Time a reload of every line of `ranges` (random order within `window_pages`-page windows,
    /// flushing after each probe) and return the lines that hit (`ticks < threshold`).
    ProbeReload {
        ranges: Vec<Range>,
        threshold: u32,
        window_pages: u32,
        seed: u64,
    },
    /// One whole probe pass inside the agent, with the shortest possible window between flush
    /// and reload (so little else — other processes sharing libraries, the agent's own control
    /// traffic — can touch the probed lines): validate `ranges` and prepare everything, flush,
    /// send `request` on the agent's own loopback connection to `port` and read until `until`
    /// (without a request: spin `idle_ns`, a no-request "noise" sample), wait until the server
    /// threads are idle, then reload as `ProbeReload`. `Reply::Probed.window_ns` is the time from
    /// the end of the flush to the start of the reload.
    ProbeCycle(ProbeCycle),
    /// Open (or keep) the `ProbeCycle` loopback connection to `port` and check that this
    /// process serves it: `request` is answered on it once (reply ending with `until`) and this
    /// process's busy periods of the port grow. An error says why not (another worker of a
    /// prefork server accepted it, or every worker is busy with another connection); the CLI
    /// then sends the probe's requests itself.
    ProbeConnect {
        port: u16,
        request: String,
        until: String,
    },
    /// [`Request::ProbeConnect`] on a connection the caller passes along with this request
    /// (`SCM_RIGHTS` on the control socket): one of the caller's that this process serves,
    /// where the agent's own new connections go to another worker of a prefork server. Checked
    /// as `ProbeConnect` checks its own (one exchange, this process's busy periods grow). The
    /// caller leaves the connection alone until [`Request::ProbeRelease`].
    ProbeAdopt {
        port: u16,
        request: String,
        until: String,
    },
    /// Close the `ProbeCycle` connection (an adopted one goes back to its caller alone).
    ProbeRelease,
    /// Load and resolve a `.phws` profile (replaces the current one).
    LoadProfile { path: String },
    /// Drop the loaded profile.
    UnloadProfile,
    /// Configure a port: the warm-up request for the `replay` strategy (raw bytes as a string
    /// with `\r\n` already decoded), the response terminator to drain, the CPUs used to
    /// split a `lines` preheat (empty: only the serving core), and where the replay connection
    /// comes from (`None`: this process's loopback).
    Configure {
        port: u16,
        replay: Option<String>,
        replay_until: Option<String>,
        split_cpus: Vec<u32>,
        #[serde(default)]
        replay_via: Option<ReplayVia>,
    },
    /// The `replay` warm-up of `port` on a connection the caller passes along with this request
    /// (`SCM_RIGHTS` on the control socket): a session the caller opened where the protocol
    /// needs one before any request (a MySQL login and prepared statements), `request` the
    /// warm-up's bytes and `until` the bytes its reply ends with. Checked as
    /// [`Request::ProbeAdopt`] checks its connection (one exchange; this process's busy periods
    /// grow); it then is the port's replay connection, never reopened by the agent (it could not
    /// log in). A later `Configure` of the port replaces it.
    ConfigureSession {
        port: u16,
        request: Vec<u8>,
        until: Vec<u8>,
    },
    /// What an `auto` announcement for `port` does (`None`: forget the choice, so `auto` does
    /// [`Strategies::AUTO_UNMEASURED`]); set from a measured choice (`preheat run --auto`).
    SetAuto {
        port: u16,
        strategies: Option<Strategies>,
    },
    /// Turn the agent off (hooks become pass-through) or on again.
    SetEnabled { enabled: bool },
    /// Hold the server's threads polling their event waits until a request expected at
    /// `arrival_ns` (CLOCK_MONOTONIC) has come, as a `replay` warm-up leaves them (the agent's
    /// hold); 0 closes an open hold. The demo's hot floor asks for it before its priming
    /// request, so that no preheated row can start its request sooner than the floor does.
    Hold { arrival_ns: u64 },
    /// Start communication detection (shared-pages sampling) with this configuration.
    CommStart {
        #[serde(default)]
        config: CommConfig,
    },
    /// Stop communication detection (every revoked page is restored; the matrix is kept).
    CommStop,
    /// Zero the communication matrix and counters (the paper resets after start-up).
    CommReset,
    /// The communication matrix and counters.
    CommReport,
}

impl Request {
    /// The request's name on the wire (its `cmd`), for messages.
    pub fn name(&self) -> &'static str {
        match self {
            Request::Status => "status",
            Request::Candidates => "candidates",
            Request::Calibrate => "calibrate",
            Request::ProbeFlush { .. } => "probe_flush",
            Request::ProbeReload { .. } => "probe_reload",
            Request::ProbeCycle(_) => "probe_cycle",
            Request::ProbeConnect { .. } => "probe_connect",
            Request::ProbeAdopt { .. } => "probe_adopt",
            Request::ProbeRelease => "probe_release",
            Request::LoadProfile { .. } => "load_profile",
            Request::UnloadProfile => "unload_profile",
            Request::Configure { .. } => "configure",
            Request::ConfigureSession { .. } => "configure_session",
            Request::SetAuto { .. } => "set_auto",
            Request::SetEnabled { .. } => "set_enabled",
            Request::Hold { .. } => "hold",
            Request::CommStart { .. } => "comm_start",
            Request::CommStop => "comm_stop",
            Request::CommReset => "comm_reset",
            Request::CommReport => "comm_report",
        }
    }
}

fn one() -> u32 {
    1
}

/// Per-port counters kept by the agent.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortStats {
    pub port: u16,
    /// Busy periods attributed to this port.
    pub busy_periods: u64,
    /// Sum of their durations.
    pub busy_ns: u64,
    /// CPU and thread of the most recent busy period (where the next request will be served).
    pub last_cpu: u32,
    pub last_tid: u32,
    /// Start of the most recent busy period (CLOCK_MONOTONIC ns): when the last request really
    /// arrived at the server thread, for comparing with its announced arrival.
    #[serde(default)]
    pub last_start_ns: u64,
}

/// Counters of the preheat path.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreheatStats {
    pub announcements: u64,
    /// Dropped: malformed datagram.
    pub malformed: u64,
    /// Dropped: arrival time already past when received.
    pub late: u64,
    /// Announcements for a port with no loaded working set (lines skipped).
    pub no_profile: u64,
    pub preheats: u64,
    /// Preheats that finished all lines before the deadline.
    pub completed: u64,
    pub lines_preheated: u64,
    pub wake_spins: u64,
    pub replays: u64,
    pub replay_errors: u64,
    /// Sum of preheat durations (lines strategy), for a mean.
    pub preheat_ns_total: u64,
    /// Most recent preheat: lines done / total and duration.
    pub last_lines_done: u64,
    pub last_lines_total: u64,
    pub last_preheat_ns: u64,
    /// Most recent lead: arrival − time the worker started, ns (negative: late).
    pub last_lead_ns: i64,
    /// Most recent lead when the trigger thread received the announcement: arrival − receipt.
    #[serde(default)]
    pub last_trigger_lead_ns: i64,
    /// Announcements the trigger thread handled itself, already on the serving CPU.
    #[serde(default)]
    pub local_handoffs: u64,
    /// `wake` requests handed to the wake planner (a PM QoS window) instead of a spin.
    #[serde(default)]
    pub wake_planned: u64,
    /// `wake` handled by keeping the CPUs polling in idle for the window (the agent's PM QoS
    /// request) instead of a spin.
    #[serde(default)]
    pub wake_polled: u64,
    /// `replay` warm-ups sent on a fresh connection each, served by whichever of the server's
    /// processes accepted it (servers that close connections; prefork workers busy with their
    /// client's connection).
    #[serde(default)]
    pub replays_fresh: u64,
    /// `auto` announcements for a port without a measured choice (run as
    /// [`Strategies::AUTO_UNMEASURED`]).
    #[serde(default)]
    pub auto_unmeasured: u64,
}

/// Summary of a loaded profile class.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoadedClass {
    pub port: u16,
    pub lines: u64,
    pub runs: u64,
    pub skipped_lines: u64,
}

/// Control replies, tagged by `reply`. (`Status` is much larger than the other variants; a
/// reply is built once per control request, never on a hot path, so it is not boxed.)
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "reply", rename_all = "snake_case")]
pub enum Reply {
    Status {
        pid: u32,
        exe: String,
        enabled: bool,
        /// Why the agent disabled itself, if it did.
        disabled_reason: Option<String>,
        threads_seen: u32,
        ports: Vec<PortStats>,
        preheat: PreheatStats,
        profile: Option<String>,
        classes: Vec<LoadedClass>,
    },
    Candidates {
        ranges: Vec<Range>,
        total_bytes: u64,
    },
    Calibration {
        hit_ticks_p50: u32,
        miss_ticks_p50: u32,
        threshold: u32,
        samples: u32,
    },
    Probed {
        hits: Vec<u64>,
        probed: u64,
        elapsed_ns: u64,
        /// `ProbeCycle` only: flush end to reload start.
        #[serde(default)]
        window_ns: u64,
    },
    Loaded {
        path: String,
        classes: Vec<LoadedClass>,
        skipped_regions: Vec<String>,
    },
    Ok,
    Error {
        message: String,
    },
    Comm(CommReport),
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A probe cycle's fields sit beside `cmd` (the wire format agents and callers of every
    /// version share), and a request without `stride` and `phase` probes every line.
    #[test]
    fn a_probe_cycle_is_one_flat_json_object() {
        let text = r#"{"cmd":"probe_cycle","ranges":[],"threshold":200,"window_pages":16,"seed":7,"port":80,"request":null,"until":"\n","idle_ns":0}"#;
        let r: Request = serde_json::from_str(text).unwrap();
        let Request::ProbeCycle(c) = &r else {
            panic!("{r:?}")
        };
        assert_eq!((c.stride, c.phase, c.port), (1, 0, 80));
        let back = serde_json::to_value(&r).unwrap();
        assert_eq!(back["cmd"], "probe_cycle");
        assert_eq!(back["threshold"], 200);
        assert_eq!(back["stride"], 1);
    }

    #[test]
    fn a_walk_stops_at_the_arrival_or_at_its_budget() {
        let a = Announcement {
            strategies: Strategies::LINES,
            port: 1,
            seq: 0,
            arrival_ns: 1_000,
            sent_ns: 0,
            budget_ns: 0,
        };
        assert_eq!(a.preheat_deadline(500), 1_000);
        let budget = Announcement { budget_ns: 30, ..a };
        assert_eq!(budget.preheat_deadline(500), 530, "no send time: from now");
        let sent = Announcement {
            sent_ns: 400,
            ..budget
        };
        assert_eq!(sent.preheat_deadline(500), 430, "from the send");
    }

    #[test]
    fn announcement_roundtrip_and_rejects() {
        let a = Announcement {
            strategies: Strategies::WAKE.union(Strategies::LINES),
            port: 11211,
            seq: 9,
            arrival_ns: 123_456_789,
            sent_ns: 123_000_000,
            budget_ns: 0,
        };
        let b = a.encode();
        assert_eq!(Announcement::decode(&b), Ok(a));
        assert_eq!(
            Announcement::decode(&b[..39]),
            Err(AnnounceError::Length(39))
        );
        let mut bad = b;
        bad[0] = b'X';
        assert_eq!(Announcement::decode(&bad), Err(AnnounceError::Magic));
        let mut bad = b;
        bad[4] = 9;
        assert_eq!(Announcement::decode(&bad), Err(AnnounceError::Version(9)));
        let mut bad = b;
        bad[5] = 0x80;
        assert_eq!(
            Announcement::decode(&bad),
            Err(AnnounceError::Strategy(0x80))
        );
    }

    #[test]
    fn socket_names_roundtrip() {
        assert_eq!(pid_of_control_socket(&control_socket_name(42)), Some(42));
        assert_eq!(pid_of_control_socket(&trigger_socket_name(42)), None);
        assert_eq!(pid_of_control_socket("agent-x.sock"), None);
    }

    #[test]
    fn strategies_parse() {
        assert_eq!(Strategies::parse("wake+lines").unwrap().0, 3);
        assert_eq!(Strategies::parse("all").unwrap(), Strategies::ALL);
        assert!(Strategies::parse("warp").is_err());
        assert_eq!(Strategies(5).name(), "wake+replay");
        assert_eq!(Strategies::parse("auto").unwrap(), Strategies::AUTO);
        assert_eq!(
            Strategies::parse("auto+replay").unwrap().name(),
            "auto+replay"
        );
        assert_eq!(
            Strategies::parse("auto+wake")
                .unwrap()
                .without(Strategies::AUTO),
            Strategies::WAKE
        );
    }

    #[test]
    fn control_json_shape() {
        let r: Request =
            serde_json::from_str(r#"{"cmd":"load_profile","path":"/x.phws"}"#).unwrap();
        assert_eq!(
            r,
            Request::LoadProfile {
                path: "/x.phws".into()
            }
        );
        let s = serde_json::to_string(&Reply::Ok).unwrap();
        assert_eq!(s, r#"{"reply":"ok"}"#);
    }
}
