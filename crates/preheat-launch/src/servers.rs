//! Servers under test, as the CLI starts them: the catalog of `preheat-lab` (memcached, nginx,
//! redis, MariaDB, the bundled preheat-kv) plus any command given after `--`.
//!
//! The catalog plans a server (configuration, data directory, command line); this module turns
//! the plan into a [`ServerSpec`] for the launcher (which attaches the agent, pins CPUs and
//! stops everything on exit or SIGTERM), then loads the server's data set.

use std::net::SocketAddr;
use std::path::Path;

use anyhow::{Context, Result};
use preheat_lab::driver::{self, Driver, RawExchange, Wait, WorkloadSpec};
pub use preheat_lab::servers::ServerKind;
use preheat_lab::servers::{Plan, PlanOptions};
use preheat_lab::tpcc::{TpccClient, TxKind};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::launch::{self, Client, Server, ServerSpec};
use crate::paths;

/// What a measurement sends.
#[derive(Debug, Clone)]
pub struct Workload {
    /// The catalog's workload (its protocol driver); `None` for a custom command, which only
    /// has the raw exchange.
    pub spec: Option<WorkloadSpec>,
    /// The fixed byte exchange the agent can send itself (the probe's request, the `replay`
    /// warm-up); `None` where none exists (MySQL needs a session).
    pub raw: Option<RawExchange>,
}

impl Workload {
    /// A custom server's workload: `request`, a reply ending with `until`; the request doubles
    /// as its own warm-up replay.
    pub fn custom(request: Vec<u8>, until: Vec<u8>) -> Workload {
        Workload {
            spec: None,
            raw: Some(RawExchange {
                replay: request.clone(),
                replay_until: until.clone(),
                request,
                until,
            }),
        }
    }

    /// HTTP/1.1 GETs of `path` on keep-alive connections (replies framed by their length), for
    /// a server outside the catalog.
    pub fn http_get(path: &str) -> Workload {
        Workload::of_spec(WorkloadSpec {
            protocol: driver::Protocol::Http,
            key: path.to_string(),
            expect: None,
            tpcc: None,
        })
    }

    /// The catalog workload of a plan.
    pub fn of(plan: &Plan) -> Workload {
        Workload::of_spec(plan.workload.clone())
    }

    /// The workload of a protocol driver's request (and the raw exchange it allows).
    pub fn of_spec(spec: WorkloadSpec) -> Workload {
        Workload {
            raw: spec.raw_exchange(),
            spec: Some(spec),
        }
    }

    /// Connect a requester (busy-polling where the protocol allows it).
    pub fn connect(&self, addr: SocketAddr) -> Result<Requester> {
        match (&self.spec, &self.raw) {
            (Some(s), _) if s.protocol == driver::Protocol::Mysql => {
                let cfg = s.tpcc.clone().unwrap_or_default();
                Ok(Requester::Tpcc {
                    client: Box::new(TpccClient::connect(addr, &cfg)?),
                    pinned: None,
                    draws: Box::new(StdRng::seed_from_u64(0x853c_49e6_748f_ea9b)),
                })
            }
            (Some(s), _) => Ok(Requester::Lab {
                driver: driver::connect(addr, s, Wait::Spin)?,
                addr,
                spec: s.clone(),
            }),
            (None, Some(r)) => Ok(Requester::Raw {
                client: Client::connect(addr)?,
                request: r.request.clone(),
                until: r.until.clone(),
            }),
            (None, None) => anyhow::bail!("a workload needs a protocol driver or a raw exchange"),
        }
    }
}

/// One connection that sends the workload's request.
pub enum Requester {
    /// A protocol driver's connection. A server that closes the connection after its reply
    /// (HTTP/1.0 like Python's `http.server`, `Connection: close`) gets a fresh connection
    /// opened *inside* the next request, as such a server's clients do: the connect, the
    /// server's accept and whatever it does per connection are part of the measured request. A
    /// keep-alive connection the server ended before answering (a request limit) is reopened and
    /// the request repeated once.
    Lab {
        driver: Box<dyn Driver>,
        addr: SocketAddr,
        spec: WorkloadSpec,
    },
    Raw {
        client: Client,
        request: Vec<u8>,
        until: Vec<u8>,
    },
    /// TPC-C-like transactions; `pinned` fixes the transaction type (see [`Requester::new_round`]).
    Tpcc {
        client: Box<TpccClient>,
        pinned: Option<TxKind>,
        /// The mix draws: a fixed seed, the same sequence every run.
        draws: Box<StdRng>,
    },
}

impl Requester {
    /// Send one request and read the whole reply. `Ok(false)`: a wrong reply (checked where the
    /// workload knows the right one).
    pub fn request(&mut self) -> Result<bool> {
        match self {
            Requester::Lab { driver, addr, spec } => {
                if driver.closing() {
                    *driver = driver::connect(*addr, spec, Wait::Spin)?;
                }
                match driver.request() {
                    Ok(o) => Ok(o.ok),
                    Err(e) if driver::is_stale(&e) => {
                        *driver = driver::connect(*addr, spec, Wait::Spin)?;
                        Ok(driver.request()?.ok)
                    }
                    Err(e) => Err(e),
                }
            }
            Requester::Tpcc { client, pinned, .. } => Ok(match pinned {
                Some(k) => client.run(*k)?.ok,
                None => client.transaction()?.ok,
            }),
            Requester::Raw {
                client,
                request,
                until,
            } => {
                client.request(request, until)?;
                Ok(true)
            }
        }
    }

