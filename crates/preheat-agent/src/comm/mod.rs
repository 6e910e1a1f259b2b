//! Communication detection in user space: SPCD (Diener et al., IPDPS'13) as Busse et al. use it
//! for partial coscheduling (SAC'15, §2.2), on a stock kernel without modules.
//!
//! SPCD clears the present bit of a sample of pages so that the next access faults; a fault on
//! a page another thread touched before is a communication event. We do the same from inside
//! the process: a sampler thread ([`sampler`]) revokes access to a sample of pages with
//! `mprotect` every round; the SIGSEGV handler ([`signal`]) catches the induced fault, notes the
//! faulting thread, restores access and lets the access re-execute; [`state`] keeps SPCD's
//! last two sharers per granule and the thread × thread matrix.
//!
//! Where we differ from SPCD, deliberately:
//! * `mprotect` instead of the present bit. By default pages are made read-only
//!   ([`CommAccess::Write`]): only writes fault, but the kernel can still read the pages for the
//!   program's system calls (futex waits, `write`, `send`), which a cleared present bit would
//!   let the kernel fault in and `mprotect(PROT_NONE)` would turn into `EFAULT`.
//!   [`CommAccess::Any`] revokes reads too, as SPCD does, at that risk.
//! * The kernel cannot resolve a fault on a revoked page for a system call: such a call fails
//!   with `EFAULT`. The calls the agent interposes (the read and wait families) restore the
//!   revoked pages and retry once ([`efault_retry`]); for others it is a documented limit
//!   (they are rare on the pages we sample: stacks and library data are never sampled).
//! * The fault budget is enforced by construction: a revoked page faults at most once per round,
//!   so at most `pages_per_round / period` faults per second.
//!
//! The host program must never notice: its own SIGSEGVs reach its own handler or kill it as
//! before ([`signal`]); its `sigaction`/`signal` calls see its own disposition; its
//! `mprotect`/`munmap`/`mmap`/`mremap` calls first give back any revoked page they touch
//! ([`MapChange`]); threads are not allowed to keep SIGSEGV blocked while we sample
//! ([`strip_segv`]); any internal error stops detection ([`disable`]) and restores every page.

pub mod changes;
pub mod hooks;
pub mod release;
pub mod sampler;
pub mod signal;
pub mod state;
pub mod uffd;
mod uffd_abi;
pub mod written;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use preheat_model::comm::{CommConfig, CommMechanism, CommReport, CommThread};

use state::{ARMED, ARMED_COUNT, BUSY, COUNTERS, FREE, PAGE, SLOTS};

pub use preheat_model::comm::CommAccess;
pub use release::{efault_retry, strip_segv, MapChange, Release};
pub use state::{altstack_ranges, note_altstack};

/// The mechanism of the running (or last) session: true = userfaultfd, false = mprotect.
pub static USE_UFFD: AtomicBool = AtomicBool::new(false);
/// What the report says about the mechanism (set at start, control thread only).
static MECHANISM: Mutex<String> = Mutex::new(String::new());
/// What the report says about how pages are found (set by the sampler; only `try_lock`ed).
pub static FOCUS: Mutex<String> = Mutex::new(String::new());

/// The sampler should keep running.
pub static RUN: AtomicBool = AtomicBool::new(false);
/// The sampler thread exists (set by `start`, cleared by the thread when it ends).
static SAMPLER_ALIVE: AtomicBool = AtomicBool::new(false);
/// When the current report period began (CLOCK_MONOTONIC ns).
static SINCE_NS: AtomicU64 = AtomicU64::new(0);
/// The running configuration and why detection stopped itself. Only ever `try_lock`ed: a fork
/// may copy it locked into a child, which must not hang on it.
static CONTROL: Mutex<(Option<CommConfig>, Option<String>)> = Mutex::new((None, None));

/// Thread names seen by the sampler (a thread's name is gone from /proc once it exits). Only
/// ever `try_lock`ed, as [`CONTROL`].
static NAMES: Mutex<Vec<(u32, String)>> = Mutex::new(Vec::new());

/// Remember the names of the threads in the matrix (sampler thread, once per round). The
/// names are read before the lock is taken, so the lock is held only for the merge and a
/// report at exit racing this refresh still finds the cache (a thread missing from it is
/// reported without a name).
pub fn refresh_names() {
    let read: Vec<(u32, String)> = state::threads()
        .into_iter()
        .filter_map(|tid| {
            std::fs::read_to_string(format!("/proc/self/task/{tid}/comm"))
                .ok()
                .map(|n| (tid, n.trim_end().to_string()))
        })
        .collect();
    let Some(mut names) = lock_names() else {
        return;
    };
    for (tid, n) in read {
        match names.iter_mut().find(|(t, _)| *t == tid) {
            Some(e) => e.1 = n,
            None => names.push((tid, n)),
        }
    }
}

