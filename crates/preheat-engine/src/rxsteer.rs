//! Receive steering: a network device's receive processing moved to chosen CPUs (RPS, the
//! `queues/rx-*/rps_cpus` masks of the device), as a real NIC's interrupt affinity puts a
//! server's packets on the server's core. On the loopback the receive softirq otherwise runs on
//! the *sender's* CPU — for the demo, the client's.
//!
//! A machine setting, so it is put back: [`Steering`] restores every mask it changed when
//! dropped. Before changing anything it writes the original masks to a journal in [`STATE_DIR`]
//! (machine-wide, as the masks are); a process killed outright leaves the journal behind, and
//! whoever steers next, or calls [`restore_left`] (every `preheat` command does), writes those
//! masks back first; a signal handler that exits without dropping calls [`restore_own`]. One
//! steerer per machine at a time: a [`PidLock`] there (a second would journal the first's masks
//! as originals).

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::pidlock::{LockError, PidLock};

/// Where the lock and the journal are (steering needs root, who can write there).
pub const STATE_DIR: &str = "/run";
const LOCK: &str = "preheat-rxsteer.lock";
const JOURNAL: &str = "preheat-rxsteer.journal";

/// The journal of this process's live steering ([`restore_own`]).
static OWN: Mutex<Option<PathBuf>> = Mutex::new(None);

/// Where the network devices are.
pub const SYS_NET: &str = "/sys/class/net";

/// Why steering could not be set up.
#[derive(Debug)]
pub enum SteerError {
    /// Another live process steers (its pid, where known).
    Busy(Option<u32>),
    /// The device has no RPS masks (no such device, or a kernel without RPS).
    NoQueues(String),
    Io(io::Error),
}

impl std::fmt::Display for SteerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SteerError::Busy(Some(pid)) => write!(f, "another process (pid {pid}) steers"),
            SteerError::Busy(None) => write!(f, "another process steers"),
            SteerError::NoQueues(dev) => {
                write!(f, "{dev} has no receive queue with an RPS mask (rps_cpus)")
            }
            SteerError::Io(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for SteerError {}

impl From<io::Error> for SteerError {
    fn from(e: io::Error) -> SteerError {
        SteerError::Io(e)
    }
}

impl From<LockError> for SteerError {
    fn from(e: LockError) -> SteerError {
        match e {
            LockError::Held(pid) => SteerError::Busy(pid),
            LockError::Io(e) => SteerError::Io(e),
        }
    }
}

/// The RPS mask files of `dev`'s receive queues under `sys_net`, sorted.
pub fn queue_files(sys_net: &Path, dev: &str) -> Result<Vec<PathBuf>, SteerError> {
    let queues = sys_net.join(dev).join("queues");
    let mut files: Vec<PathBuf> = fs::read_dir(&queues)
        .map_err(|_| SteerError::NoQueues(dev.to_string()))?
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("rx-"))
        .map(|e| e.path().join("rps_cpus"))
        .filter(|p| p.exists())
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(SteerError::NoQueues(dev.to_string()));
    }
    Ok(files)
}

