//! Deadline-aware preheating of resolved runs (paper §3.3).
//!
//! The paper loops over the sorted, run-length-encoded working set and loads every line into the
//! last-level cache, optionally split over two cores (+10% on its platform). We do the same
//! with three differences:
//!
//! * **prefetcht0 instead of loads** ([`preheat_runs`]). A prefetch never faults, so a stale
//!   working set (a mapping that went away since it was resolved) cannot crash the server, and
//!   prefetches do not block retirement, so they are issued back to back until the miss
//!   buffers are full (4000 scattered lines issue in ~18 µs here, runs of 16 lines in ~3 µs; the
//!   lines themselves arrive at the scattered-line limit, ~9 GB/s, latency-bound). They still
//!   perform the page walk, which matters because the host backs guest memory with 4 KiB pages.
//!   [`load_runs`] does real loads for comparison in benchmarks.
//! * **a deadline**: the paper's prototype overshot its 30 µs budget (§5); we check the
//!   deadline ever more often as it nears (spaced by the time left; with the unordered TSC once
//!   [`crate::time::enable_tsc_deadlines`] ran: a `CLOCK_MONOTONIC` read drains the prefetches in
//!   flight) and stop when the announced arrival time has passed, so a preheat never delays the request it was meant to speed up. Runs come in
//!   priority order (code first, see `preheat_model::resolve`), so what is cut is the tail.
//! * **virtual addresses** of the live process instead of physical ones, in the order the
//!   resolver produced.
//!
//! [`preheat_runs`] is a hot-path function (no allocation, no locks, no logging).
//! [`ParallelPreheater::run`] does not allocate either; it may block in `futex` while waiting
//! for its workers.
//!
//! Prefetching functions accept any address and are safe; the functions that really load
//! ([`load_runs`], [`plain_load`], [`independent_loads`]) fault on an address that is not
//! mapped readable and are `unsafe fn`s.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use preheat_model::{AbsRun, VirtAddr};

use crate::cache::{prefetch_line, LINE};
use crate::os::{futex_wait, futex_wake};
use crate::time::{now_ns, Deadline};

/// Lines issued between two deadline checks at most (and before the first check of a walk
/// whose deadline is far). The checks are spaced by the time left (see `Pacer`).
pub const CHECK_EVERY_MAX: u32 = 1 << 16;

/// Lines issued between two deadline checks at least: near the deadline the checks come every
/// this many lines, so a preheat overshoots by about their issue time (~0.2–0.3 µs).
pub const CHECK_EVERY_MIN: u32 = 8;

/// A pessimistic time to issue one line (ns), for spacing the checks: a scattered line from
/// DRAM with a page walk issues in ~23–37 ns on this project's hosts (EPYC and Xeon), so
/// lines this slow mean the thread lost its CPU.
pub const SLOW_LINE_NS: u64 = 100;

/// Spaces a walk's deadline checks: after each check (and at the start), the lines to the next
/// check are those that fit in a quarter of the time left at [`SLOW_LINE_NS`] per line, or at
/// the rate the last interval measured if that was slower; clamped to
/// [[`CHECK_EVERY_MIN`], [`CHECK_EVERY_MAX`]]. So a walk far from its deadline checks a few
/// times, and one that runs into it checks ever more often as it nears it.
///
/// Why not a fixed count: a check reads the unordered TSC, which costs ~15 ns on the EPYC hosts
/// but 100–130 ns on a Xeon host amid outstanding prefetches (measured with a C loop of 3072
/// scattered prefetches: +12.8 µs for `rdtsc` every 32 lines, +40 µs every 8, against 17 ns
/// for back-to-back `rdtsc`): checks every 32 lines cost 15–18% of the walk there.
struct Pacer {
    dl: Deadline,
    last: u64,
    /// [`SLOW_LINE_NS`] in the deadline's units.
    slow: u64,
    every: u32,
}

impl Pacer {
    #[inline(always)]
    fn new(dl: Deadline) -> Pacer {
        let now = dl.now();
        let slow = (SLOW_LINE_NS * dl.units_per_us() / 1000).max(1);
        let mut p = Pacer {
            last: now,
            slow,
            every: CHECK_EVERY_MIN,
            dl,
        };
        p.space(now, slow);
        p
    }

    /// Lines to the next check from `now`, at `per_line` units per line (at least `slow`).
    #[inline(always)]
    fn space(&mut self, now: u64, per_line: u64) {
        let quarter = self.dl.end().saturating_sub(now) / 4;
        let lines = quarter / per_line.max(self.slow);
        self.every = lines.clamp(CHECK_EVERY_MIN as u64, CHECK_EVERY_MAX as u64) as u32;
    }

    /// Whether the deadline passed; else spaces the next check ([`every`](Self::every)).
    #[inline(always)]
    fn passed(&mut self) -> bool {
        let now = self.dl.now();
        if now >= self.dl.end() {
            return true;
        }
        let per_line = now.wrapping_sub(self.last) / self.every.max(1) as u64;
        self.last = now;
        self.space(now, per_line);
        false
    }
}

/// Runs of at most this many lines are walked without a length-dependent branch (see `walk`).
const SHORT_RUN: u32 = 4;