/// [`NAMES`], waiting a little for a holder (never blocking: a fork child may have inherited
/// it locked, and then gets `None` after ~20 ms).
fn lock_names() -> Option<std::sync::MutexGuard<'static, Vec<(u32, String)>>> {
    for _ in 0..200 {
        if let Ok(g) = NAMES.try_lock() {
            return Some(g);
        }
        std::thread::sleep(std::time::Duration::from_micros(100));
    }
    None
}

/// A copy of the names seen by the sampler (empty if the lock stays taken).
fn cached_names() -> Vec<(u32, String)> {
    lock_names().map(|g| g.clone()).unwrap_or_default()
}

/// The main thread's thread pointer (its TLS block and the kernel's rseq area are next to it).
static MAIN_TP: AtomicU64 = AtomicU64::new(0);

/// Called by the constructor, on the main thread.
pub fn note_main_thread() {
    // SAFETY: pthread_self has no preconditions.
    let tp = unsafe { libc::pthread_self() } as u64;
    MAIN_TP.store(tp, Ordering::Relaxed);
}

/// Start detection with `cfg`: at start-up (`at_start`: only the main thread and the agent's
/// own threads, which are still starting, exist), or later from the control thread, when a
/// program thread that keeps SIGSEGV blocked refuses the start.
pub fn start(cfg: CommConfig, at_start: bool) -> Result<(), String> {
    cfg.validate()?;
    if SAMPLER_ALIVE.load(Ordering::Acquire) {
        return Err("communication detection is already running (stop it first)".into());
    }
    let (use_uffd, described) = choose_mechanism(cfg.mechanism);
    if use_uffd {
        uffd::start()?;
    } else {
        if let Some(tid) = (!at_start)
            .then(|| sampler::thread_persistently_blocking_segv(20, Duration::from_millis(5)))
            .flatten()
        {
            return Err(format!(
                "thread {tid} blocks SIGSEGV: an induced fault would kill the process, so \
                 detection cannot start in it (start the program under `preheat comm --` \
                 instead, where the agent keeps SIGSEGV unblocked from the start, or use the \
                 uffd mechanism)"
            ));
        }
        signal::install()?;
    }
    USE_UFFD.store(use_uffd, Ordering::SeqCst);
    if let Ok(mut g) = MECHANISM.try_lock() {
        *g = described;
    }
    state::GRANULE_SHIFT.store(cfg.granule.trailing_zeros(), Ordering::Relaxed);
    state::reset_counted(cfg.threads == preheat_model::comm::CommThreads::Vcpu);
    let ex = exclusions();
    if let Ok(mut g) = CONTROL.try_lock() {
        *g = (Some(cfg), None);
    }
    SINCE_NS.store(preheat_engine::time::now_ns(), Ordering::Relaxed);
    RUN.store(true, Ordering::Release);
    SAMPLER_ALIVE.store(true, Ordering::Release);
    if use_uffd {
        // The fault thread must never touch heap memory (it would wait on itself for a page
        // it protects): no logging there; its priority is logged by the sampler.
        let r = crate::threads::spawn_agent_thread("preheat-uffd".into(), || {
            uffd::raise_priority();
            uffd::serve();
        });
        if let Err(e) = r {
            RUN.store(false, Ordering::Release);
            SAMPLER_ALIVE.store(false, Ordering::Release);
            uffd::close();
            return Err(format!("cannot start the userfaultfd fault thread: {e}"));
        }
    }
    let r = crate::threads::spawn_agent_thread("preheat-comm".into(), move || {
        sampler::run(cfg, ex);
        if USE_UFFD.load(Ordering::SeqCst) {
            uffd::close();
        }
        SAMPLER_ALIVE.store(false, Ordering::Release);
    });
    if let Err(e) = r {
        RUN.store(false, Ordering::Release);
        SAMPLER_ALIVE.store(false, Ordering::Release);
        uffd::close();
        return Err(format!("cannot start the sampler thread: {e}"));
    }
    crate::log::log(&format!(
        "comm: detection started ({}; {} pages per {} ms, granule {} B, {} faults)",
        MECHANISM.try_lock().map(|g| g.clone()).unwrap_or_default(),
        cfg.pages_per_round(),
        cfg.period_ms,
        cfg.granule,
        cfg.access.name()
    ));
    Ok(())
}

