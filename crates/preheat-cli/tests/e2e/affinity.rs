//! `preheat affinity` end to end: the experiment matrix from fake sysfs trees (this kind of
//! box, a Clovertown-like and a Niagara-like machine), the base vectors' measured eviction, one
//! small cell of each experiment through the CLI (structure and gross errors only: timings are
//! reported, never pass/fail), bad input refused clearly, and nothing left running afterwards —
//! also when the controller is stopped with SIGTERM or killed with SIGKILL.

use crate::common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{find_program, preheat, realtime_or_skip, run_dir, serial};
use serde_json::Value;

/// One cache of a fake sysfs CPU.
struct C {
    level: u32,
    kind: &'static str,
    size: &'static str,
    shared: String,
}

fn c(level: u32, kind: &'static str, size: &'static str, shared: &str) -> C {
    C {
        level,
        kind,
        size,
        shared: shared.into(),
    }
}

/// Write a fake /sys/devices/system/cpu with `n` CPUs; `caches(cpu)` lists each CPU's caches.
fn fake_sysfs(root: &Path, n: u32, caches: impl Fn(u32) -> Vec<C>) {
    std::fs::create_dir_all(root).unwrap();
    std::fs::write(root.join("online"), format!("0-{}\n", n - 1)).unwrap();
    for cpu in 0..n {
        let d = root.join(format!("cpu{cpu}"));
        std::fs::create_dir_all(d.join("topology")).unwrap();
        std::fs::write(d.join("topology/core_id"), format!("{cpu}\n")).unwrap();
        std::fs::write(d.join("topology/physical_package_id"), "0\n").unwrap();
        for (i, k) in caches(cpu).iter().enumerate() {
            let x = d.join(format!("cache/index{i}"));
            std::fs::create_dir_all(&x).unwrap();
            std::fs::write(x.join("level"), format!("{}\n", k.level)).unwrap();
            std::fs::write(x.join("type"), format!("{}\n", k.kind)).unwrap();
            std::fs::write(x.join("size"), format!("{}\n", k.size)).unwrap();
            std::fs::write(x.join("coherency_line_size"), "64\n").unwrap();
            std::fs::write(x.join("shared_cpu_list"), format!("{}\n", k.shared)).unwrap();
        }
    }
}

