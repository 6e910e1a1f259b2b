//! CPU and cache topology from sysfs.

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheInfo {
    pub level: u32,
    /// "Data", "Instruction" or "Unified".
    pub kind: String,
    pub size_bytes: u64,
    pub line_size: u32,
    pub shared_cpus: Vec<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuInfo {
    pub cpu: u32,
    pub core_id: u32,
    pub package_id: u32,
    pub caches: Vec<CacheInfo>,
    /// cpuidle state names, e.g. ["POLL", "halt"].
    pub idle_states: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    pub cpus: Vec<CpuInfo>,
    /// e.g. "haltpoll", "intel_idle", "acpi_idle", or None.
    pub cpuidle_driver: Option<String>,
    pub cpuidle_governor: Option<String>,
}

pub fn read() -> Topology {
    unimplemented!()
}
