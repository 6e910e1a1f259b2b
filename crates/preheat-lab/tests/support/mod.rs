//! Support of the load-engine tests: a real loopback TCP server started in the test (with
//! switches for stalls, dropped connections and wrong replies), in-test drivers of a line
//! protocol (the client sends `get\n`, the server answers `VALUE\n`) with and without the
//! multiplexed path, a fake announcer, and helpers to run a load and read its records.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use preheat_lab::driver::{Driver, Outcome, Protocol, Wait};
use preheat_lab::load::{run, Announce, CsvSink, Grant, LoadConfig, LoadSummary, Mode, RecordSink};

// ---------------------------------------------------------------------------------------------
// The test server.

#[derive(Default)]
pub struct Ctl {
    /// Requests answered (warm-up included).
    pub served: AtomicU64,
    pub accepted: AtomicU64,
    /// Stall this many ms before answering request number `stall_at` (1-based), once.
    pub stall_at: AtomicU64,
    pub stall_ms: AtomicU64,
    /// Close the connection instead of answering request number `drop_at`, once.
    pub drop_at: AtomicU64,
    /// Close every connection instead of answering.
    pub drop_all: AtomicBool,
    /// Answer this instead of VALUE for every request.
    pub wrong: AtomicBool,
    /// Sleep this many µs before every answer.
    pub delay_us: AtomicU64,
    pub stop: AtomicBool,
}

pub struct TestServer {
    pub addr: SocketAddr,
    pub ctl: Arc<Ctl>,
    acceptor: Option<std::thread::JoinHandle<()>>,
}

impl TestServer {
    pub fn start() -> TestServer {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let ctl = Arc::new(Ctl::default());
        let c = ctl.clone();
        let acceptor = std::thread::spawn(move || {
            for s in listener.incoming() {
                if c.stop.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(s) = s else { continue };
                c.accepted.fetch_add(1, Ordering::SeqCst);
                let c = c.clone();
                std::thread::spawn(move || serve(s, &c));
            }
        });
        TestServer {
            addr,
            ctl,
            acceptor: Some(acceptor),
        }
    }

    /// Stop listening (new connections are refused); open connections are closed at their
    /// next request.
    pub fn shut_down(&mut self) {
        self.ctl.drop_all.store(true, Ordering::SeqCst);
        self.ctl.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.addr);
        if let Some(h) = self.acceptor.take() {
            let _ = h.join();
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.shut_down();
    }
}

