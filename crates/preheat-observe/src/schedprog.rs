//! The observer's scheduler form: busy periods from the scheduler's and the socket layer's
//! tracepoints instead of the system calls' (pure: no I/O, deterministic).
//!
//! The syscall programs ([`crate::periodprog`], [`crate::bpfprog`]) hang on `sys_enter` and
//! `sys_exit`, and while any program is attached there, **every system call of the machine**
//! takes the kernel's slow path to reach them: on preheat-kv that measured ~6% of the
//! throughput in total (`preheat bench observe --toggle`), nearly all of it outside the
//! observed process. The tracepoints used here are plain static ones — a patched-out jump
//! until a program attaches, then one call of it where the event happens — so the machine
//! pays only for the events themselves:
//!
//! - `sched_switch` (every context switch of the machine: a few loads and compares for other
//!   processes). A thread of the observed process **switched in** opens a busy period unless
//!   one is open (it was preempted, not asleep); one **switched out asleep** (not preempted,
//!   not yielding) closes it and writes the slot out as one record — unless the period
//!   touched no connection of the port, which ends without a record. **Neither reads a
//!   clock**: each keeps its run queue's `clock`, which the scheduler has just brought up to
//!   date (three loads: `task->se.cfs_rq->rq->clock`, the scheduler's own timeline), and the
//!   close converts both ends to CLOCK_MONOTONIC by the **anchor** — CLOCK_MONOTONIC minus
//!   that clock, measured (one clock read) by a close that finds it missing or older than
//!   [`ANCHOR_EVERY_NS`] (10 ms) by the scheduler's clock, so once per 10 ms at most where
//!   requests come faster. A clock read measured ~65 ns here (`kernel.bpf_stats_enabled`), two
//!   per request before. The two clocks drift apart by NTP's frequency corrections only
//!   (parts per million: tens of ns over 10 ms). Without group scheduling (no `se.cfs_rq` in the kernel's
//!   BTF) both switches read CLOCK_MONOTONIC instead.
//! - `skb_copy_datagram_iovec` (data of a received buffer copied to a reader, in the reader's
//!   context: only receives that return data, a few per request) and `sock_send_length`
//!   (every socket send of the machine, after the call): a load and a compare for other ports.
//!   A copy from, or a send that sent something on, a socket whose local port is the observed
//!   port, by a thread of the process, counts a read or a write in the thread's open period
//!   (opening one at once for a thread found running at attach) and keeps the connection (its
//!   peer's IPv4 address — zero for an IPv6 peer, whose port alone then names it — and port)
//!   for the first [`EVENTS`] calls: the tracker ([`crate::periods::Tracker::feed_period`])
//!   follows a request from the thread that read it to the one that writes the reply. A
//!   receive in a period that already wrote is the **next request**: the period so far ends
//!   there and the next one starts there (one clock read for both), so a thread that goes from
//!   one request to the next without sleeping — an event loop that finds the next request
//!   queued, a Go thread still spinning — has a period per request, starting when it reads it.
//!   The split reads the clock (the one place a request may): the period so far is converted
//!   by the anchor, the next starts at the read.
//!
//! Why the copy and not `sock_recv_length` (the receive call's own tracepoint, which the first
//! build of this form used): that one runs for **every** receive call of the machine, and the
//! calls that find nothing are most of them where anyone polls — an event loop reads until
//! `EAGAIN`, the bench's client spins on a non-blocking socket: 10.1 receive calls per
//! request on preheat-kv against 2.0 copies (`perf stat`). A copy happens only where data moves.
//! What it sees differently: a receive that copies several buffers counts a read per buffer,
//! and a peek (`MSG_PEEK`, which copies) counts as a read — neither changes which thread read
//! a connection, which is what the tracker follows.
//!
//! The slots are the period programs' (an array indexed by the thread id's low bits, tagged
//! with the whole id). A thread whose slot another thread holds inside a period gets no
//! period meanwhile: each of its calls goes out alone, as a period of its own from now to now
//! (a clock read and a record per call, counted at index 1 of the lost array), so requests are
//! neither lost nor mixed, only their periods' times.
//!
//! What this form sees differently from the syscall form, by design: a period starts when the
//! thread runs again (not when its wait returns: the same instant but for the wait's return
//! path) or, without a sleep between, at the next request's receive, and ends when the thread
//! sleeps (not at its next wait's entry), so a thread that sleeps inside a request (a lock, a
//! page read) has two periods there; writes are sends that sent something (an empty send is
//! none); accepts are not seen (a period that only accepted is no
//! period); the calls are not stamped, so periods carry no first-read and first-write times
//! (the per-call syscall programs give them: `preheat observe --per-call`). The fields read —
//! `task_struct.pid` and `tgid`, `sk_buff.sk`, `sock`'s local port, peer port and peer
//! address, `se.cfs_rq`, `cfs_rq.rq`, `rq.clock` — are at the
//! offsets the running kernel's BTF gives ([`crate::btf::field`]); the tracepoints' arguments
//! are typed, so they are plain loads. A period's start on the scheduler's clock assumes that
//! clock agrees across CPUs (a stable TSC, as here) when a thread moves between them.
#![forbid(unsafe_code)]

