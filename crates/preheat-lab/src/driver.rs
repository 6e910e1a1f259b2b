//! One request of a workload, per protocol (paper §4, Table 1: the request whose response time
//! is measured). INTERFACE FIXED BY THE LEAD: keep the public signatures.
//!
//! Every driver sends one request at a time on one connection and reads the *whole* reply,
//! framed by the protocol's own length fields (never by searching for a terminator inside the
//! data):
//!
//! * memcached text: `get KEY\r\n` → `VALUE KEY FLAGS LEN\r\n<LEN bytes>\r\nEND\r\n` or
//!   `END\r\n` (miss);
//! * redis RESP: `*2 $3 GET $n KEY` → bulk string `$LEN\r\n<LEN bytes>\r\n` or `$-1\r\n` (miss);
//! * HTTP/1.1: `GET PATH` with keep-alive → status line, headers, then a `Content-Length` body,
//!   a `Transfer-Encoding: chunked` body (decoded), or a body up to the end of the connection;
//! * MySQL/MariaDB: one TPC-C-like transaction ([`crate::tpcc`]) through the `mysql` crate.
//!
//! [`Wait::Spin`] makes the socket non-blocking and busy-polls it, so the measured latency does
//! not contain the client's own (v)CPU wakeup; [`Wait::Block`] blocks in `read`. [`Wait::Epoll`]
//! is a mode of the load engine's event loop (wait in `epoll_wait`, then read: see
//! [`crate::load`]); a driver used synchronously through [`Driver::request`] (e.g. by
//! `preheat demo`) treats it as [`Wait::Block`]: same socket setup, a blocking `read`. The `mysql` crate only does blocking I/O, so a MySQL driver always
//! blocks ([`Wait::Spin`] and [`Wait::Epoll`] are accepted here and treated as [`Wait::Block`];
//! the load engine refuses [`Wait::Epoll`] for MySQL, which has no multiplexed path).
//!
//! **Multiplexed use** (several connections on one client thread, like wrk `-t T -c C`):
//! [`Driver::send_request`] writes a request, [`Driver::poll_reply`] reads what has arrived
//! without blocking and returns the outcome once the reply is complete, and [`Driver::raw_fd`]
//! gives the socket for readiness (epoll). Memcached, redis and HTTP implement them in both wait
//! modes (the socket is switched to non-blocking for this path, and back for
//! [`Driver::request`]); the same length-based parsers frame the reply: a parse that runs out of
//! bytes stops, and the next poll parses the reply again from its start (replies are small).
//! MySQL does not implement them (the defaults return a "not supported" error).
//!
//! Errors: `Err` from [`Driver::request`] means the connection is unusable (I/O error, the peer
//! closed it, a reply that breaks the framing, no complete reply within [`REPLY_TIMEOUT`]);
//! a complete but wrong reply (other value, miss, error reply, HTTP status ≠ 200, SQL error) is
//! `Ok` with `ok == false`.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::ops::Range;
use std::os::fd::{AsRawFd, RawFd};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

/// Wire protocol of a server under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    /// memcached text protocol (`get KEY`); the bundled preheat-kv speaks it too.
    Memcached,
    /// redis RESP (`GET KEY`).
    Redis,
    /// HTTP/1.1 GET with keep-alive.
    Http,
    /// The MySQL/MariaDB protocol: TPC-C-like transactions (see [`crate::tpcc`]).
    Mysql,
}

impl Protocol {
    /// The name used on the command line and in JSON ("memcached", "mysql", ...).
    pub fn name(self) -> &'static str {
        match self {
            Protocol::Memcached => "memcached",
            Protocol::Redis => "redis",
            Protocol::Http => "http",
            Protocol::Mysql => "mysql",
        }
    }
}

/// How a client waits for its reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Wait {
    /// Busy-poll a non-blocking socket: the latency excludes the client's own (v)CPU wakeup.
    /// Not available for MySQL (the `mysql` crate blocks): treated as `Block` there.
    Spin,
    /// Block in the kernel: with one thread per connection a blocking `read` on the one socket;
    /// on the load engine's multiplexed path (threads < connections) `epoll_wait`, then read.
    Block,
    /// Wait for readiness in `epoll_wait` and then read, as event-loop clients (memcaslap, wrk,
    /// redis-benchmark) do: the load engine always runs its event loop for it, even with one
    /// connection on one thread. A driver used synchronously ([`Driver::request`]) treats it as
    /// `Block`. Not for MySQL in the load engine (no multiplexed path).
    Epoll,
}

/// What to request. `key`: memcached/redis key, or HTTP path; ignored for MySQL.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkloadSpec {
    pub protocol: Protocol,
    pub key: String,
    /// Expected value (memcached/redis) or body (HTTP); checked on every reply when set.
    pub expect: Option<Vec<u8>>,
    /// MySQL only: the TPC-C-like database and scale.
    pub tpcc: Option<crate::tpcc::TpccConfig>,
}

/// How long a driver waits for a whole reply (and for `connect`).
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(10);

/// The key the memcached and redis warm-up requests ask for; it is never stored, so the reply
/// is a short, fixed miss.
pub const WARMUP_KEY: &str = "__preheat_warmup__";

/// The HTTP warm-up file the nginx plan writes into its site ...
pub const HTTP_WARMUP_PATH: &str = "/preheat-warmup.txt";
/// ... and its fixed content (16 bytes, so the whole body is the reply suffix).
pub const HTTP_WARMUP_BODY: &[u8] = b"preheat warm-up\n";

