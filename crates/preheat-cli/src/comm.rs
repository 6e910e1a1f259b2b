//! `preheat comm`: communication detection (SPCD in user space, partial-coscheduling paper §2.2)
//! on an unmodified program started under the agent, or on a running process that has one.
//!
//! The agent does the sampling (`preheat-agent::comm`) and `preheat-comm` drives it (starts it,
//! resets the matrix after start-up as the paper does); this command shows progress and writes
//! the thread × thread matrix as JSON (the shape `preheat groups` reads), CSV and a text table.
//! Everything it prints is measured on this machine.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use preheat_comm::report::{labels, only_threads};
use preheat_comm::session::{attach, follow, Follow, Followed, Polled};
use preheat_launch::paths;
use preheat_model::comm::{CommAccess, CommConfig, CommMechanism, CommReport};

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
            ..CommConfig::default()
        }
    }
}

pub fn run(a: CommArgs) -> Result<()> {
    let cfg = a.config();
    if let Err(e) = cfg.validate() {
        bail!("{e}");
    }
    let (mut report, program, status) = match (a.pid, a.program.is_empty()) {
        (Some(pid), _) => {
            let Some(secs) = a.duration else {
                bail!("--pid needs --duration SECONDS (how long to sample)");
            };
            let r = attach(
                &paths::run_dir(),
                pid,
                cfg,
                a.reset_after_ms,
                secs,
                progress,
            );
            end_progress();
            (r?, format!("pid {pid}"), None)
        }
        (None, false) => {
            let f = Follow {
                argv: &a.program,
                cfg,
                reset_after_ms: a.reset_after_ms,
                duration: a.duration,
                stdout: None,
                poll: Duration::from_millis(100),
            };
            let followed = follow(&f, progress);
            end_progress();
            let Followed {
                report,
                status,
                note,
            } = followed?;
            if let Some(note) = note {
                eprintln!("{note}");
            }
            // Stopped at --duration: the program did not fail.
            let st = if a.duration.is_some() {
                None
            } else {
                Some(status)
            };
            (report, a.program.join(" "), st)
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

/// Progress on a terminal: one line, rewritten with every report.
fn progress(p: &Polled) {
    use std::io::IsTerminal;
    if !std::io::stderr().is_terminal() {
        return;
    }
    let r = p.report;
    eprint!(
        "\rcomm: {:5.1} s, {} threads, {:.0} induced faults/s, {:.0} events/s (measured)   ",
        p.elapsed.as_secs_f64(),
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
