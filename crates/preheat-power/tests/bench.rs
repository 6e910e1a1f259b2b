//! The quiescence bench in a 1-second mode: every field is produced, labeled, and nothing is
//! left behind. No timing thresholds.

use std::path::Path;
use std::time::Duration;

use preheat_engine::machine::{self, MachineRoot};
use preheat_power::bench::{run_bench, BenchConfig, Io, Mode};
use preheat_power::quiesce::{cgroup_mounts, Backend, Freezer};

/// The benches share the machine (and this process's group names): run them one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn lock() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn our_groups() -> Vec<std::path::PathBuf> {
    let me = std::process::id();
    let m = cgroup_mounts();
    [
        m.v2.map(|r| Freezer::new(Backend::V2, r)),
        m.v1_freezer.map(|r| Freezer::new(Backend::V1, r)),
    ]
    .into_iter()
    .flatten()
    .flat_map(|f| f.list_groups())
    .filter(|(_, p)| *p == me)
    .map(|(d, _)| d)
    .collect()
}

fn check_labels(v: &serde_json::Value, path: &str) {
    match v {
        serde_json::Value::Object(m) => {
            if m.contains_key("value") || m.contains_key("p50") {
                let l = m.get("label").and_then(|l| l.as_str()).unwrap_or("");
                assert!(
                    ["measured", "emulated", "modeled"].contains(&l),
                    "{path}: unlabeled {v}"
                );
            }
            for (k, x) in m {
                check_labels(x, &format!("{path}.{k}"));
            }
        }
        serde_json::Value::Array(a) => a
            .iter()
            .enumerate()
            .for_each(|(i, x)| check_labels(x, &format!("{path}[{i}]"))),
        _ => {}
    }
}

#[test]
fn one_second_bench_produces_every_field() {
    let _g = lock();
    // This machine, whichever variant it is.
    bench_fields(MachineRoot::real(), None);
}

#[test]
fn the_bench_degrades_without_cpuidle_and_models_energy_with_it() {
    let _g = lock();
    // Both variants on any machine: the request loop, latency and CPU times are this machine's;
    // the idle counters are a fake tree's (they do not move: every CPU counts busy).
    for (variant, per_state) in [(machine::NO_CPUIDLE, false), (machine::HALTPOLL, true)] {
        let tmp = tempfile::tempdir().unwrap();
        let root = machine::write_fake(tmp.path(), &variant).unwrap();
        bench_fields(root, Some(per_state));
    }
}

