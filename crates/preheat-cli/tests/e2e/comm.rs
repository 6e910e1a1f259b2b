//! `preheat comm` end to end: communication detection on the bundled NPB-style kernels finds
//! their true coscheduling sets through `preheat groups`, attaches to a running process, and
//! refuses bad arguments clearly.

use crate::common;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{npb, ok, preheat, run_dir};

/// True sets from thread names `npb-K-iI-rR`: one per instance; every thread alone for `ep`.
fn truth(kernel: &str, names: &[String]) -> Vec<Vec<String>> {
    let mut sets: Vec<Vec<String>> = if kernel == "ep" {
        names.iter().map(|n| vec![n.clone()]).collect()
    } else {
        let mut by: std::collections::BTreeMap<String, Vec<String>> = Default::default();
        for n in names {
            let inst = n.split('-').nth(2).unwrap_or("").to_string();
            by.entry(inst).or_default().push(n.clone());
        }
        by.into_values().collect()
    };
    for s in &mut sets {
        s.sort();
    }
    sets.sort();
    sets
}

/// The agents' log files in `rd`, for a failure's message (a run on 2026-11-27 saw the program
/// die of SIGSEGV 0.18 s into its first `comm` run, once in the suite, not again in 66 runs).
fn agent_logs(rd: &std::path::Path) -> String {
    let mut out = String::new();
    for e in std::fs::read_dir(rd).into_iter().flatten().flatten() {
        let p = e.path();
        if p.extension().is_some_and(|x| x == "log") {
            let text = std::fs::read_to_string(&p).unwrap_or_default();
            out += &format!("--- {}\n{text}", p.display());
        }
    }
    out
}

#[test]
fn attaches_to_a_running_process() {
    let tmp = tempfile::tempdir().unwrap();
    let rd = run_dir(&tmp);
    let agent = PathBuf::from(env!("CARGO_BIN_EXE_preheat")).with_file_name("libpreheat_agent.so");
    if !agent.exists() {
        // `preheat comm -- ...` builds the companions; make sure they exist for this test.
        let _ = preheat(&["comm", "--", "true"], &rd);
    }
    let mut child = Command::new(npb())
        .args(["is", "--threads", "4", "--instances", "2", "--seconds", "5"])
        .env("LD_PRELOAD", &agent)
        .env("PREHEAT_RUN_DIR", &rd)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    let sock = rd.join(format!("agent-{pid}.sock"));
    let t0 = Instant::now();
    while !sock.exists() && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = tmp.path().join("pid.json");
    let o = preheat(
        &[
            "comm",
            "--pid",
            &pid.to_string(),
            "--duration",
            "1.5",
            "--period-ms",
            "20",
            "--budget",
            "5000",
            "--only",
            "npb-",
            "--out",
            out.to_str().unwrap(),
        ],
        &rd,
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert!(report["rounds"].as_u64().unwrap() > 10, "{report}");
    assert!(report["faults_induced"].as_u64().unwrap() > 0, "{report}");
    assert_eq!(
        report["active"], false,
        "stopped after --duration: {report}"
    );
    // The program keeps running after detection stopped and finishes normally.
    let st = child.wait().unwrap();
    assert!(st.success(), "{st}");
}

#[test]
fn bad_arguments_are_refused_clearly() {
    let tmp = tempfile::tempdir().unwrap();
    let rd = run_dir(&tmp);
    let o = preheat(&["comm"], &rd);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("give a program after `--`"));
    let o = preheat(&["comm", "--pages", "0", "--", "true"], &rd);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("pages"));
    let o = preheat(&["comm", "--pid", "1"], &rd);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("--duration"));
}

/// Tests whose outcome depends on the machine's timing (caches, wake-ups, deadlines):
/// `scripts/test.sh` runs every `timing::` test after all others, one at a time, so no other
/// test loads the two CPUs meanwhile.
mod timing {
    use super::*;

    #[test]
    fn detected_groups_equal_each_kernels_truth() {
        let tmp = tempfile::tempdir().unwrap();
        let rd = run_dir(&tmp);
        let bin = npb();
        // Every kernel with the default mechanism; one with userfaultfd write-protect.
        for (kernel, mechanism) in [
            ("mg", "auto"),
            ("cg", "auto"),
            ("is", "auto"),
            ("ep", "auto"),
            ("cg", "uffd"),
        ] {
            // A sampling detector: one run in about eight (all day on 2026-11-27, alone on the
            // machine and beside other tests) saw no event between one instance's two threads;
            // 12 `cg` runs each with the agent's own file table and with the host's (2026-11-27
            // #3) missed 1 and 0 times. With two runs per kernel, five kernels would still fail
            // a suite in ~3%: a kernel whose sets miss the truth gets up to three runs, said on
            // stderr; all missing fails (a detector that no longer sees a pattern misses it
            // every time).
            for attempt in 1..=3 {
                let out = tmp
                    .path()
                    .join(format!("{kernel}-{mechanism}-{attempt}.json"));
                // A faster schedule than the default (20 ms rounds, higher budget) so a short test run
                // samples enough; the report is taken while the kernel runs (--duration), after the
                // matrix was reset past start-up.
                let o = preheat(
                    &[
                        "comm",
                        "--mechanism",
                        mechanism,
                        "--period-ms",
                        "20",
                        "--budget",
                        "5000",
                        "--reset-after-ms",
                        "300",
                        "--duration",
                        "3",
                        "--only",
                        "npb-",
                        "--out",
                        out.to_str().unwrap(),
                        "--",
                        bin.to_str().unwrap(),
                        kernel,
                        "--threads",
                        "4",
                        "--instances",
                        "2",
                        "--seconds",
                        "4",
                        "--start-delay-ms",
                        "300",
                    ],
                    &rd,
                );
                assert!(
                    o.status.success(),
                    "{kernel}: {}\n{}\nagent logs:\n{}",
                    String::from_utf8_lossy(&o.stderr),
                    String::from_utf8_lossy(&o.stdout),
                    agent_logs(&rd)
                );
                let report: serde_json::Value =
                    serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
                assert_eq!(report["label"], "measured");
                assert!(report["faults_induced"].as_u64().unwrap() > 0, "{report}");
                let g: serde_json::Value =
                    serde_json::from_str(&ok(&["groups", out.to_str().unwrap(), "--json"], &rd))
                        .unwrap();
                let names: Vec<String> = report["threads"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|t| t["name"].as_str().unwrap().to_string())
                    .collect();
                assert_eq!(
                    names.len(),
                    4,
                    "{kernel}: the four kernel threads: {names:?}"
                );
                let mut sets: Vec<Vec<String>> = g["sets"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|s| {
                        let mut v: Vec<String> = s
                            .as_array()
                            .unwrap()
                            .iter()
                            .map(|i| names[i.as_u64().unwrap() as usize].clone())
                            .collect();
                        v.sort();
                        v
                    })
                    .collect();
                sets.sort();
                let want = truth(kernel, &names);
                if sets != want && attempt < 3 {
                    eprintln!(
                        "comm {kernel}: attempt {attempt} missed the truth (sets {sets:?}, matrix \
                         {}): running it once more",
                        report["matrix"]
                    );
                    continue;
                }
                assert_eq!(sets, want, "{kernel}: matrix {}", report["matrix"]);
                eprintln!(
                    "comm {kernel} ({}): groups = truth; {} events, {} induced faults (measured)",
                    report["mechanism"], report["events"], report["faults_induced"]
                );
                break;
            }
        }
    }
}
