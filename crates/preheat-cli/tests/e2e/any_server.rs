//! Any server, not only the catalog (issue 12, point 2): prefork servers, whose worker processes
//! share one listening socket and each carry an agent of their own while the process that loaded
//! the agent first never serves, and Python's threaded `http.server`, whose handler threads block
//! in `recv` instead of waiting in epoll/poll/select. Real servers on loopback, the real demo and
//! recorder.

use crate::common;

use std::path::{Path, PathBuf};

use common::{assert_no_agent_sockets, find_program, ok, run_dir, serial};
use serde_json::Value;

/// The preforking Python server (blocking workers, keep-alive), a fixture file beside the tests.
fn prefork_fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/prefork_http.py")
}

pub(crate) fn tmpdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("preheat-any-")
        .tempdir()
        .unwrap()
}

fn page() -> String {
    format!("<html>{}</html>\n", "any server ".repeat(300))
}

/// Pids whose agent attached to a program whose path contains `program` (agent logs stay in the
/// run directory after the processes are gone).
pub(crate) fn agent_pids_of(rd: &Path, program: &str) -> Vec<String> {
    let mut pids: Vec<String> = common::agent_logs(rd)
        .into_iter()
        .filter_map(|(_, log)| {
            log.lines()
                .filter_map(|l| l.split_once("attached to ").map(|(_, r)| r))
                .find(|r| r.split(' ').next().is_some_and(|exe| exe.contains(program)))
                .and_then(|r| r.split("(pid ").nth(1))
                .and_then(|r| r.split(')').next())
                .map(str::to_string)
        })
        .collect();
    pids.sort();
    pids.dedup();
    pids
}

/// `preheat demo` on a server given by its command; the parsed JSON.
pub(crate) fn demo(rd: &Path, port: u16, strategies: &str, command: &[&str]) -> Value {
    // A lead this shared 2-vCPU machine meets reliably: the test is about reaching the right
    // process, not about the shortest lead.
    let opts = [
        "--rounds",
        "3",
        "--lead-us",
        "300",
        "--strategies",
        strategies,
    ];
    demo_with(rd, port, &opts, command)
}

/// `preheat demo` with the quick options, `opts`, and an HTTP request for `/index.html` on
/// `port`, on a server given by its command; the parsed JSON.
pub(crate) fn demo_with(rd: &Path, port: u16, opts: &[&str], command: &[&str]) -> Value {
    let port = port.to_string();
    // The tests read the agents' logs afterwards (which processes loaded one).
    let mut args = vec!["demo", "--keep-agent-logs"];
    args.extend(common::QUICK_DEMO);
    args.extend_from_slice(opts);
    args.extend([
        "--port",
        &port,
        "--protocol",
        "http",
        "--request",
        "/index.html",
        "--json",
        "--",
    ]);
    args.extend_from_slice(command);
    serde_json::from_str(&ok(&args, rd)).unwrap()
}

/// Every mode in `modes` measured `n` times, and every preheated request reached a preheated
/// process (but for workers that joined).
pub(crate) fn assert_rows(v: &Value, modes: &[&str], n: u64) {
    let rows = v["rows"].as_array().unwrap();
    for m in modes {
        let r = rows
            .iter()
            .find(|r| r["mode"] == *m)
            .unwrap_or_else(|| panic!("mode {m} missing: {}", v["skipped"]));
        assert_eq!(r["latency"]["n"], n, "{r}");
    }
    // Where `lines` ran, it had a working set.
    if let Some(lines) = rows.iter().find(|r| r["mode"] == "preheat:lines") {
        assert!(lines["ws_kib"].as_f64().unwrap() > 0.0, "empty working set");
    }
    // Every preheated request reached a preheated process, but for one per worker that joined
    // the announced set during the measurement (a prefork server that closes its connections
    // hands a request to any worker; the demo announces to a worker from the request after
    // the first it served unannounced).
    let missed = missed_requests(v);
    let joined = v["joined_pids"].as_array().unwrap().len();
    assert!(
        missed <= joined,
        "{missed} measured requests reached no announced process, {joined} joined: {:?}",
        rows.iter().map(|r| &r["flags"]).collect::<Vec<_>>()
    );
}

/// Measured requests that reached no announced process.
pub(crate) fn missed_requests(v: &Value) -> usize {
    v["samples"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["served_by_preheated"] == false)
        .count()
}

