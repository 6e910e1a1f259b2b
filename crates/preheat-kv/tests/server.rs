//! End-to-end tests: start the real `preheat-kv` binary on an OS-chosen port,
//! talk to it over loopback TCP, and stop it with SIGTERM.
//!
//! Every loop is bounded by an iteration count and every socket has a
//! timeout, so a misbehaving server fails the test instead of hanging it.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const BIN: &str = env!("CARGO_BIN_EXE_preheat-kv");
const IO_TIMEOUT: Duration = Duration::from_secs(10);
const MAX_VALUE: usize = 1024 * 1024;

/// The value the server preloads under `key:{index}`.
fn preload_value(index: usize, size: usize) -> Vec<u8> {
    (0..size).map(|j| b'a' + ((index + j) % 26) as u8).collect()
}

struct Server {
    child: Option<Child>,
    port: u16,
    ready: PathBuf,
    _dir: tempfile::TempDir,
}

impl Server {
    fn start(extra: &[&str]) -> Server {
        let dir = tempfile::tempdir().expect("temp dir");
        let ready = dir.path().join("ready");
        let mut child = Command::new(BIN)
            .args(["--port", "0", "--quiet", "--ready-file"])
            .arg(&ready)
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn preheat-kv");
        let deadline = Instant::now() + Duration::from_secs(10);
        let port = loop {
            if let Ok(text) = std::fs::read_to_string(&ready) {
                let port = text
                    .strip_prefix("ready ")
                    .and_then(|rest| rest.strip_suffix('\n'))
                    .and_then(|p| p.parse::<u16>().ok());
                match port {
                    Some(port) if port != 0 => break port,
                    _ => panic!("malformed ready file: {text:?}"),
                }
            }
            if let Some(status) = child.try_wait().unwrap() {
                panic!("preheat-kv exited during startup: {status}");
            }
            assert!(Instant::now() < deadline, "preheat-kv did not become ready");
            thread::sleep(Duration::from_millis(10));
        };
        Server {
            child: Some(child),
            port,
            ready,
            _dir: dir,
        }
    }

    fn connect(&self) -> Client {
        let stream = TcpStream::connect(("127.0.0.1", self.port)).expect("connect");
        stream.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
        stream.set_write_timeout(Some(IO_TIMEOUT)).unwrap();
        stream.set_nodelay(true).unwrap();
        Client {
            reader: BufReader::new(stream.try_clone().unwrap()),
            stream,
        }
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    /// Sends SIGTERM and waits (bounded) for the process to exit.
    fn terminate(&mut self) -> ExitStatus {
        // A pid we spawned and still own (not yet reaped).
        preheat_engine::os::send_signal(self.pid(), libc::SIGTERM, false).unwrap();
        let mut child = self.child.take().unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("preheat-kv did not exit within 5 s of SIGTERM");
            }
            thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

struct Client {
    stream: TcpStream,
    reader: BufReader<TcpStream>,
}

type Value = (String, u32, Vec<u8>);

impl Client {
    fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).expect("write");
    }

    /// One reply line, including its `\r\n`.
    fn line(&mut self) -> String {
        let mut line = Vec::new();
        self.reader.read_until(b'\n', &mut line).expect("read line");
        assert!(line.ends_with(b"\r\n"), "truncated line {line:?}");
        String::from_utf8(line).expect("utf-8 reply line")
    }

    fn exact(&mut self, n: usize) -> Vec<u8> {
        let mut buf = vec![0; n];
        self.reader.read_exact(&mut buf).expect("read data");
        buf
    }

    /// Sends `command` + CRLF and returns the one-line reply.
    fn cmd(&mut self, command: &str) -> String {
        self.send(format!("{command}\r\n").as_bytes());
        self.line()
    }

    fn set(&mut self, key: &str, flags: u32, data: &[u8]) -> String {
        let mut req = format!("set {key} {flags} 0 {}\r\n", data.len()).into_bytes();
        req.extend_from_slice(data);
        req.extend_from_slice(b"\r\n");
        self.send(&req);
        self.line()
    }

