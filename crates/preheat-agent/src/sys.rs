//! The FFI boundary of the agent: slots holding the real libc functions (resolved once with
//! `dlsym(RTLD_NEXT)` in the constructor), errno, futex, `poll`/`eventfd`/`send` for the agent's
//! own threads, `dladdr`, `getsockname` and `pthread_atfork`.
//!
//! Together with [`crate::hooks`] this is the only place of the agent with `unsafe`; every
//! block has a `// SAFETY:` comment. Everything else (clocks, flush/prefetch, maps) comes from
//! `preheat-engine`.
//!
//! The slots and helpers the hooks use (`Real`, errno, `local_port`) are on the hooked path, so
//! the whole file is held to its lints (see the crate docs).
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

use std::ffi::CStr;
use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

use libc::{c_int, c_void};

/// One real-function slot: the address `dlsym(RTLD_NEXT, name)` returned, 0 if unresolved.
pub struct Real {
    pub name: &'static CStr,
    addr: AtomicUsize,
}

impl Real {
    const fn new(name: &'static CStr) -> Real {
        Real {
            name,
            addr: AtomicUsize::new(0),
        }
    }
    /// The resolved address, 0 if the constructor has not run yet or `dlsym` failed.
    #[inline(always)]
    pub fn get(&self) -> usize {
        self.addr.load(Ordering::Relaxed)
    }
}

/// Reinterpret a resolved slot as a function pointer of type `F`.
///
/// # Safety
/// `F` must be the exact C signature of the function `slot` was resolved for.
#[inline(always)]
pub(crate) unsafe fn real<F: Copy>(slot: &Real) -> Option<F> {
    let a = slot.get();
    if a == 0 {
        None
    } else {
        // SAFETY: `a` is a non-null address returned by dlsym for `slot.name`, and the caller
        // guarantees `F` is that function's signature (a thin `extern "C"` fn pointer of the
        // same size as usize).
        Some(unsafe { std::mem::transmute_copy::<usize, F>(&a) })
    }
}

pub static REAL_EPOLL_WAIT: Real = Real::new(c"epoll_wait");
pub static REAL_EPOLL_PWAIT: Real = Real::new(c"epoll_pwait");
pub static REAL_EPOLL_PWAIT2: Real = Real::new(c"epoll_pwait2");
pub static REAL_POLL: Real = Real::new(c"poll");
pub static REAL_POLL_CHK: Real = Real::new(c"__poll_chk");
pub static REAL_PPOLL: Real = Real::new(c"ppoll");
pub static REAL_PPOLL_CHK: Real = Real::new(c"__ppoll_chk");
pub static REAL_SELECT: Real = Real::new(c"select");
pub static REAL_PSELECT: Real = Real::new(c"pselect");
pub static REAL_ACCEPT: Real = Real::new(c"accept");
pub static REAL_ACCEPT4: Real = Real::new(c"accept4");
pub static REAL_READ: Real = Real::new(c"read");
pub static REAL_READ_CHK: Real = Real::new(c"__read_chk");
pub static REAL_RECV: Real = Real::new(c"recv");
pub static REAL_RECV_CHK: Real = Real::new(c"__recv_chk");
pub static REAL_RECVFROM: Real = Real::new(c"recvfrom");
pub static REAL_RECVFROM_CHK: Real = Real::new(c"__recvfrom_chk");
pub static REAL_RECVMSG: Real = Real::new(c"recvmsg");
pub static REAL_READV: Real = Real::new(c"readv");
pub static REAL_WRITE: Real = Real::new(c"write");
pub static REAL_WRITEV: Real = Real::new(c"writev");
pub static REAL_SEND: Real = Real::new(c"send");
pub static REAL_SENDTO: Real = Real::new(c"sendto");
pub static REAL_SENDMSG: Real = Real::new(c"sendmsg");
pub static REAL_CLOSE: Real = Real::new(c"close");
pub static REAL_CLOSE_RANGE: Real = Real::new(c"close_range");
pub static REAL_CLOSEFROM: Real = Real::new(c"closefrom");
pub static REAL_SIGNAL: Real = Real::new(c"signal");
pub static REAL_SIGPROCMASK: Real = Real::new(c"sigprocmask");
pub static REAL_PTHREAD_SIGMASK: Real = Real::new(c"pthread_sigmask");
pub static REAL_SIGALTSTACK: Real = Real::new(c"sigaltstack");
pub static REAL_MPROTECT: Real = Real::new(c"mprotect");
pub static REAL_MUNMAP: Real = Real::new(c"munmap");
pub static REAL_MMAP: Real = Real::new(c"mmap");
pub static REAL_MMAP64: Real = Real::new(c"mmap64");
pub static REAL_MREMAP: Real = Real::new(c"mremap");

