//! The single-threaded, level-triggered epoll event loop.
//!
//! Everything happens on one thread with plain libc calls — `epoll_create1`,
//! `epoll_ctl`, `epoll_wait`, `accept4`, `read`, `send`, `close` — because the
//! preheat LD_PRELOAD agent interposes `epoll_wait`/`accept`/`read` to find
//! request boundaries; a runtime such as mio or tokio would hide them.
//!
//! Per connection there is an input buffer (requests may arrive split across
//! reads or several per read) and an output buffer. After a read, every
//! complete request in the input buffer is executed and the replies are
//! written immediately; whatever the socket does not accept stays buffered and
//! the connection is registered for `EPOLLOUT`. While a connection has more
//! than [`OUT_HIGH_WATER`] bytes of unsent output it is not read from (nor
//! are its buffered requests executed), so a client that does not read its
//! replies cannot make the server buffer without bound.
//!
//! Limits: at most [`MAX_CONNS`] connections (more are told
//! `ERROR Too many open connections` and closed, like memcached), at most
//! [`MAX_INBUF`] bytes of unparsed input per connection, and at most
//! [`MAX_GET_RESPONSE`](crate::limits::MAX_GET_RESPONSE) bytes for one `get` reply (otherwise
//! `SERVER_ERROR out of memory writing get response`, memcached's message).
//! Connections that violate the protocol's hard limits are closed.
//!
//! Shutdown: SIGTERM/SIGINT set an atomic flag and write one byte into a
//! non-blocking self-pipe that is in the epoll set, so `epoll_wait` returns
//! whichever thread the signal was delivered to (the preheat agent adds
//! threads to this process) and however close to the flag check it arrives;
//! the loop exits, closing every connection. An idle server therefore sleeps
//! in `epoll_wait` without a timeout: no periodic wakeups.

use std::collections::HashMap;
use std::ffi::OsString;
use std::io;
use std::net::{SocketAddr, TcpListener};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::time::{Duration, Instant};

use crate::execute::{execute, Next, Stats};
use crate::limits::{MAX_CONNS, MAX_INBUF, OUT_HIGH_WATER};
use crate::protocol::{self, Parse};
use crate::store::Store;

/// Minimum free space offered to each `read`.
const READ_CHUNK: usize = 16 * 1024;
/// Idle buffers larger than this are shrunk back.
const SHRINK_ABOVE: usize = 256 * 1024;
const MAX_EVENTS: usize = 256;
/// Connections accepted per listener wake-up, for fairness.
const ACCEPT_BATCH: usize = 64;
/// How long to stop accepting after running out of file descriptors.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);
const LISTENER_TOKEN: u64 = 0;
/// The self-pipe's read end (no connection token has all fd bits set).
const WAKE_TOKEN: u64 = u64::MAX;

static SHUTDOWN: AtomicBool = AtomicBool::new(false);
/// Write end of the self-pipe the signal handler wakes the event loop with (-1: none yet).
static WAKE_FD: AtomicI32 = AtomicI32::new(-1);

/// Server configuration (from the command line).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub listen: SocketAddr,
    pub items: usize,
    pub value_size: usize,
    pub ready_file: Option<PathBuf>,
    pub quiet: bool,
}

