//! The agent attached to the bundled `preheat-kv` server: request boundaries, control requests,
//! announcements, profiles and the probe, with real processes and sockets.

// Test programs signal and inspect the processes they start (kill, geteuid): libc calls.
#![allow(unsafe_code)]

mod support;

use std::time::Duration;

use preheat_model::proto::{Range, Reply, Request, Strategies, ANNOUNCE_LEN};
use preheat_model::{
    encode_profile, Backend, BinaryIdent, FileIdent, FilterParams, LineSet, Profile, RegionTable,
    RequestClass, VirtAddr, WorkingSet,
};
use support::*;

const WAIT: Duration = Duration::from_secs(10);

#[path = "kv/profiles.rs"]
mod profiles;

#[test]
fn load_is_served_correctly_and_attributed_to_the_port() {
    let srv = start_kv(&[]);
    let done = mixed_load(srv.port, 8, 500, Some((100, kv_value)));
    assert_eq!(done, 8 * 500);
    let mut agent = srv.agent();
    let (ok, st) = agent.wait_status(WAIT, |s| s.busy_periods(srv.port) > 0);
    assert!(ok, "no busy periods for port {}: {st:?}", srv.port);
    let p = st.port(srv.port).unwrap();
    assert!(p.busy_ns > 0, "{p:?}");
    assert!(
        (p.last_cpu as usize) < preheat_engine::os::online_cpus(),
        "{p:?}"
    );
    assert_ne!(p.last_tid, 0, "{p:?}");
    assert!(st.threads_seen >= 1, "{st:?}");
    assert_eq!(st.pid, srv.pid());
    assert!(st.exe.ends_with("preheat-kv"), "{}", st.exe);
    assert!(st.enabled);
    // Every busy period of a single-threaded server with 8 busy clients: at least one per
    // handful of requests (requests of several clients may share one epoll_wait return).
    assert!(
        p.busy_periods >= 100,
        "only {} busy periods for 4000 requests",
        p.busy_periods
    );
}

/// preheat-kv with the agent, after one request (so the port has a busy period and a CPU to
/// preheat on): the server, that connection and the agent's control connection.
fn kv_served_once() -> (Server, Mc, AgentClient) {
    let srv = start_kv(&[]);
    let mut mc = Mc::connect(srv.port);
    assert_eq!(mc.get("key:3").unwrap(), Some(kv_value(3)));
    let mut agent = srv.agent();
    assert!(agent.wait_status(WAIT, |s| s.busy_periods(srv.port) > 0).0);
    (srv, mc, agent)
}

#[test]
fn announcements_are_counted_and_acted_on() {
    let (srv, mut mc, mut agent) = kv_served_once();
    let pid = srv.pid();
    let wake_lines = Strategies::WAKE.union(Strategies::LINES);
    // Valid: wake+lines (no profile loaded: lines counts no_profile), then the forced spin.
    srv.announce(pid, wake_lines, LEAD_NS, 1);
    assert!(
        agent
            .wait_status(WAIT, |s| s.preheat.wake_spins + s.preheat.wake_polled == 1
                && s.preheat.no_profile == 1)
            .0
    );
    srv.announce(pid, Strategies::SPIN, LEAD_NS, 2);
    // Malformed: too short, bad magic, unknown version, unknown strategy bits.
    let mut good = preheat_model::proto::Announcement {
        strategies: Strategies::WAKE,
        port: srv.port,
        seq: 3,
        arrival_ns: preheat_engine::time::now_ns() + 1_000_000_000,
        sent_ns: 0,
        budget_ns: 0,
    }
    .encode();
    srv.announce_raw(pid, &good[..ANNOUNCE_LEN - 1]);
    let mut bad = good;
    bad[0] = b'X';
    srv.announce_raw(pid, &bad);
    let mut bad = good;
    bad[4] = 99;
    srv.announce_raw(pid, &bad);
    let mut bad = good;
    bad[5] = 0x80;
    srv.announce_raw(pid, &bad);
    srv.announce_raw(pid, &[0u8; 100]);
    // Late: arrival already past.
    good[16..24].copy_from_slice(&(preheat_engine::time::now_ns() - 1_000_000).to_le_bytes());
    srv.announce_raw(pid, &good);
    let (ok, st) = agent.wait_status(WAIT, |s| {
        s.preheat.announcements == 8
            && s.preheat.malformed == 5
            && s.preheat.late == 1
            && s.preheat.wake_spins + s.preheat.wake_polled == 2
    });
    assert!(ok, "{:?}", st.preheat);
    // `spin` always spins; `wake` polls in idle where the agent may open the PM QoS device
    // (the tests run as root in CI), else it spins too.
    let may_poll = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/cpu_dma_latency")
        .is_ok();
    assert_eq!(
        (st.preheat.wake_spins, st.preheat.wake_polled),
        if may_poll { (1, 1) } else { (2, 0) },
        "{:?}",
        st.preheat
    );
    assert_eq!(st.preheat.no_profile, 1, "{:?}", st.preheat);
    assert_eq!(st.preheat.preheats, 0, "{:?}", st.preheat);
    assert!(
        st.preheat.last_lead_ns > 0,
        "worker started after the arrival: {:?}",
        st.preheat
    );
    // The server kept serving.
    assert_eq!(mc.get("key:4").unwrap(), Some(kv_value(4)));
}