static ALL_REAL: [&Real; 36] = [
    &REAL_EPOLL_WAIT,
    &REAL_EPOLL_PWAIT,
    &REAL_EPOLL_PWAIT2,
    &REAL_POLL,
    &REAL_POLL_CHK,
    &REAL_PPOLL,
    &REAL_PPOLL_CHK,
    &REAL_SELECT,
    &REAL_PSELECT,
    &REAL_ACCEPT,
    &REAL_ACCEPT4,
    &REAL_READ,
    &REAL_READ_CHK,
    &REAL_RECV,
    &REAL_RECV_CHK,
    &REAL_RECVFROM,
    &REAL_RECVFROM_CHK,
    &REAL_RECVMSG,
    &REAL_READV,
    &REAL_WRITE,
    &REAL_WRITEV,
    &REAL_SEND,
    &REAL_SENDTO,
    &REAL_SENDMSG,
    &REAL_CLOSE,
    &REAL_CLOSE_RANGE,
    &REAL_CLOSEFROM,
    &REAL_SIGNAL,
    &REAL_SIGPROCMASK,
    &REAL_PTHREAD_SIGMASK,
    &REAL_SIGALTSTACK,
    &REAL_MPROTECT,
    &REAL_MUNMAP,
    &REAL_MMAP,
    &REAL_MMAP64,
    &REAL_MREMAP,
];

/// Resolve every real function (constructor only: `dlsym` may allocate and take the loader
/// lock, so it is never called from a hook). Returns the names that could not be resolved.
pub fn resolve_real_functions() -> Vec<&'static str> {
    let mut missing = Vec::new();
    for r in ALL_REAL {
        // SAFETY: `r.name` is a NUL-terminated C string literal; RTLD_NEXT asks for the next
        // definition after this object in the lookup order (libc's), which is what we forward to.
        let p = unsafe { libc::dlsym(libc::RTLD_NEXT, r.name.as_ptr()) };
        r.addr.store(p as usize, Ordering::Relaxed);
        if p.is_null() {
            missing.push(r.name.to_str().unwrap_or("?"));
        }
    }
    missing
}

#[inline(always)]
pub fn errno() -> c_int {
    // SAFETY: __errno_location returns the calling thread's errno slot, always valid.
    unsafe { *libc::__errno_location() }
}

#[inline(always)]
pub fn set_errno(e: c_int) {
    // SAFETY: as in `errno`; writing the calling thread's own errno.
    unsafe { *libc::__errno_location() = e }
}

pub use preheat_engine::os::futex_wait;

/// Wake one waiter on `word` (the engine's futex wrapper).
pub fn futex_wake(word: &AtomicU32) {
    preheat_engine::os::futex_wake(word, 1);
}