    /// Reads the reply to a `get`: VALUE blocks up to END.
    fn values(&mut self) -> Vec<Value> {
        let mut values = Vec::new();
        for _ in 0..10_000 {
            let line = self.line();
            if line == "END\r\n" {
                return values;
            }
            let fields: Vec<&str> = line.trim_end().split(' ').collect();
            assert!(
                fields.len() == 4 && fields[0] == "VALUE",
                "bad get reply line {line:?}"
            );
            let len: usize = fields[3].parse().unwrap();
            let data = self.exact(len + 2);
            assert_eq!(&data[len..], b"\r\n", "value not CRLF-terminated");
            values.push((
                fields[1].to_string(),
                fields[2].parse().unwrap(),
                data[..len].to_vec(),
            ));
        }
        panic!("get reply without END");
    }

    fn get(&mut self, keys: &str) -> Vec<Value> {
        self.send(format!("get {keys}\r\n").as_bytes());
        self.values()
    }

    fn get1(&mut self, key: &str) -> Option<(u32, Vec<u8>)> {
        let mut values = self.get(key);
        assert!(values.len() <= 1);
        values.pop().map(|(k, flags, data)| {
            assert_eq!(k, key);
            (flags, data)
        })
    }

    fn stats(&mut self) -> HashMap<String, String> {
        self.send(b"stats\r\n");
        let mut stats = HashMap::new();
        for _ in 0..1000 {
            let line = self.line();
            if line == "END\r\n" {
                return stats;
            }
            let mut parts = line.trim_end().splitn(3, ' ');
            assert_eq!(parts.next(), Some("STAT"), "{line:?}");
            let name = parts.next().unwrap().to_string();
            stats.insert(name, parts.next().unwrap_or("").to_string());
        }
        panic!("stats without END");
    }

    /// Asserts the server closes this connection (EOF or reset) in time.
    fn expect_closed(&mut self) {
        let mut buf = [0u8; 4096];
        for _ in 0..1000 {
            match self.reader.read(&mut buf) {
                Ok(0) => return,
                Ok(_) => continue,
                Err(e) if e.kind() == ErrorKind::ConnectionReset => return,
                Err(e) => panic!("expected the server to close the connection: {e}"),
            }
        }
        panic!("server kept sending data instead of closing");
    }
}

