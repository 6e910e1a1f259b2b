//! The observer's per-call eBPF programs, and the assembler of every observer program (pure: no
//! I/O, deterministic). The default where typed is the cheaper form that writes one record per
//! busy period ([`crate::periodprog`]); these write one per call, and run where a caller needs
//! each call's time or the programs cannot be typed.
//!
//! Why hand-assembled: the program is ~60 instructions and the machine kind this project runs on
//! has no BPF compiler in the build (clang's BPF target or `bpf-linker` would be a build-time
//! dependency of every checkout); the encoding is the kernel's stable `struct bpf_insn` ABI
//! (`Documentation/bpf/standardization/instruction-set.rst`), and the kernel's verifier checks
//! every program before it runs, so a wrong program is refused at load, never run.
//!
//! What the program does, on the raw tracepoint `sys_enter` or `sys_exit` (one program each):
//! drop every call not of process `tgid` or not in the traced set (a chain of compares on the
//! syscall number; at exit the number is the registers' `orig_ax`), and for the rest write one
//! record ([`RECORD_SIZE`]: thread id, edge, CLOCK_MONOTONIC time, number, first two arguments
//! or the return value) into a BPF ring buffer; a record the full buffer refuses is counted in
//! a one-element array (the lost count). The tracker in user space is the same as for perf
//! samples ([`crate::periods`]).
//!
//! Two forms of the same program: **BTF-typed** (`BPF_PROG_TYPE_TRACING` attached as
//! `tp_btf`, the tracepoint named by its type id in the kernel's BTF: [`crate::btf`]), where
//! the verifier knows the first argument is a `struct pt_regs` and the program reads the
//! syscall number and arguments with plain loads; and **untyped** (`BPF_PROG_TYPE_RAW_TRACEPOINT`),
//! where each of those reads is a `bpf_probe_read_kernel` call — three per kept entry, one per
//! exit of every call of the process. The typed form is the default and measured cheaper
//! (`preheat bench observe`, the crate docs): 4.2 / 4.4 / 3.1% and 4.2 / 4.0 / 7.7% of
//! preheat-kv's throughput against 6.1 / 6.1 / 6.1% and 6.0 / 7.1 / 5.8% untyped (two series).
//!
//! Why a raw tracepoint (`BPF_RAW_TRACEPOINT_OPEN`), not a program on the tracepoint's perf
//! event: a perf event's programs share the tracepoint with every other perf user of it, and
//! a program returning 0 there suppresses *their* samples too (measured: a perf observer run
//! beside it in the test suite saw 3 of ~200 events). A raw tracepoint's program is a probe of
//! its own and touches nobody else's events.
//!
//! Against perf samples filtered in the kernel ([`crate::session::Mechanism::SystemWide`]): the
//! same events, but each is a 48-byte copy into a ring buffer instead of a perf sample (~0.13
//! µs per record against ~0.45 µs per sample, measured: the crate docs), and the process
//! filter is its thread group id, which covers threads created later without a refresh.
//!
//! Where x86_64 is assumed: the `pt_regs` offsets of the arguments and of `orig_ax`, and the
//! syscall numbers (as everywhere in this crate).
#![forbid(unsafe_code)]

/// One instruction, `struct bpf_insn`: opcode, dst (low nibble) and src (high nibble)
/// registers, a signed 16-bit offset, a signed 32-bit immediate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Insn {
    pub code: u8,
    pub regs: u8,
    pub off: i16,
    pub imm: i32,
}

impl Insn {
    /// The 8 bytes the kernel reads (little-endian fields, as on x86_64).
    pub fn to_bytes(self) -> [u8; 8] {
        let mut b = [0u8; 8];
        b[0] = self.code;
        b[1] = self.regs;
        b[2..4].copy_from_slice(&self.off.to_le_bytes());
        b[4..8].copy_from_slice(&self.imm.to_le_bytes());
        b
    }
}

