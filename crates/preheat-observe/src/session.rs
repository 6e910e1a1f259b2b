//! One observation: refuse at once what cannot work, open the tracepoint events, drain their
//! ring buffers, and turn the stream into busy periods and a report.

use std::collections::BTreeMap;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::bpf;
use crate::decode::{self, Ids};
pub use crate::mechanism::Mechanism;
use crate::perf::{self, RingBuffer};
use crate::periods::{nr, parse_proc_syscall, Edge, Period, SchedPeriod, SysEvent, Tracker};
use crate::report::{summarize_threads, Report};
use crate::sampling::{Action, AwayTimes, Sampler, Sampling};
use crate::sockets;
use crate::tracefs;

/// What to observe.
#[derive(Debug, Clone)]
pub struct Options {
    pub pid: u32,
    pub port: u16,
    pub mechanism: Mechanism,
    /// Data pages per CPU ring buffer (a power of two).
    pub buffer_pages: usize,
    /// eBPF programs BTF-typed where the kernel's BTF allows (the default: measured cheaper,
    /// the crate docs); false for the untyped ones, which read the registers through a helper
    /// call each (`PREHEAT_OBSERVE_NO_BTF=1` asks for them too: to compare).
    pub btf: bool,
    /// A stamped record of every traced call, so that each period's first read and first write
    /// are timed (the demo's `--syscall-stages` asks for this); false (the default): the typed
    /// programs write one record per busy period ([`crate::periodprog`], measured cheaper: the
    /// crate docs) and periods carry no such times (`PREHEAT_OBSERVE_PER_CALL=1` asks for the
    /// per-call records too: to compare).
    pub per_call: bool,
    /// The period programs' and the scheduler form's per-thread slots (a power of two;
    /// [`crate::periodprog::SLOTS`] by default). Threads whose ids agree in the low bits share
    /// one: at the per-call cost while the other is inside a period (with the scheduler form,
    /// each call then a period of its own); the tests use 1, where every thread shares it.
    pub slots: u32,
    /// The syscall tracepoints instead of the scheduler form ([`crate::schedprog`], the
    /// default where the kernel loads it: measured cheaper for every process of the machine,
    /// the crate docs); `PREHEAT_OBSERVE_SYSCALLS=1` asks for them too: to compare. A record
    /// per call (`per_call`) and untyped programs (`btf` false) are syscall forms.
    pub syscalls: bool,
    /// Sample under sustained load ([`crate::sampling`]): the programs detached for a while
    /// each time the rate of records says the server is busy. `None` (the default): observe
    /// throughout; the outside preheater samples.
    pub sampling: Option<Sampling>,
}

impl Options {
    pub fn new(pid: u32, port: u16) -> Options {
        Options {
            pid,
            port,
            mechanism: Mechanism::Bpf,
            buffer_pages: 512,
            btf: true,
            per_call: false,
            slots: crate::periodprog::SLOTS,
            syscalls: false,
            sampling: None,
        }
    }
}

/// An attached observer: events are being written to its ring buffers.
pub struct Observer {
    opts: Options,
    ids: Ids,
    fds: Vec<OwnedFd>,
    /// Per fd in `fds`: an exit event (its filter keeps fewer syscalls).
    is_exit: Vec<bool>,
    /// CPU → index in `fds` of the event whose ring buffer the CPU's events share.
    leaders: BTreeMap<usize, usize>,
    rings: Vec<RingBuffer>,
    scratch: Vec<u8>,
    events: Vec<SysEvent>,
    /// The scheduler form's periods drained and not yet analysed.
    sched_periods: Vec<SchedPeriod>,
    /// Records drained (eBPF) or samples read (perf).
    records: u64,
    lost: u64,
    start_ns: u64,
    listening: Vec<u64>,
    connections: Vec<u64>,
    threads_attached: usize,
    tracefs_mounted_now: bool,
    /// System-wide: the thread ids in the filter, the pid threshold above which every thread
    /// passes it, and polls since the last refresh.
    known_tids: Vec<u32>,
    threshold: u32,
    polls: u32,
    /// The tracker, fed in time order as events settle ([`SETTLED_NS`]), made at the first.
    tracker: Option<Tracker>,
    /// [`Mechanism::Bpf`]: the attached programs and their ring buffer.
    bpf: Option<bpf::Attached>,
    /// Why the eBPF observer did not load, where it was asked for and perf samples ran instead.
    fallback: Option<String>,
    /// Sampling under load, where asked for.
    sampler: Option<Sampler>,
    /// Paused by the caller ([`Observer::pause`]).
    paused: bool,
    /// When the kernel's side was away (by the caller or the sampler): the periods that
    /// straddled such a time are dropped.
    away: AwayTimes,
}

