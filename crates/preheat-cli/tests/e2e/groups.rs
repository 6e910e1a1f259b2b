//! `preheat groups`: the group detection of Busse et al. (SAC'15) §3 from the command line, on
//! the paper's Figure 3 matrix, and its refusals of bad input.

use crate::common;

use common::{ok, preheat, run_dir};
use std::io::Write;
use std::process::{Command, Stdio};

const FIGURE_3: &str = "[[0,6,1,9,6],[6,0,1,6,7],[1,1,0,1,1],[9,6,1,0,6],[6,7,1,6,0]]";

#[test]
fn paper_example_in_both_shapes() {
    let tmp = tempfile::tempdir().unwrap();
    let rd = run_dir(&tmp);
    let bare = tmp.path().join("bare.json");
    std::fs::write(&bare, FIGURE_3).unwrap();
    let wrapped = tmp.path().join("wrapped.json");
    std::fs::write(
        &wrapped,
        format!(r#"{{"matrix":{FIGURE_3},"labels":["v0","v1","v2","v3","v4"],"note":"x"}}"#),
    )
    .unwrap();
    for (file, labels) in [
        (&bare, serde_json::json!(["0", "1", "2", "3", "4"])),
        (&wrapped, serde_json::json!(["v0", "v1", "v2", "v3", "v4"])),
    ] {
        let f = file.to_str().unwrap();
        let v: serde_json::Value =
            serde_json::from_str(&ok(&["groups", f, "--json"], &rd)).unwrap();
        assert_eq!(v["t"], 1.5);
        assert_eq!(v["sets"], serde_json::json!([[0, 1, 3, 4], [2]]));
        assert_eq!(v["labels"], labels);
        let root = &v["tree"]["nodes"][v["tree"]["root"].as_u64().unwrap() as usize];
        assert_eq!(root["d"], 1.0);
        assert_eq!(root["tasks"], serde_json::json!([0, 1, 2, 3, 4]));
        assert_eq!(v["tree"]["nodes"][7]["d"], 6.0);

        let text = ok(&["groups", f], &rd);
        for needle in [
            "d=1.000 {0,1,2,3,4}  [split",
            "d=6.000 {0,1,3,4}  [set 1",
            "d=9.000 {0,3}",
            "d=7.000 {1,4}",
            "set 1: {0,1,3,4}",
            "set 2: {2}",
        ] {
            assert!(text.contains(needle), "{f}: no {needle:?} in\n{text}");
        }
    }
    let text = ok(&["groups", wrapped.to_str().unwrap()], &rd);
    assert!(text.contains("task 2 (v2)"), "{text}");
    assert!(
        text.contains("set 1: {0,1,3,4}  (v0, v1, v3, v4)"),
        "{text}"
    );

    let v: serde_json::Value = serde_json::from_str(&ok(
        &["groups", bare.to_str().unwrap(), "--t", "1.4", "--json"],
        &rd,
    ))
    .unwrap();
    assert_eq!(v["sets"], serde_json::json!([[0, 3], [1, 4], [2]]));
}

#[test]
fn reads_standard_input() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_preheat"))
        .args(["groups", "-", "--t", "inf", "--json"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(FIGURE_3.as_bytes())
        .unwrap();
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success());
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["sets"], serde_json::json!([[0, 1, 2, 3, 4]]));
    assert_eq!(v["t"], serde_json::Value::Null, "JSON has no infinity");
}

#[test]
fn bad_input_fails_with_the_file_and_the_problem() {
    let tmp = tempfile::tempdir().unwrap();
    let rd = run_dir(&tmp);
    let fails = |args: &[&str], needles: &[&str]| {
        let o = preheat(args, &rd);
        let err = String::from_utf8_lossy(&o.stderr).to_string();
        assert!(!o.status.success(), "preheat {args:?} should fail");
        for n in needles {
            assert!(err.contains(n), "error for {args:?} lacks {n:?}: {err}");
        }
    };
    let ragged = tmp.path().join("ragged.json");
    std::fs::write(&ragged, "[[0,1,2],[1,0],[2,1,0]]").unwrap();
    let r = ragged.to_str().unwrap();
    fails(
        &["groups", r],
        &[r, "matrix is not square: row 1 has 2 entries, expected 3"],
    );
    let missing = tmp.path().join("missing.json");
    let m = missing.to_str().unwrap();
    fails(&["groups", m], &[m, "No such file"]);
    let garbage = tmp.path().join("garbage.json");
    std::fs::write(&garbage, "[[0,1],[1,0]").unwrap();
    fails(&["groups", garbage.to_str().unwrap()], &["invalid JSON"]);
    let good = tmp.path().join("good.json");
    std::fs::write(&good, FIGURE_3).unwrap();
    fails(
        &["groups", good.to_str().unwrap(), "--t=-1"],
        &["threshold t must be a number >= 0"],
    );
}

#[test]
fn methods_and_the_simulated_comparison() {
    let tmp = tempfile::tempdir().unwrap();
    let rd = run_dir(&tmp);
    let file = tmp.path().join("fig3.json");
    std::fs::write(&file, FIGURE_3).unwrap();
    let f = file.to_str().unwrap();
    let json =
        |args: &[&str]| -> serde_json::Value { serde_json::from_str(&ok(args, &rd)).unwrap() };
    let paper = json(&["groups", f, "--json"]);
    assert_eq!(paper["method"], "paper");
    assert!(paper.get("modularity").is_none(), "{paper}");
    // Task 2's one event with each task is what its total predicts: modularity keeps it.
    let m = json(&["groups", f, "--method", "modularity", "--json"]);
    assert_eq!(m["method"], "modularity");
    assert_eq!(m["sets"], serde_json::json!([[0, 1, 2, 3, 4]]));
    assert_eq!(m["modularity"], 0.0);
    let text = ok(&["groups", f, "--method", "modularity"], &rd);
    assert!(
        text.contains("[set 1: Q 0.000 kept >= -0.004 split]"),
        "{text}"
    );
    assert!(text.contains("sets by modularity"), "{text}");

    let table = ok(&["groups", "compare", "--seeds", "20"], &rd);
    assert!(table.starts_with("simulated: "), "{table}");
    for needle in ["20 seeds (0..20)", "paper (t = 1.5)", "modularity", "/20 "] {
        assert!(table.contains(needle), "no {needle:?} in\n{table}");
    }
    let c = json(&["groups", "compare", "--seeds", "20", "--json"]);
    assert_eq!(c["simulated"], true);
    assert_eq!(c["methods"], serde_json::json!(["paper", "modularity"]));
    let rows = c["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 5);
    assert_eq!(rows[0]["noise"], 0.0);
    assert_eq!(rows[0]["recovered"], serde_json::json!([20, 20]));

    let help = ok(&["groups", "--help"], &rd);
    for needle in [
        "--method paper",
        "--method modularity",
        "groups compare",
        "simulated",
    ] {
        assert!(help.contains(needle), "help lacks {needle:?}");
    }
    let o = preheat(&["groups", f, "--method", "louvain"], &rd);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("paper or modularity"));
}
