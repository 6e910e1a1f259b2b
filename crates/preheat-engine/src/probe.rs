//! Flush+reload working-set probe (our user-space stand-in for the paper's cache tag dump).
use preheat_model::proto::Range;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Calibration {
    pub hit_ticks_p50: u32,
    pub miss_ticks_p50: u32,
    /// Ticks below which a reload counts as a cache hit.
    pub threshold: u32,
    pub samples: u32,
}

/// Measure reload time of cached vs flushed lines in this process and derive a threshold.
pub fn calibrate(samples: u32) -> Calibration {
    let _ = samples;
    unimplemented!()
}

/// Flush every line of `ranges` (must be mapped).
pub fn flush(ranges: &[Range]) {
    let _ = ranges;
    unimplemented!()
}

/// Time a one-byte load of every line of `ranges` in random order within windows of
/// `window_pages` pages, clflush after each probe; push the addresses of lines that loaded in
/// fewer than `threshold` ticks into `hits`. Returns the number of lines probed.
pub fn reload(ranges: &[Range], threshold: u32, window_pages: u32, seed: u64, hits: &mut Vec<u64>) -> u64 {
    let _ = (ranges, threshold, window_pages, seed, hits);
    unimplemented!()
}
