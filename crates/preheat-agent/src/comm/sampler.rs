//! The sampling thread: every round it restores the pages of the previous round, picks a new
//! sample of the process's writable memory and revokes access to it (SPCD's periodic clearing
//! of present bits, done with `mprotect`).
//!
//! Which pages may be sampled ([`eligible`]): writable private anonymous memory (the heap and
//! anonymous mappings) and shared memory (`/dev/shm`, `memfd:`, SysV, shared anonymous) — the
//! memory threads share data through. Never: file-backed private mappings (library data:
//! glibc's own state, the kernel's rseq and robust-list areas of the main thread near it),
//! stacks (`[stack]`, and every writable mapping right above a `PROT_NONE` guard: thread stacks
//! and alternate signal stacks), special mappings (`[vvar]`, `anon_inode:`, devices), the
//! agent's own object and thread stacks, the main thread's TLS block, and alternate signal
//! stacks registered with `sigaltstack`. Only resident pages are sampled.
//!
//! Re-use (as SPCD keeps sampling the same pages): up to half of a round's pages are pages that
//! faulted in the previous round (active memory); the rest are drawn at random, so new sharing
//! is still discovered.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use preheat_engine::maps;
use preheat_model::comm::{nth_page, split_round, CommAccess, CommConfig, CommFocus, CommRegion};
use preheat_model::Mapping;
use rand::rngs::StdRng as SmallRng;
use rand::{Rng, SeedableRng};

use super::signal::raw_mprotect;
use super::state::{self, ARMED, ARMED_COUNT, BUSY, COUNTERS, FREE, OPEN, PAGE, SLOTS};
use super::RUN;

/// Largest `PROT_NONE` mapping taken for a stack guard (glibc's default guard is one page;
/// `pthread_attr_setguardsize` may ask for more).
const MAX_GUARD: u64 = 1 << 20;

/// Address ranges that must never be sampled, besides what [`eligible`] rules out by kind.
#[derive(Debug, Default, Clone)]
pub struct Exclusions {
    /// The agent's shared object (path as in the maps).
    pub agent_so: Option<String>,
    /// Exact address ranges `[start, end)` that must stay accessible (every loaded object's
    /// image including its .bss — the agent's own tables among them —, the agent threads'
    /// stacks, the main thread's TLS block, alternate signal stacks). Anonymous mappings merge
    /// with their neighbours, so these are cut out of a mapping rather than excluding the whole
    /// mapping.
    pub ranges: Vec<(u64, u64)>,
}

/// A sampleable range and its protection (`PROT_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Eligible {
    pub start: u64,
    pub end: u64,
    pub prot: u8,
}

fn shared_memory_name(name: &str) -> bool {
    name.starts_with("/dev/shm/")
        || name.starts_with("/memfd:")
        || name.starts_with("/SYSV")
        || name.starts_with("/dev/zero")
}

/// The writable ranges of `maps` that may be sampled (see the module doc).
pub fn eligible(maps: &[Mapping], ex: &Exclusions) -> Vec<Eligible> {
    let mut out = Vec::new();
    for (i, m) in maps.iter().enumerate() {
        if !m.read || !m.write || m.end <= m.start {
            continue;
        }
        let name = m.name.as_str();
        let ok_kind = if m.shared {
            name.is_empty() || shared_memory_name(name)
        } else {
            name.is_empty() || name == "[heap]"
        };
        if !ok_kind {
            continue;
        }
        if ex.agent_so.as_deref().is_some_and(|so| so == name) {
            continue;
        }
        if i > 0 {
            let p = &maps[i - 1];
            // A writable mapping directly above a small inaccessible one: a stack and its
            // guard (thread stacks, alternate signal stacks). A large inaccessible mapping
            // below is something else, e.g. the reserved tail of the previous malloc arena.
            if p.end == m.start && !p.read && !p.write && !p.exec && p.end - p.start <= MAX_GUARD {
                continue;
            }
        }
        let prot = libc::PROT_READ | libc::PROT_WRITE | if m.exec { libc::PROT_EXEC } else { 0 };
        for (start, end) in
            preheat_model::addr::subtract_ranges(m.start, m.end, &ex.ranges, PAGE as u64)
        {
            out.push(Eligible {
                start,
                end,
                prot: prot as u8,
            });
        }
    }
    out
}

