//! One guest: a QEMU process (TCG, one host thread per vCPU, `CPU n/TCG`), its serial console
//! read line by line, stopped with its descendants when dropped.
//!
//! **Why TCG.** `/dev/kvm` on our VMs cannot boot stock kernels (a PVM flavour); QEMU's
//! multi-threaded TCG can, with one host thread per vCPU. QEMU also runs a main-loop thread
//! (timers, I/O, the big lock) and helpers (`call_rcu`, `worker`): [`Guest::threads`] lists them
//! all, [`Guest::vcpu_threads`] the vCPUs by index.
//!
//! **Nothing outlives its command.** QEMU is started in its own process group through
//! `preheat-launch`'s `Program` (stopped on drop, error and SIGINT/SIGTERM), under
//! `setpriv --pdeathsig KILL` when util-linux has it (the kernel kills QEMU when the *thread*
//! that started it exits, so start guests from a thread that lives as long as they should), and
//! journaled ([`crate::journal`]): after a SIGKILL, the next [`Guest::start`] or
//! `preheat guest cleanup` stops what is left.

use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use preheat_launch::launch::Program;

use crate::console::{self, Event};
use crate::image::Image;
use crate::{journal, Missing};

/// The QEMU system emulator guests run in.
pub const QEMU: &str = "qemu-system-x86_64";
/// The Debian package that has it.
pub const QEMU_PACKAGE: &str = "qemu-system-x86";

/// The installed QEMU, or [`Missing::Tool`] naming its Debian package.
pub fn find_qemu() -> Result<PathBuf> {
    preheat_engine::host::find_program(QEMU).ok_or_else(|| {
        Missing::Tool {
            tool: QEMU.into(),
            package: QEMU_PACKAGE.into(),
        }
        .into()
    })
}

/// What a guest runs: `preheat-npb` with these arguments (with `--json` and
/// `--progress-ms`); the guest powers off when it ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workload {
    pub args: Vec<String>,
    /// Progress report period, guest milliseconds.
    pub progress_ms: u64,
}

impl Workload {
    /// `preheat-npb KERNEL --threads THREADS --seconds SECONDS`.
    pub fn npb(kernel: &str, threads: usize, seconds: f64) -> Workload {
        Workload {
            args: vec![
                kernel.into(),
                "--threads".into(),
                threads.to_string(),
                "--seconds".into(),
                seconds.to_string(),
            ],
            progress_ms: 1000,
        }
    }

    /// The same with `--instances INSTANCES` (independent copies, the paper's "double").
    pub fn instances(mut self, instances: usize) -> Workload {
        self.args
            .extend(["--instances".into(), instances.to_string()]);
        self
    }

    /// The same with `--shared-pages N` (each communicating pair shares N more pages; 0
    /// changes nothing).
    pub fn shared_pages(mut self, n: usize) -> Workload {
        if n > 0 {
            self.args.extend(["--shared-pages".into(), n.to_string()]);
        }
        self
    }

    /// The same with `--start-delay-ms MS`: the kernel starts computing this long after its
    /// threads exist (so a coscheduler can be in place first).
    pub fn start_delay_ms(mut self, ms: u64) -> Workload {
        self.args
            .extend(["--start-delay-ms".into(), ms.to_string()]);
        self
    }

    /// The kernel command line's `preheat.args=` value (comma-separated), refused when an
    /// argument holds a character the command line or `/init`'s splitting would change.
    pub fn cmdline_value(&self) -> Result<String> {
        let mut all = self.args.clone();
        all.extend([
            "--json".into(),
            "--progress-ms".into(),
            self.progress_ms.to_string(),
        ]);
        for a in &all {
            let ok = |c: char| c.is_ascii_alphanumeric() || "._=-:".contains(c);
            if a.is_empty() || !a.chars().all(ok) {
                bail!(
                    "a guest workload argument may hold only letters, digits and ._=-: (got {a:?})"
                );
            }
        }
        Ok(all.join(","))
    }
}

