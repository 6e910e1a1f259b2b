//! How a CPU is kept out of deep idle during a window (paper §2: "In the wakeup duration, the
//! CPU idle management is prevented from entering any of the hardware sleep states").
//!
//! Three mechanisms, chosen per CPU at start-up ([`Machine::open`]), each with the reason when
//! it is unavailable:
//!
//! * [`Mechanism::PmQos`] — per-CPU PM QoS: write `n/a` (the strict value on this kernel; `0`
//!   means *no* constraint) to `/sys/devices/system/cpu/cpuN/power/pm_qos_resume_latency_us` and
//!   write the original value back at the end. Before the file is first changed its original
//!   value goes to a journal (`<run dir>/wake-journal.json`, [`Journal`]) so whoever starts next
//!   restores it if this process dies. Only one process on the machine drives PM QoS at a time: it holds
//!   an exclusive lock on `/run/preheat-wake.lock` (otherwise two daemons would save each
//!   other's `n/a` as "original").
//! * [`Mechanism::DmaLatency`] — `/dev/cpu_dma_latency`: open, write a 4-byte 0, keep the fd
//!   open while any CPU is armed. Whole-system (every CPU polls), and crash-safe: the kernel
//!   drops the constraint when the fd closes.
//! * [`Mechanism::Spin`] — no privileges: the CPU's worker thread (pinned, `SCHED_IDLE` while
//!   spinning, so any real task preempts it) spins through the window. Changes no machine
//!   state. Weaker than the other two on a VM (see the crate docs for numbers).
//!
//! Unprivileged (effective uid ≠ 0) the first two are never tried: nothing is changed.
//!
//! The worker that arms CPU N runs *on* CPU N, so after writing the constraint the CPU goes back
//! to idle through the governor, which then honours it (a halted CPU would otherwise stay halted
//! until its next interrupt).

use preheat_engine::latency::LatencyRequest;
use preheat_engine::pidlock::{LockError, PidLock};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// The mechanism that keeps a CPU awake.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Mechanism {
    #[serde(rename = "pmqos")]
    PmQos,
    #[serde(rename = "dma")]
    DmaLatency,
    #[serde(rename = "spin")]
    Spin,
}

impl Mechanism {
    pub fn name(self) -> &'static str {
        match self {
            Mechanism::PmQos => "pmqos",
            Mechanism::DmaLatency => "dma",
            Mechanism::Spin => "spin",
        }
    }
}

impl std::fmt::Display for Mechanism {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Which mechanism to use (`serve --mech`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, Serialize, Deserialize)]
pub enum MechChoice {
    /// Per CPU: pmqos if available, else dma, else spin.
    #[default]
    Auto,
    #[value(name = "pmqos")]
    PmQos,
    Dma,
    Spin,
}

/// The strict per-CPU resume-latency value on this kernel.
pub const PM_QOS_STRICT: &str = "n/a";

/// Where the OS knobs live (the real ones by default; tests point them into a temporary tree).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SysPaths {
    /// `/sys/devices/system/cpu`
    pub cpu_root: PathBuf,
    /// `/dev/cpu_dma_latency`
    pub dma_latency: PathBuf,
    /// Machine-wide lock of the PM QoS owner: `/run/preheat-wake.lock`.
    pub lock: PathBuf,
    /// Refuse to change anything unless the effective uid is 0 (true for the real paths).
    pub require_root: bool,
}

impl Default for SysPaths {
    fn default() -> Self {
        SysPaths {
            cpu_root: PathBuf::from("/sys/devices/system/cpu"),
            dma_latency: PathBuf::from("/dev/cpu_dma_latency"),
            lock: PathBuf::from("/run/preheat-wake.lock"),
            require_root: true,
        }
    }
}

impl SysPaths {
    pub fn pm_qos(&self, cpu: u32) -> PathBuf {
        self.cpu_root
            .join(format!("cpu{cpu}/power/pm_qos_resume_latency_us"))
    }

