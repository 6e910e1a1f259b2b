//! The slice planner: which coscheduled sets run in the next time slice, and on which CPUs.
//!
//! Shared by the simulator ([`crate::sim`]) and the real user-space coscheduler, so both make
//! the same decisions.
//!
//! # What it implements
//!
//! Busse et al. (SAC'15) ran their sets on the coscheduling Linux kernel of Schönherr et al.
//! (§2.1): all tasks of a set run at the same time, and several sets share the host at once
//! when they fit (the paper's Figure 2b: "a part of the bigger machine can be scheduled in this
//! slot", §5). We do not have that kernel, so we plan time slices ourselves:
//!
//! * **Least attained service first.** The ready sets are ordered by the service charged to them
//!   so far ([`Planner::charge`]): *wall time* during which the set was scheduled, not CPU time
//!   (set size × wall time). Wall time is what equal-share gang scheduling of VMs gives — each VM
//!   (or set) gets an equal share of time whatever its width — and it is what makes the paper's
//!   expectations come out (§5: 33% for double and quad, 100% for single; see
//!   [`crate::predict`]). Charging CPU time instead would favour narrow sets.
//! * **Ties** are broken by a start index that rotates by one every slice, so sets with equal
//!   service alternate instead of the lowest index always winning.
//! * **First fit.** Walking that order, every set whose size fits the CPUs still free is added.
//!   The least-served ready set always fits an empty slice (no set is larger than the host), so
//!   it is always scheduled: no ready set starves.
//! * **Stable placement.** A member goes to the CPU it ran on last if that CPU is free, else to
//!   the lowest free CPU. Members that ran in the previous slice claim their CPUs first, so a
//!   set that continues from one slice to the next never moves. Fewer migrations for the real
//!   controller, fewer switches in the simulator. (Some migrations cannot be avoided: in the
//!   paper's double scenario three sets of 4 take turns on two halves of the host, and the set
//!   coming in finds only the half of the set that left.)
//!
//! # Where we differ from the paper
//!
//! The paper's kernel integrated coscheduling into CFS (per-set load balancing, hierarchical
//! runqueues); we plan whole-host slices of fixed length, which is the simplest scheme with the
//! same equal-share property. A set larger than the host is an error ([`PlanError::SetTooLarge`]),
//! never split silently: the caller decides how to split it.

use serde::{Deserialize, Serialize};

/// A coscheduled set: vCPUs (global indices) that must run at the same time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CoSet {
    /// The VM the set belongs to (for reports; the planner does not use it).
    pub vm: usize,
    /// Global vCPU indices.
    pub members: Vec<usize>,
}

/// One planned time slice.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Slice {
    /// Indices (into [`Planner::sets`]) of the sets chosen, in planning order.
    pub sets: Vec<usize>,
    /// `cpu.len() == cpus`; `cpu[c]` is the vCPU to run on CPU `c`, `None` = idle.
    pub cpu: Vec<Option<usize>>,
}

/// Why a set of coscheduled sets cannot be planned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error(
        "set {set} has {members} vCPUs but the host only {cpus} CPUs: it can never run all at \
         once (split it into smaller sets)"
    )]
    SetTooLarge {
        set: usize,
        members: usize,
        cpus: usize,
    },
    #[error("set {set} is empty")]
    EmptySet { set: usize },
    #[error("vCPU {vcpu} is in more than one set (or twice in one)")]
    DuplicateMember { vcpu: usize },
    #[error("the host has no CPUs")]
    NoCpus,
}

/// Plans slices over a fixed list of sets (see the module documentation for the rule).
#[derive(Debug, Clone)]
pub struct Planner {
    cpus: usize,
    sets: Vec<CoSet>,
    service: Vec<u64>,
    /// Per set, per member: the CPU it ran on last.
    last: Vec<Vec<Option<usize>>>,
    rotate: usize,
    // Scratch, kept to avoid allocating per slice.
    order: Vec<usize>,
    pending: Vec<(usize, usize)>,
    /// The previous slice's placement.
    prev: Vec<Option<usize>>,
}

fn validate(cpus: usize, sets: &[CoSet]) -> Result<(), PlanError> {
    if cpus == 0 {
        return Err(PlanError::NoCpus);
    }
    let mut all = Vec::new();
    for (i, s) in sets.iter().enumerate() {
        if s.members.is_empty() {
            return Err(PlanError::EmptySet { set: i });
        }
        if s.members.len() > cpus {
            return Err(PlanError::SetTooLarge {
                set: i,
                members: s.members.len(),
                cpus,
            });
        }
        all.extend_from_slice(&s.members);
    }
    all.sort_unstable();
    if let Some(w) = all.windows(2).find(|w| w[0] == w[1]) {
        return Err(PlanError::DuplicateMember { vcpu: w[0] });
    }
    Ok(())
}

