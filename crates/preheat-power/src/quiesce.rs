//! Slack-enabled quiescence (Zhu et al. §3): while a latency-critical request waits on a slow
//! synchronous I/O, freeze registered background work so that every CPU can idle at the same
//! time; thaw it when the critical work resumes, so the background work runs piggybacked on the
//! CPUs the critical work keeps awake anyway.
//!
//! [`Freezer`] abstracts the two cgroup freezers:
//!
//! * **v2** (`cgroup.freeze` = `1`/`0`, settled when `cgroup.events` says `frozen 1`/`frozen 0`),
//!   chosen when a cgroup2 hierarchy is mounted and supports it (an existing child cgroup has
//!   `cgroup.freeze`, or there is no child and the kernel is ≥ 5.2). It is a core cgroup file,
//!   so it exists in every *non-root* v2 cgroup even when no controller is enabled.
//! * **v1** (`freezer.state` = `FROZEN`/`THAWED`, settled when it reads back the same), the
//!   `freezer` controller hierarchy. It freezes per thread group.
//!
//! Freezing is asynchronous in both: the write starts it and the state settles later (~130 µs
//! for one task here). Waiting for it **sleeps** between polls (20 µs doubling to 1 ms, bounded
//! by [`SETTLE_TIMEOUT`]) and never spins: a spinning controller sharing a CPU with the task
//! being frozen starves it (measured-here notes).
//!
//! [`BackgroundGroup`] is the cgroup `preheat-bg-<pid>` (`preheat-bg-<pid>-<n>` for further
//! groups of one process) in the chosen hierarchy, holding the registered background processes.
//!
//! **Machine state.** Every group is thawed, emptied (members go back to the cgroup they came
//! from, else to the hierarchy root) and removed when the [`BackgroundGroup`] is dropped or
//! closed, including on error paths and panics (unwinding); `preheat power` turns SIGINT/SIGTERM
//! into an orderly return so the drops run. [`cleanup_stale`] (called by
//! [`BackgroundGroup::create`] and at start-up of `preheat power`) thaws and removes groups whose
//! owner process is gone (pid not alive, or alive but started after the group was created —
//! pid reuse); their members are moved to the hierarchy root, never killed.
//!
//! Needs root (creating cgroups and moving processes); without root or without a freezer,
//! [`Freezer::detect`] returns [`QuiesceError::Unavailable`] with the reason.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// Name prefix of every cgroup this module creates.
pub const GROUP_PREFIX: &str = "preheat-bg-";

/// Upper bound for a freeze or thaw to settle, and for removing a group.
pub const SETTLE_TIMEOUT: Duration = Duration::from_secs(2);

const POLL_FIRST: Duration = Duration::from_micros(20);
const POLL_MAX: Duration = Duration::from_millis(1);

#[derive(Debug, thiserror::Error)]
pub enum QuiesceError {
    #[error("quiescence unavailable: {0}")]
    Unavailable(String),
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path}: freezer did not reach {want:?} within {waited:?} (last state {last:?})")]
    Timeout {
        path: PathBuf,
        want: FreezeState,
        last: FreezeState,
        waited: Duration,
    },
    #[error("{0}")]
    Refused(String),
}

type Result<T> = std::result::Result<T, QuiesceError>;

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> QuiesceError + 'a {
    move |source| QuiesceError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

/// Write `value` to an existing control file (never creates files).
fn write_ctl(path: &Path, value: &str) -> Result<()> {
    use std::io::Write;
    let mut f = fs::OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(io_err("opening", path))?;
    f.write_all(value.as_bytes())
        .map_err(io_err("writing", path))
}

fn read_ctl(path: &Path) -> Result<String> {
    fs::read_to_string(path).map_err(io_err("reading", path))
}

/// Which cgroup freezer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// cgroup v2 `cgroup.freeze`.
    V2,
    /// cgroup v1 `freezer.state`.
    V1,
}

/// Which freezer to use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Preference {
    /// v2 if it supports `cgroup.freeze`, else v1.
    #[default]
    Auto,
    V1,
    V2,
}

