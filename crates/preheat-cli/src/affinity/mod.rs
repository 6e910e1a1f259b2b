//! `preheat affinity`: what a scheduler loses when it interleaves or moves a task, measured on
//! this machine with the method of Kazempour, Fedorova and Alagheband ("Performance Implications
//! of Cache Affinity on Multicore Processors", Euro-Par 2008) — and won back by preheating.
//!
//! The arguments and the printing; the plan is `preheat-affinity` (pure), the controller that
//! runs it `preheat-affinity-ctl`.
//!
//! * `topology` — caches, base vectors, the experiment matrix this machine allows, and each
//!   vector's measured eviction.
//! * `run` (here) — one cell.
//! * `bench` — the controller's overhead and quantum accuracy as ratios within one run.
//! * `worker` (hidden) — a worker process the controller starts from this binary.
//!
//! The lab (`preheat lab affinity`) repeats cells, shuffles them and draws the paper's tables
//! and figures.

mod bench;
mod topology;
mod worker;

use std::path::PathBuf;

use anyhow::Result;

use preheat_affinity_ctl::proc::WorkerCmd;
use preheat_affinity_ctl::run::{self, Experiment, MainSpec, RunResult, RunSpec};

const ABOUT: &str = "Cache affinity: what a scheduler loses when it interleaves or moves a task \
(Kazempour, Fedorova, Alagheband, Euro-Par 2008), measured on this machine, and how much of it \
preheating wins back.\n\n\
Method. A base vector is a program with a chosen cache footprint: BV_0 (negligible), BV_L1D (reads \
a buffer the size of the L1 data cache), BV_L1I (executes jumps spanning the L1 instruction \
cache), one data vector per further level (BV_L2 ... BV_LLC). Sizes come from sysfs. \
Section 2 (Table 2): the workload and a vector share one CPU and alternate every quantum (2, 10, \
200 ms): BV_0 leaves the workload's L1 state intact (high affinity), BV_L1D/BV_L1I displace it \
(low affinity); low retention of the next level runs that level's vector concurrently on a CPU \
sharing it. Linux does not take orders about timeslices, so the controller enforces the quanta \
itself (SCHED_FIFO priorities swapped every quantum; SIGSTOP/SIGCONT without real-time \
permission) and reports the quanta it achieved. Section 3 (Table 3): copies of a workload plus \
interfering ones on all CPUs, each copy pinned (high affinity) or moved to the next CPU every \
quantum (low affinity). Beyond the paper: --preheat loads the workload's working set (the \
preheat engine) on its CPU just before it resumes or moves.\n\n\
Metric: with no PMU (this kind of VM) IPC and misses per instruction cannot be counted; the \
metric is work per CPU-second of the main workload (bundled workloads count their progress; \
programs: jobs per CPU-second from the CPU time the kernel accounts to the job), plus a refill \
profile for bundled workloads (progress rate against time since the quantum began). Every \
number printed is measured on this machine; the lab labels the paper's numbers as the paper's.\n\n\
Workloads (stand-ins for SPEC CPU2000): chase (mcf: pointer chase over an L2-sized working set), \
stream (art: streaming, poor reuse), branchy (gcc/crafty: large instruction footprint); Debian \
programs on fixed inputs: gzip, xz, sqlite3, cc; or any program after `--`.\n\n\
Examples:\n  preheat affinity topology --verify\n  preheat affinity run --workload chase \
--interleave BV_L1D --quantum-ms 2\n  preheat affinity run --workload chase --interleave BV_L2 \
--concurrent BV_LLC --quantum-ms 2 --preheat\n  preheat affinity run --experiment table3 \
--workload chase --interfering stream --affinity low\n  preheat affinity run --interleave BV_L1I \
--quantum-ms 10 -- xz -c -9 big.tar\n  preheat affinity bench\n  preheat lab affinity --quick";

#[derive(clap::Args)]
#[command(long_about = ABOUT)]
pub struct AffinityArgs {
    #[command(subcommand)]
    cmd: AffinityCmd,
}

