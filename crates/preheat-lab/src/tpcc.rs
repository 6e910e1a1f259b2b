//! TPC-C-like schema, loader and transaction mix. INTERFACE FIXED BY THE LEAD.

use serde::{Deserialize, Serialize};

/// Database name and scale.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TpccConfig {
    pub database: String,
    pub user: String,
    pub warehouses: u32,
}
