//! What the guest says on its serial console, and the host's reading of it.
//!
//! The guest's `/init` ([`INIT`]) runs on the console (`ttyS0`, QEMU's stdout): it announces
//! itself (`PREHEAT-GUEST up …`), runs the workload named on the kernel command line
//! (`preheat.args=`, comma-separated), whose `preheat-npb --json --progress-ms N` prints
//! `READY {…}`, then `PROGRESS {"t_ms":…,"phases":[…]}` every N ms of guest time, then its JSON
//! summary; `/init` ends with `PREHEAT-GUEST done status=S` and powers the guest off. Without a
//! workload the guest idles until it is stopped. Kernel messages may appear between those lines
//! (they are [`Event::Other`]).

use preheat_npb::Progress;

/// The guest's `/init`, a busybox shell script.
pub const INIT: &str = r#"#!/bin/busybox sh
# preheat guest: mount, announce, run the workload named on the kernel command line, power off.
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null
args=
for w in $(cat /proc/cmdline); do
  case "$w" in preheat.args=*) args=${w#preheat.args=} ;; esac
done
echo "PREHEAT-GUEST up uptime_s=$(cut -d' ' -f1 /proc/uptime) cpus=$(grep -c ^processor /proc/cpuinfo)"
if [ -n "$args" ]; then
  IFS=,
  set -- $args
  unset IFS
  /bin/preheat-npb "$@"
  echo "PREHEAT-GUEST done status=$?"
  poweroff -f
fi
echo "PREHEAT-GUEST idle"
while :; do sleep 3600; done
"#;

/// The tag of `/init`'s own lines.
const TAG: &str = "PREHEAT-GUEST ";

/// One console line, read.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// User space is up: the guest's uptime then (seconds, its own clock) and its CPU count.
    Up { uptime_s: f64, cpus: u32 },
    /// The workload's threads exist (`preheat-npb`'s READY announcement).
    Ready(serde_json::Value),
    /// Barrier phases so far, per instance (guest clock).
    Progress(Progress),
    /// The workload's JSON summary (its last line).
    Summary(serde_json::Value),
    /// The workload ended with this exit status; the guest powers off next.
    Done { status: i32 },
    /// Anything else (kernel messages, errors of the workload).
    Other(String),
}

/// Read one console line (a trailing `\r` of the serial line discipline is ignored).
pub fn parse_line(line: &str) -> Event {
    let line = line.trim_end_matches(['\r', '\n']);
    let other = || Event::Other(line.to_string());
    if let Some(rest) = line.strip_prefix(TAG) {
        let field = |k: &str| {
            rest.split_whitespace()
                .find_map(|w| w.strip_prefix(k)?.strip_prefix('='))
        };
        if rest.starts_with("up ") {
            let uptime_s = field("uptime_s").and_then(|v| v.parse().ok());
            let cpus = field("cpus").and_then(|v| v.parse().ok());
            return match (uptime_s, cpus) {
                (Some(uptime_s), Some(cpus)) => Event::Up { uptime_s, cpus },
                _ => other(),
            };
        }
        if rest.starts_with("done ") {
            return field("status")
                .and_then(|v| v.parse().ok())
                .map_or_else(other, |status| Event::Done { status });
        }
        return other();
    }
    if let Some(json) = line.strip_prefix("READY ") {
        return serde_json::from_str(json).map_or_else(|_| other(), Event::Ready);
    }
    if let Some(json) = line.strip_prefix("PROGRESS ") {
        return serde_json::from_str(json).map_or_else(|_| other(), Event::Progress);
    }
    if line.starts_with('{') {
        if let Ok(v) = serde_json::from_str::<serde_json::Value>(line) {
            if v.get("kernel").is_some() && v.get("iterations").is_some() {
                return Event::Summary(v);
            }
        }
    }
    other()
}

/// Phases per second of guest time between two progress reports, per instance (`None` when
/// the second is not later or the instance counts differ).
pub fn phase_rates(from: &Progress, to: &Progress) -> Option<Vec<f64>> {
    let dt = to.t_ms.checked_sub(from.t_ms).filter(|d| *d > 0)? as f64 / 1e3;
    (from.phases.len() == to.phases.len()).then(|| {
        from.phases
            .iter()
            .zip(&to.phases)
            .map(|(a, b)| b.saturating_sub(*a) as f64 / dt)
            .collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_init_and_workload_lines() {
        assert_eq!(
            parse_line("PREHEAT-GUEST up uptime_s=3.21 cpus=2\r"),
            Event::Up {
                uptime_s: 3.21,
                cpus: 2
            }
        );
        assert_eq!(
            parse_line("PREHEAT-GUEST done status=0"),
            Event::Done { status: 0 }
        );
        assert_eq!(
            parse_line(r#"PROGRESS {"t_ms":1000,"phases":[665]}"#),
            Event::Progress(Progress {
                t_ms: 1000,
                phases: vec![665]
            })
        );
        assert!(matches!(
            parse_line(r#"READY {"pid":1,"threads":[]}"#),
            Event::Ready(_)
        ));
        assert!(matches!(
            parse_line(r#"{"kernel":"mg","iterations":5,"wall_s":1.0}"#),
            Event::Summary(_)
        ));
    }

    #[test]
    fn anything_else_is_other() {
        for l in [
            "[    3.123] random: crng init done",
            "PREHEAT-GUEST up uptime_s=x cpus=2",
            "PROGRESS {not json",
            "{\"a\":1}",
            "",
        ] {
            assert_eq!(parse_line(l), Event::Other(l.to_string()), "{l}");
        }
    }

    #[test]
    fn rates_per_instance_over_guest_time() {
        let a = Progress {
            t_ms: 1000,
            phases: vec![100, 10],
        };
        let b = Progress {
            t_ms: 3000,
            phases: vec![1500, 10],
        };
        assert_eq!(phase_rates(&a, &b), Some(vec![700.0, 0.0]));
        assert_eq!(phase_rates(&b, &a), None);
        assert_eq!(phase_rates(&a, &a), None);
    }

    #[test]
    fn init_reads_the_args_it_is_given() {
        assert!(INIT.contains("preheat.args="));
        assert!(INIT.contains("/bin/preheat-npb \"$@\""));
    }
}
