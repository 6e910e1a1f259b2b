//! The authenticated datagram format between senders, the arbiter and receivers (paper §3.2),
//! and the admission checks every endpoint applies before acting on a datagram.
//!
//! Layout (all integers little endian; `PROTOCOL.md` is the normative description):
//!
//! ```text
//! 0   magic "PHNT"            4
//! 4   version u8              1   (= VERSION)
//! 5   kind u8                 1   (1 Demand, 2 Allocation, 3 Announce, 4 Hello)
//! 6   body_len u16            2   (fixed per kind)
//! 8   sender u32              4   (HostId: IPv4 address as big-endian u32, stored LE)
//! 12  seq u64                 8   (stream id 24 bits | counter 40 bits; see `SeqGen`)
//! 20  sent_ns u64             8   (sender's CLOCK_MONOTONIC at sending)
//! 28  body                    body_len
//! ..  mac [u8; 16]            HMAC-SHA256(key, everything before it), first 16 bytes
//! ```
//!
//! [`decode`] checks length, magic, version, kind and body length, then the MAC (constant time)
//! and only then parses the body; it never panics and never allocates beyond the message.
//! [`Gate`] adds staleness, replay and per-sender rate checks and counts every drop.

use crate::HostId;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::collections::HashMap;
use std::fmt;
use std::path::Path;
use thiserror::Error;

type HmacSha256 = Hmac<Sha256>;

/// Wire format version. A receiver drops every other version (counted as malformed).
pub const VERSION: u8 = 1;
/// The arbiter listens here (UDP).
pub const DEFAULT_ARBITER_PORT: u16 = 7710;
/// The receivers' `preheatd` listens here (UDP).
pub const DEFAULT_PREHEATD_PORT: u16 = 7711;
/// First four bytes of every datagram.
pub const MAGIC: [u8; 4] = *b"PHNT";
/// Bytes before the body.
pub const HEADER_LEN: usize = 28;
/// Bytes of the truncated HMAC-SHA256 trailer.
pub const MAC_LEN: usize = 16;
/// The longest datagram of this version (an Allocation).
pub const MAX_DATAGRAM: usize = HEADER_LEN + ALLOCATION_BODY_LEN + MAC_LEN;
/// Default staleness bound: datagrams sent more than this long ago (or this far in the
/// future) are dropped.
pub const DEFAULT_MAX_AGE_NS: u64 = 50_000_000;
/// Default per-sender rate limit (datagrams per second) and burst.
pub const DEFAULT_RATE_PER_S: f64 = 200_000.0;
pub const DEFAULT_BURST: f64 = 20_000.0;

/// Message kinds (the `kind` byte).
pub const KIND_DEMAND: u8 = 1;
pub const KIND_ALLOCATION: u8 = 2;
pub const KIND_ANNOUNCE: u8 = 3;
pub const KIND_HELLO: u8 = 4;

/// Body lengths per kind.
pub const DEMAND_BODY_LEN: usize = 16;
pub const ALLOCATION_BODY_LEN: usize = 28;
pub const ANNOUNCE_BODY_LEN: usize = 24;
pub const HELLO_BODY_LEN: usize = 1;

/// Roles in a [`Msg::Hello`].
pub const ROLE_SENDER: u8 = 1;
pub const ROLE_RECEIVER: u8 = 2;
pub const ROLE_ARBITER: u8 = 3;

/// The pre-shared key every host of the fleet holds. `Debug` never prints it.
#[derive(Clone, PartialEq, Eq)]
pub struct Key(pub [u8; 32]);

/// Why a key could not be read.
#[derive(Debug, Error)]
pub enum KeyError {
    #[error("key must be 64 hex digits (32 bytes), got {0} characters")]
    HexLength(usize),
    #[error("key has a non-hex character")]
    HexDigit,
    #[error("cannot read key file {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("key file {path}: {problem}")]
    File { path: String, problem: String },
}

