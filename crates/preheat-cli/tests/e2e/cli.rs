//! End-to-end tests of the `preheat` command: real servers on loopback, real files.

use crate::common;

use common::{agent_logs, assert_no_agent_sockets, ok, preheat, run_dir};
use std::path::Path;
use std::process::Command;

fn fails_with(args: &[&str], run_dir: &Path, needles: &[&str]) {
    let o = preheat(args, run_dir);
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    assert!(!o.status.success(), "preheat {args:?} should fail");
    for n in needles {
        assert!(err.contains(n), "error for {args:?} lacks {n:?}: {err}");
    }
}

/// A server whose mappings change under the probe: every request maps or unmaps a 256 KiB
/// region (`preheat-agent/tests/probe/unmapper.c`). The agent skips a cycle whose ranges changed
/// while the server served its request (touching them could fault the server); `preheat
/// record` repeats such a cycle and still writes a profile, saying how many it repeated. Before
/// the repeat it failed with "round skipped" on every try.
#[test]
fn record_repeats_the_cycles_the_agent_skipped() {
    let tmp = tempfile::tempdir().unwrap();
    let rd = run_dir(&tmp);
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../preheat-agent/tests/probe/unmapper.c");
    let Some(prog) = preheat_testsupport::compile_c(&src, tmp.path()) else {
        return;
    };
    let port = preheat_testsupport::free_port().to_string();
    let out = tmp.path().join("unmapper.phws");
    let (ready, state) = (tmp.path().join("ready"), tmp.path().join("state"));
    let said = ok(
        &[
            "record",
            "--backend",
            "probe",
            "--out",
            out.to_str().unwrap(),
            "--port",
            &port,
            "--request",
            "x\\n",
            "--until",
            "\\n",
            "--samples",
            "4",
            "--keep",
            "2",
            "--",
            prog.to_str().unwrap(),
            ready.to_str().unwrap(),
            state.to_str().unwrap(),
            &port,
        ],
        &rd,
    );
    assert!(said.contains("cycle(s) repeated"), "{said}");
    assert!(out.is_file(), "no profile written: {said}");
    assert_no_agent_sockets(&rd);
}

#[test]
fn record_show_and_bad_files() {
    let tmp = tempfile::tempdir().unwrap();
    let rd = run_dir(&tmp);
    let out = tmp.path().join("kv.phws");
    let o = out.to_str().unwrap();
    ok(
        &[
            "record",
            "--server",
            "kv",
            "--out",
            o,
            "--samples",
            "4",
            "--keep",
            "3",
            "--backend",
            "probe",
        ],
        &rd,
    );
    let v: serde_json::Value =
        serde_json::from_str(&ok(&["ws", "show", "--json", o], &rd)).unwrap();
    let c = &v["classes"][0];
    let lines = c["lines"].as_u64().unwrap();
    let runs = c["runs"].as_u64().unwrap();
    assert!(lines > 20, "a GET touches more than 20 lines: {v}");
    assert!(runs > 0 && runs <= lines);
    assert_eq!(c["raw_bytes"].as_u64().unwrap(), 4 * lines);
    assert!(
        c["encoded_bytes"].as_u64().unwrap() < 4 * lines,
        "RLE must beat 4 B/line"
    );
    assert_eq!(v["backend"], "probe");
    assert_eq!(v["k"], 3);
    assert_eq!(v["n"], 4);
    // A recording that ended well leaves its server's agent logs behind no more than a demo.
    assert_no_agent_sockets(&rd);
    let logs: Vec<String> = agent_logs(&rd).into_iter().map(|(n, _)| n).collect();
    assert!(logs.is_empty(), "agent logs left behind: {logs:?}");
    // Text form names the paper metric.
    assert!(ok(&["ws", "show", o], &rd).contains("4 B/line"));

    // Bad files: clear errors naming the file and the problem; nothing else happens.
    let bytes = std::fs::read(&out).unwrap();
    let bad = |name: &str, data: &[u8], needle: &str| {
        let p = tmp.path().join(name);
        std::fs::write(&p, data).unwrap();
        let ps = p.to_str().unwrap().to_string();
        fails_with(&["ws", "show", &ps], &rd, &[&ps, needle]);
    };
    bad("trunc.phws", &bytes[..bytes.len() / 2], "truncated");
    let mut flipped = bytes.clone();
    let mid = flipped.len() / 2;
    flipped[mid] ^= 1;
    bad("flip.phws", &flipped, "checksum");
    let mut v2 = bytes.clone();
    v2[8] = 9;
    bad("v9.phws", &v2, "version 9");
    bad("text.phws", b"not a profile at all", "bad magic");
    fails_with(
        &["ws", "show", "/nonexistent/x.phws"],
        &rd,
        &["/nonexistent/x.phws"],
    );
}

