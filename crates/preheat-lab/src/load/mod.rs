//! The load-generation engine (paper §4: the client side of every measurement).
//!
//! Three ways of pacing requests ([`Mode`]):
//!
//! * **open loop**: each connection is an independent Poisson process at `rate / connections`
//!   (the superposition of independent Poisson processes is Poisson at `rate`), seeded from
//!   `seed + connection` so runs are reproducible. Every intended send time is fixed in advance
//!   from the run start ([`Poisson`]); a slow reply makes later requests on that connection go out
//!   late, and their latency still counts from their *intended* time. That is the rule against
//!   coordinated omission: a stall shows up in the latency of every request that should have been
//!   sent during it, not only in the one request that was stuck.
//! * **idle gap**: sleep `gap`, then send one request (the cold-start case); intended = the time
//!   the gap ended.
//! * **closed loop**: back to back on each connection; intended = now.
//!
//! With an [`Announce`] the engine asks for a send time before every measured request. In open
//! loop the request is still measured from its intended (Poisson) time, so a wait for a slot
//! counts. In idle-gap and closed mode the *granted* time is the intended time: an announced
//! request is meant to arrive at the announced time, and that is what the receiver preheats for.
//!
//! Waiting for a send time sleeps until ~150 µs before it, then spins, so long gaps do not burn a
//! CPU and the send itself is precise.
//!
//! **Threads.** By default every connection has its own client thread and a synchronous
//! [`Driver::request`] (the *thread-per-connection* loop; [`Wait::Block`] blocks in `read`,
//! [`Wait::Spin`] busy-polls the socket). With [`LoadConfig::threads`] below the number of
//! connections, or with [`Wait::Epoll`] for any threads ≤ connections (one connection on one
//! thread included), the *event loop* runs instead ([`LoadSummary::client_loop`] says which
//! ran): thread `t` drives the connections `c` with `c % threads == t` (like wrk `-t T -c C`),
//! through the drivers' non-blocking [`Driver::send_request`] / [`Driver::poll_reply`]: closed loop keeps
//! one request outstanding on every connection (a completed reply is recorded and the next
//! request goes out); open loop keeps each connection's own Poisson schedule and sends when the
//! intended time has come and nothing is outstanding on that connection, measuring from the
//! intended time as above. The thread waits in `epoll_wait` ([`Wait::Block`] and [`Wait::Epoll`]:
//! until a reply arrives or ~150 µs before the next scheduled send) and then reads the ready
//! sockets, as event-loop clients (memcaslap, wrk, redis-benchmark) do, or polls every
//! connection in turn ([`Wait::Spin`]). Idle-gap mode and announcements need the
//! thread-per-connection loop (a run that asks for the event loop with them, by fewer threads
//! or by [`Wait::Epoll`], is rejected), as do drivers without the multiplexed path (MySQL).
//!
//! Latencies (ns) go into one HdrHistogram per connection (1 ns .. 60 s, 3 significant digits),
//! merged at the end; per-request [`Record`]s go through a channel to a writer thread, so the
//! measuring threads never wait for I/O.
//!
//! # Files
//!
//! Dependencies run one way, from the types here down to [`run`]: [`pacing`](Poisson) (the
//! arrival process, waiting for a send time) and [`records`](RecordSink) (the writer thread)
//! know only these types; `conn` is one connection that reopens after a transport failure;
//! `shared` is the state the client threads share and how a measured request is counted; the
//! two client loops (`thread_per_connection`, `event_loop`) build on those; `run` validates a
//! configuration, starts the loops and merges what they measured.

mod conn;
mod event_loop;
mod pacing;
mod records;
mod run;
mod shared;
mod thread_per_connection;

use std::time::Duration;

use serde::{Deserialize, Serialize};

#[cfg(doc)]
use crate::driver::Driver;
use crate::driver::Wait;

pub use pacing::{poisson_gaps_ns, wait_until, Poisson};
pub use records::{csv_header, CsvSink, RecordSink};
pub use run::run;

/// How requests are paced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Open loop: Poisson arrivals at `rate` per second (over all connections; each connection
    /// is an independent Poisson process at rate/connections). A request that cannot go out at
    /// its intended time (the previous reply on its connection is still outstanding) is sent
    /// late and its latency still counts from the intended time.
    Open,
    /// One request after each idle gap (the cold-start case).
    IdleGap,
    /// Back to back on each connection.
    Closed,
}

