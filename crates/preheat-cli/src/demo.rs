//! `preheat demo`: the arguments, and the table printed (`preheat-demo` runs it: start the
//! server with the agent, estimate its working set, pilot `auto`, measure the rounds, compute the
//! table; see its `run` module for the modes).

use std::path::PathBuf;

use anyhow::{Context, Result};
use preheat_demo::DemoParams;
use preheat_launch::servers::ServerKind;

use crate::progress::Bars;

/// The protocol of a server given by its command (`preheat_demo::CustomProtocol`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CustomProtocol {
    /// HTTP/1.1 GET of `--request PATH` (keep-alive).
    Http,
    /// memcached text protocol: `get --request KEY`.
    Memcached,
    /// redis RESP: `GET --request KEY`.
    Redis,
    /// Raw bytes: `--request BYTES` (\r \n escapes); the reply ends with `--until BYTES`.
    Raw,
}

impl From<CustomProtocol> for preheat_demo::CustomProtocol {
    fn from(p: CustomProtocol) -> Self {
        match p {
            CustomProtocol::Http => Self::Http,
            CustomProtocol::Memcached => Self::Memcached,
            CustomProtocol::Redis => Self::Redis,
            CustomProtocol::Raw => Self::Raw,
        }
    }
}

/// Where the loopback's receive processing runs (`preheat_demo::SteerRx`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SteerRx {
    /// Measure both (paired pilot rounds of one preheat mode) and keep steering only where it
    /// was measured faster: it helps on some machines and hurts on others.
    Auto,
    /// Steer lo's receive processing to the server's CPU (RPS; root), as a NIC's interrupt
    /// affinity would; restored afterwards.
    On,
    /// Leave it on the sending CPU (the kernel's default).
    Off,
}

impl From<SteerRx> for preheat_demo::SteerRx {
    fn from(s: SteerRx) -> Self {
        match s {
            SteerRx::Auto => Self::Auto,
            SteerRx::On => Self::On,
            SteerRx::Off => Self::Off,
        }
    }
}

