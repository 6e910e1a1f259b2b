//! The preheating path's speed benchmarks, as ratios against baselines measured in the same run
//! (`preheat bench preheat|agent` parse the arguments and print the results):
//!
//! * [`throughput`] — preheat throughput (GB/s of lines made cache-resident) against a plain
//!   load loop and the machine's scattered-line limit; two cores against one.
//! * [`agent`] — the agent's overhead on warm requests, servers with and without it alternating
//!   in blocks.
//!
//! The other benchmarks live beside what they measure (`preheat-comm`, `preheat-cosched-run`,
//! `preheat-affinity-ctl`, …). The two modules are independent. No `unsafe` (the engine's
//! primitives); servers are started through `preheat-launch`. Prints nothing; progress through
//! a `preheat_launch::progress::Progress`.

pub mod agent;
pub mod throughput;
