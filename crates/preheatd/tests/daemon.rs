//! preheatd end to end: the bundled server with the real agent attached, the built `preheatd`
//! binary, announcements sealed with the `preheat-net` wire encoder over loopback UDP. Results
//! are read from the agent's own `Status` and from `/metrics`. Every wait is bounded.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use preheat_net::wire::{encode, Key, Msg, NetAnnouncement};
use preheatd::registry::{query_status, AgentStatus};

/// Announcement lead used for announcements that must be acted on: long enough that a loaded
/// machine (tests run in parallel) still delivers them in time. The agent's `wake` spin is
/// capped at 1 ms whatever the lead.
const LEAD_NS: u64 = 2_000_000_000;
const WAIT: Duration = Duration::from_secs(15);
/// Agent settings a test must not inherit from the caller's environment.
const AGENT_ENV: [&str; 4] = [
    "PREHEAT_AGENT_ONLY",
    "PREHEAT_AGENT_DISABLE",
    "PREHEAT_PROFILE",
    "PREHEAT_AGENT_LOG",
];

struct Artifacts {
    agent_so: PathBuf,
    kv_bin: PathBuf,
}

/// `target/debug/libpreheat_agent.so` and `target/debug/preheat-kv`, built if missing.
fn artifacts() -> &'static Artifacts {
    static A: OnceLock<Artifacts> = OnceLock::new();
    A.get_or_init(|| {
        let dir = preheat_testsupport::debug_dir();
        let a = Artifacts {
            agent_so: dir.join("libpreheat_agent.so"),
            kv_bin: dir.join("preheat-kv"),
        };
        if !(a.agent_so.exists() && a.kv_bin.exists()) {
            let st = preheat_testsupport::cargo_build(&["preheat-kv", "preheat-agent"]).status();
            assert!(
                matches!(st, Ok(s) if s.success()),
                "cargo build -p preheat-kv -p preheat-agent failed: {st:?}"
            );
        }
        assert!(a.agent_so.exists(), "{} missing", a.agent_so.display());
        assert!(a.kv_bin.exists(), "{} missing", a.kv_bin.display());
        a
    })
}

use preheat_testsupport::eventually as wait_until;

fn now_ns() -> u64 {
    preheat_net::now_ns()
}

/// A child process killed (SIGKILL) and reaped on drop.
struct Proc {
    child: Child,
    log: PathBuf,
}

impl Proc {
    fn pid(&self) -> u32 {
        self.child.id()
    }
    fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A private run directory (mode 0700, as the agent requires) inside a temp dir.
fn run_dir(tmp: &Path) -> PathBuf {
    use std::os::unix::fs::DirBuilderExt;
    let d = tmp.join("run");
    std::fs::DirBuilder::new().mode(0o700).create(&d).unwrap();
    d
}

/// preheat-kv on 127.0.0.1 (port chosen by the OS) with the agent attached; returns it and
/// its port once it is ready and its agent answers.
fn start_kv(tmp: &Path, run: &Path) -> (Proc, u16) {
    let a = artifacts();
    let ready = tmp.join("kv.ready");
    let log = tmp.join("kv.log");
    let f = std::fs::File::create(&log).unwrap();
    let mut cmd = Command::new(&a.kv_bin);
    cmd.args(["--port", "0", "--quiet", "--ready-file"])
        .arg(&ready)
        .env("LD_PRELOAD", &a.agent_so)
        .env("PREHEAT_RUN_DIR", run)
        .stdin(Stdio::null())
        .stdout(f.try_clone().unwrap())
        .stderr(f);
    for k in AGENT_ENV {
        cmd.env_remove(k);
    }
    let mut p = Proc {
        child: cmd.spawn().expect("starting preheat-kv"),
        log,
    };
    let mut port = None;
    wait_until(WAIT, || {
        port = std::fs::read_to_string(&ready)
            .ok()
            .and_then(|s| s.strip_prefix("ready ")?.trim().parse().ok());
        port.is_some() || !p.alive()
    });
    let port = port.unwrap_or_else(|| panic!("preheat-kv did not become ready:\n{}", p.log()));
    let pid = p.pid();
    assert!(
        wait_until(WAIT, || status(run, pid).is_some()),
        "the agent of preheat-kv (pid {pid}) does not answer in {}:\n{}",
        run.display(),
        p.log()
    );
    (p, port)
}

fn status(run: &Path, pid: u32) -> Option<AgentStatus> {
    query_status(run, pid, Duration::from_secs(5)).ok()
}

/// One memcached `get` (a miss) so the agent attributes a busy period to the port.
fn get_once(port: u16) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(WAIT)).unwrap();
    s.write_all(b"get preheatd-test\r\n").unwrap();
    let mut l = String::new();
    BufReader::new(&s).read_line(&mut l).unwrap();
    assert_eq!(l, "END\r\n");
}

