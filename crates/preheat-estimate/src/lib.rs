//! Working-set estimation (paper §3.1): record the cache lines a server's request touches with
//! one of several backends, keep the stable ones (k of n), and write them as a `.phws` profile.
//!
//! Modules, each using only those listed before it (no import cycle):
//! * [`params`] – what an estimation is asked for and reports (backend, parameters, statistics);
//! * [`profile`] – reading and atomically writing working-set files, building a profile;
//! * [`compare`] – precision and recall against a ground truth, and which file lines are code
//!   ([`compare::CodeLines`], shared with the hybrid merge);
//! * [`show`] – what a working-set file contains;
//! * [`serving`] – which agent serves a connection, connections a given agent's process serves;
//! * [`record`] – the `probe` backend (flush and reload through the agent);
//! * [`exact`] – the `trace` and `step` backends, the probe's ground truth;
//! * [`hybrid`] – step's code lines and the probe's data lines, merged;
//! * [`session`] – one estimation from start to profile (`preheat record`);
//! * [`report`] – what `preheat record` prints about a recording.
//!
//! Progress goes through [`preheat_launch::progress::Progress`]; nothing here draws.

pub mod compare;
pub mod exact;
pub mod hybrid;
pub mod layout;
pub mod params;
pub mod profile;
pub mod record;
pub mod report;
pub mod serving;
pub mod session;
pub mod show;

pub use params::{BackendChoice, HybridStats, RecordParams, RecordStats, Recording};
pub use profile::{check_destination, read_profile, write_profile};