/// Local port of the socket `fd`: `Some(port)` for AF_INET/AF_INET6, `None` otherwise or on
/// error. Allocation-free (usable from hooks).
pub fn local_port(fd: c_int) -> Option<u16> {
    // SAFETY: sockaddr_storage is plain data; all-zero is valid.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: `ss` and `len` are valid writable locals and `len` holds the buffer's size.
    let r = unsafe {
        libc::getsockname(
            fd,
            &mut ss as *mut libc::sockaddr_storage as *mut libc::sockaddr,
            &mut len,
        )
    };
    if r != 0 {
        return None;
    }
    match ss.ss_family as c_int {
        libc::AF_INET => {
            // SAFETY: the kernel filled a sockaddr_in (family AF_INET) into the larger storage.
            let sin =
                unsafe { &*(&ss as *const libc::sockaddr_storage as *const libc::sockaddr_in) };
            Some(u16::from_be(sin.sin_port))
        }
        libc::AF_INET6 => {
            // SAFETY: the kernel filled a sockaddr_in6 (family AF_INET6) into the storage.
            let sin6 =
                unsafe { &*(&ss as *const libc::sockaddr_storage as *const libc::sockaddr_in6) };
            Some(u16::from_be(sin6.sin6_port))
        }
        _ => None,
    }
}

/// `poll(2)` for the agent's own threads (the hook passes agent threads straight through).
pub fn poll(fds: &mut [libc::pollfd], timeout_ms: c_int) -> io::Result<usize> {
    // SAFETY: `fds` is a valid mutable slice of pollfd of the given length.
    let r = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as usize)
    }
}

/// Wait until `fd` is readable or `timeout_ns` passed (`ppoll`: an hrtimer, not the jiffies of
/// `SO_RCVTIMEO`). True if readable (or on an error: the caller's read reports it).
pub fn wait_readable(fd: RawFd, timeout_ns: u64) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let ts = libc::timespec {
        tv_sec: (timeout_ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (timeout_ns % 1_000_000_000) as libc::c_long,
    };
    // SAFETY: `p` and `ts` are valid locals for the call; a null signal mask is allowed.
    let r = unsafe { libc::ppoll(&mut p, 1, &ts, std::ptr::null()) };
    r != 0
}

/// Wait until `fd` is writable or `timeout_ns` passed (`ppoll`). True if writable (or on an
/// error condition: the caller's next call reports it).
pub fn wait_writable(fd: RawFd, timeout_ns: u64) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLOUT,
        revents: 0,
    };
    let ts = libc::timespec {
        tv_sec: (timeout_ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (timeout_ns % 1_000_000_000) as libc::c_long,
    };
    // SAFETY: `p` and `ts` are valid locals for the call; a null signal mask is allowed.
    let r = unsafe { libc::ppoll(&mut p, 1, &ts, std::ptr::null()) };
    r > 0
}

/// A socket's pending error (`SO_ERROR`, 0: none); -1 if it cannot be read.
pub fn socket_error(fd: RawFd) -> c_int {
    let mut err: c_int = 0;
    let mut len = std::mem::size_of::<c_int>() as libc::socklen_t;
    // SAFETY: `err` and `len` are valid locals of the sizes the call expects.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_ERROR,
            &mut err as *mut c_int as *mut c_void,
            &mut len,
        )
    };
    if r < 0 {
        -1
    } else {
        err
    }
}

/// A non-blocking, close-on-exec eventfd.
pub fn eventfd() -> io::Result<RawFd> {
    // SAFETY: no pointers involved.
    let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    if fd < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(fd)
    }
}

/// Add 1 to an eventfd (allocation-free, never blocks: the fd is non-blocking).
pub fn eventfd_signal(fd: RawFd) {
    let one: u64 = 1;
    // SAFETY: writes 8 bytes from a valid local; an invalid fd only yields EBADF.
    unsafe { libc::write(fd, &one as *const u64 as *const c_void, 8) };
}

/// Reset an eventfd's counter.
pub fn eventfd_clear(fd: RawFd) {
    let mut v: u64 = 0;
    // SAFETY: reads at most 8 bytes into a valid local.
    unsafe { libc::read(fd, &mut v as *mut u64 as *mut c_void, 8) };
}

