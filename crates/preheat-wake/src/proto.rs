//! The daemon's socket protocol: JSON lines over the Unix stream socket `<run dir>/wake.sock`.
//!
//! Requests (one JSON object per line; each gets exactly one reply line):
//!
//! | line | reply |
//! |---|---|
//! | `{"requester":"ssd","cpus":[1],"start_ns":T,"duration_ns":D}` (or with `"cmd":"request"`) | [`AcceptedReply`] or `{"ok":false,"error":"…"}` |
//! | `{"cmd":"cancel","id":N}` | `{"ok":true}` or an error (only this connection's windows that have not started) |
//! | `{"cmd":"status"}` | `{"ok":true,"status":`[`Status`]`}` |
//!
//! Times are `CLOCK_MONOTONIC` nanoseconds of the daemon's host. Windows belong to the
//! connection that asked for them: when it closes, its windows that have not started yet are
//! cancelled; running windows end on their own at their end time.

use crate::keep_awake::{Armed, Mechanism};
use crate::plan::{Interval, Reject, WakeRequest};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Name of the daemon's socket in the run directory.
pub const SOCKET_NAME: &str = "wake.sock";
/// Longest request line accepted.
pub const MAX_LINE: usize = 64 * 1024;

/// A parsed request line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    Request(WakeRequest),
    Cancel(u64),
    Status,
}

/// Parse one request line. Every refusal names the problem (negative times, wrong types,
/// missing fields).
pub fn parse_line(line: &str) -> Result<Command, Reject> {
    let v: serde_json::Value = serde_json::from_str(line.trim())
        .map_err(|e| Reject::Malformed(format!("not JSON: {e}")))?;
    let obj = v
        .as_object()
        .ok_or_else(|| Reject::Malformed("expected a JSON object".into()))?;
    let cmd = match obj.get("cmd") {
        None => "request",
        Some(serde_json::Value::String(s)) => s.as_str(),
        Some(_) => return Err(Reject::Malformed("\"cmd\" must be a string".into())),
    };
    match cmd {
        "request" => parse_request(obj).map(Command::Request),
        "cancel" => Ok(Command::Cancel(uint(obj, "id")?)),
        "status" => Ok(Command::Status),
        other => Err(Reject::Malformed(format!(
            "unknown cmd {other:?} (expected request, cancel or status)"
        ))),
    }
}

fn uint(
    obj: &serde_json::Map<String, serde_json::Value>,
    field: &'static str,
) -> Result<u64, Reject> {
    let v = obj
        .get(field)
        .ok_or_else(|| Reject::Malformed(format!("missing field {field:?}")))?;
    if let Some(u) = v.as_u64() {
        return Ok(u);
    }
    if let Some(i) = v.as_i64() {
        return Err(Reject::Negative { field, value: i });
    }
    if let Some(f) = v.as_f64() {
        if f < 0.0 {
            return Err(Reject::Malformed(format!(
                "{field} is negative ({f}): times are CLOCK_MONOTONIC nanoseconds, ≥ 0"
            )));
        }
        return Err(Reject::Malformed(format!(
            "{field} must be an integer number of nanoseconds, got {f}"
        )));
    }
    Err(Reject::Malformed(format!(
        "{field} must be a non-negative integer, got {v}"
    )))
}

fn parse_request(obj: &serde_json::Map<String, serde_json::Value>) -> Result<WakeRequest, Reject> {
    let requester = match obj.get("requester") {
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(_) => return Err(Reject::Malformed("\"requester\" must be a string".into())),
        None => return Err(Reject::Malformed("missing field \"requester\"".into())),
    };
    let cpus = match obj.get("cpus") {
        Some(serde_json::Value::Array(a)) => {
            if a.len() > 4096 {
                return Err(Reject::Malformed("too many CPUs".into()));
            }
            a.iter()
                .map(|c| {
                    c.as_u64()
                        .and_then(|c| u32::try_from(c).ok())
                        .ok_or_else(|| {
                            Reject::Malformed(format!(
                                "CPU numbers must be non-negative integers, got {c}"
                            ))
                        })
                })
                .collect::<Result<Vec<u32>, Reject>>()?
        }
        Some(_) => {
            return Err(Reject::Malformed(
                "\"cpus\" must be an array of CPU numbers".into(),
            ))
        }
        None => return Err(Reject::Malformed("missing field \"cpus\"".into())),
    };
    Ok(WakeRequest {
        requester,
        cpus,
        start_ns: uint(obj, "start_ns")?,
        duration_ns: uint(obj, "duration_ns")?,
    })
}

/// Reply to an accepted request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AcceptedReply {
    pub ok: bool,
    pub id: u64,
    /// The mechanism of the window's CPUs (`pmqos`, `dma`, `spin`; `mixed` if they differ).
    pub mechanism: String,
    pub mechanisms: BTreeMap<u32, Mechanism>,
    /// As planned (a start in the past is clamped to the time of acceptance).
    pub start_ns: u64,
    pub end_ns: u64,
    /// Per CPU, how long before `start_ns` the CPU is armed (the learned timer-wake lead).
    pub lead_ns: BTreeMap<u32, u64>,
}

/// `pmqos` if every CPU uses it, …; `mixed` otherwise.
pub fn summarize(m: &BTreeMap<u32, Mechanism>) -> String {
    let mut it = m.values();
    match it.next() {
        None => "none".into(),
        Some(first) if it.all(|x| x == first) => first.name().into(),
        Some(_) => "mixed".into(),
    }
}