impl Key {
    /// 64 hex digits (surrounding whitespace ignored).
    pub fn from_hex(s: &str) -> Result<Key, KeyError> {
        let s = s.trim();
        if s.len() != 64 {
            return Err(KeyError::HexLength(s.chars().count()));
        }
        let mut k = [0u8; 32];
        let b = s.as_bytes();
        for (i, out) in k.iter_mut().enumerate() {
            let hi = hex_val(b[2 * i]).ok_or(KeyError::HexDigit)?;
            let lo = hex_val(b[2 * i + 1]).ok_or(KeyError::HexDigit)?;
            *out = hi << 4 | lo;
        }
        Ok(Key(k))
    }

    /// A key file: exactly 32 raw bytes, or 64 hex digits (surrounding whitespace ignored).
    /// Keep it readable by its owner only (mode 0600).
    pub fn from_file(path: impl AsRef<Path>) -> Result<Key, KeyError> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|source| KeyError::Io {
            path: path.display().to_string(),
            source,
        })?;
        if bytes.len() == 32 {
            let mut k = [0u8; 32];
            k.copy_from_slice(&bytes);
            return Ok(Key(k));
        }
        let text = std::str::from_utf8(&bytes).map_err(|_| KeyError::File {
            path: path.display().to_string(),
            problem: format!("{} bytes, neither 32 raw bytes nor hex text", bytes.len()),
        })?;
        Key::from_hex(text).map_err(|e| KeyError::File {
            path: path.display().to_string(),
            problem: e.to_string(),
        })
    }

    /// A fresh random key from the operating system's generator.
    pub fn random() -> Key {
        use rand::RngCore;
        let mut k = [0u8; 32];
        rand::rngs::OsRng.fill_bytes(&mut k);
        Key(k)
    }

    /// 64 lower-case hex digits.
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    fn mac(&self) -> HmacSha256 {
        // HMAC accepts keys of any length; a 32-byte key never fails.
        <HmacSha256 as Mac>::new_from_slice(&self.0).expect("HMAC takes any key length")
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Key(<redacted>)")
    }
}

fn hex_val(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

/// A sender asks the arbiter for `packets` timeslots to send flow `flow` to `dst:dst_port`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Demand {
    pub dst: HostId,
    pub dst_port: u16,
    /// ≥ 1.
    pub packets: u16,
    /// Chosen by the sender, unique among its outstanding demands.
    pub flow: u64,
}

/// The arbiter grants `slots` consecutive timeslots of `slot_ns` each, starting at
/// `send_at_ns`, to flow `flow` (one Allocation per run of consecutive slots).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Allocation {
    pub flow: u64,
    pub dst: HostId,
    pub dst_port: u16,
    pub send_at_ns: u64,
    /// ≥ 1.
    pub slots: u16,
    /// ≥ 1.
    pub slot_ns: u32,
}

/// The arbiter tells a receiver: `packets` packets of flow `flow` from `src` to port `dst_port`
/// arrive from `arrival_ns` on (one per slot).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct NetAnnouncement {
    pub src: HostId,
    pub dst_port: u16,
    pub arrival_ns: u64,
    pub flow: u64,
    /// ≥ 1.
    pub packets: u16,
}

/// A message body.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Msg {
    Demand(Demand),
    Allocation(Allocation),
    Announce(NetAnnouncement),
    /// Liveness probe; the arbiter answers a Hello with `Hello { role: ROLE_ARBITER }`.
    /// `role` is one of [`ROLE_SENDER`], [`ROLE_RECEIVER`], [`ROLE_ARBITER`].
    Hello {
        role: u8,
    },
}

impl Msg {
    /// The `kind` byte of this message.
    pub fn kind(&self) -> u8 {
        match self {
            Msg::Demand(_) => KIND_DEMAND,
            Msg::Allocation(_) => KIND_ALLOCATION,
            Msg::Announce(_) => KIND_ANNOUNCE,
            Msg::Hello { .. } => KIND_HELLO,
        }
    }
}

/// The authenticated header of a decoded datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Header {
    pub version: u8,
    pub kind: u8,
    pub sender: HostId,
    pub seq: u64,
    pub sent_ns: u64,
}

/// Why a datagram was refused by [`decode`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum WireError {
    #[error("datagram shorter than header and MAC")]
    Short,
    #[error("unsupported wire version {0} (this end speaks {VERSION})")]
    Version(u8),
    #[error("unknown message kind {0}")]
    Kind(u8),
    #[error("datagram length does not match its kind")]
    Length,
    #[error("MAC does not verify (wrong key or corrupted)")]
    BadMac,
    #[error("malformed message: {0}")]
    Malformed(&'static str),
}