/// How to start a guest.
#[derive(Debug, Clone)]
pub struct GuestSpec {
    /// QEMU's `-name` (and the journal's).
    pub name: String,
    pub vcpus: u32,
    pub memory_mb: u32,
    /// `None`: the guest idles until stopped.
    pub workload: Option<Workload>,
    /// Host-side communication detection in QEMU (the agent preloaded, detection on from the
    /// start): its configuration and the run directory its control socket goes to.
    pub comm: Option<(preheat_model::comm::CommConfig, PathBuf)>,
}

impl GuestSpec {
    /// An idle guest called `name` with `vcpus` vCPUs and 256 MiB.
    pub fn new(name: &str, vcpus: u32) -> GuestSpec {
        GuestSpec {
            name: name.into(),
            vcpus,
            memory_mb: 256,
            workload: None,
            comm: None,
        }
    }
}

/// QEMU's arguments for `spec` on `image`.
pub fn qemu_args(image: &Image, spec: &GuestSpec) -> Result<Vec<String>> {
    if spec.vcpus == 0 || spec.memory_mb < 64 {
        bail!(
            "a guest needs at least 1 vCPU and 64 MiB (got {} and {} MiB)",
            spec.vcpus,
            spec.memory_mb
        );
    }
    if spec.name.is_empty() || spec.name.contains([',', ' ']) {
        bail!(
            "a guest name must be non-empty, without commas or spaces (got {:?})",
            spec.name
        );
    }
    let mut append = "console=ttyS0 quiet panic=-1".to_string();
    if let Some(w) = &spec.workload {
        append += &format!(" preheat.args={}", w.cmdline_value()?);
    }
    let s = |x: &str| x.to_string();
    Ok(vec![
        s("-name"),
        format!("{},debug-threads=on", spec.name),
        s("-accel"),
        s("tcg,thread=multi"),
        s("-cpu"),
        s("max"),
        s("-smp"),
        spec.vcpus.to_string(),
        s("-m"),
        spec.memory_mb.to_string(),
        s("-kernel"),
        image.kernel.display().to_string(),
        s("-initrd"),
        image.initrd.display().to_string(),
        s("-append"),
        append,
        s("-nodefaults"),
        s("-no-user-config"),
        s("-display"),
        s("none"),
        s("-serial"),
        s("stdio"),
        s("-monitor"),
        s("none"),
        s("-net"),
        s("none"),
        s("-no-reboot"),
    ])
}

/// A console event with the host time since QEMU was started.
#[derive(Debug, Clone, PartialEq)]
pub struct Timed {
    pub at: Duration,
    pub event: Event,
}

/// One of QEMU's threads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QemuThread {
    pub tid: u32,
    pub name: String,
    /// The vCPU it runs (`CPU n/TCG`, `CPU n/KVM`), if it is one.
    pub vcpu: Option<u32>,
}

/// The vCPU index in a QEMU thread name (`CPU 1/TCG` → 1).
pub fn vcpu_of(name: &str) -> Option<u32> {
    let (n, accel) = name.strip_prefix("CPU ")?.split_once('/')?;
    (!accel.is_empty()).then_some(())?;
    n.parse().ok()
}

/// A running guest; QEMU is stopped (with its descendants) and its journal entry removed when
/// it is dropped.
pub struct Guest {
    pub spec: GuestSpec,
    program: Option<Program>,
    entry: Option<PathBuf>,
    events: Receiver<Timed>,
    /// Every console event so far, in order.
    pub history: Vec<Timed>,
    stderr: Arc<Mutex<Vec<String>>>,
    started: Instant,
}

