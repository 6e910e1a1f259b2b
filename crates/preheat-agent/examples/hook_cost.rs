//! What the agent's hooks cost per request cycle, measured (a microbenchmark):
//! `cargo run --release -p preheat-agent --example hook_cost -- [reps] [cycles-per-block] [blocks]`
//! (build the cdylib first: `cargo build --release -p preheat-agent`; `PREHEAT_AGENT_SO` names
//! another copy).
//!
//! One request cycle of an event-loop server as the agent sees it: an event wait that returns an
//! event (the end of an idle period and the start of a busy period: `wait_enter`, `wait_exit`)
//! and a read that returns bytes from a connection accepted on a listening port (`on_read`: the
//! busy period's attribution). Both system calls are as cheap as they get: the epoll set holds an
//! eventfd that stays readable, and the accepted connection's fd number is made to refer to
//! `/dev/zero` (an unhooked `dup3` after the hooked `accept4` mapped the number to its port).
//!
//! In one process, blocks of cycles through libc's functions (interposed by the agent when it is
//! preloaded) alternate with blocks of the same system calls issued raw (never interposed); the
//! difference per cycle is what libc's wrappers and, with the agent, its hooks add. The parent
//! runs a child per configuration, in rotated order each repetition: no agent; no agent but one
//! more (parked) thread, as the agent's threads make the host multi-threaded (glibc's
//! cancellable wrappers then switch the cancellation type with atomics around every call); the
//! agent preloaded but pass-through (`PREHEAT_AGENT_DISABLE=1`: the interposition alone, no
//! threads); and the agent tracking. Reported per repetition: differences to no agent, ns per
//! cycle; median [range] over repetitions. (What a multi-threaded process costs in the kernel —
//! a shared fd table takes a file reference per system call — is in both blocks and cancels
//! out of the differences; the raw cycle shows it: the extra host thread shares the table and
//! pays it, the agent's threads run on a table of their own (`fdreg`), so the tracking
//! configuration's raw cycle is none's — measured 628 vs 632 ns, against 747 ns before.)
#![allow(unsafe_code)]

use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::process::Command;

use preheat_engine::time::now_ns;
use preheat_model::stats::summarize;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--child") {
        let cycles = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(20_000);
        let blocks = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(20);
        let (delta, raw) = child(cycles, blocks);
        println!("{delta} {raw}");
        return;
    }
    let reps: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(7);
    let cycles: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(20_000);
    let blocks: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(20);
    let exe = std::env::current_exe().expect("own path");
    let so = std::env::var_os("PREHEAT_AGENT_SO")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            exe.parent()
                .and_then(|d| d.parent())
                .expect("target directory")
                .join("libpreheat_agent.so")
        });
    assert!(
        so.exists(),
        "{} missing: build the agent first",
        so.display()
    );
    let run_dir = tempfile::Builder::new()
        .prefix("preheat-hookcost-")
        .tempdir()
        .expect("run dir");
    let ncpu = std::thread::available_parallelism().map_or(1, |n| n.get());
    let configs = ["none", "none+thread", "pass-through", "tracking"];
    let mut res: [Vec<f64>; 4] = Default::default();
    let mut raw: [Vec<f64>; 4] = Default::default();
    for r in 0..reps {
        for k in 0..4 {
            let c = (k + r) % 4;
            let mut cmd = Command::new(&exe);
            cmd.args(["--child", &cycles.to_string(), &blocks.to_string()])
                .env("PREHEAT_RUN_DIR", run_dir.path())
                .env("PREHEAT_CHILD_CPU", (ncpu - 1).to_string())
                .env_remove("LD_PRELOAD")
                .env_remove("PREHEAT_AGENT_DISABLE");
            match c {
                1 => {
                    cmd.env("PREHEAT_CHILD_THREAD", "1");
                }
                2 => {
                    cmd.env("LD_PRELOAD", &so).env("PREHEAT_AGENT_DISABLE", "1");
                }
                3 => {
                    cmd.env("LD_PRELOAD", &so);
                }
                _ => {}
            }
            let out = cmd.output().expect("child");
            assert!(out.status.success(), "child failed: {out:?}");
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            let mut v = text
                .split_whitespace()
                .map(|x| x.parse::<f64>().expect("child's numbers"));
            res[c].push(v.next().expect("libc − raw"));
            raw[c].push(v.next().expect("raw"));
        }
    }
    let show = |v: &[f64]| {
        let s = summarize(v);
        format!("{:.1} ns median [{:.1}–{:.1}]", s.p50, s.min, s.max)
    };
    let minus = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x - y).collect::<Vec<_>>();
    println!(
        "hook cost per request cycle (epoll_wait returning 1 event + read returning 1 byte on a connection of a listening port) [measured: {reps} repetitions x 4 configurations, each {blocks} blocks x {cycles} cycles through libc alternating with as many raw system calls, on CPU {}]",
        ncpu - 1
    );
    for (c, name) in configs.iter().enumerate() {
        println!(
            "  {name:>12}: libc − raw {} per cycle; raw cycle {}",
            show(&res[c]),
            show(&raw[c])
        );
    }
    println!(
        "  agent hooks (tracking − none): {}; interposition alone (pass-through − none): {}; a second thread (none+thread − none): {}",
        show(&minus(&res[3], &res[0])),
        show(&minus(&res[2], &res[0])),
        show(&minus(&res[1], &res[0]))
    );
}