/// `send(fd, buf, MSG_DONTWAIT | MSG_NOSIGNAL)`: the real syscall, not one of our hooks, and
/// never SIGPIPE (a broken replay connection must not kill the host).
pub fn send_nonblocking(fd: RawFd, buf: &[u8]) -> io::Result<usize> {
    // SAFETY: `buf` is a valid readable slice of the given length.
    let r = unsafe {
        libc::send(
            fd,
            buf.as_ptr() as *const c_void,
            buf.len(),
            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as usize)
    }
}

/// `recv(fd, buf, MSG_DONTWAIT)` through the raw syscall (the agent's own traffic must not
/// reach its own hooks' attribution).
pub fn recv_nonblocking(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: `buf` is a valid writable slice; null address arguments are allowed.
    let r = unsafe {
        libc::syscall(
            libc::SYS_recvfrom,
            fd,
            buf.as_mut_ptr(),
            buf.len(),
            libc::MSG_DONTWAIT,
            std::ptr::null_mut::<libc::sockaddr>(),
            std::ptr::null_mut::<libc::socklen_t>(),
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as usize)
    }
}

/// `write(fd, buf)` through the raw syscall, all of it at once (a device write): false on an
/// error or a short write.
pub fn write_all_raw(fd: RawFd, buf: &[u8]) -> bool {
    // SAFETY: `buf` is a valid readable slice of the given length; `fd` is the caller's own.
    let r = unsafe { libc::syscall(libc::SYS_write, fd, buf.as_ptr(), buf.len()) };
    r >= 0 && r as usize == buf.len()
}

/// `sched_yield()`: let any other runnable task on this CPU run first.
pub fn sched_yield() {
    // SAFETY: no arguments, no memory access; always succeeds on Linux.
    unsafe { libc::sched_yield() };
}

/// Close a raw fd with the real syscall.
/// Close `fd` (a raw close, no hook). For fds the agent never registered; a registered one is
/// closed with `runtime::close_own_fd`, which unregisters it first.
pub fn close_fd(fd: RawFd) {
    if fd >= 0 {
        // SAFETY: closing an fd number we own (callers track ownership explicitly).
        unsafe { libc::syscall(libc::SYS_close, fd) };
    }
}

/// What `dladdr` knows about the object containing `addr`: (file name, load base).
pub fn object_of(addr: usize) -> Option<(String, usize)> {
    // SAFETY: Dl_info is plain data; all-zero is valid.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: `info` is a valid writable Dl_info; dladdr only inspects `addr` numerically.
    let r = unsafe { libc::dladdr(addr as *const c_void, &mut info) };
    if r == 0 {
        return None;
    }
    let name = if info.dli_fname.is_null() {
        String::new()
    } else {
        // SAFETY: dladdr returned a NUL-terminated string owned by the loader, valid while
        // the object stays loaded (we copy it at once).
        unsafe { CStr::from_ptr(info.dli_fname) }
            .to_string_lossy()
            .into_owned()
    };
    Some((name, info.dli_fbase as usize))
}

/// Load base of the main executable (via its program headers, `AT_PHDR`).
pub fn main_executable_base() -> Option<usize> {
    // SAFETY: getauxval has no preconditions.
    let phdr = unsafe { libc::getauxval(libc::AT_PHDR) };
    if phdr == 0 {
        return None;
    }
    object_of(phdr as usize).map(|(_, base)| base)
}

/// Signals the agent's threads keep unblocked: the synchronous fault signals (blocked, a fault
/// would kill the process instead of reaching a handler).
const SYNCHRONOUS_SIGNALS: [c_int; 6] = [
    libc::SIGSEGV,
    libc::SIGBUS,
    libc::SIGFPE,
    libc::SIGILL,
    libc::SIGTRAP,
    libc::SIGSYS,
];

