//! `preheat arbiter`: the central arbiter of a Fastpass-like network (paper §3.2), extended to
//! announce every allocated packet to its receiver's preheatd, `--lead-us` ahead.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::{Context, Result};
use preheat_net::arbiter::{Arbiter, ArbiterConfig};
use preheat_net::wire::Key;

#[derive(clap::Args, Debug)]
pub struct ArbiterArgs {
    /// UDP address to listen on.
    #[arg(long, default_value = "0.0.0.0:7710")]
    pub listen: SocketAddr,
    /// Pre-shared key (64 hex digits or 32 raw bytes).
    #[arg(long)]
    pub key_file: PathBuf,
    /// How far ahead the first allocated slot starts, µs (Fastpass: ~65 µs).
    #[arg(long, default_value_t = 65)]
    pub lead_us: u64,
    /// Link speed, Gb/s (with --mtu, gives the timeslot length).
    #[arg(long, default_value_t = 10.0)]
    pub link_gbps: f64,
    /// Frame size, bytes.
    #[arg(long, default_value_t = 1500)]
    pub mtu: u32,
    /// UDP port of the receivers' preheatd.
    #[arg(long, default_value_t = preheat_net::wire::DEFAULT_PREHEATD_PORT)]
    pub preheatd_port: u16,
    /// Added to each slot start when announcing the arrival (one-way link latency), µs.
    #[arg(long, default_value_t = 0)]
    pub link_latency_us: u64,
    /// Print statistics every this many seconds (0: only at exit).
    #[arg(long, default_value_t = 0)]
    pub stats_every_s: u64,
}

pub fn run(a: ArbiterArgs) -> Result<()> {
    let key = Key::from_file(&a.key_file)
        .map_err(|e| anyhow::anyhow!("{}: {e}", a.key_file.display()))?;
    let mut cfg = ArbiterConfig::new(a.listen, key);
    cfg.lead_ns = a.lead_us * 1000;
    cfg.slot_ns = preheat_net::alloc::slot_ns((a.link_gbps * 1e9) as u64, a.mtu);
    cfg.preheatd_port = a.preheatd_port;
    let slot = cfg.slot_ns;
    let mut arb =
        Arbiter::bind(cfg).with_context(|| format!("binding the arbiter to {}", a.listen))?;
    arb.set_link_latency_ns(a.link_latency_us * 1000);
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone()).context("installing signal handlers")?;
    }
    eprintln!(
        "preheat arbiter on {} (slot {} ns for {} B at {} Gb/s; lead {} µs; announcing to preheatd port {})",
        arb.local_addr()?,
        slot,
        a.mtu,
        a.link_gbps,
        a.lead_us,
        a.preheatd_port
    );
    if a.stats_every_s > 0 {
        let stop2 = stop.clone();
        let every = a.stats_every_s;
        // Run in slices so statistics can be printed between them.
        let slice = Arc::new(AtomicBool::new(false));
        loop {
            let s2 = slice.clone();
            let t = std::thread::spawn(move || {
                std::thread::sleep(std::time::Duration::from_secs(every));
                s2.store(true, Ordering::SeqCst);
            });
            arb.run_until(&slice)?;
            let _ = t.join();
            slice.store(false, Ordering::SeqCst);
            eprintln!("arbiter: {:?}", arb.stats());
            if stop2.load(Ordering::SeqCst) {
                break;
            }
        }
    } else {
        arb.run_until(&stop)?;
    }
    eprintln!("arbiter: {:?}", arb.stats());
    Ok(())
}
