//! The load-generation engine (paper §4: the client side of every measurement).
//!
//! Three ways of pacing requests ([`Mode`]):
//!
//! * **open loop**: each connection is an independent Poisson process at `rate / connections`
//!   (the superposition of independent Poisson processes is Poisson at `rate`), seeded from
//!   `seed + connection` so runs are reproducible. Every intended send time is fixed in advance
//!   from the run start ([`Poisson`]); a slow reply makes later requests on that connection go out
//!   late, and their latency still counts from their *intended* time. That is the rule against
//!   coordinated omission: a stall shows up in the latency of every request that should have been
//!   sent during it, not only in the one request that was stuck.
//! * **idle gap**: sleep `gap`, then send one request (the cold-start case); intended = the time
//!   the gap ended.
//! * **closed loop**: back to back on each connection; intended = now.
//!
//! With an [`Announce`] the engine asks for a send time before every measured request. In open
//! loop the request is still measured from its intended (Poisson) time, so a wait for a slot
//! counts. In idle-gap and closed mode the *granted* time is the intended time: an announced
//! request is meant to arrive at the announced time, and that is what the receiver preheats for.
//!
//! Waiting for a send time sleeps until ~150 µs before it, then spins, so long gaps do not burn a
//! CPU and the send itself is precise.
//!
//! **Threads.** By default every connection has its own client thread and a synchronous
//! [`Driver::request`] (the *thread-per-connection* loop; [`Wait::Block`] blocks in `read`,
//! [`Wait::Spin`] busy-polls the socket). With [`LoadConfig::threads`] below the number of
//! connections, or with [`Wait::Epoll`] for any threads ≤ connections (one connection on one
//! thread included), the *event loop* runs instead ([`LoadSummary::client_loop`] says which
//! ran): thread `t` drives the connections `c` with `c % threads == t` (like wrk `-t T -c C`),
//! through the drivers' non-blocking [`Driver::send_request`] / [`Driver::poll_reply`]: closed loop keeps
//! one request outstanding on every connection (a completed reply is recorded and the next
//! request goes out); open loop keeps each connection's own Poisson schedule and sends when the
//! intended time has come and nothing is outstanding on that connection, measuring from the
//! intended time as above. The thread waits in `epoll_wait` ([`Wait::Block`] and [`Wait::Epoll`]:
//! until a reply arrives or ~150 µs before the next scheduled send) and then reads the ready
//! sockets, as event-loop clients (memcaslap, wrk, redis-benchmark) do, or polls every
//! connection in turn ([`Wait::Spin`]). Idle-gap mode and announcements need the
//! thread-per-connection loop (a run that asks for the event loop with them, by fewer threads
//! or by [`Wait::Epoll`], is rejected), as do drivers without the multiplexed path (MySQL).
//!
//! Latencies (ns) go into one HdrHistogram per connection (1 ns .. 60 s, 3 significant digits),
//! merged at the end; per-request [`Record`]s go through a channel to a writer thread, so the
//! measuring threads never wait for I/O.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Barrier, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use hdrhistogram::Histogram;
use preheat_engine::time::now_ns;
use serde::{Deserialize, Serialize};

use crate::driver::{Driver, Outcome, Wait};

/// How requests are paced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Open loop: Poisson arrivals at `rate` per second (over all connections; each connection
    /// is an independent Poisson process at rate/connections). A request that cannot go out at
    /// its intended time (the previous reply on its connection is still outstanding) is sent
    /// late and its latency still counts from the intended time.
    Open,
    /// One request after each idle gap (the cold-start case).
    IdleGap,
    /// Back to back on each connection.
    Closed,
}

impl Mode {
    /// The name used on the command line, in JSON and in records.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Open => "open",
            Mode::IdleGap => "idle-gap",
            Mode::Closed => "closed",
        }
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct LoadConfig {
    pub mode: Mode,
    /// Stop after this many measured requests (all connections together) ...
    pub requests: Option<u64>,
    /// ... or after this long (whichever comes first; at least one must be set).
    pub duration: Option<Duration>,
    /// Open loop: offered load, requests per second over all connections.
    pub rate: f64,
    /// Idle-gap mode: the gap before each request.
    pub gap: Duration,
    /// Connections.
    pub connections: usize,
    /// Client threads: 0 or `connections` = one thread per connection with a blocking
    /// [`Driver::request`] (except with [`Wait::Epoll`]); fewer = each thread multiplexes
    /// `connections / threads` (±1) connections (see the module docs). Not with idle-gap mode
    /// or announcements.
    pub threads: usize,
    /// How a client thread waits (pass the same as the drivers' own wait). Event loop: `Block`
    /// and `Epoll` wait in `epoll_wait`, `Spin` polls the connections in turn. `Epoll` always
    /// runs the event loop (also with threads == connections); with `Block` and `Spin` one
    /// thread per connection runs the synchronous [`Driver::request`] (the drivers wait
    /// themselves).
    pub wait: Wait,
    /// Unmeasured requests per connection before measuring.
    pub warmup: u64,
    /// Seed of the arrival process (runs are reproducible).
    pub seed: u64,
    /// Strategy label written into every record (e.g. "none", "wake+lines").
    pub strategy: String,
}

/// When a request may go out. Implemented by the CLI for local announcements (announce
/// `arrival = max(earliest, now + lead)` and send then) and for the arbiter (ask for a slot).
pub trait Announce: Send {
    /// Called before each measured request with the earliest time it should go out; returns
    /// the time it will be sent (the engine spins until then).
    fn grant(&mut self, earliest_ns: u64) -> Grant;