type SigmaskFn = unsafe extern "C" fn(c_int, *const libc::sigset_t, *mut libc::sigset_t) -> c_int;

/// Block every asynchronous signal in the calling thread and return the previous mask (None if
/// libc's `pthread_sigmask` is not resolved, or it failed). Goes through libc's real
/// `pthread_sigmask`, never the raw system call: glibc keeps its internal signals (SIGCANCEL,
/// SIGSETXID) deliverable, and `setuid` in a threaded host needs every thread to take SIGSETXID.
pub fn block_async_signals() -> Option<libc::sigset_t> {
    // SAFETY: `SigmaskFn` is pthread_sigmask's C signature, the function the slot holds.
    let f = unsafe { real::<SigmaskFn>(&REAL_PTHREAD_SIGMASK) }?;
    // SAFETY: an all-zero sigset_t is valid storage for sigfillset to fill.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid local sigset.
    unsafe { libc::sigfillset(&mut set) };
    for s in SYNCHRONOUS_SIGNALS {
        // SAFETY: `set` is a valid local sigset, `s` a valid signal number.
        unsafe { libc::sigdelset(&mut set, s) };
    }
    // SAFETY: an all-zero sigset_t is valid storage for the old mask.
    let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: libc's pthread_sigmask with pointers to valid locals.
    (unsafe { f(libc::SIG_BLOCK, &set, &mut old) } == 0).then_some(old)
}

/// Set the calling thread's signal mask back to `old` (from [`block_async_signals`]).
pub fn restore_signal_mask(old: &libc::sigset_t) {
    // SAFETY: as in `block_async_signals`.
    if let Some(f) = unsafe { real::<SigmaskFn>(&REAL_PTHREAD_SIGMASK) } {
        // SAFETY: libc's pthread_sigmask with a valid mask and a null old-mask pointer.
        unsafe { f(libc::SIG_SETMASK, old, std::ptr::null_mut()) };
    }
}

/// Register a fork child handler (no prepare or parent handler: the agent never makes `fork`
/// wait; see [`crate::forkcell`]).
pub fn register_atfork_child(child: unsafe extern "C" fn()) -> io::Result<()> {
    // SAFETY: the handler is a plain `extern "C"` function that lives as long as the process
    // (the agent is never unloaded); null prepare and parent handlers are allowed.
    let r = unsafe { libc::pthread_atfork(None, None, Some(child)) };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(r))
    }
}

pub fn geteuid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}

pub fn getpid() -> u32 {
    std::process::id()
}

/// Call `f(load address, program header)` for every program header of every loaded object
/// (`dl_iterate_phdr`; the caller may allocate: not for hooks).
fn for_each_program_header(mut f: impl FnMut(u64, &libc::Elf64_Phdr)) {
    type Visit<'a> = &'a mut dyn FnMut(u64, &libc::Elf64_Phdr);
    unsafe extern "C" fn each(
        info: *mut libc::dl_phdr_info,
        _size: libc::size_t,
        data: *mut c_void,
    ) -> c_int {
        // SAFETY: `data` is the `Visit` passed below, alive for the whole iteration; `info` is
        // valid for this call, and its `dlpi_phdr` points to `dlpi_phnum` program headers.
        unsafe {
            let visit = &mut *(data as *mut Visit);
            let info = &*info;
            for i in 0..usize::from(info.dlpi_phnum) {
                visit(info.dlpi_addr, &*info.dlpi_phdr.add(i));
            }
        }
        0
    }
    let mut visit: Visit = &mut f;
    // SAFETY: `each` only reads the loader's data for the duration of the call and calls
    // `visit`, which outlives it.
    unsafe { libc::dl_iterate_phdr(Some(each), &mut visit as *mut Visit as *mut c_void) };
}

