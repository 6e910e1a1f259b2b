//! The staging proxy (Zhu et al., "staged bursts"): buffer complete client requests, release all
//! of them to the backend in one burst, and let responses flow back at once.
//!
//! **Phases.** A staging phase opens when a request arrives at an empty stage and ends with a
//! burst `period` later: under load that is one burst every `period`, and bursts are never closer
//! than `period` apart except for early releases. **Early release** (the paper's "dynamically
//! trigger burst processing when some staged requests are in danger of missing their latency
//! deadlines"): the burst comes earlier as soon as the oldest buffered request has waited
//! `bound − guard`, where the guard is the learned backend response time plus a margin
//! ([`ServiceEstimator`]); a guard at or above the bound releases requests as they arrive. A
//! burst always releases everything buffered.
//!
//! **Connections.** Each client connection gets its own backend connection, opened lazily at its
//! first burst (the backend sees nothing before the burst). Three threads per connection, all
//! blocking without timeouts while healthy, so an idle proxy causes no wakeups:
//!
//! ```text
//!  client ─▶ reader: frame requests ─▶ staged ─(stager thread: burst)─▶ released ─▶ writer ─▶ backend
//!  client ◀──────────────── backend reader: forward at once, frame responses (timing) ◀─ backend
//! ```
//!
//! The byte stream is forwarded unchanged and in order in both directions; framing only picks
//! cut points (see [`crate::framing`]). Per connection, responses therefore come back in request
//! order (the backend answers a connection in order).
//!
//! **Failures.** Backend unreachable at the burst, or closing/resetting with requests
//! outstanding: every outstanding request is answered with a proxy error (memcached:
//! `SERVER_ERROR proxy: ...` once per request that expects a reply, so a pipelining client stays
//! aligned; HTTP: one `502 Bad Gateway` with `Connection: close`), unless part of a response was
//! already forwarded; then the client connection is closed. Malformed or oversized requests:
//! earlier requests are still served, then the client gets `CLIENT_ERROR proxy: ...` / `400` /
//! `413` and the connection closes. A client closing with a partial request: the partial bytes
//! are dropped, complete requests are still released (half-close), and it is counted. Everything
//! is counted in [`StageCounters`].
//!
//! **Limits.** HTTP `Expect: 100-continue` is not answered by the proxy: a client that waits for
//! `100 Continue` before sending the body stalls until its own timeout (curl: 1 s). After an
//! HTTP `Upgrade`/`CONNECT` request, or on memcached binary-protocol connections, bytes are
//! staged unframed, in chunks as read (still in order, still released in bursts, untimed).

