//! Staged bursts (Zhu et al., *Sleeping CPUs*, "Staged Bursts", `shared/papers/sleeping-cpus.txt`):
//! instead of running every request as soon as it arrives, a staging proxy buffers requests and
//! releases them to the server in bursts every `period` (paper: 250 ms), so the server's CPUs
//! can sleep longer and more deeply between bursts, while each request still meets its latency
//! bound (paper: p99.9 under 500 ms) — a burst comes early when a buffered request would
//! otherwise miss it.
//!
//! | module | what |
//! |---|---|
//! | [`proxy`] | the staging TCP proxy [`Stage`] (per-connection backend connections, bursts, early release, failure handling, counters) |
//! | [`framing`] | request and response framing: HTTP/1.1 and the memcached text protocol |
//! | [`estimate`] | the learned backend response time behind early release |
//! | [`cpu_use`] | our vs other processes' CPU time over a window, a process's own wakeups (idle residency itself is [`preheat_power::residency`]) |
//! | [`mod@bench`] | open-loop Poisson benchmark: direct vs staged, latency and residency |
//!
//! Differences from the paper: the proxy runs on the server machine (the paper ran it on
//! another machine; here its own wakeups land on the client's CPU when pinned); a staging phase
//! opens at the first request into an empty stage, so bursts are never closer than `period`
//! apart; the early-release deadline uses a response time learned online (EWMA plus four mean
//! deviations plus a margin) rather than application feedback; no scheduler changes (the paper
//! also relaxed Linux's migration rules to spread bursts over all CPUs). Energy is not
//! measured (no RAPL here): residency is.
//!
//! CLI (wired by `preheat` as `preheat stage`): [`StageArgs`], [`run`].
#![forbid(unsafe_code)]

pub mod bench;
pub mod cpu_use;
pub mod estimate;
pub mod framing;
pub mod proxy;

use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

use anyhow::{bail, Context, Result};

pub use bench::{bench, BenchReport};
pub use framing::Framing;
pub use proxy::{Stage, StageConfig, StageCounters};

/// `preheat stage`: staged bursts (sleep shaping on servers).
#[derive(clap::Args, Debug, Clone)]
pub struct StageArgs {
    #[command(subcommand)]
    pub cmd: StageCmd,
}

#[derive(clap::Subcommand, Debug, Clone)]
pub enum StageCmd {
    /// Run the staging proxy until SIGINT/SIGTERM, then print its counters.
    Proxy(ProxyArgs),
    /// Measure latency and CPU idle residency, backend direct vs through the proxy.
    Bench(BenchArgs),
}

/// Staging parameters shared by `proxy` and `bench`.
#[derive(clap::Args, Debug, Clone)]
pub struct StagingOpts {
    /// Length of a staging phase: buffered requests are released in one burst this long after
    /// the first of them arrived (paper: 250).
    #[arg(long, default_value_t = 250)]
    pub period_ms: u64,
    /// Latency bound per request: a burst comes early when the oldest buffered request would
    /// otherwise miss it (paper: 500, for p99.9).
    #[arg(long, default_value_t = 500)]
    pub bound_ms: u64,
    /// Extra guard before the bound on top of the learned backend response time.
    #[arg(long, default_value_t = 5)]
    pub margin_ms: u64,
    /// Backend response time assumed before the first measurement.
    #[arg(long, default_value_t = 5)]
    pub initial_service_ms: u64,
}

impl StagingOpts {
    pub fn check(&self) -> Result<()> {
        if self.period_ms == 0 || self.bound_ms == 0 {
            bail!("--period-ms and --bound-ms must be positive");
        }
        Ok(())
    }

    /// Copies these parameters into a proxy configuration.
    pub fn apply(&self, cfg: &mut StageConfig) {
        cfg.period = Duration::from_millis(self.period_ms);
        cfg.bound = Duration::from_millis(self.bound_ms);
        cfg.margin = Duration::from_millis(self.margin_ms);
        cfg.initial_service = Duration::from_millis(self.initial_service_ms);
    }
}

