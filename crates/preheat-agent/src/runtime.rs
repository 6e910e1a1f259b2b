//! Start-up, configuration, logging, fork and exit handling.
//!
//! # Start-up
//!
//! A `.init_array` constructor resolves the real libc functions, decides whether to attach
//! (`PREHEAT_AGENT_DISABLE`, `PREHEAT_AGENT_ONLY`, and whether this object is the LD_PRELOAD
//! library at all rather than the rlib linked into some executable), then binds the control and
//! trigger sockets and starts the threads: one pinned worker per online CPU, the trigger thread
//! and the control thread. Nothing waits for those threads (the loader lock is held while
//! constructors run).
//!
//! # Fork
//!
//! `fork` copies only the calling thread, so a forked child (nginx workers, `memcached -d`)
//! would have an agent without threads. A `pthread_atfork` child handler therefore resets the
//! per-process state (thread table, port counters, preheat counters; the fd→port tables stay
//! valid because the child inherits the fds), closes the parent's agent fds, forgets (leaks) the
//! parent's plan (its split-preheater threads do not exist in the child, so dropping it would
//! join threads that never run), and starts fresh sockets named after the child's pid and fresh
//! threads. Allocating and creating threads in the child handler is sound with glibc: its
//! `fork` re-initialises the malloc arenas (`__malloc_fork_unlock_child`) and the loader locks
//! before it runs the child handlers. Our own static lock ([`crate::plan::PLAN`]) is taken in
//! the prepare handler and released in the parent and child handlers, the classic atfork
//! protocol, so a fork can never copy it in a locked state. The configuration read from the
//! environment is cached at start-up, so the child handler does not touch the environment
//! (whose lock another parent thread might have held).
//!
//! # Exit
//!
//! A `.fini_array` destructor removes this pid's socket files (only in the process that created
//! them). Sockets of pids that no longer exist are removed by any agent that starts in the same
//! run directory.

use std::cell::RefCell;
use std::os::fd::RawFd;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::os::unix::net::{UnixDatagram, UnixListener};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};

use crate::plan::{Plan, PLAN};
use crate::stats::STATS;
use crate::{control, socket_paths, sys, track, worker};

/// Configuration from the environment, read once by the constructor.
#[derive(Debug, Clone)]
pub struct Config {
    pub run_dir: PathBuf,
    pub profile: Option<String>,
    pub log: Option<PathBuf>,
    /// `PREHEAT_WAKE_PLANNER=1`: the `wake` strategy asks a running wake planner for a window
    /// instead of spinning (see [`crate::wakeplan`]; off by default: measured slower here).
    pub wake_planner: bool,
    /// `PREHEAT_COMM=1`: start communication detection with the agent (see [`crate::comm`]).
    pub comm: Option<preheat_model::comm::CommConfig>,
    /// `PREHEAT_COMM_OUT`: write the final communication report there at exit.
    pub comm_out: Option<String>,
}

static CONFIG: OnceLock<Config> = OnceLock::new();
/// Path of the agent's shared object (from `dladdr`).
static AGENT_SO: OnceLock<String> = OnceLock::new();
/// Pid whose sockets this process created (0: none).
static STARTED_PID: AtomicU32 = AtomicU32::new(0);
static CONTROL_WAKE_FD: AtomicI32 = AtomicI32::new(-1);
static ATFORK_REGISTERED: AtomicBool = AtomicBool::new(false);
/// Why the agent disabled itself.
pub static DISABLED_REASON: Mutex<Option<String>> = Mutex::new(None);

/// fds the agent owns (closed in a fork child).
static AGENT_FDS: [AtomicI32; 64] = [const { AtomicI32::new(-1) }; 64];
/// An address inside the stack of every agent thread (to exclude them from probe candidates).
static AGENT_STACKS: [AtomicU64; 512] = [const { AtomicU64::new(0) }; 512];
/// The kernel thread ids of the agent's threads.
static AGENT_TIDS: [AtomicU32; 512] = [const { AtomicU32::new(0) }; 512];
/// The pid whose environment asked for a communication report at exit (0: none).
static COMM_OUT_PID: AtomicU32 = AtomicU32::new(0);

pub fn config() -> Option<&'static Config> {
    CONFIG.get()
}

