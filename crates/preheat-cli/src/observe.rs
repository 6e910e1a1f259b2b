//! `preheat observe`: busy periods of a running server from outside (`preheat-observe`), per
//! thread and attributed to the listening port, printed as a table or JSON.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use preheat_observe::{Kind, Mechanism, Options, Report};

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum MechanismArg {
    /// Events per CPU for every task, filtered in the kernel on the process's threads (the
    /// default: measured cheapest).
    SystemWide,
    /// Events per thread and CPU, inherited by new threads (costs the thread at every switch).
    PerThread,
}

impl From<MechanismArg> for Mechanism {
    fn from(m: MechanismArg) -> Mechanism {
        match m {
            MechanismArg::PerThread => Mechanism::PerThread,
            MechanismArg::SystemWide => Mechanism::SystemWide,
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
    #[arg(long, value_enum, default_value = "system-wide")]
    pub mechanism: MechanismArg,
    /// Print every busy period too (text output).
    #[arg(long)]
    pub periods: bool,
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
    let secs = Duration::from_secs_f64(a.seconds.max(0.0));
    let r = preheat_observe::observe(opts, secs, &|| stop.load(Ordering::Relaxed))?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        print(&r, a.periods);
    }
    Ok(())
}

fn print(r: &Report, periods: bool) {
    println!(
        "busy periods of process {} on port {} [measured, from outside: {}; {:.2} s, {} threads attached]",
        r.pid,
        r.port,
        r.mechanism_detail,
        (r.end_ns - r.start_ns) as f64 / 1e9,
        r.threads_attached
    );
    if r.tracefs_mounted_now {
        println!("  (tracefs was not mounted: mounted it at /sys/kernel/tracing)");
    }
    println!(
        "  {} syscall events, {} lost samples, {} candidate periods without the port, {} open at the end",
        r.counts.events, r.lost_samples, r.counts.unattributed, r.counts.open_at_end
    );
    if r.threads.is_empty() {
        println!("  no busy period on the port (no request arrived?)");
    }
    println!(
        "  {:>8} {:<16} {:>7} {:>6} {:>8} {:>6} {:>6} {:>10} {:>10} {:>10}  hand-offs from",
        "tid", "thread", "periods", "read", "hand-off", "reply", "accept", "p50 µs", "p99 µs", "max µs"
    );
    for t in &r.threads {
        let from: Vec<String> = t.hand_off_from.iter().map(u32::to_string).collect();
        println!(
            "  {:>8} {:<16} {:>7} {:>6} {:>8} {:>6} {:>6} {:>10.1} {:>10.1} {:>10.1}  {}",
            t.tid,
            if t.comm.is_empty() { "(exited)" } else { &t.comm },
            t.periods,
            t.read,
            t.hand_off,
            t.reply,
            t.accept,
            t.duration_us.p50,
            t.duration_us.p99,
            t.duration_us.max,
            if from.is_empty() { "-".into() } else { from.join(",") }
        );
    }
    if periods {
        println!("  {:>8} {:>14} {:>10}  kind", "tid", "start (s)", "µs");
        for p in &r.periods {
            let kind = match p.kind {
                Kind::Read => "read".to_string(),
                Kind::HandOff { from } => format!("hand-off from {from}"),
                Kind::Reply => "reply".into(),
                Kind::Accept => "accept".into(),
            };
            println!(
                "  {:>8} {:>14.6} {:>10.1}  {kind}",
                p.tid,
                p.start_ns.saturating_sub(r.start_ns) as f64 / 1e9,
                (p.end_ns - p.start_ns) as f64 / 1e3
            );
        }
    }
}