#[derive(clap::Args, Debug)]
pub struct DemoArgs {
    /// Server to run the demo on (a catalog server); or give any server's command after `--`
    /// with --port, --protocol and --request.
    #[arg(long, value_enum, default_value = "kv")]
    pub server: ServerKind,
    /// Any server: the port it listens on (it must listen there itself, e.g. from its own
    /// configuration).
    #[arg(long, requires = "command")]
    pub port: Option<u16>,
    /// Any server: its protocol.
    #[arg(long, value_enum, default_value = "http", requires = "command")]
    pub protocol: CustomProtocol,
    /// Any server: the request to measure — an HTTP path, a memcached or redis key, or raw
    /// request bytes (\r \n escapes) with --protocol raw. HTTP and redis replies are learned from
    /// one real exchange first and framed by their length.
    #[arg(long, requires = "command")]
    pub request: Option<String>,
    /// Any server, --protocol raw: the bytes its reply ends with (\r \n escapes).
    #[arg(long, default_value = "\\r\\n")]
    pub until: String,
    /// Any server: its command line (after --), started pinned to the server CPU with the agent
    /// attached.
    #[arg(last = true)]
    pub command: Vec<String>,
    /// Rounds (each measures every mode once, in shuffled order).
    #[arg(long, default_value_t = 150)]
    pub rounds: usize,
    /// Announcement lead time, µs (Fastpass schedules ~65 µs ahead).
    #[arg(long, default_value_t = 65)]
    pub lead_us: u64,
    /// Idle gap before a cold-idle request, ms.
    #[arg(long, default_value_t = 20)]
    pub idle_ms: u64,
    /// Eviction sweep size, MiB.
    #[arg(long, default_value_t = 128)]
    pub sweep_mib: usize,
    /// Gap after the sweep before the request, µs (the server CPU goes idle meanwhile).
    #[arg(long, default_value_t = 1000)]
    pub post_gap_us: u64,
    /// Preheat strategies to compare, comma separated (each may combine with +). `auto` runs a
    /// pilot first (--pilot-rounds rounds of every combination of wake, lines and replay that
    /// can run here, against announcing nothing) and announces the combination measured to help
    /// most — nothing, if none was measured to help; the table measures it again.
    #[arg(long, default_value = "auto,wake,lines,replay,wake+lines,all")]
    pub strategies: String,
    /// Rounds of `auto`'s pilot (each measures none and every candidate once).
    #[arg(long, default_value_t = 15)]
    pub pilot_rounds: usize,
    /// Use this working-set file instead of recording one.
    #[arg(long)]
    pub profile: Option<PathBuf>,
    /// Samples for the recording (the paper uses 8).
    #[arg(long, default_value_t = 8)]
    pub samples: u32,
    /// Keep lines seen in at least this many samples.
    #[arg(long, default_value_t = 6)]
    pub keep: u32,
    /// Merge runs separated by at most this many unused lines when encoding (paper §3.1: fewer,
    /// longer runs at the cost of loading a few lines nobody uses).
    #[arg(long, default_value_t = 0)]
    pub gap_merge: u32,
    /// Append every sample as one JSON line to this file as it is measured (an interrupted run
    /// keeps what it measured).
    #[arg(long)]
    pub records: Option<PathBuf>,
    /// Server CPU (default: the last CPU); the client uses another one.
    #[arg(long)]
    pub server_cpu: Option<usize>,
    /// Run the server in a network namespace of its own, reached over a veth pair, instead of
    /// on the loopback (root, iproute2; a server after `--` must listen on 0.0.0.0; not mariadb).
    #[arg(long)]
    pub netns: bool,
    /// Where the loopback's receive processing runs during the table (the machine's masks are
    /// restored afterwards, also after a crash: the next run puts back what a killed one left).
    #[arg(long, value_enum, default_value_t = SteerRx::Auto)]
    pub steer_rx: SteerRx,
    /// Where the agent runs: auto = inside the server where it loads, else outside it (a static
    /// binary, a Go program: wake, replay and lines of its code and read-only data from a thread
    /// on the server's CPU, busy periods from the kernel's tracepoints, root; no heap lines); inside =
    /// refuse such a server; outside = outside even where it could load (to compare)
    #[arg(long, default_value = "auto", value_parser = ["auto", "inside", "outside"])]
    pub agent: String,
    /// Keep the agents' logs (one per server process, in the run directory) after a demo that
    /// ended well or was stopped by SIGINT/SIGTERM; by default they are removed then, and a
    /// failed demo always keeps them.
    #[arg(long)]
    pub keep_agent_logs: bool,
    /// Split every response time at the server's own system calls: send → its first read of
    /// the request returned (to read), → its reply's write (compute: the server's own work), →
    /// the client has the reply (reply). Attaches the syscall observer to the serving process
    /// (root; eBPF programs on the syscall tracepoints, ~0.13 µs per traced call, every mode
    /// alike; the output says which ran).
    #[arg(long)]
    pub syscall_stages: bool,
    /// Add the diagnostic row `conn-primed`: a request on the measured connection after going cold
    #[arg(long)]
    pub connection_row: bool,
    /// Write all results (per-request records and the table) as JSON here.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Print the table as JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

impl DemoArgs {
    fn params(self) -> DemoParams {
        DemoParams {
            server: self.server,
            port: self.port,
            protocol: self.protocol.into(),
            request: self.request,
            until: self.until,
            command: self.command,
            rounds: self.rounds,
            lead_us: self.lead_us,
            idle_ms: self.idle_ms,
            sweep_mib: self.sweep_mib,
            post_gap_us: self.post_gap_us,
            strategies: self.strategies,
            pilot_rounds: self.pilot_rounds,
            profile: self.profile,
            samples: self.samples,
            keep: self.keep,
            gap_merge: self.gap_merge,
            records: self.records,
            out: self.out,
            server_cpu: self.server_cpu,
            netns: self.netns,
            steer_rx: self.steer_rx.into(),
            keep_agent_logs: self.keep_agent_logs,
            syscall_stages: self.syscall_stages,
            connection_row: self.connection_row,
            agent: preheat_demo::AgentPlace::parse(&self.agent),
        }
    }
}

pub fn run(a: DemoArgs) -> Result<()> {
    let (out_path, json) = (a.out.clone(), a.json);
    if !a.keep_agent_logs {
        preheat_launch::cleanup::tidy_agent_logs_on_signal();
    }
    // The recording's bar is drawn even with --json (as it always was); the pilot's and the
    // rounds' are hidden then.
    let out = preheat_demo::run(&a.params(), &Bars::new(false), &Bars::new(json))?;
    if let Some(p) = &out_path {
        std::fs::write(p, serde_json::to_vec_pretty(&out)?)
            .with_context(|| format!("writing {}", p.display()))?;
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        print!("{}", preheat_demo::render(&out));
    }
    Ok(())
}