/// The mask text of `cpus`: comma-separated 32-bit hex words, most significant first (the
/// kernel's bitmap format).
pub fn mask(cpus: &[usize]) -> String {
    let words = cpus.iter().max().map_or(1, |m| m / 32 + 1);
    let mut w = vec![0u32; words];
    for &c in cpus {
        if let Some(x) = w.get_mut(c / 32) {
            *x |= 1 << (c % 32);
        }
    }
    w.iter()
        .rev()
        .map(|x| format!("{x:08x}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// Receive processing of a device steered to some CPUs; the original masks come back on drop.
#[derive(Debug)]
pub struct Steering {
    saved: Vec<(PathBuf, String)>,
    mask: String,
    journal: PathBuf,
    _lock: PidLock,
    /// False only in tests that play a process killed outright.
    restore: bool,
}

impl Steering {
    /// Steer `dev`'s receive processing (every queue) to `cpus`.
    pub fn apply(dev: &str, cpus: &[usize]) -> Result<Steering, SteerError> {
        Steering::apply_at(Path::new(SYS_NET), dev, cpus, Path::new(STATE_DIR))
    }

    /// [`Steering::apply`] with the devices under `sys_net` and the lock and journal in
    /// `state_dir` (tests use directories of their own).
    pub fn apply_at(
        sys_net: &Path,
        dev: &str,
        cpus: &[usize],
        state_dir: &Path,
    ) -> Result<Steering, SteerError> {
        let lock = PidLock::take(&state_dir.join(LOCK))?;
        let journal = state_dir.join(JOURNAL);
        restore_journal(&journal)?;
        let files = queue_files(sys_net, dev)?;
        let saved = files
            .iter()
            .map(|f| Ok((f.clone(), fs::read_to_string(f)?.trim().to_string())))
            .collect::<io::Result<Vec<_>>>()?;
        write_journal(&journal, &saved)?;
        if let Ok(mut own) = OWN.lock() {
            *own = Some(journal.clone());
        }
        let steering = Steering {
            saved,
            mask: mask(cpus),
            journal,
            _lock: lock,
            restore: true,
        };
        // On failure, dropping `steering` puts back what was changed.
        steering.set(true)?;
        Ok(steering)
    }

    /// Steer (`true`) or put the original masks back for now (`false`); the lock and the
    /// journal stay until drop.
    pub fn set(&self, on: bool) -> io::Result<()> {
        for (f, orig) in &self.saved {
            fs::write(f, if on { &self.mask } else { orig })?;
        }
        Ok(())
    }

    /// The mask files changed.
    pub fn files(&self) -> impl Iterator<Item = &Path> {
        self.saved.iter().map(|(p, _)| p.as_path())
    }
}

impl Drop for Steering {
    fn drop(&mut self) {
        if !self.restore {
            return;
        }
        let mut all = true;
        for (f, v) in &self.saved {
            all &= fs::write(f, v).is_ok();
        }
        // A mask that could not be put back stays journaled for the next steerer.
        if all {
            let _ = fs::remove_file(&self.journal);
            if let Ok(mut own) = OWN.lock() {
                *own = None;
            }
        }
    }
}

/// Put back the masks a steerer that died left journaled (nothing while a live process steers,
/// or without a journal); the number of masks restored.
pub fn restore_left() -> io::Result<usize> {
    if !Path::new(STATE_DIR).join(JOURNAL).exists() {
        return Ok(0);
    }
    restore_left_at(Path::new(STATE_DIR))
}

/// [`restore_left`] with the lock and journal in `state_dir`.
pub fn restore_left_at(state_dir: &Path) -> io::Result<usize> {
    match PidLock::take(&state_dir.join(LOCK)) {
        Ok(_lock) => restore_journal(&state_dir.join(JOURNAL)),
        Err(LockError::Held(_)) => Ok(0),
        // No state directory, or not ours to write (an unprivileged command): nothing it could
        // put back.
        Err(LockError::Io(e))
            if matches!(
                e.kind(),
                io::ErrorKind::NotFound | io::ErrorKind::PermissionDenied
            ) =>
        {
            Ok(0)
        }
        Err(LockError::Io(e)) => Err(e),
    }
}

/// Put back this process's live steering from its journal (for a signal handler about to
/// exit: no destructor runs then). Nothing without one.
pub fn restore_own() {
    let own = OWN.lock().ok().and_then(|mut o| o.take());
    if let Some(j) = own {
        let _ = restore_journal(&j);
    }
}

/// One line per mask file: its path, a tab, the original mask.
fn write_journal(journal: &Path, saved: &[(PathBuf, String)]) -> io::Result<()> {
    let text: String = saved
        .iter()
        .map(|(p, v)| format!("{}\t{v}\n", p.display()))
        .collect();
    let tmp = journal.with_extension("tmp");
    fs::write(&tmp, text)?;
    fs::rename(&tmp, journal)
}

/// Write back the masks in `journal` and remove it (caller holds the lock); how many. Only
/// `rps_cpus` files are ever written, whatever the journal says.
fn restore_journal(journal: &Path) -> io::Result<usize> {
    let text = match fs::read_to_string(journal) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e),
    };
    let mut n = 0;
    for line in text.lines() {
        let Some((path, value)) = line.split_once('\t') else {
            continue;
        };
        let path = Path::new(path);
        if path.file_name().is_some_and(|f| f == "rps_cpus") {
            fs::write(path, value)?;
            n += 1;
        }
    }
    fs::remove_file(journal)?;
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake `/sys/class/net` with `lo` of two receive queues, masks "0".
    fn fake() -> (tempfile::TempDir, PathBuf, PathBuf) {
        let t = tempfile::tempdir().unwrap();
        let net = t.path().join("net");
        for q in ["rx-0", "rx-1"] {
            let d = net.join("lo/queues").join(q);
            fs::create_dir_all(&d).unwrap();
            fs::write(d.join("rps_cpus"), "0\n").unwrap();
        }
        fs::create_dir_all(net.join("lo/queues/tx-0")).unwrap();
        let run = t.path().join("run");
        fs::create_dir_all(&run).unwrap();
        (t, net, run)
    }

    fn masks(net: &Path) -> Vec<String> {
        queue_files(net, "lo")
            .unwrap()
            .iter()
            .map(|f| fs::read_to_string(f).unwrap().trim().to_string())
            .collect()
    }

    #[test]
    fn masks_are_kernel_bitmaps() {
        assert_eq!(mask(&[1]), "00000002");
        assert_eq!(mask(&[0, 3]), "00000009");
        assert_eq!(mask(&[33]), "00000002,00000000");
        assert_eq!(mask(&[]), "00000000");
    }

    #[test]
    fn steering_is_put_back_on_drop() {
        let (_t, net, run) = fake();
        let s = Steering::apply_at(&net, "lo", &[1], &run).unwrap();
        assert_eq!(s.files().count(), 2);
        assert_eq!(masks(&net), ["00000002", "00000002"]);
        assert!(run.join(JOURNAL).exists());
        s.set(false).unwrap();
        assert_eq!(masks(&net), ["0", "0"]);
        s.set(true).unwrap();
        assert_eq!(masks(&net), ["00000002", "00000002"]);
        drop(s);
        assert_eq!(masks(&net), ["0", "0"]);
        assert!(!run.join(JOURNAL).exists() && !run.join(LOCK).exists());
    }

    #[test]
    fn a_steerer_killed_outright_is_undone_by_the_next() {
        let (_t, net, run) = fake();
        let mut s = Steering::apply_at(&net, "lo", &[1], &run).unwrap();
        // Killed outright: nothing restored; its lock goes with the process.
        s.restore = false;
        drop(s);
        assert_eq!(masks(&net), ["00000002", "00000002"]);
        assert_eq!(restore_left_at(&run).unwrap(), 2);
        assert_eq!(masks(&net), ["0", "0"]);
        assert_eq!(restore_left_at(&run).unwrap(), 0);
    }

    #[test]
    fn one_steerer_at_a_time_and_no_device_is_an_error() {
        let (_t, net, run) = fake();
        let s = Steering::apply_at(&net, "lo", &[1], &run).unwrap();
        assert!(matches!(
            Steering::apply_at(&net, "lo", &[0], &run),
            Err(SteerError::Busy(Some(_)))
        ));
        // A live steerer's journal is not "left".
        assert_eq!(restore_left_at(&run).unwrap(), 0);
        assert_eq!(masks(&net), ["00000002", "00000002"]);
        drop(s);
        assert!(matches!(
            Steering::apply_at(&net, "eth9", &[0], &run),
            Err(SteerError::NoQueues(_))
        ));
    }
}
