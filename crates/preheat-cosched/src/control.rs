//! The controller loop: plan a slice, enforce it with real-time priorities and affinity, sleep,
//! measure, repeat; restore everything at the end. See the crate doc for the mechanism.

use std::collections::BTreeMap;
use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::cost::{Call, CostReport, Costs, Stage};
use anyhow::{bail, Context, Result};
use preheat_cosim::plan::{CoSet, Planner, Slice};
use preheat_cosim::scenario::Policy;
use preheat_engine::sched::{self, ThreadSched};
use preheat_model::stats::summarize;
use serde::Serialize;

use crate::journal::{self, Entry, Journal};
use crate::measure::{self, SetCorun};
use crate::ready;
use crate::thread::{RunClock, StateProbe, ThreadRef};

/// Priority of the thread(s) chosen for the current slice.
pub const PRIO_RUN: i32 = 2;
/// Priority of managed threads that must not run now (parked behind a chosen thread).
pub const PRIO_PARK: i32 = 1;
/// Priority of the controller thread itself (above every managed thread).
pub const PRIO_CONTROLLER: i32 = 10;

/// One virtual CPU: a thread of a "VM" process, or an idle vCPU (no thread: it never has work,
/// but full coscheduling still reserves a CPU for it).
#[derive(Debug, Clone, Serialize)]
pub struct Vcpu {
    pub vm: usize,
    pub thread: Option<ThreadRef>,
    pub name: String,
}

/// What to run and how.
#[derive(Debug, Clone)]
pub struct Config {
    /// Host CPUs the coscheduler owns (the planner's CPU c is `cpus[c]`).
    pub cpus: Vec<usize>,
    pub slice: Duration,
    pub policy: Policy,
    /// Stop after this long (also stops when every vCPU thread is gone).
    pub duration: Duration,
    /// The journal file (written before the first change).
    pub journal: PathBuf,
    /// Re-evaluate the sets this often (partial-auto; the paper: 5 s).
    pub regroup_every: Option<Duration>,
}

/// Sets replaced at a regroup.
#[derive(Debug, Clone, Serialize)]
pub struct Regroup {
    pub at_s: f64,
    pub sets: Vec<Vec<usize>>,
}

/// Everything measured in one run (all of it measured on this machine).
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub label: &'static str,
    pub policy: String,
    pub cpus: Vec<usize>,
    pub requested_slice_us: f64,
    pub slices: u64,
    /// Achieved slice lengths, µs.
    pub slice_us_p50: f64,
    pub slice_us_p99: f64,
    pub slice_us_max: f64,
    /// Controller time to enforce one slice (plan + syscalls), µs.
    pub apply_us_p50: f64,
    pub apply_us_p99: f64,
    /// Controller time to read every managed thread's readiness once (part of `apply_us`), µs,
    /// and how many threads a reading covers.
    pub ready_us_p50: f64,
    pub ready_us_p99: f64,
    pub ready_threads: usize,
    /// Scheduling syscalls issued.
    pub syscalls: u64,
    /// Where `apply_us` goes: each stage of a switch, each kind of scheduling call.
    pub cost: CostReport,
    /// Per set (members as vCPU indices): co-run estimate and lower bound.
    pub sets: Vec<SetReport>,
    /// Over all sets with ≥ 2 members: (estimate, lower bound).
    pub corun_fraction: Option<f64>,
    pub corun_lower: Option<f64>,
    /// Idle share of the coscheduler's CPUs over the run (`/proc/stat`).
    pub idle_cpu_share: Option<f64>,
    /// Share of CPU-slots the plans left idle (what the policy wastes by construction).
    pub planned_idle_share: f64,
    /// Run time of managed threads that were not chosen for the slice, over all managed run
    /// time (0 = perfect enforcement).
    pub leak_share: f64,
    /// Each vCPU's run time, s.
    pub vcpu_run_s: Vec<f64>,
    pub regroups: Vec<Regroup>,
    pub notes: Vec<String>,
    pub elapsed_s: f64,
}

/// One set's co-run numbers.
#[derive(Debug, Clone, Serialize)]
pub struct SetReport {
    pub members: Vec<usize>,
    pub windows: u64,
    pub corun_fraction: Option<f64>,
    pub corun_lower: Option<f64>,
}

