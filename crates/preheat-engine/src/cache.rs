//! Cache-line primitives.

/// CPU features relevant to preheating, from CPUID.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuFeatures {
    pub clflush: bool,
    pub clflushopt: bool,
    pub rdtscp: bool,
    pub invariant_tsc: bool,
    /// Line size reported by CPUID (64 on every supported CPU).
    pub line_size: u32,
}

pub fn features() -> CpuFeatures {
    unimplemented!()
}

/// Flush the line containing `addr` from every cache level (clflushopt where available, else
/// clflush). The address must be mapped and readable (flush of an unmapped address faults).
pub fn flush_line(addr: usize) {
    let _ = addr;
    unimplemented!()
}

/// Flush every line of `[start, start + len)`, then fence.
pub fn flush_range(start: usize, len: usize) {
    let _ = (start, len);
    unimplemented!()
}

/// prefetcht0 the line at `addr`. Never faults, even for unmapped addresses.
pub fn prefetch_line(addr: usize) {
    let _ = addr;
    unimplemented!()
}

/// Store fence + load fence.
pub fn fence() {
    unimplemented!()
}
