//! The central arbiter (paper §3.2, Fastpass): receives [`Demand`]s, allocates timeslots
//! ([`crate::alloc`]), sends each sender its [`Allocation`]s and each receiver an
//! [`NetAnnouncement`] per allocated run of packets.
//!
//! Loop: block for a datagram (or poll while demand is backlogged); admit it through a
//! [`Gate`] (MAC, staleness, replay, rate); queue admitted demands. Whenever demand is pending
//! and the allocator's horizon is less than one window ahead of `now + lead_ns`, allocate a
//! window of slots starting at `now + lead_ns` (or at the horizon, if later), send the
//! Allocations to the UDP address each Demand came from and the Announcements to
//! `(dst IPv4, preheatd_port)`. `arrival_ns` = slot start + the configured link latency
//! estimate (default 0).
//!
//! **Time.** All times are `CLOCK_MONOTONIC` ns of the arbiter. In our tests every host shares
//! one kernel, hence one clock. A real deployment must synchronize the hosts' clocks to the
//! arbiter's (PTP, as Fastpass does; sub-µs offsets are needed since slots last ~1.2 µs at
//! 10 Gb/s) and put the synchronized clock (e.g. `CLOCK_TAI` disciplined by `phc2sys`) in
//! every time field; a receiver then interprets `arrival_ns` as "the first packet is on my
//! link at this instant of the common clock" and converts it to its own `CLOCK_MONOTONIC`
//! with the measured offset before handing it to the agent.

use crate::alloc::{self, Allocator};
use crate::wire::{
    self, Allocation, Counters, Demand, Gate, Key, Msg, NetAnnouncement, SeqGen, KIND_DEMAND,
    KIND_HELLO, ROLE_ARBITER,
};
use crate::{host_ip, now_ns, HostId};
use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr, SocketAddrV4, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Fastpass computes schedules this far ahead (the figure the paper uses).
pub const DEFAULT_LEAD_NS: u64 = 65_000;
/// Slots per allocation window by default.
pub const DEFAULT_WINDOW_SLOTS: usize = 32;
/// Demands the arbiter queues at most; more are dropped (their senders fail open).
pub const DEFAULT_MAX_PENDING: usize = 65_536;

/// Arbiter configuration. [`ArbiterConfig::new`] fills in the defaults.
#[derive(Debug, Clone)]
pub struct ArbiterConfig {
    /// UDP address to listen on (default port [`wire::DEFAULT_ARBITER_PORT`]).
    pub bind: SocketAddr,
    pub key: Key,
    /// How far ahead of now the first allocated slot starts (default 65 µs).
    pub lead_ns: u64,
    /// Slot length (default: 1500 B MTU on 10 Gb/s, [`alloc::slot_ns`]).
    pub slot_ns: u32,
    /// Port of the receivers' `preheatd` (default [`wire::DEFAULT_PREHEATD_PORT`]).
    pub preheatd_port: u16,
    /// Per-sender admission rate limit (datagrams/s) and burst.
    pub rate_per_s: f64,
    pub burst: f64,
    /// Staleness bound for incoming datagrams.
    pub max_age_ns: u64,
}

impl ArbiterConfig {
    pub fn new(bind: SocketAddr, key: Key) -> ArbiterConfig {
        ArbiterConfig {
            bind,
            key,
            lead_ns: DEFAULT_LEAD_NS,
            slot_ns: alloc::slot_ns(10_000_000_000, 1500),
            preheatd_port: wire::DEFAULT_PREHEATD_PORT,
            rate_per_s: wire::DEFAULT_RATE_PER_S,
            burst: wire::DEFAULT_BURST,
            max_age_ns: wire::DEFAULT_MAX_AGE_NS,
        }
    }
}

/// What the arbiter did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ArbiterStats {
    /// Demands queued for allocation.
    pub demands: u64,
    /// Allocation messages sent (one per run of consecutive slots).
    pub allocations: u64,
    /// Packets (slots) allocated.
    pub packets: u64,
    /// Announce messages sent to receivers.
    pub announcements: u64,
    /// Hello messages answered.
    pub hellos: u64,
    /// Authenticated demands dropped: same (sender, flow) already pending.
    pub duplicate_demands: u64,
    /// Authenticated demands dropped: queue full.
    pub queue_full: u64,
    /// Authenticated demands dropped: `dst` is 0.0.0.0 or 255.255.255.255.
    pub unusable_demands: u64,
    /// Datagrams that could not be sent.
    pub send_errors: u64,
    /// Admission counters of the arbiter's gate.
    pub gate: Counters,
}

