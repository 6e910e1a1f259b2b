//! Connections this process serves: the probe's and `replay`'s loopback connections must reach
//! the server thread of *this* process.
//!
//! A prefork server (lighttpd with `server.max-worker`, Apache prefork, a Python preforking
//! server) has several worker processes accepting from one listening socket; each has its own
//! agent (the fork child handler starts one, with sockets named after the child's pid). A
//! connection the agent of worker A opens may be accepted by worker B: A's probe would then time
//! reloads in A while B serves the request, and A's warm-up would warm B. So a connection is
//! kept only once a request sent on it was *served here*: this process's busy periods of the
//! port grew while it was answered (the same evidence the CLI uses to find the serving process;
//! nothing else sends requests while the CLI records or configures). Otherwise it is closed and
//! another one opened — a kernel hands new connections to waiting workers in turn (blocking
//! `accept` waiters are woken first-in first-out; epoll waiters race), so a few attempts reach
//! this process if it accepts at all. The master process of a prefork server never does: there
//! every attempt fails and the error says so.
//!
//! Where every attempt goes to another worker, the CLI hands the agent its own connection,
//! which this process serves (`ProbeAdopt`, [`adopt_served`]; the descriptor arrives over the
//! control socket, `preheat_engine::fdpass`).
//!
//! A server that closes the connection after every reply (HTTP/1.0 like Python's
//! `http.server`, `Connection: close`) has no persistent connection: [`Served::stream`] is `None`,
//! and the probe then opens a fresh connection for each measured request ([`fresh_exchange`]);
//! `replay` then warms up on a fresh connection each time ([`crate::fresh`]), as it does where
//! only other processes of the server answer (a blocking prefork worker busy with its client's
//! connection: [`NotHere::answered_elsewhere`]).

use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use preheat_model::proto::ReplayVia;

use crate::{sys, track};

/// Connections tried before concluding this process does not serve the port.
const ATTEMPTS: u32 = 24;
/// How long a served request's busy period gets to end (the serving thread waits again).
const SERVED_WAIT: Duration = Duration::from_millis(50);
/// How long after a reply a closing server gets to close the connection.
const CLOSE_WAIT_MS: i32 = 20;
/// Reply buffer of the verifying exchange.
const REPLY_MAX: usize = 1 << 20;
const REPLY_TIMEOUT_NS: u64 = 2_000_000_000;

/// A connection whose first request this process served.
pub(super) struct Served {
    /// Non-blocking, no Nagle; `None` if the server closed it after the reply (it closes every
    /// connection after its reply).
    pub stream: Option<TcpStream>,
}

/// Why no connection served here was found.
pub(super) struct NotHere {
    pub message: String,
    /// Every exchange was answered, by another process of the server (its sibling workers).
    pub answered_elsewhere: bool,
}

/// Open a loopback connection to `port`, exchange `request` (reply ending with `until`) on it,
/// and keep it only if this process served that request (see the module docs).
pub(super) fn connect_served_here(
    port: u16,
    request: &[u8],
    until: &[u8],
) -> Result<Served, String> {
    connect_served(port, None, request, until).map_err(|e| e.message)
}

/// Where a connection to `port` goes, for messages: `127.0.0.1:PORT`, or the address and the
/// network namespace it is opened in.
pub(super) fn describe(port: u16, via: Option<&ReplayVia>) -> String {
    match via {
        None => format!("127.0.0.1:{port}"),
        Some(v) => format!("{}:{port} from the network namespace {}", v.addr, v.netns),
    }
}

/// [`connect_served_here`] from `via` (`None`: this process's loopback), saying whether other
/// processes answered.
pub(super) fn connect_served(
    port: u16,
    via: Option<&ReplayVia>,
    request: &[u8],
    until: &[u8],
) -> Result<Served, NotHere> {
    let failed = |message: String| NotHere {
        message,
        answered_elsewhere: false,
    };
    let mut reply = vec![0u8; REPLY_MAX];
    let mut elsewhere = 0;
    for _ in 0..ATTEMPTS {
        let before = track::port_busy_periods(port);
        let st = open(port, via).map_err(failed)?;
        super::cycle::exchange(st.as_raw_fd(), request, until, &mut reply, REPLY_TIMEOUT_NS)
            .map_err(|e| {
                failed(format!(
                    "a new connection to {} was not answered as configured ({e}): \
                 the reply does not end with the configured bytes, or the server closed the \
                 connection instead of answering, or every worker is busy serving another \
                 connection (workers that serve one connection at a time)",
                    describe(port, via)
                ))
            })?;
        if !served_since(port, before) {
            elsewhere += 1;
            continue;
        }
        let closes = peer_closes(st.as_raw_fd());
        return Ok(Served {
            stream: (!closes).then_some(st),
        });
    }
    Err(NotHere {
        message: format!(
            "none of {ATTEMPTS} connections to {} was served by this process (pid \
             {}; {elsewhere} answered by another one): it does not accept the port's \
             connections (a prefork master), or not while it serves another one (a worker that \
             serves one connection at a time)",
            describe(port, via),
            sys::getpid()
        ),
        answered_elsewhere: elsewhere == ATTEMPTS,
    })
}