/// The state of a freezer cgroup.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum FreezeState {
    Thawed,
    /// Freeze requested, not every task frozen yet.
    Freezing,
    Frozen,
    /// v2 only: thaw requested, `cgroup.events` still says frozen.
    Thawing,
}

/// cgroup hierarchies found in `/proc/self/mountinfo`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CgroupMounts {
    /// A writable cgroup2 mount.
    pub v2: Option<PathBuf>,
    /// A writable cgroup v1 mount with the `freezer` controller.
    pub v1_freezer: Option<PathBuf>,
}

fn unescape_mount_path(s: &str) -> String {
    // mountinfo escapes space, tab, newline and backslash as \ooo.
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 4 <= b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') as u32 * 64
                + (b[i + 2] - b'0') as u32 * 8
                + (b[i + 3] - b'0') as u32;
            if let Ok(v) = u8::try_from(v) {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Find the cgroup2 and v1-freezer mounts in the text of `/proc/self/mountinfo`. Read-only
/// mounts are ignored.
pub fn parse_mountinfo(text: &str) -> CgroupMounts {
    let mut m = CgroupMounts::default();
    for line in text.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let lf: Vec<&str> = left.split_whitespace().collect();
        let rf: Vec<&str> = right.split_whitespace().collect();
        if lf.len() < 6 || rf.len() < 3 {
            continue;
        }
        let mount_point = PathBuf::from(unescape_mount_path(lf[4]));
        let read_only = lf[5].split(',').any(|o| o == "ro") || rf[2].split(',').any(|o| o == "ro");
        if read_only {
            continue;
        }
        match rf[0] {
            "cgroup2" if m.v2.is_none() => m.v2 = Some(mount_point),
            "cgroup" if m.v1_freezer.is_none() && rf[2].split(',').any(|o| o == "freezer") => {
                m.v1_freezer = Some(mount_point)
            }
            _ => {}
        }
    }
    m
}

/// The cgroup mounts of this machine (empty if `/proc/self/mountinfo` cannot be read).
pub fn cgroup_mounts() -> CgroupMounts {
    fs::read_to_string("/proc/self/mountinfo")
        .map(|t| parse_mountinfo(&t))
        .unwrap_or_default()
}

pub use preheat_engine::host::effective_uid;

fn kernel_at_least(major: u32, minor: u32) -> bool {
    let Ok(rel) = fs::read_to_string("/proc/sys/kernel/osrelease") else {
        return false;
    };
    let mut it = rel
        .trim()
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|p| p.parse::<u32>().ok());
    match (it.next(), it.next()) {
        (Some(a), Some(b)) => (a, b) >= (major, minor),
        _ => false,
    }
}

/// Does the cgroup2 hierarchy at `root` support `cgroup.freeze`? Decided by an existing child
/// cgroup if there is one, else by the kernel version (the file appeared in 5.2).
pub fn v2_supports_freeze(root: &Path) -> bool {
    if let Ok(rd) = fs::read_dir(root) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() && p.join("cgroup.procs").exists() {
                return p.join("cgroup.freeze").exists();
            }
        }
    }
    kernel_at_least(5, 2)
}

/// A cgroup freezer: one backend and the root of its hierarchy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Freezer {
    backend: Backend,
    root: PathBuf,
}

impl Freezer {
    /// Use `backend` on the hierarchy mounted at `root`, without checks (tests, explicit setups).
    pub fn new(backend: Backend, root: impl Into<PathBuf>) -> Freezer {
        Freezer {
            backend,
            root: root.into(),
        }
    }

    /// Pick a freezer on this machine. Requires root; errors are
    /// [`QuiesceError::Unavailable`] with a reason a user can act on.
    pub fn detect(pref: Preference) -> Result<Freezer> {
        match effective_uid() {
            Some(0) => {}
            Some(uid) => {
                return Err(QuiesceError::Unavailable(format!(
                    "not root (effective uid {uid}): creating cgroups and moving processes into \
                     them needs root"
                )))
            }
            None => {
                return Err(QuiesceError::Unavailable(
                    "cannot read the effective uid from /proc/self/status".into(),
                ))
            }
        }
        Freezer::detect_from(pref, &cgroup_mounts(), v2_supports_freeze)
    }