/// How long after its stamp an event is surely drained: a record is committed within
/// microseconds of its stamp (the rest of a non-preemptible eBPF program or perf sample), so
/// whatever was stamped this long before a drain began was in that drain or an earlier one, and
/// can be analysed in order.
pub const SETTLED_NS: u64 = 1_000_000;

/// Whether the cheaper form of the eBPF programs is wanted: `Ok` unless the options say not
/// (`wanted` false: `otherwise` is why) or the environment variable `env` is set (to anything
/// but 0: to compare).
fn cheaper_form(wanted: bool, otherwise: &str, env: &str) -> Result<(), String> {
    if !wanted {
        Err(otherwise.to_string())
    } else if std::env::var_os(env).is_some_and(|v| v != "0") {
        Err(format!("{env} is set"))
    } else {
        Ok(())
    }
}

/// Whether the scheduler form is wanted: not where the syscall tracepoints are asked for, nor
/// where the syscall programs' own cheaper forms are not wanted (`typed`, `period`: a record
/// per call or untyped programs asked for).
fn sched_form(
    opts: &Options,
    typed: &Result<(), String>,
    period: &Result<u32, String>,
) -> Result<(u16, u32), String> {
    cheaper_form(!opts.syscalls, "asked for", "PREHEAT_OBSERVE_SYSCALLS")?;
    if let Err(why) = typed {
        return Err(format!("BTF-typed programs {why}"));
    }
    if let Err(why) = period {
        return Err(format!("a record per call {why}"));
    }
    Ok((opts.port, opts.slots))
}

/// The last pid the kernel allocated (in our pid namespace).
fn last_pid() -> Result<u32> {
    let s =
        std::fs::read_to_string("/proc/sys/kernel/ns_last_pid").context("reading ns_last_pid")?;
    s.trim().parse().context("parsing ns_last_pid")
}

/// The kernel takes a filter of at most a page (`strndup_user(…, PAGE_SIZE)`).
const FILTER_MAX: usize = 4000;

/// The kernel filter of the system-wide events: the traced syscalls, of threads `tids` or any
/// thread above `threshold`. A process with too many threads to name within `FILTER_MAX`
/// gets every thread from its lowest id on instead (more samples of other processes, dropped
/// by pid in user space).
pub fn system_wide_filter(tids: &[u32], threshold: u32, exit: bool) -> String {
    let mut pids: Vec<String> = tids.iter().map(|t| format!("common_pid == {t}")).collect();
    pids.push(format!("common_pid > {threshold}"));
    let f = format!("({}) && ({})", pids.join(" || "), id_filter(exit));
    if f.len() <= FILTER_MAX {
        return f;
    }
    let low = tids.iter().min().copied().unwrap_or(threshold);
    format!("(common_pid >= {low}) && ({})", id_filter(exit))
}

