//! The controller: exact quanta on a stock kernel.
//!
//! Linux decides its own timeslices, so the paper's 2, 10 and 200 ms quanta are enforced here:
//!
//! * **Interleaving (Section 2)**, mechanism `fifo-priority-swap`: the main workload runs at
//!   `SCHED_FIFO` 2 and the base vector at 1 on the same CPU, so the main workload runs and the
//!   vector waits. For the vector's quantum the controller raises the vector to 3 (it preempts
//!   the main workload at once) and lowers it back to 1 at the quantum's end. Only the vector's
//!   single thread ever changes, so a main program may have any number of threads and children
//!   (they inherit its class and CPU). With `--preheat`, the main workload's warm thread (FIFO 4)
//!   is woken as the vector is lowered and loads the working set before the main thread resumes.
//!   Without real-time permission, mechanism `sigstop-sigcont`: both in the normal class, the
//!   one off-quantum stopped with SIGSTOP (the main program's whole process group).
//! * **Moving (Section 3)**: every quantum each main copy moves to the next CPU of the rotation
//!   (`sched_setaffinity` of its threads); with `--preheat` the copy's warm thread is first
//!   moved to the destination and woken (FIFO 4: it runs there before the copy does).
//!
//! The controller sleeps until shortly before each switch and spins the rest (a halted vCPU here
//! takes 20–90 µs to wake), at `SCHED_FIFO` 10 on a CPU other than the main one when there is
//! one. The quanta achieved are measured by the workers themselves (their run intervals).

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use preheat_engine::sched::{self, ThreadSched};

/// How the controller alternates the main workload and the vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mechanism {
    FifoSwap,
    Signals,
}

impl Mechanism {
    pub fn name(self) -> &'static str {
        match self {
            Mechanism::FifoSwap => "fifo-priority-swap",
            Mechanism::Signals => "sigstop-sigcont",
        }
    }

    /// The best mechanism this process may use, and why if it is the fallback.
    pub fn best() -> (Mechanism, Option<String>) {
        match sched::realtime_permitted() {
            Ok(()) => (Mechanism::FifoSwap, None),
            Err(e) => (
                Mechanism::Signals,
                Some(format!(
                    "no permission for real-time scheduling ({e}; needs CAP_SYS_NICE or an \
                     RLIMIT_RTPRIO): quanta are enforced with SIGSTOP/SIGCONT instead, which \
                     takes longer per switch; --preheat needs real-time scheduling"
                )),
            ),
        }
    }
}

/// Priorities (SCHED_FIFO) of the parts of an interleaved run.
pub const PRIO_VECTOR_WAIT: i32 = 1;
pub const PRIO_MAIN: i32 = 2;
pub const PRIO_VECTOR_RUN: i32 = 3;
pub const PRIO_WARM: i32 = 4;
pub const PRIO_CONTROLLER: i32 = 10;

/// Spin this long before each switch instead of sleeping through it.
const SPIN: Duration = Duration::from_micros(250);

/// Sleep until `t` (sleep most of the way, spin the rest).
pub fn wait_until(t: Instant) {
    let now = Instant::now();
    if t > now + SPIN {
        std::thread::sleep(t - now - SPIN);
    }
    while Instant::now() < t {
        std::hint::spin_loop();
    }
}

/// Make the calling thread the controller: pinned to `cpu`, SCHED_FIFO 10 when permitted.
/// Returns what to restore with [`restore_self`].
pub fn become_controller(cpu: usize, fifo: bool) -> Result<(Vec<usize>, ThreadSched)> {
    let saved = (
        preheat_engine::os::get_affinity(),
        sched::thread_sched(0).unwrap_or(ThreadSched::NORMAL),
    );
    preheat_engine::os::pin_current_thread(cpu)
        .with_context(|| format!("pinning the controller to CPU {cpu}"))?;
    if fifo {
        sched::set_thread_sched(0, ThreadSched::fifo(PRIO_CONTROLLER))
            .context("controller priority")?;
    }
    Ok(saved)
}

/// Undo [`become_controller`].
pub fn restore_self(saved: &(Vec<usize>, ThreadSched)) {
    let _ = sched::set_thread_sched(0, saved.1);
    let _ = preheat_engine::os::set_affinity(&saved.0);
}

/// One side of an interleaving: how to let it run and how to hold it.
pub trait Side {
    /// Let it run.
    fn run(&mut self) -> Result<()>;
    /// Hold it.
    fn hold(&mut self) -> Result<()>;
}

/// The vector under `fifo-priority-swap`: run = FIFO 3, hold = FIFO 1.
pub struct FifoVector(pub u32);

impl Side for FifoVector {
    fn run(&mut self) -> Result<()> {
        set(self.0, ThreadSched::fifo(PRIO_VECTOR_RUN))
    }
    fn hold(&mut self) -> Result<()> {
        set(self.0, ThreadSched::fifo(PRIO_VECTOR_WAIT))
    }
}

/// A process group under `sigstop-sigcont`.
pub struct Stoppable(pub u32);

impl Side for Stoppable {
    fn run(&mut self) -> Result<()> {
        preheat_engine::os::send_signal(self.0, libc::SIGCONT, true).context("SIGCONT")
    }
    fn hold(&mut self) -> Result<()> {
        preheat_engine::os::send_signal(self.0, libc::SIGSTOP, true).context("SIGSTOP")
    }
}

fn set(tid: u32, s: ThreadSched) -> Result<()> {
    match sched::set_thread_sched(tid, s) {
        Err(e) if sched::is_gone(&e) => Ok(()),
        r => r.with_context(|| format!("setting thread {tid} to {}", s.name())),
    }
}

/// What the controller measured about itself.
#[derive(Debug, Clone, Default)]
pub struct ControllerStats {
    pub switches: u64,
    /// How late each switch was issued after its planned time, µs.
    pub late_us: Vec<f64>,
}

/// Interleave: the main workload runs `q`, the vector runs `q`, … until `done()` says the main
/// workload has finished. `main` is `None` under `fifo-priority-swap` (the main workload is never
/// touched); `before_main` runs just before the main workload resumes (the preheat trigger).
pub fn interleave(
    q: Duration,
    vector: &mut dyn Side,
    mut main: Option<&mut dyn Side>,
    mut before_main: impl FnMut() -> Result<()>,
    mut done: impl FnMut() -> Result<bool>,
) -> Result<ControllerStats> {
    let mut st = ControllerStats::default();
    let start = Instant::now();
    let mut k: u32 = 0;
    loop {
        // Main quantum [2k q, (2k+1) q), vector quantum [(2k+1) q, (2k+2) q).
        let t_vec = start + q * (2 * k + 1);
        wait_until(t_vec);
        if done()? {
            break;
        }
        st.late_us
            .push(Instant::now().duration_since(t_vec).as_secs_f64() * 1e6);
        if let Some(m) = main.as_deref_mut() {
            m.hold()?;
        }
        vector.run()?;
        let t_main = start + q * (2 * k + 2);
        wait_until(t_main);
        st.late_us
            .push(Instant::now().duration_since(t_main).as_secs_f64() * 1e6);
        before_main()?;
        vector.hold()?;
        if let Some(m) = main.as_deref_mut() {
            m.run()?;
        }
        st.switches += 2;
        k += 1;
        if done()? {
            break;
        }
    }
    Ok(st)
}
