//! `preheat load`: a load generator that can announce what it sends, on top of the engine in
//! [`preheat_lab::load`] (open loop with Poisson arrivals, idle gap, closed loop; one client
//! thread per connection, or `--threads T` threads that each multiplex several, or with
//! `--wait epoll` an event loop that waits in `epoll_wait` for any threads ≤ connections;
//! latency from the *intended* send time into an HdrHistogram, so a slow
//! reply, a late send or a wait for a slot is never hidden: no coordinated omission).
//!
//! Announcing (paper §3.2):
//! * `--arbiter ADDR --key-file K`: the sender side of the centrally arbitrated network: each
//!   request is a demand to the arbiter; the request is sent at the allocated slot, and the
//!   arbiter announces it to the receiver's preheatd. If the arbiter does not answer in time the
//!   request goes out unscheduled (fail-open) and is counted as such. One sender per connection.
//! * `--announce-local`: announce through the local trigger API to every agent in the run dir
//!   (same host), `--lead-us` ahead, then send at the announced time. One announcer per
//!   connection.
//!
//! SIGINT/SIGTERM stop the measurement: the summary of what was measured is printed, the records
//! file is complete up to the last reply, and the exit status is 128 + signal. A second signal
//! exits at once.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use preheat_lab::driver::{self, Protocol, Wait, WorkloadSpec};
use preheat_lab::load::{
    self as engine, Announce, CsvSink, Grant, LoadConfig, Mode, Record, RecordSink,
};
use preheat_model::proto::{Announcement, Strategies};
use serde::Serialize;

use preheat_launch::agentctl::{self, Announcer};
use preheat_launch::paths;

const AFTER_HELP: &str = "\
Modes:
  open      Open loop: Poisson arrivals at --rate requests/s over all connections (each
            connection an independent Poisson process at rate/connections, seeded from
            --seed + connection, so runs are reproducible). Every intended send time is fixed in
            advance from the start of the run.
  idle-gap  One request after each idle gap of --gap-ms per connection: the cold-start case.
  closed    Back to back on each connection.

No coordinated omission: latency runs from a request's INTENDED send time to its whole reply.
In open loop, a request that could not go out on time (its connection still waiting for the
previous reply, or for an arbiter slot) is sent late, and the lateness is part of its latency;
send_late_us_* shows how late requests really went out. With announcements in idle-gap and
closed mode, the announced (granted) time is the intended time: the request is meant to arrive
then, and that is what the receiver preheats for.

Waiting (--wait), three modes:
  spin   Busy-poll non-blocking sockets. The latency excludes the client's own (v)CPU wakeup,
         at the price of a busy client CPU. Use it to measure the server (the default, and what
         preheat demo uses).
  block  Block in the kernel: with one thread per connection a blocking read() on its one
         socket (no epoll), with --threads T < C epoll_wait, then read. Use it for the cheapest
         blocking client (fewest system calls per request).
  epoll  Wait for readiness in epoll_wait and then read, as event-loop clients (memcaslap, wrk,
         redis-benchmark) do: always the event loop below, for any --threads <= --connections,
         one connection on one thread included. Use it to compare with those tools (preheat lab
         peer does). Not with --mode idle-gap, --announce-local, --arbiter or --protocol mysql.
The JSON field client_loop says which loop ran: thread-per-connection or event-loop.

Threads: by default every connection has its own client thread that blocks (or spins) on its
one request. --threads T (fewer than --connections C), or --wait epoll, runs T client threads as
an event loop instead, thread t driving connections t, t+T, t+2T, ... like wrk -t T -c C: with
--wait block or epoll it waits in epoll_wait for whichever connection answers, with --wait spin
it polls them in turn. Closed loop keeps one request outstanding on every connection; open loop
keeps every connection's own Poisson schedule (a connection sends when its intended time has
come and its previous reply is in; latency still counts from the intended time). The event loop
is rejected with --mode idle-gap, --announce-local, --arbiter and --protocol mysql (they need
one thread per connection).

Each connection sends --warmup unmeasured requests first. --records FILE.csv writes one row per
measured request (flushed every 100 ms, so an interrupted run keeps what it measured). SIGINT or
SIGTERM stops the run: the summary covers what was measured.";

