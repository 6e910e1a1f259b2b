//! Generated code with a chosen instruction footprint: the code base vector `BV_L1I` and the
//! branchy, code-heavy workload of the cache-affinity experiments (Kazempour et al., §2.1: "a
//! base vector configured with the I-cache footprint equal to the size of the I-cache and a
//! negligible D-cache footprint").
//!
//! A [`CodeChain`] is an executable mapping cut into 64-byte blocks (one cache line each) and
//! grouped into segments. Each segment is a function `extern "C" fn(u64) -> u64` that runs
//! through its blocks, jumping from block to block (in address order or shuffled, to defeat
//! next-line prefetching), and returns. [`BlockKind::Jump`] blocks only jump (negligible data,
//! negligible work per line: the pure I-cache footprint); [`BlockKind::Branchy`] blocks also step
//! a 64-bit LCG and take a data-dependent conditional branch (a stand-in for gcc/crafty).
//!
//! The mapping is written while read-write and then made read+execute (never writable and
//! executable at once). x86-64 only: elsewhere [`CodeChain::new`] returns an error that names
//! the architecture, and callers degrade (the experiment omits the code cells and says why).

use std::io;

use preheat_model::VirtAddr;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;

/// Bytes per block: one cache line.
pub const BLOCK: usize = 64;

/// What each block does besides jumping to the next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockKind {
    /// `jmp next` only.
    Jump,
    /// Step an LCG in `rdi`, branch on one of its bits, fold it into `rax`, `jmp next`.
    Branchy,
}

/// An executable mapping of generated code; see the module docs.
pub struct CodeChain {
    ptr: *mut u8,
    len: usize,
    /// Byte offset of each segment's entry.
    entries: Vec<usize>,
}

// SAFETY: after construction the mapping is read+execute only and exclusively owned by this
// value; executing it touches no memory but the stack (registers only), so running segments from
// several threads at once cannot race.
unsafe impl Send for CodeChain {}
// SAFETY: see `Send`.
unsafe impl Sync for CodeChain {}

impl CodeChain {
    /// Generate `bytes` of code (rounded up to whole blocks, at least one segment) in segments
    /// of `segment_blocks` blocks. `shuffle_seed`: `None` lays each segment's blocks out in
    /// address order, `Some(seed)` visits all blocks of the chain in a pseudo-random order
    /// (split into segments), so consecutive blocks are rarely neighbours in memory.
    pub fn new(
        bytes: usize,
        segment_blocks: usize,
        kind: BlockKind,
        shuffle_seed: Option<u64>,
    ) -> io::Result<CodeChain> {
        if !cfg!(target_arch = "x86_64") {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!(
                    "generated code needs x86-64 (this is {})",
                    std::env::consts::ARCH
                ),
            ));
        }
        let seg = segment_blocks.max(1);
        let blocks = bytes.div_ceil(BLOCK).max(seg).div_ceil(seg) * seg;
        let page = crate::sweep::page_size();
        let len = (blocks * BLOCK).div_ceil(page) * page;
        let mut order: Vec<usize> = (0..blocks).collect();
        if let Some(seed) = shuffle_seed {
            order.shuffle(&mut StdRng::seed_from_u64(seed));
        }
        let mut code = vec![0xCCu8; len]; // int3 everywhere nothing is generated
        let mut entries = Vec::with_capacity(blocks / seg);
        for s in order.chunks(seg) {
            entries.push(s[0] * BLOCK);
            for (k, &b) in s.iter().enumerate() {
                let next = s.get(k + 1).map(|&n| n * BLOCK);
                let first = k == 0;
                write_block(
                    &mut code[b * BLOCK..(b + 1) * BLOCK],
                    b * BLOCK,
                    next,
                    first,
                    kind,
                );
            }
        }
        let ptr = crate::sweep::map_anonymous(len)?;
        let p = ptr as *mut libc::c_void;
        // SAFETY: `ptr` is a fresh writable mapping of `len` bytes that nothing else references,
        // and `code` has exactly `len` bytes; the regions cannot overlap.
        unsafe { std::ptr::copy_nonoverlapping(code.as_ptr(), ptr, len) };
        // SAFETY: changes the protection of our own mapping only (W^X: never writable and
        // executable at once); the error is checked and the mapping released on failure.
        if unsafe { libc::mprotect(p, len, libc::PROT_READ | libc::PROT_EXEC) } != 0 {
            let e = io::Error::last_os_error();
            // SAFETY: unmapping the mapping we just created and never handed out.
            unsafe { libc::munmap(p, len) };
            return Err(e);
        }
        Ok(CodeChain { ptr, len, entries })
    }

    /// Number of segments.
    pub fn segments(&self) -> usize {
        self.entries.len()
    }

    /// Bytes of generated code (whole pages).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never true (a chain has at least one block).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Start address of the mapping (for working-set runs and cache-line flushes). The mapping
    /// (`len()` bytes) is readable for as long as `self` lives.
    pub fn addr(&self) -> VirtAddr {
        VirtAddr::from_ptr(self.ptr)
    }

    /// Run segment `i % segments()` with `state`; returns the state the segment leaves (for
    /// `Jump` chains, `state` unchanged or garbage: fold it into a checksum).
    #[inline]
    pub fn run_segment(&self, i: usize, state: u64) -> u64 {
        let off = self.entries[i % self.entries.len()];
        // SAFETY: `off` is the entry of a segment generated by `write_block`: a complete
        // function under the System V ABI (`extern "C" fn(u64) -> u64`) that uses only rax and
        // rdi (both caller-saved), touches no memory besides the return address, jumps only to
        // blocks inside this mapping and ends in `ret`. The mapping is read+execute and lives as
        // long as `self`.
        let f: extern "C" fn(u64) -> u64 = unsafe { std::mem::transmute(self.ptr.add(off)) };
        f(state)
    }

    /// Run every segment once.
    pub fn run_all(&self, mut state: u64) -> u64 {
        for i in 0..self.entries.len() {
            state = self.run_segment(i, state);
        }
        state
    }
}