pub fn agent_so_path() -> Option<&'static str> {
    AGENT_SO.get().map(|s| s.as_str())
}

pub fn register_fd(fd: RawFd) {
    set_fd_bit(fd, true);
    for s in AGENT_FDS.iter() {
        if s.compare_exchange(-1, fd, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            return;
        }
    }
}

/// Close an fd the agent registered: unregister it first, so the number is never left marked as
/// the agent's once the host may be handed it again (the hooked `close()` would then refuse to
/// close the host's fd, and a forked child would close it). The one way to close a registered fd.
pub fn close_own_fd(fd: RawFd) {
    if fd < 0 {
        return;
    }
    unregister_fd(fd);
    sys::close_fd(fd);
}

pub fn unregister_fd(fd: RawFd) {
    set_fd_bit(fd, false);
    for s in AGENT_FDS.iter() {
        if s.compare_exchange(fd, -1, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            return;
        }
    }
}

/// One bit per fd below [`track::MAX_FDS`]: the fd belongs to the agent.
static AGENT_FD_BITS: [AtomicU64; track::MAX_FDS / 64] =
    [const { AtomicU64::new(0) }; track::MAX_FDS / 64];

fn set_fd_bit(fd: RawFd, on: bool) {
    let Ok(i) = usize::try_from(fd) else { return };
    if let Some(w) = AGENT_FD_BITS.get(i / 64) {
        let bit = 1u64 << (i % 64);
        if on {
            w.fetch_or(bit, Ordering::AcqRel);
        } else {
            w.fetch_and(!bit, Ordering::AcqRel);
        }
    }
}

/// The first agent fd in `[from, to]`, if any (allocation-free; used by `close_range`).
pub fn next_agent_fd(from: u32, to: u32) -> Option<u32> {
    let to = to.min(track::MAX_FDS as u32 - 1);
    let mut fd = from;
    while fd <= to {
        let w = AGENT_FD_BITS.get(fd as usize / 64)?.load(Ordering::Relaxed) >> (fd % 64);
        if w == 0 {
            fd = (fd / 64 + 1) * 64;
            continue;
        }
        let hit = fd + w.trailing_zeros();
        return (hit <= to).then_some(hit);
    }
    None
}

/// Whether `fd` is one of the agent's own (allocation-free; used by the `close` hook).
#[inline]
pub fn is_agent_fd(fd: RawFd) -> bool {
    let Ok(i) = usize::try_from(fd) else {
        return false;
    };
    AGENT_FD_BITS
        .get(i / 64)
        .is_some_and(|w| w.load(Ordering::Relaxed) & (1u64 << (i % 64)) != 0)
}

fn register_stack(addr: u64) {
    for s in AGENT_STACKS.iter() {
        if s.compare_exchange(0, addr, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            break;
        }
    }
    let tid = preheat_engine::os::gettid();
    for t in AGENT_TIDS.iter() {
        if t.compare_exchange(0, tid, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            return;
        }
    }
}

/// Whether `tid` is one of the agent's own threads.
pub fn is_agent_tid(tid: u32) -> bool {
    tid != 0 && AGENT_TIDS.iter().any(|t| t.load(Ordering::Relaxed) == tid)
}

/// Addresses inside the agent's thread stacks.
pub fn agent_stack_addresses() -> Vec<u64> {
    AGENT_STACKS
        .iter()
        .map(|s| s.load(Ordering::Relaxed))
        .filter(|&a| a != 0)
        .collect()
}

/// Append a line to the agent log (control, trigger and start-up paths only; never hooks).
///
/// The file is opened for every line (logging is rare): a long-lived log fd could be closed
/// behind the agent's back (`close_range` in a daemonising host) and its number reused for one
/// of the host's files, which the agent would then write into.
pub fn log(msg: &str) {
    let Some(cfg) = CONFIG.get() else { return };
    let pid = sys::getpid();
    if cfg.log.is_none() && !RUN_DIR_TRUSTED.load(Ordering::Relaxed) {
        // Never write into a run directory we did not accept (see `check_run_dir`).
        eprintln!("preheat-agent[{pid}]: {msg}");
        return;
    }
    let path = cfg
        .log
        .clone()
        .unwrap_or_else(|| socket_paths(&cfg.run_dir, pid).log);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let line = format!(
        "{}.{:06} preheat-agent[{pid}]: {msg}\n",
        t.as_secs(),
        t.subsec_micros()
    );
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .mode(0o600)
        .open(&path)
    {
        let _ = std::io::Write::write_all(&mut f, line.as_bytes());
    }
}