    /// How long before `earliest` [`Announce::grant`] wants to be called (open loop: the engine
    /// calls it this far ahead of the intended time, so an announcement `lead` ahead does not
    /// delay the request). Default 0: at the intended time.
    fn lead_ns(&self) -> u64 {
        0
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    pub send_at_ns: u64,
    /// False: the request goes out unannounced/unscheduled (fail-open).
    pub scheduled: bool,
}

/// One measured request.
#[derive(Debug, Clone, Serialize)]
pub struct Record {
    pub seq: u64,
    pub conn: u32,
    pub mode: Mode,
    /// Idle gap before this request, µs: intended time − the previous reply on this connection
    /// (0 outside idle-gap mode).
    pub gap_us: f64,
    /// Intended send time (arrival process / gap end), CLOCK_MONOTONIC ns. In idle-gap and
    /// closed mode with an announcer, the granted (announced) time.
    pub intended_ns: u64,
    /// Granted send time (== intended without announcements).
    pub granted_ns: u64,
    /// When it really went out, and when the whole reply was read.
    pub sent_ns: u64,
    pub done_ns: u64,
    /// done − intended, µs: includes any wait for a slot or a busy connection.
    pub latency_us: f64,
    pub kind: &'static str,
    pub ok: bool,
    /// The announcer granted a slot / announced it (false without an announcer).
    pub scheduled: bool,
    pub strategy: String,
}

/// Which client loop ran a load.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ClientLoop {
    /// One thread per connection, each in the synchronous [`Driver::request`].
    ThreadPerConnection,
    /// Threads multiplexing their connections through [`Driver::send_request`] /
    /// [`Driver::poll_reply`] (in `epoll_wait`, or polling with [`Wait::Spin`]).
    EventLoop,
}

impl ClientLoop {
    /// The name used in JSON ("thread-per-connection", "event-loop").
    pub fn name(self) -> &'static str {
        match self {
            ClientLoop::ThreadPerConnection => "thread-per-connection",
            ClientLoop::EventLoop => "event-loop",
        }
    }
}

/// Totals of a run. Every latency is measured on this machine from the intended send time.
#[derive(Debug, Clone, Serialize)]
pub struct LoadSummary {
    pub label: &'static str,
    pub mode: Mode,
    pub connections: usize,
    /// Client threads (== connections: one per connection).
    pub threads: usize,
    /// The client loop that really ran (reported by the client threads themselves).
    pub client_loop: ClientLoop,
    /// Measured requests (complete replies, right or wrong): the histogram's sample count.
    pub requests: u64,
    /// Transport failures (each followed by a reconnect; the failed request is not measured).
    pub errors: u64,
    /// Complete but wrong replies (`Outcome::ok == false`); measured, and in `requests`.
    pub wrong: u64,
    /// With an announcer: requests sent at a granted/announced time, and fail-open ones.
    pub scheduled: u64,
    pub unscheduled: u64,
    /// From the start of the measured phase (after warm-up) to the last reply.
    pub duration_s: f64,
    /// Completed requests per second.
    pub throughput_rps: f64,
    /// Open loop: the configured rate; otherwise 0.
    pub offered_rps: f64,
    pub p50_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub max_us: f64,
    pub mean_us: f64,
    /// sent − intended, µs: how late requests really went out.
    pub send_late_us_p50: f64,
    pub send_late_us_p99: f64,
}

/// Where records go. Implementations must not block the measuring threads for long: the engine
/// hands records over through a channel to a writer thread.
pub trait RecordSink: Send {
    fn write(&mut self, r: &Record) -> Result<()>;
    fn flush(&mut self) -> Result<()>;
}

/// The CSV header of [`CsvSink`]: every [`Record`] field, in declaration order.
pub const CSV_HEADER: &str = "seq,conn,mode,gap_us,intended_ns,granted_ns,sent_ns,done_ns,latency_us,kind,ok,scheduled,strategy";

/// Records as CSV (header first); flushed at least every 100 ms so an interrupted run keeps
/// what it measured.
pub struct CsvSink {
    w: BufWriter<File>,
    path: PathBuf,
    last_flush: Instant,
}

impl CsvSink {
    pub fn create(path: &Path) -> Result<CsvSink> {
        let f = File::create(path)
            .with_context(|| format!("creating the records file {}", path.display()))?;
        let mut s = CsvSink {
            w: BufWriter::new(f),
            path: path.to_path_buf(),
            last_flush: Instant::now(),
        };
        writeln!(s.w, "{CSV_HEADER}")
            .and_then(|_| s.w.flush())
            .with_context(|| format!("writing {}", s.path.display()))?;
        Ok(s)
    }
}

/// A CSV field: quoted when it contains a separator, quote or line break.
fn csv_field(s: &str) -> std::borrow::Cow<'_, str> {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\"")).into()
    } else {
        s.into()
    }
}