fn serve(s: TcpStream, c: &Ctl) {
    let _ = s.set_nodelay(true);
    let mut w = s.try_clone().unwrap();
    let mut r = BufReader::new(s);
    let mut line = String::new();
    loop {
        line.clear();
        match r.read_line(&mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        if c.drop_all.load(Ordering::SeqCst) {
            return;
        }
        let n = c.served.fetch_add(1, Ordering::SeqCst) + 1;
        if n == c.drop_at.load(Ordering::SeqCst) {
            return;
        }
        let delay = c.delay_us.load(Ordering::SeqCst);
        if delay > 0 {
            std::thread::sleep(Duration::from_micros(delay));
        }
        if n == c.stall_at.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(c.stall_ms.load(Ordering::SeqCst)));
        }
        let reply: &[u8] = if c.wrong.load(Ordering::SeqCst) {
            b"NOPE\n"
        } else {
            b"VALUE\n"
        };
        if w.write_all(reply).is_err() {
            return;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The in-test driver.

pub struct LineDriver {
    w: TcpStream,
    r: BufReader<TcpStream>,
    line: String,
}

impl Driver for LineDriver {
    fn request(&mut self) -> Result<Outcome> {
        self.w.write_all(b"get\n")?;
        self.line.clear();
        if self.r.read_line(&mut self.line)? == 0 {
            bail!("server closed the connection");
        }
        Ok(Outcome {
            kind: "get",
            ok: self.line == "VALUE\n",
        })
    }
    fn protocol(&self) -> Protocol {
        Protocol::Memcached
    }
}

pub fn connector(addr: SocketAddr) -> impl Fn() -> Result<Box<dyn Driver>> + Sync {
    move || {
        let s = TcpStream::connect(addr)?;
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        Ok(Box::new(LineDriver {
            w: s.try_clone()?,
            r: BufReader::new(s),
            line: String::new(),
        }) as Box<dyn Driver>)
    }
}

/// The in-test driver with the multiplexed path: one non-blocking socket, replies read into a
/// buffer up to the `\n`.
pub struct MuxLineDriver {
    s: TcpStream,
    buf: Vec<u8>,
    /// Calls of `request` (the synchronous path) and of `poll_reply`, over all connections.
    counts: Arc<Counts>,
}

#[derive(Default)]
pub struct Counts {
    pub requests: AtomicU64,
    pub polls: AtomicU64,
}

impl MuxLineDriver {
    /// Read what is there; `Some` once a whole line arrived.
    fn try_line(&mut self) -> Result<Option<Outcome>> {
        let mut chunk = [0u8; 256];
        loop {
            if let Some(i) = self.buf.iter().position(|&b| b == b'\n') {
                let ok = &self.buf[..=i] == b"VALUE\n";
                self.buf.drain(..=i);
                return Ok(Some(Outcome { kind: "get", ok }));
            }
            match self.s.read(&mut chunk) {
                Ok(0) => bail!("server closed the connection"),
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(None),
                Err(e) => return Err(e.into()),
            }
        }
    }
}

impl Driver for MuxLineDriver {
    fn request(&mut self) -> Result<Outcome> {
        self.counts.requests.fetch_add(1, Ordering::SeqCst);
        self.send_request()?;
        let t0 = Instant::now();
        loop {
            if let Some(o) = self.try_line()? {
                return Ok(o);
            }
            if t0.elapsed() > Duration::from_secs(10) {
                bail!("no reply");
            }
            std::thread::yield_now();
        }
    }
    fn protocol(&self) -> Protocol {
        Protocol::Memcached
    }
    fn send_request(&mut self) -> Result<()> {
        self.s.write_all(b"get\n")?;
        Ok(())
    }
    fn poll_reply(&mut self) -> Result<Option<Outcome>> {
        self.counts.polls.fetch_add(1, Ordering::SeqCst);
        self.try_line()
    }
    fn raw_fd(&self) -> Option<std::os::fd::RawFd> {
        use std::os::fd::AsRawFd;
        Some(self.s.as_raw_fd())
    }
}

pub fn mux_connector(addr: SocketAddr) -> impl Fn() -> Result<Box<dyn Driver>> + Sync {
    counting_mux_connector(addr, Arc::default())
}

pub fn counting_mux_connector(
    addr: SocketAddr,
    counts: Arc<Counts>,
) -> impl Fn() -> Result<Box<dyn Driver>> + Sync {
    move || {
        let s = TcpStream::connect(addr)?;
        s.set_nodelay(true)?;
        s.set_nonblocking(true)?;
        Ok(Box::new(MuxLineDriver {
            s,
            buf: Vec::new(),
            counts: counts.clone(),
        }) as Box<dyn Driver>)
    }
}

pub fn cfg(mode: Mode) -> LoadConfig {
    LoadConfig {
        mode,
        requests: Some(100),
        duration: None,
        rate: 1000.0,
        gap: Duration::from_millis(1),
        connections: 1,
        threads: 0,
        wait: Wait::Block,
        warmup: 1,
        seed: 7,
        strategy: "none".into(),
    }
}

pub fn quiet(_: u64) {}

pub fn run_plain(
    c: &LoadConfig,
    addr: SocketAddr,
    sink: Option<Box<dyn RecordSink>>,
) -> LoadSummary {
    let stop = AtomicBool::new(false);
    run(c, &connector(addr), None, sink, &stop, &quiet).unwrap()
}

/// A per-request records CSV in a temporary directory (removed on drop).
pub struct Records {
    _dir: tempfile::TempDir,
    pub path: std::path::PathBuf,
}

impl Records {
    pub fn new() -> Records {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("records.csv");
        Records { _dir: dir, path }
    }

    /// A fresh [`CsvSink`] writing to the file.
    pub fn sink(&self) -> Option<Box<dyn RecordSink>> {
        Some(Box::new(CsvSink::create(&self.path).unwrap()))
    }

    /// The rows written: (header, rows as column vectors).
    pub fn read(&self) -> (String, Vec<Vec<String>>) {
        let text = std::fs::read_to_string(&self.path).unwrap();
        let mut lines = text.lines();
        let header = lines.next().unwrap_or_default().to_string();
        let rows = lines
            .map(|l| l.split(',').map(str::to_string).collect())
            .collect();
        (header, rows)
    }
}

pub fn col(header: &str, name: &str) -> usize {
    header.split(',').position(|c| c == name).unwrap()
}

/// Record `r`'s column `name` as an integer.
pub fn num(h: &str, r: &[String], name: &str) -> u64 {
    r[col(h, name)].parse().unwrap()
}

/// Record `r`'s column `name` as a number.
pub fn numf(h: &str, r: &[String], name: &str) -> f64 {
    r[col(h, name)].parse().unwrap()
}

/// The records of the requests queued behind a server stall: latency (from the intended time)
/// of 20 ms or more. Checks that there are at least 10 and that at least 10 of them really went
/// out 10 ms or more after their intended time (`what` names the run in the messages).
pub fn queued_behind_stall<'a>(
    h: &str,
    rows: &'a [Vec<String>],
    what: &str,
) -> Vec<&'a Vec<String>> {
    let queued: Vec<&Vec<String>> = rows
        .iter()
        .filter(|r| numf(h, r, "latency_us") >= 20_000.0)
        .collect();
    assert!(
        queued.len() >= 10,
        "{what}: only {} requests with latency ≥ 20 ms: the stall was not charged to the \
         requests behind it",
        queued.len()
    );
    let late = queued
        .iter()
        .filter(|r| numf(h, r, "sent_ns") - numf(h, r, "intended_ns") >= 10e6)
        .count();
    assert!(
        late >= 10,
        "{what}: only {late} of the queued requests went out ≥ 10 ms after their intended time"
    );
    queued
}