/// Disable the agent (hooks pass through) and record why.
pub fn disable(reason: String) {
    track::ENABLED.store(false, Ordering::SeqCst);
    log(&format!("agent disabled: {reason}"));
    if let Ok(mut g) = DISABLED_REASON.try_lock() {
        *g = Some(reason);
    }
}

/// Ask the control thread to look at broken replay connections.
pub fn wake_control() {
    let fd = CONTROL_WAKE_FD.load(Ordering::Relaxed);
    if fd >= 0 {
        sys::eventfd_signal(fd);
    }
}

/// Spawn one of the agent's own threads: marked (hooks pass through), stack registered, body
/// wrapped in `catch_unwind` (a panic disables the agent instead of taking the host down).
pub fn spawn_agent_thread<F>(name: String, f: F) -> std::io::Result<()>
where
    F: FnOnce() + Send + 'static,
{
    let tname = name.clone();
    std::thread::Builder::new()
        .name(name)
        // Explicit, so std never consults RUST_MIN_STACK (the environment) here, which matters
        // in a fork child.
        .stack_size(512 * 1024)
        .spawn(move || {
            track::mark_agent_thread();
            let marker = 0u8;
            register_stack(std::hint::black_box(&marker) as *const u8 as u64);
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
            if let Err(p) = r {
                disable(format!(
                    "agent thread {tname} panicked: {}",
                    panic_message(&p)
                ));
            }
        })
        .map(|_| ())
}

pub fn panic_message(p: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic".to_string()
    }
}

// ------------------------------------------------------------------------- constructor

#[used]
#[link_section = ".init_array"]
static INIT: extern "C" fn() = agent_init;

#[used]
#[link_section = ".fini_array"]
static FINI: extern "C" fn() = agent_fini;

extern "C" fn agent_init() {
    let _ = std::panic::catch_unwind(init);
}

extern "C" fn agent_fini() {
    let _ = std::panic::catch_unwind(|| {
        let pid = STARTED_PID.load(Ordering::SeqCst);
        if COMM_OUT_PID.load(Ordering::SeqCst) == sys::getpid() {
            if let Some(out) = CONFIG.get().and_then(|c| c.comm_out.as_deref()) {
                crate::comm::write_report(out);
            }
        }
        if pid != 0 && pid == sys::getpid() {
            if let Some(c) = CONFIG.get() {
                let p = socket_paths(&c.run_dir, pid);
                let _ = std::fs::remove_file(&p.control);
                let _ = std::fs::remove_file(&p.trigger);
            }
        }
    });
}

fn env_nonempty(k: &str) -> Option<String> {
    std::env::var(k).ok().filter(|v| !v.is_empty())
}

fn init() {
    let missing = sys::resolve_real_functions();
    crate::comm::note_main_thread();
    // Are we the LD_PRELOAD object, or the rlib statically linked into some executable (a test
    // or a tool that uses `socket_paths`)? Only the former attaches.
    let me = sys::object_of(agent_init as *const () as usize);
    let main_base = sys::main_executable_base();
    let Some((so_path, base)) = me else {
        return;
    };
    if Some(base) == main_base {
        return;
    }
    let so_path = std::fs::canonicalize(&so_path)
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or(so_path);
    let _ = AGENT_SO.set(so_path);
    if env_nonempty("PREHEAT_AGENT_DISABLE").is_some_and(|v| v != "0") {
        // Loaded but pure pass-through: no threads, no sockets.
        return;
    }
    if let Some(only) = env_nonempty("PREHEAT_AGENT_ONLY") {
        let exe = std::fs::read_link("/proc/self/exe").unwrap_or_default();
        let base = exe
            .file_name()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        if !only.split(',').any(|n| n.trim() == base) {
            return;
        }
    }
    let comm = crate::comm::config_from_env();
    let cfg = Config {
        run_dir: crate::run_dir_from_env(),
        profile: env_nonempty("PREHEAT_PROFILE"),
        log: env_nonempty("PREHEAT_AGENT_LOG").map(PathBuf::from),
        wake_planner: env_nonempty("PREHEAT_WAKE_PLANNER").is_some_and(|v| v != "0"),
        comm: comm.as_ref().ok().copied().flatten(),
        comm_out: env_nonempty("PREHEAT_COMM_OUT"),
    };
    if cfg.comm_out.is_some() {
        COMM_OUT_PID.store(sys::getpid(), Ordering::SeqCst);
    }
    let _ = CONFIG.set(cfg);
    if let Err(e) = comm {
        log(&format!("communication detection not started: {e}"));
    }
    std::panic::set_hook(Box::new(|info| {
        log(&format!("panic: {info}"));
    }));
    if !ATFORK_REGISTERED.swap(true, Ordering::SeqCst) {
        if let Err(e) = sys::register_atfork(atfork_prepare, atfork_parent, atfork_child) {
            // Without fork handling a forked child simply has no agent threads.
            log(&format!(
                "pthread_atfork failed ({e}): forked children will run without an agent"
            ));
        }
    }
    if let Err(e) = start(&missing) {
        log(&format!("agent not started: {e}"));
        track::ACTIVE.store(false, Ordering::SeqCst);
    }
}

