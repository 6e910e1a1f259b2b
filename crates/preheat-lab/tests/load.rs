//! The load-generation engine against a real loopback TCP server started in the test, through an
//! in-test driver (line protocol: the client sends `get\n`, the server answers `VALUE\n`).
//!
//! No wall-clock performance assertions: only counts, orderings and coarse sanity bounds.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use preheat_lab::driver::{Driver, Outcome, Protocol, Wait};
use preheat_lab::load::{
    poisson_gaps_ns, run, Announce, ClientLoop, CsvSink, Grant, LoadConfig, LoadSummary, Mode,
    RecordSink, CSV_HEADER,
};

// ---------------------------------------------------------------------------------------------
// The test server.

#[derive(Default)]
struct Ctl {
    /// Requests answered (warm-up included).
    served: AtomicU64,
    accepted: AtomicU64,
    /// Stall this many ms before answering request number `stall_at` (1-based), once.
    stall_at: AtomicU64,
    stall_ms: AtomicU64,
    /// Close the connection instead of answering request number `drop_at`, once.
    drop_at: AtomicU64,
    /// Close every connection instead of answering.
    drop_all: AtomicBool,
    /// Answer this instead of VALUE for every request.
    wrong: AtomicBool,
    /// Sleep this many µs before every answer.
    delay_us: AtomicU64,
    stop: AtomicBool,
}

struct TestServer {
    addr: SocketAddr,
    ctl: Arc<Ctl>,
    acceptor: Option<std::thread::JoinHandle<()>>,
}

