//! The trigger thread and the per-CPU preheat workers (paper §3.2–3.3).
//!
//! The trigger thread blocks in `recv` on the announcement socket, decodes each 40-byte
//! [`Announcement`] without allocating, drops (and counts) malformed and late ones, picks the
//! CPU that served the port last and hands the announcement to that CPU's worker.
//!
//! # Hand-off
//!
//! Each worker owns a static [`WorkerSlot`]: the announcement's fields behind a seqlock written
//! only by the trigger thread, and a generation word the worker sleeps on with `FUTEX_WAIT`.
//! The trigger thread writes the fields, bumps the generation and issues `FUTEX_WAKE`: no lock,
//! no allocation, and the trigger thread never waits for a worker. A busy worker that gets
//! several announcements acts on the newest (older ones are counted as superseded).
//!
//! # Scheduling class
//!
//! Workers are pinned to their CPU and switch to `SCHED_IDLE` once, at start-up, and stay there.
//! They only ever run when their CPU would otherwise be idle, and any normal task (in particular
//! the server thread woken by the announced request) preempts them at once, so neither a spin
//! (`wake`) nor a preheat (`lines`) can delay the request it prepares for. Switching per
//! announcement would cost two `sched_setscheduler` calls on the critical path, and returning
//! from `SCHED_IDLE` needs `CAP_SYS_NICE` or a permissive `RLIMIT_NICE`; staying idle avoids
//! both. The price: on a CPU that is saturated by normal tasks, a worker may not run at all —
//! which is exactly when preheating is pointless. A worker that starts after the announced
//! arrival drops the announcement (counted as `late`, like one that arrived late).
//!
//! # Strategies, in order
//!
//! `replay` (send the configured warm-up request on the persistent loopback connection),
//! `lines` (prefetch the port's resolved runs until the deadline), `wake` (keep the CPUs polling
//! in idle until arrival + 2 ms through the handling thread's own PM QoS request
//! ([`crate::idlepoll`]) and go back to waiting; where that is not permitted, or with the
//! `spin` bit, spin until the served thread becomes busy with the announced request, at most
//! arrival + 200 µs, never more than 1 ms).

use std::os::fd::AsRawFd;
use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};

use preheat_engine::{os, preheat, time};
use preheat_model::proto::{Announcement, Strategies};
use preheat_model::AbsRun;

use crate::counters::STATS;
use crate::idlepoll::IdlePoll;
use crate::plan::{self, ReplayConn, MAX_SPLIT};
use crate::{log, sys, threads, track};

pub const MAX_WORKERS: usize = 256;
/// A `wake` spin ends at most this long after the announced arrival...
pub const WAKE_AFTER_ARRIVAL_NS: u64 = 200_000;
/// ...and never lasts longer than this in total.
pub const WAKE_MAX_NS: u64 = 1_000_000;
/// An idle-polling `wake` window lasts at most this long (it occupies no CPU — its cost is
/// power — so leads far beyond a spin's are fine; the bound only stops absurd announcements).
pub const POLL_MAX_NS: u64 = 1_000_000_000;
/// `wake` polls from the start only with at least this much lead left when the announcement is
/// handled; with less it spins through the arrival and polls after (see `handle`): arming
/// costs ~10 µs here (measured: 9–12 µs per `/dev/cpu_dma_latency` write of 0, 200 writes × 5),
/// and at a 65 µs announcement lead (~20 µs left on arrival at the agent) `wake+lines+replay`
/// measured 61 µs p50 polling against 52 µs spinning (kv, 200 rounds).
pub const POLL_MIN_LEAD_NS: u64 = 50_000;
/// A busy period that starts this little before the announced arrival counts as the announced
/// request (clocks of sender and arrival differ by a few µs).
pub const EARLY_SLACK_NS: u64 = 10_000;