#[test]
fn basic_commands() {
    let server = Server::start(&["--items", "100", "--value-size", "64"]);
    let mut c = server.connect();

    let version = c.cmd("version");
    assert!(version.starts_with("VERSION preheat-kv "), "{version:?}");
    assert!(version.ends_with("\r\n"));

    // Preloaded data.
    assert_eq!(c.get1("key:0"), Some((0, preload_value(0, 64))));
    assert_eq!(c.get1("key:99"), Some((0, preload_value(99, 64))));
    assert_eq!(c.get1("key:100"), None);

    // Miss, set, hit, delete.
    assert_eq!(c.get1("greeting"), None);
    assert_eq!(c.set("greeting", 42, b"hello world"), "STORED\r\n");
    assert_eq!(c.get1("greeting"), Some((42, b"hello world".to_vec())));
    assert_eq!(c.set("greeting", u32::MAX, b"bye"), "STORED\r\n");
    assert_eq!(c.get1("greeting"), Some((u32::MAX, b"bye".to_vec())));
    assert_eq!(c.cmd("delete greeting"), "DELETED\r\n");
    assert_eq!(c.cmd("delete greeting"), "NOT_FOUND\r\n");
    assert_eq!(c.get1("greeting"), None);

    // Empty and binary values.
    assert_eq!(c.set("empty", 0, b""), "STORED\r\n");
    assert_eq!(c.get1("empty"), Some((0, Vec::new())));
    let binary: Vec<u8> = (0..=255).collect();
    assert_eq!(c.set("bin", 1, &binary), "STORED\r\n");
    assert_eq!(c.get1("bin"), Some((1, binary)));

    // Multi-get keeps request order and skips misses.
    let values = c.get("key:1 nothing key:2 key:1");
    let keys: Vec<&str> = values.iter().map(|v| v.0.as_str()).collect();
    assert_eq!(keys, ["key:1", "key:2", "key:1"]);

    // noreply: no reply line, the next reply is for the next command.
    c.send(b"set quiet 0 0 2 noreply\r\nok\r\ndelete quiet noreply\r\n");
    assert_eq!(c.get1("quiet"), None);

    // Negative exptime stores an already-expired item.
    assert_eq!(c.set("temp", 0, b"x"), "STORED\r\n");
    c.send(b"set temp 0 -1 1\r\ny\r\n");
    assert_eq!(c.line(), "STORED\r\n");
    assert_eq!(c.get1("temp"), None);

    // Errors.
    assert_eq!(c.cmd("bogus"), "ERROR\r\n");
    assert_eq!(c.cmd("get"), "ERROR\r\n");
    assert_eq!(
        c.cmd("set k 0 0 notanumber"),
        "CLIENT_ERROR bad command line format\r\n"
    );
    let long_key = "k".repeat(251);
    assert_eq!(
        c.cmd(&format!("get {long_key}")),
        "CLIENT_ERROR bad command line format\r\n"
    );
    assert_eq!(c.set(&"k".repeat(250), 0, b"v"), "STORED\r\n");

    let stats = c.stats();
    for name in [
        "pid",
        "uptime",
        "curr_items",
        "get_hits",
        "get_misses",
        "cmd_get",
        "cmd_set",
        "curr_connections",
        "total_connections",
        "bytes",
    ] {
        assert!(stats.contains_key(name), "missing stat {name}");
    }
    assert_eq!(stats["pid"], server.pid().to_string());
    assert_eq!(stats["curr_connections"], "1");
    // 100 preloaded + empty + bin + the 250-byte key.
    assert_eq!(stats["curr_items"], "103");
    assert_eq!(stats["cmd_set"], "8");
    assert_eq!(stats["get_hits"], "9");
    assert_eq!(stats["get_misses"], "6");
    assert_eq!(stats["cmd_get"], "15");

    assert_eq!(c.cmd("flush_all"), "OK\r\n");
    assert_eq!(c.get1("key:0"), None);
    assert_eq!(c.stats()["curr_items"], "0");
}

#[test]
fn pipelined_requests_in_one_write() {
    let server = Server::start(&["--items", "10", "--value-size", "8"]);
    let mut c = server.connect();

    let mut request = Vec::new();
    let mut expected = Vec::new();
    for i in 0..200 {
        let key = format!("p{}", i % 7);
        match i % 5 {
            0 | 3 => {
                let value = format!("value-{i}");
                request.extend(format!("set {key} {i} 0 {}\r\n{value}\r\n", value.len()).bytes());
                expected.extend_from_slice(b"STORED\r\n");
            }
            1 => {
                request.extend(format!("get key:{}\r\n", i % 10).bytes());
                expected.extend(format!("VALUE key:{} 0 8\r\n", i % 10).bytes());
                expected.extend(preload_value(i % 10, 8));
                expected.extend_from_slice(b"\r\nEND\r\n");
            }
            2 => {
                request.extend_from_slice(b"get never-set\r\n");
                expected.extend_from_slice(b"END\r\n");
            }
            _ => {
                request.extend_from_slice(b"version\r\n");
                expected.extend(
                    format!("VERSION preheat-kv {}\r\n", env!("CARGO_PKG_VERSION")).bytes(),
                );
            }
        }
    }
    c.send(&request);
    let got = c.exact(expected.len());
    assert_eq!(
        String::from_utf8_lossy(&got),
        String::from_utf8_lossy(&expected)
    );

    // The same kind of stream, dribbled in tiny chunks so requests (and set
    // payloads) straddle reads.
    let mut request = Vec::new();
    let mut expected = Vec::new();
    for i in 0..40 {
        let value = vec![b'0' + (i % 10) as u8; 100 + i];
        request.extend(format!("set d{i} 0 0 {}\r\n", value.len()).bytes());
        request.extend_from_slice(&value);
        request.extend_from_slice(b"\r\nget d");
        request.extend(format!("{i}\r\n").bytes());
        expected.extend_from_slice(b"STORED\r\n");
        expected.extend(format!("VALUE d{i} 0 {}\r\n", value.len()).bytes());
        expected.extend_from_slice(&value);
        expected.extend_from_slice(b"\r\nEND\r\n");
    }
    for (n, chunk) in request.chunks(97).enumerate() {
        c.send(chunk);
        if n % 4 == 0 {
            thread::sleep(Duration::from_millis(2));
        }
    }
    let got = c.exact(expected.len());
    assert_eq!(
        String::from_utf8_lossy(&got),
        String::from_utf8_lossy(&expected)
    );
}