impl RecordSink for CsvSink {
    fn write(&mut self, r: &Record) -> Result<()> {
        writeln!(
            self.w,
            "{},{},{},{:.3},{},{},{},{},{:.3},{},{},{},{}",
            r.seq,
            r.conn,
            r.mode.name(),
            r.gap_us,
            r.intended_ns,
            r.granted_ns,
            r.sent_ns,
            r.done_ns,
            r.latency_us,
            csv_field(r.kind),
            r.ok,
            r.scheduled,
            csv_field(&r.strategy)
        )
        .with_context(|| format!("writing {}", self.path.display()))?;
        if self.last_flush.elapsed() >= FLUSH_EVERY {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<()> {
        self.last_flush = Instant::now();
        self.w
            .flush()
            .with_context(|| format!("writing {}", self.path.display()))
    }
}

const FLUSH_EVERY: Duration = Duration::from_millis(100);
const PROGRESS_EVERY: Duration = Duration::from_millis(50);
/// Sleep until this long before a send time, then spin.
const SPIN_NS: u64 = 150_000;
/// Longest single sleep, so `stop` is noticed promptly.
const MAX_SLEEP: Duration = Duration::from_millis(20);
/// Reconnect attempts after a transport failure before giving up.
const RECONNECTS: u32 = 3;
/// Requests failing in a row (each on a fresh connection) before giving up.
const FAILS_IN_ROW: u32 = 3;
const HIST_MAX_NS: u64 = 60_000_000_000;

/// The open-loop arrival process of one connection: exponential inter-arrival gaps (ns) at
/// `rate_per_s`, from a small self-contained generator (SplitMix64), so a seed gives the same
/// schedule on every machine and with every version of the `rand` crate.
#[derive(Debug, Clone)]
pub struct Poisson {
    state: u64,
    mean_ns: f64,
}

impl Poisson {
    pub fn new(rate_per_s: f64, seed: u64) -> Poisson {
        Poisson {
            state: seed,
            mean_ns: 1e9 / rate_per_s,
        }
    }

    fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// The next inter-arrival gap, ns.
    pub fn next_gap_ns(&mut self) -> u64 {
        // u in (0, 1]: 53 random bits, never 0, so ln(u) is finite.
        let u = ((self.next_u64() >> 11) + 1) as f64 / (1u64 << 53) as f64;
        (-u.ln() * self.mean_ns).round() as u64
    }
}

impl Iterator for Poisson {
    type Item = u64;
    fn next(&mut self) -> Option<u64> {
        Some(self.next_gap_ns())
    }
}

/// The first `n` inter-arrival gaps (ns) of a Poisson process at `rate_per_s` with `seed`: a
/// pure function (same inputs, same schedule). Connection `c` of an open-loop run uses
/// `poisson_gaps_ns(rate / connections, seed + c, ..)`; its intended send times are the run
/// start plus the running sums.
pub fn poisson_gaps_ns(rate_per_s: f64, seed: u64, n: usize) -> Vec<u64> {
    Poisson::new(rate_per_s, seed).take(n).collect()
}

/// Wait until `t_ns` (CLOCK_MONOTONIC): sleep until ~150 µs before, then spin. Returns false if
/// `cancel` said so while sleeping (it is not polled during the final spin).
pub fn wait_until(t_ns: u64, cancel: &dyn Fn() -> bool) -> bool {
    loop {
        let now = now_ns();
        if now >= t_ns {
            return true;
        }
        let sleep = sleep_before(t_ns, now);
        if sleep.is_zero() {
            std::hint::spin_loop();
        } else {
            if cancel() {
                return false;
            }
            std::thread::sleep(sleep);
        }
    }
}

/// Sleep `d` (really sleep: the idle gap is the point), in slices so `cancel` is noticed.
fn sleep_for(d: Duration, cancel: &dyn Fn() -> bool) -> bool {
    let end = Instant::now() + d;
    loop {
        if cancel() {
            return false;
        }
        let now = Instant::now();
        if now >= end {
            return true;
        }
        std::thread::sleep((end - now).min(MAX_SLEEP));
    }
}

type Connect<'a> = &'a (dyn Fn() -> Result<Box<dyn Driver>> + Sync);

/// One connection's driver, reconnected after transport failures.
struct Conn<'a> {
    id: usize,
    driver: Box<dyn Driver>,
    connect: Connect<'a>,
    errors: u64,
    fails_in_row: u32,
}

impl<'a> Conn<'a> {
    fn open(id: usize, connect: Connect<'a>) -> Result<Conn<'a>> {
        let driver = connect().with_context(|| format!("connection {id}: connecting"))?;
        Ok(Conn {
            id,
            driver,
            connect,
            errors: 0,
            fails_in_row: 0,
        })
    }

    /// One request. `Ok(None)`: a transport failure, counted, and the connection was reopened
    /// (or `cancel` is set). `Err`: the server is gone for good.
    fn request(&mut self, cancel: &dyn Fn() -> bool) -> Result<Option<Outcome>> {
        match self.driver.request() {
            Ok(o) => {
                self.fails_in_row = 0;
                Ok(Some(o))
            }
            Err(e) => {
                self.failed(e, cancel)?;
                Ok(None)
            }
        }
    }

    /// A transport failure: count it and reopen the connection (unless `cancel` is set).
    /// `Err`: the server is gone for good.
    fn failed(&mut self, e: anyhow::Error, cancel: &dyn Fn() -> bool) -> Result<()> {
        self.errors += 1;
        self.fails_in_row += 1;
        if self.fails_in_row >= FAILS_IN_ROW {
            return Err(e.context(format!(
                "connection {}: {} requests in a row failed, each on a fresh connection; giving up (is the server overloaded or closing connections?)",
                self.id, self.fails_in_row
            )));
        }
        self.reconnect(e, cancel)
    }

    fn reconnect(&mut self, cause: anyhow::Error, cancel: &dyn Fn() -> bool) -> Result<()> {
        let backoff = [
            Duration::ZERO,
            Duration::from_millis(10),
            Duration::from_millis(50),
        ];
        let mut last = None;
        for pause in backoff.iter().take(RECONNECTS as usize) {
            if !sleep_for(*pause, cancel) {
                return Ok(());
            }
            match (self.connect)() {
                Ok(d) => {
                    self.driver = d;
                    return Ok(());
                }
                Err(e) => last = Some(e),
            }
        }
        let last = last.map(|e| format!("{e:#}")).unwrap_or_default();
        bail!(
            "connection {}: the connection failed ({cause:#}) and {RECONNECTS} reconnects in a row failed (last: {last}); is the server still running?",
            self.id
        )
    }
}

/// What one connection measured.
struct ConnOut {
    latency: Histogram<u64>,
    late: Histogram<u64>,
    errors: u64,
    wrong: u64,
    scheduled: u64,
    unscheduled: u64,
    last_done_ns: u64,
    /// Measured by the event loop (false: the thread-per-connection loop).
    event_loop: bool,
}

impl ConnOut {
    fn new(event_loop: bool) -> ConnOut {
        ConnOut {
            latency: histogram(),
            late: histogram(),
            errors: 0,
            wrong: 0,
            scheduled: 0,
            unscheduled: 0,
            last_done_ns: 0,
            event_loop,
        }
    }
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, HIST_MAX_NS, 3).expect("valid histogram bounds")
}

/// Shared state of a run.
struct Shared<'a> {
    cfg: &'a LoadConfig,
    stop: &'a AtomicBool,
    /// A connection failed for good: the others stop too.
    abort: AtomicBool,
    /// Requests claimed (never more than `cfg.requests`).
    claimed: AtomicU64,
    /// Requests measured (the progress count and the record sequence number).
    completed: AtomicU64,
    start: OnceLock<u64>,
    setup: Barrier,
}

