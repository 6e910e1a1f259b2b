//! The network side of preheat (paper §3.2, "Network Packet Prediction"): a Fastpass-like
//! central arbiter that allocates timeslots to senders and, as the paper's extension, announces
//! each future packet to its receiver together with the target port, so the receiver can preheat
//! the working set of the server behind that port before the packet arrives.
//!
//! ```text
//!   sender host                    arbiter                         receiver host
//!   Sender::request ──Demand──▶   Gate (MAC, age, replay, rate)
//!                                 Allocator (per-slot matching)
//!          ◀──Allocation── send_at ──────────Announce──────────▶  Receiver::recv (preheatd)
//!   Sender::wait_until(send_at)                                    ──▶ agent trigger socket
//!   sends the packet ─────────────────────────────────────────────▶ arrives at arrival_ns
//! ```
//!
//! | module | what |
//! |---|---|
//! | [`wire`] | authenticated datagram format (HMAC-SHA256), replay window, rate limiter, [`wire::Gate`] |
//! | [`alloc`] | pure timeslot allocator: greedy maximal matching per slot, FIFO (Fastpass §3) |
//! | [`arbiter`] | the arbiter's UDP loop |
//! | [`sender`] | client library for senders: request a slot, fail open, wait for the slot |
//! | [`receiver`] | what the receiver daemon (`preheatd`) uses to receive announcements |
//!
//! The byte layout and the security and failure rules are specified in `PROTOCOL.md` next to
//! this crate's `Cargo.toml`.
//!
//! **Time base.** Every time on the wire is `CLOCK_MONOTONIC` nanoseconds ([`now_ns`]). All
//! hosts of our tests share one kernel (loopback or network namespaces), so they share that
//! clock. A real deployment needs the hosts' clocks synchronized to the arbiter's (PTP, as
//! Fastpass assumes) and would carry the PTP-disciplined clock (e.g. `CLOCK_TAI`) in these
//! fields; see `PROTOCOL.md`, "Time".
#![forbid(unsafe_code)]

pub mod alloc;
pub mod arbiter;
pub mod receiver;
pub mod sender;
pub mod wire;

use std::net::Ipv4Addr;

/// A host: its IPv4 address as a big-endian `u32` ([`Ipv4Addr::to_bits`]).
pub type HostId = u32;

/// The [`HostId`] of an IPv4 address.
pub fn host_id(ip: Ipv4Addr) -> HostId {
    ip.to_bits()
}

/// The IPv4 address of a [`HostId`].
pub fn host_ip(id: HostId) -> Ipv4Addr {
    Ipv4Addr::from_bits(id)
}

/// `CLOCK_MONOTONIC` in nanoseconds: the time base of every time on the wire.
#[inline]
pub fn now_ns() -> u64 {
    preheat_engine::time::now_ns()
}

/// Receive one datagram on `sock` with a deadline that is honoured to within tens of µs.
///
/// `SO_RCVTIMEO` (what `set_read_timeout` sets) counts in kernel jiffies (1–10 ms), so a plain
/// read timeout can overshoot a short deadline by a jiffy. Long waits block with a read timeout
/// that ends a margin before the deadline; the rest polls non-blockingly with short sleeps.
/// `deadline_ns == None` blocks until a datagram arrives. Returns `Ok(None)` at the deadline.
pub(crate) fn recv_until(
    sock: &std::net::UdpSocket,
    nonblocking: &mut bool,
    buf: &mut [u8],
    deadline_ns: Option<u64>,
) -> std::io::Result<Option<(usize, std::net::SocketAddr)>> {
    use std::io::ErrorKind;
    use std::time::Duration;
    /// Longer than one jiffy at HZ=100, so a coarse read timeout never passes the deadline.
    const COARSE_MARGIN_NS: u64 = 11_000_000;
    const POLL_SLEEP_NS: u64 = 20_000;
    loop {
        let want_nonblocking;
        let mut timeout = None;
        match deadline_ns {
            None => want_nonblocking = false,
            Some(d) => {
                let now = now_ns();
                if now >= d {
                    // One last non-blocking look so a datagram already queued is not missed.
                    want_nonblocking = true;
                } else if d - now > COARSE_MARGIN_NS + 1_000_000 {
                    want_nonblocking = false;
                    timeout = Some(Duration::from_nanos(d - now - COARSE_MARGIN_NS));
                } else {
                    want_nonblocking = true;
                }
            }
        }
        if want_nonblocking != *nonblocking {
            sock.set_nonblocking(want_nonblocking)?;
            *nonblocking = want_nonblocking;
        }
        if !want_nonblocking {
            sock.set_read_timeout(timeout)?;
        }
        match sock.recv_from(buf) {
            Ok(r) => return Ok(Some(r)),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                if let Some(d) = deadline_ns {
                    let now = now_ns();
                    if now >= d {
                        return Ok(None);
                    }
                    if want_nonblocking {
                        std::thread::sleep(Duration::from_nanos((d - now).min(POLL_SLEEP_NS)));
                    }
                }
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_id_is_big_endian_ipv4() {
        assert_eq!(host_id(Ipv4Addr::new(10, 0, 0, 1)), 0x0a00_0001);
        assert_eq!(host_ip(0x7f00_0001), Ipv4Addr::LOCALHOST);
    }
}
