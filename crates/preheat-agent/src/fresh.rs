//! `replay` on a fresh loopback connection per warm-up, served by whichever of the server's
//! workers accepts it.
//!
//! # Why
//!
//! A prefork server whose workers serve one connection at a time (blocking `accept` and `read`:
//! Apache prefork, many Python and Ruby servers) cannot serve a persistent warm-up connection in
//! the worker that serves the client: that worker is busy reading the client's keep-alive
//! connection, and any connection the agent opens is accepted by an idle sibling (see
//! [`crate::control`]'s `served`). A persistent connection to the sibling would keep that worker
//! for the agent for good — one worker of the pool per configured agent. So such a port warms up
//! on a fresh connection each time: connect, send the warm-up request, and close once the reply
//! is complete, which sends the worker back to `accept`. The same holds for servers that close
//! every connection after the reply (HTTP/1.0, `Connection: close`), where no persistent
//! connection exists at all.
//!
//! What a sibling's warm-up warms for the worker that serves the real request: everything they
//! share — the code (the same file pages), the data created before the fork and not written
//! since (copy-on-write pages stay shared), the kernel's paths and the served files' page
//! cache — on the CPU the server runs on. What it cannot warm is the serving worker's own
//! written data; `lines` loads that from the worker's recorded set.
//!
//! # Lifecycle of one warm-up
//!
//! The worker takes a free slot, opens a non-blocking socket, connects to `127.0.0.1:port` (on
//! loopback the handshake completes within a bounded poll), sends the request and leaves the
//! fd in the slot. Slots are reaped — what arrived is read and matched against the reply's
//! terminator; a slot closes once the terminator was seen or the server closed its end, and is
//! abandoned (closed) once older than [`STALE_NS`] — by the next warm-up before it connects and
//! by the control thread every [`REAP_EVERY_MS`] while slots are open. A slot is never closed
//! while a reply may still be on its way (that would reset the connection under the server's
//! write), except when stale. All access goes through the owning `ReplayConn`'s `busy` claim.
//!
//! Not a hooked path, but the worker's: atomics and raw system calls only, no allocation.

#![deny(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects,
    clippy::unreachable,
    clippy::todo,
    clippy::unimplemented
)]

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicI32, AtomicU64, AtomicUsize, Ordering};

use crate::{fdreg, sys};

/// Warm-up connections that may be open at once (a reply not read yet).
pub const SLOTS: usize = 8;
/// A warm-up connection whose reply has not completed after this long is closed anyway.
pub const STALE_NS: u64 = 2_000_000_000;
/// How often the control thread reaps while warm-up connections are open.
pub const REAP_EVERY_MS: i32 = 20;
/// How long a connect may take to complete on loopback before the warm-up is given up.
const CONNECT_WAIT_NS: u64 = 1_000_000;

struct Slot {
    /// -1: free.
    fd: AtomicI32,
    /// Bytes of the terminator matched at the end of what was read so far.
    match_pos: AtomicUsize,
    opened_ns: AtomicU64,
}

impl Slot {
    const fn new() -> Slot {
        Slot {
            fd: AtomicI32::new(-1),
            match_pos: AtomicUsize::new(0),
            opened_ns: AtomicU64::new(0),
        }
    }
}

/// The open warm-up connections of one port. Callers hold the owning `ReplayConn`'s `busy`
/// claim for every method.
pub struct FreshConns {
    port: u16,
    slots: [Slot; SLOTS],
}

/// Why a warm-up was not sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WarmUpError {
    /// Every slot holds a connection whose reply is not complete yet.
    Full,
    /// socket/connect/send failed.
    Connect,
}

impl FreshConns {
    pub fn new(port: u16) -> FreshConns {
        FreshConns {
            port,
            slots: [const { Slot::new() }; SLOTS],
        }
    }

    /// Reap finished connections, then open one and send `request` on it.
    pub fn warm_up(&self, request: &[u8], until: &[u8], now_ns: u64) -> Result<(), WarmUpError> {
        self.reap(until, now_ns);
        let slot = self
            .slots
            .iter()
            .find(|s| s.fd.load(Ordering::Relaxed) < 0)
            .ok_or(WarmUpError::Full)?;
        let fd = connect_loopback(self.port).ok_or(WarmUpError::Connect)?;
        match sys::send_nonblocking(fd, request) {
            Ok(n) if n == request.len() => {
                slot.match_pos.store(0, Ordering::Relaxed);
                slot.opened_ns.store(now_ns, Ordering::Relaxed);
                slot.fd.store(fd, Ordering::Release);
                Ok(())
            }
            _ => {
                fdreg::close_own_fd(fd);
                Err(WarmUpError::Connect)
            }
        }
    }

    /// Read what arrived on every open connection; close those whose reply is complete (the
    /// terminator `until` seen; with an empty `until`, any reply), whose server closed them, or
    /// that are stale. Returns how many stay open.
    pub fn reap(&self, until: &[u8], now_ns: u64) -> usize {
        let mut open = 0usize;
        for s in &self.slots {
            let fd = s.fd.load(Ordering::Acquire);
            if fd < 0 {
                continue;
            }
            let stale = now_ns.saturating_sub(s.opened_ns.load(Ordering::Relaxed)) > STALE_NS;
            if read_done(s, fd, until) || stale {
                s.fd.store(-1, Ordering::Release);
                fdreg::close_own_fd(fd);
            } else {
                open = open.saturating_add(1);
            }
        }
        open
    }

    /// How many connections are open.
    pub fn open(&self) -> usize {
        self.slots
            .iter()
            .filter(|s| s.fd.load(Ordering::Relaxed) >= 0)
            .count()
    }