/// How far a preheat got.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PreheatReport {
    /// Runs whose lines were all issued.
    pub runs_done: u64,
    /// Lines issued.
    pub lines_done: u64,
    /// Lines in all runs.
    pub lines_total: u64,
    /// All lines were issued before the deadline.
    pub completed: bool,
    /// Wall time of the call (CLOCK_MONOTONIC), ns. For [`preheat_runs`] this is the time to
    /// *issue* the prefetches; the last lines arrive up to one memory latency later
    /// (~0.1–0.5 µs), or longer while the miss queues drain.
    pub elapsed_ns: u64,
}

impl PreheatReport {
    /// Combine the reports of pieces done in parallel (counts add up, `completed` only if all
    /// pieces completed, `elapsed_ns` is the longest).
    pub fn merge(self, o: PreheatReport) -> PreheatReport {
        PreheatReport {
            runs_done: self.runs_done + o.runs_done,
            lines_done: self.lines_done + o.lines_done,
            lines_total: self.lines_total + o.lines_total,
            completed: self.completed && o.completed,
            elapsed_ns: self.elapsed_ns.max(o.elapsed_ns),
        }
    }

    /// An empty, completed report (the identity of [`merge`](Self::merge)).
    pub fn empty() -> PreheatReport {
        PreheatReport {
            completed: true,
            ..Default::default()
        }
    }
}

/// Walk `runs` line by line in order, calling `touch` on each line address, checking the clock
/// as a [`Pacer`] spaces the checks. Allocation-free. `touch` is only ever given line addresses of
/// `runs` (`r.addr + i × 64` for `i < r.lines`).
#[inline(always)]
fn walk<F: FnMut(VirtAddr)>(
    runs: &[AbsRun],
    deadline_ns: Option<u64>,
    mut touch: F,
) -> PreheatReport {
    let start = now_ns();
    let lines_total: u64 = runs.iter().map(|r| r.lines as u64).sum();
    // Checked with the unordered TSC where enabled: a clock read would drain the prefetches in
    // flight at every check.
    let mut pacer = deadline_ns.map(|d| Pacer::new(Deadline::at(d)));
    let mut runs_done = 0u64;
    let mut lines_done = 0u64;
    let mut budget = pacer.as_ref().map_or(u32::MAX, |p| p.every);
    let mut stopped = deadline_ns.is_some_and(|d| start >= d) && lines_total > 0;
    if !stopped {
        'runs: for r in runs {
            let mut addr = r.addr;
            let mut left = r.lines;
            if (1..=SHORT_RUN).contains(&left) && budget >= left {
                // A short run: always SHORT_RUN touches, their addresses clamped to the run's last
                // line (a repeated touch of a line in flight costs an issue slot, no traffic), so
                // no branch depends on the run's length (a loop exit at the run's length is
                // mispredicted about once per run). Measured on the benchmark's short runs:
                // preheat-1 / limit 0.89–0.91 without (2 runs), 0.92–0.93 with (3 runs), 3 repetitions each.
                let last = (left - 1) as usize;
                for i in 0..SHORT_RUN as usize {
                    touch(addr.offset((LINE * i.min(last)) as u64));
                }
                budget -= left;
                lines_done += left as u64;
                runs_done += 1;
                continue;
            }
            while left > 0 {
                if budget == 0 {
                    // Only reached with a deadline (else the budget never runs out).
                    if let Some(p) = pacer.as_mut() {
                        if p.passed() {
                            stopped = true;
                            break 'runs;
                        }
                        budget = p.every;
                    } else {
                        budget = u32::MAX;
                    }
                }
                let n = left.min(budget);
                for _ in 0..n {
                    touch(addr);
                    addr = addr.offset(LINE as u64);
                }
                left -= n;
                budget -= n;
                lines_done += n as u64;
            }
            runs_done += 1;
        }
    }
    PreheatReport {
        runs_done,
        lines_done,
        lines_total,
        completed: !stopped,
        elapsed_ns: now_ns().saturating_sub(start),
    }
}

/// Prefetch `runs` in order (prefetcht0 per line; never faults), checking the clock every few
/// lines and stopping once `deadline_ns` (CLOCK_MONOTONIC) has passed.
///
/// Any address is safe: prefetches of unmapped or inaccessible memory are silently dropped by
/// the CPU. If the deadline has already passed on entry, nothing is issued. Hot path: no
/// allocation, no locks, no logging.
pub fn preheat_runs(runs: &[AbsRun], deadline_ns: Option<u64>) -> PreheatReport {
    walk(runs, deadline_ns, prefetch_line)
}

/// Like [`preheat_runs`] but with real one-byte volatile loads of every line: guaranteed to fill
/// the cache and redo page walks (a prefetch may be dropped), for comparison in benchmarks.
/// The values read are discarded (folded into a checksum).
///
/// # Safety
/// Unlike [`preheat_runs`], every line of `runs` **must be mapped and readable** in this
/// process, backed by memory (not past the end of a mapped file), and stay so for the duration
/// of the call (nothing in this or another thread may unmap it meanwhile): a load of an
/// unmapped address raises SIGSEGV and kills the process. Lines past the deadline are not
/// touched, but the caller cannot know in advance which those are, so the contract covers all
/// of `runs`.
pub unsafe fn load_runs(runs: &[AbsRun], deadline_ns: Option<u64>) -> PreheatReport {
    let mut sum = 0u8;
    let r = walk(runs, deadline_ns, |a| {
        // SAFETY: `walk` passes only line addresses of `runs`, which the caller guarantees
        // mapped and readable for the call.
        sum = sum.wrapping_add(unsafe { load_byte(a) })
    });
    std::hint::black_box(sum);
    r
}