/// Per-vCPU enforcement state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct State {
    cpu: Option<usize>,
    prio: Option<i32>,
}

struct Enforcer<'a> {
    cfg: &'a Config,
    vcpus: Vec<Vcpu>,
    state: Vec<State>,
    /// Each vCPU's stat line, re-read at every slice decision.
    probes: Vec<Option<StateProbe>>,
    /// Each vCPU's readiness at the last decision (`None`: no thread); see [`crate::ready`].
    runnable: Vec<Option<bool>>,
    syscalls: u64,
    notes: Vec<String>,
    /// Where the controller's time goes (see [`crate::cost`]).
    costs: Costs,
}

impl Enforcer<'_> {
    /// Apply `f`, a scheduling call of kind `call`, to vCPU `v`'s thread; a vanished thread is
    /// dropped (noted), other errors abort.
    fn sys(&mut self, v: usize, call: Call, f: impl FnOnce(u32) -> io::Result<()>) -> Result<bool> {
        let Some(t) = self.vcpus[v].thread else {
            return Ok(false);
        };
        self.syscalls += 1;
        let t0 = Instant::now();
        let r = f(t.tid);
        self.costs.call(call, t0);
        match r {
            Ok(()) => Ok(true),
            Err(e) if sched::is_gone(&e) || !t.alive() => {
                self.notes.push(format!(
                    "vCPU {v} ({}, tid {}) exited during the run; its set continues without it",
                    self.vcpus[v].name, t.tid
                ));
                self.vcpus[v].thread = None;
                Ok(false)
            }
            Err(e) => Err(e)
                .with_context(|| format!("changing the scheduling of thread {} (vCPU {v})", t.tid)),
        }
    }

    fn set_cpu(&mut self, v: usize, c: usize) -> Result<()> {
        if self.state[v].cpu != Some(c) {
            let cpu = self.cfg.cpus[c];
            if self.sys(v, Call::Affinity, |tid| {
                sched::set_thread_affinity(tid, &[cpu])
            })? {
                self.state[v].cpu = Some(c);
            }
        }
        Ok(())
    }

    fn set_prio(&mut self, v: usize, p: i32) -> Result<()> {
        if self.state[v].prio != Some(p)
            && self.sys(v, Call::Priority, |tid| {
                sched::set_thread_sched(tid, ThreadSched::fifo(p))
            })?
        {
            self.state[v].prio = Some(p);
        }
        Ok(())
    }

    /// Which vCPUs `slice` chooses (with a live thread).
    fn chosen(&self, slice: &Slice) -> Vec<bool> {
        let mut chosen = vec![false; self.vcpus.len()];
        for &v in slice.cpu.iter().flatten() {
            if self.vcpus[v].thread.is_some() {
                chosen[v] = true;
            }
        }
        chosen
    }

    /// Read every vCPU's readiness (one `pread` of its stat line each). A thread whose line
    /// cannot be read is not runnable (it has exited; the clocks drop it).
    fn read_runnable(&mut self) {
        for (v, probe) in self.probes.iter_mut().enumerate() {
            self.runnable[v] = match (&self.vcpus[v].thread, probe) {
                (Some(_), Some(p)) => Some(p.runnable().unwrap_or(false)),
                _ => None,
            };
        }
    }

    /// Read every thread's readiness, plan the next slice with `p` and demote what it does not
    /// choose (each stage timed).
    fn plan_and_demote(&mut self, p: &mut Planner) -> Result<Slice> {
        let t = Instant::now();
        self.read_runnable();
        self.costs.stage(Stage::Readiness, t);
        let t = Instant::now();
        let s = p.next_slice(&self.sets_ready(p.sets()));
        self.costs.stage(Stage::Plan, t);
        let t = Instant::now();
        self.demote(&s)?;
        self.costs.stage(Stage::Demote, t);
        Ok(s)
    }

    /// Which sets of `sets` have a runnable member (see [`ready::sets_ready`]).
    fn sets_ready(&self, sets: &[CoSet]) -> Vec<bool> {
        let members: Vec<&[usize]> = sets.iter().map(|s| &s.members[..]).collect();
        ready::sets_ready(&members, &self.runnable)
    }

    /// First half of a switch to `next`: every managed thread `next` does not choose is lowered
    /// and moved behind a chosen thread that is runnable ([`ready::park_cpus`]): off the CPUs
    /// `next` leaves idle and off those whose chosen thread is halted. Lowering a thread that
    /// was running stops it and brings its schedstat up to date, so the clocks read right after
    /// this are exact for every thread whose state changes (a thread that keeps running reads
    /// up to a tick stale; its lag moves between two of its own slices, never into a leak).
    fn demote(&mut self, next: &Slice) -> Result<()> {
        let chosen = self.chosen(next);
        let good = ready::park_cpus(&next.cpu, &chosen, &self.runnable);
        let park = good.iter().position(|&b| b).unwrap_or(0);
        for (v, &ch) in chosen.iter().enumerate() {
            if ch || self.vcpus[v].thread.is_none() {
                continue;
            }
            self.set_prio(v, PRIO_PARK)?;
            if !matches!(self.state[v].cpu, Some(c) if good[c]) {
                self.set_cpu(v, park)?;
            }
        }
        Ok(())
    }

    /// Second half: every thread `next` chooses is pinned to its CPU and raised.
    fn raise(&mut self, next: &Slice) -> Result<()> {
        let chosen = self.chosen(next);
        for (c, v) in next.cpu.iter().enumerate() {
            if let Some(v) = *v {
                if chosen[v] {
                    self.set_cpu(v, c)?;
                    self.set_prio(v, PRIO_RUN)?;
                }
            }
        }
        Ok(())
    }
}