impl Shared<'_> {
    /// `stop` was asked for or a connection failed for good (requests left or not).
    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed) || self.abort.load(Ordering::Relaxed)
    }

    /// [`Shared::stopped`], or every request ticket is taken.
    fn cancelled(&self) -> bool {
        self.stopped()
            || self
                .cfg
                .requests
                .is_some_and(|n| self.claimed.load(Ordering::Relaxed) >= n)
    }

    /// Take one of the `requests` tickets; false when they are gone.
    fn claim(&self) -> bool {
        match self.cfg.requests {
            None => true,
            Some(n) => self
                .claimed
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| {
                    (c < n).then_some(c + 1)
                })
                .is_ok(),
        }
    }

    /// Give a ticket back (its request failed and was not measured).
    fn unclaim(&self) {
        if self.cfg.requests.is_some() {
            self.claimed.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// The end of the measured phase that started at `start` (none without a duration).
    fn deadline(&self, start: u64) -> Option<u64> {
        self.cfg.duration.map(|d| start.saturating_add(nanos(d)))
    }

    /// Connection `id`'s open-loop arrival process (seeded from `seed + id`) and its first
    /// send time: `start` plus the first gap in open loop, `start` otherwise.
    fn arrivals(&self, id: usize, start: u64) -> (Poisson, u64) {
        let cfg = self.cfg;
        let mut arrivals = Poisson::new(
            cfg.rate / cfg.connections as f64,
            cfg.seed.wrapping_add(id as u64),
        );
        let mut first = start;
        if cfg.mode == Mode::Open {
            first += arrivals.next_gap_ns();
        }
        (arrivals, first)
    }

    /// A client thread's life: set up (cancelled by [`Shared::stopped`]), wait for the other
    /// threads, then measure from the common start. A failure in either phase stops the others.
    fn client_thread<S>(
        &self,
        set_up: impl FnOnce(&dyn Fn() -> bool) -> Result<S>,
        measure: impl FnOnce(S, u64) -> Result<ConnOut>,
    ) -> Result<ConnOut> {
        let setup = set_up(&|| self.stopped());
        if setup.is_err() {
            self.abort.store(true, Ordering::Relaxed);
        }
        self.setup.wait();
        let setup = setup?;
        let start = *self.start.get_or_init(now_ns);
        let r = measure(setup, start);
        if r.is_err() {
            self.abort.store(true, Ordering::Relaxed);
        }
        r
    }
}

/// `d` in ns (saturating).
fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// How long to sleep before a send at `t_ns` when it is `now_ns`: until ~150 µs before it (the
/// rest is spun), at most [`MAX_SLEEP`]; zero when it is that close already.
fn sleep_before(t_ns: u64, now_ns: u64) -> Duration {
    Duration::from_nanos(t_ns.saturating_sub(now_ns).saturating_sub(SPIN_NS)).min(MAX_SLEEP)
}

fn validate(cfg: &LoadConfig) -> Result<()> {
    if cfg.requests.is_none() && cfg.duration.is_none() {
        bail!("a load needs a number of requests or a duration (or both)");
    }
    if cfg.connections == 0 {
        bail!("a load needs at least one connection");
    }
    if cfg.mode == Mode::Open && !(cfg.rate.is_finite() && cfg.rate > 0.0) {
        bail!("open loop needs a positive request rate (got {})", cfg.rate);
    }
    if cfg.threads > cfg.connections {
        bail!(
            "more client threads ({}) than connections ({}): a thread drives at least one connection",
            cfg.threads,
            cfg.connections
        );
    }
    if cfg.wait == Wait::Epoll && cfg.mode == Mode::IdleGap {
        bail!(
            "idle-gap mode is not supported with wait epoll (the event loop); use wait block or spin (one thread per connection, each sleeps its own gap)"
        );
    }
    if multiplexed(cfg) && cfg.mode == Mode::IdleGap {
        bail!(
            "idle-gap mode needs one thread per connection (threads 0 or {}, got {}): each connection sleeps its own gap",
            cfg.connections,
            cfg.threads
        );
    }
    Ok(())
}

/// Client threads of a run.
fn thread_count(cfg: &LoadConfig) -> usize {
    if cfg.threads == 0 {
        cfg.connections
    } else {
        cfg.threads
    }
}

/// The event loop runs: threads drive several connections each, or [`Wait::Epoll`] asks for it.
fn multiplexed(cfg: &LoadConfig) -> bool {
    thread_count(cfg) < cfg.connections || cfg.wait == Wait::Epoll
}

/// Run a load. `connect` opens one driver per connection (and again after a transport error);
/// `announce` (optional) makes one announcer per connection; `stop` ends the run early (the
/// summary covers what was measured); `progress` is called with the number of completed
/// requests now and then.
pub fn run(
    cfg: &LoadConfig,
    connect: &(dyn Fn() -> Result<Box<dyn Driver>> + Sync),
    announce: Option<&(dyn Fn(usize) -> Result<Box<dyn Announce>> + Sync)>,
    sink: Option<Box<dyn RecordSink>>,
    stop: &AtomicBool,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<LoadSummary> {
    validate(cfg)?;
    if cfg.wait == Wait::Epoll && announce.is_some() {
        bail!(
            "announcements are not supported with wait epoll (the event loop); use wait block or spin (one thread per connection, each request is granted its own send time)"
        );
    }
    if multiplexed(cfg) && announce.is_some() {
        bail!(
            "announcements need one thread per connection (threads 0 or {}, got {}): each request is granted its own send time",
            cfg.connections,
            cfg.threads
        );
    }
    let threads = thread_count(cfg);
    let shared = Shared {
        cfg,
        stop,
        abort: AtomicBool::new(false),
        claimed: AtomicU64::new(0),
        completed: AtomicU64::new(0),
        start: OnceLock::new(),
        setup: Barrier::new(threads),
    };
    let (tx, rx) = mpsc::channel::<Record>();
    let (outs, written) = std::thread::scope(|s| {
        let writer = sink.map(|sink| s.spawn(move || write_records(sink, rx)));
        let workers: Vec<_> = (0..threads)
            .map(|i| {
                let tx = writer.as_ref().map(|_| tx.clone());
                let shared = &shared;
                if multiplexed(cfg) {
                    s.spawn(move || mux_thread(i, threads, shared, connect, tx))
                } else {
                    s.spawn(move || connection(i, shared, connect, announce, tx))
                }
            })
            .collect();
        drop(tx);
        let mut last = Instant::now();
        while !workers.iter().all(|h| h.is_finished()) {
            std::thread::sleep(Duration::from_millis(5));
            if last.elapsed() >= PROGRESS_EVERY {
                last = Instant::now();
                progress(shared.completed.load(Ordering::Relaxed));
            }
        }
        let outs: Vec<Result<ConnOut>> = workers
            .into_iter()
            .enumerate()
            .map(|(i, h)| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("client thread {i} panicked")))
            })
            .collect();
        let written = writer.map(|w| {
            w.join()
                .unwrap_or_else(|_| Err(anyhow::anyhow!("the records writer panicked")))
        });
        (outs, written)
    });
    progress(shared.completed.load(Ordering::Relaxed));
    let end_fallback = now_ns();
    let mut merged = Vec::with_capacity(outs.len());
    for o in outs {
        merged.push(o?);
    }
    if let Some(w) = written {
        w?;
    }
    Ok(summarize(
        cfg,
        &merged,
        shared.start.get().copied(),
        end_fallback,
    ))
}

