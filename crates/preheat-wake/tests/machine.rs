//! The daemon against the real machine: PM QoS really changes during a window and is restored
//! after it, after a crash (journal), and on SIGTERM; client death cancels future windows;
//! bad requests are refused with a clear message.
//!
//! Tests that need root or a sysfs file this machine lacks report a skip
//! (`preheat_testsupport::skip`). Tests that
//! touch the real `pm_qos_resume_latency_us` of a CPU run one at a time (and put back the value
//! they found, whatever happens).

use preheat_wake::keep_awake::{Journal, JournalEntry, SysPaths};
use preheat_wake::proto::Status;
use preheat_wake::{Config, Daemon, Limits, MechChoice, Mechanism, WakeClient};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use preheat_engine::time::now_ns;

const MS: u64 = 1_000_000;

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

use preheat_testsupport::skip;

/// The CPU the tests use (1 if online, else the highest online CPU).
fn test_cpu() -> u32 {
    let online = SysPaths::default().online_cpus();
    if online.contains(&1) {
        1
    } else {
        online.last().copied().unwrap_or(0)
    }
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap().trim().to_string()
}

fn write(p: &Path, v: &str) {
    std::fs::write(p, v).unwrap();
}

/// The real PM QoS file of `cpu`, if we are root and it exists; else why not.
fn real_pm_qos(cpu: u32) -> Result<PathBuf, (&'static str, String)> {
    if preheat_wake::keep_awake::effective_uid() != Some(0) {
        return Err(("root", "not root: cannot change PM QoS".into()));
    }
    let p = SysPaths::default().pm_qos(cpu);
    if !p.exists() {
        return Err(("pm-qos", format!("{} does not exist", p.display())));
    }
    Ok(p)
}

/// Puts back the value found at creation when dropped (also when the test fails).
struct PutBack {
    path: PathBuf,
    value: String,
}

impl PutBack {
    fn new(path: &Path) -> PutBack {
        PutBack {
            path: path.to_path_buf(),
            value: read(path),
        }
    }
}

impl Drop for PutBack {
    fn drop(&mut self) {
        let _ = std::fs::write(&self.path, &self.value);
    }
}

/// The real PM QoS file of `cpu` with `original` written to it, and the guard that puts back
/// what it held before; `None` (after reporting the skip) where it cannot be changed.
fn set_real_pm_qos(cpu: u32, original: &str) -> Option<(PathBuf, PutBack)> {
    let path = match real_pm_qos(cpu) {
        Ok(p) => p,
        Err((component, why)) => {
            skip(component, &why);
            return None;
        }
    };
    let put_back = PutBack::new(&path);
    write(&path, original);
    Some((path, put_back))
}

fn start(dir: &Path, mech: MechChoice) -> Daemon {
    let mut cfg = Config::new(dir);
    cfg.mech = mech;
    Daemon::start(cfg).expect("daemon starts")
}

