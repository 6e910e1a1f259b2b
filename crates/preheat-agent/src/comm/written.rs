//! Where the program writes ([`CommFocus::Written`](preheat_model::comm::CommFocus)): the
//! kernel tracks which pages of the sampled region were written since the last look, and the
//! sampler draws its pages from those.
//!
//! Mechanism: the region is registered with a userfaultfd of our own in *asynchronous*
//! write-protect mode (`UFFD_FEATURE_WP_ASYNC`, Linux ≥ 6.7): the kernel write-protects the
//! pages and, on a write, lifts the protection itself (no message, no thread waits: a minor
//! fault in the kernel). `PAGEMAP_SCAN` on `/proc/self/pagemap` then returns the pages whose
//! protection was lifted (`PAGE_IS_WRITTEN`) and protects them again in the same call
//! (`PM_SCAN_WP_MATCHING`), once per round. This is the soft-dirty idea of
//! `/proc/self/clear_refs` without its whole-process scope (soft-dirty is not built into the
//! kernel here, and `/sys/kernel/mm/page_idle` is absent).
//!
//! Where this departs from SPCD (Diener et al.): SPCD finds shared pages only through the
//! faults it induces on pages drawn at random, and keeps sampling where faults happened. In a
//! QEMU guest the shared working set is a few pages among ≥ 65k pages of guest RAM, which
//! random draws almost never hit; drawing from the pages written in the last round finds the
//! guest's active memory first, and SPCD's own faults still decide who shares.
//!
//! Sampler thread only (not a hooked path); the fds are the agent's own (`fdreg`). Closing the
//! userfaultfd ends the tracking; the kernel drops the registration, and pages it still had
//! write-protected become writable again on their next write (an ordinary write fault).

use std::os::fd::RawFd;

use libc::{c_int, c_void};

use super::uffd_abi::{
    iowr, UffdioApi, UffdioRange, UffdioRegister, UffdioWriteprotect, UFFDIO_API, UFFDIO_REGISTER,
    UFFDIO_REGISTER_MODE_WP, UFFDIO_WRITEPROTECT, UFFDIO_WRITEPROTECT_MODE_WP, UFFD_API,
    UFFD_FEATURE_WP_ASYNC, UFFD_FEATURE_WP_UNPOPULATED,
};

/// `PAGEMAP_SCAN` of `<linux/fs.h>`: `_IOWR('f', 16, struct pm_scan_arg)`.
const PAGEMAP_SCAN: u64 = iowr(b'f' as u64, 16, 96);
const PM_SCAN_WP_MATCHING: u64 = 1 << 0;
const PM_SCAN_CHECK_WPASYNC: u64 = 1 << 1;
const PAGE_IS_WRITTEN: u64 = 1 << 1;

/// `struct pm_scan_arg`.
#[repr(C)]
#[derive(Default)]
struct PmScanArg {
    size: u64,
    flags: u64,
    start: u64,
    end: u64,
    walk_end: u64,
    vec: u64,
    vec_len: u64,
    max_pages: u64,
    category_inverted: u64,
    category_mask: u64,
    category_anyof_mask: u64,
    return_mask: u64,
}

/// `struct page_region`.
#[repr(C)]
#[derive(Default, Clone, Copy)]
struct PageRegion {
    start: u64,
    end: u64,
    categories: u64,
}

fn ioctl<T>(fd: RawFd, req: u64, arg: &mut T) -> c_int {
    // SAFETY: `arg` is a valid, exclusively borrowed `repr(C)` struct of the size encoded in
    // `req`; the kernel reads and writes only that struct (and, for PAGEMAP_SCAN, the vector
    // it points to, whose length it is given).
    unsafe { libc::ioctl(fd, req as _, arg as *mut T as *mut c_void) }
}

fn os_err() -> std::io::Error {
    std::io::Error::last_os_error()
}

/// Written-page tracking over a set of ranges (dropped: fds closed, tracking ends).
pub struct Tracker {
    uffd: RawFd,
    pagemap: RawFd,
    ranges: Vec<(u64, u64)>,
    /// Region buffer for `PAGEMAP_SCAN` (reused every round).
    buf: Vec<PageRegion>,
}

