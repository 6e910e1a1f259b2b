//! What the probe may touch: candidate ranges (the process's resident, readable memory minus
//! the agent's own) and the validation of requested ranges against the mappings as they are
//! now.

use preheat_engine::maps;
use preheat_model::addr::subtract_ranges;
use preheat_model::proto::{Range, Reply};
use preheat_model::Mapping;

use crate::log::log;
use crate::threads;

/// Probe candidates are capped at this many bytes.
pub const CANDIDATE_CAP: u64 = 256 << 20;
/// Mappings the probe may touch: readable, not special, not device memory.
fn probe_safe(m: &Mapping) -> bool {
    if m.is_special() || !m.read {
        return false;
    }
    let n = m.name.as_str();
    !(n.starts_with("/dev/") && !n.starts_with("/dev/shm/") && !n.starts_with("/dev/zero"))
}

/// Clip `ranges` to what is mapped, readable and resident now (`/proc/self/maps` and mincore):
/// flushing or loading an unmapped address would SIGSEGV the host, a page past the end of a
/// truncated file SIGBUS.
pub(super) fn validate_ranges(ranges: &[Range]) -> Result<Vec<Range>, String> {
    let text = std::fs::read_to_string("/proc/self/maps")
        .map_err(|e| format!("cannot read /proc/self/maps: {e}"))?;
    let mut maps = maps::parse_maps(&text);
    maps.sort_by_key(|m| m.start);
    let mut out = Vec::new();
    for r in ranges {
        let (lo, hi) = (r.start, r.start.saturating_add(r.len));
        let first = maps.partition_point(|m| m.end <= lo);
        for m in maps.iter().skip(first) {
            if m.start >= hi {
                break;
            }
            if !probe_safe(m) {
                continue;
            }
            let (a, b) = (lo.max(m.start), hi.min(m.end));
            if a < b {
                for (s, l) in maps::resident_ranges(a, b - a) {
                    out.push(Range { start: s, len: l });
                }
            }
        }
    }
    Ok(out)
}

/// Resident ranges of the process's usable mappings minus the agent's own memory (its image
/// and its threads' stacks, cut out exactly: see [`threads::own_memory`]), capped at
/// [`CANDIDATE_CAP`].
pub(super) fn candidates() -> Result<Reply, String> {
    let maps = maps::read_maps(None).map_err(|e| format!("cannot read /proc/self/maps: {e}"))?;
    let own = threads::own_memory();
    let page = preheat_engine::sweep::page_size() as u64;
    let mut ranges = Vec::new();
    let mut total = 0u64;
    let mut capped = false;
    'maps: for m in maps.iter().filter(|m| probe_safe(m)) {
        for (s, l) in maps::resident_ranges(m.start, m.len()) {
            for (a, b) in subtract_ranges(s, s + l, &own, page) {
                let l = (b - a).min(CANDIDATE_CAP - total);
                if l == 0 {
                    capped = true;
                    break 'maps;
                }
                ranges.push(Range { start: a, len: l });
                total += l;
            }
        }
    }
    if capped || total >= CANDIDATE_CAP {
        log(&format!(
            "candidates capped at {} MiB (the process has more resident memory)",
            CANDIDATE_CAP >> 20
        ));
    }
    Ok(Reply::Candidates {
        ranges,
        total_bytes: total,
    })
}