/// Runs the server until SIGTERM or SIGINT.
pub fn run(config: &Config) -> io::Result<()> {
    let wake = install_signal_handlers()?;
    if let Some(path) = &config.ready_file {
        // A stale file from an earlier run must not announce the wrong port.
        match std::fs::remove_file(path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
    }

    let mut store = Store::new();
    store.preload(config.items, config.value_size);

    // std's bind sets SO_REUSEADDR and CLOEXEC; everything after is raw libc.
    let listener = TcpListener::bind(config.listen)?;
    listener.set_nonblocking(true)?;
    let local = listener.local_addr()?;
    let mut server = Server::new(listener, store, config.quiet, wake)?;
    if !config.quiet {
        eprintln!("preheat-kv listening on {local}");
    }
    if let Some(path) = &config.ready_file {
        write_ready_file(path, local.port())?;
    }

    let result = server.run_loop();
    server.log(format_args!("shutting down"));
    drop(server);
    if let Some(path) = &config.ready_file {
        let _ = std::fs::remove_file(path);
    }
    result
}

extern "C" fn on_shutdown_signal(_signal: libc::c_int) {
    SHUTDOWN.store(true, Ordering::SeqCst);
    let fd = WAKE_FD.load(Ordering::SeqCst);
    if fd >= 0 {
        // SAFETY: errno is thread-local and read/restored around write(2), which is
        // async-signal-safe; the one-byte buffer lives across the call; a full pipe (EAGAIN)
        // already holds a wake-up, so the result is ignored.
        unsafe {
            let errno = *libc::__errno_location();
            let byte = 1u8;
            libc::write(fd, (&byte as *const u8).cast(), 1);
            *libc::__errno_location() = errno;
        }
    }
}

/// Creates the self-pipe (both ends non-blocking, close-on-exec), publishes its write end for
/// the handler, installs the handlers, and returns the read end for the epoll set.
fn install_signal_handlers() -> io::Result<OwnedFd> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: `fds` is a valid, writable array of two ints, as pipe2 requires.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both fds were just returned by pipe2 and are owned by nothing else; the write end
    // stays open for the life of the process (the handler may run at any time), so it is
    // deliberately never closed.
    let read_end = unsafe { OwnedFd::from_raw_fd(fds[0]) };
    WAKE_FD.store(fds[1], Ordering::SeqCst);
    for signal in [libc::SIGTERM, libc::SIGINT] {
        // SAFETY: an all-zero `sigaction` is a valid value (no flags, default
        // handler); every field we rely on is set explicitly below.
        let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
        let handler: extern "C" fn(libc::c_int) = on_shutdown_signal;
        action.sa_sigaction = handler as libc::sighandler_t;
        // No SA_RESTART, so a blocked epoll_wait returns EINTR at once.
        action.sa_flags = 0;
        // SAFETY: `sa_mask` is a valid, writable sigset_t inside `action`.
        unsafe { libc::sigemptyset(&mut action.sa_mask) };
        // SAFETY: `action` is fully initialised and outlives the call; the
        // handler only stores to an atomic, which is async-signal-safe; a null
        // old-action pointer is allowed.
        if unsafe { libc::sigaction(signal, &action, std::ptr::null_mut()) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(read_end)
}

/// Writes `ready <port>\n` to `path` atomically (temp file + rename), so a
/// harness polling for the file never sees a partial line.
fn write_ready_file(path: &Path, port: u16) -> io::Result<()> {
    let name = path.file_name().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "--ready-file needs a file name",
        )
    })?;
    let mut tmp_name = OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(".{}.tmp", std::process::id()));
    let tmp = path.with_file_name(tmp_name);
    std::fs::write(&tmp, format!("ready {port}\n"))?;
    std::fs::rename(&tmp, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

/// Thin owner of an epoll instance.
struct Epoll {
    fd: OwnedFd,
}

impl Epoll {
    fn new() -> io::Result<Epoll> {
        // SAFETY: epoll_create1 has no memory-safety preconditions.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just returned by epoll_create1; nothing else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Epoll { fd })
    }

    fn ctl(&self, op: libc::c_int, fd: RawFd, events: u32, token: u64) -> io::Result<()> {
        let mut event = libc::epoll_event { events, u64: token };
        // SAFETY: `event` is a valid epoll_event that lives across the call
        // (the kernel only reads it); invalid fds are reported through errno.
        let rc = unsafe { libc::epoll_ctl(self.fd.as_raw_fd(), op, fd, &mut event) };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    fn wait(&self, events: &mut [libc::epoll_event], timeout_ms: i32) -> io::Result<usize> {
        let max = libc::c_int::try_from(events.len()).unwrap_or(libc::c_int::MAX);
        // SAFETY: `events` is a valid, writable buffer of at least `max`
        // entries; the kernel writes at most `max` of them.
        let n =
            unsafe { libc::epoll_wait(self.fd.as_raw_fd(), events.as_mut_ptr(), max, timeout_ms) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(n as usize)
    }
}

/// Why request processing on a connection stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    /// Every complete request was executed; waiting for more bytes.
    NeedInput,
    /// Too much unsent output; resume once the socket drains.
    Paused,
    /// `quit` was received.
    Quit,
    /// Protocol limit violated; close now.
    Fatal,
}

enum ReadResult {
    Data,
    Eof,
    WouldBlock,
    Failed,
}

struct Conn {
    fd: OwnedFd,
    token: u64,
    /// Events currently registered with epoll.
    interest: u32,
    inbuf: Vec<u8>,
    out: Vec<u8>,
    /// Bytes of `out` already sent.
    out_pos: usize,
    /// Input bytes still to discard (payload of an oversized set).
    swallow: usize,
    read_closed: bool,
    stop: Stop,
}

impl Conn {
    fn new(fd: OwnedFd, token: u64, interest: u32) -> Conn {
        Conn {
            fd,
            token,
            interest,
            inbuf: Vec::new(),
            out: Vec::new(),
            out_pos: 0,
            swallow: 0,
            read_closed: false,
            stop: Stop::NeedInput,
        }
    }

    fn pending_out(&self) -> usize {
        self.out.len() - self.out_pos
    }

    fn wants_read(&self) -> bool {
        !self.read_closed && self.stop == Stop::NeedInput
    }

    fn desired_interest(&self) -> u32 {
        let mut events = 0;
        if self.wants_read() {
            events |= libc::EPOLLIN as u32;
        }
        // A paused connection may have flushed everything already; EPOLLOUT
        // (immediately ready) then brings it back to resume processing.
        if self.pending_out() > 0 || self.stop == Stop::Paused {
            events |= libc::EPOLLOUT as u32;
        }
        events
    }

    /// Nothing more will happen on this connection: close it.
    fn finished(&self) -> bool {
        match self.stop {
            Stop::Fatal => true,
            Stop::Quit => self.pending_out() == 0,
            Stop::NeedInput => self.read_closed && self.pending_out() == 0,
            Stop::Paused => false,
        }
    }

    /// Handles one epoll notification; returns false if the connection must
    /// be closed.
    fn on_event(&mut self, events: u32, store: &mut Store, stats: &mut Stats) -> bool {
        let readable = (libc::EPOLLIN | libc::EPOLLHUP | libc::EPOLLERR) as u32;
        let writable = (libc::EPOLLOUT | libc::EPOLLHUP | libc::EPOLLERR) as u32;
        if events & readable != 0 && self.wants_read() {
            match self.read_some(stats) {
                ReadResult::Data => {}
                ReadResult::Eof => self.read_closed = true,
                ReadResult::WouldBlock => return true,
                ReadResult::Failed => return false,
            }
            if !self.process_and_flush(store, stats) {
                return false;
            }
        }
        if events & writable != 0 {
            if !self.flush(stats) {
                return false;
            }
            // One batch per wake-up keeps a busy connection from starving the
            // others; a still-paused connection stays registered for EPOLLOUT.
            if self.stop == Stop::Paused
                && self.pending_out() < OUT_HIGH_WATER
                && !self.process_and_flush(store, stats)
            {
                return false;
            }
        }
        true
    }

    fn process_and_flush(&mut self, store: &mut Store, stats: &mut Stats) -> bool {
        self.stop = self.process(store, stats);
        self.stop != Stop::Fatal && self.flush(stats)
    }

    /// One `read(2)` into the input buffer.
    fn read_some(&mut self, stats: &mut Stats) -> ReadResult {
        let room = MAX_INBUF.saturating_sub(self.inbuf.len());
        if room == 0 {
            return ReadResult::Failed;
        }
        self.inbuf.reserve(READ_CHUNK.min(room));
        let spare = self.inbuf.spare_capacity_mut();
        let want = spare.len().min(room);
        // SAFETY: `spare` is the vector's uninitialised spare capacity with at
        // least `want` bytes; read(2) writes at most `want` bytes into it, and
        // the fd is an open socket owned by this connection.
        let n = unsafe { libc::read(self.fd.as_raw_fd(), spare.as_mut_ptr().cast(), want) };
        match n {
            0 => ReadResult::Eof,
            n if n > 0 => {
                let n = n as usize;
                // SAFETY: read(2) initialised exactly `n <= want` bytes right
                // after the current length.
                unsafe { self.inbuf.set_len(self.inbuf.len() + n) };
                stats.bytes_read += n as u64;
                ReadResult::Data
            }
            _ => match io::Error::last_os_error().kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => ReadResult::WouldBlock,
                _ => ReadResult::Failed,
            },
        }
    }

    /// Executes every complete buffered request (until output backs up).
    fn process(&mut self, store: &mut Store, stats: &mut Stats) -> Stop {
        if self.out_pos > 0 {
            self.out.drain(..self.out_pos);
            self.out_pos = 0;
        }
        let mut pos = 0;
        let stop = loop {
            if self.swallow > 0 {
                let n = self.swallow.min(self.inbuf.len() - pos);
                pos += n;
                self.swallow -= n;
                if self.swallow > 0 {
                    break Stop::NeedInput;
                }
            }
            if self.out.len() >= OUT_HIGH_WATER {
                break Stop::Paused;
            }
            let input = &self.inbuf[pos..];
            if input.is_empty() {
                break Stop::NeedInput;
            }
            match protocol::parse(input) {
                Parse::Incomplete if input.len() >= MAX_INBUF => break Stop::Fatal,
                Parse::Incomplete => break Stop::NeedInput,
                Parse::Invalid(_) => break Stop::Fatal,
                Parse::Complete { request, consumed } => {
                    pos += consumed;
                    match execute(request, store, stats, &mut self.out) {
                        Next::Continue => {}
                        Next::Swallow(n) => self.swallow = n,
                        Next::Quit => break Stop::Quit,
                    }
                }
            }
        };
        self.inbuf.drain(..pos);
        if self.inbuf.is_empty() && self.inbuf.capacity() > SHRINK_ABOVE {
            self.inbuf = Vec::new();
        }
        stop
    }

    /// Sends as much pending output as the socket takes; false on error.
    fn flush(&mut self, stats: &mut Stats) -> bool {
        while self.out_pos < self.out.len() {
            let pending = &self.out[self.out_pos..];
            // SAFETY: `pending` is an initialised slice; send(2) reads at most
            // `pending.len()` bytes from it. MSG_NOSIGNAL turns a closed peer
            // into EPIPE instead of SIGPIPE.
            let n = unsafe {
                libc::send(
                    self.fd.as_raw_fd(),
                    pending.as_ptr().cast(),
                    pending.len(),
                    libc::MSG_NOSIGNAL,
                )
            };
            if n > 0 {
                self.out_pos += n as usize;
                stats.bytes_written += n as u64;
                continue;
            }
            if n == 0 {
                break;
            }
            match io::Error::last_os_error().kind() {
                io::ErrorKind::Interrupted => {}
                io::ErrorKind::WouldBlock => break,
                _ => return false,
            }
        }
        if self.out_pos == self.out.len() {
            self.out.clear();
            self.out_pos = 0;
            if self.out.capacity() > SHRINK_ABOVE {
                self.out = Vec::new();
            }
        }
        true
    }
}

struct Server {
    epoll: Epoll,
    /// Read end of the shutdown self-pipe.
    wake: OwnedFd,
    listener: TcpListener,
    conns: HashMap<RawFd, Conn>,
    store: Store,
    stats: Stats,
    /// Distinguishes successive connections that reuse the same fd number,
    /// so a stale event for a closed connection is never applied to a new one.
    generation: u32,
    accept_paused_until: Option<Instant>,
    quiet: bool,
}

impl Server {
    fn new(listener: TcpListener, store: Store, quiet: bool, wake: OwnedFd) -> io::Result<Server> {
        let epoll = Epoll::new()?;
        epoll.ctl(
            libc::EPOLL_CTL_ADD,
            listener.as_raw_fd(),
            libc::EPOLLIN as u32,
            LISTENER_TOKEN,
        )?;
        epoll.ctl(
            libc::EPOLL_CTL_ADD,
            wake.as_raw_fd(),
            libc::EPOLLIN as u32,
            WAKE_TOKEN,
        )?;
        Ok(Server {
            epoll,
            wake,
            listener,
            conns: HashMap::new(),
            store,
            stats: Stats::new(),
            generation: 0,
            accept_paused_until: None,
            quiet,
        })
    }

    fn log(&self, message: std::fmt::Arguments<'_>) {
        if !self.quiet {
            eprintln!("preheat-kv: {message}");
        }
    }

    fn run_loop(&mut self) -> io::Result<()> {
        let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; MAX_EVENTS];
        while !SHUTDOWN.load(Ordering::SeqCst) {
            // Sleep until an event; only a paused accept needs a timer.
            let timeout_ms = match self.accept_paused_until {
                Some(t) => {
                    let left = t.saturating_duration_since(Instant::now());
                    i32::try_from(left.as_millis() + 1).unwrap_or(i32::MAX)
                }
                None => -1,
            };
            let n = match self.epoll.wait(&mut events, timeout_ms) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            let now = Instant::now();
            self.store.set_now(now);
            self.maybe_resume_accept(now);
            for event in &events[..n] {
                // Copy the fields out: epoll_event is packed on x86-64.
                let (token, flags) = (event.u64, event.events);
                if token == LISTENER_TOKEN {
                    self.accept_ready(now);
                } else if token == WAKE_TOKEN {
                    self.drain_wake();
                } else {
                    self.conn_event(token, flags);
                }
            }
        }
        Ok(())
    }

    /// Empty the self-pipe (the flag it signals is read by the loop condition).
    fn drain_wake(&self) {
        let mut buf = [0u8; 64];
        // SAFETY: `buf` is a valid, writable buffer of `buf.len()` bytes; the read end is
        // non-blocking, so this stops at EAGAIN.
        while unsafe { libc::read(self.wake.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) } > 0 {
        }
    }

    fn conn_event(&mut self, token: u64, events: u32) {
        let fd = (token & 0xffff_ffff) as u32 as RawFd;
        let Some(conn) = self.conns.get_mut(&fd) else {
            return;
        };
        if conn.token != token {
            return;
        }
        let mut alive = conn.on_event(events, &mut self.store, &mut self.stats) && !conn.finished();
        if alive {
            let wanted = conn.desired_interest();
            if wanted != conn.interest {
                alive = self
                    .epoll
                    .ctl(libc::EPOLL_CTL_MOD, fd, wanted, token)
                    .is_ok();
                conn.interest = wanted;
            }
        }
        if !alive {
            self.close_conn(fd);
        }
    }

    fn close_conn(&mut self, fd: RawFd) {
        // Dropping the OwnedFd calls close(2), which also removes the fd
        // from the epoll set.
        if self.conns.remove(&fd).is_some() {
            self.stats.curr_connections -= 1;
        }
    }

    fn accept_ready(&mut self, now: Instant) {
        for _ in 0..ACCEPT_BATCH {
            // SAFETY: the listener fd is open for the lifetime of `self`;
            // null address pointers are allowed when the peer address is not
            // wanted.
            let fd = unsafe {
                libc::accept4(
                    self.listener.as_raw_fd(),
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                )
            };
            if fd < 0 {
                let err = io::Error::last_os_error();
                if err.kind() == io::ErrorKind::WouldBlock {
                    return;
                }
                match err.raw_os_error().unwrap_or(0) {
                    // The peer gave up before we accepted, or a signal: try the next one.
                    libc::EINTR | libc::ECONNABORTED | libc::EPROTO => continue,
                    libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM => {
                        self.log(format_args!("accept: {err}; pausing accepts"));
                        self.pause_accept(now);
                        return;
                    }
                    _ => {
                        self.log(format_args!("accept: {err}"));
                        return;
                    }
                }
            }
            // SAFETY: accept4 returned a new descriptor that nothing else owns.
            let fd = unsafe { OwnedFd::from_raw_fd(fd) };
            self.add_conn(fd);
        }
    }

    fn add_conn(&mut self, fd: OwnedFd) {
        let raw = fd.as_raw_fd();
        if self.conns.len() >= MAX_CONNS {
            let msg = b"ERROR Too many open connections\r\n";
            // SAFETY: `msg` is a valid buffer of `msg.len()` bytes and `raw`
            // is open (owned by `fd`); the result is deliberately ignored.
            let _ = unsafe {
                libc::send(
                    raw,
                    msg.as_ptr().cast(),
                    msg.len(),
                    libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
                )
            };
            self.stats.rejected_connections += 1;
            return;
        }
        set_nodelay(raw);
        self.generation = self.generation.wrapping_add(1).max(1);
        let token = (u64::from(self.generation) << 32) | u64::from(raw as u32);
        let interest = libc::EPOLLIN as u32;
        if let Err(e) = self.epoll.ctl(libc::EPOLL_CTL_ADD, raw, interest, token) {
            self.log(format_args!("epoll_ctl(ADD): {e}"));
            return;
        }
        self.conns.insert(raw, Conn::new(fd, token, interest));
        self.stats.curr_connections += 1;
        self.stats.total_connections += 1;
    }

    /// Out of descriptors: stop polling the listener for a moment instead of
    /// spinning on a level-triggered event we cannot act on.
    fn pause_accept(&mut self, now: Instant) {
        if self.accept_paused_until.is_none() {
            let _ = self
                .epoll
                .ctl(libc::EPOLL_CTL_DEL, self.listener.as_raw_fd(), 0, 0);
            self.accept_paused_until = Some(now + ACCEPT_BACKOFF);
        }
    }

    fn maybe_resume_accept(&mut self, now: Instant) {
        if self.accept_paused_until.is_some_and(|t| t <= now) {
            let fd = self.listener.as_raw_fd();
            match self.epoll.ctl(
                libc::EPOLL_CTL_ADD,
                fd,
                libc::EPOLLIN as u32,
                LISTENER_TOKEN,
            ) {
                Ok(()) => self.accept_paused_until = None,
                Err(e) => {
                    self.log(format_args!("epoll_ctl(ADD listener): {e}"));
                    self.accept_paused_until = Some(now + ACCEPT_BACKOFF);
                }
            }
        }
    }
}

/// Disables Nagle's algorithm: replies are small and latency matters.
fn set_nodelay(fd: RawFd) {
    let on: libc::c_int = 1;
    // SAFETY: `on` is a valid c_int whose size is passed as the option
    // length; failure is harmless and ignored.
    let _ = unsafe {
        libc::setsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_NODELAY,
            (&on as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
}
