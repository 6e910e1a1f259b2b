//! The staging proxy on real loopback sockets, against the bundled preheat-kv and small fake
//! backends. Behaviour checks with generous slack (the VM is noisy), each bounded to seconds.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use preheat_stage::framing::{http_request, memcached_response_len, Limits};
use preheat_stage::{Framing, Stage, StageConfig, StageCounters};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const IO_TIMEOUT: Duration = Duration::from_secs(10);

fn kv_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| preheat_stage::bench::kv_binary().expect("preheat-kv binary"))
        .clone()
}

/// preheat-kv on a free port, killed on drop.
struct Kv {
    child: Child,
    addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Kv {
    fn start() -> Kv {
        let dir = tempfile::tempdir().unwrap();
        let ready = dir.path().join("ready");
        let child = Command::new(kv_bin())
            .args(["--port", "0", "--quiet", "--ready-file"])
            .arg(&ready)
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        // Guard first, so a failed start still stops the process.
        let mut kv = Kv {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(t) = std::fs::read_to_string(&ready) {
                if let Some(port) = t.strip_prefix("ready ").and_then(|p| p.trim().parse().ok()) {
                    kv.addr.set_port(port);
                    return kv;
                }
            }
            assert!(Instant::now() < deadline, "preheat-kv did not start");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Kv {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn stage(backend: SocketAddr, proto: Framing, period_ms: u64, bound_ms: u64) -> Stage {
    let mut cfg = StageConfig::new(SocketAddr::from(([127, 0, 0, 1], 0)), backend, proto);
    cfg.period = Duration::from_millis(period_ms);
    cfg.bound = Duration::from_millis(bound_ms);
    Stage::start(cfg).unwrap()
}

fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_nodelay(true).unwrap();
    s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    s
}

/// Reads `n` memcached responses; returns their bytes concatenated.
fn read_mc(s: &mut TcpStream, n: usize) -> Vec<u8> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16384];
    let mut got = 0;
    let mut off = 0;
    while got < n {
        while got < n {
            match memcached_response_len(&buf[off..]).unwrap() {
                Some(len) => {
                    off += len;
                    got += 1;
                }
                None => break,
            }
        }
        if got == n {
            break;
        }
        let k = s.read(&mut chunk).expect("read (timed out?)");
        assert!(
            k > 0,
            "EOF after {got} of {n} responses: {:?}",
            String::from_utf8_lossy(&buf)
        );
        buf.extend_from_slice(&chunk[..k]);
    }
    assert_eq!(off, buf.len(), "extra bytes");
    buf
}

/// Reads until EOF (bounded by the read timeout).
fn read_to_eof(s: &mut TcpStream) -> Vec<u8> {
    let mut out = Vec::new();
    s.read_to_end(&mut out).expect("read to EOF");
    out
}

/// preheat-kv's preloaded value of key:I (100 bytes, byte J = 'a' + (I + J) % 26).
fn kv_value(i: u32) -> Vec<u8> {
    (0..100u32).map(|j| b'a' + ((i + j) % 26) as u8).collect()
}

fn wait_for(stage: &Stage, what: &str, f: impl Fn(&StageCounters) -> bool) -> StageCounters {
    let deadline = Instant::now() + IO_TIMEOUT;
    loop {
        let c = stage.counters();
        if f(&c) {
            return c;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: {c:#?}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn pipelined_requests_are_answered_in_order() {
    let kv = Kv::start();
    let st = stage(kv.addr, Framing::Memcached, 20, 60);
    let addr = st.local_addr();
    let clients: Vec<_> = (0..3u64)
        .map(|c| {
            std::thread::spawn(move || {
                let mut req = Vec::new();
                let mut expect = Vec::new();
                let mut responses = 0;
                // Deterministic keys and split points.
                let mut rng = StdRng::seed_from_u64(c + 1);
                for i in 0..150u32 {
                    let n = rng.gen_range(0..1000u32);
                    match i % 5 {
                        0 | 1 => {
                            req.extend(format!("get key:{n}\r\n").bytes());
                            expect.extend(format!("VALUE key:{n} 0 100\r\n").bytes());
                            expect.extend(kv_value(n));
                            expect.extend(b"\r\nEND\r\n");
                            responses += 1;
                        }
                        2 => {
                            // Data containing CRLF and a fake command.
                            let data = format!("v{c}-{i}\r\nget key:1\r\n");
                            req.extend(
                                format!("set c{c}k{i} 7 0 {}\r\n{data}\r\n", data.len()).bytes(),
                            );
                            expect.extend(b"STORED\r\n");
                            req.extend(format!("get c{c}k{i} key:{n}\r\n").bytes());
                            expect.extend(
                                format!("VALUE c{c}k{i} 7 {}\r\n{data}\r\n", data.len()).bytes(),
                            );
                            expect.extend(format!("VALUE key:{n} 0 100\r\n").bytes());
                            expect.extend(kv_value(n));
                            expect.extend(b"\r\nEND\r\n");
                            responses += 2;
                        }
                        3 => {
                            req.extend(format!("delete c{c}k{} noreply\r\n", i - 1).bytes());
                            req.extend(format!("get c{c}k{}\r\n", i - 1).bytes());
                            expect.extend(b"END\r\n");
                            responses += 1;
                        }
                        _ => {
                            req.extend(b"get nosuchkey\r\n");
                            expect.extend(b"END\r\n");
                            responses += 1;
                        }
                    }
                }
                let mut s = connect(addr);
                let mut r = s.try_clone().unwrap();
                let reader = std::thread::spawn(move || read_mc(&mut r, responses));
                // Send in random pieces (partial requests across reads and bursts).
                let mut off = 0;
                while off < req.len() {
                    let k = rng.gen_range(1..=200usize).min(req.len() - off);
                    s.write_all(&req[off..off + k]).unwrap();
                    off += k;
                    if rng.gen_ratio(1, 8) {
                        std::thread::sleep(Duration::from_millis(rng.gen_range(0..15)));
                    }
                }
                let got = reader.join().unwrap();
                assert!(
                    got == expect,
                    "client {c}: responses differ from the expected sequence"
                );
                responses as u64
            })
        })
        .collect();
    let responses: u64 = clients.into_iter().map(|h| h.join().unwrap()).sum();
    let c = wait_for(&st, "all connections closed", |c| c.connections_active == 0);
    // 150 lines per client, of which 30 are `set`s that stand for one request each, plus the
    // extra get after each set and the get after each delete.
    assert_eq!(c.requests_staged, 3 * (150 + 30 + 30));
    assert_eq!(c.requests_released, c.requests_staged);
    assert_eq!(c.responses, responses, "{c:#?}");
    assert_eq!(c.unmatched_responses, 0);
    assert_eq!(c.response_framing_lost, 0);
    assert!(c.bursts >= 2, "{c:#?}");
    assert_eq!((c.requests_failed, c.backend_failures), (0, 0));
    assert!(c.service_ewma_us > 0.0);
    st.shutdown();
}

#[test]
fn requests_are_held_until_the_burst() {
    let kv = Kv::start();
    let st = stage(kv.addr, Framing::Memcached, 400, 10_000);
    let mut a = connect(st.local_addr());
    let mut b = connect(st.local_addr());
    let t0 = Instant::now();
    a.write_all(b"get key:1\r\n").unwrap();
    std::thread::sleep(Duration::from_millis(100));
    b.write_all(b"get key:2\r\n").unwrap();
    let ra = read_mc(&mut a, 1);
    let la = t0.elapsed();
    let rb = read_mc(&mut b, 1);
    assert!(ra.starts_with(b"VALUE key:1 0 100\r\n"));
    assert!(rb.starts_with(b"VALUE key:2 0 100\r\n"));
    assert!(
        la >= Duration::from_millis(370),
        "a lone request came back after {la:?}, before the 400 ms burst"
    );
    assert!(la < Duration::from_secs(3), "{la:?}");
    let c = st.counters();
    // Both connections' requests went out in the same (periodic) burst.
    assert_eq!((c.bursts_periodic, c.bursts_early), (1, 0), "{c:#?}");
    assert_eq!(c.burst_max_requests, 2);
    assert!(c.held_max_us >= 370_000, "{c:#?}");
    st.shutdown();
}

#[test]
fn early_release_keeps_the_bound() {
    let kv = Kv::start();
    let st = stage(kv.addr, Framing::Memcached, 5_000, 150);
    let mut a = connect(st.local_addr());
    let t0 = Instant::now();
    a.write_all(b"get key:7\r\n").unwrap();
    let r = read_mc(&mut a, 1);
    let l = t0.elapsed();
    assert!(r.starts_with(b"VALUE key:7 0 100\r\n"));
    assert!(l >= Duration::from_millis(60), "not held at all: {l:?}");
    assert!(
        l <= Duration::from_millis(150 + 400),
        "released too late for the 150 ms bound: {l:?}"
    );
    let c = st.counters();
    assert_eq!((c.bursts_early, c.bursts_periodic), (1, 0), "{c:#?}");
    st.shutdown();
}

fn closed_port() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

#[test]
fn backend_down_is_an_error_reply_and_counted() {
    let down = closed_port();
    let st = stage(down, Framing::Memcached, 20, 60);
    let mut s = connect(st.local_addr());
    s.write_all(b"get key:1\r\nset x 0 0 1 noreply\r\nx\r\nget key:2\r\n")
        .unwrap();
    let got = String::from_utf8(read_to_eof(&mut s)).unwrap();
    let lines: Vec<&str> = got.split_terminator("\r\n").collect();
    assert_eq!(
        lines.len(),
        2,
        "one error per request expecting a reply: {got:?}"
    );
    for l in lines {
        assert!(
            l.starts_with("SERVER_ERROR proxy: backend 127.0.0.1:") && l.contains("unavailable"),
            "{l}"
        );
    }
    let c = wait_for(&st, "connection closed", |c| c.connections_active == 0);
    assert_eq!(c.backend_connect_failures, 1);
    assert_eq!(c.requests_failed, 2);
    st.shutdown();

    let st = stage(down, Framing::Http, 20, 60);
    let mut s = connect(st.local_addr());
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let got = String::from_utf8(read_to_eof(&mut s)).unwrap();
    assert!(got.starts_with("HTTP/1.1 502 Bad Gateway\r\n"), "{got}");
    assert!(got.contains("Connection: close\r\n"), "{got}");
    assert_eq!(st.counters().backend_connect_failures, 1);
    st.shutdown();
}

/// A backend that reads until it has `lines` request lines, writes `reply`, and closes.
fn flaky_backend(lines: usize, reply: &'static [u8]) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
        let mut got = Vec::new();
        let mut chunk = [0u8; 1024];
        while got.iter().filter(|&&b| b == b'\n').count() < lines {
            match s.read(&mut chunk) {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&chunk[..n]),
            }
        }
        let _ = s.write_all(reply);
    });
    addr
}

#[test]
fn backend_dying_mid_connection_fails_only_the_outstanding() {
    let backend = flaky_backend(2, b"END\r\n");
    let st = stage(backend, Framing::Memcached, 20, 60);
    let mut s = connect(st.local_addr());
    s.write_all(b"get a\r\nget b\r\n").unwrap();
    let got = String::from_utf8(read_to_eof(&mut s)).unwrap();
    assert_eq!(
        got,
        "END\r\nSERVER_ERROR proxy: backend closed the connection\r\n"
    );
    let c = wait_for(&st, "connection closed", |c| c.connections_active == 0);
    assert_eq!(
        (c.backend_failures, c.requests_failed, c.responses),
        (1, 1, 1)
    );
    st.shutdown();
}

#[test]
fn client_disconnecting_mid_request() {
    let kv = Kv::start();
    let st = stage(kv.addr, Framing::Memcached, 20, 60);
    // Half-close with a partial request: complete ones are still answered, then EOF.
    let mut s = connect(st.local_addr());
    s.write_all(b"get key:3\r\nget key:").unwrap();
    s.shutdown(Shutdown::Write).unwrap();
    let got = read_to_eof(&mut s);
    let mut expect = b"VALUE key:3 0 100\r\n".to_vec();
    expect.extend(kv_value(3));
    expect.extend(b"\r\nEND\r\n");
    assert_eq!(got, expect);
    wait_for(&st, "first disconnect counted", |c| {
        c.client_disconnects_mid_request == 1
    });
    // Gone in the middle of a data block: nothing partial reaches the backend.
    let mut s = connect(st.local_addr());
    s.write_all(b"set half 0 0 10\r\nabc").unwrap();
    std::thread::sleep(Duration::from_millis(30));
    drop(s);
    wait_for(&st, "second disconnect counted", |c| {
        c.client_disconnects_mid_request == 2
    });
    let mut s = connect(st.local_addr());
    s.write_all(b"get half\r\n").unwrap();
    assert_eq!(read_mc(&mut s, 1), b"END\r\n");
    drop(s);
    let c = wait_for(&st, "all closed", |c| c.connections_active == 0);
    assert_eq!(c.requests_failed, 0);
    st.shutdown();
}

/// An HTTP/1.1 backend: answers pipelined requests in order; HEAD without a body, `/chunked`
/// chunked, POST echoes its body.
fn http_backend() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for conn in l.incoming() {
            let Ok(mut s) = conn else { return };
            std::thread::spawn(move || {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    while let Ok(Some(f)) = http_request(&buf, &Limits::default()) {
                        let req = buf.drain(..f.len).collect::<Vec<u8>>();
                        let text = String::from_utf8_lossy(&req).to_string();
                        let path = text.split(' ').nth(1).unwrap_or("").to_string();
                        let reply = if text.starts_with("HEAD") {
                            "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n".to_string()
                        } else if path == "/chunked" {
                            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n".to_string()
                        } else if text.starts_with("POST") {
                            let body = &text[text.find("\r\n\r\n").unwrap() + 4..];
                            format!(
                                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
                                body.len()
                            )
                        } else {
                            format!(
                                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{path}",
                                path.len()
                            )
                        };
                        if s.write_all(reply.as_bytes()).is_err() {
                            return;
                        }
                    }
                    match s.read(&mut chunk) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
            });
        }
    });
    addr
}

