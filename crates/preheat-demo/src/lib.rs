//! `preheat demo`'s machinery as a library: the paper's Table 1 in miniature on any server.
//! * [`run`] – the pipeline: start the server with the agent, estimate its working set, pilot
//!   `auto`, measure interleaved rounds of every mode, compute the table ([`Output`]);
//! * [`render`] – the table as text; [`DemoParams`] – what a run is asked for;
//! * [`hot`] – the hot floor: every CPU kept out of idle while a warm request is served;
//! * [`read_saved_choice`] – a demo's `auto` choice read back from its `--out` JSON.
//!
//! Modules in one direction: `hot custom params mode` ← `join` ← `measure table` ← `pilot` ← `run` ←
//! `render`; `saved` stands alone.

mod custom;
pub mod hot;
mod join;
mod measure;
mod mode;
mod params;
mod pilot;
mod render;
mod run;
mod saved;
mod table;

pub use custom::CustomProtocol;
pub use mode::Sample;
pub use params::DemoParams;
pub use render::render;
pub use run::{run, Output, Skipped};
pub use saved::{parse_saved_choice, read_saved_choice, SavedChoice};
pub use table::{Decomposition, FloorCheck, Row};