/// Registers: r0 return value, r1–r5 arguments (clobbered by calls), r6–r9 kept across calls,
/// r10 the read-only frame pointer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reg(pub u8);
pub const R0: Reg = Reg(0);
pub const R1: Reg = Reg(1);
pub const R2: Reg = Reg(2);
pub const R3: Reg = Reg(3);
pub const R4: Reg = Reg(4);
pub const R5: Reg = Reg(5);
pub const R6: Reg = Reg(6);
pub const R7: Reg = Reg(7);
pub const R8: Reg = Reg(8);
pub const R9: Reg = Reg(9);
pub const FP: Reg = Reg(10);

// Instruction classes, sizes, modes, operations (uapi/linux/bpf_common.h, bpf.h).
const LD: u8 = 0x00;
const LDX: u8 = 0x01;
const ST: u8 = 0x02;
const STX: u8 = 0x03;
const JMP: u8 = 0x05;
const JMP32: u8 = 0x06;
const ALU64: u8 = 0x07;
const W: u8 = 0x00;
const H: u8 = 0x08;
const ALU: u8 = 0x04;
const LSH: u8 = 0x60;
const OR: u8 = 0x40;
const AND: u8 = 0x50;
const MUL: u8 = 0x20;
const JSET: u8 = 0x40;
const JLT: u8 = 0xa0;
const JSGT: u8 = 0x60;
const JSGE: u8 = 0x70;
const DW: u8 = 0x18;
const IMM: u8 = 0x00;
const MEM: u8 = 0x60;
const ATOMIC: u8 = 0xc0;
const K: u8 = 0x00;
const X: u8 = 0x08;
const ADD: u8 = 0x00;
const SUB: u8 = 0x10;
const RSH: u8 = 0x70;
const MOV: u8 = 0xb0;
const JA: u8 = 0x00;
const JEQ: u8 = 0x10;
const JNE: u8 = 0x50;
const CALL: u8 = 0x80;
const EXIT: u8 = 0x90;
/// `src_reg` of a 64-bit immediate load that names a map by its fd.
const PSEUDO_MAP_FD: u8 = 1;

/// Helper function ids (uapi `enum bpf_func_id`).
pub mod helper {
    pub const MAP_LOOKUP_ELEM: i32 = 1;
    pub const KTIME_GET_NS: i32 = 5;
    pub const GET_CURRENT_PID_TGID: i32 = 14;
    pub const PROBE_READ_KERNEL: i32 = 113;
    pub const RINGBUF_OUTPUT: i32 = 130;
}

/// `bpf_ringbuf_output`'s flag: no notification of the consumer.
pub(crate) const RB_NO_WAKEUP: i32 = 1;

/// A jump target, resolved when the program is finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Label(usize);

/// A program under construction: instructions plus forward jumps to labels.
#[derive(Debug, Default)]
pub struct Asm {
    insns: Vec<Insn>,
    labels: Vec<Option<usize>>,
    /// (instruction index, label) of every jump to patch.
    fixups: Vec<(usize, Label)>,
}

fn regs(dst: Reg, src: Reg) -> u8 {
    (src.0 << 4) | (dst.0 & 0x0f)
}

