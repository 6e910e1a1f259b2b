//! Profiles in the agent: loaded over the control socket or from the environment at start,
//! refused where they do not match the binary, and preheated from on announcements.

use super::*;

/// A profile of the running preheat-kv: the first `n` lines of each executable mapping of its
/// binary, as the recorder would write it (region-relative).
fn exe_profile(pid: u32, port: u16, n: u64, fake_exe: bool) -> Profile {
    let maps = preheat_engine::maps::read_maps(Some(pid)).unwrap();
    let exe = preheat_engine::maps::exe_ident(Some(pid)).unwrap();
    let table = RegionTable::build(maps);
    let mut lines = Vec::new();
    for m in &table.mappings {
        if m.exec && m.file.as_ref().is_some_and(|f| f.path == exe.path) {
            for k in 0..n.min(m.len() / 64) {
                lines.push(table.to_relative(VirtAddr(m.start + k * 64)).unwrap());
            }
        }
    }
    assert!(!lines.is_empty(), "no executable mapping of {}", exe.path);
    let binary = if fake_exe {
        BinaryIdent {
            exe: FileIdent {
                path: "/opt/elsewhere/other-server".into(),
                inode: 12345,
                build_id: vec![0xab; 20],
            },
        }
    } else {
        BinaryIdent { exe }
    };
    Profile {
        binary,
        backend: Backend::Trace,
        filter: FilterParams::default(),
        created_unix_s: 0,
        regions: table.regions.clone(),
        classes: vec![RequestClass {
            port,
            samples: 8,
            ws: WorkingSet::from_lines(&LineSet::from_lines(lines), 0),
        }],
    }
}

#[test]
fn profiles_load_refuse_and_preheat() {
    let srv = start_kv(&[]);
    let mut mc = Mc::connect(srv.port);
    assert_eq!(mc.get("key:1").unwrap(), Some(kv_value(1)));
    let mut agent = srv.agent();
    assert!(agent.wait_status(WAIT, |s| s.busy_periods(srv.port) > 0).0);
    let dir = srv.dir.path();

    // A good profile loads and resolves completely.
    let good = encode_profile(&exe_profile(srv.pid(), srv.port, 64, false));
    let good_path = dir.join("good.phws");
    std::fs::write(&good_path, &good).unwrap();
    let good_str = good_path.to_string_lossy().into_owned();
    match agent.call(&Request::LoadProfile {
        path: good_str.clone(),
    }) {
        Reply::Loaded { path, classes, .. } => {
            assert_eq!(path, good_str);
            assert_eq!(classes.len(), 1);
            assert_eq!(classes[0].port, srv.port);
            assert!(classes[0].lines >= 64, "{classes:?}");
            assert_eq!(classes[0].skipped_lines, 0, "{classes:?}");
        }
        other => panic!("load: {other:?}"),
    }

    // Broken files: each refused with the file and the problem named.
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "garbage.phws",
            b"this is not a profile at all".to_vec(),
            "bad magic",
        ),
        (
            "truncated.phws",
            good[..good.len() / 2].to_vec(),
            "truncated",
        ),
        (
            "corrupt.phws",
            {
                let mut c = good.clone();
                let i = c.len() - 10;
                c[i] ^= 0x55;
                c
            },
            "checksum",
        ),
        (
            "version.phws",
            {
                let mut c = good.clone();
                c[8] = 9;
                c
            },
            "version",
        ),
    ];
    for (name, bytes, what) in cases {
        let p = dir.join(name);
        std::fs::write(&p, bytes).unwrap();
        let msg = agent.error(&Request::LoadProfile {
            path: p.to_string_lossy().into_owned(),
        });
        assert!(
            msg.contains(name),
            "{name}: message does not name the file: {msg}"
        );
        assert!(msg.contains(what), "{name}: expected '{what}' in: {msg}");
    }
    let msg = agent.error(&Request::LoadProfile {
        path: dir.join("missing.phws").to_string_lossy().into_owned(),
    });
    assert!(msg.contains("missing.phws"), "{msg}");

    // A profile of another binary is refused as a whole.
    let wrong_path = dir.join("wrong.phws");
    std::fs::write(
        &wrong_path,
        encode_profile(&exe_profile(srv.pid(), srv.port, 64, true)),
    )
    .unwrap();
    let msg = agent.error(&Request::LoadProfile {
        path: wrong_path.to_string_lossy().into_owned(),
    });
    assert!(
        msg.contains("wrong.phws")
            && msg.contains("other-server")
            && msg.contains("record a new profile"),
        "{msg}"
    );

    // The good profile is still loaded and the server still serves.
    let st = agent.status();
    assert_eq!(st.profile.as_deref(), Some(good_str.as_str()));
    assert_eq!(st.classes.len(), 1);
    assert_eq!(mc.get("key:2").unwrap(), Some(kv_value(2)));

    // Lines: an announcement preheats the port's working set before the arrival.
    srv.announce(srv.pid(), Strategies::LINES, LEAD_NS, 1);
    let (ok, st) = agent.wait_status(WAIT, |s| s.preheat.preheats == 1);
    assert!(ok, "{:?}", st.preheat);
    let lines = st.classes[0].lines;
    assert_eq!(st.preheat.completed, 1, "{:?}", st.preheat);
    assert_eq!(st.preheat.lines_preheated, lines, "{:?}", st.preheat);
    assert_eq!(st.preheat.last_lines_total, lines);
    assert_eq!(st.preheat.no_profile, 0);

    // Split over another CPU.
    agent.ok(&Request::Configure {
        port: srv.port,
        replay: None,
        replay_until: None,
        split_cpus: vec![0],
        replay_via: None,
    });
    srv.announce(srv.pid(), Strategies::LINES, LEAD_NS, 2);
    let (ok, st) = agent.wait_status(WAIT, |s| s.preheat.preheats == 2);
    assert!(ok, "{:?}", st.preheat);
    assert_eq!(st.preheat.lines_preheated, 2 * lines, "{:?}", st.preheat);
    let msg = agent.error(&Request::Configure {
        port: srv.port,
        replay: None,
        replay_until: None,
        split_cpus: vec![4096],
        replay_via: None,
    });
    assert!(msg.contains("4096"), "{msg}");

    // Another port has no working set.
    let other = srv.port.wrapping_add(1).max(1);
    let now = preheat_engine::time::now_ns();
    srv.announce_raw(
        srv.pid(),
        &preheat_model::proto::Announcement {
            strategies: Strategies::LINES,
            port: other,
            seq: 3,
            arrival_ns: now + LEAD_NS,
            sent_ns: now,
            budget_ns: 0,
        }
        .encode(),
    );
    assert!(agent.wait_status(WAIT, |s| s.preheat.no_profile == 1).0);

    // Unload.
    agent.ok(&Request::UnloadProfile);
    let st = agent.status();
    assert_eq!(st.profile, None);
    assert!(st.classes.is_empty());
    srv.announce(srv.pid(), Strategies::LINES, LEAD_NS, 4);
    assert!(agent.wait_status(WAIT, |s| s.preheat.no_profile == 2).0);
    assert_eq!(mc.get("key:5").unwrap(), Some(kv_value(5)));
}

