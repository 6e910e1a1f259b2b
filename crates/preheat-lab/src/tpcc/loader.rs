//! The initial population (TPC-C clause 4.3, scaled down): multi-row INSERTs of up to 1 000 rows,
//! one transaction per batch, from a fixed seed.

use std::net::SocketAddr;
use std::time::Instant;

use anyhow::{Context, Result};
use mysql::prelude::Queryable;
use mysql::Conn;
use rand::rngs::SmallRng;
use rand::{Rng, RngCore, SeedableRng};

use super::schema::{read_marker, Scale, LOADER_VERSION, MARKER, SCHEMA, TABLES};
use super::{
    money, TpccConfig, CUSTOMERS_PER_DISTRICT, DISTRICTS_PER_WAREHOUSE, ITEMS, LOAD_TIMEOUT,
    NEW_ORDERS_PER_DISTRICT, ORDERS_PER_DISTRICT,
};

/// Seed of the loader's data (the data set is always the same).
const LOAD_SEED: u64 = 0x7043_4c6f_6164_0001;
/// Rows per multi-row INSERT (one transaction each) ...
const BATCH_ROWS: usize = 1000;
/// ... or fewer, when the statement grows beyond this many bytes.
const BATCH_BYTES: usize = 1 << 20;

/// What [`load`] found or loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Loaded {
    /// Rows of the data set (loaded now, or by an earlier load of the same scale).
    pub rows: u64,
    /// What the database holds, in words (for reports).
    pub detail: String,
}

/// Multi-row INSERTs, each its own (autocommitted) transaction.
struct Inserter<'a> {
    conn: &'a mut Conn,
    head: &'static str,
    sql: String,
    rows: usize,
    total: u64,
}

impl<'a> Inserter<'a> {
    fn new(conn: &'a mut Conn, head: &'static str) -> Self {
        Inserter {
            conn,
            head,
            sql: String::with_capacity(BATCH_BYTES + 4096),
            rows: 0,
            total: 0,
        }
    }