/// `auto` announcements do the port's measured choice (`SetAuto`), or wake+lines (counted as
/// `auto_unmeasured`) where none was set; a choice that is itself `auto` is refused.
#[test]
fn auto_announcements_follow_the_measured_choice() {
    let (srv, mut mc, mut agent) = kv_served_once();
    let pid = srv.pid();
    let woke = |s: &preheat_model::proto::PreheatStats| s.wake_spins + s.wake_polled;
    // No choice: wake+lines (no profile loaded, so lines counts no_profile).
    srv.announce(pid, Strategies::AUTO, LEAD_NS, 1);
    let (ok, st) = agent.wait_status(WAIT, |s| {
        s.preheat.auto_unmeasured == 1 && woke(&s.preheat) == 1 && s.preheat.no_profile == 1
    });
    assert!(ok, "{:?}", st.preheat);
    // A measured choice of `lines` alone: no wake this time.
    let r = agent.call(&Request::SetAuto {
        port: srv.port,
        strategies: Some(Strategies::LINES),
    });
    assert_eq!(r, Reply::Ok);
    srv.announce(pid, Strategies::AUTO, LEAD_NS, 2);
    let (ok, st) = agent.wait_status(WAIT, |s| s.preheat.no_profile == 2);
    assert!(ok, "{:?}", st.preheat);
    assert_eq!(woke(&st.preheat), 1, "{:?}", st.preheat);
    assert_eq!(st.preheat.auto_unmeasured, 1, "{:?}", st.preheat);
    // A measured "nothing helps": the announcement does nothing at all.
    let r = agent.call(&Request::SetAuto {
        port: srv.port,
        strategies: Some(Strategies::NONE),
    });
    assert_eq!(r, Reply::Ok);
    srv.announce(pid, Strategies::AUTO, LEAD_NS, 3);
    let (ok, st) = agent.wait_status(WAIT, |s| s.preheat.announcements == 3);
    assert!(ok, "{:?}", st.preheat);
    std::thread::sleep(Duration::from_millis(50));
    let st = agent.status();
    assert_eq!(
        (woke(&st.preheat), st.preheat.no_profile),
        (1, 2),
        "{:?}",
        st.preheat
    );
    // A choice that is itself auto is refused.
    let r = agent.call(&Request::SetAuto {
        port: srv.port,
        strategies: Some(Strategies::AUTO),
    });
    assert!(matches!(r, Reply::Error { .. }), "{r:?}");
    assert_eq!(mc.get("key:4").unwrap(), Some(kv_value(4)));
}