/// A random key, written as hex to a 0600 file.
fn key_file(tmp: &Path) -> (Key, PathBuf) {
    use std::os::unix::fs::OpenOptionsExt;
    let key = Key::random();
    let path = tmp.join("key");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .unwrap();
    writeln!(f, "{}", key.to_hex()).unwrap();
    (key, path)
}

struct Daemon {
    proc: Proc,
    udp: SocketAddr,
    metrics: SocketAddr,
    ready: PathBuf,
}

fn start_preheatd(tmp: &Path, run: &Path, key: &Path, extra: &[&str]) -> Daemon {
    let ready = tmp.join("preheatd.ready");
    let log = tmp.join("preheatd.log");
    let f = std::fs::File::create(&log).unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_preheatd"));
    cmd.args(["--listen", "127.0.0.1:0", "--key-file"])
        .arg(key)
        .arg("--run-dir")
        .arg(run)
        .args(["--metrics", "127.0.0.1:0", "--scan-interval-ms", "100"])
        .arg("--ready-file")
        .arg(&ready)
        .args(extra)
        .env_remove("LD_PRELOAD")
        .stdin(Stdio::null())
        .stdout(f.try_clone().unwrap())
        .stderr(f);
    let mut proc = Proc {
        child: cmd.spawn().expect("starting preheatd"),
        log,
    };
    let mut addrs = None;
    wait_until(WAIT, || {
        addrs = std::fs::read_to_string(&ready).ok().and_then(|s| {
            let mut w = s.strip_prefix("ready ")?.split_whitespace();
            let u: SocketAddr = w.next()?.parse().ok()?;
            let m: SocketAddr = w.next()?.parse().ok()?;
            Some((u, m))
        });
        addrs.is_some() || !proc.alive()
    });
    let (udp, metrics) =
        addrs.unwrap_or_else(|| panic!("preheatd did not become ready:\n{}", proc.log()));
    assert!(udp.port() != 0 && metrics.port() != 0);
    Daemon {
        proc,
        udp,
        metrics,
        ready,
    }
}

impl Daemon {
    /// GET /metrics, parsed into `name{labels} → value`.
    fn metrics(&self) -> BTreeMap<String, f64> {
        let mut s = TcpStream::connect(self.metrics).unwrap();
        s.set_read_timeout(Some(WAIT)).unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: test\r\n\r\n")
            .unwrap();
        let mut r = String::new();
        s.read_to_string(&mut r).unwrap();
        assert!(r.starts_with("HTTP/1.1 200 OK\r\n"), "{r}");
        let body = r.split_once("\r\n\r\n").unwrap().1;
        body.lines()
            .filter(|l| !l.starts_with('#'))
            .map(|l| {
                let (k, v) = l.rsplit_once(' ').unwrap();
                (k.to_string(), v.parse().unwrap())
            })
            .collect()
    }

    fn metric(&self, key: &str) -> f64 {
        self.metrics().get(key).copied().unwrap_or(f64::NAN)
    }

    /// Wait until metric `key` equals `want`; panics with the metrics and the log if not.
    fn wait_metric(&mut self, key: &str, want: f64) {
        let mut last = BTreeMap::new();
        let ok = wait_until(WAIT, || {
            last = self.metrics();
            last.get(key) == Some(&want)
        });
        assert!(
            ok,
            "{key} is {:?}, want {want}\nmetrics: {last:#?}\npreheatd log:\n{}",
            last.get(key),
            self.proc.log()
        );
    }
}

fn dropped(reason: &str) -> String {
    format!("preheatd_announcements_dropped_total{{reason=\"{reason}\"}}")
}

/// Sends sealed announcements to preheatd as one arbiter (sender id 127.0.0.1).
struct Arbiter {
    sock: UdpSocket,
    to: SocketAddr,
    key: Key,
    seq: u64,
}

impl Arbiter {
    fn new(to: SocketAddr, key: Key) -> Arbiter {
        Arbiter {
            sock: UdpSocket::bind("127.0.0.1:0").unwrap(),
            to,
            key,
            seq: 0,
        }
    }
    fn sealed(&mut self, key: &Key, port: u16, arrival_ns: u64) -> Vec<u8> {
        self.seq += 1;
        self.sealed_as(key, self.seq, now_ns(), port, arrival_ns)
    }
    /// Sealed with a chosen sequence number and send time.
    fn sealed_as(&self, key: &Key, seq: u64, sent_ns: u64, port: u16, arrival_ns: u64) -> Vec<u8> {
        let a = NetAnnouncement {
            src: 0x7f00_0001,
            dst_port: port,
            arrival_ns,
            flow: seq,
            packets: 1,
        };
        encode(key, 0x7f00_0001, seq, sent_ns, &Msg::Announce(a))
    }
    fn send_raw(&self, bytes: &[u8]) {
        self.sock.send_to(bytes, self.to).unwrap();
    }
    /// Seal and send; returns the datagram.
    fn announce(&mut self, port: u16, arrival_ns: u64) -> Vec<u8> {
        let key = self.key.clone();
        let b = self.sealed(&key, port, arrival_ns);
        self.send_raw(&b);
        b
    }
}

