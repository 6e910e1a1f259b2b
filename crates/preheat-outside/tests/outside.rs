//! The outside agent on a real server process (a Python selectors event loop, answered "pong\n"
//! per "ping\n"), driven through the agent's own client and announcer as the demo drives it:
//! busy periods seen from outside, the warm-up configured and sent on announcements, `wake`
//! spun, late announcements dropped, what needs the agent inside refused, the probe and a
//! profile on the server's read-only file-backed memory, the sockets removed when it stops,
//! and a second stand-in for the same pid refused. Root only (the observer).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use preheat_launch::agentctl::{AgentClient, Announcer};
use preheat_model::proto::{Announcement, PortStats, PreheatStats, Reply, Request, Strategies};
use preheat_outside::{Config, OutsideAgent};
use preheat_testsupport::KillOnDrop;

fn permitted() -> bool {
    if preheat_engine::host::effective_uid() != Some(0) {
        preheat_testsupport::skip(
            "root",
            "preheating from outside needs root (eBPF programs on kernel tracepoints)",
        );
        return false;
    }
    true
}

/// The observer's Python event-loop test server on a free port, listening.
fn server() -> Option<(KillOnDrop, u16)> {
    let Some(python) = preheat_testsupport::find_program("python3") else {
        preheat_testsupport::skip("python3", "python3 is not installed");
        return None;
    };
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../preheat-observe/tests/servers/event_loop.py");
    let port = preheat_testsupport::free_port();
    let mut child = KillOnDrop(
        Command::new(python)
            .arg(script)
            .arg(port.to_string())
            .spawn()
            .expect("starting the event-loop server"),
    );
    preheat_testsupport::wait_port(port, &mut child.0).expect("the server listens");
    Some((child, port))
}

/// A run directory of the test's own and the stand-in's configuration for `pid` on `port`, its
/// worker on the last CPU.
fn setup(pid: u32, port: u16) -> (tempfile::TempDir, Config) {
    let tmp = tempfile::Builder::new()
        .prefix("preheat-outside-")
        .tempdir()
        .unwrap();
    let config = Config {
        run_dir: tmp.path().to_path_buf(),
        pid,
        port,
        cpu: preheat_engine::os::online_cpus() - 1,
        why: "a test".into(),
    };
    (tmp, config)
}

fn ping(c: &mut TcpStream) {
    c.write_all(b"ping\n").unwrap();
    let mut b = [0u8; 5];
    c.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"pong\n");
}

fn status(c: &mut AgentClient, port: u16) -> (PortStats, PreheatStats, u32) {
    match c.call(&Request::Status).unwrap() {
        Reply::Status {
            ports,
            preheat,
            threads_seen,
            ..
        } => (
            ports.into_iter().find(|p| p.port == port).unwrap(),
            preheat,
            threads_seen,
        ),
        r => panic!("not a status: {r:?}"),
    }
}

/// A lead a loaded machine meets: a normal task on the worker's CPU can keep it waiting a few
/// milliseconds (the scheduler's slice), and these tests are about what the worker does, not
/// how soon (2 ms leads were late under a busy CPU).
const LEAD_NS: i64 = 20_000_000;

fn announce(a: &mut Announcer, port: u16, st: Strategies, lead_ns: i64) {
    let now = preheat_engine::time::now_ns();
    a.send(Announcement {
        strategies: st,
        port,
        seq: 0,
        arrival_ns: (now as i64 + lead_ns) as u64,
        sent_ns: now,
        budget_ns: 0,
    });
}

