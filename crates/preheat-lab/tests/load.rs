//! The load-generation engine against a real loopback TCP server started in the test, through an
//! in-test driver (`support`): the arrival process, coordinated omission, records, failures,
//! the three modes and announcements, on one thread per connection. The event loop has its
//! own file (`load_event_loop.rs`).
//!
//! No wall-clock performance assertions: only counts, orderings and coarse sanity bounds.

mod support;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use preheat_lab::load::{csv_header, poisson_gaps_ns, run, LoadSummary, Mode};
use support::*;

// ---------------------------------------------------------------------------------------------
// The arrival process.

#[test]
fn poisson_mean_within_3_percent_and_reproducible() {
    for (rate, seed) in [(1000.0, 1u64), (2000.0, 42), (50.0, 7), (123_456.0, 99)] {
        let gaps = poisson_gaps_ns(rate, seed, 20_000);
        assert_eq!(gaps.len(), 20_000);
        let mean = gaps.iter().sum::<u64>() as f64 / gaps.len() as f64;
        let want = 1e9 / rate;
        assert!(
            (mean - want).abs() / want < 0.03,
            "rate {rate} seed {seed}: mean gap {mean:.0} ns, want {want:.0}"
        );
        // Exponential: the median is ln 2 of the mean, and about 1/e of the gaps exceed it.
        let over = gaps.iter().filter(|g| **g as f64 > want).count() as f64 / 20_000.0;
        assert!(
            (over - (-1f64).exp()).abs() < 0.02,
            "share above the mean {over}"
        );
        assert_eq!(
            gaps,
            poisson_gaps_ns(rate, seed, 20_000),
            "same seed, same schedule"
        );
        assert_ne!(
            gaps,
            poisson_gaps_ns(rate, seed + 1, 20_000),
            "seeds differ"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Coordinated omission.

#[test]
fn open_loop_counts_a_stall_against_every_request_scheduled_during_it() {
    let srv = TestServer::start();
    // Request 1 is the warm-up; stall 100 ms on measured request ~200 (about 0.2 s in).
    srv.ctl.stall_at.store(201, Ordering::SeqCst);
    srv.ctl.stall_ms.store(100, Ordering::SeqCst);
    let csv = Records::new();
    let mut c = cfg(Mode::Open);
    c.requests = Some(600);
    c.rate = 1000.0;
    let s = run_plain(&c, srv.addr, csv.sink());
    assert_sane(&s);
    assert_eq!(s.requests, 600);
    assert_eq!(s.errors, 0);
    let (h, rows) = csv.read();
    assert_eq!(rows.len(), 600);
    // The requests that should have gone out during the stall waited for it: their latency
    // (from the intended time) includes the queueing, and they really went out late.
    queued_behind_stall(&h, &rows, "open loop");
    assert!(s.max_us >= 90_000.0, "the stalled request itself: {s:?}");
    assert!(s.send_late_us_p99 >= 10_000.0, "{s:?}");
    // The intended times are the Poisson schedule, not "when the connection was free": they
    // strictly increase and are spread over the ~0.6 s the offered load takes.
    let times: Vec<f64> = rows.iter().map(|r| numf(&h, r, "intended_ns")).collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]));
    let span_s = (times[times.len() - 1] - times[0]) / 1e9;
    assert!(
        (0.3..3.0).contains(&span_s),
        "intended times span {span_s} s"
    );
}

// ---------------------------------------------------------------------------------------------
// Records.

#[test]
fn records_csv_has_a_header_and_one_row_per_request() {
    let srv = TestServer::start();
    let csv = Records::new();
    let mut c = cfg(Mode::Open);
    c.requests = Some(300);
    c.rate = 2000.0;
    c.connections = 2;
    c.strategy = "wake+lines".into();
    let s = run_plain(&c, srv.addr, csv.sink());
    assert_sane(&s);
    assert_eq!(s.requests, 300);
    assert_eq!(s.offered_rps, 2000.0);
    let (h, rows) = csv.read();
    assert_eq!(h, csv_header());
    assert_eq!(rows.len(), 300);
    let ncol = h.split(',').count();
    assert!(rows.iter().all(|r| r.len() == ncol));
    assert_seqs(&h, &rows, 300);
    for r in &rows {
        assert_eq!(r[col(&h, "mode")], "open");
        assert_eq!(r[col(&h, "kind")], "get");
        assert_eq!(r[col(&h, "ok")], "true");
        assert_eq!(r[col(&h, "strategy")], "wake+lines");
        assert_times_ordered(&h, r);
        assert_eq!(num(&h, r, "granted_ns"), num(&h, r, "intended_ns"));
    }
    let conns: std::collections::BTreeSet<&str> =
        rows.iter().map(|r| r[col(&h, "conn")].as_str()).collect();
    assert_eq!(conns.len(), 2, "both connections measured");
    // 2 connections × 1 warm-up + 300 measured.
    assert_served(&srv, 302, 2);
}

