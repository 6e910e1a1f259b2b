//! `preheat load`: the arguments, the progress bar and the report printed; `preheat-loadgen`
//! runs it. A load generator that can announce what it sends, on top of the engine in
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

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::{Context, Result};
use preheat_lab::driver::{Protocol, Wait};
use preheat_lab::load::Mode;
use preheat_loadgen::{LoadParams, LoadReport};
use serde::Serialize;

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
    /// Strategies requested by local announcements (`auto`: what each agent was told was
    /// measured to help its port, else wake+lines).
    #[arg(long, default_value = "auto")]
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

impl LoadArgs {
    fn params(&self) -> LoadParams {
        LoadParams {
            target: self.target.clone(),
            protocol: self.protocol,
            key: self.key.clone(),
            mode: self.mode,
            requests: self.requests,
            duration_s: self.duration_s,
            rate: self.rate,
            connections: self.connections,
            threads: self.threads,
            warmup: self.warmup,
            seed: self.seed,
            wait: self.wait,
            records: self.records.clone(),
            strategy: self.strategy.clone(),
            gap_ms: self.gap_ms,
            announce_local: self.announce_local,
            arbiter: self.arbiter.clone(),
            key_file: self.key_file.clone(),
            my_ip: self.my_ip,
            arbiter_timeout_ms: self.arbiter_timeout_ms,
            lead_us: self.lead_us,
            strategies: self.strategies.clone(),
            observe: self.observe,
        }
    }
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
    let params = a.params();
    let bar = progress_bar(params.request_count(), a.json);
    let report = preheat_loadgen::generate(&params, &stop, &|n| bar.set_position(n));
    bar.finish_and_clear();
    let report = report?;
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

/// A progress bar on stderr (drawn only on a terminal, never with --json).
fn progress_bar(requests: Option<u64>, json: bool) -> indicatif::ProgressBar {
    if json {
        return indicatif::ProgressBar::hidden();
    }
    match requests {
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
