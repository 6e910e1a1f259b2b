//! Timeslot allocation (Fastpass §3, "timeslot allocation"): pure, no I/O.
//!
//! Time is divided into slots of `slot_ns` (the time one MTU-sized frame occupies a link,
//! [`slot_ns`]); slot `k` starts at `k · slot_ns`. In every slot each host sends at most one
//! packet and receives at most one packet, so no queue builds up anywhere in a full-bisection
//! network and the arrival time of every packet is known in advance (which is what lets the
//! arbiter announce it, paper §3.2).
//!
//! [`Allocator::allocate`] computes, for a window of slots, the greedy maximal matching of
//! Fastpass: demands are visited oldest first and each takes every slot of the window in which
//! both its source and its destination are still free, until it has all its packets. Visiting
//! demand by demand over the whole window is equivalent to the per-slot greedy pass (slot by
//! slot, demands oldest first), because whether a demand takes slot `t` depends only on what
//! older demands took in slot `t` and what the demand itself took before `t`. Consequences:
//!
//! * no host sends or receives twice in one slot, and windows of successive calls never
//!   overlap (the allocator remembers its horizon), so this holds across calls too;
//! * a demand is delayed only by older demands that share its source or its destination: it
//!   is fully allocated within (packets of older pending demands sharing its source or
//!   destination) + (its own packets) slots of allocation time — nothing starves;
//! * unallocated packets carry over to the next call, keeping their place in the FIFO.

use crate::wire::Demand;
use crate::HostId;
use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};

/// Multiplicative hash for the per-call host index (host ids are not attacker-chosen here:
/// only authenticated demands reach the allocator, and the table is rebuilt every call).
#[derive(Default)]
struct HostHasher(u64);

impl Hasher for HostHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(5) ^ u64::from(b)).wrapping_mul(0x517c_c1b7_2722_0a95);
        }
    }
    fn write_u32(&mut self, v: u32) {
        self.0 = (u64::from(v) ^ 0x9e37_79b9_7f4a_7c15).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
}

type HostIndex = HashMap<HostId, usize, BuildHasherDefault<HostHasher>>;

/// Ethernet per-frame overhead on the wire beyond the MTU: preamble+SFD 8, header 14, FCS 4,
/// inter-frame gap 12.
pub const ETHERNET_OVERHEAD_BYTES: u32 = 38;

/// Time to send one MTU-sized frame (plus [`ETHERNET_OVERHEAD_BYTES`]) at `link_bits_per_s`,
/// rounded up to whole ns; saturates at `u32::MAX` (also for a zero link rate).
pub fn slot_ns(link_bits_per_s: u64, mtu_bytes: u32) -> u32 {
    if link_bits_per_s == 0 {
        return u32::MAX;
    }
    let bits = (u128::from(mtu_bytes) + u128::from(ETHERNET_OVERHEAD_BYTES)) * 8;
    let ns = (bits * 1_000_000_000).div_ceil(u128::from(link_bits_per_s));
    u32::try_from(ns).unwrap_or(u32::MAX)
}

#[derive(Debug, Clone)]
struct Pending {
    src: HostId,
    demand: Demand,
    remaining: u16,
}

/// The Fastpass-style timeslot allocator (see the module docs).
#[derive(Debug, Clone)]
pub struct Allocator {
    slot_ns: u64,
    pending: VecDeque<Pending>,
    /// First slot index not yet handed out: windows start at or after it.
    horizon: u64,
    // Scratch, reused across calls.
    index: HostIndex,
    send_busy: Vec<u64>,
    recv_busy: Vec<u64>,
    taken: Vec<u64>,
}

/// One allocated run: `(source host, the demand as added, start of the first slot in ns,
/// number of consecutive slots)`.
pub type Run = (HostId, Demand, u64, u16);

impl Allocator {
    /// `slot_ns` of 0 is treated as 1.
    pub fn new(slot_ns: u32) -> Allocator {
        Allocator {
            slot_ns: u64::from(slot_ns.max(1)),
            pending: VecDeque::new(),
            horizon: 0,
            index: HostIndex::default(),
            send_busy: Vec::new(),
            recv_busy: Vec::new(),
            taken: Vec::new(),
        }
    }

