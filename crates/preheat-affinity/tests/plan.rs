//! The whole plan and its JSON shape (docs/affinity-json.md).

mod common;

use common::*;
use preheat_affinity::{plan, plan_with_cpus, Cpu, PlanError, DEFAULT_QUANTA_MS};
use serde_json::json;

#[test]
fn json_has_the_contracts_keys_and_values() {
    let p = plan(&this_box(), 0, &DEFAULT_QUANTA_MS).unwrap();
    let v = serde_json::to_value(&p).unwrap();
    let mut keys: Vec<&str> = v.as_object().unwrap().keys().map(|k| k.as_str()).collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        ["caches", "cpus", "main_cpu", "table2", "table3", "vectors"]
    );
    assert_eq!(v["cpus"], json!([0, 1]));
    assert_eq!(v["main_cpu"], 0);
    assert_eq!(
        v["caches"],
        json!([
            {"name": "L1d", "level": 1, "kind": "Data", "bytes": 49152, "line": 64, "shared_cpus": [0]},
            {"name": "L1i", "level": 1, "kind": "Instruction", "bytes": 32768, "line": 64, "shared_cpus": [0]},
            {"name": "L2",  "level": 2, "kind": "Unified", "bytes": 2097152, "line": 64, "shared_cpus": [0]},
            {"name": "L3",  "level": 3, "kind": "Unified", "bytes": 33554432, "line": 64, "shared_cpus": [0, 1]}
        ])
    );
    assert_eq!(
        v["vectors"],
        json!([
            {"name": "BV_0",   "kind": "zero", "bytes": 4096,     "target": null},
            {"name": "BV_L1D", "kind": "data", "bytes": 49152,    "target": "L1d"},
            {"name": "BV_L1I", "kind": "code", "bytes": 32768,    "target": "L1i"},
            {"name": "BV_L2",  "kind": "data", "bytes": 2097152,  "target": "L2"},
            {"name": "BV_LLC", "kind": "data", "bytes": 33554432, "target": "L3"}
        ])
    );
    let t2 = &v["table2"];
    assert_eq!(t2["retention_level"], "L3");
    assert_eq!(t2["concurrent_cpu"], 1);
    assert_eq!(t2["paper_exact"], false);
    assert!(t2["notes"]
        .as_array()
        .unwrap()
        .iter()
        .all(|n| n.is_string()));
    let cell = t2["cells"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["id"] == "BV_L1D.low.q2")
        .unwrap();
    let mut cell_keys: Vec<&str> = cell
        .as_object()
        .unwrap()
        .keys()
        .map(|k| k.as_str())
        .collect();
    cell_keys.sort_unstable();
    assert_eq!(
        cell_keys,
        [
            "affinity",
            "concurrent",
            "concurrent_cpu",
            "id",
            "interleaved",
            "paper_cell",
            "quantum_ms",
            "retention",
            "substitute"
        ]
    );
    assert_eq!(cell["affinity"], "low-d");
    assert_eq!(cell["retention"], "low");
    assert_eq!(cell["quantum_ms"], 2);
    let high = t2["cells"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["id"] == "BV_0.high.q10")
        .unwrap();
    assert_eq!(high["concurrent"], json!(null));
    assert_eq!(high["concurrent_cpu"], json!(null));
    assert_eq!(high["substitute"], json!(null));
    assert_eq!(high["affinity"], "high");

    let t3 = &v["table3"];
    assert_eq!(t3["feasible"], true);
    assert_eq!(t3["cpus"], json!([0, 1]));
    assert_eq!(t3["main_copies"], 2);
    assert_eq!(t3["interfering"], 1);
    assert_eq!(t3["lost_on_move"], json!(["L1d", "L1i", "L2"]));
    assert_eq!(t3["kept_on_move"], json!(["L3"]));
}

#[test]
fn plan_round_trips_through_json() {
    let p = plan(&clovertown(), 2, &[2, 10]).unwrap();
    let back = serde_json::from_str(&serde_json::to_string(&p).unwrap()).unwrap();
    assert_eq!(p, back);
}

#[test]
fn same_input_same_plan() {
    assert_eq!(
        plan(&niagara(), 4, &QUANTA).unwrap(),
        plan(&niagara(), 4, &QUANTA).unwrap()
    );
}

#[test]
fn table3_cpus_can_be_chosen() {
    let p = plan_with_cpus(&clovertown(), 0, &QUANTA, &[0, 2]).unwrap();
    assert_eq!(p.cpus, [0, 1, 2, 3]);
    assert_eq!(p.table3.cpus, [0, 2]);
    assert_eq!(p.table3.lost_on_move, ["L1d", "L1i", "L2"]);
    assert!(p.table2.paper_exact);
}

#[test]
fn errors_are_clear() {
    let e = plan(&this_box(), 4, &QUANTA).unwrap_err();
    assert_eq!(
        e.to_string(),
        "CPU 4 is not in the machine (its CPUs: [0, 1])"
    );
    let e = plan(&this_box(), 0, &[]).unwrap_err();
    assert_eq!(e, PlanError::EmptyQuanta);
    assert!(e.to_string().contains("at least one"));
    let e = plan(&this_box(), 0, &[0]).unwrap_err();
    assert_eq!(e, PlanError::ZeroQuantum);
    assert!(e.to_string().contains("at least 1 ms"));
    let mut m = this_box();
    let dup: Cpu = m.cpus[1].clone();
    m.cpus.push(dup);
    assert_eq!(
        plan(&m, 0, &QUANTA).unwrap_err(),
        PlanError::DuplicateCpu(1)
    );
}

#[test]
fn single_cpu_plan_is_honest() {
    let p = plan(&single(), 0, &QUANTA).unwrap();
    assert!(!p.table3.feasible);
    assert_eq!(p.table2.cells.len(), 12);
    assert!(p.table2.cells.iter().all(|c| c.concurrent.is_none()));
}
