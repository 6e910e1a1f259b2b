//! The connection under the memcached, redis and HTTP drivers: one request out, the reply read
//! into a buffer and parsed by ranges (never by searching for a terminator inside the data),
//! blocking, busy-polling ([`Wait::Spin`]) or polled without blocking (the multiplexed path).

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::ops::Range;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use super::{Outcome, Stale, Wait, REPLY_TIMEOUT};

/// Longest protocol line (memcached reply line, RESP header, HTTP status line or header).
const MAX_LINE: usize = 64 * 1024;
/// Largest value or body a driver accepts (a bigger length field is treated as a broken reply).
pub(super) const MAX_BODY: usize = 64 << 20;

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
pub(super) fn matches_expect(expect: &Option<Vec<u8>>, got: &[u8]) -> bool {
    match expect {
        Some(e) => e[..] == *got,
        None => true,
    }
}

/// Printable excerpt of a reply for error messages.
pub(super) fn excerpt(b: &[u8]) -> String {
    let s = String::from_utf8_lossy(&b[..b.len().min(80)]);
    s.escape_debug().to_string()
}

pub(super) struct Conn {
    pub(super) stream: TcpStream,
    pub(super) addr: SocketAddr,
    spin: bool,
    /// Bytes received; `buf[pos..]` is not parsed yet. Compacted only when a request is sent, so
    /// ranges handed out while parsing one reply stay valid.
    pub(super) buf: Vec<u8>,
    pos: usize,
    scratch: Box<[u8]>,
    deadline: Instant,
    /// The socket is in non-blocking mode (always with `spin`; on the multiplexed path too).
    nonblocking: bool,
    /// Polling: a read that would block ends the parse with [`Incomplete`].
    polling: bool,
    /// Requests sent on this connection (a failure before any byte of the reply to any but the
    /// first is [`Stale`]).
    requests: u64,
    /// Part of the current reply has arrived: before reading more, acknowledge it at once
    /// ([`preheat_engine::os::tcp_quickack`]). A server that writes a reply in pieces with Nagle
    /// on (Python's `http.server` writes head and body separately) otherwise holds the rest
    /// until our kernel's delayed ACK (40 ms), and every reply would measure that timer.
    partial: bool,
    /// When this connection's sends reached the wire, once asked for ([`Conn::stamp_sends`]).
    stamps: preheat_engine::txstamp::SendStamps,
}

