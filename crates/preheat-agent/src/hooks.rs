//! The interposed libc functions.
//!
//! Each hook forwards to the real function resolved once by the constructor
//! ([`crate::sys::resolve_real_functions`]); if a hook runs before that (another library's
//! constructor) or `dlsym` failed, it issues the raw system call instead. Hooks never call
//! `dlsym`, never allocate, lock, log or panic, and preserve errno across their own work (the
//! wait and read paths by calling nothing that writes it on their fast path: see
//! [`crate::track`]). When
//! the agent is inactive or disabled, or the caller is one of the agent's own threads, they are
//! pure pass-through ([`track::tracking`]).
//!
//! `close` forgets the fd's port (on host threads only: with the agent's own file table, see
//! [`crate::fdreg`], an agent thread's fd number is not the host's). Where the agent shares
//! the host's table, `close`, `close_range` and `closefrom` additionally leave the agent's own
//! fds open when the host closes them (daemons close "every" fd after fork): closing them
//! would let the host reuse the numbers while an agent thread still reads or writes them. The
//! host sees success. With the agent's own table they pass every call through: the host's
//! table holds none of the agent's fds, and a host fd with an agent fd's number is the host's.
//!
//! # Abort safety
//!
//! The hooks are `extern "C"`: since Rust 1.81 (the workspace requires 1.89) a panic that
//! reaches such a boundary aborts the process instead of unwinding into C — which would still
//! kill the host. So nothing on the hooked path may panic, and that is checked, not hoped for:
//! every file the hooks run code from (this one, [`crate::track`], [`crate::sys`],
//! [`crate::fdreg`], the fault handler's [`crate::faults`], and the detector's
//! [`crate::comm::hooks`], [`crate::comm::release`], [`crate::comm::signal`],
//! [`crate::comm::state`]) denies `clippy::panic`, `unwrap_used`,
//! `expect_used`, `indexing_slicing`, `arithmetic_side_effects` (overflow panics in debug
//! builds, which the tests preload), `unreachable`, `todo` and `unimplemented`. What the lints
//! cannot see is kept out by rule: no `assert!`, no `RefCell::borrow_mut` (only `try_*`), no
//! `thread_local!` `with` (only `try_with`), and calls into other crates only to functions that
//! cannot panic (`preheat_engine::{os::gettid, os::current_cpu, time::now_ns, time::stamp,
//! time::stamp_cpu, time::stamps_are_tsc, guard::fixup}`, libc).
//! A hook therefore needs no `catch_unwind`: there is nothing to catch.
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

use std::ptr;

use libc::{
    c_int, c_void, epoll_event, fd_set, iovec, msghdr, nfds_t, pollfd, sigset_t, size_t, sockaddr,
    socklen_t, ssize_t, timespec, timeval,
};

use crate::sys::{self, errno, real, set_errno};
use crate::track::{self, ThreadSlot};

/// Size of the kernel's signal set (`_NSIG / 8`), as the raw syscalls expect.
const KERNEL_SIGSET: usize = 8;

// The wait and read paths of `track` preserve errno themselves: their fast path calls nothing
// that writes it, their slow paths save and restore it (see the `track` module docs).

#[inline(always)]
fn wait_pre() -> Option<&'static ThreadSlot> {
    track::wait_enter()
}

#[inline(always)]
fn wait_post(s: Option<&'static ThreadSlot>, ret: c_int) {
    if let Some(s) = s {
        track::wait_exit(s, ret > 0);
    }
}

#[inline(always)]
fn read_post(fd: c_int, ret: ssize_t) {
    track::on_read(fd, ret);
}

fn ms_to_timespec(ms: c_int) -> Option<timespec> {
    (ms >= 0).then(|| timespec {
        tv_sec: (ms / 1000) as libc::time_t,
        tv_nsec: ((ms % 1000) as libc::c_long).saturating_mul(1_000_000),
    })
}

