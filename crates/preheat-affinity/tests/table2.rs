//! The Table 2 matrix on the paper's machines (exact) and on ours (substituted).

mod common;

use std::collections::BTreeSet;

use common::*;
use preheat_affinity::{plan_table2, Affinity, Cell, PlanError, Retention, Table2Plan};

fn ids(t: &Table2Plan) -> BTreeSet<String> {
    t.cells.iter().map(|c| c.id.clone()).collect()
}

fn cell<'a>(t: &'a Table2Plan, id: &str) -> &'a Cell {
    t.cells
        .iter()
        .find(|c| c.id == id)
        .unwrap_or_else(|| panic!("no cell {id}"))
}

/// The invariants every matrix keeps whatever the machine.
fn check_consistent(t: &Table2Plan, quanta: &[u32]) {
    assert_eq!(ids(t).len(), t.cells.len(), "ids repeat");
    for c in &t.cells {
        assert_eq!(
            c.id,
            format!(
                "{}.{}.q{}",
                c.interleaved,
                c.retention.as_str(),
                c.quantum_ms
            )
        );
        assert!(quanta.contains(&c.quantum_ms));
        match c.retention {
            Retention::High => {
                assert_eq!(c.concurrent, None);
                assert_eq!(c.concurrent_cpu, None);
            }
            Retention::Low => {
                assert!(c.concurrent.is_some());
                assert_eq!(c.concurrent_cpu, t.concurrent_cpu);
            }
        }
        let expected = match c.affinity {
            Affinity::LowD => "BV_L1D",
            Affinity::LowI => "BV_L1I",
            Affinity::High => "BV_0",
            Affinity::LowDL2 => c.interleaved.as_str(),
        };
        assert_eq!(c.interleaved, expected);
        if t.paper_exact {
            assert_eq!(c.substitute, None, "{}", c.id);
        }
        assert!(c.paper_cell.contains("L2 retention"), "{}", c.paper_cell);
    }
}

#[test]
fn paper_machines_give_the_papers_cells() {
    for m in [clovertown(), niagara()] {
        let t = plan_table2(&m, 0, &QUANTA).unwrap();
        check_consistent(&t, &QUANTA);
        assert!(t.paper_exact);
        assert_eq!(t.retention_level.as_deref(), Some("L2"));
        assert_eq!(t.concurrent_cpu, Some(1));
        assert_eq!(t.cells.len(), 3 * 2 * 3);
        let mut want = BTreeSet::new();
        for v in ["BV_L1D", "BV_L1I", "BV_0"] {
            for r in ["high", "low"] {
                for q in QUANTA {
                    want.insert(format!("{v}.{r}.q{q}"));
                }
            }
        }
        assert_eq!(ids(&t), want);
        let low = cell(&t, "BV_L1I.low.q2");
        assert_eq!(low.concurrent.as_deref(), Some("BV_LLC"));
        assert_eq!(low.concurrent_cpu, Some(1));
        assert_eq!(low.affinity, Affinity::LowI);
        assert_eq!(low.paper_cell, "low L2 retention, low L1 I-cache affinity");
        assert_eq!(
            cell(&t, "BV_0.high.q200").paper_cell,
            "high L2 retention, high L1 cache affinity"
        );
        assert!(t.cells.iter().all(|c| c.affinity != Affinity::LowDL2));
    }
}

#[test]
fn concurrent_cpu_is_the_lowest_sharer_of_the_main_cpu() {
    let t = plan_table2(&clovertown(), 3, &QUANTA).unwrap();
    assert_eq!(t.concurrent_cpu, Some(2));
    let t = plan_table2(&niagara(), 0, &[2]).unwrap();
    assert_eq!(t.concurrent_cpu, Some(1));
    let t = plan_table2(&niagara(), 1, &[2]).unwrap();
    assert_eq!(t.concurrent_cpu, Some(0));
}

