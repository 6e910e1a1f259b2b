//! Request boundaries of any server, from outside the process (issue 23, point 1).
//!
//! The agent (`preheat-agent`) finds busy periods from inside the server through `LD_PRELOAD`,
//! which a static binary (Go's default) ignores. This crate finds busy periods from outside,
//! for any process, static or dynamic, through eBPF programs on the kernel's tracepoints (or
//! perf samples where the kernel refuses those), whose records are read from ring buffers and
//! turned into periods per thread, attributed to the listening port, plus what the agent does
//! not follow: a request read by one thread and answered by another is the writing thread's
//! busy period too ([`periods::Kind::HandOff`]).
//!
//! Two models, by the tracepoints they use:
//!
//! - **The scheduler form** (the default where the kernel loads it, [`schedprog`]): a period
//!   runs from the moment a thread of the process is switched in after sleeping (or, without a
//!   sleep between, from its receive of the next request) to the moment it sleeps again, and
//!   counts if it received or sent data on a socket whose local port is the port
//!   (`sched_switch`, `skb_copy_datagram_iovec`, `sock_send_length`). The kernel keeps the period in a
//!   per-thread slot and writes one record per period; the tracker follows each connection
//!   from the period that read its request to the one that answered it ([`schedperiods`]).
//! - **The syscall form** (the agent's model, [`periods`]): from a wait call's return to the
//!   thread's next wait, the stream of the process's syscall entries and exits (thread,
//!   CLOCK_MONOTONIC time, number, first arguments or return value) from `sys_enter`/
//!   `sys_exit`, one record per period ([`periodprog`]) or per call ([`bpfprog`]), attributed
//!   through the process's sockets at attach (`/proc/PID/fd` and `/proc/PID/net/tcp*`,
//!   [`sockets`]) and what `accept` returns on the listening socket. Used where the scheduler
//!   form does not load, where each call's time is needed (`--per-call`, the demo's
//!   `--syscall-stages`) or asked for (`--syscalls`).
//!
//! Layers: [`periods`] and [`schedperiods`] (the state machines), [`decode`] (ring-buffer
//! records), [`btf`] (the kernel's type information), [`sampling`] (when to step aside under
//! load) and [`bpfprog`], [`periodprog`], [`schedprog`] and [`slotasm`] (the eBPF programs'
//! instructions) are pure; [`sockets`] and [`tracefs`] read
//! `/proc` and tracefs; [`bpf`] and [`perf`] are the only modules with `unsafe` (system calls
//! and the ring buffers' mappings); [`session`] ties them together; [`report`] and [`render`]
//! make the report and its text; [`mechanism`] names the ways events are opened.
//!
//! # Mechanism, chosen by measurement
//!
//! Three ways to open the events ([`Mechanism`]), all kept and tested:
//!
//! - [`Mechanism::Bpf`], the default: eBPF programs (assembled here; loaded and attached by
//!   [`bpf`]); the scheduler form's three where the kernel loads them (BTF-typed only), else
//!   two on the raw tracepoints `sys_enter`/`sys_exit`, which keep the process's
//!   traced calls (its thread group id: threads created later included) and write records into
//!   one BPF ring buffer that a thread drains. BTF-typed (`tp_btf`: the registers read with
//!   plain loads) where the kernel's BTF names the tracepoints ([`btf`]), they write **one
//!   record per busy period** ([`periodprog`]: the calls inside a period kept in a per-thread
//!   array in the kernel, unstamped; two clock reads per period) unless a caller needs each
//!   call's time ([`session::Options::per_call`]: the demo's `--syscall-stages`); otherwise, or
//!   untyped (each register read a helper call), a stamped 48-byte record per call
//!   ([`bpfprog`]). The report says which ran and why. Where the kernel refuses them (no BPF, an old kernel, a
//!   locked-down one) the observer falls back to the next and the report says why.
//! - [`Mechanism::SystemWide`]: perf samples (`perf_event_open` on
//!   `raw_syscalls:sys_enter`/`sys_exit`, bindings from `perf-event-open-sys`, samples
//!   `TID | TIME | RAW` with CLOCK_MONOTONIC times, one ring buffer per CPU): one entry and
//!   one exit event per CPU for every task, filtered in the kernel on the syscall number and
//!   the process's thread ids, plus `common_pid > last pid allocated` so a thread the process
//!   creates is sampled from its first call; every 100 ms the filter takes the new threads in
//!   and raises the threshold.
//! - [`Mechanism::PerThread`]: the perf pair per thread and CPU, inherited by new threads.
//!
//! Measured with `preheat bench observe` (the agent bench's method: per pair, two warm
//! preheat-kv servers on CPU 1, one observed, closed-loop GETs alternating in 20 ABBA blocks of
//! 2,000 requests from CPU 0, where the observer's reader thread runs too; each row a median
//! over 7 pairs with the range; 2 vCPUs of an AMD EPYC, cpuidle `haltpoll`; the three
//! configurations interleaved, three runs each, release build, 2026-11-29):
//!
//! | observer | throughput loss (blockwise), three runs | p50 delta per request |
//! |---|---|---|
//! | none (A/A control) | 1.01%, −0.36%, 0.26% | +0.09, −0.05, 0.00 µs |
//! | perf, system-wide | 12.7%, 12.9%, 17.2% | +2.24, +2.26, +2.32 µs |
//! | eBPF | **4.7%, 4.7%, 5.7%** | **+0.59, +0.69, +0.72 µs** |
//!
//! Every request was found (read periods per request 1.000, no record lost), at 5 records
//! per request (epoll_wait entry and exit, read entry and exit, send entry): perf costs
//! ~0.45 µs per sample (the kernel preparing and writing it), eBPF ~0.13 µs per record. An
//! earlier measurement (2026-11-27, same variant) had per-thread perf events at 15.3%.
//! Where eBPF's cost goes (same method, two to three runs each): the programs with no call
//! kept (the process filter, and at exit the read of the syscall number from the registers)
//! cost 0.80% / 0.75% (+0.12 / +0.08 µs); without reading the entry's two arguments the
//! records cost 5.2–5.6%; no reader wake-up (`BPF_RB_NO_WAKEUP`) measured no different
//! (6.0, 5.9, 7.0%). So what is left is the records themselves, ~0.1 µs each (time stamp,
//! ring-buffer reservation and copy, the reader's drain on the client's CPU).
//!
//! **BTF-typed programs** (session 24, 2026-11-29, same method and variant, the two forms
//! interleaved, three runs of 7 pairs each; `PREHEAT_OBSERVE_NO_BTF=1` runs the untyped ones):
//! untyped 6.05 / 6.10 / 6.06% (p50 +0.63–0.67 µs), typed **4.18 / 4.42 / 3.09%** (p50
//! +0.40–0.48 µs); a second series at the final commit untyped 5.95 / 7.06 / 5.82% (p50
//! +0.63–0.71 µs), typed 4.21 / 3.99 / 7.73% (p50 +0.46–0.48 µs); every request found by both: the helper calls that read the registers were
//! a third of the cost.
//! The typed programs with the record left out (an experiment, not kept; three runs of 7
//! pairs against the typed programs as built, interleaved): 2.5 / 3.0 / 3.2% against 3.4 /
//! 4.6 / 4.3% — the records are now about a point; the rest is a program on every system
//! call of the machine (the process filter) and the clock read for each kept call.
//! **The clock is most of that rest**: the same without records and without
//! `bpf_ktime_get_ns` 0.60 / 0.49 / 0.40% (p50 +0.02–0.06 µs) against 2.05 / 1.33 / 1.28%
//! (p50 +0.23–0.25 µs) with it (three runs each, interleaved; experiments, not kept): about
//! 40 ns per clock read in this guest (the kernel's ordered TSC read), five per request. So the
//! way to ≤ 1% is fewer clock reads as much as fewer records: per-thread state in the kernel,
//! stamps only at a busy period's boundaries (where `--syscall-stages` is not asked for), one
//! record per period — not built.
//!
//! **Where the rest goes, and the reader** (session 25, 2026-11-30, same method and variant,
//! release, 7 pairs per run, interleaved). `bench observe` now reports the reader thread's CPU
//! time per request. The reader not draining at all (its records left in a 128 MiB buffer
//! until the end) against draining every 5 ms, three runs each: 3.55 / 3.10 / 2.67% against
//! 5.52 / 4.10 / 3.72%, the p50 cost the same (+0.36–0.47 against +0.48–0.51 µs) — so the
//! kernel's side (the records and their stamps, in the server's request path) is the larger
//! part and the reader's about a point; the reader thread took 55–123 ns of CPU per request
//! only waking every 5 ms. The observer's collecting callers now drain every 50 ms
//! ([`session::DRAIN_EVERY`], as the outside preheater did): 3.30 / 3.90 / 3.21%, the reader
//! 150–156 ns per request (198–238 at 5 ms). The drained events are analysed as they settle
//! ([`session::Observer::poll`]) instead of all being kept to the end, so an observation holds
//! its periods, not ~250 bytes per request (which is why the reader's time now includes the
//! analysis, ~80 ns per request). Loading the thread's ids from the current task
//! (`bpf_get_current_task_btf`, which the JIT inlines, and `task_struct`'s offsets from the
//! BTF) instead of calling `bpf_get_current_pid_tgid` on every system call of the machine was
//! tried and measured no different (four runs each, interleaved: 4.5 / 4.3 / 2.9 / 4.3%
//! against 4.0 / 4.3 / 5.4 / 3.4%, p50 +0.42–0.61 against +0.46–1.04 µs): not kept.
//!
//! **One record per busy period** (session 25, 2026-11-30, same method and variant, release,
//! the two forms interleaved, three runs of 7 pairs each; `PREHEAT_OBSERVE_PER_CALL=1` runs
//! the per-call programs): **1.26 / 1.52 / 1.34%** (whole blocks 0.88 / 1.99 / 1.23%; p50
//! **+0.11 / +0.12 / +0.14 µs**; 1.00 record and 4 calls analysed per request, the reader 106–112
//! ns per request) against 4.23 / 3.56 / 4.39% (p50 +0.44–0.47 µs; 5 records; the reader
//! 133–148 ns) for a record per call; every request found by both. Five more runs of the
//! final build: 1.37 / 1.87 / 2.20 / 1.32 / 2.09% (whole blocks 0.96–2.04%, p50 +0.11–0.34
//! µs), A/A controls −0.03 / −0.01% — over all eight a median of 1.45%: a third of the
//! per-call cost. The final build (threads sharing a slot handled, records cut after their
//! last call), ten runs on a noisier host: 1.13 / −0.61 / 0.83 / 0.98 / 0.43 / 1.40 / 1.33 /
//! 1.12 / 2.09 / 1.73%, **median 1.1%**, A/A 0.46 / −0.54%: at the goal's edge and within the
//! bench's noise — and only a lower bound: the bench's two servers share whatever the observer
//! costs every process alike (below), which cancels in its comparison. **The total**
//! (`preheat bench observe --toggle`: one server, the programs detached and attached between
//! blocks): 6.01 / 5.94 / 6.04 / 4.30 / 4.32 / 7.21 / 3.78%, median 5.9% (p50 +0.63–0.76
//! µs), against 8.20 / 6.53% (+1.07 µs) with a record per call, A/A 0.07 / 0.07% — **not
//! met**. On the static Go server under `wrk`
//! (ad hoc, noisy: docs/results-log.md, session 25) it is far from it, ~11%, and ~6–8% with
//! the observer attached to another, idle process — as much as `perf stat` counting the same
//! tracepoints costs: there the cost is enabling the syscall tracepoints at all (every task's
//! system calls take the slow path), not the programs. `fentry`/`fexit` programs on the
//! traced calls' kernel functions, which would not need the tracepoints, are refused (EPERM)
//! on this machine kind's locked-down kernel: tried and dropped (the results log). What is left, from a
//! `perf record -e cpu-clock` profile of the bench's client: the programs run on the client's
//! own system calls too (every system call of the machine, each a raw-tracepoint dispatch and
//! a `bpf_get_current_pid_tgid` call: about 4% of the client's CPU samples), then two clock
//! reads, one record and its reader per request. `bpf_get_current_task_btf` is a real call on
//! this kernel (it shows in the same profile), so loading the ids from the task gains
//! nothing; tried again with the period programs and dropped.
//!
//! **The scheduler form** (session 26, 2026-11-30, same variant and method, release,
//! `bench observe --toggle`, 7 pairs per run; `PREHEAT_OBSERVE_SYSCALLS=1` runs the syscall
//! period programs, interleaved): **3.15 / 2.84 / 3.28%** (p50 +0.30–0.37 µs; one record per
//! request; the reader 45–173 ns per request) against 5.56 / 5.68% (p50 +0.65–0.67 µs); A/A
//! 0.28%; an earlier build of it (before the next-request split and the 32-bit return
//! compare) 2.88 / 2.64 / 1.89 / 1.80 / 3.14 / 2.73%. Half the syscall programs' cost in
//! total: nothing is added to system calls; what is left is a program run on every context
//! switch and every socket call of the machine (a few loads and compares for other processes;
//! trivial programs on the same three tracepoints measured ~0.4% in an ad-hoc series), two
//! clock reads, two slot lookups and a record per request on the server's path, and the
//! reader. Still **not within 1%**: the same three programs returning at once (an
//! experiment) cost 0.83 / 1.38 / 0.70% against 1.44 / 1.75 / 1.71% as built in one
//! interleaved series on a quieter host — about half of the total is the dispatch of a program
//! on every context switch and socket call, which no program can take back. On nginx
//! (`--server nginx`, p50 21.8 µs) 1.92 / 1.61% against 4.56% for the syscall programs; on the
//! static Go server (`-- CMD {port}`) within the A/A noise for both forms. (Before it, `fentry`/`fexit` and BPF LSM programs were
//! tried again: this kernel refuses to load them at all, EPERM before the verifier; kprobes
//! are not built in.)
//!
//! **Fewer dispatches, no clock on the path, and sampling** (session 27, 2026-11-30, same
//! variant and method, release, 9 pairs per run). The host alternated between two states
//! within the session — a fast one (warm p50 ~11 µs) and a slow one (~15.8 µs) — and the
//! observer's share differs between them several-fold, so every comparison below is within
//! one state. (1) The receive program moved from `sock_recv_length` (every receive call of
//! the machine: 10.1 per kv request under the bench's spinning client) to
//! `skb_copy_datagram_iovec` (only where data is copied: 2.0): slow state 0.54 / 0.93 / 1.28 /
//! 0.75% against 2.17 / 1.84 / 1.38 / 2.01%, fast state no better (3.5–4.7% both: the
//! client's failed receives are off the request's path). (2) A period's ends are the run
//! queue's clock (loads at the switches) converted by an anchor measured at most every 10
//! ms, instead of two clock reads per request ([`schedprog`]): the switch program's run time
//! 133 against 177 ns per run (`kernel.bpf_stats_enabled`); slow state median 0.25% over six
//! runs; fast state still 2.7–3.5% (p50 +0.28–0.32 µs). (3) **The dispatch is the floor**:
//! the three programs returning at once cost 1.96 / 1.62 / 1.38% (p50 +0.19–0.26 µs) against
//! 1.81 / 2.61 / 2.53% as built, the socket programs alone (returning at once) 1.36 / 1.64%,
//! the switch program alone 0.74 / 1.10 / 0.83% (mostly fast state; experiments, not kept):
//! on a request of 11 µs a program on these tracepoints cannot be within 1%, whatever it
//! does. So the observer **samples under sustained load** ([`sampling`]: above 10 000
//! periods a second its programs go away for 450 ms at a time, then look again), which the
//! outside preheater and `bench observe` use by default: **0.05 / 0.17 / 0.40 / 0.17 /
//! 0.64%** (median 0.17%; away 86–89% of the time, 0.10–0.13 of the requests seen) against
//! 3.01 / 2.84 / 0.85 / 3.09 / 2.69% observing throughout (`--complete`), interleaved. An idle
//! or bursty server, whose first request after an idle is what preheating needs, is observed
//! throughout.
//!
//! The per-call programs' goal (≤ 1%, as for the agent) was **not met** on preheat-kv, whose warm request is ~12 µs
//! on the loopback (the least any server here spends per request, so the largest share): the
//! filter alone is 0.8%. **Fewer records alone would not reach it** (measured the same session,
//! with the untyped programs changed for the experiment and not kept, three interleaved runs
//! of 7 pairs each): the records as built 6.3 / 6.0 / 3.8% and 5.5 / 4.8 / 6.4% in two series;
//! each record written into a hash map keyed by thread instead (`bpf_map_update_elem`) **7.3 /
//! 7.9 / 5.7%**, more than the ring buffer; the thread's entry looked up and written in place
//! (`bpf_map_lookup_elem`, the per-thread state a one-record-per-busy-period design would
//! keep) 3.4 / 3.2 / 4.6%; nothing written at all (the filter, the registers read through
//! `bpf_probe_read_kernel`, the clock) 3.4 / 2.6 / 1.7% and 2.7 / 2.9 / 3.5%. The typed
//! programs took most of the register reads' share; what is left to try is per-thread state
//! in task-local storage (the cheapest map, open to typed programs) with one record per busy
//! period, and programs that run only for the traced calls (`fentry`/`fexit` on the
//! syscalls' kernel functions), not built; ptrace would stop the server at every syscall (two
//! context switches each): not tried.
#![allow(unsafe_code)]

pub mod bpf;
pub mod bpfprog;
pub mod btf;
pub mod decode;
pub mod mechanism;
pub mod perf;
pub mod periodprog;
pub mod periods;
pub mod render;
pub mod report;
pub mod sampling;
pub mod schedperiods;
pub mod schedprog;
pub mod session;
pub mod slotasm;
pub mod sockets;
pub mod tracefs;

pub use periods::{Kind, Period};
pub use report::{Report, ThreadSummary};
pub use session::{observe, Mechanism, Observer, Options};