#[test]
fn extreme_announcements_do_not_disable_the_agent() {
    let srv = start_kv(&[]);
    let mut agent = srv.agent();
    let now = preheat_engine::time::now_ns();
    for (i, (arrival, sent, budget)) in [
        (u64::MAX, u64::MAX, u64::MAX),
        (1 << 63, 0, 1),
        (now + LEAD_NS, u64::MAX, u64::MAX),
        (now + LEAD_NS, 0, u64::MAX),
    ]
    .into_iter()
    .enumerate()
    {
        for port in [0, srv.port, u16::MAX] {
            let a = preheat_model::proto::Announcement {
                strategies: Strategies::ALL,
                port,
                seq: i as u64,
                arrival_ns: arrival,
                sent_ns: sent,
                budget_ns: budget,
            };
            srv.announce_raw(srv.pid(), &a.encode());
            // One at a time, so none is superseded.
            let want = (i * 3) as u64
                + [0, srv.port, u16::MAX]
                    .iter()
                    .position(|&p| p == port)
                    .unwrap() as u64
                + 1;
            let (ok, st) = agent.wait_status(WAIT, |s| {
                s.preheat.wake_spins + s.preheat.wake_polled == want
            });
            assert!(ok, "{:?}", st.preheat);
        }
    }
    let st = agent.status();
    assert!(st.enabled, "{st:?}");
    assert_eq!(st.disabled_reason, None);
    let mut mc = Mc::connect(srv.port);
    assert_eq!(mc.get("key:1").unwrap(), Some(kv_value(1)));
}

#[test]
fn set_enabled_toggles_tracking() {
    let srv = start_kv(&[]);
    let mut mc = Mc::connect(srv.port);
    let mut agent = srv.agent();
    assert_eq!(mc.get("key:1").unwrap(), Some(kv_value(1)));
    assert!(agent.wait_status(WAIT, |s| s.busy_periods(srv.port) > 0).0);
    agent.ok(&Request::SetEnabled { enabled: false });
    let before = agent.status();
    assert!(!before.enabled);
    assert_eq!(before.disabled_reason, None);
    for i in 0..50 {
        assert_eq!(mc.get(&format!("key:{i}")).unwrap(), Some(kv_value(i)));
    }
    std::thread::sleep(Duration::from_millis(50));
    let during = agent.status();
    // At most the busy period in flight when tracking stopped.
    assert!(
        during.busy_periods(srv.port) <= before.busy_periods(srv.port) + 1,
        "{} -> {}",
        before.busy_periods(srv.port),
        during.busy_periods(srv.port)
    );
    agent.ok(&Request::SetEnabled { enabled: true });
    assert!(agent.status().enabled);
    for i in 0..50 {
        assert_eq!(mc.get(&format!("key:{i}")).unwrap(), Some(kv_value(i)));
    }
    let (ok, after) = agent.wait_status(WAIT, |s| {
        s.busy_periods(srv.port) >= during.busy_periods(srv.port) + 40
    });
    assert!(
        ok,
        "{} -> {}",
        during.busy_periods(srv.port),
        after.busy_periods(srv.port)
    );
}

