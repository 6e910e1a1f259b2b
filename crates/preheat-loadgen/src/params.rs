//! What a load run is asked for. Plain data; the CLI's `LoadArgs` fills it from the command line
//! (same defaults, [`Default`]).

use std::path::PathBuf;

use preheat_lab::driver::{Protocol, Wait};
use preheat_lab::load::Mode;

/// A load run's parameters (the flags named are `preheat load`'s).
#[derive(Debug, Clone)]
pub struct LoadParams {
    /// Server address, HOST:PORT.
    pub target: String,
    /// Wire protocol (mysql: the TPC-C-like transaction mix).
    pub protocol: Protocol,
    /// Key (memcached, redis) or path (HTTP) to request.
    pub key: String,
    /// How requests are paced (`preheat load --help` describes the modes; default idle-gap).
    pub mode: Mode,
    /// Measured requests over all connections [default: 200 unless --duration-s is given].
    pub requests: Option<u64>,
    /// Measure for this long, s (with --requests: whichever ends first).
    pub duration_s: Option<f64>,
    /// Open loop: offered load, requests per second over all connections (required there).
    pub rate: Option<f64>,
    /// Connections (each with its own client thread unless --threads says fewer).
    pub connections: usize,
    /// Client threads, each multiplexing connections/threads connections (like wrk -t)
    /// [default: one per connection]. Not with idle-gap, announcements or mysql.
    pub threads: Option<usize>,
    /// Unmeasured warm-up requests per connection.
    pub warmup: u64,
    /// Seed of the open-loop arrival process.
    pub seed: u64,
    /// How the client waits for a reply: spin (busy-poll; excludes the client's own vCPU
    /// wakeup), block (in the kernel: a blocking read per connection thread, epoll_wait with
    /// --threads < --connections) or epoll (epoll_wait then read in the event loop, as
    /// memcaslap/wrk/redis-benchmark do; for comparing with them); default spin.
    pub wait: Wait,
    /// Write one CSV row per measured request here.
    pub records: Option<PathBuf>,
    /// Strategy label for the records and the report [default: none / the local announcement's
    /// strategies / arbiter].
    pub strategy: Option<String>,
    /// Idle gap before each request in idle-gap mode, ms.
    pub gap_ms: u64,
    /// Announce each request to the agents in the run dir (same host) --lead-us ahead.
    pub announce_local: bool,
    /// Request a timeslot from this arbiter for each request and send at the allocated time.
    pub arbiter: Option<String>,
    /// Pre-shared key file for the arbiter (hex).
    pub key_file: Option<PathBuf>,
    /// This host's IPv4 address as the arbiter knows it (default: the address used to reach it).
    pub my_ip: Option<std::net::Ipv4Addr>,
    /// Give up on an allocation after this long and send unscheduled, ms.
    pub arbiter_timeout_ms: u64,
    /// Lead time of local announcements, µs.
    pub lead_us: u64,
    /// Strategies requested by local announcements.
    pub strategies: String,
    /// After each request, ask the agents in the run dir (same filesystem: works across network
    /// namespaces) when the server thread really started on it and whether the preheat for its
    /// announcement finished in time: announcement accuracy and completion before arrival.
    /// Only with --connections 1; the agents are asked from the records thread, after the reply.
    pub observe: bool,
}

impl Default for LoadParams {
    fn default() -> LoadParams {
        LoadParams {
            target: String::new(),
            protocol: Protocol::Memcached,
            key: "key:42".into(),
            mode: Mode::IdleGap,
            requests: None,
            duration_s: None,
            rate: None,
            connections: 1,
            threads: None,
            warmup: 1,
            seed: 1,
            wait: Wait::Spin,
            records: None,
            strategy: None,
            gap_ms: 20,
            announce_local: false,
            arbiter: None,
            key_file: None,
            my_ip: None,
            arbiter_timeout_ms: 5,
            lead_us: 65,
            strategies: "wake+lines".into(),
            observe: false,
        }
    }
}

impl LoadParams {
    /// The measured requests: `requests`, or 200 when neither it nor a duration is given
    /// (`None`: as many as the duration allows).
    pub fn request_count(&self) -> Option<u64> {
        match (self.requests, self.duration_s) {
            (Some(n), _) => Some(n),
            (None, Some(_)) => None,
            (None, None) => Some(200),
        }
    }
}
