//! What the state of the connection a request comes on costs: the `conn-primed` row
//! (`--connection-row`, the `ConnPrimed` mode) against `auto`'s.
//!
//! `replay` warms the server's path on a connection of its own and `lines` loads the recorded
//! set, but the request comes on another connection: the client's socket and transmit path,
//! the server's socket, its receive and wake-up path and the server's own data for that
//! connection stay as cold as the idle left them. Measured on preheat-kv (2026-11-30, EPYC
//! `haltpoll`, two runs of 150 rounds; `docs/results-log.md`, session 28): one request on the
//! measured connection after the sweep, then the lead and the same announcement, removed 99
//! and 100% of the cold overhead against `lines+replay`'s 87 and 85%, every stage back at
//! hot's. The row makes that measurable on any server; it is a diagnostic, not a strategy (the
//! paper's arbiter announces a request, it cannot send one on the client's connection).

use preheat_model::proto::Strategies;
use serde::Serialize;

use crate::mode::{Mode, Sample, CONN_PRIMED};
use crate::table::{difference, Residual, Row};

/// `auto` less `conn-primed`, µs (p50 differences), by stage as a mode's [`Residual`].
#[derive(Debug, Clone, Serialize)]
pub struct ConnectionState {
    /// The row compared (`preheat:auto`).
    pub mode: String,
    /// The difference: of the response time, the client's own transmit (where stamped), the
    /// rest of *start*, *serve*.
    #[serde(flatten)]
    pub split: Residual,
    /// What `mode` left above the floor in all (its residual), for the share.
    pub left_above_floor_us: Option<f64>,
    /// Samples of the two rows.
    pub n: (usize, usize),
    /// `auto` announced `replay`, so its warm-up already ran the server's path (code, shared
    /// data) and the difference is the connection's own state; without, the one request also
    /// restores what a warm-up would have.
    pub isolates_connection: bool,
}

/// The comparison, where both rows were measured (by stage as [`crate::table::difference`]
/// computes a mode's residual above its floor).
pub(crate) fn connection_state(
    rows: &[Row],
    samples: &[Sample],
    auto_chose: Strategies,
) -> Option<ConnectionState> {
    let name = Mode::Auto(Strategies::NONE).name();
    let auto = rows.iter().find(|r| r.mode == name)?;
    let primed = rows.iter().find(|r| r.mode == CONN_PRIMED)?;
    Some(ConnectionState {
        mode: auto.mode.clone(),
        split: difference(samples, &auto.mode, &primed.mode)?,
        left_above_floor_us: auto.residual.as_ref().map(|r| r.total_us),
        n: (auto.latency.n, primed.latency.n),
        isolates_connection: auto_chose.contains(Strategies::REPLAY),
    })
}

/// The text line.
pub(crate) fn line(c: &ConnectionState, floor: &str) -> String {
    let us = |x: Option<f64>| x.map_or("-".to_string(), |x| format!("{x:+.1} µs"));
    let of = c.left_above_floor_us.map_or(String::new(), |l| {
        format!(" of the {l:+.1} µs it left above the {floor} floor")
    });
    let what = if c.isolates_connection {
        "the state of the connection the request came on"
    } else {
        "what one request on the connection restores beyond auto's announcement (auto has no replay here: code and data as well as the connection's own state)"
    };
    format!(
        "{what}: {:+.1} µs{of} = wire {} + start after the wire {} + serve {} [{} − {CONN_PRIMED}, p50 differences, measured, n = {} / {}; {CONN_PRIMED}: one request on the measured connection after the cold-making step, then the same lead and announcement — a diagnostic, not a strategy]",
        c.split.total_us,
        us(c.split.wire_us),
        us(c.split.server_start_us),
        us(c.split.serve_us),
        c.mode,
        c.n.0,
        c.n.1
    )
}
