//! One TPC-C-like transaction client on its own connection: the mix (45 : 43 : 12) and the
//! new-order, payment and order-status transactions (TPC-C 2.4–2.6, customers by id only).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{bail, Context, Result};
use mysql::prelude::{FromValue, Queryable};
use mysql::{AccessMode, Conn, Params, Row, Transaction, TxOpts};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::schema::{read_marker, Scale, LOADER_VERSION, MARKER};
use super::{
    money, TpccConfig, TxKind, TxOutcome, CUSTOMERS_PER_DISTRICT, C_ID, C_OL_I_ID,
    DISTRICTS_PER_WAREHOUSE, ITEMS, TX_TIMEOUT,
};

/// Why a transaction did not complete.
enum Fail {
    /// An SQL error or unexpected data: the transaction failed, the connection is fine.
    Wrong(String),
    /// The connection is unusable.
    Transport(mysql::Error),
}

impl From<mysql::Error> for Fail {
    fn from(e: mysql::Error) -> Fail {
        match e {
            mysql::Error::MySqlError(_)
            | mysql::Error::FromValueError(_)
            | mysql::Error::FromRowError(_) => Fail::Wrong(e.to_string()),
            other => Fail::Transport(other),
        }
    }
}

/// Column `i` of `row` as `T`.
fn col<T: FromValue>(row: &Row, i: usize, what: &str) -> Result<T, Fail> {
    match row.get_opt::<T, usize>(i) {
        Some(Ok(v)) => Ok(v),
        Some(Err(e)) => Err(Fail::Wrong(format!("{what}: unexpected value {:?}", e.0))),
        None => Err(Fail::Wrong(format!("{what}: missing column {i}"))),
    }
}

/// The first row of a query that must return one.
fn first<Q: Queryable, P: Into<Params>>(
    q: &mut Q,
    sql: &str,
    params: P,
    what: &str,
) -> Result<Row, Fail> {
    q.exec_first::<Row, _, _>(sql, params)?
        .ok_or_else(|| Fail::Wrong(format!("no {what} row")))
}

/// TPC-C's non-uniform random NURand(A, x, y) with run-time constant `c`.
fn nurand(rng: &mut StdRng, a: u32, c: u32, x: u32, y: u32) -> u32 {
    (((rng.gen_range(0..=a) | rng.gen_range(x..=y)) + c) % (y - x + 1)) + x
}

/// One transaction client on its own connection.
pub struct TpccClient {
    conn: Conn,
    rng: StdRng,
    warehouses: u32,
    last_error: Option<String>,
}

/// Clients connected in this process so far (to give each its own seed).
static CLIENTS: AtomicU64 = AtomicU64::new(0);

const STOCK_SELECT: [&str; 10] = [
    "SELECT s_quantity, s_data, s_dist_01 FROM stock WHERE s_i_id = ? AND s_w_id = ? FOR UPDATE",
    "SELECT s_quantity, s_data, s_dist_02 FROM stock WHERE s_i_id = ? AND s_w_id = ? FOR UPDATE",
    "SELECT s_quantity, s_data, s_dist_03 FROM stock WHERE s_i_id = ? AND s_w_id = ? FOR UPDATE",
    "SELECT s_quantity, s_data, s_dist_04 FROM stock WHERE s_i_id = ? AND s_w_id = ? FOR UPDATE",
    "SELECT s_quantity, s_data, s_dist_05 FROM stock WHERE s_i_id = ? AND s_w_id = ? FOR UPDATE",
    "SELECT s_quantity, s_data, s_dist_06 FROM stock WHERE s_i_id = ? AND s_w_id = ? FOR UPDATE",
    "SELECT s_quantity, s_data, s_dist_07 FROM stock WHERE s_i_id = ? AND s_w_id = ? FOR UPDATE",
    "SELECT s_quantity, s_data, s_dist_08 FROM stock WHERE s_i_id = ? AND s_w_id = ? FOR UPDATE",
    "SELECT s_quantity, s_data, s_dist_09 FROM stock WHERE s_i_id = ? AND s_w_id = ? FOR UPDATE",
    "SELECT s_quantity, s_data, s_dist_10 FROM stock WHERE s_i_id = ? AND s_w_id = ? FOR UPDATE",
];

