//! The catalog of servers under test (paper §4, Table 1: nginx, memcached and MariaDB running a
//! TPC-C-like DBT-2 workload; plus redis and the bundled preheat-kv).
//!
//! The catalog only *plans* a server (checks the program is installed, writes its configuration
//! and data directory into a work directory, builds its command line) and *prepares* it once it
//! listens (loads the data the workload reads). Starting, pinning, attaching the agent and
//! stopping belong to the caller's launcher (`preheat-launch`), so process cleanup lives
//! in one place.
//!
//! Every server listens on 127.0.0.1:PORT (0.0.0.0 in a network namespace of its own), runs
//! in the foreground (no daemonizing), keeps its configuration, data, pid file and logs inside
//! the work directory, and runs as root too.
//!
//! What "one request" is, per server (the unit whose response time is measured):
//!
//! * **preheat-kv / memcached** — one `get key:42` of a preloaded 100-byte value: the paper's
//!   memcached request (a small GET that hits).
//! * **nginx** — one keep-alive `GET /index.html` of a ~4 KiB static page: the paper's nginx
//!   request (static content, so the server's own path is measured, not a backend).
//! * **redis** — one `GET key:42` of the same preloaded value as memcached, for comparison.
//! * **MariaDB** — one TPC-C-like transaction (new-order, payment or order-status, drawn from
//!   the mix; see [`crate::tpcc`]): the paper's DBT-2 response time is per transaction, and a
//!   transaction is what a client waits for.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::driver::{self, Protocol, Wait, WorkloadSpec};
use crate::tpcc::{self, TpccConfig};

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
    /// Directories searched for the server programs, in order. `None`: `$PATH`, then
    /// [`SYSTEM_DIRS`] (Debian installs nginx and mariadbd in `/usr/sbin`, which a non-root
    /// `$PATH` often lacks).
    pub search_path: Option<Vec<PathBuf>>,
    /// Listen on every address (0.0.0.0) instead of 127.0.0.1: for a server in a network
    /// namespace of its own, reached over a veth pair. Not for MariaDB (its grant tables admit
    /// root from 127.0.0.1 only).
    pub any_address: bool,
}

/// Searched after `$PATH`.
pub use preheat_engine::host::SBIN_DIRS as SYSTEM_DIRS;

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

/// Keys `key:0 .. key:ITEMS-1` are loaded into the key-value servers ...
pub const KV_ITEMS: usize = 1000;
/// ... each holding a value of this many bytes ([`value_for`]) ...
pub const VALUE_SIZE: usize = 100;
/// ... and the measured request reads this one.
pub const MEASURED_KEY: &str = "key:42";
const MEASURED_INDEX: usize = 42;

/// The value stored under `key:{i}`: [`VALUE_SIZE`] bytes where byte `j` is
/// `'a' + (i + j) % 26` — exactly what `preheat-kv --items N --value-size 100` preloads, so a
/// workload's `expect` is the same for preheat-kv, memcached and redis.
pub fn value_for(i: usize) -> String {
    (0..VALUE_SIZE)
        .map(|j| char::from(b'a' + (i.wrapping_add(j) % 26) as u8))
        .collect()
}