impl Asm {
    fn push(&mut self, code: u8, dst: Reg, src: Reg, off: i16, imm: i32) {
        self.insns.push(Insn {
            code,
            regs: regs(dst, src),
            off,
            imm,
        });
    }
    pub fn label(&mut self) -> Label {
        self.labels.push(None);
        Label(self.labels.len() - 1)
    }
    /// Place `l` at the next instruction.
    pub fn bind(&mut self, l: Label) {
        self.labels[l.0] = Some(self.insns.len());
    }
    /// `dst = src`.
    pub fn mov(&mut self, dst: Reg, src: Reg) {
        self.push(ALU64 | MOV | X, dst, src, 0, 0);
    }
    /// `dst = imm` (sign-extended).
    pub fn mov_imm(&mut self, dst: Reg, imm: i32) {
        self.push(ALU64 | MOV | K, dst, R0, 0, imm);
    }
    /// `dst += imm`.
    pub fn add_imm(&mut self, dst: Reg, imm: i32) {
        self.push(ALU64 | ADD | K, dst, R0, 0, imm);
    }
    /// `dst <<= imm`.
    pub fn lsh_imm(&mut self, dst: Reg, imm: i32) {
        self.push(ALU64 | LSH | K, dst, R0, 0, imm);
    }
    /// `dst |= src`.
    pub fn or(&mut self, dst: Reg, src: Reg) {
        self.push(ALU64 | OR | X, dst, src, 0, 0);
    }
    /// `dst |= imm` (sign-extended).
    pub fn or_imm(&mut self, dst: Reg, imm: i32) {
        self.push(ALU64 | OR | K, dst, R0, 0, imm);
    }
    /// `dst &= imm` (sign-extended).
    pub fn and_imm(&mut self, dst: Reg, imm: i32) {
        self.push(ALU64 | AND | K, dst, R0, 0, imm);
    }
    /// `dst *= imm`.
    pub fn mul_imm(&mut self, dst: Reg, imm: i32) {
        self.push(ALU64 | MUL | K, dst, R0, 0, imm);
    }
    /// `dst += src`.
    pub fn add(&mut self, dst: Reg, src: Reg) {
        self.push(ALU64 | ADD | X, dst, src, 0, 0);
    }
    /// `dst -= src`.
    pub fn sub(&mut self, dst: Reg, src: Reg) {
        self.push(ALU64 | SUB | X, dst, src, 0, 0);
    }
    /// `dst = (u32) src` (the low half, zero-extended).
    pub fn mov32(&mut self, dst: Reg, src: Reg) {
        self.push(ALU | MOV | X, dst, src, 0, 0);
    }
    /// `dst = *(u32 *)(src + off)` (zero-extended).
    pub fn load32(&mut self, dst: Reg, src: Reg, off: i16) {
        self.push(LDX | MEM | W, dst, src, off, 0);
    }
    /// `dst = *(u16 *)(src + off)` (zero-extended).
    pub fn load16(&mut self, dst: Reg, src: Reg, off: i16) {
        self.push(LDX | MEM | H, dst, src, off, 0);
    }
    /// `*(u32 *)(dst + off) = src`.
    pub fn store32(&mut self, dst: Reg, off: i16, src: Reg) {
        self.push(STX | MEM | W, dst, src, off, 0);
    }
    /// `dst >>= imm` (logical).
    pub fn rsh_imm(&mut self, dst: Reg, imm: i32) {
        self.push(ALU64 | RSH | K, dst, R0, 0, imm);
    }
    /// `dst = *(u64 *)(src + off)`.
    pub fn load64(&mut self, dst: Reg, src: Reg, off: i16) {
        self.push(LDX | MEM | DW, dst, src, off, 0);
    }
    /// `*(u64 *)(dst + off) = src`.
    pub fn store64(&mut self, dst: Reg, off: i16, src: Reg) {
        self.push(STX | MEM | DW, dst, src, off, 0);
    }
    /// `*(u64 *)(dst + off) = imm` (sign-extended).
    pub fn store64_imm(&mut self, dst: Reg, off: i16, imm: i32) {
        self.push(ST | MEM | DW, dst, R0, off, imm);
    }
    /// `*(u32 *)(dst + off) = imm`.
    pub fn store32_imm(&mut self, dst: Reg, off: i16, imm: i32) {
        self.push(ST | MEM | W, dst, R0, off, imm);
    }
    /// `lock *(u64 *)(dst + off) += src`.
    pub fn atomic_add64(&mut self, dst: Reg, off: i16, src: Reg) {
        self.push(STX | ATOMIC | DW, dst, src, off, i32::from(ADD));
    }
    /// `dst = map` (the two-slot 64-bit immediate load of a map fd).
    pub fn load_map_fd(&mut self, dst: Reg, fd: i32) {
        self.push(LD | IMM | DW, dst, Reg(PSEUDO_MAP_FD), 0, fd);
        self.push(0, R0, R0, 0, 0);
    }
    pub fn call(&mut self, helper: i32) {
        self.push(JMP | CALL, R0, R0, 0, helper);
    }
    pub fn exit(&mut self) {
        self.push(JMP | EXIT, R0, R0, 0, 0);
    }
    fn jump(&mut self, code: u8, dst: Reg, imm: i32, to: Label) {
        self.jump_reg(code, dst, R0, imm, to);
    }
    fn jump_reg(&mut self, code: u8, dst: Reg, src: Reg, imm: i32, to: Label) {
        self.fixups.push((self.insns.len(), to));
        self.push(code, dst, src, 0, imm);
    }
    /// `goto to`.
    pub fn ja(&mut self, to: Label) {
        self.jump(JMP | JA, R0, 0, to);
    }
    /// `if dst == imm goto to`.
    pub fn jeq_imm(&mut self, dst: Reg, imm: i32, to: Label) {
        self.jump(JMP | JEQ | K, dst, imm, to);
    }
    /// `if dst != imm goto to`.
    pub fn jne_imm(&mut self, dst: Reg, imm: i32, to: Label) {
        self.jump(JMP | JNE | K, dst, imm, to);
    }
    /// `if dst == src goto to`.
    pub fn jeq(&mut self, dst: Reg, src: Reg, to: Label) {
        self.jump_reg(JMP | JEQ | X, dst, src, 0, to);
    }
    /// `if dst != src goto to`.
    pub fn jne(&mut self, dst: Reg, src: Reg, to: Label) {
        self.jump_reg(JMP | JNE | X, dst, src, 0, to);
    }
    /// `if dst & imm goto to`.
    pub fn jset_imm(&mut self, dst: Reg, imm: i32, to: Label) {
        self.jump(JMP | JSET | K, dst, imm, to);
    }
    /// `if dst < imm goto to` (unsigned).
    pub fn jlt_imm(&mut self, dst: Reg, imm: i32, to: Label) {
        self.jump(JMP | JLT | K, dst, imm, to);
    }
    /// `if (s64) dst > imm goto to`.
    pub fn jsgt_imm(&mut self, dst: Reg, imm: i32, to: Label) {
        self.jump(JMP | JSGT | K, dst, imm, to);
    }
    /// `if (s32) dst > imm goto to` (the low halves: an `int` argument of a raw tracepoint is
    /// passed zero-extended).
    pub fn jsgt32_imm(&mut self, dst: Reg, imm: i32, to: Label) {
        self.jump(JMP32 | JSGT | K, dst, imm, to);
    }
    /// `if (s64) dst >= imm goto to`.
    pub fn jsge_imm(&mut self, dst: Reg, imm: i32, to: Label) {
        self.jump(JMP | JSGE | K, dst, imm, to);
    }
    /// The finished program: every jump patched to its label (an unbound label or a jump
    /// farther than 16 bits is a bug of the builder's caller: an error, not a wrong program).
    pub fn finish(mut self) -> Result<Vec<Insn>, String> {
        for (at, l) in std::mem::take(&mut self.fixups) {
            let target = self
                .labels
                .get(l.0)
                .copied()
                .flatten()
                .ok_or_else(|| format!("label {} never bound", l.0))?;
            let off = i64::try_from(target).unwrap_or(i64::MAX)
                - i64::try_from(at).unwrap_or(i64::MAX)
                - 1;
            self.insns[at].off =
                i16::try_from(off).map_err(|_| format!("jump at {at} too far ({off})"))?;
        }
        Ok(self.insns)
    }
}

