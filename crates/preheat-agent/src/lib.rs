//! `preheat-agent`: the `LD_PRELOAD` library that attaches preheat to an unmodified server.
//!
//! ```text
//! LD_PRELOAD=target/release/libpreheat_agent.so memcached -p 11211 -U 0 -t 2
//! ```
//!
//! What it does inside the host process (paper §3, on stock Linux):
//!
//! * **Request boundaries** ([`track`], [`hooks`]): it interposes the event-wait calls
//!   (`epoll_wait`, `epoll_pwait`, `epoll_pwait2`, `poll`, `ppoll`, `select`, `pselect`), the
//!   accept calls and the read calls (`read`, `recv`, `recvfrom`, `recvmsg`, `readv`, and the
//!   `_FORTIFY_SOURCE` variants `__read_chk`, `__recv_chk`, `__recvfrom_chk`, `__poll_chk`,
//!   `__ppoll_chk`), the write calls (`write`, `writev`, `send`, `sendto`, `sendmsg`: a
//!   blocking reader's reply ends its busy period; one relaxed load for everyone else), plus
//!   `close`, `close_range` and `closefrom` (a closed fd forgets its
//!   port; where the agent shares the host's file table, they also keep a host that closes
//!   "all" fds from closing the agent's sockets under it).
//! * **A file table of its own** ([`fdreg`]): the agent's threads run on one file table of
//!   their own, not the host's, so a single-threaded host keeps an unshared table and the
//!   kernel takes no file reference on its every fd system call. The control thread is spawned
//!   first and leaves the host's table before it opens anything (the new table starts empty:
//!   no reference to a host file, so a socket the host closes sends its FIN); it spawns every
//!   other agent thread. The two tables' fd numbers are independent: the host closes its fds,
//!   whatever their number, and the agent never uses a host fd from its threads (the hooks,
//!   on host threads, are the only code that touches host fds). Where the table cannot be left
//!   (seccomp, kernels without `close_range`'s `CLOSE_RANGE_UNSHARE` and `unshare`, or
//!   `PREHEAT_AGENT_SHARED_FDS=1`), the agent shares it as before and says why in its log.
//!   A thread returning from a wait with events starts a *busy period* that ends when it waits
//!   again; the busy period belongs to the listening port of the connection it served. Per port
//!   it keeps the number and length of busy periods and where (CPU, thread) the last one ran:
//!   that is where the next request will be served, and where to preheat.
//! * **Control** ([`control`]): a Unix stream socket `<run-dir>/agent-<pid>.sock` speaking the
//!   JSON-lines protocol of `preheat_model::proto` — status, flush+reload probing for the
//!   working-set estimation (§3.1), loading a `.phws` profile, configuring per-port strategies.
//!   The probe's loads and flushes of the host's memory cannot crash it ([`faults`]): during
//!   each pass the agent's SIGSEGV/SIGBUS handler resumes the probing thread's own faults at
//!   the engine's recovery points (the round is skipped), and sends every other fault where it
//!   would have gone without the agent.
//! * **Preheating** ([`worker`]): a Unix datagram socket `<run-dir>/agent-<pid>.trig` receives
//!   40-byte announcements ("a request for port P arrives at T", §3.2); the CPU that served P
//!   last gets the announcement and applies the requested strategies before T (§3.3):
//!   `replay` a warm-up request through the real kernel path, prefetch the recorded `lines`,
//!   and `wake` (keep the core out of deep idle).
//! * **Communication detection** ([`comm`]): on request (`CommStart`, or `PREHEAT_COMM=1` at
//!   start-up), SPCD in user space — revoke a sample of pages, catch the induced faults, count
//!   which threads share which pages (partial coscheduling paper, §2.2).
//!
//! Environment: `PREHEAT_RUN_DIR` (default `/tmp/preheat`, created 0700), `PREHEAT_PROFILE`
//! (a `.phws` file loaded at start-up), `PREHEAT_AGENT_LOG` (default
//! `<run-dir>/agent-<pid>.log`), `PREHEAT_NO_REPLAY_HOLD=1` (a replay's server thread blocks in its wait
//! instead of polling until the arrival: [`hold`]), `PREHEAT_AGENT_DISABLE=1` (load, but stay pure pass-through:
//! no threads, no sockets), `PREHEAT_AGENT_ONLY=name[,name]` (attach only to processes whose
//! executable's basename matches, so e.g. `sh -c` wrappers stay untouched),
//! `PREHEAT_AGENT_SHARED_FDS=1` (the agent's threads share the host's file table).
//!
//! Invariants: hooked paths never allocate, block, log, lock or panic, and preserve errno (the
//! files they run code from deny panicking constructs; see [`hooks`] on abort safety); the
//! agent's own `unsafe` is in the FFI boundary ([`sys`], [`hooks`], [`faults`] (the fault
//! handler and the `sigaction`/`signal` hooks), [`comm`]'s hooks and fault claims, the
//! constructor and fork handlers in [`runtime`]) and in what touches the host's memory or the
//! fork state outside it (the probe's passes in [`control`], [`forkcell`]); any internal error
//! disables the agent (hooks become pass-through), is logged ([`log`]), and the host keeps
//! serving; the agent's threads block asynchronous signals, so the host's signals always reach
//! the host's threads ([`threads`]), and its fork handler never waits ([`forkcell`]). See [`runtime`] for start-up, fork and exit, [`plan`] for how the control thread
//! publishes profiles to the workers, [`worker`] for the hand-off and the scheduling class of
//! the workers.
//!
//! # Layering
//!
//! Each module depends only on modules in lower layers (checked by grepping `use crate::`);
//! nothing depends on `runtime`, which starts everything:
//!
//! ```text
//! 5  runtime                          constructor, fork handler, destructor
//! 4  control  worker  hooks            control thread; trigger thread + workers; interposed calls
//! 3  comm  wakeplan  plan              detector; wake-planner client; control → workers hand-over
//! 2  threads  idlepoll  fresh          the agent's own threads; a thread's idle-polling window;
//!                                      warm-ups on a fresh connection each (prefork servers)
//! 1  log  fdreg  faults                log + disable-with-reason; the agent's fds and table;
//!                                      SIGSEGV/SIGBUS handler, the program's dispositions
//! 0  config  track  counters  sys  forkcell  hold
//!                                      configuration; busy periods; counters; FFI; fork-safe cell;
//!                                      the server thread's hold after a replay
//! ```
//!
//! (The crate root's path helpers such as [`socket_paths`] are used from any layer.)
//!
//! Built as a `cdylib` (the preload object) and an `rlib`; the rlib exports
//! [`socket_paths`] so tests and tools agree on socket names. Linking the rlib into an
//! executable does not attach an agent to it: the constructor notices it is not running from a
//! shared object and only resolves the real functions, so the (then linked-in) hooks are
//! pass-through.

// The agent is an FFI boundary: it interposes libc functions, calls the real ones through
// resolved pointers and raw syscalls, and installs constructors, fork and signal handlers. None
// of that can be written without `unsafe`; every block says why it is sound (`// SAFETY:`,
// checked by clippy::undocumented_unsafe_blocks).
#![allow(unsafe_code)]

pub mod comm;
pub mod config;
pub mod control;
pub mod counters;
pub mod faults;
pub mod fdreg;
pub mod forkcell;
pub mod fresh;
pub mod hold;
pub mod hooks;
pub mod idlepoll;
pub mod log;
pub mod plan;
pub mod runtime;
pub mod sys;
pub mod threads;
pub mod track;
pub mod wakeplan;
pub mod worker;

pub use preheat_model::proto::DEFAULT_RUN_DIR;

// Where the agent's sockets and log live, and which agents are alive: the one implementation,
// shared with the CLI and preheatd (a crate of its own, so they need not link the hooks).
pub use preheat_rundir::{live_agents, run_dir_from_env, socket_paths, SocketPaths};