fn body_len(kind: u8) -> Option<usize> {
    match kind {
        KIND_DEMAND => Some(DEMAND_BODY_LEN),
        KIND_ALLOCATION => Some(ALLOCATION_BODY_LEN),
        KIND_ANNOUNCE => Some(ANNOUNCE_BODY_LEN),
        KIND_HELLO => Some(HELLO_BODY_LEN),
        _ => None,
    }
}

fn put_body(out: &mut Vec<u8>, msg: &Msg) {
    match msg {
        Msg::Demand(d) => {
            out.extend_from_slice(&d.dst.to_le_bytes());
            out.extend_from_slice(&d.dst_port.to_le_bytes());
            out.extend_from_slice(&d.packets.to_le_bytes());
            out.extend_from_slice(&d.flow.to_le_bytes());
        }
        Msg::Allocation(a) => {
            out.extend_from_slice(&a.flow.to_le_bytes());
            out.extend_from_slice(&a.dst.to_le_bytes());
            out.extend_from_slice(&a.dst_port.to_le_bytes());
            out.extend_from_slice(&a.slots.to_le_bytes());
            out.extend_from_slice(&a.send_at_ns.to_le_bytes());
            out.extend_from_slice(&a.slot_ns.to_le_bytes());
        }
        Msg::Announce(n) => {
            out.extend_from_slice(&n.src.to_le_bytes());
            out.extend_from_slice(&n.dst_port.to_le_bytes());
            out.extend_from_slice(&n.packets.to_le_bytes());
            out.extend_from_slice(&n.arrival_ns.to_le_bytes());
            out.extend_from_slice(&n.flow.to_le_bytes());
        }
        Msg::Hello { role } => out.push(*role),
    }
}

/// Encode and authenticate one datagram.
///
/// Encoding never fails; a message that violates a body rule (zero `packets`/`slots`/`slot_ns`,
/// unknown Hello role) is encoded as given and refused by [`decode`] as malformed.
pub fn encode(key: &Key, sender: HostId, seq: u64, sent_ns: u64, msg: &Msg) -> Vec<u8> {
    encode_with(&key.mac(), sender, seq, sent_ns, msg)
}

pub(crate) fn encode_with(
    mac: &HmacSha256,
    sender: HostId,
    seq: u64,
    sent_ns: u64,
    msg: &Msg,
) -> Vec<u8> {
    let kind = msg.kind();
    let blen = body_len(kind).unwrap_or(0);
    let mut out = Vec::with_capacity(HEADER_LEN + blen + MAC_LEN);
    out.extend_from_slice(&MAGIC);
    out.push(VERSION);
    out.push(kind);
    out.extend_from_slice(&(blen as u16).to_le_bytes());
    out.extend_from_slice(&sender.to_le_bytes());
    out.extend_from_slice(&seq.to_le_bytes());
    out.extend_from_slice(&sent_ns.to_le_bytes());
    put_body(&mut out, msg);
    debug_assert_eq!(out.len(), HEADER_LEN + blen);
    let mut m = mac.clone();
    m.update(&out);
    let tag = m.finalize().into_bytes();
    out.extend_from_slice(&tag[..MAC_LEN]);
    out
}

/// Decode and authenticate one datagram (see the module docs for the order of checks).
pub fn decode(key: &Key, bytes: &[u8]) -> Result<(Header, Msg), WireError> {
    decode_with(&key.mac(), bytes)
}

/// Little-endian reader over a slice whose length was checked beforehand.
struct Rd<'a>(&'a [u8]);

impl Rd<'_> {
    fn take<const N: usize>(&mut self) -> [u8; N] {
        let mut a = [0u8; N];
        // The caller checked the total length; `get` keeps this panic-free regardless.
        if let Some(s) = self.0.get(..N) {
            a.copy_from_slice(s);
            self.0 = &self.0[N..];
        }
        a
    }
    fn u8(&mut self) -> u8 {
        self.take::<1>()[0]
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.take())
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.take())
    }
    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.take())
    }
}