use crate::bpfprog::{
    count_at, count_refused, element_at, helper, Asm, Insn, Label, FP, R0, R1, R2, R3, R4, R6, R7,
    R8, R9, RB_NO_WAKEUP,
};
use crate::slotasm::{self, Calls, Slots};

/// Connections kept per period (its reads and writes are all counted).
pub const EVENTS: usize = 6;

// The slot, and the record, which is the slot as written out (little-endian):
/// `tid` (u32) and the flags (u32), as every slot ([`slotasm`]).
pub const TAG: i16 = slotasm::TAG;
pub const FLAGS: i16 = slotasm::FLAGS;
/// CLOCK_MONOTONIC ns: switched in, and switched out asleep. (In the slot, a period opened at
/// a switch-in holds the scheduler's clock as its start until it closes: [`flag::SCHED`].)
pub const START_NS: i16 = 8;
pub const END_NS: i16 = 16;
/// Reads and writes on the port's connections (u32 each).
pub const READS: i16 = 24;
pub const WRITES: i16 = 28;
/// Connections kept in `CALLS` (u64).
pub const COUNT: i16 = 32;
/// The kept calls: the peer's IPv4 address as the socket holds it (u32), then its port (the
/// high half of a u32, network order as the socket holds it) and the edge (the low half:
/// [`READ`] or [`WRITE`]).
pub const CALLS: i16 = 40;
pub const CALL_SIZE: i16 = 8;
/// Bytes of a slot, and of a record at most (a record ends after its last kept call).
pub const SLOT_SIZE: usize = CALLS as usize + EVENTS * CALL_SIZE as usize;
/// The edges of a kept call.
pub const READ: u16 = 1;
pub const WRITE: u16 = 2;

/// Where the calls are, for [`slotasm`].
const CALLS_LAYOUT: Calls = Calls {
    count: COUNT,
    at: CALLS,
    size: CALL_SIZE,
    max: EVENTS,
};

/// The slot's flags.
pub mod flag {
    /// A period is open.
    pub const OPEN: i32 = crate::slotasm::OPEN;
    /// In a record: it closes the period.
    pub const END: i32 = 8;
    /// In the slot: the start is the scheduler's clock (`rq->clock`), converted to
    /// CLOCK_MONOTONIC when the period closes.
    pub const SCHED: i32 = 16;
}

/// The lost array's elements: records the full ring buffer refused, and calls written alone
/// (their thread's slot held by another thread).
pub const LOST_REFUSED: i32 = 0;
pub const LOST_ALONE: i32 = 1;
/// The same array's last elements: the anchor, CLOCK_MONOTONIC minus the scheduler's clock as
/// last measured where a period closed (both clocks read there; zero until then), and the
/// scheduler's clock then.
pub const ANCHOR: i32 = 2;
pub const ANCHOR_AT: i32 = 3;
/// Elements of that array.
pub const COUNTERS: u32 = 4;
/// The anchor is measured again at a close when it is older than this (ns).
pub const ANCHOR_EVERY_NS: i32 = 10_000_000;