/// Check the server is installed (else: an error naming the Debian package and
/// `scripts/setup-lab.sh`), write its configuration and data directory under `workdir`, and
/// return its command line for `port` on 127.0.0.1 (every address with `opts.any_address`).
pub fn plan(kind: ServerKind, port: u16, workdir: &Path, opts: &PlanOptions) -> Result<Plan> {
    if port == 0 {
        bail!("plan {}: a fixed port is needed (got 0)", kind.name());
    }
    if opts.any_address && kind == ServerKind::Mariadb {
        bail!(
            "mariadb cannot run in a network namespace of its own here: its grant tables admit \
             root from 127.0.0.1 only (use another server, or the loopback)"
        );
    }
    let host = if opts.any_address {
        "0.0.0.0"
    } else {
        "127.0.0.1"
    };
    // Check the program first: a missing program should not leave an empty work directory.
    let program = match kind {
        ServerKind::Kv => kv_program(opts)?,
        ServerKind::Memcached => find_program(kind, &["memcached"], opts)?,
        ServerKind::Nginx => find_program(kind, &["nginx"], opts)?,
        ServerKind::Redis => find_program(kind, &["redis-server"], opts)?,
        ServerKind::Mariadb => find_program(kind, &["mariadbd", "mysqld"], opts)?,
    };
    std::fs::create_dir_all(workdir)
        .with_context(|| format!("creating the work directory {}", workdir.display()))?;
    let workdir = workdir
        .canonicalize()
        .with_context(|| format!("resolving the work directory {}", workdir.display()))?;
    let dir = path_str(&workdir)?;
    let p = port.to_string();
    let prog = path_str(&program)?.to_string();
    let kv_workload = WorkloadSpec {
        protocol: kind.protocol(),
        key: MEASURED_KEY.to_string(),
        expect: Some(value_for(MEASURED_INDEX).into_bytes()),
        tpcc: None,
    };
    let mut plan = Plan {
        kind,
        name: kind.name().to_string(),
        argv: Vec::new(),
        env: Vec::new(),
        // The agent compares the basename of /proc/self/exe, which resolves symlinks: Debian's
        // /usr/bin/redis-server is a symlink to redis-check-rdb, /usr/sbin/mysqld to mariadbd.
        agent_only: Some(exe_basename(&program)),
        port,
        start_timeout: Duration::from_secs(20),
        workload: kv_workload,
        workdir: workdir.clone(),
    };
    match kind {
        ServerKind::Kv => {
            plan.argv = strings(&[
                &prog,
                "--listen",
                &format!("{host}:{p}"),
                "--items",
                &KV_ITEMS.to_string(),
                "--value-size",
                &VALUE_SIZE.to_string(),
                "--quiet",
            ]);
        }
        ServerKind::Memcached => plan.argv = memcached_argv(&prog, &p, host),
        ServerKind::Nginx => {
            let index = write_site(&workdir)?;
            let info = nginx_build_info(&program);
            let conf = nginx_conf(&info, &workdir, host, port)?;
            let conf_path = workdir.join("nginx.conf");
            write(&conf_path, conf.as_bytes())?;
            let mut argv = strings(&[&prog, "-p", &format!("{dir}/"), "-c", path_str(&conf_path)?]);
            if nginx_supports_e(&info) {
                // Where nginx logs before it has read the configuration (Debian's build: stderr;
                // others: /var/log/nginx/error.log).
                argv.extend(strings(&["-e", &format!("{dir}/error.log")]));
            }
            plan.argv = argv;
            plan.workload = WorkloadSpec {
                protocol: Protocol::Http,
                key: "/index.html".to_string(),
                expect: Some(index),
                tpcc: None,
            };
        }
        ServerKind::Redis => plan.argv = redis_argv(&prog, &p, host, dir),
        ServerKind::Mariadb => plan_mariadb(&mut plan, prog, opts)?,
    }
    Ok(plan)
}

/// memcached's command line (see [`plan`]).
fn memcached_argv(prog: &str, port: &str, host: &str) -> Vec<String> {
    // One worker thread (-t 1), no UDP, 64 MB; the LRU crawler and maintainer threads
    // are off so the only activity is request handling. -u root: memcached refuses to
    // run as root without -u (and ignores it otherwise). It logs to stderr only.
    strings(&[
        prog,
        "-p",
        port,
        "-l",
        host,
        "-U",
        "0",
        "-t",
        "1",
        "-m",
        "64",
        "-u",
        "root",
        "-o",
        "no_lru_crawler,no_lru_maintainer",
    ])
}

/// redis's command line (see [`plan`]).
fn redis_argv(prog: &str, port: &str, host: &str, dir: &str) -> Vec<String> {
    // No persistence (--save "" --appendonly no), one I/O thread, no jemalloc background
    // thread, warnings only, logged into the work directory.
    strings(&[
        prog,
        "--port",
        port,
        "--bind",
        host,
        "--save",
        "",
        "--appendonly",
        "no",
        "--dir",
        dir,
        "--protected-mode",
        "no",
        "--daemonize",
        "no",
        "--supervised",
        "no",
        "--io-threads",
        "1",
        "--jemalloc-bg-thread",
        "no",
        "--loglevel",
        "warning",
        "--logfile",
        &format!("{dir}/redis.log"),
    ])
}