#[test]
fn this_box_substitutes_l3_and_adds_l2_cells() {
    let t = plan_table2(&this_box(), 0, &QUANTA).unwrap();
    check_consistent(&t, &QUANTA);
    assert!(!t.paper_exact);
    assert_eq!(t.retention_level.as_deref(), Some("L3"));
    assert_eq!(t.concurrent_cpu, Some(1));
    assert_eq!(t.cells.len(), 4 * 2 * 3);

    // The contract's example cell.
    let c = cell(&t, "BV_L1D.low.q2");
    assert_eq!(c.interleaved, "BV_L1D");
    assert_eq!(c.concurrent.as_deref(), Some("BV_LLC"));
    assert_eq!(c.concurrent_cpu, Some(1));
    assert_eq!(c.affinity, Affinity::LowD);
    assert_eq!(c.retention, Retention::Low);
    assert_eq!(c.quantum_ms, 2);
    assert_eq!(c.paper_cell, "low L2 retention, low L1 D-cache affinity");
    assert_eq!(
        c.substitute.as_deref(),
        Some(
            "no CPU shares L2 with CPU 0 (private); low retention is made at L3, shared with CPU 1: \
             BV_LLC runs concurrently there"
        )
    );
    // High-retention cells of the paper's columns are the paper's.
    assert_eq!(cell(&t, "BV_L1I.high.q10").substitute, None);

    // The L2 cells, in both rows.
    let l2_text = "L2 is private here: BV_L2 interleaved on the same CPU displaces it, so the \
                   workload reloads from beyond L2 (the paper's intent for low L2 retention)";
    for q in QUANTA {
        let h = cell(&t, &format!("BV_L2.high.q{q}"));
        assert_eq!(h.affinity, Affinity::LowDL2);
        assert_eq!(h.concurrent, None);
        assert_eq!(h.substitute.as_deref(), Some(l2_text));
        assert!(h
            .paper_cell
            .starts_with("low L2 retention, low L1 D-cache affinity"));
        let l = cell(&t, &format!("BV_L2.low.q{q}"));
        assert_eq!(l.affinity, Affinity::LowDL2);
        assert_eq!(l.concurrent.as_deref(), Some("BV_LLC"));
        let s = l.substitute.as_deref().unwrap();
        assert!(
            s.starts_with(l2_text) && s.contains("low retention is made at L3"),
            "{s}"
        );
    }
    let json = serde_json::to_value(cell(&t, "BV_L2.low.q200")).unwrap();
    assert_eq!(json["affinity"], "low-d-l2");
    assert_eq!(json["retention"], "low");
}

#[test]
fn one_cpu_has_no_low_row_but_keeps_the_l2_cells() {
    let t = plan_table2(&single(), 0, &QUANTA).unwrap();
    check_consistent(&t, &QUANTA);
    assert_eq!(t.retention_level, None);
    assert_eq!(t.concurrent_cpu, None);
    assert!(!t.paper_exact);
    assert!(t.cells.iter().all(|c| c.retention == Retention::High));
    assert_eq!(t.cells.len(), 4 * 3);
    assert!(t.cells.iter().any(|c| c.id == "BV_L2.high.q2"));
    assert!(
        t.notes
            .iter()
            .any(|n| n.contains("low-retention row is omitted")),
        "{:?}",
        t.notes
    );
}

#[test]
fn all_private_multiprocessor_omits_the_low_row() {
    // Clovertown with one core per chip (the paper's UMP): CPUs 0 and 2 only.
    let mut m = clovertown();
    m.cpus.retain(|c| c.cpu % 2 == 0);
    let t = plan_table2(&m, 0, &[2]).unwrap();
    assert_eq!(t.retention_level, None);
    // The only level beyond L1 is L2 (private here), named BV_LLC.
    let ids: Vec<&str> = t.cells.iter().map(|c| c.id.as_str()).collect();
    assert_eq!(
        ids,
        [
            "BV_L1D.high.q2",
            "BV_L1I.high.q2",
            "BV_0.high.q2",
            "BV_LLC.high.q2"
        ]
    );
    assert!(
        t.notes
            .iter()
            .any(|n| n.contains("no cache level ≥ 2 of CPU 0 is shared")),
        "{:?}",
        t.notes
    );
}

#[test]
fn quanta_order_is_kept_and_cells_are_row_column_quantum() {
    let t = plan_table2(&niagara(), 0, &[200, 2]).unwrap();
    let ids: Vec<&str> = t.cells.iter().map(|c| c.id.as_str()).collect();
    assert_eq!(
        ids,
        [
            "BV_L1D.high.q200",
            "BV_L1D.high.q2",
            "BV_L1I.high.q200",
            "BV_L1I.high.q2",
            "BV_0.high.q200",
            "BV_0.high.q2",
            "BV_L1D.low.q200",
            "BV_L1D.low.q2",
            "BV_L1I.low.q200",
            "BV_L1I.low.q2",
            "BV_0.low.q200",
            "BV_0.low.q2",
        ]
    );
}

#[test]
fn bad_quanta_are_refused() {
    let m = this_box();
    assert_eq!(plan_table2(&m, 0, &[]).unwrap_err(), PlanError::EmptyQuanta);
    assert_eq!(
        plan_table2(&m, 0, &[2, 0]).unwrap_err(),
        PlanError::ZeroQuantum
    );
    assert_eq!(
        plan_table2(&m, 0, &[2, 10, 2]).unwrap_err(),
        PlanError::DuplicateQuantum(2)
    );
    assert!(matches!(
        plan_table2(&m, 5, &[2]).unwrap_err(),
        PlanError::CpuNotFound { cpu: 5, .. }
    ));
}
