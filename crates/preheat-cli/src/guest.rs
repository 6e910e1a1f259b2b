//! `preheat guest`: real virtual machines (QEMU, TCG) for the coscheduling experiments. The
//! image, QEMU and the console live in `preheat-guest`; this parses arguments and prints.

use std::time::Duration;

use anyhow::{bail, Result};
use clap::{Args, Subcommand};
use preheat_guest::{comm, journal, session, GuestSpec, ImageSpec, Workload};

#[derive(Args)]
pub struct GuestArgs {
    #[command(subcommand)]
    cmd: GuestCmd,
}

#[derive(Subcommand)]
enum GuestCmd {
    /// Build the guest image (or find it in the cache) and print what it is made of.
    Build {
        #[command(flatten)]
        image: ImageArgs,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Boot a guest, run an NPB-style kernel in it and print its progress; the guest powers off
    /// when the kernel ends (with --idle: runs until Ctrl-C).
    Run(RunArgs),
    /// Host-side communication detection: 2-vCPU guests run KERNEL as one instance of two
    /// threads (single) and two of one (double); prints the vCPU matrix against the truth.
    Comm(CommArgs),
    /// Stop guests whose command was killed outright, and forget them.
    Cleanup,
}

#[derive(Args)]
struct CommArgs {
    #[arg(long, default_value = "mg")]
    kernel: String,
    /// single, double or both.
    #[arg(long, default_value = "both")]
    scenario: String,
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Sampling seconds per run (after a 1 s warm-up).
    #[arg(long, default_value_t = 5.0)]
    window_s: f64,
    /// Fields of the detection's configuration to change, as JSON (`{"period_ms": 20}`).
    #[arg(long)]
    comm_config: Option<String>,
    /// Extra 4 KiB pages each communicating pair shares (`preheat-npb --shared-pages`).
    #[arg(long, default_value_t = 0)]
    shared_pages: usize,
}

#[derive(Args)]
struct ImageArgs {
    /// The kernel package [default: the one linux-image-amd64 depends on].
    #[arg(long)]
    kernel_package: Option<String>,
}

#[derive(Args)]
struct RunArgs {
    #[command(flatten)]
    image: ImageArgs,
    /// QEMU's name for the guest.
    #[arg(long, default_value = "vm1")]
    name: String,
    /// Virtual CPUs.
    #[arg(long, default_value_t = 2)]
    vcpus: u32,
    /// Guest memory, MiB.
    #[arg(long, default_value_t = 256)]
    memory_mb: u32,
    /// The kernel to run inside: mg, cg, is or ep (ep has no barriers: no phases).
    #[arg(long, default_value = "mg")]
    kernel: String,
    /// Its threads [default: --vcpus].
    #[arg(long)]
    threads: Option<usize>,
    /// Independent instances of it (dividing the threads; 2: the paper's "double").
    #[arg(long, default_value_t = 1)]
    instances: usize,
    /// How long it runs, seconds of guest time.
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    /// Boot and wait (no kernel) until Ctrl-C or SIGTERM.
    #[arg(long, conflicts_with_all = ["kernel", "threads", "seconds", "instances"])]
    idle: bool,
    /// Give up when user space is not up within this many seconds.
    #[arg(long, default_value_t = 120)]
    boot_timeout_s: u64,
    /// Print one JSON object at the end instead of text.
    #[arg(long)]
    json: bool,
}

pub fn run(a: GuestArgs) -> Result<()> {
    match a.cmd {
        GuestCmd::Build { image, json } => build(image, json),
        GuestCmd::Run(r) => run_guest(r),
        GuestCmd::Comm(c) => {
            let k = &c.kernel;
            let each = |r: &comm::Run| eprintln!("{k} {}: events {}", r.scenario.name(), r.cross);
            let cmp = comm::Comparison {
                kernel: k,
                scenarios: &c.scenario,
                runs: c.runs,
                window_s: c.window_s,
                overrides: c.comm_config.as_deref(),
                shared_pages: c.shared_pages,
            };
            let (s, d) = comm::compare(&cmp, each)?;
            print!("{}", comm::render(k, &s, &d));
            Ok(())
        }
        GuestCmd::Cleanup => {
            print!("{}", journal::cleanup());
            Ok(())
        }
    }
}

fn image_spec(a: ImageArgs) -> ImageSpec {
    ImageSpec {
        kernel_package: a.kernel_package,
        npb: None,
    }
}

fn build(a: ImageArgs, json: bool) -> Result<()> {
    let t0 = std::time::Instant::now();
    let image = preheat_guest::ensure_image(&image_spec(a))?;
    if json {
        println!("{}", serde_json::to_string(&image)?);
        return Ok(());
    }
    print!("{}", image.render(t0.elapsed()));
    Ok(())
}

fn run_guest(a: RunArgs) -> Result<()> {
    // Before a build that may take a minute: what is missing is said at once.
    preheat_guest::qemu::find_qemu()?;
    let image = preheat_guest::ensure_image(&image_spec(a.image))?;
    let mut spec = GuestSpec::new(&a.name, a.vcpus);
    spec.memory_mb = a.memory_mb;
    if !a.idle {
        let threads = a.threads.unwrap_or(a.vcpus as usize);
        spec.workload = Some(Workload::npb(&a.kernel, threads, a.seconds).instances(a.instances));
    }
    let (mut guest, mut r) = session::boot(&image, &spec, Duration::from_secs(a.boot_timeout_s))?;
    if !a.json {
        print!("{}", session::render_up(&r));
    }
    if a.idle {
        println!("guest {} idles; Ctrl-C stops it", a.name);
        while guest.wait_exit(Duration::from_secs(3600))?.is_none() {}
        bail!("guest {} stopped on its own", a.name);
    }
    let budget = Duration::from_secs_f64(a.seconds * 4.0 + 60.0);
    session::follow(&mut guest, &mut r, budget, |row, rates| {
        if !a.json {
            println!("{}", session::render_row(row, rates.as_deref()));
        }
    })?;
    if a.json {
        println!("{}", serde_json::to_string(&r)?);
    } else {
        print!("{}", session::render_end(&r));
    }
    Ok(())
}