impl Tracker {
    /// Track writes to `ranges` (`[start, end)`, page-aligned), or say why this kernel cannot.
    pub fn start(ranges: &[(u64, u64)]) -> Result<Tracker, String> {
        if ranges.is_empty() {
            return Err("no memory to track".into());
        }
        // SAFETY: userfaultfd(2) takes flags only.
        let uffd =
            unsafe { libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC | libc::O_NONBLOCK) }
                as c_int;
        if uffd < 0 {
            return Err(format!("userfaultfd is not available: {}", os_err()));
        }
        crate::fdreg::register_fd(uffd);
        let mut t = Tracker {
            uffd,
            pagemap: -1,
            ranges: ranges.to_vec(),
            buf: vec![PageRegion::default(); 4096],
        };
        let mut api = UffdioApi {
            api: UFFD_API,
            features: UFFD_FEATURE_WP_ASYNC | UFFD_FEATURE_WP_UNPOPULATED,
            ioctls: 0,
        };
        if ioctl(uffd, UFFDIO_API, &mut api) != 0 {
            return Err(format!(
                "userfaultfd without asynchronous write-protect on this kernel (Linux 6.7 or \
                 later has it): {}",
                os_err()
            ));
        }
        let path = c"/proc/self/pagemap";
        // SAFETY: a NUL-terminated path and plain flags.
        let pm = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
        if pm < 0 {
            return Err(format!("cannot open /proc/self/pagemap: {}", os_err()));
        }
        crate::fdreg::register_fd(pm);
        t.pagemap = pm;
        for &(s, e) in ranges {
            let mut reg = UffdioRegister {
                range: UffdioRange {
                    start: s,
                    len: e - s,
                },
                mode: UFFDIO_REGISTER_MODE_WP,
                ioctls: 0,
            };
            if ioctl(uffd, UFFDIO_REGISTER, &mut reg) != 0 {
                return Err(format!(
                    "cannot register {s:#x}..{e:#x} for write-protect: {}",
                    os_err()
                ));
            }
            let mut wp = UffdioWriteprotect {
                range: UffdioRange {
                    start: s,
                    len: e - s,
                },
                mode: UFFDIO_WRITEPROTECT_MODE_WP,
            };
            if ioctl(uffd, UFFDIO_WRITEPROTECT, &mut wp) != 0 {
                return Err(format!("cannot write-protect {s:#x}..{e:#x}: {}", os_err()));
            }
        }
        // A first scan: it must work here (PAGEMAP_SCAN is Linux ≥ 6.7).
        t.scan(usize::MAX)?;
        Ok(t)
    }

    /// The pages written since the last scan, as `(start, bytes)` runs (at most `cap` pages
    /// in all), write-protected again.
    pub fn scan(&mut self, cap: usize) -> Result<Vec<(u64, u64)>, String> {
        let mut out = Vec::new();
        let mut pages = 0usize;
        for i in 0..self.ranges.len() {
            let (s, e) = self.ranges[i];
            let mut at = s;
            while at < e {
                let mut arg = PmScanArg {
                    size: std::mem::size_of::<PmScanArg>() as u64,
                    flags: PM_SCAN_WP_MATCHING | PM_SCAN_CHECK_WPASYNC,
                    start: at,
                    end: e,
                    vec: self.buf.as_mut_ptr() as u64,
                    vec_len: self.buf.len() as u64,
                    category_mask: PAGE_IS_WRITTEN,
                    return_mask: PAGE_IS_WRITTEN,
                    ..Default::default()
                };
                let n = ioctl(self.pagemap, PAGEMAP_SCAN, &mut arg);
                if n < 0 {
                    return Err(format!("PAGEMAP_SCAN failed: {}", os_err()));
                }
                for r in self.buf.iter().take(n as usize) {
                    if pages < cap {
                        out.push((r.start, r.end - r.start));
                        pages += ((r.end - r.start) / 4096) as usize;
                    }
                }
                if arg.walk_end <= at {
                    break;
                }
                at = arg.walk_end;
            }
        }
        Ok(out)
    }
}

impl Drop for Tracker {
    fn drop(&mut self) {
        if self.pagemap >= 0 {
            crate::fdreg::close_own_fd(self.pagemap);
        }
        crate::fdreg::close_own_fd(self.uffd);
    }
}
