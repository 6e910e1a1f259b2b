//! The OS side of the eBPF observer: maps, program loading, attachment to the scheduler's and
//! socket tracepoints or to the syscall tracepoints, and the ring buffer's consumer.
//!
//! Every `unsafe` block here is a `bpf(2)` call on memory this module
//! owns for the call's duration, or an access to the ring buffer's mapping while it is alive
//! ([`RingBuf`] unmaps it on drop).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use anyhow::{bail, Context, Result};

use crate::bpfprog::{self, Edge, Spec};
use crate::periodprog::{self, PeriodSpec};
use crate::schedprog::{self, Fields, Prog, SchedSpec};

const MAP_CREATE: libc::c_long = 0;
const MAP_LOOKUP_ELEM: libc::c_long = 1;
const PROG_LOAD: libc::c_long = 5;
const RAW_TRACEPOINT_OPEN: libc::c_long = 17;
const MAP_TYPE_ARRAY: u32 = 2;
const MAP_TYPE_RINGBUF: u32 = 27;
const PROG_TYPE_RAW_TRACEPOINT: u32 = 17;
const PROG_TYPE_TRACING: u32 = 26;
/// `BPF_TRACE_RAW_TP`: a BTF-typed raw tracepoint program (`tp_btf`).
const TRACE_RAW_TP: u32 = 23;
/// The kernel's own BTF, where a `tp_btf` program's tracepoint is named by a type id.
const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";

/// `union bpf_attr` as `BPF_MAP_CREATE` reads it (the rest zero).
#[repr(C)]
#[derive(Default)]
struct MapCreate {
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    map_flags: u32,
    pad: [u32; 27],
}

/// `union bpf_attr` as `BPF_PROG_LOAD` reads it (the rest zero).
#[repr(C)]
#[derive(Default)]
struct ProgLoad {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
    prog_btf_fd: u32,
    func_info_rec_size: u32,
    func_info: u64,
    func_info_cnt: u32,
    line_info_rec_size: u32,
    line_info: u64,
    line_info_cnt: u32,
    attach_btf_id: u32,
    attach_prog_fd: u32,
    pad: [u32; 7],
}

/// `union bpf_attr` as `BPF_MAP_LOOKUP_ELEM` reads it.
#[repr(C)]
#[derive(Default)]
struct MapElem {
    map_fd: u32,
    pad0: u32,
    key: u64,
    value: u64,
    flags: u64,
    pad: [u32; 24],
}

/// `union bpf_attr` as `BPF_RAW_TRACEPOINT_OPEN` reads it.
#[repr(C)]
#[derive(Default)]
struct RawTpOpen {
    name: u64,
    prog_fd: u32,
    pad: [u32; 29],
}