/// The protection a revoked page gets.
pub fn revoked_prot(access: CommAccess) -> i32 {
    match access {
        CommAccess::Write => libc::PROT_READ,
        CommAccess::Any => libc::PROT_NONE,
    }
}

/// Restore or release one slot at the end of a round; true if it had faulted (it was OPEN).
/// `still_revoked` says whether the maps still show the page with the revoked protection:
/// then it is restored, whatever the slot says (an OPEN slot whose page is still revoked is
/// healed here rather than left for a fault no slot would claim).
fn retire(slot: &state::Slot, still_revoked: bool) -> bool {
    loop {
        let st = slot.state.load(Ordering::Acquire);
        match st {
            FREE => return false,
            ARMED | OPEN => {
                if slot
                    .state
                    .compare_exchange(st, BUSY, Ordering::AcqRel, Ordering::Acquire)
                    .is_err()
                {
                    continue;
                }
                let page = slot.page.load(Ordering::Relaxed);
                if still_revoked {
                    raw_mprotect(page, PAGE, i32::from(slot.prot.load(Ordering::Relaxed)));
                    state::trace(state::ev::RETIRE_RESTORE, u64::from(st), page, 0);
                } else if st == ARMED {
                    COUNTERS.pages_released.fetch_add(1, Ordering::Relaxed);
                    state::trace(state::ev::RETIRE_RELEASE, 0, page, 0);
                } else {
                    state::trace(state::ev::RETIRE_OPEN, 0, page, 0);
                }
                state::note_restore();
                slot.page.store(0, Ordering::Release);
                slot.state.store(FREE, Ordering::Release);
                return st == OPEN;
            }
            _ => std::thread::yield_now(),
        }
    }
}

/// This process's mappings, parsed without file identities (no ELF build-id reads: the sampler
/// reads the maps several times a round, and must stay cheap).
fn own_maps() -> std::io::Result<Vec<Mapping>> {
    std::fs::read_to_string("/proc/self/maps").map(|t| maps::parse_maps(&t))
}

/// Whether `page` is still mapped with the revoked protection (then it is restored). A page
/// that is gone, or whose protection someone else changed, is released without a restore: our
/// `mprotect` must never clobber a mapping the program made. (A revoked page may merge with a
/// neighbouring mapping of the same protection; restoring just that page is still right.)
fn looks_revoked(page: u64, maps: &[Mapping], revoked: i32) -> bool {
    let Some(m) = maps.iter().find(|m| m.start <= page && page < m.end) else {
        return false;
    };
    let want_read = revoked & libc::PROT_READ != 0;
    m.read == want_read && !m.write && !m.exec
}

/// End the current round: restore every revoked page (validated against fresh maps) and free
/// every slot. Returns the pages that faulted during the round and those that did not.
pub fn retire_all(access: CommAccess) -> (Vec<u64>, Vec<u64>) {
    let any_held = SLOTS
        .iter()
        .any(|s| s.state.load(Ordering::Acquire) != FREE);
    let maps = if !any_held {
        Vec::new()
    } else {
        own_maps().unwrap_or_default()
    };
    let revoked = revoked_prot(access);
    let mut faulted = Vec::new();
    let mut idle = Vec::new();
    for s in SLOTS.iter() {
        let page = s.page.load(Ordering::Relaxed) as u64;
        if page == 0 {
            continue;
        }
        let ours = !maps.is_empty() && looks_revoked(page, &maps, revoked);
        if retire(s, ours) {
            faulted.push(page);
        } else {
            idle.push(page);
        }
    }
    ARMED_COUNT.store(0, Ordering::Release);
    (faulted, idle)
}

/// Looks for a moment without a hooked map change in progress: spins of [`QUIET_SPINS`] checks,
/// a yield between them.
const QUIET_TRIES: u32 = 20;
/// Checks per spin (each a few nanoseconds: tens of microseconds on the CPU in all).
const QUIET_SPINS: u32 = 10_000;

