//! The "VMs" a coscheduler run manages: processes (started by us or attached by pid) whose
//! threads are the vCPUs, and the sets each policy derives from them.
//!
//! A VM has `vcpus` virtual CPUs. Its vCPU threads are the process's threads whose name starts
//! with `threads` (all threads if empty), in creation (tid) order: vCPU 0 is the first. A VM
//! may also be a real QEMU guest (`guest`, `preheat-guest`): its vCPU threads are QEMU's
//! `CPU n/TCG` threads; QEMU's other threads (main loop, RCU) are left to Linux, unpinned and
//! `SCHED_OTHER` (measured: see `GuestVm`). A VM with
//! fewer such threads than vCPUs has idle vCPUs (they never have work, but full coscheduling
//! still reserves a CPU for each, as it reserves the CPU of a halted vCPU). Global vCPU indices
//! number VM 0's vCPUs first, then VM 1's, and so on.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use preheat_cosched::control::Vcpu;
use preheat_cosched::thread::{self, ThreadRef};
use preheat_cosim::plan::CoSet;
use preheat_cosim::scenario::Policy;
use preheat_model::comm::CommConfig;
use serde::{Deserialize, Serialize};

use preheat_launch::launch::{attach_agent, Program};
use preheat_launch::preflight::Needs;

/// One VM of a run configuration (`preheat cosched run --config`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VmSpec {
    /// A name for reports (default `vmN`).
    #[serde(default)]
    pub name: Option<String>,
    /// Virtual CPUs.
    pub vcpus: usize,
    /// Start this program (argv) ...
    #[serde(default)]
    pub command: Vec<String>,
    /// ... or manage this running process ...
    #[serde(default)]
    pub pid: Option<u32>,
    /// ... or boot this QEMU guest.
    #[serde(default)]
    pub guest: Option<GuestVm>,
    /// Name prefix of the vCPU threads (empty: every thread of the process).
    #[serde(default)]
    pub threads: String,
    /// Coscheduled sets for `partial-static`, as vCPU indices within this VM; vCPUs in no set
    /// run alone.
    #[serde(default)]
    pub sets: Vec<Vec<usize>>,
}

/// A real VM: a QEMU guest running a bundled kernel (`preheat-guest`), booted when the run
/// starts (every guest of the run at once; each kernel starts when its guest is up) and powered
/// off when the kernel ends. Only its vCPU threads are coscheduled; QEMU's other threads stay
/// `SCHED_OTHER`, unpinned. Measured (a 2-vCPU guest running `mg` alone, `full`, 8 s windows
/// within one boot, 3 boots): 581, 522, 546 phases/s against 585, 466, 521 under plain Linux
/// before and 558, 446, 623 after, console lines at most 0.5–1.0 s late (a first 10 s run: up
/// to 2.8 s); with those threads at `SCHED_FIFO` 3, above the vCPUs: 578, 501, 583 phases/s,
/// at most 0.8–0.9 s late — no difference worth an extra real-time thread for one
/// compute-bound guest; guests competing for the CPUs, or doing I/O, are still to be measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GuestVm {
    /// The kernel: mg, cg, is or ep.
    pub kernel: String,
    /// Its threads [default: the VM's vCPUs].
    #[serde(default)]
    pub threads: Option<usize>,
    /// Independent instances of it [default: 1; 2 is the paper's "double"].
    #[serde(default)]
    pub instances: Option<usize>,
    /// How long it runs, seconds of guest time.
    pub seconds: f64,
    /// It starts computing this long after its threads exist, guest ms [default: 0].
    #[serde(default)]
    pub start_delay_ms: Option<u64>,
    /// Its progress reports come every this many guest ms [default: 1000].
    #[serde(default)]
    pub progress_ms: Option<u64>,
}

/// A run configuration: the VMs.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostSpec {
    pub vms: Vec<VmSpec>,
}

