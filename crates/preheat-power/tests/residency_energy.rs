//! Residency diffs and the energy model on synthetic sysfs trees, with exact expected numbers.

use std::fs;
use std::path::Path;

use preheat_power::energy::{PowerProfile, StatePower, PROFILE_FORMAT};
use preheat_power::residency::{IdleError, MachineRoot, ResidencyError, Snapshot};

/// (name, time µs, usage) of one idle state.
type State<'a> = (&'a str, u64, u64);

/// Write `cpuN/cpuidle/stateK/{name,time,usage}` for every (cpu, states) given.
fn write_tree(root: &Path, cpus: &[(u32, &[State])]) {
    for (cpu, states) in cpus {
        for (k, (name, time, usage)) in states.iter().enumerate() {
            let d = root.join(format!("cpu{cpu}/cpuidle/state{k}"));
            fs::create_dir_all(&d).unwrap();
            fs::write(d.join("name"), format!("{name}\n")).unwrap();
            fs::write(d.join("time"), format!("{time}\n")).unwrap();
            fs::write(d.join("usage"), format!("{usage}\n")).unwrap();
        }
    }
}

const S: u64 = 1_000_000_000; // 1 s in ns

/// Two CPUs over exactly 1 s:
/// cpu0: POLL +100 ms (busy), C6 +500 ms → busy 500 ms (share 0.5)
/// cpu1: POLL +0, C6 +750 ms → busy 250 ms (share 0.25)
fn two_cpu_interval(m: &MachineRoot) -> (Snapshot, Snapshot) {
    let root = &m.sys_cpu();
    write_tree(
        root,
        &[
            (0, &[("POLL", 1_000, 10), ("C6", 2_000_000, 100)]),
            (1, &[("POLL", 0, 0), ("C6", 3_000_000, 200)]),
        ],
    );
    // Non-CPU entries must be ignored.
    fs::create_dir_all(root.join("cpufreq")).unwrap();
    fs::create_dir_all(root.join("cpuidle")).unwrap();
    fs::write(root.join("online"), "0-1\n").unwrap();
    let a = Snapshot::read_with_wall(m, 5 * S).unwrap();
    write_tree(
        root,
        &[
            (0, &[("POLL", 101_000, 13), ("C6", 2_500_000, 150)]),
            (1, &[("POLL", 0, 0), ("C6", 3_750_000, 260)]),
        ],
    );
    let b = Snapshot::read_with_wall(m, 6 * S).unwrap();
    (a, b)
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

#[test]
fn residency_diff_is_exact() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = two_cpu_interval(&MachineRoot::at(tmp.path()));
    assert_eq!(a.cpus.len(), 2);
    assert_eq!(a.cpus[0].states[0].name, "POLL");
    let d = a.diff(&b).unwrap();
    assert_eq!(d.wall_us, 1_000_000);
    assert_eq!(d.cpus[0].states[0].time_us, 100_000);
    assert_eq!(d.cpus[0].states[0].transitions, 3);
    assert_eq!(d.cpus[0].states[1].time_us, 500_000);
    assert_eq!(d.cpus[0].states[1].transitions, 50);
    assert_eq!(d.cpus[1].states[1].time_us, 750_000);
    assert_eq!(d.cpus[1].states[1].transitions, 60);
    assert_eq!(d.transitions(), 113);

    let busy = d.busy_default();
    assert_eq!(busy[0].busy_us, 500_000); // POLL counts as busy
    assert_eq!(busy[0].share, 0.5);
    assert_eq!(busy[1].busy_us, 250_000);
    assert_eq!(busy[1].share, 0.25);
    assert!(!busy[0].clamped && !busy[1].clamped);

    // Share of CPU time (2 CPUs × 1 s) in C6: 1.25 s / 2 s.
    assert!(close(d.share_of_states(|n| n == "C6"), 0.625));
}

