//! The binary: bad options exit 2 with a message; the READY line parses, lists every thread
//! with distinct tids and the names the threads really carry; progress lines count phases; the
//! last line is the summary.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};

use serde_json::Value;

fn npb() -> Command {
    Command::new(env!("CARGO_BIN_EXE_preheat-npb"))
}

#[test]
fn bad_options_exit_2_with_a_message() {
    let cases: &[(&[&str], &str)] = &[
        (&["mg", "--threads", "0"], "--threads"),
        (&["mg", "--threads", "3", "--instances", "2"], "divide"),
        (&["mg", "--instances", "0"], "--instances"),
        (&["lu"], "invalid value"),
        (&["mg", "--iterations", "0"], "--iterations"),
        (&["mg", "--seconds=-1"], "--seconds"),
        (&["mg", "--seconds", "0"], "--seconds"),
        (
            &["mg", "--iterations", "3", "--seconds", "1"],
            "cannot be used",
        ),
    ];
    for (args, needle) in cases {
        let out = npb().args(*args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
        assert!(out.stdout.is_empty(), "{args:?}");
    }
}

#[test]
fn ready_line_maps_tids_to_named_threads() {
    let mut child = npb()
        .args([
            "mg",
            "--threads",
            "4",
            "--instances",
            "2",
            "--iterations",
            "3",
        ])
        .args(["--work", "2", "--start-delay-ms", "300", "--json"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let json = line.strip_prefix("READY ").expect("READY line first");
    let ready: Value = serde_json::from_str(json).unwrap();
    assert_eq!(ready["pid"].as_u64(), Some(child.id() as u64));
    let threads = ready["threads"].as_array().unwrap();
    assert_eq!(threads.len(), 4);
    let tids: BTreeSet<u64> = threads.iter().map(|t| t["tid"].as_u64().unwrap()).collect();
    assert_eq!(tids.len(), 4, "distinct tids");
    // During the start delay the threads exist under the announced names.
    for (j, t) in threads.iter().enumerate() {
        assert_eq!(t["index"].as_u64(), Some(j as u64));
        assert_eq!(t["instance"].as_u64(), Some(j as u64 / 2));
        assert_eq!(t["rank"].as_u64(), Some(j as u64 % 2));
        let name = t["name"].as_str().unwrap();
        assert_eq!(name, format!("npb-mg-i{}-r{}", j / 2, j % 2));
        let comm = format!("/proc/{}/task/{}/comm", child.id(), t["tid"]);
        assert_eq!(std::fs::read_to_string(comm).unwrap().trim(), name);
    }
    let mut rest = String::new();
    out.read_to_string(&mut rest).unwrap();
    assert!(child.wait().unwrap().success());
    let summary: Value = serde_json::from_str(rest.trim()).expect("one JSON line");
    assert_eq!(summary["kernel"], "mg");
    assert_eq!(summary["iterations"], 3);
    assert_eq!(summary["truth"], serde_json::json!([[0, 1], [2, 3]]));
    assert_eq!(summary["pattern"].as_array().unwrap().len(), 4);
    assert_eq!(summary["cpu_s"].as_array().unwrap().len(), 4);
}

#[test]
fn human_output_ends_with_the_json_summary() {
    let out = npb()
        .args(["ep", "--threads", "2", "--iterations", "2", "--work", "1"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("READY {"));
    assert!(lines[1].starts_with("preheat-npb ep:"));
    let summary: Value = serde_json::from_str(lines.last().unwrap()).unwrap();
    assert_eq!(summary["truth"], serde_json::json!([[0], [1]]));
    assert_eq!(summary["checksum"].as_str().unwrap().len(), 16);
}

#[test]
fn long_names_are_cut_to_fifteen_bytes() {
    assert_eq!(
        preheat_npb::config::thread_name(preheat_npb::Kernel::Is, 12, 345),
        "npb-is-i12-r345"
    );
    assert_eq!(
        preheat_npb::config::thread_name(preheat_npb::Kernel::Is, 123, 45),
        "npb-is-i123-r45"
    );
    assert_eq!(
        preheat_npb::config::thread_name(preheat_npb::Kernel::Cg, 100, 200).len(),
        15
    );
}

#[test]
fn progress_lines_count_each_instances_phases() {
    let out = npb()
        .args([
            "mg",
            "--threads",
            "4",
            "--instances",
            "2",
            "--seconds",
            "0.5",
        ])
        .args(["--progress-ms", "100", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let reports: Vec<Value> = text
        .lines()
        .filter_map(|l| l.strip_prefix("PROGRESS "))
        .map(|j| serde_json::from_str(j).unwrap())
        .collect();
    assert!(reports.len() >= 2, "{text}");
    for w in reports.windows(2) {
        assert!(w[1]["t_ms"].as_u64() > w[0]["t_ms"].as_u64(), "{text}");
        let phases = |r: &Value| -> Vec<u64> {
            let counts = r["phases"].as_array().unwrap().iter();
            counts.map(|p| p.as_u64().unwrap()).collect()
        };
        let (a, b) = (phases(&w[0]), phases(&w[1]));
        assert_eq!(a.len(), 2, "one count per instance: {text}");
        assert!(a.iter().zip(&b).all(|(x, y)| y >= x), "{text}");
    }
    let last = reports.last().unwrap();
    assert!(last["phases"][0].as_u64().unwrap() > 0, "{text}");
    assert!(
        text.lines().last().unwrap().starts_with('{'),
        "the summary stays last"
    );
}