    /// Online CPUs (`<cpu_root>/online`); empty if unreadable.
    pub fn online_cpus(&self) -> Vec<u32> {
        std::fs::read_to_string(self.cpu_root.join("online"))
            .map(|s| {
                preheat_engine::topology::parse_cpu_list(&s)
                    .into_iter()
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Whether `path` is a per-CPU PM QoS file under our CPU root (the only files a journal may
    /// make us write).
    fn is_pm_qos_path(&self, path: &Path) -> bool {
        let Ok(rest) = path.strip_prefix(&self.cpu_root) else {
            return false;
        };
        let parts: Vec<_> = rest.components().collect();
        parts.len() == 3
            && parts[0]
                .as_os_str()
                .to_str()
                .and_then(|s| s.strip_prefix("cpu"))
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
            && parts[1].as_os_str() == "power"
            && parts[2].as_os_str() == "pm_qos_resume_latency_us"
    }
}

pub use preheat_engine::host::effective_uid;

/// A value a PM QoS file may legitimately hold (`n/a` or a decimal number of µs).
fn valid_pm_qos_value(v: &str) -> bool {
    v == PM_QOS_STRICT || (!v.is_empty() && v.len() <= 10 && v.bytes().all(|b| b.is_ascii_digit()))
}

fn read_value(path: &Path) -> io::Result<String> {
    let mut s = String::new();
    File::open(path)?.read_to_string(&mut s)?;
    Ok(s.trim().to_string())
}

/// Write `v` in one `write` (sysfs takes the value from a single write; `O_TRUNC` is ignored
/// there and makes ordinary files — the tests' fake tree — behave the same).
fn write_value(path: &Path, v: &str) -> io::Result<()> {
    let mut f = OpenOptions::new().write(true).truncate(true).open(path)?;
    f.write_all(v.as_bytes())
}

/// A per-CPU PM QoS file kept open: read and written at offset 0 (`pread`/`pwrite`), under
/// 1 µs each here, against ~7 µs to open the file for every access — this is on the path
/// between the worker's timer wake and the constraint taking effect.
#[derive(Debug)]
struct QosFile {
    file: File,
    /// Ordinary files (the tests' fake tree) must be truncated after a shorter write; sysfs
    /// takes each write as a whole value.
    truncate: bool,
}

impl QosFile {
    fn open(path: &Path, truncate: bool) -> io::Result<QosFile> {
        Ok(QosFile {
            file: OpenOptions::new().read(true).write(true).open(path)?,
            truncate,
        })
    }

    fn read(&self) -> io::Result<String> {
        let mut buf = [0u8; 64];
        let n = self.file.read_at(&mut buf, 0)?;
        Ok(String::from_utf8_lossy(&buf[..n]).trim().to_string())
    }

    fn write(&self, v: &str) -> io::Result<()> {
        let n = self.file.write_at(v.as_bytes(), 0)?;
        if n != v.len() {
            return Err(io::Error::other(format!(
                "short write ({n} of {} bytes)",
                v.len()
            )));
        }
        if self.truncate {
            self.file.set_len(v.len() as u64)?;
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// Journal

/// One changed setting: write `original` back to `path` (if it still holds `written`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JournalEntry {
    pub path: PathBuf,
    pub original: String,
    pub written: String,
}

/// The files this daemon may have changed and the value each must get back. Written (temp
/// file + rename) *before* a file is first changed (and again if its original value changed
/// meanwhile), kept while the daemon runs — an entry whose file already holds its original is
/// a no-op at restore — and removed at a clean exit. So it always lists at least what is
/// changed, and the usual window costs no journal I/O.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Journal {
    pub version: u32,
    pub pid: u32,
    pub entries: Vec<JournalEntry>,
}

impl Journal {
    pub const FILE: &'static str = "wake-journal.json";

    /// Read the journal; a missing file is an empty journal.
    pub fn load(path: &Path) -> io::Result<Journal> {
        match std::fs::read(path) {
            Ok(b) => serde_json::from_slice(&b).map_err(|e| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{}: not a wake journal: {e}", path.display()),
                )
            }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Journal::default()),
            Err(e) => Err(e),
        }
    }

    /// Write atomically; an empty journal removes the file. No fsync: the journal protects
    /// against a crash of this process (the page cache survives it); after a reboot sysfs is
    /// back at its defaults anyway.
    pub fn save(&self, path: &Path) -> io::Result<()> {
        if self.entries.is_empty() {
            return match std::fs::remove_file(path) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
                _ => Ok(()),
            };
        }
        let tmp = path.with_extension(format!("json.tmp{}", std::process::id()));
        let j = Journal {
            version: 1,
            pid: std::process::id(),
            entries: self.entries.clone(),
        };
        let body = serde_json::to_vec_pretty(&j).map_err(io::Error::other)?;
        std::fs::write(&tmp, body)?;
        std::fs::rename(&tmp, path)
    }
}

/// What happened to one journal entry at start-up.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum RestoreOutcome {
    /// `path` held `written`; `original` was written back.
    Restored { path: PathBuf, original: String },
    /// `path` already held `original`.
    AlreadyOriginal { path: PathBuf },
    /// Someone else changed `path` since: left alone.
    ChangedSince { path: PathBuf, current: String },
    /// The entry names a file or value we never write: ignored.
    Refused { path: PathBuf, why: String },
    /// Could not restore (the entry stays in the journal).
    Failed { path: PathBuf, error: String },
}

impl std::fmt::Display for RestoreOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RestoreOutcome::Restored { path, original } => {
                write!(f, "restored {} to {original:?}", path.display())
            }
            RestoreOutcome::AlreadyOriginal { path } => {
                write!(f, "{} already holds its original value", path.display())
            }
            RestoreOutcome::ChangedSince { path, current } => write!(
                f,
                "{} was changed by someone else since (now {current:?}): left alone",
                path.display()
            ),
            RestoreOutcome::Refused { path, why } => {
                write!(f, "ignored journal entry for {}: {why}", path.display())
            }
            RestoreOutcome::Failed { path, error } => {
                write!(f, "could not restore {}: {error}", path.display())
            }
        }
    }
}

