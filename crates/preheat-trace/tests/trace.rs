//! Real-process tests of the trace backend: build phtrace, run it, trace an epoll server.
//!
//! Every test reports a skip (`preheat_testsupport::skip`: on stderr past the test harness's
//! capture, and in the skip log) and returns when Valgrind, its tool-building files or a
//! compiler are missing.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use preheat_trace::{
    ensure_tool, jaccard, to_region_lines, BusyPeriod, ToolPaths, TraceError, TraceOptions,
    TracedServer,
};

fn say(msg: &str) {
    let _ = writeln!(std::io::stderr(), "{msg}");
}

/// What a [`TraceError::is_unavailable`] error says is missing, as a skip component.
fn missing(e: &TraceError) -> &'static str {
    match e {
        TraceError::Missing { package, .. } => package,
        _ => "x86-64",
    }
}

fn tool_or_skip() -> Option<ToolPaths> {
    match ensure_tool() {
        Ok(t) => Some(t),
        Err(e) if e.is_unavailable() => {
            preheat_testsupport::skip(missing(&e), &e.to_string());
            None
        }
        Err(e) => panic!("building phtrace failed: {e}"),
    }
}

/// Run `cmd` with a time limit; returns (success, combined output).
fn run_bounded(cmd: &mut Command, limit: Duration) -> (bool, String) {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("out");
    let f = std::fs::File::create(&log).unwrap();
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(f.try_clone().unwrap())
        .stderr(f)
        .spawn()
        .unwrap_or_else(|e| panic!("spawning {cmd:?}: {e}"));
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let out = std::fs::read_to_string(&log).unwrap_or_default();
    match status {
        Some(s) => (s.success(), out),
        None => (false, format!("timed out after {limit:?}\n{out}")),
    }
}

#[test]
fn tool_builds_and_runs_true() {
    let Some(tool) = tool_or_skip() else {
        return;
    };
    assert!(
        tool.lib_dir.join("phtrace-amd64-linux").is_file() || cfg!(not(target_arch = "x86_64"))
    );
    let dir = tempfile::tempdir().unwrap();
    for all in [false, true] {
        let out = dir.path().join(format!("true-{all}.bin"));
        let mut cmd = Command::new(&tool.valgrind);
        cmd.env("VALGRIND_LIB", &tool.lib_dir)
            .arg("--tool=phtrace")
            .arg(format!("--phtrace-out={}", out.display()))
            .arg(format!("--phtrace-all={}", if all { "yes" } else { "no" }))
            .arg("/bin/true");
        let (ok, log) = run_bounded(&mut cmd, Duration::from_secs(60));
        assert!(ok, "valgrind --tool=phtrace /bin/true failed:\n{log}");
        assert!(log.contains("phtrace"), "{log}");
        let bytes = std::fs::read(&out).expect("dump file created");
        let (periods, used) = preheat_trace::parse_dump(&bytes).unwrap();
        assert_eq!(used, bytes.len());
        if all {
            // One incomplete record: everything /bin/true did (it never waits for events).
            assert_eq!(periods.len(), 1, "{periods:?}");
            let p = &periods[0];
            assert!(!p.complete);
            assert!(p.instructions > 10_000, "{}", p.instructions);
            assert!(p.lines.len() > 100, "{}", p.lines.len());
            assert!(p.lines.windows(2).all(|w| w[0] < w[1]), "sorted, distinct");
            assert!(p.lines.iter().all(|l| l % 64 == 0));
        } else {
            assert!(periods.is_empty(), "/bin/true has no busy period");
        }
    }
}

/// Code and data lines of `lines` according to `/proc/<pid>/maps` (executable mappings are
/// code), plus lines in no mapping.
fn code_data_split(pid: u32, lines: &[u64]) -> (usize, usize, usize) {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
    let ranges: Vec<(u64, u64, bool)> = maps
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (a, b) = f.next()?.split_once('-')?;
            let perms = f.next()?;
            Some((
                u64::from_str_radix(a, 16).ok()?,
                u64::from_str_radix(b, 16).ok()?,
                perms.contains('x'),
            ))
        })
        .collect();
    let (mut code, mut data, mut none) = (0, 0, 0);
    for &l in lines {
        match ranges.iter().find(|r| l >= r.0 && l < r.1) {
            Some(r) if r.2 => code += 1,
            Some(_) => data += 1,
            None => none += 1,
        }
    }
    (code, data, none)
}