/// MariaDB's data directory, command line and TPC-C-like workload (see [`plan`]).
fn plan_mariadb(plan: &mut Plan, prog: String, opts: &PlanOptions) -> Result<()> {
    let (workdir, port) = (plan.workdir.clone(), plan.port);
    let dir = path_str(&workdir)?;
    let datadir = workdir.join("data");
    init_mariadb(&datadir, &workdir, opts)?;
    let tmp = workdir.join("tmp");
    std::fs::create_dir_all(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    let socket = mariadb_socket(&workdir, port);
    // Thread per connection (explicit; MariaDB's default on Linux) so a request is
    // served by its connection's own thread, as in the paper. Root logs in over TCP
    // without a password: mariadb-install-db --auth-root-authentication-method=normal
    // creates root@localhost, root@127.0.0.1 and root@::1 with empty passwords (checked
    // by the tests); --skip-name-resolve makes a TCP client from 127.0.0.1 match
    // root@127.0.0.1 without a reverse DNS lookup on every connect. The grant tables
    // stay on (no --skip-grant-tables), so the server behaves like a normal install.
    plan.argv = vec![
        prog,
        "--no-defaults".to_string(),
        format!("--datadir={}", path_str(&datadir)?),
        format!("--socket={}", path_str(&socket)?),
        format!("--port={port}"),
        "--bind-address=127.0.0.1".to_string(),
        "--user=root".to_string(),
        "--skip-log-bin".to_string(),
        "--skip-name-resolve".to_string(),
        "--thread-handling=one-thread-per-connection".to_string(),
        "--innodb-buffer-pool-size=64M".to_string(),
        "--innodb-flush-log-at-trx-commit=2".to_string(),
        "--performance-schema=OFF".to_string(),
        format!("--tmpdir={}", path_str(&tmp)?),
        format!("--log-error={dir}/mariadb.err"),
        format!("--pid-file={dir}/mariadb.pid"),
    ];
    plan.start_timeout = Duration::from_secs(60);
    plan.workload = WorkloadSpec {
        protocol: Protocol::Mysql,
        key: String::new(),
        expect: None,
        tpcc: Some(TpccConfig {
            warehouses: if opts.warehouses == 0 {
                2
            } else {
                opts.warehouses
            },
            ..TpccConfig::default()
        }),
    };
    Ok(())
}

/// Once the server listens on `addr`: load the data its workload reads (memcached/redis keys,
/// MariaDB's TPC-C-like tables). Idempotent; the preloaded preheat-kv needs nothing.
pub fn prepare(plan: &Plan, addr: SocketAddr) -> Result<Prepared> {
    prepare_with_progress(plan, addr, &|_| {})
}

/// [`prepare`], reporting what it does through `progress` (the TPC-C-like load takes seconds).
pub fn prepare_with_progress(
    plan: &Plan,
    addr: SocketAddr,
    progress: &dyn Fn(&str),
) -> Result<Prepared> {
    let started = Instant::now();
    let mut prepared = match plan.kind {
        ServerKind::Kv => Prepared {
            items: KV_ITEMS as u64,
            seconds: 0.0,
            detail: format!(
                "preheat-kv preloads key:0..key:{} ({VALUE_SIZE}-byte values)",
                KV_ITEMS - 1
            ),
        },
        ServerKind::Memcached => {
            progress(&format!("memcached: setting {KV_ITEMS} keys"));
            pipeline_load(addr, b"STORED", |i| {
                let v = value_for(i);
                format!("set key:{i} 0 0 {}\r\n{v}\r\n", v.len()).into_bytes()
            })?;
            Prepared {
                items: KV_ITEMS as u64,
                seconds: 0.0,
                detail: format!("set key:0..key:{} ({VALUE_SIZE}-byte values)", KV_ITEMS - 1),
            }
        }
        ServerKind::Redis => {
            progress(&format!("redis: setting {KV_ITEMS} keys"));
            pipeline_load(addr, b"+OK", |i| {
                let k = format!("key:{i}");
                let v = value_for(i);
                format!(
                    "*3\r\n$3\r\nSET\r\n${}\r\n{k}\r\n${}\r\n{v}\r\n",
                    k.len(),
                    v.len()
                )
                .into_bytes()
            })?;
            Prepared {
                items: KV_ITEMS as u64,
                seconds: 0.0,
                detail: format!("SET key:0..key:{} ({VALUE_SIZE}-byte values)", KV_ITEMS - 1),
            }
        }
        ServerKind::Nginx => Prepared {
            items: SITE_FILES as u64,
            seconds: 0.0,
            detail: format!(
                "static site of {SITE_FILES} files in {}/site",
                plan.workdir.display()
            ),
        },
        ServerKind::Mariadb => {
            let cfg = plan.workload.tpcc.clone().unwrap_or_default();
            let loaded = tpcc::load(addr, &cfg, progress)
                .with_context(|| format!("loading the TPC-C-like data into MariaDB at {addr}"))?;
            Prepared {
                items: loaded.rows,
                seconds: 0.0,
                detail: loaded.detail,
            }
        }
    };
    // The measured request must succeed before anything is measured (this also checks that
    // `expect` matches what the server really holds).
    if plan.kind != ServerKind::Mariadb {
        let mut d = driver::connect(addr, &plan.workload, Wait::Block)?;
        let out = d
            .request()
            .with_context(|| format!("checking {}'s measured request", plan.name))?;
        if !out.ok {
            bail!(
                "{} at {addr} did not return the expected reply to the measured request \
                 ({} {})",
                plan.name,
                out.kind,
                plan.workload.key
            );
        }
    }
    prepared.seconds = started.elapsed().as_secs_f64();
    Ok(prepared)
}

// ---------------------------------------------------------------------------------------------
// Programs

fn install_hint(program: &str, kind: ServerKind) -> String {
    let package = kind.package().unwrap_or("?");
    format!("{program} is not installed: run scripts/setup-lab.sh (or apt-get install {package})")
}

/// The directories searched for programs.
fn search_dirs(opts: &PlanOptions) -> Vec<PathBuf> {
    if let Some(dirs) = &opts.search_path {
        return dirs.clone();
    }
    preheat_engine::host::search_dirs()
}

/// The first of `names` found in the search path.
fn find_program(kind: ServerKind, names: &[&str], opts: &PlanOptions) -> Result<PathBuf> {
    let dirs = search_dirs(opts);
    names
        .iter()
        .find_map(|name| preheat_engine::host::find_in(name, &dirs))
        .ok_or_else(|| anyhow!(install_hint(names.first().copied().unwrap_or("?"), kind)))
}

fn kv_program(opts: &PlanOptions) -> Result<PathBuf> {
    let Some(bin) = &opts.kv_bin else {
        bail!(
            "the bundled preheat-kv needs its binary: build it with `cargo build -p preheat-kv` \
             and pass its path (PlanOptions::kv_bin)"
        );
    };
    if !preheat_engine::host::is_executable(bin) {
        bail!(
            "preheat-kv binary {} is missing or not executable: build it with \
             `cargo build -p preheat-kv`",
            bin.display()
        );
    }
    bin.canonicalize()
        .with_context(|| format!("resolving {}", bin.display()))
}

/// Basename of the executable `p` really runs (symlinks resolved).
fn exe_basename(p: &Path) -> String {
    let real = p.canonicalize().unwrap_or_else(|_| p.to_path_buf());
    real.file_name()
        .or_else(|| p.file_name())
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

fn path_str(p: &Path) -> Result<&str> {
    p.to_str()
        .ok_or_else(|| anyhow!("path {} is not valid UTF-8", p.display()))
}

fn strings(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| s.to_string()).collect()
}

fn write(path: &Path, data: &[u8]) -> Result<()> {
    std::fs::write(path, data).with_context(|| format!("writing {}", path.display()))
}

/// The effective uid of this process (from /proc/self/status).
fn effective_uid() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(2)?.parse().ok()
}