/// Run the coscheduler. `sets` are the initial sets (ignored under `none`, except for measuring
/// their co-run fraction); `regroup` is called every `cfg.regroup_every` and may return new sets.
/// `stop` ends the run early (e.g. on SIGTERM). Everything changed is restored before this
/// returns, on success and on error.
pub fn run(
    cfg: &Config,
    vcpus: Vec<Vcpu>,
    sets: Vec<CoSet>,
    mut regroup: impl FnMut(&[Vcpu]) -> Option<Vec<CoSet>>,
    stop: &AtomicBool,
) -> Result<Report> {
    if cfg.cpus.is_empty() {
        bail!("no CPUs to coschedule on");
    }
    if cfg.slice < Duration::from_micros(500) {
        bail!(
            "a slice of {:?} is shorter than the controller can hold (each switch costs \
             ~100-200 µs here): use at least 0.5 ms",
            cfg.slice
        );
    }
    let managed = cfg.policy != Policy::None;
    let mut planner = if managed {
        Some(Planner::new(cfg.cpus.len(), sets.clone()).map_err(|e| anyhow::anyhow!("{e}"))?)
    } else {
        None
    };
    let mut journal = Journal::for_this_process();
    if managed {
        sched::realtime_permitted().map_err(|e| {
            anyhow::anyhow!(
                "no permission for real-time scheduling ({e}): the coscheduler enforces slices \
                 with SCHED_FIFO and needs CAP_SYS_NICE (run as root) or an RLIMIT_RTPRIO ≥ \
                 {PRIO_CONTROLLER}; only `--policy none` works without it"
            )
        })?;
        for v in &vcpus {
            if let Some(t) = v.thread {
                match Entry::capture(t) {
                    Ok(e) => journal.entries.push(e),
                    Err(e) if sched::is_gone(&e) => {}
                    Err(e) => return Err(e).context("reading a thread's scheduling state"),
                }
            }
        }
        journal
            .save(&cfg.journal)
            .with_context(|| format!("writing the journal {}", cfg.journal.display()))?;
    }
    let own_before = sched::thread_sched(0).ok();
    let mut enf = Enforcer {
        cfg,
        state: vec![
            State {
                cpu: None,
                prio: None
            };
            vcpus.len()
        ],
        probes: vcpus
            .iter()
            .map(|v| v.thread.as_ref().map(StateProbe::open))
            .collect(),
        runnable: vec![None; vcpus.len()],
        vcpus,
        syscalls: 0,
        notes: Vec::new(),
        costs: Costs::default(),
    };
    let result = (|| -> Result<Report> {
        if managed {
            sched::set_thread_sched(0, ThreadSched::fifo(PRIO_CONTROLLER))
                .context("raising the controller thread")?;
        }
        let _ = preheat_engine::os::set_timer_slack_ns(1);
        main_loop(cfg, &mut enf, planner.as_mut(), sets, &mut regroup, stop)
    })();
    // Restore, whatever happened.
    if managed {
        let outcomes = journal.restore();
        for o in &outcomes {
            if matches!(o, journal::Outcome::Failed { .. }) {
                eprintln!("preheat cosched: {o}");
            }
        }
        if outcomes
            .iter()
            .all(|o| !matches!(o, journal::Outcome::Failed { .. }))
        {
            let _ = journal::remove(&cfg.journal);
        }
        if let Some(s) = own_before {
            let _ = sched::set_thread_sched(0, s);
        }
    }
    result
}