#[test]
fn stop_ends_a_long_run_quickly_and_keeps_what_was_measured() {
    let srv = TestServer::start();
    let csv = Records::new();
    let mut c = cfg(Mode::Open);
    c.requests = None;
    c.duration = Some(Duration::from_secs(600));
    c.rate = 500.0;
    c.connections = 2;
    let stop = AtomicBool::new(false);
    let progress_calls = AtomicU64::new(0);
    let last_progress = AtomicU64::new(0);
    let progress = |n: u64| {
        progress_calls.fetch_add(1, Ordering::SeqCst);
        last_progress.store(n, Ordering::SeqCst);
    };
    let t0 = Instant::now();
    let s = std::thread::scope(|sc| {
        sc.spawn(|| {
            std::thread::sleep(Duration::from_millis(500));
            stop.store(true, Ordering::SeqCst);
        });
        run(&c, &connector(srv.addr), None, csv.sink(), &stop, &progress).unwrap()
    });
    assert!(
        t0.elapsed() < Duration::from_secs(10),
        "took {:?}",
        t0.elapsed()
    );
    assert_sane(&s);
    assert!(s.requests > 0, "{s:?}");
    let (_, rows) = csv.read();
    assert_eq!(rows.len() as u64, s.requests);
    assert!(progress_calls.load(Ordering::SeqCst) >= 2);
    assert_eq!(last_progress.load(Ordering::SeqCst), s.requests);

    // Idle-gap mode with a long gap stops as quickly.
    let mut c = cfg(Mode::IdleGap);
    c.gap = Duration::from_secs(60);
    stop.store(false, Ordering::SeqCst);
    let t0 = Instant::now();
    let s = std::thread::scope(|sc| {
        sc.spawn(|| {
            std::thread::sleep(Duration::from_millis(200));
            stop.store(true, Ordering::SeqCst);
        });
        run(&c, &connector(srv.addr), None, None, &stop, &quiet).unwrap()
    });
    assert!(
        t0.elapsed() < Duration::from_secs(10),
        "took {:?}",
        t0.elapsed()
    );
    assert_eq!(s.requests, 0);
}

// ---------------------------------------------------------------------------------------------
// Failures.

#[test]
fn reconnects_after_the_server_drops_a_connection() {
    let srv = TestServer::start();
    // Request 1 is the warm-up; the server closes the connection instead of answering no. 6.
    srv.ctl.drop_at.store(6, Ordering::SeqCst);
    let mut c = cfg(Mode::Closed);
    c.requests = Some(20);
    let s = run_plain(&c, srv.addr, None);
    assert_sane(&s);
    assert_eq!(
        s.requests, 20,
        "the failed request is not measured, a new one is"
    );
    assert_eq!(s.errors, 1);
    assert_eq!(s.wrong, 0);
    assert_eq!(srv.ctl.accepted.load(Ordering::SeqCst), 2, "one reconnect");
}

#[test]
fn wrong_replies_are_counted_apart_from_errors() {
    let srv = TestServer::start();
    srv.ctl.wrong.store(true, Ordering::SeqCst);
    let mut c = cfg(Mode::Closed);
    c.requests = Some(10);
    let s = run_plain(&c, srv.addr, None);
    assert_eq!((s.requests, s.wrong, s.errors), (10, 10, 0));
}

#[test]
fn gives_up_with_a_clear_error_when_the_server_is_gone() {
    let mut srv = TestServer::start();
    let addr = srv.addr;
    let mut c = cfg(Mode::Closed);
    c.requests = None;
    c.duration = Some(Duration::from_secs(60));
    let stop = AtomicBool::new(false);
    let t0 = Instant::now();
    let r = std::thread::scope(|sc| {
        let h = sc.spawn(|| run(&c, &connector(addr), None, None, &stop, &quiet));
        std::thread::sleep(Duration::from_millis(200));
        srv.shut_down();
        h.join().unwrap()
    });
    let e = format!(
        "{:#}",
        r.expect_err("the run must fail once the server is gone")
    );
    assert!(e.contains("reconnect"), "{e}");
    assert!(t0.elapsed() < Duration::from_secs(10));

    // Nothing listening at all: a clear error at once.
    let e = run(
        &cfg(Mode::Closed),
        &connector(addr),
        None,
        None,
        &stop,
        &quiet,
    )
    .expect_err("no server");
    assert!(format!("{e:#}").contains("connection 0"), "{e:#}");
}

#[test]
fn a_server_that_drops_every_request_is_given_up_on() {
    let srv = TestServer::start();
    let stop = AtomicBool::new(false);
    let mut c = cfg(Mode::Closed);
    c.warmup = 0;
    srv.ctl.drop_all.store(true, Ordering::SeqCst);
    let e = run(&c, &connector(srv.addr), None, None, &stop, &quiet).expect_err("must give up");
    assert!(format!("{e:#}").contains("in a row"), "{e:#}");
}

// ---------------------------------------------------------------------------------------------
// Modes.

