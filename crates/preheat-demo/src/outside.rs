//! Where the demo's agent runs: inside the server (`LD_PRELOAD`, wherever it loads) or, for a
//! server it cannot enter (a static binary, a Go program), outside it ([`preheat_outside`]):
//! `wake`, `replay` and `lines` of its file-backed read-only memory (code, read-only data)
//! from a thread on the server's CPU, busy periods from the kernel's syscall tracepoints.

use anyhow::{bail, Result};
use preheat_launch::launch::Server;
use preheat_launch::preflight;
use preheat_outside::{Config, OutsideAgent};

use crate::params::AgentPlace;

/// Where the agent goes for a server started by `command` (empty: a catalog server): `None`
/// inside the server, `Some(why)` outside it. With `--agent auto` (the default) a server the
/// agent cannot be loaded into because it is statically linked or Go is preheated from
/// outside, and the pre-flight's reason is said (prefixed with `who`: `demo`, `preheat`); other
/// refusals stand.
pub(crate) fn place(
    agent: AgentPlace,
    command: &[String],
    netns: bool,
    who: &str,
) -> Result<Option<String>> {
    // Why outside, and the pre-flight's refusal where that decided it.
    let (why, refusal) = match agent {
        AgentPlace::Inside => return Ok(None),
        AgentPlace::Outside => ("--agent outside".to_string(), None),
        AgentPlace::Auto => {
            let Some(program) = command.first() else {
                return Ok(None);
            };
            let agent = preheat_launch::paths::agent_so()?;
            match preflight::check(program, &agent, preflight::Needs::Hooks) {
                Ok(_) => return Ok(None),
                // Not a case for the outside agent either (another class of program, secure
                // execution): refused here as the launcher would.
                Err(r) if !r.outside => return Err(r.into()),
                Err(r) => (r.reason.clone(), Some(r)),
            }
        }
    };
    let refused = refusal.map(|r| format!("{r}\n")).unwrap_or_default();
    if preheat_engine::host::effective_uid() != Some(0) {
        // Said before the server starts (the observer would say it after).
        bail!(
            "{refused}preheating it from outside the process needs root: its busy periods come \
             from syscall tracepoints (eBPF or perf_event_open, tracefs); run it as root"
        );
    }
    if netns {
        bail!(
            "--netns with the agent outside the server is not built (the outside agent's \
             warm-up connection and observer work in the caller's network namespace); run \
             without --netns"
        );
    }
    if !refused.is_empty() {
        eprintln!(
            "{who}: {refused}{who}: preheating it from outside the process instead (wake, replay, \
             and lines of its code and read-only data: no heap lines from outside)"
        );
    }
    Ok(Some(why))
}

/// Start the outside agent for the process of `server` that listens on its port, its worker on
/// `cpu` (said on stderr, prefixed with `who`).
pub(crate) fn attach(server: &Server, cpu: usize, why: String, who: &str) -> Result<OutsideAgent> {
    let port = server.spec.port;
    let pid = listening_pid(server)?;
    let agent = OutsideAgent::start(Config {
        run_dir: server.run_dir.clone(),
        pid,
        port,
        cpu,
        why,
    })?;
    eprintln!("{who}: pid {pid} is {}", agent.describe());
    Ok(agent)
}

/// The process of `server`'s tree with a socket listening on its port (the first found; a
/// prefork server's workers share the master's).
fn listening_pid(server: &Server) -> Result<u32> {
    let port = server.spec.port;
    let mut tree = server.tree();
    tree.sort_unstable();
    for pid in tree {
        if let Ok(fds) =
            preheat_observe::sockets::snapshot(std::path::Path::new("/proc"), pid, port)
        {
            if !fds.listening.is_empty() {
                return Ok(pid);
            }
        }
    }
    bail!(
        "none of {}'s processes ({:?}) has a socket listening on port {port}",
        server.spec.name,
        server.tree()
    )
}