#[test]
fn usage_errors_are_clear() {
    let tmp = tempfile::tempdir().unwrap();
    let rd = run_dir(&tmp);
    let out = tmp.path().join("x.phws");
    let o = out.to_str().unwrap();
    fails_with(&["record", "--out", o], &rd, &["--server"]);
    fails_with(
        &["record", "--out", o, "--", "true"],
        &rd,
        &["--port", "--request"],
    );
    fails_with(
        &["record", "--server", "kv", "--out", o, "--keep", "9"],
        &rd,
        &["--keep"],
    );
    if !has_pmu() {
        fails_with(
            &["record", "--server", "kv", "--out", o, "--backend", "pmu"],
            &rd,
            &["no hardware PMU"],
        );
    }
    fails_with(&["announce", "--port", "1"], &rd, &["no agents"]);
    // Sizes that measure nothing are refused before a server starts.
    fails_with(&["demo", "--rounds", "0"], &rd, &["--rounds 0"]);
    fails_with(&["demo", "--lead-us", "99999999999"], &rd, &["--lead-us"]);
    // A result path that cannot be written is refused before the minutes of work that fill it.
    let nowhere = tmp.path().join("no/such/dir/x");
    let nowhere = nowhere.to_str().unwrap();
    fails_with(
        &["demo", "--out", nowhere],
        &rd,
        &["--out", "cannot be written"],
    );
    fails_with(
        &["demo", "--server-cpu", "4096"],
        &rd,
        &["--server-cpu", "CPU 4096 does not exist"],
    );
    fails_with(
        &["record", "--server", "kv", "--out", nowhere],
        &rd,
        &["cannot write the profile"],
    );
    // A benchmark of no repetitions is refused, not reported as 0.00% with n = 0.
    fails_with(&["bench", "agent", "--pairs", "0"], &rd, &["--pairs 0"]);
    fails_with(&["bench", "preheat", "--reps", "0"], &rd, &["--reps 0"]);
    fails_with(&["affinity", "bench", "--reps", "0"], &rd, &["--reps 0"]);
    // A profile that cannot be read is refused before the server starts.
    let missing = tmp.path().join("missing.phws");
    let run = [
        "run",
        "--port",
        "1",
        "--profile",
        missing.to_str().unwrap(),
        "--",
        "true",
    ];
    fails_with(&run, &rd, &["cannot read", "missing.phws"]);
    // An error's cause is said once (it was repeated: the message embedded its source).
    let sim = [
        "cosched",
        "simulate",
        "--scenario",
        "single",
        "--phase-us",
        "0",
    ];
    let o = preheat(&sim, &rd);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.matches("must be positive").count(), 1, "{err}");
    assert_no_agent_sockets(&rd);
    assert!(!out.exists(), "nothing written on errors");
    // --help explains.
    let help = ok(&["record", "--help"], &rd);
    assert!(help.contains("--backend") && help.contains("Examples"));
}

/// `preheat observe` says at once what rules it out: no such process, not root, no listener.
#[test]
fn observe_refuses_at_once() {
    let tmp = tempfile::tempdir().unwrap();
    let rd = run_dir(&tmp);
    let t0 = std::time::Instant::now();
    fails_with(
        &["observe", "--pid", "999999999", "--port", "1"],
        &rd,
        &["no process"],
    );
    let me = std::process::id().to_string();
    let why = if common::euid_is_root() {
        "no socket listening on TCP port 1"
    } else {
        "needs root"
    };
    fails_with(&["observe", "--pid", &me, "--port", "1"], &rd, &[why]);
    assert!(t0.elapsed() < std::time::Duration::from_secs(5));
}