#[test]
fn large_values_and_bad_input() {
    let server = Server::start(&["--items", "0"]);
    let mut c = server.connect();

    // Exactly 1 MiB is accepted and returned intact.
    let big: Vec<u8> = (0..MAX_VALUE).map(|i| (i * 7 % 251) as u8).collect();
    assert_eq!(c.set("big", 3, &big), "STORED\r\n");
    assert_eq!(c.get1("big"), Some((3, big.clone())));

    // One byte more is refused, the payload swallowed, the old value dropped.
    let too_big = vec![b'z'; MAX_VALUE + 1];
    assert_eq!(
        c.set("big", 0, &too_big),
        "SERVER_ERROR object too large for cache\r\n"
    );
    assert_eq!(c.get1("big"), None);

    // A data block not followed by CRLF.
    c.send(b"set k 0 0 3\r\nabcXYget k\r\n");
    assert_eq!(c.line(), "CLIENT_ERROR bad data chunk\r\n");
    assert_eq!(c.values(), Vec::new());

    // The connection is still healthy.
    assert_eq!(c.set("k", 0, b"ok"), "STORED\r\n");
    assert_eq!(c.get1("k"), Some((0, b"ok".to_vec())));

    // A multi-get whose line is longer than 2048 bytes is fine.
    let keys: Vec<String> = (0..400).map(|i| format!("missing-key-{i}")).collect();
    assert!(keys.join(" ").len() > 4096);
    assert_eq!(c.get(&format!("k {}", keys.join(" "))).len(), 1);
}

#[test]
fn garbage_closes_only_that_connection() {
    let server = Server::start(&["--items", "5", "--value-size", "4"]);
    let mut good = server.connect();
    assert_eq!(good.set("x", 0, b"1"), "STORED\r\n");

    // A "command line" with no newline beyond the limit.
    let mut bad = server.connect();
    bad.send(&vec![b'x'; 8192]);
    bad.expect_closed();

    // A set line absurdly long even though it has a newline.
    let mut bad = server.connect();
    let mut line = b"set".to_vec();
    line.resize(5000, b' ');
    line.extend_from_slice(b"k 0 0 1\r\nx\r\n");
    bad.send(&line);
    bad.expect_closed();

    assert_eq!(good.get1("x"), Some((0, b"1".to_vec())));
    assert_eq!(good.get1("key:4"), Some((0, preload_value(4, 4))));
}

#[test]
fn quit_and_half_close_flush_replies_first() {
    let server = Server::start(&["--items", "3", "--value-size", "5"]);

    let mut c = server.connect();
    c.send(b"get key:1\r\nquit\r\n");
    assert_eq!(
        c.values(),
        vec![("key:1".to_string(), 0, preload_value(1, 5))]
    );
    c.expect_closed();

    // A client that shuts down its write side still gets its replies.
    let mut c = server.connect();
    c.send(b"get key:2\r\nset h 0 0 1\r\nz\r\n");
    c.stream.shutdown(Shutdown::Write).unwrap();
    assert_eq!(
        c.values(),
        vec![("key:2".to_string(), 0, preload_value(2, 5))]
    );
    assert_eq!(c.line(), "STORED\r\n");
    c.expect_closed();
}

