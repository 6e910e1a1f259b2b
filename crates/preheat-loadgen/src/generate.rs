//! The load run: the engine's configuration from the parameters (and the combinations it
//! refuses, saying why), the announcers and the records sink it is given, and the report.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use preheat_lab::driver::{self, Protocol, Wait, WorkloadSpec};
use preheat_lab::load::{self as engine, CsvSink, LoadConfig, Mode, RecordSink};
use preheat_model::proto::Strategies;
use serde::Serialize;

use crate::announce::announcers;
use crate::observe::{ObserveSink, Observer};
use crate::params::LoadParams;

/// A load run's result: `preheat load --json` prints it.
#[derive(Debug, Serialize)]
pub struct LoadReport {
    pub target: String,
    pub protocol: Protocol,
    pub announce: String,
    pub strategy: String,
    pub wait: Wait,
    pub seed: u64,
    pub warmup: u64,
    /// The engine's totals (label, mode, counts, throughput, latency quantiles), flattened.
    #[serde(flatten)]
    pub summary: preheat_lab::load::LoadSummary,
    /// Wait from asking for a slot to the allocated send time, µs (p50), scheduled requests.
    pub slot_wait_us_p50: f64,
    /// The run was cut short by SIGINT/SIGTERM; the numbers cover what was measured.
    pub interrupted: bool,
    pub records: Option<PathBuf>,
    /// With --observe: server thread start − intended (announced) arrival, µs, p50 / p99, and
    /// how many requests that measure covers.
    pub server_start_us_p50: Option<f64>,
    pub server_start_us_p99: Option<f64>,
    pub observed: u64,
    /// With --observe: announcements acted on, and lines preheats that finished before the
    /// announced arrival, as counted by the agents during the run.
    pub agent_announcements: u64,
    pub agent_preheats: u64,
    pub agent_preheats_completed: u64,
    pub agent_late: u64,
}

/// The engine's configuration from the flags.
fn config(a: &LoadParams, strategy: String) -> Result<LoadConfig> {
    if a.connections == 0 {
        bail!("--connections must be at least 1");
    }
    let rate = match (a.mode, a.rate) {
        (Mode::Open, Some(r)) if r.is_finite() && r > 0.0 => r,
        (Mode::Open, Some(r)) => bail!("--rate must be a positive number of requests/s (got {r})"),
        (Mode::Open, None) => bail!("--mode open needs --rate (requests/s over all connections)"),
        (_, Some(_)) => bail!("--rate applies to --mode open only"),
        (_, None) => 0.0,
    };
    let duration = match a.duration_s {
        Some(d) if d.is_finite() && d > 0.0 => Some(Duration::from_secs_f64(d)),
        Some(d) => bail!("--duration-s must be positive (got {d})"),
        None => None,
    };
    let requests = a.request_count();
    if requests == Some(0) {
        bail!("--requests 0: nothing would be measured (give at least 1, or --duration-s)");
    }
    let threads = a.threads.unwrap_or(a.connections);
    if threads == 0 || threads > a.connections {
        bail!(
            "--threads must be between 1 and --connections ({}), got {threads}",
            a.connections
        );
    }
    // What needs one thread per connection (the event loop cannot run it); mysql is worded
    // apart for each case.
    let per_connection = |mysql: &'static str| {
        if a.mode == Mode::IdleGap {
            Some("--mode idle-gap (each connection sleeps its own gap)")
        } else if a.announce_local {
            Some("--announce-local (each request is granted its own send time)")
        } else if a.arbiter.is_some() {
            Some("--arbiter (each request is granted its own send time)")
        } else if a.protocol == Protocol::Mysql {
            Some(mysql)
        } else {
            None
        }
    };
    if a.wait == Wait::Epoll {
        if let Some(why) = per_connection(
            "--protocol mysql: not supported by the mysql driver (it only blocks, no event loop)",
        ) {
            bail!("--wait epoll runs the event loop, which does not support {why}; use --wait block or spin");
        }
    }
    if threads < a.connections {
        if let Some(why) = per_connection("--protocol mysql (its driver only blocks)") {
            bail!(
                "--threads {threads} < --connections {}: {why} needs one thread per connection; drop --threads",
                a.connections
            );
        }
    }
    if a.observe && a.connections != 1 {
        bail!(
            "--observe attributes the agents' latest busy period to the latest request, so it needs --connections 1 (got {})",
            a.connections
        );
    }
    Ok(LoadConfig {
        mode: a.mode,
        requests,
        duration,
        rate,
        gap: Duration::from_millis(a.gap_ms),
        connections: a.connections,
        threads,
        wait: a.wait,
        warmup: a.warmup,
        seed: a.seed,
        strategy,
    })
}

