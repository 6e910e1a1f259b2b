//! Scheduling class, real-time priority and CPU affinity of *other* threads, by thread id.
//!
//! [`crate::os`] acts on the calling thread; a coscheduler (`preheat cosched`) or an
//! interleaving controller must change threads it did not create: the vCPU threads of a "VM",
//! the ranks of a workload. Everything here takes a kernel thread id (`tid`, as listed in
//! `/proc/PID/task`) and changes only that thread. Changing another user's thread, or entering
//! a real-time class, needs `CAP_SYS_NICE` (EPERM otherwise); a thread that has exited gives
//! ESRCH, which callers treat as "the thread is gone", not as an error.
//!
//! Real-time classes are always set with `SCHED_RESET_ON_FORK`, so a process the thread forks
//! starts in the normal class: a coscheduled program cannot leak real-time children.

use std::io;

/// A thread's scheduling class and real-time priority (`sched_getscheduler`/`sched_getparam`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThreadSched {
    /// `libc::SCHED_OTHER`, `SCHED_FIFO`, `SCHED_RR`, `SCHED_BATCH`, `SCHED_IDLE` (without the
    /// reset-on-fork flag).
    pub policy: i32,
    /// Real-time priority (1..=99 for FIFO/RR, 0 otherwise).
    pub priority: i32,
    /// Whether `SCHED_RESET_ON_FORK` is set.
    pub reset_on_fork: bool,
}

impl ThreadSched {
    /// The normal class (`SCHED_OTHER`, priority 0).
    pub const NORMAL: ThreadSched = ThreadSched {
        policy: libc::SCHED_OTHER,
        priority: 0,
        reset_on_fork: false,
    };

    /// `SCHED_FIFO` at `priority`, with reset-on-fork.
    pub fn fifo(priority: i32) -> ThreadSched {
        ThreadSched {
            policy: libc::SCHED_FIFO,
            priority,
            reset_on_fork: true,
        }
    }

    /// Whether this is a real-time class (FIFO or RR).
    pub fn is_realtime(&self) -> bool {
        self.policy == libc::SCHED_FIFO || self.policy == libc::SCHED_RR
    }

    /// A short name: `other`, `fifo:2`, `rr:10`, `batch`, `idle`.
    pub fn name(&self) -> String {
        match self.policy {
            libc::SCHED_OTHER => "other".into(),
            libc::SCHED_FIFO => format!("fifo:{}", self.priority),
            libc::SCHED_RR => format!("rr:{}", self.priority),
            libc::SCHED_BATCH => "batch".into(),
            libc::SCHED_IDLE => "idle".into(),
            p => format!("policy{p}:{}", self.priority),
        }
    }
}