/// The slice that is running: its plan, the member lists of its sets, and when it began.
type Running = (Slice, Vec<Vec<usize>>, Instant);

fn main_loop(
    cfg: &Config,
    enf: &mut Enforcer<'_>,
    mut planner: Option<&mut Planner>,
    initial_sets: Vec<CoSet>,
    regroup: &mut impl FnMut(&[Vcpu]) -> Option<Vec<CoSet>>,
    stop: &AtomicBool,
) -> Result<Report> {
    let managed = cfg.policy != Policy::None;
    let mut tally = Tally::open(&enf.vcpus);
    let mut sets = initial_sets;
    let cpu0 = measure::cpu_times(&cfg.cpus);
    let t0 = Instant::now();
    let mut next_regroup = cfg.regroup_every.map(|d| t0 + d);
    let mut prev: Option<Running> = None;
    let mut deadline = t0;
    loop {
        let now = Instant::now();
        let elapsed = now.duration_since(t0);
        let stopping = stop.load(Ordering::Relaxed)
            || elapsed >= cfg.duration
            || enf.vcpus.iter().all(|v| v.thread.is_none());
        if let (Some(p), Some((slice, _, started))) = (planner.as_mut(), &prev) {
            p.charge(slice, now.duration_since(*started).as_nanos() as u64);
        }
        // Regroup (partial-auto): takes effect with the slice planned now.
        if next_regroup.is_some_and(|at| !stopping && now >= at) {
            next_regroup = cfg.regroup_every.map(|d| now + d);
            if let Some(new_sets) = regroup(&enf.vcpus) {
                let planner = planner.as_deref_mut();
                let regroups = &mut tally.regroups;
                apply_regroup(enf, planner, &mut sets, regroups, new_sets, elapsed);
            }
        }
        // Plan the next slice and stop what it does not choose.
        let next = match (planner.as_mut(), stopping) {
            (Some(p), false) => Some(enf.plan_and_demote(p)?),
            _ => None,
        };
        let next_members: Vec<Vec<usize>> = match (&next, planner.as_ref()) {
            (Some(s), Some(p)) => s
                .sets
                .iter()
                .map(|&i| p.sets()[i].members.clone())
                .collect(),
            _ => Vec::new(),
        };
        let t = Instant::now();
        tally.read_clocks(enf);
        enf.costs.stage(Stage::Clocks, t);
        let t = Instant::now();
        if let Some((slice, members, started)) = &prev {
            let len = now.duration_since(*started).as_nanos() as u64;
            tally.account_slice(slice, len, managed);
            let measured = if managed {
                members.clone()
            } else {
                sets.iter().map(|s| s.members.clone()).collect()
            };
            tally.account_corun(&measured, &next_members, managed && !stopping, len);
            enf.costs.stage(Stage::Account, t);
        }
        if stopping {
            break;
        }
        let slice = match next {
            Some(s) => {
                let t = Instant::now();
                enf.raise(&s)?;
                enf.costs.stage(Stage::Raise, t);
                tally.count_planned(&s, &enf.vcpus);
                s
            }
            None => Slice {
                sets: Vec::new(),
                cpu: vec![None; cfg.cpus.len()],
            },
        };
        let applied = Instant::now();
        tally
            .apply_us
            .push(applied.duration_since(now).as_nanos() as f64 / 1e3);
        prev = Some((slice, next_members, now));
        tally.slices += 1;
        deadline += cfg.slice;
        if deadline < applied {
            // Fell behind (e.g. preempted): start counting from now rather than bursting.
            deadline = applied + cfg.slice;
        }
        std::thread::sleep(deadline.saturating_duration_since(Instant::now()));
    }
    Ok(tally.report(cfg, enf, cpu0, t0))
}

