//! Request boundaries of any server, from outside the process (issue 23, point 1).
//!
//! The agent (`preheat-agent`) finds busy periods from inside the server through `LD_PRELOAD`,
//! which a static binary (Go's default) ignores. This crate finds the same busy periods from
//! outside, for any process, static or dynamic: the kernel's syscall tracepoints
//! (`raw_syscalls:sys_enter`/`sys_exit`) opened with `perf_event_open` on the process's
//! threads, samples (thread, CLOCK_MONOTONIC time, syscall number and first arguments or
//! return value) read from per-CPU ring buffers, and the agent's busy-period model applied to
//! that stream ([`periods`]), plus what the agent does not follow: a request read by one thread
//! and answered by another is the writing thread's busy period too ([`periods::Kind::HandOff`]).
//! Attribution to the port: the process's sockets at attach (`/proc/PID/fd` and
//! `/proc/PID/net/tcp*`, [`sockets`]), then what `accept` returns on the listening socket.
//!
//! Layers: [`periods`] (the state machine) and [`decode`] (ring-buffer records) are pure;
//! [`sockets`] and [`tracefs`] read `/proc` and tracefs; [`perf`] is the only module with
//! `unsafe` (system calls and the ring buffers' mappings); [`session`] ties them together.
//!
//! # Mechanism, chosen by measurement
//!
//! See the numbers in the crate's bench section below (filled from `preheat bench observe`).
#![allow(unsafe_code)]

pub mod decode;
pub mod periods;
pub mod perf;
pub mod session;
pub mod sockets;
pub mod tracefs;

pub use periods::{Kind, Period};
pub use session::{observe, Mechanism, Observer, Options, Report, ThreadSummary};