/// Run the load `a` asks for until its requests or duration are done or `stop` is set (the
/// report then covers what was measured, `interrupted`); `progress` gets the number of measured
/// requests so far.
pub fn generate(
    a: &LoadParams,
    stop: &AtomicBool,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<LoadReport> {
    let target: SocketAddr = a
        .target
        .to_socket_addrs()
        .with_context(|| format!("resolving {}", a.target))?
        .next()
        .with_context(|| format!("{} resolves to nothing", a.target))?;
    let strategies = Strategies::parse(&a.strategies).map_err(anyhow::Error::msg)?;
    let strategy = a.strategy.clone().unwrap_or_else(|| {
        if a.arbiter.is_some() {
            "arbiter".into()
        } else if a.announce_local {
            strategies.name()
        } else {
            "none".into()
        }
    });
    let cfg = config(a, strategy)?;
    let spec = WorkloadSpec {
        protocol: a.protocol,
        key: a.key.clone(),
        expect: None,
        tpcc: (a.protocol == Protocol::Mysql).then(preheat_lab::tpcc::TpccConfig::default),
    };
    let wait = a.wait;
    let connect = move || driver::connect(target, &spec, wait);

    // Announcers: one per connection, made by the engine in the connection's thread.
    let slot_waits = Arc::new(Mutex::new(Vec::<f64>::new()));
    let announcer = announcers(a, target, strategies, &slot_waits)?;

    // Records, and the observer (which reads each record right after its reply).
    let csv = match &a.records {
        Some(p) => Some(CsvSink::create(p)?),
        None => None,
    };
    let starts = Arc::new(Mutex::new(Vec::<f64>::new()));
    // The agents' counters before the run (the report gives what the run added).
    let mut totals_before = a.observe.then(|| {
        let mut o = Observer::new(target.port());
        let t0 = o.totals();
        (o, t0)
    });
    let sink: Option<Box<dyn RecordSink>> = if a.observe {
        Some(Box::new(ObserveSink {
            csv,
            observer: Observer::new(target.port()),
            starts: starts.clone(),
        }))
    } else {
        csv.map(|c| Box::new(c) as Box<dyn RecordSink>)
    };

    let s = engine::run(&cfg, &connect, announcer.as_deref(), sink, stop, progress)?;
    let interrupted = stop.load(Ordering::Relaxed);

    let totals = match totals_before.as_mut() {
        Some((o, t0)) => {
            let t1 = o.totals();
            std::array::from_fn(|i| t1[i].saturating_sub(t0[i]))
        }
        None => [0; 4],
    };
    let starts = starts.lock().map(|v| v.clone()).unwrap_or_default();
    let start = preheat_model::stats::summarize(&starts);
    let waits = slot_waits.lock().map(|v| v.clone()).unwrap_or_default();
    Ok(LoadReport {
        target: a.target.clone(),
        protocol: a.protocol,
        announce: if a.arbiter.is_some() {
            "arbiter".into()
        } else if a.announce_local {
            format!("local {} µs, {}", a.lead_us, strategies.name())
        } else {
            "none".into()
        },
        strategy: cfg.strategy.clone(),
        wait: a.wait,
        seed: a.seed,
        warmup: a.warmup,
        summary: s,
        // The model's median (the lower middle of an even sample); 0 without a wait.
        slot_wait_us_p50: preheat_model::stats::summarize(&waits).p50,
        interrupted,
        records: a.records.clone(),
        server_start_us_p50: (start.n > 0).then_some(start.p50),
        server_start_us_p99: (start.n > 0).then_some(start.p99),
        observed: start.n as u64,
        agent_announcements: totals[0],
        agent_preheats: totals[1],
        agent_preheats_completed: totals[2],
        agent_late: totals[3],
    })
}