/// Replace the sets by `new_sets` (in the planner too, which may refuse them: noted, the
/// previous sets stay).
fn apply_regroup(
    enf: &mut Enforcer<'_>,
    planner: Option<&mut Planner>,
    sets: &mut Vec<CoSet>,
    regroups: &mut Vec<Regroup>,
    new_sets: Vec<CoSet>,
    elapsed: Duration,
) {
    let ok = match planner {
        Some(p) => p.replace_sets(new_sets.clone()).map_err(|e| e.to_string()),
        None => Ok(()),
    };
    match ok {
        Ok(()) => {
            regroups.push(Regroup {
                at_s: elapsed.as_secs_f64(),
                sets: new_sets.iter().map(|s| s.members.clone()).collect(),
            });
            *sets = new_sets;
        }
        Err(e) => enf.notes.push(format!(
            "regroup at {:.1} s refused ({e}); kept the previous sets",
            elapsed.as_secs_f64()
        )),
    }
}

/// What the loop measures from slice to slice, with the vCPUs' run clocks it reads.
struct Tally {
    clocks: Vec<Option<RunClock>>,
    /// Each vCPU's run time at the last reading.
    last: Vec<u64>,
    /// What each vCPU ran during the slice that just ended.
    d: Vec<u64>,
    total_run: Vec<u64>,
    corun: BTreeMap<Vec<usize>, SetCorun>,
    /// Open episodes (a set chosen in consecutive slices): per-member run time and length.
    episodes: BTreeMap<Vec<usize>, (Vec<u64>, u64)>,
    regroups: Vec<Regroup>,
    slice_us: Vec<f64>,
    apply_us: Vec<f64>,
    leak_ns: u64,
    all_ns: u64,
    planned_idle: u64,
    planned_slots: u64,
    slices: u64,
}

impl Tally {
    /// Open the run clock of every vCPU with a thread and read where each starts.
    fn open(vcpus: &[Vcpu]) -> Tally {
        let n = vcpus.len();
        let mut clocks: Vec<Option<RunClock>> = vcpus
            .iter()
            .map(|v| v.thread.as_ref().map(RunClock::open))
            .collect();
        let last: Vec<u64> = clocks
            .iter_mut()
            .map(|c| c.as_mut().and_then(|c| c.run_ns()).unwrap_or(0))
            .collect();
        Tally {
            clocks,
            last,
            d: vec![0; n],
            total_run: vec![0; n],
            corun: BTreeMap::new(),
            episodes: BTreeMap::new(),
            regroups: Vec::new(),
            slice_us: Vec::new(),
            apply_us: Vec::new(),
            leak_ns: 0,
            all_ns: 0,
            planned_idle: 0,
            planned_slots: 0,
            slices: 0,
        }
    }

    /// Read the clocks: what ran during the slice that just ended. A thread whose clock cannot
    /// be read has exited: it is dropped (noted).
    fn read_clocks(&mut self, enf: &mut Enforcer<'_>) {
        for v in 0..self.d.len() {
            let r = self.clocks[v].as_mut().and_then(|c| c.run_ns());
            self.d[v] = r.map_or(0, |r| r.saturating_sub(self.last[v]));
            match r {
                Some(r) => self.last[v] = r,
                None => {
                    if let Some(t) = enf.vcpus[v].thread.take() {
                        enf.notes.push(format!(
                            "vCPU {v} ({}, tid {}) exited during the run; its set continues \
                             without it",
                            enf.vcpus[v].name, t.tid
                        ));
                    }
                    self.clocks[v] = None;
                }
            }
            self.total_run[v] += self.d[v];
        }
    }

    /// The slice that just ended, `len` ns long: its length, and the run time of the vCPUs it
    /// did not choose (leaked; under `none` every vCPU counts as chosen).
    fn account_slice(&mut self, slice: &Slice, len: u64, managed: bool) {
        self.slice_us.push(len as f64 / 1e3);
        let mut chosen = vec![!managed; self.d.len()];
        for v in slice.cpu.iter().flatten() {
            chosen[*v] = true;
        }
        for (v, &d) in self.d.iter().enumerate() {
            self.all_ns += d;
            if !chosen[v] {
                self.leak_ns += d;
            }
        }
    }