/// A new-order's input: warehouse, district, customer, lines.
struct NewOrder {
    w: u32,
    d: u32,
    c: u32,
    lines: Vec<Line>,
}

/// What a new-order reads for its total: the order id it took and the taxes and discount.
struct OrderHead {
    o_id: u32,
    w_tax: f64,
    d_tax: f64,
    c_discount: f64,
}

/// One order line of a new-order: (item, supply warehouse, quantity).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Line {
    supply_w: u32,
    item: u32,
    quantity: u32,
}

impl TpccClient {
    /// Connect to the TPC-C-like database `cfg.database` on `addr` (loaded by
    /// [`load`](super::load) with the same number of warehouses). Seeded from `cfg.seed` and the
    /// number of clients this process connected before.
    pub fn connect(addr: SocketAddr, cfg: &TpccConfig) -> Result<Self> {
        let n = CLIENTS.fetch_add(1, Ordering::Relaxed);
        Self::connect_seeded(
            addr,
            cfg,
            cfg.seed.wrapping_add(n.wrapping_mul(0x9E37_79B9_7F4A_7C15)),
        )
    }

    /// [`TpccClient::connect`] with an explicit RNG seed.
    pub fn connect_seeded(addr: SocketAddr, cfg: &TpccConfig, seed: u64) -> Result<Self> {
        cfg.validate()?;
        let mut conn = Conn::new(cfg.opts(addr, true, TX_TIMEOUT)).with_context(|| {
            format!(
                "connecting to MariaDB/MySQL at {addr} as {} (database {})",
                cfg.user, cfg.database
            )
        })?;
        let scale = read_marker(&mut conn)
            .with_context(|| format!("reading the TPC-C-like scale from {addr}"))?;
        match scale {
            Some(s) if s == Scale::of(cfg.warehouses) => {}
            Some(s) => bail!(
                "database {} at {addr} holds a TPC-C-like data set with {} warehouse(s) \
                 (loader v{}), the workload wants {} (v{LOADER_VERSION}): load it again",
                cfg.database,
                s.warehouses,
                s.version,
                cfg.warehouses
            ),
            None => bail!(
                "database {} at {addr} has no TPC-C-like data set (no {MARKER} table): load it \
                 first (servers::prepare or tpcc::load)",
                cfg.database
            ),
        }
        Ok(TpccClient {
            conn,
            rng: StdRng::seed_from_u64(seed),
            warehouses: cfg.warehouses,
            last_error: None,
        })
    }

    /// Run one transaction drawn from the mix (45 : 43 : 12). `Err` only when the connection
    /// is unusable; an SQL error is `Ok` with `ok == false`.
    pub fn transaction(&mut self) -> Result<TxOutcome> {
        let r = self.rng.gen_range(0..100);
        self.run(TxKind::at_percentile(r))
    }

    /// Run one transaction of `kind`.
    pub fn run(&mut self, kind: TxKind) -> Result<TxOutcome> {
        self.last_error = None;
        let result = match kind {
            TxKind::NewOrder => self.new_order(),
            TxKind::Payment => self.payment(),
            TxKind::OrderStatus => self.order_status(),
        };
        match result {
            Ok(committed) => Ok(TxOutcome {
                kind,
                ok: true,
                rolled_back: !committed,
            }),
            Err(Fail::Wrong(e)) => {
                self.last_error = Some(e);
                Ok(TxOutcome {
                    kind,
                    ok: false,
                    rolled_back: true,
                })
            }
            Err(Fail::Transport(e)) => {
                Err(anyhow::Error::new(e).context(format!("{} transaction", kind.name())))
            }
        }
    }

    /// The error of the last transaction when it was not `ok`.
    pub fn last_error(&self) -> Option<&str> {
        self.last_error.as_deref()
    }

    fn other_warehouse(&mut self, w: u32) -> u32 {
        // Uniform over the other W-1 warehouses (W > 1).
        let o = self.rng.gen_range(1..self.warehouses);
        if o >= w {
            o + 1
        } else {
            o
        }
    }

