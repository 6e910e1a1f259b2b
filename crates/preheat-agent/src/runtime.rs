//! Start-up, fork and exit handling (the top layer: it starts every other part).
//!
//! # Start-up
//!
//! A `.init_array` constructor resolves the real libc functions, decides whether to attach
//! (`PREHEAT_AGENT_DISABLE`, `PREHEAT_AGENT_ONLY`, and whether this object is the LD_PRELOAD
//! library at all rather than the rlib linked into some executable), prepares the run
//! directory and spawns the control thread. That thread leaves the host's file table
//! ([`crate::fdreg`]), binds the control and trigger sockets and starts the other threads (one
//! pinned worker per online CPU, the trigger thread, communication detection if asked): spawned
//! from it, they share its table. The constructor waits for its report (bounded, 5 s: a thread
//! start, a few sockets and thread starts; the new threads take no loader lock, which is not
//! held while an LD_PRELOAD object's constructor runs at start-up, nor in a fork child's
//! handlers), so the sockets exist and the threads run before `main`, as when the constructor
//! did it all itself; nothing else waits for the agent's threads.
//!
//! # Fork
//!
//! `fork` copies only the calling thread, so a forked child (nginx workers, `memcached -d`)
//! would have an agent without threads. A `pthread_atfork` child handler therefore resets the
//! per-process state (thread table, port counters, preheat counters; the fd→port tables stay
//! valid because the child inherits the fds), forgets the parent's agent fds (closing them
//! where the agent shared the host's table; in a private table the child never had them, and
//! their numbers are the host's), forgets (leaks) the
//! parent's plan (its split-preheater threads do not exist in the child, so dropping it would
//! join threads that never run), and starts as the constructor does: a fresh control thread
//! that leaves the child's table, fresh sockets named after the child's pid, fresh threads. Allocating and creating threads in the child handler is sound with glibc: its
//! `fork` re-initialises the malloc arenas (`__malloc_fork_unlock_child`) and the loader locks
//! before it runs the child handlers. There is no prepare handler: the state another thread may
//! hold at the moment of the fork (the published plan, the disable reason) lives in
//! [`crate::forkcell::ForkCell`]s, which the child handler takes back without waiting, so the
//! agent never makes the host's `fork` wait for a lock (the classic protocol — lock in the
//! prepare handler — could deadlock against an allocator's own atfork handlers; see
//! [`crate::forkcell`]). The configuration read from the
//! environment is cached at start-up, so the child handler does not touch the environment
//! (whose lock another parent thread might have held).
//!
//! # Exit
//!
//! A `.fini_array` destructor removes this pid's socket files (only in the process that created
//! them). Sockets of pids that no longer exist are removed by any agent that starts in the same
//! run directory.

use std::os::unix::fs::DirBuilderExt;
use std::os::unix::net::{UnixDatagram, UnixListener};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use crate::config::{self, Config};
use crate::counters::STATS;
use crate::fdreg::register_fd;
use crate::log::{log, RUN_DIR_TRUSTED};
use crate::plan;
use crate::threads::spawn_agent_thread;
use crate::{control, fdreg, socket_paths, sys, threads, track, worker};

/// Pid whose sockets this process created (0: none).
static STARTED_PID: AtomicU32 = AtomicU32::new(0);
static ATFORK_REGISTERED: AtomicBool = AtomicBool::new(false);
/// The pid whose environment asked for a communication report at exit (0: none).
static COMM_OUT_PID: AtomicU32 = AtomicU32::new(0);

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
            if let Some(out) = config::config().and_then(|c| c.comm_out.as_deref()) {
                crate::comm::write_report(out);
            }
        }
        if pid != 0 && pid == sys::getpid() {
            if let Some(c) = config::config() {
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
    config::set_agent_so(so_path);
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
        idle_poll: env_nonempty("PREHEAT_NO_IDLE_POLL").is_none_or(|v| v == "0"),
        replay_hold: env_nonempty("PREHEAT_NO_REPLAY_HOLD").is_none_or(|v| v == "0"),
        comm: comm.as_ref().ok().copied().flatten(),
        comm_out: env_nonempty("PREHEAT_COMM_OUT"),
        shared_fds: env_nonempty("PREHEAT_AGENT_SHARED_FDS").is_some_and(|v| v != "0"),
    };
    if cfg.comm_out.is_some() {
        COMM_OUT_PID.store(sys::getpid(), Ordering::SeqCst);
    }
    config::set(cfg);
    if let Err(e) = comm {
        log(&format!("communication detection not started: {e}"));
    }
    std::panic::set_hook(Box::new(|info| {
        log(&format!("panic: {info}"));
    }));
    if let Err(e) = register_fork_handler() {
        // Without fork handling a forked child simply has no agent threads.
        log(&format!(
            "pthread_atfork failed ({e}): forked children will run without an agent"
        ));
    }
    if let Err(e) = start(&missing) {
        log(&format!("agent not started: {e}"));
        track::ACTIVE.store(false, Ordering::SeqCst);
    }
}

