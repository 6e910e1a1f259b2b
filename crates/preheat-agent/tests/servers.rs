//! The agent attached to real third-party servers: memcached (multi-threaded, libevent) and
//! nginx (master + forked workers). Skipped (`preheat_testsupport::skip`) when a server is not installed
//! (`apt-get install memcached nginx-light`).

// Test programs signal and inspect the processes they start (kill, geteuid): libc calls.
#![allow(unsafe_code)]

mod support;

use std::process::Command;
use std::time::Duration;

use preheat_model::proto::{Reply, Request, Strategies};
use support::*;

const WAIT: Duration = Duration::from_secs(10);

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

#[test]
fn memcached_with_agent() {
    let Some(bin) = find_program("memcached") else {
        preheat_testsupport::skip(
            "memcached",
            "memcached is not installed (apt-get install memcached)",
        );
        return;
    };
    let port = free_port();
    let mut cmd = Command::new(bin);
    cmd.args([
        "-p",
        &port.to_string(),
        "-U",
        "0",
        "-t",
        "2",
        "-l",
        "127.0.0.1",
    ]);
    if is_root() {
        cmd.args(["-u", "root"]);
    }
    let dir = tempfile::tempdir().unwrap();
    let srv = start_with_agent("memcached", cmd, dir, &[], |_, child| {
        wait_port(port, child)
    });
    let done = mixed_load(srv.port, 8, 300, None);
    assert_eq!(done, 8 * 300);
    let mut agent = srv.agent();
    let (ok, st) = agent.wait_status(WAIT, |s| s.busy_periods(port) >= 100);
    assert!(ok, "busy periods: {st:?}\n{}", srv.log_tail());
    assert!(st.exe.ends_with("memcached"), "{}", st.exe);
    // The listener thread and the two worker threads wait in epoll.
    assert!(st.threads_seen >= 3, "{st:?}");
    assert!(
        st.ports.iter().all(|p| p.port == port),
        "busy periods on unexpected ports: {:?}",
        st.ports
    );
    let p = st.port(port).unwrap();
    assert_ne!(p.last_tid, 0);
    assert_ne!(
        p.last_tid,
        srv.pid(),
        "memcached's worker threads serve, not the main thread"
    );

    // Replay a warm-up GET through the real kernel path, on announcement.
    agent.ok(&Request::Configure {
        port,
        replay: Some("get __preheat_warmup__\r\n".into()),
        replay_until: Some("END\r\n".into()),
        split_cpus: vec![],
        replay_via: None,
    });
    for i in 0..3u64 {
        srv.announce(
            srv.pid(),
            Strategies::REPLAY.union(Strategies::WAKE),
            LEAD_NS,
            i,
        );
        let (ok, st) = agent.wait_status(WAIT, |s| s.preheat.replays == i + 1);
        assert!(ok, "{:?}", st.preheat);
    }
    let st = agent.status();
    assert_eq!(st.preheat.replay_errors, 0, "{:?}", st.preheat);
    assert_eq!(
        st.preheat.wake_spins + st.preheat.wake_polled,
        3,
        "{:?}",
        st.preheat
    );

    // Probe requests on a multi-threaded server.
    let threshold = match agent.call(&Request::Calibrate) {
        Reply::Calibration { threshold, .. } => threshold,
        other => panic!("{other:?}"),
    };
    let ranges = match agent.call(&Request::Candidates) {
        Reply::Candidates { ranges, .. } => ranges,
        other => panic!("{other:?}"),
    };
    let chunk: Vec<_> = ranges.iter().take(16).copied().collect();
    agent.ok(&Request::ProbeFlush {
        ranges: chunk.clone(),
    });
    let mut mc = Mc::connect(port);
    mc.set("after-probe", b"v").unwrap();
    assert!(matches!(
        agent.call(&Request::ProbeReload {
            ranges: chunk,
            threshold,
            window_pages: 16,
            seed: 1,
        }),
        Reply::Probed { .. }
    ));
    assert_eq!(mc.get("after-probe").unwrap().as_deref(), Some(&b"v"[..]));
    let mut srv = srv;
    assert!(srv.alive(), "{}", srv.log_tail());
}