pub(crate) fn decode_with(mac: &HmacSha256, bytes: &[u8]) -> Result<(Header, Msg), WireError> {
    if bytes.len() < HEADER_LEN + MAC_LEN {
        return Err(WireError::Short);
    }
    if bytes[0..4] != MAGIC {
        return Err(WireError::Malformed("bad magic"));
    }
    let version = bytes[4];
    if version != VERSION {
        return Err(WireError::Version(version));
    }
    let kind = bytes[5];
    let want = body_len(kind).ok_or(WireError::Kind(kind))?;
    let blen = u16::from_le_bytes([bytes[6], bytes[7]]) as usize;
    if blen != want || bytes.len() != HEADER_LEN + want + MAC_LEN {
        return Err(WireError::Length);
    }
    let (signed, tag) = bytes.split_at(HEADER_LEN + want);
    let mut m = mac.clone();
    m.update(signed);
    // Constant-time comparison of the truncated tag (subtle::ConstantTimeEq inside).
    m.verify_truncated_left(tag)
        .map_err(|_| WireError::BadMac)?;

    let mut r = Rd(&signed[8..]);
    let header = Header {
        version,
        kind,
        sender: r.u32(),
        seq: r.u64(),
        sent_ns: r.u64(),
    };
    let msg = match kind {
        KIND_DEMAND => {
            let d = Demand {
                dst: r.u32(),
                dst_port: r.u16(),
                packets: r.u16(),
                flow: r.u64(),
            };
            if d.packets == 0 {
                return Err(WireError::Malformed("demand for zero packets"));
            }
            Msg::Demand(d)
        }
        KIND_ALLOCATION => {
            let a = Allocation {
                flow: r.u64(),
                dst: r.u32(),
                dst_port: r.u16(),
                slots: r.u16(),
                send_at_ns: r.u64(),
                slot_ns: r.u32(),
            };
            if a.slots == 0 {
                return Err(WireError::Malformed("allocation of zero slots"));
            }
            if a.slot_ns == 0 {
                return Err(WireError::Malformed("allocation with zero slot length"));
            }
            Msg::Allocation(a)
        }
        KIND_ANNOUNCE => {
            let n = NetAnnouncement {
                src: r.u32(),
                dst_port: r.u16(),
                packets: r.u16(),
                arrival_ns: r.u64(),
                flow: r.u64(),
            };
            if n.packets == 0 {
                return Err(WireError::Malformed("announcement of zero packets"));
            }
            Msg::Announce(n)
        }
        KIND_HELLO => {
            let role = r.u8();
            if !(ROLE_SENDER..=ROLE_ARBITER).contains(&role) {
                return Err(WireError::Malformed("unknown hello role"));
            }
            Msg::Hello { role }
        }
        _ => return Err(WireError::Kind(kind)),
    };
    Ok((header, msg))
}

/// Bits of a sequence number that name its stream (the high bits).
pub const SEQ_STREAM_BITS: u32 = 24;
/// Bits of a sequence number that count within its stream (the low bits).
pub const SEQ_COUNTER_BITS: u32 = 64 - SEQ_STREAM_BITS;
const COUNTER_MASK: u64 = (1 << SEQ_COUNTER_BITS) - 1;

/// The stream of a sequence number (its high [`SEQ_STREAM_BITS`] bits).
pub fn seq_stream(seq: u64) -> u32 {
    (seq >> SEQ_COUNTER_BITS) as u32
}

/// The counter of a sequence number within its stream (its low [`SEQ_COUNTER_BITS`] bits).
pub fn seq_counter(seq: u64) -> u64 {
    seq & COUNTER_MASK
}

/// Sequence numbers for one sending endpoint: a random stream id (chosen at creation) in the
/// high bits and a counter from 1 in the low bits.
///
/// Every process (every [`crate::sender::Sender`], every arbiter) draws its own stream, so
/// several processes can share one [`HostId`] and a restarted process never reuses the
/// numbers of its previous life; receivers keep one replay window per (sender, stream). See
/// `PROTOCOL.md`, "Replay".
#[derive(Debug, Clone)]
pub struct SeqGen {
    stream: u32,
    counter: u64,
}

impl Default for SeqGen {
    fn default() -> Self {
        SeqGen::new()
    }
}

