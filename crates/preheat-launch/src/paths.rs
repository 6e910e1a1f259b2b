//! Where preheat's companion artifacts and sockets live.
//!
//! The CLI ships with two companions built from the same workspace: the LD_PRELOAD agent
//! (`libpreheat_agent.so`) and the bundled default server (`preheat-kv`). They are looked up next
//! to the `preheat` executable (the layout of `target/<profile>/`, of its `deps/` for test
//! executables, and of an install prefix's `bin/` + `lib/`), or at `PREHEAT_AGENT_SO` / `PREHEAT_KV_BIN`. When running from a source
//! checkout and they are missing, the CLI builds them with cargo (once, with a message).

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
