//! Threads and scheduling.
//!
//! The paper wakes "a CPU" to preheat (§3.2) and parallelises preheating over two cores (§3.3);
//! here that means pinning helper threads to chosen CPUs ([`set_affinity`]) and optionally
//! running them as `SCHED_IDLE` so they never delay the server itself.
//!
//! All calls act on the *calling thread* (pid/tid 0 in the underlying syscalls), not on the
//! whole process. [`current_cpu`] and [`gettid`] are hot-path functions (no allocation).

use std::io;
use std::sync::atomic::AtomicU32;

/// Pin the calling thread to `cpu`.
pub fn pin_current_thread(cpu: usize) -> io::Result<()> {
    set_affinity(&[cpu])
}

/// Set the CPU affinity mask of the calling thread to exactly `cpus`
/// (`sched_setaffinity(0, ...)`). An empty list or a CPU ≥ `CPU_SETSIZE` is `EINVAL`.
pub fn set_affinity(cpus: &[usize]) -> io::Result<()> {
    crate::sched::set_thread_affinity(0, cpus)
}

/// The CPU affinity mask of the calling thread, as a sorted list of CPU numbers (empty if the
/// call fails, which it does not on Linux).
pub fn get_affinity() -> Vec<usize> {
    crate::sched::thread_affinity(0).unwrap_or_default()
}

/// Run `f` with the calling thread pinned to `cpu`, then give the thread back the affinity mask
/// it had. Fails without running `f` where the thread cannot be pinned there.
pub fn on_cpu<T>(cpu: usize, f: impl FnOnce() -> T) -> io::Result<T> {
    let old = get_affinity();
    pin_current_thread(cpu)?;
    let r = f();
    if !old.is_empty() {
        set_affinity(&old)?;
    }
    Ok(r)
}

/// The CPU the calling thread runs on (sched_getcpu; rseq/vDSO-backed, no syscall on recent
/// kernels). Returns 0 if the call fails. Hot path: allocation-free.
#[inline]
pub fn current_cpu() -> u32 {
    // SAFETY: sched_getcpu takes no arguments and only reads per-thread kernel state.
    let c = unsafe { libc::sched_getcpu() };
    if c < 0 {
        0
    } else {
        c as u32
    }
}

/// Kernel thread id of the calling thread. Hot path: allocation-free (one `gettid` syscall,
/// deliberately not cached in a thread-local: a cached value would be wrong after `fork`).
#[inline]
pub fn gettid() -> u32 {
    // SAFETY: SYS_gettid takes no arguments and cannot fail.
    unsafe { libc::syscall(libc::SYS_gettid) as u32 }
}