impl HostSpec {
    /// Check what can be checked before anything starts.
    pub fn validate(&self, cpus: usize) -> Result<()> {
        if self.vms.is_empty() {
            bail!("no VMs: the configuration needs at least one entry in \"vms\"");
        }
        for (i, vm) in self.vms.iter().enumerate() {
            let name = vm.name.clone().unwrap_or_else(|| format!("vm{i}"));
            if vm.vcpus == 0 {
                bail!("{name}: vcpus must be at least 1");
            }
            if vm.vcpus > cpus {
                bail!(
                    "{name} has {} vCPUs but the coscheduler owns {cpus} CPUs: a VM larger than \
                     the host can never be coscheduled as a whole (give it fewer vCPUs or use \
                     partial sets that fit)",
                    vm.vcpus
                );
            }
            let given = [!vm.command.is_empty(), vm.pid.is_some(), vm.guest.is_some()];
            if given.iter().filter(|g| **g).count() != 1 {
                bail!("{name}: give exactly one of \"command\", \"pid\" and \"guest\"");
            }
            let mut seen = vec![false; vm.vcpus];
            for s in &vm.sets {
                if s.is_empty() {
                    bail!("{name}: an empty set");
                }
                if s.len() > cpus {
                    bail!(
                        "{name}: the set {s:?} has {} members but there are only {cpus} CPUs; \
                         its members could never all run at once (split it)",
                        s.len()
                    );
                }
                for &m in s {
                    if m >= vm.vcpus {
                        bail!(
                            "{name}: set {s:?} names vCPU {m}, but the VM has {}",
                            vm.vcpus
                        );
                    }
                    if std::mem::replace(&mut seen[m], true) {
                        bail!("{name}: vCPU {m} is in two sets");
                    }
                }
            }
        }
        Ok(())
    }
}

/// A VM that is running: its process (if we started it) and its vCPU threads.
pub struct LiveVm {
    pub name: String,
    pub spec: VmSpec,
    pub pid: u32,
    pub program: Option<Program>,
    /// Standard output of a program we started.
    pub stdout: Option<PathBuf>,
    /// First global vCPU index.
    pub first: usize,
    pub threads: Vec<ThreadRef>,
    /// The QEMU guest we booted (stopped when dropped).
    pub guest: Option<preheat_guest::Guest>,
}

impl LiveVm {
    /// Whether this run started it (a program or a QEMU guest: its agent is in the run's own
    /// directory), rather than attaching to a running process by pid.
    pub fn started_by_us(&self) -> bool {
        self.program.is_some() || self.guest.is_some()
    }
}

/// How to start the VMs.
pub struct Start<'a> {
    /// Attach the agent with communication detection (partial-auto).
    pub comm: Option<&'a CommConfig>,
    /// Directory for the programs' standard output.
    pub out_dir: &'a Path,
    /// Run directory for agent sockets.
    pub run_dir: &'a Path,
}

/// Start (or attach to) every VM and find its vCPU threads.
pub fn start(spec: &HostSpec, how: &Start<'_>) -> Result<Vec<LiveVm>> {
    let mut out = Vec::new();
    let mut first = 0;
    for (i, vm) in spec.vms.iter().enumerate() {
        let name = vm.name.clone().unwrap_or_else(|| format!("vm{i}"));
        let (pid, program, stdout) = match vm.pid {
            _ if vm.guest.is_some() => (0, None, None),
            Some(pid) => {
                if thread::process_start_ticks(pid).is_none() {
                    bail!("{name}: no process {pid}");
                }
                (pid, None, None)
            }
            None => {
                let path = how.out_dir.join(format!("{name}.out"));
                let file = std::fs::File::create(&path)
                    .with_context(|| format!("creating {}", path.display()))?;
                let mut cmd = Command::new(&vm.command[0]);
                cmd.args(&vm.command[1..])
                    .stdin(Stdio::null())
                    .stdout(file)
                    .stderr(Stdio::inherit())
                    .env("PREHEAT_RUN_DIR", how.run_dir);
                if let Some(cfg) = how.comm {
                    attach_agent(&mut cmd, &vm.command[0], Needs::Load)
                        .with_context(|| format!("{name}: partial-auto needs the agent"))?;
                    preheat_launch::launch::agent_run_dir(&mut cmd, how.run_dir)?;
                    cmd.env("PREHEAT_COMM", "1")
                        .env("PREHEAT_COMM_CONFIG", serde_json::to_string(cfg)?);
                }
                let p = Program::spawn(&mut cmd)
                    .with_context(|| format!("{name}: cannot start {}", vm.command[0]))?;
                (p.pid(), Some(p), Some(path))
            }
        };
        out.push(LiveVm {
            name,
            spec: vm.clone(),
            pid,
            program,
            stdout,
            first,
            threads: Vec::new(),
            guest: None,
        });
        first += vm.vcpus;
    }
    boot_guests(&mut out, how)?;
    for vm in &mut out {
        vm.threads = wait_for_threads(vm)?;
    }
    Ok(out)
}

/// How long a guest may take to reach user space (~8–12 s under TCG here, two guests booting
/// at once) before it is booted again.
const BOOT_WAIT: Duration = Duration::from_secs(90);