/// Which tracepoint a program serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Edge {
    Enter,
    Exit,
}

/// The record the program writes (little-endian u64 fields, [`RECORD_SIZE`] bytes):
/// `pid_tgid` (thread id in the low half), `edge` (0 entry, 1 exit), `time_ns`
/// (CLOCK_MONOTONIC), `nr`, `a0` (first argument, or the return value on exit), `a1` (second
/// argument; 0 on exit).
pub const RECORD_SIZE: usize = 48;
const REC: i16 = -(RECORD_SIZE as i16);
/// The lost counter's key, below the record on the stack.
const KEY: i16 = REC - 8;

/// x86_64 `struct pt_regs`: where the entry's first two arguments and the syscall number are.
pub(crate) const REGS_SI: i16 = 104;
pub(crate) const REGS_DI: i16 = 112;
pub(crate) const REGS_ORIG_AX: i16 = 120;

/// What one observer program needs.
#[derive(Debug, Clone)]
pub struct Spec<'a> {
    pub edge: Edge,
    /// The observed process (its thread group id).
    pub tgid: u32,
    /// The syscall numbers to keep.
    pub keep: &'a [i64],
    pub ringbuf_fd: i32,
    /// The one-element array counting records the full ring buffer refused.
    pub lost_fd: i32,
    /// A BTF-typed program (`tp_btf`): the verifier knows `regs` is a `struct pt_regs`, so its
    /// fields are read with plain loads; otherwise through `bpf_probe_read_kernel` (a helper
    /// call each).
    pub typed: bool,
}

