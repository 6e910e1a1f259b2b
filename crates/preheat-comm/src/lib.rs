//! Communication detection (SPCD in user space, partial-coscheduling paper §2.2) driven from
//! outside the program: the agent does the sampling (`preheat-agent`'s `comm`, whose
//! configuration and report are `preheat_model::comm`); this crate starts it and reads it.
//! `preheat comm` and `preheat bench comm` parse the arguments and print.
//!
//! * [`session`] — a program started under the agent with detection on from its first
//!   instruction and followed until it exits ([`session::follow`]), or a running process that has
//!   the agent sampled for a while ([`session::attach`]); the matrix reset after start-up as the
//!   paper does; every report polled goes to the caller's closure.
//! * [`report`] — a report's sub-matrix of some threads, its thread labels.
//! * [`bench`](mod@bench) — what detection costs and how soon it finds the truth on the bundled
//!   NPB-style kernels.
//!
//! Modules in one direction: `report session` ← `bench`. No `unsafe`; processes are started
//! and stopped through `preheat-launch`. Draws no progress (the caller's closures); prints only
//! the one-line notes of the bench's runs on stderr.

pub mod bench;
pub mod report;
pub mod session;
