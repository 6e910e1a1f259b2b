//! Request boundaries: busy periods of server threads and their attribution to listening ports.
//!
//! A thread that enters an event-wait call (epoll/poll/select family) is *idle*; a wait that
//! returns events starts a *busy period*, which ends when the thread next enters a wait call.
//! The busy period belongs to the listening port of the first connection it accepted or read
//! from.
//!
//! Threads that never enter a wait call but block in `read`/`recv` on an accepted connection
//! (thread-per-connection servers: Python's `ThreadingHTTPServer`, a preforked worker reading
//! its connection, a pool thread the request is handed to, as in the JDK's `HttpServer`) are
//! *blocking readers* (see the section of that name at the end): for them a read that returns
//! data on a tracked connection starts the busy period, and writing on a tracked connection (the
//! reply), entering the next read on one, or closing one ends it. (Before the write ended it, a
//! pool thread that parks on a futex after answering stayed busy until the next request's read:
//! its port showed no busy period for a request until the next one came.) In a process without blocking readers
//! this costs one relaxed load of a process-wide flag ([`ANY_BLOCKING`]) per read and close; in
//! one with them, event-loop threads pay a thread-local load more.
//!
//! Everything here runs on hooked paths of the host: fixed-size static tables of atomics, no
//! allocation, no locks, no panics (only `get`, never indexing), no logging.
//!
//! Cost per request (measured by `examples/hook_cost.rs`): the fields of a thread's slot have one
//! writer, the thread itself (plain loads and stores, no read-modify-write; the control thread
//! only clears slots of threads that no longer exist, or busy periods in flight after
//! re-enabling, where losing a race costs one busy period's attribution at most); the calling
//! thread's tid, slot, agent flag and last port slot live in one thread-local (one
//! `__tls_get_addr` per hook in the cdylib); times are [`time::stamp`]s (the raw TSC, and the CPU
//! from `rdpid` or `rdtscp`, where the engine enabled them: no vDSO clock read, no
//! `sched_getcpu`), converted to CLOCK_MONOTONIC ns on the read side ([`port_stats`]). The fast
//! path calls nothing that writes errno (TSC stamps, memory operations); the paths that can
//! (claiming a slot, clock reads where stamps are ns) save and restore it themselves.
//!
//! Hooked path: the lints below (see the crate docs) reject panicking code here.
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

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU32, AtomicU64, Ordering};

use preheat_engine::{os, time};
use preheat_model::proto::PortStats;

use crate::sys;

/// Thread slots (server threads seen in a wait call).
pub const MAX_THREADS: usize = 1024;
/// Port slots.
pub const MAX_PORTS: usize = 64;
/// fds at or above this are not tracked.
pub const MAX_FDS: usize = 65536;

/// Some thread of this process has become a blocking reader (never cleared: a process that
/// has them keeps paying the thread-local check on reads and closes).
pub static ANY_BLOCKING: AtomicBool = AtomicBool::new(false);

/// The agent is attached and running in this process (set by the constructor / fork child).
pub static ACTIVE: AtomicBool = AtomicBool::new(false);
/// Hooks track (true) or are pure pass-through (false): `SetEnabled`, or a disabling error.
pub static ENABLED: AtomicBool = AtomicBool::new(true);

pub struct ThreadSlot {
    /// Kernel tid owning the slot, 0 = free.
    pub tid: AtomicU32,
    /// The thread has entered a wait call at least once (it is a server event-loop thread).
    pub seen_wait: AtomicBool,
    pub in_wait: AtomicBool,
    /// Start of the current busy period (a [`time::stamp`]), 0 = not busy.
    pub busy_start: AtomicU64,
    /// Port of the current busy period, 0 = not attributed yet.
    pub port: AtomicU16,
    /// CPU at the start of the current busy period.
    pub cpu: AtomicU32,
    /// The thread is a blocking reader (see the module docs): its busy periods start on reads.
    pub blocking: AtomicBool,
}

impl ThreadSlot {
    const fn new() -> ThreadSlot {
        ThreadSlot {
            tid: AtomicU32::new(0),
            seen_wait: AtomicBool::new(false),
            in_wait: AtomicBool::new(false),
            busy_start: AtomicU64::new(0),
            port: AtomicU16::new(0),
            cpu: AtomicU32::new(0),
            blocking: AtomicBool::new(false),
        }
    }
    fn clear(&self) {
        self.blocking.store(false, Ordering::Relaxed);
        self.seen_wait.store(false, Ordering::Relaxed);
        self.in_wait.store(false, Ordering::Relaxed);
        self.busy_start.store(0, Ordering::Relaxed);
        self.port.store(0, Ordering::Relaxed);
        self.cpu.store(0, Ordering::Relaxed);
        self.tid.store(0, Ordering::Release);
    }
}

