//! The observer's cheaper eBPF programs: one record per busy period (pure: no I/O,
//! deterministic).
//!
//! The per-call programs ([`crate::bpfprog::observer`]) write a stamped record of every traced
//! call: five records and five clock reads per request of an event-loop server, which is most
//! of what the observer costs (`preheat bench observe`, the crate docs). These keep a little
//! state per thread in the kernel instead — a slot of an array map, indexed by the thread id's
//! low bits and tagged with the whole id — and write what the tracker ([`crate::periods`])
//! needs in one record per busy period:
//!
//! - A wait's **exit** (epoll, poll, select, the waiting futex operations, sleeps) opens a
//!   period in the thread's slot: its time (the one clock read at the start), number and return
//!   value. No record.
//! - While a period is open, the calls the tracker attributes — a read's or accept's exit that
//!   returned something (its fd read from the registers, which the call left as they were), a
//!   write's or close's entry — are kept in the slot, unstamped, up to [`EVENTS`]; one more
//!   writes the slot out as a partial record and starts over.
//! - The next wait's **entry** closes the period: its time (the second clock read), number and
//!   first arguments go into the slot, and the slot is written out as one record. A period that
//!   kept no call is closed without either: the tracker would only count it as a candidate
//!   period without the port (a Go server's threads have one or two such per request: wake-ups
//!   between futex waits), so that count covers only periods with calls.
//!
//! What the per-call programs would write and the tracker never uses is dropped in the kernel:
//! non-waiting futex calls (wake-ups), reads that returned nothing, failed accepts, and the
//! entries of an event-loop thread's reads and accepts (their exits carry the fd). A thread
//! that has not been seen in an event wait may block in a read or accept on the port, which
//! the tracker counts as a wait: there those entries close the period like a wait's, and
//! whatever such a thread does outside an open period is written per call, stamped, as the
//! per-call programs do ([`crate::bpfprog`]'s record, exits with their fd). So the tracker sees
//! the same calls in the same order per thread; what it loses is the time of the calls inside a
//! period (they carry the period's start), so [`crate::periods::Period`]'s first read and first
//! write are not known — callers that need them (the demo's `--syscall-stages`) use the per-call
//! programs.
//!
//! Two threads whose ids agree in the low bits share a slot: one takes it over only between
//! the other's periods, and meanwhile writes its calls per call, stamped (correct, at the
//! per-call cost); so neither loses nor mixes the other's periods (barring both changing the
//! slot at the same instant on two CPUs, where the verifier's bounds make a mixed record the
//! worst case). A slot left inside a period by a thread that exited stays its own.
//!
//! Only the BTF-typed form exists: the untyped one would read each register through a helper
//! call, which is what this saves.
#![forbid(unsafe_code)]

use crate::bpfprog::{
    count_refused, helper, stamp_and_output, Asm, Edge, Insn, Label, FP, R0, R1, R2, R3, R4, R5,
    R6, R7, R8, R9, RECORD_SIZE, REGS_DI, REGS_ORIG_AX, REGS_SI,
};
use crate::periods::nr;
use crate::slotasm::{self, Calls, Slots};

/// Calls kept per period in a slot before it is written out as a partial record.
pub const EVENTS: usize = 6;
/// Slots in the per-thread array by default (a power of two: the thread id's low bits index
/// it).
pub const SLOTS: u32 = 4096;

// The slot, and the period record, which is the slot as written out (little-endian):
/// `tid` (u32) and the flags (u32).
pub const TAG: i16 = slotasm::TAG;
pub const FLAGS: i16 = slotasm::FLAGS;
/// The opening wait's exit: CLOCK_MONOTONIC ns, number, return value.
pub const START_NS: i16 = 8;
pub const START_NR: i16 = 16;
pub const START_RET: i16 = 24;
/// Calls kept in `EVENTS`.
pub const COUNT: i16 = 32;
/// The closing wait's entry (a record with [`flag::END`]): ns, number, first two arguments.
pub const END_NS: i16 = 40;
pub const END_NR: i16 = 48;
pub const END_A0: i16 = 56;
pub const END_A1: i16 = 64;
/// The calls: each `nr | edge << 32` (edge 0 entry, 1 exit), then the first argument, then the
/// second argument (entry) or the return value (exit).
pub const CALLS: i16 = 72;
pub const CALL_SIZE: i16 = 24;
/// Bytes of a slot, and of a period record at most (a record ends after its last kept call).
pub const SLOT_SIZE: usize = CALLS as usize + EVENTS * CALL_SIZE as usize;