#[test]
fn replay_sends_warmup_requests() {
    let srv = start_kv(&[]);
    let mut mc = Mc::connect(srv.port);
    assert_eq!(mc.get("key:1").unwrap(), Some(kv_value(1)));
    let mut agent = srv.agent();
    assert!(agent.wait_status(WAIT, |s| s.busy_periods(srv.port) > 0).0);
    // Replay without a configured request: counted as an error, nothing sent.
    srv.announce(srv.pid(), Strategies::REPLAY, LEAD_NS, 1);
    assert!(agent.wait_status(WAIT, |s| s.preheat.replay_errors == 1).0);
    agent.ok(&Request::Configure {
        port: srv.port,
        replay: Some("get __preheat_warmup__\r\n".into()),
        replay_until: Some("END\r\n".into()),
        split_cpus: vec![],
        replay_via: None,
    });
    let base = agent.status().busy_periods(srv.port);
    for i in 0..3 {
        srv.announce(srv.pid(), Strategies::REPLAY, LEAD_NS, 10 + i);
        let want = i + 1;
        let (ok, st) = agent.wait_status(WAIT, |s| s.preheat.replays == want);
        assert!(ok, "{:?}", st.preheat);
        // The server answered the warm-up: it shows up as a busy period of the port. Waited
        // for before the next announcement: a warm-up sent while the server still serves the
        // previous one joins that busy period (seen in a suite run: 3 warm-ups, 2 periods).
        let (ok, st) = agent.wait_status(WAIT, |s| s.busy_periods(srv.port) >= base + want);
        assert!(ok, "{base} -> {}", st.busy_periods(srv.port));
    }
    let st = agent.status();
    assert_eq!(st.preheat.replay_errors, 1, "{:?}", st.preheat);
    // All strategies together.
    srv.announce(srv.pid(), Strategies::ALL, LEAD_NS, 20);
    let (ok, st) = agent.wait_status(WAIT, |s| {
        s.preheat.replays == 4
            && s.preheat.wake_spins + s.preheat.wake_polled == 1
            && s.preheat.no_profile == 1
    });
    assert!(ok, "{:?}", st.preheat);
    // A warm-up the server answers by closing the connection cannot warm anything on a
    // persistent connection: Configure answers the warm-up once and refuses it, saying why
    // (before, every other replay found the connection broken and was lost).
    let msg = agent.error(&Request::Configure {
        port: srv.port,
        replay: Some("quit\r\n".into()),
        replay_until: None,
        split_cpus: vec![],
        replay_via: None,
    });
    assert!(msg.contains("closed the connection"), "{msg}");
    srv.announce(srv.pid(), Strategies::REPLAY, LEAD_NS, 30);
    let (ok, st) = agent.wait_status(WAIT, |s| s.preheat.replay_errors == 2);
    assert!(ok, "{:?}", st.preheat);
    // A warm-up whose reply never ends as configured is refused too (it was never answered).
    let msg = agent.error(&Request::Configure {
        port: srv.port,
        replay: Some("get __preheat_warmup__\r\n".into()),
        replay_until: Some("NEVER".into()),
        split_cpus: vec![],
        replay_via: None,
    });
    assert!(msg.contains("was not answered"), "{msg}");
    // Configure of a port nobody listens on fails cleanly.
    let msg = agent.error(&Request::Configure {
        port: free_port(),
        replay: Some("x\r\n".into()),
        replay_until: None,
        split_cpus: vec![],
        replay_via: None,
    });
    assert!(msg.contains("replay connection"), "{msg}");
    assert_eq!(mc.get("key:2").unwrap(), Some(kv_value(2)));
}

/// `ConfigureSession`: a connection the caller opened (where a protocol needs a login first)
/// becomes the port's replay connection; without a descriptor, or with a warm-up it does not
/// see answered, it is refused, saying why.
#[test]
fn a_session_handed_over_is_the_replay_connection() {
    use std::os::fd::AsRawFd;
    let srv = start_kv(&[]);
    let mut mc = Mc::connect(srv.port);
    assert_eq!(mc.get("key:1").unwrap(), Some(kv_value(1)));
    let mut agent = srv.agent();
    assert!(agent.wait_status(WAIT, |s| s.busy_periods(srv.port) > 0).0);
    let session = |until: &[u8]| Request::ConfigureSession {
        port: srv.port,
        request: b"get __preheat_warmup__\r\n".to_vec(),
        until: until.to_vec(),
    };
    let msg = agent.error(&session(b"END\r\n"));
    assert!(msg.contains("SCM_RIGHTS"), "{msg}");
    let conn = std::net::TcpStream::connect(("127.0.0.1", srv.port)).unwrap();
    match agent.call_with_fd(&session(b"NEVER"), conn.as_raw_fd()) {
        Reply::Error { message } => assert!(message.contains("not answered"), "{message}"),
        other => panic!("a warm-up never answered as configured was accepted: {other:?}"),
    }
    let conn = std::net::TcpStream::connect(("127.0.0.1", srv.port)).unwrap();
    match agent.call_with_fd(&session(b"END\r\n"), conn.as_raw_fd()) {
        Reply::Ok => {}
        other => panic!("{other:?}"),
    }
    drop(conn); // the agent holds its own duplicate
    let base = agent.status().busy_periods(srv.port);
    for i in 0..2 {
        srv.announce(srv.pid(), Strategies::REPLAY, LEAD_NS, 40 + i);
        let (ok, st) = agent.wait_status(WAIT, |s| s.preheat.replays == i + 1);
        assert!(ok, "{:?}", st.preheat);
        let (ok, st) = agent.wait_status(WAIT, |s| s.busy_periods(srv.port) > base + i);
        assert!(ok, "{base} -> {}", st.busy_periods(srv.port));
    }
    assert_eq!(agent.status().preheat.replay_errors, 0);
    assert_eq!(mc.get("key:2").unwrap(), Some(kv_value(2)));
}