/// Bind the sockets and start the threads for the current pid.
fn start(missing: &[&str]) -> std::io::Result<()> {
    let Some(cfg) = CONFIG.get() else {
        return Ok(());
    };
    let pid = sys::getpid();
    let paths = socket_paths(&cfg.run_dir, pid);
    if !cfg.run_dir.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&cfg.run_dir)?;
    }
    check_run_dir(&cfg.run_dir)?;
    remove_stale_sockets(&cfg.run_dir);
    let _ = std::fs::remove_file(&paths.control);
    let _ = std::fs::remove_file(&paths.trigger);
    let listener = UnixListener::bind(&paths.control).map_err(|e| {
        std::io::Error::new(
            e.kind(),
            format!("binding {}: {e}", paths.control.display()),
        )
    })?;
    let trig = UnixDatagram::bind(&paths.trigger).map_err(|e| {
        std::io::Error::new(
            e.kind(),
            format!("binding {}: {e}", paths.trigger.display()),
        )
    })?;
    let wake = sys::eventfd()?;
    register_fd(std::os::fd::AsRawFd::as_raw_fd(&listener));
    register_fd(std::os::fd::AsRawFd::as_raw_fd(&trig));
    register_fd(wake);
    CONTROL_WAKE_FD.store(wake, Ordering::SeqCst);
    STARTED_PID.store(pid, Ordering::SeqCst);
    track::ENABLED.store(true, Ordering::SeqCst);
    track::ACTIVE.store(true, Ordering::SeqCst);
    let n = worker::start_workers()?;
    spawn_agent_thread("preheat-trigger".into(), move || worker::trigger_main(trig))?;
    let profile = cfg.profile.clone();
    spawn_agent_thread("preheat-control".into(), move || {
        control::control_main(listener, wake, profile)
    })?;
    if let Some(c) = cfg.comm {
        if let Err(e) = crate::comm::start(c, true) {
            log(&format!("communication detection not started: {e}"));
        }
    }
    let exe = std::fs::read_link("/proc/self/exe").unwrap_or_default();
    log(&format!(
        "attached to {} (pid {pid}): control {}, trigger {}, {n} workers{}",
        exe.display(),
        paths.control.display(),
        paths.trigger.display(),
        if missing.is_empty() {
            String::new()
        } else {
            format!(
                "; not found in libc (hooks use raw syscalls): {}",
                missing.join(", ")
            )
        }
    ));
    Ok(())
}

/// Set once the run directory passed [`check_run_dir`].
static RUN_DIR_TRUSTED: AtomicBool = AtomicBool::new(false);

/// The run directory must belong to us and not be world-writable: whoever can write there
/// could replace our sockets or plant a symlink where we write the log. (The sockets themselves
/// get the umask's permissions; connecting needs write permission on them.)
fn check_run_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let md = std::fs::symlink_metadata(dir)?;
    let euid = sys::geteuid();
    if !md.is_dir() || md.uid() != euid || md.mode() & 0o002 != 0 {
        return Err(std::io::Error::other(format!(
            "run directory {} is not a directory owned by uid {euid} and closed to other users \
             (owner {}, mode {:o}): refusing to create agent sockets there",
            dir.display(),
            md.uid(),
            md.mode() & 0o7777
        )));
    }
    RUN_DIR_TRUSTED.store(true, Ordering::Relaxed);
    Ok(())
}

