//! What the observer tests share: real servers started on free ports, one request, the root
//! check.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

pub const N: usize = 40;

pub struct Server(pub Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn servers_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/servers")
}

/// Start `make() PORT` on a free port and wait until it accepts connections; a start that
/// exits first (the port taken meanwhile by a parallel test) is retried on another port. Root
/// only (it reads the child's fds), as every test here.
pub fn start(make: impl Fn() -> Command) -> (Server, u16) {
    for _ in 0..3 {
        let port = preheat_testsupport::free_port();
        let mut s = Server(
            make()
                .arg(port.to_string())
                .spawn()
                .expect("starting the test server"),
        );
        let t0 = Instant::now();
        loop {
            if s.0.try_wait().unwrap().is_some() {
                break;
            }
            // Ours listens (not a parallel test's server that took the port first).
            let ours = preheat_observe::sockets::snapshot(Path::new("/proc"), s.0.id(), port)
                .is_ok_and(|f| !f.listening.is_empty());
            if ours && TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return (s, port);
            }
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "server did not listen"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    panic!("the test server exited at start three times");
}

pub fn request(c: &mut TcpStream) {
    c.write_all(b"ping\n").unwrap();
    let mut b = [0u8; 5];
    c.read_exact(&mut b).expect("reading the reply");
    assert_eq!(&b, b"pong\n");
}

pub fn permitted() -> bool {
    // The effective uid of this process, from /proc.
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let euid = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap_or("1");
    if euid != "0" {
        preheat_testsupport::skip(
            "root",
            "observing from outside needs root (eBPF programs on kernel tracepoints)",
        );
        return false;
    }
    true
}

/// The Python selectors event-loop server (`tests/servers/event_loop.py`), started.
pub fn event_loop_server() -> (Server, u16) {
    start(|| {
        let mut cmd = Command::new("python3");
        cmd.arg(servers_dir().join("event_loop.py"));
        cmd
    })
}