#[test]
fn profile_from_the_environment_is_loaded_at_start() {
    // Record a profile of one preheat-kv process; file regions survive a restart.
    let first = start_kv(&[]);
    let profile = exe_profile(first.pid(), first.port, 32, false);
    let path = first.dir.path().join("env.phws");
    std::fs::write(&path, encode_profile(&profile)).unwrap();
    let bad = first.dir.path().join("bad.phws");
    std::fs::write(&bad, b"garbage").unwrap();

    let srv = start_kv(&[("PREHEAT_PROFILE", path.to_str().unwrap())]);
    let mut agent = srv.agent();
    let (ok, st) = agent.wait_status(WAIT, |s| s.profile.is_some());
    assert!(ok, "PREHEAT_PROFILE not loaded: {st:?}\n{}", srv.log_tail());
    assert_eq!(st.profile.as_deref(), path.to_str());
    assert_eq!(st.classes.len(), 1);
    assert_eq!(st.classes[0].port, first.port);
    assert!(st.classes[0].lines >= 32);
    assert_eq!(st.classes[0].skipped_lines, 0, "{st:?}");

    let srv = start_kv(&[("PREHEAT_PROFILE", bad.to_str().unwrap())]);
    let mut mc = Mc::connect(srv.port);
    assert_eq!(mc.get("key:1").unwrap(), Some(kv_value(1)));
    let log = preheat_agent::socket_paths(&srv.run_dir, srv.pid()).log;
    assert!(
        wait_until(WAIT, || std::fs::read_to_string(&log).is_ok_and(|l| l
            .contains("PREHEAT_PROFILE not loaded")
            && l.contains("bad magic"))),
        "{}",
        srv.log_tail()
    );
    assert_eq!(srv.agent().status().profile, None);
}