#[test]
fn dispatches_valid_and_drops_late_bad_mac_replayed_stale_malformed_unknown_port() {
    let tmp = tempfile::tempdir().unwrap();
    let run = run_dir(tmp.path());
    let (kv, port) = start_kv(tmp.path(), &run);
    let pid = kv.pid();
    get_once(port);
    assert!(
        wait_until(WAIT, || status(&run, pid)
            .is_some_and(|s| s.served_ports().contains(&port))),
        "the agent attributed no busy period to port {port}:\n{}",
        kv.log()
    );
    let (key, key_path) = key_file(tmp.path());
    let mut d = start_preheatd(tmp.path(), &run, &key_path, &[]);
    d.wait_metric("preheatd_agents", 1.0);
    let before = status(&run, pid).unwrap().preheat;
    assert_eq!(before.announcements, 0);
    let agent = |k: &str| format!("preheat_agent_{k}_total{{pid=\"{pid}\"}}");

    // A valid announcement is dispatched, and the agent acts on it (wake+lines: it spins).
    let mut arb = Arbiter::new(d.udp, key.clone());
    let valid = arb.announce(port, now_ns() + LEAD_NS);
    let valid_seq = arb.seq;
    d.wait_metric("preheatd_dispatched_total", 1.0);
    let ok = wait_until(WAIT, || {
        status(&run, pid).is_some_and(|s| {
            s.preheat.announcements == 1 && s.preheat.wake_spins + s.preheat.wake_polled == 1
        })
    });
    assert!(
        ok,
        "agent did not act: {:?}\n{}",
        status(&run, pid),
        d.proc.log()
    );
    d.wait_metric(&agent("announcements"), 1.0);
    // `wake` polls in idle where the agent may (root), else it spins.
    let polled = status(&run, pid).is_some_and(|s| s.preheat.wake_polled == 1);
    d.wait_metric(
        &agent(if polled { "wake_polled" } else { "wake_spins" }),
        1.0,
    );
    assert_eq!(d.metric(&format!("preheat_agent_up{{pid=\"{pid}\"}}")), 1.0);
    assert_eq!(d.metric(&agent("late")), 0.0);

    // Late: 1 µs of lead when sent, less than the 5 µs minimum (and past) when received.
    arb.announce(port, now_ns() + 1_000);
    d.wait_metric(&dropped("late"), 1.0);

    // Wrong key → bad_mac.
    let b = arb.sealed(&Key::random(), port, now_ns() + LEAD_NS);
    arb.send_raw(&b);
    d.wait_metric(&dropped("bad_mac"), 1.0);

    // The valid announcement's sequence number again (freshly sent) → replayed.
    let b = arb.sealed_as(&key, valid_seq, now_ns(), port, now_ns() + LEAD_NS);
    arb.send_raw(&b);
    d.wait_metric(&dropped("replayed"), 1.0);

    // Sent 10 s ago by the sender's clock (the gate allows 50 ms) → stale.
    arb.seq += 1;
    let b = arb.sealed_as(
        &key,
        arb.seq,
        now_ns() - 10_000_000_000,
        port,
        now_ns() + LEAD_NS,
    );
    arb.send_raw(&b);
    d.wait_metric(&dropped("stale"), 1.0);

    // Garbage (and a truncated datagram) → malformed.
    arb.send_raw(b"\x00garbage that is no announcement at all");
    arb.send_raw(&valid[..valid.len() / 2]);
    arb.send_raw(&[]);
    d.wait_metric(&dropped("malformed"), 3.0);

    // A port no agent serves → no_agent.
    let unknown = if port == 1 { 2 } else { port - 1 };
    arb.announce(unknown, now_ns() + LEAD_NS);
    d.wait_metric(&dropped("no_agent"), 1.0);

    // Totals: each datagram counted once; only the valid one reached the agent.
    let m = d.metrics();
    assert_eq!(m["preheatd_announcements_received_total"], 9.0, "{m:#?}");
    assert_eq!(m["preheatd_announcements_accepted_total"], 3.0, "{m:#?}");
    assert_eq!(m[&dropped("rate_limited")], 0.0);
    assert_eq!(m["preheatd_dispatched_total"], 1.0);
    assert_eq!(m["preheatd_send_errors_total"], 0.0);
    assert_eq!(m["preheatd_lead_seconds_count"], 3.0, "{m:#?}");
    assert_eq!(
        m["preheatd_lead_seconds_bucket{le=\"0.000005\"}"], 1.0,
        "{m:#?}"
    );
    assert_eq!(m["preheatd_lead_seconds_bucket{le=\"+Inf\"}"], 3.0);
    let s = status(&run, pid).unwrap().preheat;
    assert_eq!(s.announcements, 1, "{s:?}");
    assert_eq!(s.malformed, 0);
    assert!(d.proc.alive(), "preheatd died:\n{}", d.proc.log());
}