/// Boot the VMs that are QEMU guests, all at once, and wait until each one's user space is up
/// (its kernel then starts); their vCPU threads are the `CPU n/…` threads. A guest that does not
/// come up within [`BOOT_WAIT`] is shut down and booted again, once, saying so on stderr (in one
/// suite run of some dozens a TCG guest's kernel hung at boot, "soft lockup - CPU#1 stuck for
/// 160s", before its init ran: not the workload's doing, and nothing measured yet).
fn boot_guests(vms: &mut [LiveVm], how: &Start<'_>) -> Result<()> {
    use preheat_guest::{Guest, GuestSpec, ImageSpec, Workload};
    let mut image = None;
    let mut specs = Vec::new();
    for vm in vms.iter_mut() {
        let Some(g) = vm.spec.guest.clone() else {
            continue;
        };
        let image = match &image {
            Some(i) => i,
            None => image.insert(preheat_guest::ensure_image(&ImageSpec::default())?),
        };
        let mut spec = GuestSpec::new(&vm.name, vm.spec.vcpus as u32);
        let threads = g.threads.unwrap_or(vm.spec.vcpus);
        let instances = g.instances.unwrap_or(1);
        let mut w = Workload::npb(&g.kernel, threads, g.seconds)
            .instances(instances)
            .start_delay_ms(g.start_delay_ms.unwrap_or(0));
        w.progress_ms = g.progress_ms.unwrap_or(w.progress_ms);
        spec.workload = Some(w);
        // partial-auto: host-side detection in QEMU (`preheat-guest::comm`): the guest's RAM
        // only, vCPU threads only, draws from the pages the guest wrote.
        if how.comm.is_some() {
            spec.comm = Some((
                preheat_model::comm::CommConfig::guest(spec.memory_mb),
                how.run_dir.to_path_buf(),
            ));
        }
        let guest = Guest::start(image, &spec)?;
        vm.pid = guest.pid();
        vm.spec.threads = "CPU ".into();
        vm.guest = Some(guest);
        specs.push(spec);
    }
    let mut specs = specs.into_iter();
    for vm in vms.iter_mut().filter(|vm| vm.guest.is_some()) {
        let spec = specs.next().context("a guest without its spec")?;
        let Some(Err(e)) = vm.guest.as_mut().map(|g| g.wait_up(BOOT_WAIT)) else {
            continue;
        };
        let why = format!("{e:#}");
        eprintln!(
            "preheat: {}: the guest did not come up ({}); booting it again, once",
            vm.name,
            why.lines().next().unwrap_or_default()
        );
        // Shut down (its drop) before the new one starts.
        vm.guest = None;
        let image = image.as_ref().context("a guest without its image")?;
        let mut guest = Guest::start(image, &spec)?;
        vm.pid = guest.pid();
        guest
            .wait_up(BOOT_WAIT)
            .with_context(|| format!("booted again after: {why}"))?;
        vm.guest = Some(guest);
    }
    Ok(())
}