/// Bytes of thread-local storage of every loaded object (the sum of their `PT_TLS` segments):
/// about the size of a thread's static TLS block, which lies just below its thread pointer.
pub fn static_tls_bytes() -> u64 {
    let mut total = 0;
    for_each_program_header(|_, ph| {
        if ph.p_type == libc::PT_TLS {
            total = ph
                .p_memsz
                .saturating_add(ph.p_align.max(1))
                .saturating_add(total);
        }
    });
    total
}

/// Every `PT_LOAD` segment (`.bss` included) of every loaded object: (load base, start, end).
fn load_segments() -> Vec<(u64, u64, u64)> {
    let mut out = Vec::new();
    for_each_program_header(|base, ph| {
        if ph.p_type == libc::PT_LOAD && ph.p_memsz > 0 {
            let start = base.wrapping_add(ph.p_vaddr);
            out.push((base, start, start.wrapping_add(ph.p_memsz)));
        }
    });
    out
}

/// The memory image (every `PT_LOAD` segment, `.bss` included) of every loaded object, as
/// `[start, end)` ranges.
pub fn loaded_object_ranges() -> Vec<(u64, u64)> {
    load_segments()
        .into_iter()
        .map(|(_, s, e)| (s, e))
        .collect()
}

/// The memory image of the one loaded object that holds `addr`, as `[start, end)` ranges;
/// empty if no loaded object holds it.
pub fn object_image_ranges(addr: u64) -> Vec<(u64, u64)> {
    let all = load_segments();
    let Some(&(base, _, _)) = all.iter().find(|(_, s, e)| (*s..*e).contains(&addr)) else {
        return Vec::new();
    };
    all.into_iter()
        .filter(|(b, _, _)| *b == base)
        .map(|(_, s, e)| (s, e))
        .collect()
}

/// The calling thread's stack block `[low, high)` as the C library reports it
/// (`pthread_getattr_np`): for a thread it created, the whole block above the guard, its
/// thread control block and static TLS included.
pub fn current_thread_stack() -> Option<(u64, u64)> {
    // SAFETY: pthread_attr_t is plain data; pthread_getattr_np initialises it before we read
    // it, and we destroy it exactly once after a successful init.
    unsafe {
        let mut attr: libc::pthread_attr_t = std::mem::zeroed();
        if libc::pthread_getattr_np(libc::pthread_self(), &mut attr) != 0 {
            return None;
        }
        let mut addr: *mut c_void = std::ptr::null_mut();
        let mut size: libc::size_t = 0;
        let r = libc::pthread_attr_getstack(&attr, &mut addr, &mut size);
        libc::pthread_attr_destroy(&mut attr);
        (r == 0 && !addr.is_null())
            .then(|| (addr as u64, (addr as u64).saturating_add(size as u64)))
    }
}

/// Run `f` on the calling thread inside the network namespace of the file `path` (such as
/// `/proc/PID/ns/net`), then move the thread back to the one it had: a socket `f` creates stays
/// in the namespace it was created in. Only the calling thread moves (a network namespace is
/// per thread). Err if the namespace cannot be entered (no such file, not a network namespace,
/// no `CAP_SYS_ADMIN`), or if the way back failed (then the thread is left in `path`'s
/// namespace, which the error says; holding a descriptor of its own namespace and having just
/// been allowed to enter one, it does not happen short of a kernel fault).
pub fn in_netns<T>(path: &str, f: impl FnOnce() -> T) -> io::Result<T> {
    use std::os::fd::AsRawFd;
    let own = std::fs::File::open("/proc/thread-self/ns/net")?;
    let target = std::fs::File::open(path)?;
    // SAFETY: setns with a descriptor we own and CLONE_NEWNET only changes the calling thread's
    // network namespace; no memory is passed.
    if unsafe { libc::setns(target.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let r = f();
    // SAFETY: as above, back to the namespace this thread had (a descriptor we own).
    if unsafe { libc::setns(own.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::other(format!(
            "could not return to its own network namespace from {path}: {e}"
        )));
    }
    Ok(r)
}