impl TestServer {
    fn start() -> TestServer {
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
    fn shut_down(&mut self) {
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

struct LineDriver {
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

fn connector(addr: SocketAddr) -> impl Fn() -> Result<Box<dyn Driver>> + Sync {
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
struct MuxLineDriver {
    s: TcpStream,
    buf: Vec<u8>,
    /// Calls of `request` (the synchronous path) and of `poll_reply`, over all connections.
    counts: Arc<Counts>,
}

#[derive(Default)]
struct Counts {
    requests: AtomicU64,
    polls: AtomicU64,
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

fn mux_connector(addr: SocketAddr) -> impl Fn() -> Result<Box<dyn Driver>> + Sync {
    counting_mux_connector(addr, Arc::default())
}

fn counting_mux_connector(
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

fn cfg(mode: Mode) -> LoadConfig {
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

fn quiet(_: u64) {}

fn run_plain(c: &LoadConfig, addr: SocketAddr, sink: Option<Box<dyn RecordSink>>) -> LoadSummary {
    let stop = AtomicBool::new(false);
    run(c, &connector(addr), None, sink, &stop, &quiet).unwrap()
}

/// A per-request records CSV in a temporary directory (removed on drop).
struct Records {
    _dir: tempfile::TempDir,
    path: std::path::PathBuf,
}

impl Records {
    fn new() -> Records {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("records.csv");
        Records { _dir: dir, path }
    }

    /// A fresh [`CsvSink`] writing to the file.
    fn sink(&self) -> Option<Box<dyn RecordSink>> {
        Some(Box::new(CsvSink::create(&self.path).unwrap()))
    }

    /// The rows written: (header, rows as column vectors).
    fn read(&self) -> (String, Vec<Vec<String>>) {
        let text = std::fs::read_to_string(&self.path).unwrap();
        let mut lines = text.lines();
        let header = lines.next().unwrap_or_default().to_string();
        let rows = lines
            .map(|l| l.split(',').map(str::to_string).collect())
            .collect();
        (header, rows)
    }
}

fn col(header: &str, name: &str) -> usize {
    header.split(',').position(|c| c == name).unwrap()
}

fn assert_sane(s: &LoadSummary) {
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
// The arrival process.

#[test]
fn poisson_mean_within_3_percent_and_reproducible() {
    for (rate, seed) in [(1000.0, 1u64), (2000.0, 42), (50.0, 7), (123_456.0, 99)] {
        let gaps = poisson_gaps_ns(rate, seed, 20_000);
        assert_eq!(gaps.len(), 20_000);
        let mean = gaps.iter().sum::<u64>() as f64 / gaps.len() as f64;
        let want = 1e9 / rate;
        assert!(
            (mean - want).abs() / want < 0.03,
            "rate {rate} seed {seed}: mean gap {mean:.0} ns, want {want:.0}"
        );
        // Exponential: the median is ln 2 of the mean, and about 1/e of the gaps exceed it.
        let over = gaps.iter().filter(|g| **g as f64 > want).count() as f64 / 20_000.0;
        assert!(
            (over - (-1f64).exp()).abs() < 0.02,
            "share above the mean {over}"
        );
        assert_eq!(
            gaps,
            poisson_gaps_ns(rate, seed, 20_000),
            "same seed, same schedule"
        );
        assert_ne!(
            gaps,
            poisson_gaps_ns(rate, seed + 1, 20_000),
            "seeds differ"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Coordinated omission.

#[test]
fn open_loop_counts_a_stall_against_every_request_scheduled_during_it() {
    let srv = TestServer::start();
    // Request 1 is the warm-up; stall 100 ms on measured request ~200 (about 0.2 s in).
    srv.ctl.stall_at.store(201, Ordering::SeqCst);
    srv.ctl.stall_ms.store(100, Ordering::SeqCst);
    let csv = Records::new();
    let mut c = cfg(Mode::Open);
    c.requests = Some(600);
    c.rate = 1000.0;
    let s = run_plain(&c, srv.addr, csv.sink());
    assert_sane(&s);
    assert_eq!(s.requests, 600);
    assert_eq!(s.errors, 0);
    let (h, rows) = csv.read();
    assert_eq!(rows.len(), 600);
    let (lat, sent, intended) = (
        col(&h, "latency_us"),
        col(&h, "sent_ns"),
        col(&h, "intended_ns"),
    );
    let f = |r: &Vec<String>, i: usize| r[i].parse::<f64>().unwrap();
    // The requests that should have gone out during the stall waited for it: their latency
    // (from the intended time) includes the queueing, and they really went out late.
    let queued: Vec<&Vec<String>> = rows.iter().filter(|r| f(r, lat) >= 20_000.0).collect();
    assert!(
        queued.len() >= 10,
        "only {} requests with latency ≥ 20 ms: the stall was not charged to the requests behind it",
        queued.len()
    );
    let late = queued
        .iter()
        .filter(|r| f(r, sent) - f(r, intended) >= 10e6)
        .count();
    assert!(
        late >= 10,
        "only {late} of the queued requests went out ≥ 10 ms after their intended time"
    );
    assert!(s.max_us >= 90_000.0, "the stalled request itself: {s:?}");
    assert!(s.send_late_us_p99 >= 10_000.0, "{s:?}");
    // The intended times are the Poisson schedule, not "when the connection was free": they
    // strictly increase and are spread over the ~0.6 s the offered load takes.
    let times: Vec<f64> = rows.iter().map(|r| f(r, intended)).collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]));
    let span_s = (times[times.len() - 1] - times[0]) / 1e9;
    assert!(
        (0.3..3.0).contains(&span_s),
        "intended times span {span_s} s"
    );
}

// ---------------------------------------------------------------------------------------------
// Records.

#[test]
fn records_csv_has_a_header_and_one_row_per_request() {
    let srv = TestServer::start();
    let csv = Records::new();
    let mut c = cfg(Mode::Open);
    c.requests = Some(300);
    c.rate = 2000.0;
    c.connections = 2;
    c.strategy = "wake+lines".into();
    let s = run_plain(&c, srv.addr, csv.sink());
    assert_sane(&s);
    assert_eq!(s.requests, 300);
    assert_eq!(s.offered_rps, 2000.0);
    let (h, rows) = csv.read();
    assert_eq!(h, CSV_HEADER);
    assert_eq!(rows.len(), 300);
    let ncol = h.split(',').count();
    assert!(rows.iter().all(|r| r.len() == ncol));
    let mut seqs: Vec<u64> = rows
        .iter()
        .map(|r| r[col(&h, "seq")].parse().unwrap())
        .collect();
    seqs.sort_unstable();
    assert_eq!(seqs, (0..300).collect::<Vec<_>>());
    for r in &rows {
        assert_eq!(r[col(&h, "mode")], "open");
        assert_eq!(r[col(&h, "kind")], "get");
        assert_eq!(r[col(&h, "ok")], "true");
        assert_eq!(r[col(&h, "strategy")], "wake+lines");
        let t = |n: &str| r[col(&h, n)].parse::<u64>().unwrap();
        assert!(t("intended_ns") <= t("sent_ns") && t("sent_ns") < t("done_ns"));
        assert_eq!(t("granted_ns"), t("intended_ns"));
    }
    let conns: std::collections::BTreeSet<&str> =
        rows.iter().map(|r| r[col(&h, "conn")].as_str()).collect();
    assert_eq!(conns.len(), 2, "both connections measured");
    // 2 connections × 1 warm-up + 300 measured.
    assert_eq!(srv.ctl.served.load(Ordering::SeqCst), 302);
    assert_eq!(srv.ctl.accepted.load(Ordering::SeqCst), 2);
}

#[test]
fn stop_ends_a_long_run_quickly_and_keeps_what_was_measured() {
    let srv = TestServer::start();
    let csv = Records::new();
    let mut c = cfg(Mode::Open);
    c.requests = None;
    c.duration = Some(Duration::from_secs(600));
    c.rate = 500.0;
    c.connections = 2;
    let stop = AtomicBool::new(false);
    let progress_calls = AtomicU64::new(0);
    let last_progress = AtomicU64::new(0);
    let progress = |n: u64| {
        progress_calls.fetch_add(1, Ordering::SeqCst);
        last_progress.store(n, Ordering::SeqCst);
    };
    let t0 = Instant::now();
    let s = std::thread::scope(|sc| {
        sc.spawn(|| {
            std::thread::sleep(Duration::from_millis(500));
            stop.store(true, Ordering::SeqCst);
        });
        run(&c, &connector(srv.addr), None, csv.sink(), &stop, &progress).unwrap()
    });
    assert!(
        t0.elapsed() < Duration::from_secs(10),
        "took {:?}",
        t0.elapsed()
    );
    assert_sane(&s);
    assert!(s.requests > 0, "{s:?}");
    let (_, rows) = csv.read();
    assert_eq!(rows.len() as u64, s.requests);
    assert!(progress_calls.load(Ordering::SeqCst) >= 2);
    assert_eq!(last_progress.load(Ordering::SeqCst), s.requests);

    // Idle-gap mode with a long gap stops as quickly.
    let mut c = cfg(Mode::IdleGap);
    c.gap = Duration::from_secs(60);
    stop.store(false, Ordering::SeqCst);
    let t0 = Instant::now();
    let s = std::thread::scope(|sc| {
        sc.spawn(|| {
            std::thread::sleep(Duration::from_millis(200));
            stop.store(true, Ordering::SeqCst);
        });
        run(&c, &connector(srv.addr), None, None, &stop, &quiet).unwrap()
    });
    assert!(
        t0.elapsed() < Duration::from_secs(10),
        "took {:?}",
        t0.elapsed()
    );
    assert_eq!(s.requests, 0);
}

// ---------------------------------------------------------------------------------------------
// Failures.

#[test]
fn reconnects_after_the_server_drops_a_connection() {
    let srv = TestServer::start();
    // Request 1 is the warm-up; the server closes the connection instead of answering no. 6.
    srv.ctl.drop_at.store(6, Ordering::SeqCst);
    let mut c = cfg(Mode::Closed);
    c.requests = Some(20);
    let s = run_plain(&c, srv.addr, None);
    assert_sane(&s);
    assert_eq!(
        s.requests, 20,
        "the failed request is not measured, a new one is"
    );
    assert_eq!(s.errors, 1);
    assert_eq!(s.wrong, 0);
    assert_eq!(srv.ctl.accepted.load(Ordering::SeqCst), 2, "one reconnect");
}

#[test]
fn wrong_replies_are_counted_apart_from_errors() {
    let srv = TestServer::start();
    srv.ctl.wrong.store(true, Ordering::SeqCst);
    let mut c = cfg(Mode::Closed);
    c.requests = Some(10);
    let s = run_plain(&c, srv.addr, None);
    assert_eq!((s.requests, s.wrong, s.errors), (10, 10, 0));
}

#[test]
fn gives_up_with_a_clear_error_when_the_server_is_gone() {
    let mut srv = TestServer::start();
    let addr = srv.addr;
    let mut c = cfg(Mode::Closed);
    c.requests = None;
    c.duration = Some(Duration::from_secs(60));
    let stop = AtomicBool::new(false);
    let t0 = Instant::now();
    let r = std::thread::scope(|sc| {
        let h = sc.spawn(|| run(&c, &connector(addr), None, None, &stop, &quiet));
        std::thread::sleep(Duration::from_millis(200));
        srv.shut_down();
        h.join().unwrap()
    });
    let e = format!(
        "{:#}",
        r.expect_err("the run must fail once the server is gone")
    );
    assert!(e.contains("reconnect"), "{e}");
    assert!(t0.elapsed() < Duration::from_secs(10));

    // Nothing listening at all: a clear error at once.
    let e = run(
        &cfg(Mode::Closed),
        &connector(addr),
        None,
        None,
        &stop,
        &quiet,
    )
    .expect_err("no server");
    assert!(format!("{e:#}").contains("connection 0"), "{e:#}");
}

#[test]
fn a_server_that_drops_every_request_is_given_up_on() {
    let srv = TestServer::start();
    let stop = AtomicBool::new(false);
    let mut c = cfg(Mode::Closed);
    c.warmup = 0;
    srv.ctl.drop_all.store(true, Ordering::SeqCst);
    let e = run(&c, &connector(srv.addr), None, None, &stop, &quiet).expect_err("must give up");
    assert!(format!("{e:#}").contains("in a row"), "{e:#}");
}

// ---------------------------------------------------------------------------------------------
// Modes.

#[test]
fn closed_loop_with_two_connections_completes_n_requests() {
    let srv = TestServer::start();
    let mut c = cfg(Mode::Closed);
    c.requests = Some(500);
    c.connections = 2;
    c.warmup = 3;
    let progress_max = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let s = run(&c, &connector(srv.addr), None, None, &stop, &|n| {
        progress_max.fetch_max(n, Ordering::SeqCst);
    })
    .unwrap();
    assert_sane(&s);
    assert_eq!(s.requests, 500);
    assert_eq!(s.connections, 2);
    assert_eq!(s.offered_rps, 0.0);
    assert_eq!(
        srv.ctl.served.load(Ordering::SeqCst),
        506,
        "3 warm-ups per connection"
    );
    assert_eq!(progress_max.load(Ordering::SeqCst), 500);
}

#[test]
fn duration_bounds_a_closed_loop() {
    let srv = TestServer::start();
    let mut c = cfg(Mode::Closed);
    c.requests = None;
    c.duration = Some(Duration::from_millis(300));
    let t0 = Instant::now();
    let s = run_plain(&c, srv.addr, None);
    assert!(t0.elapsed() < Duration::from_secs(10));
    assert!(s.requests > 0);
    assert!(s.duration_s > 0.2 && s.duration_s < 5.0, "{s:?}");
}

#[test]
fn idle_gap_sleeps_before_each_request() {
    let srv = TestServer::start();
    let csv = Records::new();
    let mut c = cfg(Mode::IdleGap);
    c.requests = Some(20);
    c.gap = Duration::from_millis(3);
    let s = run_plain(&c, srv.addr, csv.sink());
    assert_sane(&s);
    assert_eq!(s.requests, 20);
    let (h, rows) = csv.read();
    assert_eq!(rows.len(), 20);
    for r in &rows {
        assert_eq!(r[col(&h, "mode")], "idle-gap");
        let gap: f64 = r[col(&h, "gap_us")].parse().unwrap();
        assert!(gap >= 3000.0, "gap {gap} µs");
    }
}

#[test]
fn config_errors_are_clear() {
    let stop = AtomicBool::new(false);
    let addr: SocketAddr = "127.0.0.1:1".parse().unwrap();
    let mut c = cfg(Mode::Open);
    c.rate = 0.0;
    let e = run(&c, &connector(addr), None, None, &stop, &quiet).unwrap_err();
    assert!(format!("{e}").contains("rate"), "{e}");
    let mut c = cfg(Mode::Closed);
    c.requests = None;
    let e = run(&c, &connector(addr), None, None, &stop, &quiet).unwrap_err();
    assert!(format!("{e}").contains("duration"), "{e}");
}

// ---------------------------------------------------------------------------------------------
// Announcements.

/// Grants `delay` after the earliest time; every other request is unscheduled (sent at once).
struct FakeAnnounce {
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
fn fake_announcer(
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
fn run_err(
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

fn announced(mode: Mode, srv: &TestServer) -> (LoadSummary, String, Vec<Vec<String>>) {
    let csv = Records::new();
    let mut c = cfg(mode);
    c.requests = Some(40);
    c.rate = 500.0;
    let calls = Arc::new(Mutex::new(Vec::new()));
    let mk = fake_announcer(2_000_000, calls.clone());
    let stop = AtomicBool::new(false);
    let s = run(
        &c,
        &connector(srv.addr),
        Some(&mk),
        csv.sink(),
        &stop,
        &quiet,
    )
    .unwrap();
    assert_eq!(
        calls.lock().unwrap().len(),
        40,
        "one grant per measured request"
    );
    let (h, rows) = csv.read();
    (s, h, rows)
}

#[test]
fn announced_requests_idle_gap_measures_from_the_granted_time() {
    let srv = TestServer::start();
    let (s, h, rows) = announced(Mode::IdleGap, &srv);
    assert_eq!((s.requests, s.scheduled, s.unscheduled), (40, 20, 20));
    for r in &rows {
        let t = |n: &str| r[col(&h, n)].parse::<u64>().unwrap();
        assert_eq!(
            t("intended_ns"),
            t("granted_ns"),
            "announced: meant to arrive then"
        );
        assert!(t("sent_ns") >= t("granted_ns"));
    }
    // Measured from the granted time: the 2 ms wait for it is not latency.
    for r in &rows {
        let t = |n: &str| r[col(&h, n)].parse::<f64>().unwrap();
        let want = (t("done_ns") - t("granted_ns")) / 1e3;
        assert!((t("latency_us") - want).abs() < 0.01, "{r:?}");
    }
}

#[test]
fn announced_requests_open_loop_measures_from_the_poisson_time() {
    let srv = TestServer::start();
    let (s, h, rows) = announced(Mode::Open, &srv);
    assert_eq!((s.scheduled, s.unscheduled), (20, 20));
    for r in &rows {
        let t = |n: &str| r[col(&h, n)].parse::<u64>().unwrap();
        let scheduled = r[col(&h, "scheduled")] == "true";
        assert!(t("sent_ns") >= t("granted_ns"));
        if scheduled {
            // The grant came `lead` early, and the granted time is ≥ 2 ms after the
            // intended time: that wait counts.
            assert!(t("granted_ns") >= t("intended_ns") + 2_000_000);
            let lat: f64 = r[col(&h, "latency_us")].parse().unwrap();
            assert!(lat >= 2000.0, "{lat}");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Multiplexed client threads (threads < connections).

fn run_mux(
    c: &LoadConfig,
    addr: SocketAddr,
    sink: Option<Box<dyn RecordSink>>,
) -> Result<LoadSummary> {
    let stop = AtomicBool::new(false);
    run(c, &mux_connector(addr), None, sink, &stop, &quiet)
}

fn conn_ids(h: &str, rows: &[Vec<String>]) -> std::collections::BTreeSet<String> {
    rows.iter().map(|r| r[col(h, "conn")].clone()).collect()
}

#[test]
fn multiplexed_closed_loop_four_connections_on_one_thread() {
    for wait in [Wait::Block, Wait::Spin] {
        let srv = TestServer::start();
        let csv = Records::new();
        let mut c = cfg(Mode::Closed);
        c.requests = Some(2000);
        c.connections = 4;
        c.threads = 1;
        c.wait = wait;
        c.warmup = 2;
        let s = run_mux(&c, srv.addr, csv.sink()).unwrap();
        assert_sane(&s);
        assert_eq!(
            (s.requests, s.errors, s.wrong),
            (2000, 0, 0),
            "{wait:?}: {s:?}"
        );
        assert_eq!((s.connections, s.threads), (4, 1));
        let (h, rows) = csv.read();
        assert_eq!(rows.len(), 2000);
        assert_eq!(
            conn_ids(&h, &rows).len(),
            4,
            "{wait:?}: every connection measured"
        );
        let mut seqs: Vec<u64> = rows
            .iter()
            .map(|r| r[col(&h, "seq")].parse().unwrap())
            .collect();
        seqs.sort_unstable();
        assert_eq!(seqs, (0..2000).collect::<Vec<_>>());
        for r in &rows {
            let t = |n: &str| r[col(&h, n)].parse::<u64>().unwrap();
            assert!(t("intended_ns") <= t("sent_ns") && t("sent_ns") < t("done_ns"));
        }
        assert_eq!(srv.ctl.served.load(Ordering::SeqCst), 2000 + 4 * 2);
        assert_eq!(srv.ctl.accepted.load(Ordering::SeqCst), 4);
    }
}

#[test]
fn multiplexed_threads_split_connections_and_a_duration_bounds_the_run() {
    let srv = TestServer::start();
    let csv = Records::new();
    let mut c = cfg(Mode::Closed);
    c.requests = None;
    c.duration = Some(Duration::from_millis(300));
    c.connections = 5;
    c.threads = 2;
    let t0 = Instant::now();
    let s = run_mux(&c, srv.addr, csv.sink()).unwrap();
    assert!(t0.elapsed() < Duration::from_secs(10));
    assert_sane(&s);
    assert!(s.requests > 0 && s.errors == 0, "{s:?}");
    assert_eq!(s.threads, 2);
    assert!(s.duration_s > 0.2 && s.duration_s < 5.0, "{s:?}");
    let (h, rows) = csv.read();
    assert_eq!(rows.len() as u64, s.requests);
    assert_eq!(conn_ids(&h, &rows).len(), 5);
}

#[test]
fn multiplexed_reconnects_after_the_server_drops_a_connection() {
    let srv = TestServer::start();
    // 4 warm-ups, then the server closes a connection instead of answering request 10.
    srv.ctl.drop_at.store(10, Ordering::SeqCst);
    let mut c = cfg(Mode::Closed);
    c.requests = Some(200);
    c.connections = 4;
    c.threads = 1;
    let s = run_mux(&c, srv.addr, None).unwrap();
    assert_sane(&s);
    assert_eq!((s.requests, s.errors, s.wrong), (200, 1, 0), "{s:?}");
    assert_eq!(srv.ctl.accepted.load(Ordering::SeqCst), 5, "one reconnect");
}

#[test]
fn multiplexed_open_loop_counts_a_stall_and_does_not_stall_the_other_connection() {
    for wait in [Wait::Block, Wait::Spin] {
        let srv = TestServer::start();
        // 2 warm-ups; stall 100 ms on measured request ~200 (about 0.2 s in).
        srv.ctl.stall_at.store(202, Ordering::SeqCst);
        srv.ctl.stall_ms.store(100, Ordering::SeqCst);
        let csv = Records::new();
        let mut c = cfg(Mode::Open);
        c.requests = Some(600);
        c.rate = 1000.0;
        c.connections = 2;
        c.threads = 1;
        c.wait = wait;
        let s = run_mux(&c, srv.addr, csv.sink()).unwrap();
        assert_sane(&s);
        assert_eq!((s.requests, s.errors), (600, 0), "{s:?}");
        assert_eq!(s.offered_rps, 1000.0);
        let (h, rows) = csv.read();
        assert_eq!(rows.len(), 600);
        let (lat, sent, intended, conn) = (
            col(&h, "latency_us"),
            col(&h, "sent_ns"),
            col(&h, "intended_ns"),
            col(&h, "conn"),
        );
        let f = |r: &Vec<String>, i: usize| r[i].parse::<f64>().unwrap();
        // The stalled connection: the requests scheduled during the stall queued behind it,
        // their latency counts from the intended time, and they went out late.
        let queued: Vec<&Vec<String>> = rows.iter().filter(|r| f(r, lat) >= 20_000.0).collect();
        assert!(
            queued.len() >= 10,
            "{wait:?}: only {} requests with latency ≥ 20 ms",
            queued.len()
        );
        let stalled = &queued[0][conn];
        assert!(
            queued.iter().all(|r| &r[conn] == stalled),
            "{wait:?}: only one connection stalled"
        );
        let late = queued
            .iter()
            .filter(|r| f(r, sent) - f(r, intended) >= 10e6)
            .count();
        assert!(
            late >= 10,
            "{wait:?}: only {late} queued requests went out ≥ 10 ms late"
        );
        assert!(s.max_us >= 90_000.0, "{wait:?}: {s:?}");
        // The other connection on the same thread kept its schedule during the stall.
        let (t_lo, t_hi) = queued.iter().fold((f64::MAX, 0.0f64), |(lo, hi), r| {
            (lo.min(f(r, intended)), hi.max(f(r, intended)))
        });
        let others: Vec<&Vec<String>> = rows
            .iter()
            .filter(|r| &r[conn] != stalled && (t_lo..=t_hi).contains(&f(r, intended)))
            .collect();
        assert!(
            others.len() >= 10,
            "{wait:?}: {} requests on the other connection",
            others.len()
        );
        let slow = others.iter().filter(|r| f(r, lat) >= 20_000.0).count();
        assert_eq!(
            slow, 0,
            "{wait:?}: the other connection waited for the stalled one"
        );
        // Each connection's intended times are its Poisson schedule (increasing).
        for id in conn_ids(&h, &rows) {
            let times: Vec<f64> = rows
                .iter()
                .filter(|r| r[conn] == id)
                .map(|r| f(r, intended))
                .collect();
            assert!(times.windows(2).all(|w| w[0] <= w[1]));
        }
    }
}

#[test]
fn multiplexed_configuration_errors_are_clear() {
    let srv = TestServer::start();
    let stop = AtomicBool::new(false);
    // Idle-gap needs one thread per connection.
    let mut c = cfg(Mode::IdleGap);
    c.connections = 2;
    c.threads = 1;
    let e = run_err(&c, &mux_connector(srv.addr), None);
    assert!(
        e.contains("idle-gap") && e.contains("one thread per connection"),
        "{e}"
    );
    // More threads than connections.
    let mut c = cfg(Mode::Closed);
    c.threads = 3;
    let e = run_err(&c, &mux_connector(srv.addr), None);
    assert!(e.contains("more client threads"), "{e}");
    // Announcements need one thread per connection.
    let mut c = cfg(Mode::Closed);
    c.connections = 2;
    c.threads = 1;
    let mk = fake_announcer(0, Arc::default());
    let e = run_err(&c, &mux_connector(srv.addr), Some(&mk));
    assert!(
        e.contains("announcements need one thread per connection"),
        "{e}"
    );
    // A driver without the multiplexed path (like MySQL's): a clear error, nothing measured.
    let e = run_err(&c, &connector(srv.addr), None);
    assert!(
        e.contains("cannot multiplex") && e.contains("one thread per connection"),
        "{e}"
    );
    // threads == connections is the thread-per-connection engine (the blocking driver works).
    let mut c = cfg(Mode::Closed);
    c.connections = 2;
    c.threads = 2;
    let s = run(&c, &connector(srv.addr), None, None, &stop, &quiet).unwrap();
    assert_eq!((s.requests, s.threads), (100, 2));
}

// ---------------------------------------------------------------------------------------------
// Wait::Epoll: the event loop for any threads <= connections, one connection included.

/// Run `c` with the counting multiplexed driver; the summary and the driver's call counts.
fn run_counted(
    c: &LoadConfig,
    srv: &TestServer,
    csv: Option<&Records>,
) -> (LoadSummary, Arc<Counts>) {
    let counts = Arc::new(Counts::default());
    let stop = AtomicBool::new(false);
    let sink = csv.and_then(Records::sink);
    let s = run(
        c,
        &counting_mux_connector(srv.addr, counts.clone()),
        None,
        sink,
        &stop,
        &quiet,
    )
    .unwrap_or_else(|e| panic!("{:?} {}c/{}t: {e:#}", c.wait, c.connections, c.threads));
    (s, counts)
}

#[test]
fn epoll_one_connection_on_one_thread_runs_the_event_loop() {
    // threads 1 and threads 0 (= one per connection) both mean one thread here.
    for threads in [1, 0] {
        let srv = TestServer::start();
        let csv = Records::new();
        let mut c = cfg(Mode::Closed);
        c.requests = Some(1000);
        c.connections = 1;
        c.threads = threads;
        c.wait = Wait::Epoll;
        c.warmup = 3;
        let (s, counts) = run_counted(&c, &srv, Some(&csv));
        assert_sane(&s);
        assert_eq!((s.requests, s.errors, s.wrong), (1000, 0, 0), "{s:?}");
        assert_eq!((s.connections, s.threads), (1, 1));
        assert_eq!(s.client_loop, ClientLoop::EventLoop, "{s:?}");
        // Only the warm-ups went through the synchronous request(); every measured request
        // was collected by poll_reply.
        assert_eq!(counts.requests.load(Ordering::SeqCst), 3);
        assert!(counts.polls.load(Ordering::SeqCst) >= 1000);
        let (h, rows) = csv.read();
        assert_eq!(rows.len(), 1000);
        for r in &rows {
            let t = |n: &str| r[col(&h, n)].parse::<u64>().unwrap();
            assert!(t("intended_ns") <= t("sent_ns") && t("sent_ns") < t("done_ns"));
            assert_eq!(r[col(&h, "ok")], "true");
        }
        assert_eq!(srv.ctl.served.load(Ordering::SeqCst), 1000 + 3);
        assert_eq!(srv.ctl.accepted.load(Ordering::SeqCst), 1);
    }
}

#[test]
fn epoll_four_connections_on_two_threads() {
    let srv = TestServer::start();
    let csv = Records::new();
    let mut c = cfg(Mode::Closed);
    c.requests = Some(2000);
    c.connections = 4;
    c.threads = 2;
    c.wait = Wait::Epoll;
    c.warmup = 2;
    let (s, counts) = run_counted(&c, &srv, Some(&csv));
    assert_sane(&s);
    assert_eq!((s.requests, s.errors, s.wrong), (2000, 0, 0), "{s:?}");
    assert_eq!((s.connections, s.threads), (4, 2));
    assert_eq!(s.client_loop, ClientLoop::EventLoop);
    assert_eq!(
        counts.requests.load(Ordering::SeqCst),
        4 * 2,
        "warm-ups only"
    );
    let (h, rows) = csv.read();
    assert_eq!(rows.len(), 2000);
    assert_eq!(conn_ids(&h, &rows).len(), 4, "every connection measured");
    let mut seqs: Vec<u64> = rows
        .iter()
        .map(|r| r[col(&h, "seq")].parse().unwrap())
        .collect();
    seqs.sort_unstable();
    assert_eq!(seqs, (0..2000).collect::<Vec<_>>());
    assert_eq!(srv.ctl.served.load(Ordering::SeqCst), 2000 + 4 * 2);
    // Open loop on the same path keeps its schedule.
    let mut c = cfg(Mode::Open);
    c.requests = Some(400);
    c.rate = 4000.0;
    c.connections = 4;
    c.threads = 2;
    c.wait = Wait::Epoll;
    let (s, _) = run_counted(&c, &srv, None);
    assert_sane(&s);
    assert_eq!(
        (s.requests, s.errors, s.client_loop),
        (400, 0, ClientLoop::EventLoop)
    );
    assert_eq!(s.offered_rps, 4000.0);
}

/// Fails if epoll mode silently ran the synchronous path: with a driver that has only
/// `request()` (no multiplexed path) it must refuse, and the summary of every wait mode must name
/// the loop that really ran.
#[test]
fn epoll_never_falls_back_to_the_synchronous_path() {
    let srv = TestServer::start();
    let mut c = cfg(Mode::Closed);
    c.wait = Wait::Epoll;
    c.connections = 1;
    c.threads = 1;
    let e = run_err(&c, &connector(srv.addr), None);
    assert!(
        e.contains("wait epoll") && e.contains("not supported by the memcached driver"),
        "{e}"
    );
    // Block and Spin with one thread per connection keep the synchronous path ...
    for wait in [Wait::Block, Wait::Spin] {
        let mut c = cfg(Mode::Closed);
        c.wait = wait;
        c.connections = 2;
        c.threads = 2;
        let (s, counts) = run_counted(&c, &srv, None);
        assert_eq!((s.requests, s.errors), (100, 0), "{wait:?}");
        assert_eq!(s.client_loop, ClientLoop::ThreadPerConnection, "{wait:?}");
        assert_eq!(counts.polls.load(Ordering::SeqCst), 0, "{wait:?}");
        assert_eq!(counts.requests.load(Ordering::SeqCst), 100 + 2, "{wait:?}");
        // ... and run the event loop with fewer threads than connections.
        c.threads = 1;
        let (s, _) = run_counted(&c, &srv, None);
        assert_eq!(s.client_loop, ClientLoop::EventLoop, "{wait:?}");
    }
    // The JSON names.
    assert_eq!(
        serde_json::to_value(ClientLoop::EventLoop).unwrap(),
        serde_json::json!("event-loop")
    );
    assert_eq!(
        ClientLoop::ThreadPerConnection.name(),
        "thread-per-connection"
    );
}

/// Epoll mode waits in epoll_wait: with replies 1 ms late, the loop polls a connection about
/// once per reply (after readiness), not thousands of times as a busy poll would.
#[test]
fn epoll_waits_for_readiness_instead_of_polling() {
    let srv = TestServer::start();
    srv.ctl.delay_us.store(1000, Ordering::SeqCst);
    let mut c = cfg(Mode::Closed);
    c.requests = Some(50);
    c.connections = 1;
    c.threads = 1;
    c.wait = Wait::Epoll;
    let (s, counts) = run_counted(&c, &srv, None);
    assert_eq!(
        (s.requests, s.errors, s.client_loop),
        (50, 0, ClientLoop::EventLoop)
    );
    assert!(s.p50_us >= 1000.0, "{s:?}");
    let polls = counts.polls.load(Ordering::SeqCst);
    assert!(
        polls <= 3 * 50,
        "{polls} polls for 50 replies: not waiting in epoll_wait"
    );
    // The same with Spin polls far more often (so the bound above can fail).
    c.wait = Wait::Spin;
    c.connections = 2;
    let (_, counts) = run_counted(&c, &srv, None);
    assert!(counts.polls.load(Ordering::SeqCst) > 3 * 50);
}

#[test]
fn epoll_configuration_errors_are_clear() {
    let srv = TestServer::start();
    // Idle-gap needs the thread-per-connection loop, also with one connection.
    let mut c = cfg(Mode::IdleGap);
    c.wait = Wait::Epoll;
    let e = run_err(&c, &mux_connector(srv.addr), None);
    assert!(e.contains("idle-gap") && e.contains("wait epoll"), "{e}");
    // Announcements too.
    let mut c = cfg(Mode::Closed);
    c.wait = Wait::Epoll;
    let mk = fake_announcer(0, Arc::default());
    let e = run_err(&c, &mux_connector(srv.addr), Some(&mk));
    assert!(
        e.contains("announcements") && e.contains("wait epoll"),
        "{e}"
    );
    assert_eq!(srv.ctl.served.load(Ordering::SeqCst), 0, "nothing sent");
}