/// Longest reply suffix used for `until` (besides the protocol's own line end).
const UNTIL_TAIL: usize = 16;
/// Longest protocol line (memcached reply line, RESP header, HTTP status line or header).
const MAX_LINE: usize = 64 * 1024;
/// Largest value or body a driver accepts (a bigger length field is treated as a broken reply).
const MAX_BODY: usize = 64 << 20;
/// Most HTTP header lines in one response.
const MAX_HEADERS: usize = 128;

impl WorkloadSpec {
    /// The raw request and the exact reply suffix the agent uses for its own requests: the
    /// `replay` warm-up strategy (an idempotent request) and the flush+reload probe (the measured
    /// request itself). `None` where no fixed byte exchange exists (MySQL needs a session), and
    /// for redis and HTTP without `expect` (their replies have no fixed suffix otherwise).
    ///
    /// The agent reads until its buffer *ends with* `until`, so `until` is always an exact
    /// suffix of the whole reply that no shorter prefix of that reply ends with:
    /// * memcached: `END\r\n` (a hit's value is followed by `\r\nEND\r\n`, a miss is `END\r\n`);
    /// * redis: the last ≤16 bytes of the value plus `\r\n`; a value shorter than 16 bytes
    ///   takes as much of the bulk header as keeps the suffix at 18 bytes (at most the whole
    ///   reply), because `\r\n` also ends the header `$LEN\r\n` and e.g. `1\r\n` would match
    ///   `$1\r\n` before the value arrived;
    /// * HTTP: the last ≤16 bytes of the body (the headers end before the body starts).
    pub fn raw_exchange(&self) -> Option<RawExchange> {
        match self.protocol {
            Protocol::Memcached => Some(RawExchange {
                request: format!("get {}\r\n", self.key).into_bytes(),
                until: b"END\r\n".to_vec(),
                replay: format!("get {WARMUP_KEY}\r\n").into_bytes(),
                replay_until: b"END\r\n".to_vec(),
            }),
            Protocol::Redis => {
                let value = self.expect.as_ref()?;
                let mut reply = format!("${}\r\n", value.len()).into_bytes();
                reply.extend_from_slice(value);
                reply.extend_from_slice(b"\r\n");
                Some(RawExchange {
                    request: resp_get(self.key.as_bytes()),
                    until: tail(&reply, UNTIL_TAIL + 2).to_vec(),
                    replay: resp_get(WARMUP_KEY.as_bytes()),
                    replay_until: b"$-1\r\n".to_vec(),
                })
            }
            Protocol::Http => {
                let body = self.expect.as_ref()?;
                if body.is_empty() {
                    return None;
                }
                Some(RawExchange {
                    request: http_get(&http_path(&self.key)),
                    until: tail(body, UNTIL_TAIL).to_vec(),
                    replay: http_get(HTTP_WARMUP_PATH),
                    replay_until: tail(HTTP_WARMUP_BODY, UNTIL_TAIL).to_vec(),
                })
            }
            Protocol::Mysql => None,
        }
    }
}

/// A fixed request and the bytes its reply ends with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawExchange {
    pub request: Vec<u8>,
    pub until: Vec<u8>,
    /// An idempotent warm-up request for the `replay` strategy and its reply suffix.
    pub replay: Vec<u8>,
    pub replay_until: Vec<u8>,
}

/// The result of one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    /// What was sent ("get", "GET", "new-order", ...), for per-request records.
    pub kind: &'static str,
    /// The reply was complete and correct (false: wrong value, SQL error, HTTP status != 200).
    pub ok: bool,
}

/// A connected client that sends one request at a time and reads the whole reply.
pub trait Driver: Send {
    /// Send one request and read its whole reply. `Err`: the connection is unusable (the caller
    /// reconnects); `Ok` with `ok == false`: a wrong reply.
    fn request(&mut self) -> Result<Outcome>;
    fn protocol(&self) -> Protocol;

    /// Multiplexed use: send one request whole, without waiting for the reply (the reply is
    /// collected with [`Driver::poll_reply`]; one request outstanding at a time). `Err`: the
    /// connection is unusable, or the protocol has no multiplexed path.
    fn send_request(&mut self) -> Result<()> {
        bail!("{}", not_multiplexed(self.protocol()))
    }

    /// Multiplexed use: read what has arrived without blocking; `Some` once the reply to the
    /// request sent last is complete, `None` while it is not. `Err` as for
    /// [`Driver::request`] (including no complete reply within [`REPLY_TIMEOUT`] of the send).
    fn poll_reply(&mut self) -> Result<Option<Outcome>> {
        bail!("{}", not_multiplexed(self.protocol()))
    }

    /// Multiplexed use: the socket to watch for readability; `None` when the protocol has no
    /// multiplexed path.
    fn raw_fd(&self) -> Option<RawFd> {
        None
    }
}

/// The error of a protocol without the non-blocking, multiplexed path.
fn not_multiplexed(p: Protocol) -> String {
    format!(
        "multiplexed connections (several per client thread) are not supported by the {} \
         driver; use one thread per connection",
        p.name()
    )
}

/// A parse that ran out of received bytes in polling mode: not an error, the reply is
/// incomplete (the poll parses it again from its start when more has arrived).
#[derive(Debug)]
struct Incomplete;

impl std::fmt::Display for Incomplete {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the reply is not complete yet")
    }
}

impl std::error::Error for Incomplete {}

