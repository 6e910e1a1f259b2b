//! `preheat guest` from the command line: its help, clear errors when QEMU or the kernel
//! package is missing, and no guest left running after the command is killed with SIGKILL;
//! and `preheat cosched run` on a real guest (its vCPU threads coscheduled). The tests that
//! boot guests hold `serial()`: one of them puts the vCPUs at real-time priorities.

use crate::common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{ok, preheat, run_dir};

#[test]
fn help_explains() {
    let tmp = tempfile::tempdir().unwrap();
    let out = ok(&["guest", "--help"], &run_dir(&tmp));
    for what in [
        "Debian packages",
        "CPU n/TCG",
        "qemu-system-x86",
        "SIGKILL",
        "cleanup",
    ] {
        assert!(out.contains(what), "{what}: {out}");
    }
}

#[test]
fn missing_qemu_is_named_at_once() {
    let tmp = tempfile::tempdir().unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_preheat"))
        .args(["guest", "run", "--vcpus", "1"])
        .env("PREHEAT_RUN_DIR", run_dir(&tmp))
        .env("PATH", tmp.path())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(
        err.contains("qemu-system-x86_64 is not installed")
            && err.contains("apt-get install qemu-system-x86"),
        "{err}"
    );
}

#[test]
fn missing_kernel_package_is_named() {
    if common::find_program("apt-cache").is_none() {
        preheat_testsupport::skip!("apt-cache", "not a Debian host (no apt-cache)");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let o = preheat(
        &[
            "guest",
            "build",
            "--kernel-package",
            "linux-image-0.0.0-none-amd64",
        ],
        &run_dir(&tmp),
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(
        err.contains("linux-image-0.0.0-none-amd64 is not available")
            && err.contains("apt-get update"),
        "{err}"
    );
}

/// QEMU, or a skip (a failure under CI, whose test command installs it).
fn qemu_or_skip() -> bool {
    if common::find_program("qemu-system-x86_64").is_some() {
        return true;
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "scripts/test.sh installs QEMU under CI"
    );
    preheat_testsupport::skip!("qemu-system-x86_64", "QEMU is not installed");
    false
}

fn start_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = stat.rsplit_once(')')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    (!matches!(f.first(), Some(&"Z"))).then(|| f.get(19)?.parse().ok())?
}

/// Tests that boot QEMU guests (TCG keeps both CPUs busy while they run): `scripts/test.sh`
/// runs every `timing::` test after all others, one at a time, so their load never meets a
/// test that measures, and theirs is not disturbed either.
mod timing {
    use super::*;

    /// `guest run --idle` killed with SIGKILL: its QEMU does not survive it (the parent-death
    /// signal kills it at once; `guest cleanup`, reading the journal, would otherwise), and the
    /// journal is empty afterwards.
    #[test]
    fn sigkill_leaves_no_guest_running() {
        if common::find_program("qemu-system-x86_64").is_none() {
            assert!(
                std::env::var_os("CI").is_none(),
                "scripts/test.sh installs QEMU under CI"
            );
            preheat_testsupport::skip!("qemu-system-x86_64", "QEMU is not installed");
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let rd = run_dir(&tmp);
        let mut cli = Command::new(env!("CARGO_BIN_EXE_preheat"))
            .args([
                "guest",
                "run",
                "--vcpus",
                "1",
                "--idle",
                "--name",
                "test-kill",
            ])
            .env("PREHEAT_RUN_DIR", &rd)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut qemu = None;
        for line in BufReader::new(cli.stdout.take().unwrap()).lines() {
            let line = line.unwrap();
            if let Some(rest) = line.split("QEMU pid ").nth(1) {
                qemu = rest.split(',').next().and_then(|p| p.parse::<u32>().ok());
            }
            if line.contains("idles") {
                break;
            }
        }
        let qemu = qemu.expect("the CLI names QEMU's pid");
        let ticks = start_ticks(qemu).expect("QEMU runs");
        assert!(
            rd.join(format!("guests/qemu-{qemu}.json")).exists(),
            "journaled"
        );
        cli.kill().unwrap();
        cli.wait().unwrap();
        let t0 = Instant::now();
        while start_ticks(qemu) == Some(ticks) && t0.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(20));
        }
        let out = ok(&["guest", "cleanup"], &rd);
        assert!(out.contains("orphaned guest(s) handled"), "{out}");
        assert_ne!(
            start_ticks(qemu),
            Some(ticks),
            "QEMU {qemu} outlived its command"
        );
        let left: Vec<_> = std::fs::read_dir(rd.join("guests"))
            .unwrap()
            .flatten()
            .collect();
        assert!(left.is_empty(), "journal entries left: {left:?}");
    }

    /// A VM that is a QEMU guest: `cosched run` boots it, coschedules its two `CPU n/TCG`
    /// threads until the kernel inside ends and the guest powers off, and leaves no QEMU behind
    /// — under `full` (partial-auto on guests, which regroups from the agent in QEMU, runs in
    /// `cosched_experiment_on_real_guests`). Nothing timed is asserted (the co-run fraction is
    /// the cosched tests' subject, detection the guest comm test's).
    #[test]
    fn cosched_runs_a_real_guest() {
        if !qemu_or_skip() || !common::realtime_or_skip("cosched_runs_a_real_guest") {
            return;
        }
        let _serial = common::serial();
        let policy = "full";
        let tmp = tempfile::tempdir().unwrap();
        let rd = run_dir(&tmp);
        let cfg = tmp.path().join("vms.json");
        let vms =
            r#"{"vms": [{"name": "g", "vcpus": 2, "guest": {"kernel": "mg", "seconds": 3}}]}"#;
        std::fs::write(&cfg, vms).unwrap();
        let cfg = cfg.to_str().unwrap();
        let args = [
            "cosched",
            "run",
            "--config",
            cfg,
            "--policy",
            policy,
            "--regroup-s",
            "1",
            "--duration",
            "60",
            "--json",
        ];
        let out = ok(&args, &rd);
        let v: serde_json::Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
        let vm = &v["vms"][0];
        let (pid, threads) = (
            vm["pid"].as_u64().unwrap() as u32,
            vm["threads"].as_array().unwrap(),
        );
        assert_eq!(threads.len(), 2, "{policy}: {out}");
        assert!(
            v["report"]["slices"].as_u64().unwrap() > 0,
            "{policy}: {out}"
        );
        assert!(
            v["report"]["elapsed_s"].as_f64().unwrap() < 50.0,
            "{policy}: ended with the guest: {out}"
        );
        assert_eq!(start_ticks(pid), None, "{policy}: QEMU {pid} is gone");
    }

    /// `bench cosched --guest` at its smallest (one pair of 2 s runs): the guest's phases/s
    /// under plain Linux and under full, their ratio with its sample count and the goal, every
    /// run's window and boot, labeled measured, and no QEMU or journal entry left. In `timing`
    /// for its load (two boots keep both CPUs busy); no measured value is asserted.
    #[test]
    fn bench_cosched_on_a_real_guest() {
        if !qemu_or_skip() || !common::realtime_or_skip("bench_cosched_on_a_real_guest") {
            return;
        }
        let _serial = common::serial();
        let tmp = tempfile::tempdir().unwrap();
        let rd = run_dir(&tmp);
        let args = [
            "bench",
            "cosched",
            "--guest",
            "--reps",
            "1",
            "--seconds",
            "2",
            "--json",
        ];
        let out = ok(&args, &rd);
        let v: serde_json::Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
        assert_eq!(
            (
                v["label"].as_str(),
                v["rate_unit"].as_str(),
                v["order"].as_str()
            ),
            (Some("measured"), Some("phases/s"), Some("ABBA")),
            "{v}"
        );
        assert_eq!(v["goal"].as_f64(), Some(0.95));
        assert!(
            v["vm"].as_str().unwrap().contains("2-vCPU QEMU guest"),
            "{v}"
        );
        assert_eq!(v["ratio"]["n"].as_u64(), Some(1), "{v}");
        for k in ["none_rates", "full_rates", "ratios"] {
            let x = v[k].as_array().unwrap();
            assert_eq!(x.len(), 1, "{k}: {v}");
            assert!(x[0].as_f64().is_some_and(|x| x > 0.0), "{k}: {v}");
        }
        for k in ["windows_s", "boot_s"] {
            let x = v[k].as_array().unwrap();
            assert_eq!(x.len(), 2, "{k}: {v}");
            assert!(x.iter().all(|x| x.as_f64().unwrap() > 0.5), "{k}: {v}");
        }
        nothing_left(&rd);
    }

    // `cosched experiment --guests` at its smallest runs through the lab: python/tests/
    // test_cosched.py::test_end_to_end_guests_quick_real_binary (the same assertions, plus the
    // lab's real-VM figures and report).
}

/// No QEMU of this run directory left running, no guest left in its journal.
fn nothing_left(rd: &std::path::Path) {
    assert!(
        qemu_of(rd).is_empty(),
        "QEMU left running: {:?}",
        qemu_of(rd)
    );
    let journal: Vec<_> = std::fs::read_dir(rd.join("guests"))
        .map(|d| d.flatten().collect())
        .unwrap_or_default();
    assert!(journal.is_empty(), "journal entries left: {journal:?}");
}

/// QEMU processes started with this run directory (they inherit `PREHEAT_RUN_DIR` from the
/// command that started them; other users' guests on a shared machine do not match).
fn qemu_of(rd: &std::path::Path) -> Vec<u32> {
    let want = format!("PREHEAT_RUN_DIR={}", rd.display());
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    procs
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
            comm.starts_with("qemu") && env.split(|b| *b == 0).any(|kv| kv == want.as_bytes())
        })
        .collect()
}