#[test]
fn http_pipelining_and_malformed_requests() {
    let backend = http_backend();
    let st = stage(backend, Framing::Http, 20, 60);
    let mut s = connect(st.local_addr());
    s.write_all(
        b"GET /a HTTP/1.1\r\nHost: x\r\n\r\nHEAD /b HTTP/1.1\r\n\r\nPOST /c HTTP/1.1\r\nContent-Length: 3\r\n\r\nxyzGET /chunked HTTP/1.1\r\n\r\nGET /d HTTP/1.1\r\n\r\n",
    )
    .unwrap();
    // A request a proxy must refuse (both framings) ends the connection after the others.
    s.write_all(b"POST /e HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n")
        .unwrap();
    let got = String::from_utf8(read_to_eof(&mut s)).unwrap();
    let expect = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n/a\
                  HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n\
                  HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nxyz\
                  HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n\
                  HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n/d\
                  HTTP/1.1 400 Bad Request\r\n";
    assert!(got.starts_with(expect), "{got}");
    let c = wait_for(&st, "closed", |c| c.connections_active == 0);
    assert_eq!(c.requests_staged, 5);
    assert_eq!(c.responses, 5, "HEAD and chunked responses framed: {c:#?}");
    assert_eq!((c.response_framing_lost, c.unmatched_responses), (0, 0));
    assert_eq!(c.client_protocol_errors, 1);
    st.shutdown();
}

