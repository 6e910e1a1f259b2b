//! Log lines on stderr, one per notable event, rate-limited per kind of event so a flood of
//! bad datagrams or late announcements cannot flood the log.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// At most this many lines of one kind per [`WINDOW`].
pub const LINES_PER_WINDOW: u32 = 5;
pub const WINDOW: Duration = Duration::from_secs(10);

/// Per-kind state: window start, lines printed in it, lines suppressed in it.
struct Kind {
    start: Instant,
    printed: u32,
    suppressed: u64,
}

static KINDS: Mutex<BTreeMap<&'static str, Kind>> = Mutex::new(BTreeMap::new());

/// Print `preheatd: <msg>` unconditionally (start-up, shutdown, fatal errors).
pub fn log(msg: &str) {
    eprintln!("preheatd: {msg}");
}

/// Print the message of kind `kind` unless [`LINES_PER_WINDOW`] lines of that kind were
/// printed in the current [`WINDOW`]; when a new window starts, first say how many were
/// suppressed. `msg` is only formatted when printed. Returns whether it printed.
pub fn log_limited(kind: &'static str, msg: impl FnOnce() -> String) -> bool {
    let now = Instant::now();
    let mut kinds = KINDS.lock().unwrap_or_else(|p| p.into_inner());
    let k = kinds.entry(kind).or_insert(Kind {
        start: now,
        printed: 0,
        suppressed: 0,
    });
    if now.duration_since(k.start) >= WINDOW {
        if k.suppressed > 0 {
            eprintln!(
                "preheatd: ({} more '{kind}' messages suppressed in the last {} s)",
                k.suppressed,
                now.duration_since(k.start).as_secs()
            );
        }
        *k = Kind {
            start: now,
            printed: 0,
            suppressed: 0,
        };
    }
    if k.printed >= LINES_PER_WINDOW {
        k.suppressed += 1;
        return false;
    }
    k.printed += 1;
    drop(kinds);
    log(&msg());
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_per_kind() {
        let printed = (0..20)
            .filter(|i| log_limited("test-kind-a", || format!("line {i}")))
            .count();
        assert_eq!(printed, LINES_PER_WINDOW as usize);
        // Another kind has its own budget.
        assert!(log_limited("test-kind-b", || "other".into()));
    }
}
