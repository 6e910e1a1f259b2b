//! The bundled workloads of the cache-affinity experiments: open-source stand-ins for the SPEC
//! CPU2000 programs of Kazempour et al. with the same spread of temporal reuse.
//!
//! | workload | stands for | behaviour |
//! |---|---|---|
//! | [`Kind::Chase`] | mcf | dependent loads through a random cyclic permutation of a working set (default: the L2 size): high reuse, every miss exposed |
//! | [`Kind::Stream`] | art | sequential reads over a buffer larger than the last-level cache: poor temporal reuse, prefetch-friendly |
//! | [`Kind::Branchy`] | gcc, crafty | a large instruction footprint (generated code, visited in shuffled order) with data-dependent branches |
//!
//! Each advances in units of a few microseconds ([`Workload::step`] returns the work done), so
//! the process running it can count progress and look at the clock between units.
//! [`Workload::runs`] gives the workload's working set as cache-line runs, the format the
//! preheat engine loads ([`crate::preheat::load_runs`]); [`Workload::warm_set`] gives the same
//! runs together with a share of the memory they name, so another thread can load them safely
//! ([`WarmSet::load`]) while the workload runs.

use std::any::Any;
use std::io;
use std::sync::Arc;

use preheat_model::{AbsRun, VirtAddr};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::cache::LINE;
use crate::codegen::{BlockKind, CodeChain};

/// `u32` slots per cache line in a chase ring.
pub const SLOT: usize = LINE / 4;

/// A random cyclic permutation of the lines of a `bytes` buffer (Sattolo's algorithm): slot `i·SLOT`
/// holds the slot index of the next line, every line is visited once per cycle.
pub fn chase_ring(bytes: usize, seed: u64) -> Vec<u32> {
    let lines = (bytes / LINE).max(2);
    let mut order: Vec<u32> = (0..lines as u32).collect();
    let mut rng = StdRng::seed_from_u64(seed);
    for i in (1..lines).rev() {
        let j = rng.gen_range(0..i);
        order.swap(i, j);
    }
    let mut ring = vec![0u32; lines * SLOT];
    // Large rings on huge pages where the system allows it (THP "madvise"), so a random walk
    // measures caches, not TLB misses. The zeroed allocation is still untouched here.
    if bytes >= 4 << 20 {
        let _ = crate::os::advise_hugepages(VirtAddr::from_ptr(ring.as_ptr()), ring.len() * 4);
    }
    for k in 0..lines {
        let from = order[k] as usize;
        let to = order[(k + 1) % lines];
        ring[from * SLOT] = to * SLOT as u32;
    }
    ring
}

/// Follow `hops` links of `ring` from slot `at`; returns the slot reached.
#[inline]
pub fn chase(ring: &[u32], mut at: usize, hops: usize) -> usize {
    for _ in 0..hops {
        at = ring[at] as usize;
    }
    at
}

/// Which bundled workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Chase,
    Stream,
    Branchy,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Chase => "chase",
            Kind::Stream => "stream",
            Kind::Branchy => "branchy",
        }
    }

    /// The SPEC CPU2000 program it stands for.
    pub fn stands_for(self) -> &'static str {
        match self {
            Kind::Chase => "mcf",
            Kind::Stream => "art",
            Kind::Branchy => "gcc/crafty",
        }
    }

    pub fn parse(s: &str) -> Option<Kind> {
        [Kind::Chase, Kind::Stream, Kind::Branchy]
            .into_iter()
            .find(|k| k.name() == s)
    }

    /// Work units per [`Workload::step`], and what a unit is.
    pub fn unit(self) -> (u64, &'static str) {
        match self {
            Kind::Chase => (CHASE_HOPS as u64, "dependent loads"),
            Kind::Stream => (STREAM_BYTES as u64 / LINE as u64, "lines read"),
            Kind::Branchy => (BRANCHY_SEGMENT as u64, "code blocks executed"),
        }
    }
}

const CHASE_HOPS: usize = 64;
const STREAM_BYTES: usize = 4096;
const BRANCHY_SEGMENT: usize = 64;

// The memory is shared (`Arc`) and never mutated after construction, so a [`WarmSet`] can keep
// it alive, at the same address, after the workload is gone.
enum Body {
    Chase {
        ring: Arc<Vec<u32>>,
        at: usize,
    },
    Stream {
        buf: Arc<Vec<u64>>,
        at: usize,
    },
    Branchy {
        chain: Arc<CodeChain>,
        seg: usize,
        state: u64,
    },
}

/// A bundled workload with its state; see the module docs.
pub struct Workload {
    kind: Kind,
    body: Body,
    sum: u64,
}