#[test]
fn bad_control_input_is_answered_with_errors() {
    let srv = start_kv(&[]);
    let mut agent = srv.agent();
    for bad in [
        "not json",
        r#"{"cmd":"warp_drive"}"#,
        r#"{"cmd":"probe_flush"}"#,
        "[1,2,3]",
    ] {
        match agent.call_raw(bad) {
            Reply::Error { message } => assert!(message.contains("bad request"), "{message}"),
            other => panic!("{bad}: {other:?}"),
        }
    }
    // Several clients at once.
    let mut second = srv.agent();
    assert_eq!(second.status().pid, srv.pid());
    assert_eq!(agent.status().pid, srv.pid());
    drop(second);
    let mut mc = Mc::connect(srv.port);
    assert_eq!(mc.get("key:1").unwrap(), Some(kv_value(1)));
}

#[test]
fn only_and_disable_keep_the_agent_out() {
    for env in [
        &[("PREHEAT_AGENT_ONLY", "memcached,nginx")][..],
        &[("PREHEAT_AGENT_DISABLE", "1")][..],
    ] {
        let srv = start_kv(env);
        let mut mc = Mc::connect(srv.port);
        assert_eq!(mc.get("key:1").unwrap(), Some(kv_value(1)));
        std::thread::sleep(Duration::from_millis(100));
        assert!(
            preheat_agent::live_agents(&srv.run_dir).is_empty(),
            "{env:?}: an agent started"
        );
    }
    let srv = start_kv(&[("PREHEAT_AGENT_ONLY", "memcached,preheat-kv")]);
    assert_eq!(srv.agent().status().pid, srv.pid());
    assert_eq!(preheat_agent::live_agents(&srv.run_dir), vec![srv.pid()]);
}

#[test]
fn world_writable_run_dir_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    std::fs::create_dir(&run).unwrap();
    std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o777)).unwrap();
    let srv = start_kv_in(dir, &[]);
    let mut mc = Mc::connect(srv.port);
    assert_eq!(mc.get("key:1").unwrap(), Some(kv_value(1)));
    std::thread::sleep(Duration::from_millis(100));
    let entries: Vec<_> = std::fs::read_dir(&run).unwrap().flatten().collect();
    assert!(
        entries.is_empty(),
        "the agent wrote into a world-writable run dir"
    );
    let log = std::fs::read_to_string(&srv.log).unwrap();
    assert!(log.contains("refusing"), "server log: {log}");
}

#[test]
fn socket_files_are_removed_on_exit() {
    let mut srv = start_kv(&[]);
    let paths = preheat_agent::socket_paths(&srv.run_dir, srv.pid());
    assert!(wait_until(WAIT, || paths.control.exists() && paths.trigger.exists()));
    let mut agent = srv.agent();
    assert_eq!(agent.status().pid, srv.pid());
    drop(agent);
    srv.stop();
    assert!(!paths.control.exists() && !paths.trigger.exists());
    assert!(paths.log.exists(), "the log stays");
}

/// Tests whose outcome depends on the machine's timing (caches, wake-ups, deadlines):
/// `scripts/test.sh` runs every `timing::` test after all others, one at a time, so no other
/// test loads the two CPUs meanwhile.
mod timing {
    use super::*;

    /// The server's main thread's run time so far, ns (`schedstat`).
    fn main_thread_run_ns(pid: u32) -> u64 {
        let s = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/schedstat")).unwrap();
        s.split_whitespace().next().unwrap().parse().unwrap()
    }

