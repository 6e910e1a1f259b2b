//! The load-generation engine. INTERFACE FIXED BY THE LEAD: keep the public signatures; fill in
//! the bodies.

use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use anyhow::Result;
use serde::{Deserialize, Serialize};

use crate::driver::Driver;

/// How requests are paced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Open loop: Poisson arrivals at `rate` per second (over all connections). A request that
    /// cannot go out at its intended time (previous reply still outstanding on every connection)
    /// is sent late and its latency still counts from the intended time.
    Open,
    /// One request after each idle gap (the cold-start case).
    IdleGap,
    /// Back to back on each connection.
    Closed,
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
    /// Connections, each served by its own client thread.
    pub connections: usize,
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
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    pub send_at_ns: u64,
    /// False: the request goes out unannounced/unscheduled (fail-open).
    pub scheduled: bool,
}

/// One measured request.
#[derive(Debug, Clone, Serialize)]
pub struct Record {
    pub seq: u64,
    pub conn: u32,
    pub mode: Mode,
    /// Idle gap before this request, µs (0 outside idle-gap mode).
    pub gap_us: f64,
    /// Intended send time (arrival process / gap end), CLOCK_MONOTONIC ns.
    pub intended_ns: u64,
    /// Granted send time (== intended without announcements).
    pub granted_ns: u64,
    /// When it really went out, and when the whole reply was read.
    pub sent_ns: u64,
    pub done_ns: u64,
    /// done − intended, µs: includes any wait for a slot or a busy connection.
    pub latency_us: f64,
    pub kind: &'static str,
    pub ok: bool,
    pub scheduled: bool,
    pub strategy: String,
}

/// Totals of a run. Every latency is measured on this machine from the intended send time.
#[derive(Debug, Clone, Serialize)]
pub struct LoadSummary {
    pub label: &'static str,
    pub mode: Mode,
    pub connections: usize,
    pub requests: u64,
    /// Transport failures (reconnected) and wrong replies.
    pub errors: u64,
    pub wrong: u64,
    pub scheduled: u64,
    pub unscheduled: u64,
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

/// Where records go. Implementations must not block the measuring threads for long: the engine
/// hands records over through a channel to a writer thread.
pub trait RecordSink: Send {
    fn write(&mut self, r: &Record) -> Result<()>;
    fn flush(&mut self) -> Result<()>;
}

/// Records as CSV (header first); flushed at least every 100 ms so an interrupted run keeps
/// what it measured.
pub struct CsvSink {
    _private: (),
}

impl CsvSink {
    pub fn create(path: &Path) -> Result<CsvSink> {
        let _ = path;
        todo!("helper")
    }
}

/// Run a load. `connect` opens one driver per connection (and again after a transport error);
/// `announce` (optional) makes one announcer per connection; `stop` ends the run early (the
/// summary covers what was measured); `progress` is called with the number of completed
/// requests now and then.
pub fn run(
    cfg: &LoadConfig,
    connect: &(dyn Fn() -> Result<Box<dyn Driver>> + Sync),
    announce: Option<&(dyn Fn(usize) -> Result<Box<dyn Announce>> + Sync)>,
    sink: Option<Box<dyn RecordSink>>,
    stop: &AtomicBool,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<LoadSummary> {
    let _ = (cfg, connect, announce, sink, stop, progress);
    todo!("helper")
}
