//! Strong address types (in the spirit of ChampSim's address classes): an absolute virtual
//! address and a region-relative line index are different types.

use serde::{Deserialize, Serialize};

/// Cache-line size in bytes on every CPU preheat supports (x86-64, AArch64 server cores).
pub const LINE_SIZE: u64 = 64;

/// An absolute virtual address in one process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct VirtAddr(pub u64);

impl VirtAddr {
    /// The address of the cache line containing this address.
    pub fn line_base(self) -> VirtAddr {
        VirtAddr(self.0 & !(LINE_SIZE - 1))
    }
    /// Line number (address / 64).
    pub fn line_number(self) -> u64 {
        self.0 / LINE_SIZE
    }
    /// The address `bytes` further on (wrapping: an address is a number here, not a pointer
    /// into an object).
    pub const fn offset(self, bytes: u64) -> VirtAddr {
        VirtAddr(self.0.wrapping_add(bytes))
    }
    /// The address a pointer points to. Taking an address is safe; what may be done *at* that
    /// address is the business of whoever dereferences it (the engine's `unsafe fn`s say so).
    pub fn from_ptr<T>(p: *const T) -> VirtAddr {
        VirtAddr(p as usize as u64)
    }
    /// This address as a byte pointer (creating one is safe; dereferencing is not).
    pub fn as_ptr(self) -> *const u8 {
        self.0 as usize as *const u8
    }
}

/// A cache line named relative to a region of a [`crate::region::RegionTable`]: the region's index
/// and the line's index inside the region (for file-backed regions: file offset / 64; for
/// anonymous regions: offset from the mapping start / 64).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct RegionLine {
    pub region: u32,
    pub line: u64,
}