    /// `Request::Hold` keeps the server thread polling its wait after it served a request, until
    /// the expected arrival (+200 µs, at most 2 ms in all): the hot floor's hold. Measured by the
    /// thread's run time over the window, with a hold for 1.5 ms against none.
    #[test]
    fn hold_keeps_the_server_thread_polling_until_the_arrival() {
        let srv = start_kv(&[]);
        let mut mc = Mc::connect(srv.port);
        let mut agent = srv.agent();
        let pid = srv.pid();
        let ran = |mc: &mut Mc, agent: &mut AgentClient, hold: bool| {
            if hold {
                let arrival_ns = preheat_engine::time::now_ns() + 1_500_000;
                agent.ok(&Request::Hold { arrival_ns });
            }
            let before = main_thread_run_ns(pid);
            assert_eq!(mc.get("key:1").unwrap(), Some(kv_value(1)));
            std::thread::sleep(Duration::from_millis(5));
            main_thread_run_ns(pid) - before
        };
        // Three attempts (this test runs alone, but the host may stall it).
        let mut seen = Vec::new();
        for _ in 0..3 {
            let held = ran(&mut mc, &mut agent, true);
            let free = ran(&mut mc, &mut agent, false);
            seen.push((held, free));
            eprintln!("server thread's run time (measured): held {held} ns, not held {free} ns");
            if held >= 800_000 && free < 300_000 {
                // Closing: the next wait blocks again.
                agent.ok(&Request::Hold { arrival_ns: 0 });
                return;
            }
        }
        panic!("run time of the server thread (held, not held), ns: {seen:?}");
    }