/// The eligible ranges with the map generation they were read at. Counts only if no hooked map
/// change was in progress when it began (after [`QUIET_TRIES`] spins that found changes in
/// progress throughout: generation `u64::MAX` and no ranges, so nothing is revoked this time).
///
/// Counted in checks made on the CPU, not in time: a hooked change lasts microseconds, so a
/// spin finds a quiet moment unless the sampler is preempted. A 2 ms deadline with a yield
/// between checks (before) lost to preemption itself — with the program's threads on both
/// CPUs a yield can take longer than that — and a program that changed its mappings all the
/// time was never sampled (measured: `hostile churn`, 0 of 39 rounds, 3 of 14 test runs).
fn snapshot(ex: &Exclusions) -> std::io::Result<(u64, Vec<Eligible>)> {
    for _ in 0..QUIET_TRIES {
        for _ in 0..QUIET_SPINS {
            let g = state::MAP_GEN.load(Ordering::SeqCst);
            if state::MAP_BUSY.load(Ordering::SeqCst) == 0 {
                return Ok((g, eligible(&own_maps()?, ex)));
            }
            std::hint::spin_loop();
        }
        std::thread::yield_now();
    }
    Ok((u64::MAX, Vec::new()))
}

/// Whether `page` lies in one of `ranges` (eligible now); its protection if so.
fn eligible_now(page: u64, ranges: &[Eligible]) -> Option<u8> {
    ranges
        .iter()
        .find(|r| r.start <= page && page < r.end)
        .map(|r| r.prot)
}

/// Revoke `pages`; returns how many were revoked.
///
/// Each page is checked against a snapshot of the maps taken here, right before the first
/// `mprotect`, not against the one the pages were chosen from: map changes that do not go
/// through our hooks (glibc's own `mmap`/`munmap`/`mprotect`: a freed large `malloc` chunk
/// unmapped, a new thread's stack mapped in its place) are invisible to [`state::MAP_GEN`], so
/// between the choice (which reads residency over every eligible range) and the revocation the
/// page may have become part of something that must never be revoked — a thread stack, whose
/// thread may write it with every signal blocked (glibc's thread start) or need it for the
/// signal frame of the fault, and the kernel then kills the process with SIGSEGV without
/// asking the handler. The fresh snapshot shrinks that window to one read of the maps.
///
/// A page is revoked only if no hooked map change was in progress at that snapshot and none
/// that began since touched it (their ranges: [`super::changes`]) — a change that notes itself
/// after we read [`state::MAP_GEN`] sees the page in its slot and waits for us: we store the page
/// in the slot and then read the generation; a hook raises [`state::MAP_BUSY`] and the
/// generation and then reads the slots (all sequentially consistent), so at least one of the
/// two sees the other. A page a change touched is skipped; where the ring cannot tell (too many
/// changes, an entry being written) we take a new snapshot (a few times per round).
fn arm(pages: &[(u64, u8)], access: CommAccess, ex: &Exclusions) -> u64 {
    let (mut gen, mut ranges) = snapshot(ex).unwrap_or((u64::MAX, Vec::new()));
    let revoked = revoked_prot(access);
    ARMED_COUNT.store(pages.len() as u32, Ordering::SeqCst);
    // A snapshot counts only if no hooked map change was in progress when it began.
    let mut snapshots = 1;
    let mut n = 0;
    let mut slots = SLOTS.iter();
    let mut i = 0;
    while i < pages.len() {
        let (page, _) = pages[i];
        let Some(prot) = eligible_now(page, &ranges) else {
            i += 1;
            continue;
        };
        // BUSY from here on: a hooked map change that sees this page waits for us.
        let Some(slot) = state::claim_slot(&mut slots, page, prot) else {
            break;
        };
        let now = state::MAP_GEN.load(Ordering::SeqCst);
        let changed = if now == gen {
            // Nothing since the snapshot; a change in progress that has not noted itself yet
            // will see the page in its slot (see above).
            Some(false)
        } else {
            super::changes::touched(gen, now, page)
        };
        if changed != Some(false) {
            // A map change since the snapshot touched the page, or may have.
            slot.page.store(0, Ordering::SeqCst);
            slot.state.store(FREE, Ordering::SeqCst);
            if changed == Some(true) {
                i += 1;
                continue;
            }
            if snapshots >= 4 {
                break;
            }
            (gen, ranges) = snapshot(ex).unwrap_or((u64::MAX, Vec::new()));
            snapshots += 1;
            slots = SLOTS.iter();
            continue;
        }
        if raw_mprotect(page as usize, PAGE, revoked) {
            state::trace(state::ev::ARM, 0, page as usize, 0);
            slot.state.store(ARMED, Ordering::SeqCst);
            n += 1;
        } else {
            slot.page.store(0, Ordering::SeqCst);
            slot.state.store(FREE, Ordering::SeqCst);
        }
        i += 1;
    }
    n
}

