//! One run: allocate the instances' regions, start the ranks, announce them, release them
//! together after the start delay, collect their results through the join handles.
//!
//! This is the part of an NPB binary that OpenMP provides (thread team, start-up, join);
//! the "VM mode" — `instances` independent copies in one process — stands in for the paper's
//! single/double/quad scenarios (Busse et al. §4), where several NAS instances ran in one VM.
//! Thread `j` is rank `j mod n` of instance `j / n`, `n = threads / instances`.
//!
//! **What is shared, and when.** Before the announcement ([`Ready`]) the main thread allocates
//! and zeroes every region and the ranks register through one channel; right after it each
//! rank receives its start time on its own channel and sleeps until then. From the start time
//! until a rank's last iteration ends, the rank touches only its own pages (stack, private
//! buffer) and its instance's region, and the main thread waits on a "done" channel that the
//! ranks write only after their last iteration (it joins the threads only then, since
//! `pthread_join` reads the joined thread's own stack pages). Results come back through the
//! join handles. A detector that resets its matrix after the start delay and stops before the
//! end therefore sees only the designed sharing. With [`Config::progress`] the main thread also
//! reads each instance's barrier generation once per period ([`Progress`]): one more reader of a
//! page the instance's ranks share anyway.

use std::ops::Range;
use std::sync::mpsc::{self, Receiver, Sender};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use preheat_engine::os;
use serde::{Deserialize, Serialize};

use crate::barrier::{self, Barrier};
use crate::config::{thread_name, Config};
use crate::exchange::{Exchange, PageSets};
use crate::kernels::{self, Outcome, RankSpec};
use crate::layout::{pair_page, Region, BARRIER_PAGE};
use crate::pattern::Pattern;

/// One thread as announced.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ThreadInfo {
    /// Global thread index `j`.
    pub index: usize,
    /// Kernel thread id.
    pub tid: u32,
    /// Thread name.
    pub name: String,
    /// Instance index.
    pub instance: usize,
    /// Rank within the instance.
    pub rank: usize,
}

/// The announcement made once every rank exists, before the start delay.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Ready {
    /// Process id.
    pub pid: u32,
    /// All threads, by index.
    pub threads: Vec<ThreadInfo>,
}

/// Barrier phases completed so far, reported every [`Config::progress`] during a run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Progress {
    /// Milliseconds since the common start time.
    pub t_ms: u64,
    /// Barrier phases each instance has completed, by instance.
    pub phases: Vec<u64>,
}

/// What one rank did.
#[derive(Debug, Clone)]
pub struct ThreadReport {
    /// Identity.
    pub info: ThreadInfo,
    /// Iterations and checksum.
    pub outcome: Outcome,
    /// CPU time used from just before the announcement (the start delay is spent asleep) to
    /// the end (`/proc/thread-self/schedstat`).
    pub cpu_ns: Option<u64>,
    /// Address range of the rank's private pages.
    pub private: Range<usize>,
    /// Shared pages written and read, with [`Config::trace_pages`].
    pub pages: Option<PageSets>,
    /// Why pinning failed, with [`Config::pin`].
    pub pin_error: Option<String>,
}

/// A mailbox page (and the shared pages after it) and the two threads it is designed for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mailbox {
    /// Page address.
    pub page: usize,
    /// Pages from `page` on that only this pair touches: the mailbox and its shared pages.
    pub pages: usize,
    /// Global indices of the pair.
    pub threads: (usize, usize),
}

impl Mailbox {
    /// The addresses of its pages: the mailbox page and the shared pages after it.
    pub fn page_addrs(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.pages).map(|i| self.page + i * crate::layout::PAGE_BYTES)
    }
}

/// Where an instance's shared region lay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegionInfo {
    /// Instance index.
    pub instance: usize,
    /// Address range of the whole region.
    pub range: Range<usize>,
    /// Address of the barrier page.
    pub barrier_page: usize,
    /// The mailbox pages, by edge.
    pub mailboxes: Vec<Mailbox>,
}

/// Everything a finished run knows.
#[derive(Debug, Clone)]
pub struct RunOutcome {
    /// The configuration run.
    pub config: Config,
    /// The instances' (common) communication graph.
    pub pattern: Pattern,
    /// The instances' regions.
    pub regions: Vec<RegionInfo>,
    /// Per thread, by index.
    pub threads: Vec<ThreadReport>,
    /// From the common start time to the end of the last rank's last iteration.
    pub wall: Duration,
    /// Process id.
    pub pid: u32,
}

impl RunOutcome {
    /// The run's checksum: the threads' checksums folded in index order.
    pub fn checksum(&self) -> u64 {
        self.threads
            .iter()
            .fold(0, |h, t| kernels::mix(h, t.outcome.checksum))
    }