// ---------------------------------------------------------------------------------------------
// nginx

/// Files of the static site.
const SITE_FILES: usize = 5;

/// Write the static site into `workdir/site`; returns the measured page (index.html).
fn write_site(workdir: &Path) -> Result<Vec<u8>> {
    let site = workdir.join("site");
    std::fs::create_dir_all(&site).with_context(|| format!("creating {}", site.display()))?;
    let mut index = String::from(
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <title>preheat lab</title>\n<link rel=\"stylesheet\" href=\"/style.css\">\n</head>\n\
         <body>\n<h1>preheat lab</h1>\n<nav><a href=\"/about.html\">about</a> \
         <a href=\"/contact.html\">contact</a></nav>\n",
    );
    // Deterministic text, about 4 KiB in all.
    for i in 0..30 {
        index.push_str(&format!(
            "<p id=\"p{i}\">Paragraph {i}: a latency-critical server answers the first \
             request after an idle period as fast as a warm one.</p>\n"
        ));
    }
    index.push_str("</body>\n</html>\n");
    let pages: [(&str, String); SITE_FILES] = [
        ("index.html", index.clone()),
        (
            "about.html",
            "<!DOCTYPE html>\n<html><head><title>about</title></head><body>\n<h1>about</h1>\n\
             <p>Static pages served by nginx for preheat's measurements.</p>\n</body></html>\n"
                .to_string(),
        ),
        (
            "contact.html",
            "<!DOCTYPE html>\n<html><head><title>contact</title></head><body>\n\
             <h1>contact</h1>\n<p>Nobody reads this page.</p>\n</body></html>\n"
                .to_string(),
        ),
        (
            "style.css",
            "body { font-family: sans-serif; margin: 2em; }\nh1 { color: #333; }\n\
             nav a { margin-right: 1em; }\np { line-height: 1.4; }\n"
                .to_string(),
        ),
        (
            driver::HTTP_WARMUP_PATH.trim_start_matches('/'),
            String::from_utf8_lossy(driver::HTTP_WARMUP_BODY).into_owned(),
        ),
    ];
    for (name, content) in &pages {
        write(&site.join(name), content.as_bytes())?;
    }
    Ok(index.into_bytes())
}

