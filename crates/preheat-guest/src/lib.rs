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
//! | [`cpio`] | the initramfs archive format (newc) |
//! | [`image`] | the cached image: kernel, busybox, `/init`, static `preheat-npb` |
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

pub mod console;
pub mod cpio;
pub mod debian;
pub mod image;
pub mod journal;
pub mod qemu;
pub mod session;

pub use console::Event;
pub use image::{ensure as ensure_image, Image, ImageSpec};
pub use qemu::{Guest, GuestSpec, Workload};

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