pub struct WorkerSlot {
    seq: AtomicU64,
    /// Futex word: bumped once per hand-off.
    gen: AtomicU32,
    strategies: AtomicU32,
    port: AtomicU32,
    aseq: AtomicU64,
    arrival_ns: AtomicU64,
    sent_ns: AtomicU64,
    budget_ns: AtomicU64,
    /// The served thread (last_tid of the port), 0 if unknown.
    served_tid: AtomicU32,
    pub running: AtomicBool,
}

struct Job {
    a: Announcement,
    served_tid: u32,
}

impl WorkerSlot {
    const fn new() -> WorkerSlot {
        WorkerSlot {
            seq: AtomicU64::new(0),
            gen: AtomicU32::new(0),
            strategies: AtomicU32::new(0),
            port: AtomicU32::new(0),
            aseq: AtomicU64::new(0),
            arrival_ns: AtomicU64::new(0),
            sent_ns: AtomicU64::new(0),
            budget_ns: AtomicU64::new(0),
            served_tid: AtomicU32::new(0),
            running: AtomicBool::new(false),
        }
    }

    /// Trigger thread (the only writer): publish `a` and wake the worker.
    fn hand_off(&self, a: &Announcement, served_tid: u32) {
        let s = self.seq.load(Ordering::Relaxed);
        self.seq.store(s.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
        self.strategies
            .store(a.strategies.0 as u32, Ordering::Relaxed);
        self.port.store(a.port as u32, Ordering::Relaxed);
        self.aseq.store(a.seq, Ordering::Relaxed);
        self.arrival_ns.store(a.arrival_ns, Ordering::Relaxed);
        self.sent_ns.store(a.sent_ns, Ordering::Relaxed);
        self.budget_ns.store(a.budget_ns, Ordering::Relaxed);
        self.served_tid.store(served_tid, Ordering::Relaxed);
        self.seq.store(s.wrapping_add(2), Ordering::Release);
        self.gen.fetch_add(1, Ordering::Release);
        sys::futex_wake(&self.gen);
    }

    /// Worker: read the latest announcement (bounded retries against a concurrent write).
    fn read(&self) -> Option<Job> {
        for _ in 0..64 {
            let s1 = self.seq.load(Ordering::Acquire);
            if s1 & 1 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let job = Job {
                a: Announcement {
                    strategies: Strategies(self.strategies.load(Ordering::Relaxed) as u8),
                    port: self.port.load(Ordering::Relaxed) as u16,
                    seq: self.aseq.load(Ordering::Relaxed),
                    arrival_ns: self.arrival_ns.load(Ordering::Relaxed),
                    sent_ns: self.sent_ns.load(Ordering::Relaxed),
                    budget_ns: self.budget_ns.load(Ordering::Relaxed),
                },
                served_tid: self.served_tid.load(Ordering::Relaxed),
            };
            fence(Ordering::Acquire);
            if self.seq.load(Ordering::Relaxed) == s1 {
                return Some(job);
            }
        }
        None
    }

    /// Fork child: the parent's trigger thread may have been in the middle of a write (odd
    /// sequence number), and it does not exist here.
    fn reset(&self) {
        self.running.store(false, Ordering::Relaxed);
        self.seq.store(0, Ordering::Relaxed);
    }
}

pub static WORKERS: [WorkerSlot; MAX_WORKERS] = [const { WorkerSlot::new() }; MAX_WORKERS];
/// Number of workers started in this process.
pub static N_WORKERS: AtomicUsize = AtomicUsize::new(0);

/// Fork child: no worker runs yet.
pub fn reset_after_fork() {
    for w in WORKERS.iter() {
        w.reset();
    }
    N_WORKERS.store(0, Ordering::Relaxed);
}

// ------------------------------------------------------------------------------- trigger

/// Body of the trigger thread: never returns while the socket is open.
pub fn trigger_main(sock: std::os::unix::net::UnixDatagram) {
    let mut buf = [0u8; 128];
    // The trigger thread follows the serving CPU: the wakeup that delivers the announcement is
    // then the wakeup of the server's core, and the hand-off to that core's worker is a local
    // wakeup instead of a second cross-CPU one (measured on our VMs: 4-9 µs of the 65 µs lead
    // left before, 13-19 µs after). It stays SCHED_OTHER so that a CPU busy with normal tasks
    // cannot starve it (announcements are always counted and late ones dropped promptly); the
    // SCHED_IDLE worker does the spinning and prefetching.
    let mut pinned: Option<usize> = None;
    let mut logged_malformed = 0u32;
    let mut logged_late = 0u32;
    let mut idle_poll = IdlePoll::open(true);
    loop {
        // An armed idle-polling window ends on time even when no announcement follows.
        if let Some(t) = idle_poll.remaining_ns(time::now_ns()) {
            if !sys::wait_readable(sock.as_raw_fd(), t) {
                idle_poll.expire(time::now_ns());
                continue;
            }
        }
        let n = match sock.recv(&mut buf) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                log::log(&format!("trigger socket failed, announcements stop: {e}"));
                return;
            }
        };
        STATS.announcements.fetch_add(1, Ordering::Relaxed);
        if !track::ENABLED.load(Ordering::Relaxed) {
            STATS.disabled_drops.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        let a = match Announcement::decode(buf.get(..n).unwrap_or(&buf)) {
            Ok(a) => a,
            Err(e) => {
                STATS.malformed.fetch_add(1, Ordering::Relaxed);
                if logged_malformed < 10 {
                    logged_malformed += 1;
                    log::log(&format!("dropped a malformed announcement: {e}"));
                }
                continue;
            }
        };
        let now = time::now_ns();
        if a.arrival_ns <= now {
            STATS.late.fetch_add(1, Ordering::Relaxed);
            if logged_late < 10 {
                logged_late += 1;
                log::log(&format!(
                    "dropped a late announcement for port {} (seq {}): arrival was {} ns ago",
                    a.port,
                    a.seq,
                    now - a.arrival_ns
                ));
            }
            continue;
        }
        let a = resolve_auto(a);
        if a.strategies.is_empty() {
            continue;
        }
        let lead = (a.arrival_ns as i128 - now as i128).clamp(i64::MIN as i128, i64::MAX as i128);
        STATS
            .last_trigger_lead_ns
            .store(lead as i64, Ordering::Relaxed);
        let (cpu, tid) = track::target_cpu(a.port);
        let n = N_WORKERS.load(Ordering::Acquire).max(1);
        let idx = cpu as usize % n;
        let w = match WORKERS.get(idx) {
            Some(w) if w.running.load(Ordering::Acquire) => w,
            _ => match WORKERS.iter().find(|w| w.running.load(Ordering::Acquire)) {
                Some(w) => w,
                None => continue,
            },
        };
        if pinned == Some(idx) && os::current_cpu() as usize == idx {
            // Already on the serving CPU: do the work here (a hand-off to the SCHED_IDLE worker
            // of this CPU cost ~13 µs of the lead on our VMs). This thread is SCHED_OTHER, so
            // its `wake` spin yields the CPU on every turn instead of relying on preemption.
            STATS.local_handoffs.fetch_add(1, Ordering::Relaxed);
            handle(
                w,
                &Job { a, served_tid: tid },
                w.gen.load(Ordering::Acquire),
                true,
                &mut idle_poll,
            );
        } else {
            w.hand_off(&a, tid);
        }
        if pinned != Some(idx) && os::pin_current_thread(idx).is_ok() {
            pinned = Some(idx);
        }
    }
}

