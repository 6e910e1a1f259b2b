//! A TPC-C-like workload "in the spirit of DBT-2" (paper §4, Table 1: MariaDB running DBT-2;
//! the paper reports the response time of one transaction).
//!
//! # How this differs from TPC-C (rev. 5.11) and DBT-2
//!
//! It is **not** a TPC-C implementation and its numbers are not tpmC. What is kept: the nine
//! tables with TPC-C's columns, types and primary keys (InnoDB; plus the customer-by-name and
//! orders-by-customer secondary indexes most implementations add), TPC-C's initial-population
//! rules at a smaller scale, and the statements of the new-order, payment and order-status
//! transactions. The differences:
//!
//! * **Scale.** Per warehouse: 10 districts (as TPC-C), but [`ITEMS`] = 10 000 items and stock
//!   rows (TPC-C: 100 000), [`CUSTOMERS_PER_DISTRICT`] = 300 customers (3 000), 300 initial
//!   orders per district, one per customer (3 000), of which the last
//!   [`NEW_ORDERS_PER_DISTRICT`] = 90 are undelivered new-orders (900: the same 30 %). One
//!   history row per customer and 5–15 order lines per order as in TPC-C. W = 2 is about
//!   110 000 rows (~50 MB of InnoDB files), loaded in a few seconds and held almost whole by
//!   the lab's 64 MB buffer pool, so a transaction's time is CPU and memory, not disk (the
//!   paper's MariaDB response time is ~4 ms per DBT-2 transaction, Table 1).
//! * **Mix.** new-order 45 : payment 43 : order-status 12. TPC-C runs new-order (~45 %),
//!   payment (≥ 43 %), order-status, delivery and stock-level (≥ 4 % each); delivery (which
//!   TPC-C executes deferred, in the background) and stock-level are left out, and their 8 %
//!   go to order-status.
//! * **No terminals, no think or keying times.** Each client draws the transaction type and the
//!   home warehouse uniformly per transaction (TPC-C and DBT-2 bind a terminal to a fixed
//!   warehouse and district); the caller decides the pacing.
//! * **Customers by id only.** TPC-C selects 60 % of payment and order-status customers by last
//!   name; here every customer is chosen by id with NURand(1023, 1, 300) (TPC-C's A = 1023,
//!   range scaled to 300 customers). Items use NURand(8191, 1, 10 000). The run-time C
//!   constants are fixed ([`C_ID`], [`C_OL_I_ID`]); there is no C-delta check between load and run.
//! * **Kept from TPC-C:** 1 % of new-orders carry an unused item id as their last line and roll
//!   back (a correct outcome, [`TxOutcome::rolled_back`]); 1 % of order lines are supplied by a
//!   remote warehouse and 15 % of payments are for a customer of a remote warehouse (when
//!   W > 1); payment appends to `c_data` for bad-credit ("BC") customers.
//! * **Deadlock avoidance.** A new-order's valid lines are sorted by (supply warehouse, item)
//!   before the stock rows are locked, so concurrent clients do not deadlock on stock. A
//!   remaining deadlock or lock timeout is a failed transaction (`ok == false`), not retried.
//! * **Data.** Random strings use 64 characters (letters, digits, `_`, `.`); `c_since`,
//!   `o_entry_d` and `h_date` are the load time. `history` has no primary key (as in TPC-C).
//! * **No response-time constraints, no measurement-interval, durability or ACID rules**;
//!   [`check_consistency`] runs TPC-C's consistency conditions 1–4 (clause 3.3.2.1–3.3.2.4).
//! * **Deterministic.** The loader's data set is always the same (fixed seed); each client
//!   uses a seeded RNG ([`TpccConfig::seed`]; the n-th client connected in a process uses
//!   `seed + n·φ`, [`TpccClient::connect_seeded`] takes an explicit seed). Both draw from
//!   `rand`'s seeded generators, so a seed gives the same data and transactions for a given
//!   `rand` version (the loader's `SmallRng` on 64-bit machines).
//!
//! # Files
//!
//! * [`client`](TpccClient): one transaction client on its own connection (the mix, the three
//!   transactions);
//! * `schema`: the tables and the marker table that records the loaded scale;
//! * [`loader`](load): the initial population;
//! * [`consistency`](check_consistency): TPC-C's consistency conditions 1–4.
//!
//! Each file uses only the configuration, constants and helpers here and, for the client and
//! the loader, `schema`; none uses another.

mod client;
mod consistency;
mod loader;
mod schema;

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{bail, Result};
use mysql::OptsBuilder;
use serde::{Deserialize, Serialize};

pub use client::TpccClient;
pub use consistency::check_consistency;
pub use loader::{load, Loaded};