/// `*(fp + to) = *(u64 *)(r9 + from)` (r9: the `pt_regs`): a plain load in a BTF-typed
/// program, else through `bpf_probe_read_kernel`.
fn read_reg(a: &mut Asm, typed: bool, to: i16, from: i16) {
    if typed {
        a.load64(R1, R9, from);
        a.store64(FP, to, R1);
        return;
    }
    a.mov(R1, FP);
    a.add_imm(R1, i32::from(to));
    a.mov_imm(R2, 8);
    a.mov(R3, R9);
    a.add_imm(R3, i32::from(from));
    a.call(helper::PROBE_READ_KERNEL);
}

/// The observer program of `spec` (see the module docs), for a raw tracepoint: its context is
/// the tracepoint's arguments, `(struct pt_regs *regs, long id)` at entry and `(regs, long
/// ret)` at exit.
pub fn observer(spec: &Spec) -> Result<Vec<Insn>, String> {
    let tgid = i32::try_from(spec.tgid).map_err(|_| format!("pid {} out of range", spec.tgid))?;
    let mut a = Asm::default();
    let (keep, out) = (a.label(), a.label());
    a.mov(R6, R1); // r6 = ctx
    a.call(helper::GET_CURRENT_PID_TGID);
    a.mov(R7, R0); // r7 = tgid << 32 | tid
    a.rsh_imm(R0, 32);
    a.jne_imm(R0, tgid, out);
    a.load64(R9, R6, 0); // r9 = regs
    match spec.edge {
        Edge::Enter => a.load64(R8, R6, 8), // r8 = id
        Edge::Exit => {
            read_reg(&mut a, spec.typed, REC + 24, REGS_ORIG_AX);
            a.load64(R8, FP, REC + 24);
        }
    }
    for &n in spec.keep {
        let n = i32::try_from(n).map_err(|_| format!("syscall number {n} out of range"))?;
        a.jeq_imm(R8, n, keep);
    }
    a.ja(out);
    a.bind(keep);
    a.store64(FP, REC, R7);
    // Edge 0 entry, 1 exit, 2 exit with its first argument (a typed program reads it from the
    // registers, which the call left as they were).
    let edge = match spec.edge {
        Edge::Enter => 0,
        Edge::Exit if spec.typed => 2,
        Edge::Exit => 1,
    };
    a.store64_imm(FP, REC + 8, edge);
    a.store64(FP, REC + 24, R8);
    match spec.edge {
        Edge::Enter => {
            read_reg(&mut a, spec.typed, REC + 32, REGS_DI);
            read_reg(&mut a, spec.typed, REC + 40, REGS_SI);
        }
        Edge::Exit => {
            a.load64(R1, R6, 8); // ret
            a.store64(FP, REC + 32, R1);
            if spec.typed {
                read_reg(&mut a, true, REC + 40, REGS_DI);
            } else {
                a.store64_imm(FP, REC + 40, 0);
            }
        }
    }
    stamp_and_output(&mut a, (spec.ringbuf_fd, spec.lost_fd), (REC, KEY), out);
    a.bind(out);
    a.mov_imm(R0, 0);
    a.exit();
    a.finish()
}

