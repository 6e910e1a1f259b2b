//! The userfaultfd write-protect mechanism: sampled pages are registered with a userfaultfd in
//! write-protect mode; a write to one blocks the writing thread (in user mode or inside a
//! system call alike) until our fault thread has noted the thread id the kernel reports
//! (`UFFD_FEATURE_THREAD_ID`) and lifted the protection.
//!
//! Compared with `mprotect` ([`super::signal`]): no signal is involved (the program's SIGSEGV
//! handling is untouched), a system call that writes into a sampled page waits instead of
//! failing with EFAULT, and a mapping the program replaces simply loses the registration (our
//! later ioctls on it fail harmlessly). In exchange a write waits for a thread switch to the
//! fault thread and back, so the fault thread runs at real-time priority when allowed (its
//! own thread only; it ends with the process). Only writes are seen (as with the default
//! `--access write` of the `mprotect` mechanism).
//!
//! The fault thread never allocates or touches heap memory in its loop (it could block on a
//! page it protects itself): messages are read into a stack buffer, results go to the static
//! tables of [`super::state`].

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicI32, Ordering};

use libc::{c_int, c_void};

use super::state::{self, ARMED, BUSY, COUNTERS, FREE, OPEN, PAGE, SLOTS};

use super::uffd_abi::{
    UffdioApi, UffdioRange, UffdioRegister, UffdioWriteprotect, UFFDIO_API, UFFDIO_REGISTER,
    UFFDIO_REGISTER_MODE_WP, UFFDIO_UNREGISTER, UFFDIO_WRITEPROTECT, UFFDIO_WRITEPROTECT_MODE_WP,
    UFFD_API, UFFD_EVENT_PAGEFAULT, UFFD_FEATURE_PAGEFAULT_FLAG_WP, UFFD_FEATURE_THREAD_ID,
};

/// `struct uffd_msg` (32 bytes): event, reserved, then for page faults flags, address, ptid.
#[repr(C)]
#[derive(Clone, Copy)]
struct UffdMsg {
    event: u8,
    reserved1: u8,
    reserved2: u16,
    reserved3: u32,
    flags: u64,
    address: u64,
    ptid: u32,
    pad: u32,
}

