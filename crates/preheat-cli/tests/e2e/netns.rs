//! Issue 4's multi-host test: an arbiter host, a server host (memcached with the agent, and
//! preheatd) and two client hosts, each in its own network namespace, joined by veth pairs to a
//! bridge. End to end through the arbiter: every request is a demand, sent in its allocated slot
//! and announced to the server's preheatd, which hands it to the agent. Also fail-open: with the
//! arbiter or preheatd dead, clients fall back to unscheduled sends and the server keeps serving.
//!
//! All hosts share this machine's 2 vCPUs (emulated hosts): the latencies printed are labeled as
//! such; the assertions are about behaviour, not speed.

use crate::common;

use std::io::{Read, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use common::netlab::NetLab;

fn memcached() -> Option<String> {
    ["/usr/bin/memcached", "/usr/sbin/memcached"]
        .iter()
        .find(|p| Path::new(p).exists())
        .map(|p| p.to_string())
}

fn wait_for(what: &str, timeout: Duration, mut ok: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !ok() {
        assert!(t0.elapsed() < timeout, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn agent_announcements(run_dir: &Path) -> u64 {
    let Ok(rd) = std::fs::read_dir(run_dir) else {
        return 0;
    };
    let mut total = 0;
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        if !name.ends_with(".sock") {
            continue;
        }
        let Ok(mut s) = std::os::unix::net::UnixStream::connect(e.path()) else {
            continue;
        };
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(b"{\"cmd\":\"status\"}\n").unwrap();
        let mut buf = Vec::new();
        let mut chunk = [0u8; 65536];
        while !buf.ends_with(b"\n") {
            let n = s.read(&mut chunk).unwrap();
            if n == 0 {
                break;
            }
            buf.extend_from_slice(&chunk[..n]);
        }
        let v: serde_json::Value = serde_json::from_slice(&buf).unwrap();
        total += v["preheat"]["announcements"].as_u64().unwrap_or(0);
    }
    total
}

fn load(lab: &NetLab, host: usize, args: &[&str]) -> serde_json::Value {
    let preheat = env!("CARGO_BIN_EXE_preheat");
    let mut argv = vec!["taskset", "-c", "0", preheat, "load", "--json"];
    argv.extend_from_slice(args);
    let o = lab.cmd(host, &argv).output().unwrap();
    assert!(
        o.status.success(),
        "preheat load {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).unwrap()
}

/// The `preheat-<pid>` network namespaces that exist now.
fn preheat_namespaces() -> Vec<String> {
    std::fs::read_dir("/run/netns")
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("preheat-"))
                .collect()
        })
        .unwrap_or_default()
}

/// `preheat demo --netns`: the server in a namespace of its own, requests over a veth pair;
/// every mode measured, `replay` included (the agent's own connection reaches the server inside
/// the namespace), and the namespace gone afterwards — also when the server is refused.
#[test]
fn demo_over_a_veth_pair() {
    if preheat_engine::host::effective_uid() != Some(0) {
        preheat_testsupport::skip("netns", "network namespaces need root");
        return;
    }
    let before = preheat_namespaces();
    let tmp = tempfile::tempdir().unwrap();
    let rd = common::run_dir(&tmp);
    let args = [
        &["demo", "--netns", "--rounds", "3", "--lead-us", "1000"][..],
        // The agent's log is read below (where it opened its replay connection).
        &["--strategies", "wake,replay", "--json", "--keep-agent-logs"],
        &common::QUICK_DEMO,
    ]
    .concat();
    let out = common::ok(&args, &rd);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let transport = v["transport"].as_str().unwrap();
    assert!(
        transport.starts_with("veth 10.234.") && !transport.contains("NOT verified"),
        "{transport}"
    );
    let rows = v["rows"].as_array().unwrap();
    // The hot row is shown only where this run verified it as a floor (hot below warm by its
    // CI); 3 rounds are too few for that interval, and the shares are then against warm.
    let floor = rows[0]["floor"].as_str().unwrap();
    let hot = (floor == "hot").then_some("hot");
    for m in hot
        .into_iter()
        .chain(["warm", "cold-sweep", "preheat:wake", "preheat:replay"])
    {
        let r = rows.iter().find(|r| r["mode"] == m);
        let r = r.unwrap_or_else(|| panic!("mode {m} missing: {}", v["rows"]));
        assert_eq!(r["latency"]["n"], 3, "{r}");
    }
    // Every replay round's announcement warmed up, unless it reached the agent after its
    // arrival time (dropped as late: a stall of the 1 ms lead, which tests running side by side
    // can cause); at least one warm-up did run.
    let counters = &v["agent_counters"];
    let replays = counters["replays"].as_u64().unwrap();
    assert!(
        replays >= 1 && replays + counters["late"].as_u64().unwrap() >= 3,
        "{counters}"
    );
    // The warm-ups take the clients' path: the agent opened its replay connection in the
    // demo's network namespace, to the server's end of the pair.
    assert!(
        transport.contains("replay warm-ups come over the veth pair"),
        "{transport}"
    );
    let logs: String = common::agent_logs(&rd)
        .into_iter()
        .map(|(_, text)| text)
        .collect();
    assert!(
        logs.contains("replay connection open (10.234.") && logs.contains("/ns/net)"),
        "{logs}"
    );
    common::assert_no_agent_sockets(&rd);
    // MariaDB is refused (its grants admit 127.0.0.1 only) before it starts, namespace removed.
    let o = common::preheat(&["demo", "--netns", "--server", "mariadb"], &rd);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("network namespace") && err.contains("127.0.0.1"),
        "{err}"
    );
    let mut left = preheat_namespaces();
    left.retain(|n| !before.contains(n));
    assert!(left.is_empty(), "namespaces left behind: {left:?}");
}