#[test]
fn static_route_then_agent_death_then_sigterm() {
    let tmp = tempfile::tempdir().unwrap();
    let run = run_dir(tmp.path());
    let (mut kv, port) = start_kv(tmp.path(), &run);
    let pid = kv.pid();
    // No request yet: the agent has served nothing, so only the static route knows the port.
    assert!(status(&run, pid).unwrap().served_ports().is_empty());
    let (key, key_path) = key_file(tmp.path());
    let route = format!("{port}={pid}");
    let mut d = start_preheatd(
        tmp.path(),
        &run,
        &key_path,
        &["--route", &route, "--strategies", "wake"],
    );
    d.wait_metric("preheatd_agents", 1.0);
    d.wait_metric("preheatd_ports", 1.0);
    let mut arb = Arbiter::new(d.udp, key);
    arb.announce(port, now_ns() + LEAD_NS);
    d.wait_metric("preheatd_dispatched_total", 1.0);
    assert!(
        wait_until(WAIT, || status(&run, pid).is_some_and(|s| s
            .preheat
            .announcements
            == 1
            && s.preheat.wake_spins + s.preheat.wake_polled == 1)),
        "agent did not act: {:?}",
        status(&run, pid)
    );

    // The server dies: preheatd keeps running, the agent leaves the registry, and
    // announcements for its port are dropped (no_agent, or a send error if one races the scan).
    kv.kill();
    arb.announce(port, now_ns() + LEAD_NS);
    d.wait_metric("preheatd_agents", 0.0);
    d.wait_metric("preheatd_ports", 0.0);
    assert!(!d
        .metrics()
        .contains_key(&format!("preheat_agent_up{{pid=\"{pid}\"}}")));
    let mut m = BTreeMap::new();
    assert!(
        wait_until(WAIT, || {
            m = d.metrics();
            m[&dropped("no_agent")] + m["preheatd_send_errors_total"] == 1.0
        }),
        "{m:#?}"
    );
    arb.announce(port, now_ns() + LEAD_NS);
    d.wait_metric(&dropped("no_agent"), m[&dropped("no_agent")] + 1.0);
    assert_eq!(d.metric("preheatd_dispatched_total"), 1.0);
    assert!(d.proc.alive(), "preheatd died:\n{}", d.proc.log());
    // The dead agent's socket files are left alone (preheatd changes nothing on the machine).
    assert!(run.join(format!("agent-{pid}.sock")).exists());

    // SIGTERM: a clean exit, status 0, ready file removed.
    preheat_engine::os::send_signal(d.proc.pid(), libc::SIGTERM, false).unwrap();
    let mut code = None;
    assert!(
        wait_until(WAIT, || {
            code = d.proc.child.try_wait().unwrap();
            code.is_some()
        }),
        "preheatd did not stop on SIGTERM:\n{}",
        d.proc.log()
    );
    assert_eq!(code.unwrap().code(), Some(0), "{}", d.proc.log());
    assert!(!d.ready.exists());
    let log = d.proc.log();
    assert!(log.contains("stopping:"), "{log}");
    assert!(
        log.contains(&format!("agent of pid {pid} is gone")),
        "{log}"
    );
}

#[test]
fn refuses_bad_key_and_explains_flags() {
    let tmp = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_preheatd"))
        .arg("--help")
        .output()
        .unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--listen",
        "--key-file",
        "--run-dir",
        "--strategies",
        "--metrics",
        "--min-lead-us",
        "--rate",
        "--burst",
        "--max-age-ms",
        "--route",
    ] {
        assert!(help.contains(flag), "{flag} missing in --help:\n{help}");
    }
    let bad = tmp.path().join("bad-key");
    std::fs::write(&bad, "not a key\n").unwrap();
    for key in [bad.as_path(), &tmp.path().join("missing")] {
        let out = Command::new(env!("CARGO_BIN_EXE_preheatd"))
            .arg("--key-file")
            .arg(key)
            .args(["--listen", "127.0.0.1:0", "--metrics", "127.0.0.1:0"])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("error:") && err.contains(&*key.to_string_lossy()),
            "{err}"
        );
    }
}