#[derive(clap::Args, Debug)]
#[command(after_long_help = AFTER_HELP)]
pub struct LoadArgs {
    /// Server address, HOST:PORT.
    #[arg(long)]
    pub target: String,
    /// Wire protocol (mysql: the TPC-C-like transaction mix).
    #[arg(long, value_enum, default_value = "memcached")]
    pub protocol: Protocol,
    /// Key (memcached, redis) or path (HTTP) to request.
    #[arg(long, default_value = "key:42")]
    pub key: String,
    /// How requests are paced (see below).
    #[arg(long, value_enum, default_value = "idle-gap")]
    pub mode: Mode,
    /// Measured requests over all connections [default: 200 unless --duration-s is given].
    #[arg(long)]
    pub requests: Option<u64>,
    /// Measure for this long, s (with --requests: whichever ends first).
    #[arg(long)]
    pub duration_s: Option<f64>,
    /// Open loop: offered load, requests per second over all connections (required there).
    #[arg(long)]
    pub rate: Option<f64>,
    /// Connections (each with its own client thread unless --threads says fewer).
    #[arg(long, default_value_t = 1)]
    pub connections: usize,
    /// Client threads, each multiplexing connections/threads connections (like wrk -t)
    /// [default: one per connection]. Not with idle-gap, announcements or mysql.
    #[arg(long)]
    pub threads: Option<usize>,
    /// Unmeasured warm-up requests per connection.
    #[arg(long, default_value_t = 1)]
    pub warmup: u64,
    /// Seed of the open-loop arrival process.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// How the client waits for a reply: spin (busy-poll; excludes the client's own vCPU
    /// wakeup), block (in the kernel: a blocking read per connection thread, epoll_wait with
    /// --threads < --connections) or epoll (epoll_wait then read in the event loop, as
    /// memcaslap/wrk/redis-benchmark do; for comparing with them). See below.
    #[arg(long, value_enum, default_value = "spin")]
    pub wait: Wait,
    /// Write one CSV row per measured request here.
    #[arg(long)]
    pub records: Option<PathBuf>,
    /// Strategy label for the records and the report [default: none / the local announcement's
    /// strategies / arbiter].
    #[arg(long)]
    pub strategy: Option<String>,
    /// Idle gap before each request in idle-gap mode, ms.
    #[arg(long, default_value_t = 20)]
    pub gap_ms: u64,
    /// Announce each request to the agents in the run dir (same host) --lead-us ahead.
    #[arg(long, conflicts_with = "arbiter")]
    pub announce_local: bool,
    /// Request a timeslot from this arbiter for each request and send at the allocated time.
    #[arg(long)]
    pub arbiter: Option<String>,
    /// Pre-shared key file for the arbiter (hex).
    #[arg(long, requires = "arbiter")]
    pub key_file: Option<PathBuf>,
    /// This host's IPv4 address as the arbiter knows it (default: the address used to reach it).
    #[arg(long)]
    pub my_ip: Option<std::net::Ipv4Addr>,
    /// Give up on an allocation after this long and send unscheduled, ms.
    #[arg(long, default_value_t = 5)]
    pub arbiter_timeout_ms: u64,
    /// Lead time of local announcements, µs.
    #[arg(long, default_value_t = 65)]
    pub lead_us: u64,
    /// Strategies requested by local announcements.
    #[arg(long, default_value = "wake+lines")]
    pub strategies: String,
    /// After each request, ask the agents in the run dir (same filesystem: works across network
    /// namespaces) when the server thread really started on it and whether the preheat for its
    /// announcement finished in time: announcement accuracy and completion before arrival.
    /// Only with --connections 1; the agents are asked from the records thread, after the reply.
    #[arg(long)]
    pub observe: bool,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

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

pub fn run(a: LoadArgs) -> Result<()> {
    // SIGINT/SIGTERM end the measurement (the summary is still printed). A second signal while
    // the flag is set exits at once. `term` tells which signal it was, for the exit status.
    let stop = Arc::new(AtomicBool::new(false));
    let term = Arc::new(AtomicBool::new(false));
    {
        use signal_hook::consts::{SIGINT, SIGTERM};
        for sig in [SIGINT, SIGTERM] {
            signal_hook::flag::register_conditional_shutdown(sig, 128 + sig, stop.clone())
                .context("installing the signal handler")?;
            signal_hook::flag::register(sig, stop.clone())
                .context("installing the signal handler")?;
        }
        signal_hook::flag::register(SIGTERM, term.clone())
            .context("installing the signal handler")?;
    }
    let report = generate(&a, &stop)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_text(&a, &report);
    }
    if report.interrupted {
        use std::io::Write;
        let _ = std::io::stdout().flush();
        let sig = if term.load(Ordering::Relaxed) {
            signal_hook::consts::SIGTERM
        } else {
            signal_hook::consts::SIGINT
        };
        eprintln!("preheat load: interrupted; the summary covers what was measured");
        std::process::exit(128 + sig);
    }
    Ok(())
}