    fn row(&mut self, values: &str) -> Result<()> {
        if self.rows == 0 {
            self.sql.clear();
            self.sql.push_str(self.head);
            self.sql.push_str(" VALUES ");
        } else {
            self.sql.push(',');
        }
        self.sql.push('(');
        self.sql.push_str(values);
        self.sql.push(')');
        self.rows += 1;
        if self.rows >= BATCH_ROWS || self.sql.len() >= BATCH_BYTES {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<u64> {
        if self.rows > 0 {
            self.conn
                .query_drop(&self.sql)
                .with_context(|| format!("loading: {} ({} rows)", self.head, self.rows))?;
            self.total += self.rows as u64;
            self.rows = 0;
        }
        Ok(self.total)
    }
}

/// Random data as TPC-C's initial population (clause 4.3) prescribes, scaled down. `SmallRng`:
/// fast also in debug builds (where ChaCha, `StdRng`, would be the bottleneck of the load).
struct Gen {
    rng: SmallRng,
}

impl Gen {
    /// Random a-string of x..=y characters from a 64-character alphabet (letters, digits, `_`
    /// and `.`: TPC-C asks for at least the alphanumerics; none of them needs quoting in SQL).
    fn astr(&mut self, x: usize, y: usize) -> String {
        const CHARS: &[u8; 64] =
            b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.";
        let n = self.rng.gen_range(x..=y);
        let mut s = String::with_capacity(n);
        let mut bits = 0u64;
        for i in 0..n {
            if i % 10 == 0 {
                bits = self.rng.next_u64();
            }
            s.push(char::from(CHARS[(bits & 63) as usize]));
            bits >>= 6;
        }
        s
    }

    /// Two random capital letters.
    fn state(&mut self) -> String {
        (0..2)
            .map(|_| char::from(b'A' + self.rng.gen_range(0..26u8)))
            .collect()
    }

    /// Random n-string of n digits.
    fn nstr(&mut self, n: usize) -> String {
        (0..n)
            .map(|_| char::from(b'0' + self.rng.gen_range(0..10u8)))
            .collect()
    }

    /// i_data / s_data: 26..50 characters, 10 % containing "ORIGINAL".
    fn data(&mut self) -> String {
        let mut s = self.astr(26, 50);
        if self.rng.gen_range(0..10) == 0 {
            let at = self.rng.gen_range(0..=s.len() - 8);
            s.replace_range(at..at + 8, "ORIGINAL");
        }
        s
    }

    /// Street 1, street 2, city, state, zip as quoted SQL values.
    fn address(&mut self) -> String {
        format!(
            "'{}','{}','{}','{}','{}11111'",
            self.astr(10, 20),
            self.astr(10, 20),
            self.astr(10, 20),
            self.state(),
            self.nstr(4)
        )
    }

    /// A tax rate 0.0000..=0.2000 as a DECIMAL(4,4) literal.
    fn tax(&mut self) -> String {
        format!("0.{:04}", self.rng.gen_range(0..=2000))
    }
}

/// TPC-C's last name from a number 0..=999.
fn last_name(n: u32) -> String {
    const SYL: [&str; 10] = [
        "BAR", "OUGHT", "ABLE", "PRI", "PRES", "ESE", "ANTI", "CALLY", "ATION", "EING",
    ];
    let n = n as usize % 1000;
    format!("{}{}{}", SYL[n / 100], SYL[n / 10 % 10], SYL[n % 10])
}

/// Create the database `cfg.database` on `addr` and load the TPC-C-like data set at `cfg`'s
/// scale. Idempotent: when the marker table says this scale is already loaded, nothing is
/// changed (transactions run since then stay); otherwise all tables are dropped and reloaded.
/// Rows are inserted with multi-row INSERTs of up to 1 000 rows, one transaction per batch.
pub fn load(addr: SocketAddr, cfg: &TpccConfig, progress: &dyn Fn(&str)) -> Result<Loaded> {
    cfg.validate()?;
    let started = Instant::now();
    let mut conn = open_database(addr, cfg)?;
    if let Some(loaded) = already_loaded(&mut conn, cfg)? {
        progress("TPC-C-like data already loaded");
        return Ok(loaded);
    }
    progress("creating the TPC-C-like schema");
    create_schema(&mut conn)?;

    let mut gen = Gen {
        rng: SmallRng::seed_from_u64(LOAD_SEED),
    };
    progress(&format!("items: {ITEMS}"));
    let mut rows = load_items(&mut conn, &mut gen)?;
    for w in 1..=cfg.warehouses {
        progress(&format!("warehouse {w}/{}", cfg.warehouses));
        rows += load_warehouse(&mut conn, &mut gen, w)?;
    }

    let seconds = started.elapsed().as_secs_f64();
    write_marker(&mut conn, cfg, rows, seconds)?;
    progress(&format!("loaded {rows} rows in {seconds:.1} s"));
    Ok(Loaded {
        rows,
        detail: format!(
            "database {}: TPC-C-like data, {} warehouse(s) × {DISTRICTS_PER_WAREHOUSE} \
             districts, {ITEMS} items, {CUSTOMERS_PER_DISTRICT} customers and \
             {ORDERS_PER_DISTRICT} orders per district ({rows} rows)",
            cfg.database, cfg.warehouses
        ),
    })
}

/// Connect to `addr` as `cfg.user`, create the database `cfg.database` if it is missing and
/// select it.
fn open_database(addr: SocketAddr, cfg: &TpccConfig) -> Result<Conn> {
    let mut conn = Conn::new(cfg.opts(addr, false, LOAD_TIMEOUT)).with_context(|| {
        format!(
            "connecting to MariaDB/MySQL at {addr} as {} to load the TPC-C-like data",
            cfg.user
        )
    })?;
    let db = &cfg.database;
    conn.query_drop(format!("CREATE DATABASE IF NOT EXISTS `{db}`"))
        .with_context(|| format!("creating database {db} at {addr}"))?;
    conn.select_db(db)
        .with_context(|| format!("selecting database {db} at {addr}"))?;
    Ok(conn)
}

/// What an earlier load of `cfg`'s scale left, when the marker table says there was one.
fn already_loaded(conn: &mut Conn, cfg: &TpccConfig) -> Result<Option<Loaded>> {
    if read_marker(conn)? != Some(Scale::of(cfg.warehouses)) {
        return Ok(None);
    }
    let rows: Option<u64> =
        conn.query_first(format!("SELECT rows_loaded FROM {MARKER} LIMIT 1"))?;
    Ok(Some(Loaded {
        rows: rows.unwrap_or(0),
        detail: format!(
            "database {}: TPC-C-like data with {} warehouse(s) already loaded",
            cfg.database, cfg.warehouses
        ),
    }))
}

/// Drop every table of the data set and create the schema anew (checks off for the load).
fn create_schema(conn: &mut Conn) -> Result<()> {
    conn.query_drop("SET SESSION unique_checks = 0, foreign_key_checks = 0")?;
    for t in TABLES {
        conn.query_drop(format!("DROP TABLE IF EXISTS {t}"))
            .with_context(|| format!("dropping table {t}"))?;
    }
    for stmt in SCHEMA.split(';').map(str::trim).filter(|s| !s.is_empty()) {
        conn.query_drop(stmt)
            .context("creating the TPC-C-like schema")?;
    }
    Ok(())
}

/// The item table; returns the rows inserted.
fn load_items(conn: &mut Conn, gen: &mut Gen) -> Result<u64> {
    let mut ins = Inserter::new(
        conn,
        "INSERT INTO item (i_id, i_im_id, i_name, i_price, i_data)",
    );
    for i in 1..=ITEMS {
        let v = format!(
            "{i},{},'{}',{},'{}'",
            gen.rng.gen_range(1..=10_000),
            gen.astr(14, 24),
            money(gen.rng.gen_range(100..=10_000)),
            gen.data()
        );
        ins.row(&v)?;
    }
    ins.flush()
}

/// Warehouse `w` and everything under it (stock, districts, customers, history, orders), in
/// this order (the data set depends on it); returns the rows inserted.
fn load_warehouse(conn: &mut Conn, gen: &mut Gen, w: u32) -> Result<u64> {
    let v = format!(
        "{w},'{}',{},{},300000.00",
        gen.astr(6, 10),
        gen.address(),
        gen.tax()
    );
    conn.query_drop(format!(
        "INSERT INTO warehouse (w_id, w_name, w_street_1, w_street_2, w_city, w_state, \
         w_zip, w_tax, w_ytd) VALUES ({v})"
    ))?;
    let mut rows = 1;
    rows += load_stock(conn, gen, w)?;
    rows += load_districts(conn, gen, w)?;
    rows += load_customers(conn, gen, w)?;
    rows += load_history(conn, gen, w)?;
    rows += load_orders(conn, gen, w)?;
    Ok(rows)
}

/// Warehouse `w`'s stock of every item.
fn load_stock(conn: &mut Conn, gen: &mut Gen, w: u32) -> Result<u64> {
    let mut ins = Inserter::new(
        conn,
        "INSERT INTO stock (s_i_id, s_w_id, s_quantity, s_dist_01, s_dist_02, s_dist_03, \
         s_dist_04, s_dist_05, s_dist_06, s_dist_07, s_dist_08, s_dist_09, s_dist_10, \
         s_ytd, s_order_cnt, s_remote_cnt, s_data)",
    );
    for i in 1..=ITEMS {
        let mut v = format!("{i},{w},{}", gen.rng.gen_range(10..=100));
        for _ in 0..10 {
            v.push_str(",'");
            v.push_str(&gen.astr(24, 24));
            v.push('\'');
        }
        v.push_str(&format!(",0,0,0,'{}'", gen.data()));
        ins.row(&v)?;
    }
    ins.flush()
}

/// Warehouse `w`'s districts.
fn load_districts(conn: &mut Conn, gen: &mut Gen, w: u32) -> Result<u64> {
    let mut ins = Inserter::new(
        conn,
        "INSERT INTO district (d_id, d_w_id, d_name, d_street_1, d_street_2, d_city, \
         d_state, d_zip, d_tax, d_ytd, d_next_o_id)",
    );
    for d in 1..=DISTRICTS_PER_WAREHOUSE {
        let v = format!(
            "{d},{w},'{}',{},{},30000.00,{}",
            gen.astr(6, 10),
            gen.address(),
            gen.tax(),
            ORDERS_PER_DISTRICT + 1
        );
        ins.row(&v)?;
    }
    ins.flush()
}

/// The customers of warehouse `w`'s districts.
fn load_customers(conn: &mut Conn, gen: &mut Gen, w: u32) -> Result<u64> {
    let mut ins = Inserter::new(
        conn,
        "INSERT INTO customer (c_id, c_d_id, c_w_id, c_first, c_middle, c_last, c_street_1, \
         c_street_2, c_city, c_state, c_zip, c_phone, c_since, c_credit, c_credit_lim, \
         c_discount, c_balance, c_ytd_payment, c_payment_cnt, c_delivery_cnt, c_data)",
    );
    for d in 1..=DISTRICTS_PER_WAREHOUSE {
        for c in 1..=CUSTOMERS_PER_DISTRICT {
            let credit = if gen.rng.gen_range(0..10) == 0 {
                "BC"
            } else {
                "GC"
            };
            let v = format!(
                "{c},{d},{w},'{}','OE','{}',{},'{}',NOW(),'{credit}',50000.00,0.{:04},\
                 -10.00,10.00,1,0,'{}'",
                gen.astr(8, 16),
                last_name(c - 1),
                gen.address(),
                gen.nstr(16),
                gen.rng.gen_range(0..=5000),
                gen.astr(300, 500)
            );
            ins.row(&v)?;
        }
    }
    ins.flush()
}

/// One history row per customer of warehouse `w`.
fn load_history(conn: &mut Conn, gen: &mut Gen, w: u32) -> Result<u64> {
    let mut ins = Inserter::new(
        conn,
        "INSERT INTO history (h_c_id, h_c_d_id, h_c_w_id, h_d_id, h_w_id, h_date, \
         h_amount, h_data)",
    );
    for d in 1..=DISTRICTS_PER_WAREHOUSE {
        for c in 1..=CUSTOMERS_PER_DISTRICT {
            ins.row(&format!(
                "{c},{d},{w},{d},{w},NOW(),10.00,'{}'",
                gen.astr(12, 24)
            ))?;
        }
    }
    ins.flush()
}

/// Warehouse `w`'s orders, their lines and the undelivered ones' new-order rows.
fn load_orders(conn: &mut Conn, gen: &mut Gen, w: u32) -> Result<u64> {
    let delivered_up_to = ORDERS_PER_DISTRICT - NEW_ORDERS_PER_DISTRICT;
    let (orders, lines) = order_rows(gen, w, delivered_up_to);
    let mut ins = Inserter::new(
        conn,
        "INSERT INTO orders (o_id, o_d_id, o_w_id, o_c_id, o_entry_d, o_carrier_id, \
         o_ol_cnt, o_all_local)",
    );
    for v in &orders {
        ins.row(v)?;
    }
    let mut rows = ins.flush()?;
    let mut ins = Inserter::new(
        conn,
        "INSERT INTO order_line (ol_o_id, ol_d_id, ol_w_id, ol_number, ol_i_id, \
         ol_supply_w_id, ol_delivery_d, ol_quantity, ol_amount, ol_dist_info)",
    );
    for v in &lines {
        ins.row(v)?;
    }
    rows += ins.flush()?;
    let mut ins = Inserter::new(conn, "INSERT INTO new_order (no_o_id, no_d_id, no_w_id)");
    for d in 1..=DISTRICTS_PER_WAREHOUSE {
        for o in delivered_up_to + 1..=ORDERS_PER_DISTRICT {
            ins.row(&format!("{o},{d},{w}"))?;
        }
    }
    rows += ins.flush()?;
    Ok(rows)
}

/// The order and order-line rows of warehouse `w`: o_c_id is a random permutation of the
/// customers; orders after `delivered_up_to` are undelivered (no carrier, no delivery date, an
/// amount).
fn order_rows(gen: &mut Gen, w: u32, delivered_up_to: u32) -> (Vec<String>, Vec<String>) {
    let mut orders = Vec::new();
    let mut lines = Vec::new();
    for d in 1..=DISTRICTS_PER_WAREHOUSE {
        let mut customers: Vec<u32> = (1..=CUSTOMERS_PER_DISTRICT).collect();
        for i in (1..customers.len()).rev() {
            let j = gen.rng.gen_range(0..=i);
            customers.swap(i, j);
        }
        for o in 1..=ORDERS_PER_DISTRICT {
            let delivered = o <= delivered_up_to;
            let ol_cnt = gen.rng.gen_range(5..=15u32);
            let carrier = if delivered {
                gen.rng.gen_range(1..=10).to_string()
            } else {
                "NULL".to_string()
            };
            let c = customers[(o - 1) as usize];
            orders.push(format!("{o},{d},{w},{c},NOW(),{carrier},{ol_cnt},1"));
            for n in 1..=ol_cnt {
                let (date, amount) = if delivered {
                    ("NOW()", "0.00".to_string())
                } else {
                    ("NULL", money(gen.rng.gen_range(1..=999_999)))
                };
                lines.push(format!(
                    "{o},{d},{w},{n},{},{w},{date},5,{amount},'{}'",
                    gen.rng.gen_range(1..=ITEMS),
                    gen.astr(24, 24)
                ));
            }
        }
    }
    (orders, lines)
}

/// Record in the marker table that this scale is loaded (`rows` rows in `seconds`).
fn write_marker(conn: &mut Conn, cfg: &TpccConfig, rows: u64, seconds: f64) -> Result<()> {
    conn.exec_drop(
        format!(
            "INSERT INTO {MARKER} (version, warehouses, items, customers_per_district, \
             orders_per_district, rows_loaded, load_seconds, loaded_at) \
             VALUES (?, ?, ?, ?, ?, ?, ?, NOW())"
        ),
        (
            LOADER_VERSION,
            cfg.warehouses,
            ITEMS,
            CUSTOMERS_PER_DISTRICT,
            ORDERS_PER_DISTRICT,
            rows,
            seconds,
        ),
    )
    .context("writing the TPC-C-like load marker")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn last_names() {
        assert_eq!(last_name(0), "BARBARBAR");
        assert_eq!(last_name(371), "PRICALLYOUGHT");
    }

    #[test]
    fn the_data_set_is_fixed() {
        let mut a = Gen {
            rng: SmallRng::seed_from_u64(LOAD_SEED),
        };
        let mut b = Gen {
            rng: SmallRng::seed_from_u64(LOAD_SEED),
        };
        for _ in 0..100 {
            assert_eq!(a.data(), b.data());
            assert_eq!(a.address(), b.address());
        }
        let s = a.astr(24, 24);
        assert_eq!(s.len(), 24);
        assert!(s
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || c == b'_' || c == b'.'));
    }
}