/// Byte offsets of the kernel fields the programs read ([`crate::btf::field`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fields {
    pub task_pid: i16,
    pub task_tgid: i16,
    /// `sock.__sk_common.skc_num`: the local port, host order (u16).
    pub sk_num: i16,
    /// `skc_dport`: the peer's port, network order (u16).
    pub sk_dport: i16,
    /// `skc_daddr`: the peer's IPv4 address (u32).
    pub sk_daddr: i16,
    /// `sk_buff.sk`: the socket a received buffer belongs to (a pointer).
    pub skb_sk: i16,
    /// The way from a task to its CPU's scheduler clock: `task_struct.se.cfs_rq`,
    /// `cfs_rq.rq`, `rq.clock` (the first two only with group scheduling: `None` without, and
    /// a period then opens with a CLOCK_MONOTONIC read).
    pub rq_clock: Option<[i16; 3]>,
}

/// Which program: the scheduler's, or a socket tracepoint's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prog {
    /// `sched_switch(bool preempt, task *prev, task *next, unsigned prev_state)`.
    Switch,
    /// `skb_copy_datagram_iovec(const sk_buff *skb, int len)`: a receive that copies data.
    Recv,
    /// `sock_send_length(sock *sk, int ret, int flags)`.
    Send,
}

/// What a program needs.
#[derive(Debug, Clone)]
pub struct SchedSpec {
    pub prog: Prog,
    pub tgid: u32,
    pub port: u16,
    pub fields: Fields,
    pub ringbuf_fd: i32,
    pub lost_fd: i32,
    pub slots_fd: i32,
    pub slots: u32,
}

// The stack: the slot's key, the lost counter's key, a record of one call, a stamp.
const KEY: i16 = -8;
const LOST_KEY: i16 = -16;
const REC: i16 = LOST_KEY - CALLS - CALL_SIZE;
/// A clock read kept across a record's output.
const STAMP: i16 = REC - 8;
/// CLOCK_MONOTONIC minus the scheduler's clock, kept across a map lookup.
const OFFSET: i16 = STAMP - 8;
/// The scheduler's clock at a close.
const NOW_SC: i16 = OFFSET - 8;

/// The slot of thread `r7` in r8 ([`slotasm::find`]).
fn slot(a: &mut Asm, spec: &SchedSpec, out: Label, held: Label) {
    let slots = Slots {
        fd: spec.slots_fd,
        len: spec.slots,
    };
    slotasm::find(a, slots, (KEY, COUNT), (R7, R8), (out, held));
}

/// Open a period in the slot: now, nothing counted.
fn open_period(a: &mut Asm) {
    a.call(helper::KTIME_GET_NS);
    a.store64(R8, START_NS, R0);
    a.store64_imm(R8, READS, 0);
    a.store64_imm(R8, COUNT, 0);
    a.store32_imm(R8, FLAGS, flag::OPEN);
}

/// The scheduler clock of the CPU of the task at `ctx_off` of the context (r6) in r0, by
/// `path` ([`Fields::rq_clock`]): its run queue's `clock`, which `__schedule` has just brought
/// up to date when `sched_switch` runs — three loads, where reading CLOCK_MONOTONIC costs ~65
/// ns here.
fn sched_clock(a: &mut Asm, ctx_off: i16, path: [i16; 3]) {
    a.load64(R0, R6, ctx_off);
    for off in path {
        a.load64(R0, R0, off);
    }
}

/// Open a period at a switch-in: the scheduler's clock as its start (no clock read on the way
/// to the request: [`close_period`] converts it), where the kernel has the way to it.
fn open_at_switch(a: &mut Asm, spec: &SchedSpec) {
    let Some(path) = spec.fields.rq_clock else {
        return open_period(a);
    };
    sched_clock(a, NEXT, path);
    a.store64(R8, START_NS, R0);
    a.store64_imm(R8, READS, 0);
    a.store64_imm(R8, COUNT, 0);
    a.store32_imm(R8, FLAGS, flag::OPEN | flag::SCHED);
}

/// r0 = the counters array's element `index` (or to `none` if the map has none).
fn counter(a: &mut Asm, spec: &SchedSpec, index: i32, none: Label) {
    element_at(a, spec.lost_fd, LOST_KEY, index, none);
}

