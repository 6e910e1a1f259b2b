//! `preheat observe`: busy periods of a running server from outside (`preheat-observe`), per
//! thread and attributed to the listening port, printed as a table or JSON.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use preheat_observe::{Mechanism, Options};

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum MechanismArg {
    /// eBPF programs that keep the process's busy periods and write them into a BPF ring
    /// buffer: on the scheduler's and socket tracepoints where the kernel loads them, else on
    /// the syscall tracepoints (the default; falls back to system-wide, and says so, where the
    /// kernel refuses them).
    Bpf,
    /// perf samples per CPU for every task, filtered in the kernel on the process's threads.
    SystemWide,
    /// Events per thread and CPU, inherited by new threads (switched with the thread).
    PerThread,
}

impl From<MechanismArg> for Mechanism {
    fn from(m: MechanismArg) -> Mechanism {
        match m {
            MechanismArg::PerThread => Mechanism::PerThread,
            MechanismArg::SystemWide => Mechanism::SystemWide,
            MechanismArg::Bpf => Mechanism::Bpf,
        }
    }
}

#[derive(clap::Args, Debug)]
pub struct ObserveArgs {
    /// The server's process id.
    #[arg(long)]
    pub pid: u32,
    /// Its listening TCP port.
    #[arg(long)]
    pub port: u16,
    /// How long to observe (Ctrl-C ends early and still reports).
    #[arg(long, default_value_t = 10.0)]
    pub seconds: f64,
    #[arg(long, value_enum, default_value = "bpf")]
    pub mechanism: MechanismArg,
    /// Print every busy period too (text output).
    #[arg(long)]
    pub periods: bool,
    /// Write a stamped record of every traced call instead of one per busy period, so that
    /// each period's first read and first write are timed (eBPF; about three times the cost
    /// per request: `preheat bench observe`).
    #[arg(long)]
    pub per_call: bool,
    /// The eBPF programs on the syscall tracepoints instead of the scheduler's and socket
    /// tracepoints: periods bounded by the server's wait calls (accepts seen too), at about
    /// twice the cost (while attached, every system call of the machine takes the tracepoint
    /// path: `preheat bench observe --toggle`).
    #[arg(long)]
    pub syscalls: bool,
    /// Sample under sustained load, as the outside preheater does: the programs detached for
    /// 450 ms each time the server makes more than 10 000 periods a second (what they cost a
    /// busy machine is mostly their dispatch on every event), so that a busy server is seen
    /// about a tenth of the time and an idle one throughout; the report says how much was
    /// missed.
    #[arg(long)]
    pub sample: bool,
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: ObserveArgs) -> Result<()> {
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone())?;
    }
    let mut opts = Options::new(a.pid, a.port);
    opts.mechanism = a.mechanism.into();
    opts.per_call = a.per_call;
    opts.syscalls = a.syscalls;
    opts.sampling = a.sample.then(preheat_observe::sampling::Sampling::default);
    let secs = Duration::from_secs_f64(a.seconds.max(0.0));
    let r = preheat_observe::observe(opts, secs, &|| stop.load(Ordering::Relaxed))?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        print!("{}", preheat_observe::render::text(&r, a.periods));
    }
    Ok(())
}
