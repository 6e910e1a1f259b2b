//! `preheat record`: the arguments turned into a `preheat-estimate` session, and its report.

use anyhow::{bail, Result};
use preheat_estimate::layout::{self, Layout};
use preheat_estimate::{check_destination, write_profile, RecordParams};
use preheat_estimate::{params::Vote, session::choose_backend, session::Session};
use preheat_launch::launch::{self, scratch_dir};
use preheat_launch::servers;

use crate::progress::Bars;
use crate::RecordArgs;

/// `--backend`: which estimation backend records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendChoice {
    /// Best available: hybrid where ptrace is permitted and the workload is a fixed byte
    /// request, else probe (with a one-line note saying why).
    Auto,
    Probe,
    Trace,
    Pmu,
    /// Exact native code lines: single-step the serving thread with ptrace (slow; no data).
    Step,
    /// Code lines from step, data lines from probe, recorded on the same server and merged.
    Hybrid,
}

impl From<BackendChoice> for preheat_estimate::BackendChoice {
    fn from(b: BackendChoice) -> Self {
        use preheat_estimate::BackendChoice as B;
        match b {
            BackendChoice::Auto => B::Auto,
            BackendChoice::Probe => B::Probe,
            BackendChoice::Trace => B::Trace,
            BackendChoice::Pmu => B::Pmu,
            BackendChoice::Step => B::Step,
            BackendChoice::Hybrid => B::Hybrid,
        }
    }
}

/// `--vote`: see `preheat_estimate::params::Vote`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum VoteArg {
    Auto,
    Default,
    Enriched,
}

/// The session `a` asks for (the server started in the scratch directory `dir`).
fn session(a: &RecordArgs, dir: &std::path::Path) -> Result<Session> {
    let filter = a.filter.params()?;
    let params = RecordParams {
        filter,
        chunk_bytes: a.chunk_kib * 1024,
        subtract_noise: !a.keep_noise,
        layout: given_layout(a.stride, a.window_pages),
        warm_up: a.warm_up,
        vote: match a.vote {
            VoteArg::Auto => Vote::Auto,
            VoteArg::Default => Vote::Default,
            VoteArg::Enriched => Vote::Enriched,
        },
        ..Default::default()
    };
    let server_cpu = a.server_cpu.unwrap_or_else(crate::default_server_cpu);
    let (spec, workload, plan) = match (a.server, a.command.is_empty()) {
        (Some(k), _) => {
            let (spec, plan) = servers::plan(
                k,
                a.port,
                dir,
                servers::Placement {
                    cpus: vec![server_cpu],
                    agent: true,
                    netns: None,
                },
            )?;
            (spec, servers::Workload::of(&plan), Some(plan))
        }
        (None, false) => {
            let (Some(port), Some(req)) = (a.port, a.request.as_ref()) else {
                bail!("with a server command, give --port and --request (see --help)");
            };
            let spec = launch::ServerSpec {
                name: "server".into(),
                argv: a.command.clone(),
                port,
                agent: true,
                cpus: vec![server_cpu],
                env: vec![],
                agent_only: None,
                netns: None,
            };
            let w = servers::Workload::custom(
                launch::unescape(req).into_bytes(),
                launch::unescape(&a.until).into_bytes(),
            );
            (spec, w, None)
        }
        (None, true) => {
            bail!("name a server (--server kv) or give its command after -- (see --help)")
        }
    };
    let (backend, notes) = choose_backend(a.backend.into(), &workload)?;
    for n in notes {
        eprintln!("preheat: {n}");
    }
    Ok(Session {
        spec,
        workload,
        plan,
        backend,
        params,
        parts: a.parts.clone(),
        keep_agent_logs: a.keep_agent_logs,
    })
}

pub fn run(a: RecordArgs) -> Result<()> {
    if !a.keep_agent_logs {
        preheat_launch::cleanup::tidy_agent_logs_on_signal();
    }
    check_destination(&a.out)?;
    let scratch = scratch_dir("record")?;
    let started = session(&a, scratch.path())?.start(scratch.path())?;
    eprintln!("preheat: {}", started.describe());
    let rec = started.record(&Bars::new(false))?;
    write_profile(&a.out, &rec.profile)?;
    for line in preheat_estimate::report::lines(&a.out, &rec) {
        println!("{line}");
    }
    Ok(())
}

/// The probe layout the user gave (either flag; the other at its default), or `None` to choose
/// it by the pilot.
fn given_layout(stride: Option<u32>, window_pages: Option<u32>) -> Option<Layout> {
    (stride.is_some() || window_pages.is_some()).then(|| Layout {
        stride: stride.unwrap_or(layout::DEFAULT.stride),
        window_pages: window_pages.unwrap_or(layout::DEFAULT.window_pages),
    })
}
