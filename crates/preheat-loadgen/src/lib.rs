//! `preheat load`'s driver: a load generator that can announce what it sends, on top of the
//! engine in [`preheat_lab::load`] (open loop with Poisson arrivals, idle gap, closed loop; one
//! client thread per connection, or threads that each multiplex several, or an event loop that
//! waits in `epoll_wait`; latency from the *intended* send time, so a slow reply, a late send or
//! a wait for a slot is never hidden: no coordinated omission).
//!
//! Announcing (paper §3.2), `announce.rs`:
//! * through the arbiter of the centrally arbitrated network: each request is a demand to the
//!   arbiter; the request is sent at the allocated slot, and the arbiter announces it to the
//!   receiver's preheatd. If the arbiter does not answer in time the request goes out
//!   unscheduled (fail-open) and is counted as such. One sender per connection.
//! * locally, through the trigger API to every agent in the run dir (same host), `lead_us`
//!   ahead, then sent at the announced time. One announcer per connection.
//!
//! `observe.rs`: the agents asked, after each reply, when the server thread started on it.
//! Modules in one direction: `params observe` ← `announce` ← `generate`.

mod announce;
mod generate;
mod observe;
mod params;

pub use generate::{generate, LoadReport};
pub use params::LoadParams;
