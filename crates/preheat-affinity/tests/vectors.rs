//! Base vectors sized from the main CPU's caches (paper §2.1).

mod common;

use common::*;
use preheat_affinity::{base_vectors, CacheKind, Cpu, Machine, PlanError, VectorKind, VectorSpec};

fn summary(v: &[VectorSpec]) -> Vec<(String, VectorKind, u64, Option<String>)> {
    v.iter()
        .map(|v| (v.name.clone(), v.kind, v.bytes, v.target.clone()))
        .collect()
}

fn s(x: &str) -> String {
    x.to_string()
}

#[test]
fn this_box_has_five_vectors() {
    let bv = base_vectors(&this_box(), 0).unwrap();
    assert_eq!(
        summary(&bv.vectors),
        vec![
            (s("BV_0"), VectorKind::Zero, 4096, None),
            (s("BV_L1D"), VectorKind::Data, 48 * K, Some(s("L1d"))),
            (s("BV_L1I"), VectorKind::Code, 32 * K, Some(s("L1i"))),
            (s("BV_L2"), VectorKind::Data, 2 * M, Some(s("L2"))),
            (s("BV_LLC"), VectorKind::Data, 32 * M, Some(s("L3"))),
        ]
    );
    assert!(bv.notes.is_empty());
}

#[test]
fn last_level_is_bv_llc_even_when_it_is_l2() {
    for (m, l1d, l1i, l2) in [
        (niagara(), 8 * K, 16 * K, 3 * M),
        (clovertown(), 32 * K, 32 * K, 4 * M),
    ] {
        let bv = base_vectors(&m, 1).unwrap();
        assert_eq!(
            summary(&bv.vectors),
            vec![
                (s("BV_0"), VectorKind::Zero, 4096, None),
                (s("BV_L1D"), VectorKind::Data, l1d, Some(s("L1d"))),
                (s("BV_L1I"), VectorKind::Code, l1i, Some(s("L1i"))),
                (s("BV_LLC"), VectorKind::Data, l2, Some(s("L2"))),
            ]
        );
        assert!(bv.get("BV_L2").is_none());
    }
}

#[test]
fn missing_l1i_means_no_bv_l1i_and_a_note() {
    let m = Machine {
        cpus: vec![Cpu {
            cpu: 0,
            package: 0,
            caches: vec![
                cache(1, CacheKind::Data, 32 * K, &[0]),
                cache(2, CacheKind::Unified, M, &[0]),
            ],
        }],
    };
    let bv = base_vectors(&m, 0).unwrap();
    let names: Vec<&str> = bv.vectors.iter().map(|v| v.name.as_str()).collect();
    assert_eq!(names, ["BV_0", "BV_L1D", "BV_LLC"]);
    assert_eq!(bv.notes.len(), 1);
    assert!(bv.notes[0].contains("BV_L1I is absent"), "{}", bv.notes[0]);
}

#[test]
fn no_caches_leaves_only_bv_0() {
    let m = Machine {
        cpus: vec![Cpu {
            cpu: 3,
            package: 0,
            caches: vec![],
        }],
    };
    let bv = base_vectors(&m, 3).unwrap();
    assert_eq!(bv.vectors.len(), 1);
    assert_eq!(bv.notes.len(), 3, "{:?}", bv.notes);
}

#[test]
fn unknown_cpu_is_an_error() {
    let e = base_vectors(&this_box(), 7).unwrap_err();
    assert_eq!(
        e,
        PlanError::CpuNotFound {
            cpu: 7,
            known: vec![0, 1]
        }
    );
    assert!(e.to_string().contains("CPU 7 is not in the machine"));
}
