//! `preheat cosched` end to end on this machine: a 2-thread set co-runs under `full`, a
//! controller killed with SIGKILL leaves no thread at a real-time priority (the watchdog, or the
//! next `restore`, puts them back), and bad configurations are refused clearly.

use crate::common;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{npb, preheat, realtime_or_skip, run_dir, serial};
use serde_json::json;

/// (policy, rt_priority) of a thread, from fields 41 and 40 of its stat.
fn sched_of(pid: u32, tid: u32) -> Option<(u32, u32)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")).ok()?;
    let f: Vec<&str> = s.rsplit_once(')')?.1.split_whitespace().collect();
    Some((f.get(38)?.parse().ok()?, f.get(37)?.parse().ok()?))
}

fn npb_threads(pid: u32) -> Vec<u32> {
    let mut v: Vec<u32> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|rd| {
            rd.flatten()
                .filter(|e| {
                    std::fs::read_to_string(e.path().join("comm"))
                        .is_ok_and(|n| n.starts_with("npb-"))
                })
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

struct Victim(Child);

impl Drop for Victim {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A 2-thread barrier-synchronised workload that runs for a while, its threads listed.
fn victim(seconds: u32) -> (Victim, Vec<u32>) {
    let child = Command::new(npb())
        .args([
            "mg",
            "--threads",
            "2",
            "--seconds",
            &seconds.to_string(),
            "--json",
        ])
        .stdout(Stdio::null())
        .spawn()
        .expect("start preheat-npb");
    let pid = child.id();
    let v = Victim(child);
    let t0 = Instant::now();
    loop {
        let t = npb_threads(pid);
        if t.len() == 2 {
            return (v, t);
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "npb threads did not appear"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn write_config(dir: &Path, body: &str) -> String {
    let p = dir.join("vms.json");
    std::fs::write(&p, body).unwrap();
    p.display().to_string()
}

/// One VM running a bundled kernel.
struct NpbVm<'a> {
    name: &'a str,
    vcpus: usize,
    kernel: &'a str,
    threads: usize,
    seconds: &'a str,
    sets: serde_json::Value,
}

/// A configuration of VMs running bundled kernels, written to `dir`.
fn npb_vms(dir: &Path, vms: &[NpbVm]) -> String {
    let npb = npb().display().to_string();
    let list: Vec<serde_json::Value> = vms
        .iter()
        .map(|v| {
            json!({
                "name": v.name, "vcpus": v.vcpus, "threads": "npb-", "sets": v.sets,
                "command": [npb, v.kernel, "--threads", v.threads.to_string(),
                            "--seconds", v.seconds, "--json"],
            })
        })
        .collect();
    write_config(dir, &json!({ "vms": list }).to_string())
}

/// No scratch directory of a coscheduler is left next to the journal.
/// (The watchdog removes it right after restoring the threads: allow it a moment.)
fn assert_no_scratch(dir: &Path) {
    let t0 = Instant::now();
    loop {
        let left: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("cosched-scratch-"))
            .collect();
        if left.is_empty() {
            return;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(3),
            "left behind: {left:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn kill_controller_and_check(watchdog: bool, sigterm: bool) {
    let tmp = tempfile::tempdir().unwrap();
    let rd = run_dir(&tmp);
    let (v, tids) = victim(30);
    let pid = v.0.id();
    let cfg = write_config(
        tmp.path(),
        &format!(
            r#"{{"vms": [{{"vcpus": 2, "pid": {pid}, "threads": "npb-", "sets": [[0, 1]]}}]}}"#
        ),
    );
    let journal = tmp.path().join("journal.json");
    let mut args = vec![
        "cosched".to_string(),
        "run".into(),
        "--config".into(),
        cfg,
        "--policy".into(),
        "full".into(),
        "--duration".into(),
        "30".into(),
        "--journal".into(),
        journal.display().to_string(),
    ];
    if !watchdog {
        args.push("--no-watchdog".into());
    }
    let mut ctl = Command::new(env!("CARGO_BIN_EXE_preheat"))
        .args(&args)
        .env("PREHEAT_RUN_DIR", &rd)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Wait until the workload's threads are real-time (the controller took them).
    let t0 = Instant::now();
    while !tids
        .iter()
        .all(|&t| sched_of(pid, t).is_some_and(|(p, _)| p == 1))
    {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the controller never made the threads SCHED_FIFO: {:?}",
            tids.iter().map(|&t| sched_of(pid, t)).collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(journal.exists(), "no journal while the controller runs");
    if sigterm {
        // SIGTERM: the controller itself restores, then exits (no watchdog in this variant).
        preheat_engine::os::send_signal(ctl.id(), libc::SIGTERM, false).unwrap();
        let code = ctl.wait().unwrap();
        assert!(!code.success(), "exit after SIGTERM: {code}");
        assert!(
            tids.iter()
                .all(|&t| sched_of(pid, t).is_some_and(|(p, prio)| p == 0 && prio == 0)),
            "SIGTERM left threads real-time: {:?}",
            tids.iter().map(|&t| sched_of(pid, t)).collect::<Vec<_>>()
        );
        assert!(!journal.exists(), "the journal is removed after SIGTERM");
        assert_no_scratch(tmp.path());
        eprintln!("restored by the controller itself on SIGTERM");
        return;
    }
    ctl.kill().unwrap(); // SIGKILL
    ctl.wait().unwrap();
    if !watchdog {
        std::thread::sleep(Duration::from_millis(300));
        assert!(
            tids.iter()
                .all(|&t| sched_of(pid, t).is_some_and(|(p, _)| p == 1)),
            "without a watchdog the threads stay as the dead controller left them"
        );
        let o = preheat(
            &["cosched", "restore", "--journal", journal.to_str().unwrap()],
            &rd,
        );
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(out.contains("restored"), "{out}");
    }
    let t0 = Instant::now();
    while !tids
        .iter()
        .all(|&t| sched_of(pid, t).is_some_and(|(p, prio)| p == 0 && prio == 0))
    {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "a thread was left at a real-time priority after SIGKILL: {:?}",
            tids.iter().map(|&t| sched_of(pid, t)).collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!(
        "restored after SIGKILL by {} in {:?}",
        if watchdog {
            "the watchdog"
        } else {
            "`preheat cosched restore`"
        },
        t0.elapsed()
    );
    // The watchdog restores the threads first and removes the journal after: wait for that too
    // (bounded), rather than racing it (seen once in a suite run: checked ~20 ms after the last
    // thread was restored, the journal was still there).
    let t1 = Instant::now();
    while journal.exists() && t1.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        !journal.exists(),
        "the journal is removed once restored (waited {:?})",
        t1.elapsed()
    );
    assert_no_scratch(tmp.path());
    drop(v);
}

#[test]
fn sigkill_leaves_no_realtime_thread_watchdog() {
    let _serial = serial();
    if realtime_or_skip("sigkill_leaves_no_realtime_thread_watchdog") {
        kill_controller_and_check(true, false);
    }
}

#[test]
fn sigkill_then_restore_command() {
    let _serial = serial();
    if realtime_or_skip("sigkill_then_restore_command") {
        kill_controller_and_check(false, false);
    }
}

#[test]
fn sigterm_restores_before_exit() {
    let _serial = serial();
    if realtime_or_skip("sigterm_restores_before_exit") {
        kill_controller_and_check(false, true);
    }
}

#[test]
fn bad_configurations_are_refused_clearly() {
    let tmp = tempfile::tempdir().unwrap();
    let rd = run_dir(&tmp);
    let cases = [
        (r#"{"vms": []}"#, "no VMs"),
        (
            r#"{"vms": [{"vcpus": 64, "pid": 1}]}"#,
            "larger than the host",
        ),
        (
            r#"{"vms": [{"vcpus": 2}]}"#,
            "exactly one of \"command\", \"pid\" and \"guest\"",
        ),
        (
            r#"{"vms": [{"vcpus": 1, "pid": 1, "guest": {"kernel": "mg", "seconds": 1}}]}"#,
            "exactly one of",
        ),
        (
            r#"{"vms": [{"vcpus": 2, "pid": 1, "sets": [[0, 2]]}]}"#,
            "names vCPU 2",
        ),
        (r#"{"vms": [{"vcpus": 1, "pid": 1, "bogus": 1}]}"#, "bogus"),
        (r#"{"vms": [{"vcpus": 1, "pid": 4000000}]}"#, "no process"),
    ];
    for (body, want) in cases {
        let cfg = write_config(tmp.path(), body);
        let o = preheat(
            &[
                "cosched",
                "run",
                "--config",
                &cfg,
                "--policy",
                "none",
                "--duration",
                "1",
            ],
            &rd,
        );
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{body} was accepted");
        assert!(err.contains(want), "{body}: expected {want:?} in: {err}");
    }
    let o = preheat(&["cosched", "run", "--config", "/nonexistent.json"], &rd);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("nonexistent"));
    let cfg = write_config(tmp.path(), r#"{"vms": [{"vcpus": 1, "pid": 1}]}"#);
    let o = preheat(&["cosched", "run", "--config", &cfg, "--cpus", "99"], &rd);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("CPU 99 does not exist"));
}

/// A VM whose process ends mid-run: the controller notes it and goes on with the others.
#[test]
fn a_vm_that_exits_mid_run() {
    let _serial = serial();
    if !realtime_or_skip("a_vm_that_exits_mid_run") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let rd = run_dir(&tmp);
    let cfg = npb_vms(
        tmp.path(),
        &[
            NpbVm {
                name: "short",
                vcpus: 1,
                kernel: "ep",
                threads: 1,
                seconds: "0.5",
                sets: json!([]),
            },
            NpbVm {
                name: "long",
                vcpus: 1,
                kernel: "ep",
                threads: 1,
                seconds: "2.5",
                sets: json!([]),
            },
        ],
    );
    let journal = tmp.path().join("journal.json");
    let o = preheat(
        &[
            "cosched",
            "run",
            "--config",
            &cfg,
            "--policy",
            "full",
            "--duration",
            "2",
            "--journal",
            journal.to_str().unwrap(),
            "--json",
        ],
        &rd,
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let r = &v["report"];
    let notes = r["notes"].to_string();
    assert!(notes.contains("exited during the run"), "{notes}");
    let ran: Vec<f64> = r["vcpu_run_s"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect();
    assert!(ran[1] > ran[0], "the long VM ran {ran:?}");
    assert!(r["elapsed_s"].as_f64().unwrap() > 1.0, "{r}");
    // Where the controller's time goes: every stage of a switch timed in every slice, and the
    // scheduling calls counted one by one (together, every syscall the report counts).
    let cost = &r["cost"];
    let stages: Vec<&str> = cost["stages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["stage"].as_str().unwrap())
        .collect();
    assert_eq!(
        stages,
        ["readiness", "plan", "demote", "clocks", "account", "raise"],
        "{cost}"
    );
    let calls: u64 = cost["calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["count"].as_u64().unwrap())
        .sum();
    assert_eq!(calls, r["syscalls"].as_u64().unwrap(), "{cost}");
    assert!(!journal.exists());
}

/// partial-auto with the second grouping method (`--group-method modularity`): it regroups
/// from the agents' matrices, every grouping a partition of the VM's vCPUs; an unknown method
/// is refused by name. (Whether detection finds the truth is `comm.rs`'s test.)
#[test]
fn partial_auto_groups_with_modularity() {
    let _serial = serial();
    if !realtime_or_skip("partial_auto_groups_with_modularity") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let rd = run_dir(&tmp);
    let vm = NpbVm {
        name: "vm1",
        vcpus: 2,
        kernel: "mg",
        threads: 2,
        // Longer than the run (4 s): the VM is there for every regroup, also when a loaded
        // suite makes it start late (with 2.5 s it once exited before the first report was
        // read, and the run had no regroup).
        seconds: "6",
        sets: json!([[0, 1]]),
    };
    let cfg = npb_vms(tmp.path(), &[vm]);
    let journal = tmp.path().join("journal.json").display().to_string();
    let args = [
        "cosched",
        "run",
        "--config",
        &cfg,
        "--policy",
        "partial-auto",
        "--group-method",
        "modularity",
        "--regroup-s",
        "0.5",
        "--duration",
        "4",
        "--json",
        "--journal",
        &journal,
    ];
    let o = preheat(&args, &rd);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = String::from_utf8_lossy(&o.stdout);
    let v: serde_json::Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
    let regroups = v["report"]["regroups"].as_array().unwrap();
    assert!(!regroups.is_empty(), "no regroup: {v}");
    for g in regroups {
        let mut members: Vec<u64> = g["sets"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|s| s.as_array().unwrap().iter().map(|x| x.as_u64().unwrap()))
            .collect();
        members.sort_unstable();
        assert_eq!(members, [0, 1], "not a partition of the vCPUs: {g}");
    }
    let mut bad = args.to_vec();
    bad[7] = "louvain";
    let o = preheat(&bad, &rd);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("louvain") && err.contains("modularity"),
        "{err}"
    );
}

/// Without permission for real-time scheduling: a clear message, and `none` still works.
#[test]
fn unprivileged_gets_a_clear_message() {
    let Some(setpriv) = common::find_program("setpriv") else {
        preheat_testsupport::skip("setpriv", "setpriv (util-linux) not found");
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    // Readable by the unprivileged user.
    let dir = tmp.path().join("u");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(
        tmp.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    // The unprivileged user manages a process of its own: a sleeping one it starts itself.
    let cfg = dir.join("vms.json");
    std::fs::write(
        &cfg,
        r#"{"vms": [{"vcpus": 1, "command": ["sleep", "3"]}]}"#,
    )
    .unwrap();
    std::fs::set_permissions(&cfg, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    let run = |policy: &str| {
        Command::new(&setpriv)
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .arg(env!("CARGO_BIN_EXE_preheat"))
            .args(["cosched", "run", "--config"])
            .arg(&cfg)
            .args(["--policy", policy, "--duration", "0.5", "--journal"])
            .arg(dir.join("journal.json"))
            .env("PREHEAT_RUN_DIR", &dir)
            .env("TMPDIR", &dir)
            .output()
            .unwrap()
    };
    let o = run("full");
    let err = String::from_utf8_lossy(&o.stderr);
    if err.contains("Permission denied") && !err.contains("real-time") {
        preheat_testsupport::skip!(
            "readable-target",
            "the test binary is not readable by nobody: {err}"
        );
        return;
    }
    assert!(!o.status.success(), "full without privilege succeeded");
    assert!(
        err.contains("no permission for real-time scheduling") && err.contains("--policy none"),
        "{err}"
    );
    let o = run("none");
    assert!(
        o.status.success(),
        "none without privilege: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Tests whose outcome depends on the machine's timing: `scripts/test.sh` runs every `timing::`
/// test after all others, one at a time, so no other test (a QEMU guest's boot, a demo) loads
/// the two CPUs meanwhile.
mod timing {
    use super::*;

    /// The simulator's 2-CPU prediction against a short real run of the same configuration:
    /// reported with the difference; asserted only on gross structure (partial-static must beat
    /// full clearly in single, where a CPU idles half the time under full — predicted +100% before
    /// contention). Single only: the lab's end-to-end test (python/tests/test_cosched.py) runs
    /// every policy in both scenarios through the same command.
    #[test]
    fn simulator_against_a_short_real_run() {
        let _serial = serial();
        if !realtime_or_skip("simulator_against_a_short_real_run") {
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let rd = run_dir(&tmp);
        let o = preheat(
            &[
                "cosched",
                "experiment",
                "--kernels",
                "ep",
                "--scenarios",
                "single",
                "--policies",
                "full,partial-static",
                "--reps",
                "2",
                "--seconds",
                "2",
                "--json",
            ],
            &rd,
        );
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(v["label"], "measured");
        // Every run says how much of the machine other processes and the hypervisor took.
        for c in v["cells"].as_array().unwrap() {
            let others = c["others_share"].as_f64().expect("others_share measured");
            assert!((0.0..=1.0).contains(&others), "{c}");
            assert!(c["steal_share"].as_f64().is_some(), "{c}");
        }
        let rows = v["rows"].as_array().unwrap();
        assert_eq!(rows.len(), 1, "{v}");
        assert!(rows[0]["foreign_load_runs"].is_u64(), "{v}");
        for r in rows {
            let m = r["improvement_over_full"].as_f64().unwrap();
            let sim = r["simulated"].as_f64().unwrap();
            eprintln!(
                "{} {}: measured {:+.0}% [{:+.0}%, {:+.0}%] (n = {}), simulated {:+.0}%, predicted \
                 {:+.0}%: difference simulated − measured {:+.0} points",
                r["scenario"],
                r["policy"],
                100.0 * m,
                100.0 * r["ci_lo"].as_f64().unwrap(),
                100.0 * r["ci_hi"].as_f64().unwrap(),
                r["n"],
                100.0 * sim,
                100.0 * r["predicted"].as_f64().unwrap(),
                100.0 * (sim - m)
            );
            if r["scenario"] == "single" {
                assert!(m > 0.3, "partial-static single only {m:+.2} over full");
            }
            assert!(m > -0.2 && m < 1.5, "implausible improvement {m}");
        }
    }

    #[test]
    fn a_two_thread_set_co_runs_under_full() {
        let _serial = serial();
        if !realtime_or_skip("a_two_thread_set_co_runs_under_full") {
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let rd = run_dir(&tmp);
        let cfg = npb_vms(
            tmp.path(),
            &[
                NpbVm {
                    name: "vm1",
                    vcpus: 2,
                    kernel: "mg",
                    threads: 2,
                    seconds: "4",
                    sets: json!([[0, 1]]),
                },
                NpbVm {
                    name: "vm2",
                    vcpus: 1,
                    kernel: "mg",
                    threads: 1,
                    seconds: "4",
                    sets: json!([]),
                },
            ],
        );
        let journal = tmp.path().join("journal.json");
        let mut corun = Vec::new();
        for policy in ["full", "none"] {
            let o = preheat(
                &[
                    "cosched",
                    "run",
                    "--config",
                    &cfg,
                    "--policy",
                    policy,
                    "--duration",
                    "3",
                    "--cpus",
                    "0,1",
                    "--journal",
                    journal.to_str().unwrap(),
                    "--json",
                ],
                &rd,
            );
            assert!(
                o.status.success(),
                "{policy}: {}",
                String::from_utf8_lossy(&o.stderr)
            );
            let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
            let r = &v["report"];
            let set = r["sets"]
                .as_array()
                .unwrap()
                .iter()
                .find(|s| s["members"] == serde_json::json!([0, 1]))
                .unwrap_or_else(|| panic!("{policy}: no co-run figure for set [0, 1]: {r}"));
            let f = set["corun_fraction"].as_f64().unwrap();
            eprintln!(
                "{policy}: co-run fraction of the 2-thread set {:.3} (lower bound {:.3}, {} windows), \
                 idle {:?}, leak {:?} (measured)",
                f, set["corun_lower"], set["windows"], r["idle_cpu_share"], r["leak_share"]
            );
            corun.push(f);
            if policy == "full" {
                // Structure: the plan alternated the two VMs, leaving one CPU idle half the time.
                let planned_idle = r["planned_idle_share"].as_f64().unwrap();
                assert!(
                    (0.15..0.35).contains(&planned_idle),
                    "planned idle {planned_idle}"
                );
                assert!(r["leak_share"].as_f64().unwrap() < 0.1, "{r}");
            }
            assert!(!journal.exists(), "{policy}: the journal was not removed");
        }
        // Floor: under full both members are given the CPUs together in every VM1 slice; what can
        // separate them is only the controller's switch (~0.1-0.2 ms of a 10 ms slice) and the 5%
        // real-time throttling leaves to other tasks. Measured here: 0.97-0.99. A floor of 0.8
        // leaves room for a noisy neighbour and still fails if enforcement breaks (plain Linux
        // gives this pair ~0.5-0.7 with a third thread competing).
        assert!(corun[0] >= 0.8, "co-run fraction under full {}", corun[0]);
    }
}
