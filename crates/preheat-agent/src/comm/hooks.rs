//! The interposed calls that keep communication detection invisible to the host program:
//! signal masks for SIGSEGV, alternate signal stacks, and the calls that change mappings (which
//! first give back any page the detector revoked). The dispositions (`sigaction`, `signal`)
//! are [`crate::faults`]'s, which the probe shares.
//!
//! Like every hook (see [`crate::hooks`]): forward to the real function resolved by the
//! constructor, or to the raw system call before that; never allocate, log or panic; cost one
//! atomic load when detection has no page revoked.
//!
//! Hooked path: the lints below (see the crate docs) reject panicking code here.
#![deny(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects,
    clippy::unreachable,
    clippy::todo,
    clippy::unimplemented
)]

use libc::{c_int, c_void, off_t, size_t};

use super::{MapChange, Release};
use crate::sys::{self, real};

/// A copy of `set` without SIGSEGV when it would block SIGSEGV while detection is installed
/// (a blocked synchronous SIGSEGV makes the kernel kill the process).
///
/// # Safety
/// `set` is null or points to a readable sigset.
unsafe fn without_segv(how: c_int, set: *const libc::sigset_t) -> Option<libc::sigset_t> {
    if set.is_null() || how == libc::SIG_UNBLOCK || !super::strip_segv() {
        return None;
    }
    // SAFETY: `set` is readable (caller).
    let mut copy = unsafe { *set };
    // SAFETY: `copy` is a valid local.
    if unsafe { libc::sigismember(&copy, libc::SIGSEGV) } != 1 {
        return None;
    }
    // SAFETY: `copy` is a valid local sigset and SIGSEGV a valid signal number.
    unsafe { libc::sigdelset(&mut copy, libc::SIGSEGV) };
    Some(copy)
}

type MaskFn = unsafe extern "C" fn(c_int, *const libc::sigset_t, *mut libc::sigset_t) -> c_int;

fn raw_sigprocmask(how: c_int, set: *const libc::sigset_t, old: *mut libc::sigset_t) -> c_int {
    // SAFETY: pointers forwarded from the caller (null or valid), the kernel's sigset size.
    unsafe { libc::syscall(libc::SYS_rt_sigprocmask, how, set, old, 8) as c_int }
}

/// A signal-mask call through `slot` with SIGSEGV kept unblocked (see [`without_segv`]), or,
/// before resolution, the raw system call. Returns the result and whether it came from the raw
/// call (which returns -1 with errno set, as `sigprocmask` does).
///
/// # Safety
/// As sigprocmask(2).
unsafe fn mask_via(
    slot: &sys::Real,
    how: c_int,
    set: *const libc::sigset_t,
    old: *mut libc::sigset_t,
) -> (c_int, bool) {
    // SAFETY: `set` null or readable (caller).
    let copy = unsafe { without_segv(how, set) };
    let set = copy.as_ref().map_or(set, |c| c as *const libc::sigset_t);
    // SAFETY: `slot` is one of the sigprocmask/pthread_sigmask slots, whose C signature is
    // `MaskFn` (caller).
    match unsafe { real::<MaskFn>(slot) } {
        // SAFETY: the real function; `set` is the caller's or our local copy, `old` the caller's
        // (both null or valid under the caller's contract).
        Some(f) => (unsafe { f(how, set, old) }, false),
        None => (raw_sigprocmask(how, set, old), true),
    }
}

/// # Safety
/// Same contract as sigprocmask(2).
#[no_mangle]
pub unsafe extern "C" fn sigprocmask(
    how: c_int,
    set: *const libc::sigset_t,
    old: *mut libc::sigset_t,
) -> c_int {
    // SAFETY: the caller's contract.
    unsafe { mask_via(&sys::REAL_SIGPROCMASK, how, set, old) }.0
}

/// # Safety
/// Same contract as pthread_sigmask(3) (returns the error number instead of setting errno).
#[no_mangle]
pub unsafe extern "C" fn pthread_sigmask(
    how: c_int,
    set: *const libc::sigset_t,
    old: *mut libc::sigset_t,
) -> c_int {
    // SAFETY: the caller's contract.
    match unsafe { mask_via(&sys::REAL_PTHREAD_SIGMASK, how, set, old) } {
        (r, true) if r != 0 => sys::errno(),
        (r, _) => r,
    }
}

/// # Safety
/// Same contract as sigaltstack(2).
#[no_mangle]
pub unsafe extern "C" fn sigaltstack(ss: *const libc::stack_t, old: *mut libc::stack_t) -> c_int {
    type AltFn = unsafe extern "C" fn(*const libc::stack_t, *mut libc::stack_t) -> c_int;
    if !ss.is_null() {
        // SAFETY: `ss` is readable (caller).
        let s = unsafe { *ss };
        if s.ss_flags & libc::SS_DISABLE == 0 {
            super::note_altstack(s.ss_sp as u64, s.ss_size as u64);
        }
    }
    // SAFETY: forwarded under the caller's contract.
    unsafe {
        match real::<AltFn>(&sys::REAL_SIGALTSTACK) {
            Some(f) => f(ss, old),
            None => libc::syscall(libc::SYS_sigaltstack, ss, old) as c_int,
        }
    }
}