/// The anchor at `OFFSET`: the one kept unless it is missing or older than
/// [`ANCHOR_EVERY_NS`] by the scheduler's clock at `NOW_SC`, else measured again (one clock
/// read, here, where the scheduler's clock was read) and kept; to `none` if the map has no
/// such elements (it has).
fn anchor(a: &mut Asm, spec: &SchedSpec, none: Label) {
    let (fresh, done) = (a.label(), a.label());
    counter(a, spec, ANCHOR, none);
    a.load64(R1, R0, 0);
    a.jeq_imm(R1, 0, fresh);
    a.store64(FP, OFFSET, R1);
    counter(a, spec, ANCHOR_AT, none);
    a.load64(R1, FP, NOW_SC);
    a.load64(R2, R0, 0);
    a.sub(R1, R2);
    a.jsgt_imm(R1, ANCHOR_EVERY_NS, fresh);
    a.ja(done);
    a.bind(fresh);
    a.call(helper::KTIME_GET_NS);
    a.load64(R1, FP, NOW_SC);
    a.sub(R0, R1);
    a.store64(FP, OFFSET, R0);
    counter(a, spec, ANCHOR, none);
    a.load64(R1, FP, OFFSET);
    a.store64(R0, 0, R1);
    counter(a, spec, ANCHOR_AT, none);
    a.load64(R1, FP, NOW_SC);
    a.store64(R0, 0, R1);
    a.bind(done);
}

/// A start on the scheduler's clock ([`flag::SCHED`]) converted to CLOCK_MONOTONIC by the
/// offset in r1 (r2 clobbered).
fn start_to_mono(a: &mut Asm) {
    let (sched, done) = (a.label(), a.label());
    a.load32(R2, R8, FLAGS);
    a.jset_imm(R2, flag::SCHED, sched);
    a.ja(done);
    a.bind(sched);
    a.load64(R2, R8, START_NS);
    a.add(R2, R1);
    a.store64(R8, START_NS, R2);
    a.bind(done);
}

/// Close the slot's open period at a switch-out: written out if it counted a call, else
/// dropped. Where the kernel has the way to the scheduler's clock, the period's end is that
/// clock and both ends are converted to CLOCK_MONOTONIC by the anchor — no clock read, unless
/// the anchor is missing or old ([`anchor`]); elsewhere the end is a clock read.
fn close_period(a: &mut Asm, spec: &SchedSpec) {
    let (counted, closed) = (a.label(), a.label());
    // Reads and writes as one u64: zero when neither.
    a.load64(R1, R8, READS);
    a.jne_imm(R1, 0, counted);
    a.ja(closed);
    a.bind(counted);
    match spec.fields.rq_clock {
        None => {
            a.call(helper::KTIME_GET_NS);
            a.store64(R8, END_NS, R0);
        }
        Some(path) => {
            sched_clock(a, PREV, path);
            a.store64(FP, NOW_SC, R0);
            anchor(a, spec, closed);
            a.load64(R1, FP, OFFSET);
            a.load64(R0, FP, NOW_SC);
            a.add(R0, R1);
            a.store64(R8, END_NS, R0);
            start_to_mono(a);
        }
    }
    emit(a, spec, closed);
    a.bind(closed);
    a.store32_imm(R8, FLAGS, 0);
}

/// Write the slot out as a record that closes its period (its end stored), counting a refusal;
/// then to `done`.
fn emit(a: &mut Asm, spec: &SchedSpec, done: Label) {
    a.store32_imm(R8, FLAGS, flag::OPEN | flag::END);
    slotasm::output(a, spec.ringbuf_fd, R8, CALLS_LAYOUT);
    count_refused(a, spec.lost_fd, LOST_KEY, done);
    a.ja(done);
}

/// A receive in a period that already wrote is the next request: the period so far ends here
/// and the next starts here (one clock read for both).
fn next_request(a: &mut Asm, spec: &SchedSpec) {
    let (same, split) = (a.label(), a.label());
    a.load32(R1, R8, WRITES);
    a.jeq_imm(R1, 0, same);
    a.call(helper::KTIME_GET_NS);
    a.store64(R8, END_NS, R0);
    a.store64(FP, STAMP, R0);
    // A start on the scheduler's clock (the period opened at a switch-in): converted by the
    // last anchor — or, with none yet, the period starts here (no time for it).
    let (sched, none, converted) = (a.label(), a.label(), a.label());
    a.load32(R1, R8, FLAGS);
    a.jset_imm(R1, flag::SCHED, sched);
    a.ja(converted);
    a.bind(sched);
    counter(a, spec, ANCHOR, none);
    a.load64(R1, R0, 0);
    a.jeq_imm(R1, 0, none);
    start_to_mono(a);
    a.ja(converted);
    a.bind(none);
    a.load64(R1, FP, STAMP);
    a.store64(R8, START_NS, R1);
    a.bind(converted);
    emit(a, spec, split);
    a.bind(split);
    a.load64(R1, FP, STAMP);
    a.store64(R8, START_NS, R1);
    a.store64_imm(R8, READS, 0);
    a.store64_imm(R8, COUNT, 0);
    a.store32_imm(R8, FLAGS, flag::OPEN);
    a.bind(same);
}