/// Poll `f` every millisecond until it returns true or `deadline_ns` (CLOCK_MONOTONIC) passes.
fn poll_until(deadline_ns: u64, mut f: impl FnMut() -> bool) -> bool {
    loop {
        if f() {
            return true;
        }
        if now_ns() >= deadline_ns {
            return false;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn status(dir: &Path) -> Status {
    WakeClient::connect(dir).unwrap().status().unwrap()
}

#[test]
fn pm_qos_window_sets_na_and_restores_the_original() {
    let _s = serial();
    let cpu = test_cpu();
    // A distinctive original value, so "restored" cannot be confused with the default.
    let Some((path, _put_back)) = set_real_pm_qos(cpu, "125") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let d = start(dir.path(), MechChoice::PmQos);
    let st = d.status();
    let cs = st.cpus.iter().find(|c| c.cpu == cpu).unwrap();
    if cs.mechanism != Mechanism::PmQos {
        return skip("pm-qos", &format!("pmqos unavailable here: {:?}", st.notes));
    }
    let mut c = WakeClient::connect(dir.path()).unwrap();
    let a = c.request_in("t-pmqos", &[cpu], 300 * MS, 600 * MS).unwrap();
    assert_eq!(a.mechanism, "pmqos");
    assert_eq!(a.mechanisms[&cpu], Mechanism::PmQos);
    let (start_ns, end_ns) = (a.start_ns, a.end_ns);

    // Before the window (minus the lead, ≤ 2 ms): untouched.
    std::thread::sleep(Duration::from_millis(100));
    let v = read(&path);
    if now_ns() + 5 * MS < start_ns {
        assert_eq!(v, "125", "changed before the window");
    }
    // During: n/a, journalled with the original.
    let seen = poll_until(end_ns - 50 * MS, || read(&path) == "n/a");
    assert!(
        seen,
        "pm_qos_resume_latency_us never read n/a during the window"
    );
    let j = Journal::load(&dir.path().join(Journal::FILE)).unwrap();
    assert_eq!(j.entries.len(), 1);
    assert_eq!(j.entries[0].original, "125");
    assert_eq!(j.entries[0].written, "n/a");
    let st = c.status().unwrap();
    let armed = st.cpus.iter().find(|x| x.cpu == cpu).unwrap().armed;
    assert_eq!(armed.map(|a| a.mechanism), Some(Mechanism::PmQos));
    // After: the original, while the client is still connected (windows end on their own).
    let restored = poll_until(end_ns + 1000 * MS, || read(&path) == "125");
    assert!(restored, "not restored after the window: {}", read(&path));
    let late_ms = now_ns().saturating_sub(end_ns) as f64 / 1e6;
    println!("restored {late_ms:.2} ms after the window end");
    // The journal still lists the file with its original while the daemon runs.
    let j = Journal::load(&dir.path().join(Journal::FILE)).unwrap();
    assert!(j.entries.iter().all(|e| e.original == "125"));
    let st = c.status().unwrap();
    let w = st
        .recent
        .iter()
        .find(|w| w.id == a.id)
        .expect("window recorded");
    assert_eq!(w.outcome, "completed");
    println!(
        "ended {:.1} µs after its end time",
        w.ended_late_ns as f64 / 1e3
    );
    let rec = w.per_cpu[&cpu].expect("armed");
    assert_eq!(rec.mechanism, Mechanism::PmQos);
    println!(
        "armed {:.1} µs before the start",
        rec.armed_before_start_ns as f64 / 1e3
    );
    assert_eq!(st.awake["t-pmqos"].total_ns, end_ns - start_ns);
    assert_eq!(st.changed_now, 0);
    drop(c);
    d.shutdown();
    assert_eq!(read(&path), "125");
    assert!(!dir.path().join(Journal::FILE).exists());
}

#[test]
fn journal_left_by_a_crash_is_restored_at_start() {
    let _s = serial();
    let cpu = test_cpu();
    // What a daemon that died mid-window leaves: the value changed, the original journalled.
    let Some((path, _put_back)) = set_real_pm_qos(cpu, "n/a") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let jp = dir.path().join(Journal::FILE);
    Journal {
        version: 1,
        pid: 999_999,
        entries: vec![JournalEntry {
            path: path.clone(),
            original: "77".into(),
            written: "n/a".into(),
        }],
    }
    .save(&jp)
    .unwrap();
    let d = start(dir.path(), MechChoice::Spin);
    assert_eq!(read(&path), "77");
    assert!(!jp.exists());
    let report = d.startup_report().join("\n");
    assert!(report.contains("restored"), "{report}");
    d.shutdown();
    assert_eq!(read(&path), "77");
}

#[test]
fn client_death_cancels_future_windows_running_ones_end_on_their_own() {
    let dir = tempfile::tempdir().unwrap();
    // Spin changes nothing on the machine: no root needed.
    let d = start(dir.path(), MechChoice::Spin);
    let cpu = test_cpu();
    let mut a = WakeClient::connect(dir.path()).unwrap();
    let fut = a
        .request_in("t-death", &[cpu], 5_000 * MS, 100 * MS)
        .unwrap();
    let run = a.request_in("t-death", &[cpu], 0, 300 * MS).unwrap();
    assert_eq!(fut.mechanism, "spin");
    let st = status(dir.path());
    assert_eq!(st.pending.len(), 2);
    drop(a); // the client dies
    let ok = poll_until(now_ns() + 2000 * MS, || {
        let st = status(dir.path());
        st.pending.len() == 1 && st.pending[0].id == run.id
    });
    assert!(
        ok,
        "future window not cancelled: {:?}",
        status(dir.path()).pending
    );
    let st = status(dir.path());
    let c = st.recent.iter().find(|w| w.id == fut.id).unwrap();
    assert_eq!(c.outcome, "cancelled: client closed");
    assert_eq!(st.cancelled, 1);
    // The running one ends at its end time.
    let ended = poll_until(run.end_ns + 1000 * MS, || {
        status(dir.path()).pending.is_empty()
    });
    assert!(ended);
    let st = status(dir.path());
    let w = st.recent.iter().find(|w| w.id == run.id).unwrap();
    assert_eq!(w.outcome, "completed");
    assert_eq!(st.awake["t-death"].total_ns, run.end_ns - run.start_ns);
    // An explicit cancel works too, and only for windows that have not started.
    let mut b = WakeClient::connect(dir.path()).unwrap();
    let x = b.request_in("t-death", &[cpu], 5_000 * MS, MS).unwrap();
    b.cancel(x.id).unwrap();
    assert!(b.cancel(x.id).is_err());
    let st = b.status().unwrap();
    assert!(st.pending.is_empty());
    assert!(!st.awake.contains_key("nobody"));
    d.shutdown();
}

#[test]
fn bad_requests_are_rejected_with_a_clear_message() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = Config::new(dir.path());
    cfg.mech = MechChoice::Spin;
    cfg.limits = Limits {
        max_pending_per_requester: 2,
        max_pending_total: 3,
        ..Limits::default()
    };
    let d = Daemon::start(cfg).unwrap();
    let cpu = test_cpu();
    let mut c = WakeClient::connect(dir.path()).unwrap();
    let now = now_ns();
    let err = |c: &mut WakeClient, line: String| -> String {
        match c.send_raw(&line) {
            Err(preheat_wake::ClientError::Rejected(m)) => m,
            other => panic!("{line}: expected a rejection, got {other:?}"),
        }
    };
    let req = |start: i128, dur: i128, cpus: &str| {
        format!(r#"{{"requester":"t-bad","cpus":{cpus},"start_ns":{start},"duration_ns":{dur}}}"#)
    };
    let n = now as i128;
    let later = n + 1000 * MS as i128;
    let m = err(&mut c, req(n, 11_000 * MS as i128, &format!("[{cpu}]")));
    assert!(m.contains("longer than the limit of 10000000000 ns"), "{m}");
    let m = err(&mut c, req(n, -5, &format!("[{cpu}]")));
    assert!(m.contains("duration_ns is negative (-5)"), "{m}");
    let m = err(&mut c, req(-1, 5, &format!("[{cpu}]")));
    assert!(m.contains("start_ns is negative"), "{m}");
    let m = err(&mut c, req(later, 0, &format!("[{cpu}]")));
    assert!(m.contains("duration_ns is 0"), "{m}");
    let m = err(
        &mut c,
        req(n + 61_000 * MS as i128, MS as i128, &format!("[{cpu}]")),
    );
    assert!(m.contains("more than the limit"), "{m}");
    let m = err(
        &mut c,
        req(n - 10 * MS as i128, MS as i128, &format!("[{cpu}]")),
    );
    assert!(m.contains("already ended"), "{m}");
    let m = err(&mut c, req(later, MS as i128, "[4000]"));
    assert!(m.contains("CPU 4000 is not online"), "{m}");
    let m = err(&mut c, req(later, MS as i128, "[]"));
    assert!(m.contains("no CPUs"), "{m}");
    let m = err(&mut c, "{\"requester\":1}".into());
    assert!(m.contains("requester"), "{m}");
    let m = err(&mut c, "garbage".into());
    assert!(m.contains("not JSON"), "{m}");
    // Too many.
    for _ in 0..2 {
        c.request_in("t-bad", &[cpu], 10_000 * MS, MS).unwrap();
    }
    let m = err(
        &mut c,
        req(n + 10_000 * MS as i128, MS as i128, &format!("[{cpu}]")),
    );
    assert!(m.contains("already has 2 windows pending (limit 2)"), "{m}");
    c.request_in("other", &[cpu], 10_000 * MS, MS).unwrap();
    let m = err(
        &mut c,
        req(n + 10_000 * MS as i128, MS as i128, &format!("[{cpu}]")).replace("t-bad", "third"),
    );
    assert!(m.contains("3 windows pending in total (limit 3)"), "{m}");
    let st = c.status().unwrap();
    assert_eq!(st.rejected, 12);
    assert_eq!(st.accepted, 3);
    drop(c);
    d.shutdown();
}

#[test]
fn dma_latency_fd_is_held_only_during_the_window() {
    let _s = serial();
    if preheat_wake::keep_awake::effective_uid() != Some(0) {
        return skip("root", "not root: cannot open /dev/cpu_dma_latency");
    }
    if !Path::new("/dev/cpu_dma_latency").exists() {
        return skip("cpu-dma-latency", "/dev/cpu_dma_latency does not exist");
    }
    let holds_dma = || {
        std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .flatten()
            .any(|e| {
                std::fs::read_link(e.path()).is_ok_and(|t| t == Path::new("/dev/cpu_dma_latency"))
            })
    };
    let dir = tempfile::tempdir().unwrap();
    let d = start(dir.path(), MechChoice::Dma);
    let cpu = test_cpu();
    if d.status()
        .cpus
        .iter()
        .find(|c| c.cpu == cpu)
        .unwrap()
        .mechanism
        != Mechanism::DmaLatency
    {
        return skip(
            "cpu-dma-latency",
            &format!("dma unavailable: {:?}", d.status().notes),
        );
    }
    assert!(!holds_dma());
    let mut c = WakeClient::connect(dir.path()).unwrap();
    let a = c.request_in("t-dma", &[cpu], 100 * MS, 300 * MS).unwrap();
    assert_eq!(a.mechanism, "dma");
    assert!(poll_until(a.end_ns - 20 * MS, holds_dma), "fd never opened");
    assert!(
        poll_until(a.end_ns + 1000 * MS, || !holds_dma()),
        "fd not closed after the window"
    );
    d.shutdown();
}

// ---------------------------------------------------------------------------------------------
// The daemon as a separate process (signals, crashes).

/// Entry point of the child daemon: runs `preheat wake serve` when the parent test re-executes
/// this binary with `PREHEAT_WAKE_TEST_CHILD` set; does nothing otherwise.
#[test]
#[ignore = "entry point of the child daemon process used by the signal tests"]
fn child_daemon_entry() {
    let Some(dir) = std::env::var_os("PREHEAT_WAKE_TEST_CHILD") else {
        return;
    };
    let mech = match std::env::var("PREHEAT_WAKE_TEST_CHILD_MECH").as_deref() {
        Ok("auto") => MechChoice::Auto,
        _ => MechChoice::PmQos,
    };
    let args = preheat_wake::WakeArgs {
        run_dir: Some(PathBuf::from(dir)),
        cmd: preheat_wake::WakeCmd::Serve(preheat_wake::ServeArgs {
            mech,
            max_pending_per_requester: 64,
            max_pending_total: 1024,
            socket_mode: 0o600,
        }),
    };
    preheat_wake::run(args).unwrap();
}

struct ChildDaemon {
    child: Child,
    log: PathBuf,
}

impl ChildDaemon {
    fn spawn(dir: &Path) -> ChildDaemon {
        Self::spawn_as(dir, &[], "pmqos")
    }

    /// Run the child under `prefix` (e.g. `setpriv …`) with mechanism choice `mech`.
    fn spawn_as(dir: &Path, prefix: &[&str], mech: &str) -> ChildDaemon {
        let log = dir.with_extension("log");
        let exe = std::env::current_exe().unwrap();
        let mut cmd = match prefix.split_first() {
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(&exe);
                c
            }
            None => Command::new(&exe),
        };
        let child = cmd
            .args([
                "--exact",
                "child_daemon_entry",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("PREHEAT_WAKE_TEST_CHILD", dir)
            .env("PREHEAT_WAKE_TEST_CHILD_MECH", mech)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let mut ch = ChildDaemon { child, log };
        let deadline = Instant::now() + Duration::from_secs(20);
        while WakeClient::connect(dir).is_err() {
            if let Ok(Some(st)) = ch.child.try_wait() {
                panic!("child daemon exited ({st:?}); log:\n{}", ch.log());
            }
            assert!(
                Instant::now() < deadline,
                "child daemon did not start; log:\n{}",
                ch.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        ch
    }

    fn signal(&self, sig: &str) {
        let signo = match sig {
            "TERM" => libc::SIGTERM,
            "KILL" => libc::SIGKILL,
            other => panic!("no signal {other} in these tests"),
        };
        preheat_engine::os::send_signal(self.child.id(), signo, false).unwrap();
    }

    fn wait(&mut self) -> std::process::ExitStatus {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s;
            }
            assert!(Instant::now() < deadline, "child daemon did not exit");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for ChildDaemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // The log sits beside the test's temporary directory, which does not remove it.
        let _ = std::fs::remove_file(&self.log);
    }
}

/// Start a child daemon and hold a window on `cpu` until `path` reads `n/a`.
fn child_with_window(dir: &Path, cpu: u32, path: &Path) -> Option<(ChildDaemon, WakeClient)> {
    let ch = ChildDaemon::spawn(dir);
    let mut c = WakeClient::connect(dir).unwrap();
    let st = c.status().unwrap();
    if st.cpus.iter().find(|x| x.cpu == cpu).unwrap().mechanism != Mechanism::PmQos {
        skip(
            "pm-qos",
            &format!("pmqos unavailable in the child: {:?}", st.notes),
        );
        return None;
    }
    let a = c.request_in("t-signal", &[cpu], 0, 8_000 * MS).unwrap();
    assert!(
        poll_until(a.end_ns, || read(path) == "n/a"),
        "never n/a; child log:\n{}",
        ch.log()
    );
    Some((ch, c))
}

#[test]
fn sigterm_restores_settings() {
    let _s = serial();
    let cpu = test_cpu();
    let Some((path, _put_back)) = set_real_pm_qos(cpu, "125") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let Some((mut ch, _c)) = child_with_window(dir.path(), cpu, &path) else {
        return;
    };
    ch.signal("TERM");
    let st = ch.wait();
    let log = ch.log();
    assert!(st.success(), "exit {st:?}; log:\n{log}");
    assert_eq!(read(&path), "125", "log:\n{log}");
    assert!(!dir.path().join(Journal::FILE).exists());
    assert!(!dir.path().join("wake.sock").exists());
    assert!(log.contains("pmqos constraint removed"), "{log}");
}

#[test]
fn sigkill_then_the_next_daemon_restores_from_the_journal() {
    let _s = serial();
    let cpu = test_cpu();
    let Some((path, _put_back)) = set_real_pm_qos(cpu, "125") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let Some((mut ch, c)) = child_with_window(dir.path(), cpu, &path) else {
        return;
    };
    ch.signal("KILL");
    ch.wait();
    drop(c);
    // The crash left the setting changed, and the journal says what to restore.
    assert_eq!(read(&path), "n/a");
    let j = Journal::load(&dir.path().join(Journal::FILE)).unwrap();
    assert_eq!(j.entries.len(), 1);
    assert_eq!(j.entries[0].original, "125");
    // The successor restores it before doing anything else.
    let d = start(dir.path(), MechChoice::Auto);
    assert_eq!(read(&path), "125");
    assert!(!dir.path().join(Journal::FILE).exists());
    assert!(d.startup_report().join("\n").contains("restored"));
    d.shutdown();
}

#[test]
fn one_daemon_per_run_dir() {
    let dir = tempfile::tempdir().unwrap();
    let d = start(dir.path(), MechChoice::Spin);
    let mut cfg = Config::new(dir.path());
    cfg.mech = MechChoice::Spin;
    let e = Daemon::start(cfg)
        .err()
        .expect("second daemon refused")
        .to_string();
    assert!(e.contains("already serves"), "{e}");
    d.shutdown();
    assert!(!dir.path().join("wake.sock").exists());
}

#[test]
fn cli_subcommands_against_a_daemon() {
    let dir = tempfile::tempdir().unwrap();
    let d = start(dir.path(), MechChoice::Spin);
    let cpu = test_cpu();
    let run = |cmd: preheat_wake::WakeCmd| {
        preheat_wake::run(preheat_wake::WakeArgs {
            run_dir: Some(dir.path().to_path_buf()),
            cmd,
        })
    };
    let t0 = now_ns();
    run(preheat_wake::WakeCmd::Request {
        cpus: preheat_wake::CpuList(vec![cpu]),
        in_us: 20_000,
        for_us: 2000,
        requester: "cli-test".into(),
    })
    .unwrap();
    // It stays connected until the window ended.
    assert!(now_ns() - t0 >= 22_000_000);
    run(preheat_wake::WakeCmd::Hold {
        cpus: preheat_wake::CpuList(vec![cpu]),
        for_ms: 3,
        requester: "cli-test".into(),
    })
    .unwrap();
    run(preheat_wake::WakeCmd::Status { json: false }).unwrap();
    run(preheat_wake::WakeCmd::Status { json: true }).unwrap();
    let st = d.status();
    // The charge is the planned windows, exactly: the request's 2 ms and the hold's 3 ms, which
    // count from when the daemon got the hold (it ran 4 ms late once: the hold was refused as
    // ended before it counted from receipt). Asserted against the windows the daemon reports.
    let mine: Vec<_> = st
        .recent
        .iter()
        .filter(|w| w.requester == "cli-test")
        .collect();
    assert_eq!(mine.len(), 2, "{mine:?}");
    assert_eq!(mine[0].end_ns - mine[0].start_ns, 2_000_000, "{mine:?}");
    assert_eq!(mine[1].end_ns - mine[1].start_ns, 3_000_000, "{mine:?}");
    assert_eq!(st.awake["cli-test"].total_ns, 5_000_000, "{mine:?}");
    let text = preheat_wake::format_status(&st);
    assert!(text.contains("cli-test: "), "{text}");
    assert!(text.contains("completed"), "{text}");
    // A rejected request is an error with the daemon's reason.
    let e = run(preheat_wake::WakeCmd::Hold {
        cpus: preheat_wake::CpuList(vec![cpu]),
        for_ms: 20_000,
        requester: "cli-test".into(),
    })
    .unwrap_err()
    .to_string();
    assert!(e.contains("longer than the limit"), "{e}");
    d.shutdown();
    // Without a daemon: a clear error naming the socket.
    let e = run(preheat_wake::WakeCmd::Status { json: false })
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("wake.sock") && e.contains("preheat wake serve"),
        "{e}"
    );
}

#[test]
fn unprivileged_changes_nothing_and_uses_spin() {
    let _s = serial();
    let cpu = test_cpu();
    let path = match real_pm_qos(cpu) {
        Ok(p) => p,
        Err((component, why)) => {
            return skip(
                component,
                &format!("{why} (needed to drop to an unprivileged user)"),
            )
        }
    };
    if !Path::new("/usr/bin/setpriv").exists() {
        return skip("setpriv", "setpriv (util-linux) is not installed");
    }
    let _put_back = PutBack::new(&path);
    write(&path, "125");
    // A run directory the unprivileged user owns, reachable through a traversable parent.
    let top = tempfile::tempdir().unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(top.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    let dir = top.path().join("run");
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::os::unix::fs::chown(&dir, Some(65534), Some(65534)).unwrap();
    let mut ch = ChildDaemon::spawn_as(
        &dir,
        &[
            "/usr/bin/setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--",
        ],
        "auto",
    );
    let mut c = WakeClient::connect(&dir).unwrap();
    let st = c.status().unwrap();
    assert!(
        st.notes.iter().any(|n| n.contains("running unprivileged")),
        "{:?}",
        st.notes
    );
    assert!(st.cpus.iter().all(|c| c.mechanism == Mechanism::Spin));
    let a = c.request_in("t-unpriv", &[cpu], 0, 200 * MS).unwrap();
    assert_eq!(a.mechanism, "spin");
    // Throughout the window and after it: nothing changed, nothing journalled.
    let changed = poll_until(a.end_ns + 100 * MS, || read(&path) != "125");
    assert!(!changed, "PM QoS changed by an unprivileged daemon");
    assert!(!dir.join(Journal::FILE).exists());
    let st = c.status().unwrap();
    let w = st.recent.iter().find(|w| w.id == a.id).unwrap();
    assert_eq!(w.per_cpu[&cpu].map(|r| r.mechanism), Some(Mechanism::Spin));
    ch.signal("TERM");
    let exit = ch.wait();
    assert!(exit.success(), "{exit:?}; log:\n{}", ch.log());
    assert!(ch.log().contains("running unprivileged"), "{}", ch.log());
    assert_eq!(read(&path), "125");
}