/// Remove socket files of pids that no longer exist.
fn remove_stale_sockets(dir: &Path) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some(rest) = name.strip_prefix("agent-") else {
            continue;
        };
        let Some(pid) = rest
            .strip_suffix(".sock")
            .or_else(|| rest.strip_suffix(".trig"))
        else {
            continue;
        };
        let Ok(pid) = pid.parse::<u32>() else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

// ------------------------------------------------------------------------------- fork

type PlanGuard = MutexGuard<'static, Option<std::sync::Arc<Plan>>>;
type ReasonGuard = MutexGuard<'static, Option<String>>;

thread_local! {
    static FORK_GUARDS: RefCell<(Option<PlanGuard>, Option<ReasonGuard>)> =
        const { RefCell::new((None, None)) };
}

unsafe extern "C" fn atfork_prepare() {
    let _ = std::panic::catch_unwind(|| {
        let p = PLAN.lock().unwrap_or_else(|e| e.into_inner());
        let r = DISABLED_REASON.lock().unwrap_or_else(|e| e.into_inner());
        let _ = FORK_GUARDS.try_with(|g| {
            if let Ok(mut g) = g.try_borrow_mut() {
                *g = (Some(p), Some(r));
            }
        });
    });
}

unsafe extern "C" fn atfork_parent() {
    let _ = std::panic::catch_unwind(|| {
        let _ = FORK_GUARDS.try_with(|g| {
            if let Ok(mut g) = g.try_borrow_mut() {
                *g = (None, None);
            }
        });
    });
}

unsafe extern "C" fn atfork_child() {
    let _ = std::panic::catch_unwind(atfork_child_inner);
}

fn atfork_child_inner() {
    let _ = FORK_GUARDS.try_with(|g| {
        if let Ok(mut g) = g.try_borrow_mut() {
            let (p, r) = std::mem::take(&mut *g);
            if let Some(mut p) = p {
                // The parent's plan references split-preheater threads that do not exist here:
                // leak it rather than run its destructors.
                std::mem::forget(p.take());
            }
            if let Some(mut r) = r {
                *r = None;
            }
        }
    });
    if !track::ACTIVE.swap(false, Ordering::SeqCst) {
        return;
    }
    for s in AGENT_FDS.iter() {
        let fd = s.swap(-1, Ordering::SeqCst);
        if fd >= 0 {
            sys::close_fd(fd);
        }
    }
    for w in AGENT_FD_BITS.iter() {
        w.store(0, Ordering::Relaxed);
    }
    CONTROL_WAKE_FD.store(-1, Ordering::SeqCst);
    for s in AGENT_STACKS.iter() {
        s.store(0, Ordering::Relaxed);
    }
    for t in AGENT_TIDS.iter() {
        t.store(0, Ordering::Relaxed);
    }
    crate::comm::reset_after_fork();
    STARTED_PID.store(0, Ordering::SeqCst);
    track::reset_after_fork();
    worker::reset_after_fork();
    crate::wakeplan::reset_after_fork();
    STATS.reset();
    if let Err(e) = start(&[]) {
        log(&format!("agent not restarted after fork: {e}"));
        track::ACTIVE.store(false, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod fd_registry_tests {
    use super::*;
    use std::os::fd::IntoRawFd;

    /// Regression (issue 13): the wake-planner connection was closed without being unregistered,
    /// so the host's next fd with that number counted as the agent's.
    #[test]
    fn closing_an_own_fd_unregisters_it_first() {
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        let fd = a.into_raw_fd();
        register_fd(fd);
        assert!(is_agent_fd(fd));
        close_own_fd(fd);
        assert!(!is_agent_fd(fd), "a closed fd stays registered");
        assert!(
            !std::path::Path::new(&format!("/proc/self/fd/{fd}")).exists(),
            "the fd is closed"
        );
        // The number, reused by the host, is the host's.
        let again = b.try_clone().unwrap().into_raw_fd();
        assert!(!is_agent_fd(again));
        sys::close_fd(again);
    }
}
