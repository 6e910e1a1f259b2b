//! `preheat load` end to end: the real binary against real servers on loopback (memcached, the
//! bundled preheat-kv, redis, nginx), each started by the test and stopped by a guard. A test
//! whose program is missing reports a skip (`preheat_testsupport::skip`). No wall-clock performance assertions.

use crate::common;

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

mod servers;

use preheat_testsupport::free_port;
use servers::{memcached, nginx, preheat_kv, redis, Servers};

fn preheat_load(args: &[&str], run_dir: &Path) -> Output {
    common::preheat(&[&["load"], args].concat(), run_dir)
}

/// `preheat load --json --target TARGET ARGS`, which must succeed; its report.
fn load_json(target: &str, args: &[&str], run_dir: &Path) -> Value {
    let out = common::ok(
        &[&["load", "--json", "--target", target], args].concat(),
        run_dir,
    );
    serde_json::from_str(&out)
        .unwrap_or_else(|e| panic!("preheat load {args:?}: not JSON ({e}): {out}"))
}

const FIELDS: &[&str] = &[
    "label",
    "target",
    "protocol",
    "mode",
    "connections",
    "threads",
    "client_loop",
    "wait",
    "requests",
    "errors",
    "wrong",
    "duration_s",
    "throughput_rps",
    "offered_rps",
    "p50_us",
    "p90_us",
    "p99_us",
    "p999_us",
    "max_us",
    "mean_us",
    "send_late_us_p50",
    "send_late_us_p99",
    "scheduled",
    "unscheduled",
    "announce",
    "strategy",
    "slot_wait_us_p50",
    "interrupted",
    "server_start_us_p50",
    "server_start_us_p99",
    "observed",
    "agent_announcements",
    "agent_preheats",
    "agent_preheats_completed",
    "agent_late",
];

/// Every field is there and the numbers are consistent with `requests` measured replies.
fn check(v: &Value, requests: u64) {
    for f in FIELDS {
        assert!(v.get(f).is_some(), "missing {f}: {v}");
    }
    assert_eq!(v["label"], "measured", "{v}");
    assert_eq!(v["requests"].as_u64(), Some(requests), "{v}");
    assert_eq!(v["errors"], 0, "{v}");
    assert_eq!(v["wrong"], 0, "{v}");
    assert_eq!(v["interrupted"], false, "{v}");
    let f = |k: &str| {
        v[k].as_f64()
            .unwrap_or_else(|| panic!("{k} not a number: {v}"))
    };
    assert!(f("throughput_rps") > 0.0, "{v}");
    assert!(f("duration_s") > 0.0, "{v}");
    assert!(f("p50_us") > 0.0, "{v}");
    assert!(
        f("p50_us") <= f("p90_us") && f("p90_us") <= f("p99_us"),
        "{v}"
    );
    assert!(
        f("p99_us") <= f("p999_us") && f("p999_us") <= f("max_us") * 1.001,
        "{v}"
    );
    assert!(f("mean_us") <= f("max_us") * 1.001, "{v}");
    assert!(f("send_late_us_p50") <= f("send_late_us_p99"), "{v}");
}

fn csv_rows(path: &Path) -> (String, Vec<String>) {
    let text = std::fs::read_to_string(path).unwrap();
    let mut lines = text.lines().map(str::to_string);
    let header = lines.next().unwrap_or_default();
    (header, lines.collect())
}

/// How many distinct connections (the `conn` column) the records rows name.
fn connections_in(rows: &[String]) -> usize {
    rows.iter()
        .map(|r| r.split(',').nth(1).unwrap())
        .collect::<std::collections::BTreeSet<_>>()
        .len()
}

#[test]
fn open_loop_memcached_with_records() {
    let mut servers = Servers::default();
    let Some(port) = memcached(&mut servers) else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let records = tmp.path().join("records.csv");
    let target = format!("127.0.0.1:{port}");
    let v = load_json(
        &target,
        &[
            "--mode",
            "open",
            "--rate",
            "2000",
            "--requests",
            "300",
            "--connections",
            "2",
            "--seed",
            "3",
            "--records",
            records.to_str().unwrap(),
        ],
        tmp.path(),
    );
    println!("{v}");
    check(&v, 300);
    assert_eq!(v["mode"], "open");
    assert_eq!(v["protocol"], "memcached");
    assert_eq!(v["connections"], 2);
    assert_eq!(v["threads"], 2, "default: one thread per connection");
    assert_eq!(v["offered_rps"].as_f64(), Some(2000.0));
    assert_eq!(v["target"], target);
    assert_eq!(v["announce"], "none");
    assert_eq!(v["strategy"], "none");
    assert_eq!(
        (v["scheduled"].as_u64(), v["unscheduled"].as_u64()),
        (Some(0), Some(0))
    );
    let (header, rows) = csv_rows(&records);
    assert!(header.starts_with("seq,conn,mode,"), "{header}");
    assert_eq!(rows.len(), 300);
    assert!(rows
        .iter()
        .all(|r| r.contains(",open,") && r.contains(",get,true,")));
    assert_eq!(connections_in(&rows), 2);
}

