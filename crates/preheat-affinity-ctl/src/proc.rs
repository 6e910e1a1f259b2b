//! The processes of an affinity run: workers (an executable that runs [`crate::worker::run`]:
//! the `preheat` binary's hidden `affinity worker`, see [`WorkerCmd`]) and
//! programs, started pinned (and, for the main workload, already in its real-time class, so
//! every thread and child it creates inherits both), stopped with their descendants when dropped
//! or when the command is signalled (`launch`), and killed by the kernel if the controller dies
//! (parent-death signal).

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use super::worker::Outcome;
use preheat_launch::launch::Program;

/// A command for `program args...` that the kernel kills if the thread that spawns it dies
/// (`setpriv --pdeathsig KILL`), and that starts in `SCHED_FIFO` at `fifo` if given (`chrt`,
/// without reset-on-fork, so every thread and child it creates inherits the class). Both wrap by
/// exec: the program keeps the pid. The real-time class is entered by the child itself: a
/// spawning thread that entered it first would share the CPU at the same priority with a child
/// that never yields, and never get to run again until the child exits.
pub fn dying_with_us(program: &str, args: &[String], fifo: Option<i32>) -> Result<Command> {
    let mut argv: Vec<String> = Vec::new();
    if let Some(sp) = preheat_engine::host::find_program("setpriv") {
        argv.extend([
            sp.to_string_lossy().into(),
            "--pdeathsig".into(),
            "KILL".into(),
            "--".into(),
        ]);
    }
    if let Some(p) = fifo {
        let chrt = preheat_engine::host::find_program("chrt")
            .context("chrt (util-linux) is needed to start a program at a real-time priority")?;
        argv.extend([chrt.to_string_lossy().into(), "-f".into(), p.to_string()]);
    }
    argv.push(program.into());
    argv.extend(args.iter().cloned());
    let mut c = Command::new(&argv[0]);
    c.args(&argv[1..]);
    Ok(c)
}

/// Spawn `cmd` pinned to `cpus` (the calling thread takes that mask for the moment of the spawn
/// and gets its own back), in its own process group, registered for cleanup. Call it from a
/// thread that lives as long as the run (a parent-death signal, see [`dying_with_us`], follows
/// the spawning thread).
pub fn spawn(cmd: &mut Command, cpus: &[usize]) -> Result<Program> {
    use std::os::unix::process::CommandExt;
    cmd.process_group(0);
    let saved_mask = preheat_engine::os::get_affinity();
    let r = (|| -> Result<Program> {
        if !cpus.is_empty() {
            preheat_engine::os::set_affinity(cpus)
                .with_context(|| format!("pinning to CPUs {cpus:?}"))?;
        }
        Ok(Program::spawn(cmd)?)
    })();
    let _ = preheat_engine::os::set_affinity(&saved_mask);
    r
}

/// How to start a worker process: `exe args... ROLE FLAGS...`, where the executable runs
/// [`crate::worker::run`] with the role its flags describe (the CLI: its own binary and
/// `affinity worker`).
#[derive(Debug, Clone)]
pub struct WorkerCmd {
    pub exe: PathBuf,
    pub args: Vec<String>,
}

impl WorkerCmd {
    /// The `preheat` binary's hidden `affinity worker`, when this process is that binary.
    pub fn this_binary() -> Result<WorkerCmd> {
        Ok(WorkerCmd {
            exe: std::env::current_exe().context("locating this executable")?,
            args: vec!["affinity".into(), "worker".into()],
        })
    }
}

/// What a worker said when ready.
#[derive(Debug, Clone, Copy)]
pub struct Ready {
    pub pid: u32,
    pub main_tid: u32,
    pub warm_tid: Option<u32>,
    /// The in-process vector's thread (`--vector-kind`).
    pub vector_tid: Option<u32>,
}

/// A running worker with its pipes.
pub struct Worker {
    /// Held so the process is stopped (with its descendants) when the worker is dropped.
    _prog: Program,
    stdin: ChildStdin,
    lines: Receiver<String>,
    pub ready: Ready,
    pub what: String,
}

