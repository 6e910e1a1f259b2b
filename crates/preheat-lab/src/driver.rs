//! One request of a workload, per protocol. INTERFACE FIXED BY THE LEAD: keep the public
//! signatures; fill in the bodies.

use std::net::SocketAddr;

use anyhow::Result;
use serde::{Deserialize, Serialize};

/// Wire protocol of a server under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    /// memcached text protocol (`get KEY`); the bundled preheat-kv speaks it too.
    Memcached,
    /// redis RESP (`GET KEY`).
    Redis,
    /// HTTP/1.1 GET with keep-alive.
    Http,
    /// The MySQL/MariaDB protocol: TPC-C-like transactions (see [`crate::tpcc`]).
    Mysql,
}

/// How a driver waits for its reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Wait {
    /// Busy-poll a non-blocking socket: the latency excludes the client's own (v)CPU wakeup.
    Spin,
    /// Block in the kernel, as most load generators (memcaslap, redis-benchmark, wrk) do.
    Block,
}

/// What to request. `key`: memcached/redis key, or HTTP path; ignored for MySQL.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkloadSpec {
    pub protocol: Protocol,
    pub key: String,
    /// Expected value (memcached/redis) or body (HTTP); checked on every reply when set.
    pub expect: Option<Vec<u8>>,
    /// MySQL only: the TPC-C-like database and scale.
    pub tpcc: Option<crate::tpcc::TpccConfig>,
}

impl WorkloadSpec {
    /// The raw request and the exact reply suffix the agent uses for its own requests: the
    /// `replay` warm-up strategy (an idempotent request) and the flush+reload probe (the measured
    /// request itself). `None` where no fixed byte exchange exists (MySQL needs a session).
    pub fn raw_exchange(&self) -> Option<RawExchange> {
        let _ = self;
        todo!("helper: per protocol")
    }
}

/// A fixed request and the bytes its reply ends with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawExchange {
    pub request: Vec<u8>,
    pub until: Vec<u8>,
    /// An idempotent warm-up request for the `replay` strategy and its reply suffix.
    pub replay: Vec<u8>,
    pub replay_until: Vec<u8>,
}

/// The result of one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    /// What was sent ("get", "GET", "new-order", ...), for per-request records.
    pub kind: &'static str,
    /// The reply was complete and correct (false: wrong value, SQL error, HTTP status != 200).
    pub ok: bool,
}

/// A connected client that sends one request at a time and reads the whole reply.
pub trait Driver: Send {
    /// Send one request and read its whole reply. `Err`: the connection is unusable (the caller
    /// reconnects); `Ok` with `ok == false`: a wrong reply.
    fn request(&mut self) -> Result<Outcome>;
    fn protocol(&self) -> Protocol;
}

/// Connect a driver for `w` to `addr`.
pub fn connect(addr: SocketAddr, w: &WorkloadSpec, wait: Wait) -> Result<Box<dyn Driver>> {
    let _ = (addr, w, wait);
    todo!("helper")
}