/// One-byte volatile load of `addr`.
///
/// # Safety
/// `addr` must lie in a page that is mapped and readable in this process, backed by memory, and
/// stays so for the duration of the call.
#[inline(always)]
unsafe fn load_byte(addr: VirtAddr) -> u8 {
    // SAFETY: the caller guarantees a mapped, readable byte; a `u8` read has no alignment
    // requirement. A write racing with it (another thread of the process) is, strictly, a data
    // race in Rust's memory model; we rely on the volatile load being one byte-sized `mov`
    // (never elided, duplicated or torn) whose value only goes into a discarded checksum.
    unsafe { std::ptr::read_volatile(addr.as_ptr()) }
}

/// Split `runs` into `parts` contiguous pieces with nearly equal line counts (runs may be cut).
///
/// Piece `i` gets lines `[i·T/p, (i+1)·T/p)` of the concatenated runs (`T` lines in total,
/// `p = min(parts, T)`), so sizes differ by at most one line and the concatenation of the
/// pieces is `runs` in the same order (runs cut at piece boundaries, zero-length runs dropped).
/// Returns no pieces if there are no lines; `parts == 0` is treated as 1.
pub fn split_runs(runs: &[AbsRun], parts: usize) -> Vec<Vec<AbsRun>> {
    let total: u64 = runs.iter().map(|r| r.lines as u64).sum();
    if total == 0 {
        return Vec::new();
    }
    let p = (parts.max(1) as u64).min(total);
    let mut out: Vec<Vec<AbsRun>> = Vec::with_capacity(p as usize);
    let mut it = runs.iter().copied().filter(|r| r.lines > 0);
    let mut cur: Option<AbsRun> = None; // remainder of a run cut at the previous boundary
    for i in 0..p {
        let mut want = (i + 1) * total / p - i * total / p;
        let mut piece = Vec::new();
        while want > 0 {
            let r = match cur.take() {
                Some(r) => r,
                None => it.next().expect("line count covers all pieces"),
            };
            if r.lines as u64 <= want {
                want -= r.lines as u64;
                piece.push(r);
            } else {
                let take = want as u32;
                piece.push(AbsRun {
                    addr: r.addr,
                    lines: take,
                    exec: r.exec,
                });
                cur = Some(AbsRun {
                    addr: r.addr.offset(take as u64 * LINE as u64),
                    lines: r.lines - take,
                    exec: r.exec,
                });
                want = 0;
            }
        }
        out.push(piece);
    }
    out
}

/// Baseline for benchmarks: a plain loop loading one byte of every line of sorted addresses.
///
/// Loads one byte at each address in the given order (the caller sorts) and returns a checksum
/// of the bytes so the loop cannot be optimised away.
///
/// # Safety
/// Every address must be mapped and readable in this process, backed by memory, and stay so for
/// the duration of the call (SIGSEGV otherwise).
pub unsafe fn plain_load(addrs: &[VirtAddr]) -> u64 {
    let mut sum = 0u64;
    for &a in addrs {
        // SAFETY: the caller guarantees every address of `addrs` mapped and readable.
        sum = sum.wrapping_add(unsafe { load_byte(a) } as u64);
    }
    sum
}

/// Benchmark reference ("scattered-line limit"): prefetcht0 of a flat address array, with no
/// run decoding and no deadline checks. Never faults, so any address is allowed.
pub fn prefetch_addrs(addrs: &[VirtAddr]) {
    for &a in addrs {
        crate::cache::prefetch_line(a);
    }
}

/// Benchmark reference ("scattered-line limit"): one-byte loads of a flat address array, eight
/// independent chains so the CPU can keep many misses in flight. Returns a checksum.
///
/// # Safety
/// As [`plain_load`]: every address mapped, readable and backed by memory for the call.
pub unsafe fn independent_loads(addrs: &[VirtAddr]) -> u64 {
    let mut acc = [0u64; 8];
    let mut chunks = addrs.chunks_exact(8);
    for c in &mut chunks {
        for i in 0..8 {
            // SAFETY: `c[i]` is an address of `addrs`, guaranteed readable by the caller.
            acc[i] = acc[i].wrapping_add(unsafe { load_byte(c[i]) } as u64);
        }
    }
    let mut sum = acc.iter().fold(0u64, |a, b| a.wrapping_add(*b));
    for &a in chunks.remainder() {
        // SAFETY: as above.
        sum = sum.wrapping_add(unsafe { load_byte(a) } as u64);
    }
    sum
}

/// Addresses checked once to lie inside a buffer that stays borrowed while this value lives, so
/// the loading benchmark references ([`plain_load`], [`independent_loads`]) are safe on them and
/// pay no check per load.
pub struct AddrsIn<'a> {
    addrs: Vec<VirtAddr>,
    _buf: std::marker::PhantomData<&'a [u8]>,
}