/// Stamp the per-call record at `fp + rec` (its time field) and write it into the ring buffer
/// (`fds`: the ring buffer and the lost counter, whose key goes to `fp + key`); then to `done`.
pub(crate) fn stamp_and_output(a: &mut Asm, fds: (i32, i32), (rec, key): (i16, i16), done: Label) {
    a.call(helper::KTIME_GET_NS);
    a.store64(FP, rec + 16, R0);
    a.load_map_fd(R1, fds.0);
    a.mov(R2, FP);
    a.add_imm(R2, i32::from(rec));
    a.mov_imm(R3, RECORD_SIZE as i32);
    // No wake-up of a reader: nobody waits on the buffer (the reader polls it), and each
    // would be an irq_work self-interrupt, a VM exit here (after each drain, so rare: measured
    // no different in `bench observe`, kept because it is never needed).
    a.mov_imm(R4, RB_NO_WAKEUP);
    a.call(helper::RINGBUF_OUTPUT);
    count_refused(a, fds.1, key, done);
}

/// After a `bpf_ringbuf_output` call: where it refused the record (the buffer is full), add one
/// to the one-element array `lost_fd` (its key written at `fp + key`); then go to `done`.
pub(crate) fn count_refused(a: &mut Asm, lost_fd: i32, key: i16, done: Label) {
    a.jeq_imm(R0, 0, done);
    count_at(a, lost_fd, key, 0, done);
}

/// r0 = element `index` of the array map `map_fd` (the key built at `key` on the stack), or
/// to `none` where it has none.
pub(crate) fn element_at(a: &mut Asm, map_fd: i32, key: i16, index: i32, none: Label) {
    a.store32_imm(FP, key, index);
    a.load_map_fd(R1, map_fd);
    a.mov(R2, FP);
    a.add_imm(R2, i32::from(key));
    a.call(helper::MAP_LOOKUP_ELEM);
    a.jeq_imm(R0, 0, none);
}

/// Add one to element `index` of the array `lost_fd` (its key on the stack at `key`; then to
/// `done`).
pub(crate) fn count_at(a: &mut Asm, lost_fd: i32, key: i16, index: i32, done: Label) {
    element_at(a, lost_fd, key, index, done);
    a.mov_imm(R1, 1);
    a.atomic_add64(R0, 0, R1);
}

/// Checks of a finished program for the program builders' tests.
#[cfg(test)]
pub(crate) mod check {
    use super::Insn;

    /// The program ends with `exit` and every jump (64- and 32-bit classes, not calls or exit)
    /// lands inside it.
    pub(crate) fn well_formed(p: &[Insn], what: &str) {
        assert_eq!(
            p.last().map(|i| i.code),
            Some(0x95),
            "{what}: no exit at the end"
        );
        for (i, insn) in p.iter().enumerate() {
            let class = insn.code & 0x07;
            if (class == 0x05 || class == 0x06) && insn.code != 0x95 && insn.code != 0x85 {
                let t = i as i64 + 1 + i64::from(insn.off);
                assert!((0..p.len() as i64).contains(&t), "{what}: jump {i} → {t}");
            }
        }
    }

    /// How many calls of helper `id` the program makes.
    pub(crate) fn helper_calls(p: &[Insn], id: i32) -> usize {
        p.iter().filter(|i| i.code == 0x85 && i.imm == id).count()
    }
}

