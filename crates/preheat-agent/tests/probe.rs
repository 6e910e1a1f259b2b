//! Probing a server that unmaps memory while it serves (issue 13, bug 1): the probe validates
//! its ranges against the mappings, the server handles the request (and unmaps part of them),
//! then the probe touches the ranges again. Without a fresh look at the mappings right before
//! every pass that touches them, the *server* dies of SIGSEGV.
//!
//! The server is `tests/probe/unmapper.c` (built with the system C compiler, which the README's
//! test command installs; without one the test reports a skip): every request toggles its region
//! between mapped-and-touched and unmapped, so every other probe round finds the region gone
//! after the request.

// Test programs signal and inspect the processes they start (kill, geteuid): libc calls.
#![allow(unsafe_code)]

mod support;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use preheat_model::proto::{Range, Reply, Request};
use support::*;

/// Probe rounds of each kind.
const ROUNDS: u64 = 60;

/// The region as the server last reported it: (mapped, start, length).
fn region(state: &Path) -> (bool, u64, u64) {
    let s = std::fs::read_to_string(state).expect("the server's state file");
    let mut it = s
        .split_whitespace()
        .map(|x| x.parse::<u64>().expect("a number"));
    let (m, a, l) = (it.next(), it.next(), it.next());
    (m == Some(1), a.expect("address"), l.expect("length"))
}

fn start_unmapper(prog: &Path, dir: tempfile::TempDir) -> (Server, std::path::PathBuf) {
    let ready = dir.path().join("ready");
    let state = dir.path().join("state");
    let mut cmd = Command::new(prog);
    cmd.arg(&ready).arg(&state);
    let server = start_with_agent("unmapper", cmd, dir, &[], |_, child| {
        support::port_from_ready_file(&ready, child)
    });
    (server, state)
}

/// Fail with how the server ended and the logs, if it is no longer running (after an error
/// reply, which a dying agent gives, wait a bounded time for the process to end first).
fn assert_alive<T>(server: &mut Server, what: &str, reply: &Result<T, String>) {
    if reply.is_err() {
        wait_until(Duration::from_secs(5), || {
            !matches!(server.child.try_wait(), Ok(None))
        });
    }
    if let Ok(Some(st)) = server.child.try_wait() {
        use std::os::unix::process::ExitStatusExt;
        panic!(
            "the server died during {what}: {st:?} (signal {:?}; SIGSEGV is {})\n{}",
            st.signal(),
            libc::SIGSEGV,
            server.log_tail()
        );
    }
}

/// One request on a fresh connection of our own: the server still answers.
fn request(port: u16) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connecting to the server");
    s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    s.write_all(b"x\n").unwrap();
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line).unwrap();
    line
}

#[test]
fn probing_a_server_that_unmaps_memory_never_kills_it() {
    let dir = tempfile::tempdir().unwrap();
    let Some(prog) = compile_c("probe/unmapper", dir.path()) else {
        return;
    };
    let (mut server, state) = start_unmapper(&prog, tempfile::tempdir().unwrap());
    let port = server.port;
    let mut agent = server.agent();

    // ProbeCycle: the agent sends the request itself, between its flush and its reload.
    let (mut probed, mut skipped, mut gone_before) = (0u64, 0u64, 0u64);
    for i in 0..ROUNDS {
        let (mapped, start, len) = region(&state);
        if !mapped {
            gone_before += 1;
        }
        let reply = agent.try_call(&Request::ProbeCycle {
            ranges: vec![Range { start, len }],
            threshold: 200,
            window_pages: 16,
            seed: i,
            port,
            request: Some("x\n".into()),
            until: "\n".into(),
            idle_ns: 0,
            stride: 2,
            phase: (i % 2) as u32,
        });
        assert_alive(&mut server, &format!("probe cycle {i}"), &reply);
        match reply {
            Ok(Reply::Probed { .. }) => probed += 1,
            Ok(Reply::Error { message }) if message.contains("round skipped") => skipped += 1,
            other => panic!("probe cycle {i}: {other:?}\n{}", server.log_tail()),
        }
    }
    eprintln!("probe cycles: {probed} probed, {skipped} skipped ({gone_before} started unmapped)");
    // Every round that found the region mapped saw the request unmap it (the first request on
    // the agent's new connection toggles the region too, so count from what the cycle saw).
    assert!(
        skipped > 0 && probed > 0,
        "{probed} cycles probed, {skipped} skipped ({gone_before} started unmapped): the \
         server should have unmapped the region under about half of them"
    );

    // ProbeFlush, a request of our own, ProbeReload: the reload looks at the mappings after
    // the request, so it probes what is left (possibly nothing) and never faults.
    for i in 0..ROUNDS {
        let (_, start, len) = region(&state);
        let ranges = vec![Range { start, len }];
        let r = agent.try_call(&Request::ProbeFlush {
            ranges: ranges.clone(),
        });
        assert_alive(&mut server, &format!("probe flush {i}"), &r);
        assert!(matches!(r, Ok(Reply::Ok)), "probe flush {i}: {r:?}");
        assert!(request(port).starts_with("ok "));
        let r = agent.try_call(&Request::ProbeReload {
            ranges,
            threshold: 200,
            window_pages: 16,
            seed: i,
        });
        assert_alive(&mut server, &format!("probe reload {i}"), &r);
        assert!(
            matches!(r, Ok(Reply::Probed { .. })),
            "probe reload {i}: {r:?}"
        );
    }

    // Still serving, the agent still enabled, and it said why it skipped rounds.
    assert!(request(port).starts_with("ok "));
    let st = agent.status();
    assert!(st.enabled, "{st:?}");
    let log =
        std::fs::read_to_string(preheat_agent::socket_paths(&server.run_dir, server.pid()).log)
            .unwrap_or_default();
    assert!(
        log.contains("round skipped"),
        "the agent's log does not say it skipped rounds:\n{log}"
    );
}