pub struct PortSlot {
    /// Port number, 0 = free.
    pub port: AtomicU16,
    pub busy_periods: AtomicU64,
    /// Total length of the busy periods, in [`time::stamp`] units ([`port_stats`] converts).
    pub busy_span: AtomicU64,
    pub last_cpu: AtomicU32,
    pub last_tid: AtomicU32,
    /// When the most recent busy period of this port started (a [`time::stamp`]).
    pub last_start: AtomicU64,
}

impl PortSlot {
    const fn new() -> PortSlot {
        PortSlot {
            port: AtomicU16::new(0),
            busy_periods: AtomicU64::new(0),
            busy_span: AtomicU64::new(0),
            last_cpu: AtomicU32::new(0),
            last_tid: AtomicU32::new(0),
            last_start: AtomicU64::new(0),
        }
    }
}

pub static THREADS: [ThreadSlot; MAX_THREADS] = [const { ThreadSlot::new() }; MAX_THREADS];
pub static PORTS: [PortSlot; MAX_PORTS] = [const { PortSlot::new() }; MAX_PORTS];
/// fd → local listening port of the connection (0 = unknown).
pub static FD_PORT: [AtomicU16; MAX_FDS] = [const { AtomicU16::new(0) }; MAX_FDS];
/// Listening fd → its local port: 0 = not looked up yet, `KNOWN | port`, or `NOT_INET`.
pub static LISTEN_PORT: [AtomicU32; MAX_FDS] = [const { AtomicU32::new(0) }; MAX_FDS];
const KNOWN: u32 = 1 << 16;
const NOT_INET: u32 = 1 << 17;

/// What a thread knows about itself, in one thread-local (one lookup per hook).
struct ThreadCache {
    tid: Cell<u32>,
    /// Thread slot index + 1, 0 = none yet.
    slot: Cell<u32>,
    /// This thread belongs to the agent (control, trigger, worker): hooks pass through.
    agent: Cell<bool>,
    /// The port of this thread's most recent busy period and its port slot index + 1 (0: none;
    /// port slots are only freed in a fork child, which resets this cache).
    port: Cell<u16>,
    port_slot: Cell<u32>,
    /// This thread is a blocking reader (its slot's `blocking`); read and close hooks of other
    /// threads stop at this flag.
    blocking: Cell<bool>,
}

thread_local! {
    // A `const` initialiser of a type without Drop: a plain `#[thread_local]` static, no lazy
    // registration, no allocation (the agent is in the initial TLS block as an LD_PRELOAD
    // object, so `__tls_get_addr` does not allocate either).
    static CACHE: ThreadCache = const {
        ThreadCache {
            tid: Cell::new(0),
            slot: Cell::new(0),
            agent: Cell::new(false),
            port: Cell::new(0),
            port_slot: Cell::new(0),
            blocking: Cell::new(false),
        }
    };
}

/// Mark the calling thread as one of the agent's own.
pub fn mark_agent_thread() {
    let _ = CACHE.try_with(|c| c.agent.set(true));
}

/// Whether the calling thread is one of the agent's own.
#[inline]
pub fn is_agent_thread() -> bool {
    CACHE.try_with(|c| c.agent.get()).unwrap_or(false)
}

/// Forget the cached tid, slot and port slot of the calling thread (fork child: the tid
/// changed and the tables start over).
pub fn reset_thread_cache() {
    let _ = CACHE.try_with(|c| {
        c.tid.set(0);
        c.slot.set(0);
        c.port.set(0);
        c.port_slot.set(0);
        c.blocking.set(false);
    });
}

/// The agent is attached and tracking (the process-wide part of [`tracking`]).
#[inline(always)]
fn active() -> bool {
    ACTIVE.load(Ordering::Relaxed) && ENABLED.load(Ordering::Relaxed)
}

/// Whether hooks on this thread should track.
#[inline(always)]
pub fn tracking() -> bool {
    active() && !CACHE.try_with(|c| c.agent.get()).unwrap_or(true)
}

/// Run `f`, which may call into libc, with errno preserved.
#[inline(always)]
fn keeping_errno<R>(f: impl FnOnce() -> R) -> R {
    let e = sys::errno();
    let r = f();
    sys::set_errno(e);
    r
}