impl Worker {
    /// Start the worker `exe ARGS` pinned to `cpus` and wait (≤ 60 s) until it is ready.
    pub fn start(exe: &WorkerCmd, what: &str, args: &[String], cpus: &[usize]) -> Result<Worker> {
        let mut cmd = Command::new(&exe.exe);
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        cmd.args(&exe.args)
            .args(args)
            .arg("--parent")
            .arg(std::process::id().to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        // Workers die with the thread that spawned them (PR_SET_PDEATHSIG is per thread): the
        // short-lived spawning thread would kill them at once, so they watch the process instead
        // and are spawned from this (long-lived) thread.
        let mut prog = {
            let saved = preheat_engine::os::get_affinity();
            preheat_engine::os::set_affinity(cpus)
                .with_context(|| format!("pinning to CPUs {cpus:?}"))?;
            let p = Program::spawn(&mut cmd);
            let _ = preheat_engine::os::set_affinity(&saved);
            p?
        };
        let stdin = prog.child.stdin.take().context("worker stdin")?;
        let stdout = prog.child.stdout.take().context("worker stdout")?;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let first = match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(l) => l,
            Err(_) => bail!("{what} did not start (see its error above)"),
        };
        let v: serde_json::Value =
            serde_json::from_str(&first).with_context(|| format!("{what}: {first:?}"))?;
        let tid = |k: &str| v[k].as_u64().map(|x| x as u32);
        let ready = Ready {
            pid: tid("pid").context("ready line without pid")?,
            main_tid: tid("main_tid").context("ready line without main_tid")?,
            warm_tid: tid("warm_tid"),
            vector_tid: tid("vector_tid"),
        };
        Ok(Worker {
            _prog: prog,
            stdin,
            lines: rx,
            ready,
            what: what.into(),
        })
    }

    /// Send bytes to the worker (`g`: start, `p`: preheat).
    pub fn send(&self, b: &[u8]) -> Result<()> {
        let mut w = &self.stdin;
        w.write_all(b)?;
        w.flush()?;
        Ok(())
    }

    /// The outcome, if the worker has printed it (non-blocking).
    pub fn try_outcome(&self) -> Result<Option<Outcome>> {
        match self.lines.try_recv() {
            Ok(l) => Ok(Some(
                serde_json::from_str(&l).with_context(|| format!("{}: {l:?}", self.what))?,
            )),
            Err(std::sync::mpsc::TryRecvError::Empty) => Ok(None),
            Err(std::sync::mpsc::TryRecvError::Disconnected) => {
                bail!(
                    "{} exited without a result (see its error above)",
                    self.what
                )
            }
        }
    }

    /// Stop a vector (SIGTERM, and SIGCONT in case it is stopped) and collect its outcome.
    pub fn stop(self) -> Result<Outcome> {
        let pid = self.ready.pid;
        let _ = preheat_engine::os::send_signal(pid, libc::SIGTERM, false);
        let _ = preheat_engine::os::send_signal(pid, libc::SIGCONT, false);
        self.wait(Duration::from_secs(10))
    }

    /// Wait up to `limit` for the outcome.
    pub fn wait(self, limit: Duration) -> Result<Outcome> {
        let t0 = Instant::now();
        loop {
            match self.lines.recv_timeout(Duration::from_millis(50)) {
                Ok(l) => {
                    return serde_json::from_str(&l)
                        .with_context(|| format!("{}: {l:?}", self.what))
                }
                Err(RecvTimeoutError::Disconnected) => {
                    bail!(
                        "{} exited without a result (see its error above)",
                        self.what
                    )
                }
                Err(RecvTimeoutError::Timeout) if t0.elapsed() > limit => {
                    bail!("{} gave no result within {limit:?}", self.what)
                }
                Err(RecvTimeoutError::Timeout) => {}
            }
        }
    }
}