/// The slot's flags.
pub mod flag {
    /// Seen in an event wait: its reads' and accepts' entries are not written.
    pub const EVENT_LOOP: i32 = 1;
    /// A period is open (its start is in the slot).
    pub const OPEN: i32 = crate::slotasm::OPEN;
    /// The open period's start went out in a partial record already.
    pub const START_SENT: i32 = 4;
    /// In a record: it closes the period (its end is valid); else a partial record.
    pub const END: i32 = 8;
    /// What a closed period clears.
    pub(crate) const CLOSED: i32 = END | OPEN | START_SENT;
}

/// What a period program needs.
#[derive(Debug, Clone)]
pub struct PeriodSpec {
    pub edge: Edge,
    /// The observed process (its thread group id).
    pub tgid: u32,
    pub ringbuf_fd: i32,
    pub lost_fd: i32,
    /// The per-thread array: `slots` slots (a power of two) of [`SLOT_SIZE`] bytes.
    pub slots_fd: i32,
    pub slots: u32,
}

// The stack: the slot's key, the lost counter's key, the exit's return value, a per-call record.
const KEY: i16 = -8;
const LOST_KEY: i16 = -16;
const RET: i16 = -24;
const REC: i16 = -24 - RECORD_SIZE as i16;

const EVENT_WAITS: [i64; 7] = [
    nr::EPOLL_WAIT,
    nr::EPOLL_PWAIT,
    nr::EPOLL_PWAIT2,
    nr::POLL,
    nr::PPOLL,
    nr::SELECT,
    nr::PSELECT6,
];
const OTHER_WAITS: [i64; 4] = [
    nr::NANOSLEEP,
    nr::CLOCK_NANOSLEEP,
    nr::PAUSE,
    nr::FUTEX_WAITV,
];
const READS: [i64; 5] = [nr::READ, nr::READV, nr::RECVFROM, nr::RECVMSG, nr::RECVMMSG];
const ACCEPTS: [i64; 2] = [nr::ACCEPT, nr::ACCEPT4];
const WRITES: [i64; 7] = [
    nr::WRITE,
    nr::WRITEV,
    nr::SENDTO,
    nr::SENDMSG,
    nr::SENDMMSG,
    nr::SENDFILE,
    nr::CLOSE,
];
/// The waiting futex operations (as [`crate::periods::classify`]).
const FUTEX_WAIT_OPS: [i32; 5] = [0, 6, 9, 11, 13];

fn imm(n: i64) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// `if r8 is one of ns goto to`.
fn any_of(a: &mut Asm, ns: &[i64], to: Label) {
    for &n in ns {
        a.jeq_imm(R8, imm(n), to);
    }
}

/// `flags = (flags | set) & !clear`.
fn set_flags(a: &mut Asm, set: i32, clear: i32) {
    a.load32(R1, R6, FLAGS);
    if set != 0 {
        a.or_imm(R1, set);
    }
    if clear != 0 {
        a.and_imm(R1, !clear);
    }
    a.store32(R6, FLAGS, R1);
}

/// Write the slot out up to its last kept call (with `kind` set in its flags for the record),
/// count a refusal; then `count = 0` and the flags as after such a record.
fn emit_slot(a: &mut Asm, spec: &PeriodSpec, kind: i32) {
    set_flags(a, kind, 0);
    slotasm::output(
        a,
        spec.ringbuf_fd,
        R6,
        Calls {
            count: COUNT,
            at: CALLS,
            size: CALL_SIZE,
            max: EVENTS,
        },
    );
    let done = a.label();
    count_refused(a, spec.lost_fd, LOST_KEY, done);
    a.bind(done);
    a.store64_imm(R6, COUNT, 0);
    if kind == flag::END {
        set_flags(a, 0, flag::CLOSED);
    } else {
        set_flags(a, flag::START_SENT, 0);
    }
}