fn result(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// The scheduling class and priority of thread `tid`.
pub fn thread_sched(tid: u32) -> io::Result<ThreadSched> {
    let tid = tid as libc::pid_t;
    // SAFETY: sched_getscheduler takes only an integer thread id and reads kernel state.
    let raw = result(unsafe { libc::sched_getscheduler(tid) })?;
    let mut param = libc::sched_param { sched_priority: 0 };
    // SAFETY: `param` is a valid, writable sched_param on our stack for the duration of the call.
    result(unsafe { libc::sched_getparam(tid, &mut param) })?;
    Ok(ThreadSched {
        policy: raw & !libc::SCHED_RESET_ON_FORK,
        priority: param.sched_priority,
        reset_on_fork: raw & libc::SCHED_RESET_ON_FORK != 0,
    })
}

/// Set the scheduling class and priority of thread `tid`.
pub fn set_thread_sched(tid: u32, s: ThreadSched) -> io::Result<()> {
    let param = libc::sched_param {
        sched_priority: s.priority,
    };
    let policy = if s.reset_on_fork {
        s.policy | libc::SCHED_RESET_ON_FORK
    } else {
        s.policy
    };
    // SAFETY: `param` is a valid sched_param on our stack; the thread id is an integer.
    result(unsafe { libc::sched_setscheduler(tid as libc::pid_t, policy, &param) }).map(|_| ())
}

/// The CPU affinity of thread `tid` (0: the calling thread), as a sorted list of CPUs.
pub fn thread_affinity(tid: u32) -> io::Result<Vec<usize>> {
    // SAFETY: all-zero is a valid empty cpu_set_t.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is writable and we pass its exact size.
    result(unsafe {
        libc::sched_getaffinity(
            tid as libc::pid_t,
            std::mem::size_of::<libc::cpu_set_t>(),
            &mut set,
        )
    })?;
    let max = 8 * std::mem::size_of::<libc::cpu_set_t>();
    Ok((0..max)
        // SAFETY: `c < CPU_SETSIZE`, so CPU_ISSET reads inside `set`.
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect())
}

/// Set the CPU affinity of thread `tid` (0: the calling thread) to exactly `cpus`. An empty
/// list or a CPU ≥ `CPU_SETSIZE` is `EINVAL`.
pub fn set_thread_affinity(tid: u32, cpus: &[usize]) -> io::Result<()> {
    let max = 8 * std::mem::size_of::<libc::cpu_set_t>();
    if cpus.is_empty() || cpus.iter().any(|&c| c >= max) {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    // SAFETY: cpu_set_t is a plain bit array; all-zero is the valid empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &c in cpus {
        // SAFETY: `c < CPU_SETSIZE` was checked above, so CPU_SET stays inside `set`.
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    // SAFETY: `set` is a valid, initialised cpu_set_t and we pass its exact size.
    result(unsafe {
        libc::sched_setaffinity(
            tid as libc::pid_t,
            std::mem::size_of::<libc::cpu_set_t>(),
            &set,
        )
    })
    .map(|_| ())
}

/// Whether this process may put threads into a real-time class: tries `SCHED_FIFO` 1 on a
/// short-lived thread of its own (so no thread of the caller changes). `Err` carries the
/// reason (EPERM: no `CAP_SYS_NICE` and an `RLIMIT_RTPRIO` of 0).
pub fn realtime_permitted() -> io::Result<()> {
    std::thread::spawn(|| set_thread_sched(0, ThreadSched::fifo(1)))
        .join()
        .unwrap_or_else(|_| Err(io::Error::other("probe thread panicked")))
}

/// Whether an error means the thread no longer exists.
pub fn is_gone(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::ESRCH)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    /// A helper thread that reports its tid and waits until told to exit.
    fn parked() -> (u32, mpsc::Sender<()>, std::thread::JoinHandle<()>) {
        let (tid_tx, tid_rx) = mpsc::channel();
        let (stop_tx, stop_rx) = mpsc::channel::<()>();
        let h = std::thread::spawn(move || {
            tid_tx.send(crate::os::gettid()).unwrap();
            let _ = stop_rx.recv();
        });
        (tid_rx.recv().unwrap(), stop_tx, h)
    }

    #[test]
    fn other_thread_affinity_round_trip() {
        let _shared = crate::test_lock::shared();
        let (tid, stop, h) = parked();
        let old = thread_affinity(tid).unwrap();
        assert!(!old.is_empty());
        let cpu = old[old.len() - 1];
        set_thread_affinity(tid, &[cpu]).unwrap();
        assert_eq!(thread_affinity(tid).unwrap(), vec![cpu]);
        set_thread_affinity(tid, &old).unwrap();
        assert_eq!(thread_affinity(tid).unwrap(), old);
        assert!(set_thread_affinity(tid, &[]).is_err());
        stop.send(()).unwrap();
        h.join().unwrap();
        // The thread is gone: ESRCH, recognised as such — unless a busy machine already gave
        // its tid to a new thread elsewhere (then it is not one of ours any more).
        match thread_affinity(tid) {
            Err(e) => {
                assert!(is_gone(&e), "{e}");
                assert!(thread_sched(tid).is_err_and(|e| is_gone(&e)) || reused(tid));
            }
            Ok(_) => assert!(
                reused(tid),
                "thread {tid} still answers after it was joined"
            ),
        }
    }

    /// A tid that exists but is not a thread of this process: reused after ours ended.
    fn reused(tid: u32) -> bool {
        !std::path::Path::new(&format!("/proc/self/task/{tid}")).exists()
    }

    #[test]
    fn other_thread_fifo_round_trip_when_permitted() {
        let _shared = crate::test_lock::shared();
        let (tid, stop, h) = parked();
        let before = thread_sched(tid).unwrap();
        assert_eq!(before, ThreadSched::NORMAL);
        match set_thread_sched(tid, ThreadSched::fifo(1)) {
            Ok(()) => {
                let now = thread_sched(tid).unwrap();
                assert_eq!(now, ThreadSched::fifo(1));
                assert!(now.is_realtime());
                assert_eq!(now.name(), "fifo:1");
                set_thread_sched(tid, before).unwrap();
                assert_eq!(thread_sched(tid).unwrap(), before);
                assert!(realtime_permitted().is_ok());
            }
            Err(e) => {
                assert_eq!(e.raw_os_error(), Some(libc::EPERM), "{e}");
                assert!(realtime_permitted().is_err());
            }
        }
        stop.send(()).unwrap();
        h.join().unwrap();
    }
}
