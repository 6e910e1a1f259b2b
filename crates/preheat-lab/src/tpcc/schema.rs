//! The schema (TPC-C's nine tables with their columns, types and primary keys, plus two
//! secondary indexes) and the marker table that records which scale is loaded.

use anyhow::{bail, Result};
use mysql::prelude::Queryable;
use mysql::{Conn, Row};

use super::{CUSTOMERS_PER_DISTRICT, ITEMS, ORDERS_PER_DISTRICT};

/// Version of the schema and loader; a different version in the marker table means reload.
///
/// 2: the loader draws from `rand`'s `SmallRng` (1: a hand-written SplitMix64; other data).
pub(super) const LOADER_VERSION: u32 = 2;
/// Marker table: present and equal to the wanted scale = loaded.
pub(super) const MARKER: &str = "preheat_tpcc_scale";

/// The scale recorded in the marker table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Scale {
    pub(super) version: u32,
    pub(super) warehouses: u32,
    items: u32,
    customers: u32,
    orders: u32,
}

impl Scale {
    pub(super) fn of(warehouses: u32) -> Scale {
        Scale {
            version: LOADER_VERSION,
            warehouses,
            items: ITEMS,
            customers: CUSTOMERS_PER_DISTRICT,
            orders: ORDERS_PER_DISTRICT,
        }
    }
}

/// The marker in the current database: `None` when absent.
pub(super) fn read_marker(conn: &mut Conn) -> Result<Option<Scale>> {
    let exists: Option<u64> = conn.exec_first(
        "SELECT COUNT(*) FROM information_schema.tables \
         WHERE table_schema = DATABASE() AND table_name = ?",
        (MARKER,),
    )?;
    if exists.unwrap_or(0) == 0 {
        return Ok(None);
    }
    let row: Option<Row> = conn.query_first(format!(
        "SELECT version, warehouses, items, customers_per_district, orders_per_district \
         FROM {MARKER} LIMIT 1"
    ))?;
    let Some(row) = row else { return Ok(None) };
    let get = |i: usize| -> Result<u32> {
        match row.get_opt::<u32, usize>(i) {
            Some(Ok(v)) => Ok(v),
            _ => bail!("{MARKER} has an unexpected column {i}"),
        }
    };
    Ok(Some(Scale {
        version: get(0)?,
        warehouses: get(1)?,
        items: get(2)?,
        customers: get(3)?,
        orders: get(4)?,
    }))
}

pub(super) const TABLES: [&str; 10] = [
    MARKER,
    "order_line",
    "new_order",
    "orders",
    "history",
    "customer",
    "district",
    "stock",
    "item",
    "warehouse",
];

pub(super) const SCHEMA: &str = "
CREATE TABLE warehouse (
  w_id SMALLINT NOT NULL, w_name VARCHAR(10), w_street_1 VARCHAR(20), w_street_2 VARCHAR(20),
  w_city VARCHAR(20), w_state CHAR(2), w_zip CHAR(9), w_tax DECIMAL(4,4), w_ytd DECIMAL(12,2),
  PRIMARY KEY (w_id)) ENGINE=InnoDB;
CREATE TABLE district (
  d_id TINYINT NOT NULL, d_w_id SMALLINT NOT NULL, d_name VARCHAR(10), d_street_1 VARCHAR(20),
  d_street_2 VARCHAR(20), d_city VARCHAR(20), d_state CHAR(2), d_zip CHAR(9),
  d_tax DECIMAL(4,4), d_ytd DECIMAL(12,2), d_next_o_id INT,
  PRIMARY KEY (d_w_id, d_id)) ENGINE=InnoDB;
CREATE TABLE customer (
  c_id INT NOT NULL, c_d_id TINYINT NOT NULL, c_w_id SMALLINT NOT NULL, c_first VARCHAR(16),
  c_middle CHAR(2), c_last VARCHAR(16), c_street_1 VARCHAR(20), c_street_2 VARCHAR(20),
  c_city VARCHAR(20), c_state CHAR(2), c_zip CHAR(9), c_phone CHAR(16), c_since DATETIME,
  c_credit CHAR(2), c_credit_lim DECIMAL(12,2), c_discount DECIMAL(4,4),
  c_balance DECIMAL(12,2), c_ytd_payment DECIMAL(12,2), c_payment_cnt SMALLINT,
  c_delivery_cnt SMALLINT, c_data VARCHAR(500),
  PRIMARY KEY (c_w_id, c_d_id, c_id),
  KEY idx_customer (c_w_id, c_d_id, c_last, c_first)) ENGINE=InnoDB;
CREATE TABLE history (
  h_c_id INT, h_c_d_id TINYINT, h_c_w_id SMALLINT, h_d_id TINYINT, h_w_id SMALLINT,
  h_date DATETIME, h_amount DECIMAL(6,2), h_data VARCHAR(24)) ENGINE=InnoDB;
CREATE TABLE orders (
  o_id INT NOT NULL, o_d_id TINYINT NOT NULL, o_w_id SMALLINT NOT NULL, o_c_id INT,
  o_entry_d DATETIME, o_carrier_id TINYINT, o_ol_cnt TINYINT, o_all_local TINYINT,
  PRIMARY KEY (o_w_id, o_d_id, o_id),
  KEY idx_orders (o_w_id, o_d_id, o_c_id, o_id)) ENGINE=InnoDB;
CREATE TABLE new_order (
  no_o_id INT NOT NULL, no_d_id TINYINT NOT NULL, no_w_id SMALLINT NOT NULL,
  PRIMARY KEY (no_w_id, no_d_id, no_o_id)) ENGINE=InnoDB;
CREATE TABLE order_line (
  ol_o_id INT NOT NULL, ol_d_id TINYINT NOT NULL, ol_w_id SMALLINT NOT NULL,
  ol_number TINYINT NOT NULL, ol_i_id INT, ol_supply_w_id SMALLINT, ol_delivery_d DATETIME,
  ol_quantity TINYINT, ol_amount DECIMAL(6,2), ol_dist_info CHAR(24),
  PRIMARY KEY (ol_w_id, ol_d_id, ol_o_id, ol_number)) ENGINE=InnoDB;
CREATE TABLE item (
  i_id INT NOT NULL, i_im_id INT, i_name VARCHAR(24), i_price DECIMAL(5,2), i_data VARCHAR(50),
  PRIMARY KEY (i_id)) ENGINE=InnoDB;
CREATE TABLE stock (
  s_i_id INT NOT NULL, s_w_id SMALLINT NOT NULL, s_quantity SMALLINT,
  s_dist_01 CHAR(24), s_dist_02 CHAR(24), s_dist_03 CHAR(24), s_dist_04 CHAR(24),
  s_dist_05 CHAR(24), s_dist_06 CHAR(24), s_dist_07 CHAR(24), s_dist_08 CHAR(24),
  s_dist_09 CHAR(24), s_dist_10 CHAR(24), s_ytd DECIMAL(8,0), s_order_cnt SMALLINT,
  s_remote_cnt SMALLINT, s_data VARCHAR(50),
  PRIMARY KEY (s_w_id, s_i_id)) ENGINE=InnoDB;
CREATE TABLE preheat_tpcc_scale (
  version INT NOT NULL, warehouses INT NOT NULL, items INT NOT NULL,
  customers_per_district INT NOT NULL, orders_per_district INT NOT NULL,
  rows_loaded BIGINT NOT NULL, load_seconds DOUBLE NOT NULL, loaded_at DATETIME NOT NULL)
  ENGINE=InnoDB;
";
