//! The lab's Rust side (paper §4, Table 1 and Figure 3 on real servers).
//!
//! * [`servers`] — the catalog of servers under test: how to configure, start (the caller's
//!   launcher attaches the agent and pins CPUs), load and query memcached, nginx, redis, MariaDB
//!   (TPC-C-like, in the spirit of the paper's DBT-2) and the bundled preheat-kv.
//! * [`driver`] — one request of a workload over a real socket, per protocol: memcached text,
//!   redis RESP, HTTP/1.1, MySQL (through the `mysql` client crate).
//! * [`tpcc`] — the TPC-C-like schema, loader and transaction mix (new-order, payment,
//!   order-status).
//! * [`load`] — the load-generation engine: open loop (Poisson arrivals), idle-gap and closed
//!   loop; latency from the *intended* send time into an HdrHistogram; per-request records.
//!
//! Invariants: no unsafe code; every process is started by the caller (`preheat-cli`'s launcher),
//! so cleanup on exit/SIGTERM stays in one place; every error names what to do next.
#![forbid(unsafe_code)]

pub mod driver;
pub mod load;
pub mod servers;
pub mod tpcc;
