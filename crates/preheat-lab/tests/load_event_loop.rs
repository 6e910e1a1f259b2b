//! The load-generation engine's event loop (threads driving several connections each, and
//! `Wait::Epoll` for any threads ≤ connections) against the loopback test server of `support`.
//!
//! No wall-clock performance assertions: only counts, orderings and coarse sanity bounds.

mod support;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use preheat_lab::driver::Wait;
use preheat_lab::load::{run, ClientLoop, LoadConfig, LoadSummary, Mode, RecordSink};
use support::*;

// ---------------------------------------------------------------------------------------------
// Multiplexed client threads (threads < connections).

fn run_mux(
    c: &LoadConfig,
    addr: SocketAddr,
    sink: Option<Box<dyn RecordSink>>,
) -> Result<LoadSummary> {
    let stop = AtomicBool::new(false);
    run(c, &mux_connector(addr), None, sink, &stop, &quiet)
}

fn conn_ids(h: &str, rows: &[Vec<String>]) -> std::collections::BTreeSet<String> {
    rows.iter().map(|r| r[col(h, "conn")].clone()).collect()
}

#[test]
fn multiplexed_closed_loop_four_connections_on_one_thread() {
    for wait in [Wait::Block, Wait::Spin] {
        let srv = TestServer::start();
        let csv = Records::new();
        let mut c = cfg(Mode::Closed);
        c.requests = Some(2000);
        c.connections = 4;
        c.threads = 1;
        c.wait = wait;
        c.warmup = 2;
        let s = run_mux(&c, srv.addr, csv.sink()).unwrap();
        assert_sane(&s);
        assert_eq!(
            (s.requests, s.errors, s.wrong),
            (2000, 0, 0),
            "{wait:?}: {s:?}"
        );
        assert_eq!((s.connections, s.threads), (4, 1));
        let (h, rows) = csv.read();
        assert_eq!(rows.len(), 2000);
        assert_eq!(
            conn_ids(&h, &rows).len(),
            4,
            "{wait:?}: every connection measured"
        );
        assert_seqs(&h, &rows, 2000);
        for r in &rows {
            assert_times_ordered(&h, r);
        }
        assert_served(&srv, 2000 + 4 * 2, 4);
    }
}

#[test]
fn multiplexed_threads_split_connections_and_a_duration_bounds_the_run() {
    let srv = TestServer::start();
    let csv = Records::new();
    let mut c = cfg(Mode::Closed);
    c.requests = None;
    c.duration = Some(Duration::from_millis(300));
    c.connections = 5;
    c.threads = 2;
    let t0 = Instant::now();
    let s = run_mux(&c, srv.addr, csv.sink()).unwrap();
    assert!(t0.elapsed() < Duration::from_secs(10));
    assert_sane(&s);
    assert!(s.requests > 0 && s.errors == 0, "{s:?}");
    assert_eq!(s.threads, 2);
    assert!(s.duration_s > 0.2 && s.duration_s < 5.0, "{s:?}");
    let (h, rows) = csv.read();
    assert_eq!(rows.len() as u64, s.requests);
    assert_eq!(conn_ids(&h, &rows).len(), 5);
}

#[test]
fn multiplexed_reconnects_after_the_server_drops_a_connection() {
    let srv = TestServer::start();
    // 4 warm-ups, then the server closes a connection instead of answering request 10.
    srv.ctl.drop_at.store(10, Ordering::SeqCst);
    let mut c = cfg(Mode::Closed);
    c.requests = Some(200);
    c.connections = 4;
    c.threads = 1;
    let s = run_mux(&c, srv.addr, None).unwrap();
    assert_sane(&s);
    assert_eq!((s.requests, s.errors, s.wrong), (200, 1, 0), "{s:?}");
    assert_eq!(srv.ctl.accepted.load(Ordering::SeqCst), 5, "one reconnect");
}