/// One configuration: medians over block pairs of (libc block − raw block) and of the raw block,
/// ns per cycle. (The raw cycle differs between processes by more than the hooks cost: it is
/// printed for what a multi-threaded process costs in the kernel, not subtracted.)
fn child(cycles: usize, blocks: usize) -> (f64, f64) {
    if let Some(cpu) = std::env::var("PREHEAT_CHILD_CPU")
        .ok()
        .and_then(|s| s.parse::<usize>().ok())
    {
        // SAFETY: a zeroed cpu_set_t is valid; CPU_SET stays within it (cpu < CPU_SETSIZE
        // checked); sched_setaffinity reads the set.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            if cpu < libc::CPU_SETSIZE as usize {
                libc::CPU_SET(cpu, &mut set);
                libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
            }
        }
    }
    if std::env::var_os("PREHEAT_CHILD_THREAD").is_some() {
        std::thread::spawn(|| loop {
            std::thread::park();
        });
    }
    // A connection accepted through accept4 (interposed: the agent maps its fd to the port).
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let _client = TcpStream::connect(l.local_addr().expect("addr")).expect("connect");
    let (conn, _) = l.accept().expect("accept");
    let fd = conn.as_raw_fd();
    let zero = std::fs::File::open("/dev/zero").expect("/dev/zero");
    // SAFETY: dup3 of two open fds we own; the connection's number now refers to /dev/zero
    // (raw system call: the agent does not see it and keeps the number's port).
    let r = unsafe { libc::syscall(libc::SYS_dup3, zero.as_raw_fd(), fd, libc::O_CLOEXEC) };
    assert!(r >= 0, "dup3");
    // SAFETY: plain fd-creating calls.
    let (efd, ep) = unsafe {
        (
            libc::eventfd(1, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC),
            libc::epoll_create1(libc::EPOLL_CLOEXEC),
        )
    };
    assert!(efd >= 0 && ep >= 0);
    let mut ev = libc::epoll_event {
        events: libc::EPOLLIN as u32,
        u64: 0,
    };
    // SAFETY: `ev` is a valid epoll_event; both fds are open.
    let added = unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, efd, &mut ev) };
    assert_eq!(added, 0);
    let mut buf = [0u8; 1];
    let mut out = libc::epoll_event { events: 0, u64: 0 };
    let mut cycle = |raw: bool| {
        // SAFETY: `out` and `buf` are valid for one event / one byte; the fds are open.
        let (n, m) = unsafe {
            if raw {
                (
                    libc::syscall(
                        libc::SYS_epoll_pwait,
                        ep,
                        &mut out as *mut libc::epoll_event,
                        1,
                        0,
                        std::ptr::null::<libc::sigset_t>(),
                        8,
                    ) as i32,
                    libc::syscall(libc::SYS_read, fd, buf.as_mut_ptr(), 1) as isize,
                )
            } else {
                (
                    libc::epoll_wait(ep, &mut out, 1, 0),
                    libc::read(fd, buf.as_mut_ptr().cast(), 1),
                )
            }
        };
        assert!(n == 1 && m == 1, "cycle returned {n}, {m}");
    };
    // Warm up both paths.
    for _ in 0..cycles {
        cycle(false);
        cycle(true);
    }
    let mut deltas = Vec::with_capacity(blocks);
    let mut raws = Vec::with_capacity(blocks);
    for b in 0..blocks {
        let mut t = [0u64; 2];
        // Alternate which path goes first.
        for k in [b % 2, 1 - b % 2] {
            let t0 = now_ns();
            for _ in 0..cycles {
                cycle(k == 1);
            }
            t[k] = now_ns() - t0;
        }
        deltas.push((t[0] as f64 - t[1] as f64) / cycles as f64);
        raws.push(t[1] as f64 / cycles as f64);
    }
    drop((conn, zero));
    (summarize(&deltas).p50, summarize(&raws).p50)
}