/// The paired benchmarks end to end with tiny settings: every pair gives a loss, a block-wise
/// loss and a p50 delta (what they share, `preheat-bench`'s `Pairs`); no number is judged.
#[test]
fn paired_benches_report_every_pair() {
    let tmp = tempfile::tempdir().unwrap();
    let rd = run_dir(&tmp);
    let args = [
        "--pairs",
        "2",
        "--requests",
        "800",
        "--blocks",
        "2",
        "--json",
    ];
    let node = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/node_http.js");
    let node = node.to_str().unwrap();
    // The observer's runs observe throughout (`--complete`), where every request is to be
    // seen, but the last, which samples under load as by default.
    for (bench, extra) in [
        ("agent", &[][..]),
        ("observe", &["--complete"]),
        ("observe", &["--complete", "--toggle"]),
        // A catalog server whose worker serves under its master, and the syscall programs.
        (
            "observe",
            &["--complete", "--toggle", "--server", "nginx", "--syscalls"],
        ),
        // Any HTTP server by its command.
        (
            "observe",
            &[
                "--complete",
                "--toggle",
                "--http-path",
                "/",
                "--",
                "node",
                node,
                "{port}",
            ],
        ),
        ("observe", &["--toggle"]),
    ] {
        let mut a = vec!["bench", bench];
        a.extend(args);
        a.extend(extra);
        let complete = extra.contains(&"--complete");
        let o = preheat(&a, &rd);
        let err = String::from_utf8_lossy(&o.stderr);
        if bench == "observe" && !o.status.success() && err.contains("root") {
            preheat_testsupport::skip("root", &format!("bench observe: {err}"));
            continue;
        }
        assert!(o.status.success(), "bench {bench}: {err}");
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(v["label"], "measured", "{v}");
        for k in [
            "throughput_loss_per_pair",
            "throughput_loss_blockwise_per_pair",
            "p50_delta_us_per_pair",
        ] {
            assert_eq!(v[k]["n"], 2, "bench {bench} {k}: {v}");
        }
        assert_eq!(v["with"]["n"], v["without"]["n"], "{v}");
        if bench == "observe" {
            // The observer's programs detached and attached again between blocks: every
            // request of the attached blocks still seen (one read period each, or close).
            assert_eq!(v["toggle"], extra.contains(&"--toggle"), "{v}");
            let seen = v["periods_per_request"]["median"].as_f64().unwrap_or(0.0);
            if complete {
                assert!((0.9..=1.1).contains(&seen), "bench {bench} {extra:?}: {v}");
                assert!(v["sampled_above_per_s"].is_null(), "{v}");
            } else {
                // Sampled: what it saw, and how much it was away, is reported.
                assert!((0.0..=1.1).contains(&seen), "bench {bench} {extra:?}: {v}");
                assert_eq!(v["sampled_above_per_s"], 10000, "{v}");
                assert_eq!(v["detached_share"]["n"], 2, "{v}");
            }
            let nginx = extra.contains(&"nginx");
            let server = match () {
                _ if nginx => "nginx",
                _ if extra.contains(&"node") => "node",
                _ => "preheat-kv",
            };
            assert_eq!(v["server"], server, "{v}");
            // Which programs ran: the scheduler form unless the syscall ones were asked for.
            assert_eq!(v["syscalls"].is_string(), nginx, "{v}");
        }
        // Its servers' agents leave no log behind (two pairs left two before).
        let logs: Vec<String> = agent_logs(&rd).into_iter().map(|(n, _)| n).collect();
        assert!(logs.is_empty(), "bench {bench} left agent logs: {logs:?}");
    }
}

fn has_pmu() -> bool {
    let o = Command::new(env!("CARGO_BIN_EXE_preheat"))
        .args(["topology", "--json"])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    v["pmu"].as_bool().unwrap()
}