    pub fn slot_ns(&self) -> u32 {
        self.slot_ns as u32
    }

    /// Queue a demand of `src` (behind every demand queued before). Demands for zero packets
    /// are ignored.
    pub fn add(&mut self, src: HostId, d: Demand) {
        if d.packets == 0 {
            return;
        }
        self.pending.push_back(Pending {
            src,
            demand: d,
            remaining: d.packets,
        });
    }

    /// Demands with packets still unallocated.
    pub fn pending_demands(&self) -> usize {
        self.pending.len()
    }

    /// Packets still unallocated.
    pub fn pending_packets(&self) -> u64 {
        self.pending.iter().map(|p| u64::from(p.remaining)).sum()
    }

    /// Start (ns) of the first slot that a later call may still hand out: slots before it are
    /// committed (used or deliberately left empty).
    pub fn horizon_ns(&self) -> u64 {
        self.horizon.saturating_mul(self.slot_ns)
    }

    /// Allocate up to `max_slots` slots: the window starts at the first slot boundary at or
    /// after both `first_slot_start_ns` and [`Allocator::horizon_ns`]. Returns the runs in
    /// FIFO order of their demands (runs of one demand in time order); a demand may get
    /// several runs ("consecutive-or-later slots"). Afterwards the horizon is the end of the
    /// last slot used (unused slots after it stay available to the next call).
    pub fn allocate(&mut self, first_slot_start_ns: u64, max_slots: usize) -> Vec<Run> {
        let mut out = Vec::new();
        if max_slots == 0 || self.pending.is_empty() {
            return out;
        }
        let first = first_slot_start_ns.div_ceil(self.slot_ns).max(self.horizon);
        // Keep every slot start representable in ns.
        let limit = (u64::MAX / self.slot_ns).saturating_sub(first);
        let n = max_slots.min(usize::try_from(limit).unwrap_or(usize::MAX));
        if n == 0 {
            return out;
        }
        let words = n.div_ceil(64);
        let last_mask = if n % 64 == 0 {
            u64::MAX
        } else {
            (1u64 << (n % 64)) - 1
        };

        self.index.clear();
        self.send_busy.clear();
        self.recv_busy.clear();
        let mut used_end = 0usize; // one past the last slot used in the window

        for p in self.pending.iter_mut() {
            let si = host_index(
                &mut self.index,
                &mut self.send_busy,
                &mut self.recv_busy,
                words,
                p.src,
            );
            let di = host_index(
                &mut self.index,
                &mut self.send_busy,
                &mut self.recv_busy,
                words,
                p.demand.dst,
            );
            self.taken.clear();
            let mut need = p.remaining;
            for w in 0..words {
                if need == 0 {
                    break;
                }
                let valid = if w + 1 == words { last_mask } else { u64::MAX };
                let mut free =
                    !(self.send_busy[si * words + w] | self.recv_busy[di * words + w]) & valid;
                let mut take = 0u64;
                while free != 0 && need > 0 {
                    let bit = free & free.wrapping_neg();
                    take |= bit;
                    free &= free - 1;
                    need -= 1;
                }
                if take != 0 {
                    self.send_busy[si * words + w] |= take;
                    self.recv_busy[di * words + w] |= take;
                    self.taken.push(w as u64);
                    self.taken.push(take);
                }
            }
            if need == p.remaining {
                continue;
            }
            p.remaining = need;
            // Turn the taken bits into runs of consecutive slots.
            let mut run: Option<(usize, u16)> = None;
            for pair in self.taken.chunks_exact(2) {
                let (w, mut bits) = (pair[0] as usize, pair[1]);
                while bits != 0 {
                    let slot = w * 64 + bits.trailing_zeros() as usize;
                    bits &= bits - 1;
                    run = match run {
                        Some((s, len)) if s + len as usize == slot => Some((s, len + 1)),
                        Some((s, len)) => {
                            out.push((p.src, p.demand, (first + s as u64) * self.slot_ns, len));
                            Some((slot, 1))
                        }
                        None => Some((slot, 1)),
                    };
                    used_end = used_end.max(slot + 1);
                }
            }
            if let Some((s, len)) = run {
                out.push((p.src, p.demand, (first + s as u64) * self.slot_ns, len));
            }
        }
        self.pending.retain(|p| p.remaining > 0);
        if used_end > 0 {
            self.horizon = first + used_end as u64;
        }
        out
    }
}