fn topology_json(root: &Path) -> Value {
    let tmp = tempfile::tempdir().unwrap();
    let o = preheat(
        &[
            "affinity",
            "topology",
            "--json",
            "--sysfs",
            root.to_str().unwrap(),
        ],
        &run_dir(&tmp),
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

fn names(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_str().unwrap().to_string())
        .collect()
}

#[test]
fn the_matrix_follows_the_topology() {
    let tmp = tempfile::tempdir().unwrap();
    // This kind of box: 2 CPUs, private L1/L2, one shared L3.
    let ours = tmp.path().join("ours");
    fake_sysfs(&ours, 2, |cpu| {
        vec![
            c(1, "Data", "48K", &cpu.to_string()),
            c(1, "Instruction", "32K", &cpu.to_string()),
            c(2, "Unified", "2048K", &cpu.to_string()),
            c(3, "Unified", "32768K", "0-1"),
        ]
    });
    let t = topology_json(&ours);
    assert_eq!(t["source"], ours.to_str().unwrap());
    let t2 = &t["table2"];
    assert_eq!(t2["paper_exact"], false);
    assert_eq!(t2["retention_level"], "L3");
    assert_eq!(t2["concurrent_cpu"], 1);
    assert_eq!(t2["cells"].as_array().unwrap().len(), 24, "{t2}");
    let vectors: Vec<(String, u64)> = t["vectors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            (
                v["name"].as_str().unwrap().into(),
                v["bytes"].as_u64().unwrap(),
            )
        })
        .collect();
    assert!(
        vectors.contains(&("BV_L1D".into(), 48 << 10)),
        "{vectors:?}"
    );
    assert!(vectors.contains(&("BV_L1I".into(), 32 << 10)));
    assert!(vectors.contains(&("BV_L2".into(), 2 << 20)));
    assert!(vectors.contains(&("BV_LLC".into(), 32 << 20)));
    for cell in t2["cells"].as_array().unwrap() {
        if cell["retention"] == "low" {
            assert_eq!(cell["concurrent"], "BV_LLC", "{cell}");
            assert!(
                cell["substitute"].is_string(),
                "a substitute says so: {cell}"
            );
        }
    }
    assert_eq!(names(&t["table3"]["lost_on_move"]), ["L1d", "L1i", "L2"]);
    assert_eq!(names(&t["table3"]["kept_on_move"]), ["L3"]);

    // Clovertown-like: 4 CPUs, L2 shared by {0,1} and {2,3}: exactly the paper's cells.
    let clover = tmp.path().join("clovertown");
    fake_sysfs(&clover, 4, |cpu| {
        let pair = if cpu < 2 { "0-1" } else { "2-3" };
        vec![
            c(1, "Data", "32K", &cpu.to_string()),
            c(1, "Instruction", "32K", &cpu.to_string()),
            c(2, "Unified", "4096K", pair),
        ]
    });
    let t = topology_json(&clover);
    assert_eq!(t["table2"]["paper_exact"], true);
    assert_eq!(t["table2"]["concurrent_cpu"], 1);
    assert_eq!(t["table2"]["cells"].as_array().unwrap().len(), 18);
    assert!(t["table2"]["cells"]
        .as_array()
        .unwrap()
        .iter()
        .all(|c| c["substitute"].is_null()));
    assert_eq!(t["table3"]["main_copies"], 4);

    // Niagara-like: 8 cores, small L1s, one L2 shared by all.
    let niagara = tmp.path().join("niagara");
    fake_sysfs(&niagara, 8, |cpu| {
        vec![
            c(1, "Data", "8K", &cpu.to_string()),
            c(1, "Instruction", "16K", &cpu.to_string()),
            c(2, "Unified", "3072K", "0-7"),
        ]
    });
    let t = topology_json(&niagara);
    assert_eq!(t["table2"]["paper_exact"], true);
    assert_eq!(t["table2"]["cells"].as_array().unwrap().len(), 18);
    assert_eq!(names(&t["table3"]["kept_on_move"]), ["L2"]);
    let human = preheat(
        &["affinity", "topology", "--sysfs", niagara.to_str().unwrap()],
        &run_dir(&tmp),
    );
    let text = String::from_utf8_lossy(&human.stdout);
    assert!(
        text.contains("shared by CPUs [0, 1, 2, 3, 4, 5, 6, 7]"),
        "{text}"
    );
    assert!(text.contains("exactly the paper's cells"), "{text}");

    // Not a sysfs tree: a clear error.
    let o = preheat(
        &[
            "affinity",
            "topology",
            "--sysfs",
            tmp.path().to_str().unwrap(),
        ],
        &run_dir(&tmp),
    );
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("no CPUs found"));
}

fn run_json(args: &[&str]) -> Value {
    let tmp = tempfile::tempdir().unwrap();
    let mut a = vec!["affinity", "run", "--json"];
    a.extend_from_slice(args);
    let o = preheat(&a, &run_dir(&tmp));
    assert!(
        o.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).unwrap()
}

/// Command lines of the running processes that contain `what`.
fn running(what: &str) -> Vec<String> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains(what))
        .collect()
}