/// Switch the calling thread to SCHED_IDLE (any normal task preempts it at once) or back to
/// SCHED_OTHER.
///
/// On Linux `sched_setscheduler(0, ..)` changes only the calling thread. Leaving SCHED_IDLE
/// needs `CAP_SYS_NICE` or an `RLIMIT_NICE` that permits the thread's nice value (EPERM
/// otherwise), so unprivileged helpers should enter SCHED_IDLE only on threads they own.
pub fn set_sched_idle(idle: bool) -> io::Result<()> {
    let param = libc::sched_param { sched_priority: 0 };
    let policy = if idle {
        libc::SCHED_IDLE
    } else {
        libc::SCHED_OTHER
    };
    // SAFETY: `param` is a valid sched_param (priority 0 is required for both policies);
    // pid 0 means the calling thread.
    let r = unsafe { libc::sched_setscheduler(0, policy, &param) };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Set the calling thread's timer slack to `ns` nanoseconds (`prctl(PR_SET_TIMERSLACK)`;
/// 0 is raised to 1, because 0 would mean "back to the default", 50 µs). Timed waits of a normal
/// thread may otherwise expire up to 50 µs late, which a thread that must wake at a planned
/// time (an anticipatory wakeup) cannot afford. Affects only the calling thread; needs no
/// privileges.
pub fn set_timer_slack_ns(ns: u64) -> io::Result<()> {
    let v = ns.max(1) as libc::c_ulong;
    // SAFETY: prctl(PR_SET_TIMERSLACK, v) takes only integer arguments (no pointers) and changes
    // only the calling thread's timer slack.
    let r = unsafe {
        libc::prctl(
            libc::PR_SET_TIMERSLACK,
            v,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The calling thread's timer slack in nanoseconds (`prctl(PR_GET_TIMERSLACK)`).
pub fn timer_slack_ns() -> u64 {
    // SAFETY: prctl(PR_GET_TIMERSLACK) takes no pointer arguments and only reads the calling
    // thread's timer slack, which it returns.
    let r = unsafe {
        libc::prctl(
            libc::PR_GET_TIMERSLACK,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
        )
    };
    r.max(0) as u64
}

/// Whether this machine has CPU `cpu` (CPUs are numbered 0 to [`online_cpus`] − 1 here), else
/// why not, in words a user can act on.
pub fn check_cpu(cpu: usize) -> Result<(), String> {
    let n = online_cpus();
    if cpu < n {
        Ok(())
    } else {
        Err(format!(
            "CPU {cpu} does not exist (this machine has CPUs 0-{})",
            n.saturating_sub(1)
        ))
    }
}

/// Number of online CPUs.
pub fn online_cpus() -> usize {
    // SAFETY: sysconf has no memory-safety preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    if n < 1 {
        1
    } else {
        n as usize
    }
}

/// Time each CPU's vCPU was runnable but not run by the hypervisor ("steal"), ms, from
/// `/proc/stat` (indexed by CPU number; `None` where the kernel does not report it). Not for a
/// hot path: reads a file.
pub fn steal_ms_per_cpu() -> Option<Vec<u64>> {
    let stat = crate::procstat::read(std::path::Path::new("/proc/stat")).ok()?;
    let hz = crate::procstat::user_hz();
    let mut out = Vec::new();
    for (cpu, t) in &stat.cpus {
        let i = *cpu as usize;
        if out.len() <= i {
            out.resize(i + 1, 0);
        }
        out[i] = t.steal.saturating_mul(1000) / hz;
    }
    (!out.is_empty()).then_some(out)
}

/// Current scheduling policy of the calling thread (`libc::SCHED_*`).
pub fn sched_policy() -> i32 {
    // SAFETY: no memory-safety preconditions; pid 0 = calling thread.
    unsafe { libc::sched_getscheduler(0) }
}

/// FUTEX_WAIT_PRIVATE on `word` while it equals `expected` (spurious returns are fine: every
/// caller re-checks in a loop).
pub fn futex_wait(word: &AtomicU32, expected: u32, timeout_ns: Option<u64>) {
    let ts = timeout_ns.map(|ns| libc::timespec {
        tv_sec: (ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (ns % 1_000_000_000) as libc::c_long,
    });
    let tsp = ts
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: `word` is a live, aligned AtomicU32 (same layout as u32) for the whole call; the
    // kernel only reads it atomically. `tsp` is null or points to a timespec on our stack.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
            expected,
            tsp,
        );
    }
}

/// FUTEX_WAKE_PRIVATE up to `count` waiters on `word` (hot path: one syscall, no allocation).
pub fn futex_wake(word: &AtomicU32, count: i32) {
    // SAFETY: `word` is a live, aligned AtomicU32; FUTEX_WAKE does not access its value.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
            count,
        );
    }
}

/// A minimal epoll instance (for benchmarks that wait the way event-loop servers do).
pub struct Epoll {
    fd: i32,
}

impl Epoll {
    /// `epoll_create1(EPOLL_CLOEXEC)`.
    pub fn new() -> io::Result<Epoll> {
        // SAFETY: no pointers; returns a new fd or -1.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Epoll { fd })
    }