#[derive(clap::Subcommand)]
enum AffinityCmd {
    /// Caches, base vectors and the experiment matrix this machine allows (and why).
    Topology(topology::TopologyArgs),
    /// Run one cell (measured): a workload interleaved with a vector, moved, or alone.
    Run(RunArgs),
    /// The controller's overhead and quantum accuracy, as ratios within one run.
    Bench(bench::BenchArgs),
    /// (internal) a base vector or bundled workload process started by `run`.
    #[command(hide = true)]
    Worker(worker::WorkerArgs),
}

#[derive(clap::Args)]
pub struct RunArgs {
    /// table2 (default when --interleave is given), table3, or alone.
    #[arg(long)]
    experiment: Option<String>,
    /// The main workload: chase, stream, branchy, gzip, xz, sqlite3, cc (or a program after --).
    #[arg(long)]
    workload: Option<String>,
    /// Section 2: the base vector interleaved with the workload (BV_0, BV_L1D, BV_L1I, BV_L2, ...).
    #[arg(long)]
    interleave: Option<String>,
    /// Section 2: a vector running concurrently on a CPU sharing the retention level (low retention).
    #[arg(long)]
    concurrent: Option<String>,
    /// Section 3: the interfering workload.
    #[arg(long)]
    interfering: Option<String>,
    /// Section 3: high (each copy pinned) or low (moved every quantum).
    #[arg(long, default_value = "low")]
    affinity: String,
    /// The quantum, ms (paper: 2, 10, 200).
    #[arg(long, default_value_t = 2.0)]
    quantum_ms: f64,
    /// The main CPU.
    #[arg(long, default_value_t = 0)]
    cpu: u32,
    /// Bundled workloads: run until this much CPU time of their own.
    #[arg(long, default_value_t = 600)]
    cpu_ms: u64,
    /// Working set of a bundled workload, bytes (default: chase = L2, stream = 2x LLC,
    /// branchy = 16x L1i).
    #[arg(long)]
    ws_bytes: Option<usize>,
    /// Preheat the workload's working set on its CPU before it resumes (Section 2) or moves
    /// (Section 3): the win-back experiment. Bundled workloads, real-time scheduling.
    #[arg(long)]
    preheat: bool,
    /// Run the interleaved vector as a thread of a bundled workload's process (no address-space
    /// switch between them; isolates cache effects from the cost of switching address spaces).
    #[arg(long)]
    vector_in_process: bool,
    #[arg(long)]
    json: bool,
    /// A program to run as the main workload (one fixed job; jobs per CPU-second).
    #[arg(last = true)]
    program: Vec<String>,
}

pub fn run(a: AffinityArgs) -> Result<()> {
    let r = match a.cmd {
        AffinityCmd::Topology(t) => topology::run(t),
        AffinityCmd::Run(r) => run_cmd(r),
        AffinityCmd::Bench(b) => bench::run(b),
        AffinityCmd::Worker(w) => worker::run(w),
    };
    // Stopped by SIGINT/SIGTERM: the handler stops the processes; whatever error the run saw
    // as they vanished is a consequence, not the cause. Exit as the signal would.
    let sig = preheat_launch::cleanup::SIGNALLED.load(std::sync::atomic::Ordering::SeqCst);
    if sig != 0 {
        eprintln!(
            "preheat affinity: stopped by signal {sig}; the processes it started are stopped"
        );
        // Let the handler finish stopping them (it exits the process itself).
        std::thread::sleep(std::time::Duration::from_secs(5));
        std::process::exit(128 + sig);
    }
    r
}

