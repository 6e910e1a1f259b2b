//! The paper's experimental setup (§4) and the coscheduled sets of each policy.
//!
//! * [`Setup`]: a host of `cpus` CPUs, VMs of given sizes, and the *instances* (NPB runs) inside
//!   them. vCPUs are numbered globally: VM 0's vCPUs first, then VM 1's, and so on. A vCPU in no
//!   instance is idle (it never has work).
//! * [`Scenario`]: the paper's three loads of the bigger VM (Figure 5). The paper's VM1 is our VM
//!   0 (the first), its VM2 our VM 1. The scenario applies to the **first** VM; every other VM
//!   runs one instance on all its vCPUs (the paper's VM2; with more than two VMs, each extra VM is
//!   loaded the same way — our extension).
//!   - `single`: one instance on the first half of the first VM; the other half idle.
//!   - `double`: two instances, one per half.
//!   - `quad`: four instances, one per quarter.
//! * [`Policy`] and [`sets_for`]: full coscheduling (one set per VM, the baseline), partial
//!   coscheduling with the instances known in advance ("Partial Static"), with the instances
//!   detected at run time ("Partial Auto", §3), and no coscheduling at all (plain Linux).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::plan::CoSet;

/// The load of the first VM (the paper's Figure 5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scenario {
    Single,
    Double,
    Quad,
}

/// One parallel program (an NPB instance) pinned to some vCPUs of one VM.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Instance {
    pub vm: usize,
    /// Global vCPU indices, one thread on each.
    pub vcpus: Vec<usize>,
    /// Barrier-synchronised (most NPB kernels); `false` for EP-like kernels whose threads never
    /// wait for each other.
    pub sync: bool,
}

/// A host, its VMs and the instances running in them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Setup {
    pub cpus: usize,
    /// vCPUs per VM.
    pub vm_vcpus: Vec<usize>,
    pub instances: Vec<Instance>,
}

/// Why a setup cannot be built or simulated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScenarioError {
    #[error("the host needs at least one CPU")]
    NoCpus,
    #[error("the setup has no VMs")]
    NoVms,
    #[error("VM {vm} has 0 vCPUs")]
    EmptyVm { vm: usize },
    #[error(
        "VM {vm} has {vcpus} vCPUs but the host only {cpus} CPUs: it could never be fully \
         coscheduled (all its vCPUs at once)"
    )]
    VmLargerThanHost {
        vm: usize,
        vcpus: usize,
        cpus: usize,
    },
    #[error(
        "the {scenario} scenario splits the first VM into halves: it needs an even number of vCPUs, not {vcpus}"
    )]
    NotHalvable { scenario: Scenario, vcpus: usize },
    #[error("quad needs ≥ 4 vCPUs in the first VM (it has {vcpus})")]
    QuadTooSmall { vcpus: usize },
    #[error("quad splits the first VM into quarters: it needs a multiple of 4 vCPUs, not {vcpus}")]
    NotQuarterable { vcpus: usize },
    #[error("instance {instance} has no vCPUs")]
    EmptyInstance { instance: usize },
    #[error("instance {instance} names VM {vm}, which does not exist")]
    NoSuchVm { instance: usize, vm: usize },
    #[error("instance {instance} uses vCPU {vcpu}, which is not a vCPU of its VM {vm}")]
    ForeignVcpu {
        instance: usize,
        vcpu: usize,
        vm: usize,
    },
    #[error("vCPU {vcpu} is in two instances (or twice in one)")]
    SharedVcpu { vcpu: usize },
    #[error("VM {vm} runs no instance: the paper's metric needs a run time for every VM")]
    IdleVm { vm: usize },
}

impl fmt::Display for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Scenario::Single => "single",
            Scenario::Double => "double",
            Scenario::Quad => "quad",
        })
    }
}

/// An unknown scenario or policy name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} {given:?} (expected {expected})")]
pub struct ParseError {
    what: &'static str,
    given: String,
    expected: &'static str,
}

impl FromStr for Scenario {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Self, ParseError> {
        match s.trim().to_ascii_lowercase().as_str() {
            "single" => Ok(Scenario::Single),
            "double" => Ok(Scenario::Double),
            "quad" => Ok(Scenario::Quad),
            _ => Err(ParseError {
                what: "scenario",
                given: s.to_string(),
                expected: "single, double or quad",
            }),
        }
    }
}

