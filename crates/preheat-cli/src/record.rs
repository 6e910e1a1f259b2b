//! `preheat record`: the arguments turned into a `preheat-estimate` session, and its report.

use anyhow::{bail, Result};
use preheat_estimate::layout::{self, Layout};
use preheat_estimate::session::{choose_backend, Session};
use preheat_estimate::{write_profile, RecordParams, RecordStats};
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

/// The session `a` asks for (the server started in the scratch directory `dir`).
fn session(a: &RecordArgs, dir: &std::path::Path) -> Result<Session> {
    let filter = a.filter.params()?;
    let params = RecordParams {
        filter,
        chunk_bytes: a.chunk_kib * 1024,
        subtract_noise: !a.keep_noise,
        layout: given_layout(a.stride, a.window_pages),
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
        preheat_launch::launch::tidy_agent_logs_on_signal();
    }
    let scratch = scratch_dir("record")?;
    let started = session(&a, scratch.path())?.start(scratch.path())?;
    eprintln!("preheat: {}", started.describe());
    let rec = started.record(&Bars::new(false))?;
    write_profile(&a.out, &rec.profile)?;
    let st = rec.profile.classes[0].ws.stats();
    println!(
        "wrote {}: {} lines ({:.1} KiB) in {} runs, {} encoded bytes; {} requests, {:.1} s [measured: {} samples, probe threshold {} ticks]",
        a.out.display(),
        st.lines,
        st.kib,
        st.runs,
        st.encoded_bytes,
        rec.stats.requests_sent,
        rec.stats.seconds,
        rec.stats.samples,
        rec.stats.threshold_ticks
    );
    if !rec.stats.lines_per_sample.is_empty() {
        print_probe_stats(&rec.stats);
    }
    let st = &rec.stats;
    let remapped = st.cycles_repeated - st.probe_reconnects;
    if remapped > 0 {
        println!(
            "probe: {remapped} cycle(s) repeated because the server's mappings changed while it served the request"
        );
    }
    if st.probe_reconnects > 0 {
        println!(
            "probe: {} cycle(s) repeated on a new probe connection because the server had closed the agent's (an idle timeout of its keep-alive connections)",
            st.probe_reconnects
        );
    }
    if let Some(h) = rec.stats.hybrid {
        println!(
            "hybrid [measured]: {} code lines from step, {} data lines from probe; dropped {} probe code lines, {} non-executable step lines, {} unmapped",
            h.code_lines, h.data_lines, h.probe_code_lines_dropped, h.step_non_exec_dropped, h.unmapped_dropped
        );
    }
    Ok(())
}

/// Counts as "median [min–max], n = N" (the project's one median, `Spread`), or "n/a" without
/// any.
fn spread(v: &[u64]) -> String {
    if v.is_empty() {
        return "n/a".into();
    }
    let v: Vec<f64> = v.iter().map(|&x| x as f64).collect();
    preheat_model::stats::Spread::of(&v).show(0)
}

/// The probe layout the user gave (either flag; the other at its default), or `None` to choose
/// it by the pilot.
fn given_layout(stride: Option<u32>, window_pages: Option<u32>) -> Option<Layout> {
    (stride.is_some() || window_pages.is_some()).then(|| Layout {
        stride: stride.unwrap_or(layout::DEFAULT.stride),
        window_pages: window_pages.unwrap_or(layout::DEFAULT.window_pages),
    })
}

/// What the probe did: its layout (and the pilot that chose it), what its samples saw.
fn print_probe_stats(st: &RecordStats) {
    let pilot = if st.layout_trials.is_empty() {
        "given".to_string()
    } else {
        let trials: Vec<String> = st
            .layout_trials
            .iter()
            .map(|t| {
                format!(
                    "{}/{} {:.1}%",
                    t.layout.stride,
                    t.layout.window_pages,
                    100.0 * t.hit_share
                )
            })
            .collect();
        format!(
            "chosen by a pilot of {} request-less samples each, lines read as hits: {}",
            st.layout_trials[0].samples,
            trials.join(", ")
        )
    };
    println!(
        "probe [measured]: stride {} over {}-page windows ({pilot}); threshold {} ticks (hit {}, miss {}; {} calibration(s))",
        st.stride, st.window_pages, st.threshold_ticks, st.hit_ticks_p50, st.miss_ticks_p50, st.calibrations
    );
    for note in st.redo_notes() {
        println!("probe [measured]: {note}");
    }
    println!(
        "probe [measured]: {} KiB of candidates in {} chunk(s); lines seen per sample {}, per sample without a request {} ({:.1}% of the lines probed); {} lines seen in >= {} request-less samples removed",
        st.candidate_bytes / 1024,
        st.chunks,
        spread(&st.lines_per_sample),
        spread(&st.lines_per_noise_sample),
        100.0 * st.noise_hit_share,
        st.noise_lines_removed,
        st.noise_k
    );
}