/// `a` with its `auto` bit replaced by the port's measured choice ([`plan::resolve_auto`];
/// counted where the port has none).
fn resolve_auto(a: Announcement) -> Announcement {
    let (strategies, unmeasured) = plan::resolve_auto(a.strategies, a.port);
    if unmeasured {
        STATS.auto_unmeasured.fetch_add(1, Ordering::Relaxed);
    }
    Announcement { strategies, ..a }
}

// ------------------------------------------------------------------------------- workers

/// Body of the worker pinned to `cpu`.
pub fn worker_main(cpu: usize) {
    let Some(w) = WORKERS.get(cpu) else {
        return;
    };
    let mut last = w.gen.load(Ordering::Acquire);
    let mut idle_poll = IdlePoll::open(false);
    w.running.store(true, Ordering::Release);
    loop {
        let g = w.gen.load(Ordering::Acquire);
        if g == last {
            let now = time::now_ns();
            idle_poll.expire(now);
            sys::futex_wait(&w.gen, g, idle_poll.remaining_ns(now));
            continue;
        }
        if g.wrapping_sub(last) > 1 {
            STATS
                .superseded
                .fetch_add(g.wrapping_sub(last) as u64 - 1, Ordering::Relaxed);
        }
        last = g;
        if let Some(job) = w.read() {
            handle(w, &job, last, false, &mut idle_poll);
        }
    }
}