    /// Close every open connection (the port's replay is reconfigured or dropped).
    pub fn close_all(&self) {
        for s in &self.slots {
            let fd = s.fd.swap(-1, Ordering::AcqRel);
            fdreg::close_own_fd(fd);
        }
    }
}

/// Read what `fd` has; true once the reply is complete or the connection is over.
fn read_done(s: &Slot, fd: RawFd, until: &[u8]) -> bool {
    let mut buf = [0u8; 2048];
    let mut got = false;
    for _ in 0..64 {
        match sys::recv_nonblocking(fd, &mut buf) {
            Ok(0) => return true,
            Ok(n) => {
                got = true;
                let (pos, done) = scan_terminator(
                    until,
                    s.match_pos.load(Ordering::Relaxed),
                    buf.get(..n).unwrap_or(&[]),
                );
                if done > 0 {
                    return true;
                }
                s.match_pos.store(pos, Ordering::Relaxed);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                return got && until.is_empty();
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return true,
        }
    }
    false
}

/// Feed `data` to a match of the reply terminator `until` that had matched `pos` bytes: the
/// new position and how many terminators completed (the position restarts after each). The one
/// terminator scan of the agent's warm-ups, persistent ([`crate::worker`]) or fresh. An empty
/// `until` never completes.
pub fn scan_terminator(until: &[u8], mut pos: usize, data: &[u8]) -> (usize, u32) {
    let mut done = 0u32;
    if until.is_empty() {
        return (0, 0);
    }
    for &b in data {
        if until.get(pos) == Some(&b) {
            pos = pos.saturating_add(1);
            if pos == until.len() {
                pos = 0;
                done = done.saturating_add(1);
            }
        } else {
            pos = usize::from(until.first() == Some(&b));
        }
    }
    (pos, done)
}

/// A non-blocking, Nagle-free, registered TCP connection to `127.0.0.1:port`, established (or
/// `None`), through raw system calls (the agent's own traffic bypasses its hooks).
fn connect_loopback(port: u16) -> Option<RawFd> {
    // SAFETY: no pointers involved.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_socket,
            libc::AF_INET,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    };
    let fd = RawFd::try_from(fd).ok().filter(|f| *f >= 0)?;
    fdreg::register_fd(fd);
    let one: libc::c_int = 1;
    // SAFETY: `one` is a valid c_int for the call; an error leaves Nagle on, nothing else.
    unsafe {
        libc::syscall(
            libc::SYS_setsockopt,
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_NODELAY,
            &one as *const libc::c_int,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    let addr = preheat_engine::os::loopback_sockaddr_in(port);
    // SAFETY: `addr` is a valid sockaddr_in local and the length is its size.
    let r = unsafe {
        libc::syscall(
            libc::SYS_connect,
            fd,
            &addr as *const libc::sockaddr_in,
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        )
    };
    let established = r == 0
        || (sys::errno() == libc::EINPROGRESS && sys::wait_writable(fd, CONNECT_WAIT_NS) && {
            sys::socket_error(fd) == 0
        });
    if established {
        Some(fd)
    } else {
        fdreg::close_own_fd(fd);
        None
    }
}

#[cfg(test)]
#[allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::arithmetic_side_effects,
    clippy::indexing_slicing
)]
mod tests {
    use super::*;

    #[test]
    fn terminator_across_chunks() {
        let until = b"</html>\n";
        let (p, done) = scan_terminator(until, 0, b"abc</ht");
        assert_eq!(done, 0, "done too early");
        assert_eq!(p, 4);
        assert_eq!(scan_terminator(until, p, b"ml>\n").1, 1);
        assert_eq!(scan_terminator(until, 0, b"<</html>\n").1, 1);
        assert_eq!(scan_terminator(b"", 0, b"x"), (0, 0));
    }

    #[test]
    fn warm_up_reaches_a_server_and_closes_after_the_reply() {
        use std::io::{Read, Write};
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let f = FreshConns::new(port);
        let server = std::thread::spawn(move || {
            let mut served = 0;
            for _ in 0..3 {
                let (mut s, _) = l.accept().unwrap();
                let mut b = [0u8; 5];
                s.read_exact(&mut b).unwrap();
                assert_eq!(&b, b"ping\n");
                s.write_all(b"pong END\r\n").unwrap();
                // The warm-up's client closes once the reply is complete: EOF.
                assert_eq!(s.read(&mut b).unwrap(), 0);
                served += 1;
            }
            served
        });
        for _ in 0..3 {
            let now = preheat_engine::time::now_ns();
            f.warm_up(b"ping\n", b"END\r\n", now).unwrap();
            let t0 = std::time::Instant::now();
            while f.reap(b"END\r\n", preheat_engine::time::now_ns()) > 0 {
                assert!(t0.elapsed().as_secs() < 5, "reply never reaped");
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
        assert_eq!(server.join().unwrap(), 3);
        assert_eq!(f.open(), 0);
    }

    #[test]
    fn full_and_refused() {
        // Nobody listens on a port we just released: connect is refused.
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let f = FreshConns::new(port);
        assert_eq!(f.warm_up(b"x", b"y", 0), Err(WarmUpError::Connect));
        // A listener that never accepts still completes handshakes (backlog): slots fill up.
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let f = FreshConns::new(l.local_addr().unwrap().port());
        for _ in 0..SLOTS {
            f.warm_up(b"x", b"y", 1).unwrap();
        }
        assert_eq!(f.warm_up(b"x", b"y", 2), Err(WarmUpError::Full));
        // Stale ones are abandoned.
        assert_eq!(f.reap(b"y", 2 + STALE_NS + 1), 0);
        f.close_all();
        assert_eq!(f.open(), 0);
    }
}