/// `bpf(cmd, attr, size)`; a new fd for the commands that make one.
///
/// # Safety
/// `attr` is a zero-padded `#[repr(C)]` prefix of `union bpf_attr` for `cmd`, and every
/// pointer inside it points to memory that is valid for the kernel's reads (and writes, for
/// output buffers) of the sizes it gives, for the duration of the call.
unsafe fn bpf<T>(cmd: libc::c_long, attr: &mut T) -> io::Result<libc::c_long> {
    // SAFETY: the caller's contract above; the size passed is `attr`'s own.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            (attr as *mut T).cast::<libc::c_void>(),
            std::mem::size_of::<T>(),
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// The fd `bpf` just returned, owned.
///
/// # Safety
/// `fd` is a descriptor the kernel just created for this caller, which nothing else owns.
unsafe fn owned(fd: libc::c_long) -> io::Result<OwnedFd> {
    let fd = i32::try_from(fd).map_err(|_| io::Error::other("fd out of range"))?;
    // SAFETY: the caller's contract: a new descriptor nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn map_create(map_type: u32, key: u32, value: u32, entries: u32) -> io::Result<OwnedFd> {
    let mut a = MapCreate {
        map_type,
        key_size: key,
        value_size: value,
        max_entries: entries,
        ..MapCreate::default()
    };
    // SAFETY: a map-creation attr with no pointers; the fd it returns is new.
    unsafe { owned(bpf(MAP_CREATE, &mut a)?) }
}

/// Load a raw tracepoint program — BTF-typed where `btf_id` names its tracepoint's typedef in
/// the kernel's BTF; on refusal the error carries the verifier's log.
fn prog_load(insns: &[bpfprog::Insn], name: &str, btf_id: Option<u32>) -> Result<OwnedFd> {
    let code = bpfprog::to_bytes(insns);
    let license = c"Dual MIT/GPL";
    let mut log = vec![0u8; 64 * 1024];
    let mut prog_name = [0u8; 16];
    for (d, s) in prog_name.iter_mut().zip(name.bytes().take(15)) {
        *d = s;
    }
    let mut a = ProgLoad {
        prog_type: if btf_id.is_some() {
            PROG_TYPE_TRACING
        } else {
            PROG_TYPE_RAW_TRACEPOINT
        },
        expected_attach_type: if btf_id.is_some() { TRACE_RAW_TP } else { 0 },
        attach_btf_id: btf_id.unwrap_or(0),
        insn_cnt: u32::try_from(insns.len()).context("program too long")?,
        insns: code.as_ptr() as u64,
        license: license.as_ptr() as u64,
        log_level: 1,
        log_size: log.len() as u32,
        log_buf: log.as_mut_ptr() as u64,
        prog_name,
        ..ProgLoad::default()
    };
    // SAFETY: `insns` points to `code` (insn_cnt instructions), `license` to a NUL-terminated
    // string and `log_buf` to `log` (log_size bytes, written by the kernel); all three live
    // across the call.
    match unsafe { bpf(PROG_LOAD, &mut a) } {
        // SAFETY: the program's fd, just returned by the kernel.
        Ok(fd) => Ok(unsafe { owned(fd) }?),
        Err(e) => {
            let end = log.iter().position(|b| *b == 0).unwrap_or(log.len());
            let text = String::from_utf8_lossy(&log[..end]);
            let tail: Vec<&str> = text.lines().rev().take(6).collect();
            bail!(
                "the kernel refused the observer's eBPF program: {e}{}",
                if tail.is_empty() {
                    String::new()
                } else {
                    format!(
                        " (verifier: {})",
                        tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
                    )
                }
            )
        }
    }
}

/// Element `key` of a u64 array.
fn lookup_u64(map: &OwnedFd, key: u32) -> io::Result<u64> {
    let mut value = 0u64;
    let mut a = MapElem {
        map_fd: map.as_raw_fd() as u32,
        key: std::ptr::addr_of!(key) as u64,
        value: std::ptr::addr_of_mut!(value) as u64,
        ..MapElem::default()
    };
    // SAFETY: `key` and `value` point to a u32 and a u64 on this frame, the sizes the array
    // was created with (key 4, value 8); a key past its end is an error, not a read.
    unsafe { bpf(MAP_LOOKUP_ELEM, &mut a) }?;
    Ok(value)
}

/// A BPF ring buffer's consumer side: the consumer page (read-write) and the producer page
/// plus the data area mapped twice (read-only), so a record that wraps reads contiguously.
pub struct RingBuf {
    cons: *mut u8,
    prod: *mut u8,
    prod_len: usize,
    page: usize,
    size: usize,
}

// SAFETY: the mappings are owned by this value alone; moving it to another thread moves that
// ownership (the kernel side is indifferent to the reading thread).
unsafe impl Send for RingBuf {}

const BUSY: u32 = 1 << 31;
const DISCARD: u32 = 1 << 30;
const HDR: usize = 8;

impl RingBuf {
    fn map(fd: &OwnedFd, size: usize) -> io::Result<RingBuf> {
        let page = preheat_engine::sweep::page_size();
        // SAFETY: a fresh shared mapping of the ring buffer map's consumer page, the layout
        // the kernel documents for BPF_MAP_TYPE_RINGBUF; checked for MAP_FAILED.
        let cons = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                page,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if cons == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let prod_len = page + 2 * size;
        // SAFETY: the producer page and the data area (mapped twice by the kernel), read-only
        // at offset one page, as documented; checked for MAP_FAILED.
        let prod = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                prod_len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                page as libc::off_t,
            )
        };
        if prod == libc::MAP_FAILED {
            let e = io::Error::last_os_error();
            // SAFETY: unmapping the consumer page mapped above, which nothing else uses.
            unsafe { libc::munmap(cons, page) };
            return Err(e);
        }
        Ok(RingBuf {
            cons: cons.cast(),
            prod: prod.cast(),
            prod_len,
            page,
            size,
        })
    }

    fn positions(&self) -> (&AtomicU64, &AtomicU64) {
        // SAFETY: the first u64 of each page is the kernel's consumer / producer position,
        // 8-byte aligned (page-aligned), shared with the kernel: accessed only atomically.
        unsafe {
            (
                AtomicU64::from_ptr(self.cons.cast::<u64>()),
                AtomicU64::from_ptr(self.prod.cast::<u64>()),
            )
        }
    }

    /// Append every committed record to `out`, framed for [`crate::decode::decode_bpf`], and
    /// hand the space back; returns the records read. Stops at a record still being written.
    pub fn drain(&mut self, out: &mut Vec<u8>) -> usize {
        let (cons_a, prod_a) = self.positions();
        let mut cons = cons_a.load(Ordering::Acquire);
        let prod = prod_a.load(Ordering::Acquire);
        let mask = (self.size - 1) as u64;
        let mut n = 0;
        while cons < prod {
            let at = (cons & mask) as usize;
            // SAFETY: `at + HDR <= size`, inside the first copy of the live data area; the
            // header is 8-byte aligned (records are) and written atomically by the kernel.
            let hdr = unsafe {
                AtomicU32::from_ptr(self.prod.add(self.page + at).cast::<u32>())
                    .load(Ordering::Acquire)
            };
            if hdr & BUSY != 0 {
                break;
            }
            let len = (hdr & !(BUSY | DISCARD)) as usize;
            if len > self.size {
                break; // never written by the kernel: stop rather than read past the area.
            }
            if hdr & DISCARD == 0 {
                // Framed for the decoder: the length, a zero word, the record padded to 8.
                out.extend_from_slice(&(len as u32).to_le_bytes());
                out.extend_from_slice(&[0; 4]);
                // SAFETY: the record's payload starts within the first copy and is at most
                // `size` bytes, so it ends within the second copy of the data area.
                out.extend_from_slice(unsafe {
                    std::slice::from_raw_parts(self.prod.add(self.page + at + HDR), len)
                });
                out.resize(out.len() + (len.next_multiple_of(8) - len), 0);
                n += 1;
            }
            cons += ((len + HDR + 7) & !7) as u64;
        }
        // The space handed back once per drain: the producer reads the consumer's position at
        // every record it writes, which a store per record would keep moving between CPUs.
        cons_a.store(cons, Ordering::Release);
        n
    }
}

