//! Preheating from outside the process (issue 23, point 2): for a server the in-process agent
//! cannot enter — a statically linked program (Go's default, `-static` C), a Go program even
//! when dynamically linked (its runtime bypasses the C library the agent hooks) — threads of
//! another process do what the agent's threads would, through the agent's own interfaces.
//!
//! # What runs where
//!
//! - **The control socket and the announcement socket** of the server's pid are bound in the
//!   run directory under the agent's names (`preheat_rundir::socket_paths`), so every caller —
//!   the demo, `preheat run`, `preheatd` — talks to it as to an in-process agent
//!   ([`control`]). Requests that need the server's memory from inside (flushing and reloading
//!   arbitrary ranges, communication detection) are refused with the reason.
//! - **The probe and the profile** ([`probe`]): the server's readable, read-only file-backed
//!   mappings (its code and read-only data) are mapped into this process from the same files —
//!   the same page-cache pages, so the same cache lines (`preheat_engine::fileview`). The CLI's
//!   recorder drives the agent's probe cycle on them (flush and reload on the server's CPU, the
//!   request sent from here), and a profile loaded from it gives `lines` their runs.
//! - **Busy periods** come from the kernel's tracepoints (`preheat-observe`): by default the
//!   scheduler's and the socket layer's — a period starts when a server thread runs again
//!   after sleeping (or, without a sleep between, when it reads the next request) and ends
//!   when it sleeps, kept where it moved data on a connection of the port —, else the
//!   syscall tracepoints (the agent's model: from a wait's return to the next wait). Drained
//!   every few tens of milliseconds and on every status request ([`busy`]), they give the
//!   port's counters, its last start (the demo's *start* stage: where a request was read by
//!   one period and answered by another, the first one's start) and whether a preheated
//!   process served a request.
//! - **The worker** ([`worker`]) is one thread pinned to the server's CPU, like the agent's
//!   trigger thread when it works inline: it blocks on the announcement socket, and for an
//!   announcement sends the `replay` warm-up on a loopback connection of its own ([`replay`]),
//!   walks the loaded lines through the view for `lines`, and, for `wake`, keeps the CPUs
//!   polling in idle through the arrival (a CPU latency QoS request) — or, for `spin` or where
//!   that cannot be had, spins through it, yielding the CPU every turn so that a thread of the
//!   server that becomes runnable goes first. `replay` holds the same idle polling through the
//!   arrival.
//!
//! # Where this differs from the in-process agent (and from the paper)
//!
//! - `lines` (the paper's preheating proper) covers only file-backed, read-only memory: code and
//!   read-only data. Anonymous memory (heap, stacks, a Go heap) can neither be probed nor
//!   loaded from another process this way, so data lines are neither recorded nor loaded.
//!   Without a loaded profile announcements asking for `lines` count as `no_profile`, as in an
//!   agent without one.
//! - `replay`'s hold is idle polling: the agent keeps the server thread itself polling through
//!   the arrival after the warm-up, which another process cannot; the server's CPU is kept out
//!   of halt instead (which a host without a cpuidle driver ignores).
//! - The spin cannot stop the moment the server thread runs (the agent sees that in its
//!   hooks); it lasts until [`worker::WAKE_AFTER_ARRIVAL_NS`] past the arrival, which costs the
//!   server a yield per turn at most, otherwise idle time.
//! - The observer needs root (eBPF programs on the kernel's tracepoints, perf samples where
//!   those do not load) and costs every request a little (measured in `preheat-observe`'s
//!   docs, on preheat-kv in total, `preheat bench observe --toggle`: ~3% of the throughput
//!   with the scheduler's and socket tracepoints, +0.3 µs per warm request; ~6% on the syscall
//!   tracepoints, where while attached every system call of the machine takes the kernel's
//!   tracepoint path). The in-process agent costs far less where it loads, so callers use this
//!   only where the agent cannot load.

#![forbid(unsafe_code)]

pub mod busy;
pub mod control;
pub mod probe;
pub mod replay;
pub mod state;
pub mod worker;

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;

use anyhow::{bail, Context, Result};

use state::Shared;

/// What to preheat from outside.
#[derive(Debug, Clone)]
pub struct Config {
    /// The agents' run directory (where the sockets go).
    pub run_dir: PathBuf,
    /// The server process whose agent this stands in for (the one that serves the port).
    pub pid: u32,
    /// The port it serves.
    pub port: u16,
    /// The CPU it serves on: the worker's CPU.
    pub cpu: usize,
    /// Why the in-process agent is not used (said in the status and in refusals).
    pub why: String,
}