#[test]
fn energy_model_is_exact_with_bounds() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = two_cpu_interval(&MachineRoot::at(tmp.path()));
    let d = a.diff(&b).unwrap();
    let p = PowerProfile::default();
    assert_eq!(p.first_active_w, 37.0);
    assert_eq!(p.additional_active_w, 8.0);
    assert_eq!(p.package_idle_w, 5.0);
    let e = p.model(&d).unwrap();
    // b = (0.5, 0.25); E[k] = 0.75.
    // independent: A = 1 − 0.5·0.75 = 0.625 → 5 + 0.625·37 + 0.125·8 = 29.125 W
    // max overlap: A = 0.5 → 5 + 18.5 + 0.25·8 = 25.5 W
    // min overlap: A = 0.75 → 5 + 27.75 + 0 = 32.75 W
    assert!(close(e.mean_active_cpus.value, 0.75));
    assert!(close(e.any_active_share.independent.value, 0.625));
    assert!(close(e.any_active_share.max_overlap.value, 0.5));
    assert!(close(e.any_active_share.min_overlap.value, 0.75));
    assert!(close(e.average_power.independent.value, 29.125));
    assert!(close(e.average_power.max_overlap.value, 25.5));
    assert!(close(e.average_power.min_overlap.value, 32.75));
    // 1 s interval: J = W.
    assert!(close(e.energy.independent.value, 29.125));
    assert!(close(e.energy.max_overlap.value, 25.5));
    assert!(close(e.energy.min_overlap.value, 32.75));
    assert!(close(e.interval.value, 1.0));
    assert_eq!(e.energy.independent.unit, "J");
    assert_eq!(e.average_power.independent.unit, "W");

    // Per request: 10 requests → 2.9125 J each.
    let per = e.energy.per(10.0, "J/request");
    assert!(close(per.independent.value, 2.9125));
    assert_eq!(per.independent.unit, "J/request");
}

#[test]
fn per_state_idle_power_and_active_states_are_honoured() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = two_cpu_interval(&MachineRoot::at(tmp.path()));
    let d = a.diff(&b).unwrap();
    let mut p = PowerProfile::default();
    p.states.push(StatePower {
        name: "C6".into(),
        active: false,
        idle_extra_w: 2.0,
        deep: true,
    });
    let e = p.model(&d).unwrap();
    // C6 residency 0.5 s + 0.75 s at 2 W = 2.5 J over 1 s = +2.5 W.
    assert!(close(e.idle_state_power.value, 2.5));
    assert!(close(e.average_power.independent.value, 29.125 + 2.5));

    // POLL counted idle instead: cpu0 busy 0.4, cpu1 0.25 → E[k] = 0.65, A = 1 − 0.6·0.75 = 0.55
    // → 5 + 0.55·37 + 0.10·8 = 26.15 W.
    let mut p = PowerProfile::default();
    p.states[0].active = false;
    let e = p.model(&d).unwrap();
    assert!(close(e.average_power.independent.value, 26.15));
}

#[test]
fn every_energy_value_is_labeled_modeled() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = two_cpu_interval(&MachineRoot::at(tmp.path()));
    let e = PowerProfile::default().model(&a.diff(&b).unwrap()).unwrap();
    let v = serde_json::to_value(&e).unwrap();
    assert_eq!(v["label"], "modeled");
    let mut values = 0;
    fn walk(v: &serde_json::Value, values: &mut usize) {
        match v {
            serde_json::Value::Object(m) => {
                if m.contains_key("value") {
                    assert_eq!(m["label"], "modeled", "{v}");
                    *values += 1;
                }
                m.values().for_each(|x| walk(x, values));
            }
            serde_json::Value::Array(a) => a.iter().for_each(|x| walk(x, values)),
            _ => {}
        }
    }
    walk(&v, &mut values);
    assert!(values >= 14, "{values} labeled values");
}

#[test]
fn offline_cpus_are_skipped_and_cpus_without_cpuidle_are_busy() {
    let tmp = tempfile::tempdir().unwrap();
    let m = MachineRoot::at(tmp.path());
    let root = &m.sys_cpu();
    write_tree(root, &[(0, &[("POLL", 0, 0), ("C1", 0, 0)])]);
    write_tree(root, &[(2, &[("POLL", 0, 0), ("C1", 0, 0)])]);
    fs::write(root.join("cpu2/online"), "0\n").unwrap();
    fs::create_dir_all(root.join("cpu1")).unwrap(); // online, no cpuidle driver
    let a = Snapshot::read_with_wall(&m, 0).unwrap();
    assert_eq!(a.cpus.iter().map(|c| c.cpu).collect::<Vec<_>>(), vec![0, 1]);
    write_tree(root, &[(0, &[("POLL", 0, 0), ("C1", 400_000, 4)])]);
    let b = Snapshot::read_with_wall(&m, S).unwrap();
    let busy = a.diff(&b).unwrap().busy_default();
    assert_eq!(busy[0].busy_us, 600_000);
    assert_eq!(busy[1].busy_us, 1_000_000);
    // The report counts it busy too, says so, and keeps it in the means.
    let r = a.diff(&b).unwrap().report();
    assert_eq!(r.cpus_measured, 2);
    assert_eq!(r.per_cpu[1].busy_share.value, 1.0);
    assert!(close(r.busy_share.value, 0.8));
    assert!(
        r.notes.iter().any(|n| n.contains("cpu1: no cpuidle")),
        "{:?}",
        r.notes
    );
}