fn print_text(a: &LoadArgs, r: &LoadReport) {
    println!(
        "{} requests to {} ({} {}, {} connection(s) on {} thread(s), announce: {}, strategy {}){} [measured, {} samples]: p50 {:.1} µs, p90 {:.1}, p99 {:.1}, p99.9 {:.1}, max {:.1}, mean {:.1}",
        r.summary.requests,
        r.target,
        serde_plain(&r.protocol),
        serde_plain(&r.summary.mode),
        r.summary.connections,
        r.summary.threads,
        r.announce,
        r.strategy,
        if r.interrupted { " (interrupted)" } else { "" },
        r.summary.requests,
        r.summary.p50_us,
        r.summary.p90_us,
        r.summary.p99_us,
        r.summary.p999_us,
        r.summary.max_us,
        r.summary.mean_us,
    );
    println!(
        "  throughput {:.1} req/s over {:.3} s (offered {:.1}); sent late by p50 {:.1} / p99 {:.1} µs; scheduled {}, unscheduled {}, errors {}, wrong {}, reconnects {} (keep-alive connections the server ended; not errors)",
        r.summary.throughput_rps,
        r.summary.duration_s,
        r.summary.offered_rps,
        r.summary.send_late_us_p50,
        r.summary.send_late_us_p99,
        r.summary.scheduled,
        r.summary.unscheduled,
        r.summary.errors,
        r.summary.wrong,
        r.summary.reconnects
    );
    if let Some(p) = &r.records {
        println!("  records: {}", p.display());
    }
    if a.observe {
        println!(
            "  observed at the agents [measured, {} samples]: server thread started p50 {} / p99 {} µs after the announced arrival; announcements {}, preheats {} ({} finished before arrival), late {}",
            r.observed,
            r.server_start_us_p50.map(|x| format!("{x:.1}")).unwrap_or_else(|| "-".into()),
            r.server_start_us_p99.map(|x| format!("{x:.1}")).unwrap_or_else(|| "-".into()),
            r.agent_announcements,
            r.agent_preheats,
            r.agent_preheats_completed,
            r.agent_late
        );
    }
}