#[test]
fn multiplexed_configuration_errors_are_clear() {
    let srv = TestServer::start();
    let stop = AtomicBool::new(false);
    // Idle-gap needs one thread per connection.
    let mut c = cfg(Mode::IdleGap);
    c.connections = 2;
    c.threads = 1;
    let e = run_err(&c, &mux_connector(srv.addr), None);
    assert!(
        e.contains("idle-gap") && e.contains("one thread per connection"),
        "{e}"
    );
    // More threads than connections.
    let mut c = cfg(Mode::Closed);
    c.threads = 3;
    let e = run_err(&c, &mux_connector(srv.addr), None);
    assert!(e.contains("more client threads"), "{e}");
    // Announcements need one thread per connection.
    let mut c = cfg(Mode::Closed);
    c.connections = 2;
    c.threads = 1;
    let mk = fake_announcer(0, Arc::default());
    let e = run_err(&c, &mux_connector(srv.addr), Some(&mk));
    assert!(
        e.contains("announcements need one thread per connection"),
        "{e}"
    );
    // A driver without the multiplexed path (like MySQL's): a clear error, nothing measured.
    let e = run_err(&c, &connector(srv.addr), None);
    assert!(
        e.contains("cannot multiplex") && e.contains("one thread per connection"),
        "{e}"
    );
    // threads == connections is the thread-per-connection engine (the blocking driver works).
    let mut c = cfg(Mode::Closed);
    c.connections = 2;
    c.threads = 2;
    let s = run(&c, &connector(srv.addr), None, None, &stop, &quiet).unwrap();
    assert_eq!((s.requests, s.threads), (100, 2));
}

// ---------------------------------------------------------------------------------------------
// Wait::Epoll: the event loop for any threads <= connections, one connection included.

/// Run `c` with the counting multiplexed driver; the summary and the driver's call counts.
fn run_counted(
    c: &LoadConfig,
    srv: &TestServer,
    csv: Option<&Records>,
) -> (LoadSummary, Arc<Counts>) {
    let counts = Arc::new(Counts::default());
    let stop = AtomicBool::new(false);
    let sink = csv.and_then(Records::sink);
    let s = run(
        c,
        &counting_mux_connector(srv.addr, counts.clone()),
        None,
        sink,
        &stop,
        &quiet,
    )
    .unwrap_or_else(|e| panic!("{:?} {}c/{}t: {e:#}", c.wait, c.connections, c.threads));
    (s, counts)
}

#[test]
fn epoll_one_connection_on_one_thread_runs_the_event_loop() {
    // threads 1 and threads 0 (= one per connection) both mean one thread here.
    for threads in [1, 0] {
        let srv = TestServer::start();
        let csv = Records::new();
        let mut c = cfg(Mode::Closed);
        c.requests = Some(1000);
        c.connections = 1;
        c.threads = threads;
        c.wait = Wait::Epoll;
        c.warmup = 3;
        let (s, counts) = run_counted(&c, &srv, Some(&csv));
        assert_sane(&s);
        assert_eq!((s.requests, s.errors, s.wrong), (1000, 0, 0), "{s:?}");
        assert_eq!((s.connections, s.threads), (1, 1));
        assert_eq!(s.client_loop, ClientLoop::EventLoop, "{s:?}");
        // Only the warm-ups went through the synchronous request(); every measured request
        // was collected by poll_reply.
        assert_eq!(counts.requests.load(Ordering::SeqCst), 3);
        assert!(counts.polls.load(Ordering::SeqCst) >= 1000);
        let (h, rows) = csv.read();
        assert_eq!(rows.len(), 1000);
        for r in &rows {
            assert_times_ordered(&h, r);
            assert_eq!(r[col(&h, "ok")], "true");
        }
        assert_served(&srv, 1000 + 3, 1);
    }
}

#[test]
fn epoll_four_connections_on_two_threads() {
    let srv = TestServer::start();
    let csv = Records::new();
    let mut c = cfg(Mode::Closed);
    c.requests = Some(2000);
    c.connections = 4;
    c.threads = 2;
    c.wait = Wait::Epoll;
    c.warmup = 2;
    let (s, counts) = run_counted(&c, &srv, Some(&csv));
    assert_sane(&s);
    assert_eq!((s.requests, s.errors, s.wrong), (2000, 0, 0), "{s:?}");
    assert_eq!((s.connections, s.threads), (4, 2));
    assert_eq!(s.client_loop, ClientLoop::EventLoop);
    assert_eq!(
        counts.requests.load(Ordering::SeqCst),
        4 * 2,
        "warm-ups only"
    );
    let (h, rows) = csv.read();
    assert_eq!(rows.len(), 2000);
    assert_eq!(conn_ids(&h, &rows).len(), 4, "every connection measured");
    assert_seqs(&h, &rows, 2000);
    assert_eq!(srv.ctl.served.load(Ordering::SeqCst), 2000 + 4 * 2);
    // Open loop on the same path keeps its schedule.
    let mut c = cfg(Mode::Open);
    c.requests = Some(400);
    c.rate = 4000.0;
    c.connections = 4;
    c.threads = 2;
    c.wait = Wait::Epoll;
    let (s, _) = run_counted(&c, &srv, None);
    assert_sane(&s);
    assert_eq!(
        (s.requests, s.errors, s.client_loop),
        (400, 0, ClientLoop::EventLoop)
    );
    assert_eq!(s.offered_rps, 4000.0);
}