/// How the test learns that the server listens.
enum Ready<'a> {
    /// The server writes "ready <port>\n" to this file.
    File(&'a Path),
    /// The server listens on this port (probe with connect).
    Port(u16),
}

/// Trace a server that answers memcached `get`, send 10 GETs of one key 50 ms apart on one
/// connection (after `setup`, if any) and check the busy periods.
fn get_experiment(name: &str, cmd: Vec<String>, ready: Ready, setup: Option<&[u8]>, key: &str) {
    let t0 = Instant::now();
    let mut server = match TracedServer::spawn(&cmd, &TraceOptions::default()) {
        Ok(s) => s,
        Err(e) if e.is_unavailable() => {
            preheat_testsupport::skip!(missing(&e), "{name}: {e}");
            return;
        }
        Err(e) => panic!("{name}: spawn failed: {e}"),
    };
    // Valgrind start-up takes seconds.
    let port: u16 = loop {
        match ready {
            Ready::File(f) => {
                if let Ok(text) = std::fs::read_to_string(f) {
                    if let Some(p) = text.strip_prefix("ready ") {
                        break p.trim().parse().expect("port in ready file");
                    }
                }
            }
            Ready::Port(p) => {
                if preheat_engine::host::accepts_connections(
                    ([127, 0, 0, 1], p).into(),
                    Duration::from_secs(1),
                ) {
                    break p;
                }
            }
        }
        if !server.is_running() {
            panic!(
                "{name}: server exited before becoming ready:\n{}",
                server.log()
            );
        }
        if t0.elapsed() > Duration::from_secs(60) {
            panic!("{name}: not ready after 60 s:\n{}", server.log());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let startup = t0.elapsed();
    say(&format!("{name}: ready under valgrind after {startup:.2?}"));
    let before = server.read_new_periods().unwrap();
    if matches!(ready, Ready::File(_)) {
        assert!(before.is_empty(), "no request yet: {before:?}");
    }

    let mut conn = TcpStream::connect(("127.0.0.1", port)).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    conn.set_nodelay(true).unwrap();
    let mut reader = BufReader::new(conn.try_clone().unwrap());
    if let Some(setup) = setup {
        conn.write_all(setup).unwrap();
        let mut reply = String::new();
        reader.read_line(&mut reply).unwrap();
        assert_eq!(reply, "STORED\r\n");
    }
    let mut latencies = Vec::new();
    for _ in 0..10 {
        let t = Instant::now();
        conn.write_all(format!("get {key}\r\n").as_bytes()).unwrap();
        let mut head = String::new();
        reader.read_line(&mut head).unwrap();
        assert!(head.starts_with(&format!("VALUE {key} ")), "{head:?}");
        let len: usize = head.trim_end().rsplit(' ').next().unwrap().parse().unwrap();
        let mut body = vec![0; len + 2];
        reader.read_exact(&mut body).unwrap();
        let mut end = String::new();
        reader.read_line(&mut end).unwrap();
        assert_eq!(end, "END\r\n");
        latencies.push(t.elapsed());
        std::thread::sleep(Duration::from_millis(50));
    }
    // The last period is written when the server re-enters epoll_wait; give it time.
    // The GETs are the serving thread's periods: the thread with the most complete periods (one
    // connection is served by one thread). Other threads may add periods of their own in between
    // — the accept on the main thread, and a background thread's (memcached's LRU maintainer
    // under Valgrind did, once in a suite run) — so "the last 10 periods" is not enough.
    let mut periods: Vec<BusyPeriod> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    let serving = |periods: &[BusyPeriod]| -> Vec<BusyPeriod> {
        let complete = periods.iter().filter(|p| p.complete);
        let mut per_tid: std::collections::BTreeMap<u32, usize> = Default::default();
        for p in complete.clone() {
            *per_tid.entry(p.tid).or_default() += 1;
        }
        let tid = per_tid.iter().max_by_key(|(_, &n)| n).map(|(&t, _)| t);
        complete.filter(|p| Some(p.tid) == tid).cloned().collect()
    };
    loop {
        periods.extend(server.read_new_periods().unwrap());
        if serving(&periods).len() >= 10 || Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let complete = serving(&periods);
    assert!(
        complete.len() >= 10,
        "{name}: expected >= 10 complete busy periods of the serving thread, got {}:\n{}",
        complete.len(),
        server.log()
    );
    assert!(periods.windows(2).all(|w| w[0].seq < w[1].seq));
    // Its last 10 periods are the 10 GETs (an earlier one may be GET 1 merged with the accept).
    let gets: Vec<&BusyPeriod> = complete[complete.len() - 10..].iter().collect();
    let pid = server.pid();
    for (i, p) in gets.iter().enumerate() {
        let (code, data, none) = code_data_split(pid, &p.lines);
        say(&format!(
            "{name}: GET {i}: {} lines ({code} code, {data} data, {none} unmapped), {} instructions, tid {}, {:.2?}",
            p.lines.len(),
            p.instructions,
            p.tid,
            latencies[i]
        ));
        assert!(
            (100..=5000).contains(&p.lines.len()),
            "{name}: GET {i} touched {} lines",
            p.lines.len()
        );
    }
    let mut worst = 1.0f64;
    for w in gets[1..].windows(2) {
        worst = worst.min(jaccard(&w[0].lines, &w[1].lines));
    }
    let first_last = jaccard(&gets[1].lines, &gets[9].lines);
    say(&format!(
        "{name}: Jaccard GET2..GET10 consecutive min {worst:.3}, GET2 vs GET10 {first_last:.3}, GET1 vs GET2 {:.3}",
        jaccard(&gets[0].lines, &gets[1].lines)
    ));
    assert!(
        worst >= 0.8,
        "{name}: consecutive GET periods overlap only {worst:.3}"
    );
    assert!(
        first_last >= 0.8,
        "{name}: GET2 vs GET10 overlap only {first_last:.3}"
    );

    // Translate into region-relative lines with the process's own maps.
    match std::panic::catch_unwind(|| preheat_engine::maps::read_maps(Some(pid))) {
        Ok(Ok(maps)) => {
            let table = preheat_model::RegionTable::build(maps);
            for p in &gets[1..] {
                let (set, dropped) = to_region_lines(&p.lines, &table);
                let frac = set.len() as f64 / p.lines.len() as f64;
                assert!(
                    frac >= 0.95,
                    "{name}: only {:.1}% of lines map to regions ({dropped} dropped)",
                    100.0 * frac
                );
            }
            let (set, dropped) = to_region_lines(&gets[9].lines, &table);
            let mut per_region = std::collections::BTreeMap::<String, usize>::new();
            for l in set.as_slice() {
                *per_region
                    .entry(table.regions[l.region as usize].describe())
                    .or_default() += 1;
            }
            say(&format!(
                "{name}: GET 10 by region ({dropped} dropped): {per_region:?}"
            ));
        }
        Ok(Err(e)) => panic!("{name}: read_maps({pid}): {e}"),
        Err(panic) => {
            let msg = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            if msg.contains("not implemented") {
                preheat_testsupport::skip!(
                    "read-maps",
                    "{name}: region translation: preheat_engine::maps::read_maps is not implemented yet"
                );
            } else {
                std::panic::resume_unwind(panic);
            }
        }
    }

    drop(conn);
    drop(reader);
    let rest = server.finish().unwrap();
    assert!(
        rest.iter().all(|p| p.lines.len() < 100_000),
        "shutdown records are small"
    );
}

#[test]
fn traces_gets_of_a_c_epoll_server() {
    if tool_or_skip().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let exe = dir.path().join("mini_kv");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/mini_kv.c");
    let (ok, out) = run_bounded(
        Command::new("gcc")
            .args(["-O1", "-g", "-o"])
            .arg(&exe)
            .arg(&src),
        Duration::from_secs(120),
    );
    assert!(ok, "compiling the fixture server failed:\n{out}");
    let ready = dir.path().join("ready");
    get_experiment(
        "mini_kv",
        vec![exe.display().to_string(), ready.display().to_string()],
        Ready::File(&ready),
        None,
        "key:7",
    );
}

/// The newest modification time of any file under `dir`.
fn newest_mtime(dir: &Path) -> Option<std::time::SystemTime> {
    let mut newest = None;
    for e in std::fs::read_dir(dir).ok()?.flatten() {
        let p = e.path();
        let t = if p.is_dir() {
            newest_mtime(&p)
        } else {
            e.metadata().ok()?.modified().ok()
        };
        newest = newest.max(t);
    }
    newest
}

/// Path of an up-to-date `preheat-kv` binary (`$PREHEAT_TRACE_KV_BIN` if set), building it if
/// needed (into a private target
/// directory, so as not to wait for the lock the running `cargo test` holds).
fn preheat_kv() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("PREHEAT_TRACE_KV_BIN") {
        return Ok(PathBuf::from(p));
    }
    let krate = preheat_testsupport::workspace_root().join("crates/preheat-kv");
    if !krate.join("Cargo.toml").is_file() {
        return Err("the preheat-kv crate does not exist yet".into());
    }
    let src_time = newest_mtime(&krate.join("src"));
    let fresh = |p: &Path| {
        p.is_file()
            && match (p.metadata().and_then(|m| m.modified()).ok(), src_time) {
                (Some(b), Some(s)) => b >= s,
                _ => false,
            }
    };
    let main_bin = preheat_testsupport::built("preheat-kv");
    if fresh(&main_bin) {
        return Ok(main_bin);
    }
    let private = preheat_testsupport::target_dir().join("preheat-trace-kv");
    let (ok, out) = run_bounded(
        preheat_testsupport::cargo_build(&["preheat-kv"])
            .arg("--target-dir")
            .arg(&private),
        Duration::from_secs(540),
    );
    if !ok {
        panic!("cargo build -p preheat-kv failed:\n{out}");
    }
    Ok(private.join("debug/preheat-kv"))
}

#[test]
fn traces_gets_of_preheat_kv() {
    if tool_or_skip().is_none() {
        return;
    }
    let exe = match preheat_kv() {
        Ok(p) => p,
        Err(reason) => {
            preheat_testsupport::skip("preheat-kv", &reason);
            return;
        }
    };
    let dir = tempfile::tempdir().unwrap();
    let ready = dir.path().join("ready");
    get_experiment(
        "preheat-kv",
        vec![
            exe.display().to_string(),
            "--port".into(),
            "0".into(),
            "--ready-file".into(),
            ready.display().to_string(),
            "--items".into(),
            "1000".into(),
            "--value-size".into(),
            "100".into(),
            "--quiet".into(),
        ],
        Ready::File(&ready),
        None,
        "key:7",
    );
}

/// Comparison point with the lackey measurement in the project notes (~350 lines per GET).
#[test]
fn traces_gets_of_memcached_if_installed() {
    let Some(memcached) = ["/usr/bin/memcached", "/usr/local/bin/memcached"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
    else {
        preheat_testsupport::skip("memcached", "memcached is not installed");
        return;
    };
    if tool_or_skip().is_none() {
        return;
    }
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let mut setup = b"set key:7 0 0 100\r\n".to_vec();
    setup.extend([b'x'; 100]);
    setup.extend(b"\r\n");
    get_experiment(
        "memcached",
        vec![
            memcached.display().to_string(),
            "-u".into(),
            "root".into(),
            "-l".into(),
            "127.0.0.1".into(),
            "-p".into(),
            port.to_string(),
            "-U".into(),
            "0".into(),
            "-o".into(),
            "no_lru_crawler,no_lru_maintainer".into(),
        ],
        Ready::Port(port),
        Some(&setup),
        "key:7",
    );
}
