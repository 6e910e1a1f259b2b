//! `preheat demo`'s machinery as a library: the paper's Table 1 in miniature on any server.
//! * [`run`] – the pipeline: start the server with the agent, estimate its working set, pilot
//!   `auto`, measure interleaved rounds of every mode, compute the table ([`Output`]);
//! * [`render`] – the table as text; [`DemoParams`] – what a run is asked for;
//! * [`hot`] – the hot floor: every CPU kept out of idle while a warm request is served;
//! * [`read_saved_choice`] – a demo's `auto` choice read back from its `--out` JSON;
//! * `steer` – where the loopback's receive processing runs (`--steer-rx`), chosen by a pilot;
//! * `outside` – the agent inside the server or, where it cannot load, outside it (`--agent`);
//! * `sysstages` – the response time split at the server's system calls (`--syscall-stages`);
//! * [`run_server`] – `preheat run`: a server kept running with its agent inside or outside it.
//!
//! Modules in one direction: `hot custom params mode sysstages` ← `join outside` ← `measure table` ←
//! `pilot steer connection` ← `run` ← `render`; `saved` ← `runner` (with `outside`).

mod connection;
mod custom;
pub mod hot;
mod join;
mod measure;
mod mode;
mod output;
mod outside;
mod params;
mod pilot;
mod render;
mod run;
mod runner;
mod saved;
mod steer;
mod sweeper;
mod sysstages;
mod table;
mod warmth;

pub use connection::ConnectionState;
pub use custom::CustomProtocol;
pub use mode::Sample;
pub use output::{Output, Skipped};
pub use params::{AgentPlace, DemoParams};
pub use render::render;
pub use run::run;
pub use runner::{run_server, RunServer, Running};
pub use saved::{parse_saved_choice, read_saved_choice, SavedChoice};
pub use steer::{SteerChoice, SteerRx};
pub use table::{Decomposition, FloorCheck, Residual, Row, SysRow};