/// A running stand-in for the agent of `Config::pid`. Dropping it stops its threads and
/// removes its sockets.
pub struct OutsideAgent {
    /// The observer's mechanism that runs, said in [`OutsideAgent::describe`].
    observed_by: String,
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    sockets: [PathBuf; 2],
}

impl OutsideAgent {
    /// Attach the observer to the server, bind the sockets and start the threads. Fails at once,
    /// saying what to do, where the observer cannot attach (not root, no tracefs) or the pid
    /// already has an agent.
    pub fn start(cfg: Config) -> Result<OutsideAgent> {
        let paths = preheat_rundir::socket_paths(&cfg.run_dir, cfg.pid);
        refuse_live_agent(&paths.control, cfg.pid)?;
        // Sampled under sustained load: what preheating needs is the first request after an
        // idle, which a server between bursts gets with the programs attached.
        let mut opts = preheat_observe::session::Options::new(cfg.pid, cfg.port);
        opts.sampling = Some(preheat_observe::sampling::Sampling::default());
        let observer = preheat_observe::session::Observer::attach(opts)
            .context("observing the server's busy periods from outside")?;
        let observed_by = observer.what_runs();
        let shared = Arc::new(Shared::new(cfg, observer));
        let listener = control::bind(&paths.control)?;
        let trigger = match worker::bind(&paths.trigger) {
            Ok(t) => t,
            Err(e) => {
                let _ = std::fs::remove_file(&paths.control);
                return Err(e);
            }
        };
        let mut agent = OutsideAgent {
            observed_by,
            shared: shared.clone(),
            threads: Vec::new(),
            sockets: [paths.control.clone(), paths.trigger.clone()],
        };
        agent.spawn("preheat-out-busy", {
            let s = shared.clone();
            move || busy::run(&s)
        })?;
        agent.spawn("preheat-out-ctl", {
            let s = shared.clone();
            move || control::run(&s, listener)
        })?;
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        agent.spawn("preheat-out-work", {
            let s = shared.clone();
            move || worker::run(&s, trigger, ready_tx)
        })?;
        // The worker pins itself before it takes announcements.
        match ready_rx.recv() {
            Ok(Ok(())) => Ok(agent),
            Ok(Err(e)) => bail!("the outside worker could not start on its CPU: {e}"),
            Err(_) => bail!("the outside worker ended before it started"),
        }
    }

    fn spawn(&mut self, name: &str, f: impl FnOnce() + Send + 'static) -> Result<()> {
        let h = std::thread::Builder::new()
            .name(name.into())
            .spawn(f)
            .with_context(|| format!("starting thread {name}"))?;
        self.threads.push(h);
        Ok(())
    }

    /// The server's pid.
    pub fn pid(&self) -> u32 {
        self.shared.cfg.pid
    }

    /// Its control and announcement sockets (removed when it drops; a caller that may exit
    /// without dropping it, on a signal, removes them itself).
    pub fn sockets(&self) -> &[PathBuf; 2] {
        &self.sockets
    }

    /// What runs, one sentence (for the caller's output).
    pub fn describe(&self) -> String {
        format!(
            "preheated from outside the process ({}): its busy periods from the kernel's \
             tracepoints ({}; root), `wake` (idle polling, or a spin), `replay`, and \
             `lines` of its code and read-only data (file-backed memory mapped here: no heap \
             lines from outside) from a thread on CPU {}",
            self.shared.cfg.why, self.observed_by, self.shared.cfg.cpu
        )
    }
}

impl Drop for OutsideAgent {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        // Wake the threads that block without a timeout: the accept and the worker's receive.
        let [control, trigger] = &self.sockets;
        let _ = std::os::unix::net::UnixStream::connect(control);
        if let Ok(d) = std::os::unix::net::UnixDatagram::unbound() {
            let _ = d.send_to(&[], trigger);
        }
        for h in self.threads.drain(..) {
            let _ = h.join();
        }
        for p in &self.sockets {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// Fail if an agent already answers on `control` (the server loaded one after all); remove a
/// stale socket file.
fn refuse_live_agent(control: &Path, pid: u32) -> Result<()> {
    if std::os::unix::net::UnixStream::connect(control).is_ok() {
        bail!(
            "pid {pid} already has an agent answering at {}: preheat it from inside",
            control.display()
        );
    }
    let _ = std::fs::remove_file(control);
    Ok(())
}
