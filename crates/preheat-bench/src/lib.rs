//! The preheating path's speed benchmarks, as ratios against baselines measured in the same run
//! (`preheat bench preheat|agent` parse the arguments and print the results):
//!
//! * [`throughput`] — preheat throughput (GB/s of lines made cache-resident) against a plain
//!   load loop and the machine's scattered-line limit; two cores against one.
//! * [`agent`] — the agent's overhead on warm requests, servers with and without it alternating
//!   in blocks.
//! * [`observe`] — the outside observer's overhead on warm requests (`preheat-observe`), the
//!   same method with the observer attached to one server instead of the agent.
//!
//! The other benchmarks live beside what they measure (`preheat-comm`, `preheat-cosched-run`,
//! `preheat-affinity-ctl`, …). `observe` reuses `agent`'s servers and blocks. No `unsafe` (the engine's
//! primitives); servers are started through `preheat-launch`. Prints nothing; progress through
//! a `preheat_launch::progress::Progress`.

pub mod agent;
pub mod observe;
mod pairs;
pub mod throughput;