impl Workload {
    /// Build `kind` with a working set of `bytes` (chase: data; stream: data; branchy: code).
    pub fn new(kind: Kind, bytes: usize, seed: u64) -> io::Result<Workload> {
        let body = match kind {
            Kind::Chase => Body::Chase {
                ring: Arc::new(chase_ring(bytes, seed)),
                at: 0,
            },
            Kind::Stream => {
                let words = bytes.max(STREAM_BYTES).div_ceil(STREAM_BYTES) * STREAM_BYTES / 8;
                Body::Stream {
                    buf: Arc::new((0..words as u64).collect()),
                    at: 0,
                }
            }
            Kind::Branchy => Body::Branchy {
                chain: Arc::new(CodeChain::new(
                    bytes,
                    BRANCHY_SEGMENT,
                    BlockKind::Branchy,
                    Some(seed),
                )?),
                seg: 0,
                state: seed | 1,
            },
        };
        Ok(Workload { kind, body, sum: 0 })
    }

    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// One unit of work; returns the work done (see [`Kind::unit`]).
    #[inline]
    pub fn step(&mut self) -> u64 {
        match &mut self.body {
            Body::Chase { ring, at } => {
                *at = chase(ring, *at, CHASE_HOPS);
                CHASE_HOPS as u64
            }
            Body::Stream { buf, at } => {
                let n = STREAM_BYTES / 8;
                let s: u64 = buf[*at..*at + n]
                    .iter()
                    .fold(0u64, |a, &x| a.wrapping_add(x));
                self.sum = self.sum.wrapping_add(std::hint::black_box(s));
                *at = (*at + n) % buf.len();
                (STREAM_BYTES / LINE) as u64
            }
            Body::Branchy { chain, seg, state } => {
                *state = chain.run_segment(*seg, *state);
                *seg = (*seg + 1) % chain.segments();
                BRANCHY_SEGMENT as u64
            }
        }
    }

    /// The working set as cache-line runs (sorted by address), for the preheat engine.
    ///
    /// The runs name this workload's own memory (heap buffers, or the code chain's read+execute
    /// mapping): they are mapped and readable while the workload lives, and [`Workload::step`]
    /// never moves or resizes them — what a caller of [`crate::preheat::load_runs`] must know.
    /// To load them from another thread, use [`Workload::warm_set`] instead.
    pub fn runs(&self) -> Vec<AbsRun> {
        let (addr, bytes, exec) = match &self.body {
            Body::Chase { ring, .. } => (
                ring.as_ptr() as usize,
                std::mem::size_of_val(&ring[..]),
                false,
            ),
            Body::Stream { buf, .. } => (
                buf.as_ptr() as usize,
                std::mem::size_of_val(&buf[..]),
                false,
            ),
            Body::Branchy { chain, .. } => (chain.addr().0 as usize, chain.len(), true),
        };
        let first = addr / LINE * LINE;
        let lines = (addr + bytes).div_ceil(LINE) - first / LINE;
        // Runs of at most u32::MAX lines (any real working set is one run).
        let mut out = Vec::new();
        let mut left = lines as u64;
        let mut at = first as u64;
        while left > 0 {
            let n = left.min(u64::from(u32::MAX));
            out.push(AbsRun {
                addr: VirtAddr(at),
                lines: n as u32,
                exec,
            });
            at += n * LINE as u64;
            left -= n;
        }
        out
    }
}

impl Workload {
    /// The working set ([`Workload::runs`]) with a share of the memory it names: loading it
    /// stays safe on any thread for as long as the [`WarmSet`] lives, even after the workload
    /// itself is dropped.
    pub fn warm_set(&self) -> WarmSet {
        let memory: Arc<dyn Any + Send + Sync> = match &self.body {
            Body::Chase { ring, .. } => ring.clone(),
            Body::Stream { buf, .. } => buf.clone(),
            Body::Branchy { chain, .. } => chain.clone(),
        };
        WarmSet {
            runs: self.runs(),
            _memory: memory,
        }
    }
}

/// A workload's working set as runs, and a share of the memory they name (which it keeps
/// alive), so that loading it is safe: see [`Workload::warm_set`].
pub struct WarmSet {
    runs: Vec<AbsRun>,
    /// The buffer or code chain the runs lie in; never mutated by anyone.
    _memory: Arc<dyn Any + Send + Sync>,
}

impl WarmSet {
    /// The runs (sorted by address).
    pub fn runs(&self) -> &[AbsRun] {
        &self.runs
    }

    /// Load every line ([`crate::preheat::load_runs`]), stopping at `deadline_ns`.
    pub fn load(&self, deadline_ns: Option<u64>) -> crate::preheat::PreheatReport {
        // SAFETY: the runs lie in `_memory` (a heap buffer, or a code chain's read+execute
        // mapping), which this value keeps alive; nobody mutates, moves or resizes it after the
        // workload was built, so every line is mapped and readable for the whole call.
        unsafe { crate::preheat::load_runs(&self.runs, deadline_ns) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chase_ring_is_one_cycle_through_every_line() {
        let ring = chase_ring(64 * 100, 7);
        let mut seen = [false; 100];
        let mut at = 0;
        for _ in 0..100 {
            assert!(!seen[at / SLOT]);
            seen[at / SLOT] = true;
            at = ring[at] as usize;
        }
        assert_eq!(at, 0);
        assert!(seen.iter().all(|&s| s));
    }

    #[test]
    fn workloads_step_and_name_their_working_set() {
        for kind in [Kind::Chase, Kind::Stream, Kind::Branchy] {
            if kind == Kind::Branchy && !cfg!(target_arch = "x86_64") {
                continue;
            }
            let mut w = Workload::new(kind, 256 << 10, 1).unwrap();
            let mut work = 0;
            for _ in 0..1000 {
                work += w.step();
            }
            assert_eq!(work, 1000 * kind.unit().0);
            let lines: u64 = w.runs().iter().map(|r| u64::from(r.lines)).sum();
            assert!(lines >= (256 << 10) / LINE as u64, "{kind:?}: {lines}");
            // SAFETY: the runs are `w`'s own memory, alive (and not resized) while `w` is.
            let r = unsafe { crate::preheat::load_runs(&w.runs(), None) };
            assert_eq!(r.lines_done, lines);
            // The warm set keeps the memory after the workload is gone.
            let warm = w.warm_set();
            assert_eq!(warm.runs(), &w.runs()[..]);
            drop(w);
            assert_eq!(warm.load(None).lines_done, lines);
        }
    }
}