/// The samples of `mode`.
pub(crate) fn samples<'a>(v: &'a Value, mode: &str) -> Vec<&'a Value> {
    v["samples"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["mode"] == mode)
        .collect()
}

/// The agent acted on at least one announcement of `mode` (a late or unrouted one has no lead).
pub(crate) fn assert_acted(v: &Value, mode: &str) {
    let s = samples(v, mode);
    assert!(
        s.iter().any(|s| s["worker_lead_us"].as_f64().is_some()),
        "the agent acted on no announcement of {mode}: {s:?}"
    );
}

/// `auto`'s choice in the demo's JSON is one of the candidates its pilot measured to help, or
/// `none` where none did; (the choice, the candidates that helped).
pub(crate) fn assert_auto_chose_what_helped(v: &Value) -> (String, Vec<String>) {
    let auto = &v["auto"];
    let helped: Vec<String> = auto["candidates"]
        .as_array()
        .unwrap_or_else(|| panic!("no auto pilot: {auto}"))
        .iter()
        .filter(|c| c["verdict"] == "helps")
        .map(|c| c["strategies"].as_str().unwrap().to_string())
        .collect();
    let chosen = auto["chosen"].as_str().unwrap().to_string();
    assert!(
        helped.contains(&chosen) || (helped.is_empty() && chosen == "none"),
        "auto chose {chosen}, measured to help: {helped:?}"
    );
    (chosen, helped)
}

/// The reason a mode was skipped, if it was.
pub(crate) fn skip_reason(v: &Value, mode: &str) -> Option<String> {
    v["skipped"]
        .as_array()?
        .iter()
        .find(|s| s["mode"] == mode)
        .map(|s| s["reason"].as_str().unwrap_or_default().to_string())
}

/// lighttpd with two worker processes (`server.max-worker = 2`): the master loads the agent
/// first and never serves. Recording, `lines` and `replay` must reach the worker that serves the
/// demo's connection (replay through a connection that worker's agent verified it serves).
#[test]
fn demo_on_a_prefork_lighttpd() {
    // One at a time: each measures on the same 2 CPUs (parallel demos make announcements late).
    let _one = serial();
    let tmp = tmpdir();
    let rd = run_dir(&tmp);
    let port = preheat_testsupport::free_port();
    let body = page();
    let Some((exe, conf)) = preheat_testsupport::lighttpd_site(
        tmp.path(),
        port,
        &[("index.html", body.as_bytes())],
        "server.max-worker = 2\n",
    ) else {
        return preheat_testsupport::skip("lighttpd", "lighttpd is not installed");
    };
    let v = demo(
        &rd,
        port,
        "lines,replay",
        &[exe.to_str().unwrap(), "-D", "-f", conf.to_str().unwrap()],
    );
    // It really forked: the master and two workers each started an agent.
    let pids = agent_pids_of(&rd, "lighttpd");
    assert!(
        pids.len() >= 3,
        "lighttpd did not fork workers: agents {pids:?}"
    );
    // The serving worker's agent opened the probe's connection itself (one it serves).
    assert_eq!(
        v["record"]["external"], false,
        "{}",
        v["record"]["external_reason"]
    );
    assert_eq!(skip_reason(&v, "preheat:replay"), None);
    assert_rows(
        &v,
        &["warm", "cold-sweep", "preheat:lines", "preheat:replay"],
        3,
    );
    assert_acted(&v, "preheat:lines");
    assert_acted(&v, "preheat:replay");
    assert_no_agent_sockets(&rd);
}

