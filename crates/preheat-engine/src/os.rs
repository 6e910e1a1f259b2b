//! Threads and scheduling.

/// Pin the calling thread to `cpu`.
pub fn pin_current_thread(cpu: usize) -> std::io::Result<()> {
    let _ = cpu;
    unimplemented!()
}

/// The CPU the calling thread runs on (sched_getcpu / rdtscp aux).
pub fn current_cpu() -> u32 {
    unimplemented!()
}

pub fn gettid() -> u32 {
    unimplemented!()
}

/// Switch the calling thread to SCHED_IDLE (any normal task preempts it at once) or back to
/// SCHED_OTHER.
pub fn set_sched_idle(idle: bool) -> std::io::Result<()> {
    let _ = idle;
    unimplemented!()
}

/// Number of online CPUs.
pub fn online_cpus() -> usize {
    unimplemented!()
}