/// The task at `ctx_off` of the context (r6) in r1 if it is a thread of the process (its id
/// then in r7); else to `skip`.
fn our_task(a: &mut Asm, spec: &SchedSpec, tgid: i32, ctx_off: i16, skip: Label) {
    a.load64(R1, R6, ctx_off);
    a.load32(R2, R1, spec.fields.task_tgid);
    a.jne_imm(R2, tgid, skip);
    a.load32(R7, R1, spec.fields.task_pid);
}

/// `sched_switch`'s arguments: the task switched out and the one switched in.
const PREV: i16 = 8;
const NEXT: i16 = 16;

/// `sched_switch`: close the period of a thread of the process going to sleep, open one for a
/// thread of it switched in after sleeping.
fn switch(a: &mut Asm, spec: &SchedSpec, tgid: i32, out: Label) {
    let (next, close) = (a.label(), a.label());
    our_task(a, spec, tgid, PREV, next);
    // Preempted, or still runnable (a yield): the period goes on.
    a.load64(R2, R6, 0);
    a.jne_imm(R2, 0, next);
    a.load64(R2, R6, 24);
    a.jeq_imm(R2, 0, next);
    slot(a, spec, next, next);
    a.load32(R1, R8, FLAGS);
    a.jset_imm(R1, flag::OPEN, close);
    a.ja(next);
    a.bind(close);
    close_period(a, spec);

    // The next task: a period opens unless one is open (it was preempted) or another thread
    // holds its slot inside one.
    a.bind(next);
    our_task(a, spec, tgid, NEXT, out);
    slot(a, spec, out, out);
    a.load32(R1, R8, FLAGS);
    a.jset_imm(R1, flag::OPEN, out);
    open_at_switch(a, spec);
    a.ja(out);
}

/// `skb_copy_datagram_iovec`/`sock_send_length`: data moved on a connection of the port (the
/// socket in r9), by a thread of the process, counted in its period and kept.
fn sock(a: &mut Asm, spec: &SchedSpec, tgid: i32, out: Label) {
    let f = spec.fields;
    a.load64(R9, R6, 0);
    if spec.prog == Prog::Recv {
        // The buffer's socket, if a socket owns it (the verifier insists on the test).
        a.load64(R9, R9, f.skb_sk);
        a.jeq_imm(R9, 0, out);
    }
    a.load16(R2, R9, f.sk_num);
    a.jne_imm(R2, i32::from(spec.port), out);
    let moved = a.label();
    // The length copied or the send's return value: an `int`, which the tracepoint passes
    // zero-extended (so compared in 32 bits: a failed send, -EAGAIN, is no data).
    a.load64(R2, R6, 8);
    a.jsgt32_imm(R2, 0, moved);
    a.ja(out);
    a.bind(moved);
    a.call(helper::GET_CURRENT_PID_TGID);
    a.mov(R7, R0);
    a.rsh_imm(R0, 32);
    a.jne_imm(R0, tgid, out);
    let (held, open) = (a.label(), a.label());
    slot(a, spec, out, held);
    // A thread found running at attach: its period starts now.
    a.load32(R1, R8, FLAGS);
    a.jset_imm(R1, flag::OPEN, open);
    open_period(a);
    a.bind(open);
    if spec.prog == Prog::Recv {
        next_request(a, spec);
    }
    let (counter, edge) = match spec.prog {
        Prog::Send => (WRITES, WRITE),
        _ => (READS, READ),
    };
    a.load32(R1, R8, counter);
    a.add_imm(R1, 1);
    a.store32(R8, counter, R1);
    // Keep the connection while there is room: r3 = the call's place (count < EVENTS, so
    // bounded for the verifier).
    let room = a.label();
    a.load64(R1, R8, COUNT);
    a.jlt_imm(R1, EVENTS as i32, room);
    a.ja(out);
    a.bind(room);
    a.mov(R3, R1);
    a.mul_imm(R3, i32::from(CALL_SIZE));
    a.add_imm(R3, i32::from(CALLS));
    a.add(R3, R8);
    store_call(a, f, edge);
    a.add_imm(R1, 1);
    a.store64(R8, COUNT, R1);
    a.ja(out);

    // Another thread holds the slot inside a period: this call goes out alone, as a period of
    // its own (now to now), counted.
    a.bind(held);
    a.call(helper::KTIME_GET_NS);
    a.mov32(R1, R7);
    a.store32(FP, REC + TAG, R1);
    a.store32_imm(FP, REC + FLAGS, flag::END);
    a.store64(FP, REC + START_NS, R0);
    a.store64(FP, REC + END_NS, R0);
    let (reads, writes) = if edge == WRITE { (0, 1) } else { (1, 0) };
    a.store32_imm(FP, REC + READS, reads);
    a.store32_imm(FP, REC + WRITES, writes);
    a.store64_imm(FP, REC + COUNT, 1);
    a.mov(R3, FP);
    a.add_imm(R3, i32::from(REC + CALLS));
    store_call(a, f, edge);
    a.load_map_fd(R1, spec.ringbuf_fd);
    a.mov(R2, FP);
    a.add_imm(R2, i32::from(REC));
    a.mov_imm(R3, i32::from(CALLS + CALL_SIZE));
    a.mov_imm(R4, RB_NO_WAKEUP);
    a.call(helper::RINGBUF_OUTPUT);
    let refused = a.label();
    a.jne_imm(R0, 0, refused);
    count_at(a, spec.lost_fd, LOST_KEY, LOST_ALONE, out);
    a.ja(out);
    a.bind(refused);
    count_at(a, spec.lost_fd, LOST_KEY, LOST_REFUSED, out);
    a.ja(out);
}