impl Drop for CodeChain {
    fn drop(&mut self) {
        // SAFETY: the mapping was created by `new`, is owned by this value, and no segment can
        // be running: `run_segment` borrows `self`.
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len) };
    }
}

/// Encode one block at byte offset `at` of the mapping. `next`: the offset of the next block,
/// or `None` for the segment's last block (it returns). The first block of a segment starts
/// with `mov rax, rdi` (the state goes in rdi, out in rax).
fn write_block(b: &mut [u8], at: usize, next: Option<usize>, first: bool, kind: BlockKind) {
    let mut k = 0;
    let mut put = |bytes: &[u8], k: &mut usize| {
        b[*k..*k + bytes.len()].copy_from_slice(bytes);
        *k += bytes.len();
    };
    if first {
        put(&[0x48, 0x89, 0xF8], &mut k); // mov rax, rdi
    }
    if kind == BlockKind::Branchy {
        // Constants differ per block so branch outcomes differ per block.
        let salt = (at / BLOCK) as u32;
        let mul = 0x5851_F42Du32 | 1;
        let add = 0x1405_7B7Fu32 ^ salt.wrapping_mul(0x9E37_79B9);
        put(&[0x48, 0x69, 0xFF], &mut k); // imul rdi, rdi, imm32
        put(&mul.to_le_bytes(), &mut k);
        put(&[0x48, 0x81, 0xC7], &mut k); // add rdi, imm32
        put(&add.to_le_bytes(), &mut k);
        let bit = 1u8 << (4 + (salt % 4)); // bits 4..7 of the LCG
        put(&[0x40, 0xF6, 0xC7, bit], &mut k); // test dil, imm8
        put(&[0x74, 0x06], &mut k); // jz +6 (over the next two instructions)
        put(&[0x48, 0xFF, 0xC0], &mut k); // inc rax
        put(&[0x48, 0x31, 0xF8], &mut k); // xor rax, rdi
    }
    match next {
        Some(n) => {
            let end = at + k + 5;
            let rel = n as i64 - end as i64;
            put(&[0xE9], &mut k); // jmp rel32
            put(&(rel as i32).to_le_bytes(), &mut k);
        }
        None => put(&[0xC3], &mut k), // ret
    }
    debug_assert!(k <= BLOCK);
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;

    #[test]
    fn jump_chains_run_and_return() {
        let c = CodeChain::new(32 << 10, 64, BlockKind::Jump, None).unwrap();
        assert_eq!(c.segments(), 8);
        assert!(c.len() >= 32 << 10);
        for i in 0..c.segments() {
            c.run_segment(i, 7);
        }
        let s = CodeChain::new(64 << 10, 32, BlockKind::Jump, Some(3)).unwrap();
        s.run_all(1);
    }

    #[test]
    fn branchy_chains_compute_a_deterministic_function_of_their_input() {
        let a = CodeChain::new(16 << 10, 16, BlockKind::Branchy, Some(9)).unwrap();
        let x = a.run_all(12345);
        assert_eq!(x, a.run_all(12345));
        assert_ne!(x, a.run_all(54321));
        // The same layout generated again computes the same.
        let b = CodeChain::new(16 << 10, 16, BlockKind::Branchy, Some(9)).unwrap();
        assert_eq!(b.run_all(12345), x);
    }
}