impl Planner {
    /// A planner for a host of `cpus` CPUs; every set starts with zero service.
    pub fn new(cpus: usize, sets: Vec<CoSet>) -> Result<Planner, PlanError> {
        validate(cpus, &sets)?;
        Ok(Planner {
            cpus,
            service: vec![0; sets.len()],
            last: sets.iter().map(|s| vec![None; s.members.len()]).collect(),
            sets,
            rotate: 0,
            order: Vec::new(),
            pending: Vec::new(),
            prev: vec![None; cpus],
        })
    }

    pub fn cpus(&self) -> usize {
        self.cpus
    }

    pub fn sets(&self) -> &[CoSet] {
        &self.sets
    }

    /// Service charged to each set so far, in ns (parallel to [`Planner::sets`]).
    pub fn service_ns(&self) -> &[u64] {
        &self.service
    }

    /// Choose the sets of the next slice; `ready[s] == false` excludes set `s` (it has nothing
    /// runnable).
    ///
    /// # Panics
    /// If `ready.len() != self.sets().len()` (a caller bug).
    pub fn next_slice(&mut self, ready: &[bool]) -> Slice {
        assert_eq!(
            ready.len(),
            self.sets.len(),
            "next_slice: one ready flag per set"
        );
        let n = self.sets.len();
        let mut slice = Slice {
            sets: Vec::new(),
            cpu: vec![None; self.cpus],
        };
        if n == 0 {
            return slice;
        }
        let r = self.rotate % n;
        self.rotate = (r + 1) % n;
        self.order.clear();
        self.order.extend((0..n).filter(|&s| ready[s]));
        let service = &self.service;
        self.order
            .sort_unstable_by_key(|&s| (service[s], (s + n - r) % n));
        let mut free = self.cpus;
        for &s in &self.order {
            let k = self.sets[s].members.len();
            if k <= free {
                slice.sets.push(s);
                free -= k;
                if free == 0 {
                    break;
                }
            }
        }
        // Placement. Pass 0: members that ran on a CPU in the previous slice stay there (a
        // set that continues never moves). Pass 1: others go back to their last CPU if free.
        // Pass 2: the rest take the lowest free CPUs.
        self.pending.clear();
        for &s in &slice.sets {
            self.pending
                .extend((0..self.sets[s].members.len()).map(|i| (s, i)));
        }
        for pass in 0..2 {
            let mut k = 0;
            while k < self.pending.len() {
                let (s, i) = self.pending[k];
                let v = self.sets[s].members[i];
                let keep = match self.last[s][i] {
                    Some(c) if c < self.cpus && slice.cpu[c].is_none() => {
                        (pass == 1 || self.prev[c] == Some(v)).then_some(c)
                    }
                    _ => None,
                };
                if let Some(c) = keep {
                    slice.cpu[c] = Some(v);
                    self.pending.swap_remove(k);
                } else {
                    k += 1;
                }
            }
        }
        let mut c = 0;
        for &(s, i) in &self.pending {
            while slice.cpu[c].is_some() {
                c += 1;
            }
            slice.cpu[c] = Some(self.sets[s].members[i]);
            self.last[s][i] = Some(c);
        }
        self.prev.clone_from(&slice.cpu);
        slice
    }

    /// Account a slice that ran for `ns` to the sets chosen in it. Set indices that do not
    /// exist (a slice planned before [`Planner::replace_sets`]) are ignored.
    pub fn charge(&mut self, slice: &Slice, ns: u64) {
        for &s in &slice.sets {
            if let Some(x) = self.service.get_mut(s) {
                *x = x.saturating_add(ns);
            }
        }
    }