/// The open userfaultfd of the running session (-1: none).
static FD: AtomicI32 = AtomicI32::new(-1);
/// The fault thread is in its loop (nothing is armed before: a thread still starting up could
/// block on a protected page with nobody to answer).
static SERVING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Wait (bounded) until the fault thread serves; false if it did not start in time.
pub fn wait_serving(timeout: std::time::Duration) -> bool {
    let t0 = std::time::Instant::now();
    while !SERVING.load(Ordering::SeqCst) {
        if t0.elapsed() > timeout {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    true
}

fn ioctl<T>(fd: RawFd, req: u64, arg: &mut T) -> bool {
    // SAFETY: `arg` is a valid, exclusively borrowed `repr(C)` struct of the size encoded in
    // `req`; the kernel reads and writes only that struct.
    unsafe { libc::ioctl(fd, req as _, arg as *mut T as *mut c_void) == 0 }
}

/// Open a userfaultfd with write-protect faults and thread ids, or say why not.
fn open() -> Result<RawFd, String> {
    // SAFETY: userfaultfd(2) takes flags only.
    let fd = unsafe { libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC | libc::O_NONBLOCK) }
        as c_int;
    if fd < 0 {
        return Err(format!(
            "userfaultfd is not available: {} (kernel without it, or \
             vm.unprivileged_userfaultfd = 0 for an unprivileged user)",
            std::io::Error::last_os_error()
        ));
    }
    let mut api = UffdioApi {
        api: UFFD_API,
        features: UFFD_FEATURE_PAGEFAULT_FLAG_WP | UFFD_FEATURE_THREAD_ID,
        ioctls: 0,
    };
    if !ioctl(fd, UFFDIO_API, &mut api) {
        let e = std::io::Error::last_os_error();
        crate::sys::close_fd(fd);
        return Err(format!(
            "userfaultfd without write-protect faults and thread ids on this kernel ({e})"
        ));
    }
    Ok(fd)
}

/// Whether this kernel offers userfaultfd write-protect with thread ids (opens and closes one).
pub fn available() -> Result<(), String> {
    open().map(crate::sys::close_fd)
}

/// Open the session's userfaultfd (kept open until [`close`]).
pub fn start() -> Result<RawFd, String> {
    let fd = open()?;
    crate::fdreg::register_fd(fd);
    FD.store(fd, Ordering::SeqCst);
    Ok(fd)
}

/// Close the session's userfaultfd: the kernel drops every registration and wakes every thread
/// still waiting on one of our pages.
pub fn close() {
    crate::fdreg::close_own_fd(FD.swap(-1, Ordering::SeqCst));
}

/// Fork child: the parent's fd is not ours to use (closed with the other agent fds).
pub fn forget_after_fork() {
    FD.store(-1, Ordering::SeqCst);
    SERVING.store(false, Ordering::SeqCst);
}

fn protect(fd: RawFd, page: u64, on: bool) -> bool {
    let mut wp = UffdioWriteprotect {
        range: UffdioRange {
            start: page,
            len: PAGE as u64,
        },
        mode: if on { UFFDIO_WRITEPROTECT_MODE_WP } else { 0 },
    };
    ioctl(fd, UFFDIO_WRITEPROTECT, &mut wp)
}

/// Register and write-protect `pages`; returns how many are armed.
pub fn arm(pages: &[(u64, u8)]) -> u64 {
    let fd = FD.load(Ordering::SeqCst);
    if fd < 0 || !SERVING.load(Ordering::SeqCst) {
        return 0;
    }
    state::ARMED_COUNT.store(pages.len() as u32, Ordering::SeqCst);
    let mut n = 0;
    let mut slots = SLOTS.iter();
    for &(page, prot) in pages {
        let Some(slot) = state::claim_slot(&mut slots, page, prot) else {
            break;
        };
        let mut reg = UffdioRegister {
            range: UffdioRange {
                start: page,
                len: PAGE as u64,
            },
            mode: UFFDIO_REGISTER_MODE_WP,
            ioctls: 0,
        };
        if ioctl(fd, UFFDIO_REGISTER, &mut reg) && protect(fd, page, true) {
            state::trace(state::ev::ARM, 0, page as usize, 1);
            slot.state.store(ARMED, Ordering::SeqCst);
            n += 1;
        } else {
            unregister(fd, page);
            slot.page.store(0, Ordering::SeqCst);
            slot.state.store(FREE, Ordering::SeqCst);
        }
    }
    n
}

fn unregister(fd: RawFd, page: u64) {
    let mut r = UffdioRange {
        start: page,
        len: PAGE as u64,
    };
    ioctl(fd, UFFDIO_UNREGISTER, &mut r);
}

/// End the round: lift every protection, drop every registration, free every slot. Returns
/// the pages that faulted and those that did not.
pub fn retire_all() -> (Vec<u64>, Vec<u64>) {
    let fd = FD.load(Ordering::SeqCst);
    let mut faulted = Vec::new();
    let mut idle = Vec::new();
    for s in SLOTS.iter() {
        loop {
            let st = s.state.load(Ordering::SeqCst);
            if st == FREE {
                break;
            }
            if st == BUSY
                || s.state
                    .compare_exchange(st, BUSY, Ordering::SeqCst, Ordering::SeqCst)
                    .is_err()
            {
                std::thread::yield_now();
                continue;
            }
            let page = s.page.load(Ordering::SeqCst) as u64;
            if fd >= 0 {
                if st == ARMED {
                    protect(fd, page, false);
                }
                unregister(fd, page);
            }
            if st == OPEN {
                faulted.push(page);
            } else {
                idle.push(page);
            }
            s.page.store(0, Ordering::SeqCst);
            s.state.store(FREE, Ordering::SeqCst);
            break;
        }
    }
    state::ARMED_COUNT.store(0, Ordering::SeqCst);
    (faulted, idle)
}

/// Answer one write-protect fault: note the thread, lift the protection (which wakes it).
/// Every fault is answered, ours or not, so no thread ever stays blocked.
fn answer(fd: RawFd, m: &UffdMsg) {
    let page = m.address & !(PAGE as u64 - 1);
    let tid = m.ptid;
    if let Some(slot) = state::find_slot(page as usize) {
        if slot
            .state
            .compare_exchange(ARMED, BUSY, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
        {
            protect(fd, page, false);
            COUNTERS.faults_induced.fetch_add(1, Ordering::Relaxed);
            state::trace(state::ev::CLAIM, u64::from(tid), page as usize, 1);
            if !state::counted(tid) {
                COUNTERS.faults_uncounted.fetch_add(1, Ordering::Relaxed);
            } else if !crate::threads::is_agent_tid(tid) {
                match state::thread_index(tid) {
                    Some(t) => state::record_access(t, m.address as usize),
                    None => {
                        COUNTERS.threads_dropped.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            slot.state.store(OPEN, Ordering::SeqCst);
            return;
        }
    }
    protect(fd, page, false);
}

/// The fault thread: answer faults until detection stops (then close the fd, which releases
/// any writer still waiting).
pub fn serve() {
    let fd = FD.load(Ordering::SeqCst);
    if fd < 0 {
        return;
    }
    let mut buf = [UffdMsg {
        event: 0,
        reserved1: 0,
        reserved2: 0,
        reserved3: 0,
        flags: 0,
        address: 0,
        ptid: 0,
        pad: 0,
    }; 16];
    SERVING.store(true, Ordering::SeqCst);
    while super::RUN.load(Ordering::Acquire) {
        let mut pfd = [libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        }];
        if crate::sys::poll(&mut pfd, 50).unwrap_or(0) == 0 {
            continue;
        }
        // SAFETY: reads at most `size_of_val(&buf)` bytes into the stack buffer of plain
        // `repr(C)` messages; the fd is non-blocking.
        let n = unsafe {
            libc::read(
                fd,
                buf.as_mut_ptr() as *mut c_void,
                std::mem::size_of_val(&buf),
            )
        };
        if n <= 0 {
            continue;
        }
        let count = n as usize / std::mem::size_of::<UffdMsg>();
        for m in buf.iter().take(count) {
            if m.event == UFFD_EVENT_PAGEFAULT {
                answer(fd, m);
            }
        }
    }
    SERVING.store(false, Ordering::SeqCst);
}

/// The fault thread's priority: 0 unknown, 1 SCHED_FIFO, 2 nice -20, 3 normal.
static PRIORITY: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// Make the calling thread (the fault thread) real-time, so a blocked writer is answered at
/// once even when every CPU is busy; falls back to the highest nice value, then to nothing.
/// Allocation-free; [`priority`] says what it got.
pub fn raise_priority() {
    let param = libc::sched_param { sched_priority: 1 };
    // SAFETY: changes the calling thread's own policy; `param` is a valid local.
    let got = if unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) } == 0 {
        1
    } else if {
        // SAFETY: setpriority on the calling thread (PRIO_PROCESS with its tid on Linux).
        unsafe { libc::setpriority(libc::PRIO_PROCESS, preheat_engine::os::gettid(), -20) }
    } == 0
    {
        2
    } else {
        3
    };
    PRIORITY.store(got, Ordering::SeqCst);
}

/// What [`raise_priority`] got, in words.
pub fn priority() -> &'static str {
    match PRIORITY.load(Ordering::SeqCst) {
        1 => "SCHED_FIFO 1",
        2 => "nice -20",
        3 => "normal priority (no privilege to raise it)",
        _ => "not started",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ioctl_numbers_match_the_kernel_header() {
        // The ioctl numbers are checked in uffd_abi.
        assert_eq!(std::mem::size_of::<UffdMsg>(), 32);
    }
}