/// Samples with a single thread after which a page counts as private.
const PRIVATE_AFTER: u32 = 3;
/// Rounds without a fault after which a page counts as idle.
const IDLE_AFTER: u32 = 2;
/// Verdicts (private, idle) are forgotten this often (rounds), so changed behaviour is seen.
const FORGET_EVERY: u64 = 50;

/// What the sampler remembers about pages it sampled.
#[derive(Default)]
struct History {
    /// page → faulted samples that showed one thread so far.
    single: std::collections::HashMap<u64, u32>,
    /// page → rounds it was revoked without a fault.
    idle: std::collections::HashMap<u64, u32>,
}

impl History {
    /// Taken for private or idle: random draws skip it.
    fn skip(&self, page: u64) -> bool {
        self.single.get(&page).is_some_and(|&n| n >= PRIVATE_AFTER)
            || self.idle.get(&page).is_some_and(|&n| n >= IDLE_AFTER)
    }

    /// Learn from a round; the pages to keep sampling next round, best first.
    fn keep(&mut self, round: u64, faulted: &[u64], idle: &[u64]) -> Vec<u64> {
        if round.is_multiple_of(FORGET_EVERY) {
            self.single.clear();
            self.idle.clear();
        }
        for &p in idle {
            *self.idle.entry(p).or_insert(0) += 1;
        }
        let mut shared = Vec::new();
        let mut open = Vec::new();
        for &p in faulted {
            self.idle.remove(&p);
            if state::granule_shared(p as usize) {
                shared.push(p);
                continue;
            }
            let n = self.single.entry(p).or_insert(0);
            *n += 1;
            if *n < PRIVATE_AFTER {
                open.push(p);
            }
        }
        shared.extend(open);
        shared
    }
}

/// Pick up to `n` resident pages: first up to half from `reuse` (still eligible), then pages
/// from `written` (the runs written last round, [`split_round`]), then random ones; drawn pages
/// known to be private or idle are skipped.
fn choose(
    ranges: &[Eligible],
    reuse: &[u64],
    written: &[(u64, u64)],
    n: usize,
    rng: &mut SmallRng,
    skip: impl Fn(u64) -> bool,
) -> Vec<(u64, u8)> {
    let resident: Vec<(u64, u64, u8)> = ranges
        .iter()
        .flat_map(|r| {
            maps::resident_ranges(r.start, r.end - r.start)
                .into_iter()
                .map(move |(s, l)| (s, l, r.prot))
        })
        .collect();
    let total_pages: u64 = resident.iter().map(|&(_, l, _)| l / PAGE as u64).sum();
    let mut out: Vec<(u64, u8)> = Vec::with_capacity(n);
    let prot_of = |p: u64| {
        resident
            .iter()
            .find(|&&(s, l, _)| s <= p && p < s + l)
            .map(|&(_, _, prot)| prot)
    };
    let reusable: Vec<(u64, u8)> = reuse
        .iter()
        .filter_map(|&p| prot_of(p).map(|prot| (p, prot)))
        .collect();
    let written_pages: u64 = written.iter().map(|&(_, l)| l / PAGE as u64).sum();
    let (r, w, _) = split_round(n, reusable.len(), written_pages as usize);
    out.extend_from_slice(&reusable[..r]);
    let mut tries = 0;
    while out.len() < r + w && tries < 16 * n {
        tries += 1;
        let Some(p) = nth_page(written, rng.gen_range(0..written_pages), PAGE as u64) else {
            break;
        };
        if let Some(prot) = prot_of(p).filter(|_| !skip(p) && !out.iter().any(|&(q, _)| q == p)) {
            out.push((p, prot));
        }
    }
    if total_pages == 0 {
        return out;
    }
    let mut tries = 0;
    while out.len() < n && tries < 16 * n && (out.len() as u64) < total_pages {
        tries += 1;
        let mut k = rng.gen_range(0..total_pages);
        for &(s, l, prot) in &resident {
            let pages = l / PAGE as u64;
            if k < pages {
                let p = s + k * PAGE as u64;
                if !skip(p) && !out.iter().any(|&(q, _)| q == p) {
                    out.push((p, prot));
                }
                break;
            }
            k -= pages;
        }
    }
    out
}