    /// Start a measurement round: for workloads with several request types (the TPC-C-like
    /// mix), draw one type from the mix and send only that type until the next round, so every
    /// mode of a round measures the same transaction type (paired comparison) while the rounds
    /// follow the mix. Returns the type's name; `None` for single-request workloads.
    pub fn new_round(&mut self) -> Option<&'static str> {
        match self {
            Requester::Tpcc { pinned, draws, .. } => {
                let kind = TxKind::at_percentile(draws.gen_range(0..100));
                *pinned = Some(kind);
                Some(kind.name())
            }
            _ => None,
        }
    }

    /// Ask the kernel to stamp this connection's requests as they reach the wire (the demo's
    /// *wire* stage); false where it cannot (TPC-C-like sessions). A connection opened anew
    /// inside a request (a server that closes its connections) is not stamped.
    pub fn stamp_sends(&mut self) -> bool {
        match self {
            Requester::Lab { driver, .. } => driver.stamp_sends(),
            Requester::Raw { client, .. } => client.stamp_sends(),
            Requester::Tpcc { .. } => false,
        }
    }

    /// When the last request reached the wire (`CLOCK_MONOTONIC` ns), where stamped.
    pub fn sent_at_ns(&self) -> Option<u64> {
        match self {
            Requester::Lab { driver, .. } => driver.sent_at_ns(),
            Requester::Raw { client, .. } => client.sent_at_ns(),
            Requester::Tpcc { .. } => None,
        }
    }

    /// The kept connection the requests go on, where there is one (not where the server closes
    /// every connection, nor for the TPC-C-like sessions): the recorder hands it to the agent
    /// of the process that serves it (`Request::ProbeAdopt`), and leaves it alone until it
    /// takes it back.
    pub fn connection_fd(&self) -> Option<std::os::fd::RawFd> {
        match self {
            Requester::Lab { driver, .. } if !driver.closing() => driver.raw_fd(),
            Requester::Raw { client, .. } => Some(client.raw_fd()),
            _ => None,
        }
    }

    /// Why the last request's reply was wrong, where the protocol says (an SQL error of a
    /// TPC-C-like transaction).
    pub fn last_error(&self) -> Option<String> {
        match self {
            Requester::Tpcc { client, .. } => client.last_error().map(str::to_string),
            _ => None,
        }
    }

    /// Send one request; a wrong reply is an error.
    pub fn request_ok(&mut self) -> Result<()> {
        if !self.request()? {
            anyhow::bail!("the server sent a wrong reply");
        }
        Ok(())
    }
}

/// Where a catalog server runs: its CPUs, whether the agent is attached, and its network
/// namespace (`None`: ours, listening on 127.0.0.1; else the namespace of a veth pair,
/// listening on 0.0.0.0 there so the agent's own connections to 127.0.0.1 still reach it).
#[derive(Debug, Clone, Default)]
pub struct Placement {
    pub cpus: Vec<usize>,
    pub agent: bool,
    pub netns: Option<std::sync::Arc<preheat_engine::netns::VethHost>>,
}

/// Plan `kind` on `port` (default: a free one) in `workdir` and turn it into a launcher spec.
pub fn plan(
    kind: ServerKind,
    port: Option<u16>,
    workdir: &Path,
    at: Placement,
) -> Result<(ServerSpec, Plan)> {
    let port = match port {
        Some(p) => p,
        None => preheat_engine::host::free_port()?,
    };
    let opts = PlanOptions {
        kv_bin: if kind == ServerKind::Kv {
            Some(paths::kv_bin()?)
        } else {
            None
        },
        any_address: at.netns.is_some(),
        ..Default::default()
    };
    let workdir = workdir.join(kind.name());
    std::fs::create_dir_all(&workdir).with_context(|| format!("creating {}", workdir.display()))?;
    let plan = preheat_lab::servers::plan(kind, port, &workdir, &opts)?;
    let spec = ServerSpec {
        name: plan.name.clone(),
        argv: plan.argv.clone(),
        port,
        agent: at.agent,
        cpus: at.cpus,
        env: plan.env.clone(),
        agent_only: plan.agent_only.clone(),
        netns: at.netns,
    };
    Ok((spec, plan))
}

/// A catalog server, started and loaded.
pub struct Started {
    pub server: Server,
    pub plan: Plan,
    pub workload: Workload,
    pub prepared: preheat_lab::servers::Prepared,
}

/// Plan, start (placed `at`) and load `kind`; `workdir` holds its files and log.
pub fn start(
    kind: ServerKind,
    port: Option<u16>,
    workdir: &Path,
    at: Placement,
) -> Result<Started> {
    let (spec, plan) = plan(kind, port, workdir, at)?;
    let server = launch::start(spec, &paths::run_dir(), workdir, plan.start_timeout)?;
    let prepared = prepare(&plan, server.addr())?;
    let workload = Workload::of(&plan);
    Ok(Started {
        server,
        plan,
        workload,
        prepared,
    })
}

/// Load the data set of a planned server listening at `addr`.
pub fn prepare(plan: &Plan, addr: SocketAddr) -> Result<preheat_lab::servers::Prepared> {
    preheat_lab::servers::prepare(plan, addr)
        .with_context(|| format!("loading {}'s data set", plan.name))
}
