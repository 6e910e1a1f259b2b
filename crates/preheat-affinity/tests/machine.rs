//! The topology helpers: names, level order, L1 lookup, last level, sharers.

mod common;

use common::*;
use preheat_affinity::{CacheKind, Cpu, Machine};

#[test]
fn cache_names() {
    assert_eq!(cache(1, CacheKind::Data, K, &[0]).name(), "L1d");
    assert_eq!(cache(1, CacheKind::Instruction, K, &[0]).name(), "L1i");
    assert_eq!(cache(1, CacheKind::Unified, K, &[0]).name(), "L1");
    assert_eq!(cache(2, CacheKind::Unified, K, &[0]).name(), "L2");
    assert_eq!(cache(3, CacheKind::Unified, K, &[0]).name(), "L3");
}

#[test]
fn caches_come_in_level_order_and_llc_is_the_last() {
    let m = this_box();
    let names: Vec<String> = m.caches(1).iter().map(|c| c.name()).collect();
    assert_eq!(names, ["L1d", "L1i", "L2", "L3"]);
    let upper: Vec<String> = m.upper_levels(1).iter().map(|c| c.name()).collect();
    assert_eq!(upper, ["L2", "L3"]);
    assert_eq!(m.llc(0).unwrap().name(), "L3");
    assert_eq!(niagara().llc(5).unwrap().name(), "L2");
    assert_eq!(m.l1d(0).unwrap().bytes, 48 * K);
    assert_eq!(m.l1i(0).unwrap().bytes, 32 * K);
    assert!(m.cpu(2).is_none());
    assert!(m.caches(2).is_empty());
}

#[test]
fn unified_l1_serves_as_both() {
    let m = Machine {
        cpus: vec![Cpu {
            cpu: 0,
            package: 0,
            caches: vec![cache(1, CacheKind::Unified, 16 * K, &[0])],
        }],
    };
    assert_eq!(m.l1d(0).unwrap().name(), "L1");
    assert_eq!(m.l1i(0).unwrap().name(), "L1");
    assert!(m.llc(0).is_none());
}

#[test]
fn sharers_are_the_other_online_cpus() {
    let m = clovertown();
    let l2 = m.upper_levels(2)[0].clone();
    assert_eq!(m.sharers(2, &l2), [3]);
    let n = niagara();
    let l2 = n.llc(3).unwrap().clone();
    assert_eq!(n.sharers(3, &l2), [0, 1, 2, 4, 5, 6, 7]);
    // A sharer the machine does not list (offline) cannot run anything.
    let mut b = this_box();
    b.cpus.truncate(1);
    let l3 = b.llc(0).unwrap().clone();
    assert!(b.sharers(0, &l3).is_empty());
}