/// Run `send` (one or more client hosts' `preheat load` results, `n` requests each) up to
/// `tries` times until every request of every host was sent in its slot; every try must have
/// no error and account for all `n` requests as scheduled or unscheduled. A request whose slot
/// answer comes later than the sender's timeout is sent unscheduled (fail-open, by design), and
/// a stall of the host does that (suite runs here: one request of 80 after an 88 ms stall, two
/// of 60 with a 53 ms one), so the arbiter must schedule a whole try, not every try. Returns
/// the whole try.
fn scheduled_whole(
    what: &str,
    n: u64,
    tries: usize,
    mut send: impl FnMut() -> Vec<serde_json::Value>,
) -> Vec<serde_json::Value> {
    let mut seen = Vec::new();
    for _ in 0..tries {
        let vs = send();
        for v in &vs {
            assert_eq!(v["errors"], 0, "{what}: {v}");
            let (s, u) = (v["scheduled"].as_u64(), v["unscheduled"].as_u64());
            assert_eq!(s.unwrap() + u.unwrap(), n, "{what}: {v}");
        }
        if vs.iter().all(|v| v["scheduled"] == n) {
            return vs;
        }
        seen.push(vs);
    }
    panic!("{what}: not scheduled whole in {tries} tries: {seen:?}");
}

/// Tests whose outcome depends on the machine's timing (caches, wake-ups, deadlines):
/// `scripts/test.sh` runs every `timing::` test after all others, one at a time, so no other
/// test loads the two CPUs meanwhile.
mod timing {
    use super::*;