/// Bind the sockets and start the threads for the current pid. The calling (host) thread only
/// prepares the run directory and spawns the control thread, which leaves the host's file
/// table ([`crate::fdreg`]), binds the sockets, starts every other agent thread (so they share
/// its table) and reports back; the caller waits for that report (at most
/// [`START_WAIT`]), so, as when the constructor did all of it itself, the agent's sockets
/// exist and its threads run before `main` (or the fork child's code) does.
fn start(missing: &[&str]) -> std::io::Result<()> {
    let Some(cfg) = config::config() else {
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
    let (tx, rx) = std::sync::mpsc::channel::<std::io::Result<String>>();
    let profile = cfg.profile.clone();
    spawn_agent_thread("preheat-control".into(), move || {
        let table = if cfg.shared_fds {
            Err("PREHEAT_AGENT_SHARED_FDS=1".to_string())
        } else {
            fdreg::leave_host_table()
        };
        let paths = socket_paths(&cfg.run_dir, pid);
        match start_on_agent_thread(cfg, pid, &paths, &table) {
            Ok((listener, wake, what)) => {
                if tx.send(Ok(what.clone())).is_err() {
                    log(&what);
                }
                control::control_main(listener, wake, profile)
            }
            Err(e) => {
                track::ACTIVE.store(false, Ordering::SeqCst);
                if let Err(e) = tx.send(Err(e)) {
                    if let Err(e) = e.0 {
                        log(&format!("agent not started: {e}"));
                    }
                }
            }
        }
    })?;
    match rx.recv_timeout(START_WAIT) {
        Ok(Ok(what)) => {
            let exe = std::fs::read_link("/proc/self/exe").unwrap_or_default();
            log(&format!(
                "attached to {} (pid {pid}): control {}, trigger {}, {what}{}",
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
        Ok(Err(e)) => Err(e),
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            log(&format!(
                "the control thread has not reported its start-up within {START_WAIT:?}: \
                 continuing without waiting for it"
            ));
            Ok(())
        }
        // Its body panicked (and disabled the agent).
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => Err(std::io::Error::other(
            "the control thread ended during start-up",
        )),
    }
}

/// How long the host thread waits for the control thread's start-up (normally well under a
/// millisecond: a thread start, a few sockets and thread starts).
const START_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// The start-up on the control thread, in the file table it is in (`table`: the agent's own,
/// or why the host's): bind the sockets, start the workers, the trigger thread and
/// communication detection. Returns the control socket, the wake eventfd and what started.
fn start_on_agent_thread(
    cfg: &Config,
    pid: u32,
    paths: &crate::SocketPaths,
    table: &Result<fdreg::Left, String>,
) -> std::io::Result<(UnixListener, i32, String)> {
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
    plan::set_control_wake_fd(wake);
    STARTED_PID.store(pid, Ordering::SeqCst);
    // Before the hooks track: busy periods are stamped in one unit for the process's life.
    preheat_engine::time::enable_tsc_stamps();
    track::ENABLED.store(true, Ordering::SeqCst);
    track::ACTIVE.store(true, Ordering::SeqCst);
    let n = worker::start_workers()?;
    spawn_agent_thread("preheat-trigger".into(), move || worker::trigger_main(trig))?;
    if let Some(c) = cfg.comm {
        if let Err(e) = crate::comm::start(c, true) {
            log(&format!("communication detection not started: {e}"));
        }
    }
    let table = match table {
        Ok(fdreg::Left::Empty) => "a file table of their own".to_string(),
        Ok(fdreg::Left::Copied) => {
            "a file table of their own (unshared, the host's fds closed in it)".to_string()
        }
        Err(why) => format!("the host's file table ({why})"),
    };
    Ok((
        listener,
        wake,
        format!("{n} workers; agent threads on {table}"),
    ))
}

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

/// Register the fork child handler (once per process; the constructor, and tests).
pub(crate) fn register_fork_handler() -> std::io::Result<()> {
    if ATFORK_REGISTERED.swap(true, Ordering::SeqCst) {
        return Ok(());
    }
    sys::register_atfork_child(atfork_child)
}

/// The fork child handler. There is deliberately no prepare handler: nothing the agent holds can
/// make `fork` wait (see [`crate::forkcell`]).
unsafe extern "C" fn atfork_child() {
    let _ = std::panic::catch_unwind(atfork_child_inner);
}

fn atfork_child_inner() {
    // SAFETY: this is the fork child handler; the child has only the forking thread.
    unsafe { plan::reset_after_fork() };
    // SAFETY: this is the fork child handler; the child has only the forking thread.
    unsafe { crate::log::reset_after_fork() };
    // A fork while the control thread was inside a probe pass: the child gets the program's
    // fault dispositions back.
    crate::faults::reset_after_fork();
    if !track::ACTIVE.swap(false, Ordering::SeqCst) {
        return;
    }
    fdreg::close_all_after_fork();
    plan::set_control_wake_fd(-1);
    threads::reset_after_fork();
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
mod fork_tests {
    use super::*;
    use crate::log::{disabled_reason, DISABLED_REASON};
    use std::sync::atomic::AtomicBool;
    use std::sync::{mpsc, Arc};
    use std::time::{Duration, Instant};

    /// Issue 13: fork from one thread while another thread holds the published plan and the
    /// disable reason. The parent's `fork` must not wait for the holder (it returns while the
    /// holder still holds both), and the child must work: publish and read a plan, set and read
    /// a reason (with the classic atfork protocol the child would inherit both locked, and with
    /// a prepare handler that waits, `fork` would wait for the holder, which here waits for
    /// `fork`: the holder gives up after 10 s and the test fails instead of hanging).
    #[test]
    fn fork_while_another_thread_holds_the_agents_state() {
        static RELEASED: AtomicBool = AtomicBool::new(false);
        register_fork_handler().unwrap();
        let (held_tx, held_rx) = mpsc::channel();
        let (forked_tx, forked_rx) = mpsc::channel::<()>();
        let holder = std::thread::spawn(move || {
            plan::PLAN.with(|_| {
                DISABLED_REASON.with(|_| {
                    held_tx.send(()).unwrap();
                    let _ = forked_rx.recv_timeout(Duration::from_secs(10));
                    RELEASED.store(true, Ordering::SeqCst);
                })
            })
        });
        held_rx.recv().unwrap();
        // SAFETY: fork(2); the child only publishes/reads agent state and leaves with _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            // The child: only the forking thread exists; the holder's locks were taken back.
            plan::publish(Arc::new(plan::Plan::default()));
            let has_plan = matches!(plan::current(), Ok(Some(_)));
            DISABLED_REASON.with(|r| *r = Some("child".into()));
            let ok = has_plan && disabled_reason().as_deref() == Some("child");
            // SAFETY: _exit ends the child at once (no destructors or atexit handlers of the
            // test harness run in it).
            unsafe { libc::_exit(if ok { 0 } else { 1 }) };
        }
        let forked_while_held = !RELEASED.load(Ordering::SeqCst);
        let _ = forked_tx.send(()); // the holder may have given up already
        holder.join().unwrap();
        let mut status = 0;
        let t0 = Instant::now();
        let done = loop {
            // SAFETY: waitpid on our own child with a valid status pointer.
            let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
            if r == pid {
                break true;
            }
            if t0.elapsed() > Duration::from_secs(10) {
                // SAFETY: kill and reap our own child.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                    libc::waitpid(pid, &mut status, 0);
                }
                break false;
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        assert!(
            forked_while_held,
            "fork waited for the thread holding the plan and the reason"
        );
        assert!(done, "the fork child hung (on state inherited locked)");
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "the fork child could not use the plan or the reason (status {status:#x})"
        );
        // The parent's state works too.
        assert!(plan::current().is_ok());
        assert_eq!(disabled_reason(), None);
    }
}