impl Drop for RingBuf {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly the two mappings made in `map`; nothing borrows them.
        unsafe {
            libc::munmap(self.cons.cast(), self.page);
            libc::munmap(self.prod.cast(), self.prod_len);
        }
    }
}

/// The observer's programs attached to the entry and exit tracepoints.
pub struct Attached {
    ring: RingBuf,
    lost: OwnedFd,
    /// The raw tracepoint links (closing them detaches the programs).
    links: Vec<OwnedFd>,
    /// Why the programs are not BTF-typed (`None`: they are).
    untyped: Option<String>,
    /// Why the typed programs write a record per call (`None`: one per busy period, or untyped).
    per_call: Option<String>,
    /// Why the programs are on the syscall tracepoints rather than the scheduler's and the
    /// socket layer's (`None`: they are there, [`crate::schedprog`]).
    syscalls: Option<String>,
    _progs: Vec<OwnedFd>,
    _ringbuf: OwnedFd,
    /// The period programs' or the scheduler form's per-thread array.
    _slots: Option<OwnedFd>,
}

/// Attach `prog` to raw tracepoint `name` (the returned fd keeps it attached); `None` for a
/// BTF-typed program, whose tracepoint was named at load.
fn raw_tracepoint_open(name: Option<&std::ffi::CStr>, prog: &OwnedFd) -> io::Result<OwnedFd> {
    let mut a = RawTpOpen {
        name: name.map_or(0, |n| n.as_ptr() as u64),
        prog_fd: prog.as_raw_fd() as u32,
        ..RawTpOpen::default()
    };
    // SAFETY: `name` is null or points to a NUL-terminated string the caller keeps alive; the
    // link's fd it returns is new.
    unsafe { owned(bpf(RAW_TRACEPOINT_OPEN, &mut a)?) }
}