/// No `preheat affinity worker` process is left, waiting up to 3 s.
fn no_workers_left(what: &str) {
    let t0 = Instant::now();
    loop {
        let left = running("affinity worker");
        if left.is_empty() {
            return;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(3),
            "{what}: left running: {left:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn one_cell_of_each_experiment_runs_and_reports_its_quanta() {
    let _g = serial();
    if !realtime_or_skip("one_cell_of_each_experiment_runs_and_reports_its_quanta") {
        return;
    }
    // Section 2, low L1 affinity, low retention, with the concurrent vector.
    let r = run_json(&[
        "--workload",
        "chase",
        "--interleave",
        "BV_L1D",
        "--concurrent",
        "BV_LLC",
        "--quantum-ms",
        "2",
        "--cpu-ms",
        "150",
    ]);
    assert_eq!(r["kind"], "measured");
    assert_eq!(r["experiment"], "table2");
    assert_eq!(r["cell"]["affinity"], "low-d");
    assert_eq!(r["cell"]["retention"], "low");
    assert!(r["rate"].as_f64().unwrap() > 0.0);
    let q = &r["quanta"];
    assert_eq!(q["mechanism"], "fifo-priority-swap");
    let p50 = q["main"]["p50_ms"].as_f64().unwrap();
    eprintln!(
        "quanta (measured, 2 ms requested): main p50 {p50:.3} ms p99 {:.3} ms n {}; vector p50 {:.3} ms",
        q["main"]["p99_ms"].as_f64().unwrap(),
        q["main"]["n"],
        q["vector"]["p50_ms"].as_f64().unwrap()
    );
    // Gross errors only: a quantum off by half means the controller is broken.
    assert!(
        (1.0..3.0).contains(&p50),
        "main quanta p50 {p50} ms for 2 ms"
    );
    assert!(
        !r["refill"].as_array().unwrap().is_empty(),
        "refill profile: {r}"
    );
    no_workers_left("table2 cell");

    // Win-back: the warm thread preheats at every resume and its cost is counted.
    let r = run_json(&[
        "--workload",
        "chase",
        "--interleave",
        "BV_L2",
        "--quantum-ms",
        "2",
        "--cpu-ms",
        "150",
        "--preheat",
    ]);
    assert!(r["preheats"].as_u64().unwrap() > 10, "{r}");
    assert!(r["preheat_cpu_s"].as_f64().unwrap() > 0.0);
    assert!(r["rate_with_preheat_cost"].as_f64().unwrap() <= r["rate"].as_f64().unwrap());

    // Section 3, low affinity: every copy reports.
    let r = run_json(&[
        "--experiment",
        "table3",
        "--workload",
        "chase",
        "--interfering",
        "stream",
        "--affinity",
        "low",
        "--cpu-ms",
        "150",
    ]);
    assert_eq!(r["experiment"], "table3");
    assert_eq!(r["copies"].as_array().unwrap().len(), 2, "{r}");
    no_workers_left("table3 cell");

    // A program (Debian package) interleaved with the code vector.
    match find_program("gzip") {
        Some(_) => {
            let r = run_json(&[
                "--workload",
                "gzip",
                "--interleave",
                "BV_L1I",
                "--quantum-ms",
                "10",
            ]);
            eprintln!(
                "gzip cell (measured): {} jobs per CPU-second, quanta {}",
                r["rate"], r["quanta"]
            );
            assert_eq!(r["metric"], "jobs per CPU-second");
            assert!(r["cpu_s"].as_f64().unwrap() > 0.01);
            assert!(r["quanta"]["main"]["n"].as_u64().unwrap() > 3, "{r}");
        }
        None => {
            assert!(
                std::env::var_os("CI").is_none(),
                "gzip is installed by the test command"
            );
            preheat_testsupport::skip("gzip", "program cell: gzip is not installed");
        }
    }
}

#[test]
fn bad_input_is_refused_clearly_and_leaves_nothing_behind() {
    let _g = serial();
    let tmp = tempfile::tempdir().unwrap();
    let rd = run_dir(&tmp);
    let err = |args: &[&str], want: &str| {
        let mut a = vec!["affinity", "run"];
        a.extend_from_slice(args);
        let o = preheat(&a, &rd);
        let e = String::from_utf8_lossy(&o.stderr).to_string();
        assert!(!o.status.success(), "{args:?} succeeded");
        assert!(e.contains(want), "{args:?}: wanted {want:?} in {e}");
    };
    err(
        &["--workload", "chase", "--cpu", "77"],
        "CPU 77 is not in the machine",
    );
    err(
        &[
            "--workload",
            "chase",
            "--interleave",
            "BV_0",
            "--quantum-ms",
            "0.1",
        ],
        "outside 1..10000",
    );
    err(
        &["--workload", "chase", "--interleave", "BV_L7"],
        "no base vector BV_L7",
    );
    err(&["--workload", "nosuch"], "unknown workload");
    err(
        &["--workload", "chase", "--concurrent", "BV_LLC"],
        "needs --interleave",
    );
    err(&[], "give --workload");
    if realtime_or_skip("bad_input_is_refused_clearly_and_leaves_nothing_behind") {
        // A program that fails, and one that crashes: its measurement is void, and said so.
        err(&["--interleave", "BV_0", "--", "false"], "exit code 1");
        err(
            &["--interleave", "BV_0", "--", "sh", "-c", "kill -SEGV $$"],
            "killed by signal 11",
        );
    }
    no_workers_left("bad input");
}

#[test]
fn a_stopped_or_killed_controller_leaves_nothing_running() {
    let _g = serial();
    if !realtime_or_skip("a_stopped_or_killed_controller_leaves_nothing_running") {
        return;
    }
    for sig in ["TERM", "KILL"] {
        let tmp = tempfile::tempdir().unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_preheat"))
            .args([
                "affinity",
                "run",
                "--workload",
                "chase",
                "--interleave",
                "BV_L1D",
                "--concurrent",
                "BV_LLC",
                "--cpu-ms",
                "20000",
            ])
            .env("PREHEAT_RUN_DIR", run_dir(&tmp))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Wait until the workers run.
        let t0 = Instant::now();
        while running("affinity worker workload").is_empty()
            && t0.elapsed() < Duration::from_secs(20)
        {
            std::thread::sleep(Duration::from_millis(50));
        }
        std::thread::sleep(Duration::from_millis(300));
        let signo = if sig == "TERM" {
            libc::SIGTERM
        } else {
            libc::SIGKILL
        };
        preheat_engine::os::send_signal(child.id(), signo, false).unwrap();
        let st = child.wait().unwrap();
        if sig == "TERM" {
            assert_eq!(st.code(), Some(143), "SIGTERM: exit 128 + 15");
        }
        no_workers_left(&format!("controller got SIG{sig}"));
        // Its scratch directory is gone at once (SIGTERM) or with the next command (SIGKILL).
        let mine = format!("preheat-affinity-{}-", child.id());
        let left = |what: &str| {
            let left: Vec<_> = std::fs::read_dir(std::env::temp_dir())
                .unwrap()
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with(&mine))
                .map(|e| e.path())
                .collect();
            assert!(left.is_empty(), "SIG{sig}, {what}: left {left:?}");
        };
        if sig == "TERM" {
            left("after exit");
        }
        let _ = preheat(
            &["affinity", "run", "--workload", "chase", "--cpu-ms", "20"],
            &run_dir(&tmp),
        );
        left("after the next command");
    }
}

#[test]
fn unprivileged_falls_back_to_stop_and_continue() {
    let _g = serial();
    let Some(setpriv) = find_program("setpriv") else {
        assert!(
            std::env::var_os("CI").is_none(),
            "setpriv (util-linux) is on every CI image"
        );
        preheat_testsupport::skip("setpriv", "setpriv (util-linux) not found");
        return;
    };
    // A copy of the binary that user nobody can execute (the target dir may not be readable).
    let tmp = tempfile::tempdir().unwrap();
    let bin = tmp.path().join("preheat");
    std::fs::copy(env!("CARGO_BIN_EXE_preheat"), &bin).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    let run = |extra: &[&str]| {
        let mut c = Command::new(&setpriv);
        c.args(["--reuid", "nobody", "--regid", "nogroup", "--clear-groups"])
            .args(["--inh-caps=-all", "--bounding-set=-all"])
            .arg(&bin)
            .args([
                "affinity",
                "run",
                "--workload",
                "chase",
                "--interleave",
                "BV_L1D",
            ])
            .args(["--cpu-ms", "150"])
            .args(extra)
            .current_dir(tmp.path());
        c.output().unwrap()
    };
    let o = run(&["--json"]);
    if !o.status.success() && String::from_utf8_lossy(&o.stderr).contains("setpriv") {
        preheat_testsupport::skip!(
            "root",
            "cannot switch user here: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        return;
    }
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["quanta"]["mechanism"], "sigstop-sigcont", "{r}");
    assert!(r["notes"][0]
        .as_str()
        .unwrap()
        .contains("no permission for real-time"));
    let p50 = r["quanta"]["main"]["p50_ms"].as_f64().unwrap();
    assert!(
        (1.0..3.0).contains(&p50),
        "main quanta p50 {p50} ms for 2 ms"
    );
    let o = run(&["--preheat"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("--preheat needs real-time scheduling"));
    no_workers_left("unprivileged");
}

/// Tests whose outcome depends on the machine's timing (caches, wake-ups, deadlines):
/// `scripts/test.sh` runs every `timing::` test after all others, one at a time, so no other
/// test loads the two CPUs meanwhile.
mod timing {
    use super::*;

    #[test]
    fn base_vectors_displace_their_level() {
        let _g = serial();
        let tmp = tempfile::tempdir().unwrap();
        // The L1 data vector is the one whose effect timing shows reliably everywhere: reading a
        // buffer of the L1d's size must displace most of a resident probe of half the L1d. (The
        // probe was the L1d's full size until a CI run read share 0.36: a full-size probe is
        // itself mostly evicted between passes, resident 2093 against reference 2483 ns; half
        // the L1d reads ~380 against ~850 ns here.) The tool says when a measurement was not
        // measurable (`share` null: resident no faster than evicted — the hypervisor ran
        // something else on the core meanwhile).
        // Three attempts; where the tool calls the L1d eviction not measurable in all of them
        // (resident no faster than the reference: the host ran something on the core; seen alone
        // in the timing pass, resident 2113 vs reference 2253 ns twice), the test says so as a
        // visible skip instead of failing: a timing check this host could not support then.
        // A low share is measured again too: once in a CI timing pass the reference (then 4x
        // the L1d) read 1332 ns against the vector's 751 (share 0.40), where the vector had
        // plainly displaced the L1d (resident 370 ns). A vector that does not displace its level
        // reads low in every attempt.
        let mut share: Option<f64> = None;
        for attempt in 1..=3 {
            let o = preheat(
                // Only the L1d's vector: the whole set reads the last-level cache 15 times
                // over, ~55 s per attempt in a debug build on a host with a 300 MiB L3.
                &[
                    "affinity",
                    "topology",
                    "--json",
                    "--verify",
                    "--vectors",
                    "BV_L1D",
                ],
                &run_dir(&tmp),
            );
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
            let t: Value = serde_json::from_slice(&o.stdout).unwrap();
            let rows = t["eviction"].as_array().unwrap();
            assert!(!rows.is_empty());
            for r in rows {
                assert_eq!(r["kind"], "measured");
                eprintln!(
                    "eviction (measured, attempt {attempt}): {} of {}: {} (resident {:.0} ns, after {:.0}, reference {:.0}; n = {})",
                    r["vector"], r["level"], r["share"], r["resident_ns"].as_f64().unwrap(),
                    r["after_ns"].as_f64().unwrap(), r["reference_ns"].as_f64().unwrap(), r["samples"]
                );
            }
            let l1d = rows.iter().find(|r| r["vector"] == "BV_L1D").unwrap();
            match l1d["share"].as_f64() {
                Some(v) if v > 0.5 => {
                    share = Some(v);
                    break;
                }
                Some(v) => {
                    share = Some(share.map_or(v, |s| s.max(v)));
                    eprintln!("BV_L1D displaced {v} of the L1d on attempt {attempt}: again");
                }
                None => eprintln!("BV_L1D was not measurable on attempt {attempt}"),
            }
        }
        let Some(share) = share else {
            return preheat_testsupport::skip(
                "l1d-eviction-timing",
                "BV_L1D eviction not measurable here in 3 attempts (resident no faster than the reference)",
            );
        };
        assert!(
            share > 0.5,
            "BV_L1D displaced at most {share} of the L1d in 3 attempts"
        );
    }
}
