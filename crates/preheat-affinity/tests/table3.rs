//! Table 3: copies, interfering workloads, and what a move between CPUs loses.

mod common;

use common::*;
use preheat_affinity::{pairs, plan_table3, PlanError};

#[test]
fn this_box_loses_private_levels_and_keeps_l3() {
    let t = plan_table3(&this_box(), 0, &[0, 1]).unwrap();
    assert!(t.feasible);
    assert_eq!(t.cpus, [0, 1]);
    assert_eq!((t.main_copies, t.interfering), (2, 1));
    assert_eq!(t.lost_on_move, ["L1d", "L1i", "L2"]);
    assert_eq!(t.kept_on_move, ["L3"]);
    assert!(
        t.notes
            .iter()
            .any(|n| n.contains("MMP (2× main + 1 interfering)")),
        "{:?}",
        t.notes
    );
    assert!(
        t.notes
            .iter()
            .any(|n| n.contains("L2 private to each core") && n.contains("L3")),
        "{:?}",
        t.notes
    );
}

#[test]
fn clovertown_pair_keeps_l2_across_chips_loses_it() {
    let m = clovertown();
    let same_chip = plan_table3(&m, 0, &[0, 1]).unwrap();
    assert_eq!(same_chip.lost_on_move, ["L1d", "L1i"]);
    assert_eq!(same_chip.kept_on_move, ["L2"]);
    assert!(
        same_chip
            .notes
            .iter()
            .any(|n| n.contains("multicore uniprocessor")),
        "{:?}",
        same_chip.notes
    );

    let across = plan_table3(&m, 0, &[0, 2]).unwrap();
    assert_eq!(across.lost_on_move, ["L1d", "L1i", "L2"]);
    assert!(across.kept_on_move.is_empty());
    assert!(
        across.notes.iter().any(|n| n.contains("UMP")),
        "{:?}",
        across.notes
    );

    let all = plan_table3(&m, 0, &[0, 1, 2, 3]).unwrap();
    assert_eq!((all.main_copies, all.interfering), (4, 2));
    assert!(
        all.notes
            .iter()
            .any(|n| n.contains("UMP (4× main + 2× interfering)")),
        "{:?}",
        all.notes
    );
    assert!(
        all.notes
            .iter()
            .any(|n| n.contains("multicore multiprocessor (MMP")),
        "{:?}",
        all.notes
    );
    // CPU 1 moves to CPU 2: another chip.
    let from_1 = plan_table3(&m, 1, &[0, 1, 2, 3]).unwrap();
    assert_eq!(from_1.lost_on_move, ["L1d", "L1i", "L2"]);
    // The rotation is cyclic: CPU 3 moves to CPU 0.
    let from_3 = plan_table3(&m, 3, &[0, 1, 2, 3]).unwrap();
    assert_eq!(from_3.lost_on_move, ["L1d", "L1i", "L2"]);
}

#[test]
fn niagara_keeps_its_one_l2() {
    let t = plan_table3(&niagara(), 0, &(0..8).collect::<Vec<_>>()).unwrap();
    assert_eq!((t.main_copies, t.interfering), (8, 4));
    assert_eq!(t.lost_on_move, ["L1d", "L1i"]);
    assert_eq!(t.kept_on_move, ["L2"]);
}

#[test]
fn one_cpu_is_infeasible() {
    let t = plan_table3(&single(), 0, &[0]).unwrap();
    assert!(!t.feasible);
    assert_eq!((t.main_copies, t.interfering), (0, 0));
    assert!(t.lost_on_move.is_empty() && t.kept_on_move.is_empty());
    assert!(t.notes[0].contains("at least 2 CPUs"));
}

#[test]
fn bad_cpu_lists_are_refused() {
    let m = clovertown();
    assert_eq!(
        plan_table3(&m, 0, &[0, 0]).unwrap_err(),
        PlanError::DuplicateCpu(0)
    );
    assert!(matches!(
        plan_table3(&m, 0, &[0, 9]).unwrap_err(),
        PlanError::CpuNotFound { cpu: 9, .. }
    ));
    assert_eq!(
        plan_table3(&m, 0, &[1, 2]).unwrap_err(),
        PlanError::MainNotInList {
            main: 0,
            cpus: vec![1, 2]
        }
    );
}

#[test]
fn pairs_rotate_like_the_papers_table() {
    let w = [
        "art", "crafty", "gap", "gcc", "gzip", "mcf", "parser", "twolf",
    ];
    let p = pairs(&w);
    assert_eq!(p.len(), 8);
    assert_eq!(p[0], ("art", "crafty"));
    assert_eq!(p[6], ("parser", "twolf"));
    assert_eq!(p[7], ("twolf", "art"));
    assert_eq!(pairs(&["chase"]), [("chase", "chase")]);
    assert!(pairs(&[]).is_empty());
}