/// What the observer's programs need from the kernel's BTF: the syscall tracepoints' typedef
/// ids, and the scheduler form's (`sched_switch`, `skb_copy_datagram_iovec`,
/// `sock_send_length`) with the kernel fields its programs read — each, or why it cannot be
/// had. The kernel's BTF (~5 MB) is read and indexed once per process: it cannot change while
/// the kernel runs, and a bench attaches an observer per pair.
struct KernelIds {
    syscalls: Result<(u32, u32), String>,
    sched: Result<([u32; 3], Fields), String>,
}

fn kernel_ids() -> &'static KernelIds {
    static IDS: std::sync::OnceLock<KernelIds> = std::sync::OnceLock::new();
    IDS.get_or_init(|| {
        let raw = match std::fs::read(VMLINUX_BTF) {
            Ok(raw) => raw,
            Err(e) => {
                let why = format!("{VMLINUX_BTF}: {e}");
                return KernelIds {
                    syscalls: Err(why.clone()),
                    sched: Err(why),
                };
            }
        };
        match crate::btf::Btf::parse(&raw) {
            Ok(btf) => KernelIds {
                syscalls: syscall_ids(&btf),
                sched: sched_ids(&btf),
            },
            Err(why) => KernelIds {
                syscalls: Err(why.clone()),
                sched: Err(why),
            },
        }
    })
}

/// The typedef ids of the tracepoints `sys_enter` and `sys_exit`.
fn syscall_ids(btf: &crate::btf::Btf) -> Result<(u32, u32), String> {
    Ok((
        btf.typedef_id("btf_trace_sys_enter")?,
        btf.typedef_id("btf_trace_sys_exit")?,
    ))
}

/// The scheduler form's tracepoints' typedef ids and the fields its programs read.
fn sched_ids(btf: &crate::btf::Btf) -> Result<([u32; 3], Fields), String> {
    let ids = [
        btf.typedef_id("btf_trace_sched_switch")?,
        btf.typedef_id("btf_trace_skb_copy_datagram_iovec")?,
        btf.typedef_id("btf_trace_sock_send_length")?,
    ];
    let at = |strukt: &str, path: &str, size: u32| {
        let (off, got) = btf.field(strukt, path)?;
        if got != size {
            return Err(format!("{strukt}.{path} is {got} bytes here, not {size}"));
        }
        i16::try_from(off).map_err(|_| format!("{strukt}.{path} at {off}: too far"))
    };
    let fields = Fields {
        task_pid: at("task_struct", "pid", 4)?,
        task_tgid: at("task_struct", "tgid", 4)?,
        sk_num: at("sock", "__sk_common.skc_num", 2)?,
        sk_dport: at("sock", "__sk_common.skc_dport", 2)?,
        sk_daddr: at("sock", "__sk_common.skc_daddr", 4)?,
        skb_sk: at("sk_buff", "sk", 8)?,
        rq_clock: (|| {
            Ok::<_, String>([
                at("task_struct", "se.cfs_rq", 8)?,
                at("cfs_rq", "rq", 8)?,
                at("rq", "clock", 8)?,
            ])
        })()
        .ok(),
    };
    Ok((ids, fields))
}

/// Load and attach the scheduler form's three programs (see [`crate::schedprog`]).
fn load_sched(
    tgid: u32,
    port: u16,
    (ringbuf_fd, lost_fd): (i32, i32),
    (slots_fd, slots): (i32, u32),
) -> Result<(Vec<OwnedFd>, Vec<OwnedFd>), String> {
    let (ids, fields) = kernel_ids().sched.clone()?;
    let mut progs = Vec::new();
    let mut links = Vec::new();
    for (prog, id, name) in [
        (Prog::Switch, ids[0], "preheat_switch"),
        (Prog::Recv, ids[1], "preheat_recv"),
        (Prog::Send, ids[2], "preheat_send"),
    ] {
        let insns = schedprog::sched_observer(&SchedSpec {
            prog,
            tgid,
            port,
            fields,
            ringbuf_fd,
            lost_fd,
            slots_fd,
            slots,
        })?;
        let p = prog_load(&insns, name, Some(id)).map_err(|e| format!("{e:#}"))?;
        let link = raw_tracepoint_open(None, &p)
            .map_err(|e| format!("attaching {name} to its tracepoint: {e}"))?;
        progs.push(p);
        links.push(link);
    }
    Ok((progs, links))
}

