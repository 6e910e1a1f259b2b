//! Servers in managed runtimes through the any-server demo (issue 23): a Node.js `http` server
//! (`tests/fixtures/node_http.js`: one libuv event loop, keep-alive). Node is dynamically
//! linked against the C library, so the agent loads through `LD_PRELOAD` and finds its busy
//! periods in `epoll_wait`/`read`/`writev` as for a C event loop. A JVM HTTP server with a
//! thread hand-off (`tests/fixtures/JvmHandoff.java`, compiled by the test), which the agent
//! enters the same way. A statically linked Go
//! `net/http` server, which the agent cannot enter, is preheated from outside the process.
//! Real servers on loopback, the real demo and recorder.

use std::path::Path;

use crate::any_server::{
    agent_pids_of, assert_acted, assert_auto_chose_what_helped, assert_rows, demo, missed_requests,
    samples, skip_reason, tmpdir,
};
use crate::common::{assert_no_agent_sockets, find_program, run_dir, serial};

/// The Node.js fixture server.
fn node_fixture() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/node_http.js")
}

/// `preheat demo` on the Node.js server: the recording keeps lines, `lines` and `replay` reach
/// the event loop (the agent acted on their announcements), and `auto` ran its pilot and
/// measured whatever it chose in every round.
#[test]
fn demo_on_a_node_http_server() {
    // One at a time: each measures on the same 2 CPUs (parallel demos make announcements late).
    let _one = serial();
    let Some(node) = find_program("node") else {
        return preheat_testsupport::skip("node", "Node.js (node) is not installed");
    };
    let tmp = tmpdir();
    let rd = run_dir(&tmp);
    let port = preheat_testsupport::free_port();
    let fixture = node_fixture();
    let v = demo(
        &rd,
        port,
        "auto,lines,replay",
        &[
            node.to_str().unwrap(),
            fixture.to_str().unwrap(),
            &port.to_string(),
        ],
    );
    // The agent attached to node itself (not to a wrapper).
    assert!(
        !agent_pids_of(&rd, "node").is_empty(),
        "no agent attached to node"
    );
    assert_eq!(skip_reason(&v, "preheat:replay"), None);
    assert_rows(
        &v,
        &[
            "warm",
            "cold-sweep",
            "preheat:auto",
            "preheat:lines",
            "preheat:replay",
        ],
        3,
    );
    assert_acted(&v, "preheat:lines");
    assert_acted(&v, "preheat:replay");
    // The event loop's busy periods were tracked: every warm request has a server start.
    let warm = samples(&v, "warm");
    assert!(
        warm.iter().all(|s| s["server_start_us"].as_f64().is_some()),
        "node's event loop was not tracked: {warm:?}"
    );
    assert_no_agent_sockets(&rd);
}

