//! The receiving end of announcements (paper §3.2: "the schedule is also sent to all affected
//! receiver systems as an announcement of future network packets"). The receiver daemon
//! `preheatd` uses this to get authenticated [`NetAnnouncement`]s and hands them to the agent
//! of the server listening on the announced port.

use crate::now_ns;
use crate::wire::{Counters, Gate, Header, Key, Msg, NetAnnouncement, KIND_ANNOUNCE};
use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::time::Duration;

/// A bound announcement socket.
#[derive(Debug)]
pub struct Receiver {
    sock: UdpSocket,
    nonblocking: bool,
    gate: Gate,
    buf: Vec<u8>,
}

impl Receiver {
    /// Bind `addr` (usually `0.0.0.0:`[`crate::wire::DEFAULT_PREHEATD_PORT`]). Datagrams pass
    /// a [`Gate`] with the given per-sender rate limit and staleness bound.
    pub fn bind(
        addr: SocketAddr,
        key: Key,
        rate_per_s: f64,
        burst: f64,
        max_age_ns: u64,
    ) -> io::Result<Receiver> {
        let sock = UdpSocket::bind(addr)?;
        Ok(Receiver {
            sock,
            nonblocking: false,
            gate: Gate::new(key, rate_per_s, burst, max_age_ns).accept_only(&[KIND_ANNOUNCE]),
            buf: vec![0u8; 2048],
        })
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.sock.local_addr()
    }

    /// The next authenticated, fresh, non-replayed, not rate-limited Announce; everything else
    /// is dropped and counted in [`Receiver::counters`]. `Ok(None)` when `timeout` passes first
    /// (`None` waits forever; a zero timeout only looks at what is already queued).
    pub fn recv(
        &mut self,
        timeout: Option<Duration>,
    ) -> io::Result<Option<(Header, NetAnnouncement)>> {
        let deadline = timeout
            .map(|t| now_ns().saturating_add(u64::try_from(t.as_nanos()).unwrap_or(u64::MAX)));
        loop {
            let got =
                match crate::recv_until(&self.sock, &mut self.nonblocking, &mut self.buf, deadline)
                {
                    Ok(g) => g,
                    // Stray ICMP errors are not this socket's business.
                    Err(e)
                        if matches!(
                            e.kind(),
                            io::ErrorKind::ConnectionRefused | io::ErrorKind::ConnectionReset
                        ) =>
                    {
                        continue
                    }
                    Err(e) => return Err(e),
                };
            let Some((n, _from)) = got else {
                return Ok(None);
            };
            if let Some((h, Msg::Announce(a))) = self.gate.admit(&self.buf[..n], now_ns()) {
                return Ok(Some((h, a)));
            }
        }
    }

    pub fn counters(&self) -> &Counters {
        self.gate.counters()
    }
}