/// Keep the current call in the slot (`exit`: its fd and return value, else its first two
/// arguments), writing the slot out first as a partial record if it is full.
fn keep_call(a: &mut Asm, spec: &PeriodSpec, exit: bool) {
    // r1 = the count, below EVENTS on both paths (so bounded for the verifier): as read, or 0
    // after a full slot went out.
    let room = a.label();
    a.load64(R1, R6, COUNT);
    a.jlt_imm(R1, EVENTS as i32, room);
    emit_slot(a, spec, 0);
    a.mov_imm(R1, 0);
    a.bind(room);
    a.mov(R2, R1);
    a.mul_imm(R2, i32::from(CALL_SIZE));
    a.add_imm(R2, i32::from(CALLS));
    a.mov(R3, R6);
    a.add(R3, R2);
    a.mov(R4, R8);
    if exit {
        a.mov_imm(R5, 1);
        a.lsh_imm(R5, 32);
        a.or(R4, R5);
    }
    a.store64(R3, 0, R4);
    a.load64(R4, R9, REGS_DI);
    a.store64(R3, 8, R4);
    if exit {
        a.load64(R4, FP, RET);
    } else {
        a.load64(R4, R9, REGS_SI);
    }
    a.store64(R3, 16, R4);
    a.add_imm(R1, 1);
    a.store64(R6, COUNT, R1);
}

/// A per-call record of the current call, stamped ([`crate::bpfprog`]'s layout; an exit with
/// its fd, edge 2).
fn per_call(a: &mut Asm, spec: &PeriodSpec) {
    a.store64(FP, REC, R7);
    a.store64(FP, REC + 24, R8);
    match spec.edge {
        Edge::Enter => {
            a.store64_imm(FP, REC + 8, 0);
            a.load64(R1, R9, REGS_DI);
            a.store64(FP, REC + 32, R1);
            a.load64(R1, R9, REGS_SI);
            a.store64(FP, REC + 40, R1);
        }
        Edge::Exit => {
            a.store64_imm(FP, REC + 8, 2);
            a.load64(R1, FP, RET);
            a.store64(FP, REC + 32, R1);
            a.load64(R1, R9, REGS_DI);
            a.store64(FP, REC + 40, R1);
        }
    }
    let done = a.label();
    stamp_and_output(a, (spec.ringbuf_fd, spec.lost_fd), (REC, LOST_KEY), done);
    a.bind(done);
}

/// The slot of the current thread in r6 ([`slotasm::find`]); where another thread holds it
/// inside a period, to `taken`, where the call is written per call (stamped, as the per-call
/// programs would).
fn slot(a: &mut Asm, spec: &PeriodSpec, out: Label, taken: Label) {
    let slots = Slots {
        fd: spec.slots_fd,
        len: spec.slots,
    };
    slotasm::find(a, slots, (KEY, COUNT), (R7, R6), (out, taken));
}

/// Open a period in the slot: the wait's exit time, number and return value.
fn open_period(a: &mut Asm) {
    a.call(helper::KTIME_GET_NS);
    a.store64(R6, START_NS, R0);
    a.store64(R6, START_NR, R8);
    a.load64(R1, FP, RET);
    a.store64(R6, START_RET, R1);
    a.store64_imm(R6, COUNT, 0);
    set_flags(a, flag::OPEN, flag::START_SENT);
}

/// Close the open period with the current entry (stamped) and write the slot out — unless it
/// kept nothing.
fn close_period(a: &mut Asm, spec: &PeriodSpec) {
    // A period that kept no call (and sent none in a partial record) touched nothing the
    // tracker attributes: closed without a clock read or a record.
    let (full, done) = (a.label(), a.label());
    a.load64(R1, R6, COUNT);
    a.jne_imm(R1, 0, full);
    if_flag(a, flag::START_SENT, full);
    set_flags(a, 0, flag::CLOSED);
    a.ja(done);
    a.bind(full);
    a.call(helper::KTIME_GET_NS);
    a.store64(R6, END_NS, R0);
    a.store64(R6, END_NR, R8);
    a.load64(R1, R9, REGS_DI);
    a.store64(R6, END_A0, R1);
    a.load64(R1, R9, REGS_SI);
    a.store64(R6, END_A1, R1);
    emit_slot(a, spec, flag::END);
    a.bind(done);
}

