//! One estimation from start to profile (`preheat record`): choose the backend this machine and
//! workload allow ([`choose_backend`]), start the server with the agent and find the agent that
//! serves it ([`Session::start`]), record ([`Started::record`]). The caller prints.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Result};
use preheat_lab::servers::Plan;
use preheat_launch::launch::{self, Server, ServerSpec};
use preheat_launch::progress::Progress;
use preheat_launch::servers::{self, Requester, Workload};

use crate::exact::{record_step, record_trace};
use crate::hybrid::{ptrace_denied, record_hybrid};
use crate::params::{BackendChoice, RecordParams, Recording};
use crate::record::record_probe;
use crate::serving::serving_agent;

/// The backend that records for `asked` (`Auto` stays `Auto`: hybrid, falling back to the
/// probe's profile), with notes for the user on what was chosen instead and why.
pub fn choose_backend(asked: BackendChoice, w: &Workload) -> Result<(BackendChoice, Vec<String>)> {
    let mut notes = Vec::new();
    let backend = match asked {
        BackendChoice::Auto => {
            if preheat_engine::topology::has_pmu() {
                notes.push("a PMU is present, but the pmu backend is not implemented yet".into());
            }
            if let Some(why) = ptrace_denied() {
                notes.push(format!("note: recording with probe only, not hybrid: {why}; code lines will be over-reported"));
                BackendChoice::Probe
            } else if w.raw.is_none() {
                notes.push("note: recording with probe only, not hybrid: this workload has no fixed byte request for the step backend".into());
                BackendChoice::Probe
            } else {
                BackendChoice::Auto
            }
        }
        BackendChoice::Hybrid => {
            if let Some(why) = ptrace_denied() {
                bail!("backend hybrid needs ptrace of the server (its code lines come from the step backend), but {why}; use --backend probe");
            }
            BackendChoice::Hybrid
        }
        BackendChoice::Pmu => {
            if !preheat_engine::topology::has_pmu() {
                bail!("backend pmu: this machine exposes no hardware PMU (perf_event_open of cycles fails; typical of VMs without a virtual PMU); use --backend probe (flush+reload) or --backend trace (Valgrind)");
            }
            bail!("backend pmu: IBS/PEBS data-address sampling is not implemented yet; use --backend probe or trace");
        }
        b => b,
    };
    Ok((backend, notes))
}

/// What to record: a server, its workload, and how.
pub struct Session {
    pub spec: ServerSpec,
    pub workload: Workload,
    /// The catalog's plan of a known server (data to load, start timeout).
    pub plan: Option<Plan>,
    /// As chosen by [`choose_backend`].
    pub backend: BackendChoice,
    pub params: RecordParams,
    /// Hybrid: also write the two merged profiles into this directory.
    pub parts: Option<PathBuf>,
    /// Keep the agents' logs after a recording that ended well (else they are removed with the
    /// server; a failed recording always keeps them).
    pub keep_agent_logs: bool,
}

/// A session whose server runs with the agent (every backend but `trace`, which starts its own
/// under Valgrind).
pub struct Started {
    session: Session,
    agent: Option<(Server, u32, Requester)>,
}

impl Session {
    /// Start the server in `dir` (the trace backend starts it itself when recording), load its
    /// data, and find the agent that serves the measuring connection.
    pub fn start(mut self, dir: &Path) -> Result<Started> {
        if self.backend == BackendChoice::Trace {
            self.spec.agent = false;
            return Ok(Started {
                session: self,
                agent: None,
            });
        }
        let timeout = self
            .plan
            .as_ref()
            .map(|p| p.start_timeout)
            .unwrap_or(Duration::from_secs(20));
        let server = launch::start(
            self.spec.clone(),
            &preheat_launch::paths::run_dir(),
            dir,
            timeout,
        )?;
        if let Some(plan) = &self.plan {
            servers::prepare(plan, server.addr())?;
        }
        let mut via = self.workload.connect(server.addr())?;
        let pid = serving_agent(&server, &mut via)?;
        Ok(Started {
            session: self,
            agent: Some((server, pid, via)),
        })
    }
}

impl Started {
    /// What is about to be recorded, for the user: "recording port P of NAME (pid N) with the
    /// B backend: n samples, keep >= k".
    pub fn describe(&self) -> String {
        let s = &self.session;
        let f = s.params.filter;
        match &self.agent {
            None => format!(
                "recording port {} of {} with the trace backend (Valgrind): {} samples, keep >= {}",
                s.spec.port, s.spec.name, f.n, f.k
            ),
            Some((server, pid, _)) => {
                let name = match s.backend {
                    BackendChoice::Auto => "hybrid (auto)",
                    BackendChoice::Step => "step",
                    BackendChoice::Hybrid => "hybrid",
                    _ => "probe",
                };
                format!(
                    "recording port {} of {} (pid {pid}) with the {name} backend: {} samples, keep >= {}",
                    server.spec.port, server.spec.name, f.n, f.k
                )
            }
        }
    }

    /// Record; the server (if started) stops when this returns, and where the recording ended
    /// well its agents' logs go with it (unless the session keeps them).
    pub fn record(self, progress: &dyn Progress) -> Result<Recording> {
        let s = self.session;
        let p = &s.params;
        let Some((server, pid, mut via)) = self.agent else {
            return record_trace(
                &s.spec.argv,
                s.spec.port,
                s.plan.as_ref(),
                &s.workload,
                p,
                progress,
            );
        };
        let rec = match s.backend {
            // step and hybrid open their own connections: `via` is closed first (a prefork
            // worker that serves one connection at a time could not take theirs).
            BackendChoice::Step => {
                drop(via);
                record_step(&server, pid, &s.workload, p, None, progress)
            }
            BackendChoice::Hybrid | BackendChoice::Auto => {
                drop(via);
                let required = s.backend == BackendChoice::Hybrid;
                let parts = s.parts.as_deref();
                record_hybrid(&server, pid, &s.workload, p, required, parts, progress)
            }
            _ => {
                let r = record_probe(&server, pid, &s.workload, p, &mut via, progress);
                drop(via); // closed before the server stops
                r
            }
        };
        server.stop_and_tidy(&[], s.keep_agent_logs || rec.is_err());
        rec
    }
}