impl<'a> AddrsIn<'a> {
    /// `addrs` if every one of them is the address of a byte of `buf`; otherwise the first that
    /// is not.
    pub fn new(buf: &'a [u8], addrs: Vec<VirtAddr>) -> Result<AddrsIn<'a>, VirtAddr> {
        let lo = VirtAddr::from_ptr(buf.as_ptr());
        let hi = lo.offset(buf.len() as u64);
        match addrs.iter().find(|&&a| a < lo || a >= hi) {
            Some(&bad) => Err(bad),
            None => Ok(AddrsIn {
                addrs,
                _buf: std::marker::PhantomData,
            }),
        }
    }

    /// The addresses, in the order given.
    pub fn addrs(&self) -> &[VirtAddr] {
        &self.addrs
    }

    /// [`plain_load`] of the addresses.
    pub fn plain_load(&self) -> u64 {
        // SAFETY: every address is a byte of the buffer `new` checked them against, which stays
        // borrowed (alive, not freed or moved) for `'a`, and so for this call.
        unsafe { plain_load(&self.addrs) }
    }

    /// [`independent_loads`] of the addresses.
    pub fn independent_loads(&self) -> u64 {
        // SAFETY: as in `plain_load`.
        unsafe { independent_loads(&self.addrs) }
    }
}

// ---------------------------------------------------------------------------------------------
// Parallel preheating.

/// How long `run` spins waiting for workers before sleeping in `futex`.
const WAIT_SPIN_NS: u64 = 50_000;

/// One worker's mailbox, on its own cache lines (128 bytes: adjacent-line prefetch pairs).
///
/// Protocol (one job in flight per slot; only the thread holding `busy` publishes):
/// 1. the caller stores `ptr`, `len`, `deadline` (Relaxed), then increments `seq` (SeqCst, a
///    release store) and, if the worker announced it sleeps, futex-wakes `seq`;
/// 2. the worker sees `seq` change (acquire load), reads `ptr/len/deadline`, preheats, stores
///    the report (Relaxed), then stores `done = seq` (Release) and futex-wakes `done`;
/// 3. the caller waits until `done == seq` (acquire load) and reads the report.
#[repr(align(128))]
struct Slot {
    /// Number of the last job published (futex word the worker sleeps on).
    seq: AtomicU32,
    /// Number of the last job finished (futex word the caller sleeps on).
    done: AtomicU32,
    /// 1 while the worker is in (or about to enter) FUTEX_WAIT on `seq`.
    sleeping: AtomicU32,
    ptr: AtomicUsize,
    len: AtomicUsize,
    /// Deadline, `u64::MAX` for none.
    deadline: AtomicU64,
    runs_done: AtomicU64,
    lines_done: AtomicU64,
    lines_total: AtomicU64,
    completed: AtomicU32,
    elapsed_ns: AtomicU64,
}

impl Slot {
    fn new() -> Slot {
        Slot {
            seq: AtomicU32::new(0),
            done: AtomicU32::new(0),
            sleeping: AtomicU32::new(0),
            ptr: AtomicUsize::new(0),
            len: AtomicUsize::new(0),
            deadline: AtomicU64::new(u64::MAX),
            runs_done: AtomicU64::new(0),
            lines_done: AtomicU64::new(0),
            lines_total: AtomicU64::new(0),
            completed: AtomicU32::new(1),
            elapsed_ns: AtomicU64::new(0),
        }
    }
}

struct Shared {
    slots: Box<[Slot]>,
    stop: AtomicBool,
    /// After a job, workers poll for the next one this long before sleeping in `futex`.
    linger_ns: AtomicU64,
}

/// Persistent worker threads pinned to CPUs that preheat pieces of a working set in parallel.
///
/// Workers sleep in `futex` between jobs, so an idle preheater costs nothing; waking one costs a
/// cross-CPU wakeup (20–90 µs here unless the CPU is kept out of deep idle, see the notes),
/// which is why the paper's two-core speed-up only pays when the workers' CPUs are awake.
/// Threads do not survive `fork`: create the preheater in the process that uses it.
pub struct ParallelPreheater {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    cpus: Vec<usize>,
    /// Held by the one `run` that may publish to the slots; a concurrent `run` does its whole
    /// job on its own thread instead.
    busy: AtomicBool,
}

impl ParallelPreheater {
    /// Let workers poll for `ns` after each job before they sleep (0, the default: sleep at
    /// once). Keeps their CPUs out of idle between closely spaced jobs at the cost of spinning;
    /// benchmarks use it to measure throughput with the workers awake.
    pub fn set_linger(&self, ns: u64) {
        self.shared.linger_ns.store(ns, Ordering::Relaxed);
    }