#[test]
fn closed_loop_with_two_connections_completes_n_requests() {
    let srv = TestServer::start();
    let mut c = cfg(Mode::Closed);
    c.requests = Some(500);
    c.connections = 2;
    c.warmup = 3;
    let progress_max = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let s = run(&c, &connector(srv.addr), None, None, &stop, &|n| {
        progress_max.fetch_max(n, Ordering::SeqCst);
    })
    .unwrap();
    assert_sane(&s);
    assert_eq!(s.requests, 500);
    assert_eq!(s.connections, 2);
    assert_eq!(s.offered_rps, 0.0);
    assert_eq!(
        srv.ctl.served.load(Ordering::SeqCst),
        506,
        "3 warm-ups per connection"
    );
    assert_eq!(progress_max.load(Ordering::SeqCst), 500);
}

#[test]
fn duration_bounds_a_closed_loop() {
    let srv = TestServer::start();
    let mut c = cfg(Mode::Closed);
    c.requests = None;
    c.duration = Some(Duration::from_millis(300));
    let t0 = Instant::now();
    let s = run_plain(&c, srv.addr, None);
    assert!(t0.elapsed() < Duration::from_secs(10));
    assert!(s.requests > 0);
    assert!(s.duration_s > 0.2 && s.duration_s < 5.0, "{s:?}");
}

#[test]
fn idle_gap_sleeps_before_each_request() {
    let srv = TestServer::start();
    let csv = Records::new();
    let mut c = cfg(Mode::IdleGap);
    c.requests = Some(20);
    c.gap = Duration::from_millis(3);
    let s = run_plain(&c, srv.addr, csv.sink());
    assert_sane(&s);
    assert_eq!(s.requests, 20);
    let (h, rows) = csv.read();
    assert_eq!(rows.len(), 20);
    for r in &rows {
        assert_eq!(r[col(&h, "mode")], "idle-gap");
        let gap: f64 = r[col(&h, "gap_us")].parse().unwrap();
        assert!(gap >= 3000.0, "gap {gap} µs");
    }
}

#[test]
fn config_errors_are_clear() {
    let stop = AtomicBool::new(false);
    let addr: SocketAddr = "127.0.0.1:1".parse().unwrap();
    let mut c = cfg(Mode::Open);
    c.rate = 0.0;
    let e = run(&c, &connector(addr), None, None, &stop, &quiet).unwrap_err();
    assert!(format!("{e}").contains("rate"), "{e}");
    let mut c = cfg(Mode::Closed);
    c.requests = None;
    let e = run(&c, &connector(addr), None, None, &stop, &quiet).unwrap_err();
    assert!(format!("{e}").contains("duration"), "{e}");
}
fn announced(mode: Mode, srv: &TestServer) -> (LoadSummary, String, Vec<Vec<String>>) {
    let csv = Records::new();
    let mut c = cfg(mode);
    c.requests = Some(40);
    c.rate = 500.0;
    let calls = Arc::new(Mutex::new(Vec::new()));
    let mk = fake_announcer(2_000_000, calls.clone());
    let stop = AtomicBool::new(false);
    let s = run(
        &c,
        &connector(srv.addr),
        Some(&mk),
        csv.sink(),
        &stop,
        &quiet,
    )
    .unwrap();
    assert_eq!(
        calls.lock().unwrap().len(),
        40,
        "one grant per measured request"
    );
    let (h, rows) = csv.read();
    (s, h, rows)
}

#[test]
fn announced_requests_idle_gap_measures_from_the_granted_time() {
    let srv = TestServer::start();
    let (s, h, rows) = announced(Mode::IdleGap, &srv);
    assert_eq!((s.requests, s.scheduled, s.unscheduled), (40, 20, 20));
    for r in &rows {
        let t = |n: &str| r[col(&h, n)].parse::<u64>().unwrap();
        assert_eq!(
            t("intended_ns"),
            t("granted_ns"),
            "announced: meant to arrive then"
        );
        assert!(t("sent_ns") >= t("granted_ns"));
    }
    // Measured from the granted time: the 2 ms wait for it is not latency.
    for r in &rows {
        let t = |n: &str| r[col(&h, n)].parse::<f64>().unwrap();
        let want = (t("done_ns") - t("granted_ns")) / 1e3;
        assert!((t("latency_us") - want).abs() < 0.01, "{r:?}");
    }
}

#[test]
fn announced_requests_open_loop_measures_from_the_poisson_time() {
    let srv = TestServer::start();
    let (s, h, rows) = announced(Mode::Open, &srv);
    assert_eq!((s.scheduled, s.unscheduled), (20, 20));
    for r in &rows {
        let t = |n: &str| r[col(&h, n)].parse::<u64>().unwrap();
        let scheduled = r[col(&h, "scheduled")] == "true";
        assert!(t("sent_ns") >= t("granted_ns"));
        if scheduled {
            // The grant came `lead` early, and the granted time is ≥ 2 ms after the
            // intended time: that wait counts.
            assert!(t("granted_ns") >= t("intended_ns") + 2_000_000);
            let lat: f64 = r[col(&h, "latency_us")].parse().unwrap();
            assert!(lat >= 2000.0, "{lat}");
        }
    }
}