    /// Co-run of the sets `measured` over the slice that just ended, `len` ns long: under a
    /// managed policy per episode (exact at both ends), under `none` per slice-long window
    /// (schedstat of running threads lags up to a tick there). Members without a thread (idle
    /// vCPUs, exited threads) never run: a set is measured over its live members. An episode
    /// ends unless the set runs again in the next slice (`next_members`, when `continuing`).
    fn account_corun(
        &mut self,
        measured: &[Vec<usize>],
        next_members: &[Vec<usize>],
        continuing: bool,
        len: u64,
    ) {
        let live = |m: &Vec<usize>| -> Vec<usize> {
            m.iter()
                .copied()
                .filter(|&v| self.clocks[v].is_some())
                .collect()
        };
        let measured: Vec<Vec<usize>> = measured.iter().map(live).collect();
        let next_members: Vec<Vec<usize>> = next_members.iter().map(live).collect();
        for m in &measured {
            if m.len() < 2 {
                continue;
            }
            let e = self
                .episodes
                .entry(m.clone())
                .or_insert_with(|| (vec![0; m.len()], 0));
            for (acc, &v) in e.0.iter_mut().zip(m.iter()) {
                *acc += self.d[v];
            }
            e.1 += len;
        }
        let (open, ended): (BTreeMap<_, _>, BTreeMap<_, _>) = std::mem::take(&mut self.episodes)
            .into_iter()
            .partition(|(m, _)| continuing && next_members.contains(m));
        self.episodes = open;
        for (m, (acc, len)) in ended {
            self.corun
                .entry(m.clone())
                .or_insert_with(|| SetCorun {
                    members: m,
                    ..Default::default()
                })
                .add(&acc, len);
        }
    }

    /// Count the CPU-slots slice `s` plans and those it leaves idle.
    fn count_planned(&mut self, s: &Slice, vcpus: &[Vcpu]) {
        self.planned_slots += s.cpu.len() as u64;
        self.planned_idle += s
            .cpu
            .iter()
            .filter(|v| !matches!(v, Some(v) if vcpus[*v].thread.is_some()))
            .count() as u64;
    }

    /// The run's report (the coscheduler's CPUs' idle time since `cpu0`, the run since `t0`).
    fn report(
        self,
        cfg: &Config,
        enf: &mut Enforcer<'_>,
        cpu0: measure::CpuTimes,
        t0: Instant,
    ) -> Report {
        let cpu1 = measure::cpu_times(&cfg.cpus);
        let elapsed_s = t0.elapsed().as_secs_f64();
        let su = summarize(&self.slice_us);
        let au = summarize(&self.apply_us);
        let ru = summarize(enf.costs.readiness());
        let set_list: Vec<SetCorun> = self.corun.into_values().collect();
        let overall = measure::overall(&set_list);
        Report {
            label: "measured",
            policy: cfg.policy.to_string(),
            cpus: cfg.cpus.clone(),
            requested_slice_us: cfg.slice.as_secs_f64() * 1e6,
            slices: self.slices,
            slice_us_p50: su.p50,
            slice_us_p99: su.p99,
            slice_us_max: su.max,
            apply_us_p50: au.p50,
            apply_us_p99: au.p99,
            ready_us_p50: ru.p50,
            ready_us_p99: ru.p99,
            ready_threads: enf.probes.iter().flatten().count(),
            syscalls: enf.syscalls,
            cost: enf.costs.report(),
            sets: set_list
                .iter()
                .map(|s| SetReport {
                    members: s.members.clone(),
                    windows: s.windows,
                    corun_fraction: s.fraction().map(|f| f.0),
                    corun_lower: s.fraction().map(|f| f.1),
                })
                .collect(),
            corun_fraction: overall.map(|f| f.0),
            corun_lower: overall.map(|f| f.1),
            idle_cpu_share: measure::idle_share(cpu0, cpu1),
            planned_idle_share: if self.planned_slots > 0 {
                self.planned_idle as f64 / self.planned_slots as f64
            } else {
                0.0
            },
            leak_share: if self.all_ns > 0 {
                self.leak_ns as f64 / self.all_ns as f64
            } else {
                0.0
            },
            vcpu_run_s: self.total_run.iter().map(|&ns| ns as f64 / 1e9).collect(),
            regroups: self.regroups,
            notes: std::mem::take(&mut enf.notes),
            elapsed_s,
        }
    }
}