/// A connection a caller passed to this agent (`ProbeAdopt`), kept as [`connect_served_here`]
/// keeps its own: only if `request` sent on it is served by this process, and only if the
/// server does not close it after the reply. Its flags are left as the caller set them (the
/// exchange sends and reads with `MSG_DONTWAIT`).
pub(super) fn adopt_served(
    fd: std::os::fd::OwnedFd,
    port: u16,
    request: &[u8],
    until: &[u8],
) -> Result<TcpStream, String> {
    let st = TcpStream::from(fd);
    match st.peer_addr() {
        Ok(a) if a.port() == port => {}
        Ok(a) => {
            return Err(format!(
                "the connection passed to the agent goes to {a}, not to port {port}"
            ))
        }
        Err(e) => {
            return Err(format!(
                "the descriptor passed to the agent is no TCP connection: {e}"
            ))
        }
    }
    let mut reply = vec![0u8; REPLY_MAX];
    let before = track::port_busy_periods(port);
    super::cycle::exchange(st.as_raw_fd(), request, until, &mut reply, REPLY_TIMEOUT_NS).map_err(
        |e| format!("the connection passed to the agent was not answered as configured ({e})"),
    )?;
    if !served_since(port, before) {
        return Err(format!(
            "the connection passed to the agent is not served by this process (pid {})",
            sys::getpid()
        ));
    }
    if peer_closes(st.as_raw_fd()) {
        return Err("the server closed the connection passed to the agent after its reply".into());
    }
    Ok(st)
}

/// One exchange on a fresh connection (servers that close every connection): connect, send,
/// read the reply. `Ok(false)`: it was answered, but by another process.
pub(super) fn fresh_exchange(
    port: u16,
    request: &[u8],
    until: &[u8],
    reply: &mut [u8],
) -> Result<bool, String> {
    let before = track::port_busy_periods(port);
    let st = open(port, None)?;
    super::cycle::exchange(st.as_raw_fd(), request, until, reply, REPLY_TIMEOUT_NS)?;
    drop(st);
    Ok(served_since(port, before))
}

/// A connection to `port` on this process's loopback, or from `via` (opened in its network
/// namespace, see [`sys::in_netns`]).
fn open(port: u16, via: Option<&ReplayVia>) -> Result<TcpStream, String> {
    let connect = |addr: SocketAddr| TcpStream::connect_timeout(&addr, Duration::from_secs(1));
    let st = match via {
        None => connect(SocketAddr::from(([127, 0, 0, 1], port))),
        Some(v) => {
            sys::in_netns(&v.netns, || connect(SocketAddr::new(v.addr, port))).and_then(|r| r)
        }
    }
    .map_err(|e| format!("connection to {}: {e}", describe(port, via)))?;
    st.set_nodelay(true).map_err(|e| e.to_string())?;
    st.set_nonblocking(true).map_err(|e| e.to_string())?;
    Ok(st)
}

/// Whether this process's busy periods of `port` grew past `before` (waiting up to
/// [`SERVED_WAIT`] for the serving thread to finish its busy period).
fn served_since(port: u16, before: u64) -> bool {
    let t0 = Instant::now();
    loop {
        if track::port_busy_periods(port) > before {
            return true;
        }
        if t0.elapsed() >= SERVED_WAIT {
            return false;
        }
        std::thread::sleep(Duration::from_micros(100));
    }
}

/// Whether the peer closes `fd` (nothing more to read) within [`CLOSE_WAIT_MS`] of its reply.
fn peer_closes(fd: std::os::fd::RawFd) -> bool {
    let mut p = [libc::pollfd {
        fd,
        events: libc::POLLIN | libc::POLLRDHUP,
        revents: 0,
    }];
    if !matches!(sys::poll(&mut p, CLOSE_WAIT_MS), Ok(n) if n > 0) {
        return false;
    }
    let r = p[0].revents;
    if r & (libc::POLLRDHUP | libc::POLLHUP) != 0 {
        return true;
    }
    let mut b = [0u8; 1];
    matches!(sys::recv_nonblocking(fd, &mut b), Ok(0))
}