impl Setup {
    /// The first global vCPU index of each VM, and one past the last vCPU.
    pub fn vm_starts(&self) -> Vec<usize> {
        let mut starts = Vec::with_capacity(self.vm_vcpus.len() + 1);
        let mut at = 0;
        for &n in &self.vm_vcpus {
            starts.push(at);
            at += n;
        }
        starts.push(at);
        starts
    }

    /// Total vCPUs over all VMs.
    pub fn total_vcpus(&self) -> usize {
        self.vm_vcpus.iter().sum()
    }

    /// The paper's setup: `scenario` in the first VM, one instance on all vCPUs of every other
    /// VM; every instance barrier-synchronised if `sync`.
    pub fn scenario(
        cpus: usize,
        vm_vcpus: &[usize],
        scenario: Scenario,
        sync: bool,
    ) -> Result<Setup, ScenarioError> {
        check_vms(cpus, vm_vcpus)?;
        let first = vm_vcpus[0];
        let (parts, used) = match scenario {
            Scenario::Single | Scenario::Double if !first.is_multiple_of(2) => {
                return Err(ScenarioError::NotHalvable {
                    scenario,
                    vcpus: first,
                })
            }
            Scenario::Single => (1, 2),
            Scenario::Double => (2, 2),
            Scenario::Quad if first < 4 => {
                return Err(ScenarioError::QuadTooSmall { vcpus: first })
            }
            Scenario::Quad if !first.is_multiple_of(4) => {
                return Err(ScenarioError::NotQuarterable { vcpus: first })
            }
            Scenario::Quad => (4, 4),
        };
        // `used` parts of the first VM, `parts` of them loaded.
        let width = first / used;
        let mut instances: Vec<Instance> = (0..parts)
            .map(|k| Instance {
                vm: 0,
                vcpus: (k * width..(k + 1) * width).collect(),
                sync,
            })
            .collect();
        let mut at = first;
        for (vm, &n) in vm_vcpus.iter().enumerate().skip(1) {
            instances.push(Instance {
                vm,
                vcpus: (at..at + n).collect(),
                sync,
            });
            at += n;
        }
        let setup = Setup {
            cpus,
            vm_vcpus: vm_vcpus.to_vec(),
            instances,
        };
        setup.validate()?;
        Ok(setup)
    }

    /// Check a (possibly hand-made) setup: VMs fit the host, instances are non-empty, use
    /// vCPUs of their own VM, do not overlap, and every VM runs at least one.
    pub fn validate(&self) -> Result<(), ScenarioError> {
        check_vms(self.cpus, &self.vm_vcpus)?;
        let starts = self.vm_starts();
        let mut owner = vec![false; self.total_vcpus()];
        let mut busy_vm = vec![false; self.vm_vcpus.len()];
        for (i, inst) in self.instances.iter().enumerate() {
            if inst.vcpus.is_empty() {
                return Err(ScenarioError::EmptyInstance { instance: i });
            }
            if inst.vm >= self.vm_vcpus.len() {
                return Err(ScenarioError::NoSuchVm {
                    instance: i,
                    vm: inst.vm,
                });
            }
            busy_vm[inst.vm] = true;
            for &v in &inst.vcpus {
                if !(starts[inst.vm]..starts[inst.vm + 1]).contains(&v) {
                    return Err(ScenarioError::ForeignVcpu {
                        instance: i,
                        vcpu: v,
                        vm: inst.vm,
                    });
                }
                if std::mem::replace(&mut owner[v], true) {
                    return Err(ScenarioError::SharedVcpu { vcpu: v });
                }
            }
        }
        if let Some(vm) = busy_vm.iter().position(|&b| !b) {
            return Err(ScenarioError::IdleVm { vm });
        }
        Ok(())
    }

    /// For each global vCPU, the instance running on it (`None`: idle).
    pub fn instance_of(&self) -> Vec<Option<usize>> {
        let mut of = vec![None; self.total_vcpus()];
        for (i, inst) in self.instances.iter().enumerate() {
            for &v in &inst.vcpus {
                of[v] = Some(i);
            }
        }
        of
    }
}