    /// Start one pinned worker per CPU in `cpus`. Allocates only here.
    ///
    /// Fails (and stops the workers already started) if a thread cannot be spawned or pinned.
    /// An empty `cpus` gives a preheater that runs everything on the calling thread.
    pub fn new(cpus: &[usize]) -> std::io::Result<ParallelPreheater> {
        crate::time::enable_tsc_deadlines();
        let shared = Arc::new(Shared {
            slots: cpus.iter().map(|_| Slot::new()).collect(),
            stop: AtomicBool::new(false),
            linger_ns: AtomicU64::new(0),
        });
        let mut pre = ParallelPreheater {
            shared: shared.clone(),
            threads: Vec::with_capacity(cpus.len()),
            cpus: cpus.to_vec(),
            busy: AtomicBool::new(false),
        };
        for (i, &cpu) in cpus.iter().enumerate() {
            let sh = shared.clone();
            // One channel per worker: if the thread dies before reporting, `recv` fails
            // instead of hanging.
            let (tx, rx) = std::sync::mpsc::channel::<io::Result<()>>();
            let spawned = std::thread::Builder::new()
                .name(format!("preheat-w{cpu}"))
                .spawn(move || {
                    let pinned = crate::os::pin_current_thread(cpu);
                    let ok = pinned.is_ok();
                    let _ = tx.send(pinned);
                    drop(tx);
                    if ok {
                        worker(&sh, i);
                    }
                });
            match spawned {
                Ok(h) => pre.threads.push(h),
                Err(e) => return Err(e), // Drop stops and joins the started workers.
            }
            match rx.recv() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    return Err(io::Error::new(
                        e.kind(),
                        format!("pinning a preheat worker to CPU {cpu}: {e}"),
                    ))
                }
                Err(_) => return Err(io::Error::other("preheat worker died during start-up")),
            }
        }
        Ok(pre)
    }

    /// Number of worker threads.
    pub fn workers(&self) -> usize {
        self.threads.len()
    }

    /// The CPUs the workers are pinned to, in worker order.
    pub fn cpus(&self) -> &[usize] {
        &self.cpus
    }

    /// Preheat `pieces[i]` on worker i (the caller runs `local` itself) and wait for all.
    ///
    /// Pieces beyond the number of workers are preheated on the calling thread after `local`.
    /// Does not allocate. Returns after every worker has finished with its piece (so the
    /// borrowed slices are never used after `run` returns); waiting spins ~50 µs, then sleeps in
    /// `futex`. If another thread is inside `run` on the same preheater, this call preheats
    /// everything on its own thread instead of waiting. `elapsed_ns` is the wall time of the
    /// whole call.
    pub fn run(
        &self,
        local: &[AbsRun],
        pieces: &[&[AbsRun]],
        deadline_ns: Option<u64>,
    ) -> PreheatReport {
        let start = now_ns();
        let slots = &self.shared.slots[..];
        let owns_busy = self
            .busy
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_ok();
        let n = if owns_busy {
            pieces.len().min(slots.len())
        } else {
            0
        };
        // From here on, `guard` waits for every published job before the borrow of `pieces`
        // ends (also if preheating below were to panic), then releases `busy`.
        let mut guard = WaitGuard {
            pre: self,
            published: 0,
            owns_busy,
        };
        for (slot, piece) in slots.iter().zip(pieces).take(n) {
            slot.ptr.store(piece.as_ptr() as usize, Ordering::Relaxed);
            slot.len.store(piece.len(), Ordering::Relaxed);
            slot.deadline
                .store(deadline_ns.unwrap_or(u64::MAX), Ordering::Relaxed);
            let s = slot.seq.load(Ordering::Relaxed).wrapping_add(1);
            // SeqCst: release for ptr/len/deadline, and one half of the store-load handshake
            // with the worker's `sleeping` flag (see `worker`).
            slot.seq.store(s, Ordering::SeqCst);
            guard.published += 1;
            if slot.sleeping.load(Ordering::SeqCst) != 0 {
                futex_wake(&slot.seq, i32::MAX);
            }
        }
        let mut rep = preheat_runs(local, deadline_ns);
        for piece in &pieces[n..] {
            rep = rep.merge(preheat_runs(piece, deadline_ns));
        }
        guard.wait();
        for slot in &slots[..n] {
            rep = rep.merge(PreheatReport {
                runs_done: slot.runs_done.load(Ordering::Relaxed),
                lines_done: slot.lines_done.load(Ordering::Relaxed),
                lines_total: slot.lines_total.load(Ordering::Relaxed),
                completed: slot.completed.load(Ordering::Relaxed) != 0,
                elapsed_ns: 0,
            });
        }
        drop(guard);
        rep.elapsed_ns = now_ns().saturating_sub(start);
        rep
    }
}

/// Waits for the first `published` slots to finish their job, then releases `busy`.
struct WaitGuard<'a> {
    pre: &'a ParallelPreheater,
    published: usize,
    owns_busy: bool,
}

impl WaitGuard<'_> {
    fn wait(&mut self) {
        let slots = &self.pre.shared.slots[..self.published];
        let spin_until = now_ns().saturating_add(WAIT_SPIN_NS);
        for slot in slots {
            // Only the `busy` holder writes `seq`, so this is the job number we published.
            let s = slot.seq.load(Ordering::Relaxed);
            let mut spins = 0u32;
            loop {
                let d = slot.done.load(Ordering::Acquire);
                if d == s {
                    break;
                }
                spins = spins.wrapping_add(1);
                if spins & 63 != 0 || now_ns() < spin_until {
                    std::hint::spin_loop();
                } else {
                    // Returns at once if `done` already changed; wakes on the worker's
                    // FUTEX_WAKE; the timeout only guards against a lost wakeup.
                    futex_wait(&slot.done, d, Some(1_000_000));
                }
            }
        }
        self.published = 0;
    }
}

impl Drop for WaitGuard<'_> {
    fn drop(&mut self) {
        self.wait();
        if self.owns_busy {
            self.pre.busy.store(false, Ordering::Release);
        }
    }
}

impl Drop for ParallelPreheater {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        for slot in self.shared.slots.iter() {
            slot.seq.fetch_add(1, Ordering::SeqCst);
            futex_wake(&slot.seq, i32::MAX);
        }
        for h in self.threads.drain(..) {
            let _ = h.join();
        }
    }
}