/// Whether to use userfaultfd (else mprotect), and the choice in words.
fn choose_mechanism(mechanism: CommMechanism) -> (bool, String) {
    // Auto is mprotect: it needs no userfaultfd permission (vm.unprivileged_userfaultfd) and no
    // real-time thread, and can see reads too (--access any). Measured here the two cost about
    // the same (README); userfaultfd on request.
    match mechanism {
        CommMechanism::Uffd => (
            true,
            "uffd (userfaultfd write-protect, requested)".to_string(),
        ),
        CommMechanism::Mprotect => (false, "mprotect (requested)".to_string()),
        CommMechanism::Auto => (
            false,
            format!(
                "mprotect (auto; userfaultfd write-protect: {})",
                match uffd::available() {
                    Ok(()) => "available, not chosen".to_string(),
                    Err(e) => e,
                }
            ),
        ),
    }
}

/// What the sampler never protects, besides what it adds every round (loaded objects' images,
/// agent stacks, alternate signal stacks): the agent's own library, the main thread's static TLS
/// and thread control block.
fn exclusions() -> sampler::Exclusions {
    sampler::Exclusions {
        agent_so: crate::config::agent_so_path().map(str::to_string),
        ranges: {
            // The main thread's static TLS block lies just below its thread pointer, its
            // thread control block (with the kernel's rseq area) just above; glibc adds a
            // surplus of a few KiB for objects loaded later.
            let tp = MAIN_TP.load(Ordering::Relaxed);
            let below = crate::sys::static_tls_bytes() + 64 * 1024;
            vec![(tp.saturating_sub(below), tp + 16 * 1024)]
        },
    }
}