use std::collections::VecDeque;
use std::io::{self, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde::Serialize;

use crate::estimate::ServiceEstimator;
use crate::framing::{Framing, Limits};

mod conn;

use conn::{client_reader, close_conn, error_reply, writer, ErrorKind};

/// Configuration of a [`Stage`].
#[derive(Debug, Clone)]
pub struct StageConfig {
    /// Front address clients connect to (port 0: any free port, see [`Stage::local_addr`]).
    pub listen: SocketAddr,
    pub backend: SocketAddr,
    pub protocol: Framing,
    /// Length of a staging phase (paper: 250 ms).
    pub period: Duration,
    /// Latency bound per request (paper: p99.9 under 500 ms).
    pub bound: Duration,
    /// Fixed extra guard before the bound, on top of the learned response time.
    pub margin: Duration,
    /// Response time assumed before the first measurement.
    pub initial_service: Duration,
    pub connect_timeout: Duration,
    pub limits: Limits,
    /// Buffered bytes per connection beyond which the proxy stops reading that client.
    pub max_buffered_per_conn: usize,
    pub max_connections: usize,
}

impl StageConfig {
    /// The paper's parameters (250 ms period, 500 ms bound) and conservative defaults.
    pub fn new(listen: SocketAddr, backend: SocketAddr, protocol: Framing) -> StageConfig {
        StageConfig {
            listen,
            backend,
            protocol,
            period: Duration::from_millis(250),
            bound: Duration::from_millis(500),
            margin: Duration::from_millis(5),
            initial_service: Duration::from_millis(5),
            connect_timeout: Duration::from_secs(2),
            limits: Limits::default(),
            max_buffered_per_conn: 16 * 1024 * 1024,
            max_connections: 1024,
        }
    }
}

/// Counters of a running or stopped [`Stage`] (all measured by the proxy itself).
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct StageCounters {
    pub connections_accepted: u64,
    pub connections_rejected: u64,
    pub connections_active: u64,
    /// Complete requests buffered.
    pub requests_staged: u64,
    /// Requests (and unframed chunks) written to the backend in bursts.
    pub requests_released: u64,
    /// Chunks of unframed streams (after an HTTP upgrade, memcached binary) staged as read.
    pub opaque_chunks: u64,
    pub opaque_connections: u64,
    /// Bursts that released at least one request: periodic + early + final (shutdown).
    pub bursts: u64,
    pub bursts_periodic: u64,
    /// Bursts triggered because the oldest request would otherwise miss its bound.
    pub bursts_early: u64,
    pub bursts_final: u64,
    pub burst_max_requests: u64,
    /// Time requests were held before release: mean and max (µs).
    pub held_mean_us: f64,
    pub held_max_us: u64,
    /// Complete backend responses matched to requests (each one a response-time sample).
    pub responses: u64,
    pub interim_responses: u64,
    /// Learned backend response time (release → full response): EWMA and mean deviation (µs),
    /// and the guard currently reserved before the bound.
    pub service_ewma_us: f64,
    pub service_dev_us: f64,
    pub guard_us: f64,
    pub backend_connects: u64,
    pub backend_connect_failures: u64,
    /// Backend closed, reset or failed a write while requests were outstanding.
    pub backend_failures: u64,
    /// Backend closed a connection with nothing outstanding (idle timeout, after `quit`).
    pub backend_closed_idle: u64,
    /// Requests answered with a proxy-generated error.
    pub requests_failed: u64,
    /// Buffered requests discarded because their client was gone.
    pub requests_dropped: u64,
    /// Clients that closed with a partial request in the buffer.
    pub client_disconnects_mid_request: u64,
    /// Malformed or oversized requests (answered with an error, connection closed).
    pub client_protocol_errors: u64,
    /// Writes to clients that failed (client gone).
    pub client_write_errors: u64,
    /// Connections whose responses could no longer be framed (forwarding continued untimed).
    pub response_framing_lost: u64,
    /// Responses that arrived with no request outstanding (framing out of step).
    pub unmatched_responses: u64,
    pub bytes_from_clients: u64,
    pub bytes_to_clients: u64,
}

#[derive(Default)]
struct Counters {
    connections_accepted: AtomicU64,
    connections_rejected: AtomicU64,
    connections_closed: AtomicU64,
    requests_staged: AtomicU64,
    requests_released: AtomicU64,
    opaque_chunks: AtomicU64,
    opaque_connections: AtomicU64,
    bursts_periodic: AtomicU64,
    bursts_early: AtomicU64,
    bursts_final: AtomicU64,
    burst_max_requests: AtomicU64,
    held_sum_us: AtomicU64,
    held_max_us: AtomicU64,
    responses: AtomicU64,
    interim_responses: AtomicU64,
    backend_connects: AtomicU64,
    backend_connect_failures: AtomicU64,
    backend_failures: AtomicU64,
    backend_closed_idle: AtomicU64,
    requests_failed: AtomicU64,
    requests_dropped: AtomicU64,
    client_disconnects_mid_request: AtomicU64,
    client_protocol_errors: AtomicU64,
    client_write_errors: AtomicU64,
    response_framing_lost: AtomicU64,
    unmatched_responses: AtomicU64,
    bytes_from_clients: AtomicU64,
    bytes_to_clients: AtomicU64,
}

fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

fn get(c: &AtomicU64) -> u64 {
    c.load(Ordering::Relaxed)
}

/// Locks, ignoring poisoning: every critical section leaves the state consistent, and a panic
/// in one connection's thread must not take down the others.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

struct Req {
    arrival: Instant,
    bytes: Vec<u8>,
    expects: bool,
    head: bool,
}

struct Inflight {
    sent: Instant,
    head: bool,
}

#[derive(Default)]
struct ConnState {
    staged: VecDeque<Req>,
    released: VecDeque<Req>,
    buffered_bytes: usize,
    inflight: VecDeque<Inflight>,
    backend: Option<TcpStream>,
    /// No more requests will be staged (client EOF, protocol error).
    client_done: bool,
    /// Proxy reply to send after all earlier responses, then close.
    terminal: Option<Vec<u8>>,
    /// Responses are still framed (inflight is meaningful).
    tracking: bool,
    /// Part of a response was forwarded but not its end.
    mid_response: bool,
    closed: bool,
}

impl ConnState {
    fn outstanding(&self) -> u64 {
        let queued = self
            .staged
            .iter()
            .chain(self.released.iter())
            .filter(|r| r.expects)
            .count();
        (queued + self.inflight.len()) as u64
    }
}

struct Conn {
    client: TcpStream,
    state: Mutex<ConnState>,
    cv: Condvar,
}

#[derive(Default)]
struct Global {
    /// Connections with staged requests.
    pending: Vec<Arc<Conn>>,
    /// When the stage last became non-empty (the current phase opened).
    phase_start: Option<Instant>,
    /// Arrival of the oldest staged request.
    oldest: Option<Instant>,
    live: Vec<Weak<Conn>>,
    threads: Vec<JoinHandle<()>>,
    stop_stager: bool,
}

struct Shared {
    cfg: StageConfig,
    global: Mutex<Global>,
    stager_cv: Condvar,
    est: Mutex<ServiceEstimator>,
    counters: Counters,
    stopping: AtomicBool,
}

/// A running staging proxy. Stop it with [`Stage::shutdown`] (dropping it also stops it).
pub struct Stage {
    shared: Arc<Shared>,
    local: SocketAddr,
    acceptor: Option<JoinHandle<()>>,
    stager: Option<JoinHandle<()>>,
}

const CONN_STACK: usize = 256 * 1024;

impl Stage {
    /// Binds the front address and starts the acceptor and the stager.
    pub fn start(cfg: StageConfig) -> Result<Stage> {
        anyhow::ensure!(!cfg.period.is_zero(), "the period must be positive");
        anyhow::ensure!(!cfg.bound.is_zero(), "the bound must be positive");
        let listener =
            TcpListener::bind(cfg.listen).with_context(|| format!("binding {}", cfg.listen))?;
        let local = listener.local_addr()?;
        let est = ServiceEstimator::new(cfg.initial_service, cfg.margin);
        let shared = Arc::new(Shared {
            cfg,
            global: Mutex::new(Global::default()),
            stager_cv: Condvar::new(),
            est: Mutex::new(est),
            counters: Counters::default(),
            stopping: AtomicBool::new(false),
        });
        let s = shared.clone();
        let stager = std::thread::Builder::new()
            .name("stage-stager".into())
            .spawn(move || stager(&s))?;
        let s = shared.clone();
        let acceptor = std::thread::Builder::new()
            .name("stage-accept".into())
            .spawn(move || acceptor(&s, listener))?;
        Ok(Stage {
            shared,
            local,
            acceptor: Some(acceptor),
            stager: Some(stager),
        })
    }

    /// The bound front address.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    pub fn config(&self) -> &StageConfig {
        &self.shared.cfg
    }

    /// Current counters.
    pub fn counters(&self) -> StageCounters {
        snapshot(&self.shared)
    }

    /// Stops accepting, releases everything still buffered (a final burst), waits up to
    /// `bound + 1 s` for outstanding responses, closes all connections and joins every thread.
    pub fn shutdown(mut self) -> StageCounters {
        self.stop();
        snapshot(&self.shared)
    }

    fn stop(&mut self) {
        let Some(acceptor) = self.acceptor.take() else {
            return;
        };
        let sh = &self.shared;
        sh.stopping.store(true, Ordering::SeqCst);
        // Wake the blocking accept.
        let wake = if self.local.ip().is_unspecified() {
            SocketAddr::new(
                if self.local.is_ipv4() {
                    std::net::Ipv4Addr::LOCALHOST.into()
                } else {
                    std::net::Ipv6Addr::LOCALHOST.into()
                },
                self.local.port(),
            )
        } else {
            self.local
        };
        let _ = TcpStream::connect_timeout(&wake, Duration::from_secs(1));
        let _ = acceptor.join();
        release(sh, Instant::now(), Kind::Final);
        let deadline = Instant::now() + sh.cfg.bound + Duration::from_secs(1);
        while Instant::now() < deadline && live_conns(sh).iter().any(|c| busy(c)) {
            std::thread::sleep(Duration::from_millis(5));
        }
        for c in live_conns(sh) {
            close_conn(sh, &c, false);
        }
        {
            let mut g = lock(&sh.global);
            g.stop_stager = true;
            sh.stager_cv.notify_all();
        }
        if let Some(s) = self.stager.take() {
            let _ = s.join();
        }
        let threads = std::mem::take(&mut lock(&sh.global).threads);
        for t in threads {
            let _ = t.join();
        }
    }
}

