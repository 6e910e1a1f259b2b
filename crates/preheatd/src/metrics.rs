//! The Prometheus text exposition (format 0.0.4) of preheatd's counters ([`crate::stats`]) and
//! a minimal HTTP/1.1 server for `GET /metrics`.
//!
//! Per-agent preheat counters are not kept here: they are asked from each agent's `Status` at
//! scrape time.

use std::fmt::Write as _;
use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use preheat_model::proto::PreheatStats;

use crate::log::log_limited;
use crate::registry::{query_status, RouteTable};
use crate::stats::{Stats, StatsSnapshot};

/// The same bounds as Prometheus `le` labels, in seconds.
const LEAD_LE: [&str; 10] = [
    "0", "0.000005", "0.00001", "0.00002", "0.00004", "0.000065", "0.0001", "0.0002", "0.001",
    "+Inf",
];

/// One agent's counters as asked at scrape time (`None`: it did not answer).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentSample {
    pub pid: u32,
    pub status: Option<PreheatStats>,
}

fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// A family of one sample without labels: its `# HELP` and `# TYPE` lines, then the value.
fn scalar(out: &mut String, name: &str, kind: &str, help: &str, v: impl std::fmt::Display) {
    family(out, name, kind, help);
    let _ = writeln!(out, "{name} {v}");
}

fn seconds(ns: i64) -> String {
    // `Display` for f64 never uses an exponent; Prometheus parses any float.
    format!("{}", ns as f64 / 1e9)
}

/// The Prometheus text exposition of `s` and the agents' counters.
pub fn render(s: &StatsSnapshot, agents: &[AgentSample]) -> String {
    let mut o = String::with_capacity(4096);
    render_announcements(&mut o, s);
    render_daemon(&mut o, s);
    render_lead(&mut o, s);
    render_agents(&mut o, agents);
    o
}

/// The announcement gate's families: received, accepted and dropped (by reason).
fn render_announcements(o: &mut String, s: &StatsSnapshot) {
    let g = &s.gate;
    scalar(
        o,
        "preheatd_announcements_received_total",
        "counter",
        "Datagrams received on the announcement socket, before any check.",
        g.received,
    );
    scalar(
        o,
        "preheatd_announcements_accepted_total",
        "counter",
        "Announcements that passed the gate (authenticated, fresh, not replayed, within the rate).",
        g.accepted,
    );
    family(
        o,
        "preheatd_announcements_dropped_total",
        "counter",
        "Announcements dropped, by reason: malformed, bad_mac (authentication failed), replayed, \
         stale (sent too long ago), rate_limited (by the gate); late (less lead than \
         --min-lead-us when received), no_agent (no local agent serves the port).",
    );
    for (reason, v) in [
        ("malformed", g.malformed),
        ("bad_mac", g.bad_mac),
        ("replayed", g.replayed),
        ("stale", g.stale),
        ("rate_limited", g.rate_limited),
        ("late", s.late),
        ("no_agent", s.no_agent),
    ] {
        let _ = writeln!(
            o,
            "preheatd_announcements_dropped_total{{reason=\"{reason}\"}} {v}"
        );
    }
}

/// The dispatcher's and the registry's families: dispatched, send errors, agents, ports, scans.
fn render_daemon(o: &mut String, s: &StatsSnapshot) {
    scalar(
        o,
        "preheatd_dispatched_total",
        "counter",
        "Announcements sent to at least one local agent's trigger socket.",
        s.dispatched,
    );
    scalar(
        o,
        "preheatd_send_errors_total",
        "counter",
        "Trigger datagrams that could not be sent (one per agent and announcement: agent gone, \
         its queue full).",
        s.send_errors,
    );
    scalar(
        o,
        "preheatd_agents",
        "gauge",
        "Local agents in the registry.",
        s.agents,
    );
    scalar(
        o,
        "preheatd_ports",
        "gauge",
        "Ports served by at least one registered agent.",
        s.ports,
    );
    scalar(
        o,
        "preheatd_registry_scans_total",
        "counter",
        "Scans of the run directory for agents.",
        s.scans,
    );
}

