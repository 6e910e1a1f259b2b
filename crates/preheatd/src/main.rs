//! `preheatd`: receives authenticated announcements from the network arbiter and dispatches
//! them to the local preheat agents. See the library documentation for the design.
#![forbid(unsafe_code)]

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Parser;
use preheat_model::proto::Strategies;
use preheat_net::receiver::Receiver;
use preheat_net::wire::{self, Counters, Key};

use preheatd::dispatch::Dispatcher;
use preheatd::log::{log, log_limited};
use preheatd::metrics::{self, MetricsContext};
use preheatd::registry::{self, Registry, RouteTable, StaticRoute};
use preheatd::stats::{GateCounters, Stats};
use preheatd::RescanSignal;

/// Default `--listen` (port `preheat_net::wire::DEFAULT_PREHEATD_PORT`).
const DEFAULT_LISTEN: &str = "0.0.0.0:7711";
const DEFAULT_METRICS: &str = "127.0.0.1:9711";
/// How long the receive loop waits before it looks at the shutdown flag again and publishes
/// the gate's drop counters (they change inside `Receiver::recv`). Its last ~11 ms are a
/// short-sleep poll (`preheat_net::recv_until` honours deadlines to tens of µs), so a short
/// tick costs idle wakeups.
const RECV_TICK: Duration = Duration::from_secs(1);
/// How often the gate's drop counters are summarized in the log (when they changed).
const GATE_LOG_EVERY: Duration = Duration::from_secs(10);

/// Receiver daemon: takes announcements ("a request for port P arrives at T") from the network
/// arbiter and hands them to the preheat agents of this host.
#[derive(Debug, Parser)]
#[command(
    name = "preheatd",
    version,
    about,
    long_about = "Receiver daemon of preheat, one per server host.\n\n\
        Receives authenticated UDP announcements from the network arbiter (\"a request for port P \
        arrives at time T\"), drops those with less than --min-lead-us left, and sends each other \
        one as a trigger datagram to every local agent serving port P. Agents are found in the \
        run directory (agent-<pid>.sock / agent-<pid>.trig), rescanned every --scan-interval-ms and whenever a port has no agent: an agent \
        serves the listening ports it has handled requests on (or those given with --route). \
        Counters and the lead histogram are served in Prometheus text format at \
        http://<--metrics>/metrics.\n\n\
        preheatd changes no machine state; SIGTERM or SIGINT stop it cleanly."
)]
struct Args {
    /// UDP address to receive announcements on.
    #[arg(long, value_name = "ADDR", default_value = DEFAULT_LISTEN)]
    listen: SocketAddr,

    /// File with the fleet's pre-shared key announcements are authenticated with: 64 hex
    /// digits (or 32 raw bytes). Keep it mode 0600.
    #[arg(long, value_name = "PATH")]
    key_file: PathBuf,

    /// Directory of the agents' sockets [default: $PREHEAT_RUN_DIR, else /tmp/preheat].
    #[arg(long, value_name = "DIR")]
    run_dir: Option<PathBuf>,

    /// What agents are asked to do: auto, wake, lines, replay, joined with + (or all, none).
    /// `auto`: each agent does what was measured to help its port (`preheat run
    /// --auto-choice`), else wake+lines.
    #[arg(long, value_name = "LIST", default_value = "auto", value_parser = Strategies::parse)]
    strategies: Strategies,

    /// TCP address of the metrics endpoint (GET /metrics, Prometheus text format).
    #[arg(long, value_name = "ADDR", default_value = DEFAULT_METRICS)]
    metrics: SocketAddr,

    /// Announcements with less lead than this when received are dropped as late (µs).
    #[arg(long, value_name = "N", default_value_t = 5)]
    min_lead_us: u64,

    /// Gate: datagrams accepted per second and sender (token-bucket rate); more are dropped
    /// as rate_limited.
    #[arg(long, value_name = "PER_S", default_value_t = wire::DEFAULT_RATE_PER_S)]
    rate: f64,

    /// Gate: token-bucket burst per sender.
    #[arg(long, value_name = "N", default_value_t = wire::DEFAULT_BURST)]
    burst: f64,

    /// Gate: datagrams sent more than this long ago (or ahead) by the sender's clock are dropped
    /// as stale (ms).
    #[arg(long, value_name = "MS", default_value_t = wire::DEFAULT_MAX_AGE_NS / 1_000_000)]
    max_age_ms: u64,

    /// Static route: send announcements for PORT to the agent of process PID, whether or not
    /// it has served PORT yet (repeatable).
    #[arg(long = "route", value_name = "PORT=PID")]
    routes: Vec<StaticRoute>,

    /// How often the run directory is rescanned for agents (ms).
    #[arg(long, value_name = "MS", default_value_t = 500)]
    scan_interval_ms: u64,