/// Load and attach the entry and exit programs (BTF-typed where `typed` gives the
/// tracepoints' type ids); the programs and their links.
fn load_pair(
    tgid: u32,
    (enter_nrs, exit_nrs): (&[i64], &[i64]),
    (ringbuf_fd, lost_fd): (i32, i32),
    typed: Option<(u32, u32)>,
    slots: Option<(i32, u32)>,
) -> Result<(Vec<OwnedFd>, Vec<OwnedFd>)> {
    let mut progs = Vec::new();
    let mut links = Vec::new();
    for (edge, tp, keep, name, id) in [
        (
            Edge::Enter,
            c"sys_enter",
            enter_nrs,
            "preheat_enter",
            typed.map(|t| t.0),
        ),
        (
            Edge::Exit,
            c"sys_exit",
            exit_nrs,
            "preheat_exit",
            typed.map(|t| t.1),
        ),
    ] {
        let insns = match slots.filter(|_| id.is_some()) {
            Some((slots_fd, slots)) => periodprog::period_observer(&PeriodSpec {
                edge,
                tgid,
                ringbuf_fd,
                lost_fd,
                slots_fd,
                slots,
            }),
            None => bpfprog::observer(&Spec {
                edge,
                tgid,
                keep,
                ringbuf_fd,
                lost_fd,
                typed: id.is_some(),
            }),
        }
        .map_err(anyhow::Error::msg)?;
        let prog = prog_load(&insns, name, id)?;
        let link = raw_tracepoint_open(id.is_none().then_some(tp), &prog)
            .context("attaching the eBPF program to the raw tracepoint")?;
        progs.push(prog);
        links.push(link);
    }
    Ok((progs, links))
}

/// The syscall programs loaded and attached: their programs and links, why they are not
/// BTF-typed, why they write a record per call.
type SyscallForm = ((Vec<OwnedFd>, Vec<OwnedFd>), Option<String>, Option<String>);

impl Attached {
    /// Load the observer's programs for process `tgid` with a ring buffer of `size` bytes (a
    /// power of two, ≥ a page) and attach them: they run from here on.
    ///
    /// The scheduler form ([`crate::schedprog`], for `sched.0`, the port, with `sched.1`
    /// per-thread slots) unless `sched` says why not or the kernel refuses it; then the
    /// syscall programs on `sys_enter` and `sys_exit` (keeping `nrs.0` at entry and `nrs.1`
    /// at exit), and [`Attached::syscalls`] says why: BTF-typed (`tp_btf`, the registers read
    /// with plain loads) unless `typed` says why not or the kernel's BTF or verifier refuses
    /// them — then untyped, and [`Attached::untyped`] says why; typed, they write one record per
    /// busy period ([`crate::periodprog`], with `period`'s number of per-thread slots) unless
    /// `period` says why not or the verifier refuses them — then a record per call, and
    /// [`Attached::per_call`] says why.
    pub fn attach(
        tgid: u32,
        nrs: (&[i64], &[i64]),
        size: usize,
        sched: Result<(u16, u32), String>,
        (typed, period): (Result<(), String>, Result<u32, String>),
    ) -> Result<Attached> {
        if !cfg!(target_arch = "x86_64") {
            bail!("the eBPF observer knows x86_64's registers and syscall numbers only");
        }
        let entries = u32::try_from(size).context("ring buffer too large")?;
        let ringbuf = map_create(MAP_TYPE_RINGBUF, 0, 0, entries)
            .context("creating a BPF ring buffer (kernel ≥ 5.8, root)")?;
        // Element 0: records the full ring buffer refused; 1: the scheduler form's calls
        // written alone (their thread's slot held by another); 2 and 3: its clock anchor.
        let lost = map_create(MAP_TYPE_ARRAY, 4, 8, schedprog::COUNTERS)
            .context("creating a BPF array")?;
        let ring = RingBuf::map(&ringbuf, size).context("mapping the BPF ring buffer")?;
        let fds = (ringbuf.as_raw_fd(), lost.as_raw_fd());
        let mut slots = None;
        let sched = sched.and_then(|(port, n)| {
            let m = map_create(MAP_TYPE_ARRAY, 4, schedprog::SLOT_SIZE as u32, n)
                .map_err(|e| format!("creating the per-thread array: {e}"))?;
            let loaded = load_sched(tgid, port, fds, (m.as_raw_fd(), n))
                .map_err(|e| format!("the kernel refused the scheduler form: {e}"))?;
            slots = Some(m);
            Ok(loaded)
        });
        let ((progs, links), untyped, per_call, syscalls) = match sched {
            Ok(loaded) => (loaded, None, None, None),
            Err(why) => {
                let (loaded, untyped, per_call) =
                    Self::syscall_form(tgid, nrs, fds, typed, period, &mut slots)?;
                (loaded, untyped, per_call, Some(why))
            }
        };
        Ok(Attached {
            ring,
            lost,
            links,
            untyped,
            per_call,
            syscalls,
            _progs: progs,
            _ringbuf: ringbuf,
            _slots: slots,
        })
    }