/// The arbiter. Create with [`Arbiter::bind`], run with [`Arbiter::run_until`].
#[derive(Debug)]
pub struct Arbiter {
    cfg: ArbiterConfig,
    sock: UdpSocket,
    nonblocking: bool,
    gate: Gate,
    alloc: Allocator,
    /// (sender, flow) → where to send its Allocations and how many packets are still owed.
    reply_to: HashMap<(HostId, u64), (SocketAddr, u16)>,
    id: HostId,
    seq: SeqGen,
    link_latency_ns: u64,
    window_slots: usize,
    max_pending: usize,
    stats: ArbiterStats,
}

impl Arbiter {
    /// Bind the arbiter's socket. Its [`HostId`] (the `sender` of what it sends) is the bind
    /// address if that is a specific IPv4 address, else 0; see [`Arbiter::set_host_id`].
    pub fn bind(cfg: ArbiterConfig) -> io::Result<Arbiter> {
        let sock = UdpSocket::bind(cfg.bind)?;
        let id = match cfg.bind.ip() {
            IpAddr::V4(ip) if !ip.is_unspecified() => crate::host_id(ip),
            _ => 0,
        };
        let gate = Gate::new(cfg.key.clone(), cfg.rate_per_s, cfg.burst, cfg.max_age_ns)
            .accept_only(&[KIND_DEMAND, KIND_HELLO]);
        Ok(Arbiter {
            alloc: Allocator::new(cfg.slot_ns),
            cfg,
            sock,
            nonblocking: false,
            gate,
            reply_to: HashMap::new(),
            id,
            seq: SeqGen::new(),
            link_latency_ns: 0,
            window_slots: DEFAULT_WINDOW_SLOTS,
            max_pending: DEFAULT_MAX_PENDING,
            stats: ArbiterStats::default(),
        })
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.sock.local_addr()
    }

    /// Estimated sender-to-receiver latency added to each slot start to get `arrival_ns`
    /// (default 0).
    pub fn set_link_latency_ns(&mut self, ns: u64) {
        self.link_latency_ns = ns;
    }

    /// Slots per allocation window (default [`DEFAULT_WINDOW_SLOTS`]; at least 1).
    pub fn set_window_slots(&mut self, n: usize) {
        self.window_slots = n.max(1);
    }

    /// Maximum number of queued demands (default [`DEFAULT_MAX_PENDING`]).
    pub fn set_max_pending(&mut self, n: usize) {
        self.max_pending = n;
    }

    /// The `sender` field of the arbiter's messages.
    pub fn set_host_id(&mut self, id: HostId) {
        self.id = id;
    }

    pub fn config(&self) -> &ArbiterConfig {
        &self.cfg
    }

    pub fn stats(&self) -> ArbiterStats {
        ArbiterStats {
            gate: *self.gate.counters(),
            ..self.stats
        }
    }

    /// Serve until `stop` is set (checked at least every 10 ms).
    pub fn run_until(&mut self, stop: &AtomicBool) -> io::Result<()> {
        let mut buf = [0u8; 2048];
        const IDLE_WAIT_NS: u64 = 10_000_000;
        const BACKLOG_POLL_NS: u64 = 20_000;
        while !stop.load(Ordering::Relaxed) {
            // Wait for the first datagram: long when idle, short while demand is backlogged.
            let wait = if self.alloc.pending_demands() == 0 {
                IDLE_WAIT_NS
            } else {
                BACKLOG_POLL_NS
            };
            let deadline = now_ns() + wait;
            let mut got = self.recv(&mut buf, Some(deadline))?;
            // Then drain what else is queued, bounded so allocation is not starved.
            let mut drained = 0;
            while let Some((n, from)) = got {
                self.handle(&buf[..n], from);
                drained += 1;
                if drained >= 1024 {
                    break;
                }
                got = self.recv(&mut buf, Some(0))?;
            }
            self.allocate_due();
        }
        Ok(())
    }