fn opt_ptr<T>(o: &Option<T>) -> *const T {
    match o {
        Some(v) => v as *const T,
        None => ptr::null(),
    }
}

// ---------------------------------------------------------------- the hook pattern

/// Defines one interposed libc function: forward the arguments unchanged to the real function
/// (resolved by the constructor into `sys::$slot`), or, before that or if `dlsym` failed, run
/// `$fallback`, the raw system call with the same meaning. `wait` hooks mark the calling thread
/// idle around the call (the end and start of busy periods); `read` hooks attribute bytes read
/// from `fd` to its listening port, and mark a blocking reader (see [`crate::track`]) idle while
/// it blocks on a tracked connection. The function-pointer type is derived from the parameter
/// list, so it cannot disagree with the exported signature.
///
/// Every invocation states, in a `// SAFETY:` comment above it, why its fallback is sound.
macro_rules! hook {
    (
        $(#[$attr:meta])*
        $kind:ident fn $name:ident($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty,
        real = $slot:ident,
        fallback = $fallback:block
    ) => {
        $(#[$attr])*
        ///
        /// # Safety
        /// The same contract as the libc function of this name.
        #[no_mangle]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
            type RealFn = unsafe extern "C" fn($($ty),*) -> $ret;
            let pre = hook!(@pre $kind, $($arg),*);
            // SAFETY: `RealFn` is the exact C signature of the resolved function (built from this
            // function's own parameter list); the arguments are passed on unchanged under the
            // caller's contract; the fallback's soundness is argued at the invocation.
            let call = || unsafe {
                match real::<RealFn>(&sys::$slot) {
                    Some(f) => f($($arg),*),
                    None => $fallback,
                }
            };
            let mut ret = call();
            // A buffer on a page the communication detector revoked makes the kernel fail
            // the call with EFAULT: give the pages back and retry once (nothing was consumed).
            if crate::comm::efault_retry(ret < 0) {
                ret = call();
            }
            hook!(@post $kind, pre, ret, $($arg),*);
            ret
        }
    };
    (
        $(#[$attr:meta])*
        $kind:ident fn $name:ident($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty,
        real = $slot:ident,
        hold = $t:ident,
        fallback = $fallback:block
    ) => {
        $(#[$attr])*
        ///
        /// # Safety
        /// The same contract as the libc function of this name.
        #[no_mangle]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
            type RealFn = unsafe extern "C" fn($($ty),*) -> $ret;
            let pre = hook!(@pre $kind, $($arg),*);
            // SAFETY: as in the plain pattern; the one argument that differs is the timeout
            // (`$t`, shadowed by the closure's parameter), which the hold replaces by 0 or by
            // what is left of the caller's own timeout.
            let call = |$t: c_int| unsafe {
                match real::<RealFn>(&sys::$slot) {
                    Some(f) => f($($arg),*),
                    None => $fallback,
                }
            };
            let once = |t: c_int| {
                let mut r = call(t);
                if crate::comm::efault_retry(r < 0) {
                    r = call(t);
                }
                r
            };
            // A host thread the agent tracks waits through the hold (crate::hold): it polls
            // while a replay's window is open.
            let ret = if pre.is_some() { crate::hold::wait($t, once) } else { once($t) };
            hook!(@post $kind, pre, ret, $($arg),*);
            ret
        }
    };
    (@pre wait, $($arg:ident),*) => { wait_pre() };
    (@pre read, $fd:ident $(, $rest:ident)*) => { track::read_enter($fd) };
    (@pre write, $($arg:ident),*) => { () };
    (@post wait, $pre:ident, $ret:ident, $($arg:ident),*) => { wait_post($pre, $ret) };
    (@post read, $pre:ident, $ret:ident, $fd:ident $(, $rest:ident)*) => {{
        track::read_exit($pre);
        read_post($fd, $ret)
    }};
    (@post write, $pre:ident, $ret:ident, $fd:ident $(, $rest:ident)*) => {{
        let () = $pre;
        track::on_write($fd, $ret)
    }};
}

// ---------------------------------------------------------------- event waits

// SAFETY (fallback): epoll_wait is epoll_pwait with a NULL signal mask.
hook! {
    wait fn epoll_wait(epfd: c_int, events: *mut epoll_event, maxevents: c_int, timeout: c_int) -> c_int,
    real = REAL_EPOLL_WAIT,
    hold = timeout,
    fallback = {
        libc::syscall(
            libc::SYS_epoll_pwait,
            epfd,
            events,
            maxevents,
            timeout,
            ptr::null::<sigset_t>(),
            KERNEL_SIGSET,
        ) as c_int
    }
}

// SAFETY (fallback): the raw syscall with the caller's arguments and the kernel's sigset size.
hook! {
    wait fn epoll_pwait(
        epfd: c_int,
        events: *mut epoll_event,
        maxevents: c_int,
        timeout: c_int,
        sigmask: *const sigset_t,
    ) -> c_int,
    real = REAL_EPOLL_PWAIT,
    hold = timeout,
    fallback = {
        libc::syscall(
            libc::SYS_epoll_pwait,
            epfd,
            events,
            maxevents,
            timeout,
            sigmask,
            KERNEL_SIGSET,
        ) as c_int
    }
}

// SAFETY (fallback): the raw syscall with the caller's arguments and the kernel's sigset size.
hook! {
    wait fn epoll_pwait2(
        epfd: c_int,
        events: *mut epoll_event,
        maxevents: c_int,
        timeout: *const timespec,
        sigmask: *const sigset_t,
    ) -> c_int,
    real = REAL_EPOLL_PWAIT2,
    fallback = {
        libc::syscall(
            libc::SYS_epoll_pwait2,
            epfd,
            events,
            maxevents,
            timeout,
            sigmask,
            KERNEL_SIGSET,
        ) as c_int
    }
}

// SAFETY (fallback): ppoll with a timespec on this frame (NULL for an infinite timeout) is poll.
hook! {
    wait fn poll(fds: *mut pollfd, nfds: nfds_t, timeout: c_int) -> c_int,
    real = REAL_POLL,
    fallback = { raw_poll(fds, nfds, timeout) }
}

// SAFETY (fallback): as `poll`; `fdslen` is only the fortification's bound.
hook! {
    /// Fortified `poll` (`_FORTIFY_SOURCE`).
    wait fn __poll_chk(fds: *mut pollfd, nfds: nfds_t, timeout: c_int, fdslen: size_t) -> c_int,
    real = REAL_POLL_CHK,
    fallback = {
        let _ = fdslen;
        raw_poll(fds, nfds, timeout)
    }
}

/// `poll` as a raw `ppoll` system call with the timeout converted on this frame (NULL for an
/// infinite timeout).
///
/// # Safety
/// As poll(2).
unsafe fn raw_poll(fds: *mut pollfd, nfds: nfds_t, timeout: c_int) -> c_int {
    let ts = ms_to_timespec(timeout);
    // SAFETY: the caller's poll contract covers `fds`/`nfds`; the timespec lives on this frame.
    unsafe {
        libc::syscall(
            libc::SYS_ppoll,
            fds,
            nfds,
            opt_ptr(&ts),
            ptr::null::<sigset_t>(),
            KERNEL_SIGSET,
        ) as c_int
    }
}

// SAFETY (fallback): copies `*tmo` when non-null (the kernel writes the remaining time back,
// the C API promises not to) and passes the copy from this frame.
hook! {
    wait fn ppoll(
        fds: *mut pollfd,
        nfds: nfds_t,
        tmo: *const timespec,
        sigmask: *const sigset_t,
    ) -> c_int,
    real = REAL_PPOLL,
    fallback = { raw_ppoll(fds, nfds, tmo, sigmask) }
}

// SAFETY (fallback): as `ppoll`; `fdslen` is only the fortification's bound.
hook! {
    /// Fortified `ppoll`.
    wait fn __ppoll_chk(
        fds: *mut pollfd,
        nfds: nfds_t,
        tmo: *const timespec,
        sigmask: *const sigset_t,
        fdslen: size_t,
    ) -> c_int,
    real = REAL_PPOLL_CHK,
    fallback = {
        let _ = fdslen;
        raw_ppoll(fds, nfds, tmo, sigmask)
    }
}

/// `ppoll` as a raw system call on a copy of `*tmo`.
///
/// # Safety
/// `tmo` is null or points to a readable timespec; the rest as ppoll(2).
unsafe fn raw_ppoll(
    fds: *mut pollfd,
    nfds: nfds_t,
    tmo: *const timespec,
    sigmask: *const sigset_t,
) -> c_int {
    // SAFETY: `tmo` is null or readable (caller); the copy lives on this frame for the call.
    unsafe {
        let ts = if tmo.is_null() { None } else { Some(*tmo) };
        libc::syscall(
            libc::SYS_ppoll,
            fds,
            nfds,
            opt_ptr(&ts),
            sigmask,
            KERNEL_SIGSET,
        ) as c_int
    }
}

// SAFETY (fallback): converts `*timeout` (if non-null) to a timespec on this frame for pselect6
// (NULL sigmask data) and writes the remaining time back, as Linux select does.
hook! {
    wait fn select(
        nfds: c_int,
        readfds: *mut fd_set,
        writefds: *mut fd_set,
        exceptfds: *mut fd_set,
        timeout: *mut timeval,
    ) -> c_int,
    real = REAL_SELECT,
    fallback = {
        let mut ts = if timeout.is_null() {
            None
        } else {
            Some(timespec {
                tv_sec: (*timeout).tv_sec,
                tv_nsec: ((*timeout).tv_usec as libc::c_long).saturating_mul(1000),
            })
        };
        let tsp = match &mut ts {
            Some(t) => t as *mut timespec,
            None => ptr::null_mut(),
        };
        let r = libc::syscall(
            libc::SYS_pselect6,
            nfds,
            readfds,
            writefds,
            exceptfds,
            tsp,
            ptr::null::<c_void>(),
        ) as c_int;
        if let Some(t) = ts {
            (*timeout).tv_sec = t.tv_sec;
            (*timeout).tv_usec = (t.tv_nsec / 1000) as libc::suseconds_t;
        }
        r
    }
}

// SAFETY (fallback): copies `*timeout` (pselect must not modify it; the kernel would) and
// passes pselect6's {sigmask, size} pair from this frame.
hook! {
    wait fn pselect(
        nfds: c_int,
        readfds: *mut fd_set,
        writefds: *mut fd_set,
        exceptfds: *mut fd_set,
        timeout: *const timespec,
        sigmask: *const sigset_t,
    ) -> c_int,
    real = REAL_PSELECT,
    fallback = {
        let mut ts = if timeout.is_null() {
            None
        } else {
            Some(*timeout)
        };
        let tsp = match &mut ts {
            Some(t) => t as *mut timespec,
            None => ptr::null_mut(),
        };
        let data: [usize; 2] = [sigmask as usize, KERNEL_SIGSET];
        libc::syscall(
            libc::SYS_pselect6,
            nfds,
            readfds,
            writefds,
            exceptfds,
            tsp,
            data.as_ptr(),
        ) as c_int
    }
}

// ---------------------------------------------------------------- accept

type AcceptFn = unsafe extern "C" fn(c_int, *mut sockaddr, *mut socklen_t) -> c_int;
type Accept4Fn = unsafe extern "C" fn(c_int, *mut sockaddr, *mut socklen_t, c_int) -> c_int;

#[inline(always)]
fn accept_post(fd: c_int, ret: c_int) {
    if ret >= 0 {
        let e = errno();
        track::on_accept(fd, ret);
        set_errno(e);
    }
}

/// # Safety
/// Same contract as accept(2).
#[no_mangle]
pub unsafe extern "C" fn accept(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    // SAFETY: arguments forwarded unchanged; accept is accept4 with flags 0.
    let ret = unsafe {
        match real::<AcceptFn>(&sys::REAL_ACCEPT) {
            Some(f) => f(fd, addr, len),
            None => libc::syscall(libc::SYS_accept4, fd, addr, len, 0) as c_int,
        }
    };
    accept_post(fd, ret);
    ret
}

/// # Safety
/// Same contract as accept4(2).
#[no_mangle]
pub unsafe extern "C" fn accept4(
    fd: c_int,
    addr: *mut sockaddr,
    len: *mut socklen_t,
    flags: c_int,
) -> c_int {
    // SAFETY: arguments forwarded unchanged.
    let ret = unsafe {
        match real::<Accept4Fn>(&sys::REAL_ACCEPT4) {
            Some(f) => f(fd, addr, len, flags),
            None => libc::syscall(libc::SYS_accept4, fd, addr, len, flags) as c_int,
        }
    };
    accept_post(fd, ret);
    ret
}

// ---------------------------------------------------------------- reads

type CloseFn = unsafe extern "C" fn(c_int) -> c_int;

// SAFETY (fallback): the raw syscall with the caller's arguments.
hook! {
    read fn read(fd: c_int, buf: *mut c_void, count: size_t) -> ssize_t,
    real = REAL_READ,
    fallback = { libc::syscall(libc::SYS_read, fd, buf, count) as ssize_t }
}

// SAFETY (fallback): clamps to the known buffer length.
hook! {
    /// Fortified `read`.
    read fn __read_chk(fd: c_int, buf: *mut c_void, count: size_t, buflen: size_t) -> ssize_t,
    real = REAL_READ_CHK,
    fallback = { libc::syscall(libc::SYS_read, fd, buf, count.min(buflen)) as ssize_t }
}

// SAFETY (fallback): recv is recvfrom with a NULL address.
hook! {
    read fn recv(fd: c_int, buf: *mut c_void, len: size_t, flags: c_int) -> ssize_t,
    real = REAL_RECV,
    fallback = {
        libc::syscall(
            libc::SYS_recvfrom,
            fd,
            buf,
            len,
            flags,
            ptr::null_mut::<sockaddr>(),
            ptr::null_mut::<socklen_t>(),
        ) as ssize_t
    }
}

// SAFETY (fallback): as `recv`, clamped to the known buffer length.
hook! {
    /// Fortified `recv`.
    read fn __recv_chk(fd: c_int, buf: *mut c_void, len: size_t, buflen: size_t, flags: c_int) -> ssize_t,
    real = REAL_RECV_CHK,
    fallback = {
        libc::syscall(
            libc::SYS_recvfrom,
            fd,
            buf,
            len.min(buflen),
            flags,
            ptr::null_mut::<sockaddr>(),
            ptr::null_mut::<socklen_t>(),
        ) as ssize_t
    }
}

// SAFETY (fallback): the raw syscall with the caller's arguments.
hook! {
    read fn recvfrom(
        fd: c_int,
        buf: *mut c_void,
        len: size_t,
        flags: c_int,
        addr: *mut sockaddr,
        alen: *mut socklen_t,
    ) -> ssize_t,
    real = REAL_RECVFROM,
    fallback = { libc::syscall(libc::SYS_recvfrom, fd, buf, len, flags, addr, alen) as ssize_t }
}

// SAFETY (fallback): as `recvfrom`, clamped to the known buffer length.
hook! {
    /// Fortified `recvfrom`.
    read fn __recvfrom_chk(
        fd: c_int,
        buf: *mut c_void,
        len: size_t,
        buflen: size_t,
        flags: c_int,
        addr: *mut sockaddr,
        alen: *mut socklen_t,
    ) -> ssize_t,
    real = REAL_RECVFROM_CHK,
    fallback = {
        libc::syscall(libc::SYS_recvfrom, fd, buf, len.min(buflen), flags, addr, alen) as ssize_t
    }
}

// SAFETY (fallback): the raw syscall with the caller's arguments.
hook! {
    read fn recvmsg(fd: c_int, msg: *mut msghdr, flags: c_int) -> ssize_t,
    real = REAL_RECVMSG,
    fallback = { libc::syscall(libc::SYS_recvmsg, fd, msg, flags) as ssize_t }
}

// ---------------------------------------------------------------- writes
//
// Only for blocking readers (track's section of that name): the reply written on the
// connection a blocking reader read ends its busy period (a thread that parks on a futex after
// answering, as a JVM executor does, would otherwise stay busy until its next read). Every
// other caller pays one relaxed load.

// SAFETY (fallback): the raw syscall with the caller's arguments.
hook! {
    write fn write(fd: c_int, buf: *const c_void, count: size_t) -> ssize_t,
    real = REAL_WRITE,
    fallback = { libc::syscall(libc::SYS_write, fd, buf, count) as ssize_t }
}

// SAFETY (fallback): the raw syscall with the caller's arguments.
hook! {
    write fn writev(fd: c_int, iov: *const iovec, iovcnt: c_int) -> ssize_t,
    real = REAL_WRITEV,
    fallback = { libc::syscall(libc::SYS_writev, fd, iov, iovcnt) as ssize_t }
}

// SAFETY (fallback): send is sendto with a NULL address.
hook! {
    write fn send(fd: c_int, buf: *const c_void, len: size_t, flags: c_int) -> ssize_t,
    real = REAL_SEND,
    fallback = {
        libc::syscall(
            libc::SYS_sendto,
            fd,
            buf,
            len,
            flags,
            ptr::null::<sockaddr>(),
            0 as socklen_t,
        ) as ssize_t
    }
}

// SAFETY (fallback): the raw syscall with the caller's arguments.
hook! {
    write fn sendto(
        fd: c_int,
        buf: *const c_void,
        len: size_t,
        flags: c_int,
        addr: *const sockaddr,
        alen: socklen_t,
    ) -> ssize_t,
    real = REAL_SENDTO,
    fallback = { libc::syscall(libc::SYS_sendto, fd, buf, len, flags, addr, alen) as ssize_t }
}

// SAFETY (fallback): the raw syscall with the caller's arguments.
hook! {
    write fn sendmsg(fd: c_int, msg: *const msghdr, flags: c_int) -> ssize_t,
    real = REAL_SENDMSG,
    fallback = { libc::syscall(libc::SYS_sendmsg, fd, msg, flags) as ssize_t }
}

// SAFETY (fallback): the raw syscall with the caller's arguments.
hook! {
    read fn readv(fd: c_int, iov: *const iovec, iovcnt: c_int) -> ssize_t,
    real = REAL_READV,
    fallback = { libc::syscall(libc::SYS_readv, fd, iov, iovcnt) as ssize_t }
}

// ---------------------------------------------------------------- close

type CloseRangeFn = unsafe extern "C" fn(libc::c_uint, libc::c_uint, c_int) -> c_int;
type CloseFromFn = unsafe extern "C" fn(c_int);

/// The host is closing fds it may not own, in the file table it shares with the agent (with
/// a private agent table, see [`crate::fdreg`], no host call can reach an agent fd, and a host
/// fd with an agent fd's number is the host's to close).
#[inline(always)]
fn protect_agent_fds() -> bool {
    track::ACTIVE.load(std::sync::atomic::Ordering::Relaxed)
        && !crate::fdreg::private_table()
        && !track::is_agent_thread()
}

fn raw_close_range(first: libc::c_uint, last: libc::c_uint, flags: c_int) -> c_int {
    // SAFETY: close_range(2) takes no pointers.
    unsafe { libc::syscall(libc::SYS_close_range, first, last, flags) as c_int }
}

/// close_range over `[first, last]` minus the agent's fds, piece by piece, via `f`.
fn close_range_around_agent_fds(
    first: libc::c_uint,
    last: libc::c_uint,
    flags: c_int,
    f: impl Fn(libc::c_uint, libc::c_uint, c_int) -> c_int,
) -> c_int {
    let mut lo = first;
    while lo <= last {
        match crate::fdreg::next_agent_fd(lo, last) {
            Some(fd) => {
                if fd > lo {
                    let r = f(lo, fd.saturating_sub(1), flags);
                    if r != 0 {
                        return r;
                    }
                }
                if fd == libc::c_uint::MAX {
                    return 0;
                }
                lo = fd.saturating_add(1);
            }
            None => return f(lo, last, flags),
        }
    }
    0
}

/// # Safety
/// Same contract as close_range(2).
#[no_mangle]
pub unsafe extern "C" fn close_range(
    first: libc::c_uint,
    last: libc::c_uint,
    flags: c_int,
) -> c_int {
    // SAFETY: arguments forwarded (possibly as sub-ranges) to close_range, which takes no
    // pointers.
    let call = |a: libc::c_uint, b: libc::c_uint, fl: c_int| unsafe {
        match real::<CloseRangeFn>(&sys::REAL_CLOSE_RANGE) {
            Some(f) => f(a, b, fl),
            None => raw_close_range(a, b, fl),
        }
    };
    if !protect_agent_fds() {
        return call(first, last, flags);
    }
    // The agent's fds stay open (see `close`); the fd→port table is not touched here (a
    // bulk close is a start-up or fork-child affair, not a connection's end).
    close_range_around_agent_fds(first, last, flags, call)
}

/// # Safety
/// Same contract as closefrom(3).
#[no_mangle]
pub unsafe extern "C" fn closefrom(lowfd: c_int) {
    let low = lowfd.max(0) as libc::c_uint;
    if protect_agent_fds() && crate::fdreg::next_agent_fd(low, libc::c_uint::MAX).is_some() {
        let r = close_range_around_agent_fds(low, libc::c_uint::MAX, 0, raw_close_range);
        if r == 0 {
            return;
        }
        // No close_range(2) (kernel < 5.9): close one by one up to the fd limit.
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes into a valid local.
        let max = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 {
            lim.rlim_cur.min(1 << 20) as c_int
        } else {
            65536
        };
        for fd in lowfd.max(0)..max {
            if !crate::fdreg::is_agent_fd(fd) {
                // SAFETY: close(2) of an fd number; errors (EBADF) are ignored, as closefrom does.
                unsafe { libc::syscall(libc::SYS_close, fd) };
            }
        }
        return;
    }
    // SAFETY: forwarded unchanged; the fallback is the close_range syscall closefrom uses.
    unsafe {
        match real::<CloseFromFn>(&sys::REAL_CLOSEFROM) {
            Some(f) => f(lowfd),
            None => {
                raw_close_range(low, libc::c_uint::MAX, 0);
            }
        }
    }
}

/// # Safety
/// Same contract as close(2).
#[no_mangle]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    if track::ACTIVE.load(std::sync::atomic::Ordering::Relaxed) {
        if crate::fdreg::private_table() {
            // An agent thread closes a number of the agent's own table, not the host's: the
            // host's fd→port tables stay as they are.
            if !track::is_agent_thread() {
                track::on_close(fd);
            }
        } else if crate::fdreg::is_agent_fd(fd) && !track::is_agent_thread() {
            // Shared table: the host closing one of the agent's fds (daemons closing "all" fds
            // after fork): keep it open and report success. Closing it would let the host
            // reuse the number while an agent thread still reads or writes it.
            return 0;
        } else {
            // Forget the fd before the real close: afterwards its number may be reused at once.
            track::on_close(fd);
        }
    }
    // SAFETY: argument forwarded unchanged.
    unsafe {
        match real::<CloseFn>(&sys::REAL_CLOSE) {
            Some(f) => f(fd),
            None => libc::syscall(libc::SYS_close, fd) as c_int,
        }
    }
}
