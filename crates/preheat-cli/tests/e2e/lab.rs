//! The lab's servers through the CLI: `preheat demo` on MariaDB (TPC-C-like transactions, probe
//! recording around externally sent requests, replay reported as not applicable) and
//! `preheat serve` (ready line, real requests, SIGTERM stops the server it started).

use crate::common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{find_program, ok, run_dir};

fn installed(prog: &str) -> bool {
    find_program(prog).is_some()
}

#[test]
fn demo_on_mariadb_runs_tpcc_transactions() {
    if !installed("mariadbd") && !installed("mysqld") {
        preheat_testsupport::skip(
            "mariadbd",
            "mariadbd is not installed (scripts/setup-lab.sh)",
        );
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let rd = run_dir(&tmp);
    let records = tmp.path().join("records.jsonl");
    let out = ok(
        &[
            "demo",
            "--server",
            "mariadb",
            "--rounds",
            "3",
            "--samples",
            "2",
            "--keep",
            "2",
            "--idle-ms",
            "2",
            "--sweep-mib",
            "32",
            "--strategies",
            "lines,replay",
            // Long enough that no announcement comes late in a loaded debug run.
            "--lead-us",
            "1000",
            "--records",
            records.to_str().unwrap(),
            "--json",
        ],
        &rd,
    );
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["server"], "mariadb");
    assert_eq!(v["cpi"], serde_json::Value::Null);
    // Replay runs on a MySQL session the demo opened and handed to the agent (a login and the
    // warm-up's prepared statements): nothing but the hot floor may be skipped (it needs root;
    // without it the demo lists it as skipped, saying why).
    let skipped: Vec<_> = v["skipped"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["mode"] != "hot")
        .collect();
    assert!(skipped.is_empty(), "{skipped:?}");
    let rows = v["rows"].as_array().unwrap();
    let hot = rows.iter().any(|r| r["mode"] == "hot");
    assert_eq!(
        rows.len(),
        6 + usize::from(hot),
        "(hot,) warm, cold-idle, cold-sweep, control, preheat:lines, preheat:replay"
    );
    assert!(rows.iter().any(|r| r["mode"] == "preheat:replay"));
    // Replay announcements sent their warm-ups on the session (one that came late does
    // nothing), and none failed.
    let counters = &v["agent_counters"];
    assert!(counters["replays"].as_u64().unwrap() >= 1, "{counters}");
    assert_eq!(counters["replay_errors"], 0, "{counters}");
    let lines = rows.iter().find(|r| r["mode"] == "preheat:lines").unwrap();
    assert!(lines["ws_kib"].as_f64().unwrap() > 0.0, "empty working set");
    // Every sample is one TPC-C-like transaction of the round's type, and every mode of a round
    // measured the same type.
    let samples = v["samples"].as_array().unwrap();
    assert_eq!(samples.len(), 3 * rows.len());
    for s in samples {
        let kind = s["kind"].as_str().unwrap();
        assert!(
            ["new-order", "payment", "order-status"].contains(&kind),
            "{kind}"
        );
        let mut same_round = samples.iter().filter(|o| o["round"] == s["round"]);
        assert!(same_round.all(|o| o["kind"] == s["kind"]));
    }
    // The records file holds every sample, one JSON object per line, as measured.
    let text = std::fs::read_to_string(&records).unwrap();
    assert_eq!(text.lines().count(), samples.len());
}

/// Kills the child if the test fails before stopping it.
struct Guard(std::process::Child);
impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn serve_starts_loads_and_stops_redis() {
    if !installed("redis-server") {
        preheat_testsupport::skip(
            "redis-server",
            "redis-server is not installed (scripts/setup-lab.sh)",
        );
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let rd = run_dir(&tmp);
    // The server's files go into the test's directory (serve keeps its own temp dir after a
    // signal, for a look afterwards).
    let workdir = tmp.path().join("serve");
    let mut child = Command::new(env!("CARGO_BIN_EXE_preheat"))
        .args(["serve", "--server", "redis", "--json", "--workdir"])
        .arg(&workdir)
        .env("PREHEAT_RUN_DIR", &rd)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut guard = Guard(child);
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).unwrap();
    let ready: serde_json::Value = serde_json::from_str(&line).expect("a JSON ready line");
    assert_eq!(ready["server"], "redis");
    assert_eq!(ready["protocol"], "redis");
    let port = ready["port"].as_u64().unwrap() as u16;
    assert!(ready["prepared"]["items"].as_u64().unwrap() >= 1000);
    // The data set is loaded: the measured key has its value.
    let key = ready["key"].as_str().unwrap();
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(s, "*2\r\n$3\r\nGET\r\n${}\r\n{key}\r\n", key.len()).unwrap();
    let mut buf = [0u8; 256];
    let n = s.read(&mut buf).unwrap();
    assert!(
        buf[..n].starts_with(b"$100\r\n"),
        "{:?}",
        String::from_utf8_lossy(&buf[..n])
    );
    drop(s);
    // SIGTERM stops preheat serve and the server it started.
    preheat_engine::os::send_signal(guard.0.id(), libc::SIGTERM, false).unwrap();
    let t0 = Instant::now();
    while guard.0.try_wait().unwrap().is_none() {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "preheat serve ignored SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let t0 = Instant::now();
    while preheat_engine::host::accepts_connections(
        ([127, 0, 0, 1], port).into(),
        Duration::from_secs(1),
    ) {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "redis still listens after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn serve_names_the_missing_server_and_leaves_nothing_running() {
    let tmp = tempfile::tempdir().unwrap();
    let rd = run_dir(&tmp);
    let o = Command::new(env!("CARGO_BIN_EXE_preheat"))
        .args(["serve", "--server", "redis", "--json"])
        .env("PREHEAT_RUN_DIR", &rd)
        .env("PATH", "/nonexistent")
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("setup-lab.sh") || err.contains("apt-get"),
        "{err}"
    );
}

#[test]
fn serve_refuses_a_port_in_use() {
    let tmp = tempfile::tempdir().unwrap();
    let rd = run_dir(&tmp);
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = busy.local_addr().unwrap().port().to_string();
    let o = Command::new(env!("CARGO_BIN_EXE_preheat"))
        .args(["serve", "--server", "kv", "--port", &port, "--json"])
        .env("PREHEAT_RUN_DIR", &rd)
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains(&format!("port {port} is already in use")),
        "{err}"
    );
    // Nothing was started: the run dir holds no agent.
    let agents = std::fs::read_dir(&rd).map(|d| d.count()).unwrap_or(0);
    assert_eq!(agents, 0, "an agent was left behind");
}