#[test]
fn nginx_workers_are_forked_with_agents() {
    let Some(bin) = find_program("nginx") else {
        preheat_testsupport::skip(
            "nginx",
            "nginx is not installed (apt-get install nginx-light)",
        );
        return;
    };
    let port = free_port();
    let dir = tempfile::tempdir().unwrap();
    let t = dir.path().to_str().unwrap().to_string();
    std::fs::create_dir_all(dir.path().join("www")).unwrap();
    let body: Vec<u8> = (0..207).map(|i| b'a' + (i % 26) as u8).collect();
    std::fs::write(dir.path().join("www/index.html"), &body).unwrap();
    let user = if is_root() { "user root;\n" } else { "" };
    let conf = format!(
        "daemon off;\nmaster_process on;\nworker_processes 2;\n{user}error_log stderr notice;\npid {t}/nginx.pid;\n\
         events {{ worker_connections 256; }}\n\
         http {{\n  access_log off;\n  keepalive_requests 100000;\n\
           client_body_temp_path {t}/body;\n  proxy_temp_path {t}/proxy;\n  fastcgi_temp_path {t}/fastcgi;\n\
           uwsgi_temp_path {t}/uwsgi;\n  scgi_temp_path {t}/scgi;\n\
           server {{\n    listen 127.0.0.1:{port};\n    root {t}/www;\n    location / {{ }}\n  }}\n}}\n"
    );
    let conf_path = dir.path().join("nginx.conf");
    std::fs::write(&conf_path, conf).unwrap();
    let mut cmd = Command::new(bin);
    cmd.arg("-p")
        .arg(&t)
        .arg("-c")
        .arg(&conf_path)
        .args(["-e", "stderr"]);
    let srv = start_with_agent(
        "nginx",
        cmd,
        dir,
        &[("PREHEAT_AGENT_ONLY", "nginx")],
        |_, child| wait_port(port, child),
    );
    let master = srv.pid();
    // Workers are forked from the master: each must have an agent of its own.
    let mut workers = Vec::new();
    let ok = wait_until(WAIT, || {
        workers = children_of(master);
        let agents = preheat_agent::live_agents(&srv.run_dir);
        workers.len() == 2 && workers.iter().all(|w| agents.contains(w)) && agents.contains(&master)
    });
    assert!(
        ok,
        "workers {workers:?}, agents {:?}\n{}",
        preheat_agent::live_agents(&srv.run_dir),
        srv.log_tail()
    );

    // Keep-alive GETs from several clients, every response verified.
    let handles: Vec<_> = (0..8)
        .map(|_| {
            let body = body.clone();
            std::thread::spawn(move || {
                let mut h = Http::connect(port);
                for _ in 0..150 {
                    let (status, b) = h.get("/index.html").unwrap();
                    assert_eq!(status, 200);
                    assert_eq!(b, body);
                }
                let (status, _) = h.get("/missing").unwrap();
                assert_eq!(status, 404);
            })
        })
        .collect();
    for h in handles {
        h.join().expect("http client");
    }

    let mut total = 0;
    for &w in &workers {
        let mut agent = srv.agent_of(w);
        let st = agent.status();
        assert_eq!(st.pid, w);
        assert!(st.enabled, "{st:?}");
        assert!(
            st.ports.iter().all(|p| p.port == port),
            "worker {w}: busy periods on unexpected ports: {:?}",
            st.ports
        );
        total += st.busy_periods(port);
        // The worker's trigger thread and preheat workers were restarted after fork.
        srv.announce(w, Strategies::WAKE, LEAD_NS, 1);
        let (ok, st) =
            agent.wait_status(WAIT, |s| s.preheat.wake_spins + s.preheat.wake_polled == 1);
        assert!(ok, "worker {w}: {:?}", st.preheat);
        assert_eq!(
            st.preheat.announcements, 1,
            "counters start over in the child"
        );
    }
    assert!(
        total >= 100,
        "only {total} busy periods in the workers for 1208 requests"
    );
    // The master does not serve requests.
    let st = srv.agent_of(master).status();
    assert_eq!(st.busy_periods(port), 0, "{st:?}");
    let mut h = Http::connect(port);
    assert_eq!(h.get("/index.html").unwrap(), (200, body));
}