#[test]
fn shutdown_releases_what_is_buffered() {
    let kv = Kv::start();
    let st = stage(kv.addr, Framing::Memcached, 10_000, 60_000);
    let mut s = connect(st.local_addr());
    s.write_all(b"get key:9\r\n").unwrap();
    wait_for(&st, "request staged", |c| c.requests_staged == 1);
    let stopper = std::thread::spawn(move || st.shutdown());
    let got = read_mc(&mut s, 1);
    assert!(got.starts_with(b"VALUE key:9 0 100\r\n"));
    let c = stopper.join().unwrap();
    assert_eq!((c.bursts_final, c.bursts_periodic), (1, 0), "{c:#?}");
}

#[test]
fn bench_smoke() {
    kv_bin();
    let args = preheat_stage::BenchArgs {
        backend: None,
        backend_cmd: None,
        rate: 200.0,
        duration_s: 1.0,
        protocol: Framing::Memcached,
        staging: preheat_stage::StagingOpts {
            period_ms: 20,
            bound_ms: 60,
            margin_ms: 5,
            initial_service_ms: 5,
        },
        connections: 2,
        rounds: 1,
        keys: 1000,
        settle_ms: 0,
        idle_baseline: true,
        quiet_gate_pct: 0.0,
        max_others_pct: 0.0,
        no_pin: false,
        seed: 3,
        json: true,
        machine: preheat_power::cli::MachineArg { machine_root: None },
    };
    let r = preheat_stage::bench(&args).unwrap();
    assert_eq!(r.modes.len(), 3);
    assert_eq!(r.modes[2].sent, 0, "idle baseline");
    for m in &r.modes[..2] {
        assert!(m.sent > 50, "{m:#?}");
        assert_eq!(m.completed, m.sent, "{m:#?}");
        assert_eq!((m.errors, m.mismatched, m.unanswered), (0, 0, 0), "{m:#?}");
        assert_eq!(m.hits, m.completed);
        assert_eq!(m.latency.samples, m.completed);
    }
    let staged = &r.modes[1];
    let s = staged.stage.as_ref().unwrap();
    assert!(s.bursts >= 10, "{s:#?}");
    // Held requests: the staged median is well above the direct one.
    assert!(staged.latency.p50.value_us > r.modes[0].latency.p50.value_us);
    let json = serde_json::to_string(&r).unwrap();
    assert!(json.contains("\"kind\":\"measured\""));
    assert!(r.render().contains("p99.9"));
}