    /// Fewest iterations any thread completed.
    pub fn iterations(&self) -> u64 {
        self.threads
            .iter()
            .map(|t| t.outcome.iterations)
            .min()
            .unwrap_or(0)
    }
}

/// A rank's message to the main thread once it is set up.
struct Registration {
    index: usize,
    tid: u32,
    pin_error: Option<String>,
}

/// A rank's channels to the main thread (each used only outside the measured run).
struct Channels {
    /// The rank's global index.
    index: usize,
    /// Registration, shared by all ranks, used before the announcement.
    register: Sender<Registration>,
    /// The start time, this rank's own channel, received before the start delay.
    go: Receiver<Instant>,
    /// "Done", shared by all ranks, sent after the last iteration, so the main thread does not
    /// wait in `pthread_join` (which reads the rank's own stack pages) while the rank runs.
    done: Sender<()>,
}

/// What a rank returns through its join handle.
struct Finished {
    outcome: Outcome,
    end: Instant,
    cpu_ns: Option<u64>,
    private: Range<usize>,
    pages: Option<PageSets>,
}

/// Nanoseconds the calling thread has spent on a CPU (first field of its schedstat).
fn thread_cpu_ns() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    s.split_whitespace().next()?.parse().ok()
}

/// The body of one rank's thread.
fn rank_main(
    config: &Config,
    spec: RankSpec,
    region: &Region,
    pattern: &Pattern,
    channels: Channels,
) -> Option<Finished> {
    let index = channels.index;
    let tid = os::gettid();
    let pin_error = if config.pin {
        let cpu = index % os::online_cpus();
        os::pin_current_thread(cpu)
            .err()
            .map(|e| format!("thread {index}: pinning to CPU {cpu} failed: {e}"))
    } else {
        None
    };
    // Everything the loop needs is set up here, before the announcement: the private pages
    // (allocated by this thread) and the slices of the region (cached on this stack).
    let mut private = kernels::setup(&spec, &pattern.links(spec.rank));
    let barrier = Barrier::new(region.barrier_page(), spec.ranks);
    let mut x = Exchange::new(region, barrier, spec.rank, config.limit, config.trace_pages);
    // Read before the start: reading allocates, and a heap arena may be shared by threads.
    let cpu_start = thread_cpu_ns();
    channels
        .register
        .send(Registration {
            index,
            tid,
            pin_error,
        })
        .ok()?;
    drop(channels.register);
    let start_at = channels.go.recv().ok()?;
    thread::sleep(start_at.saturating_duration_since(Instant::now()));
    x.start();
    let outcome = kernels::run(&spec, &mut private, &mut x);
    let end = Instant::now();
    let cpu_ns = cpu_start
        .zip(thread_cpu_ns())
        .map(|(a, b)| b.saturating_sub(a));
    let _ = channels.done.send(());
    Some(Finished {
        outcome,
        end,
        cpu_ns,
        private: private.addr_range(),
        pages: x.into_pages(),
    })
}

/// Run `config`. `on_ready` is called once every rank exists and is set up, before the start
/// delay; the ranks start their first iteration `config.start_delay` after it returns.
pub fn run(config: &Config, on_ready: impl FnOnce(&Ready)) -> Result<RunOutcome> {
    run_observed(config, on_ready, |_| {})
}

