//! preheat-guest: real virtual machines for the coscheduling experiments (issue 22).
//!
//! Busse et al., *Partial Coscheduling of Virtual Machines Based on Memory Access Patterns*
//! (`../shared/papers/partial-coscheduling.txt`), coschedule the vCPUs of KVM guests running
//! the NAS Parallel Benchmarks. This crate gives us such guests on a stock Debian host without
//! installing anything into the host's `/boot`: a small guest image built on first use from
//! Debian packages only, QEMU guests with a known vCPU count, and the guest's own progress
//! (barrier phases per second of the bundled NPB-style kernels) read from its serial console.
//!
//! | module | what |
//! |---|---|
//! | [`debian`] | apt look-ups, package downloads, extraction (no installation) |
//! | [`comm`] | host-side communication detection in QEMU, the matrix against the truth |
//! | [`cpio`] | the initramfs archive format (newc) |
//! | [`image`] | the cached image: kernel, busybox, `/init`, static `preheat-npb` |
//! | [`pvh`] | the kernel unpacked from its bzImage, for QEMU to start at its PVH entry |
//! | [`console`] | `/init`, and the console lines it and the workload print, read |
//! | [`qemu`] | one guest: QEMU started, its threads (`CPU n/TCG`), its console, stopped |
//! | [`journal`] | running guests on record, so a SIGKILLed owner's are stopped next time |
//! | [`session`] | one guest from boot to power-off: its threads, progress, phase rate |
//!
//! Invariants: no `unsafe` (the OS through the engine); prints nothing. Every QEMU it starts is
//! stopped on drop, error and SIGINT/SIGTERM (`preheat-launch`), killed by the kernel when the
//! thread that started it dies (parent-death signal), and otherwise by the next start or
//! `preheat guest cleanup` (the journal). What is missing (QEMU, apt, a package) is a
//! [`Missing`] error naming what to install, never a silent fallback.

#![forbid(unsafe_code)]

pub mod comm;
pub mod console;
pub mod cpio;
pub mod debian;
pub mod image;
pub mod journal;
pub mod pvh;
pub mod qemu;
pub mod session;

pub use console::Event;
pub use image::{ensure as ensure_image, Image, ImageSpec};
pub use qemu::{Guest, GuestSpec, Workload};

/// `preheat guest --help`.
pub const HELP: &str =
    "Real virtual machines for the coscheduling experiments (issue 22): QEMU guests \
with a known number of vCPUs, each vCPU one host thread (`CPU n/TCG`), running the bundled \
NPB-style kernels and reporting their progress (barrier phases per second of the guest's own \
clock) on the serial console.\n\n\
The guest image is built on first use from Debian packages only and cached (in \
$PREHEAT_CACHE_DIR, else $XDG_CACHE_HOME/preheat, else ~/.cache/preheat; under guest/, keyed by \
the package versions and the preheat-npb binary): the kernel the metapackage linux-image-amd64 \
names (downloaded with apt-get download, never installed), busybox-static, and a statically \
linked preheat-npb (built with cargo from a source checkout, or $PREHEAT_NPB_STATIC_BIN). QEMU \
comes from the Debian package qemu-system-x86. KVM is not used: /dev/kvm on our VMs cannot boot \
stock kernels; multi-threaded TCG can (about 8 s from start to user space here).\n\n\
No guest outlives the command: QEMU is stopped on exit, error and SIGINT/SIGTERM, dies with the \
command (parent-death signal), and is journaled in $PREHEAT_RUN_DIR/guests so that the next \
`guest run` or `guest cleanup` stops what a SIGKILLed command left.\n\n\
`guest comm` measures host-side communication detection (SPCD in QEMU: the guest's RAM only, \
the vCPU threads only, draws from the pages the guest wrote): the vCPU matrix of a guest whose \
two threads share against one whose threads share nothing, several runs each, with medians.\n\n\
Examples:\n  preheat guest build\n  preheat guest run --vcpus 2 --kernel mg --seconds 10\n  \
preheat guest run --vcpus 1 --idle\n  preheat guest comm --kernel mg\n  preheat guest cleanup";

/// Something a guest needs that this host lacks.
#[derive(Debug, thiserror::Error)]
pub enum Missing {
    /// A program, with the Debian package that has it.
    #[error(
        "{tool} is not installed: install the Debian package {package} (apt-get install {package})"
    )]
    Tool { tool: String, package: String },
    /// A package apt cannot provide.
    #[error("the Debian package {name} is not available: {detail} (run apt-get update, or name another with --kernel-package)")]
    Package { name: String, detail: String },
}