/// A stamp (see [`time::stamp`]); errno preserved.
#[inline(always)]
fn stamp() -> u64 {
    if time::stamps_are_tsc() {
        time::stamp()
    } else {
        keeping_errno(time::stamp)
    }
}

/// A stamp and the current CPU; errno preserved (`sched_getcpu` can set it).
#[inline(always)]
fn stamp_cpu() -> (u64, u32) {
    if time::stamps_are_tsc() {
        time::stamp_cpu()
    } else {
        keeping_errno(time::stamp_cpu)
    }
}

/// The slot of the thread `c` belongs to, claimed on first use (`None` if the table is full).
#[inline(always)]
fn slot_of(c: &ThreadCache) -> Option<&'static ThreadSlot> {
    let cached = c.slot.get();
    if cached != 0 {
        return THREADS.get((cached as usize).wrapping_sub(1));
    }
    claim_slot(c)
}

/// Once per thread: find or claim the calling thread's slot (errno preserved: `gettid`).
#[cold]
#[inline(never)]
fn claim_slot(c: &ThreadCache) -> Option<&'static ThreadSlot> {
    let mut tid = c.tid.get();
    if tid == 0 {
        tid = keeping_errno(os::gettid);
        c.tid.set(tid);
    }
    // Look for an existing slot of this tid first (a reused tid, or a slot behind a hole left
    // by a released one), then claim.
    let i = find_thread_slot(tid, false).or_else(|| find_thread_slot(tid, true))?;
    c.slot.set((i as u32).saturating_add(1));
    THREADS.get(i)
}

/// Slot index of `tid` (claiming a free one if `claim`). Linear probing from `tid % N`.
pub fn find_thread_slot(tid: u32, claim: bool) -> Option<usize> {
    if tid == 0 {
        return None;
    }
    let h = tid as usize % MAX_THREADS;
    for k in 0..MAX_THREADS {
        let i = h.wrapping_add(k) % MAX_THREADS;
        let s = THREADS.get(i)?;
        let cur = s.tid.load(Ordering::Acquire);
        if cur == tid {
            return Some(i);
        }
        if cur == 0 {
            if !claim {
                // Keep probing: slots can be freed (dead threads), leaving holes.
                continue;
            }
            match s
                .tid
                .compare_exchange(0, tid, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return Some(i),
                Err(actual) if actual == tid => return Some(i),
                Err(_) => continue,
            }
        }
    }
    None
}

/// Slot index of `port` (claiming a free one if `claim`).
fn port_slot_index(port: u16, claim: bool) -> Option<usize> {
    if port == 0 {
        return None;
    }
    for (i, p) in PORTS.iter().enumerate() {
        let cur = p.port.load(Ordering::Acquire);
        if cur == port {
            return Some(i);
        }
        if cur == 0 && claim {
            match p
                .port
                .compare_exchange(0, port, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return Some(i),
                Err(actual) if actual == port => return Some(i),
                Err(_) => continue,
            }
        }
    }
    None
}

/// The slot of `port` (claiming a free one if `claim`).
pub fn port_slot(port: u16, claim: bool) -> Option<&'static PortSlot> {
    port_slot_index(port, claim).and_then(|i| PORTS.get(i))
}

/// The (claimed) slot of `port`, through the thread's cache of its last port.
#[inline(always)]
fn cached_port_slot(c: &ThreadCache, port: u16) -> Option<&'static PortSlot> {
    if c.port.get() == port {
        if let Some(p) = PORTS.get((c.port_slot.get() as usize).wrapping_sub(1)) {
            return Some(p);
        }
    }
    port_slot_miss(c, port)
}

/// [`cached_port_slot`] for a port other than the thread's last: look it up (claim) and cache it.
#[cold]
#[inline(never)]
fn port_slot_miss(c: &ThreadCache, port: u16) -> Option<&'static PortSlot> {
    let i = port_slot_index(port, true)?;
    c.port.set(port);
    c.port_slot.set((i as u32).saturating_add(1));
    PORTS.get(i)
}