/// Any server, not only the catalog: lighttpd (a Debian package outside the catalog) given by
/// its command, its port and the request; the HTTP reply is learned once and framed by length.
#[test]
fn demo_on_any_server_given_by_its_command() {
    let tmp = tempfile::tempdir().unwrap();
    let rd = run_dir(&tmp);
    // Bad input first: a command without its port or request is refused clearly.
    fails_with(
        &["demo", "--request", "/x", "--", "/bin/true"],
        &rd,
        &["--port"],
    );
    fails_with(
        &["demo", "--port", "1", "--", "/bin/true"],
        &rd,
        &["--request"],
    );
    // The connection's diagnostic row compares against auto's: without auto, refused at once.
    fails_with(
        &["demo", "--connection-row", "--strategies", "lines"],
        &rd,
        &["--connection-row", "add auto"],
    );
    let body = format!("<html>{}</html>\n", "any server ".repeat(300));
    let port = preheat_testsupport::free_port();
    let Some((exe, conf)) = preheat_testsupport::lighttpd_site(
        tmp.path(),
        port,
        &[("index.html", body.as_bytes())],
        "",
    ) else {
        return preheat_testsupport::skip("lighttpd", "lighttpd is not installed");
    };
    let port_s = port.to_string();
    let out = ok(
        &[
            &["demo", "--rounds", "3"][..],
            &common::QUICK_DEMO,
            &[
                "--strategies",
                "lines,replay",
                "--port",
                &port_s,
                "--protocol",
                "http",
                "--request",
                "/index.html",
                "--json",
                "--",
                exe.to_str().unwrap(),
                "-D",
                "-f",
                conf.to_str().unwrap(),
            ],
        ]
        .concat(),
        &rd,
    );
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["server"], "lighttpd");
    let rows = v["rows"].as_array().unwrap();
    for m in ["warm", "cold-sweep", "preheat:lines", "preheat:replay"] {
        let r = rows
            .iter()
            .find(|r| r["mode"] == m)
            .unwrap_or_else(|| panic!("mode {m} missing: {v}"));
        assert_eq!(r["latency"]["n"], 3, "{r}");
    }
    let lines = rows.iter().find(|r| r["mode"] == "preheat:lines").unwrap();
    assert!(lines["ws_kib"].as_f64().unwrap() > 0.0, "empty working set");
    // No server or agent outlives the command, and a demo that ended well leaves none of its
    // agents' logs in the run directory (without --keep-agent-logs).
    assert_no_agent_sockets(&rd);
    let logs: Vec<String> = agent_logs(&rd).into_iter().map(|(n, _)| n).collect();
    assert!(logs.is_empty(), "agent logs left behind: {logs:?}");
}

/// Tests whose outcome depends on the machine's timing (caches, wake-ups, deadlines):
/// `scripts/test.sh` runs every `timing::` test after all others, one at a time, so no other
/// test loads the two CPUs meanwhile.
mod timing {
    use super::*;

