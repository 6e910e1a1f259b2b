//! The `hybrid` recording backend on the bundled server: its code lines are the native step
//! recording's, its data lines the probe's, both from the same recording (`--parts`); `auto`
//! picks it where ptrace is permitted; without permission `--backend hybrid` refuses clearly and
//! `auto` falls back to the probe with a note.

use crate::common;

use common::{ok, run_dir, serial};
use std::path::Path;
use std::process::{Command, Output};

/// `preheat record --server kv --out OUT EXTRA...` with `env`.
fn record_kv(rd: &Path, out: &Path, extra: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_preheat"));
    c.args(["record", "--server", "kv", "--out", out.to_str().unwrap()])
        .args(extra)
        .env("PREHEAT_RUN_DIR", rd);
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("run preheat")
}

/// Whether a failed recording failed for want of ptrace (then the test skips).
fn ptrace_refused(o: &Output) -> Option<String> {
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    (err.contains("PTRACE_SEIZE")
        || err.contains("Operation not permitted")
        || err.contains("ptrace_scope"))
    .then_some(err)
}

fn compare(tested: &Path, truth: &Path, rd: &Path) -> serde_json::Value {
    serde_json::from_str(&ok(
        &[
            "ws",
            "compare",
            "--json",
            tested.to_str().unwrap(),
            truth.to_str().unwrap(),
        ],
        rd,
    ))
    .unwrap()
}

#[test]
fn hybrid_is_step_code_plus_probe_data() {
    let _g = serial();
    let tmp = tempfile::tempdir().unwrap();
    let rd = run_dir(&tmp);
    let out = tmp.path().join("hybrid.phws");
    let parts = tmp.path().join("parts");
    let o = record_kv(
        &rd,
        &out,
        &["--backend", "hybrid", "--parts", parts.to_str().unwrap()],
        &[],
    );
    if !o.status.success() {
        if let Some(err) = ptrace_refused(&o) {
            preheat_testsupport::skip!("ptrace", "ptrace not permitted here: {err}");
            return;
        }
        panic!(
            "hybrid recording failed: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.contains("hybrid [measured]"), "{stdout}");
    // Code: exactly the step recording's lines (the merge takes them as they are, so no
    // tolerance: step's nondeterminism across requests is already voted out by its k-of-n
    // filter before the merge).
    let c = compare(&out, &parts.join("step.phws"), &rd);
    println!("hybrid vs its step part: {c:#}");
    let code = &c["code"];
    assert!(code["truth"].as_u64().unwrap() >= 50, "{c}");
    assert_eq!(code["tested"], code["truth"], "{c}");
    assert_eq!(code["true_positives"], code["truth"], "{c}");
    // Data: exactly the probe part's lines outside executable mappings, file-backed and
    // anonymous alike.
    let d = compare(&out, &parts.join("probe.phws"), &rd);
    println!("hybrid vs its probe part: {d:#}");
    let data = &d["data"];
    assert_eq!(data["tested"], data["truth"], "{d}");
    assert_eq!(data["true_positives"], data["truth"], "{d}");
    assert_eq!(d["tested_anon_lines"], d["truth_anon_lines"], "{d}");
    // Whether the probe part over- or under-reports code is the CPU's: more lines than step on
    // the EPYC hosts (instruction prefetch), fewer on a Xeon host (575 step lines against 528
    // probe lines in one run). Either way the hybrid's code is step's, checked above.
}

#[test]
fn auto_picks_hybrid_where_ptrace_is_permitted() {
    let _g = serial();
    let tmp = tempfile::tempdir().unwrap();
    let rd = run_dir(&tmp);
    let out = tmp.path().join("auto.phws");
    let o = record_kv(&rd, &out, &[], &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let err = String::from_utf8_lossy(&o.stderr);
    let show = ok(&["ws", "show", out.to_str().unwrap()], &rd);
    if err.contains("recording with probe only") || err.contains("the step backend failed") {
        preheat_testsupport::skip!("ptrace", "auto fell back to the probe: {err}");
        assert!(show.contains("backend  probe"), "{show}");
        return;
    }
    assert!(err.contains("hybrid (auto) backend"), "{err}");
    assert!(show.contains("backend  hybrid"), "{show}");
}

#[test]
fn without_ptrace_hybrid_refuses_and_auto_falls_back() {
    let _g = serial();
    let tmp = tempfile::tempdir().unwrap();
    let rd = run_dir(&tmp);
    let out = tmp.path().join("x.phws");
    // Yama's "no attach" policy, simulated (PREHEAT_PTRACE_SCOPE overrides
    // /proc/sys/kernel/yama/ptrace_scope for this check).
    let deny = [("PREHEAT_PTRACE_SCOPE", "3")];
    let o = record_kv(&rd, &out, &["--backend", "hybrid"], &deny);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("backend hybrid needs ptrace")
            && err.contains("ptrace_scope is 3")
            && err.contains("--backend probe"),
        "{err}"
    );
    assert!(!out.exists());
    let o = record_kv(&rd, &out, &[], &deny);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    let notes: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("recording with probe only"))
        .collect();
    assert_eq!(notes.len(), 1, "{err}");
    assert!(notes[0].contains("ptrace_scope is 3"), "{err}");
    let show = ok(&["ws", "show", out.to_str().unwrap()], &rd);
    assert!(show.contains("backend  probe"), "{show}");
}