/// Connect a driver for `w` to `addr`. Errors name the address. [`Wait::Epoll`] sets the socket
/// up as [`Wait::Block`] does (its [`Driver::request`] blocks in `read`; the epoll wait is the
/// load engine's, around [`Driver::send_request`] / [`Driver::poll_reply`]). For
/// [`Protocol::Mysql`], `wait` is ignored: the `mysql` crate blocks, so the driver always
/// behaves as [`Wait::Block`].
pub fn connect(addr: SocketAddr, w: &WorkloadSpec, wait: Wait) -> Result<Box<dyn Driver>> {
    match w.protocol {
        Protocol::Memcached => {
            check_memcached_key(&w.key)?;
            let conn = Conn::open(addr, wait)?;
            Ok(Box::new(MemcachedDriver {
                request: format!("get {}\r\n", w.key).into_bytes(),
                key: w.key.clone().into_bytes(),
                expect: w.expect.clone(),
                conn,
            }))
        }
        Protocol::Redis => {
            let conn = Conn::open(addr, wait)?;
            Ok(Box::new(RedisDriver {
                request: resp_get(w.key.as_bytes()),
                expect: w.expect.clone(),
                conn,
            }))
        }
        Protocol::Http => {
            let path = http_path(&w.key);
            if path
                .bytes()
                .any(|b| b.is_ascii_whitespace() || b.is_ascii_control())
            {
                bail!("HTTP path {path:?} contains whitespace or control characters");
            }
            let conn = Conn::open(addr, wait)?;
            Ok(Box::new(HttpDriver {
                request: http_get(&path),
                expect: w.expect.clone(),
                conn,
                closed: false,
                body: Vec::new(),
            }))
        }
        Protocol::Mysql => {
            let default_cfg;
            let cfg = match &w.tpcc {
                Some(c) => c,
                None => {
                    default_cfg = crate::tpcc::TpccConfig::default();
                    &default_cfg
                }
            };
            let client = crate::tpcc::TpccClient::connect(addr, cfg)?;
            Ok(Box::new(MysqlDriver { client }))
        }
    }
}

/// The last `n` bytes of `b` (all of it when shorter).
fn tail(b: &[u8], n: usize) -> &[u8] {
    &b[b.len().saturating_sub(n)..]
}

/// A RESP `GET key` command.
fn resp_get(key: &[u8]) -> Vec<u8> {
    let mut r = format!("*2\r\n$3\r\nGET\r\n${}\r\n", key.len()).into_bytes();
    r.extend_from_slice(key);
    r.extend_from_slice(b"\r\n");
    r
}

/// The HTTP path of a workload key ("" → "/", "index.html" → "/index.html").
fn http_path(key: &str) -> String {
    if key.starts_with('/') {
        key.to_string()
    } else {
        format!("/{key}")
    }
}

/// An HTTP/1.1 keep-alive GET of `path`.
fn http_get(path: &str) -> Vec<u8> {
    format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: keep-alive\r\n\r\n").into_bytes()
}

fn check_memcached_key(key: &str) -> Result<()> {
    if key.is_empty()
        || key.len() > 250
        || key
            .bytes()
            .any(|b| b.is_ascii_whitespace() || b.is_ascii_control())
    {
        bail!(
            "invalid memcached key {key:?}: 1..250 bytes without whitespace or control characters"
        );
    }
    Ok(())
}

/// Busy-poll bookkeeping: after [`YIELD_AFTER`] without progress the poll also yields the
/// CPU each turn. The client never sleeps, but when the scheduler put the server on the
/// client's CPU (an unpinned client), the server then runs at once instead of after the
/// client's time slice (milliseconds). With nothing else runnable on the client's CPU a yield
/// returns at once (a syscall, ~1 µs), so a slow (cold) reply is still seen about as soon as
/// it arrives; the client's own wakeup stays out of the latency either way.
struct Spinner {
    turns: u32,
    started: Instant,
    yielding: bool,
}

/// See [`Spinner`].
const YIELD_AFTER: Duration = Duration::from_micros(200);

impl Spinner {
    fn new() -> Spinner {
        Spinner {
            turns: 0,
            started: Instant::now(),
            yielding: false,
        }
    }

