//! `preheat comm`: communication detection (SPCD in user space, partial-coscheduling paper §2.2)
//! on an unmodified program started under the agent, or on a running process that has one.
//!
//! The agent does the sampling (`preheat-agent::comm`); this command starts it, resets the
//! matrix after start-up as the paper does, shows progress, and writes the thread × thread
//! matrix as JSON (the shape `preheat groups` reads), CSV and a text table. Everything it prints
//! is measured on this machine.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use preheat_model::comm::{CommAccess, CommConfig, CommMechanism, CommReport};
use preheat_model::proto::{Reply, Request};

use crate::{launch, paths};
use preheat_launch::agentctl::{self, AgentClient};

#[derive(Args, Debug)]
pub struct CommArgs {
    /// A running process that has the agent attached (instead of a program after `--`).
    #[arg(long, conflicts_with = "program")]
    pub pid: Option<u32>,
    /// Stop after this many seconds (with --pid: required; with a program: stop it then, and
    /// report what was seen while it ran, not its exit).
    #[arg(long)]
    pub duration: Option<f64>,
    /// Zero the matrix this many ms after detection started, so start-up sharing (libraries,
    /// initialisation) is not counted (the paper resets after starting the benchmark).
    #[arg(long, default_value_t = 0)]
    pub reset_after_ms: u64,
    /// Length of one sampling round, ms.
    #[arg(long, default_value_t = 100)]
    pub period_ms: u32,
    /// Pages revoked per round (capped by --budget).
    #[arg(long, default_value_t = 64)]
    pub pages: u32,
    /// Most induced faults per second (SPCD's default sampling rate is of this order).
    #[arg(long, default_value_t = 1000)]
    pub budget: u32,
    /// Granule in bytes (power of two ≥ 4096): accesses within one granule count as sharing.
    #[arg(long, default_value_t = 4096)]
    pub granule: u64,
    /// Which accesses fault: `write` (pages read-only; safe for the program's system calls) or
    /// `any` (pages inaccessible, as SPCD; system calls that read them fail with EFAULT).
    #[arg(long, value_enum, default_value = "write")]
    pub access: AccessArg,
    /// How pages are revoked: `mprotect` (a SIGSEGV handler in the program), `uffd`
    /// (userfaultfd write-protect: no signals, system calls wait instead of failing; writes
    /// only), or `auto` (mprotect; the report says whether userfaultfd was available).
    #[arg(long, value_enum, default_value = "auto")]
    pub mechanism: MechanismArg,
    /// Write the report (matrix, threads, counters) as JSON here.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Write the matrix as CSV here (header: thread labels).
    #[arg(long)]
    pub csv: Option<PathBuf>,
    /// Print the JSON report on stdout instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Keep only threads whose name starts with this (e.g. the workers of a pool).
    #[arg(long, value_name = "PREFIX")]
    pub only: Option<String>,
    /// The program and its arguments.
    #[arg(last = true)]
    pub program: Vec<String>,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum MechanismArg {
    Auto,
    Mprotect,
    Uffd,
}

impl From<MechanismArg> for CommMechanism {
    fn from(m: MechanismArg) -> CommMechanism {
        match m {
            MechanismArg::Auto => CommMechanism::Auto,
            MechanismArg::Mprotect => CommMechanism::Mprotect,
            MechanismArg::Uffd => CommMechanism::Uffd,
        }
    }
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum AccessArg {
    Write,
    Any,
}

impl CommArgs {
    fn config(&self) -> CommConfig {
        CommConfig {
            period_ms: self.period_ms,
            pages: self.pages,
            granule: self.granule,
            budget: self.budget,
            access: match self.access {
                AccessArg::Write => CommAccess::Write,
                AccessArg::Any => CommAccess::Any,
            },
            mechanism: self.mechanism.into(),
        }
    }
}

pub fn run(a: CommArgs) -> Result<()> {
    let cfg = a.config();
    if let Err(e) = cfg.validate() {
        bail!("{e}");
    }
    let (mut report, program, status) = match (a.pid, a.program.is_empty()) {
        (Some(pid), _) => (attach(&a, cfg, pid)?, format!("pid {pid}"), None),
        (None, false) => {
            let f = Follow {
                argv: &a.program,
                cfg,
                reset_after_ms: a.reset_after_ms,
                duration: a.duration,
                stdout: None,
                poll: Duration::from_millis(100),
                progress: true,
            };
            let (r, st) = follow(&f, |_, _| {})?;
            // Stopped at --duration: the program did not fail.
            let st = if a.duration.is_some() { None } else { Some(st) };
            (r, a.program.join(" "), st)
        }
        (None, true) => bail!(
            "give a program after `--` (preheat comm -- ./my-program args) or --pid of a \
             process that runs with the agent"
        ),
    };
    if let Some(prefix) = &a.only {
        report = only_threads(&report, prefix);
    }
    write_outputs(&a, &report, &program)?;
    if let Some(st) = status {
        if !st.success() {
            bail!("the program exited with {st} (the report above covers it until then)");
        }
    }
    Ok(())
}

/// Sample a running process for `--duration` seconds.
fn attach(a: &CommArgs, cfg: CommConfig, pid: u32) -> Result<CommReport> {
    let Some(secs) = a.duration else {
        bail!("--pid needs --duration SECONDS (how long to sample)");
    };
    let run_dir = paths::run_dir();
    let mut c = AgentClient::connect(&run_dir, pid)?;
    c.call(&Request::CommStart { config: cfg })?;
    let mut poll = Poller::new(a.reset_after_ms, true);
    let mut last = None;
    while poll.t0.elapsed().as_secs_f64() < secs {
        std::thread::sleep(Duration::from_millis(200));
        if let Some((r, _)) = poll.step(&mut c)? {
            last = Some(r);
        }
    }
    end_progress();
    match c.call(&Request::CommStop)? {
        Reply::Comm(r) => Ok(r),
        _ => last.context("the agent sent no communication report"),
    }
}

/// One poll of a running session: the reset once its time has come, then the report (with
/// progress on a terminal) and the time since the reset.
struct Poller {
    t0: Instant,
    reset_after: Duration,
    reset_at: Option<Instant>,
    progress: bool,
}

impl Poller {
    fn new(reset_after_ms: u64, progress: bool) -> Poller {
        let t0 = Instant::now();
        Poller {
            t0,
            reset_after: Duration::from_millis(reset_after_ms),
            reset_at: (reset_after_ms == 0).then_some(t0),
            progress,
        }
    }