fn worker(sh: &Shared, i: usize) {
    let slot = &sh.slots[i];
    let mut last = 0u32;
    loop {
        let mut s = slot.seq.load(Ordering::Acquire);
        let linger = sh.linger_ns.load(Ordering::Relaxed);
        if linger > 0 && s == last {
            let until = now_ns().saturating_add(linger);
            while s == last && now_ns() < until {
                std::hint::spin_loop();
                s = slot.seq.load(Ordering::Acquire);
            }
        }
        while s == last {
            // Announce that we are about to sleep, then re-check `seq`. Paired with the caller's
            // SeqCst store of `seq` followed by its SeqCst load of `sleeping`: in the single
            // total order of SeqCst operations either we see the new `seq` here, or the caller
            // sees `sleeping == 1` and wakes us. FUTEX_WAIT itself re-checks `seq == last`
            // atomically, so a wake between the check and the wait is not lost either.
            slot.sleeping.store(1, Ordering::SeqCst);
            s = slot.seq.load(Ordering::SeqCst);
            if s == last {
                futex_wait(&slot.seq, last, None);
                s = slot.seq.load(Ordering::Acquire);
            }
            slot.sleeping.store(0, Ordering::Relaxed);
        }
        last = s;
        if sh.stop.load(Ordering::SeqCst) {
            return;
        }
        let ptr = slot.ptr.load(Ordering::Relaxed) as *const AbsRun;
        let len = slot.len.load(Ordering::Relaxed);
        let deadline = slot.deadline.load(Ordering::Relaxed);
        let runs: &[AbsRun] = if len == 0 {
            &[]
        } else {
            // SAFETY: `ptr/len` were taken from a live `&[AbsRun]` by `ParallelPreheater::run`
            // and published before job number `s` with a release store of `seq`, which our
            // acquire load of `seq` synchronises with, so we see them fully. `run` holds that
            // borrow until it has observed `done == s` (its `WaitGuard` waits even on unwind),
            // and we store `done = s` only after the last use of `runs` below, so the slice is
            // alive and unaliased by writers (it is a shared borrow) for as long as we use it.
            // `AbsRun` is `Copy` plain data, so reading it from another thread is fine.
            unsafe { std::slice::from_raw_parts(ptr, len) }
        };
        let r = preheat_runs(runs, (deadline != u64::MAX).then_some(deadline));
        slot.runs_done.store(r.runs_done, Ordering::Relaxed);
        slot.lines_done.store(r.lines_done, Ordering::Relaxed);
        slot.lines_total.store(r.lines_total, Ordering::Relaxed);
        slot.completed.store(r.completed as u32, Ordering::Relaxed);
        slot.elapsed_ns.store(r.elapsed_ns, Ordering::Relaxed);
        // Release: publishes the report; after this we no longer touch `runs`.
        slot.done.store(s, Ordering::Release);
        futex_wake(&slot.done, i32::MAX);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(addr: u64, lines: u32) -> AbsRun {
        AbsRun {
            addr: VirtAddr(addr),
            lines,
            exec: (addr >> 12) & 1 == 0,
        }
    }

    fn lines_of(runs: &[AbsRun]) -> Vec<u64> {
        runs.iter()
            .flat_map(|r| (0..r.lines as u64).map(move |i| r.addr.0 + i * 64))
            .collect()
    }

    fn sample_runs() -> Vec<AbsRun> {
        vec![
            run(0x1000, 5),
            run(0x8000, 0),
            run(0x9000, 1),
            run(0x20000, 37),
            run(0x40000, 2),
            run(0x50000, 100),
            run(0x90000, 3),
        ]
    }

    #[test]
    fn split_preserves_lines_and_order() {
        let _shared = crate::test_lock::shared();
        let runs = sample_runs();
        let all = lines_of(&runs);
        for parts in 0..200 {
            let pieces = split_runs(&runs, parts);
            assert!(pieces.len() <= parts.max(1), "parts {parts}");
            assert!(pieces.iter().all(|p| !p.is_empty()));
            let cat: Vec<AbsRun> = pieces.iter().flatten().copied().collect();
            assert_eq!(lines_of(&cat), all, "parts {parts}");
            let sizes: Vec<u64> = pieces
                .iter()
                .map(|p| p.iter().map(|r| r.lines as u64).sum())
                .collect();
            let (mn, mx) = (sizes.iter().min().unwrap(), sizes.iter().max().unwrap());
            assert!(mx - mn <= 1, "parts {parts}: {sizes:?}");
            // exec flags survive cuts
            for r in &cat {
                let orig = runs
                    .iter()
                    .find(|o| r.addr >= o.addr && r.addr < o.addr.offset(o.lines as u64 * 64))
                    .unwrap();
                assert_eq!(r.exec, orig.exec);
            }
        }
        assert!(split_runs(&[], 4).is_empty());
        assert!(split_runs(&[run(0x1000, 0)], 4).is_empty());
    }

    #[test]
    fn preheat_counts_and_deadlines() {
        let _shared = crate::test_lock::shared();
        let buf = vec![1u8; 64 * 1024];
        let base = buf.as_ptr() as u64;
        let runs = vec![
            run(base, 100),
            run(base + 200 * 64, 300),
            run(base + 600 * 64, 0),
        ];
        let r = preheat_runs(&runs, None);
        assert_eq!(
            (r.runs_done, r.lines_done, r.lines_total, r.completed),
            (3, 400, 400, true)
        );
        let r = preheat_runs(&runs, Some(now_ns() + 10_000_000_000));
        assert_eq!((r.lines_done, r.completed), (400, true));
        let r = preheat_runs(&runs, Some(now_ns().saturating_sub(1)));
        assert_eq!((r.runs_done, r.lines_done, r.completed), (0, 0, false));
        // SAFETY: every run lies inside `buf` (lines 0..500 of 1024), a live heap allocation of
        // this test, dropped only at its end.
        let r = unsafe { load_runs(&runs, None) };
        assert_eq!((r.lines_done, r.completed), (400, true));
        // Unmapped addresses are fine for prefetches.
        let r = preheat_runs(&[run(0, 64), run(0xdead_0000_0000, 64)], None);
        assert_eq!(r.lines_done, 128);
        let e = preheat_runs(&[], Some(0));
        assert!(e.completed && e.lines_total == 0 && e.lines_done == 0);
        let addrs: Vec<VirtAddr> = (0..buf.len() as u64)
            .step_by(64)
            .map(|i| VirtAddr(base + i))
            .collect();
        // SAFETY: every address is a byte of `buf`, live until the end of this test.
        unsafe {
            assert_eq!(plain_load(&addrs), addrs.len() as u64);
            assert_eq!(independent_loads(&addrs), addrs.len() as u64);
            assert_eq!(independent_loads(&addrs[..13]), 13);
        }
        let checked = AddrsIn::new(&buf, addrs.clone()).unwrap();
        assert_eq!(checked.plain_load(), addrs.len() as u64);
        assert_eq!(checked.independent_loads(), addrs.len() as u64);
        let past = VirtAddr(base + buf.len() as u64);
        assert_eq!(AddrsIn::new(&buf, vec![past]).err(), Some(past));
        assert_eq!(
            AddrsIn::new(&buf, vec![VirtAddr(base - 1)]).err(),
            Some(VirtAddr(base - 1))
        );
        prefetch_addrs(&addrs);
        prefetch_addrs(&[VirtAddr(0), VirtAddr(64), VirtAddr(0xdead_0000_0000)]);
    }

    #[test]
    fn deadline_stops_a_long_preheat() {
        let _shared = crate::test_lock::shared();
        // 1M lines of unmapped memory (prefetches are dropped) take far more than 20 µs.
        let runs = vec![run(0x7000_0000_0000, 1 << 20)];
        let r = preheat_runs(&runs, Some(now_ns() + 20_000));
        assert!(!r.completed);
        assert!(r.lines_done < 1 << 20);
    }

    #[test]
    fn checks_come_more_often_as_the_deadline_nears() {
        let _shared = crate::test_lock::shared();
        // Far away (1 s): the spacing is at its bound.
        let mut p = Pacer::new(Deadline::at(now_ns() + 1_000_000_000));
        assert_eq!(p.every, CHECK_EVERY_MAX);
        assert!(!p.passed());
        assert_eq!(p.every, CHECK_EVERY_MAX);
        // 2 ms away: a quarter of the time left at SLOW_LINE_NS per line. Bracketed by clock
        // reads (a preemption only widens the bracket), ±2% for the TSC conversion.
        let d = now_ns() + 2_000_000;
        let before = now_ns();
        let p = Pacer::new(Deadline::at(d));
        let after = now_ns();
        let lines = |t: u64| d.saturating_sub(t) as f64 / 4.0 / SLOW_LINE_NS as f64;
        let every = p.every as f64;
        assert!(
            every >= lines(after) * 0.98 - 1.0 && every <= lines(before) * 1.02 + 1.0,
            "{every} lines for {} to {}",
            lines(after),
            lines(before)
        );
        // Checks after a slow interval: spaced by the measured rate. 16 µs for `every` lines
        // is slower than SLOW_LINE_NS per line for every spacing below 160 lines. A try is
        // kept only when its bracket of clock reads stayed under 20 µs: a preemption longer
        // than the deadline's slack (the suite's other tests share the 2 CPUs) would pass the
        // 40 µs deadline, which is not what this checks.
        let mut kept = false;
        for _ in 0..50 {
            let t0 = now_ns();
            let mut p = Pacer::new(Deadline::at(t0 + 40_000));
            p.every = 64;
            while now_ns() < t0 + 16_000 {
                std::hint::spin_loop();
            }
            let passed = p.passed();
            if now_ns() - t0 > 20_000 {
                continue;
            }
            assert!(!passed);
            // 20–24 µs left, at ≥ 250 ns per line: at most 24 lines to the next check.
            assert!(p.every <= 24, "{}", p.every);
            kept = true;
            break;
        }
        assert!(kept, "every try was preempted for over 4 µs");
        // Near the deadline, the least spacing; past it, passed.
        let mut p = Pacer::new(Deadline::at(now_ns() + 500));
        assert_eq!(p.every, CHECK_EVERY_MIN);
        let t = now_ns();
        while now_ns() < t + 1_000 {
            std::hint::spin_loop();
        }
        assert!(p.passed());
    }

    fn test_cpus() -> Vec<usize> {
        let aff = crate::os::get_affinity();
        aff.into_iter().take(2).collect()
    }

    #[test]
    fn parallel_preheats_all_lines() {
        let _shared = crate::test_lock::shared();
        let buf = vec![7u8; 1 << 20];
        let base = (buf.as_ptr() as u64 + 63) & !63;
        let mut runs = Vec::new();
        let mut a = base;
        for i in 0..200u64 {
            let lines = 1 + (i * 7) % 23;
            if a + (lines + 3) * 64 > buf.as_ptr() as u64 + buf.len() as u64 {
                break;
            }
            runs.push(run(a, lines as u32));
            a += (lines + 3) * 64;
        }
        let total: u64 = runs.iter().map(|r| r.lines as u64).sum();
        let cpus = test_cpus();
        let pre = ParallelPreheater::new(&cpus).unwrap();
        assert_eq!(pre.workers(), cpus.len());
        let pieces = split_runs(&runs, cpus.len() + 1);
        let refs: Vec<&[AbsRun]> = pieces[1..].iter().map(|p| &p[..]).collect();
        for _ in 0..500 {
            let r = pre.run(&pieces[0], &refs, None);
            assert_eq!(r.lines_done, total);
            assert_eq!(r.lines_total, total);
            assert_eq!(
                r.runs_done,
                pieces.iter().map(|p| p.len() as u64).sum::<u64>()
            );
            assert!(r.completed);
        }
        // More pieces than workers: extras run locally.
        let many = split_runs(&runs, 7);
        let refs: Vec<&[AbsRun]> = many.iter().map(|p| &p[..]).collect();
        let r = pre.run(&[], &refs, Some(now_ns() + 10_000_000_000));
        assert_eq!((r.lines_done, r.completed), (total, true));
        // Past deadline: nothing issued anywhere, but every worker reports back.
        let local: u64 = pieces[0].iter().map(|r| r.lines as u64).sum();
        let r = pre.run(&pieces[0], &refs, Some(1));
        assert_eq!(
            (r.lines_done, r.lines_total, r.completed),
            (0, total + local, false)
        );
    }

    #[test]
    fn concurrent_runs_and_drop() {
        let _shared = crate::test_lock::shared();
        let buf = vec![7u8; 256 * 1024];
        let base = buf.as_ptr() as u64 & !63;
        let runs: Vec<AbsRun> = (0..64).map(|i| run(base + 64 + i * 4096, 16)).collect();
        let total: u64 = runs.iter().map(|r| r.lines as u64).sum();
        let pieces = split_runs(&runs, 3);
        let pre = Arc::new(ParallelPreheater::new(&test_cpus()).unwrap());
        let hs: Vec<_> = (0..2)
            .map(|_| {
                let pre = pre.clone();
                let pieces = pieces.clone();
                std::thread::spawn(move || {
                    let refs: Vec<&[AbsRun]> = pieces[1..].iter().map(|p| &p[..]).collect();
                    for _ in 0..300 {
                        let r = pre.run(&pieces[0], &refs, None);
                        assert_eq!((r.lines_done, r.completed), (total, true));
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        drop(pre);
        // No workers at all.
        let pre = ParallelPreheater::new(&[]).unwrap();
        let refs: Vec<&[AbsRun]> = pieces.iter().map(|p| &p[..]).collect();
        assert_eq!(pre.run(&[], &refs, None).lines_done, total);
        // Pinning to a CPU that does not exist fails cleanly.
        assert!(ParallelPreheater::new(&[100_000]).is_err());
    }
}

/// Throughput of the preheat loops on this machine; run with
/// `cargo test --release -p preheat-engine --lib preheat::report -- --ignored --nocapture`.
#[cfg(test)]
mod report {
    use super::*;

    #[test]
    #[ignore]
    fn preheat_throughput() {
        use rand::rngs::SmallRng;
        use rand::{Rng, SeedableRng};
        let _shared = crate::test_lock::shared();
        let buf = vec![1u8; 64 << 20];
        let base = (buf.as_ptr() as u64 + 63) & !63;
        let total_lines = (buf.len() / 64 - 1) as u64;
        let mut rng = SmallRng::seed_from_u64(0x9e37_79b9_7f4a_7c15);
        for run_len in [1u32, 16] {
            let mut runs: Vec<AbsRun> = (0..4000 / run_len)
                .map(|_| AbsRun {
                    addr: VirtAddr(base + rng.gen_range(0..total_lines - 16) * 64),
                    lines: run_len,
                    exec: false,
                })
                .collect();
            runs.sort();
            let addrs: Vec<VirtAddr> = runs
                .iter()
                .flat_map(|r| (0..r.lines as u64).map(move |i| r.addr.offset(i * 64)))
                .collect();
            // Every run and address lies inside `buf` (whole lines below its last one), which
            // lives until the end of this test: the SAFETY of every load and flush below.
            let flush_all = || {
                for &a in &addrs {
                    // SAFETY: a line of the live `buf` (see above).
                    unsafe { crate::cache::flush_line(a) };
                }
                crate::cache::fence();
            };
            let mut best = [u64::MAX; 3];
            for _ in 0..20 {
                flush_all();
                best[0] = best[0].min(preheat_runs(&runs, None).elapsed_ns);
                flush_all();
                // SAFETY: lines of the live `buf` (see above).
                best[1] = best[1].min(unsafe { load_runs(&runs, None) }.elapsed_ns);
                flush_all();
                let t = now_ns();
                // SAFETY: lines of the live `buf` (see above).
                std::hint::black_box(unsafe { plain_load(&addrs) });
                best[2] = best[2].min(now_ns() - t);
            }
            let gbs = |ns: u64| addrs.len() as f64 * 64.0 / ns as f64;
            println!(
                "{} lines in runs of {run_len}: prefetch {} ns ({:.1} GB/s), load_runs {} ns ({:.1} GB/s), plain_load {} ns ({:.1} GB/s)",
                addrs.len(),
                best[0],
                gbs(best[0]),
                best[1],
                gbs(best[1]),
                best[2],
                gbs(best[2])
            );
        }
    }
}