/// The JVM hand-off server (issue 23): the JDK's HTTP server, whose dispatcher thread reads a
/// request and hands it to a one-thread executor that serves it. The agent attaches to `java`
/// itself; the recording runs (its time is printed, not asserted); `replay` reaches the server (the
/// agent acted on its announcements and its warm-ups were answered); `auto` ran its pilot and
/// announces only what the pilot measured to help (or nothing), measured in every round.
#[test]
fn demo_on_a_jvm_handoff_server() {
    let _one = serial();
    let (Some(java), Some(javac)) = (find_program("java"), find_program("javac")) else {
        return preheat_testsupport::skip(
            "javac",
            "a JDK (java and javac: Debian's openjdk-17-jdk-headless) is not installed",
        );
    };
    let tmp = tmpdir();
    let classes = tmp.path().join("classes");
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/JvmHandoff.java");
    let built = std::process::Command::new(&javac)
        .arg("-d")
        .arg(&classes)
        .arg(&fixture)
        .output()
        .unwrap();
    assert!(
        built.status.success(),
        "javac failed: {}",
        String::from_utf8_lossy(&built.stderr)
    );
    let rd = run_dir(&tmp);
    let port = preheat_testsupport::free_port();
    let v = demo(
        &rd,
        port,
        "auto,replay",
        &[
            java.to_str().unwrap(),
            // A small heap and one GC thread keep the JVM light on 2 CPUs.
            "-Xmx64m",
            "-XX:+UseSerialGC",
            "-cp",
            classes.to_str().unwrap(),
            "JvmHandoff",
            &port.to_string(),
        ],
    );
    assert!(
        !agent_pids_of(&rd, "java").is_empty(),
        "no agent attached to java"
    );
    // How long the recording took is reported, not asserted: it runs beside the suite's other
    // tests (measured: 21.6 s for the whole test alone, 64 s for the recording in the suite).
    let seconds = v["record"]["seconds"].as_f64().unwrap();
    // More than the 8 warm-up requests (counted too): the samples sent theirs.
    assert!(
        v["record"]["requests_sent"].as_u64().unwrap_or(0) > 8,
        "{}",
        v["record"]
    );
    eprintln!("the JVM's recording took {seconds:.1} s: {}", v["record"]);
    assert_eq!(skip_reason(&v, "preheat:replay"), None);
    assert_rows(
        &v,
        &["warm", "cold-sweep", "preheat:auto", "preheat:replay"],
        3,
    );
    assert_acted(&v, "preheat:replay");
    assert!(
        v["agent_counters"]["replays"].as_u64().unwrap_or(0) > 0,
        "{}",
        v["agent_counters"]
    );
    assert_auto_chose_what_helped(&v);
    assert_no_agent_sockets(&rd);
}

/// Issue 23, point 2: a statically linked Go `net/http` server (`CGO_ENABLED=0`), which the
/// agent cannot enter, preheated from outside the process by default (`--agent auto`): the
/// demo says so and why, records the executable's code and read-only data lines through the
/// outside agent's view of them, and `wake`, `lines` and `replay` act on their announcements
/// (the outside worker's counters); the server's busy periods come from its syscall
/// tracepoints (every warm request has a server start, every announced one reached the
/// observed process).
#[test]
fn demo_on_a_static_go_server_from_outside() {
    let _one = serial();
    let tmp = tmpdir();
    let Some(server) = go_server_to_preheat_from_outside(&tmp) else {
        return;
    };
    let rd = run_dir(&tmp);
    let port = preheat_testsupport::free_port();
    let v = demo(
        &rd,
        port,
        "auto,wake,lines,replay",
        &[server.to_str().unwrap(), &port.to_string()],
    );
    let outside = v["outside"].as_str().unwrap_or_default();
    assert!(
        outside.contains("statically linked Go program")
            && outside.contains("from outside")
            && outside.contains("eBPF programs")
            && !outside.contains("did not load"),
        "{outside:?}"
    );
    // Recorded from outside: the executable's code and read-only data, through the outside
    // agent's view of its file-backed memory.
    // More than the 8 warm-up requests (counted too): the samples sent theirs.
    assert!(
        v["record"]["requests_sent"].as_u64().unwrap_or(0) > 8,
        "{}",
        v["record"]
    );
    assert_eq!(skip_reason(&v, "preheat:lines"), None);
    assert_rows(
        &v,
        &[
            "warm",
            "cold-sweep",
            "preheat:auto",
            "preheat:wake",
            "preheat:lines",
            "preheat:replay",
        ],
        3,
    );
    assert_acted(&v, "preheat:wake");
    assert_acted(&v, "preheat:lines");
    assert_acted(&v, "preheat:replay");
    assert!(
        v["agent_counters"]["lines_preheated"].as_u64().unwrap_or(0) > 0,
        "{}",
        v["agent_counters"]
    );
    assert!(
        v["agent_counters"]["replays"].as_u64().unwrap_or(0) > 0,
        "{}",
        v["agent_counters"]
    );
    let warm = samples(&v, "warm");
    assert!(
        warm.iter().all(|s| s["server_start_us"].as_f64().is_some()),
        "the Go server's busy periods were not seen from outside: {warm:?}"
    );
    assert_eq!(missed_requests(&v), 0, "{}", v["samples"]);
    assert_no_agent_sockets(&rd);
}

