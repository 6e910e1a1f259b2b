//! What the period programs ([`crate::periodprog`]) and the scheduler form
//! ([`crate::schedprog`]) do alike with a thread's slot (pure: no I/O, deterministic): find it
//! in the per-thread array, and write it out up to its last kept call.
//!
//! Both slots begin with the thread's id (`u32` at [`TAG`]) and flags (`u32` at [`FLAGS`],
//! [`OPEN`] while a period is open), and keep their count of calls as a `u64` at an offset
//! each layout names.
#![forbid(unsafe_code)]

use crate::bpfprog::{helper, Asm, Label, Reg, FP, R0, R1, R2, R3, R4, RB_NO_WAKEUP};

/// The thread id the slot belongs to (u32).
pub const TAG: i16 = 0;
/// The slot's flags (u32).
pub const FLAGS: i16 = 4;
/// The flag set while a period is open.
pub const OPEN: i32 = 2;

/// The per-thread array: its fd and its number of slots (a power of two).
#[derive(Debug, Clone, Copy)]
pub struct Slots {
    pub fd: i32,
    pub len: u32,
}

/// A slot layout's calls: where the count is, where the calls begin, their size and how many
/// fit.
#[derive(Debug, Clone, Copy)]
pub struct Calls {
    pub count: i16,
    pub at: i16,
    pub size: i16,
    pub max: usize,
}

/// The slot of the thread whose id is in `tid` into `slot`, its key on the stack at `key`; to
/// `out` if the map gives none. A slot another thread holds is taken over (emptied: flags and
/// count zero) unless that thread is inside a period: then to `held`. Two threads whose ids
/// agree in the low bits thus never lose or mix each other's periods (barring both changing
/// the slot at the same instant on two CPUs: the verifier bounds every access, so a mixed
/// record is the worst case).
pub fn find(
    a: &mut Asm,
    slots: Slots,
    (key, count): (i16, i16),
    (tid, slot): (Reg, Reg),
    (out, held): (Label, Label),
) {
    a.mov32(R1, tid);
    a.and_imm(R1, slots.len.saturating_sub(1) as i32);
    a.store32(FP, key, R1);
    a.load_map_fd(R1, slots.fd);
    a.mov(R2, FP);
    a.add_imm(R2, i32::from(key));
    a.call(helper::MAP_LOOKUP_ELEM);
    a.jeq_imm(R0, 0, out);
    a.mov(slot, R0);
    let mine = a.label();
    a.load32(R1, slot, TAG);
    a.mov32(R2, tid);
    a.jeq(R1, R2, mine);
    a.load32(R1, slot, FLAGS);
    a.jset_imm(R1, OPEN, held);
    a.store32(slot, TAG, R2);
    a.store32_imm(slot, FLAGS, 0);
    a.store64_imm(slot, count, 0);
    a.bind(mine);
}

/// Write `slot` into the ring buffer up to its last kept call (`calls.at + min(count, max) *
/// size` bytes, bounded for the verifier); `bpf_ringbuf_output`'s result in r0.
pub fn output(a: &mut Asm, ringbuf_fd: i32, slot: Reg, calls: Calls) {
    let fits = a.label();
    a.load64(R3, slot, calls.count);
    a.jlt_imm(R3, calls.max as i32 + 1, fits);
    a.mov_imm(R3, calls.max as i32);
    a.bind(fits);
    a.mul_imm(R3, i32::from(calls.size));
    a.add_imm(R3, i32::from(calls.at));
    a.load_map_fd(R1, ringbuf_fd);
    a.mov(R2, slot);
    a.mov_imm(R4, RB_NO_WAKEUP);
    a.call(helper::RINGBUF_OUTPUT);
}
