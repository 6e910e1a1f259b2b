//! Where preheat's companion artifacts and sockets live.
//!
//! The CLI ships with two companions built from the same workspace: the LD_PRELOAD agent
//! (`libpreheat_agent.so`) and the bundled default server (`preheat-kv`). They are looked up next
//! to the `preheat` executable (the layout of `target/<profile>/`, of its `deps/` for test
//! executables, and of an install prefix's `bin/` + `lib/`), or at `PREHEAT_AGENT_SO` / `PREHEAT_KV_BIN`. When running from a source
//! checkout and they are missing, the CLI builds them with cargo (once, with a message).
//! Guests get a statically linked `preheat-npb` ([`npb_static_bin`]), built the same way.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

/// Directory of agent sockets: `PREHEAT_RUN_DIR` (if set and non-empty) or `/tmp/preheat`.
pub fn run_dir() -> PathBuf {
    preheat_rundir::run_dir_from_env()
}

pub fn control_socket(run_dir: &Path, pid: u32) -> PathBuf {
    preheat_rundir::socket_paths(run_dir, pid).control
}

pub fn trigger_socket(run_dir: &Path, pid: u32) -> PathBuf {
    preheat_rundir::socket_paths(run_dir, pid).trigger
}

/// The log the agent of `pid` writes in `run_dir`.
pub fn agent_log(run_dir: &Path, pid: u32) -> PathBuf {
    preheat_rundir::socket_paths(run_dir, pid).log
}

fn exe_dir() -> Result<PathBuf> {
    let exe = std::env::current_exe().context("cannot find the preheat executable")?;
    Ok(exe
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from(".")))
}

/// The cargo profile of `dir` (`target/<profile>/`, or its `deps/` for a test executable).
fn profile_name(dir: &Path) -> &'static str {
    if dir.ends_with("release") || dir.parent().is_some_and(|p| p.ends_with("release")) {
        "release"
    } else {
        "dev"
    }
}

/// Build missing companions when running from this source checkout.
fn build_companions(dir: &Path) -> Result<()> {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../Cargo.toml");
    if !manifest.exists() {
        bail!("preheat's agent and bundled server are not next to {} and no source checkout is available to build them; set PREHEAT_AGENT_SO and PREHEAT_KV_BIN", dir.display());
    }
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    eprintln!(
        "preheat: building the agent and the bundled programs (cargo build --profile {} -p preheat-agent -p preheat-kv -p preheat-npb) ...",
        profile_name(dir)
    );
    let st = Command::new(cargo)
        .args(["build", "--quiet", "--profile", profile_name(dir)])
        .args([
            "-p",
            "preheat-agent",
            "-p",
            "preheat-kv",
            "-p",
            "preheat-npb",
        ])
        .arg("--manifest-path")
        .arg(&manifest)
        .status()
        .context("running cargo to build the agent and bundled server")?;
    if !st.success() {
        bail!("building the agent and bundled server failed ({st})");
    }
    Ok(())
}

fn companion(env: &str, names: &[&str]) -> Result<PathBuf> {
    if let Some(p) = std::env::var_os(env) {
        let p = PathBuf::from(p);
        if !p.exists() {
            bail!("{env}={} does not exist", p.display());
        }
        return Ok(p);
    }
    let dir = exe_dir()?;
    let find = || {
        names
            .iter()
            .flat_map(|n| {
                [
                    dir.join(n),
                    dir.join("../lib").join(n),
                    dir.join("..").join(n),
                ]
            })
            .find(|p| p.exists())
    };
    if let Some(p) = find() {
        return Ok(p);
    }
    build_companions(&dir)?;
    find().with_context(|| format!("{} not found in {} after building", names[0], dir.display()))
}

/// The LD_PRELOAD agent.
pub fn agent_so() -> Result<PathBuf> {
    companion("PREHEAT_AGENT_SO", &["libpreheat_agent.so"])
}

/// The bundled default server.
pub fn kv_bin() -> Result<PathBuf> {
    companion("PREHEAT_KV_BIN", &["preheat-kv"])
}

/// The bundled NPB-style kernels (communication detection and coscheduling workloads).
pub fn npb_bin() -> Result<PathBuf> {
    companion("PREHEAT_NPB_BIN", &["preheat-npb"])
}

/// The target triple of the statically linked kernels run inside x86-64 guests.
pub const GUEST_TARGET: &str = "x86_64-unknown-linux-gnu";

/// The bundled NPB-style kernels linked statically, for a guest whose initramfs has no C library:
/// `PREHEAT_NPB_STATIC_BIN`, else `preheat-npb-static` next to the executable, else — from a
/// source checkout — built (or brought up to date) with cargo: release, `--target`
/// [`GUEST_TARGET`] with `-C target-feature=+crt-static` (only the target's artifacts are
/// static; a no-op when nothing changed) and without debug info (2 MB instead of 15 in the
/// guest's initramfs). Refused unless the file names no dynamic linker.
pub fn npb_static_bin() -> Result<PathBuf> {
    let path = match std::env::var_os("PREHEAT_NPB_STATIC_BIN") {
        Some(p) => PathBuf::from(p),
        None => {
            let installed = exe_dir()?.join("preheat-npb-static");
            if installed.exists() {
                installed
            } else {
                build_npb_static()?
            }
        }
    };
    let elf = preheat_engine::elf::read(&path)
        .map_err(|e| anyhow::anyhow!("{}: not a program: {e}", path.display()))?;
    if let Some(interp) = elf.interp {
        bail!(
            "{} is dynamically linked (it names the dynamic linker {interp}); a guest needs a \
             statically linked preheat-npb",
            path.display()
        );
    }
    Ok(path)
}

/// Build `preheat-npb` statically from this source checkout; the path of the binary.
fn build_npb_static() -> Result<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let manifest = root.join("Cargo.toml");
    if !manifest.exists() {
        bail!(
            "no statically linked preheat-npb: set PREHEAT_NPB_STATIC_BIN, or install \
             preheat-npb-static next to {} (no source checkout is available to build it)",
            exe_dir()?.display()
        );
    }
    let target_dir = std::env::var_os("CARGO_TARGET_DIR")
        .filter(|d| !d.is_empty())
        .map_or_else(|| root.join("target"), PathBuf::from);
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = Command::new(cargo)
        .args(["build", "--quiet", "--release", "-p", "preheat-npb"])
        .args(["--target", GUEST_TARGET])
        .arg("--manifest-path")
        .arg(&manifest)
        .arg("--target-dir")
        .arg(&target_dir)
        .env(
            "CARGO_ENCODED_RUSTFLAGS",
            "-Ctarget-feature=+crt-static\x1f-Cstrip=debuginfo",
        )
        .output()
        .context("running cargo to build a statically linked preheat-npb")?;
    if !out.status.success() {
        bail!(
            "building a statically linked preheat-npb failed ({}):\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim_end()
        );
    }
    Ok(target_dir.join(GUEST_TARGET).join("release/preheat-npb"))
}