/// Wait until the VM's thread list is stable for 300 ms (at most 10 s), then take it.
fn wait_for_threads(vm: &mut LiveVm) -> Result<Vec<ThreadRef>> {
    let t0 = Instant::now();
    let mut last: Vec<(u32, String)> = Vec::new();
    let mut stable_since = Instant::now();
    loop {
        if let Some(p) = vm.program.as_mut() {
            if let Ok(Some(st)) = p.child.try_wait() {
                bail!("{}: the program exited during start-up ({st})", vm.name);
            }
        }
        let now = thread::threads_named(vm.pid, &vm.spec.threads);
        if now != last {
            last = now;
            stable_since = Instant::now();
        } else if !last.is_empty() && stable_since.elapsed() >= Duration::from_millis(300) {
            break;
        }
        if t0.elapsed() > Duration::from_secs(10) {
            if last.is_empty() {
                bail!(
                    "{}: no thread named {:?}* appeared in process {} within 10 s",
                    vm.name,
                    vm.spec.threads,
                    vm.pid
                );
            }
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    if last.len() > vm.spec.vcpus {
        bail!(
            "{}: process {} has {} threads named {:?}* but the VM has only {} vCPUs (raise \
             \"vcpus\" or narrow \"threads\")",
            vm.name,
            vm.pid,
            last.len(),
            vm.spec.threads,
            vm.spec.vcpus
        );
    }
    Ok(last
        .iter()
        .filter_map(|(tid, _)| ThreadRef::of(vm.pid, *tid))
        .collect())
}

/// The controller's vCPU list.
pub fn vcpus(vms: &[LiveVm]) -> Vec<Vcpu> {
    let mut out = Vec::new();
    for (i, vm) in vms.iter().enumerate() {
        for k in 0..vm.spec.vcpus {
            let thread = vm.threads.get(k).copied();
            out.push(Vcpu {
                vm: i,
                thread,
                name: match thread {
                    Some(t) => format!("{}/vcpu{k}/tid{}", vm.name, t.tid),
                    None => format!("{}/vcpu{k}/idle", vm.name),
                },
            });
        }
    }
    out
}

/// One set per VM (every vCPU, idle ones included).
pub fn full_sets(vms: &[LiveVm]) -> Vec<CoSet> {
    vms.iter()
        .enumerate()
        .flat_map(|(i, vm)| vm_sets(i, vm.first, vm.spec.vcpus, [(0..vm.spec.vcpus).collect()]))
        .collect()
}

/// The configured sets of each VM; vCPUs in no set run alone.
pub fn static_sets(vms: &[LiveVm]) -> Vec<CoSet> {
    vms.iter()
        .enumerate()
        .flat_map(|(i, vm)| vm_sets(i, vm.first, vm.spec.vcpus, vm.spec.sets.iter().cloned()))
        .collect()
}

/// The sets of VM `vm` (global vCPUs `first .. first + vcpus`) from sets of its own vCPU
/// indices; vCPUs in no set run alone.
pub fn vm_sets(
    vm: usize,
    first: usize,
    vcpus: usize,
    local: impl IntoIterator<Item = Vec<usize>>,
) -> Vec<CoSet> {
    let mut covered = vec![false; vcpus];
    let mut out = Vec::new();
    for s in local {
        for &m in &s {
            covered[m] = true;
        }
        out.push(CoSet {
            vm,
            members: s.iter().map(|m| first + m).collect(),
        });
    }
    out.extend((0..vcpus).filter(|&k| !covered[k]).map(|k| CoSet {
        vm,
        members: vec![first + k],
    }));
    out
}

/// The sets a policy starts with (partial-auto starts fully coscheduled until its first
/// regroup; `none` measures the co-run fraction of the static sets, or of whole VMs).
pub fn initial_sets(vms: &[LiveVm], policy: Policy) -> Result<Vec<CoSet>> {
    Ok(match policy {
        Policy::Full | Policy::PartialAuto => full_sets(vms),
        Policy::PartialStatic => {
            if vms.iter().all(|v| v.spec.sets.is_empty()) {
                bail!(
                    "partial-static needs the sets: give \"sets\" for the VMs (vCPU indices \
                     within the VM), or use partial-auto to detect them"
                );
            }
            static_sets(vms)
        }
        Policy::None => {
            if vms.iter().any(|v| !v.spec.sets.is_empty()) {
                static_sets(vms)
            } else {
                full_sets(vms)
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vm(vcpus: usize, sets: Vec<Vec<usize>>) -> VmSpec {
        VmSpec {
            name: None,
            vcpus,
            command: vec!["true".into()],
            pid: None,
            guest: None,
            threads: String::new(),
            sets,
        }
    }

    #[test]
    fn validate_refuses_what_cannot_be_coscheduled() {
        let ok = HostSpec {
            vms: vec![vm(2, vec![vec![0, 1]]), vm(1, vec![])],
        };
        assert!(ok.validate(2).is_ok());
        assert!(HostSpec { vms: vec![] }.validate(2).is_err());
        assert!(HostSpec {
            vms: vec![vm(3, vec![])]
        }
        .validate(2)
        .is_err());
        assert!(HostSpec {
            vms: vec![vm(2, vec![vec![0], vec![0]])]
        }
        .validate(2)
        .is_err());
        assert!(HostSpec {
            vms: vec![vm(2, vec![vec![2]])]
        }
        .validate(2)
        .is_err());
        let mut both = vm(1, vec![]);
        both.pid = Some(1);
        assert!(HostSpec { vms: vec![both] }.validate(2).is_err());
    }

    #[test]
    fn vm_sets_leave_uncovered_vcpus_alone_in_global_indices() {
        let sets = vm_sets(1, 4, 3, [vec![0, 2]]);
        let members: Vec<Vec<usize>> = sets.iter().map(|s| s.members.clone()).collect();
        assert_eq!(members, vec![vec![4, 6], vec![5]]);
        assert!(sets.iter().all(|s| s.vm == 1));
    }
}
