//! Eviction sweep: emulate the cache loss of a deep sleep by reading a large buffer.

pub struct EvictionBuffer {
    _private: (),
}

impl EvictionBuffer {
    /// Allocate and touch `bytes` (default use: 128 MiB).
    pub fn new(bytes: usize) -> EvictionBuffer {
        let _ = bytes;
        unimplemented!()
    }
    /// Read one word per line of the whole buffer; returns elapsed ns.
    pub fn sweep(&self) -> u64 {
        unimplemented!()
    }
}
