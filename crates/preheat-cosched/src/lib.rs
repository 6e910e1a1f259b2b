//! A user-space coscheduler for stock Linux.
//!
//! Busse et al. (*Partial Coscheduling of Virtual Machines Based on Memory Access Patterns*,
//! SAC'15, §2.1) used Schönherr's coscheduling kernel (Linux 3.8, never merged): groups of tasks
//! in a cgroup run at the same time on different CPUs. On a stock kernel without sched_ext we
//! enforce the same guarantee from user space:
//!
//! * **Slices.** The host runs in slices of a fixed length (default 10 ms). Before each slice
//!   the shared planner ([`preheat_cosim::plan::Planner`]: least attained service first, sets
//!   packed first-fit onto the free CPUs) chooses the sets to run and places each member on a CPU.
//! * **Enforcement by real-time priority** ([`control`]): every managed thread is `SCHED_FIFO`.
//!   A thread chosen for the slice gets the high priority and is pinned to its CPU; every other
//!   managed thread gets the low priority and is parked on a CPU that runs a chosen thread, so it
//!   cannot run while that thread is runnable. A CPU the plan leaves idle has no managed thread
//!   on it at all (that is the waste full coscheduling causes).
//! * **Readiness** ([`ready`]): at every slice decision each managed thread's state is read from
//!   its stat line (`R` runnable; a halted QEMU vCPU sleeps). A set none of whose members is
//!   runnable is skipped (the planner falls through to the next set), and unchosen threads park
//!   only behind a chosen thread that is runnable, so a CPU whose chosen vCPU is halted idles
//!   instead of running another VM's vCPU (strict coscheduling). A chosen thread that halts
//!   *during* a slice still lets what is parked behind it run until the next decision (leak). The controller thread itself runs
//!   at a higher real-time priority and sleeps between slices. Measured alternatives and why we
//!   chose this: the cgroup-v1 freezer needs ~130 µs per freeze and the controller must poll
//!   `freezer.state`; SIGSTOP acts on whole processes; `sched_rr_timeslice_ms` rounds to jiffies
//!   (HZ = 250, so 2 ms becomes 4 ms). Priority rotation kept pairs co-running 99% of the time
//!   (`../shared/notes/measured-here.md`).
//! * **Measurement** ([`measure`]): the co-run fraction of every set from each member's
//!   `/proc/PID/task/TID/schedstat` read at every slice boundary (an estimate with bounds: in one
//!   slice, members that ran d₁…dₙ ns overlapped at most min dᵢ and at least Σdᵢ − (n−1)·L), the
//!   run time of threads that were *not* chosen (leak), and each CPU's idle share from
//!   `/proc/stat`; where the controller's own time per slice goes, stage by stage and call by
//!   call ([`cost`]).
//! * **Restore** ([`journal`]): before the first change, every managed thread's class, priority
//!   and affinity is written to a journal; a clean exit restores and removes it; a watchdog
//!   process restores it if the controller dies (also SIGKILL); the next start restores a journal
//!   left behind. Real-time classes are set with reset-on-fork, so forked children are normal.
//!
//! Where we deliberately differ from the paper: the kernel coscheduler places sets with the
//! usual Linux balancing and lets unmanaged tasks mix freely; ours plans whole slices centrally,
//! and unmanaged (CFS) tasks get only what real-time throttling leaves them while managed threads
//! spin (5% per CPU on this kernel, via the fair server).
#![forbid(unsafe_code)]

pub mod control;
pub mod cost;
pub mod journal;
pub mod measure;
pub mod ready;
pub mod thread;
