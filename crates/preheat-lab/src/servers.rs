//! The catalog of servers under test. INTERFACE FIXED BY THE LEAD: keep the public signatures;
//! fill in the bodies.
//!
//! The catalog only *plans* a server (checks the program is installed, writes its configuration
//! and data directory into a work directory, builds its command line) and *prepares* it once it
//! listens (loads the data the workload reads). Starting, pinning, attaching the agent and
//! stopping belong to the caller's launcher (`preheat-cli::launch`), so process cleanup lives
//! in one place.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Result;
use serde::{Deserialize, Serialize};

use crate::driver::{Protocol, WorkloadSpec};

/// A server preheat knows how to configure, load and query.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum ServerKind {
    /// The bundled epoll key-value server (memcached text protocol); needs no installs.
    Kv,
    /// memcached (Debian package `memcached`), one worker thread.
    Memcached,
    /// nginx (Debian package `nginx-light` or `nginx`) serving a small static site, one worker.
    Nginx,
    /// redis (Debian package `redis-server`), no persistence.
    Redis,
    /// MariaDB (Debian package `mariadb-server`) with a TPC-C-like database.
    Mariadb,
}

impl ServerKind {
    pub const ALL: [ServerKind; 5] = [
        ServerKind::Kv,
        ServerKind::Memcached,
        ServerKind::Nginx,
        ServerKind::Redis,
        ServerKind::Mariadb,
    ];

    /// Short name used in file names, reports and `--server`.
    pub fn name(self) -> &'static str {
        match self {
            ServerKind::Kv => "preheat-kv",
            ServerKind::Memcached => "memcached",
            ServerKind::Nginx => "nginx",
            ServerKind::Redis => "redis",
            ServerKind::Mariadb => "mariadb",
        }
    }

    pub fn protocol(self) -> Protocol {
        match self {
            ServerKind::Kv | ServerKind::Memcached => Protocol::Memcached,
            ServerKind::Nginx => Protocol::Http,
            ServerKind::Redis => Protocol::Redis,
            ServerKind::Mariadb => Protocol::Mysql,
        }
    }

    /// The Debian package that provides the server (`None`: bundled).
    pub fn package(self) -> Option<&'static str> {
        match self {
            ServerKind::Kv => None,
            ServerKind::Memcached => Some("memcached"),
            ServerKind::Nginx => Some("nginx-light"),
            ServerKind::Redis => Some("redis-server"),
            ServerKind::Mariadb => Some("mariadb-server"),
        }
    }
}

/// Knobs of a plan.
#[derive(Debug, Clone, Default)]
pub struct PlanOptions {
    /// The bundled server's binary (required for `Kv`; the CLI knows where it is).
    pub kv_bin: Option<PathBuf>,
    /// TPC-C warehouses for MariaDB (0: the default, 2).
    pub warehouses: u32,
}

/// How to start one server: everything the launcher needs.
#[derive(Debug, Clone)]
pub struct Plan {
    pub kind: ServerKind,
    /// Process name for logs and reports.
    pub name: String,
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    /// Attach the agent only to processes with this executable basename (e.g. not to the shell
    /// or helper processes a server spawns).
    pub agent_only: Option<String>,
    pub port: u16,
    /// How long start-up (until the port accepts connections) may take.
    pub start_timeout: Duration,
    /// The measured request of this server's workload.
    pub workload: WorkloadSpec,
    /// The work directory holding configuration, data and logs.
    pub workdir: PathBuf,
}

/// What `prepare` loaded.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Prepared {
    /// Items (keys, files, rows) loaded.
    pub items: u64,
    pub seconds: f64,
    pub detail: String,
}

/// Check the server is installed (else: an error naming the Debian package and
/// `scripts/setup-lab.sh`), write its configuration and data directory under `workdir`, and
/// return its command line for `port` on 127.0.0.1.
pub fn plan(kind: ServerKind, port: u16, workdir: &Path, opts: &PlanOptions) -> Result<Plan> {
    let _ = (kind, port, workdir, opts);
    todo!("helper")
}

/// Once the server listens on `addr`: load the data its workload reads (memcached/redis keys,
/// MariaDB's TPC-C-like tables). Idempotent; the preloaded preheat-kv needs nothing.
pub fn prepare(plan: &Plan, addr: SocketAddr) -> Result<Prepared> {
    let _ = (plan, addr);
    todo!("helper")
}
