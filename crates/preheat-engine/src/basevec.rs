//! Base vectors (Doucette and Fedorova, WIOSCA'07; used by Kazempour et al., §2.1): programs with
//! a chosen cache footprint that displace a co-scheduled workload's cache state.
//!
//! * [`BaseVector::zero`] — `BV_0`: negligible footprint (register arithmetic on one line).
//! * [`BaseVector::data`] — `BV_L1D`, `BV_L2`, `BV_LLC`: reads one byte of every line of a
//!   buffer of that level's size, over and over (negligible code).
//! * [`BaseVector::code`] — `BV_L1I`: executes a chain of jumps spanning the L1i size
//!   ([`crate::codegen`]; negligible data).
//!
//! A vector advances in small steps (about 4 KiB of footprint each) so that the process running
//! it can look at the clock between steps and notice when it was descheduled.
//!
//! [`verify`] measures what a vector really displaces: a probe buffer (or probe code) of the
//! level's size is made resident, the vector runs, and the probe is timed again — against the
//! same probe timed resident (share 0) and after a reference eviction that certainly displaced
//! it from that level (share 1).

use std::io;

use preheat_model::VirtAddr;

use crate::codegen::{BlockKind, CodeChain};
use crate::time::now_ns;

/// Footprint per step.
pub const STEP_BYTES: usize = 4096;

enum Body {
    Zero,
    Data { buf: Vec<u8> },
    Code { chain: CodeChain },
}

/// A base vector and its position in its footprint; see the module docs.
pub struct BaseVector {
    body: Body,
    cursor: usize,
    sum: u64,
}

impl BaseVector {
    /// `BV_0`.
    pub fn zero() -> BaseVector {
        BaseVector {
            body: Body::Zero,
            cursor: 0,
            sum: 1,
        }
    }

    /// A data vector of `bytes` (at least one step), every page touched now.
    pub fn data(bytes: usize) -> BaseVector {
        let n = bytes.max(STEP_BYTES).div_ceil(STEP_BYTES) * STEP_BYTES;
        let buf: Vec<u8> = (0..n).map(|i| (i / 4096) as u8 ^ 0x5a).collect();
        BaseVector {
            body: Body::Data { buf },
            cursor: 0,
            sum: 0,
        }
    }

    /// A code vector of `bytes` of jumps (x86-64 only; the error says so elsewhere).
    pub fn code(bytes: usize) -> io::Result<BaseVector> {
        let chain = CodeChain::new(
            bytes,
            STEP_BYTES / crate::codegen::BLOCK,
            BlockKind::Jump,
            None,
        )?;
        Ok(BaseVector {
            body: Body::Code { chain },
            cursor: 0,
            sum: 0,
        })
    }

    /// Steps per pass over the whole footprint (1 for `BV_0`).
    pub fn steps_per_pass(&self) -> usize {
        match &self.body {
            Body::Zero => 1,
            Body::Data { buf } => buf.len() / STEP_BYTES,
            Body::Code { chain } => chain.segments(),
        }
    }

    /// One step: about 4 KiB of the footprint (`BV_0`: a few hundred register operations).
    #[inline]
    pub fn step(&mut self) {
        match &self.body {
            Body::Zero => {
                // Register arithmetic as CPU work (an LCG step per iteration, kept from being
                // folded away by `black_box`), not a random number generator: nothing here needs
                // randomness, so this stays hand-written rather than `rand`.
                let mut x = self.sum;
                for _ in 0..256 {
                    x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
                }
                self.sum = x;
            }
            Body::Data { buf } => {
                let start = self.cursor * STEP_BYTES;
                let mut s = 0u64;
                for off in (start..start + STEP_BYTES).step_by(crate::cache::LINE) {
                    s = s.wrapping_add(u64::from(std::hint::black_box(buf[off])));
                }
                self.sum = self.sum.wrapping_add(s);
                self.cursor = (self.cursor + 1) % (buf.len() / STEP_BYTES);
            }
            Body::Code { chain } => {
                self.sum = self
                    .sum
                    .wrapping_add(chain.run_segment(self.cursor, self.sum));
                self.cursor = (self.cursor + 1) % chain.segments();
            }
        }
    }

    /// `passes` passes over the whole footprint.
    pub fn run_passes(&mut self, passes: usize) {
        for _ in 0..passes * self.steps_per_pass() {
            self.step();
        }
        std::hint::black_box(self.sum);
    }
}

