//! A request read and answered by a pool thread that parks on a futex afterwards (the JDK's
//! `HttpServer` pattern, issue 23): the reply ends the worker's busy period, so the port's
//! count and its last serving thread are known as soon as the request is answered — not at the
//! worker's next read, which comes only with the next request.

// The shared test support signals the processes it starts (kill): libc calls.
#![allow(unsafe_code)]

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use support::*;

const WAIT: Duration = Duration::from_secs(10);

#[test]
fn the_reply_ends_a_pool_threads_busy_period() {
    let dir = tempfile::tempdir().unwrap();
    let ready = dir.path().join("ready");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/handoff/dispatch.py");
    let mut cmd = Command::new("python3");
    cmd.arg(&script).arg(&ready);
    let srv = start_with_agent("dispatch.py", cmd, dir, &[], |_, child| {
        port_from_ready_file(&ready, child)
    });
    let mut agent = srv.agent();
    let mut c = TcpStream::connect(("127.0.0.1", srv.port)).unwrap();
    c.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    // The dispatcher's accept is a busy period of the port: wait for it to settle.
    assert!(agent.wait_status(WAIT, |s| s.busy_periods(srv.port) >= 1).0);
    std::thread::sleep(Duration::from_millis(100));
    let before = agent.status().busy_periods(srv.port);
    for i in 1..=3u64 {
        c.write_all(b"ping\n").unwrap();
        let mut b = [0u8; 5];
        c.read_exact(&mut b).unwrap();
        assert_eq!(&b, b"pong\n");
        // No further request: the worker's period must end with its reply.
        let (ok, st) = agent.wait_status(WAIT, |s| s.busy_periods(srv.port) >= before + i);
        assert!(
            ok,
            "request {i}: the port's busy periods stayed at {} (before: {before})",
            st.busy_periods(srv.port)
        );
        let p = st.port(srv.port).unwrap();
        // Served by the pool thread, not the dispatcher (the main thread, tid = pid).
        assert_ne!(p.last_tid, srv.pid(), "{p:?}");
    }
}
