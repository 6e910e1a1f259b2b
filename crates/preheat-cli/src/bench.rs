//! `preheat bench`: speed targets as ratios against baselines measured in the same run.
//!
//! * `preheat` — preheat throughput against a plain load loop and the scattered-line limit, two
//!   cores against one (`preheat_bench::throughput`).
//! * `agent` — the agent's overhead on warm requests (`preheat_bench::agent`; `--aa` runs both
//!   servers without the agent: the benchmark's noise floor).
//! * `observe` — the outside observer's overhead on warm requests (`preheat_bench::observe`).
//! * `comm` — communication detection's overhead and accuracy on the bundled kernels
//!   (`preheat_comm::bench`).
//! * `cosched`, `cosim` — the coscheduler's overhead and the simulator's speed (`cosched/`).
//!
//! This module parses the arguments and prints the results.

use anyhow::Result;
use preheat_model::comm::CommConfig;

use crate::progress::Bars;

#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub which: Which,
    /// Print JSON.
    #[arg(long, global = true)]
    pub json: bool,
}

#[derive(clap::Subcommand, Debug)]
pub enum Which {
    /// Preheat throughput vs a plain load loop and the scattered-line limit; 2 cores vs 1.
    Preheat {
        /// Working-set size in KiB (the paper's memcached set: 142 KiB).
        #[arg(long, default_value_t = 192)]
        ws_kib: u64,
        /// Trials per method in each repetition.
        #[arg(long, default_value_t = 40)]
        trials: usize,
        /// Repetitions (each a full set of interleaved trials; the ratios are reported as the
        /// median over repetitions with their range; >= 5 for a headline).
        #[arg(long, default_value_t = 5)]
        reps: usize,
    },
    /// Communication detection: overhead and accuracy on the bundled NPB-style kernels.
    Comm {
        /// Kernels (comma-separated: mg, cg, is, ep).
        #[arg(long, default_value = "mg,cg,is,ep", value_delimiter = ',')]
        kernels: Vec<String>,
        /// Repetitions per kernel and condition (≥ 5 for a headline).
        #[arg(long, default_value_t = 5)]
        reps: usize,
        /// Kernel iterations per run (fixed work, so wall times compare).
        #[arg(long, default_value_t = 8000)]
        iterations: u64,
        #[arg(long, default_value_t = 4)]
        threads: usize,
        #[arg(long, default_value_t = 2)]
        instances: usize,
        /// Pages revoked per round (default: the detector's default).
        #[arg(long)]
        pages: Option<u32>,
        /// Round length in ms (default: the detector's default).
        #[arg(long)]
        period_ms: Option<u32>,
        /// How pages are revoked.
        #[arg(long, value_enum, default_value = "auto")]
        mechanism: crate::comm::MechanismArg,
    },
    /// The user-space coscheduler's overhead: useful work per second of one set under it
    /// against plain Linux (goal >= 0.97).
    Cosched {
        /// Bundled kernel (mg, cg, is, ep).
        #[arg(long, default_value = "mg")]
        kernel: String,
        /// Paired repetitions (>= 5 for a headline).
        #[arg(long, default_value_t = 5)]
        reps: usize,
        /// Seconds per run [default: 3; 8 with --guest].
        #[arg(long)]
        seconds: Option<f64>,
        /// Slice length, ms.
        #[arg(long, default_value_t = 10.0)]
        slice_ms: f64,
        /// One 2-vCPU QEMU guest (booted per run; goal >= 0.95) instead of a thread group.
        #[arg(long)]
        guest: bool,
    },
    /// Simulator speed: simulated CPU-seconds per wall second (`preheat cosched simulate`).
    Cosim {
        /// Repetitions (≥ 5 for a headline).
        #[arg(long, default_value_t = 5)]
        reps: usize,
        /// Host CPUs (VMs of this and half this many vCPUs, quad).
        #[arg(long, default_value_t = 64)]
        cpus: usize,
    },
    /// Agent overhead on warm requests (bundled server).
    Agent {
        /// Requests per configuration in each pair.
        #[arg(long, default_value_t = 40000)]
        requests: usize,
        /// Pairs (each pair gives one throughput ratio, reported as the median over pairs with
        /// its range; >= 5 for a headline; the A/A control moves a median of 15 by about ±0.6%).
        #[arg(long, default_value_t = 15)]
        pairs: usize,
        /// Blocks per configuration in a pair (requests alternate between the two servers in
        /// blocks, ABBA order).
        #[arg(long, default_value_t = 20)]
        blocks: usize,
        /// A/A control: run the second server without the agent too (the benchmark's noise
        /// floor).
        #[arg(long)]
        aa: bool,
        /// Attach the agent to the second server but switch its tracking off (`SetEnabled`):
        /// what interposition and the agent's threads cost without the busy-period tracking.
        #[arg(long, conflicts_with = "aa")]
        passthrough: bool,
    },
    /// The outside observer's overhead on warm requests (bundled server; root).
    Observe {
        /// Requests per configuration in each pair.
        #[arg(long, default_value_t = 40000)]
        requests: usize,
        /// Pairs (>= 5 for a headline).
        #[arg(long, default_value_t = 9)]
        pairs: usize,
        /// Blocks per configuration in a pair (ABBA order).
        #[arg(long, default_value_t = 20)]
        blocks: usize,
        /// How the observer opens its events.
        #[arg(long, value_enum, default_value = "bpf")]
        mechanism: crate::observe::MechanismArg,
        /// A/A control: attach the observer to neither server (the noise floor).
        #[arg(long)]
        aa: bool,
        /// One server, the observer's programs attached in every other block, instead of two
        /// servers with one observed throughout: what the observer costs every process (its
        /// programs run on events of the whole machine; the syscall tracepoints' slow path)
        /// is then in the comparison too, which the two-server design cancels.
        #[arg(long)]
        toggle: bool,
        /// The eBPF programs on the syscall tracepoints instead of the scheduler's and socket
        /// tracepoints (to compare; as `preheat observe --syscalls`).
        #[arg(long)]
        syscalls: bool,
        /// Observe throughout instead of sampling under load as the outside preheater does
        /// (its programs detached for 450 ms each time the server makes more than 10 000
        /// periods a second): what complete observation costs.
        #[arg(long)]
        complete: bool,
        /// The server observed: the bundled preheat-kv (its request the shortest here, so the
        /// observer's largest share) or a catalog server (its Debian package installed).
        #[arg(long, value_enum, default_value = "kv")]
        server: preheat_launch::servers::ServerKind,
        /// With a server's command after `--`: the path its HTTP GETs ask for (any HTTP/1.1
        /// server with keep-alive; `{port}` in the command is replaced by a free port), e.g.
        /// `preheat bench observe --toggle --http-path / -- ./go-server {port}`.
        #[arg(long, default_value = "/")]
        http_path: String,
        /// A server of any kind by its command (instead of --server).
        #[arg(last = true, value_name = "COMMAND")]
        command: Vec<String>,
    },
}

