//! Clocks.

/// CLOCK_MONOTONIC in nanoseconds (the time base of announcements).
pub fn now_ns() -> u64 {
    unimplemented!()
}

/// Read the time-stamp counter (serialising enough for probe timing: `rdtscp` + `lfence`).
pub fn rdtscp() -> u64 {
    unimplemented!()
}

/// TSC ticks per nanosecond, measured against CLOCK_MONOTONIC over `ms` milliseconds.
pub fn calibrate_tsc(ms: u64) -> f64 {
    let _ = ms;
    unimplemented!()
}
