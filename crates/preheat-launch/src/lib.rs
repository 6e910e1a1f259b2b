//! Launching what preheat measures, and talking to the agent inside it: the base layer of
//! every command that starts a server (record, demo, serve, run, the coscheduler, cache
//! affinity, the benchmarks).
//!
//! * [`launch`] – start a server with the agent attached (`LD_PRELOAD`, pinned, in its own
//!   process group) or any other program, and stop every process started on drop, on error and
//!   on SIGINT/SIGTERM; scratch directories removed likewise; the busy-polling
//!   request/response [`launch::Client`].
//! * [`cleanup`] – what stops all of that when the command is stopped: SIGINT, SIGTERM, or a
//!   print that finds its output closed (a reader that went away), with the hooks that run
//!   first ([`cleanup::install_cleanup`]).
//! * [`preflight`] – whether the agent can be loaded into a program (dynamically linked, of
//!   the agent's machine, no secure execution), decided before it starts, so a program it
//!   cannot reach is refused at once with what to do; [`launch::attach_agent`] is the one way
//!   a command starts a program with the agent.
//! * [`agentctl`] – the agent's control socket (JSON lines) and its announcement socket.
//! * [`paths`] – where the companion artifacts are (agent, `preheat-kv`, `preheat-npb`), built
//!   with cargo from a source checkout on first use.
//! * [`progress`] – the [`progress::Progress`] trait through which libraries report a long
//!   measurement's progress (the CLI draws it; [`progress::NoProgress`] for quiet runs).
//! * [`servers`] – `preheat-lab`'s server catalog turned into started servers, and the
//!   requesters that measure them.
//!
//! No `unsafe`: signals, affinity and process state go through `preheat-engine`.

pub mod agentctl;
pub mod cleanup;
pub mod launch;
pub mod mysql_session;
pub mod paths;
pub mod preflight;
pub mod progress;
pub mod servers;