#[test]
fn closed_and_idle_gap_on_the_bundled_kv() {
    let mut servers = Servers::default();
    let Some(port) = preheat_kv(&mut servers) else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let target = format!("127.0.0.1:{port}");
    let v = load_json(
        &target,
        &[
            "--mode",
            "closed",
            "--requests",
            "400",
            "--connections",
            "2",
            "--warmup",
            "5",
            "--key",
            "key:7",
        ],
        tmp.path(),
    );
    println!("{v}");
    check(&v, 400);
    assert_eq!(v["mode"], "closed");
    assert_eq!(v["offered_rps"].as_f64(), Some(0.0));

    // Idle gap (the default mode), text output, blocking waits.
    let o = preheat_load(
        &[
            "--target",
            &target,
            "--requests",
            "15",
            "--gap-ms",
            "2",
            "--wait",
            "block",
        ],
        tmp.path(),
    );
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    println!("{out}");
    assert!(out.contains("[measured, 15 samples]"), "{out}");
    assert!(out.contains("idle-gap"), "{out}");

    // Duration instead of a request count.
    let v = load_json(
        &target,
        &["--mode", "closed", "--duration-s", "0.3"],
        tmp.path(),
    );
    assert!(v["requests"].as_u64().unwrap() > 0, "{v}");
    let d = v["duration_s"].as_f64().unwrap();
    assert!(d > 0.2 && d < 5.0, "{v}");
}

#[test]
fn redis_protocol() {
    let mut servers = Servers::default();
    let Some(port) = redis(&mut servers) else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let target = format!("127.0.0.1:{port}");
    for mode in [["--mode", "closed"], ["--mode", "idle-gap"]] {
        let v = load_json(
            &target,
            &[
                "--protocol",
                "redis",
                mode[0],
                mode[1],
                "--requests",
                "50",
                "--gap-ms",
                "1",
            ],
            tmp.path(),
        );
        println!("{v}");
        check(&v, 50);
        assert_eq!(v["protocol"], "redis");
    }
    let v = load_json(
        &target,
        &[
            "--protocol",
            "redis",
            "--mode",
            "open",
            "--rate",
            "1000",
            "--requests",
            "100",
            "--connections",
            "2",
        ],
        tmp.path(),
    );
    check(&v, 100);
}

#[test]
fn http_protocol_against_nginx() {
    let mut servers = Servers::default();
    let tmp = tempfile::tempdir().unwrap();
    let Some(port) = nginx(&mut servers, &tmp.path().join("nginx")) else {
        return;
    };
    let target = format!("127.0.0.1:{port}");
    let v = load_json(
        &target,
        &[
            "--protocol",
            "http",
            "--key",
            "/index.html",
            "--mode",
            "closed",
            "--requests",
            "100",
            "--connections",
            "2",
        ],
        tmp.path(),
    );
    println!("{v}");
    check(&v, 100);
    assert_eq!(v["protocol"], "http");
    // A missing page is a wrong reply (404), measured and counted apart from errors.
    let v = load_json(
        &target,
        &[
            "--protocol",
            "http",
            "--key",
            "/nope.html",
            "--mode",
            "closed",
            "--requests",
            "10",
        ],
        tmp.path(),
    );
    assert_eq!(
        (v["requests"].as_u64(), v["wrong"].as_u64()),
        (Some(10), Some(10)),
        "{v}"
    );
    assert_eq!(v["errors"], 0, "{v}");
}

#[test]
fn sigint_stops_the_run_and_keeps_what_was_measured() {
    let mut servers = Servers::default();
    let Some(port) = memcached(&mut servers) else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let records = tmp.path().join("r.csv");
    let child = Command::new(env!("CARGO_BIN_EXE_preheat"))
        .args([
            "load",
            "--json",
            "--target",
            &format!("127.0.0.1:{port}"),
            "--mode",
            "open",
            "--rate",
            "500",
            "--duration-s",
            "600",
            "--records",
            records.to_str().unwrap(),
        ])
        .env("PREHEAT_RUN_DIR", tmp.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1000));
    let t0 = Instant::now();
    preheat_engine::os::send_signal(child.id(), libc::SIGINT, false).unwrap();
    let o = child.wait_with_output().unwrap();
    assert!(
        t0.elapsed() < Duration::from_secs(10),
        "took {:?}",
        t0.elapsed()
    );
    assert_eq!(
        o.status.code(),
        Some(130),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let v: Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&o.stdout)));
    println!("{v}");
    assert_eq!(v["interrupted"], true);
    let n = v["requests"].as_u64().unwrap();
    assert!(n > 0, "{v}");
    let (_, rows) = csv_rows(&records);
    assert_eq!(
        rows.len() as u64,
        n,
        "the records file holds every measured request"
    );
}