/// `if the slot's flags have bit goto to`.
fn if_flag(a: &mut Asm, bit: i32, to: Label) {
    a.load32(R1, R6, FLAGS);
    a.jset_imm(R1, bit, to);
}

/// Where the class dispatch of [`period_observer`] goes, and its two endings.
struct Targets {
    out: Label,
    /// A per-call record of the current call.
    per: Label,
    read: Label,
    accept: Label,
    write: Label,
}

/// The exit program after a wait's slot lookup: open a period; and its reads and accepts.
fn exit_paths(a: &mut Asm, spec: &PeriodSpec, to: &Targets) {
    let Targets {
        out, read, accept, ..
    } = *to;
    // Open a period, writing out one still open first (its end was never seen).
    let (stale, fresh) = (a.label(), a.label());
    if_flag(a, flag::OPEN, stale);
    a.ja(fresh);
    a.bind(stale);
    emit_slot(a, spec, 0);
    a.bind(fresh);
    open_period(a);
    a.ja(out);

    // A read that returned data, an accept that returned a connection: kept in an open
    // period, else written per call; the rest dropped.
    let got = a.label();
    a.bind(read);
    a.load64(R1, FP, RET);
    a.jsgt_imm(R1, 0, got);
    a.ja(out);
    a.bind(accept);
    a.load64(R1, FP, RET);
    a.jsge_imm(R1, 0, got);
    a.ja(out);
    a.bind(got);
    keep_in_period(a, spec, to, true);
}

/// The current call kept in the thread's open period, or written per call where none is open.
fn keep_in_period(a: &mut Asm, spec: &PeriodSpec, to: &Targets, exit: bool) {
    let keep = a.label();
    slot(a, spec, to.out, to.per);
    if_flag(a, flag::OPEN, keep);
    a.ja(to.per);
    a.bind(keep);
    keep_call(a, spec, exit);
    a.ja(to.out);
}

/// The entry program after a wait's slot lookup: close the open period; and its reads,
/// accepts, writes and closes.
fn entry_paths(a: &mut Asm, spec: &PeriodSpec, to: &Targets) {
    let Targets {
        out,
        per,
        read,
        accept,
        write,
    } = *to;
    // A wait's entry, or a read's or accept's by a thread not seen in an event wait (the
    // tracker may count it as one): closes an open period, else written per call.
    let (closing, close) = (a.label(), a.label());
    a.bind(closing);
    if_flag(a, flag::OPEN, close);
    a.ja(per);
    a.bind(close);
    close_period(a, spec);
    a.ja(out);

    // An event-loop thread's reads and accepts: their exits carry the fd.
    a.bind(read);
    a.bind(accept);
    slot(a, spec, out, per);
    if_flag(a, flag::EVENT_LOOP, out);
    a.ja(closing);

    // Writes and closes: kept in an open period, else written per call.
    a.bind(write);
    keep_in_period(a, spec, to, false);
}