/// lighttpd with two event-loop workers and keep-alive off: every request is a new connection
/// that either worker may accept, and which one does changes with the moment (measured: one
/// worker served all of the demo's first requests, then 7–29 of 60 measured requests per mode
/// went to the other, unannounced one). A worker that serves a measured request unannounced
/// joins the announced set at once: each worker is missed at most once. The working set is
/// recorded with keep-alive on (the probe cannot choose the worker of a fresh connection).
#[test]
fn demo_on_a_prefork_lighttpd_that_closes_connections() {
    let _one = serial();
    let tmp = tmpdir();
    let rd = run_dir(&tmp);
    let body = page();
    let site = |dir: &str, port: u16, extra: &str| {
        let d = tmp.path().join(dir);
        std::fs::create_dir_all(&d).unwrap();
        preheat_testsupport::lighttpd_site(&d, port, &[("index.html", body.as_bytes())], extra)
    };
    let (ka_port, port) = (
        preheat_testsupport::free_port(),
        preheat_testsupport::free_port(),
    );
    let Some((exe, ka_conf)) = site("keepalive", ka_port, "server.max-worker = 2\n") else {
        return preheat_testsupport::skip("lighttpd", "lighttpd is not installed");
    };
    let (_, conf) = site(
        "close",
        port,
        "server.max-worker = 2\nserver.max-keep-alive-requests = 0\n",
    )
    .unwrap();
    let profile = tmp.path().join("lighttpd.phws");
    let ka = ka_port.to_string();
    ok(
        &[
            "record",
            "--backend",
            "probe",
            "--samples",
            "4",
            "--keep",
            "3",
            "--out",
            profile.to_str().unwrap(),
            "--port",
            &ka,
            "--request",
            "GET /index.html HTTP/1.1\\r\\nHost: 127.0.0.1\\r\\n\\r\\n",
            "--until",
            "</html>\\n",
            "--",
            exe.to_str().unwrap(),
            "-D",
            "-f",
            ka_conf.to_str().unwrap(),
        ],
        &rd,
    );
    let opts = [
        "--rounds",
        "12",
        "--lead-us",
        "300",
        "--strategies",
        "replay,wake+lines+replay",
        "--profile",
        profile.to_str().unwrap(),
    ];
    let v = demo_with(
        &rd,
        port,
        &opts,
        &[exe.to_str().unwrap(), "-D", "-f", conf.to_str().unwrap()],
    );
    let announced = v["serving_pids"].as_array().unwrap().len();
    let missed = missed_requests(&v);
    assert!(
        missed < announced,
        "{missed} measured requests reached no announced worker, {announced} announced \
         ({:?}): a worker that served one unannounced did not join",
        v["serving_pids"]
    );
    assert_acted(&v, "preheat:replay");
    assert_no_agent_sockets(&rd);
}

/// What the Python servers' tests share: python3, a temp dir (keep it alive), its run dir, and
/// `www/index.html` to serve.
struct PythonSite {
    python: std::path::PathBuf,
    tmp: tempfile::TempDir,
    rd: std::path::PathBuf,
    www: std::path::PathBuf,
}

/// A [`PythonSite`], or `None` (skipped, saying why) without python3.
fn python_site() -> Option<PythonSite> {
    let Some(python) = find_program("python3") else {
        preheat_testsupport::skip("python3", "python3 is not installed");
        return None;
    };
    let tmp = tmpdir();
    let rd = run_dir(&tmp);
    let www = tmp.path().join("www");
    std::fs::create_dir_all(&www).unwrap();
    std::fs::write(www.join("index.html"), page()).unwrap();
    Some(PythonSite {
        python,
        tmp,
        rd,
        www,
    })
}

/// A preforking server whose workers block in accept and recv and serve one connection at a
/// time: the worker that serves the demo's connection cannot take a connection of its agent's,
/// so the demo hands that agent its own connection for the probe's requests (`ProbeAdopt`),
/// and `replay` warms up on a fresh connection each time, served by the sibling worker
/// (issue 20, point 3).
#[test]
fn demo_on_a_preforking_python_server() {
    // One at a time: each measures on the same 2 CPUs (parallel demos make announcements late).
    let _one = serial();
    let Some((_tmp, rd, v)) = demo_on_prefork_fixture(&[]) else {
        return;
    };
    let pids = agent_pids_of(&rd, "python");
    assert!(pids.len() >= 3, "the fixture did not fork: agents {pids:?}");
    // The agent's own connections went to the sibling (or waited for it): it was handed ours.
    assert_eq!(v["record"]["external"], false, "{}", v["record"]);
    assert!(v["record"]["probe_adopted"].is_string(), "{}", v["record"]);
    assert_rows(
        &v,
        &["warm", "cold-sweep", "preheat:lines", "preheat:replay"],
        3,
    );
    assert_acted(&v, "preheat:lines");
    assert_eq!(skip_reason(&v, "preheat:replay"), None);
    assert_fresh_replays(&v, 3);
    // One connection, one worker: the announcements go to it alone.
    assert_eq!(
        v["serving_pids"].as_array().unwrap().len(),
        1,
        "{}",
        v["serving_pids"]
    );
    // Busy periods of blocking workers are tracked: the server thread's start is measured.
    assert!(
        samples(&v, "warm")
            .iter()
            .any(|s| s["server_start_us"].as_f64().is_some()),
        "no server start measured for a blocking worker"
    );
    assert_no_agent_sockets(&rd);
}