/// [`run`], calling `on_progress` every [`Config::progress`] from the start time until every
/// rank is done (never without it).
pub fn run_observed(
    config: &Config,
    on_ready: impl FnOnce(&Ready),
    mut on_progress: impl FnMut(&Progress),
) -> Result<RunOutcome> {
    config.validate().map_err(|e| anyhow!(e))?;
    let ranks = config.ranks();
    let pattern = Pattern::for_kernel(config.kernel, ranks, config.seed);
    let regions: Vec<Region> = (0..config.instances)
        .map(|_| Region::new(pattern.edges().len(), config.shared_pages))
        .collect();
    let pid = std::process::id();

    let (infos, finished, wall) = thread::scope(|s| -> Result<_> {
        let (reg_tx, reg_rx) = mpsc::channel();
        let (done_tx, done_rx) = mpsc::channel();
        let mut handles = Vec::with_capacity(config.threads);
        let mut gos = Vec::with_capacity(config.threads);
        let mut names = Vec::with_capacity(config.threads);
        for index in 0..config.threads {
            let spec = RankSpec {
                kernel: config.kernel,
                instance: index / ranks,
                rank: index % ranks,
                ranks,
                work: config.work,
                seed: config.seed,
            };
            let (go_tx, go_rx) = mpsc::channel();
            let name = thread_name(config.kernel, spec.instance, spec.rank);
            let region = &regions[spec.instance];
            let pattern = &pattern;
            let channels = Channels {
                index,
                register: reg_tx.clone(),
                go: go_rx,
                done: done_tx.clone(),
            };
            let handle = thread::Builder::new()
                .name(name.clone())
                .spawn_scoped(s, move || {
                    rank_main(config, spec, region, pattern, channels)
                })
                .with_context(|| format!("cannot start thread {name}"))?;
            handles.push(handle);
            gos.push(go_tx);
            names.push((name, spec));
        }
        drop((reg_tx, done_tx));
        let (infos, pin_errors) = await_registrations(&reg_rx, names)?;
        on_ready(&Ready {
            pid,
            threads: infos.clone(),
        });
        let start_at = Instant::now() + config.start_delay;
        for go in &gos {
            // A rank that is gone shows up as a failed join below.
            let _ = go.send(start_at);
        }
        await_done(&done_rx, config, start_at, &regions, &mut on_progress);
        let mut finished = Vec::with_capacity(config.threads);
        for (h, pin_error) in handles.into_iter().zip(pin_errors) {
            match h.join() {
                Ok(Some(f)) => finished.push((f, pin_error)),
                Ok(None) => bail!("a worker thread stopped before its start time"),
                Err(_) => bail!("a worker thread panicked"),
            }
        }
        let last = finished.iter().map(|(f, _)| f.end).max();
        let wall = last.map_or(Duration::ZERO, |e| e.saturating_duration_since(start_at));
        Ok((infos, finished, wall))
    })?;

    let region_infos = region_infos(&regions, &pattern, ranks);
    let threads = infos
        .into_iter()
        .zip(finished)
        .map(|(info, (f, pin_error))| ThreadReport {
            info,
            outcome: f.outcome,
            cpu_ns: f.cpu_ns,
            private: f.private,
            pages: f.pages,
            pin_error,
        })
        .collect();
    Ok(RunOutcome {
        config: config.clone(),
        pattern,
        regions: region_infos,
        threads,
        wall,
        pid,
    })
}

/// Wait for every rank's "done" (an error means a rank is gone without it; its join says why),
/// reporting progress every `config.progress` meanwhile.
fn await_done(
    done_rx: &Receiver<()>,
    config: &Config,
    start_at: Instant,
    regions: &[Region],
    on_progress: &mut impl FnMut(&Progress),
) {
    let mut left = config.threads;
    let Some(period) = config.progress else {
        while left > 0 && done_rx.recv().is_ok() {
            left -= 1;
        }
        return;
    };
    let mut next = start_at + period;
    while left > 0 {
        match done_rx.recv_timeout(next.saturating_duration_since(Instant::now())) {
            Ok(()) => left -= 1,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                on_progress(&Progress {
                    t_ms: start_at.elapsed().as_millis() as u64,
                    phases: regions
                        .iter()
                        .map(|r| barrier::phases(r.barrier_page()))
                        .collect(),
                });
                next += period;
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => return,
        }
    }
}

/// Every rank's registration (it is set up and pinned), in index order: the threads' identities
/// and their pin errors. `names`: each rank's thread name and spec, by index.
fn await_registrations(
    reg_rx: &Receiver<Registration>,
    names: Vec<(String, RankSpec)>,
) -> Result<(Vec<ThreadInfo>, Vec<Option<String>>)> {
    let mut registered: Vec<Option<Registration>> = (0..names.len()).map(|_| None).collect();
    for _ in 0..names.len() {
        let r = reg_rx
            .recv()
            .map_err(|_| anyhow!("a worker thread failed during set-up"))?;
        let i = r.index;
        registered[i] = Some(r);
    }
    let mut pin_errors = Vec::with_capacity(names.len());
    let infos: Vec<ThreadInfo> = registered
        .into_iter()
        .zip(names)
        .enumerate()
        .map(|(index, (r, (name, spec)))| {
            let r = r.expect("every index registered once");
            pin_errors.push(r.pin_error);
            ThreadInfo {
                index,
                tid: r.tid,
                name,
                instance: spec.instance,
                rank: spec.rank,
            }
        })
        .collect();
    Ok((infos, pin_errors))
}

/// Where each instance's shared region, barrier page and mailboxes lay.
fn region_infos(regions: &[Region], pattern: &Pattern, ranks: usize) -> Vec<RegionInfo> {
    regions
        .iter()
        .enumerate()
        .map(|(instance, r)| RegionInfo {
            instance,
            range: r.addr_range(),
            barrier_page: r.page_addr(BARRIER_PAGE),
            mailboxes: pattern
                .edges()
                .iter()
                .enumerate()
                .map(|(e, &(a, b))| Mailbox {
                    page: r.page_addr(pair_page(e, r.extra())),
                    pages: 1 + r.extra(),
                    threads: (instance * ranks + a, instance * ranks + b),
                })
                .collect(),
        })
        .collect()
}