    /// Once both sockets are bound, atomically write "ready <listen-addr> <metrics-addr>\n"
    /// here (removed on exit).
    #[arg(long, value_name = "PATH")]
    ready_file: Option<PathBuf>,
}

fn gate_of(c: &Counters) -> GateCounters {
    GateCounters {
        received: c.received,
        malformed: c.malformed,
        bad_mac: c.bad_mac,
        replayed: c.replayed,
        stale: c.stale,
        rate_limited: c.rate_limited,
        accepted: c.accepted,
    }
}

/// `ready <listen> <metrics>\n`, written to a temporary file and renamed.
fn write_ready_file(path: &Path, listen: SocketAddr, metrics: SocketAddr) -> Result<()> {
    let name = path
        .file_name()
        .with_context(|| format!("--ready-file {} has no file name", path.display()))?;
    let mut tmp = std::ffi::OsString::from(".");
    tmp.push(name);
    tmp.push(format!(".{}.tmp", std::process::id()));
    let tmp = path.with_file_name(tmp);
    std::fs::write(&tmp, format!("ready {listen} {metrics}\n"))
        .with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| {
        let _ = std::fs::remove_file(&tmp);
        format!("renaming {} to {}", tmp.display(), path.display())
    })
}

/// Warn about a run directory other users can write to (the agents refuse to use one).
fn check_run_dir(dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    if let Ok(md) = std::fs::symlink_metadata(dir) {
        if !md.is_dir() {
            log(&format!(
                "warning: run directory {} is not a directory",
                dir.display()
            ));
        } else if md.permissions().mode() & 0o002 != 0 {
            log(&format!(
                "warning: run directory {} is writable by every user (mode {:o}); agents refuse \
                 such directories",
                dir.display(),
                md.permissions().mode() & 0o7777
            ));
        }
    }
}

/// Summarize what the gate dropped since the last summary (one line, only when something was).
fn log_gate_drops(prev: &GateCounters, now: &GateCounters, secs: u64) {
    let parts: Vec<String> = [
        ("malformed", now.malformed - prev.malformed),
        ("bad_mac", now.bad_mac - prev.bad_mac),
        ("replayed", now.replayed - prev.replayed),
        ("stale", now.stale - prev.stale),
        ("rate_limited", now.rate_limited - prev.rate_limited),
    ]
    .iter()
    .filter(|(_, n)| *n > 0)
    .map(|(r, n)| format!("{n} {r}"))
    .collect();
    if !parts.is_empty() {
        log_limited("gate", || {
            format!("the gate dropped {} in the last {secs} s", parts.join(", "))
        });
    }
}

fn run(args: Args) -> Result<()> {
    let shutdown = shutdown_on_signals()?;
    let gate_ok = args.rate > 0.0 && args.rate.is_finite() && args.burst >= 1.0;
    if !(gate_ok && args.burst.is_finite()) {
        bail!("--rate must be > 0 and --burst ≥ 1");
    }
    // The error names the file.
    let key = Key::from_file(&args.key_file).map_err(|e| anyhow::anyhow!("--key-file: {e}"))?;
    let run_dir = args
        .run_dir
        .clone()
        .unwrap_or_else(preheat_rundir::run_dir_from_env);
    check_run_dir(&run_dir);

    let max_age_ns = args.max_age_ms.saturating_mul(1_000_000);
    let mut receiver = Receiver::bind(args.listen, key, args.rate, args.burst, max_age_ns)
        .with_context(|| format!("binding the announcement socket {}", args.listen))?;
    let metrics_listener = TcpListener::bind(args.metrics)
        .with_context(|| format!("binding the metrics endpoint {}", args.metrics))?;
    let metrics_addr = metrics_listener.local_addr()?;
    let listen_addr = receiver.local_addr()?;

    let stats = Arc::new(Stats::new());
    let table = Arc::new(RouteTable::new());
    let rescan = Arc::new(RescanSignal::new());

    // One scan before the first announcement, so the agents already there are known.
    let reg = first_scan(&run_dir, &args.routes, &stats, &table);

    let scanner = {
        let (table, stats, rescan, shutdown) = (
            table.clone(),
            stats.clone(),
            rescan.clone(),
            shutdown.clone(),
        );
        let interval = Duration::from_millis(args.scan_interval_ms.max(1));
        std::thread::Builder::new()
            .name("registry".into())
            .spawn(move || registry::run_scanner(reg, table, stats, rescan, interval, shutdown))?
    };
    let metrics_thread = {
        let ctx = MetricsContext {
            stats: stats.clone(),
            table: table.clone(),
            run_dir: run_dir.clone(),
            agent_timeout: Duration::from_millis(500),
        };
        let shutdown = shutdown.clone();
        std::thread::Builder::new()
            .name("metrics".into())
            .spawn(move || metrics::serve(metrics_listener, ctx, shutdown))?
    };

    let mut dispatcher = Dispatcher::new(
        args.strategies,
        Duration::from_micros(args.min_lead_us),
        table.clone(),
        stats.clone(),
        rescan.clone(),
    )?;
    if let Some(p) = &args.ready_file {
        write_ready_file(p, listen_addr, metrics_addr)?;
    }
    log(&format!(
        "listening for announcements on udp {}, metrics on http://{metrics_addr}/metrics; \
         agents in {}; strategies {}, minimum lead {} µs",
        listen_addr,
        run_dir.display(),
        args.strategies.name(),
        args.min_lead_us
    ));

    receive(&mut receiver, &mut dispatcher, &stats, &shutdown);
    let mut result = Ok(());

    shutdown.store(true, Ordering::Relaxed);
    rescan.request();
    if scanner.join().is_err() {
        result = Err(anyhow::anyhow!("the registry thread panicked"));
    }
    if metrics_thread.join().is_err() {
        result = Err(anyhow::anyhow!("the metrics thread panicked"));
    }
    if let Some(p) = &args.ready_file {
        let _ = std::fs::remove_file(p);
    }
    let s = stats.snapshot();
    log(&format!(
        "stopping: {} received, {} accepted, {} dispatched, {} late, {} without agent, {} send errors",
        s.gate.received, s.gate.accepted, s.dispatched, s.late, s.no_agent, s.send_errors
    ));
    result
}