impl Mode {
    /// The name used on the command line, in JSON and in records.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Open => "open",
            Mode::IdleGap => "idle-gap",
            Mode::Closed => "closed",
        }
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct LoadConfig {
    pub mode: Mode,
    /// Stop after this many measured requests (all connections together) ...
    pub requests: Option<u64>,
    /// ... or after this long (whichever comes first; at least one must be set).
    pub duration: Option<Duration>,
    /// Open loop: offered load, requests per second over all connections.
    pub rate: f64,
    /// Idle-gap mode: the gap before each request.
    pub gap: Duration,
    /// Connections.
    pub connections: usize,
    /// Client threads: 0 or `connections` = one thread per connection with a blocking
    /// [`Driver::request`] (except with [`Wait::Epoll`]); fewer = each thread multiplexes
    /// `connections / threads` (±1) connections (see the module docs). Not with idle-gap mode
    /// or announcements.
    pub threads: usize,
    /// How a client thread waits (pass the same as the drivers' own wait). Event loop: `Block`
    /// and `Epoll` wait in `epoll_wait`, `Spin` polls the connections in turn. `Epoll` always
    /// runs the event loop (also with threads == connections); with `Block` and `Spin` one
    /// thread per connection runs the synchronous [`Driver::request`] (the drivers wait
    /// themselves).
    pub wait: Wait,
    /// Unmeasured requests per connection before measuring.
    pub warmup: u64,
    /// Seed of the arrival process (runs are reproducible).
    pub seed: u64,
    /// Strategy label written into every record (e.g. "none", "wake+lines").
    pub strategy: String,
}

/// When a request may go out. Implemented by the CLI for local announcements (announce
/// `arrival = max(earliest, now + lead)` and send then) and for the arbiter (ask for a slot).
pub trait Announce: Send {
    /// Called before each measured request with the earliest time it should go out; returns
    /// the time it will be sent (the engine spins until then).
    fn grant(&mut self, earliest_ns: u64) -> Grant;

    /// How long before `earliest` [`Announce::grant`] wants to be called (open loop: the engine
    /// calls it this far ahead of the intended time, so an announcement `lead` ahead does not
    /// delay the request). Default 0: at the intended time.
    fn lead_ns(&self) -> u64 {
        0
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    pub send_at_ns: u64,
    /// False: the request goes out unannounced/unscheduled (fail-open).
    pub scheduled: bool,
}

/// One measured request (a row of the records CSV: the field order is the column order).
#[derive(Debug, Clone, Serialize)]
pub struct Record {
    pub seq: u64,
    pub conn: u32,
    pub mode: Mode,
    /// Idle gap before this request, µs: intended time − the previous reply on this connection
    /// (0 outside idle-gap mode).
    #[serde(serialize_with = "micros")]
    pub gap_us: f64,
    /// Intended send time (arrival process / gap end), CLOCK_MONOTONIC ns. In idle-gap and
    /// closed mode with an announcer, the granted (announced) time.
    pub intended_ns: u64,
    /// Granted send time (== intended without announcements).
    pub granted_ns: u64,
    /// When it really went out, and when the whole reply was read.
    pub sent_ns: u64,
    pub done_ns: u64,
    /// done − intended, µs: includes any wait for a slot or a busy connection.
    #[serde(serialize_with = "micros")]
    pub latency_us: f64,
    pub kind: &'static str,
    pub ok: bool,
    /// The announcer granted a slot / announced it (false without an announcer).
    pub scheduled: bool,
    pub strategy: String,
}

/// A duration in µs to the nanosecond (3 decimals): what the clock resolves, no more.
fn micros<S: serde::Serializer>(v: &f64, s: S) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_f64((v * 1e3).round() / 1e3)
}

/// Which client loop ran a load.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ClientLoop {
    /// One thread per connection, each in the synchronous [`Driver::request`].
    ThreadPerConnection,
    /// Threads multiplexing their connections through [`Driver::send_request`] /
    /// [`Driver::poll_reply`] (in `epoll_wait`, or polling with [`Wait::Spin`]).
    EventLoop,
}

impl ClientLoop {
    /// The name used in JSON ("thread-per-connection", "event-loop").
    pub fn name(self) -> &'static str {
        match self {
            ClientLoop::ThreadPerConnection => "thread-per-connection",
            ClientLoop::EventLoop => "event-loop",
        }
    }
}

/// Totals of a run. Every latency is measured on this machine from the intended send time.
#[derive(Debug, Clone, Serialize)]
pub struct LoadSummary {
    pub label: &'static str,
    pub mode: Mode,
    pub connections: usize,
    /// Client threads (== connections: one per connection).
    pub threads: usize,
    /// The client loop that really ran (reported by the client threads themselves).
    pub client_loop: ClientLoop,
    /// Measured requests (complete replies, right or wrong): the histogram's sample count.
    pub requests: u64,
    /// Transport failures (each followed by a reconnect; the failed request is not measured).
    pub errors: u64,
    /// Keep-alive connections the server ended normally (`Connection: close`, or closed before
    /// answering the next request), reopened as real clients do; not errors. A request cut off
    /// that way was not answered and is sent again, not measured.
    pub reconnects: u64,
    /// Complete but wrong replies (`Outcome::ok == false`); measured, and in `requests`.
    pub wrong: u64,
    /// With an announcer: requests sent at a granted/announced time, and fail-open ones.
    pub scheduled: u64,
    pub unscheduled: u64,
    /// From the start of the measured phase (after warm-up) to the last reply.
    pub duration_s: f64,
    /// Completed requests per second.
    pub throughput_rps: f64,
    /// Open loop: the configured rate; otherwise 0.
    pub offered_rps: f64,
    pub p50_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub max_us: f64,
    pub mean_us: f64,
    /// sent − intended, µs: how late requests really went out.
    pub send_late_us_p50: f64,
    pub send_late_us_p99: f64,
}