fn summarize(cfg: &LoadConfig, outs: &[ConnOut], start: Option<u64>, now: u64) -> LoadSummary {
    let mut latency = histogram();
    let mut late = histogram();
    let (mut errors, mut wrong, mut scheduled, mut unscheduled, mut last_done) = (0, 0, 0, 0, 0);
    for o in outs {
        latency.add(&o.latency).expect("same bounds");
        late.add(&o.late).expect("same bounds");
        errors += o.errors;
        wrong += o.wrong;
        scheduled += o.scheduled;
        unscheduled += o.unscheduled;
        last_done = last_done.max(o.last_done_ns);
    }
    // What the client threads report; every thread of a run runs the same loop.
    let client_loop = if outs.iter().any(|o| o.event_loop) {
        ClientLoop::EventLoop
    } else {
        ClientLoop::ThreadPerConnection
    };
    let requests = latency.len();
    let start = start.unwrap_or(now);
    let end = if requests > 0 { last_done } else { now };
    let duration_s = end.saturating_sub(start) as f64 / 1e9;
    let us = |h: &Histogram<u64>, q: f64| {
        if h.is_empty() {
            0.0
        } else {
            h.value_at_quantile(q) as f64 / 1e3
        }
    };
    LoadSummary {
        label: "measured",
        mode: cfg.mode,
        connections: cfg.connections,
        threads: thread_count(cfg),
        client_loop,
        requests,
        errors,
        wrong,
        scheduled,
        unscheduled,
        duration_s,
        throughput_rps: if duration_s > 0.0 {
            requests as f64 / duration_s
        } else {
            0.0
        },
        offered_rps: if cfg.mode == Mode::Open {
            cfg.rate
        } else {
            0.0
        },
        p50_us: us(&latency, 0.5),
        p90_us: us(&latency, 0.9),
        p99_us: us(&latency, 0.99),
        p999_us: us(&latency, 0.999),
        max_us: if requests > 0 {
            latency.max() as f64 / 1e3
        } else {
            0.0
        },
        mean_us: if requests > 0 {
            latency.mean() / 1e3
        } else {
            0.0
        },
        send_late_us_p50: us(&late, 0.5),
        send_late_us_p99: us(&late, 0.99),
    }
}