impl SeqGen {
    /// A fresh random stream.
    pub fn new() -> SeqGen {
        SeqGen::with_stream(rand::random::<u32>())
    }

    /// A given stream (masked to [`SEQ_STREAM_BITS`]); for tests and tools.
    pub fn with_stream(stream: u32) -> SeqGen {
        SeqGen {
            stream: stream & ((1 << SEQ_STREAM_BITS) - 1),
            counter: 0,
        }
    }

    pub fn stream(&self) -> u32 {
        self.stream
    }

    /// The next sequence number: strictly increasing within the stream; after 2^40 numbers a
    /// new random stream begins.
    pub fn next_seq(&mut self) -> u64 {
        if self.counter >= COUNTER_MASK {
            *self = SeqGen::new();
        }
        self.counter += 1;
        (u64::from(self.stream) << SEQ_COUNTER_BITS) | self.counter
    }
}

/// Why [`ReplayWindow::check_and_update`] refused a sequence number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum Replay {
    #[error("sequence number already seen")]
    Duplicate,
    #[error("sequence number older than the replay window")]
    TooOld,
}

/// Per-sender sliding replay window (RFC 4303 style): for each (sender, stream of the
/// sequence number, see [`SeqGen`]) the highest counter seen and a 64-bit bitmap of which of
/// the 64 counters ending at it were seen.
#[derive(Debug, Clone, Default)]
pub struct ReplayWindow {
    windows: HashMap<(HostId, u32), ReplayEntry>,
    tick: u64,
}

#[derive(Debug, Clone, Copy)]
struct ReplayEntry {
    highest: u64,
    bitmap: u64,
    used: u64,
}

/// Width of the replay window.
pub const REPLAY_WINDOW: u64 = 64;
/// Windows kept at most; beyond, the least recently used half is forgotten.
pub const REPLAY_MAX_WINDOWS: usize = 1 << 16;

impl ReplayWindow {
    pub fn new() -> ReplayWindow {
        ReplayWindow::default()
    }

    /// Accept `seq` from `sender` if it is above its stream's window, or inside it and unseen;
    /// record it. Call only for authenticated datagrams (else a forger could advance the
    /// window).
    pub fn check_and_update(&mut self, sender: HostId, seq: u64) -> Result<(), Replay> {
        self.tick += 1;
        let key = (sender, seq_stream(seq));
        let c = seq_counter(seq);
        let tick = self.tick;
        if !self.windows.contains_key(&key) {
            if self.windows.len() >= REPLAY_MAX_WINDOWS {
                self.forget_oldest_half();
            }
            self.windows.insert(
                key,
                ReplayEntry {
                    highest: c,
                    bitmap: 1,
                    used: tick,
                },
            );
            return Ok(());
        }
        let e = self.windows.get_mut(&key).expect("checked above");
        e.used = tick;
        if c > e.highest {
            let shift = c - e.highest;
            e.bitmap = if shift >= REPLAY_WINDOW {
                1
            } else {
                e.bitmap << shift | 1
            };
            e.highest = c;
            return Ok(());
        }
        let back = e.highest - c;
        if back >= REPLAY_WINDOW {
            return Err(Replay::TooOld);
        }
        let bit = 1u64 << back;
        if e.bitmap & bit != 0 {
            return Err(Replay::Duplicate);
        }
        e.bitmap |= bit;
        Ok(())
    }

    fn forget_oldest_half(&mut self) {
        let mut used: Vec<u64> = self.windows.values().map(|e| e.used).collect();
        let mid = used.len() / 2;
        let (_, &mut cut, _) = used.select_nth_unstable(mid);
        self.windows.retain(|_, e| e.used > cut);
    }

    /// Number of (sender, stream) windows tracked.
    pub fn windows(&self) -> usize {
        self.windows.len()
    }
}

/// Per-sender token bucket: `rate_per_s` tokens per second, at most `burst` stored; a new
/// sender starts with a full bucket. A non-finite or negative rate means "no limit".
#[derive(Debug, Clone)]
pub struct RateLimiter {
    rate_per_s: f64,
    burst: f64,
    buckets: HashMap<HostId, (f64, u64)>,
}

/// Beyond this many tracked senders, full buckets are forgotten (they would be full again).
const RATE_TABLE_PRUNE: usize = 1 << 16;

