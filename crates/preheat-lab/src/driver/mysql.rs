//! MySQL/MariaDB: one TPC-C-like transaction per request, through the `mysql` crate (blocking
//! only, so no multiplexed path).

use std::net::SocketAddr;

use anyhow::Result;

use super::{Driver, Outcome, Protocol, WorkloadSpec};
use crate::tpcc::{TpccClient, TpccConfig};

/// A MySQL driver for `w` on `addr` (the default TPC-C-like configuration without `w.tpcc`).
pub(super) fn connect(addr: SocketAddr, w: &WorkloadSpec) -> Result<Box<dyn Driver>> {
    let default_cfg;
    let cfg = match &w.tpcc {
        Some(c) => c,
        None => {
            default_cfg = TpccConfig::default();
            &default_cfg
        }
    };
    let client = TpccClient::connect(addr, cfg)?;
    Ok(Box::new(MysqlDriver { client }))
}

struct MysqlDriver {
    client: TpccClient,
}

impl Driver for MysqlDriver {
    fn request(&mut self) -> Result<Outcome> {
        let t = self.client.transaction()?;
        Ok(Outcome {
            kind: t.kind.name(),
            ok: t.ok,
        })
    }

    fn protocol(&self) -> Protocol {
        Protocol::Mysql
    }
}