fn host_index(
    index: &mut HostIndex,
    send: &mut Vec<u64>,
    recv: &mut Vec<u64>,
    words: usize,
    h: HostId,
) -> usize {
    *index.entry(h).or_insert_with(|| {
        let i = send.len() / words;
        send.resize(send.len() + words, 0);
        recv.resize(recv.len() + words, 0);
        i
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(dst: HostId, packets: u16, flow: u64) -> Demand {
        Demand {
            dst,
            dst_port: 80,
            packets,
            flow,
        }
    }

    #[test]
    fn slot_length_of_common_links() {
        // 10 Gb/s, 1500 B MTU: 1538 B · 8 = 12304 bits = 1230.4 ns → 1231.
        assert_eq!(slot_ns(10_000_000_000, 1500), 1231);
        assert_eq!(slot_ns(1_000_000_000, 1500), 12304);
        assert_eq!(slot_ns(100_000_000_000, 9000), 724); // 72304 bits → 723.04 ns
        assert_eq!(slot_ns(0, 1500), u32::MAX);
        assert_eq!(slot_ns(1, u32::MAX), u32::MAX);
    }

    #[test]
    fn matching_in_one_slot_and_carry_over() {
        let mut a = Allocator::new(1000);
        a.add(1, d(2, 1, 10)); // 1→2
        a.add(3, d(2, 1, 11)); // 3→2 conflicts on the receiver
        a.add(1, d(4, 1, 12)); // 1→4 conflicts on the sender
        a.add(5, d(6, 1, 13)); // independent
        let r = a.allocate(0, 1);
        assert_eq!(r, vec![(1, d(2, 1, 10), 0, 1), (5, d(6, 1, 13), 0, 1)]);
        assert_eq!(a.pending_demands(), 2);
        assert_eq!(a.horizon_ns(), 1000);
        // The next call may not reuse slot 0 even if asked to.
        let r = a.allocate(0, 1);
        assert_eq!(
            r,
            vec![(3, d(2, 1, 11), 1000, 1), (1, d(4, 1, 12), 1000, 1)]
        );
        assert_eq!(a.pending_demands(), 0);
        assert!(a.allocate(0, 10).is_empty());
    }

    #[test]
    fn multi_packet_demands_form_runs() {
        let mut a = Allocator::new(100);
        a.add(1, d(2, 3, 1)); // slots 0,1,2
        a.add(3, d(2, 2, 2)); // receiver 2 busy until 3 → slots 3,4
        a.add(3, d(4, 4, 3)); // sender 3 free in 0,1,2 then busy 3,4, free 5 → 0,1,2,5
        let r = a.allocate(250, 8); // rounds up to slot 3
        assert_eq!(
            r,
            vec![
                (1, d(2, 3, 1), 300, 3),
                (3, d(2, 2, 2), 600, 2),
                (3, d(4, 4, 3), 300, 3),
                (3, d(4, 4, 3), 800, 1),
            ]
        );
        assert_eq!(a.horizon_ns(), 900);
    }

    #[test]
    fn windows_wider_than_a_word() {
        let mut a = Allocator::new(1);
        a.add(1, d(2, 200, 1));
        let r = a.allocate(0, 130);
        assert_eq!(r, vec![(1, d(2, 200, 1), 0, 130)]);
        let r = a.allocate(0, 130);
        assert_eq!(r, vec![(1, d(2, 200, 1), 130, 70)]);
        assert_eq!(a.pending_demands(), 0);
    }
}