/// The records' sequence numbers are 0..n, each once.
pub fn assert_seqs(h: &str, rows: &[Vec<String>], n: u64) {
    let mut seqs: Vec<u64> = rows.iter().map(|r| num(h, r, "seq")).collect();
    seqs.sort_unstable();
    assert_eq!(seqs, (0..n).collect::<Vec<_>>());
}

/// A record went out no earlier than intended, and its reply came after the send.
pub fn assert_times_ordered(h: &str, r: &[String]) {
    let t = |n: &str| num(h, r, n);
    assert!(
        t("intended_ns") <= t("sent_ns") && t("sent_ns") < t("done_ns"),
        "{r:?}"
    );
}

/// The test server answered `served` requests (warm-ups included) on `accepted` connections.
pub fn assert_served(srv: &TestServer, served: u64, accepted: u64) {
    assert_eq!(
        srv.ctl.served.load(Ordering::SeqCst),
        served,
        "requests served"
    );
    assert_eq!(
        srv.ctl.accepted.load(Ordering::SeqCst),
        accepted,
        "connections"
    );
}

pub fn assert_sane(s: &LoadSummary) {
    assert_eq!(s.label, "measured");
    if s.requests > 0 {
        assert!(s.p50_us > 0.0, "{s:?}");
        assert!(s.p50_us <= s.p90_us && s.p90_us <= s.p99_us, "{s:?}");
        assert!(
            s.p99_us <= s.p999_us && s.p999_us <= s.max_us * 1.001,
            "{s:?}"
        );
        assert!(s.mean_us > 0.0 && s.mean_us <= s.max_us * 1.001, "{s:?}");
        assert!(s.duration_s > 0.0 && s.throughput_rps > 0.0, "{s:?}");
    }
}
// ---------------------------------------------------------------------------------------------
// Announcements.

/// Grants `delay` after the earliest time; every other request is unscheduled (sent at once).
pub struct FakeAnnounce {
    delay_ns: u64,
    n: u64,
    calls: Arc<Mutex<Vec<(u64, u64)>>>,
}

impl Announce for FakeAnnounce {
    fn grant(&mut self, earliest_ns: u64) -> Grant {
        self.n += 1;
        let now = preheat_engine::time::now_ns();
        self.calls.lock().unwrap().push((earliest_ns, now));
        if self.n.is_multiple_of(2) {
            Grant {
                send_at_ns: now.max(earliest_ns),
                scheduled: false,
            }
        } else {
            Grant {
                send_at_ns: earliest_ns.max(now) + self.delay_ns,
                scheduled: true,
            }
        }
    }
    fn lead_ns(&self) -> u64 {
        self.delay_ns
    }
}

/// Makes a [`FakeAnnounce`] per connection, all logging into `calls`.
pub fn fake_announcer(
    delay_ns: u64,
    calls: Arc<Mutex<Vec<(u64, u64)>>>,
) -> impl Fn(usize) -> Result<Box<dyn Announce>> + Sync {
    move |_conn| {
        Ok(Box::new(FakeAnnounce {
            delay_ns,
            n: 0,
            calls: calls.clone(),
        }) as Box<dyn Announce>)
    }
}

/// A run that must fail: its error, with the whole chain.
pub fn run_err(
    c: &LoadConfig,
    connect: &(dyn Fn() -> Result<Box<dyn Driver>> + Sync),
    announce: Option<&(dyn Fn(usize) -> Result<Box<dyn Announce>> + Sync)>,
) -> String {
    let stop = AtomicBool::new(false);
    format!(
        "{:#}",
        run(c, connect, announce, None, &stop, &quiet).unwrap_err()
    )
}