impl RateLimiter {
    pub fn new(rate_per_s: f64, burst: f64) -> RateLimiter {
        RateLimiter {
            rate_per_s,
            burst: if burst.is_nan() { 0.0 } else { burst.max(0.0) },
            buckets: HashMap::new(),
        }
    }

    fn unlimited(&self) -> bool {
        !self.rate_per_s.is_finite() || self.rate_per_s < 0.0
    }

    /// Take one token for `sender` at time `now_ns`; false if its bucket is empty.
    pub fn allow(&mut self, sender: HostId, now_ns: u64) -> bool {
        if self.unlimited() {
            return true;
        }
        if self.buckets.len() >= RATE_TABLE_PRUNE && !self.buckets.contains_key(&sender) {
            let (rate, burst) = (self.rate_per_s, self.burst);
            self.buckets
                .retain(|_, (t, last)| refill(*t, *last, now_ns, rate, burst) < burst);
        }
        let (rate, burst) = (self.rate_per_s, self.burst);
        let e = self.buckets.entry(sender).or_insert((burst, now_ns));
        let tokens = refill(e.0, e.1, now_ns, rate, burst);
        e.1 = e.1.max(now_ns);
        if tokens >= 1.0 {
            e.0 = tokens - 1.0;
            true
        } else {
            e.0 = tokens;
            false
        }
    }
}

fn refill(tokens: f64, last_ns: u64, now_ns: u64, rate: f64, burst: f64) -> f64 {
    let dt = now_ns.saturating_sub(last_ns) as f64 * 1e-9;
    (tokens + dt * rate).min(burst)
}

/// What a [`Gate`] saw. Every datagram is counted once in `received` and then either in
/// `accepted` or in exactly one drop reason.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    pub received: u64,
    /// Too short, bad magic, wrong version, unknown kind, wrong length, bad body field, or a
    /// (well-authenticated) kind this endpoint does not accept.
    pub malformed: u64,
    pub bad_mac: u64,
    pub replayed: u64,
    pub stale: u64,
    pub rate_limited: u64,
    pub accepted: u64,
}

impl Counters {
    /// Datagrams dropped for any reason.
    pub fn dropped(&self) -> u64 {
        self.malformed + self.bad_mac + self.replayed + self.stale + self.rate_limited
    }
}

/// Admission control in front of every endpoint: decode + MAC, kind filter, staleness bound,
/// replay window, per-sender rate limit, in that order. A datagram is acted on only if
/// [`Gate::admit`] returns it.
#[derive(Clone)]
pub struct Gate {
    mac: HmacSha256,
    replay: ReplayWindow,
    rate: RateLimiter,
    max_age_ns: u64,
    kinds: u32,
    counters: Counters,
}

impl fmt::Debug for Gate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gate")
            .field("max_age_ns", &self.max_age_ns)
            .field("kinds", &self.kinds)
            .field("counters", &self.counters)
            .finish_non_exhaustive()
    }
}

impl Gate {
    /// A gate that accepts every kind; see [`Gate::accept_only`].
    pub fn new(key: Key, rate_per_s: f64, burst: f64, max_age_ns: u64) -> Gate {
        Gate {
            mac: key.mac(),
            replay: ReplayWindow::new(),
            rate: RateLimiter::new(rate_per_s, burst),
            max_age_ns,
            kinds: u32::MAX,
            counters: Counters::default(),
        }
    }

    /// Accept only the given kinds (`KIND_*`); authenticated datagrams of other kinds are
    /// dropped and counted as malformed.
    pub fn accept_only(mut self, kinds: &[u8]) -> Gate {
        self.kinds = kinds.iter().fold(0, |m, &k| m | 1u32 << (k & 31));
        self
    }