/// The preforking server closing every connection after its reply (`close`): each request goes
/// to the other worker than the last, so the demo announces to both, and both warm up on fresh
/// connections.
#[test]
fn demo_on_a_preforking_python_server_that_closes_connections() {
    // One at a time: each measures on the same 2 CPUs (parallel demos make announcements late).
    let _one = serial();
    let Some((_tmp, rd, v)) = demo_on_prefork_fixture(&["close"]) else {
        return;
    };
    // Both workers served the demo's requests (the fixture's workers take turns to accept)
    // and were announced to (not the master).
    let serving = v["serving_pids"].as_array().unwrap();
    let agents = agent_pids_of(&rd, "python");
    assert_eq!(
        serving.len(),
        2,
        "serving {}, joined {}, agents {agents:?}",
        v["serving_pids"],
        v["joined_pids"]
    );
    for p in serving {
        assert!(
            agents.contains(&p.to_string()),
            "{p} is not an agent: {agents:?}"
        );
    }
    assert_rows(
        &v,
        &["warm", "cold-sweep", "preheat:lines", "preheat:replay"],
        3,
    );
    assert_acted(&v, "preheat:lines");
    assert_eq!(skip_reason(&v, "preheat:replay"), None);
    assert_no_agent_sockets(&rd);
}

/// `preheat demo --strategies lines,replay` on the preforking fixture with two workers (and
/// `extra` arguments): the temp dir (keep it alive), the run dir and the demo's JSON; `None`
/// (skipped, saying why) without python3.
fn demo_on_prefork_fixture(
    extra: &[&str],
) -> Option<(tempfile::TempDir, std::path::PathBuf, Value)> {
    demo_on_python(|port, www| {
        let mut args = prefork_args(port, www);
        args.extend(extra.iter().map(|s| s.to_string()));
        args
    })
}

/// The preforking fixture's arguments after python3: two workers on `port` serving `www`.
fn prefork_args(port: &str, www: &str) -> Vec<String> {
    let fixture = prefork_fixture();
    vec![
        fixture.to_str().unwrap().into(),
        port.into(),
        www.into(),
        "2".into(),
    ]
}

/// `preheat demo --strategies lines,replay` on a python3 server whose arguments after
/// `python3` are `args(port, docroot)`: the temp dir (keep it alive), the run dir and the
/// demo's JSON; `None` (skipped, saying why) without python3.
fn demo_on_python(
    args: impl FnOnce(&str, &str) -> Vec<String>,
) -> Option<(tempfile::TempDir, std::path::PathBuf, Value)> {
    let PythonSite {
        python,
        tmp,
        rd,
        www,
    } = python_site()?;
    let port = preheat_testsupport::free_port();
    let args = args(&port.to_string(), www.to_str().unwrap());
    let mut command = vec![python.to_str().unwrap()];
    command.extend(args.iter().map(String::as_str));
    let v = demo(&rd, port, "lines,replay", &command);
    Some((tmp, rd, v))
}

/// The recording agent (the primary) sent its `replay` warm-ups on fresh connections, one per
/// measured replay round (the pilot and other modes add none here): at least one, and every
/// round either replayed or counted late — an announcement that reached the agent after its
/// arrival time (a stall longer than the lead while other tests load the 2 CPUs; on a host
/// without a cpuidle driver the agent's control thread also wakes from halt: failed once there
/// with replays 2, late 1).
fn assert_fresh_replays(v: &Value, n: u64) {
    let c = &v["agent_counters"];
    let fresh = c["replays_fresh"].as_u64().unwrap_or(0);
    let late = c["late"].as_u64().unwrap_or(0);
    assert!(
        fresh >= 1 && fresh + late >= n,
        "replays not on fresh connections: {c}"
    );
    assert_eq!(c["replays_fresh"], c["replays"], "{c}");
}