    #[test]
    fn arbitrated_network_end_to_end_and_fail_open() {
        let Some(mc) = memcached() else {
            preheat_testsupport::skip(
                "memcached",
                "memcached is not installed (apt-get install memcached)",
            );
            return;
        };
        let preheatd = preheat_testsupport::built("preheatd");
        let agent = preheat_testsupport::built("libpreheat_agent.so");
        if !preheatd.exists() || !agent.exists() {
            preheat_testsupport::skip!(
                "workspace-build",
                "build the workspace first ({} / {} missing)",
                preheatd.display(),
                agent.display()
            );
            return;
        }
        let mut lab = match NetLab::new(&["arb", "srv", "c1", "c2"]) {
            Ok(l) => l,
            Err(e) => {
                preheat_testsupport::skip!("netns", "cannot create network namespaces: {e}");
                return;
            }
        };
        let tmp = tempfile::tempdir().unwrap();
        let run_dir = tmp.path().join("run");
        std::fs::create_dir(&run_dir).unwrap();
        std::fs::set_permissions(
            &run_dir,
            std::os::unix::fs::PermissionsExt::from_mode(0o700),
        )
        .unwrap();
        let key = tmp.path().join("key");
        let hex: String = (0..32)
            .map(|i| format!("{:02x}", (i * 37 + std::process::id()) % 256))
            .collect();
        std::fs::write(&key, hex).unwrap();
        let key = key.to_str().unwrap().to_string();
        let (arb_ip, srv_ip) = (lab.addr(0).to_string(), lab.addr(1).to_string());
        let srv = format!("{srv_ip}:11211");
        let run_dir_s = run_dir.to_str().unwrap().to_string();
        let agent_s = agent.to_str().unwrap().to_string();
        let env: [(&str, &str); 3] = [
            ("LD_PRELOAD", &agent_s),
            ("PREHEAT_RUN_DIR", &run_dir_s),
            ("PREHEAT_AGENT_ONLY", "memcached"),
        ];

        // Server host: memcached with the agent (pinned to CPU 1), preheatd.
        lab.spawn(
            1,
            &[
                "taskset",
                "-c",
                "1",
                &mc,
                "-l",
                &srv_ip,
                "-p",
                "11211",
                "-U",
                "0",
                "-t",
                "1",
                "-u",
                "root",
                "-o",
                "no_lru_crawler,no_lru_maintainer",
            ],
            &env,
            &tmp.path().join("memcached.log"),
        );
        let ready = tmp.path().join("preheatd.ready");
        let pd = lab.spawn(
            1,
            &[
                preheatd.to_str().unwrap(),
                "--listen",
                &format!("{srv_ip}:7711"),
                "--key-file",
                &key,
                "--run-dir",
                &run_dir_s,
                "--metrics",
                "127.0.0.1:0",
                "--ready-file",
                ready.to_str().unwrap(),
            ],
            &[("PREHEAT_RUN_DIR", &run_dir_s)],
            &tmp.path().join("preheatd.log"),
        );
        wait_for("preheatd", Duration::from_secs(20), || ready.exists());
        wait_for("memcached's agent", Duration::from_secs(20), || {
            std::fs::read_dir(&run_dir)
                .map(|d| {
                    d.flatten()
                        .any(|e| e.file_name().to_string_lossy().ends_with(".sock"))
                })
                .unwrap_or(false)
        });
        // Store the key the clients read (from a client host, over the bridge).
        let set = lab
            .cmd(2, &["sh", "-c", &format!(
                "exec 3<>/dev/tcp/{srv_ip}/11211 2>/dev/null || exit 1; printf 'set key:42 0 0 5\\r\\nhello\\r\\n' >&3; head -c 8 <&3"
            )])
            .output()
            .unwrap();
        if !String::from_utf8_lossy(&set.stdout).starts_with("STORED") {
            // /dev/tcp is a bash feature; fall back to the load generator's own connection check.
            let o = lab.cmd(2, &["bash", "-c", &format!(
                "exec 3<>/dev/tcp/{srv_ip}/11211; printf 'set key:42 0 0 5\\r\\nhello\\r\\n' >&3; head -c 8 <&3"
            )]).output().unwrap();
            assert!(
                String::from_utf8_lossy(&o.stdout).starts_with("STORED"),
                "cannot set the key: {o:?}"
            );
        }

        // Arbiter host.
        let arb = lab.spawn(
            0,
            &[
                env!("CARGO_BIN_EXE_preheat"),
                "arbiter",
                "--listen",
                &format!("{arb_ip}:7710"),
                "--key-file",
                &key,
                "--lead-us",
                "500",
            ],
            &[],
            &tmp.path().join("arbiter.log"),
        );
        std::thread::sleep(Duration::from_millis(300));
        let arbiter = format!("{arb_ip}:7710");
        let n = "60";
        // `preheat load` from client `host` through the arbiter: `requests` requests `gap_ms` apart.
        let through_arbiter =
            |lab: &NetLab, host: usize, requests: &str, gap_ms: &str, extra: &[&str]| {
                let mut args = vec![
                    "--target",
                    &srv,
                    "--requests",
                    requests,
                    "--gap-ms",
                    gap_ms,
                    "--arbiter",
                    &arbiter,
                    "--key-file",
                    &key,
                ];
                args.extend_from_slice(extra);
                load(lab, host, &args)
            };

        // Warm (closed loop), cold (idle gaps, unannounced), preheated (idle gaps, through the
        // arbiter), from client host c1.
        let warm = load(
            &lab,
            2,
            &["--target", &srv, "--mode", "closed", "--requests", "300"],
        );
        let cold = load(
            &lab,
            2,
            &["--target", &srv, "--requests", n, "--gap-ms", "10"],
        );
        let mut announced = 0;
        let pre = scheduled_whole("every request got a slot", 60, 3, || {
            let before = agent_announcements(&run_dir);
            let v = through_arbiter(&lab, 2, n, "10", &[]);
            announced = agent_announcements(&run_dir) - before;
            vec![v]
        })
        .remove(0);
        for (name, v) in [("warm", &warm), ("cold", &cold), ("preheated", &pre)] {
            println!(
                "[emulated hosts in netns on one 2-vCPU VM, {} samples] {name:>9}: p50 {:.1} µs p99 {:.1} µs (scheduled {}, unscheduled {}, errors {})",
                v["requests"], v["p50_us"].as_f64().unwrap(), v["p99_us"].as_f64().unwrap(),
                v["scheduled"], v["unscheduled"], v["errors"]
            );
            assert_eq!(v["errors"], 0, "{name}: {v}");
        }
        assert!(
            announced >= 30,
            "the arbiter's announcements reached the agent through preheatd for only {announced} of 60 requests"
        );

        // Two client hosts at once: the arbiter schedules both (see `scheduled_whole`).
        let lab_ref = &lab;
        scheduled_whole("two hosts at once", 40, 3, || {
            std::thread::scope(|s| {
                let h1 = s.spawn(|| through_arbiter(lab_ref, 2, "40", "5", &[]));
                let h2 = s.spawn(|| through_arbiter(lab_ref, 3, "40", "5", &[]));
                vec![h1.join().unwrap(), h2.join().unwrap()]
            })
        });

        // Fail-open 1: preheatd dies. The arbiter still schedules, the server still serves.
        lab.kill(pd);
        scheduled_whole("without preheatd", 20, 3, || {
            vec![through_arbiter(&lab, 2, "20", "5", &[])]
        });

        // Fail-open 2: the arbiter dies. Senders time out and send unscheduled; nothing fails.
        lab.kill(arb);
        let t0 = Instant::now();
        let no_arb = through_arbiter(&lab, 2, "20", "5", &["--arbiter-timeout-ms", "5"]);
        assert_eq!(no_arb["errors"], 0, "{no_arb}");
        assert_eq!(no_arb["unscheduled"], 20, "{no_arb}");
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "fail-open took {:?}",
            t0.elapsed()
        );
    }
}
