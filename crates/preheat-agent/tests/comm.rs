//! Communication detection (SPCD in user space) on real processes: the detected matrix of a
//! program with known sharing, and host programs that must not notice the detector (their own
//! segfaults, SIGSEGV handlers, blocked signal masks, mapping churn, fork + exec).
//!
//! The test programs are C files in `tests/comm/`, compiled with the system C compiler (which
//! the README's test command installs); without one the tests report a skip.

// Test programs signal and inspect the processes they start (kill, geteuid): libc calls.
#![allow(unsafe_code)]

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use preheat_model::comm::CommReport;

/// Compile `tests/comm/<name>.c` into `dir`, or None (skip reported) without a C compiler.
fn compile(name: &str, dir: &Path) -> Option<PathBuf> {
    support::compile_c(&format!("comm/{name}"), dir)
}

/// Both mechanisms: `mprotect` with a SIGSEGV handler, and userfaultfd write-protect (skipped,
/// saying so, where the kernel does not offer it).
fn mechanisms() -> Vec<&'static str> {
    let mut v = vec!["mprotect"];
    match preheat_agent::comm::uffd::available() {
        Ok(()) => v.push("uffd"),
        Err(e) => preheat_testsupport::skip!("userfaultfd", "the uffd mechanism: {e}"),
    }
    v
}

/// Run `prog args` with the agent and detection on (a fast schedule, so short runs sample a
/// lot) with `mechanism`, returning its output and the final report.
fn run_detected(
    prog: &Path,
    args: &[&str],
    dir: &Path,
    mechanism: &str,
) -> (Output, Option<CommReport>) {
    let a = support::artifacts();
    let out_json = dir.join("comm.json");
    let _ = std::fs::remove_file(&out_json);
    let run_dir = dir.join("run");
    std::fs::create_dir_all(&run_dir).unwrap();
    let mut cmd = Command::new(prog);
    for k in support::AGENT_ENV {
        cmd.env_remove(k);
    }
    let out = cmd
        .args(args)
        .env("LD_PRELOAD", &a.agent_so)
        .env("PREHEAT_RUN_DIR", &run_dir)
        .env("PREHEAT_COMM", "1")
        .env(
            "PREHEAT_COMM_CONFIG",
            format!(
                r#"{{"period_ms": 20, "pages": 128, "budget": 100000, "mechanism": "{mechanism}"}}"#
            ),
        )
        .env("PREHEAT_COMM_OUT", &out_json)
        .output()
        .expect("running the test program");
    let report = std::fs::read_to_string(&out_json)
        .ok()
        .map(|t| serde_json::from_str(&t).expect("the agent's report parses"));
    (out, report)
}

fn signal_of(out: &Output) -> Option<i32> {
    use std::os::unix::process::ExitStatusExt;
    out.status.signal()
}

#[test]
fn host_segfault_still_kills_it_with_sigsegv() {
    let dir = tempfile::tempdir().unwrap();
    let Some(prog) = compile("hostile", dir.path()) else {
        return;
    };
    for (mech, mode) in mechanisms()
        .into_iter()
        .flat_map(|m| ["segv", "sigsegv-user"].map(move |x| (m, x)))
    {
        let (out, report) = run_detected(&prog, &[mode, "600"], dir.path(), mech);
        assert_eq!(
            signal_of(&out),
            Some(libc::SIGSEGV),
            "{mech} {mode}: {out:?}"
        );
        assert!(
            !String::from_utf8_lossy(&out.stdout).contains("not reached"),
            "{mode}"
        );
        // Killed by a signal: no report at exit (the CLI keeps its last poll instead).
        let _ = report;
    }
}

#[test]
fn host_programs_do_not_notice() {
    let dir = tempfile::tempdir().unwrap();
    let Some(prog) = compile("hostile", dir.path()) else {
        return;
    };
    for (mech, mode) in mechanisms()
        .into_iter()
        .flat_map(|m| ["handler", "block", "churn", "forkexec"].map(move |x| (m, x)))
    {
        let (out, report) = run_detected(&prog, &[mode, "800"], dir.path(), mech);
        assert!(
            out.status.success(),
            "{mode}: {out:?}\n{}",
            String::from_utf8_lossy(&out.stdout)
        );
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("ok"),
            "{mode}"
        );
        let r = report.unwrap_or_else(|| panic!("{mode}: no report"));
        assert!(r.rounds > 5, "{mode}: detection did not run: {r:?}");
        assert!(
            r.faults_induced > 0,
            "{mode}: nothing sampled: {r:?}\nagent logs:\n{}",
            support::agent_logs(&dir.path().join("run"))
        );
        eprintln!(
            "comm {mech} {mode}: {} induced, {} passed on, {} EFAULT retries, {} released (measured)",
            r.faults_induced, r.faults_foreign, r.efault_retries, r.pages_released
        );
    }
}

/// Tests whose outcome depends on the machine's timing (caches, wake-ups, deadlines):
/// `scripts/test.sh` runs every `timing::` test after all others, one at a time, so no other
/// test loads the two CPUs meanwhile.
mod timing {
    use super::*;

    /// Each pair's threads share, the pairs share nothing. Sampling is random and the first
    /// writer of a page in a round is the one recorded, so a run on a loaded machine may see
    /// too little: up to three attempts for "pairs detected". "Nothing else" (no event across
    /// pairs, none with an agent thread) must hold in every attempt.
    #[test]
    fn pairs_are_detected_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let Some(prog) = compile("pairs", dir.path()) else {
            return;
        };
        for mech in mechanisms() {
            let mut last = None;
            for attempt in 1..=3 {
                let (out, report) = run_detected(&prog, &["1500"], dir.path(), mech);
                assert!(out.status.success(), "{mech}: {out:?}");
                let r = report.expect("a report at exit");
                assert!(r.mechanism.starts_with(mech), "{}", r.mechanism);
                let within = within_pairs(&r);
                if r.faults_induced > 20 && within > 10 {
                    eprintln!("comm {mech}: pairs detected on attempt {attempt} ({within} events within pairs, measured)");
                    last = None;
                    break;
                }
                eprintln!("comm {mech}: attempt {attempt} saw too little: {r:?}");
                last = Some(r);
            }
            if let Some(r) = last {
                panic!("{mech}: pairs not detected in 3 attempts: {r:?}");
            }
        }
    }

    /// Events between threads of the same pair (thread names tell the truth: pairN-tM);
    /// asserts that threads of different pairs share nothing and that no agent thread shows.
    fn within_pairs(r: &CommReport) -> u64 {
        let name = |i: usize| r.threads[i].name.clone();
        let mut within = 0;
        for i in 0..r.threads.len() {
            assert!(
                !name(i).starts_with("preheat-"),
                "an agent thread in the matrix: {r:?}"
            );
            for j in 0..r.threads.len() {
                let (a, b) = (name(i), name(j));
                if i == j || !a.starts_with("pair") || !b.starts_with("pair") {
                    continue;
                }
                if a[..5] == b[..5] {
                    within += r.matrix[i][j];
                } else {
                    assert_eq!(r.matrix[i][j], 0, "{a} and {b} share nothing: {r:?}");
                }
            }
        }
        within
    }
}