    /// TPC-C 2.4: returns whether it committed (false: the specified rollback).
    fn new_order(&mut self) -> Result<bool, Fail> {
        let order = self.draw_new_order();
        let mut tx = self.conn.start_transaction(TxOpts::default())?;
        let head = insert_order(&mut tx, &order)?;
        let mut total = 0.0f64;
        for (number, line) in order.lines.iter().enumerate() {
            let Some(amount) = insert_order_line(&mut tx, &order, head.o_id, number, line)? else {
                // "Item number is not valid": the specified 1 % rollback.
                tx.rollback()?;
                return Ok(false);
            };
            total += amount;
        }
        let _total = total * (1.0 - head.c_discount) * (1.0 + head.w_tax + head.d_tax);
        tx.commit()?;
        Ok(true)
    }

    /// The input of a new-order (TPC-C 2.4.1): warehouse, district, customer and 5..=15 lines
    /// sorted by supply warehouse and item, 1 % of orders with an unused item id last.
    fn draw_new_order(&mut self) -> NewOrder {
        let w = self.rng.gen_range(1..=self.warehouses);
        let d = self.rng.gen_range(1..=DISTRICTS_PER_WAREHOUSE);
        let c = nurand(&mut self.rng, 1023, C_ID, 1, CUSTOMERS_PER_DISTRICT);
        let ol_cnt = self.rng.gen_range(5..=15usize);
        let rollback = self.rng.gen_range(0..100) == 0;
        let mut lines = Vec::with_capacity(ol_cnt);
        for _ in 0..ol_cnt {
            let item = nurand(&mut self.rng, 8191, C_OL_I_ID, 1, ITEMS);
            let supply_w = if self.warehouses > 1 && self.rng.gen_range(0..100) == 0 {
                self.other_warehouse(w)
            } else {
                w
            };
            let quantity = self.rng.gen_range(1..=10);
            lines.push(Line {
                supply_w,
                item,
                quantity,
            });
        }
        lines.sort_unstable();
        if rollback {
            // The unused item id goes last, as TPC-C's last line (clause 2.4).
            if let Some(last) = lines.last_mut() {
                last.item = ITEMS + 1;
            }
        }
        NewOrder { w, d, c, lines }
    }

    /// TPC-C 2.5, customer by id only.
    fn payment(&mut self) -> Result<bool, Fail> {
        let w = self.rng.gen_range(1..=self.warehouses);
        let d = self.rng.gen_range(1..=DISTRICTS_PER_WAREHOUSE);
        let (c_w, c_d) = if self.warehouses > 1 && self.rng.gen_range(0..100) < 15 {
            let cw = self.other_warehouse(w);
            (cw, self.rng.gen_range(1..=DISTRICTS_PER_WAREHOUSE))
        } else {
            (w, d)
        };
        let c = nurand(&mut self.rng, 1023, C_ID, 1, CUSTOMERS_PER_DISTRICT);
        let cents: i64 = self.rng.gen_range(100..=500_000);
        let amount = money(cents);

        let mut tx = self.conn.start_transaction(TxOpts::default())?;
        tx.exec_drop(
            "UPDATE warehouse SET w_ytd = w_ytd + ? WHERE w_id = ?",
            (amount.as_str(), w),
        )?;
        let row = first(
            &mut tx,
            "SELECT w_name, w_street_1, w_street_2, w_city, w_state, w_zip FROM warehouse \
             WHERE w_id = ?",
            (w,),
            "warehouse",
        )?;
        let w_name: String = col(&row, 0, "w_name")?;
        tx.exec_drop(
            "UPDATE district SET d_ytd = d_ytd + ? WHERE d_w_id = ? AND d_id = ?",
            (amount.as_str(), w, d),
        )?;
        let row = first(
            &mut tx,
            "SELECT d_name, d_street_1, d_street_2, d_city, d_state, d_zip FROM district \
             WHERE d_w_id = ? AND d_id = ?",
            (w, d),
            "district",
        )?;
        let d_name: String = col(&row, 0, "d_name")?;
        let row = first(
            &mut tx,
            "SELECT c_first, c_middle, c_last, c_street_1, c_street_2, c_city, c_state, c_zip, \
             c_phone, c_since, c_credit, c_credit_lim, c_discount, c_balance FROM customer \
             WHERE c_w_id = ? AND c_d_id = ? AND c_id = ? FOR UPDATE",
            (c_w, c_d, c),
            "customer",
        )?;
        let credit: String = col(&row, 10, "c_credit")?;
        if credit == "BC" {
            let note = format!("{c} {c_d} {c_w} {d} {w} {amount} ");
            tx.exec_drop(
                "UPDATE customer SET c_balance = c_balance - ?, \
                 c_ytd_payment = c_ytd_payment + ?, c_payment_cnt = c_payment_cnt + 1, \
                 c_data = LEFT(CONCAT(?, c_data), 500) \
                 WHERE c_w_id = ? AND c_d_id = ? AND c_id = ?",
                (amount.as_str(), amount.as_str(), note, c_w, c_d, c),
            )?;
        } else {
            tx.exec_drop(
                "UPDATE customer SET c_balance = c_balance - ?, \
                 c_ytd_payment = c_ytd_payment + ?, c_payment_cnt = c_payment_cnt + 1 \
                 WHERE c_w_id = ? AND c_d_id = ? AND c_id = ?",
                (amount.as_str(), amount.as_str(), c_w, c_d, c),
            )?;
        }
        tx.exec_drop(
            "INSERT INTO history (h_c_id, h_c_d_id, h_c_w_id, h_d_id, h_w_id, h_date, h_amount, \
             h_data) VALUES (?, ?, ?, ?, ?, NOW(), ?, ?)",
            (
                c,
                c_d,
                c_w,
                d,
                w,
                amount.as_str(),
                format!("{w_name}    {d_name}"),
            ),
        )?;
        tx.commit()?;
        Ok(true)
    }