/// `preheat record` on the preforking server (the issue's failing case: "server closed the probe
/// connection").
#[test]
fn record_on_a_preforking_python_server() {
    // One at a time: each measures on the same 2 CPUs (parallel demos make announcements late).
    let _one = serial();
    let Some(PythonSite {
        python,
        tmp,
        rd,
        www,
    }) = python_site()
    else {
        return;
    };
    let port = preheat_testsupport::free_port().to_string();
    let out = tmp.path().join("prefork.phws");
    let fixture = prefork_fixture();
    ok(
        &[
            "record",
            "--keep-agent-logs", // read below: which processes loaded an agent
            "--backend",
            "probe",
            "--samples",
            "4",
            "--keep",
            "3",
            "--out",
            out.to_str().unwrap(),
            "--port",
            &port,
            "--request",
            "GET /index.html HTTP/1.1\\r\\nHost: 127.0.0.1\\r\\n\\r\\n",
            "--until",
            "</html>\\n",
            "--",
            python.to_str().unwrap(),
            fixture.to_str().unwrap(),
            &port,
            www.to_str().unwrap(),
            "2",
        ],
        &rd,
    );
    let shown = ok(&["ws", "show", out.to_str().unwrap(), "--json"], &rd);
    let v: Value = serde_json::from_str(&shown).unwrap();
    assert!(
        v["classes"][0]["lines"].as_u64().unwrap_or(0) > 0,
        "an empty working set: {v}"
    );
    assert!(
        agent_pids_of(&rd, "python").len() >= 3,
        "the fixture did not fork"
    );
    assert_no_agent_sockets(&rd);
}

/// `python3 -m http.server` as a user runs it: a thread per connection blocking in recv, and
/// HTTP/1.0, so the server closes every connection after its reply. Every request opens its
/// connection inside the measurement; `replay` warms up on a fresh connection each time.
#[test]
fn demo_on_python_http_server() {
    // One at a time: each measures on the same 2 CPUs (parallel demos make announcements late).
    let _one = serial();
    let Some((_tmp, rd, v)) = demo_on_python_http(&[]) else {
        return;
    };
    assert_rows(
        &v,
        &["warm", "cold-sweep", "preheat:lines", "preheat:replay"],
        3,
    );
    assert_acted(&v, "preheat:lines");
    assert_eq!(skip_reason(&v, "preheat:replay"), None);
    assert_fresh_replays(&v, 3);
    assert_no_agent_sockets(&rd);
}

/// `preheat demo --strategies lines,replay` on `python3 -m http.server` serving a one-page site
/// (with `extra` arguments): the temp dir (keep it alive), the run dir and the demo's JSON; `None`
/// (skipped, saying why) without python3.
fn demo_on_python_http(extra: &[&str]) -> Option<(tempfile::TempDir, std::path::PathBuf, Value)> {
    demo_on_python(|port, www| {
        let mut args: Vec<String> = [
            "-m",
            "http.server",
            port,
            "--bind",
            "127.0.0.1",
            "--directory",
            www,
        ]
        .map(String::from)
        .to_vec();
        args.extend(extra.iter().map(|s| s.to_string()));
        args
    })
}