pub fn run(a: BenchArgs) -> Result<()> {
    match a.which {
        Which::Preheat {
            ws_kib,
            trials,
            reps,
        } => print_preheat(
            &preheat_bench::throughput::measure(ws_kib, trials, reps, &Bars::new(a.json))?,
            a.json,
        ),
        Which::Agent {
            requests,
            pairs,
            blocks,
            aa,
            passthrough,
        } => {
            let bars = Bars::new(a.json);
            let out =
                preheat_bench::agent::measure(requests, pairs, blocks, aa, passthrough, &bars)?;
            print_agent(&out, a.json)
        }
        Which::Observe {
            requests,
            pairs,
            blocks,
            mechanism,
            aa,
            toggle,
            syscalls,
            complete,
            server,
            http_path,
            command,
        } => {
            let setup = preheat_bench::observe::Setup {
                server,
                command: (!command.is_empty()).then_some(command),
                command_path: http_path,
                mechanism: (!aa).then(|| mechanism.into()),
                syscalls,
                toggle,
                sampling: (!complete).then(preheat_observe::sampling::Sampling::default),
            };
            let out = preheat_bench::observe::measure(
                requests,
                pairs,
                blocks,
                &setup,
                &Bars::new(a.json),
            )?;
            print_observe(&out, a.json)
        }
        Which::Cosim { reps, cpus } => crate::cosched::sim_bench::run(reps, cpus, a.json),
        Which::Cosched {
            kernel,
            reps,
            seconds,
            slice_ms,
            guest,
        } => crate::cosched::bench::run(&kernel, reps, (seconds, guest), slice_ms, a.json),
        Which::Comm {
            kernels,
            reps,
            iterations,
            threads,
            instances,
            pages,
            period_ms,
            mechanism,
        } => {
            let d = CommConfig::default();
            let s = preheat_comm::bench::Settings {
                kernels,
                reps,
                iterations,
                threads,
                instances,
                cfg: CommConfig {
                    pages: pages.unwrap_or(d.pages),
                    period_ms: period_ms.unwrap_or(d.period_ms),
                    mechanism: mechanism.into(),
                    ..d
                },
            };
            print_comm(&s, a.json)
        }
    }
}

fn print_preheat(out: &preheat_bench::throughput::PreheatBench, json: bool) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        print!("{}", out.render());
    }
    Ok(())
}

fn print_agent(out: &preheat_bench::agent::AgentBench, json: bool) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        print!("{}", out.render());
    }
    Ok(())
}

fn print_observe(out: &preheat_bench::observe::ObserveBench, json: bool) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        print!("{}", out.render());
    }
    Ok(())
}

/// Run the communication bench (a line on stderr per trial) and print its table (or JSON).
fn print_comm(s: &preheat_comm::bench::Settings, json: bool) -> Result<()> {
    let results = preheat_comm::bench::run(s, |t| {
        eprint!(
            "\rbench comm: trial {}/{} ({}, {})        ",
            t.n,
            t.total,
            t.kernel,
            if t.detection { "detection" } else { "plain" }
        );
    })?;
    eprintln!();
    if json {
        println!("{}", serde_json::to_string_pretty(&results)?);
        return Ok(());
    }
    print!("{}", preheat_comm::bench::render(s, &results));
    Ok(())
}