#[test]
fn bad_flag_combinations_are_clear_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let fails = |args: &[&str], needle: &str| {
        let o = preheat_load(args, tmp.path());
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{args:?} should fail");
        assert!(err.contains(needle), "{args:?}: {err}");
    };
    fails(&["--target", "127.0.0.1:1", "--mode", "open"], "--rate");
    fails(
        &[
            "--target",
            "127.0.0.1:1",
            "--mode",
            "closed",
            "--rate",
            "10",
        ],
        "--mode open",
    );
    fails(
        &["--target", "127.0.0.1:1", "--observe", "--connections", "2"],
        "--connections 1",
    );
    fails(
        &["--target", "127.0.0.1:1", "--announce-local"],
        "no agents",
    );
    fails(
        &["--target", "127.0.0.1:1", "--requests", "3"],
        "connection 0",
    );
    fails(
        &["--target", "127.0.0.1:1", "--requests", "0"],
        "--requests 0",
    );
    fails(
        &[
            "--target",
            "127.0.0.1:1",
            "--mode",
            "closed",
            "--connections",
            "2",
            "--threads",
            "3",
        ],
        "--threads must be between 1 and --connections",
    );
    fails(
        &[
            "--target",
            "127.0.0.1:1",
            "--connections",
            "2",
            "--threads",
            "1",
        ],
        "--mode idle-gap",
    );
    fails(
        &[
            "--target",
            "127.0.0.1:1",
            "--mode",
            "closed",
            "--connections",
            "2",
            "--threads",
            "1",
            "--announce-local",
        ],
        "--announce-local",
    );
    fails(
        &[
            "--target",
            "127.0.0.1:1",
            "--mode",
            "closed",
            "--protocol",
            "mysql",
            "--connections",
            "4",
            "--threads",
            "2",
        ],
        "--protocol mysql (its driver only blocks) needs one thread per connection",
    );
    // --wait epoll always runs the event loop: what needs one thread per connection is refused,
    // also with one connection.
    fails(
        &["--target", "127.0.0.1:1", "--wait", "epoll"],
        "--wait epoll runs the event loop, which does not support --mode idle-gap",
    );
    fails(
        &[
            "--target",
            "127.0.0.1:1",
            "--mode",
            "closed",
            "--wait",
            "epoll",
            "--protocol",
            "mysql",
        ],
        "not supported by the mysql driver",
    );
    fails(
        &[
            "--target",
            "127.0.0.1:1",
            "--mode",
            "closed",
            "--wait",
            "epoll",
            "--announce-local",
        ],
        "--wait epoll runs the event loop, which does not support --announce-local",
    );
    let o = Command::new(env!("CARGO_BIN_EXE_preheat"))
        .args(["load", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&o.stdout);
    for needle in [
        "open",
        "idle-gap",
        "closed",
        "coordinated omission",
        "INTENDED",
        "--rate",
        "--threads",
        "wrk -t T -c C",
        "spin",
        "block",
        "epoll",
        "epoll_wait",
        "memcaslap",
        "client_loop",
    ] {
        assert!(help.contains(needle), "--help lacks {needle}: {help}");
    }
}