    /// Err: the reset was refused; Ok(None): no report this time.
    fn step(&mut self, c: &mut AgentClient) -> Result<Option<(CommReport, Option<Duration>)>> {
        if self.reset_at.is_none() && self.t0.elapsed() >= self.reset_after {
            c.call(&Request::CommReset)?;
            self.reset_at = Some(Instant::now());
        }
        let Ok(r) = c.comm_report() else {
            return Ok(None);
        };
        if self.progress {
            progress(&r, self.t0);
        }
        let since = self.reset_at.map(|at| at.elapsed());
        Ok(Some((r, since)))
    }
}

fn progress(r: &CommReport, t0: Instant) {
    use std::io::IsTerminal;
    if !std::io::stderr().is_terminal() {
        return;
    }
    eprint!(
        "\rcomm: {:5.1} s, {} threads, {:.0} induced faults/s, {:.0} events/s (measured)   ",
        t0.elapsed().as_secs_f64(),
        r.threads.len(),
        r.faults_per_s(),
        r.events_per_s()
    );
    let _ = std::io::stderr().flush();
}

fn end_progress() {
    use std::io::IsTerminal;
    if std::io::stderr().is_terminal() {
        eprintln!();
    }
}

/// A program started under the agent; stopped (with its children) on drop.
/// How to run a program under detection ([`follow`]).
pub struct Follow<'a> {
    pub argv: &'a [String],
    pub cfg: CommConfig,
    /// Zero the matrix this long after start (0: never).
    pub reset_after_ms: u64,
    /// Stop the program after this many seconds (the report is the last one taken while it
    /// ran, so sharing at its exit is not counted).
    pub duration: Option<f64>,
    /// Send the program's standard output here instead of ours.
    pub stdout: Option<PathBuf>,
    /// How often to poll the report.
    pub poll: Duration,
    /// Show progress on a terminal.
    pub progress: bool,
}

/// Start a program with detection on from its first instruction, follow it until it exits (or
/// `duration`), calling `observe` with every report polled (and the time since the reset), and
/// return the final report and the program's exit status.
pub fn follow(
    f: &Follow,
    mut observe: impl FnMut(&CommReport, Duration),
) -> Result<(CommReport, ExitStatus)> {
    let run_dir = paths::run_dir();
    std::fs::create_dir_all(&run_dir)
        .with_context(|| format!("creating the run directory {}", run_dir.display()))?;
    let work = tempfile::Builder::new()
        .prefix("preheat-comm-")
        .tempdir()
        .context("creating a temporary directory")?;
    let final_path = work.path().join("final.json");
    let agent = paths::agent_so()?;
    let Some(prog) = f.argv.first() else {
        bail!("no program to run");
    };
    let mut cmd = Command::new(prog);
    cmd.args(&f.argv[1..])
        .stdin(Stdio::null())
        .env("LD_PRELOAD", &agent)
        .env("PREHEAT_RUN_DIR", &run_dir)
        .env("PREHEAT_COMM", "1")
        .env("PREHEAT_COMM_CONFIG", serde_json::to_string(&f.cfg)?)
        .env("PREHEAT_COMM_OUT", &final_path);
    if let Some(out) = &f.stdout {
        let file =
            std::fs::File::create(out).with_context(|| format!("creating {}", out.display()))?;
        cmd.stdout(file);
    }
    let mut prog =
        launch::Program::spawn(&mut cmd).with_context(|| format!("cannot start {prog}"))?;
    let pid = prog.child.id();
    let mut client: Option<AgentClient> = None;
    let mut poll = Poller::new(f.reset_after_ms, f.progress);
    let mut last: Option<CommReport> = None;
    let mut stopped = false;
    let status = loop {
        if let Some(st) = prog.child.try_wait()? {
            break st;
        }
        if f.duration
            .is_some_and(|d| poll.t0.elapsed().as_secs_f64() >= d)
        {
            if let Some(c) = client.as_mut() {
                if let Ok(r) = c.comm_report() {
                    last = Some(r);
                }
            }
            stopped = true;
            launch::stop_tree(pid, Duration::from_secs(2));
            break prog.child.wait()?;
        }
        if client.is_none() && agentctl::discover(&run_dir).contains(&pid) {
            client = AgentClient::connect(&run_dir, pid).ok();
        }
        if let Some(c) = client.as_mut() {
            // A refused reset is tried again at the next poll.
            if let Ok(Some((r, since))) = poll.step(c) {
                if let Some(t) = since {
                    observe(&r, t);
                }
                last = Some(r);
            }
        }
        std::thread::sleep(f.poll);
    };
    if f.progress {
        end_progress();
    }
    let fin = if stopped {
        None
    } else {
        std::fs::read_to_string(&final_path)
            .ok()
            .and_then(|t| serde_json::from_str::<CommReport>(&t).ok())
    };
    let report = match (fin, last) {
        (Some(r), _) => r,
        (None, Some(r)) => {
            if !stopped {
                eprintln!(
                    "preheat comm: the program did not exit normally ({status}); the report is \
                     the last one taken while it ran"
                );
            }
            r
        }
        (None, None) => bail!(
            "no communication report: the program exited ({status}) before the agent reported \
             (is {} loadable, and the program dynamically linked?)",
            agent.display()
        ),
    };
    Ok((report, status))
}

/// The report restricted to threads whose name starts with `prefix` (a sub-matrix).
pub fn only_threads(r: &CommReport, prefix: &str) -> CommReport {
    let keep: Vec<usize> = r
        .threads
        .iter()
        .enumerate()
        .filter(|(_, t)| t.name.starts_with(prefix))
        .map(|(i, _)| i)
        .collect();
    let matrix: Vec<Vec<u64>> = keep
        .iter()
        .map(|&i| keep.iter().map(|&j| r.matrix[i][j]).collect())
        .collect();
    CommReport {
        threads: keep.iter().map(|&i| r.threads[i].clone()).collect(),
        events: preheat_model::comm::events_of(&matrix),
        matrix,
        ..r.clone()
    }
}

/// Thread labels: `name/tid` (name empty: `tid`).
pub fn labels(r: &CommReport) -> Vec<String> {
    r.threads
        .iter()
        .map(|t| {
            if t.name.is_empty() {
                t.tid.to_string()
            } else {
                format!("{}/{}", t.name, t.tid)
            }
        })
        .collect()
}

fn write_outputs(a: &CommArgs, r: &CommReport, program: &str) -> Result<()> {
    let mut doc = serde_json::to_value(r)?;
    if let Some(o) = doc.as_object_mut() {
        o.insert("program".into(), program.into());
        o.insert("label".into(), "measured".into());
        o.insert("labels".into(), labels(r).into());
        o.insert("events_per_s".into(), r.events_per_s().into());
        o.insert("faults_per_s".into(), r.faults_per_s().into());
    }
    if let Some(p) = &a.out {
        write_file(p, serde_json::to_string_pretty(&doc)?.as_bytes())?;
    }
    if let Some(p) = &a.csv {
        write_file(p, csv_text(r)?.as_bytes())?;
    }
    if a.json {
        println!("{}", serde_json::to_string(&doc)?);
    } else {
        print!("{}", table(r, program));
    }
    Ok(())
}

fn write_file(p: &Path, bytes: &[u8]) -> Result<()> {
    std::fs::write(p, bytes).with_context(|| format!("writing {}", p.display()))
}

fn csv_text(r: &CommReport) -> Result<String> {
    let mut w = csv::Writer::from_writer(Vec::new());
    let mut header = vec!["thread".to_string()];
    header.extend(labels(r));
    w.write_record(&header)?;
    for (label, row) in labels(r).into_iter().zip(&r.matrix) {
        let mut rec = vec![label];
        rec.extend(row.iter().map(|v| v.to_string()));
        w.write_record(&rec)?;
    }
    Ok(String::from_utf8(w.into_inner()?)?)
}

fn table(r: &CommReport, program: &str) -> String {
    let mut s = String::new();
    let secs = r.elapsed_ns as f64 / 1e9;
    s += &format!(
        "communication matrix of {program} (measured: {} events in {:.1} s, {} induced faults \
         = {:.0}/s, {} rounds; mechanism {}, {} faults, {} pages per {} ms, granule {} B)\n",
        r.events,
        secs,
        r.faults_induced,
        r.faults_per_s(),
        r.rounds,
        r.mechanism,
        r.config.access.name(),
        r.config.pages_per_round(),
        r.config.period_ms,
        r.config.granule
    );
    let labels = labels(r);
    let w = labels
        .iter()
        .map(|l| l.len())
        .max()
        .unwrap_or(4)
        .clamp(4, 24);
    s += &format!("{:>w$} ", "");
    for i in 0..labels.len() {
        s += &format!("{i:>7}");
    }
    s += "\n";
    for (i, (l, row)) in labels.iter().zip(&r.matrix).enumerate() {
        let l: String = l.chars().take(w).collect();
        s += &format!("{l:>w$} ");
        for (j, v) in row.iter().enumerate() {
            if i == j {
                s += &format!("{:>7}", "-");
            } else {
                s += &format!("{v:>7}");
            }
        }
        s += &format!("   [{i}]\n");
    }
    if r.faults_foreign > 0 || r.efault_retries > 0 || r.pages_released > 0 {
        s += &format!(
            "program's own faults passed on: {}, system calls retried after EFAULT: {}, pages \
             released after the program changed them: {}\n",
            r.faults_foreign, r.efault_retries, r.pages_released
        );
    }
    if let Some(why) = &r.disabled_reason {
        s += &format!("detection stopped itself: {why}\n");
    }
    s += "next: preheat groups <the --out file> (coscheduling sets, eq. 1, t = 1.5)\n";
    s
}