/// `preheat run` on the static Go server (root): started without the agent, pinned to
/// `--cpu`, preheated from outside it; `preheat announce` reaches the outside agent through
/// the agent's sockets (a `wake` counted, polled or spun), and SIGTERM stops the server and removes those
/// sockets.
#[test]
fn run_preheats_a_static_go_server_from_outside() {
    use std::io::{BufRead, BufReader};
    let tmp = tmpdir();
    let Some(server) = go_server_to_preheat_from_outside(&tmp) else {
        return;
    };
    let rd = run_dir(&tmp);
    let port = preheat_testsupport::free_port().to_string();
    let mut run = preheat_testsupport::TermOnDrop(
        std::process::Command::new(env!("CARGO_BIN_EXE_preheat"))
            .args([
                "run",
                "--port",
                &port,
                "--replay",
                "GET / HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n",
            ])
            .args(["--replay-until", "pong\\n", "--cpu", "0", "--"])
            .arg(&server)
            .arg(&port)
            .env("PREHEAT_RUN_DIR", &rd)
            .env("TMPDIR", tmp.path())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut said = String::new();
    let mut lines = BufReader::new(run.0.stdout.take().unwrap()).lines();
    let pid: u32 = loop {
        let Some(Ok(l)) = lines.next() else {
            let mut err = String::new();
            let _ = std::io::Read::read_to_string(&mut run.0.stderr.take().unwrap(), &mut err);
            panic!("preheat run ended early: {said}\n{err}");
        };
        said.push_str(&l);
        said.push('\n');
        if let Some(rest) = l.split("with agents [").nth(1) {
            break rest.split(']').next().unwrap().trim().parse().unwrap();
        }
    };
    assert!(
        said.contains("(preheated from outside it, on CPU 0)"),
        "{said}"
    );
    // The server runs pinned to CPU 0.
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    assert!(
        status.contains("Cpus_allowed_list:\t0\n"),
        "{}",
        status
            .lines()
            .filter(|l| l.starts_with("Cpus"))
            .collect::<Vec<_>>()
            .join("; ")
    );
    // A lead no loaded machine overruns: the test is about reaching the outside agent.
    let out = crate::common::ok(
        &[
            "announce",
            "--port",
            &port,
            "--lead-us",
            "200000",
            "--strategies",
            "wake+replay",
        ],
        &rd,
    );
    assert!(out.contains("to 1 of 1 agents"), "{out}");
    let t0 = std::time::Instant::now();
    let st = loop {
        let st = match preheat_launch::agentctl::AgentClient::connect(&rd, pid)
            .and_then(|mut c| c.call(&preheat_model::proto::Request::Status))
            .unwrap()
        {
            preheat_model::proto::Reply::Status { preheat, .. } => preheat,
            other => panic!("unexpected reply {other:?}"),
        };
        // Both strategies done: the wake is counted as the announcement is taken, the warm-up
        // once its reply is in.
        let woke = st.wake_spins + st.wake_polled >= 1;
        if (woke && st.replays >= 1) || t0.elapsed() > std::time::Duration::from_secs(10) {
            break st;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert_eq!(
        (st.wake_spins + st.wake_polled, st.replays, st.replay_errors),
        (1, 1, 0),
        "{st:?}"
    );
    preheat_engine::os::send_signal(run.0.id(), libc::SIGTERM, false).unwrap();
    run.0.wait().unwrap();
    assert!(
        !preheat_engine::host::accepts_connections(
            ([127, 0, 0, 1], port.parse::<u16>().unwrap()).into(),
            std::time::Duration::from_secs(1)
        ),
        "the server still listens"
    );
    // Removed on the signal, not left for the next command's discovery.
    assert_no_agent_sockets(&rd);
}

/// The static Go server built in `tmp`, where this process may preheat it from outside (root);
/// `None`, skipped visibly, where not.
fn go_server_to_preheat_from_outside(tmp: &tempfile::TempDir) -> Option<std::path::PathBuf> {
    if preheat_engine::host::effective_uid() != Some(0) {
        preheat_testsupport::skip(
            "outside",
            "preheating from outside needs root (eBPF programs on kernel tracepoints)",
        );
        return None;
    }
    preheat_testsupport::go_static_http_server(tmp.path())
}
