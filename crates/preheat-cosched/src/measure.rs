//! What the coscheduler measures: per slice, how long each managed thread ran (schedstat deltas),
//! from which the co-run fraction of every set and the leak (run time of threads that were not
//! chosen) follow; over the run, each CPU's idle share (`/proc/stat`).
//!
//! The co-run fraction of a set is the share of its members' scheduled time in which all of
//! them ran at the same time. Schedstat gives each member's run time dᵢ in a window of length
//! L, not when in the window it ran, so per window the overlap of n members is bounded:
//! at most min dᵢ, at least max(0, Σdᵢ − (n−1)·L). We report Σ min / Σ max over the run (the
//! estimate, an upper bound) and Σ lower / Σ max (a lower bound). Windows are the controller's
//! slices (or, under `none`, the same period); a set of one thread is not counted.

use serde::Serialize;

/// Per-set accumulators.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SetCorun {
    /// The set's vCPUs.
    pub members: Vec<usize>,
    /// Σ over windows of min dᵢ (ns).
    pub min_ns: u64,
    /// Σ over windows of max dᵢ (ns).
    pub max_ns: u64,
    /// Σ over windows of max(0, Σdᵢ − (n−1)L) (ns).
    pub lower_ns: u64,
    /// Windows in which at least one member ran.
    pub windows: u64,
}

impl SetCorun {
    /// Account one window of length `len_ns` in which the members ran `d` ns each.
    pub fn add(&mut self, d: &[u64], len_ns: u64) {
        if d.len() < 2 {
            return;
        }
        let max = d.iter().copied().max().unwrap_or(0);
        if max == 0 {
            return;
        }
        let min = d.iter().copied().min().unwrap_or(0);
        let sum: u64 = d.iter().sum();
        let slack = (d.len() as u64 - 1) * len_ns;
        self.min_ns += min;
        self.max_ns += max;
        self.lower_ns += sum.saturating_sub(slack);
        self.windows += 1;
    }

    /// (estimate, lower bound); `None` if no member ever ran.
    pub fn fraction(&self) -> Option<(f64, f64)> {
        (self.max_ns > 0).then(|| {
            (
                self.min_ns as f64 / self.max_ns as f64,
                (self.lower_ns as f64 / self.max_ns as f64).min(1.0),
            )
        })
    }
}

/// Co-run fraction over several sets: (Σ min / Σ max, Σ lower / Σ max); `None` if empty.
pub fn overall(sets: &[SetCorun]) -> Option<(f64, f64)> {
    let max: u64 = sets.iter().map(|s| s.max_ns).sum();
    (max > 0).then(|| {
        let min: u64 = sets.iter().map(|s| s.min_ns).sum();
        let lower: u64 = sets.iter().map(|s| s.lower_ns).sum();
        (
            min as f64 / max as f64,
            (lower as f64 / max as f64).min(1.0),
        )
    })
}

/// Busy and idle jiffies of some CPUs, from `/proc/stat`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuTimes {
    pub idle: u64,
    pub total: u64,
}

/// The idle (idle + iowait) and total jiffies of `cpus`, summed.
pub fn cpu_times(cpus: &[usize]) -> CpuTimes {
    let text = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    parse_cpu_times(&text, cpus)
}

fn parse_cpu_times(text: &str, cpus: &[usize]) -> CpuTimes {
    let stat = preheat_engine::procstat::parse(text);
    let mut t = CpuTimes::default();
    for (n, c) in &stat.cpus {
        if cpus.contains(&(*n as usize)) {
            t.idle += c.idle_all();
            t.total += c.total();
        }
    }
    t
}

/// The idle share between two readings (`None` if no time passed).
pub fn idle_share(a: CpuTimes, b: CpuTimes) -> Option<f64> {
    let total = b.total.checked_sub(a.total)?;
    (total > 0).then(|| b.idle.saturating_sub(a.idle) as f64 / total as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_of_one_window() {
        let mut s = SetCorun::default();
        // Two members each ran the whole 10 ms window: fully together.
        s.add(&[10, 10], 10);
        assert_eq!(s.fraction(), Some((1.0, 1.0)));
        // One ran 10, the other 0: never together.
        let mut s = SetCorun::default();
        s.add(&[10, 0], 10);
        assert_eq!(s.fraction(), Some((0.0, 0.0)));
        // Each ran half: overlap between 0 and 5.
        let mut s = SetCorun::default();
        s.add(&[5, 5], 10);
        assert_eq!(s.fraction(), Some((1.0, 0.0)));
        // Singletons and empty windows are not counted.
        let mut s = SetCorun::default();
        s.add(&[7], 10);
        s.add(&[0, 0], 10);
        assert_eq!(s.fraction(), None);
        assert_eq!(overall(&[s]), None);
    }

    #[test]
    fn proc_stat_parsing() {
        let text = "cpu  1 2 3 4 5 6 7 8 9 10\ncpu0 10 0 10 70 10 0 0 0 0 0\ncpu1 50 0 50 0 0 0 0 0 0 0\nintr 5\n";
        assert_eq!(
            parse_cpu_times(text, &[0]),
            CpuTimes {
                idle: 80,
                total: 100
            }
        );
        assert_eq!(
            parse_cpu_times(text, &[0, 1]),
            CpuTimes {
                idle: 80,
                total: 200
            }
        );
        let a = CpuTimes {
            idle: 10,
            total: 100,
        };
        let b = CpuTimes {
            idle: 60,
            total: 200,
        };
        assert_eq!(idle_share(a, b), Some(0.5));
        assert_eq!(idle_share(b, b), None);
    }
}