/// Districts per warehouse (as in TPC-C).
pub const DISTRICTS_PER_WAREHOUSE: u32 = 10;
/// Items, and stock rows per warehouse (TPC-C: 100 000).
pub const ITEMS: u32 = 10_000;
/// Customers per district (TPC-C: 3 000).
pub const CUSTOMERS_PER_DISTRICT: u32 = 300;
/// Initial orders per district, one per customer (TPC-C: 3 000).
pub const ORDERS_PER_DISTRICT: u32 = 300;
/// Of those, the last ones are undelivered new-orders (TPC-C: 900, the same 30 %).
pub const NEW_ORDERS_PER_DISTRICT: u32 = 90;
/// Run-time NURand constant C for customer ids (0 ≤ C ≤ 1023).
pub const C_ID: u32 = 259;
/// Run-time NURand constant C for item ids (0 ≤ C ≤ 8191).
pub const C_OL_I_ID: u32 = 7911;
/// The `replay` warm-up's statements (`preheat_launch::mysql_session`): the reads of a
/// new-order transaction — warehouse, district, customer, item, stock — at fixed keys that
/// every loaded database has, without `FOR UPDATE`: read-only, so warming up changes nothing
/// and locks nothing. Each returns one row, so the reply's end is the same every time; the
/// last has more columns than any before it, so its final packet (whose sequence number
/// counts the columns) occurs nowhere else in the reply.
pub const WARM_UP: [&str; 5] = [
    "SELECT w_tax FROM warehouse WHERE w_id = 1",
    "SELECT d_tax, d_next_o_id FROM district WHERE d_w_id = 1 AND d_id = 1",
    "SELECT c_discount, c_last, c_credit FROM customer WHERE c_w_id = 1 AND c_d_id = 1 AND c_id = 1",
    "SELECT i_price, i_name, i_data FROM item WHERE i_id = 1",
    "SELECT s_quantity, s_data, s_dist_01, s_ytd FROM stock WHERE s_i_id = 1 AND s_w_id = 1",
];
/// Per-statement timeout of a transaction client (as the other drivers' reply timeout).
pub(super) const TX_TIMEOUT: Duration = Duration::from_secs(10);
/// The loader's statements are larger.
pub(super) const LOAD_TIMEOUT: Duration = Duration::from_secs(120);
/// Most warehouses the loader accepts (a sanity bound, ~55 000 rows each).
const MAX_WAREHOUSES: u32 = 1000;

/// Database name and scale.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TpccConfig {
    /// Database name: letters, digits and `_` only.
    pub database: String,
    /// MySQL user (no password: the lab's MariaDB lets root in without one over TCP).
    pub user: String,
    pub warehouses: u32,
    /// Seed of the clients' RNG (the loader's data is fixed).
    #[serde(default)]
    pub seed: u64,
}

impl Default for TpccConfig {
    fn default() -> Self {
        TpccConfig {
            database: "tpcc".to_string(),
            user: "root".to_string(),
            warehouses: 2,
            seed: 0,
        }
    }
}

impl TpccConfig {
    pub(super) fn validate(&self) -> Result<()> {
        if self.database.is_empty()
            || self.database.len() > 64
            || !self
                .database
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_')
        {
            bail!(
                "invalid TPC-C database name {:?}: use 1..64 letters, digits or '_'",
                self.database
            );
        }
        if self.warehouses == 0 || self.warehouses > MAX_WAREHOUSES {
            bail!(
                "TPC-C warehouses must be 1..={MAX_WAREHOUSES}, not {}",
                self.warehouses
            );
        }
        Ok(())
    }

    pub(super) fn opts(&self, addr: SocketAddr, with_db: bool, timeout: Duration) -> OptsBuilder {
        OptsBuilder::new()
            .ip_or_hostname(Some(addr.ip().to_string()))
            .tcp_port(addr.port())
            .user(Some(self.user.clone()))
            .db_name(with_db.then(|| self.database.clone()))
            // Stay on TCP: the crate would otherwise switch to the server's unix socket on
            // loopback, and the agent attributes requests to the TCP port.
            .prefer_socket(false)
            .tcp_nodelay(true)
            .tcp_connect_timeout(Some(TX_TIMEOUT))
            .read_timeout(Some(timeout))
            .write_timeout(Some(timeout))
            .stmt_cache_size(64)
    }
}

/// The three transaction types of the mix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum TxKind {
    NewOrder,
    Payment,
    OrderStatus,
}

impl TxKind {
    pub const ALL: [TxKind; 3] = [TxKind::NewOrder, TxKind::Payment, TxKind::OrderStatus];

    /// "new-order", "payment", "order-status".
    pub fn name(self) -> &'static str {
        match self {
            TxKind::NewOrder => "new-order",
            TxKind::Payment => "payment",
            TxKind::OrderStatus => "order-status",
        }
    }

    /// The transaction type at percentile `r` (0..100) of the mix: a uniform `r` draws from it.
    pub fn at_percentile(r: u32) -> TxKind {
        let mut acc = 0;
        TxKind::ALL
            .into_iter()
            .find(|k| {
                acc += k.percent();
                r < acc
            })
            .unwrap_or(TxKind::OrderStatus)
    }

    /// Share in the mix, percent (45 : 43 : 12).
    pub fn percent(self) -> u32 {
        match self {
            TxKind::NewOrder => 45,
            TxKind::Payment => 43,
            TxKind::OrderStatus => 12,
        }
    }
}

/// The result of one transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TxOutcome {
    pub kind: TxKind,
    /// Completed as TPC-C specifies: committed, or (1 % of new-orders) rolled back on the
    /// unused item. False: an SQL error (deadlock, lock timeout, ...) or unexpected data; see
    /// [`TpccClient::last_error`].
    pub ok: bool,
    /// Nothing was committed (the specified new-order rollback, or a failure).
    pub rolled_back: bool,
}

/// Cents as a DECIMAL literal ("1234.56"); passed as a string so no float rounding enters.
pub(super) fn money(cents: i64) -> String {
    let sign = if cents < 0 { "-" } else { "" };
    let c = cents.unsigned_abs();
    format!("{sign}{}.{:02}", c / 100, c % 100)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn money_literals() {
        assert_eq!(money(123_456), "1234.56");
        assert_eq!(money(-1000), "-10.00");
        assert_eq!(money(5), "0.05");
    }

    #[test]
    fn config_validation() {
        assert!(TpccConfig::default().validate().is_ok());
        let bad = TpccConfig {
            database: "x; DROP".into(),
            ..TpccConfig::default()
        };
        assert!(bad.validate().is_err());
        let zero = TpccConfig {
            warehouses: 0,
            ..TpccConfig::default()
        };
        assert!(zero.validate().is_err());
    }
}
