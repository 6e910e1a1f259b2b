//! A detection session: a program started under the agent with detection on from its first
//! instruction and followed until it exits ([`follow`]), or a running process that has the agent
//! sampled for a while ([`attach`]); the matrix reset after start-up as the paper does.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use preheat_launch::agentctl::{self, AgentClient};
use preheat_launch::{launch, paths, preflight};
use preheat_model::comm::{CommConfig, CommReport};
use preheat_model::proto::{Reply, Request};

/// One report polled from a running session.
pub struct Polled<'a> {
    pub report: &'a CommReport,
    /// Since detection started.
    pub elapsed: Duration,
    /// Since the matrix was reset (None: not yet).
    pub since_reset: Option<Duration>,
}

/// One poll of a running session: the reset once its time has come, then the report and the
/// time since the reset.
struct Poller {
    t0: Instant,
    reset_after: Duration,
    reset_at: Option<Instant>,
}

impl Poller {
    fn new(reset_after_ms: u64) -> Poller {
        let t0 = Instant::now();
        Poller {
            t0,
            reset_after: Duration::from_millis(reset_after_ms),
            reset_at: (reset_after_ms == 0).then_some(t0),
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
        let since = self.reset_at.map(|at| at.elapsed());
        Ok(Some((r, since)))
    }

    fn polled<'a>(&self, report: &'a CommReport, since_reset: Option<Duration>) -> Polled<'a> {
        Polled {
            report,
            elapsed: self.t0.elapsed(),
            since_reset,
        }
    }
}

/// Sample the running process `pid` (its agent in `run_dir`) for `secs` seconds, calling
/// `observe` with every report polled, and return the final report.
pub fn attach(
    run_dir: &Path,
    pid: u32,
    cfg: CommConfig,
    reset_after_ms: u64,
    secs: f64,
    mut observe: impl FnMut(&Polled),
) -> Result<CommReport> {
    let mut c = AgentClient::connect(run_dir, pid)?;
    c.call(&Request::CommStart { config: cfg })?;
    let mut poll = Poller::new(reset_after_ms);
    let mut last = None;
    while poll.t0.elapsed().as_secs_f64() < secs {
        std::thread::sleep(Duration::from_millis(200));
        if let Some((r, since)) = poll.step(&mut c)? {
            observe(&poll.polled(&r, since));
            last = Some(r);
        }
    }
    match c.call(&Request::CommStop)? {
        Reply::Comm(r) => Ok(r),
        _ => last.context("the agent sent no communication report"),
    }
}

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
}

/// A program started under the agent, its process and where its final report goes.
struct Started {
    prog: launch::Program,
    final_path: PathBuf,
    /// What the pre-flight ruled out (said if no report comes).
    ready: preflight::Ready,
    _work: tempfile::TempDir,
}

fn start(f: &Follow, run_dir: &Path) -> Result<Started> {
    std::fs::create_dir_all(run_dir)
        .with_context(|| format!("creating the run directory {}", run_dir.display()))?;
    let work = tempfile::Builder::new()
        .prefix("preheat-comm-")
        .tempdir()
        .context("creating a temporary directory")?;
    let final_path = work.path().join("final.json");
    let Some(prog) = f.argv.first() else {
        bail!("no program to run");
    };
    let mut cmd = Command::new(prog);
    let ready = launch::attach_agent(&mut cmd, prog, preflight::Needs::Load)?;
    launch::agent_run_dir(&mut cmd, run_dir)?;
    cmd.args(&f.argv[1..])
        .stdin(Stdio::null())
        .env("PREHEAT_COMM", "1")
        .env("PREHEAT_COMM_CONFIG", serde_json::to_string(&f.cfg)?)
        .env("PREHEAT_COMM_OUT", &final_path);
    if let Some(out) = &f.stdout {
        let file =
            std::fs::File::create(out).with_context(|| format!("creating {}", out.display()))?;
        cmd.stdout(file);
    }
    let prog = launch::Program::spawn(&mut cmd).with_context(|| format!("cannot start {prog}"))?;
    Ok(Started {
        prog,
        final_path,
        ready,
        _work: work,
    })
}

/// What [`follow`] saw.
pub struct Followed {
    pub report: CommReport,
    pub status: ExitStatus,
    /// A note for the user (`preheat comm: ...`): the report is the last one polled, because the
    /// program did not exit normally.
    pub note: Option<String>,
}

/// Start a program with detection on from its first instruction, follow it until it exits (or
/// `duration`), calling `observe` with every report polled, and return the final report and the
/// program's exit status.
pub fn follow(f: &Follow, mut observe: impl FnMut(&Polled)) -> Result<Followed> {
    let run_dir = paths::run_dir();
    let Started {
        mut prog,
        final_path,
        ready,
        _work,
    } = start(f, &run_dir)?;
    let pid = prog.child.id();
    let mut client: Option<AgentClient> = None;
    let mut poll = Poller::new(f.reset_after_ms);
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
                observe(&poll.polled(&r, since));
                last = Some(r);
            }
        }
        std::thread::sleep(f.poll);
    };
    let fin = if stopped {
        None
    } else {
        std::fs::read_to_string(&final_path)
            .ok()
            .and_then(|t| serde_json::from_str::<CommReport>(&t).ok())
    };
    let mut note = None;
    let report = match (fin, last) {
        (Some(r), _) => r,
        (None, Some(r)) => {
            if !stopped {
                note = Some(format!(
                    "preheat comm: the program did not exit normally ({status}); the report is \
                     the last one taken while it ran"
                ));
            }
            r
        }
        (None, None) => bail!(
            "no communication report: the program exited ({status}) before the agent reported \
             (ruled out before the start: {}; not checked: programs it starts later)",
            ready.ruled_out.join("; ")
        ),
    };
    Ok(Followed {
        report,
        status,
        note,
    })
}