fn paranoid() -> String {
    std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

/// The thread ids of `pid`.
fn tids(pid: u32) -> Result<Vec<u32>> {
    let dir = format!("/proc/{pid}/task");
    let mut v: Vec<u32> = std::fs::read_dir(&dir)
        .with_context(|| format!("reading {dir}"))?
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    v.sort_unstable();
    Ok(v)
}

/// The kernel filter on the syscall number: every traced call at entry, those in
/// [`nr::EXITS`] at exit.
fn id_filter(exit: bool) -> String {
    let ids: &[i64] = if exit { &nr::EXITS } else { &nr::TRACED };
    ids.iter()
        .map(|n| format!("id == {n}"))
        .collect::<Vec<_>>()
        .join(" || ")
}

fn open_error(e: std::io::Error) -> anyhow::Error {
    let hint = match e.raw_os_error() {
        Some(libc::EACCES) | Some(libc::EPERM) => format!(
            " (not permitted: needs root or CAP_PERFMON; perf_event_paranoid is {})",
            paranoid()
        ),
        Some(libc::ENOENT) | Some(libc::ESRCH) => " (the thread exited meanwhile?)".into(),
        _ => String::new(),
    };
    anyhow::anyhow!("perf_event_open on a syscall tracepoint failed: {e}{hint}")
}

/// Refuse at once what cannot work: no such process, not root, no tracefs, no socket of the
/// process listening on the port.
fn preflight(opts: &Options) -> Result<(tracefs::Tracefs, sockets::PortFds)> {
    if !Path::new(&format!("/proc/{}", opts.pid)).is_dir() {
        bail!("no process {}", opts.pid);
    }
    if !perf::is_root() {
        bail!(
            "observing a process from outside needs root: eBPF programs on the kernel's tracepoints, or perf samples of its syscall tracepoints through perf_event_open and tracefs (perf_event_paranoid is {}); run preheat observe as root",
            paranoid()
        );
    }
    let t = tracefs::find_or_mount()?;
    let fds = sockets::snapshot(Path::new("/proc"), opts.pid, opts.port)?;
    if fds.listening.is_empty() {
        bail!(
            "process {} has no socket listening on TCP port {} (is the port right, or does a child process listen?)",
            opts.pid,
            opts.port
        );
    }
    Ok((t, fds))
}

impl Observer {
    /// Attach to `opts.pid`: checks first (said at once, with what to do), then the events.
    pub fn attach(opts: Options) -> Result<Observer> {
        let (t, fds) = preflight(&opts)?;
        let ids = tracefs::raw_syscall_ids(&t)?;
        let mut o = Observer {
            opts,
            ids,
            fds: Vec::new(),
            is_exit: Vec::new(),
            leaders: BTreeMap::new(),
            rings: Vec::new(),
            scratch: Vec::new(),
            events: Vec::new(),
            sched_periods: Vec::new(),
            records: 0,
            lost: 0,
            start_ns: 0,
            listening: fds.listening,
            connections: fds.connections,
            threads_attached: 0,
            tracefs_mounted_now: t.mounted_now,
            known_tids: Vec::new(),
            threshold: 0,
            polls: 0,
            tracker: None,
            bpf: None,
            fallback: None,
            sampler: None,
            paused: false,
            away: AwayTimes::default(),
        };
        match o.opts.mechanism {
            Mechanism::PerThread => o.open_per_thread()?,
            Mechanism::SystemWide => o.open_system_wide()?,
            Mechanism::Bpf => {}
        }
        o.start_ns = preheat_engine::time::now_ns();
        o.sampler = o.opts.sampling.map(|c| Sampler::new(c, o.start_ns));
        o.blocked_at_attach()?;
        if o.opts.mechanism == Mechanism::Bpf {
            // Attached after the blocked calls were read, as the perf events are enabled
            // after: the stream starts with them.
            // As much as the perf buffers would hold: `buffer_pages` per CPU.
            let size = o
                .opts
                .buffer_pages
                .saturating_mul(preheat_engine::sweep::page_size())
                .saturating_mul(preheat_engine::os::online_cpus())
                .next_power_of_two();
            let attached = if std::env::var_os("PREHEAT_OBSERVE_NO_BPF").is_some() {
                Err(anyhow::anyhow!("PREHEAT_OBSERVE_NO_BPF is set"))
            } else {
                let typed = cheaper_form(o.opts.btf, "not asked for", "PREHEAT_OBSERVE_NO_BTF");
                let period = cheaper_form(
                    !o.opts.per_call,
                    "asked for (each call's time)",
                    "PREHEAT_OBSERVE_PER_CALL",
                )
                .map(|()| o.opts.slots);
                let sched = sched_form(&o.opts, &typed, &period);
                let nrs = (&nr::TRACED[..], &nr::EXITS[..]);
                bpf::Attached::attach(o.opts.pid, nrs, size, sched, (typed, period))
            };
            match attached {
                Ok(a) => {
                    if a.syscalls().is_none() {
                        // The calls blocked at attach are the syscall tracker's: not needed.
                        o.events.clear();
                    }
                    o.bpf = Some(a);
                    o.threads_attached = tids(o.opts.pid)?.len();
                }
                Err(e) => {
                    o.fallback = Some(format!("{e:#}"));
                    o.opts.mechanism = Mechanism::SystemWide;
                    o.open_system_wide()?;
                }
            }
        }
        for fd in &o.fds {
            perf::enable(fd).map_err(open_error)?;
        }
        Ok(o)
    }

    /// The mechanism that runs (the one asked for, or the fallback).
    pub fn mechanism(&self) -> Mechanism {
        self.opts.mechanism
    }

    /// Why the eBPF observer did not load, where it was asked for.
    pub fn fallback(&self) -> Option<&str> {
        self.fallback.as_deref()
    }

    /// Why the eBPF programs are not BTF-typed (each register read is then a helper call);
    /// `None` where they are, or where no eBPF observer runs.
    pub fn untyped(&self) -> Option<&str> {
        self.bpf.as_ref().and_then(|b| b.untyped())
    }

    /// Why the eBPF programs write a record per call instead of one per busy period; `None`
    /// where they write one per period, or where no eBPF observer runs.
    pub fn per_call(&self) -> Option<&str> {
        self.bpf.as_ref().and_then(|b| b.per_call())
    }

    /// Why the eBPF programs are on the syscall tracepoints instead of the scheduler's and the
    /// socket layer's; `None` where the scheduler form runs, or where no eBPF observer runs.
    pub fn syscalls(&self) -> Option<&str> {
        self.bpf.as_ref().and_then(|b| b.syscalls())
    }

    /// What runs, one phrase for a caller's output: the mechanism, which eBPF programs and
    /// why, and why the eBPF observer did not load where it fell back.
    pub fn what_runs(&self) -> String {
        let m = self.mechanism().describe();
        let what = match (self.fallback(), &self.bpf) {
            (Some(why), _) => format!("{m} (the eBPF observer did not load: {why})"),
            (None, Some(b)) => format!(
                "{m}, {}",
                crate::report::programs(b.syscalls(), b.untyped(), b.per_call())
            ),
            (None, None) => m.to_string(),
        };
        match self.opts.sampling {
            Some(s) => format!("{what}; sampled under sustained load ({})", s.describe()),
            None => what,
        }
    }

    /// Open one event of the pair on `cpu`: the CPU's first becomes its ring buffer, the others
    /// write into it.
    fn open_one(
        &mut self,
        id: u16,
        pid: i32,
        cpu: usize,
        filter: &str,
        inherit: bool,
    ) -> Result<()> {
        let fd =
            perf::open_tracepoint(u64::from(id), pid, cpu as i32, inherit).map_err(open_error)?;
        perf::set_filter(&fd, filter).context("installing the tracepoint filter")?;
        self.is_exit.push(id == self.ids.exit);
        match self.leaders.get(&cpu).and_then(|i| self.fds.get(*i)) {
            Some(leader) => {
                perf::set_output(&fd, leader).context("redirecting an event to its CPU's buffer")?
            }
            None => {
                let ring = RingBuffer::map(&fd, self.opts.buffer_pages)
                    .context("mapping a ring buffer")?;
                self.rings.push(ring);
                self.leaders.insert(cpu, self.fds.len());
            }
        }
        self.fds.push(fd);
        Ok(())
    }

    fn open_per_thread(&mut self) -> Result<()> {
        let ncpu = preheat_engine::os::online_cpus();
        let mut done: Vec<u32> = Vec::new();
        // Threads created while we open are inherited from their creator when its events came
        // first; list again until no thread is new.
        for _ in 0..5 {
            let new: Vec<u32> = tids(self.opts.pid)?
                .into_iter()
                .filter(|t| !done.contains(t))
                .collect();
            if new.is_empty() {
                break;
            }
            for &tid in &new {
                for cpu in 0..ncpu {
                    for id in [self.ids.enter, self.ids.exit] {
                        let filter = id_filter(id == self.ids.exit);
                        match self.open_one(id, tid as i32, cpu, &filter, true) {
                            Err(_)
                                if !Path::new(&format!("/proc/{}/task/{tid}", self.opts.pid))
                                    .exists() => {}
                            r => r?,
                        }
                    }
                }
                done.push(tid);
            }
        }
        self.threads_attached = done.len();
        Ok(())
    }

    fn open_system_wide(&mut self) -> Result<()> {
        let ncpu = preheat_engine::os::online_cpus();
        self.threshold = last_pid()?;
        self.known_tids = tids(self.opts.pid)?;
        for cpu in 0..ncpu {
            for id in [self.ids.enter, self.ids.exit] {
                let filter =
                    system_wide_filter(&self.known_tids, self.threshold, id == self.ids.exit);
                self.open_one(id, -1, cpu, &filter, false)?;
            }
        }
        self.threads_attached = self.known_tids.len();
        Ok(())
    }

    /// System-wide: take the process's new threads into the filter and raise the threshold to
    /// the last pid allocated, so other new threads stop passing it. A pid wrap-around (the
    /// last pid below the threshold) keeps the old threshold: threads with low ids that the
    /// process creates meanwhile are seen only from the next refresh.
    fn refresh_filter(&mut self) -> Result<()> {
        let now = tids(self.opts.pid)?;
        let last = last_pid()?;
        let new: Vec<u32> = now
            .iter()
            .copied()
            .filter(|t| !self.known_tids.contains(t))
            .collect();
        if new.is_empty() && last <= self.threshold {
            return Ok(());
        }
        self.known_tids = now;
        self.threshold = self.threshold.max(last);
        let filters =
            [false, true].map(|x| system_wide_filter(&self.known_tids, self.threshold, x));
        for (fd, exit) in self.fds.iter().zip(&self.is_exit) {
            let f = &filters[usize::from(*exit)];
            perf::set_filter(fd, f).context("narrowing the tracepoint filter")?;
        }
        Ok(())
    }

    /// The calls the threads are blocked in now, as entries at the start: their exits are then
    /// paired (a blocking `accept` adopts its connection, a blocking read is a wait).
    fn blocked_at_attach(&mut self) -> Result<()> {
        for tid in tids(self.opts.pid)? {
            let p = format!("/proc/{}/task/{tid}/syscall", self.opts.pid);
            if let Some((n, args)) = std::fs::read_to_string(p)
                .ok()
                .as_deref()
                .and_then(parse_proc_syscall)
            {
                let what = Edge::Enter(args);
                self.events.push(SysEvent {
                    time_ns: self.start_ns,
                    tid,
                    nr: n,
                    what,
                });
            }
        }
        Ok(())
    }

    /// Stop the kernel's side until [`Observer::resume`]: the eBPF programs detached (the syscall
    /// tracepoints then cost the machine nothing), the perf events disabled. Calls made
    /// meanwhile are not seen; what was written before is still drained.
    pub fn pause(&mut self) -> Result<()> {
        self.paused = true;
        self.kernel_side(false)
    }

    /// Start the kernel's side again after [`Observer::pause`] (unless the sampler has it away:
    /// then when its pause ends).
    pub fn resume(&mut self) -> Result<()> {
        self.paused = false;
        if self.sampler.as_ref().is_some_and(Sampler::detached) {
            return Ok(());
        }
        self.kernel_side(true)
    }

    /// Attach or detach the kernel's side, noting when it was away.
    fn kernel_side(&mut self, on: bool) -> Result<()> {
        let attached = !self.away.away();
        if on == attached {
            return Ok(());
        }
        if on {
            let back = preheat_engine::time::now_ns();
            if let Some(b) = &mut self.bpf {
                b.reattach()?;
            }
            for fd in &self.fds {
                perf::enable(fd).map_err(open_error)?;
            }
            self.away.came_back(back);
        } else {
            if let Some(b) = &mut self.bpf {
                b.detach();
            }
            for fd in &self.fds {
                perf::disable(fd).map_err(open_error)?;
            }
            self.away.went_away(preheat_engine::time::now_ns());
        }
        Ok(())
    }

    /// The sampler's step after a drain that found `records`.
    fn sample(&mut self, now: u64, records: u64) {
        let Some(s) = &mut self.sampler else { return };
        let on = match s.step(now, records) {
            Action::Keep => return,
            Action::Detach => false,
            Action::Attach => true,
        };
        if !self.paused {
            // Detaching cannot fail for the programs; attaching again can (the process
            // gone): the report then shows what was seen until here.
            let _ = self.kernel_side(on);
        }
    }

    /// Drain every ring buffer (call often enough that none fills: every few ms under load);
    /// system-wide, every 20th call also refreshes the filter.
    pub fn poll(&mut self) {
        let now = preheat_engine::time::now_ns();
        let records_before = self.records;
        let pid = Some(self.opts.pid);
        for r in &mut self.rings {
            self.scratch.clear();
            let before = self.events.len();
            if r.drain(&mut self.scratch) > 0 {
                self.lost += decode::decode(&self.scratch, self.ids, pid, &mut self.events);
            }
            self.records += (self.events.len() - before) as u64;
        }
        if let Some(b) = &mut self.bpf {
            self.scratch.clear();
            if b.drain(&mut self.scratch) > 0 {
                self.records += if b.syscalls().is_none() {
                    decode::decode_sched(&self.scratch, &mut self.sched_periods)
                } else {
                    decode::decode_bpf(&self.scratch, &mut self.events)
                };
            }
        }
        // What was stamped well before this drain began is all here: analyse it now, so an
        // observation holds its periods, not every record (at 5 records per request, a
        // long observation of a busy server would otherwise grow by ~250 B per request).
        self.feed_upto(now.saturating_sub(SETTLED_NS));
        self.sample(now, self.records - records_before);
        self.polls += 1;
        if self.opts.mechanism == Mechanism::SystemWide && self.polls.is_multiple_of(20) {
            // A process that exited meanwhile: nothing to refresh; the report says what was seen.
            let _ = self.refresh_filter();
        }
    }

    /// Feed the tracker every pending event stamped before `upto` (all: `u64::MAX`) in time
    /// order (a stable sort: equal stamps keep the order they were drained in).
    fn feed_upto(&mut self, upto: u64) {
        self.events.sort_by_key(|e| e.time_ns);
        let n = self.events.partition_point(|e| e.time_ns < upto);
        let (listening, connections, bpf) = (&self.listening, &self.connections, &self.bpf);
        let tr = self.tracker.get_or_insert_with(|| {
            let mut t = Tracker::new();
            if bpf.as_ref().is_some_and(|b| b.per_call().is_none()) {
                t.unstamped_calls();
            }
            listening.iter().for_each(|fd| t.add_listener(*fd));
            connections.iter().for_each(|fd| t.add_connection(*fd));
            t
        });
        self.events.drain(..n).for_each(|e| tr.feed(&e));
        // The scheduler form's periods settle by their end but are analysed in the order they
        // started: a thread that hands a request over starts its period before the one it
        // wakes, which may sleep again first.
        self.sched_periods.sort_by_key(|p| p.end_ns);
        let n = self.sched_periods.partition_point(|p| p.end_ns < upto);
        let settled = self.sched_periods.get_mut(..n).unwrap_or_default();
        settled.sort_by_key(|p| p.start_ns);
        // A period open when the programs went away and closed after they came back spans
        // the time they were away (its slot kept it open): not a period.
        let away = &self.away;
        self.sched_periods
            .drain(..n)
            .filter(|p| !away.spanned(p.start_ns, p.end_ns))
            .for_each(|p| tr.feed_period(&p));
    }

    /// Events drained and not yet analysed (those of the last [`SETTLED_NS`] before the last
    /// drain, until the next).
    pub fn pending(&self) -> usize {
        self.events.len() + self.sched_periods.len()
    }

    /// Live analysis: drain the ring buffers, feed everything they held to the tracker (in
    /// time order) and return the busy periods that ended since the last call;
    /// [`Observer::finish`] then reports only the periods not taken. Events are ordered within
    /// one drain and across drains for all but the last [`SETTLED_NS`]: a hand-off between
    /// threads on two CPUs within that window can be seen one drain late.
    pub fn take_periods(&mut self) -> Vec<Period> {
        self.poll();
        self.feed_upto(u64::MAX);
        self.tracker
            .as_mut()
            .map(Tracker::take_periods)
            .unwrap_or_default()
    }

    /// Stop, drain and analyse.
    pub fn finish(mut self) -> Report {
        for fd in &self.fds {
            let _ = perf::disable(fd);
        }
        if let Some(b) = &mut self.bpf {
            b.detach();
        }
        let end_ns = preheat_engine::time::now_ns();
        self.poll();
        if let Some(b) = &self.bpf {
            self.lost += b.lost();
        }
        self.feed_upto(u64::MAX);
        let (periods, counts) = self.tracker.take().map(Tracker::finish).unwrap_or_default();
        Report {
            label: "measured",
            mechanism: self.opts.mechanism,
            mechanism_detail: self.opts.mechanism.describe(),
            fallback: self.fallback.clone(),
            untyped: self.untyped().map(str::to_string),
            per_call: self.per_call().map(str::to_string),
            syscalls: self.syscalls().map(str::to_string),
            records: self.records,
            pid: self.opts.pid,
            port: self.opts.port,
            start_ns: self.start_ns,
            end_ns,
            tracefs_mounted_now: self.tracefs_mounted_now,
            listening_fds: self.listening.clone(),
            connections_at_attach: self.connections.len(),
            threads_attached: self.threads_attached,
            lost_samples: self.lost,
            written_alone: self.bpf.as_ref().map_or(0, bpf::Attached::written_alone),
            sampled: self.sampler.as_ref().map(|s| s.sampled(end_ns)),
            counts,
            threads: summarize_threads(self.opts.pid, &periods),
            periods,
        }
    }
}

/// How often a caller that only collects drains the buffers ([`Observer::poll`]): each
/// buffer holds 512 pages per CPU (~2 MiB), at five records of a few dozen bytes per request
/// thousands of requests, so rarely — every drain is a wake-up of the caller's thread (measured
/// with `preheat bench observe`: the reader's thread took 55–123 ns of CPU per request just
/// waking every 5 ms, without draining).
pub const DRAIN_EVERY: Duration = Duration::from_millis(50);

/// Attach, drain every [`DRAIN_EVERY`] until `duration` has passed or `stop` says so, and
/// report.
pub fn observe(opts: Options, duration: Duration, stop: &dyn Fn() -> bool) -> Result<Report> {
    let mut o = Observer::attach(opts)?;
    let t0 = Instant::now();
    while t0.elapsed() < duration && !stop() {
        std::thread::sleep(DRAIN_EVERY.min(duration.saturating_sub(t0.elapsed())));
        o.poll();
    }
    Ok(o.finish())
}

#[cfg(test)]
mod tests {
    #[test]
    fn filter_text() {
        let f = super::system_wide_filter(&[10, 11], 500, false);
        assert!(f.starts_with(
            "(common_pid == 10 || common_pid == 11 || common_pid > 500) && (id == 0 || id == 1 ||"
        ));
        let many: Vec<u32> = (1000..1400).collect();
        let f = super::system_wide_filter(&many, 5000, false);
        assert!(f.starts_with("(common_pid >= 1000) && (id == 0 ||"), "{f}");
        assert!(f.len() <= super::FILTER_MAX);
        let f = super::system_wide_filter(&[10], 500, true);
        assert!(f.starts_with("(common_pid == 10 || common_pid > 500) && (id == 0 || id == 7 ||"));
    }
}