    /// The syscall programs, as [`Attached::attach`] says.
    fn syscall_form(
        tgid: u32,
        nrs: (&[i64], &[i64]),
        fds: (i32, i32),
        typed: Result<(), String>,
        period: Result<u32, String>,
        slots: &mut Option<OwnedFd>,
    ) -> Result<SyscallForm> {
        let loaded = typed
            .and_then(|()| kernel_ids().syscalls.clone())
            .and_then(|ids| {
                let period = period.and_then(|n| {
                    let m = map_create(MAP_TYPE_ARRAY, 4, periodprog::SLOT_SIZE as u32, n)
                        .map_err(|e| format!("creating the per-thread array: {e}"))?;
                    let pair = load_pair(tgid, nrs, fds, Some(ids), Some((m.as_raw_fd(), n)))
                        .map_err(|e| format!("the verifier refused the period programs: {e:#}"))?;
                    *slots = Some(m);
                    Ok(pair)
                });
                match period {
                    Ok(pair) => Ok((pair, None)),
                    Err(why) => load_pair(tgid, nrs, fds, Some(ids), None)
                        .map(|pair| (pair, Some(why)))
                        .map_err(|e| format!("{e:#}")),
                }
            });
        Ok(match loaded {
            Ok((pair, per_call)) => (pair, None, per_call),
            Err(why) => (load_pair(tgid, nrs, fds, None, None)?, Some(why), None),
        })
    }

    /// Why the programs are on the syscall tracepoints instead of the scheduler's and the
    /// socket layer's; `None` where the scheduler form runs.
    pub fn syscalls(&self) -> Option<&str> {
        self.syscalls.as_deref()
    }

    /// Why the programs write a record per call instead of one per busy period; `None` where
    /// they write one per period.
    pub fn per_call(&self) -> Option<&str> {
        match &self.untyped {
            Some(_) => Some("not BTF-typed"),
            None => self.per_call.as_deref(),
        }
    }

    /// Why the programs are not BTF-typed (they read the registers through a helper call
    /// each); `None` where they are.
    pub fn untyped(&self) -> Option<&str> {
        self.untyped.as_deref()
    }

    /// Stop: the programs no longer run once their links are closed.
    pub fn detach(&mut self) {
        self.links.clear();
    }

    /// Attach the loaded programs again after [`Attached::detach`] (nothing if attached).
    pub fn reattach(&mut self) -> Result<()> {
        if !self.links.is_empty() {
            return Ok(());
        }
        // The untyped programs (entry, exit) name their tracepoint at attach; typed ones were
        // named at load.
        let untyped = [c"sys_enter", c"sys_exit"];
        for (i, prog) in self._progs.iter().enumerate() {
            let name = untyped.get(i).copied().filter(|_| self.untyped.is_some());
            let link = raw_tracepoint_open(name, prog)
                .context("attaching the eBPF program to the raw tracepoint again")?;
            self.links.push(link);
        }
        Ok(())
    }

    /// Append every committed record to `out`; returns how many.
    pub fn drain(&mut self, out: &mut Vec<u8>) -> usize {
        self.ring.drain(out)
    }

    /// Records the full ring buffer refused so far.
    pub fn lost(&self) -> u64 {
        lookup_u64(&self.lost, 0).unwrap_or(0)
    }

    /// The scheduler form's calls written alone, as periods of their own (another thread held
    /// the caller's slot).
    pub fn written_alone(&self) -> u64 {
        lookup_u64(&self.lost, 1).unwrap_or(0)
    }
}
