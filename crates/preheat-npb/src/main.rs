//! `preheat-npb KERNEL [options]`: run an NPB-style kernel (`mg`, `cg`, `is`, `ep`) whose
//! sharing pattern is known by construction; see the library documentation.
//!
//! stdout: one line `READY {"pid":P,"threads":[{"index":j,"tid":T,"name":"…","instance":i,
//! "rank":r},…]}` as soon as every thread exists (before `--start-delay-ms`), with
//! `--progress-ms N` a line `PROGRESS {"t_ms":T,"phases":[…]}` every N ms of the run (barrier
//! phases completed per instance since the start), then at the end
//! the summary: with `--json` only the JSON line, otherwise three human lines followed by the
//! same JSON line (always the last line). Exit status 0 on success, 2 on bad options, 1 if
//! the run fails.
#![forbid(unsafe_code)]

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use preheat_npb::kernels::{DEFAULT_ITERATIONS, DEFAULT_WORK};
use preheat_npb::{Config, Kernel, Limit, Summary};

/// Run an NPB-style multi-threaded kernel with a known page-sharing pattern.
#[derive(Debug, Parser)]
#[command(name = "preheat-npb", version)]
struct Args {
    /// Kernel: mg (ring of halo exchanges), cg (sparse random exchanges), is (all-to-all),
    /// ep (no sharing).
    #[arg(value_enum)]
    kernel: Kernel,
    /// Total threads.
    #[arg(long, default_value_t = 4)]
    threads: usize,
    /// Independent instances ("VMs"); must divide --threads. Instance i owns threads
    /// i*N/K .. (i+1)*N/K-1.
    #[arg(long, default_value_t = 1)]
    instances: usize,
    /// Iterations to run [default: 8000, about 2.5 s per thread with its own core].
    #[arg(long, conflicts_with = "seconds")]
    iterations: Option<u64>,
    /// Run for this many seconds instead (all ranks of an instance stop at the same iteration).
    #[arg(long)]
    seconds: Option<f64>,
    /// Compute units per iteration (one unit is about 1 µs).
    #[arg(long, default_value_t = DEFAULT_WORK)]
    work: u32,
    /// Extra pages each communicating pair shares beyond its mailbox page: with every exchange
    /// each thread of the pair writes one line of its own on each and reads its partner's
    /// (grows the shared working set a page-level detector must find; the truth counts them).
    #[arg(long, default_value_t = 0)]
    shared_pages: usize,
    /// Seed of the data and of the cg pattern.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Pin thread j to CPU j mod (online CPUs).
    #[arg(long)]
    pin: bool,
    /// Sleep this long after READY before the first iteration.
    #[arg(long, default_value_t = 0)]
    start_delay_ms: u64,
    /// Every this many milliseconds of the run, print `PROGRESS {"t_ms":…,"phases":[…]}`: the
    /// barrier phases each instance has completed since the start.
    #[arg(long)]
    progress_ms: Option<u64>,
    /// Print only JSON (READY line, then the summary line).
    #[arg(long)]
    json: bool,
}

fn config(a: &Args) -> Result<Config, String> {
    let limit = match (a.iterations, a.seconds) {
        (_, Some(s)) => Limit::Seconds(
            Duration::try_from_secs_f64(s)
                .map_err(|_| format!("--seconds must be a positive number, got {s}"))?,
        ),
        (n, None) => Limit::Iterations(n.unwrap_or(DEFAULT_ITERATIONS)),
    };
    let c = Config {
        kernel: a.kernel,
        threads: a.threads,
        instances: a.instances,
        limit,
        work: a.work,
        shared_pages: a.shared_pages,
        seed: a.seed,
        pin: a.pin,
        start_delay: Duration::from_millis(a.start_delay_ms),
        trace_pages: false,
        progress: a.progress_ms.map(Duration::from_millis),
    };
    c.validate()?;
    Ok(c)
}

/// `TAG {json}` on stdout, flushed. A closed stdout must not stop the run; the summary write at
/// the end reports it.
fn print_line(tag: &str, value: &impl serde::Serialize) {
    let line = serde_json::to_string(value).expect("a report serialises");
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{tag} {line}");
    let _ = out.flush();
}

fn main() -> ExitCode {
    let args = Args::parse();
    let config = match config(&args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("preheat-npb: error: {e}");
            return ExitCode::from(2);
        }
    };
    let outcome = preheat_npb::run_observed(
        &config,
        |ready| print_line("READY", ready),
        |progress| print_line("PROGRESS", progress),
    );
    let outcome = match outcome {
        Ok(o) => o,
        Err(e) => {
            eprintln!("preheat-npb: error: {e:#}");
            return ExitCode::from(1);
        }
    };
    for t in &outcome.threads {
        if let Some(e) = &t.pin_error {
            eprintln!("preheat-npb: warning: {e}");
        }
    }
    let summary = Summary::new(&outcome);
    let json = serde_json::to_string(&summary).expect("summary serialises");
    let mut out = std::io::stdout().lock();
    let written = if args.json {
        writeln!(out, "{json}")
    } else {
        writeln!(out, "{}\n{json}", summary.human())
    };
    if written.and_then(|()| out.flush()).is_err() {
        return ExitCode::from(1);
    }
    ExitCode::SUCCESS
}
