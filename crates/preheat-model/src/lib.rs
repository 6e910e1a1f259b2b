//! Pure data model of preheat.
//!
//! This crate implements the data side of the working-set estimation and preheating of
//! Gottschlag & Bellosa, *Reducing Response Time with Preheated Caches* (§3.1, §3.3):
//!
//! * [`addr`]: strong address types. A line is always named either by an absolute virtual
//!   address ([`addr::VirtAddr`]) or relative to a memory region ([`addr::RegionLine`]); the two
//!   never mix silently.
//! * [`region`]: regions a profile is relative to (file-backed mappings by path + build-id/inode,
//!   anonymous ones by kind and order), so a profile survives ASLR and restarts.
//! * [`ws`]: line sets, address sorting and run-length encoding with an optional gap merge.
//! * [`vote`]: the paper's k-of-n sample filter ("only those memory locations which have been
//!   repeatedly accessed", 8 samples in the paper), our noise removal, and the model and test
//!   of what it keeps by chance.
//! * [`profile`] and [`mod@format`]: the versioned, checksummed `.phws` file.
//! * [`resolve`]: turning a profile back into absolute, prioritised runs for a live process.
//! * [`proto`]: the agent's control messages and the announcement ("trigger") datagram.
//! * [`comm`]: communication detection (SPCD) configuration and reports.
//! * [`stats`]: order statistics with confidence intervals, shared by every report.
//! * [`auto`]: the `auto` strategy's choice from a pilot, and the judgement (per-round gain over
//!   announcing nothing) behind every "this strategy hurts" flag.
//!
//! Invariants: no I/O, no `unsafe`, no global state. Everything here is deterministic and can be
//! property-tested and fuzzed.
#![forbid(unsafe_code)]

pub mod addr;
pub mod auto;
pub mod comm;
pub mod format;
pub mod procstat;
pub mod profile;
pub mod proto;
pub mod region;
pub mod resolve;
pub mod stats;
pub mod varint;
pub mod vote;
pub mod ws;

pub use addr::{RegionLine, VirtAddr, LINE_SIZE};
pub use format::{decode_profile, encode_profile, FormatError};
pub use profile::{Backend, BinaryIdent, FilterParams, Profile, RequestClass};
pub use region::{AnonKind, FileIdent, Mapping, RegionKey, RegionTable};
pub use resolve::{resolve_class, AbsRun, ResolveError, Resolved};
pub use vote::{
    chance_kept, enriched_at, enrichment_p, enrichment_ps, fdr_level, filter_k_of_n, keep_enriched,
    remove_noise,
};
pub use ws::{encode_runs, LineSet, Run, WorkingSet, WsStats};
