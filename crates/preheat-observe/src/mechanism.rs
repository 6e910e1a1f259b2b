//! How the observer opens its events, what each way costs and how it is described.

use serde::Serialize;

/// How the tracepoint events are opened (both deliver the same records).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mechanism {
    /// One event pair per thread and CPU, inherited by threads created later; the kernel
    /// switches them in and out with the thread (at every block and wake), so other processes
    /// pay nothing.
    PerThread,
    /// One event pair per CPU for every task, filtered in the kernel on the process's thread
    /// ids and on any thread newer than the last pid allocated at the last refresh (so a thread
    /// the process creates is seen from its first call); the filter is narrowed again every
    /// 100 ms and other processes' samples are dropped by pid. The default: measured slightly
    /// cheaper and steadier than per-thread events (+3.1 µs against +3.7 µs per warm request,
    /// ranges overlapping: crate docs). Every syscall of the machine runs the filter.
    SystemWide,
    /// eBPF programs (every CPU) that keep only the process's busy periods and write records
    /// of them into a BPF ring buffer; no perf sample is written. On the scheduler's and the
    /// socket layer's tracepoints where the kernel loads them ([`crate::schedprog`]), else on
    /// the raw tracepoints `sys_enter`/`sys_exit` ([`crate::periodprog`],
    /// [`crate::bpfprog`]). The default where the kernel loads them; elsewhere the observer
    /// falls back to [`Mechanism::SystemWide`] and says why (`PREHEAT_OBSERVE_NO_BPF=1` makes
    /// it behave so: to compare, and to test the fallback).
    Bpf,
}

impl Mechanism {
    /// What the mechanism costs the observed process, as measured (crate docs).
    pub fn cost(self) -> &'static str {
        match self {
            Mechanism::Bpf => {
                "on the scheduler's and socket tracepoints a few instructions per context switch and socket call of the machine and a record per busy period; on the syscall tracepoints a record per period or call, and every system call of the machine takes the tracepoint path while attached (measured: preheat bench observe)"
            }
            Mechanism::SystemWide | Mechanism::PerThread => {
                "a perf sample per traced call, ~0.45 µs each on this machine kind (measured: preheat bench observe)"
            }
        }
    }

    pub fn describe(self) -> &'static str {
        match self {
            Mechanism::Bpf => {
                "eBPF programs (every CPU) keeping the process's busy periods and writing records of them into a BPF ring buffer (no perf samples)"
            }
            Mechanism::PerThread => {
                "perf_event_open on raw_syscalls:sys_enter/sys_exit, per thread and CPU (inherited), filtered on the syscall number"
            }
            Mechanism::SystemWide => {
                "perf_event_open on raw_syscalls:sys_enter/sys_exit, per CPU for every task, filtered in the kernel on the syscall number and the process's thread ids (and newer threads until the next refresh)"
            }
        }
    }
}