fn check_vms(cpus: usize, vm_vcpus: &[usize]) -> Result<(), ScenarioError> {
    if cpus == 0 {
        return Err(ScenarioError::NoCpus);
    }
    if vm_vcpus.is_empty() {
        return Err(ScenarioError::NoVms);
    }
    for (vm, &n) in vm_vcpus.iter().enumerate() {
        if n == 0 {
            return Err(ScenarioError::EmptyVm { vm });
        }
        if n > cpus {
            return Err(ScenarioError::VmLargerThanHost { vm, vcpus: n, cpus });
        }
    }
    Ok(())
}

/// How vCPUs are grouped for coscheduling.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Policy {
    /// No coscheduling: plain Linux (a model of CFS, see [`crate::sim`]).
    None,
    /// One set per VM with all its vCPUs (the paper's baseline).
    Full,
    /// One set per instance, known in advance (the paper's "Partial Static").
    PartialStatic,
    /// Sets detected at run time (the paper's "Partial Auto"): full until the first regrouping,
    /// then the instance sets, with the detector's overhead (see [`crate::sim::SimParams`]).
    PartialAuto,
}

impl Policy {
    pub const ALL: [Policy; 4] = [
        Policy::None,
        Policy::Full,
        Policy::PartialStatic,
        Policy::PartialAuto,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Policy::None => "none",
            Policy::Full => "full",
            Policy::PartialStatic => "partial-static",
            Policy::PartialAuto => "partial-auto",
        }
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Policy {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Self, ParseError> {
        let s2 = s.trim().to_ascii_lowercase();
        Policy::ALL
            .into_iter()
            .find(|p| p.name() == s2)
            .ok_or_else(|| ParseError {
                what: "policy",
                given: s.to_string(),
                expected: "none, full, partial-static or partial-auto",
            })
    }
}

/// The coscheduled sets of `policy`, ordered by their lowest vCPU.
///
/// * `Full`: one set per VM with **all** its vCPUs — idle ones included: they reserve CPUs
///   while the VM runs, which is the waste partial coscheduling removes.
/// * `PartialStatic`: one set per barrier-synchronised instance; one singleton per vCPU of an
///   unsynchronised instance (its threads need no coscheduling); one singleton per idle vCPU
///   (never ready, so it never takes a CPU).
/// * `PartialAuto`: the same sets as `PartialStatic`; the detection delay and overhead are
///   modelled by the simulator.
/// * `None`: no sets (no planner).
pub fn sets_for(setup: &Setup, policy: Policy) -> Vec<CoSet> {
    let mut sets = match policy {
        Policy::None => Vec::new(),
        Policy::Full => {
            let starts = setup.vm_starts();
            (0..setup.vm_vcpus.len())
                .map(|vm| CoSet {
                    vm,
                    members: (starts[vm]..starts[vm + 1]).collect(),
                })
                .collect()
        }
        Policy::PartialStatic | Policy::PartialAuto => {
            let mut sets = Vec::new();
            for inst in &setup.instances {
                if inst.sync {
                    sets.push(CoSet {
                        vm: inst.vm,
                        members: inst.vcpus.clone(),
                    });
                } else {
                    sets.extend(inst.vcpus.iter().map(|&v| CoSet {
                        vm: inst.vm,
                        members: vec![v],
                    }));
                }
            }
            let starts = setup.vm_starts();
            for (v, inst) in setup.instance_of().iter().enumerate() {
                if inst.is_none() {
                    let vm = starts.partition_point(|&s| s <= v) - 1;
                    sets.push(CoSet {
                        vm,
                        members: vec![v],
                    });
                }
            }
            sets
        }
    };
    for s in &mut sets {
        s.members.sort_unstable();
    }
    sets.sort_by_key(|s| s.members[0]);
    sets
}

/// `ready[s]`: set `s` has at least one vCPU that runs an instance (so it has work).
pub fn ready_of(setup: &Setup, sets: &[CoSet]) -> Vec<bool> {
    let of = setup.instance_of();
    sets.iter()
        .map(|s| {
            s.members
                .iter()
                .any(|&v| of.get(v).copied().flatten().is_some())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paper_scenarios() {
        let s = Setup::scenario(8, &[8, 4], Scenario::Single, true).unwrap();
        assert_eq!(s.instances.len(), 2);
        assert_eq!(s.instances[0].vcpus, vec![0, 1, 2, 3]);
        assert_eq!(s.instances[1].vcpus, vec![8, 9, 10, 11]);
        assert_eq!(s.instances[1].vm, 1);
        let d = Setup::scenario(8, &[8, 4], Scenario::Double, true).unwrap();
        assert_eq!(d.instances[1].vcpus, vec![4, 5, 6, 7]);
        let q = Setup::scenario(8, &[8, 4], Scenario::Quad, false).unwrap();
        assert_eq!(q.instances.len(), 5);
        assert_eq!(q.instances[3].vcpus, vec![6, 7]);
        assert!(!q.instances[0].sync);
        // More VMs: each extra one runs one instance on all its vCPUs.
        let m = Setup::scenario(8, &[8, 4, 2], Scenario::Double, true).unwrap();
        assert_eq!(m.instances[3].vcpus, vec![12, 13]);
    }

    #[test]
    fn scenario_errors_are_clear() {
        let e = |cpus, vms: &[usize], s| Setup::scenario(cpus, vms, s, true).unwrap_err();
        assert_eq!(e(0, &[1], Scenario::Single), ScenarioError::NoCpus);
        assert_eq!(e(8, &[], Scenario::Single), ScenarioError::NoVms);
        assert_eq!(
            e(8, &[8, 0], Scenario::Single),
            ScenarioError::EmptyVm { vm: 1 }
        );
        let big = e(8, &[8, 9], Scenario::Double).to_string();
        assert!(big.contains("never be fully coscheduled"), "{big}");
        assert!(e(8, &[7, 4], Scenario::Single)
            .to_string()
            .contains("even number"));
        let quad = e(2, &[2, 1], Scenario::Quad).to_string();
        assert!(
            quad.contains("quad needs ≥ 4 vCPUs in the first VM"),
            "{quad}"
        );
        assert!(e(8, &[6, 4], Scenario::Quad)
            .to_string()
            .contains("multiple of 4"));
    }

    #[test]
    fn validate_hand_made() {
        let mut s = Setup::scenario(8, &[8, 4], Scenario::Double, true).unwrap();
        s.instances[2].vcpus.push(3);
        assert_eq!(
            s.validate().unwrap_err(),
            ScenarioError::ForeignVcpu {
                instance: 2,
                vcpu: 3,
                vm: 1
            }
        );
        let mut s = Setup::scenario(8, &[8, 4], Scenario::Double, true).unwrap();
        s.instances[1].vcpus.push(0);
        assert_eq!(
            s.validate().unwrap_err(),
            ScenarioError::SharedVcpu { vcpu: 0 }
        );
        s.instances.truncate(1);
        s.instances[0].vcpus.pop();
        assert_eq!(s.validate().unwrap_err(), ScenarioError::IdleVm { vm: 1 });
    }

    #[test]
    fn names_round_trip() {
        for p in Policy::ALL {
            assert_eq!(p.to_string().parse::<Policy>().unwrap(), p);
            assert_eq!(
                serde_json::to_string(&p).unwrap(),
                format!("\"{}\"", p.name())
            );
        }
        assert_eq!("Quad".parse::<Scenario>().unwrap(), Scenario::Quad);
        assert_eq!(serde_json::to_string(&Scenario::Quad).unwrap(), "\"quad\"");
        let e = "fuller".parse::<Policy>().unwrap_err().to_string();
        assert!(
            e.contains("unknown policy") && e.contains("partial-static"),
            "{e}"
        );
    }

    #[test]
    fn sets_of_each_policy() {
        let s = Setup::scenario(8, &[8, 4], Scenario::Single, true).unwrap();
        let full = sets_for(&s, Policy::Full);
        assert_eq!(full.len(), 2);
        assert_eq!(full[0].members, (0..8).collect::<Vec<_>>());
        let part = sets_for(&s, Policy::PartialStatic);
        let members: Vec<Vec<usize>> = part.iter().map(|c| c.members.clone()).collect();
        assert_eq!(
            members,
            vec![
                vec![0, 1, 2, 3],
                vec![4],
                vec![5],
                vec![6],
                vec![7],
                vec![8, 9, 10, 11]
            ]
        );
        assert_eq!(part[5].vm, 1);
        assert_eq!(part[4].vm, 0);
        assert_eq!(
            ready_of(&s, &part),
            vec![true, false, false, false, false, true]
        );
        assert_eq!(sets_for(&s, Policy::PartialAuto), part);
        assert!(sets_for(&s, Policy::None).is_empty());
        let ep = Setup::scenario(4, &[4], Scenario::Double, false).unwrap();
        assert_eq!(sets_for(&ep, Policy::PartialStatic).len(), 4);
    }
}