/// End the busy period of `s` (if any) and account it to its port. `s` is the calling
/// thread's slot: its fields are written by their owner only (see the module docs).
#[inline(always)]
fn end_busy(s: &ThreadSlot, c: &ThreadCache) {
    let start = s.busy_start.load(Ordering::Relaxed);
    if start == 0 {
        return;
    }
    s.busy_start.store(0, Ordering::Relaxed);
    let port = s.port.load(Ordering::Relaxed);
    if port == 0 {
        return;
    }
    if let Some(p) = cached_port_slot(c, port) {
        let span = stamp().saturating_sub(start);
        // Shared by every thread serving the port: read-modify-writes.
        p.busy_span.fetch_add(span, Ordering::Relaxed);
        p.last_cpu
            .store(s.cpu.load(Ordering::Relaxed), Ordering::Relaxed);
        p.last_tid
            .store(s.tid.load(Ordering::Relaxed), Ordering::Relaxed);
        p.last_start.store(start, Ordering::Relaxed);
        p.busy_periods.fetch_add(1, Ordering::Release);
    }
}

/// A thread enters a wait call. Returns its slot for [`wait_exit`], `None` if not tracking.
#[inline]
pub fn wait_enter() -> Option<&'static ThreadSlot> {
    if !active() {
        return None;
    }
    CACHE
        .try_with(|c| {
            if c.agent.get() {
                return None;
            }
            let s = slot_of(c)?;
            end_busy(s, c);
            s.seen_wait.store(true, Ordering::Relaxed);
            s.in_wait.store(true, Ordering::Release);
            Some(s)
        })
        .ok()
        .flatten()
}

/// The wait call returned `events` (> 0: a busy period starts).
#[inline]
pub fn wait_exit(s: &ThreadSlot, events: bool) {
    if events {
        let (start, cpu) = stamp_cpu();
        s.port.store(0, Ordering::Relaxed);
        s.cpu.store(cpu, Ordering::Relaxed);
        s.busy_start.store(start, Ordering::Release);
    }
    s.in_wait.store(false, Ordering::Release);
}

/// Attribute the calling thread's current busy period to `port` (first attribution wins).
#[inline]
fn attribute(port: u16) {
    if port == 0 {
        return;
    }
    let _ = CACHE.try_with(|c| {
        if c.agent.get() {
            return;
        }
        let Some(s) = THREADS.get((c.slot.get() as usize).wrapping_sub(1)) else {
            return;
        };
        // Owner-only fields: a plain check and store.
        if s.busy_start.load(Ordering::Relaxed) != 0 && s.port.load(Ordering::Relaxed) == 0 {
            s.port.store(port, Ordering::Relaxed);
        }
    });
}

/// A read-like call on `fd` returned `ret` bytes.
#[inline]
pub fn on_read(fd: libc::c_int, ret: isize) {
    // The fd's port first: reads of fds that are no connection skip the thread-local.
    if ret <= 0 || !active() {
        return;
    }
    let Some(port) = usize::try_from(fd)
        .ok()
        .and_then(|i| FD_PORT.get(i))
        .map(|p| p.load(Ordering::Relaxed))
        .filter(|p| *p != 0)
    else {
        return;
    };
    let _ = CACHE.try_with(|c| {
        if c.agent.get() {
            return;
        }
        match THREADS.get((c.slot.get() as usize).wrapping_sub(1)) {
            // Owner-only fields: a plain check and store (first attribution wins).
            Some(s) if s.busy_start.load(Ordering::Relaxed) != 0 => {
                if s.port.load(Ordering::Relaxed) == 0 {
                    s.port.store(port, Ordering::Relaxed);
                }
            }
            s => blocking_read_returned(c, s, port),
        }
    });
}

/// Local port of listening fd `lfd` (cached per fd).
fn listen_port(lfd: libc::c_int) -> u16 {
    let Some(e) = usize::try_from(lfd).ok().and_then(|i| LISTEN_PORT.get(i)) else {
        return crate::sys::local_port(lfd).unwrap_or(0);
    };
    let v = e.load(Ordering::Relaxed);
    if v & KNOWN != 0 {
        return (v & 0xffff) as u16;
    }
    if v & NOT_INET != 0 {
        return 0;
    }
    match crate::sys::local_port(lfd) {
        Some(p) => {
            e.store(KNOWN | p as u32, Ordering::Relaxed);
            p
        }
        None => {
            e.store(NOT_INET, Ordering::Relaxed);
            0
        }
    }
}

/// accept/accept4 on listening fd `lfd` returned `newfd`.
#[inline]
pub fn on_accept(lfd: libc::c_int, newfd: libc::c_int) {
    if newfd < 0 || !tracking() {
        return;
    }
    let port = listen_port(lfd);
    if let Some(e) = usize::try_from(newfd).ok().and_then(|i| FD_PORT.get(i)) {
        e.store(port, Ordering::Relaxed);
    }
    attribute(port);
}