/// Run a one-second bench reading idle counters at `root` and check every field; `per_state`:
/// whether the counters must have per-state time (None: whatever this machine has).
fn bench_fields(root: MachineRoot, per_state: Option<bool>) {
    let cfg = BenchConfig {
        duration: Duration::from_secs(1),
        rounds: 1,
        machine: root,
        ..BenchConfig::default()
    };
    let r = run_bench(&cfg).unwrap();
    let v = serde_json::to_value(&r).unwrap();
    let has_states = r.modes[0].residency.unavailable.is_none();
    if let Some(want) = per_state {
        assert_eq!(has_states, want, "{:?}", r.modes[0].residency);
    }
    check_labels(&v, "report");
    assert_eq!(v["config"]["io_kind"], "emulated");
    assert_eq!(v["config"]["io_emulated_wait"]["label"], "emulated");
    assert!(r.config.work_iterations > 0);
    assert!(r.cpus >= 1 && !r.idle_states.is_empty());

    let expected = if r.quiescence.available {
        vec![
            Mode::NoQuiescence,
            Mode::QuiesceDuringIo,
            Mode::BackgroundFrozen,
        ]
    } else {
        preheat_testsupport::skip!(
            "cgroup-freezer",
            "quiescence modes: {}",
            r.quiescence.reason.as_deref().unwrap_or("?")
        );
        assert!(r.quiescence.reason.is_some());
        vec![Mode::NoQuiescence]
    };
    assert_eq!(r.modes.iter().map(|m| m.mode).collect::<Vec<_>>(), expected);
    for (m, mv) in r.modes.iter().zip(v["modes"].as_array().unwrap()) {
        assert!(m.requests > 0, "{:?}: no requests", m.mode);
        assert_eq!(m.latency.n, m.requests);
        assert_eq!(m.io_wait.n, m.requests);
        assert_eq!(mv["latency"]["label"], "measured");
        assert_eq!(mv["io_wait"]["label"], "emulated");
        assert_eq!(m.blocks, 1);
        assert_eq!(mv["residency"]["label"], "measured");
        assert_eq!(m.residency.windows, 1);
        assert_eq!(m.residency.cpus_measured, r.cpus);
        if has_states {
            assert_eq!(mv["idle_transitions_per_s"]["label"], "measured");
        } else {
            // Without a cpuidle driver: entries and energy unavailable, with the reason.
            assert!(mv["idle_transitions_per_s"].is_null());
            assert!(mv["energy"].is_null() && mv["energy_per_request"].is_null());
            let why = m.energy_unavailable.as_deref().unwrap();
            assert!(why.contains("no cpuidle driver"), "{why}");
            assert!(
                r.notes.iter().any(|n| n.contains("/proc/stat")),
                "{:?}",
                r.notes
            );
            assert!(m.background_energy.is_none());
        }
        for key in [
            "deep_idle_share",
            "busy_share",
            "background_cpu",
            "background_cpu_share",
            "other_cpu_share",
            "duration",
        ] {
            assert_eq!(mv[key]["label"], "measured", "{key}");
            assert!(mv[key]["value"].as_f64().unwrap() >= 0.0, "{key}");
        }
        let bounds: &[&str] = if has_states {
            &["independent", "max_overlap", "min_overlap"]
        } else {
            &[]
        };
        for b in bounds {
            assert_eq!(mv["energy_per_request"][b]["label"], "modeled");
            assert_eq!(mv["energy_per_request"][b]["unit"], "J/request");
            assert!(mv["energy_per_request"][b]["value"].as_f64().unwrap() > 0.0);
            assert_eq!(mv["energy"]["energy"][b]["label"], "modeled");
        }
        if let Some(e) = &m.energy_per_request {
            assert!(e.max_overlap.value <= e.independent.value + 1e-12);
            assert!(e.independent.value <= e.min_overlap.value + 1e-12);
        }
        match (&m.background_energy, m.mode) {
            (None, _) => {}
            (Some(b), Mode::NoQuiescence | Mode::QuiesceDuringIo) => {
                assert_eq!(b.independent.label, preheat_power::Label::Modeled);
                assert_eq!(b.independent.unit, "J/CPU-s");
            }
            (Some(_), Mode::BackgroundFrozen) => panic!("reference has no background energy"),
        }
        if has_states && r.quiescence.available && m.mode == Mode::NoQuiescence {
            assert!(m.background_energy.is_some(), "hog ran all block long");
        }
        match m.mode {
            Mode::QuiesceDuringIo => {
                let f = m.freeze.as_ref().expect("freeze stats in mode (b)");
                assert_eq!(f.holds, m.requests);
                assert!(f.settled_before_io_done <= f.holds);
                assert_eq!(f.hold_call.n, f.holds);
                assert_eq!(f.release_call.n, f.holds);
            }
            _ => assert!(m.freeze.is_none()),
        }
    }
    assert!(
        our_groups().is_empty(),
        "cgroups left behind: {:?}",
        our_groups()
    );
}

#[test]
fn file_io_mode_runs_and_cleans_up() {
    let _g = lock();
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("data");
    std::fs::write(&path, vec![7u8; 64 * 1024]).unwrap();
    let cfg = BenchConfig {
        duration: Duration::from_millis(600),
        rounds: 1,
        io: Io::File {
            path: path.clone(),
            bytes: 4096,
        },
        work: Duration::from_micros(50),
        ..BenchConfig::default()
    };
    let r = run_bench(&cfg).unwrap();
    let v = serde_json::to_value(&r).unwrap();
    check_labels(&v, "report");
    assert_eq!(v["config"]["io_kind"], "file");
    for (m, mv) in r.modes.iter().zip(v["modes"].as_array().unwrap()) {
        assert!(m.requests > 0);
        assert_eq!(mv["io_wait"]["label"], "measured");
    }
    assert!(our_groups().is_empty());
}

#[test]
fn a_missing_io_file_is_a_clear_error() {
    let _g = lock();
    let cfg = BenchConfig {
        duration: Duration::from_millis(100),
        rounds: 1,
        io: Io::File {
            path: Path::new("/nonexistent/preheat-io").to_path_buf(),
            bytes: 4096,
        },
        ..BenchConfig::default()
    };
    let e = format!("{:#}", run_bench(&cfg).unwrap_err());
    assert!(e.contains("/nonexistent/preheat-io"), "{e}");
    assert!(our_groups().is_empty());
}