    /// The selection logic of [`Freezer::detect`] on given mounts (no uid check).
    pub fn detect_from(
        pref: Preference,
        mounts: &CgroupMounts,
        v2_freeze: impl Fn(&Path) -> bool,
    ) -> Result<Freezer> {
        let v2 = mounts.v2.as_ref().filter(|r| v2_freeze(r));
        let v1 = mounts.v1_freezer.as_ref();
        let pick = match pref {
            Preference::Auto => v2
                .map(|r| Freezer::new(Backend::V2, r))
                .or_else(|| v1.map(|r| Freezer::new(Backend::V1, r))),
            Preference::V2 => v2.map(|r| Freezer::new(Backend::V2, r)),
            Preference::V1 => v1.map(|r| Freezer::new(Backend::V1, r)),
        };
        pick.ok_or_else(|| {
            let v2_desc = match &mounts.v2 {
                None => "no writable cgroup2 mount".to_string(),
                Some(r) if v2.is_none() => {
                    format!("cgroup2 at {} lacks cgroup.freeze", r.display())
                }
                Some(r) => format!("cgroup2 with cgroup.freeze at {}", r.display()),
            };
            let v1_desc = match v1 {
                None => "no writable cgroup v1 freezer mount".to_string(),
                Some(r) => format!("v1 freezer at {}", r.display()),
            };
            QuiesceError::Unavailable(format!(
                "no usable cgroup freezer for {pref:?} ({v2_desc}; {v1_desc})"
            ))
        })
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// The root of the hierarchy groups are created in.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn control_file(&self) -> &'static str {
        match self.backend {
            Backend::V2 => "cgroup.freeze",
            Backend::V1 => "freezer.state",
        }
    }

    /// Create the cgroup `name` directly under the hierarchy root and check that it has the
    /// freezer control file (removing it again if not).
    pub fn create_group(&self, name: &str) -> Result<PathBuf> {
        if name.is_empty() || name.contains('/') || name == "." || name == ".." {
            return Err(QuiesceError::Refused(format!("bad cgroup name {name:?}")));
        }
        let dir = self.root.join(name);
        fs::create_dir(&dir).map_err(io_err("creating cgroup", &dir))?;
        if !dir.join(self.control_file()).exists() {
            let _ = fs::remove_dir(&dir);
            return Err(QuiesceError::Unavailable(format!(
                "{} has no {} ({:?} freezer not supported here)",
                dir.display(),
                self.control_file(),
                self.backend
            )));
        }
        Ok(dir)
    }

    /// Start freezing `dir` (one write; does not wait).
    pub fn request_freeze(&self, dir: &Path) -> Result<()> {
        let v = match self.backend {
            Backend::V2 => "1",
            Backend::V1 => "FROZEN",
        };
        write_ctl(&dir.join(self.control_file()), v)
    }

    /// Start thawing `dir` (one write; does not wait).
    pub fn request_thaw(&self, dir: &Path) -> Result<()> {
        let v = match self.backend {
            Backend::V2 => "0",
            Backend::V1 => "THAWED",
        };
        write_ctl(&dir.join(self.control_file()), v)
    }

    /// The current state of `dir` (on v1, reading also advances FREEZING → FROZEN).
    pub fn state(&self, dir: &Path) -> Result<FreezeState> {
        match self.backend {
            Backend::V1 => {
                let p = dir.join("freezer.state");
                let s = read_ctl(&p)?;
                match s.trim() {
                    "THAWED" => Ok(FreezeState::Thawed),
                    "FREEZING" => Ok(FreezeState::Freezing),
                    "FROZEN" => Ok(FreezeState::Frozen),
                    other => Err(QuiesceError::Io {
                        op: "parsing",
                        path: p,
                        source: io::Error::new(
                            io::ErrorKind::InvalidData,
                            format!("unknown freezer state {other:?}"),
                        ),
                    }),
                }
            }
            Backend::V2 => {
                let requested = read_ctl(&dir.join("cgroup.freeze"))?.trim() == "1";
                let events = read_ctl(&dir.join("cgroup.events"))?;
                let frozen = events.lines().any(|l| l.trim() == "frozen 1");
                Ok(match (requested, frozen) {
                    (false, false) => FreezeState::Thawed,
                    (true, false) => FreezeState::Freezing,
                    (true, true) => FreezeState::Frozen,
                    (false, true) => FreezeState::Thawing,
                })
            }
        }
    }

