//! The catalog against the real servers: plan into a temporary directory, start the command
//! line, prepare, and drive requests with every wait mode; plus the TPC-C-like workload on a
//! real MariaDB and the drivers' framing against scripted fake servers.
//!
//! A server that is not installed is skipped (`preheat_testsupport::skip`, the component its
//! program; `scripts/setup-lab.sh` installs them all).

// This test starts and stops servers itself; the lab's rule that it never does (its clippy.toml)
// is for the library.
#![allow(clippy::disallowed_methods)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use mysql::prelude::Queryable;
use preheat_lab::driver::{self, Protocol, Wait, WorkloadSpec};
use preheat_lab::servers::{self, Plan, PlanOptions, ServerKind};
use preheat_lab::tpcc::{self, TpccClient, TpccConfig, TxKind};

// ---------------------------------------------------------------------------------------------
// Helpers

/// A started server: its whole process group is killed on drop (also when a test panics),
/// before its work directory is removed.
struct Running {
    child: Child,
    plan: Plan,
    addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Drop for Running {
    fn drop(&mut self) {
        // The child leads its own process group (nginx's worker is in it too).
        let _ = preheat_engine::os::send_signal(self.child.id(), libc::SIGKILL, true);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

use preheat_testsupport::free_port;

fn kv_bin() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("PREHEAT_KV_BIN") {
        return Some(PathBuf::from(p));
    }
    let p = preheat_testsupport::built("preheat-kv");
    p.exists().then_some(p)
}

fn log_tail(dir: &std::path::Path) -> String {
    let mut out = String::new();
    for name in ["server.log", "error.log", "redis.log", "mariadb.err"] {
        if let Ok(s) = std::fs::read_to_string(dir.join(name)) {
            let lines: Vec<&str> = s.lines().collect();
            let from = lines.len().saturating_sub(20);
            out.push_str(&format!("--- {name}\n{}\n", lines[from..].join("\n")));
        }
    }
    out
}

/// The program a server needs, as a skip component.
fn program(kind: ServerKind) -> &'static str {
    match kind {
        ServerKind::Kv => "preheat-kv",
        ServerKind::Memcached => "memcached",
        ServerKind::Nginx => "nginx",
        ServerKind::Redis => "redis-server",
        ServerKind::Mariadb => "mariadbd",
    }
}

/// Plan `kind` into a fresh directory, start it and wait for its port. `None` (after reporting
/// the skip) when the program is not installed.
fn start(kind: ServerKind, warehouses: u32) -> Option<Running> {
    let mut opts = PlanOptions {
        warehouses,
        ..PlanOptions::default()
    };
    if kind == ServerKind::Kv {
        match kv_bin() {
            Some(b) => opts.kv_bin = Some(b),
            None => {
                preheat_testsupport::skip(
                    program(kind),
                    "target/debug/preheat-kv not built (cargo build -p preheat-kv) and \
                     PREHEAT_KV_BIN not set",
                );
                return None;
            }
        }
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    let t0 = Instant::now();
    let plan = match servers::plan(kind, port, dir.path(), &opts) {
        Ok(p) => p,
        Err(e) if e.to_string().contains("is not installed") => {
            preheat_testsupport::skip!(program(kind), "{}: {e}", kind.name());
            return None;
        }
        Err(e) => panic!("plan {}: {e:#}", kind.name()),
    };
    let planned = t0.elapsed();
    let log = std::fs::File::create(plan.workdir.join("server.log")).expect("server log");
    let child = Command::new(&plan.argv[0])
        .args(&plan.argv[1..])
        .envs(plan.env.iter().map(|(k, v)| (k, v)))
        .current_dir(&plan.workdir)
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .process_group(0)
        .spawn()
        .unwrap_or_else(|e| panic!("spawning {:?}: {e}", plan.argv));
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let mut running = Running {
        child,
        plan,
        addr,
        _dir: dir,
    };
    let deadline = Instant::now() + running.plan.start_timeout;
    loop {
        if preheat_engine::host::accepts_connections(addr, Duration::from_millis(200)) {
            break;
        }
        if let Ok(Some(status)) = running.child.try_wait() {
            panic!(
                "{} exited at start-up ({status}); argv {:?}\n{}",
                kind.name(),
                running.plan.argv,
                log_tail(&running.plan.workdir)
            );
        }
        if Instant::now() > deadline {
            panic!(
                "{} did not listen on {addr} within {:?}\n{}",
                kind.name(),
                running.plan.start_timeout,
                log_tail(&running.plan.workdir)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!(
        "{}: planned in {:.2} s, listening after {:.2} s; argv {:?}",
        kind.name(),
        planned.as_secs_f64(),
        t0.elapsed().as_secs_f64(),
        running.plan.argv
    );
    Some(running)
}

/// Send `req` on a plain socket and read until the reply ends with `until`.
fn raw(addr: SocketAddr, req: &[u8], until: &[u8]) -> Vec<u8> {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(req).unwrap();
    let mut reply = Vec::new();
    let mut buf = [0u8; 4096];
    while !reply.ends_with(until) {
        let n = s.read(&mut buf).unwrap_or_else(|e| {
            panic!(
                "no reply ending with {:?}: got {:?}: {e}",
                String::from_utf8_lossy(until),
                String::from_utf8_lossy(&reply)
            )
        });
        assert!(
            n > 0,
            "connection closed; got {:?}",
            String::from_utf8_lossy(&reply)
        );
        reply.extend_from_slice(&buf[..n]);
    }
    reply
}

/// Prepare, then drive the measured request with both wait modes, check that a wrong
/// expectation is noticed and that the raw exchange works.
fn exercise(r: &Running) {
    let t = Instant::now();
    let prepared = servers::prepare(&r.plan, r.addr).unwrap_or_else(|e| {
        panic!(
            "prepare {}: {e:#}\n{}",
            r.plan.name,
            log_tail(&r.plan.workdir)
        )
    });
    eprintln!(
        "{}: prepared {} items in {:.2} s ({})",
        r.plan.name,
        prepared.items,
        t.elapsed().as_secs_f64(),
        prepared.detail
    );
    // Wait::Epoll used synchronously (Driver::request) is Wait::Block.
    for wait in [Wait::Spin, Wait::Block, Wait::Epoll] {
        let mut d = driver::connect(r.addr, &r.plan.workload, wait).expect("connect driver");
        assert_eq!(d.protocol(), r.plan.kind.protocol());
        let t = Instant::now();
        let n = 25;
        for i in 0..n {
            let out = d
                .request()
                .unwrap_or_else(|e| panic!("{} {wait:?} request {i}: {e:#}", r.plan.name));
            assert!(
                out.ok,
                "{} {wait:?} request {i}: wrong reply ({out:?})",
                r.plan.name
            );
        }
        eprintln!(
            "{}: {n} requests ({wait:?}), {:.1} µs each on average",
            r.plan.name,
            t.elapsed().as_secs_f64() * 1e6 / n as f64
        );
    }
    // A wrong expectation must fail the check (so the check can fail at all).
    let mut wrong = r.plan.workload.clone();
    wrong.expect = Some(b"certainly not the value".to_vec());
    for wait in [Wait::Spin, Wait::Block] {
        let mut d = driver::connect(r.addr, &wrong, wait).expect("connect driver");
        let out = d.request().expect("request with a wrong expectation");
        assert!(!out.ok, "{}: a wrong expect passed", r.plan.name);
        // The connection stays in step: the next request is parsed as well.
        assert!(!d.request().expect("second request").ok);
    }
    // A key/path that does not exist: a complete, but wrong, reply.
    let mut missing = r.plan.workload.clone();
    missing.key = match r.plan.kind.protocol() {
        Protocol::Http => "/no-such-page.html".to_string(),
        _ => "no-such-key".to_string(),
    };
    let mut d = driver::connect(r.addr, &missing, Wait::Spin).expect("connect driver");
    assert!(!d.request().expect("request for a missing key").ok);
    assert!(!d.request().expect("second request for a missing key").ok);

    // The agent's raw exchange.
    let ex = r.plan.workload.raw_exchange().expect("a raw exchange");
    let reply = raw(r.addr, &ex.request, &ex.until);
    let expect = r.plan.workload.expect.as_ref().expect("expect");
    assert!(
        reply.windows(expect.len()).any(|w| w == &expect[..]),
        "{}: the raw reply does not contain the value",
        r.plan.name
    );
    let replay = raw(r.addr, &ex.replay, &ex.replay_until);
    assert!(replay.ends_with(&ex.replay_until));

    // prepare is idempotent.
    servers::prepare(&r.plan, r.addr).expect("second prepare");

    multiplexed_load(r);
}

/// The load engine's event loop (the drivers' non-blocking path), closed loop: 4 connections on
/// one thread with block and spin, 4 connections on 2 threads and 1 connection on 1 thread with
/// epoll: every request answered right, every connection measured, and the summary says the
/// event loop ran (epoll with threads == connections must not fall back to blocking reads).
fn multiplexed_load(r: &Running) {
    use preheat_lab::load::{self, ClientLoop, CsvSink, LoadConfig, Mode};
    use std::sync::atomic::AtomicBool;
    for (wait, connections, threads) in [
        (Wait::Block, 4, 1),
        (Wait::Spin, 4, 1),
        (Wait::Epoll, 4, 2),
        (Wait::Epoll, 1, 1),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let csv = dir.path().join("r.csv");
        let cfg = LoadConfig {
            mode: Mode::Closed,
            requests: Some(1000),
            duration: None,
            rate: 0.0,
            gap: Duration::ZERO,
            connections,
            threads,
            wait,
            warmup: 2,
            seed: 1,
            strategy: "none".into(),
        };
        let (addr, w) = (r.addr, r.plan.workload.clone());
        let connect = move || driver::connect(addr, &w, wait);
        let what = format!("{} {wait:?} {connections}c/{threads}t", r.plan.name);
        let s = load::run(
            &cfg,
            &connect,
            None,
            Some(Box::new(CsvSink::create(&csv).unwrap())),
            &AtomicBool::new(false),
            &|_| {},
        )
        .unwrap_or_else(|e| panic!("{what}: {e:#}"));
        assert_eq!(
            (s.requests, s.errors, s.wrong, s.threads),
            (1000, 0, 0, threads),
            "{what}: {s:?}"
        );
        assert_eq!(s.client_loop, ClientLoop::EventLoop, "{what}");
        assert!(
            s.p50_us > 0.0 && s.p50_us <= s.p99_us && s.mean_us > 0.0 && s.throughput_rps > 0.0,
            "{what}: {s:?}"
        );
        let text = std::fs::read_to_string(&csv).unwrap();
        assert_eq!(text.lines().count(), 1 + 1000, "{what}");
        let conns: std::collections::BTreeSet<&str> = text
            .lines()
            .skip(1)
            .map(|l| l.split(',').nth(1).unwrap())
            .collect();
        assert_eq!(conns.len(), connections, "{what}");
        eprintln!(
            "{what}: event loop: {:.0} req/s, mean {:.1} µs",
            s.throughput_rps, s.mean_us
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Real servers

#[test]
fn kv() {
    let Some(r) = start(ServerKind::Kv, 0) else {
        return;
    };
    assert_eq!(r.plan.agent_only.as_deref(), Some("preheat-kv"));
    exercise(&r);
}

#[test]
fn memcached() {
    let Some(r) = start(ServerKind::Memcached, 0) else {
        return;
    };
    exercise(&r);
    // The exact reply of the raw exchange.
    let ex = r.plan.workload.raw_exchange().unwrap();
    let reply = raw(r.addr, &ex.request, &ex.until);
    let want = format!(
        "VALUE key:42 0 100\r\n{}\r\nEND\r\n",
        servers::value_for(42)
    );
    assert_eq!(String::from_utf8_lossy(&reply), want);
}

#[test]
fn nginx() {
    let Some(r) = start(ServerKind::Nginx, 0) else {
        return;
    };
    assert_eq!(r.plan.agent_only.as_deref(), Some("nginx"));
    let body = r.plan.workload.expect.clone().unwrap();
    assert!(
        (2048..8192).contains(&body.len()),
        "index.html is {} bytes",
        body.len()
    );
    exercise(&r);
    // Nothing outside the work directory: the pid file and error log are inside.
    assert!(r.plan.workdir.join("nginx.pid").exists());
    // Other pages of the site.
    for (path, ok) in [
        ("/style.css", true),
        ("/about.html", true),
        ("/missing", false),
    ] {
        let spec = WorkloadSpec {
            protocol: Protocol::Http,
            key: path.to_string(),
            expect: None,
            tpcc: None,
        };
        let mut d = driver::connect(r.addr, &spec, Wait::Block).unwrap();
        assert_eq!(d.request().unwrap().ok, ok, "{path}");
    }
}

#[test]
fn redis() {
    let Some(r) = start(ServerKind::Redis, 0) else {
        return;
    };
    exercise(&r);
    let ex = r.plan.workload.raw_exchange().unwrap();
    let reply = raw(r.addr, &ex.request, &ex.until);
    assert_eq!(
        String::from_utf8_lossy(&reply),
        format!("$100\r\n{}\r\n", servers::value_for(42))
    );
    let w = WorkloadSpec {
        expect: None,
        ..r.plan.workload.clone()
    };
    assert!(
        w.raw_exchange().is_none(),
        "redis needs expect for a raw exchange"
    );
}

/// Counts that the transactions change.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
struct Counts {
    next_o_id_sum: u64,
    orders: u64,
    new_orders: u64,
    order_lines: u64,
    history: u64,
}

/// A connection to database `db` of the MariaDB at `addr`.
fn sql(addr: SocketAddr, db: &str) -> mysql::Conn {
    let opts = mysql::OptsBuilder::new()
        .ip_or_hostname(Some("127.0.0.1"))
        .tcp_port(addr.port())
        .user(Some("root"))
        .db_name(Some(db))
        .prefer_socket(false);
    mysql::Conn::new(opts).expect("root over TCP without a password")
}

fn counts(addr: SocketAddr, db: &str) -> Counts {
    let mut c = sql(addr, db);
    let mut one = |q: &str| -> u64 { c.query_first::<u64, _>(q).unwrap().unwrap() };
    Counts {
        next_o_id_sum: one("SELECT CAST(SUM(d_next_o_id) AS UNSIGNED) FROM district"),
        orders: one("SELECT COUNT(*) FROM orders"),
        new_orders: one("SELECT COUNT(*) FROM new_order"),
        order_lines: one("SELECT COUNT(*) FROM order_line"),
        history: one("SELECT COUNT(*) FROM history"),
    }
}

#[test]
fn mariadb_tpcc() {
    let Some(r) = start(ServerKind::Mariadb, 1) else {
        return;
    };
    assert_eq!(r.plan.start_timeout, Duration::from_secs(60));
    assert_eq!(r.plan.agent_only.as_deref(), Some("mariadbd"));
    let cfg = r.plan.workload.tpcc.clone().expect("tpcc config");
    assert_eq!(cfg.warehouses, 1);
    assert!(r.plan.workload.raw_exchange().is_none());

    // Load (W = 1) through prepare; a second prepare finds the marker and changes nothing.
    let t = Instant::now();
    let prepared = servers::prepare(&r.plan, r.addr)
        .unwrap_or_else(|e| panic!("prepare: {e:#}\n{}", log_tail(&r.plan.workdir)));
    let load_s = t.elapsed().as_secs_f64();
    eprintln!(
        "mariadb: loaded {} rows (W=1) in {load_s:.2} s: {}",
        prepared.items, prepared.detail
    );
    assert!(prepared.items > 50_000, "{prepared:?}");
    // A reload drops every table, the marker included, and writes the marker row anew: tag
    // the row with a value no load writes, and it must still be there.
    let mut c = sql(r.addr, &cfg.database);
    c.query_drop("UPDATE preheat_tpcc_scale SET load_seconds = -1")
        .expect("tagging the marker");
    let again = servers::prepare(&r.plan, r.addr).expect("second prepare");
    assert!(again.detail.contains("already loaded"), "{again:?}");
    assert_eq!(again.items, prepared.items, "{again:?}");
    let tag: Option<f64> = c
        .query_first("SELECT load_seconds FROM preheat_tpcc_scale")
        .expect("reading the marker");
    assert_eq!(tag, Some(-1.0), "the second prepare loaded the data again");
    drop(c);

    // No multiplexed path for MySQL: several connections per thread is a clear error.
    {
        use preheat_lab::load::{self, LoadConfig, Mode};
        let cfg = LoadConfig {
            mode: Mode::Closed,
            requests: Some(10),
            duration: None,
            rate: 0.0,
            gap: Duration::ZERO,
            connections: 2,
            threads: 1,
            wait: Wait::Block,
            warmup: 0,
            seed: 1,
            strategy: "none".into(),
        };
        let (addr, w) = (r.addr, r.plan.workload.clone());
        let connect = move || driver::connect(addr, &w, Wait::Block);
        let stop = std::sync::atomic::AtomicBool::new(false);
        let e = load::run(&cfg, &connect, None, None, &stop, &|_| {}).expect_err("mysql mux");
        let e = format!("{e:#}");
        assert!(e.contains("cannot multiplex") && e.contains("Mysql"), "{e}");
        // Wait::Epoll always runs the event loop: a clear error, also with one connection.
        let cfg = LoadConfig {
            connections: 1,
            threads: 1,
            wait: Wait::Epoll,
            ..cfg
        };
        let (addr, w) = (r.addr, r.plan.workload.clone());
        let connect = move || driver::connect(addr, &w, Wait::Epoll);
        let e = load::run(&cfg, &connect, None, None, &stop, &|_| {}).expect_err("mysql epoll");
        let e = format!("{e:#}");
        assert!(
            e.contains("wait epoll") && e.contains("not supported by the mysql driver"),
            "{e}"
        );
        let mut d = driver::connect(r.addr, &r.plan.workload, Wait::Block).unwrap();
        let e = format!("{:#}", d.send_request().unwrap_err());
        assert!(e.contains("not supported by the mysql driver"), "{e}");
        assert!(d.raw_fd().is_none());
    }

    // The driver, every wait mode (Spin and Epoll block too for MySQL's synchronous driver).
    for wait in [Wait::Spin, Wait::Block, Wait::Epoll] {
        let mut d = driver::connect(r.addr, &r.plan.workload, wait).expect("connect");
        let t = Instant::now();
        for i in 0..20 {
            let out = d
                .request()
                .unwrap_or_else(|e| panic!("transaction {i}: {e:#}"));
            assert!(out.ok, "transaction {i} ({}) failed", out.kind);
            assert!(["new-order", "payment", "order-status"].contains(&out.kind));
        }
        eprintln!(
            "mariadb: 20 transactions ({wait:?}), {:.2} ms each on average",
            t.elapsed().as_secs_f64() * 1e3 / 20.0
        );
    }
    // A database that was never loaded: connect fails and names the address.
    let missing = TpccConfig {
        database: "not_loaded".to_string(),
        ..cfg.clone()
    };
    let e = TpccClient::connect(r.addr, &missing)
        .err()
        .expect("no such database");
    assert!(format!("{e:#}").contains(&r.addr.to_string()), "{e:#}");

    // The mix and the state changes.
    let before = counts(r.addr, &cfg.database);
    let mut client = TpccClient::connect_seeded(r.addr, &cfg, 7).expect("client");
    let mut by_kind = std::collections::HashMap::new();
    let (mut committed_no, mut rolled_back_no, mut payments, mut lines) = (0u64, 0u64, 0u64, 0u64);
    let n = 200;
    let t = Instant::now();
    for _ in 0..n {
        let out = client.transaction().expect("transaction");
        assert!(out.ok, "{:?}: {:?}", out.kind, client.last_error());
        *by_kind.entry(out.kind).or_insert(0u32) += 1;
        match (out.kind, out.rolled_back) {
            (TxKind::NewOrder, false) => committed_no += 1,
            (TxKind::NewOrder, true) => rolled_back_no += 1,
            (TxKind::Payment, _) => payments += 1,
            _ => {}
        }
    }
    let tps = n as f64 / t.elapsed().as_secs_f64();
    // Make sure at least one specified rollback happened (1 % of new-orders).
    let mut extra = 0;
    while rolled_back_no == 0 && extra < 2000 {
        let out = client.run(TxKind::NewOrder).expect("new-order");
        assert!(out.ok, "{:?}", client.last_error());
        if out.rolled_back {
            rolled_back_no += 1;
        } else {
            committed_no += 1;
        }
        extra += 1;
    }
    eprintln!(
        "mariadb: {n} transactions at {tps:.0} tx/s, mix {by_kind:?}; new-orders committed \
         {committed_no}, rolled back {rolled_back_no} (+{extra} extra new-orders)"
    );
    let no = by_kind.get(&TxKind::NewOrder).copied().unwrap_or(0);
    let pay = by_kind.get(&TxKind::Payment).copied().unwrap_or(0);
    let os = by_kind.get(&TxKind::OrderStatus).copied().unwrap_or(0);
    assert!(
        (60..=120).contains(&no),
        "new-order {no} of {n} (expected ~90)"
    );
    assert!(
        (56..=116).contains(&pay),
        "payment {pay} of {n} (expected ~86)"
    );
    assert!(
        (10..=40).contains(&os),
        "order-status {os} of {n} (expected ~24)"
    );
    assert!(
        rolled_back_no >= 1,
        "no new-order rolled back in {extra} extra tries"
    );

    let after = counts(r.addr, &cfg.database);
    // Each committed new-order took one order id and wrote one order and one new-order row;
    // rolled-back ones left no trace.
    assert_eq!(after.next_o_id_sum - before.next_o_id_sum, committed_no);
    assert_eq!(after.orders - before.orders, committed_no);
    assert_eq!(after.new_orders - before.new_orders, committed_no);
    assert_eq!(after.history - before.history, payments);
    lines += after.order_lines - before.order_lines;
    assert!(
        (5 * committed_no..=15 * committed_no).contains(&lines),
        "{lines} order lines for {committed_no} new-orders"
    );
    let bad = tpcc::check_consistency(r.addr, &cfg).expect("consistency check");
    assert!(bad.is_empty(), "TPC-C consistency violated: {bad:#?}");
}

#[test]
fn missing_program_names_the_package() {
    let empty = tempfile::tempdir().unwrap();
    let opts = PlanOptions {
        search_path: Some(vec![empty.path().to_path_buf()]),
        ..PlanOptions::default()
    };
    for kind in ServerKind::ALL {
        let dir = tempfile::tempdir().unwrap();
        let e = servers::plan(kind, 40000, dir.path(), &opts).expect_err("nothing to find");
        let msg = e.to_string();
        match kind.package() {
            Some(package) => {
                assert!(msg.contains("scripts/setup-lab.sh"), "{msg}");
                assert!(msg.contains(&format!("apt-get install {package}")), "{msg}");
            }
            None => assert!(msg.contains("cargo build -p preheat-kv"), "{msg}"),
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let e = servers::plan(ServerKind::Redis, 40000, dir.path(), &opts).unwrap_err();
    assert_eq!(
        e.to_string(),
        "redis-server is not installed: run scripts/setup-lab.sh (or apt-get install redis-server)"
    );
}

// ---------------------------------------------------------------------------------------------
// Framing against scripted servers

/// A server that answers each request (read once) with the next reply, written in pieces of
/// `piece` bytes with short pauses, then closes.
fn scripted(replies: Vec<Vec<u8>>, piece: usize) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        let Ok((mut s, _)) = l.accept() else { return };
        s.set_nodelay(true).ok();
        let mut buf = [0u8; 4096];
        for reply in replies {
            if s.read(&mut buf).unwrap_or(0) == 0 {
                return;
            }
            for chunk in reply.chunks(piece.max(1)) {
                if s.write_all(chunk).is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_micros(200));
            }
        }
    });
    addr
}

fn spec(protocol: Protocol, key: &str, expect: &[u8]) -> WorkloadSpec {
    WorkloadSpec {
        protocol,
        key: key.to_string(),
        expect: Some(expect.to_vec()),
        tpcc: None,
    }
}

#[test]
fn http_framing() {
    let chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;x=y\r\nhello\r\n7\r\n, world\r\n0\r\nX-Trailer: 1\r\n\r\n".to_vec();
    let length = b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\nX-A: b\r\n\r\nhello, world".to_vec();
    let wrong = b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\nhello, World".to_vec();
    let status = b"HTTP/1.1 404 Not Found\r\nContent-Length: 12\r\n\r\nhello, world".to_vec();
    let close = b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nhello, world".to_vec();
    for wait in [Wait::Spin, Wait::Block] {
        let addr = scripted(
            vec![
                chunked.clone(),
                length.clone(),
                wrong.clone(),
                status.clone(),
                close.clone(),
            ],
            3,
        );
        let mut d =
            driver::connect(addr, &spec(Protocol::Http, "/x", b"hello, world"), wait).unwrap();
        assert!(d.request().unwrap().ok, "chunked");
        assert!(d.request().unwrap().ok, "content-length");
        assert!(!d.request().unwrap().ok, "wrong body");
        assert!(!d.request().unwrap().ok, "404");
        assert!(d.request().unwrap().ok, "body to EOF");
        let e = d.request().unwrap_err();
        assert!(e.to_string().contains("closed"), "{e}");
    }
    // A transfer coding the client never asked for is framed (chunked last) but not decoded:
    // the still-coded body does not match, a wrong reply rather than a broken connection.
    let gzip =
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n3\r\n\x1f\x8b\x08\r\n0\r\n\r\n"
            .to_vec();
    let addr = scripted(vec![gzip], 100);
    let mut d = driver::connect(addr, &spec(Protocol::Http, "/x", b""), Wait::Block).unwrap();
    assert!(!d.request().unwrap().ok, "gzip-coded body");
}

#[test]
fn memcached_and_redis_framing() {
    // The value contains the terminators the drivers must not search for.
    let value = b"END\r\nVALUE x\r\n$-1\r\n";
    let mut hit = format!("VALUE k 5 {}\r\n", value.len()).into_bytes();
    hit.extend_from_slice(value);
    hit.extend_from_slice(b"\r\nEND\r\n");
    let replies = vec![
        hit.clone(),
        b"END\r\n".to_vec(),
        b"SERVER_ERROR out of memory\r\n".to_vec(),
        hit,
    ];
    let addr = scripted(replies, 2);
    let mut d = driver::connect(addr, &spec(Protocol::Memcached, "k", value), Wait::Spin).unwrap();
    assert!(d.request().unwrap().ok);
    assert!(!d.request().unwrap().ok, "miss");
    assert!(!d.request().unwrap().ok, "server error");
    assert!(d.request().unwrap().ok, "in step after errors");

    let mut bulk = format!("${}\r\n", value.len()).into_bytes();
    bulk.extend_from_slice(value);
    bulk.extend_from_slice(b"\r\n");
    let replies = vec![
        bulk.clone(),
        b"$-1\r\n".to_vec(),
        b"-ERR wrong\r\n".to_vec(),
        bulk,
    ];
    let addr = scripted(replies, 2);
    let mut d = driver::connect(addr, &spec(Protocol::Redis, "k", value), Wait::Block).unwrap();
    assert!(d.request().unwrap().ok);
    assert!(!d.request().unwrap().ok, "miss");
    assert!(!d.request().unwrap().ok, "error reply");
    assert!(d.request().unwrap().ok, "in step after errors");
}

#[test]
fn connect_errors_name_the_address() {
    let port = free_port(); // nothing listens there now
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    for p in [Protocol::Memcached, Protocol::Redis, Protocol::Http] {
        let e = driver::connect(addr, &spec(p, "k", b"v"), Wait::Spin)
            .err()
            .expect("refused");
        assert!(format!("{e:#}").contains(&addr.to_string()), "{e:#}");
    }
}
