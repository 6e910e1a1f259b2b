//! Counting events of another thread or process with `perf_event_open` (no sampling): the IPC
//! and misses-per-instruction metric of the cache-affinity experiments (Kazempour et al. measure
//! IPC and L1/L2 misses per instruction), where the machine has a PMU.
//!
//! A VM without a virtual PMU (like ours) refuses hardware events: [`hw_available`] is false and
//! callers fall back to a PMU-free metric, saying so. Software events (task clock, context
//! switches) use the same code path everywhere, which is how it is tested here.

use std::io;

/// `struct perf_event_attr`, first version (PERF_ATTR_SIZE_VER0 = 64 bytes).
#[repr(C)]
#[derive(Default)]
struct Attr {
    type_: u32,
    size: u32,
    config: u64,
    sample_period: u64,
    sample_type: u64,
    read_format: u64,
    flags: u64,
    wakeup_events: u32,
    bp_type: u32,
    config1: u64,
}

const TYPE_HARDWARE: u32 = 0;
const TYPE_SOFTWARE: u32 = 1;
const TYPE_HW_CACHE: u32 = 3;
const FLAG_DISABLED: u64 = 1 << 0;
const FLAG_INHERIT: u64 = 1 << 1;
const FLAG_EXCLUDE_KERNEL: u64 = 1 << 5;
const FLAG_EXCLUDE_HV: u64 = 1 << 6;
const READ_TOTAL_TIME_ENABLED: u64 = 1 << 0;
const READ_TOTAL_TIME_RUNNING: u64 = 1 << 1;
const FD_CLOEXEC: libc::c_ulong = 1 << 3;
const IOC_ENABLE: libc::c_ulong = 0x2400;

/// An event to count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    Cycles,
    Instructions,
    /// Last-level cache misses (`PERF_COUNT_HW_CACHE_MISSES`).
    LlcMisses,
    /// L1 data cache read misses.
    L1dMisses,
    /// L1 instruction cache read misses.
    L1iMisses,
    /// Software: CPU time, ns.
    TaskClock,
    /// Software: context switches.
    ContextSwitches,
}

impl Event {
    fn type_config(self) -> (u32, u64) {
        // HW_CACHE config: id | (op << 8) | (result << 16); op READ = 0, result MISS = 1.
        let cache = |id: u64| id | (1 << 16);
        match self {
            Event::Cycles => (TYPE_HARDWARE, 0),
            Event::Instructions => (TYPE_HARDWARE, 1),
            Event::LlcMisses => (TYPE_HARDWARE, 3),
            Event::L1dMisses => (TYPE_HW_CACHE, cache(0)),
            Event::L1iMisses => (TYPE_HW_CACHE, cache(1)),
            Event::TaskClock => (TYPE_SOFTWARE, 1),
            Event::ContextSwitches => (TYPE_SOFTWARE, 3),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Event::Cycles => "cycles",
            Event::Instructions => "instructions",
            Event::LlcMisses => "llc_misses",
            Event::L1dMisses => "l1d_misses",
            Event::L1iMisses => "l1i_misses",
            Event::TaskClock => "task_clock_ns",
            Event::ContextSwitches => "context_switches",
        }
    }
}

fn open(ev: Event, pid: i32, inherit: bool, user_only: bool) -> io::Result<libc::c_int> {
    let (type_, config) = ev.type_config();
    let mut flags = FLAG_DISABLED;
    if inherit {
        flags |= FLAG_INHERIT;
    }
    if user_only {
        flags |= FLAG_EXCLUDE_KERNEL | FLAG_EXCLUDE_HV;
    }
    let attr = Attr {
        type_,
        size: std::mem::size_of::<Attr>() as u32,
        config,
        read_format: READ_TOTAL_TIME_ENABLED | READ_TOTAL_TIME_RUNNING,
        flags,
        ..Default::default()
    };
    // SAFETY: `attr` is a valid perf_event_attr of the size we declare (VER0, 64 bytes); the
    // kernel only reads it. cpu -1 = any CPU, group -1 = no group.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            &attr as *const Attr,
            pid as libc::pid_t,
            -1 as libc::c_int,
            -1 as libc::c_int,
            FD_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd as libc::c_int)
}

/// Whether hardware events can be counted here (user space only, the calling thread).
pub fn hw_available() -> bool {
    match open(Event::Cycles, 0, false, true) {
        Ok(fd) => {
            // SAFETY: `fd` is a descriptor we just opened and own; closed once.
            unsafe { libc::close(fd) };
            true
        }
        Err(_) => false,
    }
}

/// Open counters on a thread or process; see the module docs.
pub struct Counters {
    fds: Vec<(Event, libc::c_int)>,
}

impl Counters {
    /// Count `events` of `pid` (a thread id, or a process; `inherit`: also threads and children
    /// it creates from now on). Counting starts at once. User space only for hardware events.
    pub fn open(pid: u32, events: &[Event], inherit: bool) -> io::Result<Counters> {
        let mut c = Counters { fds: Vec::new() };
        for &ev in events {
            let user_only = !matches!(ev, Event::TaskClock | Event::ContextSwitches);
            let fd = open(ev, pid as i32, inherit, user_only)
                .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", ev.name())))?;
            c.fds.push((ev, fd)); // closed by Drop if a later one fails
                                  // SAFETY: PERF_EVENT_IOC_ENABLE on a perf fd we own takes no argument.
            if unsafe { libc::ioctl(fd, IOC_ENABLE as _, 0) } != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(c)
    }

    /// Current values, scaled for multiplexing (value × enabled / running); `None` for an event
    /// that never got a counter.
    pub fn read(&self) -> Vec<(Event, Option<u64>)> {
        self.fds
            .iter()
            .map(|&(ev, fd)| {
                let mut buf = [0u64; 3];
                // SAFETY: reading 24 bytes (value, time_enabled, time_running: our read_format)
                // into a 24-byte buffer we own, from a perf fd we own.
                let n = unsafe { libc::read(fd, buf.as_mut_ptr() as *mut libc::c_void, 24) };
                let v = (n == 24 && buf[2] > 0).then(|| {
                    if buf[1] == buf[2] {
                        buf[0]
                    } else {
                        (buf[0] as f64 * buf[1] as f64 / buf[2] as f64) as u64
                    }
                });
                (ev, v)
            })
            .collect()
    }
}

impl Drop for Counters {
    fn drop(&mut self) {
        for &(_, fd) in &self.fds {
            // SAFETY: each fd was opened by `open` and is closed exactly once here.
            unsafe { libc::close(fd) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn software_events_count_a_busy_child() {
        // Software events need no PMU; perf_event_paranoid may still forbid them to a user.
        let mut child = std::process::Command::new("sh")
            .args(["-c", "i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done"])
            .spawn()
            .unwrap();
        let c = match Counters::open(
            child.id(),
            &[Event::TaskClock, Event::ContextSwitches],
            true,
        ) {
            Ok(c) => c,
            Err(e) => {
                let _ = child.wait();
                return preheat_testsupport::skip!(
                    "perf",
                    "perf software events not permitted here: {e}"
                );
            }
        };
        std::thread::sleep(std::time::Duration::from_millis(30));
        let v = c.read();
        let _ = child.wait();
        assert_eq!(v[0].0, Event::TaskClock);
        assert!(v[0].1.unwrap_or(0) > 0, "{v:?}");
    }
}