/// Fails if epoll mode silently ran the synchronous path: with a driver that has only
/// `request()` (no multiplexed path) it must refuse, and the summary of every wait mode must name
/// the loop that really ran.
#[test]
fn epoll_never_falls_back_to_the_synchronous_path() {
    let srv = TestServer::start();
    let mut c = cfg(Mode::Closed);
    c.wait = Wait::Epoll;
    c.connections = 1;
    c.threads = 1;
    let e = run_err(&c, &connector(srv.addr), None);
    assert!(
        e.contains("wait epoll") && e.contains("not supported by the memcached driver"),
        "{e}"
    );
    // Block and Spin with one thread per connection keep the synchronous path ...
    for wait in [Wait::Block, Wait::Spin] {
        let mut c = cfg(Mode::Closed);
        c.wait = wait;
        c.connections = 2;
        c.threads = 2;
        let (s, counts) = run_counted(&c, &srv, None);
        assert_eq!((s.requests, s.errors), (100, 0), "{wait:?}");
        assert_eq!(s.client_loop, ClientLoop::ThreadPerConnection, "{wait:?}");
        assert_eq!(counts.polls.load(Ordering::SeqCst), 0, "{wait:?}");
        assert_eq!(counts.requests.load(Ordering::SeqCst), 100 + 2, "{wait:?}");
        // ... and run the event loop with fewer threads than connections.
        c.threads = 1;
        let (s, _) = run_counted(&c, &srv, None);
        assert_eq!(s.client_loop, ClientLoop::EventLoop, "{wait:?}");
    }
    // The JSON names.
    assert_eq!(
        serde_json::to_value(ClientLoop::EventLoop).unwrap(),
        serde_json::json!("event-loop")
    );
    assert_eq!(
        ClientLoop::ThreadPerConnection.name(),
        "thread-per-connection"
    );
}

/// Epoll mode waits in epoll_wait: with replies 1 ms late, the loop polls a connection about
/// once per reply (after readiness), not thousands of times as a busy poll would.
#[test]
fn epoll_waits_for_readiness_instead_of_polling() {
    let srv = TestServer::start();
    srv.ctl.delay_us.store(1000, Ordering::SeqCst);
    let mut c = cfg(Mode::Closed);
    c.requests = Some(50);
    c.connections = 1;
    c.threads = 1;
    c.wait = Wait::Epoll;
    let (s, counts) = run_counted(&c, &srv, None);
    assert_eq!(
        (s.requests, s.errors, s.client_loop),
        (50, 0, ClientLoop::EventLoop)
    );
    assert!(s.p50_us >= 1000.0, "{s:?}");
    let polls = counts.polls.load(Ordering::SeqCst);
    assert!(
        polls <= 3 * 50,
        "{polls} polls for 50 replies: not waiting in epoll_wait"
    );
    // The same with Spin polls far more often (so the bound above can fail).
    c.wait = Wait::Spin;
    c.connections = 2;
    let (_, counts) = run_counted(&c, &srv, None);
    assert!(counts.polls.load(Ordering::SeqCst) > 3 * 50);
}

#[test]
fn epoll_configuration_errors_are_clear() {
    let srv = TestServer::start();
    // Idle-gap needs the thread-per-connection loop, also with one connection.
    let mut c = cfg(Mode::IdleGap);
    c.wait = Wait::Epoll;
    let e = run_err(&c, &mux_connector(srv.addr), None);
    assert!(e.contains("idle-gap") && e.contains("wait epoll"), "{e}");
    // Announcements too.
    let mut c = cfg(Mode::Closed);
    c.wait = Wait::Epoll;
    let mk = fake_announcer(0, Arc::default());
    let e = run_err(&c, &mux_connector(srv.addr), Some(&mk));
    assert!(
        e.contains("announcements") && e.contains("wait epoll"),
        "{e}"
    );
    assert_eq!(srv.ctl.served.load(Ordering::SeqCst), 0, "nothing sent");
}