/// The instructions as the bytes `BPF_PROG_LOAD` reads.
pub fn to_bytes(insns: &[Insn]) -> Vec<u8> {
    insns.iter().flat_map(|i| i.to_bytes()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodings_match_the_kernel_abi() {
        // Known encodings (as `llvm-objdump -d` prints them for BPF objects).
        let mut a = Asm::default();
        a.mov(R6, R1); // bf 16 00 00 00 00 00 00
        a.mov_imm(R0, 0); // b7 00 00 00 00 00 00 00
        a.exit(); // 95 00 ...
        a.rsh_imm(R0, 32); // 77 00 00 00 20 00 00 00
        a.load64(R8, R6, 8); // 79 68 08 00 00 00 00 00
        a.store64(FP, -48, R7); // 7b 7a d0 ff 00 00 00 00
        a.call(helper::KTIME_GET_NS); // 85 00 00 00 05 00 00 00
        a.atomic_add64(R0, 0, R1); // db 10 00 00 00 00 00 00
        a.load_map_fd(R1, 7); // 18 11 00 00 07 00 00 00, then 8 zero bytes
        a.load16(R2, R1, 14); // 69 12 0e 00 00 00 00 00
        let l = a.label();
        a.jsgt32_imm(R2, 0, l); // 66 02 00 00 00 00 00 00 (to the next instruction)
        a.bind(l);
        let p = to_bytes(&a.finish().unwrap());
        let hex: Vec<String> = p
            .chunks(8)
            .map(|c| c.iter().map(|b| format!("{b:02x}")).collect())
            .collect();
        assert_eq!(
            hex,
            [
                "bf16000000000000",
                "b700000000000000",
                "9500000000000000",
                "7700000020000000",
                "7968080000000000",
                "7b7ad0ff00000000",
                "8500000005000000",
                "db10000000000000",
                "1811000007000000",
                "0000000000000000",
                "69120e0000000000",
                "6602000000000000",
            ]
        );
    }

    #[test]
    fn jumps_land_on_their_labels() {
        let mut a = Asm::default();
        let l = a.label();
        a.jeq_imm(R0, 3, l); // 0
        a.mov_imm(R0, 1); // 1
        a.bind(l);
        a.exit(); // 2
        let p = a.finish().unwrap();
        assert_eq!(p[0].off, 1);
        let mut b = Asm::default();
        let never = b.label();
        b.ja(never);
        assert!(b.finish().is_err());
    }

    #[test]
    fn the_observer_program_is_well_formed() {
        for edge in [Edge::Enter, Edge::Exit] {
            let spec = Spec {
                edge,
                tgid: 4242,
                keep: &[0, 1, 232],
                ringbuf_fd: 5,
                lost_fd: 6,
                typed: false,
            };
            let p = observer(&spec).unwrap();
            // Ends in `r0 = 0; exit`, every jump stays inside the program.
            assert_eq!(p.last().unwrap().code, 0x95);
            for (i, insn) in p.iter().enumerate() {
                if insn.code & 0x07 == JMP && insn.code != 0x95 && insn.code != 0x85 {
                    let t = i as i64 + 1 + i64::from(insn.off);
                    assert!((0..p.len() as i64).contains(&t), "jump {i} → {t}");
                }
            }
            // The process filter compares against the pid.
            assert!(p.iter().any(|i| i.code == (JMP | JNE | K) && i.imm == 4242));
            // One compare per kept number.
            assert_eq!(
                p.iter()
                    .filter(|i| i.code == (JMP | JEQ | K) && i.regs == 8)
                    .count(),
                3
            );
        }
        // A BTF-typed program reads the registers with plain loads: no helper call for them.
        for (edge, typed, reads) in [
            (Edge::Enter, false, 2),
            (Edge::Exit, false, 1),
            (Edge::Enter, true, 0),
            (Edge::Exit, true, 0),
        ] {
            let spec = Spec {
                edge,
                tgid: 1,
                keep: &[0],
                ringbuf_fd: 5,
                lost_fd: 6,
                typed,
            };
            let p = observer(&spec).unwrap();
            let calls = p
                .iter()
                .filter(|i| i.code == (JMP | CALL) && i.imm == helper::PROBE_READ_KERNEL)
                .count();
            assert_eq!(calls, reads, "{edge:?} typed {typed}");
        }
        let big = Spec {
            edge: Edge::Enter,
            tgid: u32::MAX,
            keep: &[],
            ringbuf_fd: 1,
            lost_fd: 2,
            typed: false,
        };
        assert!(observer(&big).is_err());
    }
}
