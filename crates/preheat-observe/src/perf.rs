//! The OS side: tracepoint events through `perf_event_open` (bindings from the
//! `perf-event-open-sys` crate) and their memory-mapped ring buffers.
//!
//! Every `unsafe` block here is a system call on an fd this module owns, or an access to the
//! ring buffer's mapping while it is alive (`RingBuffer` unmaps it on drop).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{fence, AtomicU64, Ordering};

use perf_event_open_sys as sys;
use sys::bindings::{
    perf_event_attr, perf_event_mmap_page, PERF_FLAG_FD_CLOEXEC, PERF_SAMPLE_RAW, PERF_SAMPLE_TID,
    PERF_SAMPLE_TIME, PERF_TYPE_TRACEPOINT,
};

/// The sample layout every event here writes (`decode` reads it).
pub const SAMPLE_TYPE: u64 = (PERF_SAMPLE_TID | PERF_SAMPLE_TIME | PERF_SAMPLE_RAW) as u64;

/// Open tracepoint `id` for thread `pid` (-1: every task) on `cpu`, disabled, sampling every
/// hit with [`SAMPLE_TYPE`] and CLOCK_MONOTONIC times; `inherit`: threads the thread creates
/// later are followed too.
pub fn open_tracepoint(id: u64, pid: i32, cpu: i32, inherit: bool) -> io::Result<OwnedFd> {
    let mut attr = perf_event_attr {
        type_: PERF_TYPE_TRACEPOINT,
        size: std::mem::size_of::<perf_event_attr>() as u32,
        config: id,
        sample_type: SAMPLE_TYPE,
        clockid: libc::CLOCK_MONOTONIC,
        ..perf_event_attr::default()
    };
    attr.sample_period = 1;
    // No wakeup per sample (each would raise an irq_work self-interrupt: a VM exit here, which
    // cost ~60 µs per request when set to 1); the reader polls, and the kernel wakes only at
    // the default watermark (half the buffer), which nobody waits on.
    attr.wakeup_events = 0;
    attr.set_disabled(1);
    attr.set_inherit(u64::from(inherit));
    attr.set_use_clockid(1);
    // SAFETY: `attr` is a fully initialized perf_event_attr whose size field is its own size;
    // the kernel only reads it (and may write the size back on E2BIG).
    let fd = unsafe {
        sys::perf_event_open(
            &mut attr,
            pid,
            cpu,
            -1,
            libc::c_ulong::from(PERF_FLAG_FD_CLOEXEC),
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned `fd`, a new descriptor nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn check(r: libc::c_int) -> io::Result<()> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Send `fd`'s samples to `target`'s ring buffer (same CPU).
pub fn set_output(fd: &OwnedFd, target: &OwnedFd) -> io::Result<()> {
    // SAFETY: both are perf event fds owned by the caller; the ioctl takes an fd number.
    check(unsafe { sys::ioctls::SET_OUTPUT(fd.as_raw_fd(), target.as_raw_fd()) })
}

/// Install a tracepoint filter (the kernel's filter syntax, e.g. `id == 0 || id == 1`).
pub fn set_filter(fd: &OwnedFd, filter: &str) -> io::Result<()> {
    let mut c = filter.as_bytes().to_vec();
    c.push(0);
    // SAFETY: `c` is a NUL-terminated string that lives across the call; the kernel copies it.
    check(unsafe { sys::ioctls::SET_FILTER(fd.as_raw_fd(), c.as_mut_ptr().cast()) })
}

/// Start counting/sampling.
pub fn enable(fd: &OwnedFd) -> io::Result<()> {
    // SAFETY: a perf event fd owned by the caller; ENABLE takes no pointer.
    check(unsafe { sys::ioctls::ENABLE(fd.as_raw_fd(), 0) })
}

/// Stop sampling.
pub fn disable(fd: &OwnedFd) -> io::Result<()> {
    // SAFETY: as in `enable`.
    check(unsafe { sys::ioctls::DISABLE(fd.as_raw_fd(), 0) })
}

/// A perf ring buffer: one metadata page and `2^k` data pages, mapped from its event's fd.
pub struct RingBuffer {
    base: *mut u8,
    map_len: usize,
    data_off: usize,
    data_size: usize,
    _fd: RawFd,
}

// SAFETY: the mapping is owned by this value alone; moving it to another thread moves that
// ownership (the kernel side is indifferent to the reading thread).
unsafe impl Send for RingBuffer {}

impl RingBuffer {
    /// Map `data_pages` (a power of two) data pages of `fd`'s buffer.
    pub fn map(fd: &OwnedFd, data_pages: usize) -> io::Result<RingBuffer> {
        let page = preheat_engine::sweep::page_size();
        let map_len = (data_pages + 1) * page;
        // SAFETY: a fresh shared mapping of a perf event fd, of the size the kernel requires
        // (1 + 2^n pages); checked for MAP_FAILED below.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let base = base.cast::<u8>();
        let meta = base.cast::<perf_event_mmap_page>();
        // SAFETY: the first page of the live mapping is the kernel's perf_event_mmap_page;
        // data_offset and data_size are set before mmap returns and never change.
        let (off, size) = unsafe { ((*meta).data_offset, (*meta).data_size) };
        let (data_off, data_size) = if size == 0 {
            (page, data_pages * page)
        } else {
            (off as usize, size as usize)
        };
        Ok(RingBuffer {
            base,
            map_len,
            data_off,
            data_size,
            _fd: fd.as_raw_fd(),
        })
    }

    fn head_tail(&self) -> (&AtomicU64, &AtomicU64) {
        let meta = self.base.cast::<perf_event_mmap_page>();
        // SAFETY: data_head and data_tail are 8-byte aligned u64 fields of the live metadata
        // page, shared with the kernel: accessed only atomically, as the perf ABI prescribes
        // (head written by the kernel, tail by the reader).
        unsafe {
            (
                AtomicU64::from_ptr(std::ptr::addr_of_mut!((*meta).data_head)),
                AtomicU64::from_ptr(std::ptr::addr_of_mut!((*meta).data_tail)),
            )
        }
    }

    /// Append every byte written since the last drain to `out` (records in order, the wrap
    /// undone) and hand the space back to the kernel. Returns the bytes copied.
    pub fn drain(&mut self, out: &mut Vec<u8>) -> usize {
        let (head_a, tail_a) = self.head_tail();
        let head = head_a.load(Ordering::Acquire);
        let tail = tail_a.load(Ordering::Relaxed);
        let avail = head.wrapping_sub(tail) as usize;
        if avail == 0 {
            return 0;
        }
        let avail = avail.min(self.data_size);
        let start = (tail as usize) % self.data_size;
        let first = avail.min(self.data_size - start);
        // SAFETY: [data_off, data_off + data_size) lies inside the live mapping; `start + first`
        // and `avail - first` are bounded by data_size; the kernel does not write the bytes
        // between tail and head until the tail store below.
        unsafe {
            let data = self.base.add(self.data_off);
            out.extend_from_slice(std::slice::from_raw_parts(data.add(start), first));
            out.extend_from_slice(std::slice::from_raw_parts(data, avail - first));
        }
        fence(Ordering::SeqCst);
        tail_a.store(tail.wrapping_add(avail as u64), Ordering::Release);
        avail
    }
}

impl Drop for RingBuffer {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly the mapping made in `map`; nothing borrows it any more.
        unsafe {
            libc::munmap(self.base.cast(), self.map_len);
        }
    }
}

/// The effective user is root.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Detach the mount at `dir` (`umount2(MNT_DETACH)`).
pub fn unmount(dir: &std::path::Path) -> io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let mut p = dir.as_os_str().as_bytes().to_vec();
    p.push(0);
    // SAFETY: a NUL-terminated string that lives across the call.
    check(unsafe { libc::umount2(p.as_ptr().cast(), libc::MNT_DETACH) })
}

/// Mount tracefs at `dir`.
pub fn mount_tracefs(dir: &std::path::Path) -> io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let mut p = dir.as_os_str().as_bytes().to_vec();
    p.push(0);
    // SAFETY: NUL-terminated strings that live across the call; no mount data.
    check(unsafe {
        libc::mount(
            c"nodev".as_ptr(),
            p.as_ptr().cast(),
            c"tracefs".as_ptr(),
            0,
            std::ptr::null(),
        )
    })
}
