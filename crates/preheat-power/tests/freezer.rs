//! Real cgroup freezer tests. They need root and a freezer hierarchy; otherwise they report a
//! skip (`preheat_testsupport::skip`) and pass. Serialised with a mutex: they share the machine's hierarchies.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use preheat_power::hogs::Hogs;
use preheat_power::quiesce::{
    self, cgroup_mounts, effective_uid, v2_supports_freeze, Backend, BackgroundGroup, FreezeState,
    Freezer, Preference, GROUP_PREFIX,
};

static SERIAL: Mutex<()> = Mutex::new(());

fn lock() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// The freezer of `backend` on this machine, or None after reporting the skip.
fn freezer(backend: Backend, test: &str) -> Option<Freezer> {
    if effective_uid() != Some(0) {
        preheat_testsupport::skip!("root", "{test}: not root");
        return None;
    }
    let m = cgroup_mounts();
    match backend {
        Backend::V1 => match m.v1_freezer {
            Some(r) => Some(Freezer::new(Backend::V1, r)),
            None => {
                preheat_testsupport::skip!(
                    "cgroup-v1-freezer",
                    "{test}: no cgroup v1 freezer mounted"
                );
                None
            }
        },
        Backend::V2 => match m.v2 {
            Some(r) if v2_supports_freeze(&r) => Some(Freezer::new(Backend::V2, r)),
            _ => {
                preheat_testsupport::skip!(
                    "cgroup2-freezer",
                    "{test}: no cgroup2 hierarchy with cgroup.freeze"
                );
                None
            }
        },
    }
}