/// `fd` is about to be closed: forget what we know about it (before the real close, so a
/// concurrent reuse of the number is never wiped).
#[inline]
pub fn on_close(fd: libc::c_int) {
    if !ACTIVE.load(Ordering::Relaxed) {
        return;
    }
    if is_blocking_reader() {
        blocking_ends(fd, true);
    }
    if let Ok(i) = usize::try_from(fd) {
        if let Some(e) = FD_PORT.get(i) {
            e.store(0, Ordering::Relaxed);
        }
        if let Some(e) = LISTEN_PORT.get(i) {
            e.store(0, Ordering::Relaxed);
        }
    }
}

// ---- read side (control / trigger / workers) ----

/// Snapshot of the port table.
pub fn port_stats() -> Vec<PortStats> {
    PORTS
        .iter()
        .filter_map(|p| {
            let port = p.port.load(Ordering::Acquire);
            (port != 0).then(|| PortStats {
                port,
                busy_periods: p.busy_periods.load(Ordering::Acquire),
                busy_ns: time::stamp_span_ns(p.busy_span.load(Ordering::Relaxed)),
                last_cpu: p.last_cpu.load(Ordering::Relaxed),
                last_tid: p.last_tid.load(Ordering::Relaxed),
                last_start_ns: time::stamp_to_ns(p.last_start.load(Ordering::Relaxed)),
            })
        })
        .collect()
}

/// Server threads seen in a wait call.
pub fn threads_seen() -> u32 {
    THREADS
        .iter()
        .filter(|s| s.tid.load(Ordering::Relaxed) != 0 && s.seen_wait.load(Ordering::Relaxed))
        .count() as u32
}

/// Where a request for `port` will most likely be served: the CPU of the port's most recent
/// busy period, else the CPU of any server thread seen, else 0. Allocation-free.
pub fn target_cpu(port: u16) -> (u32, u32) {
    if let Some(p) = port_slot(port, false) {
        if p.busy_periods.load(Ordering::Acquire) > 0 {
            return (
                p.last_cpu.load(Ordering::Relaxed),
                p.last_tid.load(Ordering::Relaxed),
            );
        }
    }
    for s in THREADS.iter() {
        if s.tid.load(Ordering::Relaxed) != 0 && s.seen_wait.load(Ordering::Relaxed) {
            return (s.cpu.load(Ordering::Relaxed), 0);
        }
    }
    (0, 0)
}

/// Tids of server threads that are not in a wait call (or, blocking readers, a read on a
/// tracked connection) now.
pub fn busy_threads(out: &mut Vec<u32>) {
    out.clear();
    for s in THREADS.iter() {
        let tid = s.tid.load(Ordering::Acquire);
        let server = s.seen_wait.load(Ordering::Relaxed) || s.blocking.load(Ordering::Relaxed);
        if tid != 0 && server && !s.in_wait.load(Ordering::Acquire) {
            out.push(tid);
        }
    }
}

/// Free the slot of a thread that no longer exists.
pub fn release_thread(tid: u32) {
    if let Some(i) = find_thread_slot(tid, false) {
        if let Some(s) = THREADS.get(i) {
            s.clear();
        }
    }
}

/// Forget busy periods in flight (after re-enabling: they straddle a pass-through interval).
pub fn forget_busy_periods() {
    for s in THREADS.iter() {
        s.busy_start.store(0, Ordering::Relaxed);
        s.port.store(0, Ordering::Relaxed);
    }
}

/// Fork child: a new process with one thread; counters and the thread table start over. The
/// fd tables stay valid (the child inherits the fds).
pub fn reset_after_fork() {
    ANY_BLOCKING.store(false, Ordering::Relaxed);
    for s in THREADS.iter() {
        s.clear();
    }
    for p in PORTS.iter() {
        p.busy_periods.store(0, Ordering::Relaxed);
        p.busy_span.store(0, Ordering::Relaxed);
        p.last_cpu.store(0, Ordering::Relaxed);
        p.last_tid.store(0, Ordering::Relaxed);
        p.last_start.store(0, Ordering::Relaxed);
        p.port.store(0, Ordering::Relaxed);
    }
    reset_thread_cache();
}

/// This process's busy periods of `port` so far (0 if it never served it).
pub fn port_busy_periods(port: u16) -> u64 {
    port_slot(port, false).map_or(0, |p| p.busy_periods.load(Ordering::Acquire))
}

