//! TPC-C's consistency conditions 1–4 (clause 3.3.2.1–3.3.2.4), checked on a quiescent database.

use std::net::SocketAddr;

use anyhow::{Context, Result};
use mysql::prelude::Queryable;
use mysql::{Conn, Row};

use super::{TpccConfig, LOAD_TIMEOUT};

/// TPC-C's consistency conditions 1–4 (clause 3.3.2.1–3.3.2.4) on a quiescent database:
/// W_YTD = Σ D_YTD; D_NEXT_O_ID − 1 = max(O_ID) = max(NO_O_ID); the new-order ids of a
/// district are contiguous; Σ O_OL_CNT = number of order lines. Returns the violations (empty:
/// consistent).
pub fn check_consistency(addr: SocketAddr, cfg: &TpccConfig) -> Result<Vec<String>> {
    cfg.validate()?;
    let mut conn = Conn::new(cfg.opts(addr, true, LOAD_TIMEOUT))
        .with_context(|| format!("connecting to MariaDB/MySQL at {addr}"))?;
    let mut bad = Vec::new();
    let rows: Vec<Row> = conn.query(
        "SELECT w.w_id, w.w_ytd, SUM(d.d_ytd) FROM warehouse w JOIN district d \
         ON d.d_w_id = w.w_id GROUP BY w.w_id, w.w_ytd HAVING w.w_ytd <> SUM(d.d_ytd)",
    )?;
    for r in rows {
        bad.push(format!("condition 1 (W_YTD = sum D_YTD) fails: {r:?}"));
    }
    let rows: Vec<Row> = conn.query(
        "SELECT * FROM (SELECT d.d_w_id, d.d_id, d.d_next_o_id AS next, \
           (SELECT MAX(o_id) FROM orders WHERE o_w_id = d.d_w_id AND o_d_id = d.d_id) AS mo, \
           (SELECT MAX(no_o_id) FROM new_order WHERE no_w_id = d.d_w_id AND no_d_id = d.d_id) \
             AS mno \
         FROM district d) t WHERE NOT (t.next - 1 <=> t.mo) OR NOT (t.mo <=> t.mno)",
    )?;
    for r in rows {
        bad.push(format!(
            "condition 2 (D_NEXT_O_ID - 1 = max O_ID = max NO_O_ID) fails: {r:?}"
        ));
    }
    let rows: Vec<Row> = conn.query(
        "SELECT no_w_id, no_d_id, COUNT(*), MIN(no_o_id), MAX(no_o_id) FROM new_order \
         GROUP BY no_w_id, no_d_id HAVING MAX(no_o_id) - MIN(no_o_id) + 1 <> COUNT(*)",
    )?;
    for r in rows {
        bad.push(format!(
            "condition 3 (contiguous new-order ids) fails: {r:?}"
        ));
    }
    let rows: Vec<Row> = conn.query(
        "SELECT o.w, o.d, o.n, l.n FROM \
           (SELECT o_w_id w, o_d_id d, SUM(o_ol_cnt) n FROM orders GROUP BY o_w_id, o_d_id) o \
         JOIN \
           (SELECT ol_w_id w, ol_d_id d, COUNT(*) n FROM order_line GROUP BY ol_w_id, ol_d_id) l \
         ON o.w = l.w AND o.d = l.d WHERE o.n <> l.n",
    )?;
    for r in rows {
        bad.push(format!(
            "condition 4 (sum O_OL_CNT = order lines) fails: {r:?}"
        ));
    }
    Ok(bad)
}
