//! What a dead controller leaves behind, and who restores it: the watchdog process a run
//! starts (the executable of [`WatchdogCmd`], which calls [`watch`]), the next start
//! ([`restore_leftover`]) and `preheat cosched restore` ([`restore`]); and the scratch
//! directories of dead runs ([`sweep_scratch`]).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use preheat_cosched::journal;
use preheat_launch::paths;

/// The prefix of a run's scratch directory (next to the journal, named with the run's pid).
pub(crate) const SCRATCH_PREFIX: &str = "cosched-scratch-";

/// How to start the watchdog: `exe args... --controller PID --journal PATH`, where the
/// executable calls [`watch`] (the CLI: `/proc/self/exe cosched restore --watch`).
#[derive(Debug, Clone)]
pub struct WatchdogCmd {
    pub exe: PathBuf,
    pub args: Vec<String>,
}

/// The journal at `journal`, or the default one in the run directory.
pub fn journal_path(journal: Option<&Path>) -> PathBuf {
    journal.map_or_else(
        || journal::default_path(&paths::run_dir()),
        Path::to_path_buf,
    )
}

/// Remove the scratch directories of coschedulers that died (their pid no longer runs).
pub fn sweep_scratch(dir: &Path) {
    preheat_launch::launch::sweep_scratch(dir, SCRATCH_PREFIX);
}

/// Restore a journal a dead controller left behind, telling `say` what was restored.
pub fn restore_leftover(path: &Path, say: &dyn Fn(&str)) -> Result<()> {
    if let Some(outcomes) = journal::restore_if_orphaned(path)
        .with_context(|| format!("restoring {}", path.display()))?
    {
        say(&format!(
            "preheat cosched: a previous controller died; restored from {}:",
            path.display()
        ));
        for o in outcomes {
            say(&format!("  {o}"));
        }
    }
    Ok(())
}

/// The watchdog's work: wait until `controller` exits, then restore what its journal lists
/// (or return once the journal is removed), and sweep dead runs' scratch directories.
pub fn watch(path: &Path, controller: u32) -> Result<Vec<journal::Outcome>> {
    let out = journal::watch(path, controller, Duration::from_millis(20))?;
    if let Some(dir) = path.parent() {
        sweep_scratch(dir);
    }
    Ok(out)
}

/// Restore a journal whose controller is dead (`None`: absent, empty or its controller runs),
/// after sweeping dead runs' scratch directories.
pub fn restore(path: &Path) -> Result<Option<Vec<journal::Outcome>>> {
    if let Some(dir) = path.parent() {
        sweep_scratch(dir);
    }
    Ok(journal::restore_if_orphaned(path)?)
}

/// The watchdog process, in its own process group (so a terminal's Ctrl-C does not reach it),
/// killed when dropped.
pub(crate) struct Watchdog(std::process::Child);

impl Drop for Watchdog {
    fn drop(&mut self) {
        // It exits by itself once the journal is gone; give it a moment, then make sure.
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_millis(500) {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Start the watchdog of this process's run with `journal`.
pub(crate) fn start(cmd: &WatchdogCmd, journal: &Path) -> Result<Watchdog> {
    use std::os::unix::process::CommandExt;
    let child = Command::new(&cmd.exe)
        .args(&cmd.args)
        .arg("--controller")
        .arg(std::process::id().to_string())
        .arg("--journal")
        .arg(journal)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .process_group(0)
        .spawn()
        .context("starting the watchdog")?;
    Ok(Watchdog(child))
}