impl Drop for Stage {
    fn drop(&mut self) {
        self.stop();
    }
}

fn live_conns(sh: &Shared) -> Vec<Arc<Conn>> {
    lock(&sh.global)
        .live
        .iter()
        .filter_map(Weak::upgrade)
        .collect()
}

fn busy(c: &Conn) -> bool {
    let st = lock(&c.state);
    // `buffered_bytes` covers staged, released and being-written requests (it drops only after
    // the write, by when they are in flight).
    !st.closed && (st.buffered_bytes > 0 || (st.tracking && !st.inflight.is_empty()))
}

fn snapshot(sh: &Shared) -> StageCounters {
    let c = &sh.counters;
    let (ewma, dev, guard) = {
        let e = lock(&sh.est);
        (e.mean_us(), e.deviation_us(), e.guard().as_secs_f64() * 1e6)
    };
    let released = get(&c.requests_released);
    let accepted = get(&c.connections_accepted);
    let (periodic, early, fin) = (
        get(&c.bursts_periodic),
        get(&c.bursts_early),
        get(&c.bursts_final),
    );
    StageCounters {
        connections_accepted: accepted,
        connections_rejected: get(&c.connections_rejected),
        connections_active: accepted.saturating_sub(get(&c.connections_closed)),
        requests_staged: get(&c.requests_staged),
        requests_released: released,
        opaque_chunks: get(&c.opaque_chunks),
        opaque_connections: get(&c.opaque_connections),
        bursts: periodic + early + fin,
        bursts_periodic: periodic,
        bursts_early: early,
        bursts_final: fin,
        burst_max_requests: get(&c.burst_max_requests),
        held_mean_us: if released == 0 {
            0.0
        } else {
            get(&c.held_sum_us) as f64 / released as f64
        },
        held_max_us: get(&c.held_max_us),
        responses: get(&c.responses),
        interim_responses: get(&c.interim_responses),
        service_ewma_us: ewma,
        service_dev_us: dev,
        guard_us: guard,
        backend_connects: get(&c.backend_connects),
        backend_connect_failures: get(&c.backend_connect_failures),
        backend_failures: get(&c.backend_failures),
        backend_closed_idle: get(&c.backend_closed_idle),
        requests_failed: get(&c.requests_failed),
        requests_dropped: get(&c.requests_dropped),
        client_disconnects_mid_request: get(&c.client_disconnects_mid_request),
        client_protocol_errors: get(&c.client_protocol_errors),
        client_write_errors: get(&c.client_write_errors),
        response_framing_lost: get(&c.response_framing_lost),
        unmatched_responses: get(&c.unmatched_responses),
        bytes_from_clients: get(&c.bytes_from_clients),
        bytes_to_clients: get(&c.bytes_to_clients),
    }
}

