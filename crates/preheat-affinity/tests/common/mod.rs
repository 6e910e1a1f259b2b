//! Machines built in code, mirroring the hardware the tests are about.
#![allow(dead_code)]

use preheat_affinity::{Cache, CacheKind, Cpu, Machine};

pub const K: u64 = 1024;
pub const M: u64 = 1024 * 1024;

pub fn cache(level: u32, kind: CacheKind, bytes: u64, shared: &[u32]) -> Cache {
    Cache {
        level,
        kind,
        bytes,
        line: 64,
        shared_cpus: shared.to_vec(),
    }
}

/// A CPU with private L1d/L1i and the given further caches.
fn cpu(n: u32, package: u32, l1d: u64, l1i: u64, mut more: Vec<Cache>) -> Cpu {
    let mut caches = vec![
        cache(1, CacheKind::Data, l1d, &[n]),
        cache(1, CacheKind::Instruction, l1i, &[n]),
    ];
    caches.append(&mut more);
    Cpu {
        cpu: n,
        package,
        caches,
    }
}

/// (a) This box: 2 vCPUs, private L1d 48K / L1i 32K / L2 2M, one shared 32M L3.
pub fn this_box() -> Machine {
    Machine {
        cpus: (0..2)
            .map(|n| {
                cpu(
                    n,
                    0,
                    48 * K,
                    32 * K,
                    vec![
                        // Listed in an odd order on purpose: the crate must sort.
                        cache(3, CacheKind::Unified, 32 * M, &[0, 1]),
                        cache(2, CacheKind::Unified, 2 * M, &[n]),
                    ],
                )
            })
            .collect(),
    }
}

/// (b) Clovertown-like: 4 cores, private 32K L1s, a 4M L2 per pair {0,1} and {2,3}, no L3.
pub fn clovertown() -> Machine {
    Machine {
        cpus: (0..4)
            .map(|n| {
                let pair = if n < 2 { [0, 1] } else { [2, 3] };
                cpu(
                    n,
                    n / 2,
                    32 * K,
                    32 * K,
                    vec![cache(2, CacheKind::Unified, 4 * M, &pair)],
                )
            })
            .collect(),
    }
}

/// (c) Niagara-like: 8 cores, L1d 8K, L1i 16K, one 3M L2 shared by all.
pub fn niagara() -> Machine {
    let all: Vec<u32> = (0..8).collect();
    Machine {
        cpus: (0..8)
            .map(|n| {
                cpu(
                    n,
                    0,
                    8 * K,
                    16 * K,
                    vec![cache(2, CacheKind::Unified, 3 * M, &all)],
                )
            })
            .collect(),
    }
}

/// (d) One CPU: L1d 32K, L1i 32K, L2 1M, L3 8M, all its own.
pub fn single() -> Machine {
    Machine {
        cpus: vec![cpu(
            0,
            0,
            32 * K,
            32 * K,
            vec![
                cache(2, CacheKind::Unified, M, &[0]),
                cache(3, CacheKind::Unified, 8 * M, &[0]),
            ],
        )],
    }
}

pub const QUANTA: [u32; 3] = [2, 10, 200];
