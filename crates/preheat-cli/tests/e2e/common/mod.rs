//! Helpers shared by the CLI's end-to-end tests.

pub mod netlab;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// Run `preheat ARGS` with its agents' run dir at `run_dir`.
pub fn preheat(args: &[&str], run_dir: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_preheat"))
        .args(args)
        .env("PREHEAT_RUN_DIR", run_dir)
        .output()
        .expect("run preheat")
}

/// Run `preheat ARGS`, which must succeed; its standard output.
pub fn ok(args: &[&str], run_dir: &Path) -> String {
    let o = preheat(args, run_dir);
    assert!(
        o.status.success(),
        "preheat {args:?} failed: {}\n{}",
        String::from_utf8_lossy(&o.stderr),
        String::from_utf8_lossy(&o.stdout)
    );
    String::from_utf8(o.stdout).unwrap()
}

/// A run dir for agents inside a test's temporary directory.
pub fn run_dir(tmp: &tempfile::TempDir) -> PathBuf {
    let d = tmp.path().join("run");
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The demo's options for a short test run: few probe samples, a short idle gap, a small sweep
/// (the tests add `--rounds` and what they measure).
pub const QUICK_DEMO: [&str; 8] = [
    "--samples",
    "4",
    "--keep",
    "3",
    "--idle-ms",
    "2",
    "--sweep-mib",
    "32",
];

#[allow(unused_imports)] // not every test file that includes this module looks for programs
pub use preheat_testsupport::find_program;

/// The bundled kernels, next to the `preheat` binary (built on demand like the agent).
pub fn npb() -> PathBuf {
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_preheat"));
    let bin = exe.with_file_name("preheat-npb");
    if !bin.exists() {
        let st = preheat_testsupport::cargo_build(&["preheat-npb"])
            .status()
            .expect("running cargo");
        assert!(st.success(), "building preheat-npb failed");
    }
    bin
}

/// Tests of one binary that put threads at real-time priorities on all CPUs run one at a time
/// (they would measure each other): hold this guard.
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Whether real-time scheduling is permitted here (root in CI). Without it the tests that need
/// it say so and return, except under CI, where the test command runs as root: there it fails.
pub fn realtime_or_skip(test: &str) -> bool {
    let ok = Command::new("chrt")
        .args(["-f", "1", "true"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        assert!(
            std::env::var_os("CI").is_none(),
            "{test}: real-time scheduling is not permitted, but CI runs the suite as root"
        );
        preheat_testsupport::skip!(
            "realtime",
            "{test}: no permission for SCHED_FIFO (run as root)"
        );
    }
    ok
}

/// Whether this test runs with effective uid 0 (from /proc/self/status: no unsafe, no libc).
pub fn euid_is_root() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|l| l.split_whitespace().nth(1).map(|e| e == "0"))
            .unwrap_or(false)
    })
}

/// The agents' logs in the run directory (`agent-PID.log`), as (file name, text), by name.
pub fn agent_logs(rd: &Path) -> Vec<(String, String)> {
    let mut logs: Vec<(String, String)> = std::fs::read_dir(rd)
        .unwrap()
        .flatten()
        .map(|e| (e.file_name().to_string_lossy().into_owned(), e.path()))
        .filter(|(n, _)| n.starts_with("agent-") && n.ends_with(".log"))
        .filter_map(|(n, p)| Some((n, std::fs::read_to_string(p).ok()?)))
        .collect();
    logs.sort();
    logs
}

/// No agent control socket is left in the run directory (its server was stopped).
pub fn assert_no_agent_sockets(rd: &Path) {
    let left: Vec<_> = std::fs::read_dir(rd)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".sock"))
        .collect();
    assert!(left.is_empty(), "agent sockets left behind: {left:?}");
}