    /// TPC-C 2.6, customer by id only; read-only.
    fn order_status(&mut self) -> Result<bool, Fail> {
        let w = self.rng.gen_range(1..=self.warehouses);
        let d = self.rng.gen_range(1..=DISTRICTS_PER_WAREHOUSE);
        let c = nurand(&mut self.rng, 1023, C_ID, 1, CUSTOMERS_PER_DISTRICT);

        let mut tx = self
            .conn
            .start_transaction(TxOpts::default().set_access_mode(Some(AccessMode::ReadOnly)))?;
        first(
            &mut tx,
            "SELECT c_balance, c_first, c_middle, c_last FROM customer \
             WHERE c_w_id = ? AND c_d_id = ? AND c_id = ?",
            (w, d, c),
            "customer",
        )?;
        let order = tx.exec_first::<Row, _, _>(
            "SELECT o_id, o_entry_d, o_carrier_id FROM orders \
             WHERE o_w_id = ? AND o_d_id = ? AND o_c_id = ? ORDER BY o_id DESC LIMIT 1",
            (w, d, c),
        )?;
        if let Some(order) = order {
            let o_id: u32 = col(&order, 0, "o_id")?;
            let lines = tx.exec::<Row, _, _>(
                "SELECT ol_i_id, ol_supply_w_id, ol_quantity, ol_amount, ol_delivery_d \
                 FROM order_line WHERE ol_w_id = ? AND ol_d_id = ? AND ol_o_id = ?",
                (w, d, o_id),
            )?;
            if lines.is_empty() {
                return Err(Fail::Wrong(format!(
                    "order {w}/{d}/{o_id} has no order lines"
                )));
            }
        }
        tx.commit()?;
        Ok(true)
    }
}

/// The new-order's first steps in `tx`: read the taxes and the customer's discount, take the
/// district's next order id, insert the order and its new-order row.
fn insert_order(tx: &mut Transaction<'_>, order: &NewOrder) -> Result<OrderHead, Fail> {
    let NewOrder { w, d, c, .. } = *order;
    let all_local = order.lines.iter().all(|l| l.supply_w == w);
    let row = first(
        tx,
        "SELECT w_tax FROM warehouse WHERE w_id = ?",
        (w,),
        "warehouse",
    )?;
    let w_tax: f64 = col(&row, 0, "w_tax")?;
    let row = first(
        tx,
        "SELECT d_tax, d_next_o_id FROM district WHERE d_w_id = ? AND d_id = ? FOR UPDATE",
        (w, d),
        "district",
    )?;
    let d_tax: f64 = col(&row, 0, "d_tax")?;
    let o_id: u32 = col(&row, 1, "d_next_o_id")?;
    tx.exec_drop(
        "UPDATE district SET d_next_o_id = d_next_o_id + 1 WHERE d_w_id = ? AND d_id = ?",
        (w, d),
    )?;
    let row = first(
        tx,
        "SELECT c_discount, c_last, c_credit FROM customer \
         WHERE c_w_id = ? AND c_d_id = ? AND c_id = ?",
        (w, d, c),
        "customer",
    )?;
    let c_discount: f64 = col(&row, 0, "c_discount")?;
    tx.exec_drop(
        "INSERT INTO orders (o_id, o_d_id, o_w_id, o_c_id, o_entry_d, o_carrier_id, \
         o_ol_cnt, o_all_local) VALUES (?, ?, ?, ?, NOW(), NULL, ?, ?)",
        (
            o_id,
            d,
            w,
            c,
            order.lines.len() as u32,
            u32::from(all_local),
        ),
    )?;
    tx.exec_drop(
        "INSERT INTO new_order (no_o_id, no_d_id, no_w_id) VALUES (?, ?, ?)",
        (o_id, d, w),
    )?;
    Ok(OrderHead {
        o_id,
        w_tax,
        d_tax,
        c_discount,
    })
}