    /// Replace the sets (partial-auto regrouping). Each new set starts with the mean service of
    /// the old sets its members were in (a set none of whose members was in an old set gets the
    /// mean over all old sets), so no set jumps the queue; members keep their last CPU.
    pub fn replace_sets(&mut self, sets: Vec<CoSet>) -> Result<(), PlanError> {
        validate(self.cpus, &sets)?;
        let mut old_of = std::collections::BTreeMap::new();
        for (s, set) in self.sets.iter().enumerate() {
            for (i, &v) in set.members.iter().enumerate() {
                old_of.insert(v, (s, self.last[s][i]));
            }
        }
        let mean = |xs: &mut Vec<usize>, service: &[u64]| -> u64 {
            xs.sort_unstable();
            xs.dedup();
            if xs.is_empty() {
                return 0;
            }
            let sum: u128 = xs.iter().map(|&s| service[s] as u128).sum();
            (sum / xs.len() as u128) as u64
        };
        let overall = mean(&mut (0..self.sets.len()).collect(), &self.service);
        let mut service = Vec::with_capacity(sets.len());
        let mut last = Vec::with_capacity(sets.len());
        for set in &sets {
            let mut olds: Vec<usize> = set
                .members
                .iter()
                .filter_map(|v| old_of.get(v).map(|&(s, _)| s))
                .collect();
            service.push(if olds.is_empty() {
                overall
            } else {
                mean(&mut olds, &self.service)
            });
            last.push(
                set.members
                    .iter()
                    .map(|v| old_of.get(v).and_then(|&(_, c)| c))
                    .collect(),
            );
        }
        self.sets = sets;
        self.service = service;
        self.last = last;
        self.rotate %= self.sets.len().max(1);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn set(vm: usize, members: std::ops::Range<usize>) -> CoSet {
        CoSet {
            vm,
            members: members.collect(),
        }
    }

    /// Every vCPU at most once, exactly the members of the chosen sets, and they fit.
    fn check_slice(p: &Planner, sl: &Slice) {
        assert_eq!(sl.cpu.len(), p.cpus());
        let mut on: Vec<usize> = sl.cpu.iter().flatten().copied().collect();
        let mut want: Vec<usize> = sl
            .sets
            .iter()
            .flat_map(|&s| p.sets()[s].members.iter().copied())
            .collect();
        on.sort_unstable();
        want.sort_unstable();
        let n = on.len();
        on.dedup();
        assert_eq!(on.len(), n, "a vCPU on two CPUs: {sl:?}");
        assert_eq!(on, want);
    }

    #[test]
    fn errors() {
        assert_eq!(
            Planner::new(4, vec![set(0, 0..5)]).unwrap_err(),
            PlanError::SetTooLarge {
                set: 0,
                members: 5,
                cpus: 4
            }
        );
        assert_eq!(Planner::new(0, vec![]).unwrap_err(), PlanError::NoCpus);
        assert_eq!(
            Planner::new(4, vec![set(0, 0..2), set(0, 2..2)]).unwrap_err(),
            PlanError::EmptySet { set: 1 }
        );
        assert_eq!(
            Planner::new(4, vec![set(0, 0..2), set(1, 1..3)]).unwrap_err(),
            PlanError::DuplicateMember { vcpu: 1 }
        );
        let msg = PlanError::SetTooLarge {
            set: 0,
            members: 5,
            cpus: 4,
        }
        .to_string();
        assert!(msg.contains("5 vCPUs") && msg.contains("4 CPUs"), "{msg}");
        let mut p = Planner::new(4, vec![set(0, 0..2)]).unwrap();
        assert!(p.replace_sets(vec![set(0, 0..6)]).is_err());
        assert_eq!(p.sets().len(), 1, "a failed replace keeps the old sets");
    }

    #[test]
    fn fairness_of_equal_sets() {
        // 5 sets of 3 on 8 CPUs: two per slice, two CPUs idle.
        let sets: Vec<CoSet> = (0..5).map(|i| set(i, 3 * i..3 * i + 3)).collect();
        let mut p = Planner::new(8, sets).unwrap();
        for _ in 0..1000 {
            let sl = p.next_slice(&[true; 5]);
            check_slice(&p, &sl);
            assert_eq!(sl.sets.len(), 2);
            p.charge(&sl, 10);
            let s = p.service_ns();
            let (lo, hi) = (s.iter().min().unwrap(), s.iter().max().unwrap());
            assert!(hi - lo <= 10, "more than one slice apart: {s:?}");
        }
        assert_eq!(p.service_ns().iter().sum::<u64>(), 1000 * 2 * 10);
    }

    #[test]
    fn paper_double_shares_two_thirds() {
        // VM1 (8) split in two sets of 4, VM2 one set of 4: each set runs 2 slices of 3.
        let mut p = Planner::new(8, vec![set(0, 0..4), set(0, 4..8), set(1, 8..12)]).unwrap();
        for _ in 0..300 {
            let sl = p.next_slice(&[true; 3]);
            check_slice(&p, &sl);
            assert!(sl.cpu.iter().all(Option::is_some), "a CPU idle: {sl:?}");
            p.charge(&sl, 1);
        }
        assert_eq!(p.service_ns(), &[200, 200, 200]);
    }

    #[test]
    fn stable_placement() {
        // Double: a set that continues into the next slice keeps its CPUs; only the set coming
        // in may move (it finds the CPUs of the set that left).
        let mut p = Planner::new(8, vec![set(0, 0..4), set(0, 4..8), set(1, 8..12)]).unwrap();
        let mut prev = p.next_slice(&[true; 3]);
        for _ in 0..300 {
            p.charge(&prev, 1);
            let sl = p.next_slice(&[true; 3]);
            let continuing: Vec<usize> = sl
                .sets
                .iter()
                .copied()
                .filter(|s| prev.sets.contains(s))
                .collect();
            assert_eq!(continuing.len(), 1, "{prev:?} -> {sl:?}");
            for c in 0..8 {
                if prev.cpu[c].is_some_and(|v| p.sets()[continuing[0]].members.contains(&v)) {
                    assert_eq!(sl.cpu[c], prev.cpu[c], "{prev:?} -> {sl:?}");
                }
            }
            prev = sl;
        }
        // A set that runs in two consecutive slices keeps its CPUs.
        let mut p = Planner::new(4, vec![set(0, 0..2), set(1, 2..3)]).unwrap();
        let a = p.next_slice(&[true, true]);
        p.charge(&a, 1);
        let b = p.next_slice(&[true, true]);
        assert_eq!(a.cpu, b.cpu);
        // Only set 1 ready: its member returns to its CPU (2), not the lowest free (0).
        p.charge(&b, 1);
        let c = p.next_slice(&[false, true]);
        assert_eq!(c.cpu, vec![None, None, Some(2), None]);
    }

    #[test]
    fn not_ready_never_runs_and_empty_slices() {
        let mut p = Planner::new(4, vec![set(0, 0..2), set(1, 2..4)]).unwrap();
        for _ in 0..10 {
            let sl = p.next_slice(&[false, true]);
            assert_eq!(sl.sets, vec![1]);
            p.charge(&sl, 5);
        }
        let sl = p.next_slice(&[false, false]);
        assert!(sl.sets.is_empty() && sl.cpu.iter().all(Option::is_none));
        let mut none = Planner::new(2, vec![]).unwrap();
        assert_eq!(none.next_slice(&[]).cpu, vec![None, None]);
    }

    #[test]
    fn replace_keeps_service_and_cpus() {
        let mut p = Planner::new(8, vec![set(0, 0..8), set(1, 8..12)]).unwrap();
        let a = p.next_slice(&[true, true]);
        p.charge(&a, 100);
        let b = p.next_slice(&[true, true]);
        p.charge(&b, 50);
        assert_eq!(p.service_ns(), &[100, 50]);
        p.replace_sets(vec![
            set(0, 0..4),
            set(0, 4..8),
            set(1, 8..12),
            set(2, 20..21),
        ])
        .unwrap();
        assert_eq!(p.service_ns(), &[100, 100, 50, 75]);
        let c = p.next_slice(&[true, true, true, false]);
        // VM1's set (least service) first, on its old CPUs 0..4; then one half of VM0, which
        // cannot have its old CPUs 0..4 and goes to 4..8.
        assert_eq!(c.sets[0], 2);
        assert_eq!(&c.cpu[..4], &[Some(8), Some(9), Some(10), Some(11)]);
    }

    proptest! {
        #[test]
        fn no_starvation_and_valid_slices(
            cpus in 1usize..10,
            sizes in proptest::collection::vec(1usize..10, 0..8),
            ready in proptest::collection::vec(any::<bool>(), 8),
            charges in proptest::collection::vec(1000u64..2000, 64),
        ) {
            let mut next = 0;
            let sets: Vec<CoSet> = sizes
                .iter()
                .enumerate()
                .map(|(i, &k)| {
                    let k = k.min(cpus);
                    next += k;
                    set(i, next - k..next)
                })
                .collect();
            let n = sets.len();
            let ready = &ready[..n];
            let mut p = Planner::new(cpus, sets).unwrap();
            let mut ran = vec![false; n];
            // A ready set waits at most until every other set has caught up with it; with
            // charges within a factor 2 that is well under 4·n slices.
            for k in 0..(4 * n + 4) {
                let sl = p.next_slice(ready);
                check_slice(&p, &sl);
                let used: usize = sl.sets.iter().map(|&s| p.sets()[s].members.len()).sum();
                prop_assert!(used <= cpus);
                for &s in &sl.sets {
                    prop_assert!(ready[s], "set {} not ready but scheduled", s);
                    ran[s] = true;
                }
                // Work conserving: no ready set left out that would have fit.
                for (s, &r) in ready.iter().enumerate() {
                    if r && !sl.sets.contains(&s) {
                        prop_assert!(p.sets()[s].members.len() > cpus - used);
                    }
                }
                p.charge(&sl, charges[k % charges.len()]);
            }
            for s in 0..n {
                prop_assert_eq!(ran[s], ready[s], "set {} (ready {})", s, ready[s]);
            }
        }
    }
}
