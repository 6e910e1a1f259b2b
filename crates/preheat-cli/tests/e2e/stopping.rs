//! How commands stop, and that nothing outlives them: stopped by SIGTERM, by a closed output (the
//! reader went away), and a hot floor killed by SIGKILL put back by the next command.

use crate::common;

use common::{agent_logs, assert_no_agent_sockets, preheat, run_dir};
use std::process::Command;

/// A hot floor killed by SIGKILL leaves its CPU held out of idle and a journal: the next
/// `preheat` command (any) puts the CPU back. Simulated with the journal a killed demo leaves
/// (the real window, one request long, is too short to hit reliably with a signal).
#[test]
fn a_killed_hot_floor_is_restored_by_the_next_command() {
    let cpu = 1;
    let knob = format!("/sys/devices/system/cpu/cpu{cpu}/power/pm_qos_resume_latency_us");
    if !common::euid_is_root() {
        return preheat_testsupport::skip("root", "PM QoS needs root");
    }
    let Ok(original) = std::fs::read_to_string(&knob).map(|v| v.trim().to_string()) else {
        return preheat_testsupport::skip!("pm-qos", "{knob} does not exist");
    };
    let tmp = tempfile::tempdir().unwrap();
    let rd = run_dir(&tmp);
    // A pid that is certainly gone: a child we reaped.
    let mut child = Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    let journal = rd.join(format!("hot-floor-{dead}-wake-journal.json"));
    std::fs::write(
        &journal,
        serde_json::json!({"version": 1, "pid": dead, "entries": [
            {"path": knob, "original": original, "written": "n/a"}]})
        .to_string(),
    )
    .unwrap();
    // Restore the knob even if an assertion below fails.
    struct Put(String, String);
    impl Drop for Put {
        fn drop(&mut self) {
            let _ = std::fs::write(&self.0, &self.1);
        }
    }
    let _put = Put(knob.clone(), original.clone());
    std::fs::write(&knob, "n/a").unwrap();
    // Any command restores it (a cheap one that fails on its argument).
    let _ = preheat(&["ws", "show", "/nonexistent.phws"], &rd);
    assert_eq!(std::fs::read_to_string(&knob).unwrap().trim(), original);
    assert!(!journal.exists(), "the restored journal was not removed");
}

/// A demo whose reader goes away (`preheat demo 2>&1 | head`) stops as on SIGTERM when it next
/// prints: exit 128 + 15, its server stopped, nothing left in the run directory — not a panic
/// (exit 101) that kept the agents' logs as after a failure.
#[test]
fn a_demo_whose_output_is_closed_stops_as_on_sigterm() {
    let tmp = tempfile::tempdir().unwrap();
    let rd = run_dir(&tmp);
    let mut demo = demo_until_attached(&rd, std::process::Stdio::piped());
    let t0 = std::time::Instant::now();
    // The reader goes away; the demo's next progress line finds its stderr closed.
    drop(demo.0.stderr.take());
    let st = loop {
        if let Some(st) = demo.0.try_wait().unwrap() {
            break st;
        }
        assert!(
            t0.elapsed().as_secs() < 240,
            "the demo went on for 240 s with its output closed"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert_eq!(st.code(), Some(143), "stopped as by SIGTERM: exit 128 + 15");
    assert_no_agent_sockets(&rd);
    let logs: Vec<String> = agent_logs(&rd).into_iter().map(|(n, _)| n).collect();
    assert!(logs.is_empty(), "agent logs left behind: {logs:?}");
}

/// A demo stopped by SIGTERM stops its server and leaves nothing in the run directory: no agent
/// socket and no agent log (the handler removes the logs a demo that ends well removes too).
#[test]
fn a_demo_stopped_by_sigterm_leaves_no_agent_logs() {
    let tmp = tempfile::tempdir().unwrap();
    let rd = run_dir(&tmp);
    let mut demo = demo_until_attached(&rd, std::process::Stdio::null());
    std::thread::sleep(std::time::Duration::from_millis(500));
    preheat_engine::os::send_signal(demo.0.id(), libc::SIGTERM, false).unwrap();
    let st = demo.0.wait().unwrap();
    assert_eq!(st.code(), Some(143), "SIGTERM: exit 128 + 15");
    assert_no_agent_sockets(&rd);
    let logs: Vec<String> = agent_logs(&rd).into_iter().map(|(n, _)| n).collect();
    assert!(logs.is_empty(), "agent logs left behind: {logs:?}");
    // Nor the calibration's bench dirs (a fresh run dir calibrates; the signal usually comes
    // while it runs: a CI-like run once found one left).
    let own = format!("preheat-wake-bench-{}-", demo.0.id());
    let left: Vec<_> = std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(&own))
        .collect();
    assert!(left.is_empty(), "calibration dirs left behind: {left:?}");
}

/// A long demo (200 rounds) in `rd`, its stdout discarded and its stderr as given, returned once
/// its server's agent has written its log (it attached).
fn demo_until_attached(
    rd: &std::path::Path,
    stderr: std::process::Stdio,
) -> preheat_testsupport::TermOnDrop {
    let mut demo = preheat_testsupport::TermOnDrop(
        Command::new(env!("CARGO_BIN_EXE_preheat"))
            .args(["demo", "--rounds", "200"])
            .args(common::QUICK_DEMO)
            .env("PREHEAT_RUN_DIR", rd)
            .stdout(std::process::Stdio::null())
            .stderr(stderr)
            .spawn()
            .unwrap(),
    );
    let t0 = std::time::Instant::now();
    while agent_logs(rd).is_empty() {
        assert!(
            t0.elapsed().as_secs() < 60,
            "no agent log within 60 s in {}",
            rd.display()
        );
        assert!(demo.0.try_wait().unwrap().is_none(), "the demo ended early");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    demo
}