    #[test]
    fn probe_requests_are_safe_and_find_hits() {
        let srv = start_kv(&[]);
        let mut mc = Mc::connect(srv.port);
        assert_eq!(mc.get("key:1").unwrap(), Some(kv_value(1)));
        let mut agent = srv.agent();
        let threshold = match agent.call(&Request::Calibrate) {
            Reply::Calibration {
                hit_ticks_p50,
                miss_ticks_p50,
                threshold,
                samples,
            } => {
                assert!(samples > 0);
                assert!(hit_ticks_p50 < threshold, "{hit_ticks_p50} {threshold}");
                assert!(threshold <= miss_ticks_p50.max(hit_ticks_p50 + 2));
                threshold
            }
            other => panic!("calibrate: {other:?}"),
        };
        let (ranges, total) = match agent.call(&Request::Candidates) {
            Reply::Candidates {
                ranges,
                total_bytes,
            } => (ranges, total_bytes),
            other => panic!("candidates: {other:?}"),
        };
        assert!(!ranges.is_empty());
        assert_eq!(total, ranges.iter().map(|r| r.len).sum::<u64>());
        assert!(total <= 256 << 20);
        // The agent's own library is not a candidate.
        let so = std::fs::canonicalize(&artifacts().agent_so).unwrap();
        let maps = std::fs::read_to_string(format!("/proc/{}/maps", srv.pid())).unwrap();
        for line in maps.lines().filter(|l| l.ends_with(so.to_str().unwrap())) {
            let (lo, hi) = line.split(' ').next().unwrap().split_once('-').unwrap();
            let (lo, hi) = (
                u64::from_str_radix(lo, 16).unwrap(),
                u64::from_str_radix(hi, 16).unwrap(),
            );
            assert!(
                !ranges.iter().any(|r| r.start < hi && r.start + r.len > lo),
                "agent mapping {line} is a candidate"
            );
        }
        // Probe the executable's candidate ranges (small: a few hundred KiB) around a request.
        let exe = std::fs::read_link(format!("/proc/{}/exe", srv.pid())).unwrap();
        let mut exe_ranges = Vec::new();
        for line in maps.lines().filter(|l| l.ends_with(exe.to_str().unwrap())) {
            let (lo, hi) = line.split(' ').next().unwrap().split_once('-').unwrap();
            let (lo, hi) = (
                u64::from_str_radix(lo, 16).unwrap(),
                u64::from_str_radix(hi, 16).unwrap(),
            );
            for r in &ranges {
                let (a, b) = (r.start.max(lo), (r.start + r.len).min(hi));
                if a < b {
                    exe_ranges.push(Range {
                        start: a,
                        len: b - a,
                    });
                }
            }
        }
        assert!(!exe_ranges.is_empty());
        // Add ranges that are not mapped at all: they must be skipped, not crash the server.
        let mut with_bogus = exe_ranges.clone();
        with_bogus.push(Range {
            start: 0x1000,
            len: 1 << 20,
        });
        with_bogus.push(Range {
            start: 0xffff_ffff_ff00_0000,
            len: 4096,
        });
        let mut best_hits = 0;
        for round in 0..3u64 {
            agent.ok(&Request::ProbeFlush {
                ranges: with_bogus.clone(),
            });
            assert_eq!(mc.get("key:7").unwrap(), Some(kv_value(7)));
            match agent.call(&Request::ProbeReload {
                ranges: with_bogus.clone(),
                threshold,
                window_pages: 16,
                seed: round + 1,
            }) {
                Reply::Probed {
                    hits,
                    probed,
                    elapsed_ns,
                    ..
                } => {
                    let exe_lines: u64 = exe_ranges.iter().map(|r| r.len.div_ceil(64)).sum();
                    assert!(probed > 0 && probed <= exe_lines, "{probed} {exe_lines}");
                    assert!(elapsed_ns > 0);
                    for h in &hits {
                        assert!(
                            exe_ranges
                                .iter()
                                .any(|r| *h >= r.start && *h < r.start + r.len),
                            "hit {h:#x} outside the probed ranges"
                        );
                    }
                    best_hits = best_hits.max(hits.len());
                }
                other => panic!("reload: {other:?}"),
            }
        }
        assert!(
            best_hits > 0,
            "no line of the server binary was hit by a request"
        );
        // The agent-side cycle (flush, its own request, reload) on the same ranges, both phases of
        // a stride-2 probe and a no-request noise pass; the client connection keeps working.
        let port = srv.port;
        let exe_lines: u64 = exe_ranges.iter().map(|r| r.len.div_ceil(64)).sum();
        let mut cycle_hits = 0;
        for (request, phase) in [(true, 0u32), (true, 1), (false, 0)] {
            match agent.call(&Request::ProbeCycle(preheat_model::proto::ProbeCycle {
                ranges: with_bogus.clone(),
                threshold,
                window_pages: 16,
                seed: 7 + phase as u64,
                port,
                request: request.then(|| "get key:7\r\n".to_string()),
                until: "END\r\n".into(),
                idle_ns: 100_000,
                stride: 2,
                phase,
            })) {
                Reply::Probed {
                    hits,
                    probed,
                    window_ns,
                    ..
                } => {
                    // Half the lines (one phase of stride 2), never the bogus ranges.
                    assert!(
                        probed > 0 && probed <= exe_lines.div_ceil(2) + 64,
                        "{probed} {exe_lines}"
                    );
                    assert!(window_ns > 0);
                    for h in &hits {
                        assert_eq!(
                            (h / 64) % 2,
                            phase as u64,
                            "hit {h:#x} outside phase {phase}"
                        );
                        assert!(exe_ranges
                            .iter()
                            .any(|r| *h >= r.start && *h < r.start + r.len));
                    }
                    if request {
                        cycle_hits += hits.len();
                    }
                }
                other => panic!("probe_cycle: {other:?}"),
            }
            assert_eq!(mc.get("key:7").unwrap(), Some(kv_value(7)));
        }
        assert!(
            cycle_hits > 0,
            "the probe cycle's own request hit no line of the binary"
        );
        // Probing all candidates in 1 MiB chunks also works (and leaves the server alive).
        let mut chunk = Vec::new();
        let mut bytes = 0;
        for r in &ranges {
            chunk.push(*r);
            bytes += r.len;
            if bytes >= 1 << 20 {
                break;
            }
        }
        agent.ok(&Request::ProbeFlush {
            ranges: chunk.clone(),
        });
        assert!(matches!(
            agent.call(&Request::ProbeReload {
                ranges: chunk,
                threshold,
                window_pages: 16,
                seed: 9,
            }),
            Reply::Probed { .. }
        ));
        assert_eq!(mc.get("key:8").unwrap(), Some(kv_value(8)));
        let mut srv = srv;
        assert!(srv.alive());
    }
}