/// A unit enum's serde name ("idle-gap", "memcached").
fn serde_plain<T: Serialize>(v: &T) -> String {
    serde_json::to_value(v)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

/// The engine's configuration from the flags.
fn config(a: &LoadArgs, strategy: String) -> Result<LoadConfig> {
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
    let requests = match (a.requests, duration) {
        (Some(n), _) => Some(n),
        (None, Some(_)) => None,
        (None, None) => Some(200),
    };
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

pub fn generate(a: &LoadArgs, stop: &AtomicBool) -> Result<LoadReport> {
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
    let announcer: Option<MakeAnnouncer> = if a.announce_local {
        let dir = paths::run_dir();
        let pids = agentctl::discover(&dir);
        if pids.is_empty() {
            bail!(
                "--announce-local: no agents in {} (start the server with the agent: preheat run)",
                dir.display()
            );
        }
        let (lead_ns, port) = (a.lead_us * 1000, target.port());
        Some(Box::new(move |_conn| {
            Ok(Box::new(LocalAnnounce {
                announcer: Announcer::new(&dir, &pids)?,
                lead_ns,
                port,
                strategies,
            }) as Box<dyn Announce>)
        }))
    } else if let Some(arb) = &a.arbiter {
        let arb: SocketAddr = arb
            .to_socket_addrs()
            .with_context(|| format!("resolving {arb}"))?
            .next()
            .context("arbiter address resolves to nothing")?;
        let key_file = a.key_file.as_ref().context("--arbiter needs --key-file")?;
        let key = preheat_net::wire::Key::from_file(key_file)
            .map_err(|e| anyhow::anyhow!("{}: {e}", key_file.display()))?;
        let my_ip = match a.my_ip {
            Some(ip) => ip,
            None => local_ipv4_towards(arb)?,
        };
        let dst_ip = match target.ip() {
            std::net::IpAddr::V4(v4) => v4.to_bits(),
            std::net::IpAddr::V6(_) => {
                bail!("--arbiter: the arbiter names hosts by IPv4 address; {target} is IPv6")
            }
        };
        let timeout = Duration::from_millis(a.arbiter_timeout_ms);
        let waits = slot_waits.clone();
        let port = target.port();
        Some(Box::new(move |_conn| {
            let sender =
                preheat_net::sender::Sender::new(arb, key.clone(), my_ip.to_bits(), timeout)
                    .context("creating the arbiter sender")?;
            Ok(Box::new(ArbiterAnnounce {
                sender,
                dst_ip,
                port,
                waits: waits.clone(),
            }) as Box<dyn Announce>)
        }))
    } else {
        None
    };

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

    let bar = progress_bar(&cfg, a.json);
    let summary = engine::run(&cfg, &connect, announcer.as_deref(), sink, stop, &|n| {
        bar.set_position(n)
    });
    bar.finish_and_clear();
    let s = summary?;
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
    let mut waits = slot_waits.lock().map(|v| v.clone()).unwrap_or_default();
    waits.sort_by(|x, y| x.total_cmp(y));
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
        slot_wait_us_p50: waits.get(waits.len() / 2).copied().unwrap_or(0.0),
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

/// A progress bar on stderr (drawn only on a terminal, never with --json).
fn progress_bar(cfg: &LoadConfig, json: bool) -> indicatif::ProgressBar {
    if json {
        return indicatif::ProgressBar::hidden();
    }
    match cfg.requests {
        Some(n) => {
            let bar = indicatif::ProgressBar::new(n);
            if let Ok(style) = indicatif::ProgressStyle::with_template(
                "{spinner} load {bar:30} {pos}/{len} requests ({elapsed})",
            ) {
                bar.set_style(style);
            }
            bar
        }
        None => {
            let bar = indicatif::ProgressBar::new_spinner();
            if let Ok(style) = indicatif::ProgressStyle::with_template(
                "{spinner} load: {pos} requests ({elapsed})",
            ) {
                bar.set_style(style);
            }
            bar
        }
    }
}

/// Makes the announcer of connection N.
type MakeAnnouncer = Box<dyn Fn(usize) -> Result<Box<dyn Announce>> + Sync>;

/// Local announcements: `arrival = max(earliest, now + lead)`, announced to every agent of the
/// run dir at once; the request is sent at the arrival time. If no agent accepted the
/// datagram the request counts as unscheduled (it still goes out at that time).
struct LocalAnnounce {
    announcer: Announcer,
    lead_ns: u64,
    port: u16,
    strategies: Strategies,
}

impl Announce for LocalAnnounce {
    fn grant(&mut self, earliest_ns: u64) -> Grant {
        let now = preheat_engine::time::now_ns();
        let arrival = earliest_ns.max(now + self.lead_ns);
        let accepted = self.announcer.send(Announcement {
            strategies: self.strategies,
            port: self.port,
            seq: 0,
            arrival_ns: arrival,
            sent_ns: now,
            budget_ns: 0,
        });
        Grant {
            send_at_ns: arrival,
            scheduled: accepted > 0,
        }
    }

    fn lead_ns(&self) -> u64 {
        self.lead_ns
    }
}

/// The arbiter: one demand per request; scheduled → send at the slot, unscheduled → now
/// (fail-open).
struct ArbiterAnnounce {
    sender: preheat_net::sender::Sender,
    dst_ip: u32,
    port: u16,
    waits: Arc<Mutex<Vec<f64>>>,
}

impl Announce for ArbiterAnnounce {
    fn grant(&mut self, _earliest_ns: u64) -> Grant {
        let now = preheat_engine::time::now_ns();
        match self.sender.request(self.dst_ip, self.port, 1) {
            preheat_net::sender::Grant::Scheduled { send_at_ns } => {
                if let Ok(mut w) = self.waits.lock() {
                    w.push(send_at_ns.saturating_sub(now) as f64 / 1e3);
                }
                Grant {
                    send_at_ns,
                    scheduled: true,
                }
            }
            preheat_net::sender::Grant::Unscheduled { .. } => Grant {
                send_at_ns: preheat_engine::time::now_ns(),
                scheduled: false,
            },
        }
    }
}

/// Records to the CSV file (if any) and, for each, the agents' start of the busy period that
/// served it. Runs on the engine's records thread, so the agents are asked after the reply,
/// never inside a measured interval.
struct ObserveSink {
    csv: Option<CsvSink>,
    observer: Observer,
    starts: Arc<Mutex<Vec<f64>>>,
}

impl RecordSink for ObserveSink {
    fn write(&mut self, r: &Record) -> Result<()> {
        if let Some(c) = self.csv.as_mut() {
            c.write(r)?;
        }
        if let Some(start) = self.observer.start_of(r.granted_ns, r.done_ns) {
            if let Ok(mut s) = self.starts.lock() {
                s.push((start as f64 - r.granted_ns as f64) / 1e3);
            }
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<()> {
        match self.csv.as_mut() {
            Some(c) => c.flush(),
            None => Ok(()),
        }
    }
}

/// Reads the agents of the run dir, over control connections opened once.
struct Observer {
    agents: Vec<agentctl::AgentClient>,
    port: u16,
}

impl Observer {
    fn new(port: u16) -> Observer {
        let dir = paths::run_dir();
        let agents = agentctl::discover(&dir)
            .into_iter()
            .filter_map(|pid| agentctl::AgentClient::connect(&dir, pid).ok())
            .collect();
        Observer { agents, port }
    }

    /// Status of every agent that still answers (agents that went away are dropped).
    fn statuses(&mut self) -> Vec<preheat_model::proto::Reply> {
        let mut out = Vec::new();
        self.agents
            .retain_mut(|c| match c.call(&preheat_model::proto::Request::Status) {
                Ok(r) => {
                    out.push(r);
                    true
                }
                Err(_) => false,
            });
        out
    }

    /// The start of the busy period for the port that served a request announced for
    /// `arrival_ns` and answered at `done_ns`: the agents' latest start, if it lies in
    /// [arrival − 1 ms, done]. The agent records a period when it ends, so poll briefly; a
    /// start after `done` means a later request already began, and this one is not observable.
    fn start_of(&mut self, arrival_ns: u64, done_ns: u64) -> Option<u64> {
        let t0 = std::time::Instant::now();
        loop {
            let port = self.port;
            let best = self
                .statuses()
                .into_iter()
                .filter_map(|r| match r {
                    preheat_model::proto::Reply::Status { ports, .. } => ports
                        .iter()
                        .find(|p| p.port == port)
                        .map(|p| p.last_start_ns),
                    _ => None,
                })
                .max();
            match best {
                Some(b) if b > done_ns => return None,
                Some(b) if b + 1_000_000 >= arrival_ns => return Some(b),
                _ => {}
            }
            if t0.elapsed() > Duration::from_millis(20) {
                return None;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// Summed agent counters: announcements, preheats, completed, late.
    fn totals(&mut self) -> [u64; 4] {
        let mut t = [0u64; 4];
        for r in self.statuses() {
            if let preheat_model::proto::Reply::Status { preheat, .. } = r {
                t[0] += preheat.announcements;
                t[1] += preheat.preheats;
                t[2] += preheat.completed;
                t[3] += preheat.late;
            }
        }
        t
    }
}

/// The local IPv4 address the kernel would use to reach `to`.
fn local_ipv4_towards(to: SocketAddr) -> Result<std::net::Ipv4Addr> {
    let s = std::net::UdpSocket::bind("0.0.0.0:0")?;
    s.connect(to)?;
    match s.local_addr()?.ip() {
        std::net::IpAddr::V4(v4) => Ok(v4),
        other => bail!("no IPv4 route to {to} (local address {other})"),
    }
}