/// Poll the status until `done` holds (the worker acts asynchronously), at most 5 s.
fn wait_status(
    c: &mut AgentClient,
    port: u16,
    done: impl Fn(&PortStats, &PreheatStats) -> bool,
) -> (PortStats, PreheatStats) {
    let t0 = Instant::now();
    loop {
        let (p, h, _) = status(c, port);
        if done(&p, &h) || t0.elapsed() > Duration::from_secs(5) {
            return (p, h);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn serves_the_agents_interfaces_from_outside() {
    if !permitted() {
        return;
    }
    let Some((srv, port)) = server() else {
        return;
    };
    let pid = srv.0.id();
    let (tmp, config) = setup(pid, port);
    let agent = OutsideAgent::start(config.clone()).unwrap();
    assert_eq!(agent.pid(), pid);
    // A second stand-in for the same pid is refused while this one answers.
    let again = OutsideAgent::start(config);
    assert!(
        again.is_err(),
        "a second outside agent for pid {pid} started"
    );
    let mut ctl = AgentClient::connect(tmp.path(), pid).unwrap();

    // Busy periods, from outside.
    let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
    for _ in 0..10 {
        ping(&mut c);
    }
    let (p, _) = wait_status(&mut ctl, port, |p, _| p.busy_periods >= 10);
    assert!(p.busy_periods >= 10, "{p:?}");
    assert!(p.last_start_ns > 0 && p.last_tid != 0, "{p:?}");

    // What the agent does inside is refused, saying why; a warm-up for another port too.
    let e = ctl
        .call(&Request::ProbeFlush { ranges: vec![] })
        .unwrap_err();
    assert!(
        format!("{e:#}").contains("needs the in-process agent"),
        "{e:#}"
    );
    let e = ctl
        .call(&Request::LoadProfile {
            path: "/nonexistent.phws".into(),
        })
        .unwrap_err();
    assert!(format!("{e:#}").contains("cannot read profile"), "{e:#}");
    let configure = |port, replay: Option<&str>| Request::Configure {
        port,
        replay: replay.map(String::from),
        replay_until: replay.map(|_| "pong\n".to_string()),
        split_cpus: vec![],
        replay_via: None,
    };
    assert!(ctl.call(&configure(port ^ 1, Some("ping\n"))).is_err());
    ctl.call(&configure(port, Some("ping\n"))).unwrap();

    // Announcements: replay + spin, acted on; the warm-ups are busy periods of the server.
    let mut ann = Announcer::new(tmp.path(), &[pid]).unwrap();
    let (before, _, _) = status(&mut ctl, port);
    for _ in 0..5 {
        announce(
            &mut ann,
            port,
            Strategies::REPLAY.union(Strategies::SPIN),
            LEAD_NS,
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let (p, h) = wait_status(&mut ctl, port, |_, h| h.replays >= 5 && h.wake_spins >= 5);
    assert_eq!(
        (h.replays, h.replay_errors, h.wake_spins),
        (5, 0, 5),
        "{h:?}"
    );
    assert_eq!(h.replays_fresh, 0, "one warm-up connection, kept: {h:?}");
    assert!(h.last_lead_ns > 0, "{h:?}");
    assert!(
        p.busy_periods >= before.busy_periods + 5,
        "{p:?} after {before:?}"
    );

    // `wake`: idle polling through the arrival where a CPU latency request can be had (root),
    // else a spin.
    announce(&mut ann, port, Strategies::WAKE, LEAD_NS);
    let (_, h) = wait_status(&mut ctl, port, |_, h| h.wake_polled + h.wake_spins >= 6);
    let polls = preheat_engine::latency::LatencyRequest::open().is_ok();
    let want = if polls { (1, 5) } else { (0, 6) };
    assert_eq!((h.wake_polled, h.wake_spins), want, "{h:?}");

    // `lines` has no profile here; a late announcement is dropped.
    announce(&mut ann, port, Strategies::LINES, LEAD_NS);
    announce(&mut ann, port, Strategies::WAKE, -1_000_000);
    let (_, h) = wait_status(&mut ctl, port, |_, h| h.late >= 1 && h.no_profile >= 1);
    assert_eq!((h.late, h.no_profile, h.announcements), (1, 1, 8), "{h:?}");

    // Stopped: sockets gone, the server untouched.
    drop(ctl);
    drop(agent);
    let paths = preheat_rundir::socket_paths(tmp.path(), pid);
    assert!(!paths.control.exists() && !paths.trigger.exists());
    ping(&mut c);
}

/// The probe's requests and a profile from outside, on the event-loop server (python3: its
/// executable and libraries are the file-backed memory): the candidates are resident pages of
/// the server's read-only file mappings; probe cycles with and without the request return hits
/// inside their ranges; a profile of the hits loads as runs, and `lines` walks them.
#[test]
fn probes_and_preheats_the_servers_file_backed_memory() {
    if !permitted() {
        return;
    }
    let Some((srv, port)) = server() else {
        return;
    };
    let pid = srv.0.id();
    let (tmp, config) = setup(pid, port);
    let agent = OutsideAgent::start(config).unwrap();
    let mut ctl = AgentClient::connect(tmp.path(), pid).unwrap();
    let threshold = match ctl.call(&Request::Calibrate).unwrap() {
        Reply::Calibration { threshold, .. } => threshold,
        r => panic!("{r:?}"),
    };
    assert!(threshold > 0);
    let ranges = match ctl.call(&Request::Candidates).unwrap() {
        Reply::Candidates {
            ranges,
            total_bytes,
        } => {
            assert_eq!(total_bytes, ranges.iter().map(|r| r.len).sum::<u64>());
            ranges
        }
        r => panic!("{r:?}"),
    };
    let maps = preheat_engine::maps::read_maps(Some(pid)).unwrap();
    for r in &ranges {
        assert!(
            maps.iter().any(|m| m.file.is_some()
                && !m.write
                && r.start >= m.start
                && r.start + r.len <= m.end),
            "{r:?} is not in a read-only file mapping of the server"
        );
    }
    // The first MiB of candidates, probed with and without the request.
    let mut chunk = Vec::new();
    let mut bytes = 0;
    for r in &ranges {
        if bytes >= 1 << 20 {
            break;
        }
        chunk.push(*r);
        bytes += r.len;
    }
    ctl.call(&Request::ProbeConnect {
        port,
        request: "ping\n".into(),
        until: "pong\n".into(),
    })
    .unwrap();
    let cycle = |request: Option<&str>| {
        Request::ProbeCycle(preheat_model::proto::ProbeCycle {
            ranges: chunk.clone(),
            threshold,
            window_pages: 16,
            seed: 7,
            port,
            request: request.map(String::from),
            until: "pong\n".into(),
            idle_ns: 1_000_000,
            stride: 2,
            phase: 0,
        })
    };
    let inside = |h: &u64| chunk.iter().any(|r| *h >= r.start && *h < r.start + r.len);
    let mut all_hits = Vec::new();
    for request in [Some("ping\n"), None] {
        match ctl.call(&cycle(request)).unwrap() {
            Reply::Probed {
                hits,
                probed,
                window_ns,
                ..
            } => {
                assert_eq!(probed, bytes / 64 / 2, "{request:?}");
                assert!(window_ns > 0);
                assert!(hits.iter().all(inside), "{request:?}: a hit outside");
                all_hits.extend(hits);
            }
            r => panic!("{r:?}"),
        }
    }
    // A profile of those lines (the server's regions, as the CLI's recorder writes them).
    let table = preheat_model::RegionTable::build(maps);
    let lines = preheat_model::LineSet::from_lines(
        all_hits
            .iter()
            .filter_map(|h| table.to_relative(preheat_model::VirtAddr(*h))),
    );
    assert!(!lines.is_empty(), "no line of the server's code was cached");
    let profile = preheat_model::Profile {
        binary: preheat_model::BinaryIdent {
            exe: preheat_engine::maps::exe_ident(Some(pid)).unwrap(),
        },
        backend: preheat_model::Backend::Probe,
        filter: preheat_model::FilterParams::default(),
        created_unix_s: 0,
        regions: table.regions.clone(),
        classes: vec![preheat_model::RequestClass {
            port,
            samples: 1,
            ws: preheat_model::WorkingSet::from_lines(&lines, 0),
        }],
    };
    let path = tmp.path().join("outside.phws");
    std::fs::write(&path, preheat_model::encode_profile(&profile)).unwrap();
    match ctl
        .call(&Request::LoadProfile {
            path: path.to_string_lossy().into_owned(),
        })
        .unwrap()
    {
        Reply::Loaded { classes, .. } => {
            assert_eq!(classes.len(), 1);
            // Every line resolved (a file mapped twice resolves to both mappings).
            assert!(classes[0].lines >= lines.len() as u64, "{classes:?}");
            assert_eq!(classes[0].skipped_lines, 0, "{classes:?}");
        }
        r => panic!("{r:?}"),
    }
    let mut ann = Announcer::new(tmp.path(), &[pid]).unwrap();
    announce(&mut ann, port, Strategies::LINES, LEAD_NS);
    let (_, h) = wait_status(&mut ctl, port, |_, h| h.preheats >= 1);
    assert_eq!((h.preheats, h.no_profile), (1, 0), "{h:?}");
    assert!(h.lines_preheated > 0, "{h:?}");
    // Unloaded: `lines` has no profile again.
    ctl.call(&Request::UnloadProfile).unwrap();
    announce(&mut ann, port, Strategies::LINES, LEAD_NS);
    let (_, h) = wait_status(&mut ctl, port, |_, h| h.no_profile >= 1);
    assert_eq!((h.preheats, h.no_profile), (1, 1), "{h:?}");
    drop(agent);
}

/// Run serially in the suite's timing pass: what it checks is that the worker gets its CPU in
/// time.
mod timing {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    /// A normal task keeps the server's CPU busy (as other tenants or tests do): the worker
    /// still gets that CPU within an announcement's lead and acts on it. A worker that waited
    /// under `SCHED_IDLE` ran only after the arrival there (every announcement late).
    #[test]
    fn acts_on_announcements_while_a_normal_task_keeps_its_cpu_busy() {
        if !permitted() {
            return;
        }
        let Some((srv, port)) = server() else {
            return;
        };
        let pid = srv.0.id();
        let (tmp, config) = setup(pid, port);
        let cpu = config.cpu;
        let agent = OutsideAgent::start(config).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let hog = std::thread::spawn({
            let stop = stop.clone();
            move || {
                preheat_engine::os::pin_current_thread(cpu).unwrap();
                while !stop.load(Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            }
        });
        struct Stop(Arc<AtomicBool>);
        impl Drop for Stop {
            fn drop(&mut self) {
                self.0.store(true, Ordering::Relaxed);
            }
        }
        let stopper = Stop(stop);
        std::thread::sleep(Duration::from_millis(50));
        let mut ctl = AgentClient::connect(tmp.path(), pid).unwrap();
        let mut ann = Announcer::new(tmp.path(), &[pid]).unwrap();
        // `spin` (the worker spins through the arrival, as where the calibration chose it):
        // the worker must get the busy CPU for each one.
        for _ in 0..5 {
            announce(&mut ann, port, Strategies::SPIN, LEAD_NS);
            std::thread::sleep(Duration::from_millis(40));
        }
        let (_, h) = wait_status(&mut ctl, port, |_, h| h.announcements >= 5);
        drop(stopper);
        hog.join().unwrap();
        assert_eq!(h.announcements, 5, "{h:?}");
        assert_eq!((h.late, h.wake_spins), (0, 5), "{h:?}");
        drop(agent);
    }
}