#[test]
fn idle_beyond_wall_is_clamped() {
    let tmp = tempfile::tempdir().unwrap();
    let m = MachineRoot::at(tmp.path());
    let root = &m.sys_cpu();
    write_tree(root, &[(0, &[("C1", 0, 0)])]);
    let a = Snapshot::read_with_wall(&m, 0).unwrap();
    write_tree(root, &[(0, &[("C1", 1_200_000, 1)])]);
    let b = Snapshot::read_with_wall(&m, S).unwrap();
    let busy = a.diff(&b).unwrap().busy_default();
    assert_eq!(busy[0].busy_us, 0);
    assert!(busy[0].clamped);
}

#[test]
fn bad_trees_and_incomparable_snapshots_are_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let m = MachineRoot::at(tmp.path());
    let root = &m.sys_cpu();
    fs::create_dir_all(root.join("cpu0")).unwrap();
    assert!(matches!(
        Snapshot::read_with_wall(&m, 0),
        Err(ResidencyError::Unavailable(IdleError::NoProcStat(_)))
    ));
    write_tree(root, &[(0, &[("C1", 500, 1)])]);
    let a = Snapshot::read_with_wall(&m, S).unwrap();
    write_tree(root, &[(0, &[("C1", 400, 1)])]);
    let b = Snapshot::read_with_wall(&m, 2 * S).unwrap();
    assert!(matches!(a.diff(&b), Err(ResidencyError::Mismatch(_))));
    // Earlier wall time.
    assert!(matches!(b.diff(&a), Err(ResidencyError::Mismatch(_))));
    fs::write(root.join("cpu0/cpuidle/state0/time"), "garbage\n").unwrap();
    assert!(matches!(
        Snapshot::read_with_wall(&m, 0),
        Err(ResidencyError::Unavailable(IdleError::Unreadable(_)))
    ));
}

#[test]
fn accumulated_intervals_add_up() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = two_cpu_interval(&MachineRoot::at(tmp.path()));
    let d = a.diff(&b).unwrap();
    let mut acc = d.clone();
    acc.accumulate(&d).unwrap();
    assert_eq!(acc.wall_us, 2_000_000);
    assert_eq!(acc.cpus[0].states[1].time_us, 1_000_000);
    assert_eq!(acc.transitions(), 226);
    // Same shares → same average power, twice the energy.
    let p = PowerProfile::default();
    let (e1, e2) = (p.model(&d).unwrap(), p.model(&acc).unwrap());
    assert!(close(
        e1.average_power.independent.value,
        e2.average_power.independent.value
    ));
    assert!(close(
        2.0 * e1.energy.independent.value,
        e2.energy.independent.value
    ));
}

#[test]
fn profile_json_round_trips_through_a_file() {
    let p = PowerProfile::default();
    let text = p.to_json();
    assert_eq!(PowerProfile::from_json(&text).unwrap(), p);
    let mut q = p.clone();
    q.name = "custom".into();
    q.package_idle_w = 12.5;
    q.states.push(StatePower {
        name: "C6".into(),
        active: false,
        idle_extra_w: 0.25,
        deep: true,
    });
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("profile.json");
    fs::write(&path, q.to_json()).unwrap();
    assert_eq!(PowerProfile::load(&path).unwrap(), q);
    let v: serde_json::Value = serde_json::from_str(&q.to_json()).unwrap();
    assert_eq!(v["format"], PROFILE_FORMAT);
}

#[test]
fn invalid_profiles_are_refused_with_the_file_name() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("bad.json");
    let good: serde_json::Value = serde_json::from_str(&PowerProfile::default().to_json()).unwrap();
    let cases: Vec<(&str, serde_json::Value)> = vec![
        ("first_active_w", {
            let mut v = good.clone();
            v["first_active_w"] = serde_json::json!(-1.0);
            v
        }),
        ("format", {
            let mut v = good.clone();
            v["format"] = serde_json::json!("preheat-power-profile/99");
            v
        }),
        ("unknown field", {
            let mut v = good.clone();
            v["bogus"] = serde_json::json!(1);
            v
        }),
        ("twice", {
            let mut v = good.clone();
            let s = v["states"][0].clone();
            v["states"].as_array_mut().unwrap().push(s);
            v
        }),
    ];
    for (what, v) in cases {
        fs::write(&path, v.to_string()).unwrap();
        let e = PowerProfile::load(&path).unwrap_err().to_string();
        assert!(e.contains("bad.json"), "{e}");
        assert!(e.contains(what), "{what}: {e}");
    }
    assert!(PowerProfile::load(&tmp.path().join("missing.json")).is_err());
}