/// Apply the announced strategies. `polite`: the caller is a SCHED_OTHER thread (the trigger
/// thread working inline), so the `wake` spin yields the CPU each turn. `idle_poll`: the
/// calling thread's PM QoS request (the `wake` window is armed there and ended by the caller's
/// wait loop).
fn handle(w: &WorkerSlot, job: &Job, gen: u32, polite: bool, idle_poll: &mut IdlePoll) {
    let a = &job.a;
    let start = time::now_ns();
    let lead = (a.arrival_ns as i128 - start as i128).clamp(i64::MIN as i128, i64::MAX as i128);
    STATS.last_lead_ns.store(lead as i64, Ordering::Relaxed);
    if start >= a.arrival_ns {
        // The worker got its CPU only after the arrival (a SCHED_IDLE worker on a CPU kept busy
        // by normal tasks): warming up now would only compete with the real request.
        STATS.late.fetch_add(1, Ordering::Relaxed);
        return;
    }
    let want_lines = a.strategies.contains(Strategies::LINES);
    let want_replay = a.strategies.contains(Strategies::REPLAY);
    let plan = if want_lines || want_replay {
        match plan::current() {
            Ok(p) => p,
            Err(plan::PlanBusy) => {
                STATS.profile_busy.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    } else {
        None
    };
    let pp = plan.as_ref().and_then(|p| p.port(a.port));
    // `wake` by idle polling first: one system call, and the CPUs then poll through whatever
    // the other strategies leave idle (the replay's server thread blocking, the wait after).
    // That call costs ~10 µs here (the kernel kicks every idle CPU to re-select its state):
    // with less than POLL_MIN_LEAD_NS left, `wake` spins through the arrival first and arms
    // the window after (below).
    let spin = a.strategies.contains(Strategies::SPIN);
    let poll_until = a
        .arrival_ns
        .saturating_add(crate::idlepoll::HOLD_AFTER_ARRIVAL_NS)
        .min(start.saturating_add(POLL_MAX_NS));
    let mut arm_poll = || {
        let armed = idle_poll.arm(poll_until);
        if armed {
            STATS.wake_polled.fetch_add(1, Ordering::Relaxed);
        }
        armed
    };
    let polled = !spin
        && a.strategies.contains(Strategies::WAKE)
        && a.arrival_ns.saturating_sub(start) >= POLL_MIN_LEAD_NS
        && arm_poll();
    if want_replay {
        match pp.and_then(|p| p.replay.as_deref()) {
            Some(conn) => {
                // The server thread that serves the warm-up then polls its wait until the
                // arrival instead of blocking (crate::hold): the request needs no wake-up.
                if crate::config::replay_hold() {
                    crate::hold::open(start, a.arrival_ns);
                }
                replay(conn)
            }
            None => {
                STATS.replay_errors.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    if want_lines {
        match pp {
            Some(p) if !p.runs.is_empty() => lines(p, a, start),
            _ => {
                STATS.no_profile.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    // Dropping our clone is never the last reference (see `plan`).
    drop(plan);
    if !polled && (spin || a.strategies.contains(Strategies::WAKE)) {
        let until = a.arrival_ns.saturating_add(WAKE_AFTER_ARRIVAL_NS);
        if !spin
            && crate::wakeplan::request(
                sys::getpid(),
                os::current_cpu(),
                start,
                until.min(start.saturating_add(WAKE_MAX_NS)),
            )
        {
            STATS.wake_planned.fetch_add(1, Ordering::Relaxed);
        } else {
            wake(w, job, gen, start, polite);
            // Too little lead to poll first: the spin covered the arrival; now that the
            // request runs (or the spin timed out), the CPUs poll for the rest of the window, so
            // a request of several round trips (a MySQL transaction) does not halt between
            // them. The arming system call happens after the request started, off its path
            // for a single-round-trip server.
            if !spin {
                arm_poll();
            }
        }
    }
}

fn lines(p: &plan::PortPlan, a: &Announcement, now: u64) {
    let deadline = a.preheat_deadline(now);
    let rep = match &p.split {
        Some(s) => {
            let mut refs: [&[AbsRun]; MAX_SPLIT] = [&[]; MAX_SPLIT];
            let mut n = 0;
            for (r, piece) in refs.iter_mut().zip(&s.pieces) {
                *r = piece.as_slice();
                n += 1;
            }
            s.par
                .run(&s.local, refs.get(..n).unwrap_or(&[]), Some(deadline))
        }
        None => preheat::preheat_runs(&p.runs, Some(deadline)),
    };
    STATS.preheats.fetch_add(1, Ordering::Relaxed);
    if rep.completed {
        STATS.completed.fetch_add(1, Ordering::Relaxed);
    }
    STATS
        .lines_preheated
        .fetch_add(rep.lines_done, Ordering::Relaxed);
    STATS
        .preheat_ns_total
        .fetch_add(rep.elapsed_ns, Ordering::Relaxed);
    STATS
        .last_lines_done
        .store(rep.lines_done, Ordering::Relaxed);
    STATS
        .last_lines_total
        .store(rep.lines_total, Ordering::Relaxed);
    STATS
        .last_preheat_ns
        .store(rep.elapsed_ns, Ordering::Relaxed);
}

/// Spin (SCHED_IDLE) so the CPU does not enter a deep idle state before the request arrives.
fn wake(w: &WorkerSlot, job: &Job, gen: u32, start: u64, polite: bool) {
    STATS.wake_spins.fetch_add(1, Ordering::Relaxed);
    let a = &job.a;
    let end = a
        .arrival_ns
        .saturating_add(WAKE_AFTER_ARRIVAL_NS)
        .min(start.saturating_add(WAKE_MAX_NS));
    let served = track::find_thread_slot(job.served_tid, false).and_then(|i| track::THREADS.get(i));
    // Busy-period starts are stamps (TSC ticks where enabled): convert the bound once.
    let busy_from = time::ns_to_stamp(a.arrival_ns.saturating_sub(EARLY_SLACK_NS).max(start));
    let mut i = 0u32;
    loop {
        if polite {
            sys::sched_yield();
        } else {
            std::hint::spin_loop();
            i = i.wrapping_add(1);
            if i & 7 != 0 {
                continue;
            }
        }
        if time::now_ns() >= end {
            return;
        }
        if let Some(s) = served {
            if s.busy_start.load(Ordering::Acquire) >= busy_from {
                return;
            }
        }
        // A newer announcement for this worker: go and handle it.
        if w.gen.load(Ordering::Relaxed) != gen {
            return;
        }
    }
}

/// Drain what the server answered to earlier replays, then send the warm-up request (on the
/// persistent connection, or on a fresh one: [`crate::fresh`]).
fn replay(conn: &ReplayConn) {
    if conn
        .busy
        .compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst)
        .is_err()
    {
        // Another worker is replaying on this connection right now: that warms the path too.
        return;
    }
    let ok = match &conn.fresh {
        Some(f) => {
            !conn.retired.load(Ordering::SeqCst)
                && f.warm_up(&conn.request, &conn.until, time::now_ns())
                    .is_ok()
        }
        None => {
            let fd = conn.fd.load(Ordering::SeqCst);
            fd >= 0 && drain(conn, fd) && send(conn, fd)
        }
    };
    conn.busy.store(false, Ordering::SeqCst);
    if ok {
        STATS.replays.fetch_add(1, Ordering::Relaxed);
        if conn.fresh.is_some() {
            STATS.replays_fresh.fetch_add(1, Ordering::Relaxed);
        }
    } else {
        STATS.replay_errors.fetch_add(1, Ordering::Relaxed);
        // A fresh-connection port has nothing to reconnect: its next warm-up connects anew.
        if conn.fresh.is_none() && !conn.broken.swap(true, Ordering::AcqRel) {
            plan::wake_control();
        }
    }
}

/// Too many unanswered warm-ups: the server does not answer on this connection.
const MAX_OUTSTANDING: u32 = 16;

fn drain(conn: &ReplayConn, fd: i32) -> bool {
    let mut buf = [0u8; 2048];
    for _ in 0..64 {
        match sys::recv_nonblocking(fd, &mut buf) {
            Ok(0) => return false, // the server closed the connection
            Ok(n) => {
                if !conn.until.is_empty() {
                    match_terminator(conn, buf.get(..n).unwrap_or(&[]));
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return true,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return false,
        }
    }
    true
}

fn match_terminator(conn: &ReplayConn, data: &[u8]) {
    let pos = conn.match_pos.load(Ordering::Relaxed);
    let (pos, done) = crate::fresh::scan_terminator(&conn.until, pos, data);
    if done > 0 {
        let _ = conn
            .outstanding
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                Some(v.saturating_sub(done))
            });
    }
    conn.match_pos.store(pos, Ordering::Relaxed);
}

fn send(conn: &ReplayConn, fd: i32) -> bool {
    if !conn.until.is_empty() && conn.outstanding.load(Ordering::Relaxed) >= MAX_OUTSTANDING {
        return false;
    }
    match sys::send_nonblocking(fd, &conn.request) {
        Ok(n) if n == conn.request.len() => {
            if !conn.until.is_empty() {
                conn.outstanding.fetch_add(1, Ordering::Relaxed);
            }
            true
        }
        _ => false,
    }
}

/// Start one pinned SCHED_IDLE worker per online CPU (at most [`MAX_WORKERS`]).
pub fn start_workers() -> std::io::Result<usize> {
    let n = os::online_cpus().clamp(1, MAX_WORKERS);
    // Preheat deadlines are checked with the unordered TSC (see preheat_engine::time).
    preheat_engine::time::enable_tsc_deadlines();
    for cpu in 0..n {
        threads::spawn_agent_thread(format!("preheat-cpu{cpu}"), move || {
            if let Err(e) = os::pin_current_thread(cpu) {
                log::log(&format!(
                    "worker for CPU {cpu}: cannot pin ({e}); it runs unpinned (is the server restricted to other CPUs?)"
                ));
            }
            if let Err(e) = os::set_sched_idle(true) {
                log::log(&format!(
                    "worker for CPU {cpu}: cannot switch to SCHED_IDLE ({e}); it runs as SCHED_OTHER"
                ));
            }
            worker_main(cpu);
        })?;
    }
    N_WORKERS.store(n, Ordering::Release);
    Ok(n)
}