/// The lead histogram of accepted announcements (cumulative buckets, sum, count).
fn render_lead(o: &mut String, s: &StatsSnapshot) {
    family(
        o,
        "preheatd_lead_seconds",
        "histogram",
        "Lead of accepted announcements when received: announced arrival minus receipt time \
         (CLOCK_MONOTONIC of this host; negative when already past).",
    );
    let mut cum = 0u64;
    for (i, le) in LEAD_LE.iter().enumerate() {
        cum += s.lead.buckets[i];
        let _ = writeln!(o, "preheatd_lead_seconds_bucket{{le=\"{le}\"}} {cum}");
    }
    let _ = writeln!(o, "preheatd_lead_seconds_sum {}", seconds(s.lead.sum_ns));
    let _ = writeln!(o, "preheatd_lead_seconds_count {}", s.lead.count);
}

/// The per-agent families: whether each agent answered, then its counters (answering ones only).
fn render_agents(o: &mut String, agents: &[AgentSample]) {
    family(
        o,
        "preheat_agent_up",
        "gauge",
        "1 if the registered agent answered Status at this scrape, else 0.",
    );
    for a in agents {
        let _ = writeln!(
            o,
            "preheat_agent_up{{pid=\"{}\"}} {}",
            a.pid,
            u8::from(a.status.is_some())
        );
    }
    type Field = fn(&PreheatStats) -> u64;
    let per_agent: [(&str, &str, Field); 6] = [
        (
            "preheat_agent_announcements_total",
            "Announcements the agent's trigger socket received (from any sender).",
            |p| p.announcements,
        ),
        (
            "preheat_agent_preheats_total",
            "Preheats (lines strategy) the agent ran.",
            |p| p.preheats,
        ),
        (
            "preheat_agent_lines_preheated_total",
            "Cache lines the agent prefetched.",
            |p| p.lines_preheated,
        ),
        (
            "preheat_agent_wake_spins_total",
            "Wake spins (wake strategy) the agent ran.",
            |p| p.wake_spins,
        ),
        (
            "preheat_agent_wake_polled_total",
            "Wake windows (wake strategy) the agent ran by keeping the CPUs polling in idle.",
            |p| p.wake_polled,
        ),
        (
            "preheat_agent_late_total",
            "Announcements the agent dropped as late (arrival already past).",
            |p| p.late,
        ),
    ];
    for (name, help, f) in per_agent {
        family(o, name, "counter", help);
        for a in agents {
            if let Some(st) = &a.status {
                let _ = writeln!(o, "{name}{{pid=\"{}\"}} {}", a.pid, f(st));
            }
        }
    }
}

/// What the `/metrics` endpoint needs.
pub struct MetricsContext {
    pub stats: Arc<Stats>,
    pub table: Arc<RouteTable>,
    pub run_dir: PathBuf,
    /// Per-agent `Status` timeout at scrape time.
    pub agent_timeout: Duration,
}

impl MetricsContext {
    /// Render the current metrics, asking every registered agent for its counters.
    pub fn scrape(&self) -> String {
        let routes = self.table.get();
        let agents: Vec<AgentSample> = routes
            .pids()
            .iter()
            .map(|&pid| AgentSample {
                pid,
                status: query_status(&self.run_dir, pid, self.agent_timeout)
                    .ok()
                    .map(|s| s.preheat),
            })
            .collect();
        render(&self.stats.snapshot(), &agents)
    }
}

/// Longest request head read.
const MAX_HEAD: usize = 8192;
/// Per-connection I/O timeout (connections are served one at a time).
const CONN_TIMEOUT: Duration = Duration::from_secs(2);

/// Read the request head (up to the blank line) and return the method and path of its
/// request line, or `None` for anything that is not a readable HTTP/1.x request.
fn read_request_line(s: &mut TcpStream) -> io::Result<Option<(String, String)>> {
    let mut buf = Vec::with_capacity(512);
    let mut chunk = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") && !buf.windows(2).any(|w| w == b"\n\n") {
        if buf.len() >= MAX_HEAD {
            return Ok(None);
        }
        let n = s.read(&mut chunk)?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let Some(line) = buf.split(|b| *b == b'\n').next() else {
        return Ok(None);
    };
    let Ok(line) = std::str::from_utf8(line) else {
        return Ok(None);
    };
    let mut parts = line.trim_end_matches('\r').split(' ');
    match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some(m), Some(p), Some(v), None) if v.starts_with("HTTP/1.") => {
            Ok(Some((m.to_string(), p.to_string())))
        }
        _ => Ok(None),
    }
}

fn respond(s: &mut TcpStream, status: &str, ctype: &str, body: &str, head_only: bool) {
    let mut r = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    if !head_only {
        r.push_str(body);
    }
    let _ = s.write_all(r.as_bytes());
    let _ = s.flush();
}