/// Stop detection; waits (bounded) for the sampler to restore every page.
pub fn stop() {
    RUN.store(false, Ordering::Release);
    let t0 = std::time::Instant::now();
    while SAMPLER_ALIVE.load(Ordering::Acquire) && t0.elapsed().as_secs() < 5 {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    if let Ok(mut g) = CONTROL.try_lock() {
        g.0 = None;
    }
}

/// Stop detection because something went wrong, and say why.
pub fn disable(reason: String) {
    RUN.store(false, Ordering::Release);
    crate::log::log(&format!("comm: detection disabled: {reason}"));
    if let Ok(mut g) = CONTROL.try_lock() {
        g.1 = Some(reason);
    }
}

/// Zero the matrix and counters (the paper resets after start-up).
pub fn reset() {
    state::reset_counts();
    SINCE_NS.store(preheat_engine::time::now_ns(), Ordering::Relaxed);
}

/// The matrix and counters.
pub fn report() -> CommReport {
    let (cfg, reason) = CONTROL
        .try_lock()
        .map(|g| (g.0, g.1.clone()))
        .unwrap_or((None, None));
    let active = RUN.load(Ordering::Acquire) && SAMPLER_ALIVE.load(Ordering::Acquire);
    // An agent thread writes heap memory in its start-up code before it registers itself, so
    // a fault there may have given it a matrix index: it is never reported as the program's.
    let all = state::threads();
    let keep: Vec<usize> = (0..all.len())
        .filter(|&i| !crate::threads::is_agent_tid(all[i]))
        .collect();
    let tids: Vec<u32> = keep.iter().map(|&i| all[i]).collect();
    // The sampler's names, copied once, and only if a thread has exited.
    let mut cache: Option<Vec<(u32, String)>> = None;
    let threads = tids
        .iter()
        .map(|&tid| {
            let name = std::fs::read_to_string(format!("/proc/self/task/{tid}/comm"))
                .map(|s| s.trim_end().to_string());
            CommThread {
                tid,
                alive: name.is_ok(),
                name: name.unwrap_or_else(|_| {
                    let names = cache.get_or_insert_with(cached_names);
                    let known = names.iter().find(|(t, _)| *t == tid);
                    known.map(|(_, n)| n.clone()).unwrap_or_default()
                }),
            }
        })
        .collect();
    let full = state::matrix(all.len());
    let matrix: Vec<Vec<u64>> = keep
        .iter()
        .map(|&i| keep.iter().map(|&j| full[i][j]).collect())
        .collect();
    let since = SINCE_NS.load(Ordering::Relaxed);
    let c = &COUNTERS;
    CommReport {
        active,
        mechanism: MECHANISM.try_lock().map(|g| g.clone()).unwrap_or_default(),
        config: cfg.unwrap_or_default(),
        threads,
        events: preheat_model::comm::events_of(&matrix),
        matrix,
        faults_induced: c.faults_induced.load(Ordering::Relaxed),
        faults_foreign: c.faults_foreign.load(Ordering::Relaxed),
        efault_retries: c.efault_retries.load(Ordering::Relaxed),
        rounds: c.rounds.load(Ordering::Relaxed),
        pages_revoked: c.pages_revoked.load(Ordering::Relaxed),
        pages_released: c.pages_released.load(Ordering::Relaxed),
        threads_dropped: c.threads_dropped.load(Ordering::Relaxed),
        faults_uncounted: c.faults_uncounted.load(Ordering::Relaxed),
        pages_written: c.pages_written.load(Ordering::Relaxed),
        focus: FOCUS.try_lock().map(|g| g.clone()).unwrap_or_default(),
        elapsed_ns: if since == 0 {
            0
        } else {
            preheat_engine::time::now_ns().saturating_sub(since)
        },
        disabled_reason: reason,
    }
}

/// Fork child: the sampler thread does not exist here; restore every revoked page (the child
/// inherited their protection), forget the parent's threads and counts.
pub fn reset_after_fork() {
    for s in SLOTS.iter() {
        let st = s.state.load(Ordering::Relaxed);
        if st == ARMED || st == BUSY {
            let page = s.page.load(Ordering::Relaxed);
            signal::raw_mprotect(page, PAGE, i32::from(s.prot.load(Ordering::Relaxed)));
        }
        s.page.store(0, Ordering::Relaxed);
        s.state.store(FREE, Ordering::Relaxed);
    }
    ARMED_COUNT.store(0, Ordering::Relaxed);
    // The parent's userfaultfd: its registrations are not inherited (no fork events), and the
    // fd itself is closed with the parent's other agent fds.
    uffd::forget_after_fork();
    RUN.store(false, Ordering::Relaxed);
    SAMPLER_ALIVE.store(false, Ordering::Relaxed);
    state::reset_counts();
    state::reset_threads();
    state::reset_counted(false);
    if let Ok(mut g) = NAMES.try_lock() {
        g.clear();
    }
    if let Ok(mut g) = CONTROL.try_lock() {
        *g = (None, None);
    }
}

/// Configuration from the environment: `PREHEAT_COMM=1` starts detection with the agent,
/// `PREHEAT_COMM_CONFIG` holds a [`CommConfig`] as JSON (absent fields: defaults).
pub fn config_from_env() -> Result<Option<CommConfig>, String> {
    let on = std::env::var("PREHEAT_COMM").is_ok_and(|v| !v.is_empty() && v != "0");
    if !on {
        return Ok(None);
    }
    let cfg = match std::env::var("PREHEAT_COMM_CONFIG") {
        Ok(j) if !j.trim().is_empty() => serde_json::from_str::<CommConfig>(&j)
            .map_err(|e| format!("PREHEAT_COMM_CONFIG is not a valid configuration: {e}"))?,
        _ => CommConfig::default(),
    };
    cfg.validate()?;
    Ok(Some(cfg))
}

/// Write the final report to `path` (at exit, when `PREHEAT_COMM_OUT` is set).
pub fn write_report(path: &str) {
    // `PREHEAT_COMM_DEBUG`: log, per page, the threads whose faults were claimed (from the
    // flight recorder), to see what the sampler looked at.
    if std::env::var_os("PREHEAT_COMM_DEBUG").is_some() {
        let pos = state::TRACE_POS.load(Ordering::Relaxed) as usize;
        let n = state::TRACE.len();
        let mut per: std::collections::BTreeMap<u64, Vec<u64>> = Default::default();
        for j in pos.saturating_sub(n)..pos {
            let w = state::TRACE[j % n].load(Ordering::Relaxed);
            if w >> 56 == state::ev::CLAIM {
                per.entry(state::TRACE_PAGE[j % n].load(Ordering::Relaxed))
                    .or_default()
                    .push((w >> 32) & 0xff_ffff);
            }
        }
        for (p, v) in per.iter().filter(|(_, v)| !v.is_empty()) {
            crate::log::log(&format!("comm debug: claims {p:x}: {v:?}"));
        }
    }
    let r = report();
    if let Ok(text) = serde_json::to_string(&r) {
        let tmp = format!("{path}.tmp");
        if std::fs::write(&tmp, text).is_ok() {
            let _ = std::fs::rename(&tmp, path);
        }
    }
}
