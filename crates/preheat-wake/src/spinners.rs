//! The `spin` mechanism for callers without a planner daemon (the demo's hot floor): one thread
//! per CPU, pinned to it and `SCHED_IDLE`, that spins while held and sleeps on a futex
//! otherwise. Being `SCHED_IDLE`, it runs only where the CPU would otherwise idle: any real
//! thread woken there preempts it at once, and the CPU never enters the idle loop (where, without
//! a cpuidle driver, it would halt whatever PM QoS says). Changes no machine state; the threads
//! end when the value is dropped.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use preheat_engine::os;

struct Shared {
    /// 1 while the CPUs are held (the futex word the idle threads wait on).
    held: AtomicU32,
    stop: AtomicBool,
}

/// `SCHED_IDLE` spinners on a set of CPUs.
pub struct Spinners {
    sh: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

impl Spinners {
    /// Start one spinner per CPU of `cpus` (idle until [`Spinners::hold`]).
    pub fn start(cpus: &[u32]) -> std::io::Result<Spinners> {
        let sh = Arc::new(Shared {
            held: AtomicU32::new(0),
            stop: AtomicBool::new(false),
        });
        let mut s = Spinners {
            sh: sh.clone(),
            threads: Vec::new(),
        };
        for &cpu in cpus {
            let sh = sh.clone();
            // On failure, `s` is dropped here and stops the threads already started.
            s.threads.push(
                std::thread::Builder::new()
                    .name(format!("preheat-spin{cpu}"))
                    .spawn(move || spin(&sh, cpu as usize))?,
            );
        }
        Ok(s)
    }

    /// Spin on every CPU from now on.
    pub fn hold(&self) {
        self.sh.held.store(1, Ordering::Release);
        os::futex_wake(&self.sh.held, i32::MAX);
    }

    /// Stop spinning (the threads go back to sleep).
    pub fn release(&self) {
        self.sh.held.store(0, Ordering::Release);
    }
}

impl Drop for Spinners {
    fn drop(&mut self) {
        self.sh.stop.store(true, Ordering::Release);
        self.hold();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn spin(sh: &Shared, cpu: usize) {
    // Pinned and SCHED_IDLE before the first spin; a thread that cannot be either does not spin
    // (it would compete with the server), it only waits for the end.
    let ok = os::pin_current_thread(cpu).is_ok() && os::set_sched_idle(true).is_ok();
    while !sh.stop.load(Ordering::Acquire) {
        if !ok || sh.held.load(Ordering::Acquire) == 0 {
            os::futex_wait(&sh.held, 0, Some(100_000_000));
            if !ok {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            continue;
        }
        std::hint::spin_loop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spinners_start_hold_release_and_stop() {
        let s = Spinners::start(&[0]).unwrap();
        s.hold();
        std::thread::sleep(std::time::Duration::from_millis(5));
        s.release();
        drop(s); // joins: the test hangs here if a thread does not stop.
    }
}