    /// One turn; `true` when the reply deadline has passed.
    fn turn(&mut self, deadline: Instant) -> bool {
        self.turns = self.turns.wrapping_add(1);
        if self.turns & 63 == 0 {
            let now = Instant::now();
            if now > deadline {
                return true;
            }
            self.yielding = now - self.started > YIELD_AFTER;
        }
        if self.yielding {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
        false
    }
}

/// Whether `got` is the expected reply (anything is, without an expectation).
fn matches_expect(expect: &Option<Vec<u8>>, got: &[u8]) -> bool {
    match expect {
        Some(e) => e[..] == *got,
        None => true,
    }
}

/// Printable excerpt of a reply for error messages.
fn excerpt(b: &[u8]) -> String {
    let s = String::from_utf8_lossy(&b[..b.len().min(80)]);
    s.escape_debug().to_string()
}

// ---------------------------------------------------------------------------------------------
// The connection: one request out, a reply read into a buffer and parsed by ranges.

struct Conn {
    stream: TcpStream,
    addr: SocketAddr,
    spin: bool,
    /// Bytes received; `buf[pos..]` is not parsed yet. Compacted only when a request is sent, so
    /// ranges handed out while parsing one reply stay valid.
    buf: Vec<u8>,
    pos: usize,
    scratch: Box<[u8]>,
    deadline: Instant,
    /// The socket is in non-blocking mode (always with `spin`; on the multiplexed path too).
    nonblocking: bool,
    /// Polling: a read that would block ends the parse with [`Incomplete`].
    polling: bool,
}

impl Conn {
    fn open(addr: SocketAddr, wait: Wait) -> Result<Conn> {
        let stream = TcpStream::connect_timeout(&addr, REPLY_TIMEOUT)
            .with_context(|| format!("connecting to {addr}"))?;
        let setup = || -> std::io::Result<()> {
            stream.set_nodelay(true)?;
            match wait {
                Wait::Spin => stream.set_nonblocking(true)?,
                // Epoll: the synchronous path blocks like Block; the event loop switches the
                // socket to non-blocking itself.
                Wait::Block | Wait::Epoll => {
                    stream.set_read_timeout(Some(REPLY_TIMEOUT))?;
                    stream.set_write_timeout(Some(REPLY_TIMEOUT))?;
                }
            }
            Ok(())
        };
        setup().with_context(|| format!("configuring the connection to {addr}"))?;
        Ok(Conn {
            stream,
            addr,
            spin: wait == Wait::Spin,
            buf: Vec::with_capacity(16 * 1024),
            pos: 0,
            scratch: vec![0u8; 64 * 1024].into_boxed_slice(),
            deadline: Instant::now() + REPLY_TIMEOUT,
            nonblocking: wait == Wait::Spin,
            polling: false,
        })
    }

    /// Switch the socket's blocking mode (a syscall only when it changes).
    fn set_nonblocking(&mut self, nb: bool) -> Result<()> {
        if self.nonblocking != nb {
            self.stream
                .set_nonblocking(nb)
                .with_context(|| format!("configuring the connection to {}", self.addr))?;
            self.nonblocking = nb;
        }
        Ok(())
    }

    /// One blocking (or, with `spin`, busy-polling) exchange on the socket's own mode.
    fn for_request(&mut self) -> Result<()> {
        self.polling = false;
        self.set_nonblocking(self.spin)
    }

    /// Multiplexed path: send `data` whole on the non-blocking socket.
    fn send_nonblocking(&mut self, data: &[u8]) -> Result<()> {
        self.polling = false;
        self.set_nonblocking(true)?;
        self.send(data)
    }