/// Serve one connection: `GET /metrics` (and `HEAD`), `GET /` (a pointer), else 404 / 405 /
/// 400. Always closes the connection.
pub fn handle_connection(mut s: TcpStream, ctx: &MetricsContext) {
    let _ = s.set_read_timeout(Some(CONN_TIMEOUT));
    let _ = s.set_write_timeout(Some(CONN_TIMEOUT));
    const TEXT: &str = "text/plain; charset=utf-8";
    let (method, path) = match read_request_line(&mut s) {
        Ok(Some(x)) => x,
        Ok(None) => {
            respond(&mut s, "400 Bad Request", TEXT, "bad request\n", false);
            return;
        }
        Err(_) => return,
    };
    let head_only = method == "HEAD";
    if method != "GET" && !head_only {
        respond(&mut s, "405 Method Not Allowed", TEXT, "only GET\n", false);
        return;
    }
    let path = path.split('?').next().unwrap_or("");
    match path {
        "/metrics" => {
            let body = ctx.scrape();
            respond(
                &mut s,
                "200 OK",
                "text/plain; version=0.0.4; charset=utf-8",
                &body,
                head_only,
            );
        }
        "/" => respond(
            &mut s,
            "200 OK",
            TEXT,
            "preheatd: metrics at /metrics\n",
            head_only,
        ),
        _ => respond(&mut s, "404 Not Found", TEXT, "not found\n", head_only),
    }
}