/// The threaded server with keep-alive (`-p HTTP/1.1`): the handler thread serves every request
/// of the connection with blocking reads and never waits in epoll/poll/select, so its busy
/// periods (the server start, `replay`'s target) come only from blocking-reader tracking; it
/// writes head and body separately with Nagle on, which must not stall replies for the
/// client's delayed-ACK timer (40 ms).
#[test]
fn demo_on_python_threaded_keepalive_server() {
    // One at a time: each measures on the same 2 CPUs (parallel demos make announcements late).
    let _one = serial();
    let Some((_tmp, rd, v)) = demo_on_python_http(&["-p", "HTTP/1.1"]) else {
        return;
    };
    assert_eq!(skip_reason(&v, "preheat:replay"), None);
    assert_rows(
        &v,
        &["warm", "cold-sweep", "preheat:lines", "preheat:replay"],
        3,
    );
    assert_acted(&v, "preheat:replay");
    let warm = samples(&v, "warm");
    assert!(
        warm.iter().all(|s| s["server_start_us"].as_f64().is_some()),
        "the handler thread's busy periods were not tracked: {warm:?}"
    );
    let p50 = v["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["mode"] == "warm")
        .and_then(|r| r["latency"]["p50"].as_f64())
        .unwrap();
    assert!(
        p50 < 20_000.0,
        "warm p50 {p50} µs: replies stalled by Nagle and delayed ACKs"
    );
    assert_no_agent_sockets(&rd);
}

/// Tests whose outcome depends on the machine's timing: `scripts/test.sh` runs every `timing::`
/// test after all others, one at a time.
mod timing {
    use super::*;
    use preheat_testsupport::KillOnDrop;

    /// nginx (one worker, an event loop) as a reverse proxy in front of the preforking fixture:
    /// a `replay` warm-up is forwarded to the backend, which may still be busy with it when the
    /// real request arrives (issue 20 measured replay 29% *slower* than none there). `auto`
    /// must never announce what its pilot did not measure to help, and the table's `auto` row
    /// must not be measurably slower than announcing nothing (its CI wholly above none's).
    #[test]
    fn auto_on_a_reverse_proxy_is_never_slower_than_none() {
        let _one = serial();
        let Some(nginx) = find_program("nginx") else {
            return preheat_testsupport::skip("nginx", "nginx is not installed");
        };
        let Some(site) = python_site() else {
            return;
        };
        let back = preheat_testsupport::free_port();
        let mut backend = KillOnDrop(
            std::process::Command::new(&site.python)
                .args(prefork_args(&back.to_string(), site.www.to_str().unwrap()))
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap(),
        );
        preheat_testsupport::wait_port(back, &mut backend.0).unwrap();
        let port = preheat_testsupport::free_port();
        let conf = proxy_conf(site.tmp.path(), port, back);
        let (nginx_s, conf_s) = (nginx.to_str().unwrap(), conf.to_str().unwrap());
        let prefix = site.tmp.path().to_str().unwrap();
        let opts = [
            "--rounds",
            "16",
            "--pilot-rounds",
            "12",
            "--lead-us",
            "200",
            "--strategies",
            "auto,replay",
        ];
        let command = [nginx_s, "-p", prefix, "-c", conf_s, "-e", "stderr"];
        let v = demo_with(&site.rd, port, &opts, &command);
        let (chosen, helped) = assert_auto_chose_what_helped(&v);
        eprintln!(
            "reverse proxy: auto chose {chosen} (measured); helped: {helped:?}; {}",
            v["auto"]
        );
        let row = |m: &str| {
            v["rows"]
                .as_array()
                .unwrap()
                .iter()
                .find(|r| r["mode"] == m)
                .unwrap_or_else(|| panic!("no {m} row: {}", v["skipped"]))["latency"]
                .clone()
        };
        let (a, none) = (row("preheat:auto"), row("cold-sweep"));
        eprintln!("reverse proxy, 200 µs (measured, n = 16): auto {a}, none {none}");
        assert!(
            a["p50_lo"].as_f64().unwrap() <= none["p50_hi"].as_f64().unwrap(),
            "auto measurably slower than none: auto {a}, none {none}"
        );
        assert_no_agent_sockets(&site.rd);
    }

    /// nginx.conf for a one-worker reverse proxy on `port` to 127.0.0.1:`back` (a new upstream
    /// connection per request: the blocking backend's two workers are never held by idle
    /// upstream connections).
    fn proxy_conf(dir: &Path, port: u16, back: u16) -> PathBuf {
        let t = dir.to_str().unwrap();
        let user = if common::euid_is_root() {
            "user root;\n"
        } else {
            ""
        };
        let conf = format!(
            "daemon off;\nmaster_process on;\nworker_processes 1;\n{user}pid {t}/nginx.pid;\n\
             error_log stderr warn;\nevents {{ worker_connections 256; }}\n\
             http {{\n  access_log off;\n  keepalive_requests 100000;\n  keepalive_timeout 3600s;\n\
             \x20 client_body_temp_path {t}/body;\n  proxy_temp_path {t}/proxy;\n\
             \x20 fastcgi_temp_path {t}/fastcgi;\n  uwsgi_temp_path {t}/uwsgi;\n\
             \x20 scgi_temp_path {t}/scgi;\n\
             \x20 server {{\n    listen 127.0.0.1:{port};\n\
             \x20   location / {{ proxy_pass http://127.0.0.1:{back}; }}\n  }}\n}}\n"
        );
        let path = dir.join("proxy.conf");
        std::fs::write(&path, conf).unwrap();
        path
    }
}