// ---- blocking readers (thread-per-connection servers; see the module docs) ----

/// A read on tracked connection `port` returned data outside a busy period: a thread that never
/// entered a wait call becomes a blocking reader and starts a busy period now. (An event-loop
/// thread reading outside its busy periods is left alone, as before.)
#[cold]
#[inline(never)]
fn blocking_read_returned(c: &ThreadCache, s: Option<&'static ThreadSlot>, port: u16) {
    let Some(s) = s.or_else(|| slot_of(c)) else {
        return;
    };
    if s.seen_wait.load(Ordering::Relaxed) {
        return;
    }
    c.blocking.set(true);
    ANY_BLOCKING.store(true, Ordering::Relaxed);
    s.blocking.store(true, Ordering::Relaxed);
    s.port.store(port, Ordering::Relaxed);
    let (start, cpu) = stamp_cpu();
    s.cpu.store(cpu, Ordering::Relaxed);
    s.busy_start.store(start.max(1), Ordering::Release);
    s.in_wait.store(false, Ordering::Release);
}

/// Whether `fd` is a connection of a tracked port.
#[inline(always)]
fn is_tracked(fd: libc::c_int) -> bool {
    usize::try_from(fd)
        .ok()
        .and_then(|i| FD_PORT.get(i))
        .is_some_and(|p| p.load(Ordering::Relaxed) != 0)
}

/// Before a read on `fd`: a blocking reader about to block on a tracked connection is idle (its
/// busy period ends). Returns whether the thread was marked idle, for [`read_exit`]. Other
/// threads return at the thread-local flag.
#[inline(always)]
pub fn read_enter(fd: libc::c_int) -> bool {
    is_blocking_reader() && blocking_read_enter(fd)
}

/// Whether the calling thread is a blocking reader: one relaxed load of the process-wide flag
/// where there is none (the thread-local only where there are).
#[inline(always)]
fn is_blocking_reader() -> bool {
    ANY_BLOCKING.load(Ordering::Relaxed) && CACHE.try_with(|c| c.blocking.get()).unwrap_or(false)
}

#[cold]
#[inline(never)]
fn blocking_read_enter(fd: libc::c_int) -> bool {
    if !tracking() {
        return false;
    }
    let tracked = is_tracked(fd);
    CACHE
        .try_with(|c| {
            let Some(s) = THREADS
                .get((c.slot.get() as usize).wrapping_sub(1))
                .filter(|_| tracked)
            else {
                return false;
            };
            if s.seen_wait.load(Ordering::Relaxed) {
                // It turned out to run an event loop after all.
                c.blocking.set(false);
                s.blocking.store(false, Ordering::Relaxed);
                return false;
            }
            end_busy(s, c);
            s.in_wait.store(true, Ordering::Release);
            true
        })
        .unwrap_or(false)
}

/// After a read that [`read_enter`] marked idle (whatever it returned).
#[inline(always)]
pub fn read_exit(idle: bool) {
    if idle {
        let _ = CACHE.try_with(|c| {
            if let Some(s) = THREADS.get((c.slot.get() as usize).wrapping_sub(1)) {
                s.in_wait.store(false, Ordering::Release);
            }
        });
    }
}

/// A write-like call on `fd` returned `ret`: a blocking reader that wrote on a tracked
/// connection has answered its request — its busy period ends (a thread that parks on a futex
/// after answering, as a JVM executor does, never enters another read or wait in time). Other
/// threads return at the process-wide flag.
#[inline(always)]
pub fn on_write(fd: libc::c_int, ret: isize) {
    if ret > 0 && is_blocking_reader() {
        blocking_ends(fd, false);
    }
}

/// A blocking reader wrote on `fd` (`closing` false) or closes it (true): if it is a tracked
/// connection, the request on it is answered — end the busy period; a close also frees the
/// thread's slot (thread-per-connection servers start a thread per connection; a later read
/// claims a slot again).
#[cold]
#[inline(never)]
fn blocking_ends(fd: libc::c_int, closing: bool) {
    if !is_tracked(fd) || !tracking() {
        return;
    }
    let _ = CACHE.try_with(|c| {
        if let Some(s) = THREADS.get((c.slot.get() as usize).wrapping_sub(1)) {
            end_busy(s, c);
            if closing {
                s.clear();
            }
        }
        if closing {
            c.slot.set(0);
            c.blocking.set(false);
        }
    });
}
