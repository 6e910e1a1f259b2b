//! The client's own network path kept warm through the cold-making waits.
//!
//! Every mode's request leaves the same client, and only the server's state should differ
//! between the rows ([`crate::measure`]). But the cold-making steps make the *client* wait too —
//! 20 ms for `cold-idle`, the sweep and the gap after it for `cold-sweep` and the preheated
//! rows — while `hot` and `warm` send one lead after the priming request. A client that only
//! spins through those milliseconds comes out of them with its own transmit path cold, though
//! nothing touched its CPU: measured on the EPYC `haltpoll` host (2026-11-29, a spinning
//! client on CPU 0, preheat-kv on CPU 1, no sweep, 60 interleaved rounds), send → on the wire
//! (the kernel's transmit stamp) took 3.1 µs after a 0.2 ms wait, 7.8 µs after 5 ms and 26.6 µs
//! after 20 ms. A trace of one demo run (`perf`: syscalls, the loopback's transmit, scheduler
//! switches and interrupts on the client's CPU) showed nothing else run there between the
//! send and the transmit, which took 9–18 µs where it takes 3 µs after a short wait; and the
//! loopback's receive processing, which runs on the client's CPU too, reached the server
//! thread's wake-up 21 µs after the transmit (p50) after a wait of over 1.5 ms against 8 µs
//! after a short one. What evicts the client's path meanwhile is presumably the host's use of
//! its core (other vCPUs, a sibling thread): not measured. The paper's client is a machine of
//! its own whose path stays warm; that decay is no part of the server's cold start, yet it was
//! counted in every cold row, and no strategy on the server's side can remove it.
//!
//! So the client exercises its own path while it waits: a TCP connection to itself on the
//! loopback, one byte there and back every [`EVERY_NS`], until the wait ends and the lead begins.
//! The lead itself is the same plain spin in every mode, so the client's last traffic before
//! a send is one lead back in every row (the priming request in `hot` and `warm`, a ping in the
//! others). The same measurement with the pings: 2.7 µs after 5 ms and 3.8 µs after 20 ms;
//! in the traced demo run the receive path's 21 µs became 9 µs. Nothing reaches the server's
//! processes or its CPU: both ends are the client's, their softirqs run on the client's CPU.
//! What it cannot rule out on one machine: kernel code the server also runs may now be found
//! in the client's caches rather than in memory (it already could after a short wait).
//! Measured in the same runs, *serve* in cold-sweep (which runs on the server's CPU) did not
//! move beyond its noise.

use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use preheat_engine::time::now_ns;

/// How often the client pings itself while it waits.
pub(crate) const EVERY_NS: u64 = 50_000;

/// How long one ping may take before the connection counts as broken.
const PING_TIMEOUT: Duration = Duration::from_millis(100);

/// A loopback TCP connection whose both ends the client holds.
pub(crate) struct ClientWarmth {
    tx: TcpStream,
    rx: TcpStream,
    /// Pings sent (the demo reports them: `client_pings`).
    pub pings: u64,
}

impl ClientWarmth {
    /// Connect the client to itself on 127.0.0.1.
    pub(crate) fn new() -> Result<ClientWarmth> {
        let what = "the client's own warm-keeping connection on 127.0.0.1";
        let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).with_context(|| what.to_string())?;
        let tx = TcpStream::connect(l.local_addr()?).with_context(|| what.to_string())?;
        let (rx, _) = l.accept().with_context(|| what.to_string())?;
        for s in [&tx, &rx] {
            s.set_nodelay(true)?;
            s.set_nonblocking(true)?;
        }
        Ok(ClientWarmth { tx, rx, pings: 0 })
    }

    /// One byte out and back in.
    fn ping(&mut self) -> Result<()> {
        let t0 = now_ns();
        loop {
            match self.tx.write(b"p") {
                Ok(1) => break,
                Ok(_) => bail!("the client's warm-keeping connection closed"),
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(e) => return Err(e).context("pinging the client's own connection"),
            }
            self.check(t0)?;
        }
        let mut b = [0u8; 64];
        loop {
            match self.rx.read(&mut b) {
                Ok(0) => bail!("the client's warm-keeping connection closed"),
                Ok(_) => break,
                Err(e) if e.kind() == ErrorKind::WouldBlock => std::hint::spin_loop(),
                Err(e) => return Err(e).context("reading the client's own ping"),
            }
            self.check(t0)?;
        }
        self.pings += 1;
        Ok(())
    }

    fn check(&self, t0: u64) -> Result<()> {
        if now_ns().saturating_sub(t0) > PING_TIMEOUT.as_nanos() as u64 {
            bail!("the client's ping to itself took over {PING_TIMEOUT:?}");
        }
        Ok(())
    }

    /// Spin until `t_ns` (`CLOCK_MONOTONIC`), pinging every [`EVERY_NS`] meanwhile.
    pub(crate) fn until(&mut self, t_ns: u64) -> Result<()> {
        let mut next = 0;
        loop {
            let now = now_ns();
            if now >= t_ns {
                return Ok(());
            }
            if now >= next {
                self.ping()?;
                next = now + EVERY_NS;
            } else {
                std::hint::spin_loop();
            }
        }
    }

    /// A ping if the last was [`EVERY_NS`] ago or longer (for waits that poll something else).
    pub(crate) fn tick(&mut self, last: &mut u64) -> Result<()> {
        let now = now_ns();
        if now >= *last + EVERY_NS {
            self.ping()?;
            *last = now;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pings_itself_through_a_wait() {
        let mut w = ClientWarmth::new().unwrap();
        w.until(now_ns() + 2_000_000).unwrap();
        // The first at once, then at most one per 50 µs (fewer where the test's thread waits
        // for its CPU).
        assert!((1..=41).contains(&w.pings), "{} pings", w.pings);
        let mut last = 0;
        w.tick(&mut last).unwrap();
        w.tick(&mut last).unwrap();
        assert!(last > 0);
    }

    #[test]
    fn a_past_deadline_sends_nothing() {
        let mut w = ClientWarmth::new().unwrap();
        w.until(now_ns().saturating_sub(1)).unwrap();
        assert_eq!(w.pings, 0);
    }
}
