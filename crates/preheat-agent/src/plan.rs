//! What the workers act on: the resolved working sets, replay connections and split preheaters
//! per port, published by the control thread.
//!
//! # Publication
//!
//! The control thread builds an immutable [`Plan`] (allocating freely) and swaps an
//! `Arc<Plan>` into [`PLAN`], a [`ForkCell`] it holds only for that swap (a fork child takes
//! it back without any fork handler waiting for it). Workers never block on it: they
//! `try_with`, clone the `Arc` (an atomic increment) and release it at once; if it happens to
//! be held they skip the `lines` strategy for that announcement and count it (`no_profile`,
//! plus an internal `profile_busy` counter). A replaced plan is not dropped
//! by the swap: the control thread keeps it in a *retired* list and drops it only once its
//! strong count is 1 (no new clones of a retired plan can appear, since clones are made only
//! from the published slot), so a worker's `Arc` drop is never the last one and never frees
//! memory or joins threads on the preheat path.
//!
//! # Replay connections
//!
//! A [`ReplayConn`]'s fd is used by workers and replaced or closed by the control thread. A
//! worker claims the connection with a `busy` CAS (SeqCst) and then loads the fd; the control
//! thread swaps the fd (SeqCst) and then waits until `busy` is clear before closing the old one.
//! In the SeqCst total order either the worker's CAS precedes the control thread's `busy` check
//! (so it waits for the worker) or the worker's fd load follows the swap (so it sees the new fd):
//! an fd number is never used after it was closed (and possibly reused by the host).

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;

use preheat_engine::preheat::ParallelPreheater;
use preheat_model::proto::Strategies;
use preheat_model::AbsRun;

use crate::forkcell::ForkCell;
use crate::fresh::FreshConns;
use crate::sys;

/// Most extra CPUs a `lines` preheat may be split across.
pub const MAX_SPLIT: usize = 16;

pub struct ReplayConn {
    pub port: u16,
    pub request: Vec<u8>,
    /// Response terminator; empty: responses are drained but not counted.
    pub until: Vec<u8>,
    pub fd: AtomicI32,
    pub busy: AtomicBool,
    /// Bytes of `until` matched at the end of what was drained so far.
    pub match_pos: AtomicUsize,
    /// Requests sent whose terminator has not been drained yet.
    pub outstanding: AtomicU32,
    /// A worker found the connection broken: the control thread reconnects.
    pub broken: AtomicBool,
    /// Warm-ups on a fresh connection each, served by any worker of the server
    /// ([`crate::fresh`]); `fd` is then -1 for good.
    pub fresh: Option<FreshConns>,
    /// Fresh mode: retired by the control thread (no more warm-ups; the connections are
    /// closed). Read by workers after their `busy` claim, like `fd`.
    pub retired: AtomicBool,
}

impl ReplayConn {
    pub fn new(port: u16, request: Vec<u8>, until: Vec<u8>, fd: RawFd) -> ReplayConn {
        ReplayConn {
            port,
            request,
            until,
            fd: AtomicI32::new(fd),
            busy: AtomicBool::new(false),
            match_pos: AtomicUsize::new(0),
            outstanding: AtomicU32::new(0),
            broken: AtomicBool::new(false),
            fresh: None,
            retired: AtomicBool::new(false),
        }
    }

    /// A port whose warm-ups go on fresh connections ([`crate::fresh`]).
    pub fn fresh(port: u16, request: Vec<u8>, until: Vec<u8>) -> ReplayConn {
        ReplayConn {
            fresh: Some(FreshConns::new(port)),
            ..ReplayConn::new(port, request, until, -1)
        }
    }

    /// Control thread: install `new_fd` (or -1) and close the previous fd once no worker uses
    /// it. Returns false if a worker held the connection for over 100 ms (the old fd is then
    /// leaked rather than risking a close under a user).
    /// In fresh mode the connection is retired instead (`new_fd` must be -1) and its open
    /// warm-up connections closed.
    pub fn replace_fd(&self, new_fd: RawFd) -> bool {
        self.retired.store(self.fresh.is_some(), Ordering::SeqCst);
        let old = self.fd.swap(new_fd, Ordering::SeqCst);
        let t0 = std::time::Instant::now();
        while self.busy.load(Ordering::SeqCst) {
            if t0.elapsed() > std::time::Duration::from_millis(100) {
                return false;
            }
            std::thread::sleep(std::time::Duration::from_micros(50));
        }
        self.match_pos.store(0, Ordering::Relaxed);
        self.outstanding.store(0, Ordering::Relaxed);
        crate::fdreg::close_own_fd(old);
        if let Some(f) = &self.fresh {
            f.close_all();
        }
        true
    }
}

/// A `lines` preheat split over extra CPUs.
pub struct Split {
    pub par: Arc<ParallelPreheater>,
    /// The piece the serving core's worker runs itself.
    pub local: Vec<AbsRun>,
    /// One piece per extra CPU.
    pub pieces: Vec<Vec<AbsRun>>,
}

pub struct PortPlan {
    pub port: u16,
    /// Resolved runs in priority order; empty if the profile has no class for the port.
    pub runs: Vec<AbsRun>,
    pub split: Option<Split>,
    pub replay: Option<Arc<ReplayConn>>,
}

#[derive(Default)]
pub struct Plan {
    pub ports: Vec<PortPlan>,
}

impl Plan {
    pub fn port(&self, port: u16) -> Option<&PortPlan> {
        self.ports.iter().find(|p| p.port == port)
    }
}