/// `nginx -V` output (version and configure arguments; printed on stderr).
fn nginx_build_info(program: &Path) -> String {
    Command::new(program)
        .arg("-V")
        .stdin(Stdio::null())
        .output()
        .map(|o| {
            let mut s = String::from_utf8_lossy(&o.stderr).into_owned();
            s.push_str(&String::from_utf8_lossy(&o.stdout));
            s
        })
        .unwrap_or_default()
}

/// nginx ≥ 1.19.5 has `-e` (start-up error log); `info`: [`nginx_build_info`].
fn nginx_supports_e(info: &str) -> bool {
    let version = info
        .split("nginx/")
        .nth(1)
        .and_then(|v| v.split_whitespace().next())
        .map(|v| {
            v.split('.')
                .filter_map(|n| n.parse::<u32>().ok())
                .collect::<Vec<_>>()
        });
    matches!(version, Some(v) if v.as_slice() >= [1, 19, 5].as_slice())
}

/// `info`: [`nginx_build_info`] (which modules are compiled out).
fn nginx_conf(info: &str, workdir: &Path, host: &str, port: u16) -> Result<String> {
    let dir = path_str(workdir)?;
    if dir.contains(['"', '\\', '$', '\n', ';', '{', '}']) {
        bail!(
            "the nginx work directory {dir:?} contains characters nginx.conf cannot hold \
             (\" \\ $ ; {{ }} or a newline): choose another directory"
        );
    }
    // Every temp path lives in the work directory, so nothing under /var/lib/nginx is needed;
    // a module that is compiled out must not get its directive.
    let mut temp = format!("    client_body_temp_path \"{dir}/tmp/client_body\";\n");
    for module in ["proxy", "fastcgi", "uwsgi", "scgi"] {
        if !info.contains(&format!("--without-http_{module}_module")) {
            temp.push_str(&format!("    {module}_temp_path \"{dir}/tmp/{module}\";\n"));
        }
    }
    // The master runs as whoever starts it; as root the worker would switch to "nobody", who
    // cannot read a private work directory, so it stays root then (as the lab's other servers).
    let user = if effective_uid() == Some(0) {
        "user root;\n"
    } else {
        ""
    };
    std::fs::create_dir_all(workdir.join("tmp")).with_context(|| format!("creating {dir}/tmp"))?;
    Ok(format!(
        "# Generated by preheat-lab for one measurement: everything lives in {dir}.\n\
         {user}daemon off;\n\
         master_process on;\n\
         worker_processes 1;\n\
         pid \"{dir}/nginx.pid\";\n\
         error_log \"{dir}/error.log\" warn;\n\
         \n\
         events {{\n    use epoll;\n    worker_connections 1024;\n    accept_mutex off;\n}}\n\
         \n\
         http {{\n\
         \x20   access_log off;\n\
         \x20   server_tokens off;\n\
         \x20   sendfile on;\n\
         \x20   tcp_nodelay on;\n\
         \x20   keepalive_timeout 3600s;\n\
         \x20   keepalive_requests 1000000000;\n\
         {temp}\
         \x20   types {{\n        text/html html;\n        text/css css;\n        text/plain txt;\n    }}\n\
         \x20   default_type application/octet-stream;\n\
         \x20   server {{\n\
         \x20       listen {host}:{port};\n\
         \x20       server_name localhost;\n\
         \x20       root \"{dir}/site\";\n\
         \x20       location / {{\n        }}\n\
         \x20   }}\n\
         }}\n"
    ))
}

// ---------------------------------------------------------------------------------------------
// MariaDB

/// Written into the data directory once `mariadb-install-db` succeeded.
const INITIALIZED: &str = ".preheat-initialized";