/// # Safety
/// Same contract as mprotect(2).
#[no_mangle]
pub unsafe extern "C" fn mprotect(addr: *mut c_void, len: size_t, prot: c_int) -> c_int {
    type F = unsafe extern "C" fn(*mut c_void, size_t, c_int) -> c_int;
    let _change = MapChange::begin(addr as usize, len, Release::Restore);
    // SAFETY: forwarded under the caller's contract.
    unsafe {
        match real::<F>(&sys::REAL_MPROTECT) {
            Some(f) => f(addr, len, prot),
            None => libc::syscall(libc::SYS_mprotect, addr, len, prot) as c_int,
        }
    }
}

/// # Safety
/// Same contract as munmap(2).
#[no_mangle]
pub unsafe extern "C" fn munmap(addr: *mut c_void, len: size_t) -> c_int {
    type F = unsafe extern "C" fn(*mut c_void, size_t) -> c_int;
    let _change = MapChange::begin(addr as usize, len, Release::Restore);
    // SAFETY: forwarded under the caller's contract.
    unsafe {
        match real::<F>(&sys::REAL_MUNMAP) {
            Some(f) => f(addr, len),
            None => libc::syscall(libc::SYS_munmap, addr, len) as c_int,
        }
    }
}

type MmapFn = unsafe extern "C" fn(*mut c_void, size_t, c_int, c_int, c_int, off_t) -> *mut c_void;

/// mmap through `slot`, inside a [`MapChange`]: revoked pages a fixed mapping replaces are
/// given back first; a slot inside the new mapping afterwards (a page we revoked was unmapped
/// behind our back, or revoked just now from an older snapshot) gets the new mapping's
/// protection and is forgotten.
///
/// # Safety
/// As mmap(2).
unsafe fn mmap_via(
    slot: &sys::Real,
    addr: *mut c_void,
    len: size_t,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: off_t,
) -> *mut c_void {
    let fixed = if flags & libc::MAP_FIXED != 0 { len } else { 0 };
    let change = MapChange::begin(addr as usize, fixed, Release::Restore);
    // SAFETY: forwarded under the caller's contract.
    let r = unsafe {
        match real::<MmapFn>(slot) {
            Some(f) => f(addr, len, prot, flags, fd, off),
            None => libc::syscall(libc::SYS_mmap, addr, len, prot, flags, fd, off) as *mut c_void,
        }
    };
    if r != libc::MAP_FAILED {
        change.also(r as usize, len, Release::NewMapping(prot));
    }
    r
}

/// # Safety
/// Same contract as mmap(2).
#[no_mangle]
pub unsafe extern "C" fn mmap(
    addr: *mut c_void,
    len: size_t,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: off_t,
) -> *mut c_void {
    // SAFETY: as mmap(2), the caller's contract.
    unsafe { mmap_via(&sys::REAL_MMAP, addr, len, prot, flags, fd, off) }
}

/// # Safety
/// Same contract as mmap64(3) (the same as mmap on 64-bit Linux).
#[no_mangle]
pub unsafe extern "C" fn mmap64(
    addr: *mut c_void,
    len: size_t,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: off_t,
) -> *mut c_void {
    // SAFETY: as mmap(2), the caller's contract.
    unsafe { mmap_via(&sys::REAL_MMAP64, addr, len, prot, flags, fd, off) }
}

/// `mremap` (variadic in C; the fifth argument is read only with `MREMAP_FIXED`, when the
/// caller passes it — on x86-64 a variadic caller passes it in the same register).
///
/// # Safety
/// Same contract as mremap(2).
#[no_mangle]
pub unsafe extern "C" fn mremap(
    old: *mut c_void,
    old_len: size_t,
    new_len: size_t,
    flags: c_int,
    new_addr: *mut c_void,
) -> *mut c_void {
    type F = unsafe extern "C" fn(*mut c_void, size_t, size_t, c_int, ...) -> *mut c_void;
    let change = MapChange::begin(old as usize, old_len, Release::Restore);
    let fixed = flags & libc::MREMAP_FIXED != 0;
    if fixed {
        change.also(new_addr as usize, new_len, Release::Restore);
    }
    let target = if fixed {
        new_addr
    } else {
        std::ptr::null_mut()
    };
    // SAFETY: forwarded under the caller's contract (the fifth argument only with
    // MREMAP_FIXED, as the C API requires).
    let r = unsafe {
        match real::<F>(&sys::REAL_MREMAP) {
            Some(f) => f(old, old_len, new_len, flags, target),
            None => {
                libc::syscall(libc::SYS_mremap, old, old_len, new_len, flags, target) as *mut c_void
            }
        }
    };
    if r != libc::MAP_FAILED {
        change.also(r as usize, new_len, Release::Restore);
    }
    r
}
