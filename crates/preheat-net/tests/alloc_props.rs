//! Allocator properties: a matching in every slot, maximality, completeness and the FIFO
//! fairness bound.

use preheat_net::alloc::Allocator;
use preheat_net::wire::Demand;
use proptest::prelude::*;
use std::collections::{HashMap, HashSet};

const SLOT: u64 = 1000;

#[derive(Debug, Clone)]
struct Case {
    /// (src, dst, packets), in add order; flow = index.
    demands: Vec<(u32, u32, u16)>,
    /// Demands are added in batches: before call k, the demands up to `cuts[k]`.
    cuts: Vec<usize>,
    window: usize,
}

fn arb_case() -> impl Strategy<Value = Case> {
    (
        2u32..10,
        proptest::collection::vec((0u32..10, 0u32..10, 1u16..6), 1..50),
        proptest::collection::vec(0usize..50, 0..5),
        1usize..100,
    )
        .prop_map(|(hosts, raw, mut cuts, window)| {
            let demands: Vec<_> = raw
                .into_iter()
                .map(|(s, d, p)| (s % hosts, d % hosts, p))
                .collect();
            for c in cuts.iter_mut() {
                *c = (*c).min(demands.len());
            }
            cuts.sort_unstable();
            cuts.push(demands.len());
            Case {
                demands,
                cuts,
                window,
            }
        })
}

fn demand(dst: u32, packets: u16, flow: usize) -> Demand {
    Demand {
        dst,
        dst_port: 7,
        packets,
        flow: flow as u64,
    }
}

/// A completed case: per demand the horizon slot when it was added; per flow the slots it
/// got; every (slot, src, dst) used.
struct Outcome {
    base: Vec<u64>,
    slots: HashMap<usize, Vec<u64>>,
    uses: Vec<(u64, u32, u32)>,
}

/// Runs the case to completion.
fn run(case: &Case) -> Outcome {
    let mut a = Allocator::new(SLOT as u32);
    let mut added = 0;
    let mut base = vec![0u64; case.demands.len()];
    let mut slots: HashMap<usize, Vec<u64>> = HashMap::new();
    let mut uses = Vec::new(); // (slot, src, dst)
    let mut calls = 0;
    let total: u64 = case.demands.iter().map(|d| u64::from(d.2)).sum();
    let mut cut_i = 0;
    loop {
        if cut_i < case.cuts.len() {
            let upto = case.cuts[cut_i];
            cut_i += 1;
            let horizon = a.horizon_ns() / SLOT;
            while added < upto {
                let (s, d, p) = case.demands[added];
                a.add(s, demand(d, p, added));
                base[added] = horizon;
                added += 1;
            }
        } else if a.pending_demands() == 0 {
            break;
        }
        for (src, d, start, n) in a.allocate(0, case.window) {
            assert_eq!(start % SLOT, 0);
            assert!(n >= 1);
            for k in 0..u64::from(n) {
                let slot = start / SLOT + k;
                slots.entry(d.flow as usize).or_default().push(slot);
                uses.push((slot, src, d.dst));
            }
        }
        calls += 1;
        assert!(
            calls <= total as usize + case.cuts.len() + 1,
            "allocation does not progress"
        );
    }
    Outcome { base, slots, uses }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn one_packet_per_sender_and_receiver_per_slot(case in arb_case()) {
        let uses = run(&case).uses;
        let mut senders = HashSet::new();
        let mut receivers = HashSet::new();
        for (slot, src, dst) in uses {
            prop_assert!(senders.insert((slot, src)), "host {} sends twice in slot {}", src, slot);
            prop_assert!(receivers.insert((slot, dst)), "host {} receives twice in slot {}", dst, slot);
        }
    }

    #[test]
    fn every_demand_is_allocated_exactly(case in arb_case()) {
        let slots = run(&case).slots;
        for (i, &(_, _, p)) in case.demands.iter().enumerate() {
            let got = slots.get(&i).map_or(0, |v| v.len());
            prop_assert_eq!(got, usize::from(p), "flow {}", i);
        }
    }

    /// A demand waits only for older demands sharing its source or destination: it is done
    /// within (their packets + its own) slots of the horizon at the time it was added.
    #[test]
    fn fifo_fairness_bound(case in arb_case()) {
        let Outcome { base, slots, .. } = run(&case);
        for (i, &(s, d, p)) in case.demands.iter().enumerate() {
            let older: u64 = case.demands[..i]
                .iter()
                .filter(|o| o.0 == s || o.1 == d)
                .map(|o| u64::from(o.2))
                .sum();
            let last = *slots[&i].iter().max().unwrap();
            prop_assert!(last >= base[i]);
            prop_assert!(
                last - base[i] < older + u64::from(p),
                "flow {} finished at {} (added at {}), bound {}",
                i, last, base[i], older + u64::from(p)
            );
        }
    }

    /// Greedy maximal matching: after one call, a demand left with packets had its source or
    /// its destination busy in every slot of the window.
    #[test]
    fn maximal_within_a_window(case in arb_case()) {
        let mut a = Allocator::new(SLOT as u32);
        for (i, &(s, d, p)) in case.demands.iter().enumerate() {
            a.add(s, demand(d, p, i));
        }
        let runs = a.allocate(0, case.window);
        let mut sends = HashSet::new();
        let mut recvs = HashSet::new();
        let mut got: HashMap<u64, u64> = HashMap::new();
        for (src, d, start, n) in runs {
            for k in 0..u64::from(n) {
                let slot = start / SLOT + k;
                prop_assert!(slot < case.window as u64);
                sends.insert((slot, src));
                recvs.insert((slot, d.dst));
            }
            *got.entry(d.flow).or_default() += u64::from(n);
        }
        for (i, &(s, d, p)) in case.demands.iter().enumerate() {
            if got.get(&(i as u64)).copied().unwrap_or(0) < u64::from(p) {
                for slot in 0..case.window as u64 {
                    prop_assert!(
                        sends.contains(&(slot, s)) || recvs.contains(&(slot, d)),
                        "flow {} left unserved while {}→{} was free in slot {}", i, s, d, slot
                    );
                }
            }
        }
    }
}

/// The oldest demand is never delayed: it gets slot 0 on.
#[test]
fn head_of_line_is_served_first() {
    let mut a = Allocator::new(10);
    for i in 0..100u32 {
        a.add(i % 3, demand(3 + i % 2, 2, i as usize));
    }
    let runs = a.allocate(0, 4);
    assert_eq!(runs[0], (0, demand(3, 2, 0), 0, 2));
}