#[test]
fn local_announcements_and_observe_with_the_agent_attached() {
    let dir = Path::new(env!("CARGO_BIN_EXE_preheat")).parent().unwrap();
    let (kv, agent) = (dir.join("preheat-kv"), dir.join("libpreheat_agent.so"));
    if !kv.is_file() || !agent.is_file() {
        preheat_testsupport::skip!(
            "workspace-build",
            "build the workspace first ({} / {} missing)",
            kv.display(),
            agent.display()
        );
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let run_dir = common::run_dir(&tmp);
    let mut servers = Servers::default();
    let port = free_port();
    servers.start(
        Command::new(&kv)
            .args(["--port", &port.to_string(), "--quiet"])
            .env("LD_PRELOAD", &agent)
            .env("PREHEAT_RUN_DIR", &run_dir),
        port,
    );
    // The agent's sockets appear once it is up.
    let t0 = Instant::now();
    while std::fs::read_dir(&run_dir).unwrap().count() < 2 {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "no agent sockets in {}",
            run_dir.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let target = format!("127.0.0.1:{port}");
    let v = load_json(
        &target,
        &[
            "--announce-local",
            "--observe",
            "--requests",
            "30",
            "--gap-ms",
            "5",
        ],
        &run_dir,
    );
    println!("{v}");
    check(&v, 30);
    assert_eq!(v["scheduled"], 30, "every request announced: {v}");
    assert_eq!(v["strategy"], "auto");
    assert!(
        v["announce"].as_str().unwrap().starts_with("local 65 µs"),
        "{v}"
    );
    assert!(v["agent_announcements"].as_u64().unwrap() >= 15, "{v}");
    assert!(v["observed"].as_u64().unwrap() >= 15, "{v}");
    assert!(v["server_start_us_p50"].is_number(), "{v}");

    // Open loop over two connections, each with its own announcer.
    let v = load_json(
        &target,
        &[
            "--announce-local",
            "--mode",
            "open",
            "--rate",
            "500",
            "--connections",
            "2",
            "--requests",
            "100",
            "--strategy",
            "my-label",
        ],
        &run_dir,
    );
    println!("{v}");
    check(&v, 100);
    assert_eq!(v["scheduled"], 100, "{v}");
    assert_eq!(v["strategy"], "my-label");
}

#[test]
fn multiplexed_threads_against_memcached() {
    let mut servers = Servers::default();
    let Some(port) = memcached(&mut servers) else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let target = format!("127.0.0.1:{port}");
    for wait in ["block", "spin"] {
        let records = tmp.path().join(format!("records-{wait}.csv"));
        let v = load_json(
            &target,
            &[
                "--mode",
                "closed",
                "--requests",
                "2000",
                "--connections",
                "4",
                "--threads",
                "1",
                "--wait",
                wait,
                "--records",
                records.to_str().unwrap(),
            ],
            tmp.path(),
        );
        println!("{v}");
        check(&v, 2000);
        assert_eq!(
            (v["connections"].as_u64(), v["threads"].as_u64()),
            (Some(4), Some(1))
        );
        let (_, rows) = csv_rows(&records);
        assert_eq!(rows.len(), 2000);
        assert_eq!(
            connections_in(&rows),
            4,
            "{wait}: every connection measured"
        );
    }
    // Open loop, 2 threads × 2 connections each.
    let v = load_json(
        &target,
        &[
            "--mode",
            "open",
            "--rate",
            "4000",
            "--requests",
            "800",
            "--connections",
            "4",
            "--threads",
            "2",
            "--wait",
            "block",
        ],
        tmp.path(),
    );
    check(&v, 800);
    assert_eq!(v["threads"], 2);
}

#[test]
fn wait_epoll_against_memcached() {
    let mut servers = Servers::default();
    let Some(port) = memcached(&mut servers) else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let target = format!("127.0.0.1:{port}");
    // One connection on one thread (the peer check's 1-connection row), and 4 on 2 threads.
    for (connections, threads) in [(1u64, 1u64), (4, 2)] {
        let records = tmp.path().join(format!("records-{connections}.csv"));
        let v = load_json(
            &target,
            &[
                "--mode",
                "closed",
                "--requests",
                "2000",
                "--connections",
                &connections.to_string(),
                "--threads",
                &threads.to_string(),
                "--wait",
                "epoll",
                "--records",
                records.to_str().unwrap(),
            ],
            tmp.path(),
        );
        println!("{v}");
        check(&v, 2000);
        assert_eq!(v["wait"], "epoll", "{v}");
        assert_eq!(v["client_loop"], "event-loop", "{v}");
        assert_eq!(
            (v["connections"].as_u64(), v["threads"].as_u64()),
            (Some(connections), Some(threads))
        );
        let (_, rows) = csv_rows(&records);
        assert_eq!(rows.len(), 2000);
        assert_eq!(
            connections_in(&rows) as u64,
            connections,
            "every connection measured"
        );
    }
    // Without --threads, epoll still runs the event loop (one thread per connection); block and
    // spin with one thread per connection run the synchronous loop.
    for (wait, want) in [
        ("epoll", "event-loop"),
        ("block", "thread-per-connection"),
        ("spin", "thread-per-connection"),
    ] {
        let v = load_json(
            &target,
            &["--mode", "closed", "--requests", "500", "--wait", wait],
            tmp.path(),
        );
        check(&v, 500);
        assert_eq!(v["client_loop"], want, "{wait}: {v}");
        assert_eq!(v["threads"], 1, "{v}");
    }
}