#[derive(clap::Args, Debug, Clone)]
pub struct ProxyArgs {
    /// Front address clients connect to, HOST:PORT.
    #[arg(long)]
    pub listen: String,
    /// Backend server, HOST:PORT.
    #[arg(long)]
    pub backend: String,
    #[arg(long, value_enum)]
    pub protocol: Framing,
    #[command(flatten)]
    pub staging: StagingOpts,
    /// At most this many client connections (each uses three threads).
    #[arg(long, default_value_t = 1024)]
    pub max_connections: usize,
    /// Print the final counters as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Args, Debug, Clone)]
pub struct BenchArgs {
    /// An already running backend, HOST:PORT (with --backend-cmd: where that command listens).
    #[arg(long)]
    pub backend: Option<String>,
    /// Command that starts the backend (run with `sh -c 'exec CMD'`, stopped at the end);
    /// `{port}` is replaced by a free port on 127.0.0.1. Without --backend and --backend-cmd
    /// the bundled preheat-kv is started.
    #[arg(long)]
    pub backend_cmd: Option<String>,
    /// Mean request rate of the open-loop Poisson client (requests/s).
    #[arg(long, default_value_t = 200.0)]
    pub rate: f64,
    /// Measured duration of each mode per round.
    #[arg(long, default_value_t = 10.0)]
    pub duration_s: f64,
    #[arg(long, value_enum, default_value = "memcached")]
    pub protocol: Framing,
    #[command(flatten)]
    pub staging: StagingOpts,
    /// Client connections (requests are spread round-robin and pipelined).
    #[arg(long, default_value_t = 4)]
    pub connections: usize,
    /// Rounds; each measures both modes, alternating which goes first.
    #[arg(long, default_value_t = 1)]
    pub rounds: u32,
    /// Keys requested: `get key:N` for N uniform below this (preheat-kv holds 1000).
    #[arg(long, default_value_t = 1000)]
    pub keys: u32,
    /// Pause after the warm-up before each measured window.
    #[arg(long, default_value_t = 500)]
    pub settle_ms: u64,
    /// Also measure residency with no load for the same duration each round (the machine's
    /// own baseline, other tenants included).
    #[arg(long)]
    pub idle_baseline: bool,
    /// Before each measured window, wait (at most 60 s) until every CPU was deep idle at least
    /// this percentage over 0.5 s (0: off). For shared, noisy machines.
    #[arg(long, default_value_t = 0.0)]
    pub quiet_gate_pct: f64,
    /// Measure a window again (up to 3 attempts) when other processes used more than this
    /// percentage of the CPUs during it (0: off). Residency is machine-wide.
    #[arg(long, default_value_t = 0.0)]
    pub max_others_pct: f64,
    /// Do not pin (default with ≥ 2 CPUs: a backend we start on the last CPU, client and proxy
    /// on CPU 0).
    #[arg(long)]
    pub no_pin: bool,
    /// Seed of the arrival schedule and keys.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub machine: preheat_power::cli::MachineArg,
}

fn resolve(text: &str, what: &str) -> Result<SocketAddr> {
    text.to_socket_addrs()
        .with_context(|| format!("{what} {text}"))?
        .next()
        .with_context(|| format!("{what} {text}: no address"))
}

/// Runs `preheat stage ...`.
pub fn run(args: StageArgs) -> Result<()> {
    match args.cmd {
        StageCmd::Proxy(a) => run_proxy(a),
        StageCmd::Bench(a) => {
            let report = bench(&a)?;
            if a.json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                print!("{}", report.render());
            }
            Ok(())
        }
    }
}

fn run_proxy(a: ProxyArgs) -> Result<()> {
    a.staging.check()?;
    let mut cfg = StageConfig::new(
        resolve(&a.listen, "--listen")?,
        resolve(&a.backend, "--backend")?,
        a.protocol,
    );
    a.staging.apply(&mut cfg);
    cfg.max_connections = a.max_connections.max(1);
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
    ])
    .context("installing signal handlers")?;
    let stage = Stage::start(cfg)?;
    eprintln!(
        "preheat stage: proxy {} -> {} ({}, period {} ms, bound {} ms); SIGINT/SIGTERM to stop",
        stage.local_addr(),
        a.backend,
        a.protocol,
        a.staging.period_ms,
        a.staging.bound_ms
    );
    let sig = signals.forever().next();
    signals.handle().close();
    if let Some(sig) = sig {
        // Not eprintln!: a closed stderr (the caller went away) must not stop the shutdown.
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "preheat stage: signal {sig}: releasing what is buffered and stopping"
        );
    }
    let counters = stage.shutdown();
    if a.json {
        println!("{}", serde_json::to_string_pretty(&counters)?);
    } else {
        print!("{}", render_counters(&counters));
    }
    Ok(())
}

/// The proxy's counters as text (all measured by the proxy).
pub fn render_counters(c: &StageCounters) -> String {
    let v = serde_json::to_value(c).unwrap_or_default();
    let mut out = String::from("stage counters (measured by the proxy):\n");
    if let Some(map) = v.as_object() {
        for (k, v) in map {
            out.push_str(&format!("  {k:<32} {v}\n"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        stage: StageArgs,
    }

    #[test]
    fn command_lines_parse() {
        let c = Cli::try_parse_from([
            "x",
            "proxy",
            "--listen",
            "127.0.0.1:0",
            "--backend",
            "127.0.0.1:1",
            "--protocol",
            "http",
            "--period-ms",
            "20",
            "--bound-ms",
            "60",
        ])
        .unwrap();
        let StageCmd::Proxy(p) = c.stage.cmd else {
            panic!("not proxy")
        };
        assert_eq!((p.staging.period_ms, p.staging.bound_ms), (20, 60));
        assert_eq!(p.protocol, Framing::Http);

        let c = Cli::try_parse_from([
            "x",
            "bench",
            "--backend-cmd",
            "memcached -p {port}",
            "--rate",
            "100",
            "--duration-s",
            "2",
            "--json",
        ])
        .unwrap();
        let StageCmd::Bench(b) = c.stage.cmd else {
            panic!("not bench")
        };
        assert_eq!(b.backend_cmd.as_deref(), Some("memcached -p {port}"));
        assert_eq!((b.rate, b.duration_s, b.json), (100.0, 2.0, true));
        assert_eq!((b.staging.period_ms, b.staging.bound_ms), (250, 500));
        assert_eq!(b.protocol, Framing::Memcached);
        assert!(Cli::try_parse_from(["x", "proxy", "--listen", "a:1"]).is_err());
    }
}