/// Body of the metrics thread: accept and serve connections one at a time until `shutdown`
/// (checked between connections and every 100 ms while idle).
pub fn serve(listener: TcpListener, ctx: MetricsContext, shutdown: Arc<AtomicBool>) {
    if let Err(e) = listener.set_nonblocking(true) {
        log_limited("metrics", || format!("metrics listener: {e}"));
    }
    while !shutdown.load(Relaxed) {
        match listener.accept() {
            Ok((s, _)) => {
                let _ = s.set_nonblocking(false);
                handle_connection(s, &ctx);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                log_limited("metrics", || format!("metrics: accept failed: {e}"));
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::GateCounters;
    use std::collections::BTreeMap;

    /// Parse an exposition into `name{labels} → value` and check its structure: every sample
    /// belongs to a family announced by HELP and TYPE before it.
    pub(crate) fn parse_exposition(text: &str) -> BTreeMap<String, f64> {
        let mut families: BTreeMap<String, String> = BTreeMap::new();
        let mut helped = std::collections::BTreeSet::new();
        let mut out = BTreeMap::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# HELP ") {
                let (name, help) = rest.split_once(' ').expect("HELP has text");
                assert!(!help.is_empty());
                assert!(helped.insert(name.to_string()), "two HELP for {name}");
            } else if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').unwrap();
                assert!(helped.contains(name), "TYPE before HELP for {name}");
                assert!(["counter", "gauge", "histogram"].contains(&kind));
                assert!(families.insert(name.into(), kind.into()).is_none());
            } else {
                assert!(!line.starts_with('#') && !line.is_empty(), "{line:?}");
                let (key, value) = line.rsplit_once(' ').unwrap();
                let name = key.split('{').next().unwrap();
                let base = ["_bucket", "_sum", "_count"]
                    .iter()
                    .find_map(|s| name.strip_suffix(s).filter(|b| families.contains_key(*b)))
                    .unwrap_or(name);
                assert!(
                    families.contains_key(base),
                    "sample {name} without a family"
                );
                assert!(name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'));
                let v: f64 = value
                    .parse()
                    .unwrap_or_else(|_| panic!("value in {line:?}"));
                assert!(out.insert(key.to_string(), v).is_none(), "duplicate {key}");
            }
        }
        out
    }

    #[test]
    fn exposition_format() {
        let st = Stats::new();
        st.set_gate(&GateCounters {
            received: 10,
            malformed: 1,
            bad_mac: 2,
            replayed: 3,
            stale: 0,
            rate_limited: 0,
            accepted: 4,
        });
        st.late.fetch_add(1, Relaxed);
        st.no_agent.fetch_add(1, Relaxed);
        st.dispatched.fetch_add(2, Relaxed);
        st.set_registry(2, 1);
        st.lead.observe(-1_000);
        st.lead.observe(30_000);
        st.lead.observe(70_000);
        let agents = [
            AgentSample {
                pid: 7,
                status: Some(PreheatStats {
                    preheats: 5,
                    lines_preheated: 1000,
                    late: 1,
                    wake_spins: 2,
                    announcements: 9,
                    ..Default::default()
                }),
            },
            AgentSample {
                pid: 8,
                status: None,
            },
        ];
        let text = render(&st.snapshot(), &agents);
        let m = parse_exposition(&text);
        let get = |k: &str| *m.get(k).unwrap_or_else(|| panic!("{k} missing in\n{text}"));
        assert_eq!(get("preheatd_announcements_received_total"), 10.0);
        assert_eq!(get("preheatd_announcements_accepted_total"), 4.0);
        for (r, v) in [
            ("malformed", 1.0),
            ("bad_mac", 2.0),
            ("replayed", 3.0),
            ("stale", 0.0),
            ("rate_limited", 0.0),
            ("late", 1.0),
            ("no_agent", 1.0),
        ] {
            assert_eq!(
                get(&format!(
                    "preheatd_announcements_dropped_total{{reason=\"{r}\"}}"
                )),
                v
            );
        }
        assert_eq!(get("preheatd_dispatched_total"), 2.0);
        assert_eq!(get("preheatd_agents"), 2.0);
        assert_eq!(get("preheatd_lead_seconds_bucket{le=\"0\"}"), 1.0);
        assert_eq!(get("preheatd_lead_seconds_bucket{le=\"0.00004\"}"), 2.0);
        assert_eq!(get("preheatd_lead_seconds_bucket{le=\"0.0001\"}"), 3.0);
        assert_eq!(get("preheatd_lead_seconds_bucket{le=\"+Inf\"}"), 3.0);
        assert_eq!(get("preheatd_lead_seconds_count"), 3.0);
        assert!((get("preheatd_lead_seconds_sum") - 99e-6).abs() < 1e-12);
        assert_eq!(get("preheat_agent_up{pid=\"7\"}"), 1.0);
        assert_eq!(get("preheat_agent_up{pid=\"8\"}"), 0.0);
        assert_eq!(get("preheat_agent_preheats_total{pid=\"7\"}"), 5.0);
        assert_eq!(
            get("preheat_agent_lines_preheated_total{pid=\"7\"}"),
            1000.0
        );
        assert_eq!(get("preheat_agent_late_total{pid=\"7\"}"), 1.0);
        assert!(!m.contains_key("preheat_agent_preheats_total{pid=\"8\"}"));
        // Buckets are cumulative and non-decreasing, in order.
        let b: Vec<f64> = text
            .lines()
            .filter(|l| l.starts_with("preheatd_lead_seconds_bucket"))
            .map(|l| l.rsplit_once(' ').unwrap().1.parse().unwrap())
            .collect();
        assert_eq!(b.len(), 10);
        assert!(b.windows(2).all(|w| w[0] <= w[1]));
    }

    fn http(addr: std::net::SocketAddr, req: &[u8]) -> String {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(req).unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }

    #[test]
    fn http_endpoint() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let d = tempfile::tempdir().unwrap();
        let stats = Arc::new(Stats::new());
        stats.dispatched.fetch_add(3, Relaxed);
        let ctx = MetricsContext {
            stats,
            table: Arc::new(RouteTable::new()),
            run_dir: d.path().to_path_buf(),
            agent_timeout: Duration::from_millis(100),
        };
        let shutdown = Arc::new(AtomicBool::new(false));
        let sd = shutdown.clone();
        let h = std::thread::spawn(move || serve(l, ctx, sd));

        let r = http(addr, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(r.starts_with("HTTP/1.1 200 OK\r\n"), "{r}");
        assert!(r.contains("Content-Type: text/plain; version=0.0.4"));
        let (head, body) = r.split_once("\r\n\r\n").unwrap();
        let len: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("Content-Length: "))
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(len, body.len());
        assert_eq!(parse_exposition(body)["preheatd_dispatched_total"], 3.0);

        let r = http(addr, b"HEAD /metrics HTTP/1.0\r\n\r\n");
        assert!(
            r.starts_with("HTTP/1.1 200 OK\r\n") && r.ends_with("\r\n\r\n"),
            "{r}"
        );
        assert!(http(addr, b"GET /nope HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404"));
        assert!(http(addr, b"POST /metrics HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 405"));
        assert!(http(addr, b"\xff\xfe garbage\r\n\r\n").starts_with("HTTP/1.1 400"));
        // A client that connects and says nothing is timed out, and the server goes on.
        let idle = TcpStream::connect(addr).unwrap();
        assert!(http(addr, b"GET / HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 200"));
        drop(idle);

        shutdown.store(true, Relaxed);
        h.join().unwrap();
    }
}