/// What a vector displaced, measured by [`verify`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Eviction {
    /// (after − resident) / (reference − resident), clamped to [0, 1]; `None` when the reference
    /// eviction itself cannot be told apart from a resident probe by timing (less than 10% or
    /// 50 ns slower): then nothing can be said about the vector.
    pub share: Option<f64>,
    /// Median time of one probe pass, ns: resident, after the vector, after the reference.
    pub resident_ns: f64,
    pub after_ns: f64,
    pub reference_ns: f64,
    /// Probe passes timed per condition.
    pub samples: usize,
}

/// The probe of a level: data (a random cyclic chase, one hop per line) or code (a shuffled
/// jump chain), so neither a hardware prefetcher nor next-line fetch hides a miss.
pub enum Probe {
    Data(Vec<u32>),
    Code(CodeChain),
}

impl Probe {
    /// A data probe of `bytes`.
    pub fn data(bytes: usize, seed: u64) -> Probe {
        Probe::Data(crate::workloads::chase_ring(bytes, seed))
    }

    /// A code probe of `bytes`.
    pub fn code(bytes: usize, seed: u64) -> io::Result<Probe> {
        Ok(Probe::Code(CodeChain::new(
            bytes,
            STEP_BYTES / crate::codegen::BLOCK,
            BlockKind::Jump,
            Some(seed),
        )?))
    }

    /// One timed pass, ns.
    pub fn pass(&self) -> u64 {
        let t = now_ns();
        match self {
            Probe::Data(ring) => {
                let hops = ring.len() / crate::workloads::SLOT;
                std::hint::black_box(crate::workloads::chase(ring, 0, hops));
            }
            Probe::Code(chain) => {
                std::hint::black_box(chain.run_all(0));
            }
        }
        now_ns().saturating_sub(t)
    }

    /// Flush every line of the probe from all cache levels.
    pub fn flush(&self) {
        match self {
            // SAFETY: the ring is a live heap allocation borrowed from `self` for the call
            // (mapped, readable, not freed meanwhile).
            Probe::Data(ring) => unsafe {
                crate::cache::flush_range(
                    VirtAddr::from_ptr(ring.as_ptr()),
                    std::mem::size_of_val(&ring[..]),
                )
            },
            // SAFETY: the chain's mapping is read+execute and lives as long as `chain`, which
            // `self` holds for the call.
            Probe::Code(chain) => unsafe { crate::cache::flush_range(chain.addr(), chain.len()) },
        }
        crate::cache::fence();
    }
}

/// How the reference eviction (share 1) is made.
pub enum Reference<'a> {
    /// Run this vector (e.g. a data vector twice the level's size) for two passes.
    Vector(&'a mut BaseVector),
    /// Flush the probe's lines (for the last level: the reload then comes from memory).
    Flush,
}

/// Measure the share of `probe` that `vector` (two passes) displaces, against `reference`;
/// `samples` timed passes per condition, medians compared. Pin the calling thread first: the
/// probe, the vector and the reference must run on one CPU.
pub fn verify(
    probe: &Probe,
    vector: &mut BaseVector,
    mut reference: Reference<'_>,
    samples: usize,
) -> Eviction {
    let samples = samples.max(1);
    let warm = |p: &Probe| {
        p.pass();
        p.pass();
    };
    let mut resident = Vec::with_capacity(samples);
    let mut after = Vec::with_capacity(samples);
    let mut refd = Vec::with_capacity(samples);
    for _ in 0..samples {
        warm(probe);
        resident.push(probe.pass() as f64);
        warm(probe);
        vector.run_passes(2);
        after.push(probe.pass() as f64);
        warm(probe);
        match &mut reference {
            Reference::Vector(v) => v.run_passes(2),
            Reference::Flush => probe.flush(),
        }
        refd.push(probe.pass() as f64);
    }
    // The model's median (the lower middle of an even sample).
    let med = |v: Vec<f64>| preheat_model::stats::summarize(&v).p50;
    let (r, a, f) = (med(resident), med(after), med(refd));
    let share = (f - r >= (0.1 * r).max(50.0)).then(|| ((a - r) / (f - r)).clamp(0.0, 1.0));
    Eviction {
        share,
        resident_ns: r,
        after_ns: a,
        reference_ns: f,
        samples,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vectors_step_through_their_footprint() {
        let mut d = BaseVector::data(64 << 10);
        assert_eq!(d.steps_per_pass(), 16);
        d.run_passes(2);
        let mut z = BaseVector::zero();
        assert_eq!(z.steps_per_pass(), 1);
        z.run_passes(3);
        #[cfg(target_arch = "x86_64")]
        {
            let mut c = BaseVector::code(32 << 10).unwrap();
            assert_eq!(c.steps_per_pass(), 8);
            c.run_passes(2);
        }
    }
}