/// Line `number` (from 0) of order `o_id` in `tx`: read the item, update its stock, insert the
/// order line. Returns the line's amount, or `None` when the item does not exist.
fn insert_order_line(
    tx: &mut Transaction<'_>,
    order: &NewOrder,
    o_id: u32,
    number: usize,
    line: &Line,
) -> Result<Option<f64>, Fail> {
    let (w, d) = (order.w, order.d);
    let Some(item) = tx.exec_first::<Row, _, _>(
        "SELECT i_price, i_name, i_data FROM item WHERE i_id = ?",
        (line.item,),
    )?
    else {
        return Ok(None);
    };
    let price: f64 = col(&item, 0, "i_price")?;
    let i_data: String = col(&item, 2, "i_data")?;
    let stock = first(
        tx,
        STOCK_SELECT[(d - 1) as usize],
        (line.item, line.supply_w),
        "stock",
    )?;
    let s_quantity: i64 = col(&stock, 0, "s_quantity")?;
    let s_data: String = col(&stock, 1, "s_data")?;
    let dist_info: String = col(&stock, 2, "s_dist_xx")?;
    let q = i64::from(line.quantity);
    let new_quantity = if s_quantity >= q + 10 {
        s_quantity - q
    } else {
        s_quantity - q + 91
    };
    tx.exec_drop(
        "UPDATE stock SET s_quantity = ?, s_ytd = s_ytd + ?, \
         s_order_cnt = s_order_cnt + 1, s_remote_cnt = s_remote_cnt + ? \
         WHERE s_i_id = ? AND s_w_id = ?",
        (
            new_quantity,
            line.quantity,
            u32::from(line.supply_w != w),
            line.item,
            line.supply_w,
        ),
    )?;
    let amount_cents = (f64::from(line.quantity) * price * 100.0).round() as i64;
    // Brand/generic as the terminal would show it.
    let _brand = if i_data.contains("ORIGINAL") && s_data.contains("ORIGINAL") {
        'B'
    } else {
        'G'
    };
    tx.exec_drop(
        "INSERT INTO order_line (ol_o_id, ol_d_id, ol_w_id, ol_number, ol_i_id, \
         ol_supply_w_id, ol_delivery_d, ol_quantity, ol_amount, ol_dist_info) \
         VALUES (?, ?, ?, ?, ?, ?, NULL, ?, ?, ?)",
        (
            o_id,
            d,
            w,
            number as u32 + 1,
            line.item,
            line.supply_w,
            line.quantity,
            money(amount_cents),
            dist_info,
        ),
    )?;
    Ok(Some(amount_cents as f64 / 100.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nurand_stays_in_range_and_is_skewed() {
        let mut rng = StdRng::seed_from_u64(1);
        let mut hits = vec![0u32; CUSTOMERS_PER_DISTRICT as usize + 1];
        for _ in 0..30_000 {
            let c = nurand(&mut rng, 1023, C_ID, 1, CUSTOMERS_PER_DISTRICT);
            assert!((1..=CUSTOMERS_PER_DISTRICT).contains(&c));
            hits[c as usize] += 1;
        }
        let max = hits.iter().max().copied().unwrap_or(0);
        assert!(max > 2 * 100, "NURand should be non-uniform, max {max}");
    }
}