impl Guest {
    /// Start `spec` on `image` (first stopping the guests of owners that are gone).
    pub fn start(image: &Image, spec: &GuestSpec) -> Result<Guest> {
        let qemu = find_qemu()?;
        let jdir = journal::dir();
        journal::reap_orphans(&jdir);
        let args = qemu_args(image, spec)?;
        let mut cmd = match preheat_engine::host::find_program("setpriv") {
            Some(sp) => {
                let mut c = Command::new(sp);
                c.args(["--pdeathsig", "KILL", "--"]).arg(&qemu);
                c
            }
            None => Command::new(&qemu),
        };
        if let Some((cfg, run_dir)) = &spec.comm {
            preheat_launch::launch::attach_agent(
                &mut cmd,
                &qemu.display().to_string(),
                preheat_launch::preflight::Needs::Load,
            )?;
            preheat_launch::launch::agent_run_dir(&mut cmd, run_dir)?;
            cmd.env("PREHEAT_COMM", "1")
                .env("PREHEAT_COMM_CONFIG", serde_json::to_string(cfg)?);
        }
        cmd.args(&args)
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let started = Instant::now();
        let mut program =
            Program::spawn(&mut cmd).with_context(|| format!("starting {}", qemu.display()))?;
        let entry = journal::record(&jdir, program.pid(), &spec.name)
            .with_context(|| format!("journaling guest {} in {}", spec.name, jdir.display()))?;
        let stdout = program.child.stdout.take().context("QEMU's stdout")?;
        let stderr = program.child.stderr.take().context("QEMU's stderr")?;
        Ok(Guest {
            spec: spec.clone(),
            program: Some(program),
            entry: Some(entry),
            events: read_console(stdout, started),
            history: Vec::new(),
            stderr: collect_lines(stderr),
            started,
        })
    }

    /// QEMU's pid.
    pub fn pid(&self) -> u32 {
        self.program.as_ref().map_or(0, Program::pid)
    }

    /// Host time since QEMU was started.
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// QEMU's threads now, by tid.
    pub fn threads(&self) -> Vec<QemuThread> {
        let pid = self.pid();
        let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            return Vec::new();
        };
        let mut v: Vec<QemuThread> = rd
            .flatten()
            .filter_map(|e| {
                let tid: u32 = e.file_name().to_str()?.parse().ok()?;
                let name = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm")).ok()?;
                let name = name.trim_end().to_string();
                Some(QemuThread {
                    tid,
                    vcpu: vcpu_of(&name),
                    name,
                })
            })
            .collect();
        v.sort_by_key(|t| t.tid);
        v
    }

    /// The vCPU threads, by vCPU index: `(index, tid)`.
    pub fn vcpu_threads(&self) -> Vec<(u32, u32)> {
        let mut v: Vec<(u32, u32)> = self
            .threads()
            .iter()
            .filter_map(|t| Some((t.vcpu?, t.tid)))
            .collect();
        v.sort_unstable();
        v
    }

    /// The next console event within `timeout` (also kept in [`Guest::history`]); `None` on
    /// timeout or when the console closed (QEMU exited).
    pub fn next_event(&mut self, timeout: Duration) -> Option<Timed> {
        match self.events.recv_timeout(timeout) {
            Ok(t) => {
                self.history.push(t.clone());
                Some(t)
            }
            Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => None,
        }
    }

    /// Read events until one `pick` accepts, within `timeout`; an error (with the console's
    /// and QEMU's last words) if QEMU exits or the time runs out first.
    pub fn wait_for<T>(
        &mut self,
        what: &str,
        timeout: Duration,
        mut pick: impl FnMut(&Timed) -> Option<T>,
    ) -> Result<T> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.events.recv_timeout(left) {
                Ok(t) => {
                    let picked = pick(&t);
                    self.history.push(t);
                    if let Some(x) = picked {
                        return Ok(x);
                    }
                }
                Err(e) => {
                    let why = match e {
                        RecvTimeoutError::Timeout => format!("no {what} within {timeout:?}"),
                        RecvTimeoutError::Disconnected => format!("QEMU exited before {what}"),
                    };
                    bail!("guest {}: {why}\n{}", self.spec.name, self.last_words());
                }
            }
        }
    }

    /// Wait (≤ `timeout`) until the guest's user space is up: the host time it took, the
    /// guest's uptime then and its CPU count.
    pub fn wait_up(&mut self, timeout: Duration) -> Result<(Duration, f64, u32)> {
        self.wait_for("user space", timeout, |t| match t.event {
            Event::Up { uptime_s, cpus } => Some((t.at, uptime_s, cpus)),
            _ => None,
        })
    }

    /// The workload's summary, once it has arrived (reads what the console has sent so far;
    /// after QEMU exited, everything it sent).
    pub fn summary(&mut self) -> Option<serde_json::Value> {
        while self.next_event(Duration::from_millis(200)).is_some() {}
        self.history.iter().rev().find_map(|t| match &t.event {
            Event::Summary(v) => Some(v.clone()),
            _ => None,
        })
    }

    /// The last console lines that were not the protocol's, and QEMU's stderr.
    pub fn last_words(&self) -> String {
        let console: Vec<&str> = self
            .history
            .iter()
            .filter_map(|t| match &t.event {
                Event::Other(l) => Some(l.as_str()),
                _ => None,
            })
            .collect();
        let stderr = self.stderr.lock().map(|v| v.join("\n")).unwrap_or_default();
        format!(
            "console (last lines): {}\nQEMU's stderr: {}",
            console[console.len().saturating_sub(10)..].join(" | "),
            stderr.trim()
        )
    }

    /// Wait (≤ `timeout`) for QEMU to exit on its own (the guest powers off after its
    /// workload): its exit code, `None` if it still runs.
    pub fn wait_exit(&mut self, timeout: Duration) -> Result<Option<i32>> {
        let deadline = Instant::now() + timeout;
        let Some(p) = self.program.as_mut() else {
            return Ok(None);
        };
        loop {
            if let Some(st) = p.child.try_wait()? {
                return Ok(Some(st.code().unwrap_or(-1)));
            }
            if Instant::now() >= deadline {
                return Ok(None);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stop QEMU (SIGTERM, SIGKILL after 2 s) with its descendants, and forget it.
    pub fn stop(mut self) {
        self.shut_down();
    }

    fn shut_down(&mut self) {
        // Program's drop stops the process tree and reaps it.
        drop(self.program.take());
        if let Some(e) = self.entry.take() {
            journal::forget(&e);
        }
    }
}

impl Drop for Guest {
    fn drop(&mut self) {
        self.shut_down();
    }
}

/// A thread that reads console lines and sends them, read and timed, until QEMU's stdout closes.
fn read_console(stdout: impl Read + Send + 'static, started: Instant) -> Receiver<Timed> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).split(b'\n') {
            let Ok(line) = line else { break };
            let event = console::parse_line(&String::from_utf8_lossy(&line));
            if tx
                .send(Timed {
                    at: started.elapsed(),
                    event,
                })
                .is_err()
            {
                break;
            }
        }
    });
    rx
}