/// Whether any thread of the process (other than the agent's) blocks SIGSEGV: a write to a
/// revoked page would then kill the process, so no page is revoked while one does.
pub fn thread_blocking_segv() -> Option<u32> {
    let rd = std::fs::read_dir("/proc/self/task").ok()?;
    for e in rd.flatten() {
        let Ok(tid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(text) = std::fs::read_to_string(e.path().join("status")) else {
            continue;
        };
        let blocked = text
            .lines()
            .find_map(|l| l.strip_prefix("SigBlk:"))
            .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
            .unwrap_or(0);
        if blocked & (1 << (libc::SIGSEGV - 1)) != 0 && !crate::threads::is_agent_tid(tid) {
            return Some(tid);
        }
    }
    None
}

/// A thread that blocks SIGSEGV on every one of `samples` looks `interval` apart, or `None`.
/// glibc blocks all signals for a moment in a thread that creates another and in a new thread
/// until it starts, so one look can see a block that is gone a microsecond later; only a block
/// that stays is a reason to refuse. (The sampler looks again before every round anyway.)
pub fn thread_persistently_blocking_segv(samples: u32, interval: Duration) -> Option<u32> {
    let mut seen = thread_blocking_segv()?;
    for _ in 1..samples {
        std::thread::sleep(interval);
        seen = thread_blocking_segv()?;
    }
    Some(seen)
}

/// Let every vCPU thread of the process count ([`CommThreads::Vcpu`]), before a round's pages
/// are revoked (a vCPU thread is named before it runs guest code).
///
/// [`CommThreads::Vcpu`]: preheat_model::comm::CommThreads::Vcpu
fn count_vcpu_threads() {
    let Ok(rd) = std::fs::read_dir("/proc/self/task") else {
        return;
    };
    for e in rd.flatten() {
        let Ok(tid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if std::fs::read_to_string(e.path().join("comm"))
            .is_ok_and(|n| preheat_model::comm::is_vcpu_thread(n.trim_end()))
        {
            state::add_counted(tid);
        }
    }
}

/// The sampled region once found, and the written-page tracker over it.
#[derive(Default)]
struct Focus {
    /// `[start, end)` of the mapping [`CommRegion::MappingBytes`] picked (kept: our own
    /// `mprotect`s split it into several mappings for a moment).
    region: Option<(u64, u64)>,
    tracker: Option<super::written::Tracker>,
    /// The tracker was tried (started or refused).
    tried: bool,
}

/// The first of `ranges` admitted by `region` (a mapping of exactly its size), as `[start, end)`.
pub fn find_region(region: CommRegion, ranges: &[Eligible]) -> Option<(u64, u64)> {
    ranges
        .iter()
        .find(|r| region.admits(r.end - r.start))
        .map(|r| (r.start, r.end))
}

/// `ranges` cut to `[start, end)`.
pub fn clip(ranges: Vec<Eligible>, (start, end): (u64, u64)) -> Vec<Eligible> {
    ranges
        .into_iter()
        .filter(|r| r.end > start && r.start < end)
        .map(|r| Eligible {
            start: r.start.max(start),
            end: r.end.min(end),
            prot: r.prot,
        })
        .collect()
}

impl Focus {
    /// The eligible ranges the configuration's region admits.
    fn restrict(&mut self, region: CommRegion, ranges: Vec<Eligible>) -> Vec<Eligible> {
        if region == CommRegion::All {
            return ranges;
        }
        if self.region.is_none() {
            self.region = find_region(region, &ranges);
            if let Some((s, e)) = self.region {
                crate::log::log(&format!(
                    "comm: sampling only the mapping {s:#x}..{e:#x} ({} MiB)",
                    (e - s) >> 20
                ));
            }
        }
        match self.region {
            Some(r) => clip(ranges, r),
            None => Vec::new(),
        }
    }

    /// Start the written-page tracker over `ranges` (once), or note why not.
    fn start_tracker(&mut self, focus: CommFocus, ranges: &[Eligible]) {
        if self.tried || ranges.is_empty() {
            return;
        }
        self.tried = true;
        let note = match focus {
            CommFocus::Random => "random (SPCD: re-sampled faulting pages, random draws)".into(),
            CommFocus::Written => {
                let rs: Vec<(u64, u64)> = ranges.iter().map(|r| (r.start, r.end)).collect();
                match super::written::Tracker::start(&rs) {
                    Ok(t) => {
                        self.tracker = Some(t);
                        format!(
                            "written (userfaultfd async write-protect + PAGEMAP_SCAN over {} KiB)",
                            rs.iter().map(|(s, e)| e - s).sum::<u64>() >> 10
                        )
                    }
                    Err(e) => format!("random (written requested, unavailable: {e})"),
                }
            }
        };
        crate::log::log(&format!("comm: focus {note}"));
        if let Ok(mut g) = super::FOCUS.try_lock() {
            *g = note;
        }
    }

    /// The runs written since the last call (empty without a tracker; a failing tracker is
    /// dropped).
    fn written(&mut self) -> Vec<(u64, u64)> {
        let Some(t) = self.tracker.as_mut() else {
            return Vec::new();
        };
        match t.scan(1 << 20) {
            Ok(w) => {
                let pages: u64 = w.iter().map(|&(_, l)| l / PAGE as u64).sum();
                COUNTERS.pages_written.fetch_add(pages, Ordering::Relaxed);
                w
            }
            Err(e) => {
                crate::log::log(&format!("comm: written-page tracking stopped: {e}"));
                if let Ok(mut g) = super::FOCUS.try_lock() {
                    *g = format!("random (written tracking stopped: {e})");
                }
                self.tracker = None;
                Vec::new()
            }
        }
    }
}

/// Log what a round chose from (every 100th round).
fn log_round(ranges: &[Eligible], chosen: usize, uffd: bool) {
    let bytes: u64 = ranges.iter().map(|r| r.end - r.start).sum();
    crate::log::log(&format!(
        "comm: round {}: {} eligible ranges ({} KiB), {chosen} pages chosen{}",
        COUNTERS.rounds.load(Ordering::Relaxed),
        ranges.len(),
        bytes >> 10,
        if uffd {
            format!("; userfaultfd fault thread at {}", super::uffd::priority())
        } else {
            String::new()
        }
    ));
}

/// Log a round that revoked nothing, with what may explain it.
fn log_nothing_revoked(ranges: usize, chosen: usize) {
    crate::log::log(&format!(
        "comm: round {}: nothing revoked ({ranges} eligible ranges, {chosen} pages chosen; \
         hooked map changes in progress {}, generation {})",
        COUNTERS.rounds.load(Ordering::Relaxed),
        state::MAP_BUSY.load(Ordering::SeqCst),
        state::MAP_GEN.load(Ordering::SeqCst),
    ));
}

/// The sampler thread's body: rounds until stopped.
pub fn run(cfg: CommConfig, ex: Exclusions) {
    let period = Duration::from_millis(u64::from(cfg.period_ms));
    let n = cfg.pages_per_round() as usize;
    let mut rng = SmallRng::seed_from_u64(u64::from(crate::sys::getpid()) ^ 0x5eed);
    let mut reuse: Vec<u64> = Vec::new();
    let mut history = History::default();
    let mut focus = Focus::default();
    // Rounds that revoked nothing, logged (the first few) with why.
    let mut quiet_rounds = 0u32;
    if super::USE_UFFD.load(Ordering::SeqCst) && !super::uffd::wait_serving(Duration::from_secs(5))
    {
        super::disable("the userfaultfd fault thread did not start within 5 s".into());
        return;
    }
    loop {
        let round_start = Instant::now();
        if !RUN.load(Ordering::Acquire) {
            break;
        }
        let mut extra = ex.clone();
        extra.ranges.extend(crate::threads::agent_stack_ranges());
        extra.ranges.extend(super::altstack_ranges());
        extra.ranges.extend(crate::sys::loaded_object_ranges());
        let uffd = super::USE_UFFD.load(Ordering::SeqCst);
        if state::ONLY_COUNTED.load(Ordering::Acquire) {
            count_vcpu_threads();
        }
        match thread_blocking_segv().filter(|_| !uffd) {
            Some(tid) => {
                if COUNTERS.rounds.load(Ordering::Relaxed).is_multiple_of(50) {
                    crate::log::log(&format!(
                        "comm: thread {tid} blocks SIGSEGV; no pages revoked this round"
                    ));
                }
            }
            None => {
                // The ranges to choose from (`arm` checks the chosen pages against maps read
                // again just before it revokes them).
                let ranges = match snapshot(&extra) {
                    Ok((_, ranges)) => focus.restrict(cfg.region, ranges),
                    Err(e) => {
                        super::disable(format!("cannot read /proc/self/maps: {e}"));
                        break;
                    }
                };
                let ranges = &ranges;
                focus.start_tracker(cfg.focus, ranges);
                let written = focus.written();
                let pages = choose(ranges, &reuse, &written, n, &mut rng, |p| history.skip(p));
                if COUNTERS.rounds.load(Ordering::Relaxed) % 100 == 1 {
                    log_round(ranges, pages.len(), uffd);
                }
                let armed = if uffd {
                    super::uffd::arm(&pages)
                } else {
                    arm(&pages, cfg.access, &extra)
                };
                COUNTERS.pages_revoked.fetch_add(armed, Ordering::Relaxed);
                if armed == 0 && quiet_rounds < 3 {
                    quiet_rounds += 1;
                    log_nothing_revoked(ranges.len(), pages.len());
                }
            }
        }
        // The sampling window: revoked pages fault on their next access.
        while RUN.load(Ordering::Acquire) && round_start.elapsed() < period {
            std::thread::park_timeout(period.saturating_sub(round_start.elapsed()));
        }
        let (faulted, idle) = if uffd {
            super::uffd::retire_all()
        } else {
            retire_all(cfg.access)
        };
        reuse = history.keep(COUNTERS.rounds.load(Ordering::Relaxed), &faulted, &idle);
        COUNTERS.rounds.fetch_add(1, Ordering::Relaxed);
        super::refresh_names();
    }
    if super::USE_UFFD.load(Ordering::SeqCst) {
        super::uffd::retire_all();
    } else {
        retire_all(cfg.access);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(start: u64, end: u64, perms: &str, shared: bool, name: &str) -> Mapping {
        let b = perms.as_bytes();
        Mapping {
            start,
            end,
            read: b[0] == b'r',
            write: b[1] == b'w',
            exec: b[2] == b'x',
            shared,
            offset: 0,
            name: name.into(),
            file: None,
        }
    }

    #[test]
    fn eligible_rules() {
        let maps = vec![
            m(0x1000, 0x3000, "rw-", false, "[heap]"),
            m(0x3000, 0x4000, "rw-", false, "/usr/lib/libc.so.6"),
            m(0x10000, 0x11000, "---", false, ""),
            m(0x11000, 0x20000, "rw-", false, ""), // thread stack above its guard
            m(0x20000, 0x30000, "rw-", false, ""), // anonymous: yes
            m(0x80000, 0x90000, "rw-", false, ""), // an object's .bss cut out of the middle
            m(0x0010_0000, 0x0100_0000, "---", false, ""), // an arena's reserved tail
            m(0x0100_0000, 0x0110_0000, "rw-", false, ""), // the next arena: eligible
            m(0x30000, 0x31000, "rw-", true, "/dev/shm/x"),
            m(0x31000, 0x31800, "rw-", true, "anon_inode:[io_uring]"),
            m(0x40000, 0x41000, "rw-", false, "[stack]"),
            m(0x50000, 0x51000, "r--", false, ""),
            m(0x60000, 0x61000, "rw-", false, "/agent.so"),
            m(0x70000, 0x71000, "rw-", false, ""), // wholly inside an excluded range
        ];
        let ex = Exclusions {
            agent_so: Some("/agent.so".into()),
            ranges: vec![(0x70000, 0x71000), (0x84000, 0x85800)],
        };
        let e = eligible(&maps, &ex);
        let mut got: Vec<(u64, u64)> = e.iter().map(|r| (r.start, r.end)).collect();
        got.sort_unstable();
        assert_eq!(
            got,
            vec![
                (0x1000, 0x3000),
                (0x20000, 0x30000),
                (0x30000, 0x31000),
                (0x80000, 0x84000),
                (0x86000, 0x90000),
                (0x0100_0000, 0x0110_0000)
            ]
        );
        assert!(e
            .iter()
            .all(|r| r.prot == (libc::PROT_READ | libc::PROT_WRITE) as u8));
    }

    #[test]
    fn region_of_exactly_the_guest_size() {
        let e = |start, end| Eligible {
            start,
            end,
            prot: 3,
        };
        let ranges = vec![
            e(0x1000, 0x9000),
            e(0x10_0000, 0x10_0000 + (8 << 20)),
            e(0x100_0000, 0x100_0000 + (16 << 20)),
        ];
        let r = CommRegion::MappingBytes(16 << 20);
        assert_eq!(
            find_region(r, &ranges),
            Some((0x100_0000, 0x100_0000 + (16 << 20)))
        );
        assert_eq!(
            find_region(CommRegion::MappingBytes(3 << 20), &ranges),
            None
        );
        // Split by our own mprotect: the pieces inside the region stay.
        let split = vec![
            e(0x1000, 0x9000),
            e(0x100_0000, 0x100_4000),
            e(0x100_5000, 0x200_0000),
        ];
        let got = clip(split, (0x100_0000, 0x200_0000));
        let got: Vec<(u64, u64)> = got.iter().map(|r| (r.start, r.end)).collect();
        assert_eq!(
            got,
            vec![(0x100_0000, 0x100_4000), (0x100_5000, 0x200_0000)]
        );
    }

    /// A page chosen while it was ordinary anonymous memory is not revoked if, by the time it
    /// would be, it has become a thread stack through calls our hooks never see (glibc frees a
    /// large `malloc` chunk with its own `munmap`, and `pthread_create` maps the next stack,
    /// guard page first, at the same address: measured here, it lands exactly there). A
    /// revoked stack page kills the process: its thread writes it with every signal blocked
    /// (glibc's thread start), or the kernel cannot write the fault's signal frame there.
    #[test]
    fn a_page_that_became_a_thread_stack_after_the_choice_is_not_revoked() {
        let pg = PAGE;
        let rw = libc::PROT_READ | libc::PROT_WRITE;
        let anon = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
        // SAFETY: a fresh private anonymous mapping of our own, written whole; its first page
        // read-only so the rest is not taken for a stack above a guard.
        let base = unsafe {
            let p = libc::syscall(libc::SYS_mmap, 0usize, 4 * pg, rw, anon, -1, 0) as usize;
            assert_ne!(p as *mut libc::c_void, libc::MAP_FAILED);
            std::ptr::write_bytes(p as *mut u8, 1, 4 * pg);
            assert_eq!(libc::syscall(libc::SYS_mprotect, p, pg, libc::PROT_READ), 0);
            p
        };
        let page = (base + 2 * pg) as u64;
        let ex = Exclusions::default();
        // The choice: eligible and resident.
        let (_, before) = snapshot(&ex).unwrap();
        let prot = eligible_now(page, &before).expect("an ordinary anonymous page");
        // Replaced behind the hooks (raw system calls, as glibc's own): a guard page, then a
        // stack written by its thread.
        // SAFETY: our own mapping, replaced in place and written.
        unsafe {
            let g = base + pg;
            let r = libc::syscall(libc::SYS_mmap, g, 3 * pg, 0, anon | libc::MAP_FIXED, -1, 0);
            assert_eq!(r as usize, g);
            assert_eq!(libc::syscall(libc::SYS_mprotect, g + pg, 2 * pg, rw), 0);
            std::ptr::write_bytes((g + pg) as *mut u8, 2, 2 * pg);
        }
        let armed = arm(&[(page, prot)], CommAccess::Write, &ex);
        // Give back whatever was revoked before asserting (the test process has no handler).
        retire_all(CommAccess::Write);
        // SAFETY: our own mapping.
        unsafe { libc::syscall(libc::SYS_munmap, base, 4 * pg) };
        assert_eq!(armed, 0, "a page of a thread stack was revoked");
    }

    #[test]
    fn revoked_page_validation() {
        let maps = vec![
            m(0x1000, 0x2000, "rw-", false, ""),
            m(0x2000, 0x4000, "r--", false, ""),
            m(0x4000, 0x5000, "rw-", false, ""),
        ];
        assert!(looks_revoked(0x2000, &maps, libc::PROT_READ));
        assert!(looks_revoked(0x3000, &maps, libc::PROT_READ));
        // Re-protected by someone else: released, not restored.
        assert!(!looks_revoked(0x4000, &maps, libc::PROT_READ));
        // Unmapped.
        assert!(!looks_revoked(0x7000, &maps, libc::PROT_READ));
        // Wrong protection for the mode.
        assert!(!looks_revoked(0x2000, &maps, libc::PROT_NONE));
    }
}
