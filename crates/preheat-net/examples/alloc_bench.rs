//! Allocator throughput on one core: `cargo run --release -p preheat-net --example alloc_bench`.
//!
//! For 16, 256 and 4096 endpoints, random demands (source ≠ destination, uniform; 1–4
//! packets) keep about two pending demands per endpoint while the allocator fills windows of
//! 32 slots back to back. Prints allocations (runs of slots, i.e. Allocation messages),
//! packets (slots) and demands completed per second, measured, single-threaded, and each as a
//! ratio to the 16-endpoint case of the same run, and "× real time": seconds of schedule
//! (10 Gb/s, 1500 B slots of 1231 ns) computed per second of CPU; below 1 one core cannot keep
//! a fully loaded network of that size scheduled. Optional argument: seconds per case
//! (default 1).

use preheat_net::alloc::Allocator;
use preheat_net::wire::Demand;
use rand::{Rng, SeedableRng};
use std::time::{Duration, Instant};

const WINDOW: usize = 32;
const SLOT_NS: u32 = 1231;

struct Result {
    endpoints: u32,
    runs_per_s: f64,
    packets_per_s: f64,
    demands_per_s: f64,
    calls_per_s: f64,
    pending: f64,
}

fn bench(endpoints: u32, secs: f64) -> Result {
    let mut rng = rand::rngs::StdRng::seed_from_u64(u64::from(endpoints));
    // Pre-generated demands so the RNG is not measured.
    let pool: Vec<(u32, Demand)> = (0..1 << 20)
        .map(|i| {
            let src = rng.gen_range(0..endpoints);
            let mut dst = rng.gen_range(0..endpoints - 1);
            if dst >= src {
                dst += 1;
            }
            let d = Demand {
                dst: 0x0a00_0000 | dst,
                dst_port: 11211,
                packets: rng.gen_range(1..=4),
                flow: i,
            };
            (0x0a00_0000 | src, d)
        })
        .collect();
    let target = 2 * endpoints as usize;
    let mut a = Allocator::new(SLOT_NS);
    let mut next = 0usize;
    let (mut runs, mut packets, mut calls, mut pending_sum) = (0u64, 0u64, 0u64, 0u64);
    let mut done_demands = 0u64;
    let mut added = 0u64;
    let deadline = Duration::from_secs_f64(secs);
    let t = Instant::now();
    let mut first = 0u64;
    while t.elapsed() < deadline {
        for _ in 0..64 {
            while a.pending_demands() < target {
                let (s, d) = pool[next];
                next = (next + 1) % pool.len();
                a.add(s, d);
                added += 1;
            }
            pending_sum += a.pending_demands() as u64;
            let out = a.allocate(first, WINDOW);
            first = a.horizon_ns();
            runs += out.len() as u64;
            packets += out.iter().map(|r| u64::from(r.3)).sum::<u64>();
            calls += 1;
        }
        done_demands = added - a.pending_demands() as u64;
    }
    let s = t.elapsed().as_secs_f64();
    Result {
        endpoints,
        runs_per_s: runs as f64 / s,
        packets_per_s: packets as f64 / s,
        demands_per_s: done_demands as f64 / s,
        calls_per_s: calls as f64 / s,
        pending: pending_sum as f64 / calls as f64,
    }
}

fn main() {
    let secs: f64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(1.0);
    println!(
        "alloc_bench (measured, 1 thread, {secs} s per case, window {WINDOW} slots, ~2 pending demands per endpoint)"
    );
    println!(
        "{:>9} {:>14} {:>8} {:>14} {:>8} {:>14} {:>12} {:>9} {:>11}",
        "endpoints",
        "allocations/s",
        "ratio",
        "packets/s",
        "ratio",
        "demands/s",
        "windows/s",
        "pending",
        "× real time"
    );
    let results: Vec<Result> = [16, 256, 4096]
        .into_iter()
        .map(|n| bench(n, secs))
        .collect();
    let base = &results[0];
    for r in &results {
        println!(
            "{:>9} {:>14.0} {:>8.3} {:>14.0} {:>8.3} {:>14.0} {:>12.0} {:>9.0} {:>11.3}",
            r.endpoints,
            r.runs_per_s,
            r.runs_per_s / base.runs_per_s,
            r.packets_per_s,
            r.packets_per_s / base.packets_per_s,
            r.demands_per_s,
            r.calls_per_s,
            r.pending,
            r.calls_per_s * (WINDOW as f64) * f64::from(SLOT_NS) * 1e-9,
        );
    }
}