    /// Watch `fd` for input (level-triggered).
    pub fn add_readable(&self, fd: i32) -> io::Result<()> {
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: fd as u64,
        };
        // SAFETY: `ev` is a valid epoll_event on our stack for the duration of the call.
        let r = unsafe { libc::epoll_ctl(self.fd, libc::EPOLL_CTL_ADD, fd, &mut ev) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Block in `epoll_wait` until a watched fd is readable (or `timeout_ms` passes; -1: no
    /// timeout). Returns the number of ready fds.
    pub fn wait(&self, timeout_ms: i32) -> io::Result<usize> {
        let mut evs = [libc::epoll_event { events: 0, u64: 0 }; 4];
        // SAFETY: `evs` is a valid writable array of 4 events; we pass its length.
        let n =
            unsafe { libc::epoll_wait(self.fd, evs.as_mut_ptr(), evs.len() as i32, timeout_ms) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(n as usize)
    }

    /// Stop watching `fd` (a closed fd leaves the set by itself once no duplicate remains).
    pub fn remove(&self, fd: i32) -> io::Result<()> {
        let mut ev = libc::epoll_event { events: 0, u64: 0 };
        // SAFETY: `ev` is a valid epoll_event on our stack (ignored by DEL on current kernels,
        // but must be non-null on old ones).
        let r = unsafe { libc::epoll_ctl(self.fd, libc::EPOLL_CTL_DEL, fd, &mut ev) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Wait until a watched fd is readable or `timeout` passes (`None`: no timeout), with
    /// nanosecond resolution where the kernel has `epoll_pwait2` (else the timeout is rounded
    /// down to whole milliseconds). Writes the ready fds into `ready` (at most its length) and
    /// returns how many; 0 on timeout or when interrupted by a signal.
    pub fn wait_ready(
        &self,
        timeout: Option<std::time::Duration>,
        ready: &mut [i32],
    ) -> io::Result<usize> {
        const MAX: usize = 64;
        let mut evs = [libc::epoll_event { events: 0, u64: 0 }; MAX];
        let cap = ready.len().clamp(1, MAX) as i32;
        let n = self.wait_raw(timeout, &mut evs[..cap as usize]);
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                return Ok(0);
            }
            return Err(e);
        }
        let n = (n as usize).min(ready.len());
        for (r, ev) in ready.iter_mut().zip(&evs[..n]) {
            *r = ev.u64 as i32;
        }
        Ok(n)
    }

    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn wait_raw(&self, timeout: Option<std::time::Duration>, evs: &mut [libc::epoll_event]) -> i32 {
        use std::sync::atomic::{AtomicBool, Ordering};
        static NO_PWAIT2: AtomicBool = AtomicBool::new(false);
        if !NO_PWAIT2.load(Ordering::Relaxed) {
            let ts = timeout.map(|d| libc::timespec {
                tv_sec: d.as_secs().min(i32::MAX as u64) as libc::time_t,
                tv_nsec: d.subsec_nanos() as _,
            });
            let tsp = ts
                .as_ref()
                .map_or(std::ptr::null(), |t| t as *const libc::timespec);
            // SAFETY: `evs` is a valid writable array whose length we pass; `tsp` is null or
            // points at a timespec on our stack; a null sigmask means "no change".
            let n = unsafe {
                libc::epoll_pwait2(
                    self.fd,
                    evs.as_mut_ptr(),
                    evs.len() as i32,
                    tsp,
                    std::ptr::null(),
                )
            };
            if n >= 0 || io::Error::last_os_error().raw_os_error() != Some(libc::ENOSYS) {
                return n;
            }
            NO_PWAIT2.store(true, Ordering::Relaxed);
        }
        self.wait_ms(timeout, evs)
    }

    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    fn wait_raw(&self, timeout: Option<std::time::Duration>, evs: &mut [libc::epoll_event]) -> i32 {
        self.wait_ms(timeout, evs)
    }

    fn wait_ms(&self, timeout: Option<std::time::Duration>, evs: &mut [libc::epoll_event]) -> i32 {
        let ms = timeout.map_or(-1, |d| d.as_millis().min(i32::MAX as u128) as i32);
        // SAFETY: `evs` is a valid writable array whose length we pass.
        unsafe { libc::epoll_wait(self.fd, evs.as_mut_ptr(), evs.len() as i32, ms) }
    }
}

impl Drop for Epoll {
    fn drop(&mut self) {
        // SAFETY: we own `fd` and close it exactly once.
        unsafe { libc::close(self.fd) };
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn steal_is_reported_per_cpu() {
        // Every Linux since 2.6.11 reports the column; it only grows.
        let a = super::steal_ms_per_cpu().expect("/proc/stat has a steal column");
        assert_eq!(a.len(), super::online_cpus().max(a.len()));
        let b = super::steal_ms_per_cpu().unwrap();
        assert!(a.iter().zip(&b).all(|(x, y)| y >= x));
    }

    use super::*;

    #[test]
    fn affinity_round_trip() {
        let _shared = crate::test_lock::shared();
        // Run in a fresh thread so the test harness thread keeps its mask.
        std::thread::spawn(|| {
            let old = get_affinity();
            assert!(!old.is_empty());
            let cpu = old[old.len() - 1];
            pin_current_thread(cpu).unwrap();
            assert_eq!(get_affinity(), vec![cpu]);
            for _ in 0..1000 {
                std::hint::spin_loop();
            }
            assert_eq!(current_cpu() as usize, cpu);
            set_affinity(&old).unwrap();
            assert_eq!(get_affinity(), old);
            assert!(set_affinity(&[]).is_err());
            assert!(set_affinity(&[1 << 20]).is_err());
        })
        .join()
        .unwrap();
    }

    #[test]
    fn epoll_wait_ready_and_remove() {
        use std::io::Write;
        use std::os::fd::AsRawFd;
        use std::time::{Duration, Instant};
        let (mut a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        let ep = Epoll::new().unwrap();
        ep.add_readable(b.as_raw_fd()).unwrap();
        let mut ready = [0i32; 4];
        let t0 = Instant::now();
        assert_eq!(
            ep.wait_ready(Some(Duration::from_micros(1500)), &mut ready)
                .unwrap(),
            0
        );
        assert!(t0.elapsed() >= Duration::from_millis(1));
        a.write_all(b"x").unwrap();
        assert_eq!(ep.wait_ready(None, &mut ready).unwrap(), 1);
        assert_eq!(ready[0], b.as_raw_fd());
        ep.remove(b.as_raw_fd()).unwrap();
        assert_eq!(ep.wait_ready(Some(Duration::ZERO), &mut ready).unwrap(), 0);
    }

    #[test]
    fn ids_and_counts() {
        let _shared = crate::test_lock::shared();
        let main = gettid();
        assert!(main > 0);
        let other = std::thread::spawn(gettid).join().unwrap();
        assert_ne!(main, other);
        assert!(online_cpus() >= 1);
        assert!((current_cpu() as usize) < 4096);
    }

    #[test]
    fn timer_slack_on_own_thread() {
        let _shared = crate::test_lock::shared();
        std::thread::spawn(|| {
            set_timer_slack_ns(1).unwrap();
            assert_eq!(timer_slack_ns(), 1);
            set_timer_slack_ns(0).unwrap();
            assert_eq!(timer_slack_ns(), 1);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn sched_idle_on_own_thread() {
        let _shared = crate::test_lock::shared();
        std::thread::spawn(|| {
            set_sched_idle(true).unwrap();
            assert_eq!(sched_policy(), libc::SCHED_IDLE);
            // Leaving SCHED_IDLE may need privileges; accept EPERM.
            match set_sched_idle(false) {
                Ok(()) => assert_eq!(sched_policy(), libc::SCHED_OTHER),
                Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EPERM)),
            }
        })
        .join()
        .unwrap();
    }
}

/// Ask the kernel to send SIGKILL to the calling process when the thread that started it exits,
/// and check that this thread's parent is still `expected_parent` (otherwise it already died in
/// between: returns an error and the caller should exit).
pub fn die_with_parent(expected_parent: u32) -> io::Result<()> {
    // SAFETY: PR_SET_PDEATHSIG takes a signal number and changes only this process's
    // parent-death signal; no memory is passed.
    if unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: getppid has no arguments and cannot fail.
    let parent = unsafe { libc::getppid() } as u32;
    if parent != expected_parent {
        return Err(io::Error::other(format!(
            "parent {expected_parent} already exited (now {parent})"
        )));
    }
    Ok(())
}

/// How a waited-for child ended, with the CPU time it and its waited-for descendants used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reaped {
    /// Exit code, or `None` if a signal ended it.
    pub code: Option<i32>,
    /// The signal that ended it, if any.
    pub signal: Option<i32>,
    /// User + system CPU time, ns (the process and every descendant it waited for).
    pub cpu_ns: u64,
}

/// Wait for child `pid` to end (blocking) and reap it, returning its exit and CPU time
/// (`wait4` resource usage). Whoever else owns a handle to the child must not wait for it again.
pub fn wait_reap(pid: u32) -> io::Result<Reaped> {
    let mut status: libc::c_int = 0;
    // SAFETY: an all-zero `rusage` is a valid value of this plain C struct.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: `status` and `ru` are valid, writable and owned by this frame; wait4 only
        // writes them.
        let r = unsafe { libc::wait4(pid as libc::pid_t, &mut status, 0, &mut ru) };
        if r == pid as libc::pid_t {
            break;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
    let tv = |t: libc::timeval| t.tv_sec as u64 * 1_000_000_000 + t.tv_usec as u64 * 1000;
    let exited = libc::WIFEXITED(status);
    Ok(Reaped {
        code: exited.then(|| libc::WEXITSTATUS(status)),
        signal: libc::WIFSIGNALED(status).then(|| libc::WTERMSIG(status)),
        cpu_ns: tv(ru.ru_utime) + tv(ru.ru_stime),
    })
}

/// Send `sig` to process `pid`, or to process group `-pid` when `group` is set.
pub fn send_signal(pid: u32, sig: i32, group: bool) -> io::Result<()> {
    let target = if group {
        -(pid as libc::pid_t)
    } else {
        pid as libc::pid_t
    };
    // SAFETY: kill takes plain integers; a wrong pid is reported as ESRCH/EPERM, never UB.
    if unsafe { libc::kill(target, sig) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Ask for transparent huge pages on the whole 2 MiB pages inside `[addr, addr + len)`
/// (`MADV_HUGEPAGE`; a hint, effective for memory not yet touched). Any range is safe: the
/// kernel validates it, and the advice changes no contents.
pub fn advise_hugepages(addr: preheat_model::VirtAddr, len: usize) -> io::Result<()> {
    const HUGE: usize = 2 << 20;
    let addr = addr.0 as usize;
    let start = addr.div_ceil(HUGE) * HUGE;
    let end = (addr + len) / HUGE * HUGE;
    if end <= start {
        return Ok(());
    }
    // SAFETY: madvise(MADV_HUGEPAGE) only records a preference for the mapping(s) in the range;
    // it neither unmaps nor changes memory contents, and an invalid range is reported as an
    // error (ENOMEM/EINVAL), not undefined behaviour.
    if unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The IPv4 loopback address 127.0.0.1:`port` as the kernel takes it (for raw `bind` and
/// `connect`: the agent's own connections, which make no allocation and no libc call).
pub const fn loopback_sockaddr_in(port: u16) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from_be_bytes([127, 0, 0, 1]).to_be(),
        },
        sin_zero: [0; 8],
    }
}

/// Acknowledge what socket `fd` has received at once (`TCP_QUICKACK`; the kernel sends a pending
/// delayed ACK now). A client that reads a reply in several pieces uses it so a server's Nagle
/// algorithm, waiting for the ACK of the first piece, does not stall the rest for the delayed-ACK
/// timeout (40 ms on Linux). Not sticky: the kernel may return to delayed ACKs afterwards.
pub fn tcp_quickack(fd: std::os::fd::RawFd) -> io::Result<()> {
    let one: libc::c_int = 1;
    // SAFETY: setsockopt reads `size_of::<c_int>()` bytes from the valid local `one`; the kernel
    // validates `fd` (a bad one is an error, not undefined behaviour).
    let r = unsafe {
        libc::setsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_QUICKACK,
            &one as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}