    /// Sleep-poll until `dir` is in state `want` (never spins); returns the time waited.
    pub fn wait_for(&self, dir: &Path, want: FreezeState, timeout: Duration) -> Result<Duration> {
        let t0 = Instant::now();
        let mut pause = POLL_FIRST;
        loop {
            let s = self.state(dir)?;
            if s == want {
                return Ok(t0.elapsed());
            }
            if t0.elapsed() >= timeout {
                return Err(QuiesceError::Timeout {
                    path: dir.to_path_buf(),
                    want,
                    last: s,
                    waited: t0.elapsed(),
                });
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(POLL_MAX);
        }
    }

    /// Freeze `dir` and wait (sleeping) until every task in it is frozen. On timeout the group
    /// is thawed again before the error is returned.
    pub fn freeze(&self, dir: &Path, timeout: Duration) -> Result<Duration> {
        let t0 = Instant::now();
        self.request_freeze(dir)?;
        match self.wait_for(dir, FreezeState::Frozen, timeout) {
            Ok(_) => Ok(t0.elapsed()),
            Err(e) => {
                let _ = self.thaw(dir, timeout);
                Err(e)
            }
        }
    }

    /// Thaw `dir` and wait (sleeping) until it reads back thawed.
    pub fn thaw(&self, dir: &Path, timeout: Duration) -> Result<Duration> {
        let t0 = Instant::now();
        self.request_thaw(dir)?;
        self.wait_for(dir, FreezeState::Thawed, timeout)?;
        Ok(t0.elapsed())
    }

    /// The processes (thread-group ids) in `dir`.
    pub fn procs(&self, dir: &Path) -> Result<Vec<u32>> {
        let p = dir.join("cgroup.procs");
        Ok(read_ctl(&p)?
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect())
    }

    /// Move process `pid` (all its threads) into `dir`: `cgroup.procs`, falling back to writing
    /// each thread to `tasks` on v1.
    pub fn move_pid(&self, dir: &Path, pid: u32) -> Result<()> {
        let procs = dir.join("cgroup.procs");
        match write_ctl(&procs, &pid.to_string()) {
            Ok(()) => Ok(()),
            Err(e) if self.backend == Backend::V1 && dir.join("tasks").exists() => {
                let tasks = dir.join("tasks");
                let tids = fs::read_dir(format!("/proc/{pid}/task")).map_err(|_| e)?;
                for t in tids.flatten() {
                    if let Some(tid) = t.file_name().to_str() {
                        write_ctl(&tasks, tid)?;
                    }
                }
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// The cgroup of `pid` in this hierarchy, from `/proc/PID/cgroup` (None if unknown).
    pub fn group_of(&self, pid: u32) -> Option<PathBuf> {
        let text = fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
        for line in text.lines() {
            let mut f = line.splitn(3, ':');
            let (id, ctrls, path) = (f.next()?, f.next()?, f.next()?);
            let hit = match self.backend {
                Backend::V2 => id == "0" && ctrls.is_empty(),
                Backend::V1 => ctrls.split(',').any(|c| c == "freezer"),
            };
            if hit {
                return Some(self.root.join(path.trim_start_matches('/')));
            }
        }
        None
    }

    /// Thaw `dir`, move every process still in it to the hierarchy root, and remove it
    /// (retrying while the kernel still reports it busy, up to `timeout`).
    pub fn remove_group(&self, dir: &Path, timeout: Duration) -> Result<()> {
        if !dir.exists() {
            return Ok(());
        }
        if self.state(dir)? != FreezeState::Thawed {
            self.thaw(dir, timeout)?;
        }
        let t0 = Instant::now();
        let mut pause = POLL_FIRST;
        loop {
            for pid in self.procs(dir)? {
                // A process that exited in the meantime cannot be moved; that is fine.
                let _ = self.move_pid(&self.root, pid);
            }
            match fs::remove_dir(dir) {
                Ok(()) => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
                Err(e) if t0.elapsed() >= timeout => {
                    return Err(QuiesceError::Io {
                        op: "removing cgroup",
                        path: dir.to_path_buf(),
                        source: e,
                    })
                }
                Err(_) => {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(POLL_MAX);
                }
            }
        }
    }

    /// The `preheat-bg-*` groups in this hierarchy with their owner pids.
    pub fn list_groups(&self) -> Vec<(PathBuf, u32)> {
        let mut out = Vec::new();
        if let Ok(rd) = fs::read_dir(&self.root) {
            for e in rd.flatten() {
                let name = e.file_name();
                let Some(name) = name.to_str() else { continue };
                if let Some(pid) = owner_pid(name) {
                    if e.path().is_dir() {
                        out.push((e.path(), pid));
                    }
                }
            }
        }
        out.sort();
        out
    }

    /// Thaw and remove every `preheat-bg-*` group in this hierarchy whose owner is gone.
    /// Returns the groups removed; failures are returned per group, not fatal.
    pub fn cleanup_stale(&self) -> StaleCleanup {
        let mut report = StaleCleanup::default();
        for (dir, pid) in self.list_groups() {
            if owner_alive(pid, &dir) {
                continue;
            }
            match self.remove_group(&dir, SETTLE_TIMEOUT) {
                Ok(()) => report.removed.push(dir),
                Err(e) => report.errors.push(e.to_string()),
            }
        }
        report
    }
}

/// Result of a stale-group cleanup.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct StaleCleanup {
    pub removed: Vec<PathBuf>,
    pub errors: Vec<String>,
}

/// The owner pid of a group name `preheat-bg-<pid>` or `preheat-bg-<pid>-<n>`.
pub fn owner_pid(name: &str) -> Option<u32> {
    let rest = name.strip_prefix(GROUP_PREFIX)?;
    let (pid, tail) = match rest.split_once('-') {
        Some((p, t)) => (p, Some(t)),
        None => (rest, None),
    };
    if pid.is_empty() || !pid.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if let Some(t) = tail {
        if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
    }
    pid.parse().ok()
}

/// Start time of `pid` as seconds since the Unix epoch (btime + starttime / USER_HZ; USER_HZ
/// is 100 on every Linux architecture we run on).
fn process_start_unix(pid: u32) -> Option<f64> {
    let start_ticks = preheat_engine::procstat::read_pid_stat(pid)?.starttime as f64;
    let btime = preheat_engine::procstat::read(Path::new("/proc/stat"))
        .ok()?
        .btime? as f64;
    Some(btime + start_ticks / preheat_engine::procstat::USER_HZ as f64)
}

/// Is the owner of the group at `dir` still alive? A pid that does not exist or is a zombie is
/// dead; a pid whose process started clearly after the group was created is a reused pid, hence
/// dead too.
/// When in doubt (unreadable times), alive.
pub fn owner_alive(pid: u32, dir: &Path) -> bool {
    let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // A zombie (e.g. SIGKILLed, reparented to an init that does not reap) is dead.
    let state = preheat_engine::procstat::parse_pid_stat(&stat).map(|s| s.state);
    if matches!(state, Some('Z' | 'X')) {
        return false;
    }
    let created = fs::metadata(dir)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map(|d| d.as_secs_f64());
    match (created, process_start_unix(pid)) {
        (Some(created), Some(started)) => started <= created + 2.0,
        _ => true,
    }
}

/// Clean up stale groups in every freezer hierarchy of this machine (both v2 and v1: an earlier
/// run may have used either). Without root, nothing is done.
pub fn cleanup_stale() -> StaleCleanup {
    let mut all = StaleCleanup::default();
    if effective_uid() != Some(0) {
        return all;
    }
    let m = cgroup_mounts();
    let freezers = [
        m.v2.map(|r| Freezer::new(Backend::V2, r)),
        m.v1_freezer.map(|r| Freezer::new(Backend::V1, r)),
    ];
    for f in freezers.into_iter().flatten() {
        let r = f.cleanup_stale();
        all.removed.extend(r.removed);
        all.errors.extend(r.errors);
    }
    all
}

static NEXT_GROUP: AtomicU32 = AtomicU32::new(0);

#[derive(Clone, Debug)]
struct Member {
    pid: u32,
    origin: Option<PathBuf>,
}

/// The cgroup holding registered background work. See the module documentation.
#[derive(Debug)]
pub struct BackgroundGroup {
    freezer: Freezer,
    dir: PathBuf,
    members: Vec<Member>,
    closed: bool,
}

impl BackgroundGroup {
    /// Clean up stale groups of dead owners in `freezer`'s hierarchy, then create
    /// `preheat-bg-<pid>` (or `preheat-bg-<pid>-<n>` for the n-th further group of this process).
    pub fn create(freezer: Freezer) -> Result<BackgroundGroup> {
        let stale = freezer.cleanup_stale();
        for e in &stale.errors {
            eprintln!("preheat-power: stale cgroup cleanup: {e}");
        }
        let n = NEXT_GROUP.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        let name = if n == 0 {
            format!("{GROUP_PREFIX}{pid}")
        } else {
            format!("{GROUP_PREFIX}{pid}-{n}")
        };
        let dir = freezer.create_group(&name)?;
        Ok(BackgroundGroup {
            freezer,
            dir,
            members: Vec::new(),
            closed: false,
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn freezer(&self) -> &Freezer {
        &self.freezer
    }

    pub fn backend(&self) -> Backend {
        self.freezer.backend
    }

    /// The registered processes.
    pub fn members(&self) -> Vec<u32> {
        self.members.iter().map(|m| m.pid).collect()
    }

    /// Register background process `pid`: move it (all threads) into the group. Refuses this
    /// process itself (freezing the controller would deadlock it).
    pub fn add(&mut self, pid: u32) -> Result<()> {
        if pid == std::process::id() {
            return Err(QuiesceError::Refused(
                "refusing to put the controlling process itself into the background group".into(),
            ));
        }
        if pid <= 1 {
            return Err(QuiesceError::Refused(format!(
                "refusing to freeze pid {pid}"
            )));
        }
        let origin = self.freezer.group_of(pid);
        self.freezer.move_pid(&self.dir, pid)?;
        self.members.push(Member { pid, origin });
        Ok(())
    }

    /// Freeze the group and wait (sleeping) until it is frozen; returns the time taken. On
    /// error the group is thawed again.
    pub fn hold(&mut self) -> Result<Duration> {
        self.freezer.freeze(&self.dir, SETTLE_TIMEOUT)
    }

    /// Start freezing the group without waiting (one write). Use [`BackgroundGroup::state`] to
    /// see whether it has settled, [`BackgroundGroup::release`] to undo.
    pub fn begin_hold(&mut self) -> Result<()> {
        let r = self.freezer.request_freeze(&self.dir);
        if r.is_err() {
            let _ = self.freezer.request_thaw(&self.dir);
        }
        r
    }

    pub fn state(&self) -> Result<FreezeState> {
        self.freezer.state(&self.dir)
    }

    /// Start thawing the group without waiting (one write). The tasks become runnable at once;
    /// only the v2 `frozen` flag may lag.
    pub fn begin_release(&mut self) -> Result<()> {
        self.freezer.request_thaw(&self.dir)
    }

    /// Thaw the group and wait (sleeping) until it reads back thawed; returns the time taken.
    pub fn release(&mut self) -> Result<Duration> {
        self.freezer.thaw(&self.dir, SETTLE_TIMEOUT)
    }

    /// Thaw, move the members back where they came from, and remove the group, reporting
    /// errors (drop does the same and prints them).
    pub fn close(mut self) -> Result<()> {
        self.cleanup()
    }

    fn cleanup(&mut self) -> Result<()> {
        if self.closed {
            return Ok(());
        }
        self.closed = true;
        if !self.dir.exists() {
            return Ok(());
        }
        // Always thaw, whatever we think the state is.
        let thawed = self.freezer.thaw(&self.dir, SETTLE_TIMEOUT);
        for m in &self.members {
            let back = m
                .origin
                .as_ref()
                .filter(|o| o.as_path() != self.dir && o.is_dir())
                .cloned()
                .unwrap_or_else(|| self.freezer.root.clone());
            let _ = self.freezer.move_pid(&back, m.pid);
        }
        let removed = self.freezer.remove_group(&self.dir, SETTLE_TIMEOUT);
        thawed.and(removed)
    }
}

impl Drop for BackgroundGroup {
    fn drop(&mut self) {
        if let Err(e) = self.cleanup() {
            eprintln!(
                "preheat-power: cleaning up cgroup {}: {e}",
                self.dir.display()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    #[test]
    fn mountinfo_finds_both_hierarchies() {
        let m = parse_mountinfo(MOUNTINFO);
        assert_eq!(m.v2.as_deref(), Some(Path::new("/sys/fs/cgroup/unified")));
        assert_eq!(
            m.v1_freezer.as_deref(),
            Some(Path::new("/sys/fs/cgroup/freezer"))
        );
    }

    #[test]
    fn mountinfo_skips_read_only_and_unescapes() {
        let text = "1 0 0:1 / /sys/fs/cgroup ro,nosuid - cgroup2 cgroup2 rw\n\
                    2 0 0:2 / /mnt/my\\040freezer rw - cgroup cgroup rw,freezer,cpu\n";
        let m = parse_mountinfo(text);
        assert_eq!(m.v2, None);
        assert_eq!(m.v1_freezer.as_deref(), Some(Path::new("/mnt/my freezer")));
    }

    #[test]
    fn detection_prefers_v2_with_freeze_and_falls_back_to_v1() {
        let m = parse_mountinfo(MOUNTINFO);
        let f = Freezer::detect_from(Preference::Auto, &m, |_| true).unwrap();
        assert_eq!(f.backend(), Backend::V2);
        let f = Freezer::detect_from(Preference::Auto, &m, |_| false).unwrap();
        assert_eq!(f.backend(), Backend::V1);
        assert_eq!(f.root(), Path::new("/sys/fs/cgroup/freezer"));
        let f = Freezer::detect_from(Preference::V1, &m, |_| true).unwrap();
        assert_eq!(f.backend(), Backend::V1);
        let e = Freezer::detect_from(Preference::V2, &m, |_| false).unwrap_err();
        assert!(matches!(e, QuiesceError::Unavailable(_)), "{e}");
        assert!(e.to_string().contains("lacks cgroup.freeze"), "{e}");
        let e =
            Freezer::detect_from(Preference::Auto, &CgroupMounts::default(), |_| true).unwrap_err();
        assert!(e.to_string().contains("no usable cgroup freezer"), "{e}");
    }

    #[test]
    fn owner_pids_of_group_names() {
        assert_eq!(owner_pid("preheat-bg-1234"), Some(1234));
        assert_eq!(owner_pid("preheat-bg-1234-2"), Some(1234));
        assert_eq!(owner_pid("preheat-bg-"), None);
        assert_eq!(owner_pid("preheat-bg-12x"), None);
        assert_eq!(owner_pid("preheat-bg-12-"), None);
        assert_eq!(owner_pid("preheat-bg-12-a"), None);
        assert_eq!(owner_pid("other-1234"), None);
    }

    #[test]
    fn a_missing_pid_is_a_dead_owner() {
        let dir = std::env::temp_dir();
        // pid_max is at most 2^22 on Linux.
        assert!(!owner_alive(4_194_304 + 17, &dir));
        // This process started before a directory created now: its owner is alive.
        let fresh = tempfile::tempdir().unwrap();
        assert!(owner_alive(std::process::id(), fresh.path()));
    }

    #[test]
    fn group_names_are_checked() {
        let f = Freezer::new(Backend::V1, std::env::temp_dir());
        for bad in ["", "a/b", ".", ".."] {
            assert!(matches!(f.create_group(bad), Err(QuiesceError::Refused(_))));
        }
    }

    #[test]
    fn groups_without_the_control_file_are_refused_and_removed() {
        let tmp = tempfile::tempdir().unwrap();
        let f = Freezer::new(Backend::V2, tmp.path());
        let e = f.create_group("preheat-bg-1").unwrap_err();
        assert!(matches!(e, QuiesceError::Unavailable(_)), "{e}");
        assert!(!tmp.path().join("preheat-bg-1").exists());
    }
}