/// Tests whose outcome depends on the machine's timing: a request on the connection that did
/// not stall must not wait 20 ms, which a loaded 2-CPU machine can break (it did in CI, with
/// the other tests of the pass running beside it). `scripts/test.sh` runs every `timing::` test
/// after all others, one at a time.
mod timing {
    use super::*;

    /// A host stall of ≥ 20 ms (another tenant on the vCPU's core) can delay a request on the
    /// other connection too, which reads like the fault this test looks for (seen once in a
    /// suite run, Spin). The fault itself would delay every request the other connection sends
    /// during the 100 ms stall, every time: so each wait mode gets three attempts, and the test
    /// fails only when all three show it. Each failed attempt is said.
    #[test]
    fn multiplexed_open_loop_counts_a_stall_and_does_not_stall_the_other_connection() {
        for wait in [Wait::Block, Wait::Spin] {
            let mut result = Err(String::new());
            for attempt in 1..=3 {
                result = stall_on_one_connection(wait);
                match &result {
                    Ok(()) => break,
                    Err(e) => eprintln!("{wait:?}, attempt {attempt} of 3: {e}"),
                }
            }
            if let Err(e) = result {
                panic!("{e}");
            }
        }
    }

    /// One run: a 100 ms stall on one of two connections of one thread. Whether the other
    /// connection kept its schedule is the `Err`; everything else is asserted.
    fn stall_on_one_connection(wait: Wait) -> Result<(), String> {
        let srv = TestServer::start();
        // 2 warm-ups; stall 100 ms on measured request ~200 (about 0.2 s in).
        srv.ctl.stall_at.store(202, Ordering::SeqCst);
        srv.ctl.stall_ms.store(100, Ordering::SeqCst);
        let csv = Records::new();
        let mut c = cfg(Mode::Open);
        c.requests = Some(600);
        c.rate = 1000.0;
        c.connections = 2;
        c.threads = 1;
        c.wait = wait;
        let s = run_mux(&c, srv.addr, csv.sink()).unwrap();
        assert_sane(&s);
        assert_eq!((s.requests, s.errors), (600, 0), "{s:?}");
        assert_eq!(s.offered_rps, 1000.0);
        let (h, rows) = csv.read();
        assert_eq!(rows.len(), 600);
        let (lat, intended, conn) = (
            col(&h, "latency_us"),
            col(&h, "intended_ns"),
            col(&h, "conn"),
        );
        let f = |r: &Vec<String>, i: usize| r[i].parse::<f64>().unwrap();
        // Each connection's intended times are its Poisson schedule (increasing).
        for id in conn_ids(&h, &rows) {
            let times: Vec<f64> = rows
                .iter()
                .filter(|r| r[conn] == id)
                .map(|r| f(r, intended))
                .collect();
            assert!(times.windows(2).all(|w| w[0] <= w[1]));
        }
        assert!(s.max_us >= 90_000.0, "{wait:?}: {s:?}");
        // The stalled connection: the requests scheduled during the stall queued behind it,
        // their latency counts from the intended time, and they went out late.
        let queued = queued_behind_stall(&h, &rows, &format!("{wait:?}"));
        let stalled = &queued[0][conn];
        if !queued.iter().all(|r| &r[conn] == stalled) {
            return Err(format!("{wait:?}: not only one connection stalled"));
        }
        // The other connection on the same thread kept its schedule during the stall.
        let (t_lo, t_hi) = queued.iter().fold((f64::MAX, 0.0f64), |(lo, hi), r| {
            (lo.min(f(r, intended)), hi.max(f(r, intended)))
        });
        let others: Vec<&Vec<String>> = rows
            .iter()
            .filter(|r| &r[conn] != stalled && (t_lo..=t_hi).contains(&f(r, intended)))
            .collect();
        assert!(
            others.len() >= 10,
            "{wait:?}: {} requests on the other connection",
            others.len()
        );
        let slow = others.iter().filter(|r| f(r, lat) >= 20_000.0).count();
        if slow > 0 {
            return Err(format!(
                "{wait:?}: {slow} of the other connection's {} requests waited ≥ 20 ms",
                others.len()
            ));
        }
        Ok(())
    }
}