/// A thread that keeps the last 50 lines of `r`.
fn collect_lines(r: impl Read + Send + 'static) -> Arc<Mutex<Vec<String>>> {
    let lines = Arc::new(Mutex::new(Vec::new()));
    let keep = Arc::clone(&lines);
    std::thread::spawn(move || {
        for line in BufReader::new(r).lines() {
            let Ok(line) = line else { break };
            if let Ok(mut v) = keep.lock() {
                v.push(line);
                let excess = v.len().saturating_sub(50);
                v.drain(..excess);
            }
        }
    });
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vcpu_names() {
        assert_eq!(vcpu_of("CPU 0/TCG"), Some(0));
        assert_eq!(vcpu_of("CPU 12/KVM"), Some(12));
        assert_eq!(vcpu_of("CPU 1/"), None);
        assert_eq!(vcpu_of("qemu-system-x86"), None);
        assert_eq!(vcpu_of("call_rcu"), None);
    }

    #[test]
    fn workload_on_the_command_line() {
        let w = Workload::npb("mg", 2, 5.0);
        assert_eq!(
            w.cmdline_value().unwrap(),
            "mg,--threads,2,--seconds,5,--json,--progress-ms,1000"
        );
        assert!(w
            .clone()
            .instances(2)
            .cmdline_value()
            .unwrap()
            .starts_with("mg,--threads,2,--seconds,5,--instances,2,"));
        let bad = Workload {
            args: vec!["mg x".into()],
            progress_ms: 1000,
        };
        assert!(bad.cmdline_value().is_err());
    }
}