    fn recv(
        &mut self,
        buf: &mut [u8],
        deadline: Option<u64>,
    ) -> io::Result<Option<(usize, SocketAddr)>> {
        match crate::recv_until(&self.sock, &mut self.nonblocking, buf, deadline) {
            Ok(r) => Ok(r),
            // ICMP errors from earlier sends surface here on some systems: not fatal.
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::ConnectionRefused | io::ErrorKind::ConnectionReset
                ) =>
            {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    fn handle(&mut self, bytes: &[u8], from: SocketAddr) {
        let Some((h, msg)) = self.gate.admit(bytes, now_ns()) else {
            return;
        };
        match msg {
            Msg::Demand(d) => self.queue(h.sender, d, from),
            Msg::Hello { .. } => {
                self.stats.hellos += 1;
                self.send(from, &Msg::Hello { role: ROLE_ARBITER });
            }
            // The gate only admits Demand and Hello.
            Msg::Allocation(_) | Msg::Announce(_) => {}
        }
    }

    fn queue(&mut self, src: HostId, d: Demand, from: SocketAddr) {
        if d.dst == 0 || d.dst == u32::MAX {
            self.stats.unusable_demands += 1;
            return;
        }
        if self.reply_to.contains_key(&(src, d.flow)) {
            self.stats.duplicate_demands += 1;
            return;
        }
        if self.alloc.pending_demands() >= self.max_pending {
            self.stats.queue_full += 1;
            return;
        }
        self.reply_to.insert((src, d.flow), (from, d.packets));
        self.alloc.add(src, d);
        self.stats.demands += 1;
    }

    /// Allocate the next window if demand is pending and the horizon is not already a window
    /// ahead of `now + lead`.
    fn allocate_due(&mut self) {
        if self.alloc.pending_demands() == 0 {
            return;
        }
        let start = now_ns().saturating_add(self.cfg.lead_ns);
        let window_ns = (self.window_slots as u64).saturating_mul(u64::from(self.alloc.slot_ns()));
        if self.alloc.horizon_ns() > start.saturating_add(window_ns) {
            return;
        }
        let runs = self.alloc.allocate(start, self.window_slots);
        let slot_ns = self.alloc.slot_ns();
        for (src, d, slot_start, slots) in runs {
            let key = (src, d.flow);
            let Some(&(to, owed)) = self.reply_to.get(&key) else {
                continue;
            };
            let owed = owed.saturating_sub(slots);
            if owed == 0 {
                self.reply_to.remove(&key);
            } else {
                self.reply_to.insert(key, (to, owed));
            }
            self.stats.packets += u64::from(slots);
            let a = Allocation {
                flow: d.flow,
                dst: d.dst,
                dst_port: d.dst_port,
                send_at_ns: slot_start,
                slots,
                slot_ns,
            };
            if self.send(to, &Msg::Allocation(a)) {
                self.stats.allocations += 1;
            }
            let n = NetAnnouncement {
                src,
                dst_port: d.dst_port,
                arrival_ns: slot_start.saturating_add(self.link_latency_ns),
                flow: d.flow,
                packets: slots,
            };
            let rcv = SocketAddr::V4(SocketAddrV4::new(host_ip(d.dst), self.cfg.preheatd_port));
            if self.send(rcv, &Msg::Announce(n)) {
                self.stats.announcements += 1;
            }
        }
    }

    fn send(&mut self, to: SocketAddr, msg: &Msg) -> bool {
        let now = now_ns();
        let bytes = self.gate.seal(self.id, self.seq.next_seq(), now, msg);
        match self.sock.send_to(&bytes, to) {
            Ok(_) => true,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock && self.nonblocking => {
                // Socket buffer full: one blocking retry.
                let _ = self.sock.set_nonblocking(false);
                self.nonblocking = false;
                let _ = self.sock.set_write_timeout(Some(Duration::from_millis(1)));
                let ok = self.sock.send_to(&bytes, to).is_ok();
                if !ok {
                    self.stats.send_errors += 1;
                }
                ok
            }
            Err(_) => {
                self.stats.send_errors += 1;
                false
            }
        }
    }
}