    /// lo's RPS masks, one per receive queue.
    fn lo_masks() -> Vec<String> {
        let mut v: Vec<(String, String)> = std::fs::read_dir("/sys/class/net/lo/queues")
            .map(|rd| {
                rd.flatten()
                    .filter(|e| e.file_name().to_string_lossy().starts_with("rx-"))
                    .filter_map(|e| {
                        let m = std::fs::read_to_string(e.path().join("rps_cpus")).ok()?;
                        Some((e.file_name().to_string_lossy().into(), m.trim().into()))
                    })
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v.into_iter().map(|(_, m)| m).collect()
    }

    /// `--steer-rx`: `on` steers lo's receive processing to the server's CPU for the table and
    /// says so; `auto` decides by its pilot and says what it measured; either way lo's masks are
    /// as before when the demo ends. One at a time (a machine setting: the timing pass).
    #[test]
    fn demo_steers_the_receive_path_and_puts_it_back() {
        if !common::euid_is_root() {
            return preheat_testsupport::skip("root", "RPS masks need root");
        }
        let before = lo_masks();
        if before.is_empty() {
            return preheat_testsupport::skip("rps", "lo has no RPS masks here");
        }
        let tmp = tempfile::tempdir().unwrap();
        let rd = run_dir(&tmp);
        for (mode, label) in [("on", "given"), ("auto", "measured")] {
            let out = ok(
                &[
                    &[
                        "demo",
                        "--rounds",
                        "4",
                        "--lead-us",
                        "1000",
                        // 8: the fewest paired rounds that bracket a 95% interval of the
                        // median (with 6 the pilot can only say "too few rounds").
                        "--pilot-rounds",
                        "8",
                    ][..],
                    &["--strategies", "auto,replay", "--steer-rx", mode],
                    &common::QUICK_DEMO,
                    &["--json"],
                ]
                .concat(),
                &rd,
            );
            let v: serde_json::Value = serde_json::from_str(&out).unwrap();
            let st = &v["steer_rx"];
            assert_eq!(st["label"], label, "{st}");
            if mode == "on" {
                assert_eq!(st["steered"], true, "{st}");
            } else {
                // The pilot's gain and its verdict, whichever way it went.
                assert!(st["gain_us"]["n"].as_u64().unwrap() > 0, "{st}");
                assert_eq!(
                    st["steered"].as_bool().unwrap(),
                    st["gain_us"]["p50_lo"].as_f64().unwrap() > 0.0,
                    "{st}"
                );
            }
            assert_eq!(
                lo_masks(),
                before,
                "lo's masks were not put back after --steer-rx {mode}"
            );
        }
        assert!(!std::path::Path::new("/run/preheat-rxsteer.journal").exists());
    }

    /// A demo killed outright while it steered leaves the original masks journaled: the next
    /// `preheat` command (any) puts them back. Played with the journal such a demo leaves.
    #[test]
    fn a_killed_steering_is_put_back_by_the_next_command() {
        if !common::euid_is_root() {
            return preheat_testsupport::skip("root", "RPS masks need root");
        }
        let knob = "/sys/class/net/lo/queues/rx-0/rps_cpus";
        let Ok(original) = std::fs::read_to_string(knob).map(|v| v.trim().to_string()) else {
            return preheat_testsupport::skip!("rps", "{knob} does not exist");
        };
        let journal = "/run/preheat-rxsteer.journal";
        struct Put(String);
        impl Drop for Put {
            fn drop(&mut self) {
                let _ = std::fs::write("/sys/class/net/lo/queues/rx-0/rps_cpus", &self.0);
                let _ = std::fs::remove_file("/run/preheat-rxsteer.journal");
            }
        }
        let _put = Put(original.clone());
        std::fs::write(journal, format!("{knob}\t{original}\n")).unwrap();
        std::fs::write(knob, "2").unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let rd = run_dir(&tmp);
        let _ = preheat(&["ws", "show", "/nonexistent.phws"], &rd);
        assert_eq!(std::fs::read_to_string(knob).unwrap().trim(), original);
        assert!(
            !std::path::Path::new(journal).exists(),
            "the journal was not removed"
        );
    }

    #[test]
    fn demo_measures_every_mode() {
        let tmp = tempfile::tempdir().unwrap();
        let rd = run_dir(&tmp);
        let json = tmp.path().join("demo.json");
        let out = ok(
            &[
                // A lead long enough for the agent to act on every announcement even when the
                // server's vCPU halted (at the default 65 µs the trigger thread can run after
                // the deadline: 1 run in 4 had no lines issued at all).
                &[
                    "demo",
                    "--rounds",
                    "6",
                    "--lead-us",
                    "1000",
                    "--pilot-rounds",
                    "8",
                    // The split at the server's system calls (the observer, root).
                    "--syscall-stages",
                    // The diagnostic row of the connection's own state.
                    "--connection-row",
                ][..],
                &common::QUICK_DEMO,
                &["--json", "--out", json.to_str().unwrap()],
            ]
            .concat(),
            &rd,
        );
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["label"], "measured");
        let rows = v["rows"].as_array().unwrap();
        let modes: Vec<&str> = rows.iter().map(|r| r["mode"].as_str().unwrap()).collect();
        // The hot floor uses the calibrated keep-awake mechanism; where the calibration found
        // none that beats plain idle, the server's threads held alone (the in-process agent
        // here); where the mechanism is unavailable (unprivileged), the demo says why.
        let calibration = &v["calibration"];
        assert_eq!(calibration["label"], "measured", "{calibration}");
        assert!(calibration["results"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["mech"] == "none"));
        let hot_skip = v["skipped"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["mode"] == "hot")
            .map(|s| s["reason"].as_str().unwrap().to_string());
        assert!(
            modes.contains(&"hot") != hot_skip.is_some(),
            "hot is measured or skipped with a reason: {}",
            v["skipped"]
        );
        if let Some(why) = &hot_skip {
            assert!(why.contains("unavailable"), "{why}");
        }
        assert!(v["wake_mechanism"].as_str().is_some_and(|s| !s.is_empty()));
        // The server CPU's branch prediction through an idle, measured in this run.
        let bp = &v["predictor"]["Ok"];
        assert_eq!(bp["n"], 41, "{}", v["predictor"]);
        for k in ["hot", "after_spin", "after_sleep"] {
            assert!(bp[k]["p50_us"].as_f64().is_some_and(|x| x > 0.0), "{bp}");
        }
        if modes.contains(&"hot") {
            let note = v["hot_floor"].as_str().unwrap();
            if calibration["best"].is_null() {
                assert!(note.contains("no CPU kept awake"), "{note}");
                assert!(note.contains("threads held"), "{note}");
            } else {
                assert!(note.contains("kept awake by"), "{note}");
            }
            // Shares are against hot only where this run showed hot below warm, from enough
            // rounds for a 95% interval of the median.
            let check = &v["floor_check"];
            let verified = check["verified"].as_bool().unwrap();
            let too_few = check["too_few_rounds"].as_bool().unwrap();
            assert_eq!(
                verified,
                !too_few && check["ci_us"][0].as_f64().unwrap() > 0.0,
                "{check}"
            );
            let floor = if verified { "hot" } else { "warm" };
            assert!(rows.iter().all(|r| r["floor"] == floor), "{check}");
            assert!(v["decomposition"]["cold_overhead_us"].is_number());
        }
        // Every mode has the stage split (the agent saw when the server thread started).
        for r in rows {
            assert!(r["start_us_p50"].as_f64().is_some(), "{r}");
            assert!(r["serve_us_p50"].as_f64().is_some(), "{r}");
        }
        // The client's socket is stamped on the loopback: every mode has its wire stage (the
        // client's own transmit), within start; every preheat mode its residual by stage.
        for r in rows {
            let start = r["start_us_p50"].as_f64().unwrap();
            let wire = r["wire_us_p50"].as_f64();
            assert!(wire.is_some_and(|w| w >= 0.0 && w <= start + 1.0), "{r}");
            if r["mode"].as_str().unwrap().starts_with("preheat:") {
                let d = &r["residual"];
                assert!(d["total_us"].is_number() && d["wire_us"].is_number(), "{r}");
            }
        }
        let samples = v["samples"].as_array().unwrap();
        assert!(samples.iter().all(|s| s["wire_us"].as_f64().is_some()));
        // --syscall-stages: as root the observer attached and split every mode's requests at
        // the server's read and write, the parts in order and within the response time;
        // otherwise the output says why it could not.
        let ss = &v["syscall_stages"];
        if common::euid_is_root() {
            // The eBPF observer ran (the kernel of this machine kind loads it; a fallback to
            // perf samples would say "did not load").
            assert!(
                ss["Ok"]
                    .as_str()
                    .is_some_and(|s| s.contains("observer") && s.contains("eBPF programs")),
                "{ss}"
            );
            assert!(!ss["Ok"].as_str().unwrap().contains("did not load"), "{ss}");
            for r in rows {
                let s = &r["syscall"];
                let p = |k: &str| s[k].as_f64().unwrap();
                assert!(s["n"].as_u64().unwrap() >= 4, "{r}");
                assert!(p("to_read_us") > 0.0 && p("compute_us") >= 0.0, "{r}");
                assert!((0.0..=p("to_read_us")).contains(&p("to_event_us")), "{r}");
                assert!(p("reply_us") > 0.0, "{r}");
            }
            let split = samples.iter().filter(|s| s["sys_compute_us"].is_number());
            for s in split {
                let parts: f64 = ["sys_to_read_us", "sys_compute_us", "sys_reply_us"]
                    .iter()
                    .map(|k| s[k].as_f64().unwrap())
                    .sum();
                let lat = s["latency_us"].as_f64().unwrap();
                assert!((parts - lat).abs() < 0.01, "{s}");
            }
        } else {
            assert!(ss["Err"].as_str().is_some_and(|s| !s.is_empty()), "{ss}");
        }
        // Shares outside ±100% are flagged, never silent.
        for r in rows {
            for k in [
                "overhead_removed",
                "removed_vs_warm",
                "removed_from_wire",
                "start_removed",
                "serve_removed",
            ] {
                if let Some(x) = r[k].as_f64() {
                    // Against warm (its CPU slept through the lead) more than all of it is
                    // expected where a mode kept the CPU awake: only a loss that large is odd.
                    let fine = if k == "removed_vs_warm" {
                        x >= -1.0
                    } else {
                        x.abs() <= 1.0
                    };
                    assert!(
                        fine || r["flags"]
                            .as_array()
                            .unwrap()
                            .iter()
                            .any(|f| { f.as_str().unwrap().contains("outside ±100%") }),
                        "{k} {x} of {} not flagged",
                        r["mode"]
                    );
                }
            }
        }
        for m in [
            "warm",
            "cold-idle",
            "cold-sweep",
            "control",
            "preheat:wake",
            "preheat:lines",
            "preheat:replay",
            "preheat:wake+lines",
            "preheat:wake+lines+replay",
        ] {
            assert!(modes.contains(&m), "mode {m} missing: {modes:?}");
        }
        // auto: a pilot of every combination of wake, lines and replay against none, and a
        // choice among those measured to help (or nothing), measured again as its own row.
        assert!(modes.contains(&"preheat:auto"), "{modes:?}");
        let auto = &v["auto"];
        let cands = auto["candidates"].as_array().unwrap();
        assert_eq!(cands.len(), 7, "{auto}");
        crate::any_server::assert_auto_chose_what_helped(&v);
        for c in cands {
            assert_eq!(c["gain_us"]["n"], 8, "{c}");
        }
        for r in rows {
            assert_eq!(r["latency"]["n"], 6, "{r}");
            assert!(r["latency"]["p50"].as_f64().unwrap() > 0.0);
        }
        // --connection-row: the diagnostic row was measured beside auto's, and the output
        // compares the two (auto less conn-primed, p50 differences, with both rows' counts).
        assert!(modes.contains(&"conn-primed"), "{modes:?}");
        let cs = &v["connection_state"];
        let row = |m: &str| rows.iter().find(|r| r["mode"] == m).unwrap();
        let p50 = |m: &str| row(m)["latency"]["p50"].as_f64().unwrap();
        assert_eq!(cs["mode"], "preheat:auto", "{cs}");
        let total = cs["total_us"].as_f64().unwrap();
        assert!(
            (total - (p50("preheat:auto") - p50("conn-primed"))).abs() < 1e-6,
            "{cs}"
        );
        assert!(
            cs["wire_us"].is_number() && cs["serve_us"].is_number(),
            "{cs}"
        );
        assert_eq!(cs["n"][0], row("preheat:auto")["latency"]["n"], "{cs}");
        assert_eq!(cs["n"][1], row("conn-primed")["latency"]["n"], "{cs}");
        // It isolates the connection's own state only where auto's warm-up already ran the
        // server's path.
        let chose = v["auto"]["chosen"].as_str().unwrap();
        assert_eq!(
            cs["isolates_connection"],
            chose.contains("replay"),
            "{cs} {chose}"
        );
        // Preheat rows carry the working-set metrics; the agent acted on the announcements.
        let lines = rows.iter().find(|r| r["mode"] == "preheat:lines").unwrap();
        assert!(lines["ws_kib"].as_f64().unwrap() > 0.0);
        assert!(lines["runs"].as_u64().unwrap() > 0);
        let samples = v["samples"].as_array().unwrap();
        let acted = samples
            .iter()
            .filter(|s| s["mode"] == "preheat:lines" && s["lines_total"].as_u64().unwrap_or(0) > 0)
            .count();
        assert!(acted > 0, "the agent never preheated lines");
        assert!(json.exists());
        // No server or agent outlives the command.
        assert_no_agent_sockets(&rd);
    }
}