/// The control thread's wake eventfd (-1: none): workers that find a replay connection broken
/// wake the control thread through it.
static CONTROL_WAKE_FD: AtomicI32 = AtomicI32::new(-1);

/// Start-up (and fork child, with -1): the control thread's wake eventfd.
pub fn set_control_wake_fd(fd: RawFd) {
    CONTROL_WAKE_FD.store(fd, Ordering::SeqCst);
}

/// Ask the control thread to look at broken replay connections.
pub fn wake_control() {
    let fd = CONTROL_WAKE_FD.load(Ordering::Relaxed);
    if fd >= 0 {
        sys::eventfd_signal(fd);
    }
}

pub static PLAN: ForkCell<Option<Arc<Plan>>> = ForkCell::new(None);

/// The plan slot is being swapped right now.
#[derive(Debug)]
pub struct PlanBusy;

/// Worker side: the current plan without blocking.
pub fn current() -> Result<Option<Arc<Plan>>, PlanBusy> {
    PLAN.try_with(|p| p.clone()).ok_or(PlanBusy)
}

/// Control side: publish `plan`, returning the previous one (to be retired, never dropped here).
pub fn publish(plan: Arc<Plan>) -> Option<Arc<Plan>> {
    PLAN.with(|p| p.replace(plan))
}

/// Fork child: forget the parent's plan without dropping it (its split-preheater threads do not
/// exist here, so dropping it would join threads that never run).
///
/// # Safety
/// Only from the `pthread_atfork` child handler (see [`ForkCell::reclaim_in_fork_child`]).
pub unsafe fn reset_after_fork() {
    // SAFETY: the caller is the fork child handler.
    unsafe { PLAN.reclaim_in_fork_child(None) };
}

/// Ports with a measured `auto` choice at most.
pub const AUTO_PORTS: usize = 64;
/// An entry of [`AUTO_CHOICES`]: `SET | port << 8 | strategies`, 0 = free.
const AUTO_SET: u32 = 1 << 31;
/// The measured `auto` choice per port (`Request::SetAuto`): written by the control thread,
/// read by the trigger thread with one atomic load per entry (no lock, no allocation). Kept by
/// a fork child: its ports are the parent's.
static AUTO_CHOICES: [AtomicU32; AUTO_PORTS] = [const { AtomicU32::new(0) }; AUTO_PORTS];

/// Control thread: set (or with `None` forget) what `auto` does for `port`. Errors when the
/// table is full.
pub fn set_auto(port: u16, st: Option<Strategies>) -> Result<(), String> {
    let entry = |e: u32| e & AUTO_SET != 0 && (e >> 8) & 0xffff == u32::from(port);
    if let Some(slot) = AUTO_CHOICES
        .iter()
        .find(|e| entry(e.load(Ordering::Acquire)))
    {
        slot.store(
            st.map_or(0, |s| AUTO_SET | u32::from(port) << 8 | u32::from(s.0)),
            Ordering::Release,
        );
        return Ok(());
    }
    let Some(s) = st else { return Ok(()) };
    let value = AUTO_SET | u32::from(port) << 8 | u32::from(s.0);
    AUTO_CHOICES
        .iter()
        .find(|e| {
            e.compare_exchange(0, value, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        })
        .map(|_| ())
        .ok_or_else(|| format!("set_auto: measured choices for {AUTO_PORTS} ports at most"))
}

/// Trigger thread: the measured `auto` choice for `port`, if one was set.
pub fn auto_for(port: u16) -> Option<Strategies> {
    AUTO_CHOICES.iter().find_map(|e| {
        let v = e.load(Ordering::Acquire);
        (v & AUTO_SET != 0 && (v >> 8) & 0xffff == u32::from(port))
            .then_some(Strategies((v & 0xff) as u8))
    })
}

/// What an announcement's strategies mean here: its `auto` bit replaced by the port's measured
/// choice, or by [`Strategies::AUTO_UNMEASURED`] (second value true) where there is none.
pub fn resolve_auto(st: Strategies, port: u16) -> (Strategies, bool) {
    if !st.contains(Strategies::AUTO) {
        return (st, false);
    }
    let rest = st.without(Strategies::AUTO);
    match auto_for(port) {
        Some(c) => (rest.union(c), false),
        None => (rest.union(Strategies::AUTO_UNMEASURED), true),
    }
}

#[cfg(test)]
mod auto_tests {
    use super::*;

    #[test]
    fn set_resolve_forget() {
        let port = 61_234;
        assert_eq!(
            resolve_auto(Strategies::AUTO, port),
            (Strategies::AUTO_UNMEASURED, true)
        );
        set_auto(port, Some(Strategies::REPLAY)).unwrap();
        assert_eq!(auto_for(port), Some(Strategies::REPLAY));
        assert_eq!(
            resolve_auto(Strategies::AUTO.union(Strategies::WAKE), port),
            (Strategies(5), false)
        );
        // A measured "nothing helps" is a choice too: announce nothing.
        set_auto(port, Some(Strategies::NONE)).unwrap();
        assert_eq!(
            resolve_auto(Strategies::AUTO, port),
            (Strategies::NONE, false)
        );
        // Other bits pass through untouched.
        assert_eq!(
            resolve_auto(Strategies::LINES, port),
            (Strategies::LINES, false)
        );
        set_auto(port, None).unwrap();
        assert_eq!(auto_for(port), None);
    }
}