/// The writer thread: records to the sink, flushed at least every 100 ms and at the end. After
/// a write error it keeps draining the channel (the run goes on) and reports the error at the
/// end.
fn write_records(mut sink: Box<dyn RecordSink>, rx: mpsc::Receiver<Record>) -> Result<()> {
    let mut err: Option<anyhow::Error> = None;
    let mut dirty = false;
    let mut last_flush = Instant::now();
    loop {
        let timeout = FLUSH_EVERY
            .saturating_sub(last_flush.elapsed())
            .max(Duration::from_millis(1));
        match rx.recv_timeout(timeout) {
            Ok(r) => {
                if err.is_none() {
                    match sink.write(&r) {
                        Ok(()) => dirty = true,
                        Err(e) => err = Some(e),
                    }
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
        if last_flush.elapsed() >= FLUSH_EVERY {
            if dirty && err.is_none() {
                if let Err(e) = sink.flush() {
                    err = Some(e);
                }
                dirty = false;
            }
            last_flush = Instant::now();
        }
    }
    if err.is_none() {
        if let Err(e) = sink.flush() {
            err = Some(e);
        }
    }
    match err {
        Some(e) => Err(e.context("writing the per-request records")),
        None => Ok(()),
    }
}

/// One connection's client thread: connect, warm up, wait for the others, then measure.
fn connection(
    id: usize,
    shared: &Shared<'_>,
    connect: Connect<'_>,
    announce: Option<&(dyn Fn(usize) -> Result<Box<dyn Announce>> + Sync)>,
    tx: Option<mpsc::Sender<Record>>,
) -> Result<ConnOut> {
    shared.client_thread(
        |cancel| set_up(id, shared, connect, announce, cancel),
        |(conn, ann), start| measure(id, shared, conn, ann, tx, start),
    )
}

/// Connect, make the announcer, send the warm-up requests (unmeasured; their transport
/// failures count in `errors` all the same).
fn set_up<'a>(
    id: usize,
    shared: &Shared<'_>,
    connect: Connect<'a>,
    announce: Option<&(dyn Fn(usize) -> Result<Box<dyn Announce>> + Sync)>,
    cancel: &dyn Fn() -> bool,
) -> Result<(Conn<'a>, Option<Box<dyn Announce>>)> {
    let mut conn = Conn::open(id, connect)?;
    let ann = match announce {
        Some(f) => {
            Some(f(id).with_context(|| format!("connection {id}: setting up announcements"))?)
        }
        None => None,
    };
    for _ in 0..shared.cfg.warmup {
        if cancel() {
            break;
        }
        conn.request(cancel)?;
    }
    Ok((conn, ann))
}

fn measure(
    id: usize,
    shared: &Shared<'_>,
    mut conn: Conn<'_>,
    mut ann: Option<Box<dyn Announce>>,
    tx: Option<mpsc::Sender<Record>>,
    start: u64,
) -> Result<ConnOut> {
    let cfg = shared.cfg;
    let cancelled = || shared.cancelled();
    let deadline = shared.deadline(start);
    let past_deadline = |t: u64| deadline.is_some_and(|e| t >= e);
    let lead = ann.as_ref().map_or(0, |a| a.lead_ns());
    let (mut arrivals, mut next_open) = shared.arrivals(id, start);
    let mut out = ConnOut::new(false);
    let mut prev_done = start;
    loop {
        if cancelled() {
            break;
        }
        let earliest = match cfg.mode {
            Mode::Open => {
                let t = next_open;
                next_open = next_open.saturating_add(arrivals.next_gap_ns());
                if past_deadline(t) || !wait_until(t.saturating_sub(lead), &cancelled) {
                    break;
                }
                t
            }
            Mode::IdleGap => {
                if !sleep_for(cfg.gap, &cancelled) {
                    break;
                }
                now_ns()
            }
            Mode::Closed => now_ns(),
        };
        if past_deadline(earliest) && cfg.mode != Mode::Open {
            break;
        }
        if !shared.claim() {
            break;
        }
        let (granted, scheduled) = match ann.as_mut() {
            Some(a) => {
                let g = a.grant(earliest);
                if g.scheduled {
                    out.scheduled += 1;
                } else {
                    out.unscheduled += 1;
                }
                (g.send_at_ns, g.scheduled)
            }
            None => (earliest, false),
        };
        // Open loop: the Poisson time is the intended time, whatever the grant. Otherwise an
        // announced request is meant to arrive at the granted (announced) time.
        let intended = if cfg.mode == Mode::Open {
            earliest
        } else {
            granted
        };
        wait_until(granted, &|| false);
        let sent = now_ns();
        let outcome = conn.request(&|| shared.stop.load(Ordering::Relaxed))?;
        let done = now_ns();
        let Some(o) = outcome else {
            shared.unclaim();
            continue;
        };
        let gap_us = if cfg.mode == Mode::IdleGap {
            intended.saturating_sub(prev_done) as f64 / 1e3
        } else {
            0.0
        };
        let times = Times {
            intended,
            granted,
            sent,
            done,
        };
        measured(
            shared,
            &mut out,
            tx.as_ref(),
            id,
            times,
            o,
            scheduled,
            gap_us,
        );
        prev_done = done;
    }
    out.errors = conn.errors;
    Ok(out)
}

/// The times of one measured request (CLOCK_MONOTONIC ns).
#[derive(Clone, Copy)]
struct Times {
    intended: u64,
    granted: u64,
    sent: u64,
    done: u64,
}

/// Count a measured request and hand its record to the writer.
#[allow(clippy::too_many_arguments)]
fn measured(
    shared: &Shared<'_>,
    out: &mut ConnOut,
    tx: Option<&mpsc::Sender<Record>>,
    id: usize,
    t: Times,
    o: Outcome,
    scheduled: bool,
    gap_us: f64,
) {
    let cfg = shared.cfg;
    let latency = t.done.saturating_sub(t.intended);
    out.latency.saturating_record(latency.max(1));
    out.late
        .saturating_record(t.sent.saturating_sub(t.intended));
    if !o.ok {
        out.wrong += 1;
    }
    out.last_done_ns = out.last_done_ns.max(t.done);
    let seq = shared.completed.fetch_add(1, Ordering::Relaxed);
    if let Some(tx) = tx {
        // The writer only goes away after every sender is dropped, so this cannot fail;
        // if it did, losing a record must not stop the measurement.
        let _ = tx.send(Record {
            seq,
            conn: id as u32,
            mode: cfg.mode,
            gap_us,
            intended_ns: t.intended,
            granted_ns: t.granted,
            sent_ns: t.sent,
            done_ns: t.done,
            latency_us: latency as f64 / 1e3,
            kind: o.kind,
            ok: o.ok,
            scheduled,
            strategy: cfg.strategy.clone(),
        });
    }
}

// ---------------------------------------------------------------------------------------------
// Multiplexed client threads: several connections per thread (threads < connections).

/// One connection of a multiplexed thread.
struct Slot<'a> {
    conn: Conn<'a>,
    arrivals: Poisson,
    /// Open loop: the next intended send time.
    next_open: u64,
    /// The outstanding request: (intended, sent).
    pending: Option<(u64, u64)>,
    /// Sends no more (the run is ending for it); its outstanding reply is still collected.
    done: bool,
}

/// How a multiplexed thread waits: an epoll set over its sockets (`Wait::Block`, `Wait::Epoll`) or none
/// (`Wait::Spin`: poll every outstanding connection in turn).
struct Waiter {
    epoll: Option<preheat_engine::os::Epoll>,
    ready: Vec<i32>,
}

impl Waiter {
    fn watch(&self, conn: &Conn<'_>) -> Result<()> {
        if let (Some(ep), Some(fd)) = (&self.epoll, conn.driver.raw_fd()) {
            match ep.add_readable(fd) {
                Ok(()) => {}
                // Still the same socket (a reconnect was cut short by the stop flag).
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => {
                    return Err(e)
                        .with_context(|| format!("connection {}: adding to epoll", conn.id))
                }
            }
        }
        Ok(())
    }
}

/// A multiplexed thread: connect its connections and warm them up (one blocking request at a
/// time), wait for the others, then measure.
fn mux_thread(
    t: usize,
    threads: usize,
    shared: &Shared<'_>,
    connect: Connect<'_>,
    tx: Option<mpsc::Sender<Record>>,
) -> Result<ConnOut> {
    shared.client_thread(
        |cancel| mux_set_up(t, threads, shared, connect, cancel),
        |(conns, waiter), start| mux_measure(shared, conns, waiter, tx, start),
    )
}

fn mux_set_up<'a>(
    t: usize,
    threads: usize,
    shared: &Shared<'_>,
    connect: Connect<'a>,
    cancel: &dyn Fn() -> bool,
) -> Result<(Vec<Conn<'a>>, Waiter)> {
    let cfg = shared.cfg;
    let waiter = Waiter {
        epoll: match cfg.wait {
            Wait::Block | Wait::Epoll => Some(
                preheat_engine::os::Epoll::new()
                    .with_context(|| format!("client thread {t}: creating an epoll instance"))?,
            ),
            Wait::Spin => None,
        },
        ready: vec![0; cfg.connections.div_ceil(threads).max(1)],
    };
    let mut conns = Vec::new();
    for id in (t..cfg.connections).step_by(threads) {
        let mut conn = Conn::open(id, connect)?;
        if conn.driver.raw_fd().is_none() {
            if cfg.wait == Wait::Epoll {
                bail!(
                    "connection {id}: wait epoll (the event loop) is not supported by the {} driver (it has no non-blocking, multiplexed path); use wait block",
                    conn.driver.protocol().name()
                );
            }
            bail!(
                "connection {id}: the {:?} driver cannot multiplex connections (threads {} < connections {}); use one thread per connection (threads 0)",
                conn.driver.protocol(),
                cfg.threads,
                cfg.connections
            );
        }
        for _ in 0..cfg.warmup {
            if cancel() {
                break;
            }
            conn.request(cancel)?;
        }
        waiter.watch(&conn)?;
        conns.push(conn);
    }
    Ok((conns, waiter))
}