struct Kid(Child);
impl Drop for Kid {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn sleeper() -> Kid {
    Kid(Command::new("sleep")
        .arg("60")
        .stdin(Stdio::null())
        .spawn()
        .expect("spawn sleep"))
}

/// Process state letter from /proc/PID/stat.
fn proc_state(pid: u32) -> char {
    preheat_engine::procstat::read_pid_stat(pid)
        .expect("/proc/PID/stat")
        .state
}

/// A thawed sleeper may briefly run ('R') before it sleeps again; a v1-frozen task shows 'D'.
fn assert_runnable(pid: u32, what: &str) {
    let t0 = Instant::now();
    loop {
        let st = proc_state(pid);
        if st == 'S' || st == 'R' {
            return;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(2),
            "{what}: /proc/{pid} state {st}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn cgroup_line(pid: u32, backend: Backend) -> String {
    let s = fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    s.lines()
        .find(|l| match backend {
            Backend::V2 => l.starts_with("0::"),
            Backend::V1 => l
                .split(':')
                .nth(1)
                .unwrap()
                .split(',')
                .any(|c| c == "freezer"),
        })
        .unwrap()
        .to_string()
}

fn our_groups(f: &Freezer) -> Vec<PathBuf> {
    let me = std::process::id();
    f.list_groups()
        .into_iter()
        .filter(|(_, p)| *p == me)
        .map(|(d, _)| d)
        .collect()
}

fn freeze_thaw_remove(backend: Backend) {
    let _g = lock();
    let test = format!("freeze_thaw_remove {backend:?}");
    let Some(f) = freezer(backend, &test) else {
        return;
    };
    let kid = sleeper();
    let pid = kid.0.id();
    let origin = cgroup_line(pid, backend);
    let mut g = BackgroundGroup::create(f.clone()).unwrap();
    let dir = g.dir().to_path_buf();
    assert!(dir.is_dir());
    assert!(dir
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .starts_with(&format!("{GROUP_PREFIX}{}", std::process::id())));
    g.add(pid).unwrap();
    assert_eq!(f.procs(&dir).unwrap(), vec![pid]);
    assert_eq!(g.state().unwrap(), FreezeState::Thawed);

    let took = g.hold().unwrap();
    assert_eq!(g.state().unwrap(), FreezeState::Frozen);
    let frozen_state = proc_state(pid);
    println!("{test}: froze in {took:?}; /proc/{pid}/stat state while frozen: {frozen_state}");
    match backend {
        Backend::V1 => {
            assert_eq!(
                fs::read_to_string(dir.join("freezer.state"))
                    .unwrap()
                    .trim(),
                "FROZEN"
            );
            // v1 frozen tasks sit in the refrigerator (TASK_FROZEN, shown as D).
            assert_ne!(frozen_state, 'R');
        }
        Backend::V2 => {
            assert_eq!(
                fs::read_to_string(dir.join("cgroup.freeze"))
                    .unwrap()
                    .trim(),
                "1"
            );
            assert!(fs::read_to_string(dir.join("cgroup.events"))
                .unwrap()
                .lines()
                .any(|l| l == "frozen 1"));
        }
    }

    g.release().unwrap();
    assert_eq!(g.state().unwrap(), FreezeState::Thawed);
    assert_runnable(pid, &test);
    g.close().unwrap();
    assert!(!dir.exists(), "{} left behind", dir.display());
    assert_eq!(cgroup_line(pid, backend), origin, "child not moved back");
    assert!(our_groups(&f).is_empty());
}

#[test]
fn v1_freezer_freezes_thaws_and_removes() {
    freeze_thaw_remove(Backend::V1);
}

#[test]
fn v2_freezer_freezes_thaws_and_removes() {
    freeze_thaw_remove(Backend::V2);
}

#[test]
fn auto_detection_picks_a_freezer_or_explains() {
    let _g = lock();
    match Freezer::detect(Preference::Auto) {
        Ok(f) => println!(
            "detected {:?} freezer at {}",
            f.backend(),
            f.root().display()
        ),
        Err(e) => {
            assert!(e.to_string().starts_with("quiescence unavailable: "), "{e}");
            preheat_testsupport::skip!("cgroup-freezer", "{e}");
        }
    }
}

fn cpu_ns(pid: u32) -> u64 {
    fs::read_to_string(format!("/proc/{pid}/schedstat"))
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
fn a_frozen_hog_gets_no_cpu_and_runs_again_after_thaw() {
    for backend in [Backend::V1, Backend::V2] {
        let _g = lock();
        let Some(f) = freezer(backend, "frozen hog") else {
            continue;
        };
        let mut hogs = Hogs::default();
        let mut g = BackgroundGroup::create(f).unwrap();
        let pid = hogs.spawn(None).unwrap();
        g.add(pid).unwrap();
        g.hold().unwrap();
        let a = cpu_ns(pid);
        std::thread::sleep(Duration::from_millis(100));
        let b = cpu_ns(pid);
        assert_eq!(a, b, "{backend:?}: frozen hog accrued CPU time");
        g.release().unwrap();
        let t0 = Instant::now();
        while cpu_ns(pid) == b && t0.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(
            cpu_ns(pid) > b,
            "{backend:?}: hog did not run again after thaw"
        );
        drop(g);
        drop(hogs);
        assert!(!Path::new(&format!("/proc/{pid}")).exists() || proc_state(pid) == 'Z');
    }
}

#[test]
fn drop_thaws_and_removes_a_frozen_group() {
    for backend in [Backend::V1, Backend::V2] {
        let _g = lock();
        let Some(f) = freezer(backend, "drop cleanup") else {
            continue;
        };
        let kid = sleeper();
        let pid = kid.0.id();
        let origin = cgroup_line(pid, backend);
        let dir;
        {
            let mut g = BackgroundGroup::create(f.clone()).unwrap();
            dir = g.dir().to_path_buf();
            g.add(pid).unwrap();
            g.begin_hold().unwrap();
            f.wait_for(&dir, FreezeState::Frozen, Duration::from_secs(2))
                .unwrap();
            // Dropped while frozen.
        }
        assert!(!dir.exists(), "{backend:?}: {} left behind", dir.display());
        assert_eq!(cgroup_line(pid, backend), origin);
        assert_runnable(pid, &format!("{backend:?}: child still frozen"));
    }
}

#[test]
fn refuses_to_freeze_itself() {
    let _g = lock();
    let Some(f) =
        freezer(Backend::V1, "refuse self").or_else(|| freezer(Backend::V2, "refuse self"))
    else {
        return;
    };
    let mut g = BackgroundGroup::create(f).unwrap();
    assert!(g.add(std::process::id()).is_err());
    assert!(g.add(1).is_err());
}

/// A pid that is certainly dead: a child we spawned and reaped.
fn dead_pid() -> u32 {
    let mut c = Command::new("true").spawn().unwrap();
    let pid = c.id();
    c.wait().unwrap();
    pid
}

#[test]
fn stale_groups_of_dead_owners_are_thawed_and_removed() {
    for backend in [Backend::V1, Backend::V2] {
        let _g = lock();
        let Some(f) = freezer(backend, "stale cleanup") else {
            continue;
        };
        let dead = dead_pid();
        let kid = sleeper();
        let pid = kid.0.id();
        // A frozen group of a dead owner, with a member.
        let stale = f.create_group(&format!("{GROUP_PREFIX}{dead}-7")).unwrap();
        f.move_pid(&stale, pid).unwrap();
        f.freeze(&stale, Duration::from_secs(2)).unwrap();
        // Our own (live) group must survive.
        let live = BackgroundGroup::create(f.clone()).unwrap();
        // create() already cleaned up stale groups in this hierarchy.
        assert!(
            !stale.exists(),
            "{backend:?}: stale group survived create()"
        );
        assert!(live.dir().exists());

        // Once more through the machine-wide entry point.
        let stale2 = f.create_group(&format!("{GROUP_PREFIX}{dead}")).unwrap();
        f.move_pid(&stale2, pid).unwrap();
        f.freeze(&stale2, Duration::from_secs(2)).unwrap();
        let report = quiesce::cleanup_stale();
        assert!(report.errors.is_empty(), "{:?}", report.errors);
        assert!(report.removed.contains(&stale2), "{report:?}");
        assert!(!stale2.exists());
        assert!(live.dir().exists(), "live group removed by cleanup");
        assert_runnable(pid, &format!("{backend:?}: member left frozen"));
        let line = cgroup_line(pid, backend);
        assert!(
            line.ends_with(":/"),
            "{backend:?}: member not at the root: {line}"
        );
        live.close().unwrap();
    }
}