/// One CPU in [`Status`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CpuStatus {
    pub cpu: u32,
    /// What its windows use.
    pub mechanism: Mechanism,
    /// Set while the CPU is kept awake.
    pub armed: Option<ArmedStatus>,
    pub lead_ns: u64,
    pub lead_samples: u64,
    pub mean_lateness_ns: u64,
    pub last_lateness_ns: u64,
    /// Its sleep plan (union of its windows).
    pub plan: Vec<Interval>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArmedStatus {
    pub mechanism: Mechanism,
    pub since_ns: u64,
}

impl From<Armed> for ArmedStatus {
    fn from(a: Armed) -> Self {
        ArmedStatus {
            mechanism: a.mechanism,
            since_ns: a.since_ns,
        }
    }
}

/// A window not yet ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WindowStatus {
    pub id: u64,
    pub requester: String,
    pub connection: u64,
    pub cpus: Vec<u32>,
    pub start_ns: u64,
    pub end_ns: u64,
    pub mechanisms: BTreeMap<u32, Mechanism>,
}

/// How one CPU of a finished window was kept awake.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArmRecord {
    pub mechanism: Mechanism,
    /// start − (time the CPU was armed); negative if it was armed late.
    pub armed_before_start_ns: i64,
}

/// A window that ended or was cancelled.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FinishedWindow {
    pub id: u64,
    pub requester: String,
    pub cpus: Vec<u32>,
    pub start_ns: u64,
    pub end_ns: u64,
    /// `completed`, `cancelled: client closed`, `cancelled`.
    pub outcome: String,
    /// For completed windows: how long after `end_ns` the daemon ended it (timer lag of the
    /// executor; the CPU may have been disarmed later still if another window kept it).
    pub ended_late_ns: u64,
    /// Per CPU; `None` if the CPU was never armed (e.g. its worker was starved by real work,
    /// which keeps the CPU awake anyway, or the window was cancelled before its lead).
    pub per_cpu: BTreeMap<u32, Option<ArmRecord>>,
}

/// Awake time charged to one requester.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequesterAwake {
    pub total_ns: u64,
    pub per_cpu: BTreeMap<u32, u64>,
}

/// The daemon's state (`{"cmd":"status"}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Status {
    pub pid: u32,
    pub run_dir: String,
    pub now_ns: u64,
    pub started_ns: u64,
    pub cpus: Vec<CpuStatus>,
    /// Why a better mechanism is unavailable, fallbacks taken.
    pub notes: Vec<String>,
    /// What the start-up journal restore did.
    pub startup: Vec<String>,
    pub pending: Vec<WindowStatus>,
    /// The most recent finished windows, oldest first.
    pub recent: Vec<FinishedWindow>,
    /// Planned awake time charged per requester since start (equal split of overlaps).
    pub awake: BTreeMap<String, RequesterAwake>,
    pub accepted: u64,
    pub rejected: u64,
    pub cancelled: u64,
    pub completed: u64,
    pub connections: usize,
    /// Settings changed right now (CPUs held by pmqos or dma).
    pub changed_now: usize,
    /// Files listed in the journal (every PM QoS file touched since start, with the value to
    /// put back).
    pub journal_entries: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_requests_and_names_problems() {
        let c =
            parse_line(r#"{"requester":"a","cpus":[1,0],"start_ns":5,"duration_ns":7}"#).unwrap();
        assert_eq!(
            c,
            Command::Request(WakeRequest {
                requester: "a".into(),
                cpus: vec![1, 0],
                start_ns: 5,
                duration_ns: 7
            })
        );
        assert_eq!(parse_line(r#"{"cmd":"status"}"#).unwrap(), Command::Status);
        assert_eq!(
            parse_line(r#"{"cmd":"cancel","id":3}"#).unwrap(),
            Command::Cancel(3)
        );
        let err = |s: &str| parse_line(s).unwrap_err().to_string();
        assert!(
            err(r#"{"requester":"a","cpus":[1],"start_ns":5,"duration_ns":-7}"#)
                .contains("duration_ns is negative (-7)")
        );
        assert!(
            err(r#"{"requester":"a","cpus":[1],"start_ns":-1,"duration_ns":7}"#)
                .contains("start_ns is negative")
        );
        assert!(
            err(r#"{"requester":"a","cpus":[1],"start_ns":1.5,"duration_ns":7}"#)
                .contains("integer")
        );
        assert!(
            err(r#"{"requester":"a","cpus":[-1],"start_ns":1,"duration_ns":7}"#)
                .contains("CPU numbers")
        );
        assert!(err(r#"{"requester":"a","start_ns":1,"duration_ns":7}"#)
            .contains("missing field \"cpus\""));
        assert!(err("nope").contains("not JSON"));
        assert!(err("[1]").contains("object"));
        assert!(err(r#"{"cmd":"reboot"}"#).contains("unknown cmd"));
    }

    #[test]
    fn summary() {
        let mut m = BTreeMap::new();
        assert_eq!(summarize(&m), "none");
        m.insert(1, Mechanism::PmQos);
        m.insert(2, Mechanism::PmQos);
        assert_eq!(summarize(&m), "pmqos");
        m.insert(3, Mechanism::Spin);
        assert_eq!(summarize(&m), "mixed");
    }
}