fn mux_measure(
    shared: &Shared<'_>,
    conns: Vec<Conn<'_>>,
    mut waiter: Waiter,
    tx: Option<mpsc::Sender<Record>>,
    start: u64,
) -> Result<ConnOut> {
    let cfg = shared.cfg;
    let stop_only = || shared.stopped();
    let deadline = shared.deadline(start);
    let past_deadline = |t: u64| deadline.is_some_and(|e| t >= e);
    let mut slots: Vec<Slot<'_>> = conns
        .into_iter()
        .map(|conn| {
            let (arrivals, next_open) = shared.arrivals(conn.id, start);
            Slot {
                conn,
                arrivals,
                next_open,
                pending: None,
                done: false,
            }
        })
        .collect();
    let mut out = ConnOut::new(true);
    let reply_timeout_ns = nanos(crate::driver::REPLY_TIMEOUT);
    // Spin mode: yield the CPU each turn after this long without a reply (see the drivers'
    // busy-poll: an unpinned client must not keep the server off its CPU).
    let mut last_progress = Instant::now();
    loop {
        // Send on every connection whose time has come and that has nothing outstanding.
        let stopping = shared.cancelled();
        let mut next_send = u64::MAX;
        let mut now = now_ns();
        for s in &mut slots {
            if s.pending.is_some() || s.done {
                continue;
            }
            if stopping {
                s.done = true;
                continue;
            }
            let intended = match cfg.mode {
                Mode::Open => s.next_open,
                _ => now,
            };
            if past_deadline(intended) {
                s.done = true;
                continue;
            }
            if intended > now {
                next_send = next_send.min(intended);
                continue;
            }
            if !shared.claim() {
                s.done = true;
                continue;
            }
            if cfg.mode == Mode::Open {
                s.next_open = s.next_open.saturating_add(s.arrivals.next_gap_ns());
            }
            let sent = now_ns();
            match s.conn.driver.send_request() {
                Ok(()) => s.pending = Some((intended, sent)),
                Err(e) => {
                    shared.unclaim();
                    s.conn.failed(e, &stop_only)?;
                    waiter.watch(&s.conn)?;
                }
            }
            now = sent;
        }
        if slots.iter().all(|s| s.done && s.pending.is_none()) {
            break;
        }
        let outstanding = slots.iter().any(|s| s.pending.is_some());

        // Wait for replies (or the next send time) and collect what is complete.
        match &waiter.epoll {
            Some(ep) => {
                let timeout = sleep_before(next_send, now_ns());
                let n = ep
                    .wait_ready(Some(timeout), &mut waiter.ready)
                    .context("waiting for replies in epoll")?;
                for k in 0..n {
                    let fd = waiter.ready[k];
                    let Some(i) = slots
                        .iter()
                        .position(|s| s.conn.driver.raw_fd() == Some(fd))
                    else {
                        // A socket that was replaced (it leaves the set when closed).
                        let _ = ep.remove(fd);
                        continue;
                    };
                    let s = &mut slots[i];
                    if s.pending.is_none() {
                        if s.done {
                            let _ = ep.remove(fd);
                        } else {
                            // Data or the end of the stream with nothing outstanding: the
                            // connection is out of step or closed; reopen it.
                            let e = anyhow::anyhow!(
                                "the server sent data or closed the connection while no request was outstanding"
                            );
                            s.conn.failed(e, &stop_only)?;
                            waiter.watch(&s.conn)?;
                        }
                        continue;
                    }
                    poll_slot(shared, s, &mut out, tx.as_ref(), &stop_only)?;
                    if s.conn.driver.raw_fd() != Some(fd) {
                        waiter.watch(&s.conn)?; // reopened
                    }
                }
                // Replies overdue without readiness: let the driver report the timeout.
                let now = now_ns();
                for s in &mut slots {
                    if s.pending
                        .is_some_and(|(_, sent)| now.saturating_sub(sent) > reply_timeout_ns)
                    {
                        poll_slot(shared, s, &mut out, tx.as_ref(), &stop_only)?;
                        waiter.watch(&s.conn)?;
                    }
                }
            }
            None => {
                let mut progress = false;
                for s in &mut slots {
                    if s.pending.is_some() {
                        progress |= poll_slot(shared, s, &mut out, tx.as_ref(), &stop_only)?;
                    }
                }
                if !outstanding {
                    // Nothing to poll: sleep until shortly before the next send.
                    if next_send == u64::MAX {
                        std::thread::sleep(Duration::from_millis(1));
                    } else {
                        std::thread::sleep(sleep_before(next_send, now_ns()));
                    }
                } else if progress {
                    last_progress = Instant::now();
                } else if last_progress.elapsed() > SPIN_YIELD_AFTER {
                    std::thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
            }
        }
    }
    out.errors = slots.iter().map(|s| s.conn.errors).sum();
    Ok(out)
}

/// Spin mode, multiplexed: yield each turn after this long without a complete reply.
const SPIN_YIELD_AFTER: Duration = Duration::from_micros(200);

/// Collect the outstanding reply of `s` if it is complete: record it (true), or on a transport
/// failure count it and reopen the connection (the request is not measured).
fn poll_slot(
    shared: &Shared<'_>,
    s: &mut Slot<'_>,
    out: &mut ConnOut,
    tx: Option<&mpsc::Sender<Record>>,
    cancel: &dyn Fn() -> bool,
) -> Result<bool> {
    let Some((intended, sent)) = s.pending else {
        return Ok(false);
    };
    match s.conn.driver.poll_reply() {
        Ok(None) => Ok(false),
        Ok(Some(o)) => {
            let done = now_ns();
            s.pending = None;
            s.conn.fails_in_row = 0;
            let times = Times {
                intended,
                granted: intended,
                sent,
                done,
            };
            measured(shared, out, tx, s.conn.id, times, o, false, 0.0);
            Ok(true)
        }
        Err(e) => {
            s.pending = None;
            shared.unclaim();
            s.conn.failed(e, cancel)?;
            Ok(false)
        }
    }
}