/// Restore every entry of the journal at `journal_path` (left by a daemon that died) and rewrite
/// the journal with the entries that could not be restored.
pub fn restore_journal(paths: &SysPaths, journal_path: &Path) -> io::Result<Vec<RestoreOutcome>> {
    let mut j = Journal::load(journal_path)?;
    if j.entries.is_empty() {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    let mut keep = Vec::new();
    for e in j.entries.drain(..) {
        let path = e.path.clone();
        if !paths.is_pm_qos_path(&e.path) {
            out.push(RestoreOutcome::Refused {
                path,
                why: "not a per-CPU pm_qos_resume_latency_us file".into(),
            });
            continue;
        }
        if !valid_pm_qos_value(&e.original) || !valid_pm_qos_value(&e.written) {
            out.push(RestoreOutcome::Refused {
                path,
                why: format!("implausible values {:?}/{:?}", e.original, e.written),
            });
            continue;
        }
        match read_value(&e.path) {
            Ok(cur) if cur == e.original => out.push(RestoreOutcome::AlreadyOriginal { path }),
            Ok(cur) if cur == e.written => match write_value(&e.path, &e.original) {
                Ok(()) => out.push(RestoreOutcome::Restored {
                    path,
                    original: e.original.clone(),
                }),
                Err(err) => {
                    out.push(RestoreOutcome::Failed {
                        path,
                        error: err.to_string(),
                    });
                    keep.push(e);
                }
            },
            Ok(cur) => out.push(RestoreOutcome::ChangedSince { path, current: cur }),
            // The CPU went away (offline/hot-unplugged): nothing to restore.
            Err(err) if err.kind() == io::ErrorKind::NotFound => {
                out.push(RestoreOutcome::Refused {
                    path,
                    why: "file no longer exists".into(),
                })
            }
            Err(err) => {
                out.push(RestoreOutcome::Failed {
                    path,
                    error: err.to_string(),
                });
                keep.push(e);
            }
        }
    }
    j.entries = keep;
    j.save(journal_path)?;
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// Machine state

/// One armed CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Armed {
    pub mechanism: Mechanism,
    pub since_ns: u64,
}

/// The mechanisms available, the settings currently changed, and the journal. Dropping it
/// restores everything ([`Machine::disarm_all`]).
#[derive(Debug)]
pub struct Machine {
    paths: SysPaths,
    journal_path: PathBuf,
    journal: Journal,
    /// Per online CPU: the mechanism its windows use.
    per_cpu: BTreeMap<u32, Mechanism>,
    /// Why a better mechanism was not available (printed at start, shown in `status`).
    notes: Vec<String>,
    armed: BTreeMap<u32, Armed>,
    /// Open PM QoS files of the CPUs that use pmqos.
    qos: BTreeMap<u32, QosFile>,
    dma_fd: Option<LatencyRequest>,
    dma_ok: bool,
    _lock: Option<PidLock>,
}

impl Machine {
    /// Decide per CPU which mechanism to use, with reasons for what is unavailable. Changes
    /// nothing (opening `/dev/cpu_dma_latency` to check it adds a request *without* a
    /// constraint, dropped at once).
    pub fn open(
        paths: SysPaths,
        journal_path: PathBuf,
        choice: MechChoice,
        cpus: &[u32],
    ) -> Machine {
        let mut notes = Vec::new();
        let euid = effective_uid();
        let privileged = !paths.require_root || euid == Some(0);
        if !privileged {
            notes.push(format!(
                "running unprivileged (effective uid {}): changing no machine state (PM QoS, \
                 /dev/cpu_dma_latency); using the spin fallback",
                euid.map_or("unknown".to_string(), |u| u.to_string())
            ));
        }
        let want_pmqos = matches!(choice, MechChoice::Auto | MechChoice::PmQos);
        let want_dma = matches!(choice, MechChoice::Auto | MechChoice::Dma);

        // PM QoS: the machine-wide lock, then each CPU's file.
        let (mut lock, qos) = if privileged && want_pmqos {
            open_pm_qos(&paths, cpus, &mut notes)
        } else {
            (None, BTreeMap::new())
        };
        let dma_ok = privileged
            && want_dma
            && match OpenOptions::new().write(true).open(&paths.dma_latency) {
                Ok(_) => true,
                Err(e) => {
                    notes.push(format!(
                        "dma unavailable: {}: {e}",
                        paths.dma_latency.display()
                    ));
                    false
                }
            };
        let per_cpu = cpus
            .iter()
            .map(|&c| {
                let m = if qos.contains_key(&c) {
                    Mechanism::PmQos
                } else if dma_ok {
                    Mechanism::DmaLatency
                } else {
                    Mechanism::Spin
                };
                (c, m)
            })
            .collect::<BTreeMap<_, _>>();
        if !per_cpu.values().any(|&m| m == Mechanism::PmQos) && lock.is_some() {
            lock = None; // Nobody uses PM QoS here: let another daemon have it.
        }
        if choice != MechChoice::Auto && privileged {
            let asked = match choice {
                MechChoice::PmQos => Mechanism::PmQos,
                MechChoice::Dma => Mechanism::DmaLatency,
                _ => Mechanism::Spin,
            };
            for (c, m) in &per_cpu {
                if *m != asked {
                    notes.push(format!(
                        "cpu{c}: {asked} was asked for but is unavailable; using {m}"
                    ));
                }
            }
        }
        // Entries a start-up restore could not handle stay listed (they are never dropped by
        // a later save).
        let journal = Journal::load(&journal_path).unwrap_or_default();
        Machine {
            paths,
            journal_path,
            journal,
            per_cpu,
            notes,
            armed: BTreeMap::new(),
            qos,
            dma_fd: None,
            dma_ok,
            _lock: lock,
        }
    }

    /// The mechanism windows on `cpu` use.
    pub fn mechanism(&self, cpu: u32) -> Mechanism {
        self.per_cpu.get(&cpu).copied().unwrap_or(Mechanism::Spin)
    }

    pub fn mechanisms(&self) -> &BTreeMap<u32, Mechanism> {
        &self.per_cpu
    }

    pub fn notes(&self) -> &[String] {
        &self.notes
    }

    /// Add a note (shown in `status`); keeps at most the last 64.
    pub fn notes_push(&mut self, note: String) {
        if self.notes.len() >= 64 {
            self.notes.remove(0);
        }
        self.notes.push(note);
    }

    pub fn armed(&self) -> &BTreeMap<u32, Armed> {
        &self.armed
    }

    pub fn journal_path(&self) -> &Path {
        &self.journal_path
    }

    /// Keep `cpu` out of deep idle from now on (idempotent). Returns the mechanism in effect;
    /// if the CPU's mechanism fails now, falls back (pmqos → dma → spin) and notes why.
    pub fn arm(&mut self, cpu: u32, now: u64) -> Mechanism {
        if let Some(a) = self.armed.get(&cpu) {
            return a.mechanism;
        }
        let mut m = self.mechanism(cpu);
        if m == Mechanism::PmQos {
            if let Err(e) = self.arm_pm_qos(cpu) {
                self.notes_push(format!(
                    "cpu{cpu}: pmqos failed ({e}); falling back for this window"
                ));
                m = if self.dma_ok {
                    Mechanism::DmaLatency
                } else {
                    Mechanism::Spin
                };
            }
        }
        if m == Mechanism::DmaLatency && self.dma_fd.is_none() {
            if let Err(e) = self.open_dma() {
                let note = format!(
                    "{}: {e}; falling back to spin for this window",
                    self.paths.dma_latency.display()
                );
                self.notes_push(note);
                m = Mechanism::Spin;
            }
        }
        self.armed.insert(
            cpu,
            Armed {
                mechanism: m,
                since_ns: now,
            },
        );
        m
    }

    fn arm_pm_qos(&mut self, cpu: u32) -> io::Result<()> {
        let path = self.paths.pm_qos(cpu);
        let f = self
            .qos
            .get(&cpu)
            .ok_or_else(|| io::Error::other("file not open"))?;
        let current = f.read()?;
        if !valid_pm_qos_value(&current) {
            return Err(io::Error::other(format!("unexpected value {current:?}")));
        }
        // Journal first, then change. The entry stays while we run (the journal lists every
        // file we may have changed, with the value to put back), so the usual arm writes only
        // the sysfs file. It is rewritten when the value found differs from the one journalled
        // (someone changed it while we were not holding it), except when it is already `n/a`:
        // then an entry left by a failed restore keeps the true original.
        match self.journal.entries.iter_mut().find(|e| e.path == path) {
            Some(e) if current == PM_QOS_STRICT || current == e.original => {}
            Some(e) => {
                e.original = current;
                self.journal.save(&self.journal_path)?;
            }
            None => {
                self.journal.entries.push(JournalEntry {
                    path: path.clone(),
                    original: current,
                    written: PM_QOS_STRICT.to_string(),
                });
                self.journal.save(&self.journal_path)?;
            }
        }
        f.write(PM_QOS_STRICT)
    }

    fn open_dma(&mut self) -> io::Result<()> {
        let mut r = LatencyRequest::open_at(&self.paths.dma_latency)?;
        r.arm()?;
        self.dma_fd = Some(r);
        Ok(())
    }

    /// Let `cpu` sleep again (idempotent): write back its original PM QoS value (unless
    /// someone else changed the file meanwhile), or drop the `/dev/cpu_dma_latency` fd once no
    /// CPU needs it. A value that cannot be restored is noted and stays in the journal.
    pub fn disarm(&mut self, cpu: u32) {
        let Some(a) = self.armed.remove(&cpu) else {
            return;
        };
        match a.mechanism {
            Mechanism::PmQos => {
                let path = self.paths.pm_qos(cpu);
                if let Some(e) = self
                    .journal
                    .entries
                    .iter()
                    .find(|e| e.path == path)
                    .cloned()
                {
                    let res = match self.qos.get(&cpu) {
                        Some(f) => match f.read() {
                            // Someone else changed it meanwhile: leave their value.
                            Ok(cur) if cur != e.written => Ok(()),
                            _ => f.write(&e.original),
                        },
                        None => Err(io::Error::other("file not open")),
                    };
                    if let Err(err) = res {
                        self.notes_push(format!(
                            "cpu{cpu}: could not restore {} to {:?}: {err} (kept in the journal)",
                            path.display(),
                            e.original
                        ));
                    }
                }
            }
            Mechanism::DmaLatency => {
                if !self
                    .armed
                    .values()
                    .any(|a| a.mechanism == Mechanism::DmaLatency)
                {
                    self.dma_fd = None;
                }
            }
            Mechanism::Spin => {}
        }
    }

    /// Restore everything this process changed and empty the journal (entries whose value
    /// could not be written back stay, for the next start).
    pub fn disarm_all(&mut self) {
        let cpus: Vec<u32> = self.armed.keys().copied().collect();
        for c in cpus {
            self.disarm(c);
        }
        self.dma_fd = None;
        if self.journal.entries.is_empty() {
            return;
        }
        let mut keep = Vec::new();
        for e in std::mem::take(&mut self.journal.entries) {
            let ok = match read_value(&e.path) {
                Ok(cur) if cur == e.written => write_value(&e.path, &e.original).is_ok(),
                // Back at the original, or someone else's value, or the file is gone.
                _ => true,
            };
            if !ok {
                keep.push(e);
            }
        }
        self.journal.entries = keep;
        if let Err(err) = self.journal.save(&self.journal_path) {
            let note = format!("{}: {err}", self.journal_path.display());
            self.notes_push(note);
        }
    }

    /// Settings changed right now (CPUs armed with pmqos or dma).
    pub fn changed_now(&self) -> usize {
        self.armed
            .values()
            .filter(|a| a.mechanism != Mechanism::Spin)
            .count()
    }

    /// The journal entries still outstanding (for `status`).
    pub fn journal(&self) -> &Journal {
        &self.journal
    }
}

impl Drop for Machine {
    fn drop(&mut self) {
        self.disarm_all();
    }
}

/// The machine-wide PM QoS lock and, under it, each CPU's PM QoS file that holds a valid value;
/// why one is unavailable goes to `notes`.
fn open_pm_qos(
    paths: &SysPaths,
    cpus: &[u32],
    notes: &mut Vec<String>,
) -> (Option<PidLock>, BTreeMap<u32, QosFile>) {
    let mut qos: BTreeMap<u32, QosFile> = BTreeMap::new();
    let lock = match take_lock(&paths.lock) {
        Ok(f) => f,
        Err(why) => {
            notes.push(format!("pmqos unavailable: {why}"));
            return (None, qos);
        }
    };
    let truncate = !paths.cpu_root.starts_with("/sys");
    for &c in cpus {
        let p = paths.pm_qos(c);
        let ok = match read_value(&p) {
            Err(e) => Err(format!("{}: {e}", p.display())),
            Ok(v) if !valid_pm_qos_value(&v) => {
                Err(format!("{}: unexpected value {v:?}", p.display()))
            }
            Ok(_) => QosFile::open(&p, truncate).map_err(|e| format!("{}: {e}", p.display())),
        };
        match ok {
            Ok(f) => {
                qos.insert(c, f);
            }
            Err(why) => notes.push(format!("pmqos unavailable on cpu{c}: {why}")),
        }
    }
    (Some(lock), qos)
}

/// Take the machine-wide PM QoS lock (non-blocking); the owner's pid is written into it.
fn take_lock(path: &Path) -> Result<PidLock, String> {
    match PidLock::take_keeping_file(path) {
        Ok(l) => Ok(l),
        Err(LockError::Held(owner)) => Err(format!(
            "another preheat-wake daemon (pid {}) drives PM QoS on this machine ({} is locked)",
            owner.map_or("?".into(), |p| p.to_string()),
            path.display()
        )),
        Err(LockError::Io(e)) => Err(format!("{}: {e}", path.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake sysfs tree with `n` CPUs, each PM QoS file holding `init`.
    fn fake(n: u32, init: &str) -> (tempfile::TempDir, SysPaths) {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("cpu");
        for c in 0..n {
            let p = root.join(format!("cpu{c}/power"));
            std::fs::create_dir_all(&p).unwrap();
            std::fs::write(p.join("pm_qos_resume_latency_us"), format!("{init}\n")).unwrap();
        }
        std::fs::write(root.join("online"), format!("0-{}\n", n - 1)).unwrap();
        let paths = SysPaths {
            cpu_root: root,
            dma_latency: d.path().join("no-such-dma"),
            lock: d.path().join("lock"),
            require_root: false,
        };
        (d, paths)
    }

    #[test]
    fn arm_journal_disarm_restores_original() {
        let (d, paths) = fake(2, "125");
        let jp = d.path().join(Journal::FILE);
        let mut m = Machine::open(paths.clone(), jp.clone(), MechChoice::Auto, &[0, 1]);
        assert_eq!(m.mechanism(1), Mechanism::PmQos);
        assert!(m.notes().iter().any(|n| n.contains("dma unavailable")));
        assert_eq!(m.arm(1, 5), Mechanism::PmQos);
        assert_eq!(read_value(&paths.pm_qos(1)).unwrap(), "n/a");
        let j = Journal::load(&jp).unwrap();
        assert_eq!(j.entries.len(), 1);
        assert_eq!(j.entries[0].original, "125");
        // Idempotent.
        assert_eq!(m.arm(1, 6), Mechanism::PmQos);
        assert_eq!(m.armed()[&1].since_ns, 5);
        m.disarm(1);
        assert_eq!(read_value(&paths.pm_qos(1)).unwrap(), "125");
        // The journal keeps listing what to put back while we run (restoring an entry that
        // already holds its original is a no-op).
        assert_eq!(Journal::load(&jp).unwrap().entries.len(), 1);
        // Someone changes it while we do not hold it: the new value becomes the original.
        std::fs::write(paths.pm_qos(1), "300").unwrap();
        m.arm(1, 8);
        assert_eq!(Journal::load(&jp).unwrap().entries[0].original, "300");
        m.disarm(1);
        assert_eq!(read_value(&paths.pm_qos(1)).unwrap(), "300");
        // Someone changes it while we hold it: left alone at disarm.
        m.arm(1, 9);
        std::fs::write(paths.pm_qos(1), "40").unwrap();
        m.disarm(1);
        assert_eq!(read_value(&paths.pm_qos(1)).unwrap(), "40");
        // Drop restores.
        m.arm(0, 7);
        assert_eq!(read_value(&paths.pm_qos(0)).unwrap(), "n/a");
        drop(m);
        assert_eq!(read_value(&paths.pm_qos(0)).unwrap(), "125");
        assert_eq!(read_value(&paths.pm_qos(1)).unwrap(), "40");
        assert!(!jp.exists());
    }

    #[test]
    fn second_owner_gets_no_pmqos() {
        let (d, paths) = fake(2, "0");
        let m1 = Machine::open(
            paths.clone(),
            d.path().join("j1"),
            MechChoice::Auto,
            &[0, 1],
        );
        assert_eq!(m1.mechanism(0), Mechanism::PmQos);
        let m2 = Machine::open(
            paths.clone(),
            d.path().join("j2"),
            MechChoice::Auto,
            &[0, 1],
        );
        assert_eq!(m2.mechanism(0), Mechanism::Spin);
        assert!(
            m2.notes()
                .iter()
                .any(|n| n.contains("another preheat-wake daemon")),
            "{:?}",
            m2.notes()
        );
        drop(m1);
        let m3 = Machine::open(paths, d.path().join("j3"), MechChoice::Auto, &[0, 1]);
        assert_eq!(m3.mechanism(0), Mechanism::PmQos);
    }

    #[test]
    fn spin_choice_changes_nothing() {
        let (d, paths) = fake(2, "0");
        let mut m = Machine::open(paths.clone(), d.path().join("j"), MechChoice::Spin, &[0, 1]);
        assert_eq!(m.arm(1, 1), Mechanism::Spin);
        assert_eq!(read_value(&paths.pm_qos(1)).unwrap(), "0");
        assert!(!d.path().join("j").exists());
        // The lock was not kept.
        assert!(take_lock(&paths.lock).is_ok());
    }

    #[test]
    fn journal_restore_after_crash() {
        let (d, paths) = fake(4, "0");
        let jp = d.path().join(Journal::FILE);
        // cpu1: changed by the dead daemon; cpu2: already back; cpu3: someone else's value.
        std::fs::write(paths.pm_qos(1), "n/a").unwrap();
        std::fs::write(paths.pm_qos(3), "77").unwrap();
        let entry = |c: u32| JournalEntry {
            path: paths.pm_qos(c),
            original: "0".into(),
            written: "n/a".into(),
        };
        let j = Journal {
            version: 1,
            pid: 1,
            entries: vec![
                entry(1),
                entry(2),
                entry(3),
                JournalEntry {
                    path: "/etc/passwd".into(),
                    original: "0".into(),
                    written: "n/a".into(),
                },
                JournalEntry {
                    path: paths.pm_qos(0),
                    original: "rm -rf".into(),
                    written: "n/a".into(),
                },
            ],
        };
        j.save(&jp).unwrap();
        let out = restore_journal(&paths, &jp).unwrap();
        assert!(matches!(&out[0], RestoreOutcome::Restored { original, .. } if original == "0"));
        assert!(matches!(&out[1], RestoreOutcome::AlreadyOriginal { .. }));
        assert!(matches!(&out[2], RestoreOutcome::ChangedSince { current, .. } if current == "77"));
        assert!(matches!(&out[3], RestoreOutcome::Refused { .. }));
        assert!(matches!(&out[4], RestoreOutcome::Refused { .. }));
        assert_eq!(read_value(&paths.pm_qos(1)).unwrap(), "0");
        assert_eq!(read_value(&paths.pm_qos(3)).unwrap(), "77");
        assert!(!jp.exists());
        // Nothing to do the second time.
        assert!(restore_journal(&paths, &jp).unwrap().is_empty());
    }

    #[test]
    fn pm_qos_path_check() {
        let p = SysPaths::default();
        assert!(p.is_pm_qos_path(&p.pm_qos(12)));
        assert!(!p.is_pm_qos_path(Path::new(
            "/sys/devices/system/cpu/cpu1/power/../../../../../etc/passwd"
        )));
        assert!(!p.is_pm_qos_path(Path::new(
            "/sys/devices/system/cpu/cpux/power/pm_qos_resume_latency_us"
        )));
        assert!(valid_pm_qos_value("n/a") && valid_pm_qos_value("0") && !valid_pm_qos_value("-1"));
    }
}
