//! Client library for senders (paper §3.2: "the sender requests a time slot to send the
//! packet"): send a [`Demand`] naming destination host *and port*, wait for the matching
//! [`Allocation`]s, then send at the granted slot.
//!
//! **Fail-open.** The arbiter is an optimisation, never a dependency: if it does not answer
//! within the timeout, or cannot be reached, [`Sender::request`] returns
//! [`Grant::Unscheduled`] and the caller sends at once (its packet is then simply not
//! announced, so the receiver is not preheated).

use crate::wire::{self, Allocation, Counters, Demand, Gate, Key, Msg, SeqGen, KIND_ALLOCATION};
use crate::{now_ns, HostId};
use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::time::Duration;

/// The answer to [`Sender::request`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grant {
    /// Send the first packet at `send_at_ns` (`CLOCK_MONOTONIC`); the runs of a multi-packet
    /// demand are in [`Sender::last_allocations`].
    Scheduled { send_at_ns: u64 },
    /// No slot: send at once (fail-open).
    Unscheduled { reason: &'static str },
}

/// What a [`Sender`] saw.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SenderCounters {
    /// Requests answered with a slot.
    pub scheduled: u64,
    /// Requests answered [`Grant::Unscheduled`] for any reason (timeouts + arbiter errors +
    /// invalid requests).
    pub unscheduled: u64,
    /// Unscheduled because no (complete) allocation arrived in time.
    pub timeouts: u64,
    /// Unscheduled because the arbiter could not be reached (socket errors, ICMP unreachable).
    pub arbiter_errors: u64,
    /// Authenticated allocations that matched no outstanding request (late answers).
    pub stray: u64,
    /// Admission counters for datagrams from the arbiter.
    pub gate: Counters,
}

/// A sender's connection to the arbiter.
#[derive(Debug)]
pub struct Sender {
    sock: UdpSocket,
    nonblocking: bool,
    gate: Gate,
    my_id: HostId,
    timeout: Duration,
    seq: SeqGen,
    next_flow: u64,
    last: Vec<Allocation>,
    counters: SenderCounters,
}

impl Sender {
    /// A UDP socket connected to `arbiter` (so only the arbiter's datagrams reach it).
    /// `my_id` is this host's [`HostId`]; `timeout` bounds every [`Sender::request`].
    pub fn new(
        arbiter: SocketAddr,
        key: Key,
        my_id: HostId,
        timeout: Duration,
    ) -> io::Result<Sender> {
        let local: SocketAddr = match arbiter {
            SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
            SocketAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
        };
        let sock = UdpSocket::bind(local)?;
        sock.connect(arbiter)?;
        // No rate limit (the arbiter is trusted once authenticated); an answer can be as old
        // as the timeout and still be useful.
        let gate = Gate::new(key, f64::INFINITY, 0.0, max_age_for(timeout))
            .accept_only(&[KIND_ALLOCATION]);
        Ok(Sender {
            sock,
            nonblocking: false,
            gate,
            my_id,
            timeout,
            seq: SeqGen::new(),
            // Random start so flows of a restarted sender never match a stale allocation.
            next_flow: rand::random::<u64>() >> 1,
            last: Vec::new(),
            counters: SenderCounters::default(),
        })
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.sock.local_addr()
    }

    pub fn my_id(&self) -> HostId {
        self.my_id
    }

    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
        self.gate.set_max_age_ns(max_age_for(timeout));
    }

    pub fn counters(&self) -> SenderCounters {
        SenderCounters {
            gate: *self.gate.counters(),
            ..self.counters
        }
    }

    /// The allocations (runs of consecutive slots) of the last scheduled request, in the
    /// order they arrived. Empty after an unscheduled one.
    pub fn last_allocations(&self) -> &[Allocation] {
        &self.last
    }

    /// Ask for `packets` slots to `dst:dst_port` and wait up to the timeout for all of them.
    /// Returns the first slot; fails open (see the module docs). If only some runs arrived in
    /// time, the first is still granted and the rest of the packets are the caller's to send
    /// unscheduled (see [`Sender::last_allocations`]).
    pub fn request(&mut self, dst: HostId, dst_port: u16, packets: u16) -> Grant {
        self.last.clear();
        if packets == 0 {
            return self.unscheduled("zero packets requested");
        }
        let deadline =
            now_ns().saturating_add(u64::try_from(self.timeout.as_nanos()).unwrap_or(u64::MAX));
        let flow = self.next_flow;
        self.next_flow = self.next_flow.wrapping_add(1);
        let now = now_ns();
        let d = Demand {
            dst,
            dst_port,
            packets,
            flow,
        };
        let bytes = self
            .gate
            .seal(self.my_id, self.seq.next_seq(), now, &Msg::Demand(d));
        if self.sock.send(&bytes).is_err() {
            self.counters.arbiter_errors += 1;
            return self.unscheduled("arbiter unreachable");
        }
        let mut got: u32 = 0;
        let mut buf = [0u8; 512];
        loop {
            match crate::recv_until(&self.sock, &mut self.nonblocking, &mut buf, Some(deadline)) {
                Ok(Some((n, _))) => {
                    let Some((_, Msg::Allocation(a))) = self.gate.admit(&buf[..n], now_ns()) else {
                        continue;
                    };
                    if a.flow != flow || a.dst != dst || a.dst_port != dst_port {
                        self.counters.stray += 1;
                        continue;
                    }
                    self.last.push(a);
                    got += u32::from(a.slots);
                    if got >= u32::from(packets) {
                        break;
                    }
                }
                Ok(None) => {
                    if self.last.is_empty() {
                        self.counters.timeouts += 1;
                        return self.unscheduled("no allocation before the timeout");
                    }
                    break;
                }
                Err(_) => {
                    self.counters.arbiter_errors += 1;
                    self.last.clear();
                    return self.unscheduled("arbiter unreachable");
                }
            }
        }
        self.counters.scheduled += 1;
        let send_at_ns = self.last.iter().map(|a| a.send_at_ns).min().unwrap_or(0);
        Grant::Scheduled { send_at_ns }
    }

    fn unscheduled(&mut self, reason: &'static str) -> Grant {
        self.counters.unscheduled += 1;
        Grant::Unscheduled { reason }
    }

    /// Wait until `send_at_ns` ([`wait_until`]).
    pub fn wait_until(&self, send_at_ns: u64) {
        wait_until(send_at_ns)
    }
}

fn max_age_for(timeout: Duration) -> u64 {
    u64::try_from(timeout.as_nanos())
        .unwrap_or(u64::MAX)
        .max(wire::DEFAULT_MAX_AGE_NS)
}

/// Sleep until about 300 µs before `send_at_ns` (`CLOCK_MONOTONIC`), then spin until it.
/// Returns at once if the time has passed. The margin covers the timer-wakeup lag of a thread
/// on an idle (v)CPU, measured at ~30 µs after ≤ 1 ms of idle and ≥ 150 µs after 10 ms on our
/// KVM guests: with a 50 µs margin senders missed their slots by tens to hundreds of µs.
pub fn wait_until(send_at_ns: u64) {
    const SPIN_NS: u64 = 300_000;
    loop {
        let now = now_ns();
        if now >= send_at_ns {
            return;
        }
        let left = send_at_ns - now;
        if left > SPIN_NS {
            std::thread::sleep(Duration::from_nanos(left - SPIN_NS));
        } else {
            std::hint::spin_loop();
        }
    }
}
