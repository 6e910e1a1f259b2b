//! The lab's Rust side (paper §4, Table 1 and Figure 3 on real servers).
//!
//! * [`tpcc`] — the TPC-C-like schema, loader and transaction mix (new-order, payment,
//!   order-status).
//! * [`driver`] — one request of a workload over a real socket, per protocol: memcached text,
//!   redis RESP, HTTP/1.1, MySQL (through the `mysql` client crate, one [`tpcc`] transaction).
//! * [`load`] — the load-generation engine: open loop (Poisson arrivals), idle-gap and closed
//!   loop; latency from the *intended* send time into an HdrHistogram; per-request records.
//! * [`servers`] — the catalog of servers under test: how to configure, start (the caller's
//!   launcher attaches the agent and pins CPUs), load and query memcached, nginx, redis, MariaDB
//!   (TPC-C-like, in the spirit of the paper's DBT-2) and the bundled preheat-kv.
//!
//! **Layering.** Dependencies run one way: a module uses only modules listed before it.
//! [`tpcc`] uses no other module of the crate; [`driver`] uses [`tpcc`] (its MySQL driver runs
//! transactions); [`load`] uses [`driver`] (it drives any [`driver::Driver`]); [`servers`] uses
//! [`driver`] (a plan's workload, the check of the measured request) and [`tpcc`] (loading
//! MariaDB). The files inside each module are layered the same way (see each module's docs).
//! The modules are declared in this order below; keep new ones in their layer.
//!
//! Invariants: no unsafe code; every process is started by the caller (`preheat-cli`'s launcher),
//! so cleanup on exit/SIGTERM stays in one place; every error names what to do next.
#![forbid(unsafe_code)]

pub mod tpcc;

pub mod driver;

pub mod load;

pub mod servers;