fn spawn_conn_thread(
    sh: &Arc<Shared>,
    name: &str,
    f: impl FnOnce() + Send + 'static,
) -> io::Result<()> {
    let h = std::thread::Builder::new()
        .name(name.into())
        .stack_size(CONN_STACK)
        .spawn(f)?;
    let mut g = lock(&sh.global);
    g.threads.retain(|t| !t.is_finished());
    g.threads.push(h);
    Ok(())
}

fn acceptor(sh: &Arc<Shared>, listener: TcpListener) {
    loop {
        let accepted = listener.accept();
        if sh.stopping.load(Ordering::SeqCst) {
            return;
        }
        let (client, _) = match accepted {
            Ok(x) => x,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => {
                // Out of descriptors or similar: back off briefly instead of spinning.
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        let _ = client.set_nodelay(true);
        let _ = client.set_write_timeout(Some(Duration::from_secs(30)));
        let c = &sh.counters;
        let active = get(&c.connections_accepted).saturating_sub(get(&c.connections_closed));
        if active >= sh.cfg.max_connections as u64 {
            add(&c.connections_rejected, 1);
            let mut client = client;
            let _ = client.write_all(&error_reply(
                sh.cfg.protocol,
                ErrorKind::Unavailable,
                1,
                "too many connections",
            ));
            continue;
        }
        if let Err(e) = start_conn(sh, client) {
            eprintln!("preheat stage: cannot start a connection: {e}");
        }
    }
}

fn start_conn(sh: &Arc<Shared>, client: TcpStream) -> io::Result<()> {
    let reader_stream = client.try_clone()?;
    let conn = Arc::new(Conn {
        client,
        state: Mutex::new(ConnState {
            tracking: true,
            ..ConnState::default()
        }),
        cv: Condvar::new(),
    });
    add(&sh.counters.connections_accepted, 1);
    {
        let mut g = lock(&sh.global);
        g.live.retain(|w| w.strong_count() > 0);
        g.live.push(Arc::downgrade(&conn));
    }
    let (s, c) = (sh.clone(), conn.clone());
    spawn_conn_thread(sh, "stage-client", move || {
        client_reader(&s, &c, reader_stream)
    })?;
    let (s, c) = (sh.clone(), conn.clone());
    if let Err(e) = spawn_conn_thread(sh, "stage-writer", move || writer(&s, &c)) {
        close_conn(sh, &conn, true);
        return Err(e);
    }
    Ok(())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Periodic,
    Early,
    Final,
}

/// The stager: sleeps until the current phase's burst (or the early-release point) and releases.
fn stager(sh: &Shared) {
    let mut g = lock(&sh.global);
    loop {
        if g.stop_stager {
            return;
        }
        let (Some(phase_start), Some(oldest)) = (g.phase_start, g.oldest) else {
            g = sh.stager_cv.wait(g).unwrap_or_else(|e| e.into_inner());
            continue;
        };
        let guard = lock(&sh.est).guard();
        let periodic_at = phase_start + sh.cfg.period;
        let early_at = oldest + sh.cfg.bound.saturating_sub(guard);
        let (at, kind) = if early_at < periodic_at {
            (early_at, Kind::Early)
        } else {
            (periodic_at, Kind::Periodic)
        };
        let now = Instant::now();
        if now >= at {
            drop(g);
            release(sh, now, kind);
            g = lock(&sh.global);
        } else {
            g = sh
                .stager_cv
                .wait_timeout(g, at - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

/// Moves every staged request to its connection's writer.
fn release(sh: &Shared, now: Instant, kind: Kind) {
    let mut g = lock(&sh.global);
    let conns = std::mem::take(&mut g.pending);
    g.phase_start = None;
    g.oldest = None;
    let mut n = 0u64;
    let mut held_sum = 0u64;
    let mut held_max = 0u64;
    for c in conns {
        let mut st = lock(&c.state);
        if st.staged.is_empty() {
            continue;
        }
        while let Some(r) = st.staged.pop_front() {
            let held = now.saturating_duration_since(r.arrival).as_micros() as u64;
            held_sum += held;
            held_max = held_max.max(held);
            n += 1;
            st.released.push_back(r);
        }
        c.cv.notify_all();
    }
    drop(g);
    if n == 0 {
        return;
    }
    let c = &sh.counters;
    add(
        match kind {
            Kind::Periodic => &c.bursts_periodic,
            Kind::Early => &c.bursts_early,
            Kind::Final => &c.bursts_final,
        },
        1,
    );
    add(&c.requests_released, n);
    add(&c.held_sum_us, held_sum);
    c.held_max_us.fetch_max(held_max, Ordering::Relaxed);
    c.burst_max_requests.fetch_max(n, Ordering::Relaxed);
}

/// Buffers one request (or unframed chunk); false if the connection is closed.
fn stage(sh: &Shared, conn: &Arc<Conn>, req: Req, opaque: bool) -> bool {
    let now = Instant::now();
    let mut g = lock(&sh.global);
    let mut st = lock(&conn.state);
    if st.closed {
        add(&sh.counters.requests_dropped, 1);
        return false;
    }
    if st.staged.is_empty() {
        g.pending.push(conn.clone());
    }
    let arrival = req.arrival;
    st.buffered_bytes += req.bytes.len();
    st.staged.push_back(req);
    drop(st);
    add(
        if opaque {
            &sh.counters.opaque_chunks
        } else {
            &sh.counters.requests_staged
        },
        1,
    );
    if g.phase_start.is_none() {
        g.phase_start = Some(now);
    }
    if !matches!(g.oldest, Some(o) if o <= arrival) {
        g.oldest = Some(arrival);
        sh.stager_cv.notify_all();
    }
    true
}