#[test]
fn slow_reader_gets_every_reply() {
    let server = Server::start(&["--items", "1", "--value-size", "4"]);
    let mut c = server.connect();
    let value: Vec<u8> = (0..256 * 1024).map(|i| (i % 253) as u8).collect();
    assert_eq!(c.set("v", 9, &value), "STORED\r\n");

    // ~25 MiB of replies, more than the socket buffers and the server's
    // high-water mark; the client only starts reading after a pause.
    const GETS: usize = 100;
    c.send("get v\r\n".repeat(GETS).as_bytes());
    thread::sleep(Duration::from_millis(200));
    // Meanwhile another client is served normally.
    let mut other = server.connect();
    assert_eq!(other.get1("key:0"), Some((0, preload_value(0, 4))));
    for i in 0..GETS {
        let values = c.values();
        assert_eq!(values.len(), 1, "reply {i}");
        assert_eq!(values[0].1, 9);
        assert!(values[0].2 == value, "reply {i} corrupted");
    }
    assert_eq!(c.cmd("version").split(' ').next(), Some("VERSION"));
}

#[test]
fn many_concurrent_connections() {
    const CONNS: usize = 50;
    const OPS: usize = 200;
    const PRELOAD: usize = 500;
    let server = Server::start(&["--items", "500", "--value-size", "32"]);

    let workers: Vec<_> = (0..CONNS)
        .map(|t| {
            let client = server.connect();
            thread::spawn(move || {
                let mut c = client;
                let mut model: HashMap<String, (u32, Vec<u8>)> = HashMap::new();
                let mut rng = StdRng::seed_from_u64(t as u64 + 1);
                let mut next = move || rng.gen::<u64>();
                for op in 0..OPS {
                    let r = next();
                    let key = format!("t{t}:{}", r % 8);
                    match (r >> 8) % 6 {
                        0 | 1 => {
                            let len = ((r >> 16) % 3000) as usize;
                            let value: Vec<u8> =
                                (0..len).map(|i| b'!' + ((i + op + t) % 90) as u8).collect();
                            let flags = (r >> 32) as u32;
                            assert_eq!(c.set(&key, flags, &value), "STORED\r\n");
                            model.insert(key, (flags, value));
                        }
                        2 => assert_eq!(c.get1(&key), model.get(&key).cloned(), "get {key}"),
                        3 => {
                            let expected = if model.remove(&key).is_some() {
                                "DELETED\r\n"
                            } else {
                                "NOT_FOUND\r\n"
                            };
                            assert_eq!(c.cmd(&format!("delete {key}")), expected);
                        }
                        4 => {
                            let i = (r >> 16) as usize % PRELOAD;
                            let got = c.get1(&format!("key:{i}"));
                            assert_eq!(got, Some((0, preload_value(i, 32))));
                        }
                        _ => {
                            // Pipelined multi-get over this thread's keys.
                            let keys: Vec<String> = (0..4).map(|k| format!("t{t}:{k}")).collect();
                            let got = c.get(&keys.join(" "));
                            let want: Vec<Value> = keys
                                .iter()
                                .filter_map(|k| {
                                    model.get(k).map(|(f, d)| (k.clone(), *f, d.clone()))
                                })
                                .collect();
                            assert_eq!(got, want);
                        }
                    }
                }
                c
            })
        })
        .collect();
    let clients: Vec<Client> = workers
        .into_iter()
        .map(|w| w.join().expect("worker panicked"))
        .collect();

    let mut c = server.connect();
    let stats = c.stats();
    assert_eq!(stats["curr_connections"], (CONNS + 1).to_string());
    assert_eq!(stats["total_connections"], (CONNS + 1).to_string());
    drop(clients);
    // Closed connections are noticed promptly.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if c.stats()["curr_connections"] == "1" {
            break;
        }
        assert!(Instant::now() < deadline, "connections not reaped");
        thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn sigterm_exits_cleanly() {
    let mut server = Server::start(&[]);
    let mut idle = server.connect();
    let mut busy = server.connect();
    assert_eq!(busy.get1("key:999"), Some((0, preload_value(999, 100))));
    let ready = server.ready.clone();
    assert!(ready.exists());

    let status = server.terminate();
    assert!(status.success(), "exit status {status}");
    assert!(
        !ready.exists(),
        "ready file should be removed on clean exit"
    );
    idle.expect_closed();
    busy.expect_closed();
}