    /// Admit one datagram received at `now_ns`, or drop it and count why.
    pub fn admit(&mut self, bytes: &[u8], now_ns: u64) -> Option<(Header, Msg)> {
        self.counters.received += 1;
        let (h, m) = match decode_with(&self.mac, bytes) {
            Ok(x) => x,
            Err(WireError::BadMac) => {
                self.counters.bad_mac += 1;
                return None;
            }
            Err(_) => {
                self.counters.malformed += 1;
                return None;
            }
        };
        if self.kinds & (1u32 << (h.kind & 31)) == 0 {
            self.counters.malformed += 1;
            return None;
        }
        if is_stale(h.sent_ns, now_ns, self.max_age_ns) {
            self.counters.stale += 1;
            return None;
        }
        if self.replay.check_and_update(h.sender, h.seq).is_err() {
            self.counters.replayed += 1;
            return None;
        }
        if !self.rate.allow(h.sender, now_ns) {
            self.counters.rate_limited += 1;
            return None;
        }
        self.counters.accepted += 1;
        Some((h, m))
    }

    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Change the staleness bound.
    pub fn set_max_age_ns(&mut self, max_age_ns: u64) {
        self.max_age_ns = max_age_ns;
    }

    /// Encode a datagram with this gate's key (no key schedule per message).
    pub fn seal(&self, sender: HostId, seq: u64, sent_ns: u64, msg: &Msg) -> Vec<u8> {
        encode_with(&self.mac, sender, seq, sent_ns, msg)
    }
}