fn run_cmd(a: RunArgs) -> Result<()> {
    preheat_launch::cleanup::install_cleanup();
    let main = MainSpec::parse(a.workload.as_deref(), &a.program)?;
    let exp = match (a.experiment.as_deref(), &a.interleave) {
        (Some("table3"), _) => {
            let name = a.interfering.as_deref().unwrap_or("stream");
            let high = match a.affinity.as_str() {
                "high" => true,
                "low" => false,
                x => anyhow::bail!("--affinity {x:?}: high or low"),
            };
            Experiment::Table3 {
                interfering: MainSpec::parse(Some(name), &[])?,
                high,
            }
        }
        (Some("alone"), None) | (None, None) => Experiment::Alone,
        (Some("alone"), Some(_)) => anyhow::bail!("--experiment alone takes no --interleave"),
        (Some("table2") | None, Some(v)) => Experiment::Table2 {
            interleaved: v.clone(),
            concurrent: a.concurrent.clone(),
        },
        (Some("table2"), None) => anyhow::bail!("table2 needs --interleave BV_..."),
        (Some(x), _) => anyhow::bail!("--experiment {x:?}: table2, table3 or alone"),
    };
    if a.concurrent.is_some() && a.interleave.is_none() {
        anyhow::bail!("--concurrent needs --interleave (a Table 2 cell)");
    }
    let plan = preheat_affinity_ctl::topology::plan(None, a.cpu, &[2, 10, 200])?;
    let dir = preheat_affinity_ctl::scratch()?;
    let spec = RunSpec {
        experiment: exp,
        main,
        quantum_ms: a.quantum_ms,
        cpu: a.cpu,
        cpu_ms: a.cpu_ms,
        preheat: a.preheat,
        ws_bytes: a.ws_bytes,
        scratch: PathBuf::from(dir.path()),
        vector_in_process: a.vector_in_process,
        worker: WorkerCmd::this_binary()?,
    };
    let r = run::execute(&plan, &spec)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        print_human(&r);
    }
    Ok(())
}

fn print_human(r: &RunResult) {
    println!(
        "{} {} ({}{}): {:.4e} {} — measured, {:.3} s CPU, {:.2} s wall",
        r.experiment,
        r.workload,
        r.workload_kind,
        if r.stands_for.is_empty() {
            String::new()
        } else {
            format!(", stands for {}", r.stands_for)
        },
        r.rate,
        r.metric,
        r.cpu_s,
        r.wall_s
    );
    let c = &r.cell;
    if let Some(v) = &c.interleaved {
        println!(
            "  interleaved with {v} every {} ms{}; affinity {}, retention {}",
            c.quantum_ms,
            c.concurrent.as_ref().map_or(String::new(), |x| format!(
                ", {x} concurrent on CPU {}",
                c.concurrent_cpu.unwrap_or(0)
            )),
            c.affinity.as_deref().unwrap_or("?"),
            c.retention.as_deref().unwrap_or("?")
        );
    }
    if let Some(i) = &c.interfering {
        println!(
            "  {} copies, interfering {i}, affinity {}",
            r.copies.len(),
            c.affinity.as_deref().unwrap_or("?")
        );
        for (k, cp) in r.copies.iter().enumerate() {
            println!("    copy {k}: {:.4e} ({:.3} s CPU)", cp.rate, cp.cpu_s);
        }
    }
    if c.preheat {
        println!(
            "  preheat: {} loads, {:.1} ms CPU ({:.2}% of the workload's); rate with that cost: {:.4e}",
            r.preheats,
            r.preheat_cpu_s * 1e3,
            100.0 * r.preheat_cpu_s / r.cpu_s.max(1e-9),
            r.rate_with_preheat_cost.unwrap_or(f64::NAN)
        );
    }
    let q = &r.quanta;
    let show = |what: &str, x: &Option<run::Quanta>| {
        if let Some(x) = x {
            println!(
                "  {what} quanta: p50 {:.3} ms, p99 {:.3} ms over {} (requested {} ms, {})",
                x.p50_ms, x.p99_ms, x.n, q.requested_ms, q.mechanism
            );
        }
    };
    show("main", &q.main);
    show("vector", &q.vector);
    if !r.refill.is_empty() {
        let s: Vec<String> = r
            .refill
            .iter()
            .map(|b| format!("{} {:.2}", run::bin_label(b.from_us, b.to_us), b.rate_rel))
            .collect();
        println!(
            "  refill (rate relative to later in the quantum): {}",
            s.join(", ")
        );
    }
    for n in &r.notes {
        println!("  note: {n}");
    }
}
