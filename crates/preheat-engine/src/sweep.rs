//! Eviction sweep: emulate the cache loss of a deep sleep by reading a large buffer.
//!
//! The paper's benchmark client flushes the server cores' caches to simulate a CPU sleep state
//! (§4). A VM guest cannot flush the whole hierarchy (no `wbinvd`), so we read a buffer much
//! larger than the last-level cache on the server's CPU: a 128 MiB sweep (4–6 ms here) leaves
//! caches and TLBs about as cold as 50 ms of real idle.

use std::io;

use crate::cache::LINE;
use crate::time::now_ns;

/// An anonymous, pre-faulted buffer to sweep caches with.
pub struct EvictionBuffer {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the buffer is exclusively owned by this value (a private anonymous mapping nobody
// else knows about); after construction it is only ever read (volatile reads in `sweep`), so
// sharing `&EvictionBuffer` between threads or moving it to another thread cannot race.
unsafe impl Send for EvictionBuffer {}
// SAFETY: see `Send`: all `&self` methods only read the mapping.
unsafe impl Sync for EvictionBuffer {}

impl EvictionBuffer {
    /// Allocate and touch `bytes` (default use: 128 MiB).
    ///
    /// Panics if the memory cannot be mapped; see [`try_new`](Self::try_new).
    pub fn new(bytes: usize) -> EvictionBuffer {
        match EvictionBuffer::try_new(bytes) {
            Ok(b) => b,
            Err(e) => panic!("cannot map a {bytes}-byte eviction buffer: {e}"),
        }
    }

    /// Like [`new`](Self::new) but returns mmap errors. `bytes` is rounded up to whole pages
    /// (at least one).
    pub fn try_new(bytes: usize) -> io::Result<EvictionBuffer> {
        let page = page_size();
        let len = bytes
            .max(1)
            .checked_add(page - 1)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOMEM))?
            & !(page - 1);
        let ptr = map_anonymous(len)?;
        // Write one word per page with distinct values so every page has its own frame (no
        // shared zero page, no KSM merging of identical pages).
        for (i, off) in (0..len).step_by(page).enumerate() {
            // SAFETY: `off < len`, the mapping is readable and writable, page-aligned (so the
            // u64 is aligned), and exclusively ours.
            unsafe { std::ptr::write_volatile(ptr.add(off) as *mut u64, i as u64 ^ 0x5a5a_5a5a) };
        }
        Ok(EvictionBuffer { ptr, len })
    }

    /// Size of the buffer in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false (the buffer has at least one page).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Read one word per line of the whole buffer; returns elapsed ns.
    pub fn sweep(&self) -> u64 {
        let start = now_ns();
        let mut sum = 0u64;
        let mut off = 0;
        while off < self.len {
            // SAFETY: `off < len` and `off` is a multiple of 64, so the u64 is inside our live
            // mapping and aligned; the mapping is only read after construction.
            sum = sum
                .wrapping_add(unsafe { std::ptr::read_volatile(self.ptr.add(off) as *const u64) });
            off += LINE;
        }
        std::hint::black_box(sum);
        now_ns().saturating_sub(start)
    }

    /// Sweep from `cpu`: pin the calling thread there, [`sweep`](Self::sweep), then restore
    /// the thread's previous affinity mask (also if pinning fails half-way). Returns elapsed ns.
    pub fn sweep_on_cpu(&self, cpu: usize) -> io::Result<u64> {
        crate::os::on_cpu(cpu, || self.sweep())
    }
}

impl Drop for EvictionBuffer {
    fn drop(&mut self) {
        // SAFETY: `ptr/len` describe exactly the mapping created in `try_new`, unmapped only
        // here, and no reference into it outlives `self`.
        unsafe {
            libc::munmap(self.ptr as *mut libc::c_void, self.len);
        }
    }
}

/// A fresh private, anonymous, read-write, pre-faulted mapping of `len` bytes (a multiple of the
/// page size), owned by the caller (who unmaps it with `munmap`).
pub(crate) fn map_anonymous(len: usize) -> io::Result<*mut u8> {
    // SAFETY: a fresh private anonymous mapping at a kernel-chosen address cannot alias any
    // existing Rust object; MAP_FAILED is checked below.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    Ok(p as *mut u8)
}

/// The system's page size in bytes (4096 where sysconf cannot say).
pub fn page_size() -> usize {
    // SAFETY: sysconf has no memory-safety preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p <= 0 {
        4096
    } else {
        p as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sweep_small_buffer() {
        let _shared = crate::test_lock::shared();
        let b = EvictionBuffer::new(1 << 20);
        assert_eq!(b.len(), 1 << 20);
        let _ = b.sweep();
        let odd = EvictionBuffer::new(1);
        assert_eq!(odd.len(), page_size());
        let _ = odd.sweep();
    }

    #[test]
    fn sweep_on_cpu_restores_affinity() {
        let _shared = crate::test_lock::shared();
        let b = EvictionBuffer::new(256 * 1024);
        std::thread::spawn(move || {
            let old = crate::os::get_affinity();
            let _ = b.sweep_on_cpu(old[0]).unwrap();
            assert_eq!(crate::os::get_affinity(), old);
            assert!(b.sweep_on_cpu(1 << 20).is_err());
            assert_eq!(crate::os::get_affinity(), old);
        })
        .join()
        .unwrap();
    }
}
