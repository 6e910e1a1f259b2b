//! partial-auto: the sets detected at run time, as the paper does (§4): SPCD (our agent's
//! communication detection, `preheat comm`) in every VM, the matrix reset after start-up, and
//! the grouping of §3 (eq. 1, t = 1.5) re-evaluated periodically (the paper: every 5 s).
//!
//! The agents' threads are normal (CFS) threads inside the VM processes, while the vCPU threads
//! the coscheduler manages are real-time: under load an agent answers only when real-time
//! throttling leaves normal tasks their 5% (up to ~1 s later here). So the queries run on a
//! thread of their own ([`Auto::spawn`]) and the controller picks up the newest sets without
//! ever waiting for an agent.
//!
//! Our rules where the paper is silent: each VM is grouped on its own (sets never span VMs, as
//! a VM's threads never share memory with another VM's); a set larger than the coscheduler's
//! CPUs is cut into consecutive pieces of at most that size, in the tree's leaf order (so
//! tasks the tree put side by side stay together); idle vCPUs (no thread) are singletons; a VM
//! whose agent does not answer keeps one set of all its vCPUs.
//!
//! Beyond the paper, for QEMU guests: with a [`NoiseFloor`] (the guest kernel's own sharing,
//! calibrated by the experiment), each VM's matrix is judged period by period (its increase
//! since the last regroup, less the noise its vCPU faults would give) and its sets change only
//! when two periods in a row agree ([`PeriodTracker`]); the report keeps the matrix as detected.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use preheat_cosched::control::Vcpu;
use preheat_cosim::plan::CoSet;
use preheat_group::floor::PeriodTracker;
use preheat_group::{group_with, CommMatrix, GroupMethod, NoiseFloor};

use crate::host::{vm_sets, LiveVm};
use preheat_launch::agentctl::{self, AgentClient};
use preheat_model::proto::Request;

/// What the regroup thread needs to know of a VM.
#[derive(Debug, Clone)]
pub struct VmView {
    pub name: String,
    pub first: usize,
    pub vcpus: usize,
}

impl VmView {
    pub fn of(vm: &LiveVm) -> VmView {
        VmView {
            name: vm.name.clone(),
            first: vm.first,
            vcpus: vm.spec.vcpus,
        }
    }
}

/// The agents of the VMs, and what the last grouping found.
pub struct Auto {
    clients: Vec<Option<AgentClient>>,
    method: GroupMethod,
    t: f64,
    floor: Option<NoiseFloor>,
    /// With a floor: each VM's matrix judged period by period, with hysteresis.
    trackers: Vec<PeriodTracker>,
    cpus: usize,
    /// Human-readable notes (a VM without an agent, a refused report).
    pub notes: Vec<String>,
    /// The last matrix of each VM (rows in vCPU order), for the report.
    pub matrices: Vec<Option<Vec<Vec<u64>>>>,
}

impl Auto {
    /// Connect to every VM's agent and reset its matrix (call once the VMs are past start-up).
    /// `own_run_dir` holds the agents of the VMs we started, `user_run_dir` those of VMs we
    /// attached to by pid.
    pub fn new(
        vms: &[LiveVm],
        own_run_dir: &Path,
        user_run_dir: &Path,
        (method, t, floor): (GroupMethod, f64, Option<NoiseFloor>),
        cpus: usize,
    ) -> Auto {
        let mut notes = Vec::new();
        let clients = vms
            .iter()
            .map(|vm| {
                let run_dir = if vm.started_by_us() {
                    own_run_dir
                } else {
                    user_run_dir
                };
                if !agentctl::discover(run_dir).contains(&vm.pid) {
                    notes.push(format!(
                        "{}: no agent answers in process {} (start it under `preheat cosched` or \
                         with the agent and PREHEAT_COMM=1): its vCPUs stay one set",
                        vm.name, vm.pid
                    ));
                    return None;
                }
                let mut c = AgentClient::connect(run_dir, vm.pid).ok()?;
                c.call(&Request::CommReset).ok()?;
                Some(c)
            })
            .collect();
        Auto {
            clients,
            method,
            t,
            floor,
            trackers: vec![PeriodTracker::default(); vms.len()],
            cpus,
            notes,
            matrices: vec![None; vms.len()],
        }
    }