/// A flag set by SIGTERM or SIGINT; a second signal while shutting down exits at once.
fn shutdown_on_signals() -> Result<Arc<AtomicBool>> {
    let shutdown = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register_conditional_shutdown(sig, 1, shutdown.clone())
            .context("installing signal handlers")?;
        signal_hook::flag::register(sig, shutdown.clone()).context("installing signal handlers")?;
    }
    Ok(shutdown)
}

/// The registry of `run_dir` (plus the static `routes`) after its first scan, published in
/// `table` and counted in `stats`.
fn first_scan(
    run_dir: &Path,
    routes: &[StaticRoute],
    stats: &Stats,
    table: &RouteTable,
) -> Registry {
    let mut reg = Registry::new(run_dir.to_path_buf(), routes.to_vec());
    let ch = reg.scan();
    registry::log_changes(&ch);
    let routes = reg.routes();
    stats.set_registry(routes.pids().len() as u64, routes.ports() as u64);
    stats.scans.fetch_add(1, Ordering::Relaxed);
    table.set(routes);
    reg
}

/// Receive announcements and dispatch them until `shutdown`; publish the receiver's counters
/// and log its drops now and then.
fn receive(
    receiver: &mut Receiver,
    dispatcher: &mut Dispatcher,
    stats: &Stats,
    shutdown: &AtomicBool,
) {
    let mut last_gate = GateCounters::default();
    let mut last_gate_log = Instant::now();
    while !shutdown.load(Ordering::Relaxed) {
        match receiver.recv(Some(RECV_TICK)) {
            Ok(Some((_header, ann))) => {
                let now = preheat_net::now_ns();
                // Every outcome is counted (and logged, rate-limited) by the dispatcher.
                dispatcher.dispatch(ann.dst_port, ann.arrival_ns, now);
            }
            Ok(None) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                log_limited("recv", || format!("receiving an announcement failed: {e}"));
                // Never spin on a persistent error.
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        let gate = gate_of(receiver.counters());
        stats.set_gate(&gate);
        if last_gate_log.elapsed() >= GATE_LOG_EVERY {
            log_gate_drops(&last_gate, &gate, last_gate_log.elapsed().as_secs());
            last_gate = gate;
            last_gate_log = Instant::now();
        }
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            log(&format!("error: {e:#}"));
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_consistent() {
        Args::command().debug_assert();
        let a = Args::try_parse_from(["preheatd", "--key-file", "k"]).unwrap();
        assert_eq!(
            a.listen.port(),
            preheat_net::wire::DEFAULT_PREHEATD_PORT,
            "default --listen port"
        );
        assert_eq!(a.strategies, Strategies::AUTO);
        assert!(
            Args::try_parse_from(["preheatd"]).is_err(),
            "--key-file is required"
        );
        assert!(
            Args::try_parse_from(["preheatd", "--key-file", "k", "--strategies", "warp"]).is_err()
        );
        let a = Args::try_parse_from([
            "preheatd",
            "--key-file",
            "k",
            "--route",
            "80=12",
            "--route",
            "443=12",
        ])
        .unwrap();
        assert_eq!(a.routes.len(), 2);
        assert!(Args::try_parse_from(["preheatd", "--key-file", "k", "--route", "80"]).is_err());
    }
}
