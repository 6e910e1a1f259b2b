//! `preheat`: the one front door.
//!
//! Preheat makes a latency-critical server answer the first request after an idle period as
//! fast as a warm one: it estimates the server's per-request cache-line working set (`record`),
//! and when a request is announced ahead of its arrival it wakes the server's core, loads that
//! working set and warms the kernel path (`run`, `announce`). `demo` shows it end to end on the
//! bundled server with honest, labeled measurements.

mod affinity;
mod arbiter;
mod bench;
mod comm;
mod cosched;
mod demo;
mod groups;
mod guest;
mod load;
mod observe;
mod progress;
mod record;
mod serve;
mod topo;
mod ws;

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use preheat_launch::{agentctl, cleanup, paths, servers};
use preheat_model::{proto::Announcement, proto::Request, proto::Strategies, FilterParams};

#[derive(Parser)]
#[command(
    name = "preheat",
    version,
    about = "Preheat CPU caches of latency-critical servers before announced requests arrive",
    long_about = "preheat estimates a server's per-request cache-line working set, and when a request \
is announced ahead of its arrival (by a load generator today, a centrally arbitrated network later) \
it wakes the server's core, loads the working set and warms the kernel path, so the first request \
after an idle period is served like a warm one.\n\nStart with `preheat demo`.",
    after_help = "Environment: PREHEAT_RUN_DIR (agent sockets, default /tmp/preheat), \
PREHEAT_AGENT_SO and PREHEAT_KV_BIN (companion artifacts)."
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Record a working set, then measure warm / cold / preheated response times side by side.
    Demo(demo::DemoArgs),
    /// Estimate a server's per-request working set and write it to a .phws file.
    #[command(
        long_about = "Estimate a server's per-request working set (paper §3.1) and write it to a \
.phws file.\n\nEither name a known server (--server kv|memcached), which preheat starts, loads and \
queries itself, or give a command after `--` together with --port and --request.\n\nExamples:\n  \
preheat record --server kv --out kv.phws\n  preheat record --out mc.phws --port 11311 \
--request 'get k\\r\\n' --until 'END\\r\\n' -- memcached -p 11311 -U 0 -t 1"
    )]
    Record(RecordArgs),
    /// Working-set files.
    Ws {
        #[command(subcommand)]
        cmd: WsCmd,
    },
    /// Start a server with the agent attached (and a profile loaded) and keep it running.
    Run(RunArgs),
    /// Announce a request ("a request for PORT arrives in LEAD µs") to the agents serving PORT.
    Announce(AnnounceArgs),
    /// Talk to running agents.
    Agent {
        #[command(subcommand)]
        cmd: AgentCmd,
    },
    /// Start a known server (memcached, nginx, redis, MariaDB, preheat-kv) with its data set and keep it running.
    Serve(serve::ServeArgs),
    /// The experiment runner: Table 1 on real servers, peer check, sweeps, reports (python3 -m preheat_lab).
    #[command(disable_help_flag = true)]
    Lab {
        /// Arguments for `python3 -m preheat_lab` (try `preheat lab --help`, `preheat lab table1 --help`).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Generate load (open loop with Poisson arrivals, idle-gap, closed loop) over memcached, redis, HTTP or MySQL, optionally announcing every request.
    Load(load::LoadArgs),
    /// Run the central arbiter: allocate timeslots to senders, announce packets to receivers.
    Arbiter(arbiter::ArbiterArgs),
    /// Anticipatory wakeups: the wake planner daemon and its clients (sleeping-cpus paper).
    Wake(preheat_wake::WakeArgs),
    /// CPU idle residency, modeled energy, and slack-enabled quiescence (cgroup freezer).
    Power(preheat_power::PowerArgs),
    /// Staged bursts: a proxy that buffers requests and releases them in bursts (sleeping-cpus paper).
    Stage(preheat_stage::StageArgs),
    /// Anticipatory I/O and kernel waits: predicted completions, block-then-spin (sleeping-cpus paper).
    Io(preheat_predict::IoArgs),
    /// Benchmarks: preheat throughput and agent overhead, as ratios within one run.
    Bench(bench::BenchArgs),
    /// Busy periods of a running server from outside (any process, static or dynamic; root):
    /// per thread, attributed to the listening port, hand-offs followed to the writing thread.
    Observe(observe::ObserveArgs),
    /// Which threads of a program share memory: SPCD communication detection in user space.
    #[command(
        long_about = "Which threads of an unmodified program share memory: communication detection \
through shared pages (SPCD, Diener et al.; used by Busse et al., Partial Coscheduling, SAC'15, \
§2.2), in user space on a stock kernel.\n\n\
Every round (--period-ms) the agent inside the program revokes access to a sample of its writable \
heap, anonymous and shared pages (--pages, at most --budget faults per second); the next access \
faults, the agent notes the faulting thread, restores the page and lets the access proceed. Two \
threads faulting on the same granule (--granule, default one page) are a communication event. \
The result is the symmetric thread x thread matrix of events (measured), for `preheat groups`.\n\n\
--access write (default) revokes writes only: the kernel can still read the pages for the \
program's system calls. --access any revokes reads too, as SPCD does; a system call that reads a \
revoked page then fails with EFAULT (calls the agent interposes are retried).\n\n\
The program's own segfaults, SIGSEGV handlers, mprotect/munmap calls, fork and exec are left as \
they would be without the agent.\n\n\
Examples:\n  preheat comm --out m.json -- preheat-npb mg --threads 4 --instances 2\n  \
preheat groups m.json\n  preheat comm --pid 1234 --duration 10 --out m.json"
    )]
    Comm(comm::CommArgs),
    /// Group tasks into coscheduling sets from a communication matrix (partial coscheduling, eq. 1, threshold t or modularity).
    #[command(long_about = preheat_group::render::GROUPS_HELP)]
    Groups(groups::GroupsArgs),
    /// Partial coscheduling: a user-space coscheduler, the paper's experiments, a host simulator.
    Cosched(cosched::CoschedArgs),
    /// Cache affinity: what interleaving and moving a task cost here, and preheating to win it back.
    Affinity(affinity::AffinityArgs),
    /// Real virtual machines: a guest image from Debian packages, QEMU guests with known vCPUs, their progress.
    #[command(long_about = preheat_guest::HELP)]
    Guest(guest::GuestArgs),
    /// What this machine offers: CPU features, caches, idle states, PMU, privileges, backends.
    Topology {
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum WsCmd {
    /// Print lines, runs, KiB, encoded bytes and the paper's size metric.
    Show {
        file: PathBuf,
        #[arg(long)]
        json: bool,
        /// Print every run as `port region start length` (tab separated).
        #[arg(long, conflicts_with = "json")]
        runs: bool,
    },
    /// Precision and recall of a working set against another taken as ground truth.
    Compare {
        /// The working set to score (e.g. recorded with --backend probe).
        tested: PathBuf,
        /// The ground truth (e.g. recorded with --backend trace).
        truth: PathBuf,
        /// Request class (default: the tested file's first).
        #[arg(long)]
        port: Option<u16>,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum AgentCmd {
    /// Status and counters of every agent (or of --pid).
    Status {
        #[arg(long)]
        pid: Option<u32>,
    },
    /// Load a working-set file into the agent of --pid (replaces its profile).
    Load {
        #[arg(long)]
        pid: u32,
        file: PathBuf,
    },
}

#[derive(Args)]
struct FilterArgs {
    /// Samples per working-set estimate (the paper uses 8).
    #[arg(long, default_value_t = 8)]
    samples: u32,
    /// Keep lines seen in at least this many samples.
    #[arg(long, default_value_t = 6)]
    keep: u32,
    /// Merge runs separated by at most this many lines.
    #[arg(long, default_value_t = 0)]
    gap: u32,
}

impl FilterArgs {
    fn params(&self) -> Result<FilterParams> {
        if self.samples == 0 || self.keep == 0 || self.keep > self.samples {
            bail!(
                "--keep must be between 1 and --samples (got keep {} of {})",
                self.keep,
                self.samples
            );
        }
        Ok(FilterParams {
            k: self.keep,
            n: self.samples,
            gap: self.gap,
        })
    }
}

#[derive(Args)]
struct RecordArgs {
    /// Output file (.phws), written atomically.
    #[arg(long, short)]
    out: PathBuf,
    /// A server preheat knows how to start and query.
    #[arg(long, value_enum, conflicts_with = "command")]
    server: Option<servers::ServerKind>,
    /// Estimation backend.
    #[arg(long, value_enum, default_value = "auto")]
    backend: record::BackendChoice,
    /// Port of the request class (required with a command).
    #[arg(long)]
    port: Option<u16>,
    /// The request to sample, with \r \n escapes (required with a command).
    #[arg(long)]
    request: Option<String>,
    /// The reply ends with these bytes (\r \n escapes).
    #[arg(long, default_value = "\\r\\n")]
    until: String,
    #[command(flatten)]
    filter: FilterArgs,
    /// Largest flush+reload pass in KiB (larger passes evict what they measure).
    #[arg(long, default_value_t = 1024)]
    chunk_kib: u64,
    /// Keep lines that also appear without a request (default: subtract them).
    #[arg(long)]
    keep_noise: bool,
    /// Requests sent before the first sample, on every backend: lazy initialisation settles.
    /// A runtime with a JIT (the JVM, Node.js) runs other code after thousands of requests than
    /// after a few; the probe's calibration and pilot send hundreds anyway, the exact backends
    /// (`trace`, `step`) only these. To score a probe recording of such a server against
    /// `trace`, warm the traced one about as far (the probe's recording prints how many
    /// requests it sent).
    #[arg(long, default_value_t = preheat_estimate::params::DEFAULT_WARM_UP, value_name = "N")]
    warm_up: u32,
    /// The vote over the probe's samples: `auto` tests each line for being seen more often
    /// with a request than without (Fisher) where the default would keep mostly lines the
    /// server's other activity brings in (a JVM), `default` never, `enriched` always.
    #[arg(long, value_enum, default_value_t = record::VoteArg::Auto)]
    vote: record::VoteArg,
    /// Probe every STRIDE-th line per pass, keeping the others cached, so lines the hardware
    /// prefetchers pull in next to a demand miss are not counted (1: plain flush+reload).
    /// Default: with --window-pages, 2; without either, the layout is chosen by a short pilot
    /// on the server's memory (the one whose request-less samples read the fewest false hits).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=64))]
    stride: Option<u32>,
    /// Probe the lines of WINDOW_PAGES pages in one random order (wider windows hide the
    /// probe's own order from the prefetchers). Default: with --stride, 16; else see --stride.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1024))]
    window_pages: Option<u32>,
    /// CPU to pin the server to (default: the last CPU).
    #[arg(long)]
    server_cpu: Option<usize>,
    /// Hybrid backend: also write the two profiles it merged, DIR/step.phws (code) and
    /// DIR/probe.phws (everything the probe saw), e.g. to score them with `preheat ws compare`.
    #[arg(long, value_name = "DIR")]
    parts: Option<PathBuf>,
    /// Keep the agents' logs (one per server process, in the run directory) after a recording
    /// that ended well or was stopped by SIGINT/SIGTERM; by default they are removed then, and a
    /// failed recording keeps them.
    #[arg(long)]
    keep_agent_logs: bool,
    /// The server command (after --).
    #[arg(last = true)]
    command: Vec<String>,
}

#[derive(Args)]
struct RunArgs {
    /// Working-set file to load into the agent.
    #[arg(long)]
    profile: Option<PathBuf>,
    /// Port to configure (replay request etc.).
    #[arg(long)]
    port: u16,
    /// Warm-up request for the replay strategy (\r \n escapes).
    #[arg(long)]
    replay: Option<String>,
    /// Reply terminator of the warm-up request.
    #[arg(long, default_value = "\\r\\n")]
    replay_until: String,
    /// What `auto` announcements for --port do: the choice a `preheat demo --out FILE` measured
    /// (its pilot's). Without it, `auto` does wake+lines (counted as auto_unmeasured).
    #[arg(long, value_name = "FILE")]
    auto_choice: Option<PathBuf>,
    /// Where the agent runs: auto = inside the server where it loads, else outside it (a static
    /// binary, a Go program; root); inside = refuse such a server; outside = outside even where
    /// it could load
    #[arg(long, default_value = "auto", value_parser = ["auto", "inside", "outside"])]
    agent: String,
    /// Preheated from outside: the CPU the server is pinned to and the outside worker runs on
    /// (default: the last CPU)
    #[arg(long)]
    cpu: Option<usize>,
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

#[derive(Args)]
struct AnnounceArgs {
    #[arg(long)]
    port: u16,
    /// How far ahead the request arrives, µs (Fastpass computes schedules ~65 µs ahead).
    #[arg(long, default_value_t = 65)]
    lead_us: u64,
    /// Strategies: auto, wake, lines, replay, joined with + (or all). `auto`: what the agent
    /// was told was measured to help the port (`preheat run --auto-choice`), else wake+lines.
    #[arg(long, default_value = "auto")]
    strategies: String,
    /// Only this agent (default: every agent found).
    #[arg(long)]
    pid: Option<u32>,
}

fn main() {
    let cli = Cli::parse();
    // Commands that start servers get the stop-everything-on-SIGINT/SIGTERM handler; the
    // daemons and proxies handle those signals themselves (restoring machine state, final
    // counters) and must not be cut short by it. `load` starts no processes and stops on those
    // signals itself to print what it measured. `affinity` installs it where it starts
    // processes (its workers stop on SIGTERM themselves and print what they measured).
    if !matches!(
        cli.cmd,
        Cmd::Stage(_)
            | Cmd::Power(_)
            | Cmd::Wake(_)
            | Cmd::Arbiter(_)
            | Cmd::Lab { .. }
            | Cmd::Load(_)
            | Cmd::Affinity(_)
    ) {
        cleanup::install_cleanup();
        // A calibration (the demo's first on a boot) stopped by the signal: its bench dirs.
        cleanup::on_signal(preheat_wake::bench::remove_own_dirs);
    }
    // A hot floor (`demo`) killed by SIGKILL left a CPU held out of idle: put it back.
    preheat_demo::hot::restore_stale(&paths::run_dir());
    // A demo killed by SIGKILL left lo's receive processing steered: put it back.
    if let Err(e) = preheat_engine::rxsteer::restore_left() {
        eprintln!("preheat: could not put back the receive steering a killed run left: {e}");
    }
    if let Err(e) = run(cli) {
        // A command stopped by SIGINT/SIGTERM may fail on its own meanwhile (what it ran was
        // stopped under it): the signal handler's cleanup ends the process (128 + the signal),
        // not this error, which would exit before the cleanup is done.
        if cleanup::SIGNALLED.load(std::sync::atomic::Ordering::SeqCst) != 0 {
            loop {
                std::thread::park();
            }
        }
        eprintln!("preheat: error: {e:#}");
        std::process::exit(1);
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.cmd {
        Cmd::Demo(a) => demo::run(a),
        Cmd::Serve(a) => serve::run(a),
        Cmd::Lab { args } => serve::lab(args),
        Cmd::Record(a) => record::run(a),
        Cmd::Ws {
            cmd: WsCmd::Show { file, json, runs },
        } => ws::show(&file, json, runs),
        Cmd::Ws {
            cmd:
                WsCmd::Compare {
                    tested,
                    truth,
                    port,
                    json,
                },
        } => ws::compare(&tested, &truth, port, json),
        Cmd::Run(a) => cmd_run(a),
        Cmd::Announce(a) => cmd_announce(a),
        Cmd::Agent { cmd } => cmd_agent(cmd),
        Cmd::Topology { json } => topo::print(json),
        Cmd::Bench(a) => bench::run(a),
        Cmd::Observe(a) => observe::run(a),
        Cmd::Load(a) => load::run(a),
        Cmd::Arbiter(a) => arbiter::run(a),
        Cmd::Wake(a) => preheat_wake::run(a),
        Cmd::Power(a) => preheat_power::run(a),
        Cmd::Stage(a) => preheat_stage::run(a),
        Cmd::Io(a) => preheat_predict::run(a),
        Cmd::Groups(a) => groups::run(a),
        Cmd::Comm(a) => comm::run(a),
        Cmd::Cosched(a) => cosched::run(a),
        Cmd::Affinity(a) => affinity::run(a),
        Cmd::Guest(a) => guest::run(a),
    }
}

fn default_server_cpu() -> usize {
    preheat_engine::os::online_cpus().saturating_sub(1)
}

fn cmd_run(a: RunArgs) -> Result<()> {
    let running = preheat_demo::run_server(&preheat_demo::RunServer {
        command: a.command,
        port: a.port,
        profile: a.profile,
        replay: a.replay,
        replay_until: a.replay_until,
        auto_choice: a.auto_choice,
        agent: preheat_demo::AgentPlace::parse(&a.agent),
        cpu: a.cpu.unwrap_or_else(default_server_cpu),
    })?;
    for line in &running.report {
        println!("{line}");
    }
    running.wait()
}

fn cmd_announce(a: AnnounceArgs) -> Result<()> {
    let strategies = Strategies::parse(&a.strategies).map_err(anyhow::Error::msg)?;
    let dir = paths::run_dir();
    let pids = match a.pid {
        Some(p) => vec![p],
        None => agentctl::discover(&dir),
    };
    if pids.is_empty() {
        bail!("no agents found in {}", dir.display());
    }
    let mut ann = agentctl::Announcer::new(&dir, &pids)?;
    let now = preheat_engine::time::now_ns();
    let n = ann.send(Announcement {
        strategies,
        port: a.port,
        seq: 0,
        arrival_ns: now + a.lead_us * 1000,
        sent_ns: now,
        budget_ns: 0,
    });
    println!(
        "announced port {} in {} µs ({}) to {n} of {} agents",
        a.port,
        a.lead_us,
        strategies.name(),
        pids.len()
    );
    Ok(())
}

fn cmd_agent(cmd: AgentCmd) -> Result<()> {
    let dir = paths::run_dir();
    match cmd {
        AgentCmd::Status { pid } => {
            let pids = match pid {
                Some(p) => vec![p],
                None => agentctl::discover(&dir),
            };
            if pids.is_empty() {
                println!("no agents running (run dir {})", dir.display());
            }
            for p in pids {
                let r = agentctl::AgentClient::connect(&dir, p)?.call(&Request::Status)?;
                println!("{}", serde_json::to_string_pretty(&r)?);
            }
            Ok(())
        }
        AgentCmd::Load { pid, file } => {
            let path =
                std::fs::canonicalize(&file).with_context(|| format!("{}", file.display()))?;
            let r = agentctl::AgentClient::connect(&dir, pid)?.call(&Request::LoadProfile {
                path: path.to_string_lossy().into_owned(),
            })?;
            println!("{}", serde_json::to_string_pretty(&r)?);
            Ok(())
        }
    }
}