/// Store the current call at r3: the peer's address, then its port and `edge` (the socket in
/// r9).
fn store_call(a: &mut Asm, f: Fields, edge: u16) {
    a.load32(R2, R9, f.sk_daddr);
    a.store32(R3, 0, R2);
    a.load16(R2, R9, f.sk_dport);
    a.lsh_imm(R2, 16);
    a.or_imm(R2, i32::from(edge));
    a.store32(R3, 4, R2);
}

/// The program of `spec` (see the module docs), BTF-typed (`tp_btf`).
pub fn sched_observer(spec: &SchedSpec) -> Result<Vec<Insn>, String> {
    let tgid = i32::try_from(spec.tgid).map_err(|_| format!("pid {} out of range", spec.tgid))?;
    if !spec.slots.is_power_of_two() || spec.slots > 1 << 20 {
        return Err(format!(
            "{} slots: not a power of two up to 2^20",
            spec.slots
        ));
    }
    let mut a = Asm::default();
    let out = a.label();
    a.mov(R6, R1); // r6 = ctx
    match spec.prog {
        Prog::Switch => switch(&mut a, spec, tgid, out),
        Prog::Recv | Prog::Send => sock(&mut a, spec, tgid, out),
    }
    a.bind(out);
    a.mov_imm(R0, 0);
    a.exit();
    a.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIELDS: Fields = Fields {
        task_pid: 1264,
        task_tgid: 1268,
        sk_num: 14,
        sk_dport: 12,
        sk_daddr: 0,
        skb_sk: 24,
        rq_clock: Some([168, 312, 2776]),
    };

    fn spec(prog: Prog) -> SchedSpec {
        SchedSpec {
            prog,
            tgid: 4242,
            port: 8080,
            fields: FIELDS,
            ringbuf_fd: 5,
            lost_fd: 6,
            slots_fd: 7,
            slots: 4096,
        }
    }

    fn program(prog: Prog) -> Vec<Insn> {
        sched_observer(&spec(prog)).unwrap()
    }

    use crate::bpfprog::check::helper_calls as calls;

    #[test]
    fn the_programs_are_well_formed() {
        for prog in [Prog::Switch, Prog::Recv, Prog::Send] {
            let p = program(prog);
            crate::bpfprog::check::well_formed(&p, &format!("{prog:?}"));
            // No helper reads: the arguments are typed.
            assert_eq!(calls(&p, helper::PROBE_READ_KERNEL), 0);
            // The return value (an int, passed zero-extended) is compared in 32 bits, as
            // signed: never in 64 (where -EAGAIN is a large positive number).
            if prog != Prog::Switch {
                assert!(p.iter().any(|i| i.code == 0x66 && i.imm == 0), "{prog:?}");
                assert!(!p.iter().any(|i| i.code == 0x65), "{prog:?}");
            }
            // The process filter compares against the pid.
            assert!(
                p.iter().any(|i| i.code == 0x55 && i.imm == 4242),
                "{prog:?}"
            );
        }
        // The switch reads CLOCK_MONOTONIC only to close a period: it opens one on the
        // scheduler's clock (`this_cpu_ptr(&runqueues)->clock`: a load), read again at the
        // close to convert. The socket programs read the clock only to open a period for a
        // thread found running and for a call written alone, and filter on the port first of
        // all. The receive also splits a period at the next request.
        let switch = program(Prog::Switch);
        // One clock read: where a close measures the anchor again (missing or older than
        // ANCHOR_EVERY_NS by the scheduler's clock).
        assert_eq!(calls(&switch, helper::KTIME_GET_NS), 1);
        assert!(switch
            .iter()
            .any(|i| i.code == 0x65 && i.imm == ANCHOR_EVERY_NS));
        // next->se.cfs_rq->rq->clock at the switch-in that opens, prev's at the close.
        let chains = switch
            .windows(3)
            .filter(|w| {
                w.iter()
                    .zip([168, 312, 2776])
                    .all(|(i, off)| i.code == 0x79 && i.off == off)
            })
            .count();
        assert_eq!(chains, 2);
        // Without the way to the scheduler's clock, a period opens with a clock read.
        let mut plain = FIELDS;
        plain.rq_clock = None;
        let spec = SchedSpec {
            fields: plain,
            ..spec(Prog::Switch)
        };
        assert_eq!(
            calls(&sched_observer(&spec).unwrap(), helper::KTIME_GET_NS),
            2
        );
        for (prog, clocks, outputs) in [(Prog::Recv, 3, 2), (Prog::Send, 2, 1)] {
            let p = program(prog);
            assert_eq!(calls(&p, helper::KTIME_GET_NS), clocks);
            let port = p.iter().position(|i| i.code == 0x55 && i.imm == 8080);
            let pid = p.iter().position(|i| i.code == 0x85);
            assert!(
                port < pid,
                "{prog:?}: the port is checked before any helper call"
            );
            assert_eq!(calls(&p, helper::RINGBUF_OUTPUT), outputs);
        }
        assert_eq!(calls(&program(Prog::Switch), helper::RINGBUF_OUTPUT), 1);
        // The receive reads the socket from the buffer (r9 = r9->sk), the send has it in the
        // context; both then read the port from it.
        let sk_of_skb = |p: &[Insn]| {
            p.iter()
                .filter(|i| i.code == 0x79 && i.regs == 0x99 && i.off == 24)
                .count()
        };
        assert_eq!(sk_of_skb(&program(Prog::Recv)), 1);
        assert_eq!(sk_of_skb(&program(Prog::Send)), 0);
        let bad = |tgid, slots| SchedSpec {
            prog: Prog::Switch,
            tgid,
            port: 1,
            fields: FIELDS,
            ringbuf_fd: 1,
            lost_fd: 2,
            slots_fd: 3,
            slots,
        };
        assert!(sched_observer(&bad(u32::MAX, 4096)).is_err());
        for slots in [0, 3, 1 << 21] {
            assert!(sched_observer(&bad(1, slots)).is_err());
        }
    }

    #[test]
    fn the_slot_layout_fits() {
        for off in [START_NS, END_NS, COUNT] {
            assert!(off + 8 <= CALLS && off % 8 == 0);
        }
        assert_eq!(READS + 4, WRITES);
        assert_eq!(READS % 8, 0, "READS and WRITES are tested as one u64");
        assert_eq!(CALLS as usize + EVENTS * CALL_SIZE as usize, SLOT_SIZE);
        assert_eq!(SLOT_SIZE % 8, 0);
        // A call written alone fits on the stack below the keys.
        const {
            assert!(-(STAMP as i32) <= 512 && REC + CALLS + CALL_SIZE <= LOST_KEY);
            assert!(STAMP + 8 <= REC);
        }
    }
}