/// The period program of `spec` (see the module docs), BTF-typed (`tp_btf`): its context is
/// `(struct pt_regs *regs, long id)` at entry and `(regs, long ret)` at exit.
pub fn period_observer(spec: &PeriodSpec) -> Result<Vec<Insn>, String> {
    let tgid = i32::try_from(spec.tgid).map_err(|_| format!("pid {} out of range", spec.tgid))?;
    if !spec.slots.is_power_of_two() || spec.slots > 1 << 20 {
        return Err(format!(
            "{} slots: not a power of two up to 2^20",
            spec.slots
        ));
    }
    let exit = spec.edge == Edge::Exit;
    let mut a = Asm::default();
    let out = a.label();
    a.mov(R6, R1); // r6 = ctx, until the slot
    a.call(helper::GET_CURRENT_PID_TGID);
    a.mov(R7, R0); // r7 = tgid << 32 | tid
    a.rsh_imm(R0, 32);
    a.jne_imm(R0, tgid, out);
    a.load64(R9, R6, 0); // r9 = regs
    if exit {
        a.load64(R1, R6, 8);
        a.store64(FP, RET, R1);
        a.load64(R8, R9, REGS_ORIG_AX); // r8 = the call's number
    } else {
        a.load64(R8, R6, 8);
    }
    // The classes; every other call stops here, before the slot.
    let (event_wait, wait, futex, read, accept, write) = (
        a.label(),
        a.label(),
        a.label(),
        a.label(),
        a.label(),
        a.label(),
    );
    any_of(&mut a, &EVENT_WAITS, event_wait);
    any_of(&mut a, &OTHER_WAITS, wait);
    a.jeq_imm(R8, imm(nr::FUTEX), futex);
    any_of(&mut a, &READS, read);
    any_of(&mut a, &ACCEPTS, accept);
    if !exit {
        any_of(&mut a, &WRITES, write);
    }
    a.ja(out);

    // A futex call is a wait only for the waiting operations; wake-ups are dropped.
    a.bind(futex);
    a.load64(R1, R9, REGS_SI);
    a.and_imm(R1, 0x7f);
    for op in FUTEX_WAIT_OPS {
        a.jeq_imm(R1, op, wait);
    }
    a.ja(out);

    let (waited, per) = (a.label(), a.label());
    a.bind(event_wait);
    slot(&mut a, spec, out, per);
    if !exit {
        set_flags(&mut a, flag::EVENT_LOOP, 0);
    }
    a.ja(waited);
    a.bind(wait);
    slot(&mut a, spec, out, per);
    a.bind(waited);
    let to = Targets {
        out,
        per,
        read,
        accept,
        write,
    };
    if exit {
        exit_paths(&mut a, spec, &to);
    } else {
        entry_paths(&mut a, spec, &to);
    }
    a.bind(per);
    per_call(&mut a, spec);
    a.bind(out);
    a.mov_imm(R0, 0);
    a.exit();
    a.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn program(edge: Edge) -> Vec<Insn> {
        period_observer(&PeriodSpec {
            edge,
            tgid: 4242,
            ringbuf_fd: 5,
            lost_fd: 6,
            slots_fd: 7,
            slots: SLOTS,
        })
        .unwrap()
    }

    use crate::bpfprog::check::helper_calls as calls;

    #[test]
    fn the_period_programs_are_well_formed() {
        for edge in [Edge::Enter, Edge::Exit] {
            let p = program(edge);
            crate::bpfprog::check::well_formed(&p, &format!("{edge:?}"));
            // Typed only: no register read through a helper.
            assert_eq!(calls(&p, helper::PROBE_READ_KERNEL), 0);
            // Two places read the clock: the period's boundary and the per-call record.
            assert_eq!(calls(&p, helper::KTIME_GET_NS), 2, "{edge:?}");
            // The process filter compares against the pid.
            assert!(p.iter().any(|i| i.code == 0x55 && i.imm == 4242));
        }
        // Only the entry program sees writes and closes; only the exit program opens periods.
        let enter = program(Edge::Enter);
        let exit = program(Edge::Exit);
        let compares = |p: &[Insn], n: i64| {
            p.iter()
                .filter(|i| i.code == 0x15 && i.regs & 0x0f == 8 && i64::from(i.imm) == n)
                .count()
        };
        assert_eq!(compares(&enter, nr::SENDTO), 1);
        assert_eq!(compares(&exit, nr::SENDTO), 0);
        assert!(period_observer(&PeriodSpec {
            edge: Edge::Enter,
            tgid: u32::MAX,
            ringbuf_fd: 1,
            lost_fd: 2,
            slots_fd: 3,
            slots: SLOTS,
        })
        .is_err());
        for slots in [0, 3, 1 << 21] {
            assert!(period_observer(&PeriodSpec {
                edge: Edge::Exit,
                tgid: 1,
                ringbuf_fd: 1,
                lost_fd: 2,
                slots_fd: 3,
                slots,
            })
            .is_err());
        }
    }

    #[test]
    fn the_slot_layout_fits() {
        // Every fixed field lies before the calls, the calls end at the slot's end, and the
        // stack holds a per-call record below the keys.
        for off in [
            START_NS, START_NR, START_RET, COUNT, END_NS, END_NR, END_A0, END_A1,
        ] {
            assert!(off + 8 <= CALLS && off % 8 == 0);
        }
        assert_eq!(CALLS as usize + EVENTS * CALL_SIZE as usize, SLOT_SIZE);
        assert_eq!(SLOT_SIZE % 8, 0);
        assert!(SLOTS.is_power_of_two());
        assert!(-(REC as i32) <= 512 && REC + RECORD_SIZE as i16 <= RET);
    }
}