    /// Regroup every `period` on a thread of its own, sending each new grouping; stops when
    /// the returned flag is set (or the receiver is gone) and hands back its state.
    pub fn spawn(
        mut self,
        vms: Vec<VmView>,
        vcpus: Vec<Vcpu>,
        period: Duration,
    ) -> (
        Receiver<Vec<CoSet>>,
        Arc<AtomicBool>,
        std::thread::JoinHandle<Auto>,
    ) {
        let (tx, rx): (Sender<Vec<CoSet>>, _) = std::sync::mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let h = std::thread::spawn(move || {
            let mut next = Instant::now() + period;
            while !flag.load(Ordering::Relaxed) {
                if Instant::now() < next {
                    std::thread::sleep(Duration::from_millis(20));
                    continue;
                }
                next = Instant::now() + period;
                if let Some(sets) = self.regroup(&vms, &vcpus) {
                    if tx.send(sets).is_err() {
                        break;
                    }
                }
            }
            self
        });
        (rx, stop, h)
    }

    /// Group every VM from its current matrix.
    pub fn regroup(&mut self, vms: &[VmView], vcpus: &[Vcpu]) -> Option<Vec<CoSet>> {
        let mut sets = Vec::new();
        for (i, vm) in vms.iter().enumerate() {
            let whole = vm_sets(i, vm.first, vm.vcpus, [(0..vm.vcpus).collect()]);
            let Some(c) = self.clients[i].as_mut() else {
                sets.extend(whole);
                continue;
            };
            let report = match c.comm_report() {
                Ok(r) => r,
                Err(e) => {
                    self.notes.push(format!("{}: no report ({e:#})", vm.name));
                    sets.extend(whole);
                    continue;
                }
            };
            // Rows of the report in vCPU order (threads the report does not know: no events).
            let ks: Vec<usize> = (0..vm.vcpus)
                .filter(|&k| vcpus[vm.first + k].thread.is_some())
                .collect();
            let row_of: Vec<Option<usize>> = ks
                .iter()
                .map(|&k| {
                    let tid = vcpus[vm.first + k].thread.map(|t| t.tid);
                    report.threads.iter().position(|t| Some(t.tid) == tid)
                })
                .collect();
            let m: Vec<Vec<u64>> = row_of
                .iter()
                .map(|a| {
                    row_of
                        .iter()
                        .map(|b| match (a, b) {
                            (Some(a), Some(b)) if a != b => report.matrix[*a][*b],
                            _ => 0,
                        })
                        .collect()
                })
                .collect();
            self.matrices[i] = Some(m.clone());
            let m = match &self.floor {
                Some(f) => self.trackers[i].period(f, &m, report.counted_faults()),
                None => m,
            };
            let Some(g) = CommMatrix::from_counts(&m)
                .ok()
                .and_then(|matrix| group_with(&matrix, self.method, self.t).ok())
            else {
                sets.extend(whole);
                continue;
            };
            let chosen = match self.floor {
                Some(_) => self.trackers[i].settle(g.sets),
                None => g.sets,
            };
            // Sets in vCPU indices, each cut into pieces the host can hold.
            let local = chosen.iter().flat_map(|s| {
                let members: Vec<usize> = s.iter().map(|&r| ks[r]).collect();
                members
                    .chunks(self.cpus.max(1))
                    .map(<[usize]>::to_vec)
                    .collect::<Vec<_>>()
            });
            sets.extend(vm_sets(i, vm.first, vm.vcpus, local));
        }
        Some(sets)
    }
}