    /// Multiplexed path: run `parse` over what has arrived (reading more without blocking). A
    /// parse that runs out of bytes is undone (`pos` back to the reply start) and gives `None`,
    /// unless the reply deadline has passed.
    fn poll<T>(
        this: &mut T,
        conn: fn(&mut T) -> &mut Conn,
        parse: fn(&mut T) -> Result<Outcome>,
    ) -> Result<Option<Outcome>> {
        let c = conn(this);
        c.set_nonblocking(true)?;
        c.polling = true;
        let start = c.pos;
        let r = parse(this);
        let c = conn(this);
        c.polling = false;
        match r {
            Ok(o) => Ok(Some(o)),
            Err(e) if e.downcast_ref::<Incomplete>().is_some() => {
                c.pos = start;
                if Instant::now() > c.deadline {
                    bail!("no complete reply from {} within {REPLY_TIMEOUT:?}", c.addr);
                }
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// Start a request: drop the parsed bytes, arm the reply deadline, send `data` whole.
    fn send(&mut self, data: &[u8]) -> Result<()> {
        self.buf.drain(..self.pos);
        self.pos = 0;
        self.deadline = Instant::now() + REPLY_TIMEOUT;
        let mut sent = 0;
        let mut spinner = Spinner::new();
        while sent < data.len() {
            match self.stream.write(&data[sent..]) {
                Ok(0) => bail!(
                    "{} closed the connection while we sent a request",
                    self.addr
                ),
                Ok(n) => sent += n,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if self.nonblocking && e.kind() == ErrorKind::WouldBlock => {
                    if spinner.turn(self.deadline) {
                        bail!("sending a request to {} timed out", self.addr);
                    }
                }
                Err(e) => {
                    return Err(e).with_context(|| format!("sending a request to {}", self.addr))
                }
            }
        }
        Ok(())
    }

    /// Receive at least one more byte (busy-polling or blocking); `false`: the peer closed the
    /// connection in order.
    fn read_more(&mut self) -> Result<bool> {
        let mut spinner = Spinner::new();
        loop {
            match self.stream.read(&mut self.scratch) {
                Ok(0) => return Ok(false),
                Ok(n) => {
                    self.buf.extend_from_slice(&self.scratch[..n]);
                    if !self.spin && !self.polling && Instant::now() > self.deadline {
                        bail!(
                            "no complete reply from {} within {REPLY_TIMEOUT:?}",
                            self.addr
                        );
                    }
                    return Ok(true);
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if self.polling && e.kind() == ErrorKind::WouldBlock => {
                    return Err(anyhow::Error::new(Incomplete));
                }
                Err(e) if self.spin && e.kind() == ErrorKind::WouldBlock => {
                    if spinner.turn(self.deadline) {
                        bail!(
                            "no complete reply from {} within {REPLY_TIMEOUT:?}",
                            self.addr
                        );
                    }
                }
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    bail!(
                        "no complete reply from {} within {REPLY_TIMEOUT:?}",
                        self.addr
                    )
                }
                Err(e) => {
                    return Err(e).with_context(|| format!("reading a reply from {}", self.addr))
                }
            }
        }
    }

    /// Receive at least one more byte; the end of the stream is an error.
    fn fill(&mut self) -> Result<()> {
        if !self.read_more()? {
            bail!(
                "{} closed the connection before the reply was complete",
                self.addr
            );
        }
        Ok(())
    }

    /// The next line without its `\r\n`.
    fn line(&mut self) -> Result<Range<usize>> {
        let mut searched = self.pos;
        loop {
            if let Some(i) = self.buf[searched..].windows(2).position(|w| w == b"\r\n") {
                let start = self.pos;
                let end = searched + i;
                self.pos = end + 2;
                return Ok(start..end);
            }
            if self.buf.len() - self.pos > MAX_LINE {
                bail!(
                    "a reply line from {} is longer than {MAX_LINE} bytes: {}",
                    self.addr,
                    excerpt(&self.buf[self.pos..])
                );
            }
            // A "\r" at the end may be the first half of the next "\r\n".
            searched = self.buf.len().saturating_sub(1).max(self.pos);
            self.fill()?;
        }
    }

    /// The next `n` bytes.
    fn take(&mut self, n: usize) -> Result<Range<usize>> {
        while self.buf.len() - self.pos < n {
            self.fill()?;
        }
        let start = self.pos;
        self.pos += n;
        Ok(start..start + n)
    }

    /// `n` bytes followed by `\r\n`; the range covers the `n` bytes only.
    fn take_crlf(&mut self, n: usize, what: &str) -> Result<Range<usize>> {
        let r = self.take(n + 2)?;
        if &self.buf[r.end - 2..r.end] != b"\r\n" {
            bail!(
                "{what} from {} is not followed by \\r\\n: the reply is out of step",
                self.addr
            );
        }
        Ok(r.start..r.end - 2)
    }

    /// Everything until the peer closes the connection.
    fn take_to_eof(&mut self) -> Result<Range<usize>> {
        let start = self.pos;
        while self.read_more()? {
            if self.buf.len() - start > MAX_BODY {
                bail!("a reply from {} is larger than {MAX_BODY} bytes", self.addr);
            }
        }
        self.pos = self.buf.len();
        Ok(start..self.buf.len())
    }
}

/// The [`Driver`] of a protocol that sends a fixed `request` on a [`Conn`] and reads the reply
/// with its own `parse` (memcached, redis, HTTP: they differ only in those two and, for HTTP,
/// in refusing to send on a connection the server closed).
macro_rules! conn_driver {
    ($name:ident, $proto:expr $(, before_send = $check:ident)?) => {
        impl Driver for $name {
            fn request(&mut self) -> Result<Outcome> {
                $(self.$check()?;)?
                self.conn.for_request()?;
                self.conn.send(&self.request)?;
                self.parse()
            }

            fn protocol(&self) -> Protocol {
                $proto
            }

            fn send_request(&mut self) -> Result<()> {
                $(self.$check()?;)?
                self.conn.send_nonblocking(&self.request)
            }

            fn poll_reply(&mut self) -> Result<Option<Outcome>> {
                Conn::poll(self, |d| &mut d.conn, Self::parse)
            }

            fn raw_fd(&self) -> Option<RawFd> {
                Some(self.conn.stream.as_raw_fd())
            }
        }
    };
}

// ---------------------------------------------------------------------------------------------
// memcached text protocol

struct MemcachedDriver {
    conn: Conn,
    request: Vec<u8>,
    key: Vec<u8>,
    expect: Option<Vec<u8>>,
}

conn_driver!(MemcachedDriver, Protocol::Memcached);

impl MemcachedDriver {
    /// Read one whole reply.
    fn parse(&mut self) -> Result<Outcome> {
        let mut ok = true;
        let mut values = 0u32;
        loop {
            let l = self.conn.line()?;
            let line = &self.conn.buf[l];
            if line == b"END" {
                break;
            }
            if let Some(rest) = line.strip_prefix(b"VALUE ") {
                // VALUE <key> <flags> <bytes> [<cas unique>]
                let mut fields = rest.split(|&b| b == b' ').filter(|f| !f.is_empty());
                let key = fields.next();
                let _flags = fields.next();
                let len = fields
                    .next()
                    .and_then(|f| std::str::from_utf8(f).ok())
                    .and_then(|f| f.parse::<usize>().ok())
                    .filter(|&n| n <= MAX_BODY);
                let Some(len) = len else {
                    bail!(
                        "malformed memcached VALUE line from {}: {}",
                        self.conn.addr,
                        excerpt(line)
                    );
                };
                if key != Some(self.key.as_slice()) {
                    ok = false;
                }
                let data = self.conn.take_crlf(len, "a memcached value")?;
                values += 1;
                if let Some(e) = &self.expect {
                    if self.conn.buf[data] != e[..] {
                        ok = false;
                    }
                }
                continue;
            }
            if line == b"ERROR"
                || line.starts_with(b"CLIENT_ERROR")
                || line.starts_with(b"SERVER_ERROR")
            {
                // A complete, but failed, reply.
                return Ok(Outcome {
                    kind: "get",
                    ok: false,
                });
            }
            bail!(
                "unexpected memcached reply line from {}: {}",
                self.conn.addr,
                excerpt(line)
            );
        }
        if values > 1 || (self.expect.is_some() && values == 0) {
            ok = false;
        }
        Ok(Outcome { kind: "get", ok })
    }
}

// ---------------------------------------------------------------------------------------------
// redis RESP

struct RedisDriver {
    conn: Conn,
    request: Vec<u8>,
    expect: Option<Vec<u8>>,
}

conn_driver!(RedisDriver, Protocol::Redis);

impl RedisDriver {
    /// Read one whole reply.
    fn parse(&mut self) -> Result<Outcome> {
        let l = self.conn.line()?;
        let line = &self.conn.buf[l];
        let ok = match line.first() {
            Some(b'$') => {
                let len = std::str::from_utf8(&line[1..])
                    .ok()
                    .and_then(|s| s.parse::<i64>().ok());
                match len {
                    Some(-1) => self.expect.is_none(), // a miss
                    Some(n) if n >= 0 && n as u64 <= MAX_BODY as u64 => {
                        let data = self.conn.take_crlf(n as usize, "a redis bulk string")?;
                        match &self.expect {
                            Some(e) => self.conn.buf[data] == e[..],
                            None => true,
                        }
                    }
                    _ => bail!(
                        "malformed redis bulk header from {}: {}",
                        self.conn.addr,
                        excerpt(line)
                    ),
                }
            }
            // An error reply, or a simple string/integer where GET returns a bulk string:
            // complete, but wrong.
            Some(b'-' | b'+' | b':') => false,
            _ => bail!(
                "unexpected redis reply from {} (expected a bulk string): {}",
                self.conn.addr,
                excerpt(line)
            ),
        };
        Ok(Outcome { kind: "GET", ok })
    }
}

// ---------------------------------------------------------------------------------------------
// HTTP/1.1

struct HttpDriver {
    conn: Conn,
    request: Vec<u8>,
    expect: Option<Vec<u8>>,
    /// The server ended the keep-alive connection with the last response.
    closed: bool,
    /// Decoded chunked body (reused).
    body: Vec<u8>,
}

/// How the body of a response is framed.
enum Framing {
    None,
    Length(usize),
    Chunked,
    ToEof,
}

impl HttpDriver {
    /// Read one response head: (status, framing, server closes after it).
    fn head(&mut self) -> Result<(u16, Framing, bool)> {
        let addr = self.conn.addr;
        let l = self.conn.line()?;
        let status_line = &self.conn.buf[l];
        let mut parts = status_line.splitn(3, |&b| b == b' ');
        let version = parts.next().unwrap_or_default();
        let status = parts
            .next()
            .and_then(|s| std::str::from_utf8(s).ok())
            .and_then(|s| s.parse::<u16>().ok());
        let (Some(status), true) = (status, version.starts_with(b"HTTP/1.")) else {
            bail!(
                "malformed HTTP status line from {addr}: {}",
                excerpt(status_line)
            );
        };
        let http10 = version == b"HTTP/1.0";
        let mut length: Option<usize> = None;
        let mut chunked = false;
        let mut close = http10;
        let mut headers = 0;
        loop {
            let l = self.conn.line()?;
            let line = &self.conn.buf[l];
            if line.is_empty() {
                break;
            }
            headers += 1;
            if headers > MAX_HEADERS {
                bail!("more than {MAX_HEADERS} header lines in an HTTP response from {addr}");
            }
            let Some(colon) = line.iter().position(|&b| b == b':') else {
                bail!("malformed HTTP header line from {addr}: {}", excerpt(line));
            };
            let name = &line[..colon];
            let value = String::from_utf8_lossy(&line[colon + 1..])
                .trim()
                .to_ascii_lowercase();
            if name.eq_ignore_ascii_case(b"content-length") {
                let n = value.parse::<usize>().ok().filter(|&n| n <= MAX_BODY);
                match (n, length) {
                    (Some(n), None) => length = Some(n),
                    (Some(n), Some(m)) if n == m => {}
                    _ => bail!(
                        "invalid or conflicting Content-Length from {addr}: {}",
                        excerpt(line)
                    ),
                }
            } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
                let codings: Vec<&str> = value.split(',').map(str::trim).collect();
                if codings.iter().any(|c| *c != "chunked") || codings.last() != Some(&"chunked") {
                    bail!(
                        "unsupported Transfer-Encoding from {addr}: {value:?} (only chunked is \
                         decoded)"
                    );
                }
                chunked = true;
            } else if name.eq_ignore_ascii_case(b"connection") {
                for token in value.split(',').map(str::trim) {
                    match token {
                        "close" => close = true,
                        "keep-alive" if http10 => close = false,
                        _ => {}
                    }
                }
            }
        }
        let framing = if (100..200).contains(&status) || status == 204 || status == 304 {
            Framing::None
        } else if chunked {
            // Transfer-Encoding overrides Content-Length (RFC 9112 §6.3).
            Framing::Chunked
        } else if let Some(n) = length {
            Framing::Length(n)
        } else {
            close = true;
            Framing::ToEof
        };
        Ok((status, framing, close))
    }

    /// Read a chunked body into `self.body`.
    fn chunked_body(&mut self) -> Result<()> {
        let addr = self.conn.addr;
        self.body.clear();
        loop {
            let l = self.conn.line()?;
            let line = &self.conn.buf[l];
            let size = line.split(|&b| b == b';').next().unwrap_or_default();
            let size = std::str::from_utf8(size)
                .ok()
                .and_then(|s| usize::from_str_radix(s.trim(), 16).ok())
                .filter(|&n| n <= MAX_BODY);
            let Some(size) = size else {
                bail!("malformed chunk size line from {addr}: {}", excerpt(line));
            };
            if size == 0 {
                break;
            }
            if self.body.len() + size > MAX_BODY {
                bail!("a chunked body from {addr} is larger than {MAX_BODY} bytes");
            }
            let data = self.conn.take_crlf(size, "an HTTP chunk")?;
            self.body.extend_from_slice(&self.conn.buf[data]);
        }
        // Trailer fields, up to the empty line.
        for _ in 0..=MAX_HEADERS {
            let l = self.conn.line()?;
            if l.is_empty() {
                return Ok(());
            }
        }
        bail!("more than {MAX_HEADERS} trailer lines in a chunked body from {addr}")
    }
}

conn_driver!(HttpDriver, Protocol::Http, before_send = check_open);

impl HttpDriver {
    fn check_open(&self) -> Result<()> {
        if self.closed {
            bail!(
                "{} closed the keep-alive connection after the last response",
                self.conn.addr
            );
        }
        Ok(())
    }

    /// Read one whole response (the state changes only once it is complete, so an
    /// incomplete parse can be repeated).
    fn parse(&mut self) -> Result<Outcome> {
        let (status, framing, close) = loop {
            let (status, framing, close) = self.head()?;
            if status == 101 {
                bail!("{} switched protocols (101) on a plain GET", self.conn.addr);
            }
            // Interim responses (100 Continue, 103 Early Hints) precede the real one.
            if !(100..200).contains(&status) {
                break (status, framing, close);
            }
        };
        let body_ok = match framing {
            Framing::None => matches_expect(&self.expect, b""),
            Framing::Length(n) => {
                let r = self.conn.take(n)?;
                matches_expect(&self.expect, &self.conn.buf[r])
            }
            Framing::Chunked => {
                self.chunked_body()?;
                matches_expect(&self.expect, &self.body)
            }
            Framing::ToEof => {
                let r = self.conn.take_to_eof()?;
                matches_expect(&self.expect, &self.conn.buf[r])
            }
        };
        if close {
            self.closed = true;
        }
        Ok(Outcome {
            kind: "GET",
            ok: status == 200 && body_ok,
        })
    }
}

// ---------------------------------------------------------------------------------------------
// MySQL: one TPC-C-like transaction per request

struct MysqlDriver {
    client: crate::tpcc::TpccClient,
}

impl Driver for MysqlDriver {
    fn request(&mut self) -> Result<Outcome> {
        let t = self.client.transaction()?;
        Ok(Outcome {
            kind: t.kind.name(),
            ok: t.ok,
        })
    }

    fn protocol(&self) -> Protocol {
        Protocol::Mysql
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) fn spec(protocol: Protocol, key: &str, expect: Option<&[u8]>) -> WorkloadSpec {
        WorkloadSpec {
            protocol,
            key: key.to_string(),
            expect: expect.map(<[u8]>::to_vec),
            tpcc: None,
        }
    }

    /// Every proper prefix of `reply` must not end with `until`; the whole reply must.
    fn exact_suffix(reply: &[u8], until: &[u8]) -> bool {
        reply.ends_with(until) && (0..reply.len()).all(|n| !reply[..n].ends_with(until))
    }

    #[test]
    fn protocol_names_are_the_json_names() {
        for p in [
            Protocol::Memcached,
            Protocol::Redis,
            Protocol::Http,
            Protocol::Mysql,
        ] {
            assert_eq!(serde_json::to_value(p).unwrap(), p.name());
        }
    }

    #[test]
    fn redis_until_is_an_exact_suffix() {
        for value in [&b"1"[..], b"", b"abc", b"0123456789abcdef0123", b"x\r\n"] {
            let ex = spec(Protocol::Redis, "k", Some(value))
                .raw_exchange()
                .unwrap();
            let mut reply = format!("${}\r\n", value.len()).into_bytes();
            reply.extend_from_slice(value);
            reply.extend_from_slice(b"\r\n");
            assert!(
                exact_suffix(&reply, &ex.until),
                "{value:?} → {:?}",
                ex.until
            );
            assert!(ex.until.len() <= 18);
        }
        assert!(spec(Protocol::Redis, "k", None).raw_exchange().is_none());
        let ex = spec(Protocol::Redis, "k", Some(b"v"))
            .raw_exchange()
            .unwrap();
        assert_eq!(ex.request, b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n");
        assert_eq!(ex.replay_until, b"$-1\r\n");
    }

    #[test]
    fn memcached_and_http_exchanges() {
        let ex = spec(Protocol::Memcached, "key:42", None)
            .raw_exchange()
            .unwrap();
        assert_eq!(ex.request, b"get key:42\r\n");
        assert_eq!(ex.until, b"END\r\n");
        assert_eq!(ex.replay, b"get __preheat_warmup__\r\n");
        let body = b"<html>hello, this is a longer body</html>\n";
        let ex = spec(Protocol::Http, "/index.html", Some(body))
            .raw_exchange()
            .unwrap();
        assert!(ex
            .request
            .starts_with(b"GET /index.html HTTP/1.1\r\nHost: 127.0.0.1\r\n"));
        assert_eq!(ex.until, &body[body.len() - 16..]);
        assert_eq!(ex.replay_until, HTTP_WARMUP_BODY);
        assert!(spec(Protocol::Http, "/", None).raw_exchange().is_none());
        assert!(spec(Protocol::Mysql, "", None).raw_exchange().is_none());
    }
}

#[cfg(test)]
mod split_reply_tests {
    //! The multiplexed path on replies that arrive one byte at a time: every poll before the
    //! last byte says "incomplete", the poll after it gives the outcome, and the connection
    //! stays usable for the next request.
    use super::tests::spec;
    use super::*;
    use std::net::TcpListener;
    use std::sync::mpsc;

    /// Serve `replies` (one per request, in order) one byte at a time, in lockstep with the
    /// test, which polls after every byte; returns the outcomes.
    fn exchange(w: &WorkloadSpec, wait: Wait, replies: &[&[u8]]) -> Vec<Outcome> {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let request_len = match w.protocol {
            Protocol::Memcached => format!("get {}\r\n", w.key).len(),
            Protocol::Redis => resp_get(w.key.as_bytes()).len(),
            Protocol::Http => http_get(&http_path(&w.key)).len(),
            Protocol::Mysql => unreachable!(),
        };
        let (wrote_tx, wrote_rx) = mpsc::channel::<()>();
        let (polled_tx, polled_rx) = mpsc::channel::<()>();
        let owned: Vec<Vec<u8>> = replies.iter().map(|r| r.to_vec()).collect();
        let server = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            s.set_nodelay(true).unwrap();
            for reply in owned {
                let mut req = vec![0u8; request_len];
                s.read_exact(&mut req).unwrap();
                for b in reply {
                    s.write_all(&[b]).unwrap();
                    wrote_tx.send(()).unwrap();
                    if polled_rx.recv().is_err() {
                        return;
                    }
                }
            }
        });
        let mut d = connect(addr, w, wait).unwrap();
        assert!(d.raw_fd().is_some());
        let mut outcomes = Vec::new();
        for reply in replies {
            d.send_request().unwrap();
            for i in 0..reply.len() {
                wrote_rx.recv().unwrap();
                // Give loopback a moment to deliver the byte.
                std::thread::sleep(Duration::from_micros(300));
                let mut got = d.poll_reply().unwrap();
                if i + 1 < reply.len() {
                    assert!(
                        got.is_none(),
                        "complete after {} of {} bytes",
                        i + 1,
                        reply.len()
                    );
                } else {
                    let t0 = Instant::now();
                    while got.is_none() && t0.elapsed() < Duration::from_secs(2) {
                        got = d.poll_reply().unwrap();
                    }
                    outcomes.push(got.expect("complete after the last byte"));
                }
                polled_tx.send(()).unwrap();
            }
        }
        drop(polled_tx);
        server.join().unwrap();
        outcomes
    }

    #[test]
    fn memcached_split_replies() {
        let w = spec(Protocol::Memcached, "k", Some(b"hello"));
        for wait in [Wait::Block, Wait::Spin] {
            let o = exchange(
                &w,
                wait,
                &[
                    b"VALUE k 0 5\r\nhello\r\nEND\r\n",
                    b"END\r\n",
                    b"VALUE k 0 5\r\nhellx\r\nEND\r\n",
                ],
            );
            assert_eq!(
                o.iter().map(|o| o.ok).collect::<Vec<_>>(),
                [true, false, false]
            );
            assert_eq!(o[0].kind, "get");
        }
    }

    #[test]
    fn redis_split_replies() {
        let w = spec(Protocol::Redis, "k", Some(b"a\r\nb"));
        let o = exchange(
            &w,
            Wait::Block,
            &[b"$4\r\na\r\nb\r\n", b"$-1\r\n", b"-ERR x\r\n"],
        );
        assert_eq!(
            o.iter().map(|o| o.ok).collect::<Vec<_>>(),
            [true, false, false]
        );
    }

    #[test]
    fn http_split_replies() {
        let w = spec(Protocol::Http, "/x", Some(b"hello world"));
        let o = exchange(
            &w,
            Wait::Block,
            &[
                b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\nhello world",
                b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n",
                b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n",
            ],
        );
        assert_eq!(
            o.iter().map(|o| o.ok).collect::<Vec<_>>(),
            [true, true, false]
        );
    }

    #[test]
    fn blocking_request_still_works_after_polling() {
        // One multiplexed exchange, then a plain request() on the same driver.
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut req = [0u8; 7];
            for _ in 0..2 {
                s.read_exact(&mut req).unwrap();
                s.write_all(b"END\r\n").unwrap();
            }
        });
        let mut d = connect(addr, &spec(Protocol::Memcached, "k", None), Wait::Block).unwrap();
        d.send_request().unwrap();
        let t0 = Instant::now();
        let mut got = None;
        while got.is_none() && t0.elapsed() < Duration::from_secs(2) {
            got = d.poll_reply().unwrap();
        }
        assert!(got.unwrap().ok);
        assert!(d.request().unwrap().ok);
        server.join().unwrap();
    }

    #[test]
    fn closed_connection_is_an_error_while_polling() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut req = [0u8; 7];
            s.read_exact(&mut req).unwrap();
            s.write_all(b"VALUE k 0 5\r\nhe").unwrap();
        });
        let mut d = connect(addr, &spec(Protocol::Memcached, "k", None), Wait::Spin).unwrap();
        d.send_request().unwrap();
        server.join().unwrap();
        let t0 = Instant::now();
        let err = loop {
            match d.poll_reply() {
                Ok(None) if t0.elapsed() < Duration::from_secs(2) => continue,
                Ok(o) => panic!("unexpected {o:?}"),
                Err(e) => break e,
            }
        };
        assert!(
            format!("{err:#}").contains("closed the connection"),
            "{err:#}"
        );
    }
}