/// Initialize `datadir` once (skipped when a previous plan did).
fn init_mariadb(datadir: &Path, workdir: &Path, opts: &PlanOptions) -> Result<()> {
    if datadir.join(INITIALIZED).exists() {
        return Ok(());
    }
    let install = find_program(
        ServerKind::Mariadb,
        &["mariadb-install-db", "mysql_install_db"],
        opts,
    )?;
    if datadir.exists() {
        // A half-initialized directory from an interrupted run.
        std::fs::remove_dir_all(datadir)
            .with_context(|| format!("removing the incomplete {}", datadir.display()))?;
    }
    let log_path = workdir.join("install-db.log");
    let log = std::fs::File::create(&log_path)
        .with_context(|| format!("creating {}", log_path.display()))?;
    let err = log
        .try_clone()
        .with_context(|| format!("opening {}", log_path.display()))?;
    let status = Command::new(&install)
        .arg("--no-defaults")
        .arg(format!("--datadir={}", path_str(datadir)?))
        .args([
            "--user=root",
            "--auth-root-authentication-method=normal",
            "--skip-test-db",
        ])
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(err)
        .status()
        .with_context(|| format!("running {}", install.display()))?;
    if !status.success() {
        let tail = std::fs::read_to_string(&log_path).unwrap_or_default();
        let tail: Vec<&str> = tail.lines().rev().take(15).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        bail!(
            "{} failed ({status}); its log is {}:\n{}",
            install.display(),
            log_path.display(),
            tail.join("\n")
        );
    }
    write(&datadir.join(INITIALIZED), b"initialized by preheat-lab\n")
}

/// The unix socket MariaDB always opens: in the work directory unless that path is too long
/// for a socket address (108 bytes), then in the temp directory.
fn mariadb_socket(workdir: &Path, port: u16) -> PathBuf {
    let p = workdir.join("mysqld.sock");
    if p.as_os_str().len() < 100 {
        p
    } else {
        std::env::temp_dir().join(format!("preheat-mariadb-{port}.sock"))
    }
}

// ---------------------------------------------------------------------------------------------
// Loading key-value servers

/// Send `command(0..KV_ITEMS)` pipelined in chunks of 100 and check that every reply line is
/// `ok_line`.
fn pipeline_load(
    addr: SocketAddr,
    ok_line: &[u8],
    command: impl Fn(usize) -> Vec<u8>,
) -> Result<()> {
    const CHUNK: usize = 100;
    let mut s = TcpStream::connect_timeout(&addr, driver::REPLY_TIMEOUT)
        .with_context(|| format!("connecting to {addr} to load keys"))?;
    s.set_read_timeout(Some(driver::REPLY_TIMEOUT))?;
    s.set_write_timeout(Some(driver::REPLY_TIMEOUT))?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    let mut start = 0;
    while start < KV_ITEMS {
        let end = (start + CHUNK).min(KV_ITEMS);
        let mut out = Vec::new();
        for i in start..end {
            out.extend_from_slice(&command(i));
        }
        s.write_all(&out)
            .with_context(|| format!("sending keys to {addr}"))?;
        let mut replies = 0;
        while replies < end - start {
            if let Some(pos) = buf.windows(2).position(|w| w == b"\r\n") {
                let line: Vec<u8> = buf.drain(..pos + 2).collect();
                if &line[..pos] != ok_line {
                    bail!(
                        "{addr} refused to store key:{}: {}",
                        start + replies,
                        String::from_utf8_lossy(&line[..pos]).escape_debug()
                    );
                }
                replies += 1;
                continue;
            }
            let n = s
                .read(&mut chunk)
                .with_context(|| format!("reading replies from {addr}"))?;
            if n == 0 {
                bail!("{addr} closed the connection while keys were loaded");
            }
            buf.extend_from_slice(&chunk[..n]);
        }
        start = end;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_match_preheat_kv() {
        // preheat-kv: byte j of key:i is 'a' + (i + j) % 26.
        let v = value_for(42);
        assert_eq!(v.len(), VALUE_SIZE);
        assert!(v.starts_with("qrstuvwxyzabc"));
        assert_eq!(&value_for(0)[..3], "abc");
    }

    #[test]
    fn missing_program_names_the_package() {
        let opts = PlanOptions {
            search_path: Some(vec![PathBuf::from("/nonexistent-preheat-dir")]),
            ..PlanOptions::default()
        };
        let e = find_program(ServerKind::Redis, &["redis-server"], &opts).unwrap_err();
        assert_eq!(
            e.to_string(),
            "redis-server is not installed: run scripts/setup-lab.sh (or apt-get install \
             redis-server)"
        );
    }
}
