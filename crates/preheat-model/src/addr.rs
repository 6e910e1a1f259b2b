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

/// `[start, end)` minus every range of `cut`, each widened to whole pages of `page` bytes.
pub fn subtract_ranges(start: u64, end: u64, cut: &[(u64, u64)], page: u64) -> Vec<(u64, u64)> {
    let mut pieces = vec![(start, end)];
    for &(cs, ce) in cut {
        let (cs, ce) = (cs & !(page - 1), ce.div_ceil(page) * page);
        pieces = pieces
            .into_iter()
            .flat_map(|(s, e)| {
                if ce <= s || cs >= e {
                    return vec![(s, e)];
                }
                let mut v = Vec::with_capacity(2);
                if s < cs {
                    v.push((s, cs));
                }
                if ce < e {
                    v.push((ce, e));
                }
                v
            })
            .collect();
    }
    pieces
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subtract_cuts_whole_pages_and_keeps_the_rest() {
        let p = 0x1000;
        assert_eq!(
            subtract_ranges(0x10000, 0x20000, &[], p),
            vec![(0x10000, 0x20000)]
        );
        // A cut in the middle, not page-aligned: widened outward.
        assert_eq!(
            subtract_ranges(0x10000, 0x20000, &[(0x14010, 0x15001)], p),
            vec![(0x10000, 0x14000), (0x16000, 0x20000)]
        );
        // A cut covering one end, one outside, one covering everything.
        assert_eq!(
            subtract_ranges(
                0x10000,
                0x20000,
                &[(0x1c000, 0x30000), (0x40000, 0x41000)],
                p
            ),
            vec![(0x10000, 0x1c000)]
        );
        assert!(subtract_ranges(0x10000, 0x20000, &[(0x0, 0x20000)], p).is_empty());
    }
}
