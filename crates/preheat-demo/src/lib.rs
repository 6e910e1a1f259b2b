//! `preheat demo`'s machinery as a library (the runner, its pilot and table still live in the
//! CLI's `demo/` and are to move here):
//! * [`hot`] – the hot floor: every CPU kept out of idle while a warm request is served.

pub mod hot;