/// Stale: sent more than `max_age_ns` before `now_ns`, or more than `max_age_ns` after it.
pub fn is_stale(sent_ns: u64, now_ns: u64, max_age_ns: u64) -> bool {
    now_ns.saturating_sub(sent_ns) > max_age_ns || sent_ns.saturating_sub(now_ns) > max_age_ns
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> Key {
        Key([7; 32])
    }

    #[test]
    fn layout_of_a_demand() {
        let d = Demand {
            dst: 0x0a00_0002,
            dst_port: 11211,
            packets: 3,
            flow: 0x1122_3344_5566_7788,
        };
        let b = encode(&key(), 0x0a00_0001, 5, 6, &Msg::Demand(d));
        assert_eq!(b.len(), HEADER_LEN + DEMAND_BODY_LEN + MAC_LEN);
        assert_eq!(&b[0..4], b"PHNT");
        assert_eq!(b[4], VERSION);
        assert_eq!(b[5], KIND_DEMAND);
        assert_eq!(&b[6..8], &16u16.to_le_bytes());
        assert_eq!(&b[8..12], &0x0a00_0001u32.to_le_bytes());
        assert_eq!(&b[12..20], &5u64.to_le_bytes());
        assert_eq!(&b[20..28], &6u64.to_le_bytes());
        assert_eq!(&b[28..32], &0x0a00_0002u32.to_le_bytes());
        assert_eq!(&b[32..34], &11211u16.to_le_bytes());
        assert_eq!(&b[34..36], &3u16.to_le_bytes());
        assert_eq!(&b[36..44], &0x1122_3344_5566_7788u64.to_le_bytes());
        let (h, m) = decode(&key(), &b).unwrap();
        assert_eq!(m, Msg::Demand(d));
        assert_eq!((h.sender, h.seq, h.sent_ns, h.kind), (0x0a00_0001, 5, 6, 1));
        assert_eq!(MAX_DATAGRAM, 72);
    }

    #[test]
    fn key_hex_and_file() {
        let k = Key::random();
        assert_eq!(Key::from_hex(&k.to_hex()).unwrap(), k);
        assert_eq!(
            Key::from_hex(&format!("  {}\n", k.to_hex().to_uppercase())).unwrap(),
            k
        );
        assert!(matches!(Key::from_hex("abc"), Err(KeyError::HexLength(3))));
        assert!(matches!(
            Key::from_hex(&"g".repeat(64)),
            Err(KeyError::HexDigit)
        ));
        let dir = tempfile::tempdir().unwrap();
        let raw = dir.path().join("raw");
        std::fs::write(&raw, k.0).unwrap();
        assert_eq!(Key::from_file(&raw).unwrap(), k);
        let hex = dir.path().join("hex");
        std::fs::write(&hex, format!("{}\n", k.to_hex())).unwrap();
        assert_eq!(Key::from_file(&hex).unwrap(), k);
        let bad = dir.path().join("bad");
        std::fs::write(&bad, [0xffu8; 40]).unwrap();
        assert!(Key::from_file(&bad).is_err());
        assert!(Key::from_file(dir.path().join("missing")).is_err());
        assert_eq!(format!("{k:?}"), "Key(<redacted>)");
    }

    #[test]
    fn replay_window_semantics() {
        let mut w = ReplayWindow::new();
        assert_eq!(w.check_and_update(1, 100), Ok(()));
        assert_eq!(w.check_and_update(1, 100), Err(Replay::Duplicate));
        assert_eq!(w.check_and_update(1, 99), Ok(()));
        assert_eq!(w.check_and_update(1, 37), Ok(())); // 100 - 63: last slot of the window
        assert_eq!(w.check_and_update(1, 36), Err(Replay::TooOld));
        assert_eq!(w.check_and_update(1, 37), Err(Replay::Duplicate));
        assert_eq!(w.check_and_update(1, 200), Ok(()));
        assert_eq!(w.check_and_update(1, 100), Err(Replay::TooOld));
        assert_eq!(w.check_and_update(1, 150), Ok(()));
        assert_eq!(w.check_and_update(1, 150), Err(Replay::Duplicate));
        // Senders are independent, and so are the streams of one sender.
        assert_eq!(w.check_and_update(2, 100), Ok(()));
        let other_stream = 1u64 << SEQ_COUNTER_BITS;
        assert_eq!(w.check_and_update(1, other_stream | 3), Ok(()));
        assert_eq!(
            w.check_and_update(1, other_stream | 3),
            Err(Replay::Duplicate)
        );
        assert_eq!(w.check_and_update(1, 151), Ok(()));
        assert_eq!(w.windows(), 3);
    }

    #[test]
    fn replay_table_is_bounded() {
        let mut w = ReplayWindow::new();
        for s in 0..(REPLAY_MAX_WINDOWS as u32 + 10) {
            w.check_and_update(s, 1).unwrap();
        }
        assert!(w.windows() <= REPLAY_MAX_WINDOWS);
        // The most recent senders are still remembered.
        assert_eq!(
            w.check_and_update(REPLAY_MAX_WINDOWS as u32 + 9, 1),
            Err(Replay::Duplicate)
        );
    }

    #[test]
    fn rate_limiter_refills() {
        let mut r = RateLimiter::new(1000.0, 3.0);
        let t = 1_000_000_000;
        assert!(r.allow(1, t));
        assert!(r.allow(1, t));
        assert!(r.allow(1, t));
        assert!(!r.allow(1, t));
        assert!(r.allow(2, t), "independent per sender");
        assert!(!r.allow(1, t + 500_000)); // half a token
        assert!(r.allow(1, t + 1_000_000)); // one token after 1 ms
        assert!(!r.allow(1, t + 1_000_000));
        // Refill is capped at the burst.
        let later = t + 10_000_000_000;
        assert!((0..3).all(|_| r.allow(1, later)));
        assert!(!r.allow(1, later));
        // Time going backwards never adds tokens.
        assert!(!r.allow(1, t));
        let mut unlimited = RateLimiter::new(f64::INFINITY, 0.0);
        assert!((0..1000).all(|_| unlimited.allow(1, 0)));
    }

    #[test]
    fn staleness_is_symmetric() {
        assert!(!is_stale(1000, 1000, 0));
        assert!(!is_stale(900, 1000, 100));
        assert!(is_stale(899, 1000, 100));
        assert!(!is_stale(1100, 1000, 100));
        assert!(is_stale(1101, 1000, 100));
        assert!(!is_stale(0, 50, 100));
        assert!(is_stale(u64::MAX, 0, 100));
    }

    #[test]
    fn seq_gen_streams() {
        let mut g = SeqGen::with_stream(0xab_cdef);
        let a = g.next_seq();
        let b = g.next_seq();
        assert_eq!((seq_stream(a), seq_counter(a)), (0xab_cdef, 1));
        assert_eq!((seq_stream(b), seq_counter(b)), (0xab_cdef, 2));
        assert_eq!(SeqGen::with_stream(u32::MAX).stream(), 0xff_ffff);
        let mut g = SeqGen {
            stream: 5,
            counter: COUNTER_MASK - 1,
        };
        assert_eq!(seq_counter(g.next_seq()), COUNTER_MASK);
        assert_eq!(
            seq_counter(g.next_seq()),
            1,
            "a new stream after the counter is used up"
        );
    }
}