impl Conn {
    pub(super) fn open(addr: SocketAddr, wait: Wait) -> Result<Conn> {
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
            partial: false,
            requests: 0,
            stamps: Default::default(),
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
    pub(super) fn for_request(&mut self) -> Result<()> {
        self.polling = false;
        self.set_nonblocking(self.spin)
    }

    /// Multiplexed path: send `data` whole on the non-blocking socket.
    pub(super) fn send_nonblocking(&mut self, data: &[u8]) -> Result<()> {
        self.polling = false;
        self.set_nonblocking(true)?;
        self.send(data)
    }

    /// Multiplexed path: run `parse` over what has arrived (reading more without blocking). A
    /// parse that runs out of bytes is undone (`pos` back to the reply start) and gives `None`,
    /// unless the reply deadline has passed.
    pub(super) fn poll<T>(
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

    /// A transport failure of the current request: [`Stale`] when the connection served
    /// requests before and nothing of this reply has arrived, else `e` as it is.
    fn failure(&self, e: anyhow::Error) -> anyhow::Error {
        if self.requests > 1 && self.buf.is_empty() {
            anyhow::Error::new(Stale { addr: self.addr }).context(format!("{e:#}"))
        } else {
            e
        }
    }

    /// Start a request: drop the parsed bytes, arm the reply deadline, send `data` whole.
    pub(super) fn send(&mut self, data: &[u8]) -> Result<()> {
        self.buf.drain(..self.pos);
        self.pos = 0;
        self.deadline = Instant::now() + REPLY_TIMEOUT;
        self.requests += 1;
        self.partial = false;
        self.send_all(data).map_err(|e| self.failure(e))?;
        // Before the reply (see `SendStamps`).
        self.stamps.sent(self.stream.as_raw_fd());
        Ok(())
    }

    /// Ask the kernel to stamp this connection's sends as they reach the wire (software
    /// transmit stamps, [`preheat_engine::txstamp`]); false where it cannot.
    pub(super) fn stamp_sends(&mut self) -> bool {
        self.stamps.enable(self.stream.as_raw_fd())
    }

    /// When the last send reached the wire (`CLOCK_MONOTONIC` ns), where stamped.
    pub(super) fn sent_at_ns(&self) -> Option<u64> {
        self.stamps.last_ns()
    }

    fn send_all(&mut self, data: &[u8]) -> Result<()> {
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
        if self.partial {
            // Best effort: a socket that refuses only keeps delayed ACKs.
            let _ = preheat_engine::os::tcp_quickack(self.stream.as_raw_fd());
        }
        loop {
            match self.stream.read(&mut self.scratch) {
                Ok(0) => return Ok(false),
                Ok(n) => {
                    self.partial = true;
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

    /// The received bytes not parsed yet.
    pub(super) fn unparsed(&self) -> &[u8] {
        &self.buf[self.pos..]
    }

    /// Mark the next `n` unparsed bytes as parsed; returns their range in `buf`.
    pub(super) fn consume(&mut self, n: usize) -> Range<usize> {
        let start = self.pos;
        self.pos = (self.pos + n).min(self.buf.len());
        start..self.pos
    }

    /// Receive at least one more byte; the end of the stream is an error ([`Stale`] before the
    /// first byte of a reply on a connection that served requests).
    pub(super) fn fill(&mut self) -> Result<()> {
        match self.read_more() {
            Ok(true) => Ok(()),
            Ok(false) => Err(self.failure(anyhow::anyhow!(
                "{} closed the connection before the reply was complete",
                self.addr
            ))),
            Err(e) if e.downcast_ref::<Incomplete>().is_some() => Err(e),
            Err(e)
                if e.downcast_ref::<std::io::Error>().is_some_and(|io| {
                    matches!(
                        io.kind(),
                        ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted
                    )
                }) =>
            {
                Err(self.failure(e))
            }
            Err(e) => Err(e),
        }
    }

    /// The next line without its `\r\n`.
    pub(super) fn line(&mut self) -> Result<Range<usize>> {
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
    pub(super) fn take(&mut self, n: usize) -> Result<Range<usize>> {
        while self.buf.len() - self.pos < n {
            self.fill()?;
        }
        let start = self.pos;
        self.pos += n;
        Ok(start..start + n)
    }

    /// `n` bytes followed by `\r\n`; the range covers the `n` bytes only.
    pub(super) fn take_crlf(&mut self, n: usize, what: &str) -> Result<Range<usize>> {
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
    pub(super) fn take_to_eof(&mut self) -> Result<Range<usize>> {
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
    ($name:ident, $proto:expr $(, before_send = $check:ident, closing = $closing:ident)?) => {
        impl $crate::driver::Driver for $name {
            $(
                fn closing(&self) -> bool {
                    self.$closing
                }
            )?

            fn request(&mut self) -> ::anyhow::Result<$crate::driver::Outcome> {
                $(self.$check()?;)?
                self.conn.for_request()?;
                self.conn.send(&self.request)?;
                self.parse()
            }

            fn protocol(&self) -> $crate::driver::Protocol {
                $proto
            }

            fn send_request(&mut self) -> ::anyhow::Result<()> {
                $(self.$check()?;)?
                self.conn.send_nonblocking(&self.request)
            }

            fn poll_reply(&mut self) -> ::anyhow::Result<Option<$crate::driver::Outcome>> {
                $crate::driver::conn::Conn::poll(self, |d| &mut d.conn, Self::parse)
            }

            fn raw_fd(&self) -> Option<::std::os::fd::RawFd> {
                Some(::std::os::fd::AsRawFd::as_raw_fd(&self.conn.stream))
            }

            fn stamp_sends(&mut self) -> bool {
                self.conn.stamp_sends()
            }

            fn sent_at_ns(&self) -> Option<u64> {
                self.conn.sent_at_ns()
            }
        }
    };
}
pub(super) use conn_driver;
