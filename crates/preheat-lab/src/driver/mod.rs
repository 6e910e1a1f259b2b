//! One request of a workload, per protocol (paper §4, Table 1: the request whose response time
//! is measured).
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
//! `Ok` with `ok == false`. Two cases are the normal life of a keep-alive connection, not
//! failures, and real clients (wrk, curl) reconnect on them: the server said it closes the
//! connection after its last reply ([`Driver::closing`]: HTTP `Connection: close`, HTTP/1.0, a
//! body framed by the end of the connection), and a connection that already served requests
//! was closed by the server before any byte of the next reply ([`Stale`], e.g. a keep-alive
//! request limit or idle timeout without `Connection: close`). The load engine reopens the
//! connection for both and counts them as reconnects.
//!
//! # Files
//!
//! This file holds the protocol-independent types and [`connect`]; `conn` is the connection
//! under the memcached, redis and HTTP drivers (buffer, framing primitives, busy-poll, the
//! multiplexed poll); `memcached`, `redis` and `http` each hold one protocol's request and
//! reply parser on top of it; `mysql` wraps a [`crate::tpcc`] client. Dependencies run from
//! the protocol files to `conn` and to the types here, never back.

mod conn;
mod http;
pub use http::http_path;
mod memcached;
mod mysql;
mod redis;
#[cfg(test)]
mod split_reply_tests;

use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::time::Duration;

use anyhow::{bail, Result};
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
                request: memcached::get(&self.key),
                until: b"END\r\n".to_vec(),
                replay: memcached::get(WARMUP_KEY),
                replay_until: b"END\r\n".to_vec(),
            }),
            Protocol::Redis => {
                let value = self.expect.as_ref()?;
                let mut reply = format!("${}\r\n", value.len()).into_bytes();
                reply.extend_from_slice(value);
                reply.extend_from_slice(b"\r\n");
                Some(RawExchange {
                    request: redis::resp_get(self.key.as_bytes()),
                    until: tail(&reply, UNTIL_TAIL + 2).to_vec(),
                    replay: redis::resp_get(WARMUP_KEY.as_bytes()),
                    replay_until: b"$-1\r\n".to_vec(),
                })
            }
            Protocol::Http => {
                let body = self.expect.as_ref()?;
                if body.is_empty() {
                    return None;
                }
                Some(RawExchange {
                    request: http::http_get(&http::http_path(&self.key)),
                    until: tail(body, UNTIL_TAIL).to_vec(),
                    replay: http::http_get(HTTP_WARMUP_PATH),
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

/// The server closed a keep-alive connection that had served requests before any byte of the
/// next reply arrived (the request may be repeated on a fresh connection: it was not answered).
#[derive(Debug)]
pub struct Stale {
    pub addr: SocketAddr,
}

impl std::fmt::Display for Stale {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} closed the keep-alive connection before answering the next request",
            self.addr
        )
    }
}

impl std::error::Error for Stale {}

/// Whether `e` is a [`Stale`] connection (a reconnect, not a failure).
pub fn is_stale(e: &anyhow::Error) -> bool {
    e.downcast_ref::<Stale>().is_some()
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

    /// The server said it closes this connection after the reply just read (HTTP
    /// `Connection: close`, HTTP/1.0, a body framed by the end of the connection): the caller
    /// reconnects before the next request.
    fn closing(&self) -> bool {
        false
    }

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

    /// Ask the kernel to stamp this connection's requests as they reach the wire (the demo's
    /// *wire* stage); false where the driver cannot.
    fn stamp_sends(&mut self) -> bool {
        false
    }

    /// When the last request reached the wire (`CLOCK_MONOTONIC` ns), where stamped.
    fn sent_at_ns(&self) -> Option<u64> {
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

/// Connect a driver for `w` to `addr`. Errors name the address. [`Wait::Epoll`] sets the socket
/// up as [`Wait::Block`] does (its [`Driver::request`] blocks in `read`; the epoll wait is the
/// load engine's, around [`Driver::send_request`] / [`Driver::poll_reply`]). For
/// [`Protocol::Mysql`], `wait` is ignored: the `mysql` crate blocks, so the driver always
/// behaves as [`Wait::Block`].
pub fn connect(addr: SocketAddr, w: &WorkloadSpec, wait: Wait) -> Result<Box<dyn Driver>> {
    match w.protocol {
        Protocol::Memcached => memcached::connect(addr, w, wait),
        Protocol::Redis => redis::connect(addr, w, wait),
        Protocol::Http => http::connect(addr, w, wait),
        Protocol::Mysql => mysql::connect(addr, w),
    }
}

/// The last `n` bytes of `b` (all of it when shorter).
fn tail(b: &[u8], n: usize) -> &[u8] {
    &b[b.len().saturating_sub(n)..]
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
