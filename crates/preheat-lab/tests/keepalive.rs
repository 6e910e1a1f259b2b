//! Keep-alive connections a server ends in the normal way are reopened as real clients do and
//! counted as reconnects, not errors (issue: `preheat load --protocol http` against lighttpd
//! counted one error per ~1000 requests, at its keep-alive request limit): a real lighttpd
//! (Debian package) with a small request limit, and an in-test server that closes a connection
//! that served requests without saying so. Both client loops.

// A test starts (and stops) its own server: the library's rule against it does not apply here.
#![allow(clippy::disallowed_methods)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use preheat_lab::driver::{connect, Driver, Protocol, Wait, WorkloadSpec};
use preheat_lab::load::{run, LoadConfig, LoadSummary, Mode};

const BODY: &[u8] = b"keep-alive test body\n";

fn cfg(wait: Wait, requests: u64) -> LoadConfig {
    LoadConfig {
        mode: Mode::Closed,
        requests: Some(requests),
        duration: None,
        rate: 1000.0,
        gap: Duration::from_millis(1),
        connections: 1,
        threads: 0,
        wait,
        warmup: 1,
        seed: 7,
        strategy: "none".into(),
    }
}

fn load(addr: SocketAddr, path: &str, wait: Wait, requests: u64) -> LoadSummary {
    let spec = WorkloadSpec {
        protocol: Protocol::Http,
        key: path.into(),
        expect: Some(BODY.to_vec()),
        tpcc: None,
    };
    // The driver's socket is set up for the run's wait mode (the mode picks the client loop).
    let connector = move || -> anyhow::Result<Box<dyn Driver>> { connect(addr, &spec, wait) };
    let c = cfg(wait, requests);
    let stop = AtomicBool::new(false);
    run(&c, &connector, None, None, &stop, &|_| {}).expect("the load run")
}

use preheat_testsupport::free_port;

/// The server process and its directory (removed after the process is gone).
struct Lighttpd(Child, #[allow(dead_code)] tempfile::TempDir);

impl Drop for Lighttpd {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn lighttpd(max_requests: u32) -> Option<(Lighttpd, SocketAddr)> {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let (exe, conf) = preheat_testsupport::lighttpd_site(
        dir.path(),
        port,
        &[("index.txt", BODY)],
        &format!(
            "server.max-keep-alive-requests = {max_requests}\nserver.max-keep-alive-idle = 30\n"
        ),
    )?;
    let child = Command::new(exe)
        .args(["-D", "-f"])
        .arg(&conf)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("starting lighttpd");
    let guard = Lighttpd(child, dir);
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let t0 = Instant::now();
    while !preheat_engine::host::accepts_connections(addr, Duration::from_secs(1)) {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "lighttpd did not listen on {addr}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    Some((guard, addr))
}

#[test]
fn lighttpd_keep_alive_limit_is_a_reconnect_not_an_error() {
    let Some((_srv, addr)) = lighttpd(10) else {
        return preheat_testsupport::skip("lighttpd", "lighttpd is not installed");
    };
    for wait in [Wait::Block, Wait::Spin, Wait::Epoll] {
        let s = load(addr, "/index.txt", wait, 300);
        assert_eq!(s.requests, 300, "{wait:?}: {s:?}");
        assert_eq!((s.errors, s.wrong), (0, 0), "{wait:?}: {s:?}");
        // lighttpd ends each connection after about 10 requests (its count includes the one
        // it closes with: 11 here) with `Connection: close`: some 25–34 connections for 301
        // requests (warm-up included).
        assert!(
            (25..=34).contains(&s.reconnects),
            "{wait:?}: {} reconnects for 301 requests at 10 per connection",
            s.reconnects
        );
    }
}

/// An HTTP server that answers `per_conn` keep-alive requests per connection and then closes
/// the connection when the next request arrives, without answering and without having said so
/// (a silent keep-alive limit). `per_conn == 0`: closes every connection at its first request.
fn silent_closer(per_conn: u64) -> (SocketAddr, Arc<AtomicU64>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicU64::new(0));
    let acc = accepted.clone();
    std::thread::spawn(move || {
        for s in listener.incoming() {
            let Ok(mut s) = s else { continue };
            acc.fetch_add(1, Ordering::SeqCst);
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                let mut served = 0;
                let mut pending = Vec::new();
                loop {
                    let n = match s.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => n,
                    };
                    pending.extend_from_slice(&buf[..n]);
                    while let Some(end) = pending.windows(4).position(|w| w == b"\r\n\r\n") {
                        pending.drain(..end + 4);
                        if served == per_conn {
                            return; // close without answering
                        }
                        served += 1;
                        let mut reply =
                            format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", BODY.len())
                                .into_bytes();
                        reply.extend_from_slice(BODY);
                        if s.write_all(&reply).is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    (addr, accepted)
}

#[test]
fn a_silently_closed_keep_alive_connection_is_a_reconnect_not_an_error() {
    for wait in [Wait::Block, Wait::Epoll] {
        let (addr, accepted) = silent_closer(3);
        let s = load(addr, "/x", wait, 30);
        assert_eq!(s.requests, 30, "{wait:?}: {s:?}");
        assert_eq!(s.errors, 0, "{wait:?}: {s:?}");
        // 31 requests at 3 per connection: 10 closed connections were reopened.
        assert_eq!(s.reconnects, 10, "{wait:?}: {s:?}");
        assert_eq!(accepted.load(Ordering::SeqCst), 11, "{wait:?}");
    }
}

#[test]
fn a_connection_closed_before_its_first_reply_is_still_an_error() {
    // A fresh connection that is closed unanswered served nothing: not a keep-alive end. The
    // run gives up after failures in a row, each counted as an error.
    let (addr, _) = silent_closer(0);
    let spec = WorkloadSpec {
        protocol: Protocol::Http,
        key: "/x".into(),
        expect: Some(BODY.to_vec()),
        tpcc: None,
    };
    let connector =
        move || -> anyhow::Result<Box<dyn Driver>> { connect(addr, &spec, Wait::Block) };
    let stop = AtomicBool::new(false);
    let e = run(&cfg(Wait::Block, 5), &connector, None, None, &stop, &|_| {})
        .expect_err("every request fails");
    assert!(format!("{e:#}").contains("in a row"), "{e:#}");
}
