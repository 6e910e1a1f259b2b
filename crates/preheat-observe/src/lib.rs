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
//! `unsafe` (system calls and the ring buffers' mappings); [`session`] ties them together;
//! [`render`] makes the report's text.
//!
//! # Mechanism, chosen by measurement
//!
//! What runs: `perf_event_open` on `raw_syscalls:sys_enter`/`sys_exit` (tracepoint ids and
//! record layouts from tracefs, mounted privately for that read where it is not), bindings from
//! the `perf-event-open-sys` crate, samples `TID | TIME | RAW` with CLOCK_MONOTONIC times into
//! one ring buffer per CPU that a thread drains every 5 ms ([`Observer::poll`]). Two ways to
//! open the events, both kept and tested ([`Mechanism`]):
//!
//! - [`Mechanism::SystemWide`], the default: one entry and one exit event per CPU for every
//!   task, filtered in the kernel on the syscall number (entries: the 26 calls the tracker
//!   reads; exits: only the 18 whose return it needs) and on the process's thread ids, plus
//!   `common_pid > last pid allocated` so a thread the process creates is sampled from its
//!   first call; every 100 ms the filter takes the new threads in and raises the threshold.
//! - [`Mechanism::PerThread`]: the pair per thread and CPU, inherited by new threads.
//!
//! Measured with `preheat bench observe` (the agent bench's method: per pair, two warm
//! preheat-kv servers on CPU 1, one observed, closed-loop GETs alternating in 20 ABBA blocks of
//! 2,000 requests from CPU 0, where the observer's reader thread runs too; median over 7 pairs
//! with the range; machine with cpuidle `haltpoll`, 2 vCPUs, no PMU; measured 2026-11-27):
//!
//! | observer | throughput loss (blockwise) | whole blocks | p50 delta |
//! |---|---|---|---|
//! | none (A/A control) | 2.1% [−2.1%, 4.6%] | −0.1% [−2.1%, 3.6%] | +0.02 µs [−0.58, 0.64] |
//! | system-wide | 13.1% [12.9%, 14.5%] | 11.8% [5.6%, 17.4%] | +3.11 µs [3.03, 3.19] |
//! | system-wide, a second run | 11.8% [8.5%, 15.2%] | 10.0% [6.5%, 14.9%] | +2.74 µs [2.23, 4.46] |
//! | per-thread | 15.3% [10.8%, 18.4%] | 17.4% [3.5%, 18.6%] | +3.72 µs [0.99, 4.86] |
//!
//! Every request was found (read periods per request 1.000 in every pair, no sample lost), at
//! 5 samples per request (epoll_wait entry and exit, read entry and exit, send entry). The goal
//! (≤ 1%, as for the agent) is **not met**: the cost is the kernel writing the samples, about
//! 0.6 µs each on this VM — the same filter with no sample passing it cost nothing measurable
//! (+0.01 µs, 0.4% [−0.4%, 1.6%]), and draining without decoding cost the same as decoding.
//! The two ways differ little (system-wide slightly cheaper and steadier); the system-wide
//! filter is evaluated on every syscall of the machine, which a pair cannot see (both servers
//! and the client pay it alike). An earlier version woke the reader at every sample
//! (`wakeup_events = 1`): ~60 µs per request, each wakeup an irq_work self-interrupt (a VM exit).
//!
//! What would reach ≤ 1%: fewer samples by aggregating in the kernel, i.e. an eBPF program on
//! the same tracepoints keeping per-thread state in maps and emitting one record per busy
//! period. Not built here: no BPF compiler is on the machine or in the project's install
//! (clang or bpf-linker would be needed at build time, or hand-assembled bytecode), and the
//! registry lists this workplace offers have no aya/libbpf entry to check. ptrace would stop
//! the server at every syscall (two context switches each): not tried.
#![allow(unsafe_code)]

pub mod decode;
pub mod perf;
pub mod periods;
pub mod render;
pub mod session;
pub mod sockets;
pub mod tracefs;

pub use periods::{Kind, Period};
pub use session::{observe, Mechanism, Observer, Options, Report, ThreadSummary};
